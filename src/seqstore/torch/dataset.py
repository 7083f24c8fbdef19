"""``SeqDataset``: a map-style ``torch.utils.data.Dataset`` over a store or any seqstore dataset.

``ds[i]`` is record ``i`` as a dict of tensors (copied once out of the read-only mapping, no warning).
``ds.__getitems__(indices)`` -- what ``DataLoader`` calls for a batch -- gathers the whole batch with
one vectorised ``get_batch(..., pad=True)`` and returns records that are views into it, so
:func:`~seqstore.torch.collate_padded` needs no further copy. Pickles small (stores by path): every
DataLoader worker maps the files itself.

Read-ahead: under :class:`~seqstore.torch.SeqDataLoader` with an ``EpochBatchSampler`` (or an
``EpochSampler`` and ``batch_size``), each worker replays its copy of the batch sampler and, while it
gathers one batch, starts the reads of its next ``prefetch`` batches (:mod:`seqstore.torch._foresight`).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..data import StoreDataset
from ..data._lengths import check_optional_int
from ..schema import field_list
from ..store import Store
from ._convert import to_tensor
from ._foresight import Foresight
from .collate import GatheredRecord, GatheredRecords, PaddedCollate

__all__ = ["SeqDataset", "as_protocol_dataset", "bfloat16_fields", "batch_to_tensors", "check_index_free",
           "check_index_free_at_start", "wrapped_options"]

INDEX_KEY = "index"


def check_index_free(names: Any) -> None:
    """``with_index``: a KeyError where the dataset has a field named ``"index"`` already."""
    if INDEX_KEY in names:
        raise KeyError(f"with_index: the dataset already has a field named {INDEX_KEY!r}")


def check_index_free_at_start(dataset: Any, fields: Any) -> None:
    """:func:`check_index_free` when a dataset is made, where its field names are known without a read
    (``fields`` given, a ``StoreDataset``, a store); else each record's or batch's names are checked."""
    names = fields if fields is not None else getattr(dataset, "field_names", None)
    if names is None and hasattr(getattr(dataset, "store", None), "schema"):
        names = list(dataset.store.schema)
    if names is not None:
        check_index_free(names)


def wrapped_options(dataset: Any, fields: list[str] | None, with_index: bool, prefetch: int | None,
                    owner: str) -> tuple[list[str] | None, bool, int | None]:
    """(fields, with_index, prefetch) of a dataset made over ``dataset``: where that is a :class:`SeqDataset`,
    what it returns -- its own fields when none are given (``fields`` must be among them: a KeyError naming
    those that are not), its index -- and its read-ahead unless ``prefetch`` is given."""
    if not isinstance(dataset, SeqDataset):
        return fields, bool(with_index), prefetch
    if dataset.fields is not None:
        if fields is None:
            fields = sorted(dataset.fields)
        elif missing := [f for f in fields if f not in dataset.fields]:
            raise KeyError(f"{owner}: the SeqDataset returns no field(s) {missing}; "
                           f"it returns {sorted(dataset.fields)}")
    return fields, bool(with_index) or dataset.with_index, dataset.prefetch if prefetch is None else prefetch


def as_protocol_dataset(obj: Any, fields: Sequence[str] | str | None = None, storage_options: Any = None, *,
                        length_field: str | None = None) -> Any:
    """A seqstore dataset (protocol: ``num_seqs``, ``lengths()``, ``epoch_order``, ``get``,
    ``get_batch``) from a store, a store path or URL (opened with ``storage_options``), a
    :class:`SeqDataset` or a protocol dataset. ``length_field``: for a store or a path, the ragged field
    whose rows are a record's length."""
    fields = field_list(fields)
    if isinstance(obj, SeqDataset):
        return obj.dataset
    if isinstance(obj, (Store, str, os.PathLike)):
        return StoreDataset(obj, fields=fields, storage_options=storage_options, length_field=length_field)
    if length_field is not None:
        raise ValueError(f"length_field= is for a store or a store path; {type(obj).__name__} measures its own")
    if missing := [m for m in ("num_seqs", "epoch_order", "get", "get_batch", "lengths") if not hasattr(obj, m)]:
        raise TypeError(f"expected a seqstore Store, a store path or a seqstore.data dataset; {type(obj).__name__} "
                        f"lacks {missing}")
    if fields is not None and isinstance(obj, StoreDataset):
        have = obj.field_names  # (a field it does not return would be left out of every record, silently)
        if missing := [f for f in fields if f not in have]:
            raise KeyError(f"{obj.store.url}: the dataset returns no field(s) {missing}; it returns {have}")
        if obj.fields is None:
            obj = copy.copy(obj)
            obj.fields = list(fields)
    return obj


