"""Fetching the bytes of one remote store's mappings into the node cache: the store's :class:`Fetcher`.

A remote file's cache entry (a sparse local file) is mapped in place of the object; pages never fetched
read as zeros, so nothing may read a mapped page before it is present. The store's :class:`Fetcher`
knows its own mappings (:meth:`Fetcher.add`, by address range) and answers the reader's
:meth:`~Fetcher.fetch` (start the requests, return at once) and :meth:`~Fetcher.ensure` (wait until
present), the remote counterparts of ``madvise(MADV_WILLNEED)``, for absolute addresses inside its
mappings (others are ignored).

The way down, each step a layer that may be left out: the plan (:mod:`.remote_plan`: pages missing from
the cache, not in flight) -> claims (:mod:`.claims`: pages another process of the node is fetching are
waited for) -> a wave of requests, through the direct reader
(:class:`DirectWaves`: many small ranges; off where the options turn direct reads off) or the object
client -> answers written into the cache. Nothing here calls back into the store that owns the fetcher.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CorruptionError, RemoteError, StaleStoreError
from .advice import page_runs
from .mapping import PAGE, address
from .nodecache import CachedObject, NodeCache, run_pages
from .object_common import Request
from .object_links import reset_in_child
from .objects import ObjectClient
from .remote_plan import MOST, all_present, exact_requests, missing_requests, paged_searchsorted

__all__ = ["DirectWaves", "Fetcher", "MOST", "Region", "Ticket"]

_RUN = 256 << 10  # a union's run asking this many bytes is fetched as it lies (fetch_runs); sparser ones wait
#: a wave of at least _DIRECT_LEAST requests of at most _DIRECT_EACH bytes each (random reads' pages),
#: _DIRECT_MOST in all, goes through the direct reader, written into the cache when the whole wave is in.
#: Other waves (an epoch's runs and chunks, and the few pages at their edges) stay with the client, whose
#: answers are written as each arrives, so a batch waiting for part of it goes on early (a whole fixed
#: epoch ran 5% slower through the direct reader)
_DIRECT_EACH = 256 << 10
_DIRECT_MOST = 64 << 20
_DIRECT_LEAST = 32


@dataclass(slots=True, eq=False)
class Ticket:
    """Requests started by :meth:`Fetcher.fetch`: :meth:`wait` returns when their bytes are in (or raises
    the request's error). No wait is unbounded: every request has a timeout and a bounded number of
    retries, and a wait gives up (``RemoteError``) after ``limit`` seconds, longer than all of them."""

    futures: list[Any]
    limit: float = 600.0
    claimed: bool = False  # some of the bytes are another process's to fetch (a ClaimWait among futures)
    url: str = ""  # the store's, for the error

    def wait(self) -> None:
        deadline = time.monotonic() + self.limit
        for f in self.futures:
            try:
                f.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                raise RemoteError(
                    f"{self.url}: no answer from object storage within {self.limit:.0f} s (longer than every "
                    "request's timeout and retries allow): the client's thread is stuck", url=self.url, attempts=0,
                ) from None


@dataclass(slots=True, eq=False)
class Region:
    """A mapped remote file: its address range, cache entry, object key and ETag."""

    base: int
    end: int
    obj: CachedObject
    key: str
    etag: str


class DirectWaves:
    """The layer that sends a wave of many small ranges (see ``_DIRECT_EACH``) through the client's direct
    reader into one buffer, written into the cache entries once all are in. :meth:`send` answers None for
    a wave it does not take (larger ranges, an object without a direct URL, ``max_inflight_bytes`` in
    flight this way already)."""

    def __init__(self, client: ObjectClient) -> None:
        self.client = client

    def send(self, reqs: list[Request], spans: list[tuple[CachedObject, int, int]]
             ) -> concurrent.futures.Future[Any] | None:
        client = self.client
        total = sum(b - a for _, a, b, _ in reqs)
        if len(reqs) < _DIRECT_LEAST or total > _DIRECT_MOST or max(b - a for _, a, b, _ in reqs) > _DIRECT_EACH:
            return None
        urls: dict[tuple[str, str | None], tuple[str, str | None]] = {}
        for key, _, _, etag in reqs:
            if (key, etag) not in urls:
                got = client.direct(key, etag)
                if got is None:
                    return None
                urls[(key, etag)] = got
        if not client.direct_budget(total):
            return None
        view = memoryview(bytearray(total))
        jobs, places, off = [], [], 0
        for key, a, b, etag in reqs:
            url, tag = urls[(key, etag)]
            jobs.append((url, a, b, tag, view[off : off + b - a]))
            places.append(off)
            off += b - a
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def fill(inner: concurrent.futures.Future[None]) -> None:
            try:
                inner.result()
                for (obj, a, b), o in zip(spans, places):
                    obj.fill(a, view[o : o + b - a])
            except BaseException as exc:  # noqa: BLE001 - the wave's error, raised where it is awaited
                out.set_exception(exc)
            else:
                out.set_result(None)
            finally:
                client.direct_budget(-total)

        try:
            client.direct_reader.submit(jobs).add_done_callback(fill)
        except BaseException:
            client.direct_budget(-total)
            raise
        return out


def _settle(wave: concurrent.futures.Future[Any], answers: concurrent.futures.Future[Any], url: str) -> None:
    """End ``wave`` as the client's future ``answers`` ended (``url``: the store's)."""
    if answers.cancelled():
        wave.set_exception(RemoteError(f"{url}: the requests were cancelled", url=url, attempts=0))
    elif answers.exception() is not None:
        wave.set_exception(answers.exception())
    else:
        wave.set_result(answers.result())


def _forget(fetcher: weakref.ref[Fetcher], base: int) -> None:
    f = fetcher()
    if f is not None:
        f.forget(base)


class Fetcher:
    """The fetch path of one remote store: its mapped files, its ``client`` and its node ``cache`` (see
    the module docstring). ``direct``: the :class:`DirectWaves` layer, or None to send every wave through
    the client."""

    def __init__(self, client: ObjectClient, cache: NodeCache, *, direct: DirectWaves | None = None) -> None:
        self.client, self.cache, self.direct = client, cache, direct
        #: told the keys of objects a read found changed (a StaleStoreError), before the error is raised
        self.on_changed: Callable[[list[str]], None] | None = None
        self.pending = 0  # data requests submitted and not yet answered (an estimate: read without a lock)
        self._lock = threading.Lock()
        reset_in_child(self, "_lock")  # (a thread of a process forked meanwhile may hold it)
        self._regions: dict[int, Region] = {}  # by base address
        self._index: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[Region]] | None = None

    # ------------------------------------------------------------------------------- mappings

    def add(self, region: Region, owner: Any) -> None:
        """Know a new mapping; it is forgotten when ``owner`` (the mapping's base object) is collected."""
        with self._lock:
            self._regions[region.base] = region
            self._index = None
        weakref.finalize(owner, _forget, weakref.ref(self), region.base).atexit = False

    def forget(self, base: int) -> None:
        with self._lock:
            if self._regions.pop(base, None) is not None:
                self._index = None

    def regions(self) -> list[Region]:
        """The files mapped now, by start address."""
        return list(self._table()[2])

    def _table(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[Region]]:
        """Arrays of the mapped files' start and end addresses, and their regions (by start)."""
        with self._lock:
            if self._index is None:
                bases = sorted(self._regions)
                regions = [self._regions[b] for b in bases]
                ends = np.asarray([r.end for r in regions], dtype=np.int64)
                self._index = (np.asarray(bases, dtype=np.int64), ends, regions)
            return self._index

    def split(self, starts: Any, ends: Any, *more: Any) -> list[Any]:
        """``(region, starts, ends, *more)`` per mapped file that ranges ``[starts, ends)`` fall in: offsets
        in the file, ends cut at its end, in their given order; ``more``: arrays alongside the ranges, split
        the same way. Ranges outside every mapping, and empty ones, are dropped."""
        s = np.asarray(starts, dtype=np.int64).reshape(-1)
        e = np.asarray(ends, dtype=np.int64).reshape(-1)
        if not len(s) or not self._regions:
            return []
        bases, ends_of, regions = self._table()
        if not len(bases):
            return []
        i = np.searchsorted(bases, s, side="right") - 1
        ok = (i >= 0) & (e > s)
        ok &= s < ends_of[np.where(ok, i, 0)]
        if not ok.any():
            return []
        s, e, i = s[ok], e[ok], i[ok]
        extra = [np.asarray(m)[ok] for m in more]
        if int(i.min()) == int(i.max()):  # one file (a batch within one shard): no grouping
            r = regions[int(i[0])]
            return [(r, s - r.base, np.minimum(e, r.end) - r.base, *extra)]
        out = []
        order = np.argsort(i, kind="stable")  # grouped by file, each group in its given order
        si = i[order]
        for m in np.split(order, np.flatnonzero(si[1:] != si[:-1]) + 1):
            r = regions[int(i[m[0]])]
            out.append((r, s[m] - r.base, np.minimum(e[m], r.end) - r.base, *(x[m] for x in extra)))
        return out

    # ---------------------------------------------------------------------------------- waves

    def submit(self, reqs: list[Request], fills: list[tuple[CachedObject, int]],
               chunks: Sequence[tuple[CachedObject, list[int]]] = ()) -> concurrent.futures.Future[Any]:
        """Send range requests whose answers are written into the cache entries ``fills``; ``chunks``: the
        aligned chunks of cache entries these requests bring whole (in flight until they arrive)."""
        self.cache.reserve(sum(-(-b // PAGE) * PAGE - a // PAGE * PAGE for _, a, b, _ in reqs))
        spans = [(obj, a, a + (r[2] - r[1])) for (obj, a), r in zip(fills, reqs)]

        def on_each(i: int, data: memoryview, meta: Any) -> None:
            obj, a, _ = spans[i]
            obj.fill(a, data)

        by_obj: dict[int, tuple[CachedObject, list[tuple[int, int]]]] = {}
        for obj, a, b in spans:
            by_obj.setdefault(id(obj), (obj, []))[1].append((a, b))
        # the wave's future, registered as in flight before any answer can arrive (one sort per entry)
        wave: concurrent.futures.Future[Any] = concurrent.futures.Future()
        for obj, runs in by_obj.values():
            with obj.lock:
                obj.inflight = sorted(obj.inflight + [(a, b, id(wave), wave) for a, b in runs])
        for obj, ids in chunks:
            with obj.lock:
                obj.chunk_flight.update(dict.fromkeys(ids, wave))
        with self._lock:
            self.pending += len(reqs)

        def done(answers: concurrent.futures.Future[Any]) -> None:
            try:
                with self._lock:
                    self.pending -= len(reqs)
                if not answers.cancelled() and isinstance(answers.exception(), StaleStoreError):
                    self.changed(r[0] for r in reqs)
                for obj, ids in chunks:
                    with obj.lock:
                        for c in ids:
                            if obj.chunk_flight.get(c) is wave:
                                del obj.chunk_flight[c]
                for obj, _runs in by_obj.values():  # one pass per entry, not one search per request
                    with obj.lock:
                        obj.inflight = [t for t in obj.inflight if t[3] is not wave]
            finally:  # the wave ends whatever happened here: nothing waits for it forever
                _settle(wave, answers, self.client.url)

        try:
            answers = None if self.direct is None else self.direct.send(reqs, spans)
            if answers is None:
                answers = self.client.submit(reqs, on_each, with_meta=False)
        except BaseException as exc:  # not submitted (e.g. the client's loop is gone): nothing in flight
            failed: concurrent.futures.Future[Any] = concurrent.futures.Future()
            failed.set_exception(exc)
            done(failed)
            raise
        answers.add_done_callback(done)
        return wave

    def changed(self, keys: Iterable[str]) -> None:
        """A read of objects ``keys`` failed as the object changed (StaleStoreError): tell ``on_changed``."""
        if self.on_changed is not None:
            self.on_changed(sorted(set(keys)))

    # ------------------------------------------------------------------------------- fetching

    def fetch(self, starts: Any, ends: Any, *, dense: bool = True) -> Ticket:
        """Start fetching whatever is not yet in the cache of the byte ranges ``[starts[i], ends[i])``
        (absolute addresses; those outside this store's mappings are ignored). Returns at once. ``dense``
        False: exactly their pages (:func:`~.remote_plan.exact_requests`), no chunk taken whole."""
        futures: list[Any] = []
        reqs: list[Request] = []
        fills: list[tuple[CachedObject, int]] = []
        chunks: list[tuple[CachedObject, list[int]]] = []
        others = False
        gap = self.client.coalesce_gap
        for region, s, e in self.split(starts, ends):
            obj = region.obj
            obj.touch()  # used now, if only from the cache (evictions take the least recently used first)
            if all_present(obj, s, e):  # e.g. a batch whose requests have arrived: no planning
                continue
            if dense:
                runs, waits, claimed = missing_requests(obj, s, e, gap)
            else:
                (runs, waits), claimed = exact_requests(obj, s, e, gap), []
            futures.extend(waits)
            if runs:  # what another process on the node is fetching is waited for
                runs, wait = self._claim(obj, runs)
                if wait is not None:
                    futures.append(wait)
                    others = True
            if runs:
                for a, b in runs:
                    reqs.append((region.key, a, b, region.etag or None))
                    fills.append((obj, a))
                if claimed:
                    chunks.append((obj, claimed))
        if not reqs:
            return Ticket(futures, 600.0, others, self.client.url)
        futures.append(self._claimed_wave(reqs, fills, chunks))
        return Ticket(futures, self.client.patience(), others, self.client.url)

    def _claimed_wave(self, reqs: list[Request], fills: list[tuple[CachedObject, int]],
                      chunks: Sequence[tuple[CachedObject, list[int]]] = ()) -> concurrent.futures.Future[Any]:
        """:meth:`submit` of requests whose pages this process claimed: the claims are released if nothing
        could be sent, and given back when the wave ends."""
        try:
            wave = self.submit(reqs, fills, chunks)
        except BaseException:
            _release(reqs, fills)  # nothing was sent: others need not wait for these pages
            raise
        wave.add_done_callback(lambda f: _release(reqs, fills, f))
        return wave

    def send(self, obj: CachedObject, key: str, etag: str, runs: list[tuple[int, int]]
             ) -> tuple[concurrent.futures.Future[Any] | None, Any]:
        """Request byte runs ``runs`` of object ``key`` (version ``etag``) into its cache entry ``obj`` as one
        wave, claiming their pages first as :meth:`fetch` does: the wave of the runs this process fetches
        (None: none), and a wait for the pages another process of the node is fetching (None: none)."""
        runs, wait = self._claim(obj, runs)
        if not runs:
            return None, wait
        reqs: list[Request] = [(key, a, b, etag or None) for a, b in runs]
        fills = [(obj, a) for a, _ in runs]
        return self._claimed_wave(reqs, fills), wait

    def take(self, obj: CachedObject, pages: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Claim those of ``pages`` of cache entry ``obj`` that no other live process of the node claims; a
        mask of those now this process's."""
        mine, _ = obj.claims.take(pages, self.client.timeout + self.client.connect_timeout)
        return mine

    def _claim(self, obj: CachedObject, runs: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], Any]:
        """Claim the pages of ``runs`` (byte runs to request) in the node cache (:mod:`.claims`): the runs
        of those that no other process is fetching, and a wait for the others (or None)."""
        s = np.fromiter((a for a, _ in runs), np.int64, len(runs))
        e = np.fromiter((b for _, b in runs), np.int64, len(runs))
        pages = run_pages(s, e)
        mine, wait = obj.claims.take(pages, self.client.timeout + self.client.connect_timeout)
        if wait is None:
            return runs, None
        keep = pages[mine] * PAGE
        ks, ke = page_runs(keep, keep + PAGE, most=MOST)  # (the last page of the object ends where it does)
        return list(zip(ks.tolist(), np.minimum(ke, obj.size).tolist())), wait

    def fetch_runs(self, starts: Any, ends: Any, must: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Start fetching the union of several accesses' ranges ``[starts[i], ends[i])`` as it lies: its runs
        (ranges closer than ``coalesce_gap`` joined), exactly their pages (:meth:`fetch` with ``dense``
        False). A range after the first ``must`` is left out where its run asks for fewer than ``_RUN``
        bytes and holds none of the first ``must`` (the few rows of the next window's blocks that a
        window's last batch takes: the next union brings them). Returns the ranges left out."""
        s0 = np.asarray(starts, dtype=np.int64).reshape(-1)
        first = np.zeros(len(s0), dtype=bool)
        first[:must] = True
        keep_s, keep_e, left_s, left_e = [], [], [], []
        for region, s, e, which in self.split(s0, ends, first):
            rs, re_ = page_runs(s, e, gap=self.client.coalesce_gap)
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
            self.fetch(np.concatenate(keep_s), np.concatenate(keep_e), dense=False)
        if not left_s:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(left_s), np.concatenate(left_e)

    def ensure(self, starts: Any, ends: Any) -> None:
        """Return once every byte of the ranges (absolute addresses) is in the cache: fetch what is
        missing, wait for what is in flight. Raises the named error of a request that failed."""
        first = self.fetch(starts, ends)
        if not first.futures:  # nothing missing, nothing in flight: all present
            return
        with contextlib.suppress(RemoteError):  # e.g. a read-ahead request that failed: asked again below
            first.wait()
        deadline = time.monotonic() + first.limit
        while True:
            again = self.fetch(starts, ends)  # also what another request was expected to bring and did not
            if not again.futures:
                return
            again.wait()
            # bytes another process claimed may still be missing (its claim ran out, it failed or exited):
            # ask again, fetching them now unless a live process claims them again
            if not again.claimed or time.monotonic() > deadline:
                break
        for region, s, e in self.split(starts, ends):
            rs, re_ = page_runs(s, e)
            ms, _ = region.obj.missing(rs, np.minimum(re_, region.obj.size))
            if len(ms):
                raise CorruptionError(
                    f"{self.client.key_url(region.key)}: bytes at {int(ms[0])} did not arrive in the cache"
                )

    def ensure_array(self, arr: np.ndarray[Any, Any]) -> None:
        """:meth:`ensure` of all the bytes a view of a mapping spans."""
        if arr.size == 0 or not self._regions:
            return
        first = address(arr)
        last = first + arr.itemsize + sum((n - 1) * st for n, st in zip(arr.shape, arr.strides) if st > 0)
        low = first + sum((n - 1) * st for n, st in zip(arr.shape, arr.strides) if st < 0)
        self.ensure(np.array([low], np.int64), np.array([last], np.int64))

    def searchsorted(self, arr: np.ndarray[Any, Any], q: np.ndarray[Any, Any], side: str = "left"
                     ) -> np.ndarray[Any, Any]:
        """``np.searchsorted`` over a sorted array of this store's mappings, reading only the pages the
        search needs (:func:`~.remote_plan.paged_searchsorted`)."""
        if len(arr) == 0:
            return np.searchsorted(arr, q, side=side)  # type: ignore[call-overload,no-any-return]
        return paged_searchsorted(arr, q, side, self.ensure)


def _release(reqs: list[Request], fills: list[tuple[CachedObject, int]], wave: Any = None) -> None:
    """Give back the claims of requests ``reqs`` (into the cache entries of ``fills``): they were not sent, or
    their ``wave`` failed (others need not wait for them)."""
    if wave is not None and (wave.cancelled() or wave.exception() is None):
        return
    for (_, a, b, _), (obj, _) in zip(reqs, fills):
        obj.claims.give_back(run_pages(np.array([a], np.int64), np.array([b], np.int64)))
