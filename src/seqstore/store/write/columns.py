"""Building a shard's files: one growing ``.npy`` file per column, written with positioned writes.

:class:`_ColumnFile` is one file of the shard a writer is building (provisional header, sequential
appends, a running CRC-32, optional ``O_DIRECT`` for large aligned appends); :func:`_coalesce` joins
small buffered pieces into large writes. store/write/writer.py's Writer drives them.
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
from ..directio import ALIGN, aligned_empty, is_aligned, open_direct, pwrite_all
from ..directio import pwrite_all as _write_at  # the buffered writes (pwrite_all: the direct ones)

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


def write_file(path: Path, raw: bytes) -> None:
    """Create ``path`` holding ``raw`` and fsync it (a shard's descriptor)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
    try:
        _write_at(fd, memoryview(raw), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
