"""The numba copies that gather a batch: a ``memcpy`` per record, run without the GIL.

:func:`take_rows` copies fixed-width rows of a mapped column into their places in a batch,
:func:`gather_rows` ragged records' value rows, and :func:`copy_via` byte ranges of mapped files whose
bytes were fetched into memory elsewhere (a read-once epoch's runs, :mod:`.stream`): each range is
looked up in a table of fetched segments and copied from where that segment was received.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from ...format.checksums import memcpy_at

__all__ = ["copy_via", "gather_rows", "gather_rows_numpy", "take_rows"]


@numba.njit(cache=True, nogil=True)
def gather_rows(  # pragma: no cover - numba
    data: Any, offsets: Any, rows: Any, out: Any, out_starts: Any, stride: int
) -> None:
    """Copy ragged records ``rows`` (as bytes, ``stride`` bytes per row) to ``out`` at ``out_starts``
    (the offsets checked by the caller): one ``memcpy`` a record, 1.7x the speed of a slice copy."""
    src = data.ctypes.data
    dst = out.ctypes.data
    for k in range(rows.shape[0]):
        r = rows[k]
        a = offsets[r] * stride
        n = offsets[r + 1] * stride - a
        if n > 0:
            memcpy_at(dst + out_starts[k], src + a, n)  # type: ignore[call-arg]


def gather_rows_numpy(data: Any, offsets: Any, rows: Any, out: Any, out_starts: Any, stride: int) -> None:
    """:func:`gather_rows` as slice copies: for a first batch that must not wait for numba's start-up
    (:mod:`seqstore._numba_start`)."""
    for k, r in enumerate(rows.tolist()):
        a, b = int(offsets[r]) * stride, int(offsets[r + 1]) * stride
        at = int(out_starts[k])
        out[at : at + b - a] = data[a:b]


@numba.njit(cache=True, nogil=True)
def take_rows(src: int, rows: Any, dst: int, pos: Any, width: int) -> None:  # pragma: no cover - numba
    """Copy rows ``rows`` of ``width`` bytes each of the rows at address ``src`` to rows ``pos`` of the
    rows at ``dst`` (both C-contiguous; every index in range: the caller checked them). One ``memcpy``
    a row into its place: as fast as ``np.take`` into a new array, where ``np.take`` followed by
    placing the rows (``res[pos] = ...``) costs 1.5x and ``np.take(..., out=)`` 2x (2 KiB rows)."""
    for k in range(rows.shape[0]):
        memcpy_at(dst + pos[k] * width, src + rows[k] * width, width)  # type: ignore[call-arg]


@numba.njit(cache=True, nogil=True)
def copy_via(  # pragma: no cover - numba
    src: Any, n: Any, dst: Any, seg_s: Any, seg_e: Any, seg_at: Any
) -> int:
    """Copy ``n[k]`` bytes of address ``src[k]`` (of a mapped file) to address ``dst[k]`` for each
    ``k``, reading them where they were received: segment ``j`` holds the bytes of addresses
    ``[seg_s[j], seg_e[j])`` at address ``seg_at[j]`` (``seg_s`` ascending; segments may overlap).
    Returns -1, or the first ``k`` no segment holds whole (nothing after it is copied)."""
    for k in range(src.shape[0]):
        a = src[k]
        m = n[k]
        if m <= 0:
            continue
        j = np.searchsorted(seg_s, a, side="right") - 1
        while j >= 0 and a + m > seg_e[j]:  # an earlier, longer segment may hold it
            j -= 1
        if j < 0:
            return k
        memcpy_at(dst[k], seg_at[j] + (a - seg_s[j]), m)  # type: ignore[call-arg]
    return -1
