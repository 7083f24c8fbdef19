"""Reading stores: constant-time open, lazily memory-mapped shards, zero-copy record views.

:func:`open_store` (``seqstore.open``) reads ``manifest.json`` only. A shard's files are mapped the
first time one of its records is touched, after cheap checks (file size, ``.npy`` header, the first
and last offsets) against the manifest; every failure is a :class:`~seqstore.CorruptionError` naming
the file. Global index -> (shard, row) is a binary search over the shards' first records (the
mapped shard table of a version-3 store: nothing per shard in memory). Ids are found through sorted
64-bit hash indexes (per shard, and merged runs under ``_index/``), comparing the id bytes of every
candidate.

Packed groups (format version 2) are mapped as one ``(n, width)`` matrix per shard; each packed
field is a zero-copy strided view of its column range. :meth:`Store.matrix` and
:meth:`Store.iter_matrix` hand out ``(rows, D)`` matrices for GEMMs, zero-copy where the layout allows.
"""

from __future__ import annotations

import bisect
import dataclasses
import errno
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numba
import numpy as np

from ..errors import CorruptionError, SeqstoreError, open_files_exhausted
from ..format.manifest import IDS, FileInfo, IndexRun, Manifest, ShardInfo
from ..format.npy import read_header
from ..io import address, any_cold, holds_descriptors, lookahead, map_file, willneed, willneed_span
from ..io.advice import request_bytes
from ..io.mapping import MADV_RANDOM, MADV_SEQUENTIAL
from ..io.objects import is_remote
from ..schema import BFLOAT16, Field, PackedGroup, Schema, bfloat16_to_float32
from .ids import encode_ids, hash_ids, hash_one, id_equal, probe_sorted

__all__ = ["Store", "open_store", "Lengths"]

_BF16_MODES = ("bits", "float32", "ml_dtypes")
#: (mapped shard, positions in the batch, local rows): one shard's part of a batch (Store._batch_groups).
#: Holding the shard keeps its files mapped for the whole call, whatever the LRU of mapped shards does.
_Group = tuple["_Shard", Any, np.ndarray[Any, Any]]
_READAHEAD_MODES = ("auto", "always", "never")
#: records per field and read-ahead stage whose pages are probed with mincore (about 2 us each)
_SAMPLE = 4
#: values (the plan's width counts values) of a zero-copy matrix view read ahead when it is made
_VIEW_AHEAD = 8 << 20


