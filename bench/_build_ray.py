"""Ray Data -> seqstore vs Ray Data's own writers, and reading back (bench/build.py's Ray part).

One Dataset of ``rows`` records, as issue 13 describes them: ``features`` a ragged float16 (L, 16)
matrix with L uniform in 10..200 (Ray's variable-shaped tensor), ``labels`` a ragged int32 sequence of
1..20 tokens, ``id`` a string. It is generated with vectorised Arrow code and materialised in Ray's
object store first, so every writer starts from the same blocks and no generation is timed. Cases,
one after another in one Ray instance (``num_cpus``, default 2):

- ``seqstore.ray.write`` (one part per write task, one commit; fsyncs every shard before the commit);
- ``write_parquet`` uncompressed (``compression="none"``) and with Ray's default compression;
- ``write_numpy`` of the ``features`` column (one column: Ray's numpy writer takes one);
- reading back: ``seqstore.ray.read`` and ``ray.data.read_parquet`` of the uncompressed files,
  every block pulled to the driver as Arrow (``iter_batches(batch_size=None)``).

Per case: seconds, rows/s, MB/s of the payload (feature and label bytes plus id bytes: the same
figure for every case), and the driver's peak RSS growth during the case (VmHWM reset before it
where Linux allows). Ratios are against the uncompressed ``write_parquet`` (writes) and
``read_parquet`` (reads); > 1 is faster.

``run(args, data)`` returns one dict per case; ``args`` may carry ``rows`` (capped at ``ray_rows``,
default 500,000: the Dataset lives in Ray's object store), ``ray_cpus``, ``repeats`` (median of that
many runs per case) and ``blocks``; ``data`` is a scratch directory. Standalone:
``python bench/_build_ray.py --rows 200000``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

DIM = 16
MIN_FRAMES, MAX_FRAMES = 10, 200
MAX_LABELS = 20
DEFAULT_ROWS = 200_000
#: at most this many rows (about 3.5 KB each) unless ``args.ray_rows`` says otherwise: the Dataset is
#: materialised in Ray's object store (3 GiB by default here) and every writer's output is kept on disk
MAX_ROWS = 500_000


def _rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in bytes."""
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":")
                vals[k] = int(v.split()[0]) * 1024
    return vals["VmRSS"], vals["VmHWM"]


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _generate(batch: Any) -> Any:
    """Arrow batch of records ``batch["id"]``: features, labels and a string id (vectorised)."""
    import numpy as np
    import pyarrow as pa

    from seqstore.engines.ray import _arrow_ragged

    ids = np.asarray(batch.column("id").to_numpy(), dtype=np.int64)
    rng = np.random.default_rng(int(ids[0]))
    n = len(ids)
    frames = rng.integers(MIN_FRAMES, MAX_FRAMES + 1, n)
    feats = rng.standard_normal((int(frames.sum()), DIM), dtype=np.float32).astype(np.float16)
    tokens = rng.integers(1, MAX_LABELS + 1, n)
    labels = rng.integers(0, 30000, int(tokens.sum()), dtype=np.int32)
    names = pa.array(np.char.add("utt-", ids.astype(str)).astype(object), type=pa.string())
    return pa.table({"id": names, "features": _arrow_ragged(feats, frames), "labels": _arrow_ragged(labels, tokens)})


def _payload_bytes(ds: Any) -> int:
    """Feature, label and id bytes of the whole dataset (summed block by block on the workers)."""
    import numpy as np

    def size(batch: Any) -> Any:
        import pyarrow as pa

        total = 0
        for name in ("features", "labels"):
            data = batch.column(name).combine_chunks().storage.flatten()[0]
            total += data.flatten().nbytes if isinstance(data, pa.LargeListArray) else data.nbytes
        ids = batch.column("id").combine_chunks()
        total += ids.buffers()[2].size if ids.buffers()[2] is not None else 0
        return {"bytes": np.array([total], dtype=np.int64)}

    return int(ds.map_batches(size, batch_format="pyarrow", batch_size=None).sum("bytes"))


def _timed(fn: Callable[[], Any]) -> tuple[float, int, bool]:
    """(seconds, driver peak RSS growth in bytes, whether the peak is exact) of ``fn()``."""
    import gc

    gc.collect()
    exact = _reset_peak()
    rss0, _ = _rss()
    t = time.perf_counter()
    fn()
    dt = time.perf_counter() - t
    return dt, _rss()[1] - rss0, exact


