"""What verified reads cost: warm random ``get_batch`` and a sequential epoch of a local store, opened
with ``verify_reads=True`` against without.

One store is generated once under ``bench/data/verify_reads/`` (``--data``): 40,000 records of a
speech-like schema, ``feats`` float16 ``(None, 80)`` (20-400 rows), ``emb`` float32 ``(256,)``,
``label`` int64 and an id (about 1.4 GB, 4 shards). Each case runs in a fresh process: it opens the
store (with or without ``verify_reads``), reads every shard file once (page cache warm), then

- ``random``: ``get_batch`` of 300 batches of 256 random records (seed 0; the first 10 untimed: numba's
  first calls), the time per batch;
- ``epoch``: ``iter_batches`` over all records in order, batches of 1024, the time of the epoch.

Every round runs each case with and without verification (interleaved); the table gives the medians
over the rounds and the ratio ``plain / verified`` of their speeds (1.0: free; the target is >= 0.8).

``--interleaved`` runs both cases in one process instead, plain and verified alternating 7 times over
the same batches (100 random batches, one epoch), and reports the best time of each: on a loaded
machine the minimum is steadier than medians of separate processes.

``--granularity`` measures instead what checking a random batch costs at each granularity a checksum
could have: per record (hash exactly the record's bytes), per 4 KiB page or per 64 KiB block (hash the
whole page or block around each record): 256 random records of 64 B and of 1 KiB from a 256 MiB
buffer in memory, the best of 50 timings each.

Usage: ``python bench/verify_reads.py [--rounds R] [--quick] [--src PATH] [--interleaved | --granularity]``
(``--quick``: a store a tenth the size; ``--src``: the seqstore source tree to run, default this
checkout's ``src``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RECORDS, SHARDS = 40_000, 4
BATCH, BATCHES, WARM, EPOCH_BATCH = 256, 300, 10, 1024


def build(data: Path, records: int) -> Path:
    """The store (made once)."""
    import numpy as np

    import seqstore as ss

    root = data / f"speech-{records}.seqstore"
    if (data / f"{root.name}.done").exists():
        return root
    schema = {"feats": ss.Field("float16", (None, 80)), "emb": ss.Field("float32", (256,)), "label": ss.Field("int64")}
    rng = np.random.default_rng(1)
    with ss.create(root, schema, max_shard_records=records // SHARDS, overwrite=True) as w:
        for a in range(0, records, 1000):
            m = min(1000, records - a)
            lengths = rng.integers(20, 401, m)
            feats = rng.standard_normal((int(lengths.sum()), 80)).astype(np.float16)
            w.append_batch(
                {"feats": (feats, lengths), "emb": rng.standard_normal((m, 256), dtype=np.float32),
                 "label": np.arange(a, a + m)},
                ids=[f"utt-{i:08d}" for i in range(a, a + m)],
            )
    (data / f"{root.name}.done").write_text("")
    return root


def case(root: str, kind: str, verify: bool) -> dict[str, Any]:
    """One case in this (fresh) process."""
    import numpy as np

    import seqstore as ss

    store = ss.open(root, verify_reads=verify)
    for f in Path(root).rglob("*.npy"):  # page cache warm
        f.read_bytes()
    if kind == "random":
        rng = np.random.default_rng(0)
        batches = [rng.integers(0, len(store), BATCH) for _ in range(BATCHES + WARM)]
        for b in batches[:WARM]:
            store.get_batch(b)
        t = time.perf_counter()
        for b in batches[WARM:]:
            store.get_batch(b)
        return {"seconds": (time.perf_counter() - t) / BATCHES}
    store.get_batch(np.arange(min(EPOCH_BATCH, len(store))))  # numba's first calls
    t = time.perf_counter()
    nbytes = 0
    n = len(store)
    for out in store.iter_batches(np.arange(a, min(a + EPOCH_BATCH, n)) for a in range(0, n, EPOCH_BATCH)):
        nbytes += out["feats"][0].nbytes + out["emb"].nbytes
    return {"seconds": time.perf_counter() - t, "bytes": nbytes}


def granularity() -> None:
    """Per record vs per page vs per block, for random reads (see the module docs)."""
    import numpy as np

    from seqstore.format.checksums import span_checks

    buf = np.random.default_rng(0).integers(0, 256, 256 << 20, dtype=np.uint8)
    for size in (64, 1024):
        idx = np.sort(np.random.default_rng(1).integers(0, len(buf) // size, BATCH)) * size
        line = []
        for unit in (None, 4096, 65536):
            starts = idx if unit is None else idx // unit * unit
            lens = np.full(BATCH, size if unit is None else unit)
            span_checks(buf, starts, lens)
            best = min(_timed(span_checks, buf, starts, lens) for _ in range(50))
            line.append(f"{'per record' if unit is None else f'per {unit // 1024} KiB'} {best * 1e6:.1f} us")
        print(f"{BATCH} random records of {size} B: " + ", ".join(line))


def interleaved(root: Path) -> None:
    """Plain and verified alternating in one process, best of 7 (see the module docs)."""
    import numpy as np

    import seqstore as ss

    stores = {"plain": ss.open(root), "verified": ss.open(root, verify_reads=True)}
    n = len(stores["plain"])
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, n, BATCH) for _ in range(100)]
    epoch = [np.arange(a, min(a + EPOCH_BATCH, n)) for a in range(0, n, EPOCH_BATCH)]
    for f in Path(root).rglob("*.npy"):  # page cache warm
        f.read_bytes()
    for store in stores.values():
        for b in batches[:WARM]:
            store.get_batch(b)
    best: dict[tuple[str, str], float] = {}
    for _ in range(7):
        for name, store in stores.items():
            t = time.perf_counter()
            for b in batches:
                store.get_batch(b)
            best["random", name] = min(best.get(("random", name), 1e9), (time.perf_counter() - t) / len(batches))
            t = time.perf_counter()
            for _out in store.iter_batches(epoch):
                pass
            best["epoch", name] = min(best.get(("epoch", name), 1e9), time.perf_counter() - t)
    for kind, unit, scale in (("random", "ms per batch of 256", 1e3), ("epoch", "s per epoch", 1.0)):
        plain, checked = best[kind, "plain"], best[kind, "verified"]
        print(f"{kind:7s} {unit}: plain {plain * scale:.3f}, verified {checked * scale:.3f}, "
              f"ratio {plain / checked:.2f} (best of 7, one process)")


def _timed(fn: Any, *args: Any) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--data", type=Path, default=REPO / "bench" / "data" / "verify_reads")
    ap.add_argument("--src", type=Path, default=REPO / "src")
    ap.add_argument("--granularity", action="store_true")
    ap.add_argument("--interleaved", action="store_true")
    ap.add_argument("--case", nargs=3, help=argparse.SUPPRESS)  # (root, kind, verify): run one case, print JSON
    args = ap.parse_args()
    sys.path.insert(0, str(args.src.resolve()))
    if args.case:
        root, kind, verify = args.case
        print(json.dumps(case(root, kind, verify == "1")))
        return
    if args.granularity:
        granularity()
        return
    args.data.mkdir(parents=True, exist_ok=True)
    root = build(args.data, RECORDS // (10 if args.quick else 1))
    if args.interleaved:
        interleaved(root)
        return
    times: dict[tuple[str, bool], list[float]] = {}
    info: dict[tuple[str, bool], dict[str, Any]] = {}
    for _ in range(args.rounds):
        for kind in ("random", "epoch"):
            for verify in (False, True):
                cmd = [sys.executable, __file__, "--src", str(args.src), "--case", str(root), kind, str(int(verify))]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode:
                    raise SystemExit(f"case {kind} (verify={verify}) failed:\n{proc.stderr}")
                got = json.loads(proc.stdout)
                times.setdefault((kind, verify), []).append(got["seconds"])
                info[(kind, verify)] = got
    print(f"store: {root} ({sum(f.stat().st_size for f in root.rglob('*.npy')) / 1e9:.2f} GB); "
          f"medians of {args.rounds} fresh processes per case")
    for kind, unit in (("random", "ms per batch of 256"), ("epoch", "s per epoch")):
        plain = statistics.median(times[(kind, False)])
        checked = statistics.median(times[(kind, True)])
        scale = 1e3 if kind == "random" else 1.0
        extra = ""
        if kind == "epoch":
            gb = info[(kind, False)]["bytes"] / 1e9
            extra = f" ({gb / plain:.2f} GB/s plain, {gb / checked:.2f} GB/s verified)"
        print(f"{kind:7s} {unit}: plain {plain * scale:.3f}, verified {checked * scale:.3f}, "
              f"ratio {plain / checked:.2f}{extra}")


if __name__ == "__main__":
    main()
