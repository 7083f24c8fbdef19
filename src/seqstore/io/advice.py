"""Read-ahead for exactly the bytes a known access will touch, and a cheap residency probe.

A page fault reads one page and waits for it: a gather of B cold records through a mapping runs at queue
depth 1. :func:`willneed` turns the byte ranges the gather is about to touch into merged page runs and
asks the kernel to start reading them now (``madvise(MADV_WILLNEED)``: asynchronous, exactly the pages
asked for), so the disk sees B reads in flight at once; on pages in memory it costs a page-cache lookup.
:func:`any_cold` samples a few ranges with ``mincore`` so that a batch entirely in memory skips the
requests. For files the process may not write, ``mincore`` reports only pages this process has mapped,
so the probe errs toward "cold" (a warm batch then pays the requests, never extra I/O).

Addresses are absolute addresses in this process; all functions are no-ops where libc's ``madvise`` is
not available.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numba
import numpy as np

from .mapping import MADV_WILLNEED, PAGE, libc

__all__ = ["page_runs", "willneed", "any_cold", "willneed_span", "request_bytes", "REQUEST_BYTES"]


@numba.njit(cache=True, nogil=True)
def _split(rs: Any, re: Any, most: int) -> tuple[Any, Any]:  # pragma: no cover - numba
    count = 0
    for i in range(rs.shape[0]):
        count += (re[i] - rs[i] + most - 1) // most
    out_s = np.empty(count, np.int64)
    out_e = np.empty(count, np.int64)
    j = 0
    for i in range(rs.shape[0]):
        a = rs[i]
        while a < re[i]:
            out_s[j] = a
            a = min(a + most, re[i])
            out_e[j] = a
            j += 1
    return out_s, out_e


@numba.njit(cache=True, nogil=True)
def _page_runs(starts: Any, ends: Any, page: int, gap: int) -> tuple[Any, Any]:  # pragma: no cover - numba
    n = starts.shape[0]
    mask = page - 1
    s = np.empty(n, np.int64)
    e = np.empty(n, np.int64)
    m = 0
    for i in range(n):
        if ends[i] > starts[i]:
            s[m] = starts[i] & ~mask
            e[m] = (ends[i] + mask) & ~mask
            m += 1
    s = s[:m]
    e = e[:m]
    order = np.argsort(s)
    rs = np.empty(m, np.int64)
    re = np.empty(m, np.int64)
    k = -1
    for j in range(m):
        i = order[j]
        if k >= 0 and s[i] <= re[k] + gap:
            if e[i] > re[k]:
                re[k] = e[i]
        else:
            k += 1
            rs[k] = s[i]
            re[k] = e[i]
    return rs[: k + 1], re[: k + 1]


def page_runs(
    starts: Any, ends: Any, *, gap: int = 0, most: int | None = None
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The page runs under byte ranges ``[starts[i], ends[i])``: page aligned, sorted, and merged where
    they overlap, touch, or lie at most ``gap`` bytes apart; runs longer than ``most`` bytes (a
    multiple of the page) are cut into pieces of ``most``. Empty ranges are dropped."""
    s = np.ascontiguousarray(starts, dtype=np.int64).reshape(-1)
    e = np.ascontiguousarray(ends, dtype=np.int64).reshape(-1)
    if s.shape != e.shape:
        raise ValueError(f"starts and ends differ in length: {s.shape} vs {e.shape}")
    runs: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] = _page_runs(s, e, PAGE, int(gap))
    if most is not None:
        if most < PAGE or most % PAGE:
            raise ValueError(f"most must be a positive multiple of the page ({PAGE}), got {most}")
        if len(runs[0]) and int((runs[1] - runs[0]).max()) > most:
            runs = _split(runs[0], runs[1], int(most))
    return runs


#: Bytes per ``MADV_WILLNEED`` request where the device's own limit is unknown. The kernel reads at
#: most max(read_ahead_kb, max_sectors_kb) of one request and silently drops the rest, so long runs
#: are cut to at most that (:func:`request_bytes`); 128 KiB is Linux's default ``read_ahead_kb``.
#: Consecutive requests still reach the disk together (issued back to back; adjacent reads merge).
REQUEST_BYTES = 128 << 10
_MOST_REQUEST = 8 << 20
_by_device: dict[int, int] = {}


def _sysfs_kb(dev: int, name: str) -> int:
    base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    for queue in (f"{base}/queue/{name}", f"{base}/../queue/{name}"):  # a partition: its disk's queue
        try:
            with open(queue) as f:
                return int(f.read())
        except (OSError, ValueError):
            continue
    return 0


def request_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes one read-ahead request may ask for on the device holding ``path``: the larger of its
    ``read_ahead_kb`` and ``max_sectors_kb`` (what the kernel honours), between 128 KiB and 8 MiB;
    128 KiB where the device is not a local block device (tmpfs, network filesystems)."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return REQUEST_BYTES
    got = _by_device.get(dev)
    if got is None:
        kb = max(_sysfs_kb(dev, "read_ahead_kb"), _sysfs_kb(dev, "max_sectors_kb"))
        got = min(_MOST_REQUEST, max(REQUEST_BYTES, (kb << 10) // PAGE * PAGE))
        _by_device[dev] = got
    return got


def willneed(starts: Any, ends: Any, *, gap: int = 0, most: int = REQUEST_BYTES) -> int:
    """Start reading the pages under byte ranges ``[starts[i], ends[i])`` (addresses inside live
    mappings), asynchronously; returns the number of requests issued (merged page runs, cut to
    ``most`` bytes: see :func:`request_bytes`)."""
    if libc is None or len(starts) == 0:
        return 0
    rs, re = page_runs(starts, ends, gap=gap, most=most)
    adv = libc.madvise
    for a, b in zip(rs.tolist(), re.tolist()):
        adv(a, b - a, MADV_WILLNEED)
    return len(rs)


def willneed_span(start: int, stop: int, *, most: int = REQUEST_BYTES) -> int:
    """Start reading the pages under one byte range ``[start, stop)`` (a scan's next stretch); the
    number of requests issued."""
    if libc is None or stop <= start:
        return 0
    return willneed(np.array([start], np.int64), np.array([stop], np.int64), most=most)


def any_cold(starts: Any, *, sample: int = 16) -> bool:
    """Whether any of up to ``sample`` evenly spaced addresses of ``starts`` lies on a page that is not
    in memory (``mincore``). False where it cannot tell (no libc, unmapped address)."""
    n = len(starts)
    if libc is None or n == 0:
        return False
    step = max(1, n // sample)
    mincore = libc.mincore
    vec = ctypes.c_ubyte()
    ref = ctypes.byref(vec)
    for a in np.asarray(starts[::step][:sample], dtype=np.int64).tolist():
        if mincore(a & ~(PAGE - 1), PAGE, ref) == 0 and not vec.value & 1:
            return True
    return False
