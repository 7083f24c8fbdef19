"""Helpers of the seqstore.torch tests: small stores, simulated ranks x DataLoader workers."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

import seqstore
from seqstore import Field


def make_store(path: Path, n: int, seed: int = 0, shard_records: int = 64, max_len: int = 12) -> np.ndarray:
    """A store of n records: ``x`` float32 (T, 3) with T in 1..max_len (x[t, 0] = record index),
    ``spk`` int16, ``w`` bfloat16 (2,). Returns the lengths."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, max_len + 1, n)
    x = np.zeros((int(lens.sum()), 3), np.float32)
    x[:, 0] = np.repeat(np.arange(n), lens)
    x[:, 1] = rng.standard_normal(len(x))
    with seqstore.create(path, {"x": Field("float32", (None, 3)), "spk": Field("int16"), "w": Field("bfloat16", (2,))},
                         max_shard_records=shard_records) as wr:
        wr.append_batch({"x": (x, lens), "spk": (np.arange(n) % 7).astype(np.int16),
                         "w": np.full((n, 2), 1.5, np.float32)})
    return lens


@contextmanager
def as_worker(worker: int, workers: int) -> Iterator[None]:
    """Pretend to run inside DataLoader worker ``worker`` of ``workers``."""
    with mock.patch("seqstore.torch.iterable.worker_topology", return_value=(worker, workers)):
        yield


def round_robin(per_worker: list[list[Any]]) -> list[Any]:
    """What a DataLoader (in_order=True) hands out: one item per live worker in turn."""
    out: list[Any] = []
    its = [iter(w) for w in per_worker]
    live = list(range(len(its)))
    while live:
        still = []
        for w in live:
            item = next(its[w], None)
            if item is not None:
                out.append(item)
                still.append(w)
        # a worker that ran dry drops out; order among the others is kept
        live = still
    return out


def simulate(make: Callable[[int, int], Any], world: int, workers: int,
             state: dict[str, Any] | None = None) -> list[list[np.ndarray]]:
    """Per rank, the index arrays the rank's DataLoader hands out (ranks simulated, workers simulated by
    pickled copies of the dataset iterated under ``as_worker``). ``make(rank, world)`` builds the dataset."""
    ranks = []
    for r in range(world):
        ds = make(r, world)
        if state is not None:
            ds.load_state_dict(state)
        per_worker = []
        for w in range(workers):
            copy = pickle.loads(pickle.dumps(ds))
            with as_worker(w, workers):
                per_worker.append(list(copy.iter_indices()))
        ranks.append(round_robin(per_worker))
    return ranks


class LoggedGatherer:
    """A :class:`~seqstore.torch._direct.Gatherer` that appends ``prefetch K`` / ``gather K`` (K: a batch's
    first index) to the file ``log`` as it is asked (picklable: loader workers get a copy)."""

    def __init__(self, gather: Any, log: Path) -> None:
        self.gather, self.log = gather, log

    def _note(self, what: str, idx: Any) -> None:
        with open(self.log, "a") as f:
            f.write(f"{what} {int(idx[0])}\n")

    def prefetch(self, run: list[Any]) -> None:
        for idx in run:
            self._note("prefetch", idx)
        self.gather.prefetch(run)

    def __call__(self, idx: Any) -> Any:
        self._note("gather", idx)
        return self.gather(idx)
