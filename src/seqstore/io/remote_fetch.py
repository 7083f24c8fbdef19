"""Fetching the bytes of remote mappings into the node cache: which requests an access needs, and
waiting for them.

:class:`~seqstore.io.remote.RemoteRoot` maps a remote file's cache entry (a sparse local file) and
registers the mapping here. Pages that were never fetched read as zeros, so nothing may read a
mapped page before it is present: the reader asks for the byte ranges it is about to touch with
:func:`fetch` (start the requests, return at once) and :func:`ensure` (wait until present), the
remote counterparts of ``madvise(MADV_WILLNEED)``. Both take absolute addresses inside such
mappings, the same ranges the local read-ahead computes; addresses outside remote mappings are
ignored. :func:`paged_searchsorted` binary-searches a remote sorted array fetching only the pages
the search visits.

Requests: the page runs an access needs minus the pages present in the cache and the runs already
in flight in this process, merged where closer than ``coalesce_gap``, cut to at most 8 MiB, all
submitted at once to the client (at most ``max_requests`` and ``max_inflight_bytes`` in flight). An
access that asks for much of an aligned chunk fetches the chunk whole (:func:`_missing_requests`).
:func:`fetch_runs` fetches the union of several accesses (a run of batches) as it lies instead: exactly
the pages of its runs, none rounded up to chunks (:func:`_exact_requests`).
"""

from __future__ import annotations

import bisect
import concurrent.futures
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import numba
import numpy as np

from ..errors import CorruptionError, RemoteError
from .advice import page_runs
from .mapping import PAGE, address
from .nodecache import CachedObject, run_pages
from .objects import ObjectClient

__all__ = [
    "MOST", "Region", "Requester", "Ticket", "ensure", "ensure_array", "fetch", "fetch_runs", "paged_searchsorted",
    "register",
    "remote_mappings",
]

MOST = 8 << 20  # bytes per request at most
_CHUNK = 1 << 20  # an access that asks for at least 1/_DENSE of such an aligned chunk fetches it whole
_DENSE = 16
_EDGE = 64 << 10  # a dense run also brings the missing bytes this close to its ends (rows across the chunk edge)
_RUN = 256 << 10  # a union's run asking this many bytes is fetched as it lies (fetch_runs); sparser ones wait


class Requester(Protocol):
    """What fetching needs of the store a mapping belongs to (:class:`~seqstore.io.remote.RemoteRoot`):
    its client (for the request options and URLs) and a way to submit range requests into the cache."""

    url: str
    client: ObjectClient

    def submit(
        self,
        reqs: list[tuple[str, int, int, str | None]],
        fills: list[tuple[CachedObject, int]],
        chunks: Sequence[tuple[CachedObject, list[int]]] = (),
    ) -> Any: ...

# ------------------------------------------------------------------------------------ registry


class Region:
    """A mapped remote file: its address range, cache entry, store, object key and ETag."""

    __slots__ = ("base", "end", "obj", "root", "key", "etag")

    def __init__(self, base: int, end: int, obj: CachedObject, root: Requester, key: str, etag: str) -> None:
        self.base, self.end, self.obj, self.root, self.key, self.etag = base, end, obj, root, key, etag


_lock = threading.Lock()
_bases: list[int] = []  # sorted
_regions: dict[int, Region] = {}
_index: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[Region]] | None = None  # arrays of _bases, ends


def register(region: Region, owner: Any) -> None:
    """Record a new mapping; it is forgotten when ``owner`` (the mapping's base object) is collected."""
    global _index
    with _lock:
        bisect.insort(_bases, region.base)
        _regions[region.base] = region
        _index = None
    weakref.finalize(owner, _unregister, region.base).atexit = False


def _unregister(base: int) -> None:
    global _index
    with _lock:
        if _regions.pop(base, None) is not None:
            i = bisect.bisect_left(_bases, base)
            if i < len(_bases) and _bases[i] == base:
                del _bases[i]
            _index = None


