"""Where a record is and the shards' mapped files: the base of every part of the Store.

Global index -> (shard, row) is a binary search over the shards' first records (the mapped shard
table of a version-3 store: nothing per shard in memory). A shard's files are mapped the first time
one of its records is touched (:class:`Shard`), through the store's byte source, after cheap checks
against the manifest; at most ``max_mapped_shards`` stay mapped (least recently used dropped).
Packed groups are mapped as one ``(n, width)`` matrix per shard; each packed field is a zero-copy
strided view of its column range.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CorruptionError
from ...format.manifest import IDS, Manifest, ShardInfo
from ...format.shard_table import ShardTable
from ...io import address, holds_descriptors
from ...io.source import ByteSource
from ...schema import Schema

__all__ = ["Shard", "Group", "ShardRegistry", "checked_bounds", "mapped_shard_limit"]

#: (mapped shard, positions in the batch, local rows): one shard's part of a batch (ShardRegistry._batch_groups).
#: Holding the shard keeps its files mapped for the whole call, whatever the LRU of mapped shards does.
Group = tuple["Shard", Any, np.ndarray[Any, Any]]


def mapped_shard_limit(schema: Schema) -> int:
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


class Shard:
    """The mapped files of one committed shard, mapped through ``source``. Built on first touch."""

    __slots__ = (
        "path", "display", "map_npy", "info", "columns", "offsets", "groups", "ids", "id_offsets", "id_hash",
        "id_rows", "_plan", "_copy_plan", "_spans", "request",
    )

    def __init__(
        self, source: ByteSource, root: Path, info: ShardInfo, schema: Schema, display: str | None = None
    ) -> None:
        self.path = root / info.name
        self.display = str(self.path) if display is None else display  # the shard's place in messages
        self.map_npy = source.map_npy
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
        self.request = source.request_bytes(self.path)  # bytes per read-ahead request on this shard's device

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


def checked_bounds(
    sh: Shard, name: str, rows: np.ndarray[Any, Any]
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


class ShardRegistry:
    """Locating records and mapping shards (the state every part of the Store shares is declared here;
    ``Store.__init__`` and ``Store._load`` set it)."""

    _source: ByteSource
    root: Path
    schema: Schema
    _manifest: Manifest
    _table: ShardTable
    _starts: np.ndarray[Any, Any]
    _start_index: Sequence[int]
    _n: int
    _shards: OrderedDict[int, Shard]
    _lru_lock: threading.Lock
    _last: tuple[int, Any]
    _max_mapped: int
    _max_mapped_opt: int | None
    _readahead: str
    _bf16: str
    # the source's ReadPolicy for this readahead mode, as plain attributes (read on every batch)
    _ahead: bool
    _probe: bool
    _lazy: bool
    _setup: bool
    _depth: int
    _deepest: int
    _together: int
    _staged: bool
    _stream: bool

    def __len__(self) -> int:
        return self._n

    @property
    def num_shards(self) -> int:
        return len(self._table)

    @property
    def url(self) -> str:
        """Where the store is: its URL for a remote store, else its path."""
        return self._source.url

    @property
    def mapped_shards(self) -> int:
        """How many shards this Store holds mapped now (bounded by ``max_mapped_shards``)."""
        return len(self._shards)

    def _same_shard(self, k: int, sh: Shard, old_table: Any) -> bool:
        """Whether shard position ``k`` of the manifest just loaded holds mapped shard ``sh`` (a version-3
        table row, which carries the CRC of the shard's descriptor, equal to the row it was mapped from)."""
        m = self._manifest
        if m.table is not None:
            if old_table is None or k >= len(old_table.data):
                return False
            return bool(old_table.data[k].tobytes() == self._table.data[k].tobytes())
        info = m.shards[k]
        return info.name == sh.info.name and info.records == sh.info.records and info.files == sh.info.files

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
        k = bisect_right(self._start_index, i) - 1
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

    # --------------------------------------------------------------------------------- mapping

    def _shard(self, k: int) -> Shard:
        """Shard ``k``, mapped on first touch. At most ``max_mapped_shards`` stay mapped: the least recently
        used is dropped (its pages stay in the page cache; arrays handed out keep their own mapping alive)."""
        last = self._last
        if last[0] == k:  # the same shard as the previous call (a single-shard store, a scan)
            hit: Shard = last[1]
            return hit
        shards = self._shards
        sh = shards.get(k)
        if sh is not None and len(shards) * 2 < self._max_mapped:  # recency matters only once evictions near
            self._last = (k, sh)
            return sh
        with self._lru_lock:  # several threads may share a Store
            sh = shards.get(k)
            if sh is None:
                sh = self._map_shard(k)
                shards[k] = sh
                while len(shards) > self._max_mapped:
                    shards.popitem(last=False)
            else:
                shards.move_to_end(k)
        self._last = (k, sh)
        return sh

    def _map_shard(self, k: int) -> Shard:
        """Map shard ``k`` (its ShardInfo: version 3 reads and checks the table row and the shard's
        descriptor here). Errors name the files as the source names them (a remote store: URLs)."""
        source = self._source
        try:
            source.prepare_shards(self._manifest, self._table, (k,))
            info = self._manifest.shards[k]
            return Shard(source, self.root, info, self.schema, display=source.shard_display(info.name))
        except CorruptionError as exc:
            text = source.display(str(exc))
            if text == str(exc):
                raise
            raise CorruptionError(text) from exc.__cause__

    def _batch_groups(self, idx: np.ndarray[Any, Any]) -> list[Group]:
        """:meth:`_group` with each shard looked up (mapped) once for the whole batch (a source whose
        shards cost requests to set up prepares the shards not mapped yet all at once)."""
        parts = list(self._group(idx))
        if self._setup:
            new = [k for k, _, _ in parts if k not in self._shards]
            if len(new) > 1:
                self._source.prepare_shards(self._manifest, self._table, new)
        return [(self._shard(k), pos, rows) for k, pos, rows in parts]

