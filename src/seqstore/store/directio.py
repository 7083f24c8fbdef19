"""Direct I/O (``O_DIRECT``) for the large sequential writes of fixed-size columns.

A buffered ``write`` copies every byte into the page cache, and on a typical VM that copy (plus the
later writeback) costs more CPU than everything else a logger does; ``O_DIRECT`` hands the caller's
memory to the device instead. It requires the memory address, the file offset and the length to be
multiples of the device's block size; :data:`ALIGN` (one page) satisfies every common device. Files
written this way get a one-page ``.npy`` header (:data:`~seqstore.format.npy.PAGE_HEADER_BYTES`), so
their data starts aligned. Filesystems without ``O_DIRECT`` (tmpfs, some network filesystems) fall
back to buffered writes; the bytes on disk are the same either way.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
from typing import Any

import numpy as np

__all__ = ["ALIGN", "O_CLOEXEC", "aligned_empty", "open_direct", "is_aligned", "pwrite_all", "write_file"]

log = logging.getLogger(__name__)

ALIGN = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
    """An uninitialised array whose memory starts on a page boundary (anonymous ``mmap``).

    Large arrays are advised as transparent huge pages where the kernel offers them on request, which
    makes the first touch of a fresh buffer several times cheaper than 4 KiB page faults.
    """
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    mm = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if nbytes >= 1 << 21 and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # kernels without THP: plain pages
            mm.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(mm, dtype=dt, count=nbytes // dt.itemsize).reshape(shape)


def is_aligned(arr: np.ndarray[Any, Any]) -> bool:
    """Whether ``arr``'s memory starts on an :data:`ALIGN` boundary."""
    return int(arr.__array_interface__["data"][0]) % ALIGN == 0


def open_direct(path: str | os.PathLike[str]) -> int | None:
    """A write-only ``O_DIRECT`` descriptor on the existing file ``path``, or None where the platform or
    filesystem has no direct I/O."""
    if not _O_DIRECT:
        return None
    try:
        return os.open(path, os.O_WRONLY | _O_DIRECT)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            log.debug("%s: no direct I/O on this filesystem (%s); writing through the page cache", path, exc)
            return None
        raise


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``os.pwrite`` may write less than asked)."""
    done = 0
    while done < len(data):
        n = os.pwrite(fd, data[done:], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"pwrite wrote {n} bytes at offset {offset + done}")
        done += n


def write_file(path: str | os.PathLike[str], raw: bytes) -> None:
    """Create (or truncate) ``path`` holding ``raw`` and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o644)
    try:
        pwrite_all(fd, memoryview(raw), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