def run(args: Any, data: Any) -> list[dict[str, Any]]:
    import ray

    import seqstore
    import seqstore.ray as sray

    rows = int(getattr(args, "rows", None) or DEFAULT_ROWS)
    cap = int(getattr(args, "ray_rows", None) or MAX_ROWS)
    if rows > cap:  # the whole Dataset lives in Ray's object store, and each writer keeps its output
        print(f"ray cases: {cap} rows instead of {rows} (--ray-rows; the Dataset is held in Ray's object store)",
              flush=True)
        rows = cap
    cpus = int(getattr(args, "ray_cpus", None) or 2)
    repeats = int(getattr(args, "repeats", None) or 1)
    blocks = int(getattr(args, "blocks", None) or max(8, rows // 10_000))
    work = Path(data) / "ray"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 object_store_memory=int(getattr(args, "object_store_bytes", None) or 3 << 30))
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    try:
        ds = ray.data.range(rows, override_num_blocks=blocks).map_batches(
            _generate, batch_format="pyarrow", batch_size=None).materialize()
        payload = _payload_bytes(ds)

        def out(name: str) -> str:
            p = work / name
            shutil.rmtree(p, ignore_errors=True)
            return str(p)

        writes: dict[str, Callable[[], Any]] = {
            "seqstore.ray.write": lambda: sray.write(ds, out("store.seqstore"), id_column="id"),
            "write_parquet (uncompressed)": lambda: ds.write_parquet(out("pq-none"), compression="none"),
            "write_parquet (default, snappy)": lambda: ds.write_parquet(out("pq-default")),
            "write_numpy (features)": lambda: ds.write_numpy(out("npy"), column="features"),
        }
        small = ds.limit(max(1, rows // blocks)).materialize()  # warm-up: workers start, import, compile
        sray.write(small, out("warm.seqstore"), id_column="id")
        small.write_parquet(out("warm-pq"))
        small.write_numpy(out("warm-npy"), column="features")
        results: list[dict[str, Any]] = []
        for name, fn in writes.items():
            runs = []
            for _ in range(repeats):
                os.sync()
                runs.append(_timed(fn))
            results.append(_row("write", name, rows, payload, runs))
        store = seqstore.open(work / "store.seqstore")
        assert len(store) == rows, f"store has {len(store)} records, expected {rows}"

        def drain(d: Any) -> None:
            n = 0
            for b in d.iter_batches(batch_size=None, batch_format="pyarrow"):
                n += b.num_rows
            assert n == rows, f"read {n} rows, expected {rows}"

        reads: dict[str, Callable[[], Any]] = {
            "seqstore.ray.read": lambda: drain(sray.read(work / "store.seqstore", id_column="id")),
            "read_parquet (uncompressed)": lambda: drain(ray.data.read_parquet(str(work / "pq-none"))),
        }
        for name, fn in reads.items():
            results.append(_row("read", name, rows, payload, [_timed(fn) for _ in range(repeats)]))
        for kind, base in (("write", "write_parquet (uncompressed)"), ("read", "read_parquet (uncompressed)")):
            ref = next(r for r in results if r["case"] == base)["seconds"]
            for r in results:
                if r["kind"] == kind:
                    r["speed_vs_parquet_uncompressed"] = round(ref / r["seconds"], 3)
        for r in results:
            r["bytes_on_disk"] = _du(work / {
                "seqstore.ray.write": "store.seqstore", "write_parquet (uncompressed)": "pq-none",
                "write_parquet (default, snappy)": "pq-default", "write_numpy (features)": "npy",
            }.get(r["case"], "none"))
        return results
    finally:
        if started:
            ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def _du(p: Path) -> int | None:
    if not p.exists():
        return None
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def _row(kind: str, name: str, rows: int, payload: int, runs: list[tuple[float, int, bool]]) -> dict[str, Any]:
    secs = statistics.median(r[0] for r in runs)
    return {
        "engine": "ray", "kind": kind, "case": name, "rows": rows, "payload_bytes": payload,
        "seconds": round(secs, 3), "rows_per_s": round(rows / secs), "mb_per_s": round(payload / secs / 1e6, 1),
        "driver_peak_mib": round(statistics.median(r[1] for r in runs) / 2**20, 1),
        "driver_peak_exact": all(r[2] for r in runs), "runs": len(runs),
    }


def _print(results: list[dict[str, Any]]) -> None:
    print("| kind | case | rows | s | rows/s | MB/s | x parquet uncompressed | driver peak MiB | on disk MB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        disk = "" if r.get("bytes_on_disk") is None else f"{r['bytes_on_disk'] / 1e6:.0f}"
        print(f"| {r['kind']} | {r['case']} | {r['rows']} | {r['seconds']:.2f} | {r['rows_per_s']} | "
              f"{r['mb_per_s']} | {r.get('speed_vs_parquet_uncompressed', '')} | {r['driver_peak_mib']} | {disk} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    ap.add_argument("--ray-rows", type=int, default=MAX_ROWS, help="cap on --rows")
    ap.add_argument("--ray-cpus", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=None)
    ap.add_argument("--data", default=None, help="scratch directory (default: a temporary one)")
    a = ap.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(dir=a.data) as tmp:
        _print(run(a, tmp))
