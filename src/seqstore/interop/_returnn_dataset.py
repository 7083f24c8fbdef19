"""``StoreDataset``: a RETURNN ``Dataset`` that reads a seqstore store (imports RETURNN at module load).

Reach it as ``seqstore.interop.returnn.StoreDataset`` (that module imports this one only when the name
is used, so seqstore itself never needs RETURNN); docs/interop.md has a config. Per process it holds the
opened store (O(fields x shards)) and the current epoch's lazy :class:`seqstore.Order`. Epoch orders
come from the data layer (:class:`seqstore.data.StoreDataset` over the same store and
``seq_order_key``, with its lengths and sort-index caches): no O(N) private memory, no O(N) work at open.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
from returnn.datasets.basic import Dataset, DatasetSeq
from returnn.util.basic import NumbersDict

from ..data import StoreDataset as _DataStoreDataset
from ..data._cache import CacheError, default_cache_dir
from ..data._orders import dataset_order
from ..errors import SeqstoreError
from ..order import Order, ordering_needs_lengths
from ..order import seq_order as _seq_order  # init_seq_order has a parameter named seq_order
from ..store import Store, open_store
from .returnn_hdf import recorded_labels, stream_dims

__all__ = ["StoreDataset"]

log = logging.getLogger(__name__)

_UNSUPPORTED = {
    "repeat_epoch": "repeat the dataset in a CombinedDataset/MetaDataset or use partition_epoch",
    "seq_list_filter_file": "filter the store when building it (a tag set is O(N) per process)",
    "unique_seq_tags": "deduplicate the store when building it (a tag set is O(N) per process)",
    "seq_order_seq_lens_file": "store the lengths as a field and name it with seq_order_key",
    "shuffle_frames_of_nseqs": "not supported by seqstore",
}


class _OrderLengths(_DataStoreDataset):
    """The data layer's view of the store for epoch orders: its lengths and caches, except that an
    unwritable cache directory is not an error here -- the lengths are then computed in memory (O(N),
    with a warning) and the sort index is not cached."""

    _in_memory = False

    def lengths_array(self) -> np.ndarray[Any, Any]:
        try:
            return super().lengths_array()
        except CacheError as exc:
            log.warning("%s: %s; computing lengths in memory (O(N))", self.store.url, exc)
            self._in_memory = True
            return self.lengths().to_numpy()

    def _sort_cache(self) -> Path | None:
        return None if self._in_memory else super()._sort_cache()


class _Tags(Sequence[str]):
    """All tags of a store, lazily: ``tags[i]`` reads one id (O(1)); pickles as the store's path."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __len__(self) -> int:
        return len(self._store)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        j = int(i) + len(self) if int(i) < 0 else int(i)
        if not 0 <= j < len(self):
            raise IndexError(f"tag index {i} out of range for {len(self)} sequences")
        return _tag(self._store, j)


def _tag(store: Store, idx: int) -> str:
    """Record ``idx``'s tag: its id, ``seq-<idx>`` in a store without ids."""
    return store.id(idx) if store.has_ids else f"seq-{idx}"


def _rebuild(kwargs: dict[str, Any], state: dict[str, Any]) -> StoreDataset:
    """Unpickle: reopen the store by path, restore sharding, epoch and an explicit order."""
    ds = StoreDataset(**kwargs)
    ds._num_shards = state["num_shards"]
    ds._shard_index = state["shard_index"]
    if state["epoch"] is not None or state["explicit"] is not None:
        ds.init_seq_order(epoch=state["epoch"], seq_order=state["explicit"])
    return ds


