"""The global stable argsort by length behind ``sorted``, ``sorted_reverse`` and ``sort_bin_shuffle``.

:func:`sort_index` computes ``numpy.argsort(lengths, kind="stable")`` as an LSD radix sort over
order-preserving uint64 keys (sign bit flipped for signed ints, the IEEE trick for floats, minus the
smallest key): one counting-sort pass when the keys span fewer than 2**20 values (the usual case:
lengths are frame or token counts), otherwise ``ceil(bits / 20)`` passes of at most 20-bit digits.
Each pass makes two sweeps over the data in chunks of 2**18 (histogram with numpy, stable placement
with a numba kernel) and needs ``2**digit_bits`` int64 counters (<= 8 MiB). With a cache path, the
output (and, with several passes, one scratch array) is written straight into ``.npy`` files, so
anonymous memory stays bounded whatever N is; the finished file is moved into place atomically and later
calls (any process) memory-map it instead of sorting again.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..io.mapping import allocate_whole
from ..io.nodecache import charge, temporary, used
from ..io.tempfiles import remove_stale
from . import _sort_kernels as S
from ._arrays import ArrayRef, PathLike

__all__ = ["sort_index", "lengths_kind"]

_log = logging.getLogger(__name__)

_MAX_DIGIT_BITS = 20
_CHUNK = 1 << 18
_SPOT_CHECKS = 4096
_SIGN = np.uint64(1 << 63)


def lengths_kind(array: np.ndarray) -> int:
    """Code of a lengths dtype: 0 signed int, 1 unsigned int, 2 float; ValueError otherwise."""
    code = {"i": 0, "u": 1, "f": 2}.get(array.dtype.kind)
    if code is None:
        raise ValueError(f"lengths must have an integer or float dtype, got {array.dtype}")
    return code


def sort_keys(values: np.ndarray) -> npt.NDArray[np.uint64]:
    """Order-preserving uint64 keys of a chunk of lengths (``-0.0`` ties with ``0.0``). O(chunk)."""
    kind = lengths_kind(values)
    if kind == 0:
        return values.astype(np.int64).view(np.uint64) ^ _SIGN
    if kind == 1:
        return values.astype(np.uint64)
    bits = (values.astype(np.float64) + 0.0).view(np.uint64)
    return np.where(bits >= _SIGN, ~bits, bits | _SIGN)


def _chunks(n: int) -> Iterator[tuple[int, int]]:
    for start in range(0, n, _CHUNK):
        yield start, min(start + _CHUNK, n)


def _usable_cache(path: Path, lengths: np.ndarray) -> np.ndarray | None:
    """The cached index at ``path`` if it has the right shape and passes a sampled sortedness check."""
    try:
        idx = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        _log.warning("sort index cache %s is unreadable (%s); recomputing it", path, exc)
        return None
    n = lengths.shape[0]
    if idx.ndim != 1 or idx.shape[0] != n or idx.dtype.kind not in "iu":
        _log.warning("sort index cache %s has shape %s dtype %s, expected (%d,) int; recomputing it", path, idx.shape,
                     idx.dtype, n)
        return None
    if n:
        probe = np.unique(np.linspace(0, n - 1, min(n, _SPOT_CHECKS)).astype(np.int64))
        rows = np.asarray(idx[probe], dtype=np.int64)
        ok = rows.min() >= 0 and rows.max() < n
        if ok:
            keys = sort_keys(np.asarray(lengths[rows]))
            ok = bool(np.all(keys[1:] >= keys[:-1]))
        if not ok:
            _log.warning("sort index cache %s does not sort these lengths; recomputing it", path)
            return None
    return idx  # type: ignore[no-any-return]


def sort_index(lengths: npt.ArrayLike | PathLike | ArrayRef, *,
               cache: PathLike | None = None) -> npt.NDArray[np.integer[Any]]:
    """Stable ascending argsort of ``lengths`` (ties in ascending index order), equal to
    ``numpy.argsort(lengths, kind="stable")``.

    ``lengths``: 1-D integer or float array-like (NaN is rejected), a memory-mapped array, a ``.npy``
    path, or a lazy object with ``len``, ``dtype`` and ``take`` (read in chunks, never held whole).
    ``cache``: path of a ``.npy`` file; if it exists and matches (shape and a sampled sortedness
    check), it is memory-mapped and returned, else the index is computed into it and then mapped. Use
    one cache path per lengths array. Returns int32 when ``N < 2**31`` else int64, shape ``(N,)``.

    Complexity: O(N * passes) time (one pass for lengths spanning < 2**20 values); extra anonymous
    memory O(2**20 counters + 2**18 chunk) with a cache path, plus the O(N) result (and scratch) without.
    """
    ref = lengths if isinstance(lengths, ArrayRef) else ArrayRef(lengths, "lengths")
    arr = ref.indexable()  # lazy lengths are gathered chunk by chunk, never materialised
    lengths_kind(np.empty(0, dtype=arr.dtype))
    n = int(arr.shape[0])
    path = None if cache is None else Path(os.fspath(cache))
    if path is not None and not path.parent.is_dir():  # (else: an error naming a temporary file beside it)
        raise FileNotFoundError(f"sort cache {path}: its directory {path.parent} does not exist (expected the path of "
                                "a .npy file in an existing directory)")
    if path is not None:  # (the temporaries of a sort killed part way, as large as the index; also where
        remove_stale(path)  # another process wrote the cache meanwhile)
    if path is not None and path.exists():
        found = _usable_cache(path, arr)
        if found is not None:
            used(path)  # (in a node cache: recently used, not the first to evict)
            return found
    dtype = np.dtype(np.int32) if n <= np.iinfo(np.int32).max else np.dtype(np.int64)
    if n == 0:
        return _finish(np.empty(0, dtype=dtype), path)

    lo, hi = ~np.uint64(0), np.uint64(0)
    for s, e in _chunks(n):
        chunk = np.asarray(arr[s:e])
        if chunk.dtype.kind == "f" and np.isnan(chunk).any():
            raise ValueError(f"lengths contain NaN (first near index {s}); a sort order is undefined")
        keys = sort_keys(chunk)
        lo, hi = min(lo, keys.min()), max(hi, keys.max())
    bits = int(hi - lo).bit_length()
    passes = max(1, math.ceil(bits / _MAX_DIGIT_BITS))
    digit = math.ceil(bits / passes)

    tmp_files: list[Path] = []
    tmp_fds: list[int] = []

    def new_buffer() -> np.ndarray:
        if path is None:
            return np.empty(n, dtype=dtype)
        # (held open until the end: in a node cache's derived/, evictions delete only a dead process's)
        fd, tmp = temporary(path)
        tmp_fds.append(fd)
        tmp_files.append(Path(tmp))
        charge(path, n * np.dtype(dtype).itemsize + 4096)  # where a node cache's budget covers the directory
        buf = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(n,))
        size = os.fstat(fd).st_size  # its disk space now: a write into a hole of a full disk is a SIGBUS
        allocate_whole(fd, size, f"cannot write the sort index {path} ({size} bytes); free space under {path.parent}",
                       str(path))
        return buf

    try:
        out = new_buffer()
        scratch = new_buffer() if passes > 1 else out
        src: np.ndarray | None = None
        for i in range(passes):
            dst = (out, scratch)[(passes - 1 - i) % 2]
            _radix_pass(arr, src, lo, i * digit, digit, dst)
            src = dst
        if path is None:
            return out
        for buf in (out, scratch):
            if isinstance(buf, np.memmap):
                buf.flush()
        del out, scratch, src, dst
        os.replace(tmp_files[0], path)
        tmp_files.pop(0)
        return _finish(None, path)
    finally:
        for tmp in tmp_files:
            tmp.unlink(missing_ok=True)
        for fd in tmp_fds:
            os.close(fd)


def _digits(arr: np.ndarray, src: np.ndarray | None, s: int, e: int, lo: np.uint64, shift: int,
            digit: int) -> npt.NDArray[np.int64]:
    rows = np.asarray(arr[s:e]) if src is None else np.asarray(arr[np.asarray(src[s:e])])
    mask = np.uint64((1 << digit) - 1)
    return (((sort_keys(rows) - lo) >> np.uint64(shift)) & mask).astype(np.int64)


def _radix_pass(arr: np.ndarray, src: np.ndarray | None, lo: np.uint64, shift: int, digit: int,
                out: np.ndarray) -> None:
    """One stable counting-sort pass by the digit at ``shift``: order ``src`` (identity if None) -> ``out``."""
    n = arr.shape[0]
    counts = np.zeros(1 << digit, dtype=np.int64)
    for s, e in _chunks(n):
        counts += np.bincount(_digits(arr, src, s, e, lo, shift, digit), minlength=1 << digit)
    cursor = np.zeros_like(counts)
    np.cumsum(counts[:-1], out=cursor[1:])
    dummy = np.zeros(1, dtype=out.dtype)
    for s, e in _chunks(n):
        d = _digits(arr, src, s, e, lo, shift, digit)
        if src is None:
            S.place_digits(d, dummy, np.int64(s), False, cursor, out)
        else:
            S.place_digits(d, np.asarray(src[s:e]), np.int64(s), True, cursor, out)


def _finish(array: np.ndarray | None, path: Path | None) -> npt.NDArray[np.integer[Any]]:
    if path is None:
        assert array is not None
        return array
    if array is not None:
        fd, tmp = temporary(path)  # (a name no eviction takes for a cached array; held until renamed)
        try:
            charge(path, array.nbytes + 4096)
            with open(tmp, "wb") as f:
                np.save(f, array)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        finally:
            os.close(fd)
    return np.load(path, mmap_mode="r", allow_pickle=False)  # type: ignore[no-any-return]
