"""``SeqDataLoader``: a ``torch.utils.data.DataLoader`` that counts what the training loop consumed.

The samplers and the iterable dataset know their resume state only from the items this rank has
*consumed* (workers and prefetching run ahead), so ``SeqDataLoader`` counts the batches it hands out:
``loader.state_dict()`` is exact with any ``num_workers`` / ``prefetch_factor``. It checks the options
the position arithmetic relies on (``in_order=True``; no ``persistent_workers`` with an iterable
dataset). Where the process reads object storage its workers start with ``forkserver`` (or ``spawn``):
the client's threads do not survive ``fork()``. Such workers import the script again, so a script
whose loop is not under ``if __name__ == "__main__":`` is refused with a
:class:`~seqstore.errors.SeqstoreError` before any worker starts (see docs/torch.md).
"""

from __future__ import annotations

import itertools
import pickle
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader

from .._mainguard import check_main_guard, start_method
from ..data._lengths import check_int
from ..io.objects import fork_unsafe as _fork_unsafe
from ..store import Pool
from ._direct import (
    PARALLEL_FROM_BYTES,
    Gatherer,
    ahead_in_runs,
    batch_bytes,
    collate_options,
    direct_plan,
    pinned,
    run_ordered,
)
from ._ring import RunBuffers, run_processes, shared_runs_possible
from ._signals import with_context
from .dataset import SeqDataset
from .iterable import IterableSeqDataset
from .packed import PackedIterableDataset
from .sampler import EpochBatchSampler, EpochSampler

__all__ = ["SeqDataLoader"]

#: batches whose index arrays ``procs=`` workers get early from a remote store, to start their reads
_AHEAD = 16

#: run buffers a ``procs=`` loop on a read-once store keeps for reuse (each new one costs the workers a
#: mapping and its page faults)
_RUN_BUFFERS = 12


class _Discard:
    """A file that keeps nothing written to it."""

    def write(self, data: Any) -> int:
        return memoryview(data).nbytes


def _any_store(dataset: Any, test: Callable[[Any], bool]) -> bool:
    """Whether ``dataset`` reads a store for which ``test(store)`` holds, found by pickling the dataset
    (what a worker receives anyway; a Store pickles as its URL). False when it does not pickle."""
    from ..store import Store

    found = False

    class _Probe(pickle.Pickler):
        def persistent_id(self, obj: Any) -> None:
            nonlocal found
            if isinstance(obj, Store) and test(obj):
                found = True

    try:  # (into a sink that keeps nothing, arrays' buffers written in place: no copy of the dataset's data)
        _Probe(_Discard(), protocol=5).dump(dataset)
    except Exception:  # noqa: BLE001 - not picklable
        return False
    return found


def _own_batches(dataset: Any, collate_fn: Any, sampler: Any, batch_sampler: Any, batch_size: Any) -> bool:
    """Whether seqstore can build a loader's batches itself: a packed dataset, a self-batching iterable,
    or a :class:`SeqDataset` batched by an ``EpochBatchSampler`` or an ``EpochSampler`` + ``batch_size``
    (the DataLoader's own ``BatchSampler``) and collated by seqstore's padding collate."""
    if isinstance(dataset, PackedIterableDataset):
        return True  # planned here, read and filled by the threads / processes (see torch/packed.py)
    if isinstance(dataset, IterableSeqDataset):
        return dataset.batch is not None
    if not isinstance(dataset, SeqDataset) or collate_options(collate_fn) is None:
        return False
    return isinstance(batch_sampler, EpochBatchSampler) or (
        isinstance(sampler, EpochSampler) and batch_size is not None
        and (batch_sampler is None or type(batch_sampler) is BatchSampler))


def _workers_as_procs(dataset: Any, threads: int, kwargs: dict[str, Any]) -> int:
    """``procs`` for a loader given ``num_workers=K`` and no ``procs``: ``K`` (and the DataLoader's own
    worker options taken out of ``kwargs``) where seqstore builds the batches itself (:func:`_own_batches`)
    and no ``worker_init_fn`` asks for the DataLoader's workers; else 0 (the DataLoader's workers, as asked)."""
    workers = kwargs.get("num_workers", 0)
    if not workers or threads or kwargs.get("worker_init_fn") is not None:
        return 0
    if not _own_batches(dataset, kwargs.get("collate_fn"), kwargs.get("sampler"), kwargs.get("batch_sampler"),
                        kwargs.get("batch_size", 1)):
        return 0
    kwargs["num_workers"] = 0
    for name in ("prefetch_factor", "persistent_workers"):  # the DataLoader's workers' options
        kwargs.pop(name, None)
    return int(workers)


