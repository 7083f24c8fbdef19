"""Grain (JAX) adapters: a random-access :class:`DataSource` over a store or any seqstore dataset, and an
:class:`EpochSampler` that feeds Grain's ``DataLoader`` a seqstore epoch order.

``DataSource`` implements Grain's ``RandomAccessDataSource`` protocol and its batched read ``_getitems``
(Grain 0.2.18's name); ``EpochSampler`` implements Grain's ``Sampler`` protocol, a pure function of the
global position, so Grain's checkpoints resume exactly. Both pickle small: the dataset travels as its
own pickle and is opened in the worker on first use; nothing of size N is held or pickled.

Grain is optional: ``import seqstore.grain`` works without it; :class:`DataSource` and :class:`PadBatch`
need nothing of it; :class:`EpochSampler` does and says so (``pip install 'seqstore[grain]'``).
"""

from __future__ import annotations

import bisect
import copy
import hashlib
import os
import pickle
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .data import StoreDataset
from .data._cache import fingerprint
from .errors import SeqstoreError
from .order import Order, ordering_name
from .order._keys import int_text
from .schema import field_list
from .store import Store

__all__ = ["DataSource", "EpochSampler", "PadBatch", "GrainMissingError", "INDEX_KEY", "LENGTHS_SUFFIX"]

INDEX_KEY = "index"
LENGTHS_SUFFIX = "_lengths"
_GRAIN_PIN = "grain>=0.2.18"


class GrainMissingError(SeqstoreError, ImportError):
    """Grain is not installed (``pip install 'seqstore[grain]'``)."""


def _grain(what: str) -> Any:
    try:
        import grain  # type: ignore[import-untyped]
    except ImportError as exc:
        raise GrainMissingError(f"seqstore.grain.{what} needs Grain ({_GRAIN_PIN}), which is not importable here "
                                f"({exc}); install it with pip install 'seqstore[grain]'") from exc
    return grain