def _lookup() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[Region]]:
    """The registered regions as arrays (start addresses, end addresses) and a list, rebuilt after a change."""
    global _index
    with _lock:
        if _index is None:
            regions = [_regions[b] for b in _bases]
            _index = (
                np.asarray(_bases, dtype=np.int64),
                np.asarray([r.end for r in regions], dtype=np.int64),
                regions,
            )
        return _index


def regions() -> list[Region]:
    """The remote files this process has mapped now."""
    return list(_lookup()[2])


def remote_mappings() -> int:
    """How many remote files this process has mapped now."""
    return len(_regions)


def _split_by_region(starts: Any, ends: Any, *more: Any) -> list[Any]:
    """``(region, starts, ends, *more)`` per registered region that ranges ``[starts, ends)`` fall in:
    offsets in the region's file, ends cut at its end, in their given order; ``more``: arrays alongside
    the ranges, split the same way. Ranges outside every region, and empty ones, are dropped."""
    s = np.asarray(starts, dtype=np.int64).reshape(-1)
    e = np.asarray(ends, dtype=np.int64).reshape(-1)
    if not len(s) or not _regions:
        return []
    bases, ends_of, regions = _lookup()
    if not len(bases):
        return []
    i = np.searchsorted(bases, s, side="right") - 1
    ok = (i >= 0) & (e > s)
    i_ok = np.where(ok, i, 0)
    ok &= s < ends_of[i_ok]
    if not ok.any():
        return []
    s, e, i = s[ok], e[ok], i[ok]
    extra = [np.asarray(m)[ok] for m in more]
    if int(i.min()) == int(i.max()):  # one region (a batch within one shard): no grouping
        r = regions[int(i[0])]
        return [(r, s - r.base, np.minimum(e, r.end) - r.base, *extra)]
    out = []
    order = np.argsort(i, kind="stable")  # grouped by region, each group in its given order
    si = i[order]
    for m in np.split(order, np.flatnonzero(si[1:] != si[:-1]) + 1):
        r = regions[int(i[m[0]])]
        out.append((r, s[m] - r.base, np.minimum(e[m], r.end) - r.base, *(x[m] for x in extra)))
    return out


# ------------------------------------------------------------------------------------- tickets


class Ticket:
    """Requests started by :func:`fetch`: :meth:`wait` returns when their bytes are in the cache (or
    raises the request's error). No wait is unbounded: every request has a timeout and a bounded number
    of retries, and a wait gives up (``RemoteError``) after ``limit`` seconds, longer than all of them."""

    __slots__ = ("futures", "limit", "claimed")

    def __init__(self, futures: list[Any], limit: float = 600.0, claimed: bool = False) -> None:
        self.futures = futures
        self.limit = limit
        self.claimed = claimed  # some of the bytes are another process's to fetch (a ClaimWait among futures)

    def wait(self) -> None:
        deadline = time.monotonic() + self.limit
        for f in self.futures:
            try:
                f.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                raise RemoteError(
                    f"no answer from object storage within {self.limit:.0f} s (longer than every request's "
                    "timeout and retries allow): the client's thread is stuck", attempts=0,
                ) from None


