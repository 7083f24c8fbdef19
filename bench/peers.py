"""seqstore beside MosaicML Streaming and LitData on the same language-model documents.

Data: ``--docs`` documents (default 1,000,000; quick 100,000) of int32 tokens, lognormal lengths with
median 300 (sigma 0.7, clipped to 8..8,192), generated once into ``--data`` (default
/work/bench-data/peers or $SEQSTORE_PEERS_DATA) as flat files, then written by each library into its
own layout: a seqstore store (one ragged field ``tokens``), Streaming's MDS shards
(``ndarray:int32``), LitData's ``optimize`` chunks. The peers run in their own venv
(``bench/.venv-peers``, see ``bench/_peers_side.py``), installed on first use.

Cases (every run a fresh process; rounds interleaved, medians of ``--repeats``; every layout read once
before them, so the page cache holds it), with the peers' defaults as a user gets them:

- ``write``: the whole data set written (seqstore ``append_batch`` of 10,000 documents a call;
  Streaming ``MDSWriter.write`` per document; LitData ``optimize`` with one worker);
- ``open``: ``seqstore.open`` / constructing the peer's ``StreamingDataset``;
- ``epoch``: a shuffled epoch read sample by sample (``for rec in IterableSeqDataset(StoreDataset(...))``;
  the peers' ``StreamingDataset(shuffle=True)``): ``first_sample`` (construction to the first record),
  then ``--records`` records; seqstore with ``random`` (every record anywhere) and ``random_block:256:1``
  (runs of 256 neighbours, the locality LitData's chunk shuffle gives);
- ``loader/W``: batches of 64 with a pad collate a user writes (``pad_sequence``) and ``W`` workers:
  ``SeqDataLoader(SeqDataset, sampler=EpochSampler)`` vs the peers' ``StreamingDataLoader``; seqstore
  with ``random`` and with ``random_block:256:1`` (as in ``epoch``);
- ``random``: ``ds[i]`` for random positions (seqstore ``store[i]``; LitData is given fewer: about
  1,000 records/s);
- ``resume``: a fresh process constructs the loader, loads a state saved after 20 batches and takes
  the first batch; ``exact`` is 1 when that batch equals the one the uninterrupted loader gave.

Usage: ``python bench/peers.py [--quick] [--repeats R] [--docs N] [--only write open epoch loader random resume]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.harness import Case, print_table, run_cases, section, warm  # noqa: E402

DEFAULT_DATA = Path(os.environ.get("SEQSTORE_PEERS_DATA", "/work/bench-data/peers"))
GROUPS = ("write", "open", "epoch", "loader", "random", "resume")
BATCH = 64
RESUME_AFTER = 20


def ensure_docs(root: Path, n: int) -> Path:
    """Flat ``tokens.npy`` / ``offsets.npy`` of ``n`` documents, generated once."""
    import numpy as np

    flat = root / f"docs-{n}"
    if (flat / "offsets.npy").exists():
        return flat
    flat.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(300), 0.7, n), 8, 8192).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.lib.format.open_memmap(flat / "tokens.npy", mode="w+", dtype=np.int32, shape=(int(offsets[-1]),))
    step = 50_000_000
    for a in range(0, len(tokens), step):
        b = min(a + step, len(tokens))
        tokens[a:b] = rng.integers(0, 50_000, size=b - a, dtype=np.int32)
    tokens.flush()
    del tokens
    np.save(flat / "offsets.npy", offsets)
    return flat


def _loader(store: str, workers: int, ordering: str = "random") -> Any:
    from bench._peers_side import _pad
    from seqstore.data import StoreDataset
    from seqstore.torch import EpochSampler, SeqDataLoader, SeqDataset

    ds = StoreDataset(store, ordering=ordering, seed=1)
    return SeqDataLoader(SeqDataset(ds), sampler=EpochSampler(ds), batch_size=BATCH, num_workers=workers,
                         collate_fn=_pad)


# ------------------------------------------------------------------------------------------ seqstore cases


def case_write(flat: str, out: str) -> dict[str, Any]:
    import shutil

    import numpy as np

    import seqstore

    tokens = np.load(Path(flat) / "tokens.npy", mmap_mode="r")
    offsets = np.load(Path(flat) / "offsets.npy")
    n = len(offsets) - 1
    shutil.rmtree(out, ignore_errors=True)
    with section():
        with seqstore.create(out, {"tokens": seqstore.Field("int32", (None,))}) as w:
            for a in range(0, n, 10_000):
                b = min(a + 10_000, n)
                w.append_batch({"tokens": (tokens[offsets[a] : offsets[b]], np.diff(offsets[a : b + 1]))})
    return {"records": n}


def case_open(out: str) -> dict[str, Any]:
    import seqstore

    with section():
        store = seqstore.open(out)
    return {"records": len(store)}


def case_epoch(out: str, records: int, ordering: str) -> dict[str, Any]:
    from bench._peers_side import timed_epoch
    from seqstore.data import StoreDataset
    from seqstore.torch import IterableSeqDataset

    return timed_epoch(lambda: IterableSeqDataset(StoreDataset(out, ordering=ordering, seed=1)), records)


def _imports() -> None:
    """What the loader cases import, before their sections (the first batch is timed from construction)."""
    import torch  # noqa: F401

    import seqstore.data  # noqa: F401
    import seqstore.torch  # noqa: F401


def case_loader(out: str, workers: int, batches: int, ordering: str = "random") -> dict[str, Any]:
    from bench._peers_side import timed_loader

    _imports()
    return timed_loader(lambda: _loader(out, workers, ordering), batches)


def case_random(out: str, indices: str, count: int) -> dict[str, Any]:
    import seqstore
    from bench._peers_side import timed_random

    return timed_random(seqstore.open(out), indices, count)


def case_resume_prepare(out: str, state: str, after: int) -> dict[str, Any]:
    from bench._peers_side import prepare_resume

    return prepare_resume(lambda: _loader(out, 0), state, after)


def case_resume(out: str, state: str) -> dict[str, Any]:
    from bench._peers_side import timed_resume

    _imports()
    return timed_resume(lambda: _loader(out, 0), state)


# ------------------------------------------------------------------------------------------ driver


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="100,000 documents, 1 run per case")
    p.add_argument("--repeats", type=int, default=None, help="runs per case (default 3, quick 1)")
    p.add_argument("--docs", type=int, default=None, help="documents (default 1,000,000; quick 100,000)")
    p.add_argument("--records", type=int, default=None, help="records per epoch case (default 200,000)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--only", nargs="+", choices=GROUPS, default=list(GROUPS))
    p.add_argument("--no-peers", action="store_true", help="seqstore only")
    p.add_argument("--loader-batches", type=int, default=300,
                   help="batches the loader cases walk after the first (default 300)")
    args = p.parse_args()
    n = args.docs or (100_000 if args.quick else 1_000_000)
    repeats = args.repeats or (1 if args.quick else 3)
    records = min(n, args.records or (50_000 if args.quick else 200_000))
    import numpy as np

    from bench import _peers_side as side

    flat = ensure_docs(args.data, n)
    root = args.data / f"n-{n}"
    root.mkdir(parents=True, exist_ok=True)
    outs = {"seqstore": str(root / "store.seqstore"), "streaming": str(root / "mds"), "litdata": str(root / "litdata")}
    py = None if args.no_peers else side.install()
    if py is None and not args.no_peers:
        print("peers: not installed (see above); seqstore only", file=sys.stderr)
    libs = ["seqstore"] + ([] if py is None else ["streaming", "litdata"])

    def case(lib: str, name: str, func: str, group: str, **kw: Any) -> Case:
        if lib == "seqstore":
            return Case(name, f"bench.peers:{func}", kw, group=group)
        return Case(name, f"bench._peers_side:{func}", {"lib": lib, **kw}, group=group, python=str(py))

    # every layout is written once before the other groups read it (the write group rewrites it)
    for lib in libs:
        done = Path(outs[lib] + ".done")
        if not done.exists():
            kw = {"flat": str(flat), "out": outs[lib]}
            run_cases(f"peers_build_{lib}", [case(lib, lib, "case_write", "build", **kw)], repeats=1, verbose=False)
            done.touch()
    indices = root / "random.npy"
    np.save(indices, np.random.default_rng(7).integers(0, n, 20_000))
    cases: list[Case] = []
    for lib in libs:
        if "write" in args.only:
            cases.append(case(lib, lib, "case_write", "write", flat=str(flat), out=outs[lib] + ".w"))
        if "open" in args.only:
            cases.append(case(lib, lib, "case_open", "open", out=outs[lib]))
        if "epoch" in args.only:
            if lib == "seqstore":
                for o in ("random", "random_block:256:1"):
                    cases.append(case(lib, f"seqstore {o}", "case_epoch", "epoch", out=outs[lib], records=records,
                                      ordering=o))
            else:
                cases.append(case(lib, lib, "case_epoch", "epoch", out=outs[lib], records=records))
        if "loader" in args.only:
            for w in (0, 2):
                cases.append(case(lib, lib, "case_loader", f"loader/{w}", out=outs[lib], workers=w,
                                  batches=args.loader_batches))
                if lib == "seqstore":  # LitData's locality (its chunk shuffle), as in the epoch group
                    cases.append(case(lib, "seqstore random_block:256:1", "case_loader", f"loader/{w}",
                                      out=outs[lib], workers=w, batches=args.loader_batches,
                                      ordering="random_block:256:1"))
        if "random" in args.only:
            cases.append(case(lib, lib, "case_random", "random", out=outs[lib], indices=str(indices),
                              count=1_000 if lib == "litdata" else 20_000))
    if "resume" in args.only:
        prep = [case(lib, lib, "case_resume_prepare", "prepare", out=outs[lib], state=str(root / f"{lib}.state"),
                     after=RESUME_AFTER) for lib in libs]
        run_cases("peers_resume_prepare", prep, repeats=1, verbose=False)
        cases += [case(lib, lib, "case_resume", "resume", out=outs[lib], state=str(root / f"{lib}.state"))
                  for lib in libs]
    baselines = ["litdata", "streaming"] if py is not None else None
    warm(*(Path(outs[lib]) for lib in libs))  # the read cases are warm: every layout in the page cache
    results = run_cases("peers", cases, baseline=baselines, repeats=repeats, interleave=True,
                        meta={"docs": n, "records": records})
    print(f"\n{n:,} documents (int32 tokens, lognormal lengths, median 300); ratios: case / peer "
          "(time: < 1 is faster; records_per_s, batches_per_s: > 1 is faster)\n")
    print_table(results, sections=["main", "first_sample", "epoch", "first_batch", "walk"])


if __name__ == "__main__":
    main()