def _dumps(obj: Any) -> bytes:
    """Pickle ``obj`` (cloudpickle where present, so datasets defined in a script or notebook travel too)."""
    try:
        import cloudpickle  # type: ignore[import-untyped]
    except ImportError:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return bytes(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def as_dataset(obj: Any) -> Any:
    """A seqstore dataset from a store, a store path, a :class:`DataSource` or a protocol dataset
    (``num_seqs``, ``epoch_order``, ``get``, ``get_batch``, ``lengths``). A bad store raises its seqstore error."""
    if isinstance(obj, DataSource):
        return obj.dataset
    if isinstance(obj, (Store, str, os.PathLike)):
        return StoreDataset(obj)
    if missing := [m for m in ("num_seqs", "epoch_order", "get", "get_batch", "lengths") if not hasattr(obj, m)]:
        raise TypeError(f"seqstore.grain: expected a seqstore Store, a store path or a seqstore.data dataset; "
                        f"{type(obj).__name__} lacks {missing}")
    return obj


class _Lazy:
    """A dataset that pickles as its own pickle and is unpickled (opened) on first use in the process
    that received it. Thread-safe: Grain reads from a pool of threads in each worker."""

    def __init__(self, dataset: Any) -> None:
        self._dataset: Any = dataset
        self._blob: bytes | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"blob": self._blob if self._dataset is None else _dumps(self._dataset)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._dataset = None
        self._blob = state["blob"]
        self._lock = threading.Lock()

    def get(self) -> Any:
        ds = self._dataset
        if ds is None:
            with self._lock:
                if self._dataset is None:
                    assert self._blob is not None
                    self._dataset = pickle.loads(self._blob)
                ds = self._dataset
        return ds


def _ordering_text(ordering: Any) -> str:
    """An ordering for a repr: its name, or a digest of an explicit order (O(len) once)."""
    if ordering_name(ordering) != "explicit":
        return str(ordering)
    arr = np.load(os.fspath(ordering), mmap_mode="r") if isinstance(ordering, (str, os.PathLike)) \
        else np.asarray(ordering)
    h = hashlib.blake2b(digest_size=8)
    for a in range(0, len(arr), 1 << 20):
        h.update(np.ascontiguousarray(arr[a : a + (1 << 20)], dtype=np.int64).tobytes())
    return f"explicit:{len(arr)}:{h.hexdigest()}"


def _identity(dataset: Any) -> str:
    """The dataset's class, size and content fingerprint (the data layer's cache key: for a store, every
    shard's name and record count and the CRC of the length field's offsets), for reprs that Grain
    compares when it restores a checkpoint. Not the path: a store copied elsewhere resumes. O(shards)."""
    key_fn = getattr(dataset, "cache_key", None)
    key = key_fn() if callable(key_fn) else None
    kind = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    n = int(dataset.num_seqs)
    return f"{type(dataset).__name__}(n={n}, fingerprint={fingerprint('grain', kind, n, key)})"


def _check_index(i: Any, n: int) -> int:
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
        raise TypeError(f"seqstore.grain.DataSource index must be an int, got {type(i).__name__}")
    j = int(i) + n if int(i) < 0 else int(i)
    if not 0 <= j < n:
        raise IndexError(f"seqstore.grain.DataSource index {i} out of range for {n} records")
    return j


class DataSource:
    """Grain's random-access data source over a store, a store path or any ``seqstore.data`` dataset.

    ``source[i]`` is record ``i``: a dict field -> NumPy array (a ragged field as its (T, ...) rows),
    read with the dataset's ``get`` and copied once (it owns its memory). ``fields``: the fields to return (default
    all). ``with_index``: add ``"index"`` (int64 scalar), the record number. ``source._getitems(indices)``
    (Grain's batched read) gathers all of them with one ``get_batch``. ``len(source)`` is the record
    count; ``repr`` names the dataset by content (Grain checks it when restoring a checkpoint).

    A store path is opened here, so a missing or damaged store raises its :class:`~seqstore.SeqstoreError`
    at once. Pickling carries the dataset's own small pickle; a Grain worker opens it on first use.
    Memory O(1) plus the record being read.
    """

    def __init__(self, dataset_or_store: Any, fields: Sequence[str] | None = None, *, with_index: bool = False) -> None:
        ds = as_dataset(dataset_or_store)
        if fields is not None:
            if isinstance(fields, str):
                raise TypeError("seqstore.grain.DataSource: fields must be a sequence of names, not a string")
            fields = list(fields)
            if isinstance(ds, StoreDataset):
                names = ds.field_names  # a StoreDataset of some fields returns only those
                if unknown := [f for f in fields if f not in names]:
                    raise KeyError(f"{ds.store.url}: no field(s) {unknown}; fields are {names}")
                if ds.fields is None:  # gather only these fields
                    ds = copy.copy(ds)
                    ds.fields = list(fields)
        self.fields: tuple[str, ...] | None = None if fields is None else tuple(fields)
        self.with_index = bool(with_index)
        kinds = _fields(ds)  # (None: an empty dataset without a schema, whose fields cannot be known)
        if kinds is not None and fields is not None and (unknown := [f for f in fields if f not in kinds]):
            raise KeyError(f"seqstore.grain.DataSource: {ds!r} returns no field(s) {unknown}; "
                           f"fields are {sorted(kinds)}")
        if self.with_index and INDEX_KEY in ((kinds or {}) if self.fields is None else self.fields):
            raise KeyError(f"seqstore.grain.DataSource: with_index, but the dataset has a field {INDEX_KEY!r}; "
                           "pass fields= without it")
        self._num_seqs = int(ds.num_seqs)
        self._ragged: tuple[str, ...] = tuple(n for n, ragged in (kinds or {}).items()
                                              if ragged and (self.fields is None or n in self.fields))
        shown = None if self.fields is None else list(self.fields)
        self._repr = f"seqstore.grain.DataSource({_identity(ds)}, fields={shown}, with_index={self.with_index})"
        self._lazy = _Lazy(ds)

    @property
    def dataset(self) -> Any:
        """The seqstore dataset (opened in this process on first use)."""
        return self._lazy.get()

    @property
    def ragged_fields(self) -> tuple[str, ...]:
        """The returned fields that are ragged (variable first dimension)."""
        return self._ragged

    def __len__(self) -> int:
        return self._num_seqs

    def _with_index(self, out: dict[str, Any], index: np.ndarray[Any, Any]) -> dict[str, Any]:
        """``out`` plus ``"index"`` when ``with_index`` (KeyError if the dataset has such a field)."""
        if self.with_index:
            if INDEX_KEY in out:
                raise KeyError(f"seqstore.grain.DataSource: with_index, but the dataset has a field {INDEX_KEY!r}")
            out[INDEX_KEY] = index
        return out

    def __getitem__(self, i: int) -> dict[str, np.ndarray[Any, Any]]:
        """Record ``i``, copied once out of the mapping (``dataset.get``: a record's own read, about 50x
        cheaper than a ``get_batch`` of one, whose read planning is sized for batches). O(record size)."""
        j = _check_index(i, self._num_seqs)
        rec = self.dataset.get(j)
        names = rec if self.fields is None else self.fields
        return self._with_index({k: np.array(rec[k]) for k in names}, np.array(j, dtype=np.int64))

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, np.ndarray[Any, Any]]]:
        """Records ``indices`` with one ``get_batch``; the records are views into the gathered batch.
        O(batch elements)."""
        idx = np.asarray(indices)
        if idx.size and idx.dtype.kind not in "iu":
            raise TypeError(f"seqstore.grain.DataSource indices must be ints, got {idx.dtype}")
        idx = idx.astype(np.int64).reshape(-1)
        if idx.size and (int(idx.min()) < -self._num_seqs or int(idx.max()) >= self._num_seqs):
            bad = int(idx.min()) if int(idx.min()) < -self._num_seqs else int(idx.max())
            raise IndexError(f"seqstore.grain.DataSource index {bad} out of range for {self._num_seqs} records")
        idx = np.where(idx < 0, idx + self._num_seqs, idx)
        batch: dict[str, Any] = self.dataset.get_batch(idx)
        if self.fields is not None:
            batch = {k: batch[k] for k in self.fields}
        batch = self._with_index(batch, idx.copy())
        split = {k: np.split(v[0], np.cumsum(np.asarray(v[1], dtype=np.int64))[:-1]) if isinstance(v, tuple) else v
                 for k, v in batch.items()}
        return [{k: v[b] for k, v in split.items()} for b in range(len(idx))]

    def batch_fn(self, *, pad_multiple: int = 1) -> PadBatch:
        """A ``batch_fn`` for ``grain.transforms.Batch`` that pads exactly this source's ragged fields."""
        return PadBatch(self._ragged, pad_multiple=pad_multiple)

    def __repr__(self) -> str:
        return self._repr


