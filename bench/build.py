"""Distributed and parallel builds (issue 13): ``seqstore convert --workers 1`` vs ``--workers N``, and
the Ray Data and Spark cases of bench/_build_ray.py and bench/_build_spark.py when those files exist.

The dataset is the one issue 13 describes: ``rows`` records (default 1e7; ``--quick``: 1e5) of
``features``, a ragged float16 (L, 16) matrix with L uniform in 10..200, ``labels``, a ragged int32
sequence of 1..20 tokens, and ``id``, a string. It is generated once (vectorised, seeded) as
uncompressed Parquet files of 100k rows in row groups of 16384 rows under
``bench/data/build/parquet-<rows>/`` (kept for later runs; ``--data`` moves it) with a ``data.json``
giving the payload bytes (feature, label and id bytes: the same figure for every case).

Convert cases: ``seqstore convert --from parquet --id-column id --workers W`` in a fresh process, for
each W of ``--workers`` (default ``1,2``), alternating W runs ``--repeats`` times (median), the output
deleted between runs. Per case: seconds (the whole command: interpreter start, worker start, commit
and rename included), rows/s, MB/s of payload, the driver process's peak private memory (psutil USS,
sampled every 0.1 s) and the workers' summed peak USS, the CPU seconds of the command and its workers
(as last sampled: up to 0.1 s of a process's end may be missed)
(``cores_busy`` = CPU / wall: on shared cores, how much CPU the case got), and the ratio to
``--workers 1`` (> 1 faster).
The machine's load average is recorded with every run (the cores may be shared). The input files
are read once before the first run (page cache warm for every run).

Other engines: ``bench/_build_ray.py`` and ``bench/_build_spark.py`` each define ``run(args, data) ->
list[dict]`` (``args``: this script's arguments; ``data``: a scratch directory); their rows are
printed and saved with these. Results: ``bench/results/build.json``.

Usage: ``python bench/build.py [--quick] [--rows N] [--workers 1,2] [--repeats R] [--only convert]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.harness import DATA, RESULTS, machine_line  # noqa: E402

ROWS = 10_000_000
QUICK_ROWS = 100_000
FILE_ROWS = 100_000
ROW_GROUP = 16_384
DIM = 16
ENGINES = ("_build_ray", "_build_spark")


# ------------------------------------------------------------------------------------------ data


def _ragged(values: Any, lengths: np.ndarray[Any, Any]) -> Any:
    import pyarrow as pa

    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(offsets), values)


def _file(first: int, n: int, seed: int) -> tuple[Any, int]:
    """One Parquet table of records ``first .. first + n - 1`` and its payload bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = np.random.default_rng(seed)
    frames = rng.integers(10, 201, n)
    tokens = rng.integers(1, 21, n)
    # random finite float16 values in [0, 1) straight from uint16 bits (no float64 intermediate)
    feats = rng.integers(0, 0x3C00, int(frames.sum()) * DIM, dtype=np.uint16).view(np.float16)
    labels = rng.integers(0, 1 << 16, int(tokens.sum()), dtype=np.int32)
    ids = pc.binary_join_element_wise(
        "utt-", pc.utf8_lpad(pc.cast(pa.array(np.arange(first, first + n)), pa.string()), 10, "0"), "")
    table = pa.table({
        "features": _ragged(pa.FixedSizeListArray.from_arrays(pa.array(feats), DIM), frames),
        "labels": _ragged(pa.array(labels), tokens),
        "id": ids,
    })
    return table, feats.nbytes + labels.nbytes + int(pc.sum(pc.binary_length(ids)).as_py())


def dataset(root: Path, rows: int) -> tuple[Path, int]:
    """The Parquet directory for ``rows`` records (generated once) and its payload bytes."""
    import pyarrow.parquet as pq

    d = root / f"parquet-{rows}"
    info = d / "data.json"
    if info.exists():
        meta = json.loads(info.read_text())
        if meta.get("rows") == rows:
            return d, int(meta["payload_bytes"])
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    payload = 0
    t0 = time.perf_counter()
    for k, first in enumerate(range(0, rows, FILE_ROWS)):
        table, nbytes = _file(first, min(FILE_ROWS, rows - first), seed=k)
        pq.write_table(table, d / f"part-{k:05d}.parquet", row_group_size=ROW_GROUP, compression="none")
        payload += nbytes
    info.write_text(json.dumps({"rows": rows, "payload_bytes": payload}))
    print(f"generated {rows} rows ({payload / 1e9:.2f} GB payload) in {d} in {time.perf_counter() - t0:.0f} s",
          flush=True)
    return d, payload


# -------------------------------------------------------------------------------------- convert


def _uss(pid: int, cpu: dict[int, float]) -> tuple[int, int]:
    """(USS of ``pid``, summed USS of its descendants) in bytes; (0, 0) once it is gone. Records each
    process's CPU seconds so far in ``cpu`` (workers started by a forkserver are not the command's
    children, so the command's rusage does not count them)."""
    import psutil

    try:
        p = psutil.Process(pid)
        own = p.memory_full_info().uss
        t = p.cpu_times()
        cpu[pid] = t.user + t.system
        kids = 0
        for c in p.children(recursive=True):
            try:
                kids += c.memory_full_info().uss
                t = c.cpu_times()
                cpu[c.pid] = t.user + t.system
            except psutil.Error:
                pass
        return own, kids
    except psutil.Error:
        return 0, 0


