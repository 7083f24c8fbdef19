"""PyTorch loader throughput: batches/s of seqstore's loaders vs an in-process loop and a hand-written peer.

Two warm stores (every file read once before the cases, so the page cache holds them):

- ``ragged`` (speech-like): ``features`` float16 (None, 80) of 20-80 frames and ``labels`` int32
  (None,) of 5-30 tokens; 200,000 records (quick: 20,000); batches of 64 records, padded (~512 KB);
- ``scalar`` (tokens): one int32 scalar ``v``; 2,000,000 records (quick: 500,000); batches of 1,024.

Epoch order ``random`` (seed 1), rank 0 of 1. Cases, each in a fresh process:

- ``inprocess``: ``store.get_batch(order.take(...), pad=True)`` + ``torch.from_numpy`` in a plain
  loop -- the limit (ratio 1.0);
- ``dataloader``: what most PyTorch users write: a plain ``torch.utils.data.DataLoader(SeqDataset,
  batch_size=B, shuffle=True, num_workers=K, collate_fn=collate_padded)`` (``RandomSampler``, seeded);
- ``dataloader-floor``: the same DataLoader over a dataset whose every batch is a copy of one made in
  advance with the same shapes (ragged: 64 x 80 x 80 float16 + 64 x 30 int32): torch's own per-batch
  cost, the floor under the ``dataloader`` rows;
- ``sampler``: ``SeqDataLoader(SeqDataset, sampler=EpochSampler, batch_size=B, collate_fn=collate_padded)``
  (``sampler/2`` is ``SeqDataLoader(..., num_workers=2)``);
- ``batch-sampler``: ``SeqDataLoader(SeqDataset, batch_sampler=EpochBatchSampler(max_seqs=B))``;
- ``iterable``: ``SeqDataLoader(IterableSeqDataset(batch=B), batch_size=None)``;
- ``threads``: ``SeqDataLoader(SeqDataset, sampler=EpochSampler, batch_size=B, threads=T)``: ``T``
  helper threads share the gathers with the loop's thread (``threads/0`` would be ``sampler/0``);
- ``procs``: the same with ``procs=K``: ``K`` worker processes gather into a ring of shared buffers;
- ``memmap-peer``: what users write by hand: a ``torch.utils.data.DataLoader`` over a map-style
  dataset on ``np.memmap`` of the same bytes (one flat file per field plus offsets), ``RandomSampler``
  and a ``pad_sequence`` collate (scalars: ``default_collate`` of ints).

``/0`` and ``/2`` are the worker (or thread) counts. Measured over ``--batches`` batches after the
first one (the first batch, which starts the workers, is ``first_batch_s``). Extras:
``batches_per_s``; ``cpu_ms_per_batch`` (CPU of the main process and its workers, from
``/proc/<pid>/stat``, per batch); ``main_anon_mib`` / ``worker_anon_mib``: resident anonymous
memory (``RssAnon``: the process's own heap, not the store's page-cache pages; a forked worker's
count includes pages still shared copy-on-write with its parent) of the main process and of the
larger worker at the end of the walk. The ratio column is ``batches_per_s`` over ``inprocess``'s (> 1 is faster).

``--step-ms S`` sleeps S ms after each batch, a training step that leaves the CPU to the loader (a GPU
step waits on the device): the time per batch is then at least S ms, and what counts is how much of
the gather hides behind the step. A list (``--step-ms 0,1``) runs every case once per step, each step
a group of its own with its own ``inprocess`` baseline (``ragged step=1ms``, ...).

Rounds are interleaved: round r runs every case once before round r + 1 starts (medians over rounds).

Usage: ``python bench/loader.py [--quick] [--repeats R] [--only ragged|scalar] [--cases a,b] [--step-ms S[,S2]]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._peers_side import settle  # noqa: E402
from bench.harness import DATA, Case, print_table, rss_anon, run_cases, section, warm  # noqa: E402

SIZES = {"ragged": 200_000, "scalar": 2_000_000}
QUICK_SIZES = {"ragged": 20_000, "scalar": 500_000}
BATCH = {"ragged": 64, "scalar": 1024}
LENGTH_FIELD: dict[str, str | None] = {"ragged": "features", "scalar": None}
WALK = {"ragged": 1000, "scalar": 1000}
QUICK_WALK = {"ragged": 200, "scalar": 200}
KINDS = ("dataloader", "dataloader-floor", "sampler", "batch-sampler", "iterable", "threads", "procs",
         "memmap-peer")


# ----------------------------------------------------------------------------------------- data


def _paths(kind: str, n: int) -> tuple[Path, Path]:
    base = DATA / "loader" / f"{kind}-{n}"
    return base.with_suffix(".seqstore"), base.with_suffix(".flat")


def ensure_data(kind: str, n: int) -> tuple[Path, Path]:
    """The store and the flat files of the peer (same bytes), built once."""
    import numpy as np

    import seqstore

    store_path, flat = _paths(kind, n)
    done = flat.with_name(flat.name + ".done")
    if done.exists():
        return store_path, flat
    flat.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    chunk = 50_000 if kind == "ragged" else 1_000_000
    if kind == "ragged":
        schema = {"features": seqstore.Field("float16", (None, 80)), "labels": seqstore.Field("int32", (None,))}
    else:
        schema = {"v": seqstore.Field("int32")}
    files = {name: open(flat / f"{name}.bin", "wb") for name in schema}
    lens: dict[str, list[Any]] = {name: [] for name in schema}
    with seqstore.create(store_path, schema, overwrite=True, buffer_bytes=256 << 20) as w:
        for a in range(0, n, chunk):
            k = min(chunk, n - a)
            if kind == "ragged":
                fl = rng.integers(20, 81, size=k).astype(np.int64)
                ll = rng.integers(5, 31, size=k).astype(np.int64)
                feats = rng.standard_normal((int(fl.sum()), 80), dtype=np.float32).astype(np.float16)
                labs = rng.integers(0, 1000, size=int(ll.sum()), dtype=np.int32)
                w.append_batch({"features": (feats, fl), "labels": (labs, ll)})
                files["features"].write(feats.tobytes())
                files["labels"].write(labs.tobytes())
                lens["features"].append(fl)
                lens["labels"].append(ll)
            else:
                v = np.arange(a, a + k, dtype=np.int32)
                w.append_batch({"v": v})
                files["v"].write(v.tobytes())
    for name, f in files.items():
        f.close()
        if lens[name]:
            ln = np.concatenate(lens[name])
            np.save(flat / f"{name}.offsets.npy", np.concatenate([[0], np.cumsum(ln)]).astype(np.int64))
    done.touch()
    return store_path, flat


# ------------------------------------------------------------------------------------- the peer


class MemmapDataset:
    """A map-style dataset over ``np.memmap`` of flat files (what a user writes by hand)."""

    def __init__(self, flat: str, kind: str) -> None:
        self.flat, self.kind = flat, kind
        self._maps: dict[str, Any] | None = None

    def _open(self) -> dict[str, Any]:
        import numpy as np

        if self._maps is None:
            if self.kind == "ragged":
                self._maps = {
                    "features": np.memmap(f"{self.flat}/features.bin", dtype=np.float16, mode="r").reshape(-1, 80),
                    "labels": np.memmap(f"{self.flat}/labels.bin", dtype=np.int32, mode="r"),
                    "features_off": np.load(f"{self.flat}/features.offsets.npy"),
                    "labels_off": np.load(f"{self.flat}/labels.offsets.npy"),
                }
            else:
                self._maps = {"v": np.memmap(f"{self.flat}/v.bin", dtype=np.int32, mode="r")}
        return self._maps

    def __len__(self) -> int:
        m = self._open()
        return len(m["features_off"]) - 1 if self.kind == "ragged" else len(m["v"])

    def __getitem__(self, i: int) -> Any:
        import numpy as np
        import torch

        m = self._open()
        if self.kind == "scalar":
            return int(m["v"][i])
        fo, lo = m["features_off"], m["labels_off"]
        return (torch.from_numpy(np.array(m["features"][fo[i]:fo[i + 1]])),
                torch.from_numpy(np.array(m["labels"][lo[i]:lo[i + 1]])))

    def __getstate__(self) -> dict[str, Any]:
        return {"flat": self.flat, "kind": self.kind, "_maps": None}


class FloorDataset:
    """The DataLoader's own cost: every batch is one made in advance, of the size the ``kind``'s padded
    batches have (a copy of it, as a gather would make), so what a worker does beyond that copy is
    torch's: the sampler, the fetch, the batch pickled into shared memory and unpickled in the loop."""

    def __init__(self, kind: str, n: int) -> None:
        self.kind, self.n = kind, n
        self._batch: dict[str, Any] | None = None

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        import torch

        if self._batch is None:
            b = len(indices)
            self._batch = ({"features": torch.zeros(b, 80, 80, dtype=torch.float16),
                            "features_lengths": torch.full((b,), 50), "labels": torch.zeros(b, 30, dtype=torch.int32),
                            "labels_lengths": torch.full((b,), 17)} if self.kind == "ragged"
                           else {"v": torch.zeros(b, dtype=torch.int32)})
        return {k: v.clone() for k, v in self._batch.items()}

    def __getstate__(self) -> dict[str, Any]:
        return {"kind": self.kind, "n": self.n, "_batch": None}