def _mapped_shard_limit(schema: Schema) -> int:
    """Default bound on mapped shards: each holds up to one mapping per file (plus a descriptor per file
    where mappings keep one); stay well inside ``vm.max_map_count`` (or ``RLIMIT_NOFILE``)."""
    files = len(schema.groups) + sum(1 for n, f in schema.items() if schema.group_of(n) is None) + 4
    files += sum(1 for _, f in schema.items() if f.ragged)
    if holds_descriptors():
        try:
            import resource

            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ImportError, OSError, ValueError):
            soft = 1024
        soft = 1024 if soft < 0 else soft
        return max(4, (soft // 2) // files)
    try:
        with open("/proc/sys/vm/max_map_count") as fh:
            maps = int(fh.read())
    except (OSError, ValueError):
        maps = 65530
    return max(16, min(8192, (maps // 2) // files))


def _load_manifest(root: Path) -> Manifest:
    """``manifest.json``, with a version-3 shard table mapped through seqstore.io (no descriptor held)."""
    return Manifest.load(root, map_file=map_file)


def map_npy(
    path: Path, info: FileInfo | None, dtype: np.dtype[Any], shape: tuple[int, ...], *, sequential: bool = False
) -> np.ndarray[Any, Any]:
    """Memory-map a ``.npy`` file read-only after checking it against what the manifest promises.

    Advised random access (a cold fault reads one page), or sequential access with ``sequential=True``
    for callers that read the whole file in order (``verify``)."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise CorruptionError(f"{path}: file is missing") from None
    except OSError as exc:
        raise CorruptionError(f"{path}: cannot stat ({exc})") from exc
    if info is not None and size != info.bytes:
        raise CorruptionError(f"{path}: file has {size} bytes, manifest says {info.bytes} (truncated or replaced?)")
    header = read_header(path)
    if header.dtype != dtype:
        raise CorruptionError(f"{path}: header dtype {header.dtype.str}, expected {dtype.str}")
    if header.shape != shape:
        raise CorruptionError(f"{path}: header shape {header.shape}, expected {shape}")
    if header.data_offset + header.data_bytes != size:
        raise CorruptionError(
            f"{path}: {size} bytes on disk but header says {header.data_offset + header.data_bytes}"
        )
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        empty = np.empty(shape, dtype=dtype)
        empty.flags.writeable = False
        return empty
    try:
        # no descriptor stays open (see seqstore.io)
        raw = map_file(path, size, advice=MADV_SEQUENTIAL if sequential else MADV_RANDOM)
    except OSError as exc:
        limit = open_files_exhausted(path, exc)
        if limit is not None:
            raise limit from exc
        if exc.errno == errno.ENOMEM:
            raise OSError(exc.errno, f"cannot map {path} ({exc.strerror}): too many mappings in this process "
                          "(vm.max_map_count) or no address space left; open the store with a smaller "
                          "max_mapped_shards") from exc
        raise CorruptionError(f"{path}: cannot map ({exc})") from exc
    except ValueError as exc:
        raise CorruptionError(f"{path}: cannot map ({exc})") from exc
    return np.frombuffer(raw, dtype=dtype, count=count, offset=header.data_offset).reshape(shape)


class _Shard:
    """The mapped files of one committed shard. Built on first touch."""

    __slots__ = (
        "path", "display", "map_npy", "info", "columns", "offsets", "groups", "ids", "id_offsets", "id_hash",
        "id_rows", "_plan", "_copy_plan", "_spans", "request",
    )

    def __init__(
        self, root: Path, info: ShardInfo, schema: Schema, map_npy: Any = map_npy, display: str | None = None
    ) -> None:
        self.path = root / info.name
        self.display = str(self.path) if display is None else display  # the shard's place in messages
        self.map_npy = map_npy
        self.info = info
        self.columns: dict[str, np.ndarray[Any, Any]] = {}
        self.offsets: dict[str, np.ndarray[Any, Any]] = {}
        self.groups: dict[str, np.ndarray[Any, Any]] = {}
        n = info.records
        for gname, g in schema.groups.items():
            rel = f"{gname}.npy"
            mat = self.map_npy(self.path / rel, info.files.get(rel), g.storage_dtype, (n, g.width))
            self.groups[gname] = mat
            for name in g.fields:
                a, b = g.columns[name]
                view = mat[:, a:b].reshape(n, *schema[name].inner_shape)  # splits the contiguous axis: a view
                self.columns[name] = view
        for name, f in schema.items():
            if name in self.columns:
                continue
            rel = f"{name}.npy"
            if f.ragged:
                orel = f"{name}.offsets.npy"
                off = self.map_npy(self.path / orel, info.files.get(orel), np.dtype("<i8"), (n + 1,))
                rows = info.rows[name]
                if off[0] != 0 or off[-1] != rows:
                    raise CorruptionError(
                        f"{self.display}/{orel}: offsets run from {off[0]} to {off[-1]}, expected 0 to {rows}"
                    )
                self.offsets[name] = off
                shape: tuple[int, ...] = (rows, *f.inner_shape)
            else:
                shape = (n, *f.inner_shape)
            self.columns[name] = self.map_npy(self.path / rel, info.files.get(rel), f.storage_dtype, shape)
        self.ids: np.ndarray[Any, Any] | None = None
        self.id_offsets: np.ndarray[Any, Any] | None = None
        self.id_hash: np.ndarray[Any, Any] | None = None
        self.id_rows: np.ndarray[Any, Any] | None = None
        self._plan = [(name, self.columns[name], self.offsets.get(name)) for name in schema]
        # for owned copies: each packed group's row is copied once and its fields are views of that copy
        self._copy_plan = (
            [
                (self.groups[gname], [(name, *g.columns[name], schema[name].inner_shape) for name in g.fields])
                for gname, g in schema.groups.items()
            ],
            [name for name in schema if schema.group_of(name) is None],
        )
        self._spans: dict[str, tuple[int, int, int]] = {}
        self.request = request_bytes(self.path)  # bytes per read-ahead request on this shard's device

    def span(self, name: str) -> tuple[int, int, int]:
        """Where field ``name``'s bytes are, for read-ahead: ``(address of record 0, bytes from one record
        to the next, bytes of one record)`` for a fixed field; ``(address of row 0 of the values, bytes per
        row, address of the offsets)`` for a ragged one. Address 0: nothing mapped (an empty file)."""
        got = self._spans.get(name)
        if got is None:
            col = self.columns[name]
            off = self.offsets.get(name)
            base = address(col) if col.size else 0
            if off is None:
                inner = col.itemsize * int(np.prod(col.shape[1:], dtype=np.int64))
                got = (base, int(col.strides[0]) if col.ndim else inner, inner)
            else:
                row = col.itemsize * int(np.prod(col.shape[1:], dtype=np.int64))
                got = (base, row, address(off))
            self._spans[name] = got
        return got

    def record(self, row: int) -> dict[str, np.ndarray[Any, Any]]:
        out = {}
        for name, col, off in self._plan:
            if off is None:
                out[name] = col[row, ...]  # a view even for scalar fields (col[row] would copy)
            else:
                a = int(off[row])
                b = int(off[row + 1])
                if not 0 <= a <= b <= col.shape[0]:
                    raise CorruptionError(
                        f"{self.display}/{name}.offsets.npy: record {row} has offsets {a}..{b}, "
                        f"outside 0..{col.shape[0]}"
                    )
                out[name] = col[a:b]
        return out

    def record_copy(self, row: int) -> dict[str, np.ndarray[Any, Any]]:
        """Like :meth:`record` but owned, writable arrays: one copy per packed group and per other field."""
        groups, others = self._copy_plan
        out = {}
        for mat, fields in groups:
            r = mat[row].copy()
            for name, a, b, shape in fields:
                out[name] = r[a:b].reshape(shape)
        if others:
            views = self.record(row)  # bounds-checked views of the other fields
            for name in others:
                out[name] = views[name].copy()
        return out

    def load_ids(self) -> None:
        if self.ids is not None:
            return
        info, n = self.info, self.info.records
        files = info.files
        off = self.map_npy(self.path / f"{IDS}.offsets.npy", files.get(f"{IDS}.offsets.npy"), np.dtype("<i8"), (n + 1,))
        if off[0] != 0:
            raise CorruptionError(f"{self.display}/{IDS}.offsets.npy: first offset is {off[0]}, expected 0")
        total = int(off[-1])
        self.ids = self.map_npy(self.path / f"{IDS}.npy", info.files.get(f"{IDS}.npy"), np.dtype("u1"), (total,))
        self.id_hash = self.map_npy(self.path / f"{IDS}.hash.npy", files.get(f"{IDS}.hash.npy"), np.dtype("<u8"), (n,))
        self.id_rows = self.map_npy(
            self.path / f"{IDS}.hash_rows.npy", info.files.get(f"{IDS}.hash_rows.npy"), np.dtype("<i8"), (n,)
        )
        self.id_offsets = off


def _checked_bounds(
    sh: _Shard, name: str, rows: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(start, end) offsets of local ``rows`` of ragged field ``name``, checked to lie in range."""
    off = sh.offsets[name]
    a = np.asarray(off[rows])
    b = np.asarray(off[rows + 1])
    bad = (a < 0) | (b < a) | (b > sh.columns[name].shape[0])
    if bad.any():
        r = int(np.asarray(rows).reshape(-1)[np.flatnonzero(np.asarray(bad).reshape(-1))[0]])
        raise CorruptionError(
            f"{sh.display}/{(name + '.offsets.npy')}: record {r} has offsets {int(off[r])}..{int(off[r + 1])}, "
            f"outside 0..{sh.columns[name].shape[0]} or decreasing"
        )
    return a, b


@numba.njit(cache=True, nogil=True)
def _gather_rows(  # pragma: no cover - numba
    data: Any, offsets: Any, rows: Any, out: Any, out_starts: Any, stride: int
) -> None:
    """Copy ragged records ``rows`` (as bytes, ``stride`` bytes per row) to ``out`` at ``out_starts``."""
    for k in range(rows.shape[0]):
        r = rows[k]
        a = offsets[r] * stride
        b = offsets[r + 1] * stride
        o = out_starts[k]
        out[o : o + (b - a)] = data[a:b]  # a slice copy: about 4x a byte loop


def _id_bounds(sh: _Shard, row: int) -> tuple[int, int]:
    """Byte range of the id of local ``row`` in ``sh.ids``, checked to lie in range."""
    assert sh.ids is not None and sh.id_offsets is not None
    a, b = int(sh.id_offsets[row]), int(sh.id_offsets[row + 1])
    if not 0 <= a <= b <= len(sh.ids):
        raise CorruptionError(
            f"{sh.display}/{(IDS + '.offsets.npy')}: record {row} has id offsets {a}..{b}, outside 0..{len(sh.ids)}"
        )
    return a, b


@dataclass(frozen=True)
class _MatrixPlan:
    """How :meth:`Store.matrix` assembles rows: ``segments`` of (source, src_a, src_b, dst_a), where a
    source is a packed group's matrix or an unpacked field flattened to (n, size)."""

    segments: tuple[tuple[str, int, int, int], ...]
    columns: dict[str, tuple[int, int]]
    width: int
    storage_dtype: np.dtype[Any]
    bfloat16: bool


class Lengths:
    """Lazy per-record lengths of one ragged field, computed from the offsets on demand.

    ``len``, ``[i]``, ``[a:b]`` and ``[int_array]`` (vectorised) work without materialising all
    lengths; :meth:`iter_chunks` walks them in chunks; ``np.asarray(lengths)`` materialises (O(N)).
    """

    def __init__(self, store: Store, field: str) -> None:
        self._store = store
        self.field = field
        self.dtype = np.dtype(np.int64)
        self.shape = (len(store),)
        self.ndim = 1

    def __len__(self) -> int:
        return len(self._store)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)):
            k, row = self._store._locate(self._store._norm(int(key)))
            sh = self._store._shard(k)
            off = sh.offsets[self.field]
            self._store._need(off[row : row + 2])
            a, b = int(off[row]), int(off[row + 1])
            if not 0 <= a <= b <= sh.columns[self.field].shape[0]:
                _checked_bounds(sh, self.field, np.array([row]))  # raises, naming the file
            return b - a
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            return self.take(np.arange(start, stop, step, dtype=np.int64))
        return self.take(np.asarray(key))

    def take(self, indices: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Lengths of records ``indices`` (any int array), as int64."""
        store = self._store
        idx = store._norm_many(indices)
        flat = idx.reshape(-1)
        out = np.empty(flat.shape, dtype=np.int64)
        groups = store._batch_groups(flat)
        if store._readahead != "never" and len(flat) > 1:  # cold offsets: all their reads at once
            store._advise(groups, [self.field], values=False)
        store._need_groups(groups, [self.field], values=False)
        for sh, pos, rows in groups:
            a, b = _checked_bounds(sh, self.field, rows)
            out[pos] = b - a
        return out.reshape(idx.shape)

    def iter_chunks(self, size: int = 1 << 20) -> Iterator[np.ndarray[Any, np.dtype[np.int64]]]:
        """Yield the lengths in order, in arrays of at most ``size`` (per shard, from the offsets)."""
        ahead = self._store._readahead != "never"
        for k in range(self._store.num_shards):
            sh = self._store._shard(k)
            off = sh.offsets[self.field]
            for a in range(0, len(off) - 1, size):
                if ahead:  # this chunk and the next, so the disk reads while this one is processed
                    self._store._scan_ahead(off[a : min(a + 2 * size, len(off) - 1) + 1], sh.request)
                self._store._need(off[a : min(a + size, len(off) - 1) + 1])
                chunk = np.diff(off[a : min(a + size, len(off) - 1) + 1])
                if chunk.size and chunk.min() < 0:  # ends are checked at open: monotone means in range
                    raise CorruptionError(f"{sh.display}/{(self.field + '.offsets.npy')}: offsets decrease")
                yield chunk

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        parts = list(self.iter_chunks())
        arr = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return arr if dtype is None else arr.astype(dtype)

    def __iter__(self) -> Iterator[int]:
        for chunk in self.iter_chunks():
            yield from chunk.tolist()

    def save(self, path: str | os.PathLike[str], dtype: Any = None) -> Path:
        """Write the lengths to a ``.npy`` file (two chunked passes; O(chunk) memory) and return its path.

        ``dtype`` defaults to the smallest unsigned integer type that holds the longest record. The file
        is written under a temporary name and renamed, so a reader never sees a partial file. Map it with
        ``np.load(path, mmap_mode="r")`` or pass the path as ``lengths`` to :func:`seqstore.seq_order`.
        """
        target = Path(path)
        if dtype is None:
            longest = max((int(c.max()) for c in self.iter_chunks() if c.size), default=0)
            dtype = next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64) if longest <= np.iinfo(t).max)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.dtype(dtype), shape=(len(self),))
        pos = 0
        for chunk in self.iter_chunks():
            out[pos : pos + len(chunk)] = chunk
            pos += len(chunk)
        out.flush()
        del out
        os.replace(tmp, target)
        return target

    def __repr__(self) -> str:
        return f"Lengths({self._store.url}, field={self.field!r}, n={len(self)})"


class Store:
    """A read-only view of the shards a manifest lists. See :func:`open_store`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        bfloat16: str = "bits",
        readahead: str = "auto",
        max_mapped_shards: int | None = None,
        storage_options: dict[str, Any] | None = None,
        filesystem: Any = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | str | None = None,
    ) -> None:
        if bfloat16 not in _BF16_MODES:
            raise ValueError(f"bfloat16 must be one of {_BF16_MODES}, got {bfloat16!r}")
        if readahead not in _READAHEAD_MODES:
            raise ValueError(f"readahead must be one of {_READAHEAD_MODES}, got {readahead!r}")
        if max_mapped_shards is not None and (isinstance(max_mapped_shards, bool) or max_mapped_shards < 1):
            raise ValueError(f"max_mapped_shards must be a positive integer, got {max_mapped_shards!r}")
        self._remote: Any = None
        if is_remote(path) or filesystem is not None:
            from ..io.remote import RemoteRoot  # only remote stores load the object-store client

            self._remote = RemoteRoot(
                os.fspath(path), storage_options, filesystem=filesystem, cache_dir=cache_dir, cache_bytes=cache_bytes
            )
            self.root = self._remote.load()  # the local mirror of its manifest and shard table
        else:
            if isinstance(path, str) and path.startswith("file://"):
                path = path[len("file://") :]
            self.root = Path(path)
        self._bf16 = bfloat16
        self._readahead = readahead
        self._max_mapped_opt = max_mapped_shards
        # mapped shards, least recently used first; at most self._max_mapped of them (see _shard)
        self._shards: OrderedDict[int, _Shard] = OrderedDict()
        self._lru_lock = threading.Lock()
        self._load(_load_manifest(self.root))

    def _load(self, manifest: Manifest) -> None:
        old_table: Any = getattr(self, "_table", None)
        self._manifest = manifest
        self.schema: Schema = manifest.schema
        # the shards as numpy columns: the mapped shard table of a version-3 store (nothing is built per
        # shard, so open is O(1)); for version 1/2 a table built from the manifest's shard list
        self._table = manifest.shard_table()
        self._starts = self._table.starts  # (num_shards,) first record of each shard: a view, no total at the end
        self._start_index = self._table.start_index()  # the same as Python ints, for bisect
        self._n = self._table.total
        # a mapped shard stays only if the new manifest lists the same shard at its position (an overwrite
        # replaces the shards: same positions, other shards), with the same records
        for k in list(self._shards):
            if k >= len(self._table) or not self._same_shard(k, self._shards[k], old_table):
                del self._shards[k]
        self._last: tuple[int, Any] = (-1, None)  # (shard number, _Shard) of the last _shard call
        self._max_mapped = self._max_mapped_opt or _mapped_shard_limit(self.schema)
        self._runs: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None] = {}
        self._probes: list[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any], int]] | None = None
        self._bf16_fields = [n for n, f in self.schema.items() if f.dtype == BFLOAT16]
        self._id_last = manifest.id_lookup == "last"
        self._nest_paths: list[tuple[str, tuple[str, ...]]] | None = None

    # ------------------------------------------------------------------------------------ basics

    def _same_shard(self, k: int, sh: _Shard, old_table: Any) -> bool:
        """Whether shard position ``k`` of the manifest just loaded holds mapped shard ``sh`` (a version-3
        table row, which carries the CRC of the shard's descriptor, equal to the row it was mapped from)."""
        m = self._manifest
        if m.table is not None:
            if old_table is None or k >= len(old_table.data):
                return False
            return bool(old_table.data[k].tobytes() == self._table.data[k].tobytes())
        info = m.shards[k]
        return info.name == sh.info.name and info.records == sh.info.records and info.files == sh.info.files

    def __len__(self) -> int:
        return self._n

    @property
    def num_shards(self) -> int:
        return len(self._table)

    @property
    def metadata(self) -> dict[str, Any]:
        """User metadata given at :func:`~seqstore.create`."""
        return dict(self._manifest.metadata)

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    @property
    def has_ids(self) -> bool:
        return self._table.has_ids

    def refresh(self) -> Store:
        """Re-read the manifest to see shards committed since open. Mapped shards are kept."""
        if self._remote is not None:
            self.root = self._remote.load()
        self._load(_load_manifest(self.root))
        return self

    @property
    def is_remote(self) -> bool:
        """Whether the store is read from object storage (through the node cache)."""
        return self._remote is not None

    @property
    def url(self) -> str:
        """Where the store is: its URL for a remote store, else its path."""
        return self._remote.url if self._remote is not None else str(self.root)

    def __repr__(self) -> str:
        return f"seqstore.Store({self.url!r}, records={self._n}, shards={self.num_shards})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as (path, options, shard count, record count): a worker process reopens the store,
        maps its own files and sees the same records as this object, even if shards were committed
        since (shards are append-only; :meth:`refresh` in the worker moves on to the newest)."""
        options: dict[str, Any] = {"readahead": self._readahead, "max_mapped_shards": self._max_mapped_opt}
        if self._remote is not None:
            options.update(self._remote.options())
        return (_unpickle_store, (self.url, self._bf16, self.num_shards, self._n, options))

    def _pin(self, num_shards: int, records: int) -> None:
        """Restrict this view to the first ``num_shards`` shards (what a pickled Store saw)."""
        m = self._manifest
        if m.num_shards == num_shards:
            if self._n != records:
                raise SeqstoreError(f"{self.url}: the store was replaced since this Store was pickled")
            return
        table = self._table.prefix(num_shards) if m.num_shards > num_shards else None
        if table is None or table.total != records:
            raise SeqstoreError(
                f"{self.url}: the store was replaced since this Store was pickled (it had {records} records in "
                f"{num_shards} shards, it now has {m.num_records} in {m.num_shards})"
            )
        runs = [r for r in m.index_runs if r.end_shard <= num_shards]  # others fall back to shard indexes
        state = m.table
        if state is not None:  # version 3: the first rows of the shard table
            state = dataclasses.replace(state, rows=num_shards, records=records, crc32=table.crc32())
        self._load(dataclasses.replace(m, shards=m.shards[:num_shards], index_runs=runs, table=state))

    # -------------------------------------------------------------------------------- locating

    def _norm(self, i: int) -> int:
        n = self._n
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"record index {i} out of range for a store of {n} records ({self.url})")
        return j

    def _norm_many(self, indices: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            if idx.size == 0:
                return idx.astype(np.int64)
            raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
        given = idx
        idx = idx.astype(np.int64, copy=True)
        idx[idx < 0] += self._n
        if idx.size and (idx.min() < 0 or idx.max() >= self._n):
            bad = given[(idx < 0) | (idx >= self._n)][0]
            raise IndexError(f"record index {bad} out of range for a store of {self._n} records ({self.url})")
        return idx

    def _locate(self, i: int) -> tuple[int, int]:
        k = bisect.bisect_right(self._start_index, i) - 1
        return k, i - self._start_index[k]

    def _group(self, idx: np.ndarray[Any, Any]) -> Iterator[tuple[int, Any, np.ndarray[Any, Any]]]:
        """Yield (shard, positions in idx, local rows) for each shard touched by ``idx``."""
        if self.num_shards == 1:
            yield 0, slice(None), idx
            return
        shard = np.searchsorted(self._starts, idx, side="right") - 1
        order = np.argsort(shard, kind="stable")
        s_sorted = shard[order]
        cuts = np.flatnonzero(np.diff(s_sorted)) + 1
        for pos in np.split(order, cuts):
            if len(pos):
                k = int(shard[pos[0]])
                yield k, pos, idx[pos] - self._starts[k]

    def _shard(self, k: int) -> _Shard:
        """Shard ``k``, mapped on first touch. At most ``max_mapped_shards`` stay mapped: the least recently
        used is dropped (its pages stay in the page cache; arrays handed out keep their own mapping alive)."""
        last = self._last
        if last[0] == k:  # the same shard as the previous call (a single-shard store, a scan)
            hit: _Shard = last[1]
            return hit
        shards = self._shards
        sh = shards.get(k)
        if sh is not None and len(shards) * 2 < self._max_mapped:  # recency matters only once evictions near
            self._last = (k, sh)
            return sh
        with self._lru_lock:  # several threads may share a Store
            sh = shards.get(k)
            if sh is None:
                # its ShardInfo: version 3 reads and checks the table row and the shard's descriptor here
                if self._remote is not None:
                    sh = self._remote_shard(k)
                else:
                    sh = _Shard(self.root, self._manifest.shards[k], self.schema)
                shards[k] = sh
                while len(shards) > self._max_mapped:
                    shards.popitem(last=False)
            else:
                shards.move_to_end(k)
        self._last = (k, sh)
        return sh

    def _remote_shard(self, k: int) -> _Shard:
        """Shard ``k`` of a remote store: its descriptor and file heads fetched in one wave, its files
        mapped from the node cache. Errors name the object's URL."""
        remote = self._remote
        m = self._manifest
        try:
            self._prepare_remote([k])
            info = m.shards[k]
            return _Shard(self.root, info, self.schema, remote.map_npy, display=f"{remote.url}/{info.name}")
        except CorruptionError as exc:
            raise CorruptionError(remote.display(str(exc))) from exc.__cause__

    def _prepare_remote(self, ks: Iterable[int]) -> None:
        """Remote store: fetch what mapping shards ``ks`` needs (descriptors, file heads), one wave for all."""
        remote = self._remote
        m = self._manifest
        files = remote.shard_files(m)
        todo: list[tuple[str, list[str], int | None]] = []
        for k in ks:
            if m.table is not None:
                row = self._table.row(k)
                todo.append((row.name, files, row.desc_crc))
            else:
                todo.append((m.shards[k].name, files, None))
        try:
            remote.prepare_shards(todo)
        except CorruptionError as exc:
            raise CorruptionError(remote.display(str(exc))) from exc.__cause__

    def _need(self, *arrays: Any) -> None:
        """Remote store: wait until every byte of these views of mapped files is in the node cache."""
        if self._remote is not None:
            from ..io.remote import ensure_array

            for arr in arrays:
                ensure_array(arr)

    def _need_groups(self, groups: list[_Group], names: list[str], values: bool = True) -> None:
        """Remote store: wait until the records of ``groups`` (offsets, then with ``values`` the value
        rows of ragged fields) are in the node cache."""
        if self._remote is None:
            return
        from ..io.remote import ensure

        for stage in (False, True) if values else (False,):
            if stage and not any(self.schema[n].ragged for n in names):
                break
            starts, ends = self._ranges(groups, names, stage)
            if starts:
                ensure(np.concatenate(starts), np.concatenate(ends))

    @property
    def mapped_shards(self) -> int:
        """How many shards this Store holds mapped now (bounded by ``max_mapped_shards``)."""
        return len(self._shards)

    # ----------------------------------------------------------------------------------- records

    def _decode_bf16(self, rec: dict[str, Any]) -> dict[str, Any]:
        for name in self._bf16_fields:
            if name in rec:
                rec[name] = self.bfloat16_view(rec[name])
        return rec

    def bfloat16_view(self, bits: Any) -> Any:
        """Present stored bfloat16 bits per the store's ``bfloat16`` mode (bits/float32/ml_dtypes)."""
        if self._bf16 == "bits":
            return bits
        if self._bf16 == "float32":
            return bfloat16_to_float32(bits)
        import ml_dtypes  # type: ignore[import-not-found,unused-ignore]

        return bits.view(ml_dtypes.bfloat16)

    def __getitem__(self, i: int) -> dict[str, np.ndarray[Any, Any]]:
        """Record ``i`` as a dict of field name -> read-only zero-copy view. O(log shards)."""
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"store[i] takes an int; use get_batch() for many records, got {type(i).__name__}")
        k, row = self._locate(self._norm(int(i)))
        sh = self._shard(k)
        if self._remote is not None:
            self._need_groups([(sh, slice(None), np.array([row], np.int64))], list(self.schema))
        rec = sh.record(row)
        return self._decode_bf16(rec) if self._bf16_fields and self._bf16 != "bits" else rec

    def nested(self, i: int, *, copy: bool = False) -> dict[str, Any]:
        """Record ``i`` as a nested dict (``"a/b"`` -> ``{"a": {"b": ...}}``) of zero-copy views.

        ``copy=True``: owned, writable arrays instead (valid after the store is closed), made with one
        copy per packed group (the record's row) and one per other field.
        """
        if copy:
            if not isinstance(i, (int, np.integer)):
                raise TypeError(f"nested(i) takes an int, got {type(i).__name__}")
            k, row = self._locate(self._norm(int(i)))
            sh = self._shard(k)
            if self._remote is not None:
                self._need_groups([(sh, slice(None), np.array([row], np.int64))], list(self.schema))
            flat = sh.record_copy(row)
            if self._bf16_fields and self._bf16 != "bits":
                flat = self._decode_bf16(flat)
        else:
            flat = self[i]
        paths = self._nest_paths
        if paths is None:
            paths = self._nest_paths = [(name, tuple(name.split("/"))) for name in self.schema]
        out: dict[str, Any] = {}
        for name, parts in paths:
            if len(parts) == 1:
                out[name] = flat[name]
                continue
            node = out
            for p in parts[:-1]:
                child = node.get(p)
                if child is None:
                    child = node[p] = {}
                node = child
            node[parts[-1]] = flat[name]
        return out

    def __iter__(self) -> Iterator[dict[str, np.ndarray[Any, Any]]]:
        window = 4096
        ahead = self._readahead != "never"
        if ahead and self._n:
            self.prefetch(np.arange(0, min(window, self._n), dtype=np.int64))
        for lo in range(0, self._n, window):
            hi = min(lo + window, self._n)
            if ahead and hi < self._n:  # the next window, while this one is read
                self.prefetch(np.arange(hi, min(hi + window, self._n), dtype=np.int64))
            for i in range(lo, hi):
                yield self[i]

    def _scan_ahead(self, block: np.ndarray[Any, Any], most: int) -> None:
        """A scan is about to read all of ``block`` (a view of a mapping): start reading it (in requests of
        ``most`` bytes) if a sample of its pages is not in memory."""
        if block.size == 0 or self._readahead == "never":
            return
        first = address(block)
        last = first + block.itemsize + sum((n - 1) * st for n, st in zip(block.shape, block.strides) if st > 0)
        if self._remote is not None:
            from ..io.remote import fetch

            fetch(np.array([first], np.int64), np.array([last], np.int64))
            return
        if self._readahead == "always" or any_cold(np.linspace(first, last - 1, 16).astype(np.int64)):
            willneed_span(first, last, most=most)

    def get_batch(
        self, indices: Sequence[int] | np.ndarray[Any, Any], fields: Sequence[str] | None = None, pad: bool = False
    ) -> dict[str, Any]:
        """Gather many records at once (vectorised; one copy).

        Returns a dict: a fixed field -> array (B, *shape); a ragged field -> ``(values, lengths)``
        where ``values`` is the rows of all B records concatenated (sum(lengths), *inner) or, with
        ``pad=True``, zero-padded to (B, max(lengths), *inner); ``lengths`` is int64 (B,).

        Records not in memory are read with all their reads in flight at once (exactly their pages;
        for ragged fields the offsets first, then the values), not one page fault at a time; a batch
        found in memory is gathered straight from the mapping. :meth:`iter_batches` also starts the
        reads of the next batches while this one is consumed.
        """
        idx = self._norm_many(indices).reshape(-1)
        names = self._field_names(fields)
        groups = self._batch_groups(idx)
        if self._readahead != "never" or self._remote is not None:
            self._request_values(self._request(groups, names), names)
            self._need_groups(groups, names)
        return self._gather(idx, groups, names, pad)

    def _batch_groups(self, idx: np.ndarray[Any, Any]) -> list[_Group]:
        """:meth:`_group` with each shard looked up (mapped) once for the whole batch (a remote store
        prepares the shards it has not mapped yet all at once)."""
        parts = list(self._group(idx))
        if self._remote is not None:
            new = [k for k, _, _ in parts if k not in self._shards]
            if len(new) > 1:
                self._prepare_remote(new)
        return [(self._shard(k), pos, rows) for k, pos, rows in parts]

    def _field_names(self, fields: Sequence[str] | None) -> list[str]:
        names = list(self.schema) if fields is None else list(fields)
        for name in names:
            if name not in self.schema:
                raise KeyError(f"no field {name!r} in {self.url}; fields are {list(self.schema)}")
        return names

    def _ranges(self, groups: list[_Group], names: list[str], values: bool) -> tuple[list[Any], list[Any]]:
        """Byte ranges (absolute addresses) of ``groups``' records: with ``values`` False the fixed
        fields' records and the ragged fields' offset pairs, with ``values`` True the ragged fields'
        value rows (reading their offsets)."""
        starts: list[np.ndarray[Any, Any]] = []
        ends: list[np.ndarray[Any, Any]] = []
        for sh, _pos, rows in groups:
            for name in names:
                base, step, size = sh.span(name)
                if name in sh.offsets:
                    if values:
                        if base:
                            a, b = _checked_bounds(sh, name, rows)
                            starts.append(base + a * step)
                            ends.append(base + b * step)
                    else:
                        s = size + rows * 8  # offsets[row] and offsets[row + 1]
                        starts.append(s)
                        ends.append(s + 16)
                elif base and not values:
                    s = base + rows * step
                    starts.append(s)
                    ends.append(s + size)
        return starts, ends

    def _advise(self, groups: list[_Group], names: list[str], values: bool) -> None:
        """Request the pages of :meth:`_ranges` unless a sample finds them in memory: per field,
        ``_SAMPLE`` records (at least one) from at most as many groups, so a batch spread over many
        shards costs no more, and a field in memory cannot hide a cold one. A remote store starts
        fetching whatever of them is not in the node cache (the value rows once their offsets are)."""
        if self._remote is not None:
            from ..io.remote import fetch

            if values:
                self._need_groups(groups, names, values=False)
            starts, ends = self._ranges(groups, names, values)
            if starts:
                fetch(np.concatenate(starts), np.concatenate(ends))
            return
        if self._readahead == "auto":
            picked = groups[:: max(1, len(groups) // _SAMPLE)][:_SAMPLE]
            per = -(-_SAMPLE // max(1, len(picked)))
            sample = [(sh, pos, rows[:: max(1, len(rows) // per)][:per]) for sh, pos, rows in picked]
            probes = []
            for name in names:
                probe, _ = self._ranges(sample, [name], values)
                if probe:
                    addrs = np.concatenate(probe)
                    probes.append(addrs[:: max(1, len(addrs) // _SAMPLE)][:_SAMPLE])
            if not probes:
                return
            addrs = np.concatenate(probes)
            if not any_cold(addrs, sample=len(addrs)):
                return
        starts, ends = self._ranges(groups, names, values)
        if starts:
            willneed(np.concatenate(starts), np.concatenate(ends), most=groups[0][0].request)

    def _request(self, groups: list[_Group], names: list[str]) -> list[_Group]:
        """First read-ahead stage of a batch: start reading the records of its fixed fields and the
        offsets of its ragged fields. Returns ``groups``."""
        self._advise(groups, names, values=False)
        return groups

    def _request_values(self, groups: list[_Group], names: list[str]) -> None:
        """Second stage: start reading the value rows of the batch's ragged fields (reads their offsets,
        which the first stage asked for)."""
        if any(self.schema[n].ragged for n in names):
            self._advise(groups, names, values=True)

    def prefetch(self, indices: Sequence[int] | np.ndarray[Any, Any], fields: Sequence[str] | None = None) -> None:
        """Start reading records ``indices`` (all fields, or ``fields``) into memory and return without
        waiting for them (for ragged fields this waits for their offsets only). A later
        :meth:`get_batch` or ``store[i]`` of those records finds them arriving or arrived. A no-op for
        records in memory and with ``readahead="never"``."""
        if self._readahead == "never" and self._remote is None:
            return
        idx = self._norm_many(indices).reshape(-1)
        names = self._field_names(fields)
        self._request_values(self._request(self._batch_groups(idx), names), names)

    def iter_batches(
        self,
        batches: Iterable[Sequence[int] | np.ndarray[Any, Any]],
        *,
        fields: Sequence[str] | None = None,
        pad: bool = False,
        prefetch: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """``get_batch`` of each index array of ``batches`` (any iterable, consumed lazily: e.g.
        ``order.iter_chunks(1024)`` or :func:`seqstore.batch_indices`), with the reads of the next
        ``prefetch`` batches already in flight while a batch is consumed (default 2; 16 for a remote store).

        Yields the same dicts as :meth:`get_batch`. Memory: the index arrays of ``prefetch + 1``
        batches plus what the page cache holds of the requested records (reclaimable, shared).
        """
        names = self._field_names(fields)
        active = self._readahead != "never" or self._remote is not None
        if prefetch is None:  # object storage answers after tens of milliseconds: keep more batches in flight
            prefetch = 2 if self._remote is None else 16

        # tokens: [indices, groups, value rows requested]; a remote store requests the value rows of a
        # batch when the ``lag``-th batch after it enters the window (reading its offsets then seldom
        # waits: they have had that many batches' time to arrive), a local one just before the batch is
        # next (the page cache answers offsets in microseconds)
        lag = max(1, prefetch // 4)
        window: deque[list[Any]] = deque()

        def values(token: list[Any]) -> None:
            if active and not token[2]:
                token[2] = True
                self._request_values(token[1], names)

        def request(batch: Any) -> list[Any]:
            idx = self._norm_many(batch).reshape(-1)
            groups = self._batch_groups(idx)
            token = [idx, self._request(groups, names) if active else groups, False]
            if self._remote is not None:
                window.append(token)
                if len(window) > lag:
                    values(window.popleft())
            return token

        for _batch, (idx, groups, _) in lookahead(batches, prefetch, request, values):
            self._need_groups(groups, names)
            yield self._gather(idx, groups, names, pad)

    def _gather(
        self, idx: np.ndarray[Any, Any], groups: list[_Group], names: list[str], pad: bool
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in names:
            f = self.schema[name]
            if f.ragged:
                out[name] = self._gather_ragged(name, f, idx, groups, pad)
            else:
                out[name] = self._gather_fixed(name, f, idx, groups)
            if f.dtype == BFLOAT16 and self._bf16 != "bits":
                if f.ragged:
                    out[name] = (self.bfloat16_view(out[name][0]), out[name][1])
                else:
                    out[name] = self.bfloat16_view(out[name])
        return out

    def _gather_fixed(self, name: str, f: Field, idx: Any, groups: list[_Group]) -> np.ndarray[Any, Any]:
        if len(groups) == 1 and isinstance(groups[0][1], slice):  # one shard, in batch order: one copy
            out: np.ndarray[Any, Any] = groups[0][0].columns[name][groups[0][2]]
            return out
        res = np.empty((len(idx), *f.inner_shape), dtype=f.storage_dtype)
        # np.take copies whole rows: 3-4x faster than ``col[rows]``, which goes element by element
        if len(groups) == 1:  # one shard: its rows in batch order, taken straight into the result
            sh, pos, rows = groups[0]
            if not isinstance(pos, slice):  # rows[k] goes to position pos[k]: put them in position order
                shard_rows = rows
                rows = np.empty_like(shard_rows)
                rows[pos] = shard_rows
            np.take(sh.columns[name], rows, axis=0, out=res)
            return res
        for sh, pos, rows in groups:
            res[pos] = np.take(sh.columns[name], rows, axis=0)
        return res

    def _gather_ragged(self, name: str, f: Field, idx: Any, groups: list[_Group], pad: bool) -> tuple[Any, Any]:
        lengths = np.empty(len(idx), dtype=np.int64)
        for sh, pos, rows in groups:
            a, b = _checked_bounds(sh, name, rows)
            lengths[pos] = b - a
        stride = f.row_bytes
        if pad:
            t = int(lengths.max()) if len(lengths) else 0
            flat = np.zeros(len(idx) * t * stride, dtype=np.uint8)
            starts = np.arange(len(idx), dtype=np.int64) * (t * stride)
        else:
            ends = np.cumsum(lengths)
            flat = np.empty(int(ends[-1]) * stride if len(ends) else 0, dtype=np.uint8)
            starts = (ends - lengths) * stride
        for sh, pos, rows in groups:
            col = sh.columns[name]
            data = col.reshape(-1).view(np.uint8) if col.size else np.empty(0, np.uint8)
            off = sh.offsets[name]
            _gather_rows(data, off, np.ascontiguousarray(rows), flat, np.ascontiguousarray(starts[pos]), stride)
        values = flat.view(f.storage_dtype)
        if pad:
            values = values.reshape(len(idx), int(lengths.max()) if len(lengths) else 0, *f.inner_shape)
        else:
            values = values.reshape(int(lengths.sum()), *f.inner_shape)  # not -1: inner dims may be 0
        return values, lengths

    def lengths(self, field: str | None = None) -> Lengths:
        """Lazy lengths of a ragged field (the only ragged field when ``field`` is None)."""
        ragged = [n for n, f in self.schema.items() if f.ragged]
        if field is None:
            if len(ragged) != 1:
                raise ValueError(f"{self.url}: name the ragged field; ragged fields are {ragged}")
            field = ragged[0]
        if field not in ragged:
            raise ValueError(f"{self.url}: field {field!r} is not ragged; ragged fields are {ragged}")
        return Lengths(self, field)

    # ------------------------------------------------------------------------------------ matrix

    @property
    def groups(self) -> dict[str, PackedGroup]:
        """The store's packed groups by name (empty for a store without them)."""
        return self.schema.groups

    def _matrix_plan(self, fields: Sequence[str] | str | None) -> _MatrixPlan:
        """Resolve ``fields`` (names of fixed fields and/or packed groups; None = all fixed fields,
        groups first in column order) into copy segments of per-shard source matrices."""
        if isinstance(fields, str):
            fields = [fields]
        groups = self.schema.groups
        names: list[str] = []
        if fields is None:
            for g in groups.values():
                names.extend(g.fields)
            names.extend(n for n, f in self.schema.items() if not f.ragged and self.schema.group_of(n) is None)
        else:
            for item in fields:
                if item in groups:
                    names.extend(groups[item].fields)
                elif item in self.schema:
                    names.append(item)
                else:
                    raise KeyError(f"no field or packed group {item!r} in {self.url}; fields are {list(self.schema)}")
        if not names:
            raise ValueError(f"{self.url}: no fixed fields to put in a matrix")
        if len(set(names)) != len(names):
            raise ValueError(f"fields {names} name a field more than once")
        dtypes = {self.schema[n].dtype for n in names}
        if len(dtypes) != 1:
            raise ValueError(f"fields {names} have different dtypes {sorted(dtypes)}; a matrix has one dtype")
        segments: list[list[Any]] = []
        columns: dict[str, tuple[int, int]] = {}
        width = 0
        for name in names:
            f = self.schema[name]
            if f.ragged:
                raise ValueError(f"field {name!r} is ragged; matrix() takes fixed fields only")
            gname = self.schema.group_of(name)
            if gname is None:
                source, (a, b) = name, (0, int(np.prod(f.inner_shape, dtype=np.int64)))
            else:
                source, (a, b) = gname, groups[gname].columns[name]
            columns[name] = (width, width + b - a)
            if segments and segments[-1][0] == source and segments[-1][2] == a:
                segments[-1][2] = b
            else:
                segments.append([source, a, b, width])
            width += b - a
        f0 = self.schema[names[0]]
        return _MatrixPlan(
            tuple((str(sg[0]), int(sg[1]), int(sg[2]), int(sg[3])) for sg in segments),
            columns,
            width,
            f0.storage_dtype,
            f0.dtype == BFLOAT16,
        )

    def matrix_columns(self, fields: Sequence[str] | str | None = None) -> dict[str, tuple[int, int]]:
        """Column range ``[a, b)`` of each field in :meth:`matrix` (same ``fields``): for module-wise scores."""
        return dict(self._matrix_plan(fields).columns)

    def _source(self, sh: _Shard, source: str) -> np.ndarray[Any, Any]:
        if source in sh.groups:
            return sh.groups[source]
        col = sh.columns[source]
        return col.reshape(col.shape[0], -1)  # contiguous: a view

    def _block(self, sh: _Shard, plan: _MatrixPlan, rows: slice | np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Rows ``rows`` (a slice or local row numbers) of one shard: a view for one segment and a slice."""
        if self._remote is not None:
            for source, _a, _b, _ in plan.segments:
                self._need_rows(self._source(sh, source), rows)
        if len(plan.segments) == 1:
            source, a, b, _ = plan.segments[0]
            return self._source(sh, source)[rows, a:b]
        n = len(range(*rows.indices(sh.info.records))) if isinstance(rows, slice) else len(rows)
        out = np.empty((n, plan.width), dtype=plan.storage_dtype)
        for source, a, b, dst in plan.segments:
            out[:, dst : dst + b - a] = self._source(sh, source)[rows, a:b]
        return out

    def _need_rows(self, src: np.ndarray[Any, Any], rows: slice | np.ndarray[Any, Any]) -> None:
        """Remote store: wait for rows ``rows`` of the 2-d view ``src`` of a mapped file."""
        if isinstance(rows, slice):
            self._need(src[rows])
            return
        from ..io.remote import ensure

        r = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(r):
            starts = address(src) + r * int(src.strides[0])
            ensure(starts, starts + src.shape[1] * src.itemsize)

    def _present(self, arr: np.ndarray[Any, Any], plan: _MatrixPlan, dtype: Any) -> np.ndarray[Any, Any]:
        if plan.bfloat16:
            if dtype is not None and np.dtype(dtype).kind == "f":
                return np.asarray(bfloat16_to_float32(arr), dtype=dtype)
            arr = self.bfloat16_view(arr)
        if dtype is not None and arr.dtype != np.dtype(dtype):
            return arr.astype(dtype)
        return arr

    def matrix(
        self,
        fields: Sequence[str] | str | None = None,
        rows: slice | Sequence[int] | np.ndarray[Any, Any] | None = None,
        *,
        dtype: Any = None,
    ) -> np.ndarray[Any, Any]:
        """Records as one ``(R, D)`` matrix: row ``r`` is the chosen fields of a record, flattened and
        concatenated in order (:meth:`matrix_columns` gives each field's column range).

        ``fields``: fixed field names and/or packed group names (None: all fixed fields, packed
        groups first); all must share one dtype. ``rows``: None (all), a slice, or record numbers.
        ``dtype``: cast the result (bfloat16 bits are widened exactly when a float dtype is asked).

        Zero-copy (a read-only strided view of the mapped file) when the fields are consecutive
        columns of one packed group (or one unpacked field) and the rows are a slice inside one
        shard; otherwise one copy, shard by shard. Use :meth:`iter_matrix` to stream a large store.
        """
        plan = self._matrix_plan(fields)
        n = self._n
        if rows is None:
            rows = slice(0, n)
        if isinstance(rows, slice):
            start, stop, step = rows.indices(n)
            if step < 0:
                return self.matrix(fields, np.arange(start, stop, step, dtype=np.int64), dtype=dtype)
            count = len(range(start, stop, step))
            if count == 0:
                return self._present(np.empty((0, plan.width), dtype=plan.storage_dtype), plan, dtype)
            k0, r0 = self._locate(start)
            k1, _ = self._locate(start + (count - 1) * step)
            if k0 == k1:
                if step == 1:  # a view: ask for its first stretch only, the caller may not touch it all
                    self._scan_rows(plan, k0, r0, r0 + min(count, max(1, _VIEW_AHEAD // max(1, plan.width))))
                block = self._block(self._shard(k0), plan, slice(r0, r0 + (count - 1) * step + 1, step))
                return self._present(block, plan, dtype)
            out = np.empty((count, plan.width), dtype=plan.storage_dtype)
            for k in range(k0, k1 + 1):
                s_k, e_k = self._start_index[k], self._table.end(k)
                first = max(start, s_k)
                first += (-(first - start)) % step
                if first >= min(stop, e_k):
                    continue
                last = min(stop, e_k)
                pos = (first - start) // step
                block = self._block(self._shard(k), plan, slice(first - s_k, last - s_k, step))
                out[pos : pos + len(block)] = block
            return self._present(out, plan, dtype)
        idx = self._norm_many(rows).reshape(-1)
        out = np.empty((len(idx), plan.width), dtype=plan.storage_dtype)
        for k, pos, local in self._group(idx):
            out[pos] = self._block(self._shard(k), plan, np.asarray(local))
        return self._present(out, plan, dtype)

    def iter_matrix(
        self,
        fields: Sequence[str] | str | None = None,
        *,
        chunk_rows: int = 1 << 16,
        start: int = 0,
        stop: int | None = None,
    ) -> Iterator[tuple[int, np.ndarray[Any, Any]]]:
        """Stream records ``[start, stop)`` as ``(first_row, block)`` pairs, ``block`` an
        ``(r, D)`` matrix of at most ``chunk_rows`` rows that never spans two shards.

        Blocks are zero-copy views of the mapped files where :meth:`matrix` would be; bfloat16 is
        returned as stored bits (uint16) whatever the store's ``bfloat16`` mode. O(chunk) memory.
        """
        if chunk_rows <= 0:
            raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
        plan = self._matrix_plan(fields)
        stop = self._n if stop is None else min(stop, self._n)
        if start < 0 or start > stop:
            raise IndexError(f"row range [{start}, {stop}) is not inside 0..{self._n}")
        pos = start
        first = True
        while pos < stop:
            k, r = self._locate(pos)
            end = min(stop, self._table.end(k), pos + chunk_rows)
            if first:
                self._scan_rows(plan, k, r, r + end - pos)
                first = False
            if end < stop:  # the next block's reads run while the caller works on this one
                nk, nr = self._locate(end)
                self._scan_rows(plan, nk, nr, nr + min(stop, self._table.end(nk), end + chunk_rows) - end)
            yield pos, self._block(self._shard(k), plan, slice(r, r + end - pos))
            pos = end

    def _scan_rows(self, plan: _MatrixPlan, k: int, a: int, b: int) -> None:
        """Read ahead rows ``[a, b)`` of shard ``k`` in every source matrix of ``plan``."""
        if self._readahead == "never" or b <= a:
            return
        sh = self._shard(k)
        for source, _, _, _ in plan.segments:
            self._scan_ahead(self._source(sh, source)[a:b], sh.request)

    def iter_ragged(
        self,
        field: str | None = None,
        *,
        chunk_records: int = 1 << 16,
        start: int = 0,
        stop: int | None = None,
    ) -> Iterator[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        """Stream records ``[start, stop)`` of a ragged field as ``(first_record, values, lengths)``:
        ``values`` the rows of at most ``chunk_records`` consecutive records, a read-only zero-copy
        view of the mapped file (``(sum(lengths), *inner)``, never spanning two shards), ``lengths``
        int64. The ragged counterpart of :meth:`iter_matrix`: the next block is read ahead while the
        caller works on this one. bfloat16 comes as stored bits. O(chunk) memory.
        """
        name = self.lengths(field).field  # checks that the field exists and is ragged
        if chunk_records <= 0:
            raise ValueError(f"chunk_records must be positive, got {chunk_records}")
        stop = self._n if stop is None else min(stop, self._n)
        if start < 0 or start > stop:
            raise IndexError(f"record range [{start}, {stop}) is not inside 0..{self._n}")

        def block(pos: int) -> tuple[_Shard, int, int, int, int]:
            k, r = self._locate(pos)
            end = min(stop, self._table.end(k), pos + chunk_records)
            sh = self._shard(k)
            off = sh.offsets[name]
            self._need(off[r : r + end - pos + 1])
            a, b = int(off[r]), int(off[r + end - pos])
            if not 0 <= a <= b <= sh.columns[name].shape[0]:
                _checked_bounds(sh, name, np.arange(r, r + end - pos))  # raises, naming the file
            return sh, r, end, a, b

        pos = start
        cur = block(pos) if pos < stop else None
        if cur is not None:
            self._scan_ahead(cur[0].columns[name][cur[3] : cur[4]], cur[0].request)
        while cur is not None:
            sh, r, end, a, b = cur
            nxt = block(end) if end < stop else None
            if nxt is not None:  # the next block's reads run while the caller works on this one
                self._scan_ahead(nxt[0].columns[name][nxt[3] : nxt[4]], nxt[0].request)
            lengths = np.diff(sh.offsets[name][r : r + end - pos + 1])
            self._need(sh.columns[name][a:b])
            if lengths.size and lengths.min() < 0:
                raise CorruptionError(f"{sh.display}/{(name + '.offsets.npy')}: offsets decrease in records "
                                      f"{pos}..{end - 1}")
            yield pos, sh.columns[name][a:b], lengths
            pos, cur = end, nxt

    # --------------------------------------------------------------------------------------- ids

    def id(self, i: int) -> str:
        """The id of record ``i``."""
        if not self.has_ids:
            raise KeyError(f"{self.url}: records have no ids")
        k, row = self._locate(self._norm(int(i)))
        sh = self._shard(k)
        sh.load_ids()
        assert sh.ids is not None and sh.id_offsets is not None
        self._need(sh.id_offsets[row : row + 2])
        a, b = _id_bounds(sh, row)
        self._need(sh.ids[a:b])
        return bytes(sh.ids[a:b]).decode("utf-8", "surrogatepass")

    def ids(
        self, indices: Sequence[int] | np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, np.dtype[np.uint8]], np.ndarray[Any, np.dtype[np.int64]]]:
        """The utf-8 ids of records ``indices`` at once, as ``(data, offsets)``: the id of
        ``indices[j]`` is ``data[offsets[j]:offsets[j + 1]]`` (``offsets``: int64, ``len(indices) + 1``
        of them, from 0; e.g. the buffers of an Arrow string column). No Python object per record: the
        bytes are gathered shard by shard, and the ids of consecutive records of one shard are a
        read-only view of the mapped file. Negative indices count from the end. KeyError when the
        records have no ids."""
        if not self.has_ids:
            raise KeyError(f"{self.url}: records have no ids")
        idx = self._norm_many(indices).reshape(-1)
        n = len(idx)
        offsets = np.zeros(n + 1, dtype=np.int64)
        if n == 0:
            return np.empty(0, dtype=np.uint8), offsets
        counts = np.empty(n, dtype=np.int64)
        groups = []
        for k, pos, local in self._group(idx):
            sh = self._shard(k)
            a, b = self._id_ranges(sh, local)
            counts[pos] = b - a
            groups.append((sh, pos, local, int(a[0])))
        np.cumsum(counts, out=offsets[1:])
        total = int(offsets[-1])
        if len(groups) == 1:  # one shard: records in a row are one slice of its ids
            sh, _, local, first = groups[0]
            if int(local[-1]) - int(local[0]) == n - 1 and (n == 1 or bool((np.diff(local) == 1).all())):
                assert sh.ids is not None
                return sh.ids[first : first + total], offsets
        data = np.empty(total, dtype=np.uint8)
        for sh, pos, local, _ in groups:
            _gather_rows(sh.ids, sh.id_offsets, np.ascontiguousarray(local), data,
                         np.ascontiguousarray(offsets[:-1][pos]), 1)
        return data, offsets

    def _probe_targets(self) -> Iterator[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any], int]]:
        """Yield (first shard, sorted hashes, rows, row base) for every index to probe, in shard order.

        Rows of a merged run are global (base 0); rows of a shard index are local (base = shard start).
        A merged run whose files were superseded after this manifest was read falls back to its shards.
        """
        shard = 0
        runs: list[IndexRun] = list(self._manifest.index_runs)
        while shard < self.num_shards:
            run = next((r for r in runs if r.first_shard == shard), None)
            arrays = self._run_arrays(run) if run is not None else None
            if run is not None and arrays is not None:
                yield shard, arrays[0], arrays[1], 0
                shard = run.end_shard
                continue
            sh = self._shard(shard)
            sh.load_ids()
            assert sh.id_hash is not None and sh.id_rows is not None
            yield shard, sh.id_hash, sh.id_rows, self._start_index[shard]
            shard += 1

    def _probe_list(self) -> list[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any], int]]:
        """:meth:`_probe_targets` as a list, built once per manifest (``refresh`` rebuilds it)."""
        if self._probes is None:
            self._probes = list(self._probe_targets())
        return self._probes

    def _run_arrays(self, run: IndexRun) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
        if run.name not in self._runs:
            try:
                mapper = map_npy if self._remote is None else self._remote.map_npy
                h = mapper(self.root / f"{run.name}.hash.npy", None, np.dtype("<u8"), (run.records,))
                r = mapper(self.root / f"{run.name}.rows.npy", None, np.dtype("<i8"), (run.records,))
                self._runs[run.name] = (h, r)
            except CorruptionError:
                self._runs[run.name] = None
        return self._runs[run.name]

    def _verify(self, rows: np.ndarray[Any, Any], qdata: Any, qoff: Any, qidx: Any) -> np.ndarray[Any, Any]:
        """Compare the stored ids of global ``rows`` with query ids ``qidx`` byte by byte."""
        ok = np.zeros(len(rows), dtype=np.bool_)
        for k, pos, local in self._group(rows):
            sh = self._shard(k)
            self._id_ranges(sh, local)
            res = np.empty(len(local), dtype=np.bool_)
            assert sh.ids is not None and sh.id_offsets is not None
            local = np.ascontiguousarray(local)
            id_equal(sh.ids, sh.id_offsets, local, qdata, qoff, np.ascontiguousarray(qidx[pos]), res)
            ok[pos] = res
        return ok

    def _searchsorted(self, arr: np.ndarray[Any, Any], q: np.ndarray[Any, Any], side: str) -> np.ndarray[Any, Any]:
        """``np.searchsorted``; on a remote store reading only the pages the search needs."""
        if self._remote is None or len(arr) == 0:
            return np.searchsorted(arr, q, side=side)  # type: ignore[call-overload,no-any-return]
        from ..io.remote import paged_searchsorted

        return paged_searchsorted(arr, q, side)

    def _id_ranges(self, sh: _Shard, local: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Byte ranges ``(a, b)`` of the ids of local rows ``local`` of ``sh`` in ``sh.ids`` (mapped, and on a
        remote store fetched), checked to lie in range."""
        sh.load_ids()
        assert sh.ids is not None and sh.id_offsets is not None
        if self._remote is not None:
            self._need_ids(sh, local)
        a = np.asarray(sh.id_offsets[local])
        b = np.asarray(sh.id_offsets[local + 1])
        if ((a < 0) | (b < a) | (b > len(sh.ids))).any():
            raise CorruptionError(f"{sh.display}/{IDS}.offsets.npy: id offsets out of range")
        return a, b

    def _need_ids(self, sh: _Shard, local: np.ndarray[Any, Any]) -> None:
        """Remote store: wait for the ids (offsets, then bytes) of local rows ``local`` of ``sh``."""
        from ..io.remote import ensure

        assert sh.ids is not None and sh.id_offsets is not None
        base = address(sh.id_offsets)
        ensure(base + local * 8, base + local * 8 + 16)
        a = np.asarray(sh.id_offsets[local])
        b = np.asarray(sh.id_offsets[local + 1])
        ok = (a >= 0) & (b >= a) & (b <= len(sh.ids))
        if ok.any() and len(sh.ids):
            ensure(address(sh.ids) + a[ok], address(sh.ids) + b[ok])

    def index(self, id: str) -> int:  # noqa: A002
        """Global index of the record with id ``id``.

        When an id was written more than once this is the first such record, or the last one in a
        store created with ``id_lookup="last"`` (e.g. a log written with ``on_duplicate="keep_last"``).
        """
        if not isinstance(id, str):
            raise TypeError(f"ids are str, got {type(id).__name__}")
        if not self.has_ids:
            raise KeyError(f"id {id!r} not in {self.url} (records have no ids)")
        key = id.encode("utf-8", "surrogatepass")
        h = np.uint64(hash_one(key))
        found = -1
        for _first, hashes, rows, base in self._probe_list():
            j = int(self._searchsorted(hashes, np.array([h]), "left")[0])
            if self._remote is not None:  # the run of equal hashes (almost always 0 or 1 entries)
                k = int(self._searchsorted(hashes, np.array([h]), "right")[0])
                self._need(hashes[j : k + 1], rows[j : k + 1])
            while j < len(hashes) and hashes[j] == h:
                row = int(rows[j]) + base
                if not 0 <= row < self._n:
                    raise CorruptionError(f"{self.url}: id index (from shard {_first}) names row {row}, out of range")
                k, local = self._locate(row)
                sh = self._shard(k)
                sh.load_ids()
                assert sh.ids is not None and sh.id_offsets is not None
                if self._remote is not None:
                    self._need_ids(sh, np.array([local], np.int64))
                a, b = _id_bounds(sh, local)
                if bytes(sh.ids[a:b]) == key:
                    if not self._id_last:
                        return row
                    found = max(found, row)
                j += 1
        if found >= 0:
            return found
        raise KeyError(f"id {id!r} not in {self.url}")

    def index_many(self, ids: Sequence[str], *, missing: str | int = "error") -> np.ndarray[Any, np.dtype[np.int64]]:
        """Global indexes of many ids at once (vectorised hash search, then byte comparison).

        ``missing="error"`` raises KeyError naming the first missing ids; an int fills them instead.
        Repeated ids resolve as in :meth:`index` (first record, or last with ``id_lookup="last"``).
        """
        if not self.has_ids:
            if len(self) == 0:
                qn = len(ids)
                if missing == "error" and qn:
                    raise KeyError(f"id {ids[0]!r} not in {self.url} (store is empty)")
                return np.full(qn, missing if isinstance(missing, int) else -1, dtype=np.int64)
            raise KeyError(f"{self.url}: records have no ids")
        qdata, qoff = encode_ids(ids)
        result = self.index_encoded(qdata, qoff)
        todo = np.flatnonzero(result < 0)
        if len(todo):
            if missing == "error":
                names = ", ".join(repr(ids[int(t)]) for t in todo[:10])
                raise KeyError(f"{len(todo)} id(s) not in {self.url}: {names}")
            result[todo] = int(missing)
        return result

    def index_encoded(self, qdata: np.ndarray[Any, Any], qoff: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Global indexes of ids given as utf-8 bytes ``qdata[qoff[i]:qoff[i+1]]`` (int64 offsets from 0),
        -1 where absent; what :meth:`index_many` and joins between stores use. Vectorised per probed
        index; memory O(queries + candidates)."""
        if not self.has_ids:
            return np.full(len(qoff) - 1, -1, dtype=np.int64)
        q = hash_ids(qdata, qoff)
        result = np.full(len(q), -1, dtype=np.int64)
        todo = np.arange(len(q), dtype=np.int64)
        for _first, hashes, rows, base in self._probe_targets():
            if len(todo) == 0:
                break
            sh = self._shards.get(_first)
            if not self._id_last and sh is not None and rows is sh.id_rows and self._remote is None:
                # a shard's own index (first-id lookup): one numba pass over the hash-sorted queries
                assert sh.ids is not None and sh.id_offsets is not None
                qorder = todo[np.argsort(q[todo], kind="stable")]
                fine = probe_sorted(q, qorder, hashes, rows, sh.ids, sh.id_offsets, qdata, qoff, np.int64(base), result)
                if not fine:
                    raise CorruptionError(f"{sh.display}/{(IDS + '.hash_rows.npy')}: names rows outside the shard")
                todo = todo[result[todo] < 0]
                continue
            qh = q[todo]
            lo = self._searchsorted(hashes, qh, "left")
            hi = self._searchsorted(hashes, qh, "right")
            counts = hi - lo
            hit = counts > 0
            if not hit.any():
                continue
            cq = np.repeat(todo[hit], counts[hit])
            run_starts = np.repeat(lo[hit], counts[hit])
            within = np.arange(len(cq)) - np.repeat(np.cumsum(counts[hit]) - counts[hit], counts[hit])
            if self._remote is not None:
                self._need_rows(rows.reshape(-1, 1), run_starts + within)
            cand_rows = np.asarray(rows[run_starts + within]) + base
            if (cand_rows < 0).any() or (cand_rows >= self._n).any():
                raise CorruptionError(f"{self.url}: id index (from shard {_first}) names rows out of range")
            ok = self._verify(cand_rows, qdata, qoff, cq)
            if not ok.any():
                continue
            found_q, found_r = cq[ok], cand_rows[ok]
            if self._id_last:  # every index may hold a later copy: keep probing all of them
                np.maximum.at(result, found_q, found_r)
                continue
            best = np.full(len(q), np.iinfo(np.int64).max, dtype=np.int64)
            np.minimum.at(best, found_q, found_r)
            newly = np.unique(found_q)
            result[newly] = best[newly]
            todo = todo[result[todo] < 0]
        return result


def _unpickle_store(
    path: str,
    bfloat16: str,
    num_shards: int | None = None,
    records: int | None = None,
    options: dict[str, Any] | None = None,
) -> Store:
    store = Store(path, bfloat16=bfloat16, **(options or {}))
    if num_shards is not None and records is not None:
        store._pin(num_shards, records)
    return store


def open_store(
    path: str | os.PathLike[str],
    bfloat16: str = "bits",
    *,
    readahead: str = "auto",
    max_mapped_shards: int | None = None,
    storage_options: dict[str, Any] | None = None,
    filesystem: Any = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_bytes: int | str | None = None,
) -> Store:
    """Open the store at ``path`` (a local path, or a URL: ``s3://``, ``gs://``, ``az://``/``abfs://``,
    ``https://``, ``file://``, or any fsspec URL) for reading. Reads the manifest only (and maps the
    shard table of a version-3 store): O(1) in the number of shards (O(fields x shards) for version 1/2).

    ``bfloat16``: how bfloat16 fields are returned: ``"bits"`` (uint16 views, default, zero-copy),
    ``"float32"`` (converted copies) or ``"ml_dtypes"`` (zero-copy ``ml_dtypes.bfloat16`` views).

    ``readahead``: how batch reads and scans meet data that is not in memory. ``"auto"`` (default): a
    batch samples whether its pages are in memory (``mincore``) and, if not, asks the kernel for exactly
    its pages, all at once, before gathering; scans ask for the next stretch ahead. ``"always"``: ask
    without sampling. ``"never"``: plain page faults (each reads one page, one at a time). Mappings are
    always advised random access, so a fault never reads around the page it needs.

    ``max_mapped_shards``: how many shards stay mapped at once (least recently used are dropped;
    default from ``vm.max_map_count``, or from the open-files limit where a mapping holds a descriptor).
    A mapping holds no file descriptor on Linux, so the open-files limit does not bound the shard count.

    Remote stores (docs/remote.md): ``storage_options`` configures the client (obstore's keys for S3,
    GCS and Azure, e.g. ``endpoint``, ``region``, ``access_key_id``; credentials otherwise come from the
    environment the way the cloud SDKs find them) and seqstore's requests (``max_requests``,
    ``coalesce_gap``, ``timeout``, ``max_retries``); ``filesystem``: an fsspec filesystem to read
    through instead; ``cache_dir`` / ``cache_bytes``: the node-local cache every process on the node
    shares (default ``$SEQSTORE_CACHE_DIR`` or ``~/.cache/seqstore``, and ``$SEQSTORE_CACHE_BYTES`` or
    16 GiB).
    """
    return Store(
        path, bfloat16=bfloat16, readahead=readahead, max_mapped_shards=max_mapped_shards,
        storage_options=storage_options, filesystem=filesystem, cache_dir=cache_dir, cache_bytes=cache_bytes,
    )
