"""What a map-style DataLoader worker will be asked for next, so it can read it ahead.

The DataLoader hands batch ``j`` of its batch sampler to worker ``j % num_workers``; an
:class:`EpochBatchSampler` (or a ``BatchSampler`` over an :class:`EpochSampler`) is a pure function of
its O(1) state, so :class:`Foresight` replays the worker's own copy of it lazily (sharing the
sampler's dataset), checks every prediction against the batch actually asked for and stops at the
first mismatch: a wrong guess only costs read-ahead, never changes a batch. With
``persistent_workers=True`` this runs in the first epoch only (docs/torch.md, "Read-ahead in the workers").
"""

from __future__ import annotations

import copy
import itertools
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._convert import worker_topology

__all__ = ["Foresight"]


def _shared(batch_sampler: Any) -> dict[int, Any]:
    """A deepcopy memo that keeps the samplers' datasets shared: the replay copies only the O(1)
    iteration state, not the stores (which would be reopened and their files mapped again)."""
    memo: dict[int, Any] = {}
    node = batch_sampler
    for _ in range(4):  # EpochBatchSampler -> dataset; BatchSampler -> EpochSampler -> dataset
        ds = getattr(node, "dataset", None)
        if ds is not None:
            memo[id(ds)] = ds
        node = getattr(node, "sampler", None)
        if node is None:
            break
    return memo


class Foresight:
    """Replays ``batch_sampler`` in this process and yields the batches to read ahead, ``depth`` of them."""

    def __init__(self, batch_sampler: Any, depth: int) -> None:
        self.batch_sampler = batch_sampler
        self.depth = int(depth)
        self._mine: Iterator[Any] | None = None
        self._queue: deque[np.ndarray[Any, Any]] = deque()
        self._stopped = False

    def __getstate__(self) -> dict[str, Any]:
        return {"batch_sampler": self.batch_sampler, "depth": self.depth}  # a worker starts afresh

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["batch_sampler"], state["depth"])  # type: ignore[misc]

    def reset(self) -> None:
        """Forget the replay (the loader begins a new iteration in this process)."""
        self._mine = None
        self._queue.clear()
        self._stopped = False

    def _pull(self) -> bool:
        assert self._mine is not None
        for batch in self._mine:
            self._queue.append(np.asarray(batch, dtype=np.int64).reshape(-1))
            return True
        return False

    def advance(self, indices: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
        """The batch ``indices`` is being gathered now: the batches to start reading (each returned once)."""
        if self._stopped or self.depth == 0:
            return []
        first = self._mine is None
        if first:
            worker, workers = worker_topology()
            replay = copy.deepcopy(self.batch_sampler, _shared(self.batch_sampler))  # not the loader's own
            self._mine = itertools.islice(iter(replay), worker, None, workers)
            for _ in range(self.depth + 1):  # this batch and the next ``depth``
                if not self._pull():
                    break
        if not self._queue or not np.array_equal(self._queue[0], indices):
            self._stopped = True
            self._queue.clear()
            return []
        self._queue.popleft()
        if first:
            return list(self._queue)
        return [self._queue[-1]] if self._pull() else []
