"""Where a record is and the shards' mapped files: the :class:`ShardMap` part of the Store.

Global index -> (shard, row) is a binary search over the shards' first records (the mapped shard
table of a version-3 store: nothing per shard in memory). A shard's files are mapped the first time
one of its records is touched (:class:`Shard`), through the store's byte source, after cheap checks
against the manifest; at most ``max_mapped_shards`` stay mapped (least recently used dropped).
Packed groups are mapped as one ``(n, width)`` matrix per shard; each packed field is a zero-copy
strided view of its column range.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from ...errors import CorruptionError
from ...format.manifest import IDS, MANIFEST, Manifest, ShardInfo
from ...format.shard_table import ShardTable
from ...io import PAGE, address, holds_descriptors, page_runs
from ...io.source import ByteSource
from ...schema import Schema

__all__ = [
    "Shard", "Group", "ShardMap", "checked_bounds", "file_spans", "is_index", "manifest_identity",
    "mapped_shard_limit", "unfetched_pages",
]


def is_index(i: Any) -> bool:
    """Whether ``i`` is a record number: an int or NumPy integer, never a bool (``True`` is not record 1,
    as for NumPy arrays, whose integer indexes refuse bools; ``get_batch([True])`` is a TypeError too)."""
    return isinstance(i, (int, np.integer)) and not isinstance(i, bool)


def manifest_identity(source: ByteSource) -> tuple[int, int, int, int] | None:
    """Which ``manifest.json`` a local store has now: (device, inode, size, mtime), or None (a remote or
    in-memory source, or none there). Every commit renames a new manifest into place, so a commit, or a
    store replaced by another, changes it."""
    if source.is_remote:
        return None
    try:
        st = os.stat(source.root / MANIFEST)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


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
        "id_rows", "_plan", "_copy_plan", "_spans", "request", "refetch", "_fetched", "_refetching", "_refetched",
        "before_ids",
    )

    def __init__(self, source: ByteSource, info: ShardInfo, schema: Schema, display: str) -> None:
        self.path = source.root / info.name
        self.display = display  # the shard's place in messages (a remote store's: its URL)
        self.map_npy = source.map_npy
        self.refetch = source.refetch
        # the pages of each file whose node-cache copy was fetched again (None: the whole file), once at most
        self._fetched: dict[str, np.ndarray[Any, Any] | None] = {}
        self._refetching = threading.Lock()  # (held through a fetch again: another thread waits for its pages)
        self._refetched = False  # whether a fetch again brought anything (a remote store's copy)
        #: called before the id files are mapped (maybe long after the others): raises if the shard was replaced
        self.before_ids: Callable[[], None] | None = None
        self.info = info
        self.columns: dict[str, np.ndarray[Any, Any]] = {}
        self.offsets: dict[str, np.ndarray[Any, Any]] = {}
        self.groups: dict[str, np.ndarray[Any, Any]] = {}
        n = info.records
        for gname, g in schema.groups.items():
            mat = self.groups[gname] = self._file(f"{gname}.npy", g.storage_dtype, (n, g.width))
            for name in g.fields:
                a, b = g.columns[name]
                self.columns[name] = mat[:, a:b].reshape(n, *schema[name].inner_shape)  # a view
        for name, f in schema.items():
            if name in self.columns:
                continue
            shape: tuple[int, ...] = (n, *f.inner_shape)
            if f.ragged:
                off = self.offsets[name] = self._file(f"{name}.offsets.npy", "<i8", (n + 1,))
                shape = (info.rows[name], *f.inner_shape)
                bad = off[0] != 0 or off[-1] != shape[0]
                if bad and self.fetch_again(f"{name}.offsets.npy", off, [0, n]):  # (a remote store's node-cache
                    bad = off[0] != 0 or off[-1] != shape[0]  # copy: maybe alone damaged; fetched anew, mapped)
                if bad:
                    raise CorruptionError(f"{self.display}/{name}.offsets.npy: offsets run from {off[0]} to "
                                          f"{off[-1]}, expected 0 to {shape[0]}")
            self.columns[name] = self._file(f"{name}.npy", f.storage_dtype, shape)
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
            col, off = self.columns[name], self.offsets.get(name)
            base = address(col) if col.size else 0
            row = col.itemsize * int(np.prod(col.shape[1:], dtype=np.int64))
            step = row if off is not None or not col.ndim else int(col.strides[0])
            got = self._spans[name] = (base, step, row if off is None else address(off))
        return got

    def record(self, row: int) -> dict[str, np.ndarray[Any, Any]]:
        out = {}
        for name, col, off in self._plan:
            if off is None:
                out[name] = col[row, ...]  # a view even for scalar fields (col[row] would copy)
            else:
                a = int(off[row])
                b = int(off[row + 1])
                if not 0 <= a <= b <= col.shape[0] and self.fetch_again(f"{name}.offsets.npy", off, [row]):
                    a, b = int(off[row]), int(off[row + 1])  # (a remote store's copy, fetched anew)
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

    def _file(self, rel: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        return self.map_npy(self.path / rel, self.info.files.get(rel), np.dtype(dtype), shape)

    def fetch_again(self, rel: str, arr: np.ndarray[Any, Any] | None = None, rows: Any = None) -> bool:
        """Fetch the node's copy of this shard's file ``rel`` again, the first time this shard finds it
        damaged (False: not again, or a local store's own file). ``arr``: the file's mapped offsets, and
        ``rows``: the records whose offsets (entries ``r`` and ``r + 1``) were found damaged: only their
        pages are fetched again (once each), not the whole file. Threads finding the same damage at once:
        one fetches the pages, the others wait for it, then look again (True: fetched again meanwhile)."""
        key = f"{self.info.name}/{rel}"
        spans = None if arr is None or rows is None else file_spans(self.info, rel, arr, rows, np.add(rows, 2))
        with self._refetching:
            fresh = unfetched_pages(self._fetched, rel, spans)
            if fresh is None:  # (fetched again already, maybe by another thread just now: worth a look again)
                return self._refetched
            self._refetched = self.refetch([key], None if spans is None else {key: fresh})
            return self._refetched

    def spans(self, stem: str, rows: Any) -> dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        """Where the bytes of local ``rows`` lie in this shard's files of ``stem`` (a packed group, a field
        not packed, or ``IDS``): ``{file: (starts, ends)}``, byte ranges in the file (the values; for a
        ragged field or the ids also the rows' offsets entries). Offsets found damaged give ranges clipped
        to the values' file."""
        r = np.asarray(rows, np.int64).reshape(-1)
        if stem == IDS:
            vals, off = self.ids, self.id_offsets
        else:
            vals, off = self.groups.get(stem, self.columns.get(stem)), self.offsets.get(stem)
        out = {}
        a, b = r, r + 1
        if off is not None:
            out[f"{stem}.offsets.npy"] = file_spans(self.info, f"{stem}.offsets.npy", off, r, r + 2)
            a, b = np.asarray(off[r], np.int64), np.asarray(off[r + 1], np.int64)
        out[f"{stem}.npy"] = file_spans(self.info, f"{stem}.npy", vals, a, b)
        return {rel: got for rel, got in out.items() if got is not None}

    def load_ids(self) -> None:
        if self.ids is not None:
            return
        if self.before_ids is not None:
            self.before_ids()
        n = self.info.records
        off = self._file(f"{IDS}.offsets.npy", "<i8", (n + 1,))
        fi = self.info.files.get(f"{IDS}.npy")  # the last offset sizes _ids.npy's mapping: within its bytes
        most = fi.bytes if fi is not None else np.iinfo(np.int64).max

        def bad() -> bool:
            return bool(off[0] != 0 or not 0 <= off[-1] <= most)

        if bad() and not (self.fetch_again(f"{IDS}.offsets.npy", off, [0, n]) and not bad()):  # (as a field's)
            raise CorruptionError(f"{self.display}/{IDS}.offsets.npy: offsets run from {off[0]} to {off[-1]}, "
                                  f"expected 0 to at most the {most} bytes of {IDS}.npy")
        try:  # (the last offset is the length of the ids: a node-cache copy damaged within range is found here)
            ids = self._file(f"{IDS}.npy", "u1", (int(off[-1]),))
        except CorruptionError as exc:
            if not self.fetch_again(f"{IDS}.offsets.npy", off, [n - 1]):
                raise CorruptionError(f"{exc} (or {IDS}.offsets.npy is damaged: its last offset is {int(off[-1])})"
                                      ) from exc
            ids = self._file(f"{IDS}.npy", "u1", (int(off[-1]),))
        self.ids = ids
        self.id_hash = self._file(f"{IDS}.hash.npy", "<u8", (n,))
        self.id_rows = self._file(f"{IDS}.hash_rows.npy", "<i8", (n,))
        self.id_offsets = off


def checked_bounds(sh: Shard, name: str, rows: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    """(start, end) offsets of local ``rows`` of ragged field ``name``, checked to lie in range."""
    off = sh.offsets[name]
    a, b = np.asarray(off[rows]), np.asarray(off[rows + 1])
    bad = (a < 0) | (b < a) | (b > sh.columns[name].shape[0])
    if bad.any() and sh.fetch_again(f"{name}.offsets.npy", off, np.asarray(rows)[bad]):  # (a remote store's
        a, b = np.asarray(off[rows]), np.asarray(off[rows + 1])  # node-cache copy: maybe alone damaged; anew)
        bad = (a < 0) | (b < a) | (b > sh.columns[name].shape[0])
    if bad.any():
        r = int(np.asarray(rows).reshape(-1)[np.flatnonzero(np.asarray(bad).reshape(-1))[0]])
        raise CorruptionError(
            f"{sh.display}/{(name + '.offsets.npy')}: record {r} has offsets {int(off[r])}..{int(off[r + 1])}, "
            f"outside 0..{sh.columns[name].shape[0]} or decreasing"
        )
    return a, b


def file_spans(info: ShardInfo, rel: str, arr: np.ndarray[Any, Any] | None, a: Any, b: Any
               ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
    """Byte ranges ``(starts, ends)`` in shard file ``rel`` (``arr``: its whole mapped array) of the rows
    ``[a[i], b[i])`` of ``arr`` (clipped to its rows; ends before starts taken the other way round), or
    None where they are not known (no such array or file). A ``.npy`` file's data ends the file."""
    fi = info.files.get(rel)
    if arr is None or fi is None or not arr.ndim:
        return None
    n = arr.shape[0]
    step = arr.nbytes // n if n else 0
    head = fi.bytes - arr.nbytes
    a = np.clip(np.asarray(a, np.int64).reshape(-1), 0, n)
    b = np.clip(np.asarray(b, np.int64).reshape(-1), 0, n)
    return head + np.minimum(a, b) * step, head + np.maximum(a, b) * step


def unfetched_pages(fetched: dict[str, Any], key: str, spans: tuple[Any, Any] | None
                    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
    """The pages under byte ranges ``spans`` of file ``key`` not yet fetched again, as byte ranges (one a
    page), noted in ``fetched`` (``{key: page numbers fetched again}``, None: the whole file); None where
    there is nothing new (every page, or the whole file, fetched again already). ``spans`` None: the whole
    file (an empty pair where it had only some pages fetched again)."""
    done = fetched.get(key, _NO_PAGES)
    if done is None:
        return None
    if spans is None:
        fetched[key] = None
        return _NO_PAGES, _NO_PAGES
    s, e = page_runs(*spans)
    first = s // PAGE
    counts = (e - s) // PAGE
    pages = np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()), dtype=np.int64)
    new = np.setdiff1d(pages, done)
    if not len(new):
        return None
    fetched[key] = np.union1d(done, new)
    return new * PAGE, (new + 1) * PAGE


_NO_PAGES = np.zeros(0, np.int64)


class Group(NamedTuple):
    """One shard's part of a batch (:meth:`ShardMap.batch`). Holding the shard keeps its files mapped for
    the whole call, whatever the LRU of mapped shards does."""

    shard: Shard
    pos: Any  #: positions in the batch (a slice for a single-shard store)
    rows: np.ndarray[Any, Any]  #: local rows


class ShardMap:
    """Global index -> (shard, row) over one manifest's shard table, and the shards mapped on first touch
    (at most ``max_mapped`` of them, least recently used dropped). :meth:`load` moves to a manifest (the
    first one too). ``setup``: first touching a shard costs requests (the source's ``ReadPolicy.setup``),
    so a batch prepares all its new shards at once. ``identity``: :func:`manifest_identity` as it was
    before the manifest was read (set anew before each :meth:`load` of a newly read manifest)."""

    def __init__(self, source: ByteSource, max_mapped: int | None, setup: bool,
                 identity: tuple[int, int, int, int] | None = None) -> None:
        self.source, self.setup, self.identity = source, setup, identity
        self.max_mapped_opt = max_mapped
        self.mapped: OrderedDict[int, Shard] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()  # several threads may share a Store

    def load(self, manifest: Manifest) -> None:
        """Move to ``manifest``. A mapped shard stays only if it lists the same shard at its position (an
        overwrite replaces the shards: same positions, other shards), with the same records."""
        old: ShardTable | None = getattr(self, "table", None)
        self.manifest, self.schema = manifest, manifest.schema
        # the mapped shard table of a version-3 store (nothing is built per shard, so open is O(1)); for
        # version 1/2 a table built from the manifest's shard list
        self.table = table = manifest.shard_table()
        self.starts = table.starts  # (num_shards,) first record of each shard: a view, no total at the end
        self.start_index: Sequence[int] = table.start_index()  # the same as Python ints, for bisect
        self.n = table.total
        for k in list(self.mapped):
            if k >= len(table) or not self._same(k, self.mapped[k], old):
                del self.mapped[k]
        self._last: tuple[int, Any] = (-1, None)  # (shard number, Shard) of the last shard() call
        self.max_mapped = self.max_mapped_opt or mapped_shard_limit(self.schema)

    def _same(self, k: int, sh: Shard, old: ShardTable | None) -> bool:
        if self.manifest.table is not None:  # a version-3 row carries the CRC of the shard's descriptor
            return old is not None and k < len(old.data) and old.data[k].tobytes() == self.table.data[k].tobytes()
        info = self.manifest.shards[k]
        return info.name == sh.info.name and info.records == sh.info.records and info.files == sh.info.files

    @property
    def url(self) -> str:
        return self.source.url

    @property
    def num_shards(self) -> int:
        return len(self.start_index)

    def norm(self, i: int) -> int:
        n = self.n
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"record index {i} out of range for a store of {n} records ({self.url})")
        return j

    def norm_many(self, indices: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            if idx.size == 0:
                return idx.astype(np.int64)
            raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
        out = idx.astype(np.int64, copy=True)
        if idx.dtype.kind == "i":  # (unsigned 2**63 and up wrap to negative: left so, out of range)
            out[out < 0] += self.n
        if out.size and (out.min() < 0 or out.max() >= self.n):
            bad = idx[(out < 0) | (out >= self.n)][0]
            raise IndexError(f"record index {bad} out of range for a store of {self.n} records ({self.url})")
        return out

    def locate(self, i: int) -> tuple[int, int]:
        """(shard, local row) of global index ``i`` (in range). The search starts after row 0: a row 0
        whose start is damaged still gives shard 0, whose check names the damage (never shard -1)."""
        k = bisect_right(self.start_index, i, 1) - 1
        return k, i - self.start_index[k]

    def record(self, i: int) -> tuple[Shard, int]:
        """The mapped shard and local row of record ``i`` (negative counts from the end; checked). ``norm``
        and ``locate`` spelled out: ``store[i]`` costs about a microsecond, and each call is a tenth of it."""
        n, j = self.n, int(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"record index {i} out of range for a store of {n} records ({self.url})")
        starts = self.start_index
        k = bisect_right(starts, j, 1) - 1  # (as in locate)
        return self.shard(k), j - starts[k]

    def group(self, idx: np.ndarray[Any, Any]) -> Iterator[tuple[int, Any, np.ndarray[Any, Any]]]:
        """Yield (shard, positions in idx, local rows) for each shard touched by ``idx``."""
        if self.num_shards == 1:
            yield 0, slice(None), idx
            return
        shard = np.searchsorted(self.starts[1:], idx, side="right")  # (as in locate)
        order = np.argsort(shard, kind="stable")
        cuts = np.flatnonzero(np.diff(shard[order])) + 1
        for pos in np.split(order, cuts):
            if len(pos):
                k = int(shard[pos[0]])
                yield k, pos, idx[pos] - self.starts[k]

    def batch(self, indices: Any) -> tuple[np.ndarray[Any, Any], list[Group]]:
        """Records ``indices`` (checked) as a flat index array and its :meth:`groups`."""
        idx = self.norm_many(indices).reshape(-1)
        return idx, self.groups(idx)

    def groups(self, idx: np.ndarray[Any, Any]) -> list[Group]:
        """:meth:`group` of ``idx`` (flat, in range) with each shard mapped once for the whole batch."""
        parts = list(self.group(idx))
        if self.setup:
            new = [k for k, _, _ in parts if k not in self.mapped]
            if len(new) > 1:
                self.source.prepare_shards(self.manifest, self.table, new)
        return [Group(self.shard(k), pos, rows) for k, pos, rows in parts]

    def shard(self, k: int) -> Shard:
        """Shard ``k``, mapped on first touch. At most ``max_mapped`` stay mapped: the least recently used
        is dropped (its pages stay in the page cache; arrays handed out keep their own mapping alive)."""
        last = self._last
        if last[0] == k:  # the same shard as the previous call (a single-shard store, a scan)
            hit: Shard = last[1]
            return hit
        shards = self.mapped
        sh = shards.get(k)
        if sh is not None and len(shards) * 2 < self.max_mapped:  # recency matters only once evictions near
            self._last = (k, sh)
            return sh
        with self._lock:
            sh = shards.get(k)
            if sh is None:
                sh = shards[k] = self._map(k)
                while len(shards) > self.max_mapped:
                    shards.popitem(last=False)
            else:
                shards.move_to_end(k)
        self._last = (k, sh)
        return sh

    def _check_unreplaced(self, k: int, info: ShardInfo) -> None:
        """A local version-1/2 store: raise if shard ``k`` of the manifest this map reads is not shard
        ``k`` of the store's manifest now (the store replaced by another, whose files may have the same
        names and sizes: version 3 finds it by the CRC of each shard's descriptor). Costs a ``stat`` of
        the manifest, and reading it once after each commit."""
        now = manifest_identity(self.source)
        if now == self.identity:
            return
        path = self.source.root / MANIFEST
        current = Manifest.load(self.source.root) if now is not None else None
        if current is None or current.table is not None or k >= current.num_shards or current.shards[k] != info:
            what = "it is gone" if current is None else f"shard {k} is not {info.name} of {info.records} records now"
            raise CorruptionError(f"{path}: the store was replaced since this Store read its manifest ({what}); "
                                  "open the store again")
        self.identity = now  # (a commit since: it added shards)

    def _recheck(self, k: int, info: ShardInfo) -> None:
        """Before mapped shard ``k``'s id files are mapped (its first id lookup, maybe long after the rest):
        that the store still has that shard there, as mapping it checked (a store replaced since by one
        with files of the same names would answer its ids for this shard's records). Version 3 reads the
        descriptor again (checked against the table row's CRC); version 1/2 compares the manifest."""
        if self.manifest.table is not None:
            self.manifest.shards[k]
        elif self.identity is not None:
            self._check_unreplaced(k, info)

    def _map(self, k: int) -> Shard:
        """Map shard ``k`` (version 3 reads and checks the table row and the shard's descriptor here).
        Errors name the files as the source names them (a remote store: URLs)."""
        source = self.source
        try:
            source.prepare_shards(self.manifest, self.table, (k,))
            info = self.manifest.shards[k]
            if self.manifest.table is None and self.identity is not None:
                self._check_unreplaced(k, info)
            sh = Shard(source, info, self.schema, source.shard_display(info.name))
            if not source.is_remote:
                sh.before_ids = partial(self._recheck, k, info)
            else:  # (the wave that learns the id objects fetches the descriptor: CRC checked; v1/2: the manifest)
                crc = self.table.row(k).desc_crc if self.manifest.table is not None else None
                sh.before_ids = partial(source.prepare_ids, info.name, crc)
            return sh
        except CorruptionError as exc:
            text = source.display(str(exc))
            if text == str(exc):
                raise
            raise CorruptionError(text) from exc.__cause__
