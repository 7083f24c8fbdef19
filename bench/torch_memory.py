"""Per-process memory of PyTorch data loading over an epoch: seqstore.torch vs torch DistributedSampler.

One rank of a 2-rank job (rank 0 of 2, set explicitly: the sampler's work and memory do not depend
on the other rank existing) with 2 DataLoader workers, batches of 1024 records of a cheap store: one
int32 scalar field (4 bytes a record; 1e8 records = 400 MB on disk, generated once under
bench/data/torch/). Cases, each in a fresh process:

- ``seqstore-sampler``: map-style ``SeqDataset`` + ``EpochSampler(ordering="random")``;
- ``seqstore-iterable``: ``IterableSeqDataset(batch=1024)`` sharded over ranks x workers;
- ``torch-distributed``: the same ``SeqDataset`` + ``torch.utils.data.DistributedSampler(shuffle=True)``.

Before the timed part every case calls ``gc.collect(); gc.freeze()`` so that garbage-collection
passes over objects inherited by the forked workers do not copy shared pages (that would show up as
tens of MiB of USS "growth" unrelated to N, in parent and workers alike).

Sections: ``first_batch`` = ``set_epoch`` + ``iter(loader)`` (starts the workers) + the first batch;
``walk`` = the next batches, up to ``--batches`` per rank (default 2000, i.e. 2.05e6 records per
rank) or the whole epoch but its last batch when that is shorter (the workers must be alive to be
measured). Extras, from ``/proc/<pid>/smaps_rollup`` (USS =
Private_Clean + Private_Dirty):

- ``main_anon_mib``: growth of the main process's resident anonymous memory (``RssAnon``) from
  before ``set_epoch`` to the end of the walk: everything it allocated for the epoch, unaffected by
  the fork (the cleanest number for the main process);
- ``main_uss_first_mib``: USS of the rank's main process at the first batch. Forking the workers
  makes every page the main process had shared with them (no longer private), so this is what the
  main process wrote since the fork: the epoch's sampler state (DistributedSampler's index list),
  prefetched batches, allocator slack;
- ``main_uss_mib``: growth of the main process's USS from the first batch to the end of the walk;
- ``worker_uss_mib`` / ``worker_anon_mib``: the larger USS / RssAnon growth of the two workers from
  the first batch to the end;
- ``worker_uss_total_mib``: the larger worker's whole USS at the end (its epoch state included);
- ``batches`` walked and ``records_per_s``.

Usage: ``python bench/torch_memory.py [--quick] [--repeats R] [--batches B]`` (quick: N = 1e5, 1e6).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.harness import DATA, Case, print_table, rss_anon, run_cases, section  # noqa: E402

NS = (1_000_000, 100_000_000)
QUICK_NS = (100_000, 1_000_000)
BATCH = 1024
CHUNK = 10_000_000


def ensure_store(n: int) -> Path:
    """The cheap store of ``n`` records (int32 ``v`` = index), built once."""
    import numpy as np

    import seqstore

    path = DATA / "torch" / f"scalar-{n}.seqstore"
    done = path.with_name(path.name + ".done")
    if done.exists() and path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with seqstore.create(path, {"v": seqstore.Field("int32")}, overwrite=True, buffer_bytes=256 << 20) as w:
        for a in range(0, n, CHUNK):
            w.append_batch({"v": np.arange(a, min(a + CHUNK, n), dtype=np.int32)})
    done.touch()
    return path


def _uss(pid: int | str = "self") -> int:
    """Private_Clean + Private_Dirty of a process, in bytes."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def case_load(path: str, kind: str, batches: int, workers: int = 2) -> dict[str, Any]:
    """One rank (0 of 2) walking ``batches`` batches of an epoch; see the module docstring."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from seqstore.data import StoreDataset
    from seqstore.torch import EpochSampler, IterableSeqDataset, SeqDataset, collate_padded

    torch.set_num_threads(1)
    ds = StoreDataset(path, ordering="random", seed=1)
    sampler: Any
    if kind == "seqstore-iterable":
        it = IterableSeqDataset(ds, batch=BATCH, rank=0, world_size=2)
        loader: DataLoader[Any] = DataLoader(it, batch_size=None, num_workers=workers)
        sampler = it
    else:
        sds = SeqDataset(ds)
        if kind == "seqstore-sampler":
            sampler = EpochSampler(ds, rank=0, world_size=2)
        elif kind == "torch-distributed":
            sampler = DistributedSampler(sds, num_replicas=2, rank=0, shuffle=True, seed=1)
        else:
            raise ValueError(kind)
        loader = DataLoader(sds, sampler=sampler, batch_size=BATCH, num_workers=workers, collate_fn=collate_padded)
    # Forked workers share the parent's pages copy-on-write; a garbage collection pass touching the
    # inherited objects would copy them and count as "growth" in both parent and workers (CPython's own
    # advice for fork servers). Freeze what exists now, in every case alike.
    gc.collect()
    gc.freeze()
    anon0 = rss_anon()
    with section("first_batch"):
        sampler.set_epoch(1)
        iterator = iter(loader)
        first = next(iterator)
    pids = [w.pid for w in getattr(iterator, "_workers", [])]
    w0 = [_uss(p) for p in pids]
    wa0 = [rss_anon(p) for p in pids]
    main0 = _uss()
    # stop one batch short of the epoch's end: the workers must still be alive to be measured
    limit = min(batches, len(loader) - 1)
    n = 1
    t0 = time.perf_counter()
    with section("walk"):
        for _ in range(limit - 1):
            next(iterator)
            n += 1
    dt = time.perf_counter() - t0
    w1 = [_uss(p) for p in pids]
    wa1 = [rss_anon(p) for p in pids]
    main1 = _uss()
    anon1 = rss_anon()
    assert len(next(iter(first.values()))) == BATCH
    del iterator
    return {
        "main_uss_first_mib": main0 / 2**20,
        "main_uss_mib": (main1 - main0) / 2**20,
        "worker_uss_mib": max((b - a for a, b in zip(w0, w1)), default=0) / 2**20,
        "main_anon_mib": (anon1 - anon0) / 2**20,
        "worker_anon_mib": max((b - a for a, b in zip(wa0, wa1)), default=0) / 2**20,
        "worker_uss_total_mib": max(w1, default=0) / 2**20,
        "batches": n,
        "records_per_s": (n - 1) * BATCH / dt if dt > 0 else 0.0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="N = 1e5 and 1e6")
    p.add_argument("--repeats", type=int, default=None, help="runs per case (default 3, quick 1)")
    p.add_argument("--batches", type=int, default=2000, help="batches walked per rank (default 2000)")
    args = p.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    ns = QUICK_NS if args.quick else NS
    cases = []
    for n in ns:
        path = str(ensure_store(n))
        group = f"N={n:.0e}"
        for kind in ("seqstore-sampler", "seqstore-iterable", "torch-distributed"):
            # DistributedSampler at 1e8 holds ~4.6 GiB and takes tens of seconds: once is enough
            rep = 1 if kind == "torch-distributed" and n >= 10**8 else None
            cases.append(Case(kind, "bench.torch_memory:case_load", {"path": path, "kind": kind,
                                                                      "batches": args.batches},
                              group=group, repeats=rep, timeout=1800))
    name = "torch_memory_quick" if args.quick else "torch_memory"
    results = run_cases(name, cases, baseline="torch-distributed", repeats=repeats,
                        meta={"ns": list(ns), "batch": BATCH, "batches": args.batches, "ranks": 2, "workers": 2})
    extras = ["main_anon_mib", "main_uss_first_mib", "main_uss_mib", "worker_uss_mib", "worker_anon_mib",
              "worker_uss_total_mib", "batches", "records_per_s"]
    text = print_table(results, sections=("first_batch", "walk"), extras=extras)
    (Path(__file__).resolve().parent / "results" / f"{name}.md").write_text(text)


if __name__ == "__main__":
    main()