def _convert_once(src: Path, out: Path, workers: int) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    cmd = [sys.executable, "-m", "seqstore.cli", "convert", "--from", "parquet", "--id-column", "id",
           "--workers", str(workers), "-q", str(src), str(out)]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = [0, 0]
    stop = threading.Event()
    cpu: dict[int, float] = {}

    def sample() -> None:
        while not stop.is_set():
            own, kids = _uss(proc.pid, cpu)
            peak[0], peak[1] = max(peak[0], own), max(peak[1], kids)
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    secs = time.perf_counter() - t0
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {stderr.decode()[-2000:]}")
    return {"seconds": secs, "cpu_s": sum(cpu.values()), "driver_uss": peak[0], "workers_uss": peak[1], "load": load0,
            "load_after": os.getloadavg()[0]}


def run_convert(args: argparse.Namespace, src: Path, payload: int, rows: int, scratch: Path) -> list[dict[str, Any]]:
    import seqstore

    for f in src.glob("*.parquet"):  # warm the page cache: every run reads the inputs from memory
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    counts = [int(w) for w in args.workers.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {w: [] for w in counts}
    shards: dict[int, int] = {}
    for _ in range(args.repeats):
        for w in counts:
            out = scratch / f"convert-w{w}.seqstore"
            r = _convert_once(src, out, w)
            store = seqstore.open(out)
            assert len(store) == rows, f"{out}: {len(store)} records, expected {rows}"
            shards[w] = store.num_shards
            runs[w].append(r)
            print(f"  convert --workers {w}: {r['seconds']:.2f} s, {r['cpu_s']:.1f} s CPU (load {r['load']:.1f})",
                  flush=True)
            shutil.rmtree(out, ignore_errors=True)
    results = []
    for w in counts:
        secs = statistics.median(r["seconds"] for r in runs[w])
        results.append({
            "engine": "convert", "kind": "write", "case": f"convert --workers {w}", "rows": rows,
            "payload_bytes": payload, "seconds": round(secs, 3), "rows_per_s": round(rows / secs),
            "mb_per_s": round(payload / secs / 1e6, 1),
            "driver_uss_mib": round(statistics.median(r["driver_uss"] for r in runs[w]) / 2**20, 1),
            "workers_uss_mib": round(statistics.median(r["workers_uss"] for r in runs[w]) / 2**20, 1),
            "cpu_s": round(statistics.median(r["cpu_s"] for r in runs[w]), 1),
            "cores_busy": round(statistics.median(r["cpu_s"] / r["seconds"] for r in runs[w]), 2),
            "shards": shards[w], "runs": len(runs[w]), "seconds_all": [round(r["seconds"], 3) for r in runs[w]],
            "load_avg_1min": [round(r["load"], 2) for r in runs[w]],
        })
    base = next((r for r in results if r["case"] == "convert --workers 1"), None)
    for r in results:
        if base is not None:
            r["speed_vs_workers_1"] = round(base["seconds"] / r["seconds"], 3)
    return results


# ------------------------------------------------------------------------------------------ main


def _print(results: list[dict[str, Any]]) -> None:
    print("| engine | kind | case | rows | s | rows/s | MB/s | ratio | driver MiB | workers MiB | CPU s | cores busy |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ratio = r.get("speed_vs_workers_1", r.get("speed_vs_parquet_uncompressed", ""))
        driver = r.get("driver_uss_mib", r.get("driver_peak_mib", ""))
        print(f"| {r.get('engine', '')} | {r.get('kind', '')} | {r['case']} | {r['rows']} | {r['seconds']:.2f} | "
              f"{r['rows_per_s']} | {r['mb_per_s']} | {ratio} | {driver} | {r.get('workers_uss_mib', '')} | "
              f"{r.get('cpu_s', '')} | {r.get('cores_busy', '')} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS} rows instead of {ROWS}")
    ap.add_argument("--rows", type=int, default=None, help="records (overrides --quick)")
    ap.add_argument("--workers", default="1,2", help="convert --workers values, comma-separated (default 1,2)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case (median; default 3)")
    ap.add_argument("--only", choices=["convert", *[e.lstrip("_").replace("build_", "") for e in ENGINES]],
                    help="run only this group")
    ap.add_argument("--data", type=Path, default=DATA / "build", help="where the Parquet input is kept")
    ap.add_argument("--scratch", type=Path, default=None, help="where outputs are written (default: --data)")
    ap.add_argument("--ray-cpus", type=int, default=2, help="Ray cases: num_cpus")
    ap.add_argument("--blocks", type=int, default=None, help="Ray cases: blocks of the dataset")
    args = ap.parse_args()
    args.rows = args.rows or (QUICK_ROWS if args.quick else ROWS)
    print(machine_line(), flush=True)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    results: list[dict[str, Any]] = []
    (args.scratch or args.data).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.scratch or args.data, prefix="build-scratch-") as tmp:
        scratch = Path(tmp)
        if args.only in (None, "convert"):
            src, payload = dataset(args.data, args.rows)
            results += run_convert(args, src, payload, args.rows, scratch)
        for name in ENGINES:
            group = name.lstrip("_").replace("build_", "")
            if args.only not in (None, group):
                continue
            if not (Path(__file__).parent / f"{name}.py").exists():
                print(f"skipped: {group} in build (bench/{name}.py not there yet)")
                continue
            try:
                mod = importlib.import_module(f"bench.{name}")
                results += mod.run(args, scratch)
            except ImportError as exc:
                print(f"skipped: {group} in build (not installed: {exc}; pip install 'seqstore[{group}]')")
    _print(results)
    for r in results:
        if r["case"].startswith("convert --workers") and r["case"] != "convert --workers 1":
            print(f"{r['case']}: {r.get('speed_vs_workers_1')}x of --workers 1 (issue 13 target for 2: >= 1.6x)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "build.json"
    out.write_text(json.dumps({"machine": machine_line(), "rows": args.rows, "results": results}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
