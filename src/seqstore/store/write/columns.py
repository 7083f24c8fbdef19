"""Building a shard's files: one growing ``.npy`` file per column, written with positioned writes.

:class:`ColumnFile` is one file of the shard a writer is building (provisional header, sequential
appends, a running CRC-32, optional ``O_DIRECT`` for large aligned appends); :func:`coalesce` joins
small buffered pieces into large writes. store/write/shard_files.py drives them for a Writer.
"""

from __future__ import annotations

import errno
import logging
import os
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ...format.manifest import FileInfo
from ...format.npy import HEADER_BYTES, PAGE_HEADER_BYTES, encode_header
from ..directio import ALIGN, O_CLOEXEC, aligned_empty, is_aligned, open_direct, pwrite_all
from ..directio import pwrite_all as _write_at  # the buffered writes (pwrite_all: the direct ones)

log = logging.getLogger(__name__)


# A batch piece at least this large is written straight from the caller's arrays (no buffer copy).
DIRECT_BYTES = 4 << 20
# With direct_io, an append of a fixed-size column at least this large bypasses the page cache.
DIRECT_IO_BYTES = 1 << 20
# Scratch buffers of direct runs that need a copy are whole multiples of this.
SCRATCH_STEP = 1 << 20
_DONE: Future[int] = Future()  # what a write returns when nothing of the caller's memory is read later
_DONE.set_result(0)


