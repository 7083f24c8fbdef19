"""Read-only file mappings that hold no file descriptor.

Python's ``mmap.mmap`` keeps a duplicate of the file's descriptor for the life of the mapping, so a
store with thousands of mapped shard files runs out of descriptors (``ulimit -n`` is often 1024).
:func:`map_file` maps through libc's ``mmap``, closes the descriptor at once, and returns a ``uint8``
array whose base object unmaps the region when the last array (or view) using it is collected.

Every mapping starts advised ``MADV_RANDOM``: a cold fault reads that page only, not a read-around
window of up to megabytes; paths that know what they will touch ask for it (:mod:`seqstore.io.advice`).
Where libc's ``mmap`` cannot be called (not Linux), ``mmap.mmap`` is used and each mapping holds a
descriptor; :func:`holds_descriptors` says which, so callers can bound how many they keep.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
import weakref
from typing import Any

import numpy as np

__all__ = [
    "PAGE", "MADV_NORMAL", "MADV_RANDOM", "MADV_SEQUENTIAL", "MADV_WILLNEED", "map_file", "map_fd",
    "holds_descriptors", "address", "libc", "allocate", "allocate_whole", "run_pages",
]

PAGE = mmap.PAGESIZE
MADV_NORMAL = getattr(mmap, "MADV_NORMAL", 0)
MADV_RANDOM = getattr(mmap, "MADV_RANDOM", 1)
MADV_SEQUENTIAL = getattr(mmap, "MADV_SEQUENTIAL", 2)
MADV_WILLNEED = getattr(mmap, "MADV_WILLNEED", 3)
_PROT_READ = 0x1
_MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value


def _load_libc() -> Any:
    """libc with mmap/munmap/madvise/mincore prototypes, or None where they cannot be used."""
    if not sys.platform.startswith("linux") or os.environ.get("SEQSTORE_PY_MMAP"):
        return None
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
        lib.mmap.restype = ctypes.c_void_p
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.munmap.restype = ctypes.c_int
        # addresses as size_t: the same register on every Linux ABI, and plain ints from numpy arrays
        lib.madvise.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
        lib.madvise.restype = ctypes.c_int
        lib.mincore.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
        lib.mincore.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


libc = _load_libc()


def holds_descriptors() -> bool:
    """True where each mapping keeps a file descriptor open (the ``mmap.mmap`` fallback)."""
    return libc is None


class _Mapping:
    """Owner of one read-only shared mapping; numpy arrays made from it keep it alive."""

    __slots__ = ("addr", "size", "__weakref__")

    def __init__(self, addr: int, size: int) -> None:
        self.addr = addr
        self.size = size
        # not at interpreter exit: a view may still be read then (atexit handlers, daemon threads), and
        # the kernel unmaps everything when the process ends anyway
        weakref.finalize(self, libc.munmap, addr, size).atexit = False

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return {"data": (self.addr, True), "shape": (self.size,), "typestr": "|u1", "version": 3}


def map_file(path: str | os.PathLike[str], size: int, *, advice: int = MADV_RANDOM) -> np.ndarray[Any, Any]:
    """Map the first ``size`` bytes (> 0) of ``path`` read-only; a ``uint8`` array of ``size`` bytes.

    No descriptor stays open where libc is usable. Raises ``OSError`` naming the file (``ENOMEM``
    when the process has too many mappings: ``vm.max_map_count``).
    """
    if size <= 0:
        raise ValueError(f"{path}: cannot map {size} bytes")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        return map_fd(fd, size, advice=advice, name=path)
    finally:
        os.close(fd)


def map_fd(
    fd: int, size: int, *, advice: int = MADV_RANDOM, name: str | os.PathLike[str] = "<fd>"
) -> np.ndarray[Any, Any]:
    """:func:`map_file` of an open descriptor (which the caller keeps or closes: the mapping does not
    need it)."""
    if size <= 0:
        raise ValueError(f"{name}: cannot map {size} bytes")
    if libc is None:
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        if hasattr(mm, "madvise"):
            mm.madvise(advice)
        return np.frombuffer(mm, dtype=np.uint8, count=size)
    addr = libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno() or errno.ENOMEM
        raise OSError(err, os.strerror(err), str(name))
    owner = _Mapping(int(addr), size)
    if advice != MADV_NORMAL:
        libc.madvise(owner.addr, size, advice)
    return np.asarray(owner)


def address(arr: np.ndarray[Any, Any]) -> int:
    """Address of ``arr``'s first byte."""
    return int(arr.__array_interface__["data"][0])


def allocate(fd: int, offset: int, length: int) -> None:
    """Give bytes ``[offset, offset + length)`` of file ``fd`` their disk space now (``posix_fallocate``):
    a write through a mapping into a hole of a full file system is a SIGBUS, where this is an OSError
    (ENOSPC). A file system without it (EOPNOTSUPP, EINVAL) is left as it is."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


def allocate_whole(fd: int, length: int, what: str, filename: str) -> None:
    """:func:`allocate` of bytes ``[0, length)`` of a file about to be written through a mapping; a full
    disk is an OSError (its errno kept) saying ``what`` could not be done, naming ``filename``."""
    try:
        allocate(fd, 0, length)
    except OSError as exc:
        raise OSError(exc.errno, f"{exc.strerror}: {what}", filename) from exc


def run_pages(starts: np.ndarray[Any, Any], ends: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The page numbers under byte runs ``[starts[i], ends[i])``, run after run (one array, no loop)."""
    p0 = starts // PAGE
    counts = -(-ends // PAGE) - p0
    return np.repeat(p0 - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
