"""Gathering a batch from a warm local store: ``get_batch`` of 1024 random records, seqstore source trees
side by side, with ``np.take`` of the same rows as the floor.

Two stores are generated once under ``bench/data/gather/`` (``--data``): fixed, 400,000 records of 512
float32 (2 KiB, 2 shards); ragged, 200,000 records of 1-200 rows of 16 float16 (2 shards). Each case runs
in a fresh process: it opens the store, reads every shard file once (page cache warm), draws 400 batches
of 1024 random indices (seed 0), gathers the first 20 (numba's first calls), then times the 400. Every
round runs every case once (interleaved), and the table gives medians: ms per batch, and the ratio to
the first source tree.

- ``seqstore LABEL``: ``store.get_batch(indices)`` of the source tree ``LABEL=PATH`` (``--src``, default
  this checkout's ``src``; e.g. ``--src before=/tmp/old/src after=src``);
- ``np.take`` (fixed only): ``np.take`` of the rows from each shard's mapped ``x.npy`` into a new array,
  placing none of them (the copy alone: a lower bound for any gather).

Usage: ``python bench/gather.py [--src LABEL=PATH ...] [--repeats R] [--quick]`` (``--quick``: stores a
tenth the size, one run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BATCH, BATCHES, WARM = 1024, 400, 20
KINDS = {"fixed": 400_000, "ragged": 200_000}


def build(data: Path, scale: int = 1) -> dict[str, Path]:
    """The two stores (made once), ``1/scale`` of the records."""
    import numpy as np

    sys.path.insert(0, str(REPO / "src"))
    import seqstore as ss

    out = {}
    for kind, n in KINDS.items():
        n //= scale
        root = data / f"{kind}-{n}.seqstore"
        out[kind] = root
        if (data / f"{root.name}.done").exists():
            continue
        rng = np.random.default_rng(1)
        field = ss.Field("float32", (512,)) if kind == "fixed" else ss.Field("float16", (None, 16))
        with ss.create(root, {"x": field}, max_shard_records=n // 2 + 1, overwrite=True) as w:
            for a in range(0, n, 10_000):
                m = min(10_000, n - a)
                if kind == "fixed":
                    w.append_batch({"x": rng.standard_normal((m, 512), dtype=np.float32)})
                else:
                    lengths = rng.integers(1, 201, m)
                    values = rng.standard_normal((int(lengths.sum()), 16)).astype(np.float16)
                    w.append_batch({"x": (values, lengths)})
        (data / f"{root.name}.done").touch()
    return out


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    import seqstore

    store = seqstore.open(spec["path"])
    for f in sorted(Path(spec["path"]).glob("shard-*/*.npy")):
        with open(f, "rb") as fh:
            while fh.read(16 << 20):
                pass
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, len(store), BATCH) for _ in range(BATCHES)]
    if spec["case"] == "np.take":
        cols = [np.load(f, mmap_mode="r") for f in sorted(Path(spec["path"]).glob("shard-*/x.npy"))]
        starts = np.cumsum([0] + [len(c) for c in cols[:-1]])

        def one(idx: Any) -> None:
            shard = np.searchsorted(starts, idx, side="right") - 1
            for k, col in enumerate(cols):
                np.take(col, idx[shard == k] - starts[k], axis=0)
    else:
        def one(idx: Any) -> None:
            store.get_batch(idx)
    for b in batches[:WARM]:
        one(b)
    c0, t0 = time.process_time(), time.perf_counter()
    for b in batches:
        one(b)
    return {"ms": (time.perf_counter() - t0) / BATCHES * 1e3, "cpu_ms": (time.process_time() - c0) / BATCHES * 1e3}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, default=REPO / "bench" / "data" / "gather")
    p.add_argument("--src", nargs="+", default=[f"this={REPO / 'src'}"], help="LABEL=PATH of seqstore sources")
    p.add_argument("--repeats", type=int, default=None, help="runs per case (default 3, quick 1)")
    p.add_argument("--quick", action="store_true", help="stores a tenth the size, 1 run")
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return
    stores = build(a.data, 10 if a.quick else 1)
    repeats = a.repeats or (1 if a.quick else 3)
    srcs = [s.split("=", 1) for s in a.src]
    cases = []
    for kind, path in stores.items():
        for label, src in srcs:
            cases.append((f"{kind}: seqstore {label}", src, {"case": "seqstore", "path": str(path)}))
        if kind == "fixed":
            cases.append((f"{kind}: np.take", srcs[0][1], {"case": "np.take", "path": str(path)}))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in cases}
    for r in range(repeats):
        for name, src, spec in cases:
            env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
            out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env, check=True,
                                 capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
            print(f"  {name:32s} run {r + 1}: {runs[name][-1]['ms']:.3f} ms per batch", file=sys.stderr, flush=True)
    print("| case | ms per batch of 1024 (runs) | CPU ms | x the first source |")
    print("|---|---|---|---|")
    for name, got in runs.items():
        kind = name.split(":")[0]
        base = statistics.median(x["ms"] for x in runs[f"{kind}: seqstore {srcs[0][0]}"])
        ms = statistics.median(x["ms"] for x in got)
        spread = "/".join(f"{x['ms']:.3f}" for x in got)
        cpu = statistics.median(x["cpu_ms"] for x in got)
        print(f"| {name} | {ms:.3f} ({spread}) | {cpu:.3f} | {ms / base:.2f}x |")


if __name__ == "__main__":
    main()
