"""GPU similarity scan of a per-example log: page cache -> pinned host -> GPU, against host memory bandwidth.

Self-contained (``PYTHONPATH=src``; numpy, numba, torch; no network). Steps, all in one process:

1. host memory bandwidth: ``np.copyto`` of a large buffer, single-threaded and with one thread per
   core (what a page cache -> pinned copy can reach at best); pinned -> GPU copy bandwidth (torch).
2. log ``--rows`` x ``--dim`` float16 rows with ``seqstore.log.Logger`` (ids ``r<i>``; a random base
   block cycled, so generation does not dominate) and close (commit: fsync).
3. ``similarity(store, queries, device=..., topk=...)`` once on a small separate log (CUDA/cuBLAS
   init, numba compiles), then over the whole log **cold**: the Logger writes with ``O_DIRECT``, so
   the log is not in the page cache after writing, and its files' pages are dropped once more with
   ``posix_fadvise(POSIX_FADV_DONTNEED)`` before a fresh ``open`` (disk bytes from ``/proc/self/io``);
   then again **warm** (the cold scan left it in the page cache): rows/s and GB/s of stored bytes moved
   page cache -> GPU; then warm with all scores kept (``--full-scores``; includes first-touching the
   ``N x Q`` float32 result in RAM).

Default: 1e6 x 4096 float16 (8.2 GB) against 1024 queries, top-10, on CUDA. The disk must hold the
log (``--dir``, default a temporary directory, removed afterwards unless ``--keep``). ``--cpu`` runs
the scan with numpy BLAS instead; ``--quick`` shrinks to 20,000 rows and 256 queries (a smoke run
that fits a 2-core box). Prints a JSON summary (also written to ``--json`` when given).

Usage: ``PYTHONPATH=src python bench/gpu_similarity.py [--rows N] [--cpu] [--quick] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)  # keep bench/ modules from shadowing stdlib or package names
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import numpy as np  # noqa: E402


def host_bandwidth(nbytes: int) -> dict[str, float]:
    """GB/s of np.copyto between two touched buffers: 1 thread and one per core (read + write counted once)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    np.copyto(dst, src)
    out = {}
    t0 = time.perf_counter()
    np.copyto(dst, src)
    out["memcpy_1thread_GBps"] = nbytes / (time.perf_counter() - t0) / 1e9
    threads = os.cpu_count() or 1
    step = -(-nbytes // threads)

    def part(a: int) -> None:
        np.copyto(dst[a : a + step], src[a : a + step])

    t0 = time.perf_counter()
    ts = [threading.Thread(target=part, args=(a,)) for a in range(0, nbytes, step)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out[f"memcpy_{threads}threads_GBps"] = nbytes / (time.perf_counter() - t0) / 1e9
    return out


def h2d_bandwidth(nbytes: int, device: str) -> dict[str, float]:
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return {"pinned_to_gpu_GBps": 3 * nbytes / (time.perf_counter() - t0) / 1e9}


def write_log(path: Path, rows: int, dim: int) -> dict[str, float]:
    from seqstore.log import Logger

    batch = 8192
    base = np.random.default_rng(0).standard_normal((batch, dim)).astype(np.float16)
    t0 = time.perf_counter()
    with Logger(path, flush_bytes=256 << 20) as lg:
        for a in range(0, rows, batch):
            n = min(batch, rows - a)
            lg.log([f"r{i}" for i in range(a, a + n)], {"grad": base[:n]})
    t = time.perf_counter() - t0
    return {"log_write_s": t, "log_write_GBps": rows * dim * 2 / t / 1e9}


def drop_cache(path: Path) -> None:
    """Write back, then drop the page cache of every file under ``path``."""
    os.sync()
    for p in path.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def io_read_bytes() -> int:
    """Bytes this process has read from block devices (``/proc/self/io``)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--queries", type=int, default=1024)
    p.add_argument("--topk", type=int, default=10)
    p.add_argument("--chunk-rows", type=int, default=None)
    p.add_argument("--cpu", action="store_true", help="scan with numpy BLAS on the CPU")
    p.add_argument("--quick", action="store_true", help="20,000 rows, 256 queries")
    p.add_argument("--full-scores", action="store_true", help="also time a scan that keeps all N x Q scores")
    p.add_argument("--dir", default=None, help="where to write the log (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the log")
    p.add_argument("--json", default=None, help="also write the summary here")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.queries = min(args.rows, 20_000), min(args.queries, 256)
    device = "cpu" if args.cpu else "cuda"
    import seqstore
    from seqstore.log import similarity

    summary: dict[str, Any] = {"rows": args.rows, "dim": args.dim, "queries": args.queries, "device": device}
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("CUDA is not available: run with --cpu")
        summary["gpu"] = torch.cuda.get_device_name(0)
    summary["cores"] = os.cpu_count()
    summary.update(host_bandwidth((1 << 30) if not args.quick else (256 << 20)))
    if device == "cuda":
        summary.update(h2d_bandwidth(1 << 30, device))
    work = Path(args.dir or tempfile.mkdtemp(prefix="seqstore-gpu-sim-"))
    path = work / "log"
    try:
        if path.exists():
            shutil.rmtree(path)
        summary.update(write_log(path, args.rows, args.dim))
        warm_up = work / "warmup"
        if warm_up.exists():
            shutil.rmtree(warm_up)
        write_log(warm_up, min(args.rows, 16384), args.dim)
        q = np.random.default_rng(1).standard_normal((args.queries, args.dim)).astype(np.float32)
        nbytes = args.rows * args.dim * 2
        # CUDA/cuBLAS init and numba compiles on a separate log, so no page of the big one is mapped yet
        similarity(seqstore.open(warm_up), q, device=device, topk=args.topk, chunk_rows=args.chunk_rows)
        drop_cache(path)
        store = seqstore.open(path)
        rb0 = io_read_bytes()
        cold = similarity(store, q, device=device, topk=args.topk, chunk_rows=args.chunk_rows)
        summary.update(
            {
                "cold_topk_scan_s": cold.seconds,
                "cold_GBps_disk_to_device": nbytes / cold.seconds / 1e9,
                "cold_disk_read_GB": (io_read_bytes() - rb0) / 1e9,
            }
        )
        res = similarity(store, q, device=device, topk=args.topk, chunk_rows=args.chunk_rows)
        summary.update(
            {
                "topk_scan_s": res.seconds,
                "topk_rows_per_s": res.rows_per_s,
                "topk_GBps_pagecache_to_device": nbytes / res.seconds / 1e9,
                "topk_TFLOPs": 2 * args.rows * args.dim * args.queries / res.seconds / 1e12,
            }
        )
        # correctness spot check against numpy on a few rows
        rows = np.array([0, args.rows // 2, args.rows - 1])
        x = store.matrix(rows=rows).astype(np.float32)
        ref = x @ q.T
        top_first = res.top_rows[:, 0]  # type: ignore[index]
        xb = store.matrix(rows=top_first[:8]).astype(np.float32)
        summary["check_top1_score_max_abs_err"] = float(
            np.abs(np.einsum("qd,qd->q", xb, q[:8]) - res.top_scores[:8, 0]).max()  # type: ignore[index]
        )
        if args.full_scores:
            res2 = similarity(store, q, device=device, chunk_rows=args.chunk_rows)
            assert res2.scores is not None
            summary.update(
                {
                    "full_scan_s": res2.seconds,
                    "full_rows_per_s": res2.rows_per_s,
                    "full_GBps_pagecache_to_device": nbytes / res2.seconds / 1e9,
                    "full_check_max_abs_err": float(np.abs(res2.scores[rows] - ref).max()),
                }
            )
        summary["host_memcpy_fraction"] = summary["topk_GBps_pagecache_to_device"] / max(
            v for k, v in summary.items() if k.startswith("memcpy_")
        )
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