def _pinning(pin_memory: bool) -> bool:
    """Whether seqstore's own batches are pinned for ``pin_memory``: as torch's DataLoader decides for its
    batches (an accelerator, not MPS; CUDA before torch 2.6), with its warnings where it does not pin."""
    if not pin_memory:
        return False
    accelerator = getattr(torch, "accelerator", None)
    if not (accelerator.is_available() if accelerator is not None else torch.cuda.is_available()):
        warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device pinned memory "
                      "won't be used.", stacklevel=3)
        return False
    device = accelerator.current_accelerator() if accelerator is not None else None
    if device is not None and device.type == "mps":
        warnings.warn("'pin_memory' argument is set as true but not supported on MPS now, device pinned memory "
                      "won't be used.", stacklevel=3)
        return False
    return True


class SeqDataLoader(DataLoader[Any]):
    """``DataLoader`` with ``state_dict()`` / ``load_state_dict()`` / ``set_epoch()`` for seqstore sources.

    The source is ``sampler=`` an :class:`EpochSampler`, ``batch_sampler=`` an
    :class:`EpochBatchSampler`, or ``dataset=`` an :class:`IterableSeqDataset` (then ``batch_size``
    must be None when the dataset batches itself; in records mode its ``group`` is set to
    ``batch_size``). All other arguments are the DataLoader's.

    Without workers, a :class:`SeqDataset` batched by an ``EpochSampler`` + ``batch_size`` or an
    ``EpochBatchSampler`` and collated by :func:`collate_padded` / :class:`PaddedCollate` (pad value
    0) is built here from the sampler's index arrays, one padded gather per batch (the same batches
    and states as through the DataLoader; :mod:`seqstore.torch._direct`). ``threads=T`` gathers such
    batches (or an iterable dataset's own batches) on ``T`` helper threads besides the loop's;
    ``procs=K`` in ``K`` worker processes that write into a ring of shared buffers
    (:mod:`seqstore.torch._ring`); ``timeout`` bounds the wait for a helper's or a worker's batch. Batches
    under ``PARALLEL_FROM_BYTES`` (128 KiB) are gathered in the loop's thread all the same. Neither goes
    with ``num_workers``; see docs/torch.md for which to use.

    ``num_workers=K`` on such batches (and no ``procs``, ``threads`` or ``worker_init_fn``) is ``procs=K``:
    seqstore's own workers take the DataLoader's place (``loader.procs == K``, ``loader.num_workers ==
    0``; ``prefetch_factor`` and ``persistent_workers`` have nothing to apply to and are dropped;
    ``timeout`` bounds the wait for each worker's batch, as for the DataLoader's). Pass ``procs=0`` with
    ``num_workers=K`` for the DataLoader's workers.
    """

    def __init__(self, dataset: Any, *args: Any, threads: int = 0, procs: int | None = None, **kwargs: Any) -> None:
        if args:
            raise TypeError("SeqDataLoader takes the DataLoader options as keyword arguments")
        self._group: int | None = None  # records mode: the dataset's group (this loader's batch_size)
        if "num_workers" in kwargs:  # (in its own name: it may become procs below)
            kwargs["num_workers"] = check_int(kwargs["num_workers"], "SeqDataLoader: num_workers", 0)
        if procs is None:  # num_workers=K: seqstore's own K worker processes where the batches are its own
            procs = _workers_as_procs(dataset, threads, kwargs)
        threads = check_int(threads, "SeqDataLoader: threads", 0)
        procs = check_int(procs, "SeqDataLoader: procs", 0)
        if threads and procs:
            raise ValueError("SeqDataLoader: choose threads= or procs=, not both")
        if (threads or procs) and (kwargs.get("num_workers", 0) or kwargs.get("worker_init_fn") is not None):
            raise ValueError(f"SeqDataLoader: {'threads' if threads else 'procs'}= replaces the DataLoader's "
                             "workers; it does not go with num_workers > 0 or a worker_init_fn")
        procs_context = kwargs.pop("multiprocessing_context", None) if procs else None
        if not kwargs.get("in_order", True):
            raise ValueError("SeqDataLoader needs in_order=True: the resume position assumes round-robin order")
        if isinstance(dataset, IterableSeqDataset):
            if kwargs.get("persistent_workers", False):
                raise ValueError("SeqDataLoader: persistent_workers=True is not taken for an IterableSeqDataset "
                                 "(its workers start each iteration from the loader's resume point; a plain "
                                 "DataLoader may keep them: set_epoch reaches them)")
            bs = kwargs.get("batch_size", 1)
            if dataset.batch is None:  # (set again where it counts: another loader may share the dataset)
                self._group = dataset.group = 1 if bs is None else int(bs)
            elif bs is not None:
                raise ValueError(f"SeqDataLoader: the dataset makes its own batches (batch={dataset.batch!r}); "
                                 "pass batch_size=None")
        if isinstance(dataset, PackedIterableDataset):
            if kwargs.get("persistent_workers", False) or kwargs.get("batch_size", 1) is not None:
                raise ValueError("SeqDataLoader: a PackedIterableDataset makes its own batches and must reach its "
                                 "workers afresh: pass batch_size=None and no persistent_workers")
        workers = procs or kwargs.get("num_workers", 0)
        chosen = procs_context if procs else kwargs.get("multiprocessing_context")
        if workers and chosen is None and _fork_unsafe() and _any_store(dataset, lambda st: not st.source.fork_safe):
            # this process reads object storage: forked workers could not (obstore's threads do not survive
            # fork()), so they start from a fresh interpreter and reopen the store from its pickle (a dataset
            # that does not pickle: fork, as before)
            import multiprocessing

            chosen = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
            if not procs:
                kwargs["multiprocessing_context"] = chosen
        self._procs_context = chosen if procs else None
        # threads= / procs= on a remote store read the next runs of batches early; found here, once (the
        # probe pickles the dataset: per epoch that is a copy of every array it holds)
        self._ahead = _AHEAD if (procs or threads) and _any_store(dataset, lambda store: store.is_remote) else 0
        super().__init__(dataset, **kwargs)
        self._consumed = 0
        self._counted: Any = None  # the source's resume point (its generation) that _consumed counts from
        self.threads = threads
        self.procs = procs
        if (threads or procs) and not _own_batches(self.dataset, self.collate_fn, self.sampler, self.batch_sampler,
                                                   self.batch_size):
            raise ValueError(
                f"SeqDataLoader: {'threads' if threads else 'procs'}= needs seqstore's own batches: a "
                "SeqDataset with sampler=EpochSampler and batch_size, or batch_sampler=EpochBatchSampler, and "
                "collate_fn=collate_padded / PaddedCollate (pad_value 0); or an IterableSeqDataset with batch= set; "
                "or a PackedIterableDataset"
            )

    def _source(self) -> EpochSampler | EpochBatchSampler | IterableSeqDataset | PackedIterableDataset:
        ds = self.dataset
        if isinstance(ds, IterableSeqDataset) and self._group is not None and ds.group != self._group:
            ds.group = self._group  # records mode: this loader's batch size (another loader may share the dataset)
        if isinstance(ds, (IterableSeqDataset, PackedIterableDataset)):
            return ds
        if isinstance(self.batch_sampler, EpochBatchSampler):
            return self.batch_sampler
        if isinstance(self.sampler, EpochSampler):
            return self.sampler
        raise TypeError("SeqDataLoader: no seqstore source to take the state from; pass sampler=EpochSampler(...), "
                        "batch_sampler=EpochBatchSampler(...) or an IterableSeqDataset")

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        src = self._source()
        src.begin()
        self._consumed = 0
        self._counted = src.generation
        plan = direct_plan(self, self.threads or self.procs) if self.num_workers == 0 else None
        packed = isinstance(src, PackedIterableDataset) and bool(self.threads or self.procs)
        # (the DataLoader's path pins, or warns, by itself)
        pin = (packed or plan is not None) and _pinning(bool(self.pin_memory))
        batches: Iterator[Any]
        if isinstance(src, PackedIterableDataset) and packed:
            if self.procs:
                check_main_guard(start_method(self._procs_context), self.procs)
            batches = src.parallel(threads=self.threads, procs=self.procs, context=self._procs_context, pin=pin,
                                   ahead=self._ahead, timeout=self.timeout)
        elif plan is not None:  # built here, straight from the sampler's index arrays (see _direct)
            arrays, gather, stream = plan
            if self.threads or self.procs:
                batches = self._parallel(arrays, gather, stream, pin)
            else:
                batches = stream(arrays) if stream is not None else map(gather, arrays)
                if pin:
                    batches = map(pinned, batches)
        else:
            if isinstance(self.dataset, SeqDataset):
                # workers replay the batch sampler to read their next batches ahead (checked per batch)
                self.dataset.foresee(self.batch_sampler)
            if self.num_workers > 0:  # workers in a fresh interpreter re-run an unguarded script: say so first
                check_main_guard(start_method(self.multiprocessing_context), self.num_workers)
            batches = super().__iter__()
            if self.num_workers > 0:  # (torch's error names the worker, not the batch)
                batches = self._naming_the_batch(batches)
        ended = False
        sampler = src if isinstance(src, (EpochSampler, EpochBatchSampler)) else None
        try:
            for batch in batches:
                self._consumed += 1
                if sampler is not None:  # (its own state_dict() then counts what the loop has, not its read-ahead)
                    sampler.handed_out(self._items(sampler))
                yield batch
            ended = True
        finally:  # broken off: the next iteration starts at this one's resume point again
            if not ended and not isinstance(src, PackedIterableDataset):
                src.broken_off()
        if isinstance(src, PackedIterableDataset):
            src.finish_epoch(self.num_workers)
        else:
            src.finish_epoch()

    def _naming_the_batch(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches``; an error drawing one says which batch of the iteration it was (its class kept)."""
        try:
            yield from batches
        except Exception as exc:
            raise with_context(exc, f"SeqDataLoader: batch {self._consumed} of this iteration")  # noqa: B904 - its cause set

    def _parallel(self, arrays: Iterator[Any], gather: Gatherer,
                  stream: Callable[[Iterator[Any]], Iterator[Any]] | None, pin: bool) -> Iterator[Any]:
        """Batches gathered by the helper threads / processes. The first batch is gathered here; if it is
        smaller than ``PARALLEL_FROM_BYTES`` the rest are too (a hand-over would cost more than the gather),
        by ``stream`` where there is one (the read-ahead of the loop without helpers)."""
        first_idx = next(arrays, None)
        if first_idx is None:
            return
        if self.procs and gather.reads_once and shared_runs_possible():
            yield from self._parallel_fetched(itertools.chain([first_idx], arrays), gather, pin)
            return
        first = gather(first_idx)
        if self.procs and batch_bytes(first) >= PARALLEL_FROM_BYTES:
            check_main_guard(start_method(self._procs_context), self.procs)
            yield from run_processes(first, arrays, gather, self.procs, context=self._procs_context, pin=pin,
                                     ahead=self._ahead, timeout=self.timeout)
            return
        if batch_bytes(first) >= PARALLEL_FROM_BYTES:  # (a remote store's reads asked for in runs, as inline)
            ahead = ahead_in_runs(arrays, gather.prefetch, self._ahead) if self._ahead else arrays
            rest: Iterator[Any] = run_ordered(ahead, gather, self.threads, self.timeout)
        else:
            rest = map(gather, arrays) if stream is None else stream(arrays)
        for batch in itertools.chain([first], rest):
            yield pinned(batch) if pin else batch

    def _parallel_fetched(self, arrays: Iterator[Any], gather: Gatherer, pin: bool) -> Iterator[Any]:
        """``procs=`` on a read-once store: this process fetches the runs of batches once
        (whatever the number of workers) into buffers the workers map, and each worker gathers its batches
        from them into its slots. Small batches (under ``PARALLEL_FROM_BYTES``) are gathered here."""
        runs = RunBuffers()
        plan: Any = gather.fetch_runs(arrays, Pool(_RUN_BUFFERS, runs.make, runs.drop))
        try:
            got = next(plan, None)
            if got is None:
                return
            first = gather.gather_released(*got)
            if batch_bytes(first) >= PARALLEL_FROM_BYTES:
                check_main_guard(start_method(self._procs_context), self.procs)
                yield from run_processes(first, plan, gather, self.procs, context=self._procs_context, pin=pin,
                                         runs=runs, timeout=self.timeout)
                return
            yield pinned(first) if pin else first
            for got in plan:
                batch = gather.gather_released(*got)
                yield pinned(batch) if pin else batch
        finally:
            plan.close()
            runs.close()

    def __len__(self) -> int:
        if isinstance(self.dataset, IterableSeqDataset):
            self._source()  # (records mode: counted in this loader's group)
        return super().__len__()

    @property
    def consumed(self) -> int:
        """Batches handed to the training loop in the current (or last) iteration."""
        return self._consumed

    def set_epoch(self, epoch: int) -> None:
        """``set_epoch`` of the source (1-based epochs). Another epoch than the source's starts with nothing
        consumed: a ``state_dict()`` before its first batch is its start."""
        src = self._source()
        before = src.epoch
        src.set_epoch(epoch)
        if src.epoch != before:  # (a packed stream with a position keeps its epoch: it goes on from there)
            self._consumed = 0

    def state_dict(self) -> dict[str, Any]:
        """The source's resume state after the batches handed out so far in this iteration. O(1). Where the
        source was given another epoch or state since (``loader.sampler.set_epoch(e)``, as for a
        ``DistributedSampler``), nothing of it is consumed yet."""
        src = self._source()
        if src.generation != self._counted:
            self._consumed = 0
        if isinstance(src, (IterableSeqDataset, PackedIterableDataset)):
            return src.state_dict(consumed=self._consumed, num_workers=self.num_workers)
        return src.state_dict(consumed=self._items(src))

    def _items(self, src: EpochSampler | EpochBatchSampler) -> int:
        """What the batches handed out in this iteration are in the sampler's items (EpochSampler: records)."""
        if isinstance(src, EpochSampler):
            return min(self._consumed * (self.batch_size or 1), len(src))
        return self._consumed

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (any world size / worker count, same dataset and ordering)."""
        self._source().load_state_dict(state)
        self._consumed = 0
