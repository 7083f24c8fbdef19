"""``StoreDataset``: one seqstore store as a dataset (records, lazy lengths, epoch orders).

Holds the store (which pickles by path), the ordering parameters and the name of the field whose
lengths count. Nothing of size N is held in memory: lengths are read lazily from the offsets; the
arrays an ordering may need (``sorted*``: lengths and a sort index) are cached as ``.npy`` files in
``cache_dir`` (default ``<store>.cache/`` beside the store) and memory-mapped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..io.options import StoreOptions
from ..schema import BFLOAT16, field_list
from ..store import Store, open_store
from ._cache import default_cache_dir, store_fingerprint
from ._lengths import ConstantLengths, LengthsView, TakeLengths, as_index_array
from .base import Dataset, check_order_params

__all__ = ["StoreDataset"]


class StoreDataset(Dataset):
    """A dataset over one store.

    ``store``: a :class:`seqstore.Store` or a path. ``ordering`` / ``seed`` / ``partition_epoch``: the
    epoch order (RETURNN names, see :func:`seqstore.order.seq_order`). ``length_field``: the ragged
    field whose row count is a sequence's length (default: the only ragged field; a store without
    ragged fields has length 1 per record). ``fields``: the fields ``get``/``get_batch`` return
    (default all). ``cache_dir``: where derived arrays are cached (default ``<store>.cache``).
    ``storage_options``: how a store given by URL is opened (as :func:`seqstore.open` takes them, or a
    :class:`~seqstore.io.options.StoreOptions` with the node cache's ``cache_dir`` / ``cache_bytes``).
    Memory O(1) (+ the store's O(shards)); pickles as (path, options).
    """

    def __init__(self, store: Store | str | os.PathLike[str], *, ordering: Any = "default", seed: int = 0,
                 partition_epoch: int = 1, length_field: str | None = None, fields: Sequence[str] | str | None = None,
                 cache_dir: str | os.PathLike[str] | None = None,
                 storage_options: StoreOptions | Mapping[str, Any] | None = None) -> None:
        if isinstance(store, Store):
            if storage_options:
                raise ValueError(f"{store.url}: storage_options are for a store given by path or URL, not a Store")
            self.store = store
        else:
            self.store = open_store(store, storage_options=storage_options)
        self.ordering, self.seed, self.partition_epoch = check_order_params(ordering, seed, partition_epoch)
        schema = self.store.schema
        ragged = [n for n, f in schema.items() if f.ragged]
        # several ragged fields and none named: fine until lengths are asked for (a map-style dataset or
        # the default order never asks)
        self._ambiguous = ragged if length_field is None and len(ragged) > 1 else None
        if length_field is None:
            length_field = ragged[0] if len(ragged) == 1 else None
        elif length_field not in ragged:
            raise ValueError(f"{self.store.url}: length_field {length_field!r} is not a ragged field; ragged fields "
                             f"are {ragged}")
        self.length_field = length_field
        fields = field_list(fields)
        if fields is not None:
            unknown = [f for f in fields if f not in schema]
            if unknown:
                raise KeyError(f"{self.store.url}: no field(s) {unknown}; fields are {list(schema)}")
        self.fields = None if fields is None else list(fields)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(self.store)

    def __reduce__(self) -> tuple[Any, ...]:
        # the Store pickles as its path, options and the shards it saw: a worker reopens it with the same
        # read-ahead options and the same records, even if shards were committed since
        return (partial(StoreDataset, self.store, ordering=self.ordering, seed=self.seed,
                        partition_epoch=self.partition_epoch, length_field=self.length_field, fields=self.fields,
                        cache_dir=str(self.cache_dir)), ())

    @property
    def num_seqs(self) -> int:
        return len(self.store)

    @property
    def field_names(self) -> list[str]:
        """The fields ``get`` returns."""
        return list(self.store.schema) if self.fields is None else list(self.fields)

    def bfloat16_fields(self) -> frozenset[str]:
        """The returned fields whose schema dtype is bfloat16, where the store returns them as uint16 bits (its
        default ``bfloat16`` mode)."""
        if self.store.bfloat16 != "bits":
            return frozenset()
        schema = self.store.schema
        return frozenset(n for n in self.field_names if schema[n].dtype == BFLOAT16)

    def cache_key(self) -> Any:
        if self.length_field is None:
            return ["store", store_fingerprint(self.store)]
        return ["store", self.length_field, store_fingerprint(self.store, (f"{self.length_field}.offsets.npy",))]

    def lengths(self) -> LengthsView:
        """Lazy lengths: rows of ``length_field`` per record (from the offsets), or 1 without ragged fields."""
        if self._ambiguous:
            raise ValueError(f"{self.store.url}: several ragged fields {self._ambiguous}; name the one that measures "
                             "length with length_field=")
        if self.length_field is None:
            return ConstantLengths(len(self.store), 1)
        return TakeLengths(self.store.lengths(self.length_field))

    def get(self, i: int) -> dict[str, Any]:
        """Record ``i`` as zero-copy views (only ``fields`` when given)."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"StoreDataset index must be an int, got {type(i).__name__}")
        rec = self.store[int(i)]
        return rec if self.fields is None else {k: rec[k] for k in self.fields}

    def get_batch(self, indices: Any, *, pad: bool = False) -> dict[str, Any]:
        """``Store.get_batch`` of ``indices`` over ``fields``: one vectorised gather per field."""
        idx = as_index_array(indices, self.num_seqs)
        return self.store.get_batch(idx, fields=self.fields, pad=pad)

    def prefetch(self, indices: Any) -> None:
        """``Store.prefetch`` of ``indices`` over ``fields``."""
        self.store.prefetch(as_index_array(indices, self.num_seqs), fields=self.fields)

    def iter_batches(self, batches: Iterable[Any], *, pad: bool = False, prefetch: int | None = None,
                     cached: bool = False) -> Iterator[dict[str, Any]]:
        """``Store.iter_batches`` over ``fields`` (two-stage read-ahead for ragged fields; ``prefetch``
        None: the store's default, 2 batches on a local store, 16 to 64 on a remote one; ``cached``:
        the store's)."""
        n = self.num_seqs
        return self.store.iter_batches((as_index_array(b, n) for b in batches), fields=self.fields, pad=pad,
                                       prefetch=prefetch, cached=cached)

    @property
    def fetches_runs(self) -> bool:
        """Whether the store receives runs of batches into memory (``Store.fetches_runs``: a read-once store)."""
        return self.store.fetches_runs

    def fetch_runs(self, batches: Iterable[Any], pool: Any) -> Iterator[tuple[Any, list[Any]]]:
        """``Store.fetch_runs`` over ``fields``: each batch's index array and the fetched parts holding it."""
        n = self.num_seqs
        return self.store.fetch_runs((as_index_array(b, n) for b in batches), pool, fields=self.fields)

    def gather_fetched(self, idx: Any, via: Any, *, pad: bool = False, alloc: Any = None) -> dict[str, Any]:
        """``Store.gather_fetched`` over ``fields``."""
        return self.store.gather_fetched(idx, via, fields=self.fields, pad=pad, alloc=alloc)

    def ids(self, indices: Any) -> list[str]:
        """The ids of ``indices`` (O(len) Python strings; for display and debugging)."""
        return [self.store.id(int(i)) for i in np.asarray(indices).reshape(-1)]

    def __repr__(self) -> str:
        return (f"StoreDataset({str(self.store.root)!r}, n={self.num_seqs}, ordering={self.ordering!r}, "
                f"seed={self.seed}, partition_epoch={self.partition_epoch})")