def stage(
    parts: list[np.ndarray[Any, Any]],
    staging: dict[str, tuple[np.ndarray[Any, Any], int, np.ndarray[Any, Any], int]],
    spare: dict[str, np.ndarray[Any, Any]],
    name: str,
    caller: set[int],
    direct_io: bool,
) -> None:
    """Move the piece just buffered (the last of ``parts``, unit ``name``'s buffer) out of the caller's
    memory with one copy into a staging array of about DIRECT_BYTES (``staging[name]``; reused across
    flushes through ``spare``). Consecutive pieces fill the same staging array, so a flush writes a few
    large runs and copies nothing again."""
    piece = parts.pop()
    if piece.base is None and id(piece) not in caller:
        parts.append(piece)  # converted by the writer: already private
        staging.pop(name, None)
        return
    rows = piece.shape[0]
    if rows == 0 or piece.nbytes == 0:
        parts.append(piece.copy())  # nothing to stage
        return
    staged = staging.get(name)
    if staged is not None and parts and parts[-1] is staged[2] and staged[1] + rows <= staged[0].shape[0]:
        arr, used, _, first = staged
        arr[used : used + rows] = piece
        view = arr[first : used + rows]
        parts[-1] = view
        staging[name] = (arr, used + rows, view, first)
        return
    row_bytes = max(piece.nbytes // rows, 1)
    capacity = max(rows, DIRECT_BYTES // row_bytes)
    reuse = spare.pop(name, None)
    if reuse is not None and reuse.shape[0] >= capacity and reuse.dtype == piece.dtype:
        arr = reuse
    else:
        shape = (capacity, *piece.shape[1:])
        arr = aligned_empty(shape, piece.dtype) if direct_io else np.empty(shape, dtype=piece.dtype)
    arr[:rows] = piece
    view = arr[:rows]
    parts.append(view)
    staging[name] = (arr, rows, view, 0)


def row_starts(lengths: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """(B+1,) first row of each record of a ragged batch column, plus the total."""
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    return starts


class BatchBytes:
    """The bytes of a batch's records as the writer counts them (its columns' data), to cut the batch
    into pieces that end a shard at ``shard_bytes``. ``prepared``: each unit's (values, lengths or None);
    ``starts``: each unit's :func:`row_starts` (None for a fixed one). O(1) for fixed columns; one
    (B+1,) cumulative array when there are ragged ones."""

    def __init__(self, prepared: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]],
                 starts: list[np.ndarray[Any, Any] | None], batch: int) -> None:
        self.per = sum(v.nbytes // batch for (v, _), rows in zip(prepared, starts) if rows is None)
        self.cum: np.ndarray[Any, Any] | None = None
        for (v, _), rows in zip(prepared, starts):
            if rows is not None:
                row = v.dtype.itemsize * int(np.prod(v.shape[1:], dtype=np.int64))
                self.cum = rows * row if self.cum is None else self.cum + rows * row
        if self.cum is not None and self.per:
            self.cum = self.cum + np.arange(batch + 1, dtype=np.int64) * self.per

    def at(self, k: int) -> int:
        """Bytes of the batch's first ``k`` records."""
        return self.per * k if self.cum is None else int(self.cum[k])

    def reach(self, start: int, room: int, stop: int) -> int:
        """The end (at most ``stop``, at least ``start + 1``) of the piece from ``start`` whose last record
        is the one that brings its bytes to ``room``."""
        if self.cum is None:
            end = stop if self.per == 0 else start + -(-max(room, 1) // self.per)
        else:
            end = int(np.searchsorted(self.cum, self.cum[start] + max(room, 1), side="left"))
        return min(stop, max(start + 1, end))


def caller_ids(values: Any) -> set[int]:
    """ids of the caller's objects in batch columns (arrays, list items, a pair's values)."""
    out: set[int] = set()
    for v in values:
        out.add(id(v))
        if isinstance(v, (list, tuple)):
            out.update(id(x) for x in v)
    return out


def coalesce(
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


class ColumnFile:
    """One growing ``.npy`` file of a shard: provisional header, sequential appends, running CRC-32.

    Every write is a positioned ``pwrite`` on an unbuffered descriptor at the file's tracked end, so
    there is no hidden buffer a forked child could flush into the parent's file, and no file offset
    shared with one. ``direct``: the data goes through a second, ``O_DIRECT`` descriptor
    (store/directio.py) in page-aligned runs of at least :data:`DIRECT_IO_BYTES`, and the header is one
    page, so the data starts aligned. Bytes after the last page boundary written (an append's unaligned
    end, or small appends) are held back (less than one run) and written with the next run, or through
    the page cache by :meth:`finish`. An aligned append from page-aligned memory is written from that
    memory; otherwise the held bytes and the append are copied into one aligned buffer first (a memory
    copy, far cheaper than the page cache's).
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
        io_pool: ThreadPoolExecutor | None = None,
    ):
        self.path = path
        self.dtype = dtype
        self.inner = inner
        self.rows = 0
        self._pool = crc_pool
        self._io = io_pool  # runs direct writes of copied runs in the background (None: written at once)
        self._crc: Future[int] | None = None
        self._header = PAGE_HEADER_BYTES if direct or page_header else HEADER_BYTES
        self._direct: int | None = None
        self._held = bytearray()  # appended bytes not yet written (direct: after the last aligned run)
        # two aligned buffers for runs that need a copy: the one being filled, the one being written
        self._scratch: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None] | None = None
        self._inflight: tuple[Future[None], Future[int], memoryview, int] | None = None  # write, CRC, run, offset
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o644)
        try:
            _write_at(self._fd, memoryview(encode_header(dtype, (0, *inner), self._header)), 0)
            self._pos = self._header  # where the next unwritten byte goes (held bytes start here)
            if direct:
                self._direct = open_direct(path)
        except BaseException:
            self.abort()
            raise

    def write(self, arr: np.ndarray[Any, Any]) -> Future[int]:
        """Append rows (``arr`` has this file's dtype and inner shape and is C-contiguous). The returned
        future is done once nothing reads ``arr`` any more (its checksum is taken)."""
        assert self._fd is not None
        buf = memoryview(arr.reshape(-1).view(np.uint8).data) if arr.size else memoryview(b"")
        self.rows += arr.shape[0] if arr.ndim else 1
        if self._direct is not None:
            done = self._write_direct(buf, is_aligned(arr))
            if done is not None:
                return done
        self._flush_held()  # bytes held back before direct I/O was refused
        crc = self._checksum(buf)
        _write_at(self._fd, buf, self._pos)
        self._pos += len(buf)
        return crc

    def _checksum(self, data: memoryview) -> Future[int]:
        """Extend the running CRC-32 with ``data`` (the next bytes of the file, in order) on the pool."""
        prev = self._crc

        def chained() -> int:
            return zlib.crc32(data, prev.result() if prev is not None else 0)

        self._crc = self._pool.submit(chained)
        return self._crc

    def _write_direct(self, buf: memoryview, aligned: bool) -> Future[int] | None:
        """Append ``buf`` through the direct descriptor, holding back what follows the last page boundary
        written. Returns a future done once ``buf`` is no longer read (see :meth:`write`), or None when
        direct I/O turned out not to work here (then ``buf`` is not written and nothing is held back:
        the caller writes it through the page cache).

        A run straight from the caller's page-aligned memory is written before returning. Other runs
        (held bytes and the append) are copied into one of two aligned buffers and, with an
        ``io_pool``, written by its thread while the caller goes on (one such write in flight; its error
        is raised by the next write or :meth:`finish`). The checksum covers the bytes written, in order."""
        assert self._direct is not None and self._fd is not None
        held = len(self._held)
        total = held + len(buf)
        if total < DIRECT_IO_BYTES:
            self._held += buf
            return _DONE
        body = total - total % ALIGN
        if not self._settle():  # the previous run's write (its buffer is the other one)
            return None
        if not held and aligned:  # straight from the caller's memory
            run: memoryview = buf[:body]
        else:
            spare = self._scratch[1] if self._scratch else None
            if spare is None or spare.nbytes < body:  # a quarter more, in MiB: a few sizes in a file's life
                size = -(-(body + body // 4) // SCRATCH_STEP) * SCRATCH_STEP
                spare = aligned_empty((max(size, 2 * DIRECT_IO_BYTES),), np.uint8)
            out = memoryview(spare.data)
            out[:held] = self._held
            out[held:body] = buf[: body - held]
            self._scratch = (spare, self._scratch[0] if self._scratch else None)
            run = out[:body]
        at = self._pos
        crc = self._checksum(run)
        self._pos += body
        self._held = bytearray(buf[body - held :])  # (a copied run holds the old held bytes already)
        if run.obj is not buf.obj and self._io is not None:  # a copy: written behind the caller
            self._inflight = (self._io.submit(pwrite_all, self._direct, run, at), crc, run, at)
            return _DONE
        try:
            pwrite_all(self._direct, run, at)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            _write_at(self._fd, run, at)  # its checksum is taken already
            self._refused(exc)
        return crc

    def _settle(self) -> bool:
        """Wait for the direct write in flight (and the checksum of its run), if any. False when it was
        refused with EINVAL: its run and the held bytes are then written through the page cache, and
        direct I/O is off for this file."""
        if self._inflight is None:
            return True
        fut, crc, run, at = self._inflight
        self._inflight = None
        try:
            fut.result()
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            assert self._fd is not None
            _write_at(self._fd, run, at)
            self._refused(exc)
            return False
        finally:
            crc.result()  # its buffer is reused next
        return True

    def _refused(self, exc: OSError) -> None:
        """The device wants a larger alignment than ALIGN: the page cache from now on."""
        log.debug("%s: direct write refused (%s); writing through the page cache", self.path, exc)
        self._close("_direct")
        self._flush_held()

    def _flush_held(self) -> None:
        """Write the held-back bytes through the page cache."""
        assert self._fd is not None
        if self._held:
            data, self._held = memoryview(self._held), bytearray()
            self._checksum(data)
            _write_at(self._fd, data, self._pos)
            self._pos += len(data)

    def _close(self, attr: str) -> None:
        """Close the descriptor ``self.<attr>`` (``_fd``, ``_direct``) if open; it is None after."""
        fd = getattr(self, attr)
        if fd is not None:
            setattr(self, attr, None)
            os.close(fd)

    def finish(self, *, sync: bool = True) -> FileInfo:
        """Write the final header, fsync (unless ``sync`` is False: a scratch file), close; return size
        and CRC."""
        assert self._fd is not None
        try:
            self._settle()
            self._flush_held()
            _write_at(self._fd, memoryview(encode_header(self.dtype, (self.rows, *self.inner), self._header)), 0)
            if sync:
                os.fsync(self._fd)
        finally:
            self.abort()  # closes both descriptors
        return FileInfo(self._pos, self._crc.result() if self._crc is not None else 0)

    def abort(self) -> None:
        """Close the descriptors (idempotent, never raises: the file is being given up or is done), once
        no write is in flight on them."""
        if self._inflight is not None:
            fut, self._inflight = self._inflight[0], None
            try:
                fut.result()
            except OSError as exc:
                log.debug("%s: direct write failed while giving the file up (%r)", self.path, exc)
        for attr in ("_direct", "_fd"):
            try:
                self._close(attr)
            except OSError as exc:
                log.debug("%s: close failed (%r)", self.path, exc)