class StoreDataset(Dataset):  # type: ignore[misc]  # RETURNN has no type stubs
    """A RETURNN dataset over a seqstore store: one data key per field.

    Args:
        path: the store directory.
        cache_dir: where the lengths and sort index of ``sorted*``/``sort_bin_shuffle*`` are cached
            (the data layer's files, shared with :class:`seqstore.data.StoreDataset`); default
            ``<store>.cache/`` next to the store. Files are named by a fingerprint of the store's shards
            and the length field's offsets, so a changed store never reuses a stale file.
        seq_order_key: the ragged field whose lengths ``sorted``/``laplace``/``sort_bin_shuffle`` use
            (RETURNN's HDFDataset uses ``data``); default: the imported inputs field, else ``data``,
            else the first ragged field.
        num_outputs: ``{key: (dim, ndim)}`` overrides; the defaults come from the store's ``returnn``
            metadata (written by :func:`~seqstore.interop.returnn.import_hdf`), else from the field's
            shape (sparse dims without metadata are reported as 1, RETURNN's "unknown").
        **kwargs: RETURNN ``Dataset`` options: ``seq_ordering`` (every RETURNN ordering name, or a
            callable ``(epoch=...) -> str``), ``partition_epoch``, ``fixed_random_seed``,
            ``random_seed_offset``, ``_num_shards``/``_shard_index`` (and ``set_sharding``), ``window``,
            ``name``, ... Options that need O(N) state per process (``repeat_epoch``,
            ``seq_list_filter_file``, ``unique_seq_tags``, ``seq_order_seq_lens_file``,
            ``shuffle_frames_of_nseqs``) raise ValueError.

    Orders: sub-epoch ``e`` on shard ``s`` is ``seqstore.seq_order(N, seq_ordering, epoch=e,
    seed=random_seed_offset, lengths=..., partition_epoch=P, shard_index=s, num_shards=S)``; with
    ``fixed_random_seed`` the full order is ``seq_order(..., epoch=1, seed=fixed_random_seed)`` and the
    sub-epoch/shard block is cut from it with RETURNN's rule. Deterministic orderings equal RETURNN's;
    random ones have RETURNN's structure with seqstore's keyed permutation.

    Cost: construction opens the store (reads the manifest only): O(fields x shards), whatever N.
    ``init_seq_order`` is O(1) (``sorted*``/``sort_bin_shuffle*``: plus, once per store and machine, one
    pass over the offsets to write the lengths cache and a bounded-memory sort written to disk).
    ``get_data`` is O(log shards) and returns a read-only view of the mapped rows.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        seq_order_key: str | None = None,
        num_outputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        for opt, hint in _UNSUPPORTED.items():
            if kwargs.get(opt):
                raise ValueError(f"StoreDataset: option {opt}={kwargs[opt]!r} is not supported ({hint})")
        super().__init__(**kwargs)
        self._init_kwargs: dict[str, Any] = {
            "path": str(path), "cache_dir": None if cache_dir is None else str(cache_dir),
            "seq_order_key": seq_order_key, "num_outputs": num_outputs, **kwargs,
        }
        self.path = str(path)
        self._store = open_store(path, bfloat16="float32")
        self._cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(self._store)
        schema = self._store.schema
        meta = self._store.metadata.get("returnn", {})
        meta = meta if isinstance(meta, dict) else {}
        ragged = [n for n, f in schema.items() if f.ragged]
        if seq_order_key is None:
            inputs = meta.get("inputs")
            fallback = "data" if "data" in ragged else (ragged[0] if ragged else None)
            seq_order_key = inputs if inputs in ragged else fallback
        elif seq_order_key not in ragged:
            raise ValueError(f"{self.path}: seq_order_key {seq_order_key!r} is not a ragged field; ragged fields: "
                             f"{ragged}")
        self._order_key = seq_order_key
        self._lengths_source = None if seq_order_key is None else _OrderLengths(
            self._store, length_field=seq_order_key, fields=[], cache_dir=self._cache_dir)
        self._keys = list(schema)
        self._ragged = {n: schema[n].ragged for n in self._keys}
        outs: dict[str, tuple[int, int]] = {}
        for n, f in schema.items():
            dim, ndim, _ = stream_dims(self._store, n, f)
            outs[n] = (1 if dim is None else dim, ndim)  # (a sparse dim without metadata: RETURNN's "unknown")
        for k, v in (num_outputs or {}).items():
            if k not in schema:
                raise KeyError(f"num_outputs: no field {k!r} in {self.path}; fields are {self._keys}")
            pair = list(v) if isinstance(v, (tuple, list)) else []
            if len(pair) != 2 or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0
                                         for x in pair):
                raise ValueError(f"num_outputs[{k!r}] must be (dim, ndim), two whole numbers >= 0, got {v!r}")
            outs[k] = (int(pair[0]), int(pair[1]))
        self.num_outputs = outs
        self.num_inputs = outs["data"][0] if "data" in outs else 0
        if labels := recorded_labels(self._store.url, meta, schema):
            self.labels = labels
        self._dtypes = {n: ("float32" if f.dtype == "bfloat16" else str(np.dtype(f.dtype))) for n, f in schema.items()}
        self._num_timesteps = 0 if seq_order_key is None else self._store.manifest.total_rows(seq_order_key)
        self._order: Order | None = None
        self._explicit: np.ndarray[Any, Any] | None = None

    # ------------------------------------------------------------------------------------ pickling

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as constructor arguments plus (epoch, sharding, explicit order): the store by path."""
        state = {"epoch": self.epoch, "num_shards": self._num_shards, "shard_index": self._shard_index,
                 "explicit": self._explicit}
        return _rebuild, (dict(self._init_kwargs), state)

    # --------------------------------------------------------------------------------------- orders

    def _epoch_order(self, name: str, **kwargs: Any) -> Order:
        """The data layer's order (:func:`seqstore.data._orders.dataset_order`) of ordering ``name`` over
        the store, with the lengths of ``seq_order_key`` (lazy for laplace, the cached array for the
        global sorts). ``kwargs``: epoch, seed, partition_epoch, shard_index, num_shards."""
        src = self._lengths_source
        if src is None:
            if ordering_needs_lengths(name):
                raise ValueError(f"{self.path}: seq_ordering {name!r} needs lengths but no field is ragged")
            return dataset_order(len(self._store), name, **kwargs)
        return dataset_order(len(self._store), name, lengths=src.lengths, lengths_array=src.lengths_array,
                             sort_cache=src._sort_cache, **kwargs)

    def _ordering_name(self, epoch: int) -> str:
        method = self.seq_ordering
        if callable(method):
            from returnn.util.basic import get_fwd_compat_kwargs

            method = method(epoch=epoch, **get_fwd_compat_kwargs())
        if not isinstance(method, str):
            raise TypeError(f"seq_ordering must be a str or a callable returning one, got {method!r}")
        return method

    def init_seq_order(
        self, epoch: int | None = None, seq_list: Sequence[str] | None = None, seq_order: Sequence[int] | None = None
    ) -> bool:
        """Set the order of sub-epoch ``epoch`` (O(1)); ``seq_list`` (tags) or ``seq_order`` (corpus
        indices) give an explicit order instead, used as is (RETURNN's convention: not partitioned)."""
        super().init_seq_order(epoch=epoch, seq_list=seq_list, seq_order=seq_order)
        n = len(self._store)
        self._explicit = None
        if seq_list is not None:
            self._explicit = self._store.index_many(list(seq_list))
        elif seq_order is not None:
            self._explicit = np.asarray(seq_order, dtype=np.int64)
        if self._explicit is not None:
            self._order = _seq_order(n, self._explicit, epoch=1)
        elif epoch is None:
            self._order = _seq_order(n, "default", epoch=1)[0:0]
        else:
            name = self._ordering_name(epoch)
            p, s, k = self.partition_epoch or 1, self._num_shards, self._shard_index
            if self.fixed_random_seed is not None:
                full = self._epoch_order(name, epoch=1, seed=int(self.fixed_random_seed))
                self._order = full.shard(((epoch - 1) % p) * s + k, p * s) if p * s > 1 else full
            else:
                self._order = self._epoch_order(name, epoch=epoch, seed=int(self.random_seed_offset),
                                                partition_epoch=p, shard_index=k, num_shards=s)
        self._num_seqs = len(self._order)
        return True

    def get_current_seq_order(self) -> Sequence[int]:
        """The lazy order of the current sub-epoch: position -> corpus index (a ``seqstore.Order``)."""
        if self._order is None:
            raise SeqstoreError(f"{self}: call init_seq_order first")
        return self._order

    @property
    def num_seqs(self) -> int:
        """Sequences in the current sub-epoch (this shard)."""
        return len(self.get_current_seq_order())

    def supports_sharding(self) -> bool:
        return True

    def supports_seq_order_sorting(self) -> bool:
        return True

    def _load_seqs(self, start: int, end: int) -> None:
        """Nothing to load: records are read from the mapped store on demand."""

    def is_cached(self, start: int, end: int) -> bool:
        return True

    # ----------------------------------------------------------------------------------------- data

    def get_corpus_seq_idx(self, seq_idx: int) -> int:
        return int(self.get_current_seq_order()[seq_idx])

    def have_corpus_seq_idx(self) -> bool:
        return True

    def _data_by_corpus_idx(self, idx: int, key: str) -> Any:
        if key not in self._ragged:
            raise KeyError(f"{self.path}: no data key {key!r}; keys are {self._keys}")
        value = self._store[idx][key]
        if not self._ragged[key]:
            value = value[None]
        if key == "data" and self.window > 1:
            value = self._sliding_window(value)
        return value

    def get_data(self, seq_idx: int, key: str) -> Any:
        """Rows of field ``key`` of the ``seq_idx``-th sequence of the epoch: (T, *row) read-only view;
        a fixed field is one row, (1, *shape). O(log shards)."""
        return self._data_by_corpus_idx(self.get_corpus_seq_idx(seq_idx), key)

    def get_seq_length(self, seq_idx: int) -> NumbersDict:
        idx = self.get_corpus_seq_idx(seq_idx)
        return NumbersDict({k: (int(self._store.lengths(k)[idx]) if r else 1) for k, r in self._ragged.items()})

    def get_estimated_seq_length(self, seq_idx: int) -> int:
        idx = self.get_corpus_seq_idx(seq_idx)
        return int(self._store.lengths(self._order_key)[idx]) if self._order_key else 1

    def get_tag(self, sorted_seq_idx: int) -> str:
        return _tag(self._store, self.get_corpus_seq_idx(sorted_seq_idx))

    def get_all_tags(self) -> Sequence[str]:
        """Every tag of the store in corpus order, as a lazy sequence (nothing is read up front)."""
        return _Tags(self._store)

    def get_total_num_seqs(self, *, fast: bool = False) -> int:
        return len(self._store)

    def have_get_corpus_seq(self) -> bool:
        return True

    def get_corpus_seq(self, corpus_seq_idx: int) -> DatasetSeq:
        features = {k: self._data_by_corpus_idx(corpus_seq_idx, k) for k in self._keys}
        return DatasetSeq(seq_idx=corpus_seq_idx, features=features, seq_tag=_tag(self._store, corpus_seq_idx))

    def get_data_keys(self) -> list[str]:
        return list(self._keys)

    def get_target_list(self) -> list[str]:
        return [k for k in self._keys if k != "data"]

    def get_data_dtype(self, key: str) -> str:
        return self._dtypes[key]

    def is_data_sparse(self, key: str) -> bool:
        """Integer data with no feature axis (RETURNN HDFDataset's rule)."""
        return "int" in self._dtypes[key] and self.num_outputs[key][1] <= 1

    def get_num_timesteps(self) -> int:
        """Total rows of the ordering field (O(shards), from the manifest)."""
        return self._num_timesteps

    def __repr__(self) -> str:
        return f"<StoreDataset {self.name!r} {self.path!r} epoch={self.epoch}>"

