"""Writing stores: buffered, crash-safe appends of records into immutable shards.

A :class:`Writer` validates records against the schema, buffers them by bytes, and writes each field
of the current shard with large sequential writes into a private workspace directory
(``_tmp/<token>/current``; ``_tmp-<token>/current`` in a version-1/2 store). :meth:`Writer.commit`
finishes the shard (final ``.npy`` headers, id index, for a version-3 store the shard's descriptor,
fsync), then under the store's lock file
renames it to ``shard-NNNNNN``, appends its shard-table row (version 3) and atomically replaces the
manifest (store/commit.py). A crash before the manifest's rename leaves only files readers never look
at, which the next writer deletes or overwrites; a crash after it loses nothing. A store keeps the
format version it was created with.

Packed groups (docs/format.md, version 2) are buffered and written as one ``(n, width)`` matrix per
group; :meth:`Writer.append_batch` also takes a group's whole ``(B, width)`` matrix under the group's
name, which is written without any per-field copy.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import socket
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from ..errors import SchemaError, SeqstoreError
from ..format.descriptor import DESCRIPTOR, encode_descriptor
from ..format.manifest import (
    COMMIT_JOURNAL,
    ID_LOOKUPS,
    MANIFEST,
    PARTS_DIR,
    FileInfo,
    Manifest,
    ShardInfo,
    fsync_dir,
)
from ..format.npy import HEADER_BYTES, PAGE_HEADER_BYTES, encode_header
from ..format.shard_table import TableState
from ..schema import Field, Schema, flatten_values, to_storage_array
from .commit import (
    IDS,
    INDEX_DIR,
    LOCK_FILE,
    MERGE_CHUNK,
    MERGE_FANIN,
    IdsMismatch,
    clean_orphans,
    commit_shard,
    merge_sorted_runs,
    recover_batch_commit,
    store_lock,
    workspace_path,
)
from .directio import ALIGN, aligned_empty, is_aligned, open_direct, pwrite_all
from .directio import pwrite_all as _write_at  # the buffered writes (pwrite_all: the direct ones)
from .ids import encode_ids, hash_ids

__all__ = [
    "Writer",
    "create",
    "append_to",
    "open_or_create",
    "store_lock",
    "merge_sorted_runs",
    "IDS",
    "INDEX_DIR",
    "LOCK_FILE",
    "MERGE_CHUNK",
    "MERGE_FANIN",
]

log = logging.getLogger(__name__)

# A batch piece at least this large is written straight from the caller's arrays (no buffer copy).
DIRECT_BYTES = 4 << 20
# With direct_io, an append of a fixed-size column at least this large bypasses the page cache.
DIRECT_IO_BYTES = 1 << 20
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _row_starts(lengths: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """(B+1,) first row of each record of a ragged batch column, plus the total."""
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    return starts


def _caller_ids(values: Any) -> set[int]:
    """ids of the caller's objects in batch columns (arrays, list items, a pair's values)."""
    out: set[int] = set()
    for v in values:
        out.add(id(v))
        if isinstance(v, (list, tuple)):
            out.update(id(x) for x in v)
    return out


def _coalesce(
    parts: list[np.ndarray[Any, Any]], target: int = DIRECT_BYTES, *, aligned: bool = False
) -> Iterator[np.ndarray[Any, Any]]:
    """Yield the buffered pieces of one file as C-contiguous arrays of at least ``target`` bytes where
    possible: a large piece as it is (no copy), consecutive small ones concatenated into one run. Keeps
    the number of writes (and checksum tasks) per flush small without copying big batches again.
    ``aligned``: runs are concatenated into page-aligned memory (for direct I/O)."""

    def join(run: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
        if len(run) == 1:
            return np.ascontiguousarray(run[0])
        if not aligned or sum(p.nbytes for p in run) < DIRECT_IO_BYTES:
            return np.concatenate(run)
        out = aligned_empty((sum(p.shape[0] for p in run), *run[0].shape[1:]), run[0].dtype)
        return np.concatenate(run, out=out)

    run: list[np.ndarray[Any, Any]] = []
    run_bytes = 0
    for part in parts:
        if part.nbytes >= target and not run:
            yield np.ascontiguousarray(part)
            continue
        run.append(part)
        run_bytes += part.nbytes
        if run_bytes >= target:
            yield join(run)
            run, run_bytes = [], 0
    if run:
        yield join(run)


class _ColumnFile:
    """One growing ``.npy`` file of a shard: provisional header, sequential appends, running CRC-32.

    Every write is a positioned ``pwrite`` on an unbuffered descriptor at the file's tracked end, so
    there is no hidden buffer a forked child could flush into the parent's file, and no file offset
    shared with one. ``direct``: large aligned appends go through a second, ``O_DIRECT`` descriptor
    (store/directio.py) and the header is one page, so the data starts aligned. An append that is
    small, or whose memory or file position is not aligned, and the unaligned tail of one that is, go
    through the page cache.
    """

    def __init__(
        self,
        path: Path,
        dtype: np.dtype[Any],
        inner: tuple[int, ...],
        crc_pool: ThreadPoolExecutor,
        *,
        direct: bool = False,
        page_header: bool = False,
    ):
        self.path = path
        self.dtype = dtype
        self.inner = inner
        self.rows = 0
        self._pool = crc_pool
        self._crc: Future[int] | None = None
        self._header = PAGE_HEADER_BYTES if direct or page_header else HEADER_BYTES
        self._direct: int | None = None
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
        try:
            _write_at(self._fd, memoryview(encode_header(dtype, (0, *inner), self._header)), 0)
            self._pos = self._header
            if direct:
                self._direct = open_direct(path)
        except BaseException:
            self.abort()
            raise

    def write(self, arr: np.ndarray[Any, Any]) -> Future[int]:
        """Append rows (``arr`` has this file's dtype and inner shape and is C-contiguous)."""
        assert self._fd is not None
        buf = memoryview(arr.reshape(-1).view(np.uint8).data) if arr.size else memoryview(b"")
        prev = self._crc

        def chained(data: memoryview = buf) -> int:  # bound now: ``buf`` is rebound below
            return zlib.crc32(data, prev.result() if prev is not None else 0)

        self._crc = self._pool.submit(chained)
        body = len(buf) - len(buf) % ALIGN
        if self._direct is not None and body >= DIRECT_IO_BYTES and self._pos % ALIGN == 0 and is_aligned(arr):
            try:
                pwrite_all(self._direct, buf[:body], self._pos)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # the device wants a larger alignment than ALIGN: page cache from now on
                log.debug("%s: direct write refused (%s); writing through the page cache", self.path, exc)
                self._close_direct()
                body = 0
            self._pos += body
            buf = buf[body:]
        _write_at(self._fd, buf, self._pos)
        self._pos += len(buf)
        self.rows += arr.shape[0] if arr.ndim else 1
        return self._crc

    def _close_direct(self) -> None:
        if self._direct is not None:
            fd, self._direct = self._direct, None
            os.close(fd)

    def finish(self, *, sync: bool = True) -> FileInfo:
        """Write the final header, fsync (unless ``sync`` is False: a scratch file), close; return size
        and CRC."""
        assert self._fd is not None
        try:
            _write_at(self._fd, memoryview(encode_header(self.dtype, (self.rows, *self.inner), self._header)), 0)
            if sync:
                os.fsync(self._fd)
        finally:
            self.abort()  # closes both descriptors
        crc = self._crc.result() if self._crc is not None else 0
        return FileInfo(self._pos, crc)

    def abort(self) -> None:
        """Close the descriptors (idempotent, never raises: the file is being given up or is done)."""
        for close in (self._close_direct, self._close_fd):
            try:
                close()
            except OSError as exc:
                log.debug("%s: close failed (%r)", self.path, exc)

    def _close_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


class Writer:
    """Appends records to a store. Use :func:`create` or :func:`append_to` to get one.

    Records are buffered up to ``buffer_bytes`` and then written to the current shard; a shard is
    committed when it reaches ``shard_bytes`` or ``max_shard_records``, on :meth:`commit`, and on
    :meth:`close`. Leaving a ``with`` block by an exception discards what was not committed.

    ``direct_io=True`` writes large appends of fixed-size columns with ``O_DIRECT`` (no copy into the
    page cache, which is most of the CPU cost of writing GB/s; store/directio.py) where the filesystem
    supports it. Those files get a one-page header. Appends come straight from page-aligned arrays
    (:func:`~seqstore.store.directio.aligned_empty`, as the Logger's buffers are) or from the writer's
    own staging arrays.
    """

    def __init__(
        self,
        root: Path,
        *,
        shard_bytes: int = 1 << 30,
        buffer_bytes: int = 64 << 20,
        max_shard_records: int = 1 << 24,
        direct_io: bool = False,
    ) -> None:
        if shard_bytes <= 0 or buffer_bytes <= 0 or max_shard_records <= 0:
            raise ValueError("shard_bytes, buffer_bytes and max_shard_records must be positive")
        self.root = root
        self.direct_io = bool(direct_io)
        self.shard_bytes = shard_bytes
        self.buffer_bytes = buffer_bytes
        self.max_shard_records = max_shard_records
        self._pid = os.getpid()
        self._failed: BaseException | None = None
        manifest = self._open_workspace()
        self.schema: Schema = manifest.schema
        self._fields: list[tuple[str, Field]] = list(self.schema.items())
        self._names = set(self.schema)
        self._groups = self.schema.groups
        # what is stored: unpacked fields, then packed groups as fixed (width,) fields
        self._units: list[tuple[str, Field]] = self.schema.storage_units()
        self._stats_delta: dict[str, float] = {}
        self._has_ids: bool | None = manifest.has_ids if manifest.num_shards else None
        # a store keeps its format version: version 3 shards get a descriptor, 1/2 are listed in the manifest
        self._descriptors = manifest.table is not None
        self._desc_crc = 0
        self._records_before = manifest.num_records
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seqstore-crc")
        self._closed = False
        self._reset_buffer()
        self._shard_open = False
        self._committed_records = 0

    def _open_workspace(self) -> Manifest:
        """Under the store's lock: clean what dead writers left, make this writer's workspace
        (``self._workspace``, holding an flock on its ``owner.lock`` in ``self._owner_fd``); return the
        manifest the writer starts from. store/parts.py's PartWriter puts its workspace elsewhere."""
        token = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        with store_lock(self.root):
            recover_batch_commit(self.root)  # a commit of parts that died part way (store/parts.py)
            manifest = Manifest.load(self.root)
            clean_orphans(self.root, manifest)
            self._workspace = workspace_path(self.root, manifest, token)
            self._workspace.mkdir(parents=self._workspace.parent != self.root)
            self._owner_fd = os.open(self._workspace / "owner.lock", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._owner_fd, fcntl.LOCK_EX)
        return manifest

    # ------------------------------------------------------------------------------------- buffers

    def _reset_buffer(self) -> None:
        # staging arrays are free again once their data is written: keep one per unit for reuse
        self._spare: dict[str, np.ndarray[Any, Any]] = {
            n: st[0] for n, st in getattr(self, "_staging", {}).items()
        }
        self._staging: dict[str, tuple[np.ndarray[Any, Any], int, np.ndarray[Any, Any], int]] = {}
        self._buf: dict[str, list[np.ndarray[Any, Any]]] = {n: [] for n, _ in self._units}
        self._buf_lengths: dict[str, list[np.ndarray[Any, Any]]] = {n: [] for n, f in self._units if f.ragged}
        self._buf_ids: list[str] = []
        self._buf_records = 0
        self._buf_bytes = 0

    def _open_shard(self) -> None:
        cur = self._workspace / "current"
        cur.mkdir()
        self._files: dict[str, _ColumnFile] = {}
        try:
            self._open_shard_files(cur)
        except BaseException:  # e.g. out of descriptors: close what was opened, leave no current/
            for col in self._files.values():
                col.abort()
            self._files = {}
            shutil.rmtree(cur, ignore_errors=True)
            raise
        self._shard_records = 0
        self._shard_bytes = 0
        self._shard_open = True

    def _open_shard_files(self, cur: Path) -> None:
        for name, f in self._units:
            path = cur / f"{name}.npy"
            path.parent.mkdir(parents=True, exist_ok=True)
            # fixed-size data starts on a page boundary, so a record never straddles more pages than its
            # size requires (a cold random read of a 2 KiB record touches one page, not two)
            self._files[name] = _ColumnFile(
                path, f.storage_dtype, f.inner_shape, self._pool, direct=self.direct_io and not f.ragged,
                page_header=not f.ragged,
            )
            if f.ragged:
                off = _ColumnFile(cur / f"{name}.offsets.npy", np.dtype("<i8"), (), self._pool)
                off.write(np.zeros(1, dtype="<i8"))
                self._files[name + ".offsets"] = off
        if self._has_ids:
            for suffix, dt in (("", "u1"), (".offsets", "<i8"), (".hash_unsorted", "<u8")):
                self._files[IDS + suffix] = _ColumnFile(cur / f"{IDS}{suffix}.npy", np.dtype(dt), (), self._pool)
            self._files[IDS + ".offsets"].write(np.zeros(1, dtype="<i8"))

    # ------------------------------------------------------------------------------------ validation

    def _check_ids(self, have_ids: bool, first: int) -> None:
        if self._has_ids is not None and self._has_ids != have_ids:
            want = "with ids" if self._has_ids else "without ids"
            raise SchemaError(f"record {first}: this store's records are written {want}; got the other kind")

    def _flatten(self, record: Mapping[str, Any], what: str) -> Mapping[str, Any]:
        if isinstance(record, Mapping) and not any(isinstance(v, Mapping) for v in record.values()):
            return record  # already flat: no copy
        return flatten_values(record, what)

    def _check_keys(self, keys: Any, what: str) -> None:
        given = set(keys)
        names = self._names
        direct = given & set(self._groups)
        if direct:  # a group given as one (B, width) matrix stands for its fields
            names = (names - {m for g in direct for m in self._groups[g].fields}) | direct
        if given != names:
            unknown = sorted(given - names)
            missing = sorted(names - given)
            parts = []
            if unknown:
                parts.append(f"unknown field(s) {unknown}")
            if missing:
                parts.append(f"missing field(s) {missing}")
            groups = f" (or packed groups {sorted(self._groups)})" if self._groups else ""
            raise SchemaError(f"{what}: {'; '.join(parts)}; schema fields are {sorted(self._names)}{groups}")

    def _pack(
        self, gname: str, flat: Mapping[str, Any], prepared: Mapping[str, np.ndarray[Any, Any]], batch: int, fw: str
    ) -> np.ndarray[Any, Any]:
        """The (batch, width) matrix of packed group ``gname``: the caller's matrix when given under the
        group's name (converted, not copied when it already has the storage dtype), else a new matrix
        assembled from the fields' converted values ``prepared`` (one copy)."""
        g = self._groups[gname]
        if gname in flat:
            mat = to_storage_array(g.as_field(), flat[gname], what=fw)
            if mat.shape != (batch, g.width):
                raise SchemaError(
                    f"{fw}: expected a ({batch}, {g.width}) matrix for packed group {gname!r}, got {mat.shape}"
                )
            return mat
        shape = (batch, g.width)
        big = self.direct_io and batch * g.width * g.storage_dtype.itemsize >= DIRECT_IO_BYTES
        mat = aligned_empty(shape, g.storage_dtype) if big else np.empty(shape, dtype=g.storage_dtype)
        for name in g.fields:
            a, b = g.columns[name]
            mat[:, a:b] = prepared[name].reshape(batch, b - a)
        return mat

    # --------------------------------------------------------------------------------------- append

    def append(self, record: Mapping[str, Any], id: str | None = None) -> None:  # noqa: A002
        """Append one record: a (possibly nested) dict of field name -> array-like.

        Raises SchemaError naming the field, record number and id; a rejected record leaves nothing.
        """
        self._check_open()
        index = self._records_before + self._committed_records + self._pending_records()
        what = f"record {index}" + (f" (id {id!r})" if id is not None else "")
        if id is not None and not isinstance(id, str):
            raise SchemaError(f"record {index}: id must be a str, got {type(id).__name__} {id!r}")
        self._check_ids(id is not None, index)
        flat = self._flatten(record, what)
        self._check_keys(flat.keys(), what)
        converted: dict[str, np.ndarray[Any, Any]] = {}
        nbytes = 0
        for name, f in self._fields:
            if name not in flat:  # its packed group was given as a whole
                continue
            value = flat[name]
            arr = to_storage_array(f, value, what=f"{what}, field {name!r}")
            if f.ragged:
                if arr.ndim != len(f.shape) or arr.shape[1:] != f.inner_shape:
                    raise SchemaError(
                        f"{what}, field {name!r}: expected shape (n, {', '.join(map(str, f.inner_shape))})"
                        .replace(", )", ")") + f", got {arr.shape}"
                    )
            elif arr.shape != f.inner_shape:
                raise SchemaError(f"{what}, field {name!r}: expected shape {f.inner_shape}, got {arr.shape}")
            # buffered until the next flush: must not share memory the caller may overwrite
            converted[name] = arr.copy() if arr is value or arr.base is not None else arr
        units: dict[str, np.ndarray[Any, Any]] = {}
        for name, f in self._units:
            if name in self._groups:
                g = self._groups[name]
                if name in flat:
                    row = to_storage_array(g.as_field(), flat[name], what=f"{what}, packed group {name!r}")
                    if row.shape != (g.width,):
                        raise SchemaError(
                            f"{what}, packed group {name!r}: expected shape ({g.width},), got {row.shape}"
                        )
                    units[name] = row[None].copy()
                else:
                    units[name] = self._pack(name, flat, {k: v[None] for k, v in converted.items()}, 1, what)
            else:
                units[name] = converted[name] if f.ragged else converted[name][None]
            nbytes += units[name].nbytes
        self._has_ids = id is not None
        for name, f in self._units:
            self._buf[name].append(units[name])
            if f.ragged:
                self._buf_lengths[name].append(np.array([units[name].shape[0]], dtype=np.int64))
        if id is not None:
            self._buf_ids.append(id)
        self._buf_records += 1
        self._buf_bytes += nbytes
        if self._buf_full():
            self._flush()

    def append_batch(self, columns: Mapping[str, Any], ids: Sequence[str] | None = None) -> None:
        """Append a batch: fixed field -> stacked array (B, ...); ragged field -> list of arrays or a
        ``(values, lengths)`` pair. ``ids``: B str ids or None. All columns are validated before
        anything is buffered; a rejected batch leaves nothing behind.
        """
        self._check_open()
        first = self._records_before + self._committed_records + self._pending_records()
        if ids is not None:
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
                raise SchemaError(f"batch starting at record {first}: ids must be a sequence of str, got {ids!r}")
            for k, s in enumerate(ids):
                if not isinstance(s, str):
                    raise SchemaError(f"record {first + k}: id must be a str, got {type(s).__name__} {s!r}")
        what = f"batch starting at record {first}" + (f" (id {str(ids[0])!r})" if ids is not None and len(ids) else "")

        def item(k: int) -> str:
            return f"record {first + k}" + (f" (id {str(ids[k])!r})" if ids is not None and k < len(ids) else "")

        flat = self._flatten(columns, what)
        self._check_keys(flat.keys(), what)
        caller = _caller_ids(flat.values())
        batch: int | None = None
        prepared: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]] = []
        fixed: dict[str, np.ndarray[Any, Any]] = {}
        nbytes = 0
        for name, f in self._fields:
            if name not in flat:  # its packed group was given as a whole
                continue
            value = flat[name]
            lengths: np.ndarray[Any, Any] | None = None
            fw = f"{what}, field {name!r}"
            if f.ragged:
                values, lengths = self._ragged_column(f, value, fw, item)
                n = len(lengths)
            else:
                values = to_storage_array(f, value, what=fw)
                if values.ndim != 1 + len(f.inner_shape) or values.shape[1:] != f.inner_shape:
                    raise SchemaError(f"{fw}: expected shape (B, {f.inner_shape}) stacked, got {values.shape}")
                n = values.shape[0]
            if batch is None:
                batch = n
            elif n != batch:
                raise SchemaError(f"{fw}: has {n} records but earlier fields have {batch}")
            if self.schema.group_of(name) is None:
                prepared.append((values, lengths))
                nbytes += values.nbytes
            else:
                fixed[name] = values
        for gname in self._groups:
            if gname in flat:
                first_dim = np.shape(flat[gname])[0] if np.ndim(flat[gname]) else 0
                batch = first_dim if batch is None else batch
            assert batch is not None
            mat = self._pack(gname, flat, fixed, batch, f"{what}, packed group {gname!r}")
            prepared.append((mat, None))
            nbytes += mat.nbytes
        assert batch is not None
        if ids is not None and len(ids) != batch:
            raise SchemaError(f"{what}: got {len(ids)} ids for a batch of {batch} records")
        if batch == 0:
            return
        self._check_ids(ids is not None, first)
        self._has_ids = ids is not None
        row_starts = [None if lengths is None else _row_starts(lengths) for _, lengths in prepared]
        start = 0
        while start < batch:  # pieces never overflow a shard's record limit
            room = self.max_shard_records - self._pending_records()
            stop = min(batch, start + max(room, 1))
            piece_bytes = nbytes * (stop - start) // batch
            direct = piece_bytes >= DIRECT_BYTES
            if direct:  # written straight from the caller's arrays: flush what is buffered first
                self._flush()
            for (name, _f), (values, lengths), rows in zip(self._units, prepared, row_starts):
                if rows is None:
                    self._buf[name].append(values[start:stop])
                else:
                    assert lengths is not None
                    self._buf[name].append(values[rows[start] : rows[stop]])
                    self._buf_lengths[name].append(lengths[start:stop])
            if ids is not None:
                self._buf_ids.extend(ids[start:stop])
            self._buf_records += stop - start
            self._buf_bytes += piece_bytes
            if direct or self._buf_full():
                self._flush()
            else:  # the piece stays buffered: copy it (once) out of memory the caller may overwrite
                for name, _ in self._units:
                    self._stage(name, caller)
            start = stop

    def _stage(self, name: str, caller: set[int]) -> None:
        """Move the piece just buffered for unit ``name`` out of the caller's memory with one copy into
        a staging array of about DIRECT_BYTES (reused across flushes). Consecutive pieces fill the same
        staging array, so a flush writes a few large runs and copies nothing again."""
        parts = self._buf[name]
        piece = parts.pop()
        if piece.base is None and id(piece) not in caller:
            parts.append(piece)  # converted by us: already private
            self._staging.pop(name, None)
            return
        rows = piece.shape[0]
        if rows == 0 or piece.nbytes == 0:
            parts.append(piece.copy())  # nothing to stage
            return
        staged = self._staging.get(name)
        if staged is not None and parts and parts[-1] is staged[2] and staged[1] + rows <= staged[0].shape[0]:
            arr, used, _, first = staged
            arr[used : used + rows] = piece
            view = arr[first : used + rows]
            parts[-1] = view
            self._staging[name] = (arr, used + rows, view, first)
            return
        row_bytes = max(piece.nbytes // rows, 1)
        capacity = max(rows, DIRECT_BYTES // row_bytes)
        spare = self._spare.pop(name, None)
        if spare is not None and spare.shape[0] >= capacity and spare.dtype == piece.dtype:
            arr = spare
        else:
            shape = (capacity, *piece.shape[1:])
            arr = aligned_empty(shape, piece.dtype) if self.direct_io else np.empty(shape, dtype=piece.dtype)
        arr[:rows] = piece
        view = arr[:rows]
        parts.append(view)
        self._staging[name] = (arr, rows, view, 0)

    def _buf_full(self) -> bool:
        """Flush when the buffer is full or the shard it goes into would be."""
        if self._buf_bytes >= self.buffer_bytes:
            return True
        done_bytes = self._shard_bytes if self._shard_open else 0
        done_records = self._shard_records if self._shard_open else 0
        return (
            done_bytes + self._buf_bytes >= self.shard_bytes
            or done_records + self._buf_records >= self.max_shard_records
        )

    def _ragged_column(
        self, f: Field, value: Any, what: str, item: Callable[[int], str]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        if isinstance(value, tuple) and len(value) == 2:
            values = to_storage_array(f, value[0], what=what)
            lengths = np.asarray(value[1])
            if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or (lengths.size and lengths.min() < 0):
                raise SchemaError(f"{what}: lengths must be a 1-D array of non-negative ints")
            lengths = lengths.astype(np.int64)
            if values.ndim != len(f.shape) or values.shape[1:] != f.inner_shape:
                raise SchemaError(f"{what}: values must have shape (total_rows, {f.inner_shape}), got {values.shape}")
            if int(lengths.sum()) != values.shape[0]:
                raise SchemaError(f"{what}: lengths sum to {int(lengths.sum())} but values have {values.shape[0]} rows")
            return values, lengths
        if isinstance(value, np.ndarray) or not isinstance(value, Sequence):
            raise SchemaError(f"{what}: a ragged column is a list of arrays or a (values, lengths) pair")
        dtype, nd, inner = f.storage_dtype, len(f.shape), f.inner_shape
        if value and all(
            type(x) is np.ndarray and x.dtype == dtype and x.ndim == nd and x.shape[1:] == inner for x in value
        ):  # the common case: arrays already in storage form; one concatenation, no per-item conversion
            values = np.concatenate(value) if len(value) > 1 else value[0]
            return values, np.fromiter((x.shape[0] for x in value), dtype=np.int64, count=len(value))
        arrays = []
        for k, x in enumerate(value):
            arr = to_storage_array(f, x, what=f"{what}, batch item {k} = {item(k)}")
            if arr.ndim != len(f.shape) or arr.shape[1:] != f.inner_shape:
                raise SchemaError(
                    f"{what}, batch item {k} = {item(k)}: expected rows of shape {f.inner_shape}, got {arr.shape}"
                )
            arrays.append(arr)
        lengths = np.fromiter((a.shape[0] for a in arrays), dtype=np.int64, count=len(arrays))
        if arrays:
            values = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        else:
            values = np.empty((0, *f.inner_shape), dtype=f.storage_dtype)
        return values, lengths

    def _pending_records(self) -> int:
        return self._buf_records + (self._shard_records if self._shard_open else 0)

    # ---------------------------------------------------------------------------------------- flush

    def _flush(self) -> None:
        """Write the buffer to the current shard (no commit). Splits the shard when it is full.

        If writing fails part way (disk full, I/O error), the shard's files no longer agree with each
        other: the writer is marked failed and only :meth:`abort` is allowed (committed data is safe)."""
        with self._failing():
            self._write_buffer()

    @contextmanager
    def _failing(self) -> Iterator[None]:
        """Mark the writer failed when the block raises anything but a SeqstoreError (I/O errors part
        way through leave the shard's files inconsistent; validation errors leave nothing behind)."""
        try:
            yield
        except SeqstoreError:
            raise
        except BaseException as exc:
            self._failed = exc
            raise

    def _write_buffer(self) -> None:
        if self._buf_records == 0:
            return
        if not self._shard_open:
            self._open_shard()
        futures: list[Future[int]] = []
        for name, f in self._units:
            col = self._files[name]
            if f.ragged:
                lengths = np.concatenate(self._buf_lengths[name])
                offsets = np.cumsum(lengths) + col.rows
                futures.append(self._files[name + ".offsets"].write(offsets.astype("<i8", copy=False)))
            # large pieces as they are, small ones joined
            for run in _coalesce(self._buf[name], aligned=self.direct_io and not f.ragged):
                futures.append(col.write(run))
        if self._has_ids:
            data, offsets = encode_ids(self._buf_ids, first_record=0)
            ids_col = self._files[IDS]
            hashes = hash_ids(data, offsets)
            futures.append(self._files[IDS + ".offsets"].write(offsets[1:] + ids_col.rows))
            futures.append(ids_col.write(data))
            futures.append(self._files[IDS + ".hash_unsorted"].write(hashes))
        for fut in futures:
            fut.result()  # the caller may reuse its arrays once we return
        self._shard_records += self._buf_records
        self._shard_bytes += self._buf_bytes
        self._reset_buffer()
        if self._shard_bytes >= self.shard_bytes or self._shard_records >= self.max_shard_records:
            self._commit_shard()

    # --------------------------------------------------------------------------------------- commit

    def commit(self) -> None:
        """Make everything appended so far durable and visible to readers that open or refresh.

        After this returns, a crash or power cut loses none of these records.
        """
        self._check_open()
        self._flush()
        if self._shard_open:
            self._commit_shard()
        elif self._stats_delta:
            with store_lock(self.root):
                manifest = Manifest.load(self.root)
                self._apply_stats(manifest)
                manifest.generation += 1
                manifest.save(self.root)

    def add_stats(self, delta: Mapping[str, float]) -> None:
        """Add numbers to the manifest's ``stats`` (``stats[k] += v``) at the next commit.

        Deltas from several writers of one store add up (they are applied under the commit lock);
        :meth:`commit` saves pending deltas even when no records are pending.
        """
        for k, v in delta.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise TypeError(f"stats delta {k!r} must be a number, got {v!r}")
            self._stats_delta[k] = self._stats_delta.get(k, 0) + v

    def _apply_stats(self, manifest: Manifest) -> None:
        for k, v in self._stats_delta.items():
            old = manifest.stats.get(k, 0)
            manifest.stats[k] = (old if isinstance(old, (int, float)) else 0) + v
        self._stats_delta = {}

    def _finish_shard_files(self) -> ShardInfo:
        cur = self._workspace / "current"
        infos: dict[str, FileInfo] = {}
        rows: dict[str, int] = {}
        for key, col in self._files.items():
            if key == IDS + ".hash_unsorted":
                continue
            infos[col.path.relative_to(cur).as_posix()] = col.finish()
            if key in self.schema and self.schema[key].ragged:
                rows[key] = col.rows
        if self._has_ids:
            tmp = self._files[IDS + ".hash_unsorted"]
            tmp.finish(sync=False)  # read back and deleted below: nothing to make durable
            hashes = np.load(tmp.path)
            order = np.argsort(hashes, kind="stable")
            for suffix, arr in ((".hash", hashes[order]), (".hash_rows", order.astype("<i8"))):
                col = _ColumnFile(cur / f"{IDS}{suffix}.npy", arr.dtype, (), self._pool)
                col.write(np.ascontiguousarray(arr))
                infos[f"{IDS}{suffix}.npy"] = col.finish()
            tmp.path.unlink()
        if self._descriptors:  # version 3: the shard describes itself (immutable once committed)
            raw = encode_descriptor(self._shard_records, rows, bool(self._has_ids), infos)
            fd = os.open(cur / DESCRIPTOR, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
            try:
                _write_at(fd, memoryview(raw), 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._desc_crc = zlib.crc32(raw)
        fsync_dir(cur)
        for sub in {p.parent for p in cur.rglob("*.npy")} - {cur}:
            fsync_dir(sub)
        return ShardInfo("", self._shard_records, rows, infos, bool(self._has_ids))

    def _commit_shard(self) -> None:
        with self._failing():
            self._commit_shard_files()

    def _commit_shard_files(self) -> None:
        pending = self._finish_shard_files()
        cur = self._workspace / "current"
        try:
            name = commit_shard(self.root, cur, pending, self._desc_crc, self._apply_stats)
        except IdsMismatch as exc:
            # another writer committed the other kind first: drop this shard, stay usable
            shutil.rmtree(cur, ignore_errors=True)
            self._shard_open = False
            self._has_ids = exc.has_ids
            kind = "with" if self._has_ids else "without"
            raise SchemaError(
                f"{self.root}: cannot mix records with and without ids in one store; its records are now "
                f"written {kind} ids, so the {pending.records} uncommitted records of this writer's shard "
                "were discarded"
            ) from None
        self._committed_records += pending.records
        self._shard_open = False
        log.debug("committed %s (%d records)", name, pending.records)

    # ---------------------------------------------------------------------------------------- close

    def _check_open(self) -> None:
        if self._closed:
            raise SeqstoreError(f"{self.root}: writer is closed")
        if os.getpid() != self._pid:
            raise SeqstoreError(
                f"{self.root}: this writer belongs to process {self._pid}; a forked child cannot use it "
                "(open a writer of its own with seqstore.append_to)"
            )
        if self._failed is not None:
            raise SeqstoreError(
                f"{self.root}: an earlier write failed ({self._failed!r}); the records appended since the last "
                "commit cannot be written consistently. Call abort(): committed records are intact."
            )

    def abort(self) -> None:
        """Discard everything not yet committed and release the writer. Never fails part way: every
        file is closed and the workspace removed even when closing one of them reports an error.
        In a forked child it only marks the writer closed (the files are the parent's)."""
        if self._closed:
            return
        try:
            if self._shard_open and os.getpid() == self._pid:
                for col in self._files.values():
                    col.abort()
        finally:
            self._reset_buffer()
            self._shard_open = False
            self._release()

    def close(self) -> None:
        """Commit what is pending and release the writer."""
        if self._closed:
            return
        if os.getpid() != self._pid:  # a forked child's copy: committing would take the parent's shard
            self._closed = True
            return
        try:
            self.commit()
        finally:
            self._release()

    def _release(self) -> None:
        self._closed = True
        if os.getpid() != self._pid:  # a forked child's copy: the workspace belongs to the parent
            return
        self._pool.shutdown(wait=True)
        shutil.rmtree(self._workspace, ignore_errors=True)
        os.close(self._owner_fd)

    def __enter__(self) -> Writer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if getattr(self, "_pid", None) != os.getpid():
            return  # a forked child's copy (or a half-built writer): leave the parent's files alone
        if not getattr(self, "_closed", True):
            log.warning("%s: writer garbage-collected without close(); uncommitted records are discarded", self.root)
            try:
                self.abort()
            except Exception:  # noqa: BLE001
                pass

    @property
    def num_committed(self) -> int:
        """Records this writer has committed."""
        return self._committed_records


def create(
    path: str | os.PathLike[str],
    schema: Mapping[str, Any] | Schema,
    *,
    shard_bytes: int = 1 << 30,
    buffer_bytes: int = 64 << 20,
    max_shard_records: int = 1 << 24,
    overwrite: bool = False,
    metadata: Mapping[str, Any] | None = None,
    packed: Mapping[str, Sequence[str]] | None = None,
    id_lookup: str = "first",
    direct_io: bool = False,
) -> Writer:
    """Create a new store at ``path`` and return a :class:`Writer` (a context manager).

    ``schema`` is a (nested) dict of name -> :class:`~seqstore.Field`. ``overwrite=True`` replaces an
    existing store; otherwise an existing path is an error. ``packed`` (``{group: [field, ...]}``)
    stores those fixed fields as one matrix per group (format version 2). ``id_lookup="last"`` makes
    ``index(id)`` return the last record written with an id instead of the first (version 2).
    ``direct_io``: see :class:`Writer`.
    """
    root = Path(path)
    sch = _checked_schema(schema, packed, id_lookup)
    if root.exists():
        if not overwrite:
            raise FileExistsError(f"{root}: already exists (pass overwrite=True to replace it)")
        if root.is_dir() and not (root / MANIFEST).exists() and any(root.iterdir()):
            raise SeqstoreError(f"{root}: refusing to overwrite a non-empty directory that is not a store")
        shutil.rmtree(root) if root.is_dir() else root.unlink()
    root.mkdir(parents=True)
    _new_manifest(sch, metadata, id_lookup).save(root)
    return Writer(
        root,
        shard_bytes=shard_bytes,
        buffer_bytes=buffer_bytes,
        max_shard_records=max_shard_records,
        direct_io=direct_io,
    )


def _new_manifest(sch: Schema, metadata: Mapping[str, Any] | None, id_lookup: str) -> Manifest:
    """The manifest of a new, empty store: version 3 (a shard table with no rows yet)."""
    return Manifest(sch, metadata=dict(metadata or {}), id_lookup=id_lookup, table=TableState(0, 0, 0))


def _checked_schema(
    schema: Mapping[str, Any] | Schema, packed: Mapping[str, Sequence[str]] | None, id_lookup: str
) -> Schema:
    if id_lookup not in ID_LOOKUPS:
        raise ValueError(f"id_lookup must be one of {ID_LOOKUPS}, got {id_lookup!r}")
    sch = Schema(schema, packed=packed) if packed is not None or not isinstance(schema, Schema) else schema
    for name, f in sch.storage_units():
        try:  # the file's header must fit its final row count, whatever it becomes
            encode_header(f.storage_dtype, (1 << 62, *f.inner_shape))
        except ValueError:
            raise SchemaError(
                f"field {name!r}: shape {f.shape} has too many dimensions for a {HEADER_BYTES}-byte .npy header"
            ) from None
    return sch


def open_or_create(
    path: str | os.PathLike[str],
    schema: Mapping[str, Any] | Schema,
    *,
    shard_bytes: int = 1 << 30,
    buffer_bytes: int = 64 << 20,
    max_shard_records: int = 1 << 24,
    metadata: Mapping[str, Any] | None = None,
    packed: Mapping[str, Sequence[str]] | None = None,
    id_lookup: str = "first",
    direct_io: bool = False,
) -> Writer:
    """A writer on the store at ``path``, creating it when it does not exist; safe when several
    processes (ranks) call it at once.

    The new store is prepared in a sibling temporary directory and renamed into place, so exactly one
    caller creates it; the others (and later callers) append. An existing store must have the same
    schema (packed groups included) and ``id_lookup``, else :class:`SchemaError`.
    """
    root = Path(path)
    sch = _checked_schema(schema, packed, id_lookup)
    install_new_store(root, sch, metadata, id_lookup)
    manifest = _load_recovered(root)
    if manifest.schema != sch:
        raise SchemaError(f"{root}: existing store has schema {manifest.schema!r}, expected {sch!r}")
    if manifest.id_lookup != id_lookup:
        raise SchemaError(f"{root}: existing store has id_lookup {manifest.id_lookup!r}, expected {id_lookup!r}")
    return Writer(
        root,
        shard_bytes=shard_bytes,
        buffer_bytes=buffer_bytes,
        max_shard_records=max_shard_records,
        direct_io=direct_io,
    )


def _load_recovered(root: Path) -> Manifest:
    """The manifest, once a commit of parts that died part way is finished or undone (store/parts.py)."""
    if (root / PARTS_DIR / COMMIT_JOURNAL).exists():
        with store_lock(root):
            recover_batch_commit(root)
    return Manifest.load(root)


def install_new_store(root: Path, sch: Schema, metadata: Mapping[str, Any] | None, id_lookup: str) -> bool:
    """Create an empty version-3 store at ``root`` unless one is there; safe when several processes
    call it at once: the store is prepared in a hidden sibling directory and renamed into place, so
    exactly one caller creates it. Returns whether this call created it. An existing non-empty
    directory that is not a store raises (OSError from the rename)."""
    created = False
    if not (root / MANIFEST).exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = root.parent / f".{root.name}.tmp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            _new_manifest(sch, metadata, id_lookup).save(tmp)
            try:
                os.rename(tmp, root)  # atomic; replaces an empty directory, fails on a non-empty one
                fsync_dir(root.parent)
                created = True
            except OSError:
                if not (root / MANIFEST).exists():
                    # a non-empty directory that is not a store, or one still being created: wait briefly
                    for _ in range(50):
                        time.sleep(0.02)
                        if (root / MANIFEST).exists():
                            break
                    else:
                        raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return created


def append_to(
    path: str | os.PathLike[str],
    *,
    shard_bytes: int = 1 << 30,
    buffer_bytes: int = 64 << 20,
    max_shard_records: int = 1 << 24,
    direct_io: bool = False,
) -> Writer:
    """Open an existing store to add shards. Many processes may do this at once."""
    root = Path(path)
    _load_recovered(root)  # clear error if it is not a store
    return Writer(
        root,
        shard_bytes=shard_bytes,
        buffer_bytes=buffer_bytes,
        max_shard_records=max_shard_records,
        direct_io=direct_io,
    )
