"""``IterableSeqDataset``: records or batches sharded over ranks x DataLoader workers, lazily.

Stream ``w * W + r`` (rank ``r``, worker ``w``) takes every ``W x K``-th global item of the epoch (see
:mod:`seqstore.torch._plan`). Every worker opens the store itself (the dataset pickles by path) and
computes its items with ``order.take``: O(item) memory per worker. The position after ``k`` items is
exact under the assumptions ``SeqDataLoader`` checks and sets (``in_order=True``, no
``persistent_workers``, records ``group`` equal to the ``batch_size``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from ..data._lengths import check_int, check_optional_int
from ..data.records import RECORDS_BLOCK, iter_gathered
from ..data.store_dataset import StoreDataset
from ..schema import field_list
from ._convert import worker_topology
from ._epoch import EpochCursor
from ._plan import LengthBatching, fixed_item_blocks, fixed_item_positions, select_items
from .collate import GatheredRecord, collate_gathered
from .dataset import (
    INDEX_KEY,
    as_protocol_dataset,
    batch_to_tensors,
    bfloat16_fields,
    check_index_free,
    check_index_free_at_start,
    wrapped_options,
)

__all__ = ["IterableSeqDataset", "RECORDS_BLOCK"]


class IterableSeqDataset(EpochCursor, IterableDataset[dict[str, torch.Tensor]]):
    """An ``IterableDataset`` over a seqstore dataset, sharded over ranks and DataLoader workers.

    ``batch``:

    * ``None`` -- yield records (dict field -> tensor, ragged fields (T, ...)). Global items are
      groups of ``group`` consecutive records; set ``group`` to the DataLoader's ``batch_size`` so a
      DataLoader batch is exactly one item (``SeqDataLoader`` does this). A stream's records are
      gathered in blocks of about :data:`RECORDS_BLOCK` (one ``get_batch`` each, the next blocks'
      reads in flight) and handed out as views into their block: a record holds its block's memory
      while it is referenced.
    * an int ``B`` -- yield batches of ``B`` consecutive records of the epoch order, gathered and
      padded in one vectorised ``get_batch`` (use ``DataLoader(batch_size=None)``).
    * a :class:`LengthBatching` -- yield length-based batches (greedy or bucketed) of the global order.

    A batch is a dict: fixed field -> (B, ...); ragged field ``x`` -> ``x`` (B, T, ...) zero-padded,
    ``x_lengths`` int64 (B,), ``x_mask`` bool (B, T) with ``masks=True``; ``index`` int64 (B,) with
    ``with_index=True``.

    Tail: fixed-size items are always full: the remaining records are padded to a multiple of
    ``item x W`` by repeating the epoch order from its start, or cut (``drop_last``); length-based
    batches are padded to a multiple of ``W`` by repeating the first batches, or cut. Every rank
    gets the same number of items.

    Rank and world size come from ``torch.distributed`` at construction (construct it after
    ``init_process_group``) or the arguments. ``state_dict(consumed=k)``: ``k`` = items this rank
    took from the DataLoader since the iteration began (``SeqDataLoader`` counts them).

    ``prefetch``: items (records mode: blocks) whose reads are in flight while one is gathered. None
    (the default): the dataset's own choice (a store: 2 on a local disk, 16 to 64 on object storage,
    where answers take tens of milliseconds); 0: none. ``storage_options``: how a store given by path or
    URL is opened (as :class:`~seqstore.data.StoreDataset` takes them).
    """

    _kind = "IterableSeqDataset"

    def __init__(self, dataset: Any, *, batch: int | LengthBatching | None = None,
                 fields: Sequence[str] | str | None = None, rank: int | None = None, world_size: int | None = None,
                 drop_last: bool = False, epoch: int = 1, masks: bool = False, with_index: bool = False, group: int = 1,
                 prefetch: int | None = None, storage_options: Any = None) -> None:
        fields, with_index, prefetch = wrapped_options(dataset, field_list(fields), with_index, prefetch, self._kind)
        self.prefetch = check_optional_int(prefetch, f"{self._kind}: prefetch", 0)
        protocol = as_protocol_dataset(dataset, fields, storage_options)
        self.fields = None if fields is None else frozenset(fields)
        self.masks = bool(masks)
        self.with_index = bool(with_index)
        if self.with_index:  # here, not in the DataLoader's workers
            check_index_free_at_start(protocol, self.fields)
        self._bf16 = bfloat16_fields(protocol)
        if batch is not None and not isinstance(batch, LengthBatching):
            if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
                raise ValueError(f"{self._kind}: batch must be None, a positive int or a LengthBatching, got {batch!r}")
            batch = int(batch)
        group = check_int(group, f"{self._kind}: group", 1)
        if batch is not None and group != 1:
            raise ValueError(f"{self._kind}: group applies to records (batch=None) only")
        self.batch = batch
        spec = batch if isinstance(batch, LengthBatching) else None
        item = batch if isinstance(batch, int) else group
        self._init_cursor(protocol, rank, world_size, drop_last, epoch, spec, item)
        self._share_with_workers()

    @property
    def group(self) -> int:
        """Records per global item in records mode (the DataLoader's batch size)."""
        return self._item if self.batch is None else 1

    @group.setter
    def group(self, value: int) -> None:
        if self.batch is not None:
            raise ValueError(f"{self._kind}: group applies to records (batch=None) only")
        self._item = check_int(value, f"{self._kind}: group", 1)
        self._len_cache = None

    def __len__(self) -> int:
        """Records (records mode) or batches this rank yields from the resume point. Length-based
        batching scans the epoch's batch boundaries (O(N) time, O(chunk) memory; cached)."""
        n = self._items_per_rank()
        return n * self._item if self.batch is None else n

    # --------------------------------------------------------------------------------- iteration

    @staticmethod
    def _index(idx: np.ndarray[Any, np.dtype[np.int64]], names: Any) -> torch.Tensor:
        check_index_free(names)
        return torch.from_numpy(np.array(idx, dtype=np.int64))

    def _gather(self, idx: np.ndarray[Any, np.dtype[np.int64]], batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        out = collate_gathered(*batch_to_tensors(batch, self._bf16, self.fields), masks=self.masks)
        if self.with_index:
            out[INDEX_KEY] = self._index(idx, out)
        return out

    def _split(self, idx: np.ndarray[Any, np.dtype[np.int64]],
               batch: dict[str, Any]) -> Iterator[dict[str, torch.Tensor]]:
        """The records of an unpadded ``get_batch(idx)`` as dicts of views into its tensors (one split per
        field, no copy)."""
        values, lengths = batch_to_tensors(batch, self._bf16, self.fields)
        names = list(values)
        parts: list[Any] = [torch.split(v, lengths[name].tolist()) if name in lengths else v.unbind(0)
                            for name, v in values.items()]
        if self.with_index:
            parts.append(self._index(idx, names).unbind(0))
            names.append(INDEX_KEY)
        if not parts:  # no fields: one empty record per index (as SeqDataset gives)
            yield from ({} for _ in range(len(idx)))
            return
        ragged = tuple(name for name in names if name in lengths)  # (collate_padded pads them in every batch)
        for views in zip(*parts):
            record = GatheredRecord(zip(names, views))
            record.ragged = ragged
            yield record

    def _stream(self) -> tuple[int, int]:
        """(streams, this process's stream): ranks x DataLoader workers, stream ``worker * W + rank``."""
        worker, workers = worker_topology()
        return self.world_size * workers, worker * self.world_size + self.rank

    def _blocks(self) -> Iterator[np.ndarray[Any, np.dtype[np.int64]]]:
        """Records mode: this stream's items as index arrays of whole items, about :data:`RECORDS_BLOCK`
        records each (one ``order.take`` per block)."""
        streams, stream = self._stream()
        order, start, _ = self._begin()
        items = max(1, RECORDS_BLOCK // self._item)
        for pos in fixed_item_blocks(len(order), start, item=self._item, world=self.world_size, streams=streams,
                                     stream=stream, drop_last=self.drop_last, items=items):
            yield order.take(pos)

    def _gathered(self, arrays: Iterator[np.ndarray[Any, Any]], pad: bool) -> Iterator[tuple[Any, dict[str, Any]]]:
        """``(idx, get_batch(idx, pad=pad))`` of each index array, the next ``prefetch`` arrays' reads in
        flight (the dataset's ``iter_batches`` where it has one)."""
        ds = self.dataset
        # several DataLoader workers read through the node cache: read once, each would fetch every block
        # of a random_block window its batches draw on (SeqDataLoader's own workers fetch the runs once)
        shared = {"cached": True} if worker_topology()[1] > 1 and isinstance(ds, StoreDataset) else {}
        return iter_gathered(ds, arrays, pad=pad, prefetch=self.prefetch, **shared)

    def iter_indices(self) -> Iterator[np.ndarray[Any, np.dtype[np.int64]]]:
        """This stream's items as int64 index arrays (in a worker: this worker's stream)."""
        yield from self._indices()
        self._finish()

    def _indices(self) -> Iterator[np.ndarray[Any, np.dtype[np.int64]]]:
        """:meth:`iter_indices` without marking the iteration finished at its end (``__iter__`` reads
        ahead of what it yields, so it marks the end only once everything was yielded)."""
        streams, stream = self._stream()
        order, start, skip = self._begin()
        if self._spec is None:
            for pos in fixed_item_positions(len(order), start, item=self._item, world=self.world_size,
                                            streams=streams, stream=stream, drop_last=self.drop_last):
                yield order.take(pos)
        else:
            items = self._batch_iter(order, start, skip)
            yield from select_items(items, world=self.world_size, streams=streams, stream=stream,
                                    drop_last=self.drop_last)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """This worker's items; the reads of its next ``prefetch`` items (records: blocks) are in flight
        meanwhile."""
        if self.batch is None:
            for idx, block in self._gathered(self._blocks(), pad=False):
                yield from self._split(idx, block)
        else:
            for idx, batch in self._gathered(self._indices(), pad=True):
                yield self._gather(idx, batch)
        self._finish()

    # ------------------------------------------------------------------------------------- state

    def state_dict(self, consumed: int | None = None, *, num_workers: int | None = None) -> dict[str, Any]:
        """Resume state after every rank took ``consumed`` items (DataLoader batches) of the current
        iteration. Call it in the main process; the workers' copies are not consulted. O(1)
        (greedy length batching: index arithmetic over the batches since the last call).

        ``consumed`` defaults to 0 (nothing consumed since the last ``load_state_dict`` /
        ``set_epoch``): the main process cannot see what workers produced. ``num_workers`` is
        recorded for information.
        """
        k = 0 if consumed is None else check_int(consumed, f"{self._kind}: consumed", 0)
        return self._state_after(k * self.world_size, check_optional_int(num_workers, f"{self._kind}: num_workers", 0))

    def __repr__(self) -> str:
        return (f"IterableSeqDataset({self.dataset!r}, batch={self.batch!r}, rank={self.rank}, "
                f"world_size={self.world_size}, epoch={self.epoch}, start={self._start})")
