"""numba kernels that sort: segments of an order by length (radix or merge), sort-by-bins with shuffled
ties, ``sorted_reverse`` from an ascending index and the counting-sort placement of the sort cache.

Like :mod:`seqstore.order._kernels` (the keyed permutation and bin arithmetic these kernels call),
everything here is integer arithmetic or a stable sort, so every machine computes the same orders.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, types
from numba.extending import overload

from ._kernels import ROUNDS, bin_start, child_key, perm_one, round_keys, split

_U = np.uint64
_ONE = np.uint64(1)
_ZERO = np.uint64(0)
_F16_BITS = np.dtype([("bits", np.uint16)])


def kernel_lengths(lengths: np.ndarray) -> np.ndarray:
    """``lengths`` as the kernels below read them: float16 (which numba cannot load) as a view of its
    bits that :func:`length_at` turns into order-preserving keys; other dtypes as they are. O(1)."""
    return lengths.view(_F16_BITS) if lengths.dtype == np.float16 else lengths


def length_at(lengths: np.ndarray, i: int) -> Any:  # pragma: no cover - numba uses the overload
    """``lengths[i]`` (of :func:`kernel_lengths`'s array), comparable with the others' values."""
    return lengths[i]


@overload(length_at)
def _length_at(lengths: Any, i: Any) -> Any:
    if isinstance(lengths.dtype, types.Record):  # float16 bits: x >= 0 is ordered by its bits, x < 0
        def key(lengths: Any, i: Any) -> Any:  # by minus its magnitude's bits (-0.0 ties with 0.0)
            b = np.int64(lengths[i].bits)
            return b if b < 0x8000 else 0x8000 - b
        return key

    def value(lengths: Any, i: Any) -> Any:  # (numba wants the annotations of _length_at)
        return lengths[i]
    return value


@njit(cache=True, nogil=True)
def place_digits(
    digits: np.ndarray, src: np.ndarray, first: np.int64, use_src: bool, cursor: np.ndarray, out: np.ndarray
) -> None:
    """Placement sweep of a counting sort over one chunk: entry ``i`` (source row ``src[i]``, or
    ``first + i`` when ``use_src`` is false) goes to ``out[cursor[digits[i]]]``, which then advances.
    Chunks must arrive in order; ``cursor`` starts as the exclusive prefix sum of the digit counts."""
    for i in range(digits.shape[0]):
        d = digits[i]
        out[cursor[d]] = src[i] if use_src else first + i
        cursor[d] += 1


def sort_segments(flat: np.ndarray, vals: np.ndarray, sizes: np.ndarray, descending: np.ndarray) -> None:
    """Stably sort each consecutive segment of ``flat`` (sizes ``sizes``) by ``vals`` (int64 or float64,
    aligned with ``flat``), ascending or, where ``descending[k]``, descending (stable sort of ``-vals``,
    RETURNN's laplace). In place; memory O(largest segment).

    Integer keys spanning fewer than 2**24 values (lengths nearly always) use an LSD radix sort with
    8-bit digits on ``v - min`` (or ``max - v`` when descending): O(m) per segment. Float keys and
    wider integer spans use a stable merge sort."""
    if vals.dtype.kind == "i":
        _radix_segments(flat, vals, sizes, descending)
    else:
        _merge_segments(flat, vals, sizes, descending)


@njit(cache=True, nogil=True)
def _merge_segment(flat: np.ndarray, vals: np.ndarray, pos: int, m: int, descending: bool) -> None:
    """Stable merge sort of ``flat[pos : pos + m]`` by ``vals`` (of ``-vals`` when ``descending``)."""
    if m < 2:
        return
    seg_vals = vals[pos : pos + m].copy()
    if descending:
        seg_vals = -seg_vals
    order = np.argsort(seg_vals, kind="mergesort")
    seg = flat[pos : pos + m].copy()
    for t in range(m):
        flat[pos + t] = seg[order[t]]


@njit(cache=True, nogil=True)
def _merge_segment_int(flat: np.ndarray, vals: np.ndarray, pos: int, m: int, descending: bool) -> None:
    """:func:`_merge_segment` of int64 ``vals``: descending as the stable ascending sort of the reversed
    segment, reversed (``-vals`` overflowed for -2**63, which then sorted as the longest)."""
    if not descending:
        _merge_segment(flat, vals, pos, m, False)
        return
    order = np.argsort(vals[pos : pos + m][::-1].copy(), kind="mergesort")
    seg = flat[pos : pos + m].copy()
    for t in range(m):
        flat[pos + t] = seg[m - 1 - order[m - 1 - t]]


@njit(cache=True, nogil=True)
def _merge_segments(flat: np.ndarray, vals: np.ndarray, sizes: np.ndarray, descending: np.ndarray) -> None:
    """Merge-sort variant of :func:`sort_segments`: every segment by :func:`_merge_segment`."""
    pos = 0
    for k in range(sizes.shape[0]):
        _merge_segment(flat, vals, pos, sizes[k], descending[k])
        pos += sizes[k]


@njit(cache=True, nogil=True)
def _radix_segments(flat: np.ndarray, vals: np.ndarray, sizes: np.ndarray, descending: np.ndarray) -> None:
    """Radix-sort the integer segments whose keys span < 2**24 values, merge-sort the others."""
    m_max = 0
    for k in range(sizes.shape[0]):
        m_max = max(m_max, sizes[k])
    keys = np.empty(m_max, dtype=np.int64)
    keys2 = np.empty(m_max, dtype=np.int64)
    items = np.empty(m_max, dtype=flat.dtype)
    items2 = np.empty(m_max, dtype=flat.dtype)
    count = np.empty(257, dtype=np.int64)
    pos = 0
    for k in range(sizes.shape[0]):
        m = sizes[k]
        if m < 2:
            pos += m
            continue
        lo = vals[pos]
        hi = vals[pos]
        for t in range(1, m):
            v = vals[pos + t]
            lo = min(lo, v)
            hi = max(hi, v)
        span = hi - lo
        if span >= (1 << 24) or span < 0:
            _merge_segment_int(flat, vals, pos, m, descending[k])
            pos += m
            continue
        for t in range(m):
            keys[t] = (hi - vals[pos + t]) if descending[k] else (vals[pos + t] - lo)
            items[t] = flat[pos + t]
        shift = 0
        src_k, dst_k, src_i, dst_i = keys, keys2, items, items2
        while True:
            for d in range(257):
                count[d] = 0
            for t in range(m):
                count[((src_k[t] >> shift) & 255) + 1] += 1
            for d in range(256):
                count[d + 1] += count[d]
            for t in range(m):
                d = (src_k[t] >> shift) & 255
                j = count[d]
                dst_k[j] = src_k[t]
                dst_i[j] = src_i[t]
                count[d] = j + 1
            src_k, dst_k, src_i, dst_i = dst_k, src_k, dst_i, src_i
            shift += 8
            if (span >> shift) == 0:
                break
        for t in range(m):
            flat[pos + t] = src_i[t]
        pos += m


@njit(cache=True, nogil=True)
def sbs_checkpoints(
    bins: np.uint64, n: np.uint64, a: np.uint64, b: np.uint64, keys: np.ndarray, every: np.int64, out: np.ndarray
) -> None:
    """Prefix sizes of visited bins: ``out[m]`` = total size of the bins visited in slots ``< m * every``.

    Bins are visited in the order ``perm_bins(0), perm_bins(1), ...``. ``out`` has
    ``ceil(bins / every) + 1`` entries. One pass over the bins, O(1) extra memory.
    """
    total = _ZERO
    nb = np.int64(bins)
    for k in range(nb):
        if k % every == 0:
            out[k // every] = np.int64(total)
        j = perm_one(_U(k), bins, a, b, keys)
        total += bin_start(j + _ONE, n, bins) - bin_start(j, n, bins)
    out[out.shape[0] - 1] = np.int64(total)


@njit(cache=True, nogil=True)
def sbs_locate(
    pos: np.ndarray,
    checkpoints: np.ndarray,
    every: np.int64,
    n: np.uint64,
    bins: np.uint64,
    a: np.uint64,
    b: np.uint64,
    keys: np.ndarray,
    slots: np.ndarray,
    offs: np.ndarray,
) -> None:
    """Visit slot and offset inside the bin of each position of a sort_bin_shuffle order.

    Starts from the checkpoint before each position and walks at most ``every`` slots; consecutive
    ascending positions continue from the previous walk, so a contiguous range costs O(range + bins in it).
    """
    cur_k = np.int64(-1)
    cur_pref = np.int64(0)
    nb = np.int64(bins)
    for i in range(pos.shape[0]):
        p = pos[i]
        blk = np.searchsorted(checkpoints, p, side="right") - 1
        if blk > (nb - 1) // every:
            blk = (nb - 1) // every
        k0 = blk * every
        if cur_k >= k0 and cur_pref <= p and cur_k // every == blk:
            k = cur_k
            pref = cur_pref
        else:
            k = k0
            pref = checkpoints[blk]
        while True:
            j = perm_one(_U(k), bins, a, b, keys)
            size = np.int64(bin_start(j + _ONE, n, bins) - bin_start(j, n, bins))
            if pref + size > p:
                break
            pref += size
            k += 1
        slots[i] = k
        offs[i] = p - pref
        cur_k = k
        cur_pref = pref


@njit(cache=True, nogil=True)
def _run_first(sidx: np.ndarray, lengths: np.ndarray, hi: np.int64) -> np.int64:
    """First position ``q <= hi`` of the sorted index whose length equals that at ``hi`` (bisection)."""
    v = length_at(lengths, sidx[hi])
    lo = np.int64(0)
    while lo < hi:
        mid = (lo + hi) // 2
        if length_at(lengths, sidx[mid]) < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True)
def _run_end(sidx: np.ndarray, lengths: np.ndarray, lo: np.int64, n: np.int64, v: Any) -> np.int64:
    """First position ``q >= lo`` of the sorted index whose length exceeds ``v``, else ``n`` (bisection)."""
    hi = n
    while lo < hi:
        mid = (lo + hi) // 2
        if length_at(lengths, sidx[mid]) > v:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True, nogil=True)
def tie_shuffled_range(
    sidx: np.ndarray, lengths: np.ndarray, s: np.int64, e: np.int64, tie_key: np.uint64, out: np.ndarray
) -> None:
    """``out[t]`` = position ``s + t`` of the length-sorted order with ties in keyed random order.

    ``sidx`` is the stable ascending argsort of ``lengths``. Each run of equal lengths
    ``[r0, r1)`` is permuted by the keyed permutation with master ``child_key(tie_key, r0)``, so the
    result is a stable sort by length of a random permutation, as RETURNN's sort_bin_shuffle. Runs
    that cross ``s`` or ``e`` are found by bisection. Memory O(1); reads O(e - s + log n).
    """
    n = np.int64(sidx.shape[0])
    rk = np.empty(ROUNDS, dtype=np.uint64)
    p = s
    while p < e:
        v = length_at(lengths, sidx[p])
        r0 = _run_first(sidx, lengths, p) if p == s else p
        q = p + 1
        while q < e and length_at(lengths, sidx[q]) == v:
            q += 1
        r1 = _run_end(sidx, lengths, q, n, v) if q == e else q
        nrun = _U(r1 - r0)
        ra, rb = split(nrun)
        round_keys(child_key(tie_key, _U(r0)), rk)
        for t in range(p, q):
            out[t - s] = sidx[r0 + np.int64(perm_one(_U(t - r0), nrun, ra, rb, rk))]
        p = q


@njit(cache=True, nogil=True)
def sbs_bins(
    bin_ids: np.ndarray,
    n: np.uint64,
    bins: np.uint64,
    sidx: np.ndarray,
    lengths: np.ndarray,
    tie_key: np.uint64,
    within_key: np.uint64,
    shuffle_within: bool,
    flat: np.ndarray,
) -> None:
    """Contents of sort_bin_shuffle bins ``bin_ids`` (bin = contiguous part of the tie-shuffled sort),
    concatenated into ``flat``; with ``shuffle_within`` each bin is permuted by the keyed permutation
    with master ``child_key(within_key, bin)``. Memory O(largest bin)."""
    rk = np.empty(ROUNDS, dtype=np.uint64)
    pos = np.int64(0)
    for k in range(bin_ids.shape[0]):
        j = _U(bin_ids[k])
        s = np.int64(bin_start(j, n, bins))
        e = np.int64(bin_start(j + _ONE, n, bins))
        m = e - s
        if m == 0:
            continue
        seg = flat[pos : pos + m]
        tie_shuffled_range(sidx, lengths, s, e, tie_key, seg)
        if shuffle_within:
            tmp = seg.copy()
            um = _U(m)
            wa, wb = split(um)
            round_keys(child_key(within_key, j), rk)
            for t in range(m):
                seg[t] = tmp[np.int64(perm_one(_U(t), um, wa, wb, rk))]
        pos += m


@njit(cache=True, nogil=True)
def reverse_sorted_take(pos: np.ndarray, sidx: np.ndarray, lengths: np.ndarray, out: np.ndarray) -> None:
    """``sorted_reverse`` from the ascending index: runs of equal length in descending order, each run in
    ascending index order (= RETURNN's stable argsort of ``-lengths``). Run bounds are found by
    bisection and reused while consecutive positions stay in the same run. O(1) memory."""
    n = np.int64(sidx.shape[0])
    r0 = np.int64(0)
    r1 = np.int64(-1)
    for i in range(pos.shape[0]):
        q = n - 1 - pos[i]
        if not (r0 <= q < r1):
            r0 = _run_first(sidx, lengths, q)
            r1 = _run_end(sidx, lengths, q + 1, n, length_at(lengths, sidx[q]))
        out[i] = sidx[r0 + (pos[i] - (n - r1))]