def _fields(dataset: Any) -> dict[str, bool] | None:
    """Field name -> whether it is ragged, for the fields a record of ``dataset`` is returned with: from the
    store's schema where there is one, else from one record (None without records: not known)."""
    store = getattr(dataset, "store", None)
    if isinstance(dataset, StoreDataset):
        return {n: dataset.store.schema[n].ragged for n in dataset.field_names}
    if isinstance(store, Store):
        return {n: f.ragged for n, f in store.schema.items()}
    if not int(dataset.num_seqs):
        return None
    return {n: isinstance(v, tuple) for n, v in dataset.get_batch(np.zeros(1, np.int64)).items()}


class PadBatch:
    """Batches records of a :class:`DataSource` (``grain.transforms.Batch(batch_size, batch_fn=...)``):
    fixed fields stacked to (B, ...); each ragged field ``name`` zero-padded to (B, T, ...) with ``T`` the
    longest record rounded up to a multiple of ``pad_multiple`` (fewer shapes for ``jax.jit`` to compile),
    plus ``name + "_lengths"`` (int64, (B,)). Picklable. O(batch elements)."""

    def __init__(self, ragged: str | Sequence[str], *, pad_multiple: int = 1) -> None:
        if isinstance(pad_multiple, bool) or not isinstance(pad_multiple, (int, np.integer)) or pad_multiple < 1:
            raise ValueError(f"PadBatch: pad_multiple must be an integer >= 1, got {pad_multiple!r}")
        self.ragged = tuple(field_list(ragged) or ())  # (a str is one field's name, not its letters)
        self.pad_multiple = int(pad_multiple)

    def __call__(self, records: Sequence[dict[str, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        if not records:
            raise ValueError("PadBatch: an empty batch")
        out: dict[str, np.ndarray[Any, Any]] = {}
        for name in records[0]:
            rows = [np.asarray(r[name]) for r in records]
            if name not in self.ragged:
                out[name] = np.stack(rows)
                continue
            key = name + LENGTHS_SUFFIX
            if key in records[0]:
                raise KeyError(f"PadBatch: output key {key!r} for ragged field {name!r} clashes with a field")
            lengths = np.array([len(r) for r in rows], dtype=np.int64)
            t = -(-int(lengths.max()) // self.pad_multiple) * self.pad_multiple
            padded = np.zeros((len(rows), t, *rows[0].shape[1:]), dtype=rows[0].dtype)
            for b, r in enumerate(rows):
                padded[b, : len(r)] = r
            out[name] = padded
            out[key] = lengths
        return out

    def __repr__(self) -> str:
        return f"seqstore.grain.PadBatch(ragged={list(self.ragged)}, pad_multiple={self.pad_multiple})"


class EpochSampler:
    """Grain's ``Sampler`` over seqstore epoch orders: RETURNN orderings, partition epochs, exact resume.

    ``dataset``: a :class:`DataSource`, a seqstore dataset, a store or a store path; its ``ordering``,
    ``seed`` and ``partition_epoch`` define the orders (``seqstore.StoreDataset(path, ordering=...,
    seed=..., partition_epoch=...)``). ``shard_options``: Grain's ``ShardOptions`` (rank and world size;
    default no sharding); the ``DataLoader`` takes them from the sampler when it is given none, and must
    otherwise be given the same. ``epoch``: the first (sub-)epoch, 1-based as in RETURNN;
    ``num_epochs``: how many follow one another (None: without end). ``rng_seed``: when set, each
    record's metadata carries ``np.random.Generator(Philox(rng_seed + position))`` for Grain's
    ``RandomMap`` (as Grain's own samplers do).

    Global position ``g`` lies in sub-epoch ``epoch + k``; within an epoch of ``L`` records the
    positions are ``L`` rounded up to a multiple of the shard count (the order repeats from its start,
    like ``DistributedSampler``) or down with ``shard_options.drop_remainder``, so every shard gets the
    same count per epoch. Grain's ``DataLoader`` gives shard ``s`` positions ``s, s + S, ...``.
    ``sampler[g]`` takes a chunk of ``chunk_size`` order positions at a time (``Order.take``; memory
    O(chunk_size)); epoch lengths are O(1) each, kept for the epochs reached (one int per epoch).

    ``repr`` names the dataset by content, the ordering and these arguments: Grain stores it in its
    checkpoints and refuses a state saved under another order.
    """

    def __init__(self, dataset: Any, *, shard_options: Any = None, epoch: int = 1, num_epochs: int | None = 1,
                 rng_seed: int | None = None, chunk_size: int = 1 << 12) -> None:
        grain = _grain("EpochSampler")
        lazy = dataset._lazy if isinstance(dataset, DataSource) else _Lazy(as_dataset(dataset))
        ds = lazy.get()
        if shard_options is None:
            shard_options = grain.sharding.NoSharding()
        if not isinstance(shard_options, grain.sharding.ShardOptions):
            raise TypeError(f"EpochSampler: shard_options must be a grain.sharding.ShardOptions, got {shard_options!r}")
        count, index = int(shard_options.shard_count), int(shard_options.shard_index)
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"EpochSampler: shard_index must be in [0, shard_count), got {index} of {count}")
        for name, v in (("epoch", epoch), ("num_epochs", num_epochs), ("chunk_size", chunk_size)):
            if v is None and name == "num_epochs":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"EpochSampler: {name} must be an integer >= 1, got {v!r}"
                                 + (" (epochs are 1-based as in RETURNN)" if name == "epoch" and v == 0 else ""))
        if rng_seed is not None and (isinstance(rng_seed, bool) or not isinstance(rng_seed, (int, np.integer))
                                     or rng_seed < 0):  # (a Philox key is rng_seed + position)
            raise ValueError(f"EpochSampler: rng_seed must be a non-negative integer or None, got {rng_seed!r}")
        self._shard_options = shard_options  # the attribute grain.DataLoader reads when it gets none
        self._count = count
        self._drop = bool(shard_options.drop_remainder)
        self.epoch = int(epoch)
        self.num_epochs = None if num_epochs is None else int(num_epochs)
        self.rng_seed = None if rng_seed is None else int(rng_seed)
        self.chunk_size = int(chunk_size)
        self._lazy = lazy
        self._init_caches()
        self._starts: list[int] = [0]
        self._lengths: list[int] = []
        self._extend(self.num_epochs if self.num_epochs is not None else 1)
        if self.num_epochs is not None and self._starts[-1] == 0:
            raise ValueError(f"EpochSampler: epochs {self.epoch}..{self.epoch + self.num_epochs - 1} of {ds!r} "
                             f"have no positions for {count} shard(s)")
        if self.rng_seed is not None and self.rng_seed + len(self) - 1 >= 1 << 128:  # (else numpy's error, per read)
            raise ValueError(f"EpochSampler: rng_seed {self.rng_seed} + position is a Philox key and must stay below "
                             f"2**128 for the {len(self)} positions; pass a smaller rng_seed")
        ordering = _ordering_text(getattr(ds, "ordering", "default"))
        seed, partition = int(getattr(ds, "seed", 0)), int(getattr(ds, "partition_epoch", 1))
        self._repr = (f"seqstore.grain.EpochSampler({_identity(ds)}, ordering={ordering}, seed={int_text(seed)}, "
                      f"partition_epoch={partition}, epoch={self.epoch}, "
                      f"num_epochs={self.num_epochs}, shard_options={shard_options!r}, rng_seed={self.rng_seed})")

    def _init_caches(self) -> None:
        self._lock = threading.Lock()
        self._orders: dict[int, Order] = {}
        self._chunk: tuple[int, int, np.ndarray[Any, np.dtype[np.int64]]] | None = None
        self._metadata: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_orders", "_chunk", "_metadata")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_caches()

    @property
    def shard_options(self) -> Any:
        return self._shard_options

    def _padded(self, length: int) -> int:
        q = length // self._count if self._drop else -(-length // self._count)
        return q * self._count

    def _extend(self, epochs: int) -> None:
        """Know the lengths of the first ``epochs`` epochs (O(1) each: an order's length)."""
        while len(self._lengths) < epochs:
            e = self.epoch + len(self._lengths)
            length = len(self._order(e))
            self._lengths.append(length)
            self._starts.append(self._starts[-1] + self._padded(length))

    def _order(self, e: int) -> Order:
        order = self._orders.get(e)
        if order is None:
            order = self._lazy.get().epoch_order(e)
            if len(self._orders) >= 2:
                self._orders.pop(next(iter(self._orders)))
            self._orders[e] = order
        return order

    def __len__(self) -> int:
        """Positions of all the epochs together (every shard's); ``sys.maxsize`` without an end."""
        return self._starts[-1] if self.num_epochs is not None else sys.maxsize

    def locate(self, position: int) -> tuple[int, int]:
        """(sub-epoch, record position in its epoch order) of global position ``position``. O(log epochs)."""
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or position < 0 \
                or position >= len(self):
            raise IndexError(f"EpochSampler: position {position!r} out of range [0, {len(self)})")
        g = int(position)
        with self._lock:
            if self.num_epochs is None:
                empty = 0
                while self._starts[-1] <= g:
                    self._extend(len(self._lengths) + 1)
                    empty = empty + 1 if self._starts[-1] == self._starts[-2] else 0
                    if empty >= 64:
                        last = self.epoch + len(self._lengths) - 1
                        raise ValueError(f"EpochSampler: 64 epochs in a row up to epoch {last} have no positions")
            k = bisect.bisect_right(self._starts, g) - 1
            return self.epoch + k, (g - self._starts[k]) % self._lengths[k]

    def record(self, position: int) -> int:
        """The record number at global position ``position``."""
        e, p = self.locate(position)
        c = p // self.chunk_size
        chunk = self._chunk
        if chunk is None or chunk[0] != e or chunk[1] != c:
            with self._lock:
                order = self._order(e)
            lo = c * self.chunk_size
            chunk = (e, c, order.take(np.arange(lo, min(lo + self.chunk_size, len(order)), dtype=np.int64)))
            self._chunk = chunk  # one tuple assignment: threads see the old chunk or the new one
        return int(chunk[2][p - c * self.chunk_size])

    def __getitem__(self, position: int) -> Any:
        """Grain's ``RecordMetadata`` of global position ``position``."""
        if self._metadata is None:
            self._metadata = _grain("EpochSampler").RecordMetadata
        key = self.record(position)
        rng = None
        if self.rng_seed is not None:
            rng = np.random.Generator(np.random.Philox(key=self.rng_seed + int(position)))
        return self._metadata(index=int(position), record_key=key, rng=rng)

    def __repr__(self) -> str:
        return self._repr