def _missing_requests(
    region: Region, s: np.ndarray[Any, Any], e: np.ndarray[Any, Any]
) -> tuple[list[tuple[int, int]], list[Any], list[int]]:
    """(new byte runs to request, futures of requests in flight that bring other missing bytes, chunks
    claimed: to be registered as in flight with the request's future)."""
    obj = region.obj
    rs, re_ = page_runs(s, e)
    re_ = np.minimum(re_, obj.size)
    ms, me = obj.missing(rs, re_)
    if not len(ms):
        return [], [], []
    ms, me = _cut_at_chunks(ms, me)
    if obj.chunk_flight:  # every missing byte in chunks requested whole (a window's later batches): wait
        coming = _chunks_coming(obj, ms)
        if coming is not None:
            return [], coming, []
    if obj.inflight:  # every missing byte in runs requested already (the batches of a union): wait
        coming = _runs_coming(obj, ms, me)
        if coming is not None:
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
    ids, inv = _sorted_unique(chunk, inverse=True)
    asked = np.bincount(inv, weights=(re_ - rs).astype(np.float64))
    # (the pair rule: a batch that takes fewer of a block's records, e.g. across two windows; random
    # records seldom ask that much of two neighbouring chunks)
    mid = asked >= _CHUNK // (2 * _DENSE)
    dense_at = (asked >= _CHUNK // _DENSE) | (mid & (_member(ids - 1, ids[mid]) | _member(ids + 1, ids[mid])))
    near = _member(ids - 1, ids[dense_at]) | _member(ids + 1, ids[dense_at])
    dense = ids[dense_at | (near & (asked >= _CHUNK // (4 * _DENSE)))]
    gap = region.root.client.coalesce_gap
    with obj.lock:
        sparse = obj.inflight  # byte runs requested and not yet arrived, sorted by start
        fs, fe = _requested(obj)
        mchunk = ms // _CHUNK
        flown, flying, coming = _chunks_flying(obj, mchunk)
        waits += coming  # chunks coming whole: wait for them
        whole = ~flying & _member(mchunk, dense)
        if whole.any():
            a = _sorted_unique(mchunk[whole]) * _CHUNK
            cs, ce = obj.missing(a, np.minimum(a + _CHUNK, obj.size))
            claimed.extend(_sorted_unique(_cut_at_chunks(cs, ce)[0] // _CHUNK).tolist())
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
            for jj in _sorted_unique(j[covered]).tolist():
                waits.append(sparse[jj][3])
            ms, me = ms[~covered], me[~covered]
    if whole.any():  # with the sparse runs: a sparse run next to a whole one (its edge) joins it
        ms, me = np.concatenate((ws, ms)), np.concatenate((we, me))
    if len(ms):
        cs, ce = page_runs(ms, me, gap=gap, most=MOST)  # adjacent chunks merge: fewer, larger requests
        runs.extend(zip(cs.tolist(), np.minimum(ce, obj.size).tolist()))
    return runs, waits, claimed


def _chunks_coming(obj: CachedObject, ms: np.ndarray[Any, Any]) -> list[Any] | None:
    """The futures of the whole-chunk requests in flight that bring the missing runs starting at ``ms``
    (cut at chunk boundaries), or None when a run lies in a chunk not in flight. What the planning
    below would answer in this case (wait for those chunks, request nothing), without its work."""
    with obj.lock:
        flight = obj.chunk_flight
        futs = []
        for c in _sorted_unique(ms // _CHUNK).tolist():
            f = flight.get(c)
            if f is None:
                return None
            futs.append(f)
    return futs


def _requested(obj: CachedObject) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Starts and ends of ``obj``'s byte runs in flight (``obj.inflight``, sorted by start). Call with
    ``obj.lock``."""
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
    return flown, flying, [flight[c] for c in _sorted_unique(chunks[flying]).tolist()]


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
    return brought, [sparse[k][3] for k in _sorted_unique(np.sort(who[jj[brought]])).tolist()]


def _runs_coming(obj: CachedObject, ms: np.ndarray[Any, Any], me: np.ndarray[Any, Any]) -> list[Any] | None:
    """The futures of the requests in flight that bring every page of the missing runs ``[ms, me)``, or
    None when a page of them is not coming."""
    pages = run_pages(ms, me) * PAGE
    with obj.lock:
        brought, futures = _coming(obj, pages)
    return futures if bool(brought.all()) else None


def _exact_requests(
    region: Region, s: np.ndarray[Any, Any], e: np.ndarray[Any, Any]
) -> tuple[list[tuple[int, int]], list[Any]]:
    """(new byte runs to request, futures of requests in flight to wait for) for exactly the pages of
    ``[s, e)``: those missing and not coming, merged where closer than ``coalesce_gap``, no chunk
    taken whole (the union of a window's batches: its blocks as they lie)."""
    obj = region.obj
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
    cs, ce = page_runs(ms, me, gap=region.root.client.coalesce_gap, most=MOST)
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


def _sorted_unique(a: np.ndarray[Any, Any], inverse: bool = False) -> Any:
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


def _all_present(obj: CachedObject, s: np.ndarray[Any, Any], e: np.ndarray[Any, Any]) -> bool:
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


def fetch(starts: Any, ends: Any, *, dense: bool = True) -> Ticket:
    """Start fetching whatever is not yet in the cache of the byte ranges ``[starts[i], ends[i])``
    (absolute addresses; those outside remote mappings are ignored). Returns at once. ``dense``
    False: exactly their pages (:func:`_exact_requests`), no chunk taken whole."""
    futures: list[Any] = []
    by_root: dict[int, tuple[Requester, list[tuple[str, int, int, str | None]], list[tuple[CachedObject, int]]]] = {}
    chunks: dict[int, list[tuple[CachedObject, list[int]]]] = {}
    others = False
    for region, s, e in _split_by_region(starts, ends):
        if _all_present(region.obj, s, e):  # e.g. a batch whose requests have arrived: no planning
            continue
        if dense:
            runs, waits, claimed = _missing_requests(region, s, e)
        else:
            (runs, waits), claimed = _exact_requests(region, s, e), []
        futures.extend(waits)
        if runs:  # what another process on the node is fetching is waited for, not fetched again
            runs, wait = _claim(region, runs)
            if wait is not None:
                futures.append(wait)
                others = True
        if runs:
            root, reqs, fills = by_root.setdefault(id(region.root), (region.root, [], []))
            for a, b in runs:
                reqs.append((region.key, a, b, region.etag or None))
                fills.append((region.obj, a))
            if claimed:
                chunks.setdefault(id(region.root), []).append((region.obj, claimed))
    limit = 0.0
    for key, (root, reqs, fills) in by_root.items():
        fut = root.submit(reqs, fills, chunks.get(key, []))
        fut.add_done_callback(lambda f, reqs=reqs, fills=fills: _give_back(f, reqs, fills))
        futures.append(fut)
        limit = max(limit, root.client.patience())
    return Ticket(futures, limit or 600.0, others)


def _claim(region: Region, runs: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], Any]:
    """Claim the pages of ``runs`` (byte runs to request) in the node cache (:mod:`.claims`): the runs
    of those that no other process is fetching, and a wait for the others (or None)."""
    client = region.root.client
    obj = region.obj
    s = np.fromiter((a for a, _ in runs), np.int64, len(runs))
    e = np.fromiter((b for _, b in runs), np.int64, len(runs))
    pages = run_pages(s, e)
    mine, wait = obj.claims.take(pages, client.timeout + client.connect_timeout)
    if wait is None:
        return runs, None
    keep = pages[mine] * PAGE
    ks, ke = page_runs(keep, keep + PAGE, most=MOST)
    return list(zip(ks.tolist(), np.minimum(ke, obj.size).tolist())), wait  # (runs are whole pages: the last
    # one of the object ends where the object does)


def _give_back(wave: Any, reqs: list[tuple[str, int, int, str | None]], fills: list[tuple[CachedObject, int]]) -> None:
    """After a wave: if it failed, the claims of its requests go back (others need not wait for them)."""
    if wave.cancelled() or wave.exception() is None:
        return
    for (_, a, b, _), (obj, _) in zip(reqs, fills):
        obj.claims.give_back(run_pages(np.array([a], np.int64), np.array([b], np.int64)))


def fetch_runs(starts: Any, ends: Any, must: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Start fetching the union of several accesses' ranges ``[starts[i], ends[i])`` as it lies: its runs
    (ranges closer than the client's ``coalesce_gap`` joined), exactly their pages (:func:`fetch` with
    ``dense`` False). The first ``must`` ranges are fetched whatever their run; a later range (the
    batch a run of batches ends with) is left out where its run asks for fewer than ``_RUN`` bytes and
    holds none of the first ``must``: the few rows of the next window's blocks a window's last batch takes, which
    the next union brings with those blocks. Returns the ranges left out (absolute addresses); ranges
    outside remote mappings are dropped."""
    s0 = np.asarray(starts, dtype=np.int64).reshape(-1)
    first = np.zeros(len(s0), dtype=bool)
    first[:must] = True
    keep_s: list[np.ndarray[Any, Any]] = []
    keep_e: list[np.ndarray[Any, Any]] = []
    left_s: list[np.ndarray[Any, Any]] = []
    left_e: list[np.ndarray[Any, Any]] = []
    for region, s, e, which in _split_by_region(s0, ends, first):
        rs, re_ = page_runs(s, e, gap=region.root.client.coalesce_gap)
        run = np.searchsorted(rs, s, side="right") - 1
        held = np.bincount(run[which], minlength=len(rs)) > 0
        asked = np.bincount(run, weights=(e - s).astype(np.float64), minlength=len(rs))
        keep = held | (asked >= _RUN)
        keep_s.append(rs[keep] + region.base)
        keep_e.append(np.minimum(re_[keep], region.obj.size) + region.base)
        out = ~keep[run]
        left_s.append(s[out] + region.base)
        left_e.append(e[out] + region.base)
    if keep_s:
        fetch(np.concatenate(keep_s), np.concatenate(keep_e), dense=False)
    if not left_s:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(left_s), np.concatenate(left_e)


def ensure(starts: Any, ends: Any) -> None:
    """Return once every byte of the ranges (absolute addresses) is in the cache: fetch what is
    missing, wait for what is in flight. Raises the named error of a request that failed."""
    first = fetch(starts, ends)
    if not first.futures:  # nothing missing, nothing in flight: all present
        return
    try:
        first.wait()
    except RemoteError:  # e.g. a read-ahead request that failed: what is still missing is asked again
        pass
    deadline = time.monotonic() + first.limit
    while True:
        again = fetch(starts, ends)  # also what another request was expected to bring and did not
        if not again.futures:
            return
        again.wait()
        # bytes another process claimed may still be missing (its claim ran out, it failed or exited):
        # ask again, fetching them now unless a live process claims them again
        if not again.claimed or time.monotonic() > deadline:
            break
    for region, s, e in _split_by_region(starts, ends):
        rs, re_ = page_runs(s, e)
        ms, _ = region.obj.missing(rs, np.minimum(re_, region.obj.size))
        if len(ms):
            raise CorruptionError(
                f"{region.root.client.key_url(region.key)}: bytes at {int(ms[0])} did not arrive in the cache"
            )


def ensure_array(arr: np.ndarray[Any, Any]) -> None:
    """:func:`ensure` of all the bytes a view of a mapping spans."""
    if arr.size == 0 or not _regions:
        return
    first = address(arr)
    last = first + arr.itemsize + sum((n - 1) * st for n, st in zip(arr.shape, arr.strides) if st > 0)
    low = first + sum((n - 1) * st for n, st in zip(arr.shape, arr.strides) if st < 0)
    ensure(np.array([low], np.int64), np.array([last], np.int64))


# --------------------------------------------------------------------------------- paged search


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


def paged_searchsorted(arr: np.ndarray[Any, Any], q: np.ndarray[Any, Any], side: str = "left") -> np.ndarray[Any, Any]:
    """``np.searchsorted(arr, q, side)`` for a sorted 1-d ``arr`` mapped from a remote object, reading
    only the pages the search needs: each round fetches (in one wave) 15 evenly spaced entries of every
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