def _as_is(batch: Any) -> Any:
    return batch


def pad_collate(samples: list[Any]) -> dict[str, Any]:
    import torch
    from torch.nn.utils.rnn import pad_sequence

    feats, labs = zip(*samples)
    return {
        "features": pad_sequence(list(feats), batch_first=True),
        "features_lengths": torch.tensor([len(f) for f in feats]),
        "labels": pad_sequence(list(labs), batch_first=True),
        "labels_lengths": torch.tensor([len(x) for x in labs]),
    }


# ---------------------------------------------------------------------------------------- cases


def _children() -> list[int]:
    """Pids of this process's children (the DataLoader workers)."""
    pids: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids += [int(x) for x in f.read().split()]
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return pids


def _cpu(pid: int) -> float:
    """utime + stime of a process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _loader(kind: str, mode: str, store: str, flat: str, workers: int) -> tuple[Any, Any]:
    """(iterable of batches, object with set_epoch or None) of one case."""
    import torch  # noqa: F401
    from torch.utils.data import DataLoader, RandomSampler

    from seqstore.data import StoreDataset
    from seqstore.torch import (
        EpochBatchSampler,
        EpochSampler,
        IterableSeqDataset,
        SeqDataLoader,
        SeqDataset,
        collate_padded,
    )

    b = BATCH[kind]
    ds = StoreDataset(store, ordering="random", seed=1, length_field=LENGTH_FIELD[kind])
    if mode == "memmap-peer":
        peer = MemmapDataset(flat, kind)
        g = torch.Generator().manual_seed(1)
        return DataLoader(peer, sampler=RandomSampler(peer, generator=g), batch_size=b, num_workers=workers,
                          collate_fn=pad_collate if kind == "ragged" else None), None
    if mode == "iterable":
        return SeqDataLoader(IterableSeqDataset(ds, batch=b), batch_size=None, num_workers=workers), None
    if mode == "dataloader-floor":  # torch's per-batch cost alone, for the dataloader rows
        g = torch.Generator().manual_seed(1)
        floor = FloorDataset(kind, len(ds.store))
        return DataLoader(floor, batch_size=b, shuffle=True, generator=g, num_workers=workers,
                          collate_fn=_as_is), None
    sds = SeqDataset(ds)
    if mode == "dataloader":  # what most PyTorch users write
        g = torch.Generator().manual_seed(1)
        return DataLoader(sds, batch_size=b, shuffle=True, generator=g, num_workers=workers,
                          collate_fn=collate_padded), None
    if mode == "batch-sampler":
        return SeqDataLoader(sds, batch_sampler=EpochBatchSampler(ds, max_seqs=b), num_workers=workers,
                             collate_fn=collate_padded), None
    if mode == "sampler":
        return SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=b, num_workers=workers,
                             collate_fn=collate_padded), None
    if mode in ("threads", "procs"):
        return SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=b, collate_fn=collate_padded,
                             **{mode: workers}), None
    raise ValueError(mode)


def _inprocess(kind: str, store: str) -> Any:
    """The limit: get_batch + from_numpy in a loop over the epoch order."""
    import numpy as np
    import torch

    from seqstore.data import StoreDataset

    b = BATCH[kind]
    ds = StoreDataset(store, ordering="random", seed=1, length_field=LENGTH_FIELD[kind])
    order = ds.epoch_order(1)
    st = ds.store
    for k in range(len(order) // b):
        batch = st.get_batch(order.take(np.arange(k * b, (k + 1) * b, dtype=np.int64)), pad=True)
        out = {}
        for name, v in batch.items():
            if isinstance(v, tuple):
                out[name] = torch.from_numpy(v[0])
                out[name + "_lengths"] = torch.from_numpy(v[1])
            else:
                out[name] = torch.from_numpy(v)
        yield out


def case_walk(kind: str, mode: str, store: str, flat: str, workers: int, batches: int,
              step_ms: float = 0.0) -> dict[str, Any]:
    """Walk ``batches`` batches (after the first) of one loader; see the module docstring."""
    import torch

    torch.set_num_threads(1)
    if mode == "inprocess":
        loader: Any = _inprocess(kind, store)
    else:
        loader, _ = _loader(kind, mode, store, flat, workers)
    gc.collect()
    gc.freeze()
    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    first_s = time.perf_counter() - t0
    settle()  # the walk measures the steady state (bench._peers_side.settle)
    pids = _children()
    wc0 = [_cpu(p) for p in pids]
    c0 = time.process_time()
    n = 0
    t1 = time.perf_counter()
    with section("walk"):
        for _ in range(batches):
            next(it)
            n += 1
            if step_ms:
                time.sleep(step_ms / 1e3)  # a training step that leaves the CPU (a GPU step waits on the device)
    dt = time.perf_counter() - t1
    cpu = time.process_time() - c0 + sum(_cpu(p) - c for p, c in zip(pids, wc0))
    wanon = max((rss_anon(p) for p in pids), default=0)
    manon = rss_anon()
    assert first is not None
    del it
    return {
        "batches_per_s": n / dt,
        "cpu_ms_per_batch": cpu / n * 1e3,
        "first_batch_s": first_s,
        "main_anon_mib": manon / 2**20,
        "worker_anon_mib": wanon / 2**20,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small stores, 200 batches, 1 run")
    p.add_argument("--repeats", type=int, default=None, help="runs per case (default 3, quick 1)")
    p.add_argument("--only", choices=("ragged", "scalar"), default=None)
    p.add_argument("--cases", default=None, help="comma-separated subset of " + ",".join(KINDS))
    p.add_argument("--workers", default="0,2", help="worker / thread counts (default 0,2)")
    p.add_argument("--batches", type=int, default=None,
                   help="batches walked after the first (default 1000, quick 200; a ragged epoch is 3,125)")
    p.add_argument("--step-ms", default="0",
                   help="sleep this long after each batch, as a training step that leaves the CPU (default 0); "
                        "a comma-separated list runs each case once per step")
    args = p.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    sizes = QUICK_SIZES if args.quick else SIZES
    walk = QUICK_WALK if args.quick else WALK
    if args.batches:
        walk = {kind: args.batches for kind in walk}
    modes = KINDS if args.cases is None else tuple(args.cases.split(","))
    counts = [int(x) for x in args.workers.split(",")]
    steps = [float(x) for x in args.step_ms.split(",")]
    cases = []
    for kind in ("ragged", "scalar"):
        if args.only and kind != args.only:
            continue
        store, flat = ensure_data(kind, sizes[kind])
        warm(store, flat)
        for step in steps:
            group = kind if len(steps) == 1 else f"{kind} step={step:g}ms"
            common = {"kind": kind, "store": str(store), "flat": str(flat), "batches": walk[kind], "step_ms": step}
            cases.append(Case("inprocess", "bench.loader:case_walk", {**common, "mode": "inprocess", "workers": 0},
                              group=group, metric="batches_per_s"))
            for mode in modes:
                for w in counts:
                    if mode in ("threads", "procs") and w == 0:
                        continue  # threads=0 / procs=0 is sampler/0
                    cases.append(Case(f"{mode}/{w}", "bench.loader:case_walk",
                                      {**common, "mode": mode, "workers": w}, group=group, metric="batches_per_s"))
    suffix = "" if steps == [0.0] else "_step" + "-".join(f"{s:g}" for s in steps) + "ms"
    name = ("loader_quick" if args.quick else "loader") + suffix
    results = run_cases(name, cases, baseline="inprocess", repeats=repeats, interleave=True,
                        meta={"sizes": sizes, "batch": BATCH, "walk": walk, "step_ms": steps,
                              "load": os.getloadavg()})
    text = print_table(results, extras=["batches_per_s", "cpu_ms_per_batch", "first_batch_s", "main_anon_mib",
                                        "worker_anon_mib"])
    text += f"\nload average before the run: {' '.join(f'{x:.2f}' for x in results['meta']['load'])}; " \
            f"after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
    print(text.splitlines()[-1])
    (Path(__file__).resolve().parent / "results" / f"{name}.md").write_text(text)


if __name__ == "__main__":
    main()
