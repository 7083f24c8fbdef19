"""``PackedIterableDataset``: a :class:`seqstore.data.PackedDataset` as a torch ``IterableDataset``.

Each of the ``S = W x K`` streams (rank ``r`` of ``W``, DataLoader worker ``w`` of ``K``) is share
``w * W + r`` of the packed dataset and yields batches of ``batch_size`` packed sequences (use
``DataLoader(batch_size=None)``). The DataLoader reads a rank's workers round-robin
(``in_order=True``), so after every rank took ``c`` batches, worker ``w``'s share made
``ceil((c - w) / K)`` of them. ``state_dict(consumed=c, num_workers=K)`` replays the packing of all
``S`` shares in this process from lengths alone (no token is read; incrementally from the previous
call) and returns the packed dataset's state: the same dict on every rank, loadable into any world
size or worker count.

``SeqDataLoader(threads=T)`` / ``SeqDataLoader(procs=K)`` (no DataLoader workers): the loop's process
plans the rank's one share (``W`` shares, as with ``num_workers=0``: the same batches and states) and
the reading and filling of each batch (``get_batch`` of its documents, the numba fill; the bulk of the
work) run on ``T`` helper threads besides the loop's (:func:`~seqstore.torch._direct.run_ordered`) or
in ``K`` worker processes that write into a ring of shared buffers
(:func:`~seqstore.torch._ring.run_processes`); a batch's plan is one int64 array.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..data._lengths import check_int, check_optional_int
from ..data.packing import PackedDataset, PackedStream
from ._convert import resolve_topology, worker_topology
from ._direct import ahead_in_runs, run_ordered
from ._epoch import SharedInts, check_epoch
from ._ring import run_processes
from ._state import StateError

__all__ = ["PackedIterableDataset"]

#: batches whose documents are asked for together on object storage without helpers (a run, as in iter_batches)
_RUN = 16


class PackedIterableDataset(IterableDataset[dict[str, torch.Tensor]]):
    """Batches of packed sequences of ``packed``, sharded over ranks x DataLoader workers (see the module).

    ``num_batches``: batches this rank yields per iteration (None: endless; the loop stops when it
    wants); the next iteration continues where the last finished one stopped. ``epoch``: where a run
    without a loaded state starts (``set_epoch`` before the first iteration). A batch is a dict of
    tensors: ``tokens``, ``labels``, ``position_ids`` int64 (B, seq_len), ``loss_mask`` bool,
    ``cu_seqlens`` int32, ``max_seqlen`` (an int).
    """

    _kind = "PackedIterableDataset"

    def __init__(self, packed: PackedDataset, *, batch_size: int, rank: int | None = None,
                 world_size: int | None = None, num_batches: int | None = None, epoch: int = 1) -> None:
        if not isinstance(packed, PackedDataset):
            raise TypeError(f"{self._kind}: expected a seqstore.data.PackedDataset, got {type(packed).__name__}")
        self.packed = packed
        self.batch_size = check_int(batch_size, f"{self._kind}: batch_size", 1)
        self.epoch = check_epoch(epoch, self._kind)
        self.num_batches = check_optional_int(num_batches, f"{self._kind}: num_batches", 0)
        self.rank, self.world_size = resolve_topology(rank, world_size, self._kind)
        self._state: dict[str, Any] | None = None  # resume point of the next iteration (None: fresh)
        self._replay: tuple[int, list[PackedStream], list[int]] | None = None
        self._ended: tuple[int, int] | None = None  # (batches, workers) of an iteration run to its end
        self.generation = 0  # bumped at each new resume point (SeqDataLoader's count of batches restarts)
        self._shared = SharedInts(3)  # (generation, epoch, whether a state is loaded) of the main process
        self._publish()

    def _publish(self) -> None:
        self._shared.publish(self.generation, self.epoch, self._state is not None)

    def _adopt(self) -> None:
        """In a DataLoader worker: take the main process's ``set_epoch``; a state loaded there since this
        copy was made cannot come along (a dict), so that is an error rather than batches made again."""
        generation, epoch, stateful = self._shared.read()
        if generation == self.generation:
            return
        if stateful or self._state is not None:
            raise StateError(f"{self._kind}: a state was loaded in the main process after this DataLoader worker "
                             "started; persistent_workers=True keeps the workers' first copy of the dataset, which "
                             "cannot receive it: use persistent_workers=False (or SeqDataLoader)")
        self.epoch, self.generation, self._replay = epoch, generation, None

    # --------------------------------------------------------------------------------- iteration

    def _shares(self, num_workers: int) -> list[dict[str, Any]]:
        return self.packed.shares(self._state, self.world_size * num_workers, self.epoch)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        worker, workers = worker_topology()
        if get_worker_info() is not None:
            self._adopt()
        build = _Build(self.packed, ring=False)
        plans = self._plans(worker, workers)
        for plan in ahead_in_runs(plans, build.prefetch, _RUN) if self.packed.remote else plans:
            yield build(plan)

    def _plans(self, worker: int = 0, workers: int = 1) -> Iterator[np.ndarray[Any, Any]]:
        """The batches of DataLoader worker ``worker`` of ``workers`` as plans: share ``worker * W + rank`` of
        ``W x workers``, ``ceil((num_batches - worker) / workers)`` of them (without workers: share ``rank``)."""
        share, total = worker * self.world_size + self.rank, self.world_size * workers
        stream = self.packed.open(self._shares(workers)[share], share, total)
        count = None if self.num_batches is None else max(0, -(-(self.num_batches - worker) // workers))
        for _ in itertools.count() if count is None else range(count):
            yield stream.plan(self.batch_size)

    def parallel(self, *, threads: int = 0, procs: int = 0, context: Any = None,
                 pin: bool = False, ahead: int = 0, timeout: float = 0) -> Iterator[dict[str, Any]]:
        """This rank's batches (as :meth:`__iter__` without workers yields them) read and filled by
        ``threads`` helper threads or ``procs`` worker processes (``context``: their start method;
        ``ahead``: the batches in a run whose documents are asked for a run early;
        ``timeout``: seconds a worker may take to answer; see :func:`~seqstore.torch._ring.run_processes`);
        planned here. ``SeqDataLoader(threads=, procs=)`` iterates this."""
        plans = self._plans()
        if procs:
            first_plan = next(plans, None)
            if first_plan is None:
                return
            ring = _Build(self.packed, ring=True)
            for batch in run_processes(ring(first_plan), plans, ring, procs,  # type: ignore[arg-type]
                                       context=context, pin=pin, ahead=ahead, timeout=timeout):
                yield {**batch, "max_seqlen": int(batch["max_seqlen"])}
            return
        build = _Build(self.packed, ring=False)
        for batch in run_ordered(ahead_in_runs(plans, build.prefetch, ahead) if ahead else plans, build, threads,
                                 timeout):
            yield {k: (v.pin_memory() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()} \
                if pin else batch

    # ------------------------------------------------------------------------------------- state

    def set_epoch(self, epoch: int) -> None:
        """Where a run without a loaded state or consumed batches starts; ignored once it has a position
        (the packed stream is endless: it goes on into the following epochs by itself)."""
        epoch = check_epoch(epoch, self._kind)
        if self._state is None and self._ended is None and epoch != self.epoch:
            self.epoch = epoch
            self._replay = None
            self.generation += 1
            self._publish()

    def begin(self) -> None:
        """A new iteration starts from the current resume point (``SeqDataLoader`` calls this): after
        the one that ran to its end, if any."""
        if self._ended is not None:
            self._state = self.state_dict(self._ended[0], num_workers=self._ended[1])
            self._ended = None
            self._publish()
        self._replay = None

    def finish_epoch(self, num_workers: int = 0) -> None:
        """An iteration of ``num_batches`` ran to its end on a DataLoader with ``num_workers`` workers:
        the next one continues after it (``SeqDataLoader`` calls this; ``state_dict(num_batches)`` still
        answers for the iteration that ended until the next begins; with a plain DataLoader, call
        ``load_state_dict(state_dict(num_batches, num_workers=K))`` instead)."""
        k = check_optional_int(num_workers, f"{self._kind}: num_workers", 0) or 0
        if self.num_batches is not None:
            self._ended = (self.num_batches, k)

    def state_dict(self, consumed: int | None = None, *, num_workers: int | None = None) -> dict[str, Any]:
        """The state after every rank took ``consumed`` batches of this iteration from a DataLoader with
        ``num_workers`` workers (0 counts as 1). Replays the packing of every share from lengths only."""
        c = 0 if consumed is None else check_int(consumed, f"{self._kind}: consumed", 0)
        workers = check_optional_int(num_workers, f"{self._kind}: num_workers", 0) or 0
        k = max(1, workers)
        if self._replay is None or self._replay[0] != k:
            shares = self._shares(k)
            total = len(shares)
            self._replay = (k, [self.packed.open(st, s, total) for s, st in enumerate(shares)], [0] * total)
        _, streams, done = self._replay
        for s, stream in enumerate(streams):
            w = s // self.world_size
            items = max(0, -(-(c - w) // k))
            if items < done[s]:
                raise ValueError(f"{self._kind}: consumed went back from an earlier state_dict call ({c})")
            stream.skip((items - done[s]) * self.batch_size)
            done[s] = items
        state = self.packed.state_dict([st.state() for st in streams])
        state["world_size"] = self.world_size
        state["num_workers"] = workers
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (any world size / worker count; same packing config and source)."""
        try:
            self.packed.check_state(state)
        except ValueError as e:
            raise StateError(str(e)) from None
        self._state = state
        self._replay = None
        self._ended = None
        self.generation += 1
        self._publish()

    @property
    def stats(self) -> dict[str, Any]:
        """Counts of the last state (sequences, tokens, documents, padding, truncated, per source)."""
        return dict(self._state["stats"]) if self._state is not None else {}

    def __repr__(self) -> str:
        return (f"PackedIterableDataset({self.packed!r}, batch_size={self.batch_size}, rank={self.rank}, "
                f"world_size={self.world_size})")


class _Build:
    """A batch of tensors from its plan (picklable: a worker process gets a copy). ``ring``: all values
    tensors (``max_seqlen`` 0-d), as the shared-buffer ring carries them."""

    def __init__(self, packed: PackedDataset, *, ring: bool) -> None:
        self.packed, self.ring = packed, ring

    def __call__(self, plan: np.ndarray[Any, Any]) -> dict[str, Any]:
        batch = self.packed.build(plan)
        out: dict[str, Any] = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in batch.items()}
        if self.ring:
            out["max_seqlen"] = torch.tensor(out["max_seqlen"], dtype=torch.int64)
        return out

    def prefetch(self, plans: list[np.ndarray[Any, Any]]) -> None:
        """Start reading the documents of later batches' plans (:meth:`PackedDataset.prefetch`)."""
        self.packed.prefetch(plans)
