"""Which requests an access to a remote file needs: pure planning over one cache entry.

Given the byte ranges an access will touch in one object (offsets in its cache entry,
:class:`~seqstore.io.nodecache.CachedObject`), :func:`missing_requests` answers which byte runs to
request and which requests in flight to wait for: the page runs minus the pages present in the cache
and the runs already in flight in this process, merged where closer than ``gap``, cut to at most
:data:`MOST` bytes; an access that asks for much of an aligned chunk fetches the chunk whole.
:func:`exact_requests` plans the union of several accesses as it lies (no chunk taken whole).
:func:`paged_searchsorted` binary-searches a remote sorted array, asking only for the pages the
search visits. Nothing here sends a request: :mod:`seqstore.io.remote_fetch` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from .advice import page_runs
from .mapping import PAGE, address
from .nodecache import CachedObject, run_pages

__all__ = ["MOST", "all_present", "exact_requests", "missing_requests", "paged_searchsorted", "sorted_unique"]

MOST = 8 << 20  # bytes per request at most
_CHUNK = 1 << 20  # an access that asks for at least 1/_DENSE of such an aligned chunk fetches it whole
_DENSE = 16
_EDGE = 64 << 10  # a dense run also brings the missing bytes this close to its ends (rows across the chunk edge)


def missing_requests(
    obj: CachedObject, s: np.ndarray[Any, Any], e: np.ndarray[Any, Any], gap: int
) -> tuple[list[tuple[int, int]], list[Any], list[int]]:
    """(new byte runs to request, futures of requests in flight that bring other missing bytes, chunks
    claimed: to be registered as in flight with the request's future)."""
    rs, re_ = page_runs(s, e)
    re_ = np.minimum(re_, obj.size)
    ms, me = obj.missing(rs, re_)
    if not len(ms):
        return [], [], []
    ms, me = _cut_at_chunks(ms, me)
    if obj.chunk_flight:  # every missing byte in chunks requested whole (a window's later batches): wait
        with obj.lock:
            _, flying, coming = _chunks_flying(obj, ms // _CHUNK)
        if flying.all():
            return [], coming, []
    if obj.inflight:  # every missing byte in runs requested already (the batches of a union): wait
        with obj.lock:
            brought, coming = _coming(obj, run_pages(ms, me) * PAGE)
        if brought.all():
            return [], coming, []
    rs, re_ = _cut_at_chunks(rs, re_)
    waits: list[Any] = []
    runs: list[tuple[int, int]] = []
    claimed: list[int] = []
    ws = we = ms[:0]
    # Dense access (a scan, the blocks of a random_block window): the aligned chunks of which it asks at
    # least 1/_DENSE (1/(2 _DENSE) for two neighbours both asked that much; 1/(4 _DENSE) next to a dense
    # chunk: where a block runs on into the next chunk) are fetched whole, once, adjacent ones in one
    # request; later accesses wait for that request instead of asking for the holes. Only this access
    # counts: random batches that come back to a chunk now and then never turn into whole-chunk reads.
    chunk = rs // _CHUNK
    ids, inv = sorted_unique(chunk, inverse=True)
    asked = np.bincount(inv, weights=(re_ - rs).astype(np.float64))
    # (the pair rule: a batch that takes fewer of a block's records, e.g. across two windows; random
    # records seldom ask that much of two neighbouring chunks)
    mid = asked >= _CHUNK // (2 * _DENSE)
    dense_at = (asked >= _CHUNK // _DENSE) | (mid & (_member(ids - 1, ids[mid]) | _member(ids + 1, ids[mid])))
    near = _member(ids - 1, ids[dense_at]) | _member(ids + 1, ids[dense_at])
    dense = ids[dense_at | (near & (asked >= _CHUNK // (4 * _DENSE)))]
    with obj.lock:
        sparse = obj.inflight  # byte runs requested and not yet arrived, sorted by start
        fs, fe = _requested(obj)
        mchunk = ms // _CHUNK
        flown, flying, coming = _chunks_flying(obj, mchunk)
        waits += coming  # chunks coming whole: wait for them
        whole = ~flying & _member(mchunk, dense)
        if whole.any():
            a = sorted_unique(mchunk[whole]) * _CHUNK
            cs, ce = obj.missing(a, np.minimum(a + _CHUNK, obj.size))
            claimed.extend(sorted_unique(_cut_at_chunks(cs, ce)[0] // _CHUNK).tolist())
            # A row that runs over a dense run's edge (a block's last row, 128 bytes into the next chunk,
            # then asked page by page by each later batch that draws it) comes with the run: the
            # missing pages within _EDGE of each end, outside chunks requested whole already.
            ws, we = page_runs(a, np.minimum(a + _CHUNK, obj.size))
            es = np.concatenate((np.maximum(ws - _EDGE, 0), we))
            ee = np.concatenate((ws, np.minimum(we + _EDGE, obj.size)))
            es, ee = page_runs(es[ee > es], ee[ee > es])
            xs, xe = obj.missing(es, np.minimum(ee, obj.size))
            if len(xs) and len(flown):
                fly = _member(xs // _CHUNK, flown)
                xs, xe = xs[~fly], xe[~fly]
            if len(xs) and len(fs):  # nor the pages a request in flight brings (nothing waits for them)
                xs, xe = _not_coming(xs, xe, fs, fe, obj.size)
            ws, we = np.concatenate((cs, xs)), np.concatenate((ce, xe))
        ms, me = ms[~(flying | whole)], me[~(flying | whole)]
        if len(fs) and len(ms):  # missing runs that a request in flight already brings: wait for it
            j, covered = _brought(fs, fe, ms, me)
            for jj in sorted_unique(j[covered]).tolist():
                waits.append(sparse[jj][3])
            ms, me = ms[~covered], me[~covered]
    if whole.any():  # with the sparse runs: a sparse run next to a whole one (its edge) joins it
        ms, me = np.concatenate((ws, ms)), np.concatenate((we, me))
    if len(ms):
        cs, ce = page_runs(ms, me, gap=gap, most=MOST)  # adjacent chunks merge: fewer, larger requests
        runs.extend(zip(cs.tolist(), np.minimum(ce, obj.size).tolist()))
    return runs, waits, claimed


def _requested(obj: CachedObject) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Starts and ends of the byte runs in flight, ``obj.inflight`` (sorted by start). Call with ``obj.lock``."""
    sparse = obj.inflight
    fs = np.fromiter((t[0] for t in sparse), dtype=np.int64, count=len(sparse))
    fe = np.fromiter((t[1] for t in sparse), dtype=np.int64, count=len(sparse))
    return fs, fe


def _chunks_flying(obj: CachedObject, chunks: np.ndarray[Any, Any]) -> tuple[Any, Any, list[Any]]:
    """(the chunk numbers requested whole and in flight, sorted; which of ``chunks`` (sorted) are among
    them; the futures of those, once each). Call with ``obj.lock``."""
    flight = obj.chunk_flight
    flown = np.sort(np.fromiter(flight, np.int64, len(flight)))
    flying = _member(chunks, flown)
    return flown, flying, [flight[c] for c in sorted_unique(chunks[flying]).tolist()]


def _coming(obj: CachedObject, pages: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], list[Any]]:
    """For page offsets ``pages`` (sorted), whether a request in flight brings each, and the futures of
    the requests that do. Requests may overlap (a union's run next to a batch's): a page is brought by
    the request that reaches furthest among those starting at or before it. Call with ``obj.lock``."""
    sparse = obj.inflight  # sorted by start
    fs, fe = _requested(obj)
    reach = np.maximum.accumulate(fe)
    who = np.maximum.accumulate(np.where(fe == reach, np.arange(len(fe)), 0))  # the request reaching that far
    j = np.searchsorted(fs, pages, side="right") - 1
    jj = np.maximum(j, 0)
    brought = (j >= 0) & (reach[jj] >= np.minimum(pages + PAGE, obj.size))
    return brought, [sparse[k][3] for k in sorted_unique(np.sort(who[jj[brought]])).tolist()]


def exact_requests(
    obj: CachedObject, s: np.ndarray[Any, Any], e: np.ndarray[Any, Any], gap: int
) -> tuple[list[tuple[int, int]], list[Any]]:
    """(new byte runs to request, futures of requests in flight to wait for) for exactly the pages of
    ``[s, e)``: those missing and not coming, merged where closer than ``coalesce_gap``, no chunk
    taken whole (the union of a window's batches: its blocks as they lie)."""
    rs, re_ = page_runs(s, e)
    ms, me = obj.missing(rs, np.minimum(re_, obj.size))
    if not len(ms):
        return [], []
    waits: list[Any] = []
    with obj.lock:
        if obj.chunk_flight:  # pages in chunks coming whole: wait for those
            ms, me = _cut_at_chunks(ms, me)
            _, flying, waits = _chunks_flying(obj, ms // _CHUNK)
            ms, me = ms[~flying], me[~flying]
        if obj.inflight and len(ms):  # pages a request in flight brings: wait for it
            pages = run_pages(ms, me) * PAGE
            brought, futures = _coming(obj, pages)
            waits += futures
            pages = pages[~brought]
            ms, me = pages, np.minimum(pages + PAGE, obj.size)
    if not len(ms):
        return [], waits
    cs, ce = page_runs(ms, me, gap=gap, most=MOST)
    return list(zip(cs.tolist(), np.minimum(ce, obj.size).tolist())), waits


def _not_coming(
    xs: np.ndarray[Any, Any], xe: np.ndarray[Any, Any], fs: np.ndarray[Any, Any], fe: np.ndarray[Any, Any], size: int
) -> tuple[Any, Any]:
    """The pages of runs ``[xs, xe)`` (page aligned, short: edges of dense runs) that no request in flight
    ``[fs, fe)`` (sorted by start) brings, as page runs."""
    pages = run_pages(xs, xe) * PAGE
    _, coming = _brought(fs, fe, pages, np.minimum(pages + PAGE, size))
    pages = pages[~coming]
    return page_runs(pages, np.minimum(pages + PAGE, size))


def _brought(fs: Any, fe: Any, s: Any, e: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """For ranges ``[s, e)``: the request in flight ``[fs, fe)`` (sorted by start) that starts at or
    before each (index), and whether that request brings the whole range."""
    j = np.searchsorted(fs, s, side="right") - 1
    return j, (j >= 0) & (fe[np.maximum(j, 0)] >= e)


def sorted_unique(a: np.ndarray[Any, Any], inverse: bool = False) -> Any:
    """``np.unique(a)`` (with ``inverse``: and ``return_inverse``) of an array sorted already (chunk and
    request numbers of sorted runs): a comparison of neighbours instead of the hashing ``np.unique``
    does, which took a quarter of the reading thread's planning on small arrays like these."""
    first = np.empty(len(a), dtype=bool)
    first[:1] = True
    np.not_equal(a[1:], a[:-1], out=first[1:])
    if inverse:
        return a[first], np.cumsum(first) - 1
    return a[first]


def _member(x: np.ndarray[Any, Any], table: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``np.isin(x, table)`` for a sorted ``table`` (chunk numbers: a few dozen; ``np.isin`` costs several
    times more on arrays this small)."""
    if not len(table):
        return np.zeros(len(x), dtype=bool)
    i = np.minimum(np.searchsorted(table, x), len(table) - 1)
    return table[i] == x  # type: ignore[no-any-return]


def all_present(obj: CachedObject, s: np.ndarray[Any, Any], e: np.ndarray[Any, Any]) -> bool:
    """Whether every range ``[s, e)`` (offsets in ``obj``) lies in at most two pages, all present: the
    check of a batch's records (rows of up to a page) that costs a few array lookups, not the planning."""
    p0 = s // PAGE
    p1 = (e - 1) // PAGE
    if not len(p0) or int((p1 - p0).max()) > 1:
        return False
    return bool(obj.bits[p0].all() and obj.bits[p1].all())


def _cut_at_chunks(s: np.ndarray[Any, Any], e: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    """Byte runs ``[s, e)`` cut where they cross a multiple of the chunk size."""
    first = s // _CHUNK
    pieces = (e - 1) // _CHUNK - first + 1
    if not len(s) or int(pieces.max()) == 1:
        return s, e
    k = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    c = np.repeat(first, pieces) + k
    return np.maximum(np.repeat(s, pieces), c * _CHUNK), np.minimum(np.repeat(e, pieces), (c + 1) * _CHUNK)


@numba.njit(cache=True, nogil=True)
def _bracket_search(arr: Any, q: Any, lo: Any, hi: Any, right: bool, out: Any) -> None:  # pragma: no cover
    for i in range(q.shape[0]):
        a = lo[i]
        b = hi[i]
        v = q[i]
        while a < b:
            m = (a + b) >> 1
            if arr[m] < v or (right and arr[m] == v):
                a = m + 1
            else:
                b = m
        out[i] = a


def paged_searchsorted(
    arr: np.ndarray[Any, Any], q: np.ndarray[Any, Any], side: str, ensure: Callable[[Any, Any], None]
) -> np.ndarray[Any, Any]:
    """``np.searchsorted(arr, q, side)`` for a sorted 1-d ``arr`` mapped from a remote object, reading
    only the pages the search needs (``ensure(starts, ends)`` makes address ranges present): each round
    fetches (in one wave) 15 evenly spaced entries of every
    query's bracket and narrows the bracket 16-fold, until it fits in one page; the rest is searched
    in the cache. ``log16(len(arr) / 512)`` rounds (4 at 10^9 entries)."""
    q = np.ascontiguousarray(q, dtype=arr.dtype)
    n = len(arr)
    lo = np.zeros(len(q), np.int64)
    hi = np.full(len(q), n, np.int64)
    per_page = max(1, PAGE // arr.itemsize)
    base = address(arr)
    right = side == "right"
    while True:
        active = np.flatnonzero(hi - lo > per_page)
        if not len(active):
            break
        span = hi[active] - lo[active]
        probes = lo[active, None] + (span[:, None] * np.arange(1, 16)[None, :]) // 16  # (a, 15), inside [lo, hi)
        flat = np.unique(probes)
        ensure(base + flat * arr.itemsize, base + (flat + 1) * arr.itemsize)
        vals = arr[probes]
        qa = q[active, None]
        below = (vals < qa) | ((vals == qa) if right else np.zeros_like(vals, dtype=bool))
        k = below.sum(axis=1)  # probes entirely before the answer: the answer is after probes[k-1]
        new_lo = np.where(k > 0, probes[np.arange(len(active)), np.maximum(k - 1, 0)] + 1, lo[active])
        new_hi = np.where(k < 15, probes[np.arange(len(active)), np.minimum(k, 14)], hi[active])
        lo[active], hi[active] = new_lo, new_hi
    nonempty = hi > lo
    if nonempty.any():
        ensure(base + lo[nonempty] * arr.itemsize, base + hi[nonempty] * arr.itemsize)
    out = np.empty(len(q), np.int64)
    _bracket_search(arr, q, lo, hi, right, out)
    return out
