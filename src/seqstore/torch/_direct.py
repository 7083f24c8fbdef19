"""The in-process batch path of :class:`~seqstore.torch.SeqDataLoader` (no DataLoader workers).

Through a ``DataLoader`` a batch of a :class:`~seqstore.torch.SeqDataset` costs far more than its
gather (a Python int per record from the sampler, a list per batch, a dict of views per record for a
collate function that ignores them). When every step is seqstore's own (an
:class:`~seqstore.torch.EpochSampler` with ``batch_size`` or an :class:`~seqstore.torch.EpochBatchSampler`,
and :func:`~seqstore.torch.collate_padded` / :class:`~seqstore.torch.PaddedCollate` with pad value 0),
the loader takes the sampler's index arrays and gathers each batch with one padded ``get_batch``
straight into the tensors it hands out: the same batches, order and resume state.

``threads=T`` gathers the next batches on ``T`` helper threads besides the loop's (:func:`run_ordered`;
the copies run without the GIL, and a batch needs no shared memory or pickle); an
:class:`~seqstore.torch.IterableSeqDataset` that makes its own batches uses them the same way.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler

from ..data.records import iter_gathered
from ._signals import InterruptsIgnored, LoaderWorkerError
from .collate import PaddedCollate, collate_gathered, collate_padded
from .dataset import SeqDataset
from .iterable import IterableSeqDataset
from .sampler import EpochBatchSampler, EpochSampler

__all__ = ["Gatherer", "collate_options", "direct_plan", "pinned", "rebatch", "run_ordered", "PARALLEL_FROM_BYTES",
           "batch_bytes", "ahead_in_runs"]

#: a batch smaller than this is gathered in the loop's own thread even with ``threads`` / ``procs``:
#: handing it to a helper costs more than gathering it (measured: bench/loader.py, docs/torch.md)
PARALLEL_FROM_BYTES = 128 << 10

IndexArray = np.ndarray[Any, np.dtype[np.int64]]
Batch = dict[str, torch.Tensor]


def rebatch(chunks: Iterable[IndexArray], size: int, drop_last: bool) -> Iterator[IndexArray]:
    """Cut a stream of index arrays into arrays of ``size`` (the last shorter unless ``drop_last``)."""
    carry: IndexArray | None = None
    for chunk in chunks:
        if carry is not None and len(carry):
            chunk = np.concatenate([carry, chunk])
        full = len(chunk) // size * size
        for a in range(0, full, size):
            yield chunk[a : a + size]
        carry = chunk[full:]
    if carry is not None and len(carry) and not drop_last:
        yield carry


def collate_options(collate_fn: Any) -> tuple[tuple[str, ...] | None, bool] | None:
    """(ragged, masks) of a seqstore collate function that the direct path reproduces, else None."""
    if collate_fn is collate_padded:
        return None, False
    if isinstance(collate_fn, PaddedCollate) and collate_fn.pad_value == 0:
        return collate_fn.ragged, bool(collate_fn.masks)
    return None


def batch_bytes(batch: Batch) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values())


def pinned(batch: Batch) -> Batch:
    """``batch`` in page-locked memory (for ``pin_memory=True`` where there is a device)."""
    return {k: v.pin_memory() for k, v in batch.items()}


class Gatherer:
    """One batch of a loader from its index array: a padded ``get_batch`` and the loader's collation.

    Picklable (datasets pickle small), so a worker process can get a copy. ``source``: a
    :class:`SeqDataset` (then ``ragged`` / ``masks`` are the collate function's) or an
    :class:`IterableSeqDataset` that makes its own batches."""

    def __init__(self, source: SeqDataset | IterableSeqDataset, ragged: tuple[str, ...] | None = None,
                 masks: bool = False) -> None:
        self.source, self.ragged, self.masks = source, ragged, masks

    def finish(self, idx: IndexArray, batch: dict[str, Any]) -> Batch:
        """The loader's batch from ``get_batch(idx, pad=True)``'s result (no copy)."""
        src = self.source
        if isinstance(src, IterableSeqDataset):
            return src._gather(idx, batch)
        values, lengths = src.batch_tensors(idx, batch)
        return collate_gathered(values, lengths, ragged=self.ragged, masks=self.masks)

    def __call__(self, idx: IndexArray) -> Batch:
        return self.finish(idx, self.source.dataset.get_batch(idx, pad=True))

    def prefetch(self, run: list[IndexArray]) -> None:
        """Start reading the records of later batches (their answers are awaited when they are gathered)."""
        self.source.dataset.prefetch(np.concatenate(run))

    @property
    def reads_once(self) -> bool:
        """Whether the dataset is a read-once store's (runs fetched into memory; see :meth:`fetch_runs`)."""
        ds = self.source.dataset
        return bool(getattr(ds, "fetches_runs", False)) and hasattr(ds, "fetch_runs")

    def fetch_runs(self, arrays: Iterator[IndexArray], pool: Any) -> Iterator[tuple[IndexArray, list[Any]]]:
        """Each batch's index array once its bytes are in ``pool``'s buffers."""
        return self.source.dataset.fetch_runs(arrays, pool)  # type: ignore[no-any-return]

    def gather_fetched(self, idx: IndexArray, via: Any, alloc: Any = None) -> Batch:
        """The loader's batch ``idx`` from fetched bytes (``via``, ``alloc``: see ``Store.gather_fetched``)."""
        return self.finish(idx, self.source.dataset.gather_fetched(idx, via, pad=True, alloc=alloc))

    def gather_released(self, idx: IndexArray, parts: list[Any]) -> Batch:
        """The batch ``idx`` of ``fetch_runs`` gathered in this process; its parts released."""
        try:
            return self.gather_fetched(idx, parts)
        finally:
            for p in parts:
                p.release()


def direct_plan(loader: Any, threads: int) -> tuple[Iterator[IndexArray], Gatherer,
                                                    Callable[[Iterator[IndexArray]], Iterator[Batch]] | None] | None:
    """(index arrays, gatherer, gather a stream in order or None) when ``loader`` (a ``SeqDataLoader``
    without DataLoader workers) can build its batches itself, else None (the DataLoader does).

    Call at the start of an iteration: the index arrays come from the loader's sampler (or iterable
    dataset) exactly as the DataLoader would ask for them. ``threads``: > 0 when the batches will be
    gathered in parallel (threads or processes); then a self-batching iterable is taken too.
    """
    ds = loader.dataset
    if isinstance(ds, IterableSeqDataset):
        if ds.batch is None or threads == 0:
            return None  # records mode, or already one gather per DataLoader step
        own = Gatherer(ds)  # stream: what the DataLoader would iterate, the next batches' reads in flight
        return ds._indices(), own, lambda idxs: (own.finish(idx, b) for idx, b in ds._gathered(idxs, pad=True))
    if not isinstance(ds, SeqDataset):
        return None
    options = collate_options(loader.collate_fn)
    if options is None:
        return None
    arrays: Iterator[IndexArray]
    if isinstance(loader.batch_sampler, EpochBatchSampler):
        arrays = loader.batch_sampler.iter_arrays()
    elif (isinstance(loader.sampler, EpochSampler) and loader.batch_size is not None
          and type(loader.batch_sampler) is BatchSampler):
        arrays = rebatch(loader.sampler.iter_chunks(), int(loader.batch_size), bool(loader.drop_last))
    else:
        return None
    gather = Gatherer(ds, *options)
    inner = ds.dataset
    stream = None
    prefetch = getattr(inner, "prefetch", None)
    if hasattr(inner, "iter_batches") and ds.prefetch != 0:

        def stream(idxs: Iterator[IndexArray]) -> Iterator[Batch]:
            # the dataset's own read-ahead (its own depth for None): the next batches' reads in flight,
            # each batch's pages asked for once
            for idx, batch in iter_gathered(inner, idxs, pad=True, prefetch=ds.prefetch):
                yield gather.finish(idx, batch)

    elif callable(prefetch) and ds.depth:

        def stream(idxs: Iterator[IndexArray]) -> Iterator[Batch]:
            # the reads of the next ``ds.depth`` batches start before this one is gathered (what the
            # workers' read-ahead does in the DataLoader path); advice only: a read that fails is raised
            # by its own batch's gather, where that batch is due
            window: deque[IndexArray] = deque()
            for idx in idxs:
                window.append(idx)
                if len(window) > 1:
                    with contextlib.suppress(Exception):
                        prefetch(idx)
                if len(window) > ds.depth:
                    yield gather(window.popleft())
            while window:
                yield gather(window.popleft())

    return arrays, gather, stream


class _Slot:
    """One batch of :func:`run_ordered`: its index array, then its result or exception."""

    __slots__ = ("idx", "done", "value", "error")

    def __init__(self, idx: IndexArray) -> None:
        self.idx, self.done = idx, threading.Event()
        self.value: Batch | None = None
        self.error: BaseException | None = None

    def run(self, gather: Callable[[IndexArray], Batch]) -> None:
        try:
            self.value = gather(self.idx)
        except Exception as exc:  # noqa: BLE001 - raised in the consumer when the batch is due
            self.error = exc
        except BaseException as exc:  # Ctrl-C (SystemExit): at once in the loop's thread; kept for the batch too
            self.error = exc
            raise
        finally:
            self.done.set()

    def result(self) -> Batch:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value


def ahead_in_runs(items: Iterable[Any], prefetch: Callable[[list[Any]], None], size: int) -> Iterator[Any]:
    """``items`` (index arrays, or packed plans) as they come, the reads of each run of ``size`` of them
    asked for at once (``prefetch`` of the run, as a remote store's ``iter_batches`` asks for its runs), the
    next run's as soon as the first item of a run is drawn. Memory: the items of two runs. A failed
    ``prefetch`` is advice lost, not raised: the run is drawn ahead of the batches still being handed out,
    and the read that failed is asked for again by its own batch's gather, which raises where that batch
    is due (as a worker process does with the runs sent to it)."""
    it = iter(items)
    runs: deque[list[Any]] = deque()
    failed: list[Exception] = []  # an error drawing the items: raised after those drawn before it

    def draw() -> None:
        run: list[Any] = []
        try:
            run.extend(itertools.islice(it, size))
        except Exception as exc:  # noqa: BLE001 - raised below, in its place
            failed.append(exc)
        if run:
            with contextlib.suppress(Exception):
                prefetch(run)
            runs.append(run)

    draw()
    while runs:
        if not failed:
            draw()
        yield from runs.popleft()
    if failed:
        raise failed[0]


def run_ordered(arrays: Iterator[IndexArray], gather: Callable[[IndexArray], Batch], threads: int,
                timeout: float = 0) -> Iterator[Batch]:
    """``gather`` of every array, in order, shared between this thread and ``threads`` helper threads.

    The next ``threads + 2`` batches are open at any time; helpers take the oldest batch nobody has
    started. The consumer, while the batch it needs next is not done, gathers the oldest batch nobody
    has started (often that very batch) instead of waiting: with no core free for the helpers the loop
    still gathers at about the in-line rate, and a helper that is ahead hands its batch over at once.
    The index arrays are drawn in this thread only. An exception in a gather (or in drawing its index
    array) is raised here when its batch is due (a KeyboardInterrupt in a gather of this thread at once);
    closing the generator lets the running gathers finish and stops the helpers (a second Ctrl-C
    meanwhile is ignored, see _signals). ``timeout`` > 0: a helper's batch not done within that many
    seconds is a :class:`LoaderWorkerError`, and the helpers still gathering are waited for that long at most
    (daemon threads: a read stuck for good is left behind)."""
    work, quiet = threading.Condition(), InterruptsIgnored()
    unclaimed: deque[_Slot] = deque()
    stopping = False

    def helper() -> None:
        while True:
            with work:
                while not unclaimed and not stopping:
                    work.wait()
                if stopping:
                    return
                slot = unclaimed.popleft()
            slot.run(gather)

    helpers = [threading.Thread(target=helper, name=f"seqstore-loader-{k}", daemon=True) for k in range(threads)]
    for h in helpers:
        h.start()
    window: deque[_Slot] = deque()
    it = iter(arrays)
    more = True
    try:
        while True:
            while more and len(window) <= threads + 1:
                try:
                    idx = next(it, None)
                except Exception as exc:  # noqa: BLE001 - raised when its batch is due, after those drawn before it
                    slot, more = _Slot(np.empty(0, np.int64)), False
                    slot.error = exc
                    slot.done.set()
                    window.append(slot)
                    break
                if idx is None:
                    more = False
                    break
                slot = _Slot(idx)
                window.append(slot)
                with work:
                    unclaimed.append(slot)
                    work.notify()
            if not window:
                return
            slot = window.popleft()
            while not slot.done.is_set():  # help instead of waiting: the oldest batch nobody started
                with work:
                    other = unclaimed.popleft() if unclaimed else None
                if other is None:
                    break
                other.run(gather)
            if timeout > 0 and not slot.done.wait(timeout):
                raise LoaderWorkerError(f"a loader helper thread gave no batch in {timeout}s")
            yield slot.result()
    finally:
        with work:
            stopping = True
            unclaimed.clear()
            work.notify_all()
        with quiet:
            for h in helpers:
                h.join(timeout if timeout > 0 else None)