def bfloat16_fields(dataset: Any) -> frozenset[str]:
    """Output names of the bfloat16 fields of ``dataset`` (returned as uint16 bits): the dataset's own
    ``bfloat16_fields()`` (every ``seqstore.data`` dataset has it, renames included); a protocol dataset
    without that method has none. O(fields)."""
    method = getattr(dataset, "bfloat16_fields", None)
    return frozenset(method()) if callable(method) else frozenset()


def batch_to_tensors(batch: dict[str, Any], bf16: frozenset[str],
                     fields: frozenset[str] | None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A ``get_batch`` result -> (field -> tensor, ragged field -> int64 lengths)."""
    values: dict[str, torch.Tensor] = {}
    lengths: dict[str, torch.Tensor] = {}
    for name, v in batch.items():
        if fields is not None and name not in fields:
            continue
        if isinstance(v, tuple):
            values[name] = to_tensor(v[0], name in bf16, name=name)
            lengths[name] = to_tensor(np.asarray(v[1], dtype=np.int64))
        else:
            values[name] = to_tensor(v, name in bf16, name=name)
    return values, lengths


class SeqDataset(Dataset[dict[str, torch.Tensor]]):
    """Map-style dataset: ``ds[i]`` -> dict field -> tensor (record ``i``).

    ``dataset_or_store``: a :class:`seqstore.Store`, a store path or URL (opened with ``storage_options``,
    as :class:`~seqstore.data.StoreDataset` takes them), or any ``seqstore.data`` dataset.
    ``length_field``: with a store or a path, the ragged field whose rows are a record's length (for
    samplers that order or batch by length; a store with several ragged fields works without it until
    lengths are asked for). ``fields``: the fields to return (default all). ``with_index``: add
    ``"index"`` (int64 scalar; (B,) in batches), the record's index, e.g. to log per example or to check
    coverage. ``prefetch``: batches whose reads are in flight while one is gathered; None (the default):
    the dataset's own choice where ``SeqDataLoader`` gathers through its ``iter_batches`` (a store: 2 on
    a local disk, 16 to 64 on object storage), else 2; 0: none.

    Ragged fields come out as (T, *inner) tensors; use :func:`collate_padded` (or :meth:`collate`) as
    the DataLoader's ``collate_fn``. Memory O(1) plus the current batch; pickles small.
    """

    def __init__(self, dataset_or_store: Any, fields: Sequence[str] | str | None = None, *, with_index: bool = False,
                 prefetch: int | None = None, storage_options: Any = None, length_field: str | None = None) -> None:
        fields, with_index, prefetch = wrapped_options(dataset_or_store, field_list(fields), with_index, prefetch,
                                                       "SeqDataset")
        self.prefetch = check_optional_int(prefetch, "SeqDataset: prefetch", 0)
        self.dataset = as_protocol_dataset(dataset_or_store, fields, storage_options, length_field=length_field)
        self.fields = None if fields is None else frozenset(fields)
        self.with_index = bool(with_index)
        if self.with_index:  # here, not in the DataLoader's workers
            check_index_free_at_start(self.dataset, self.fields)
        self._bf16 = bfloat16_fields(self.dataset)
        self._ragged: tuple[str, ...] | None = None
        self._foresight: Foresight | None = None

    def foresee(self, batch_sampler: Any) -> None:
        """Read ahead along ``batch_sampler`` (what the DataLoader will ask for, batch by batch; see the
        module docstring). ``SeqDataLoader`` calls this at the start of each iteration; None stops it."""
        if batch_sampler is None or self.prefetch == 0 or not hasattr(self.dataset, "prefetch"):
            self._foresight = None
        else:
            self._foresight = Foresight(batch_sampler, self.depth)

    @property
    def depth(self) -> int:
        """Batches read ahead where the dataset does not choose: ``prefetch``, 2 for None."""
        return 2 if self.prefetch is None else self.prefetch

    def __len__(self) -> int:
        return int(self.dataset.num_seqs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        """Record ``i``: field -> tensor (one copy out of the mapping), a dict that knows the dataset's ragged
        fields (:attr:`~seqstore.torch.collate.GatheredRecord.ragged`). O(record size)."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"SeqDataset index must be an int, got {type(i).__name__}")
        n = len(self)
        j = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"SeqDataset index {i} out of range for {n} records")
        rec = self.dataset.get(j)
        out = GatheredRecord((k, to_tensor(v, k in self._bf16, name=k)) for k, v in rec.items()
                             if self.fields is None or k in self.fields)
        if self.with_index:
            check_index_free(out)
            out[INDEX_KEY] = torch.tensor(j, dtype=torch.int64)
        out.ragged = self.ragged_fields  # (collate_padded pads them, with lengths, in every batch)
        return out

    def __getitems__(self, indices: Sequence[int]) -> GatheredRecords:
        """Records ``indices`` gathered at once (one vectorised gather per field, not padded).

        Returns a list of records (views into the batch) that also carries the batch, padded on first
        use, for :func:`collate_padded`. O(batch elements).
        """
        idx = np.asarray(indices).reshape(-1)
        if idx.size and idx.dtype.kind not in "iu":
            raise TypeError(f"SeqDataset indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=False)
        if self._foresight is not None:
            for future in self._foresight.advance(idx):
                # advice only: a read that fails here is asked for again by its own batch, which raises then
                with contextlib.suppress(Exception):  # (not now, in place of this batch and those before it)
                    self.dataset.prefetch(future)
        values, lengths = self.batch_tensors(idx, self.dataset.get_batch(idx))
        # each field's per-record views at once: a ragged field split by its lengths, a fixed one unbound
        columns = [torch.split(v, lengths[name].tolist()) if name in lengths else v.unbind(0)
                   for name, v in values.items()]
        names = list(values)
        records = GatheredRecords(GatheredRecord(zip(names, parts)) for parts in zip(*columns))
        if not columns:  # no fields: one empty record per index
            records.extend(GatheredRecord() for _ in range(len(idx)))
        records.values = values
        records.lengths = lengths
        records.views = dict(zip(names, columns))
        records.size = len(idx)
        return records

    def batch_tensors(self, idx: np.ndarray[Any, np.dtype[np.int64]],
                      batch: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``get_batch(idx, pad=...)`` of the dataset -> (field -> tensor, ragged field -> int64
        lengths), this dataset's fields and ``"index"`` with ``with_index``. O(fields), no copy."""
        values, lengths = batch_to_tensors(batch, self._bf16, self.fields)
        if self.with_index:
            check_index_free(values)
            values[INDEX_KEY] = torch.from_numpy(np.where(idx < 0, idx + len(self), idx))
        return values, lengths

    @property
    def ragged_fields(self) -> tuple[str, ...]:
        """The ragged fields (from the store schema, else from a one-record batch; cached): those the dataset
        returns (a ``StoreDataset`` made with ``fields=`` returns those alone)."""
        if self._ragged is None:
            store = getattr(self.dataset, "store", None)
            if isinstance(store, Store):
                returned = getattr(self.dataset, "field_names", None)
                names = [n for n, f in store.schema.items() if f.ragged and (returned is None or n in returned)]
            elif len(self):
                names = [n for n, v in self.dataset.get_batch(np.zeros(1, np.int64)).items() if isinstance(v, tuple)]
            else:
                names = []
            self._ragged = tuple(n for n in names if self.fields is None or n in self.fields)
        return self._ragged

    def collate(self, *, masks: bool = False, pad_value: float = 0) -> PaddedCollate:
        """A collate function padding exactly this dataset's ragged fields (lengths even when equal)."""
        return PaddedCollate(self.ragged_fields, masks=masks, pad_value=pad_value)

    def __repr__(self) -> str:
        return f"SeqDataset({self.dataset!r}, fields={None if self.fields is None else sorted(self.fields)})"
