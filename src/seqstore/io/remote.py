"""A store on object storage, read through the node-local cache as if it were local.

:class:`RemoteRoot` gives the store reader what it needs from a local directory:

- :meth:`RemoteRoot.load` fetches ``manifest.json`` (one request) and the committed rows of the
  shard table (one more), and lays them out in a small local directory of the cache (a *mirror*, one
  per store URL and manifest version), so the reader opens it with the code it uses for local stores:
  at most 2 round trips, nothing per shard.
- :meth:`RemoteRoot.prepare_shard` runs when a shard is first touched: one wave of requests fetches
  its descriptor and the first and last page of each of its files (the ``.npy`` headers, the last
  offsets, and each object's size and ETag). Data files become cache entries keyed by URL and ETag.
- :meth:`RemoteRoot.map_npy` maps a data file's cache entry (a sparse local file) in place of the
  object. Pages that were never fetched read as zeros, so nothing may read a mapped page before it
  is present: the reader asks for the byte ranges it is about to touch with :func:`fetch` (start the
  requests, return at once) and :func:`ensure` (wait until present), the remote counterparts of
  ``madvise(MADV_WILLNEED)``. Both take absolute addresses inside such mappings, the same ranges the
  local read-ahead computes; addresses outside remote mappings are ignored.

Requests: the page runs an access needs minus the pages present in the cache and the runs already
in flight in this process, merged where closer than ``coalesce_gap``, cut to at most 8 MiB, all
submitted at once to the client (at most ``max_requests`` and ``max_inflight_bytes`` in flight). An
access that asks for much of an aligned chunk fetches the chunk whole (:func:`_missing_requests`).
"""

from __future__ import annotations

import bisect
import concurrent.futures
import hashlib
import json
import os
import threading
import time
import weakref
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numba
import numpy as np

from ..errors import CorruptionError, FormatError, RemoteError, RemoteNotFound
from ..format.descriptor import DESCRIPTOR
from ..format.manifest import IDS_FILES, MANIFEST, Manifest
from ..format.npy import parse_header
from ..format.shard_table import TABLE, TABLE_HEADER_BYTES, row_dtype
from .advice import page_runs
from .mapping import MADV_RANDOM, MADV_SEQUENTIAL, PAGE, address, map_fd
from .nodecache import CachedObject, NodeCache, run_pages
from .objects import ObjectClient, ObjectMeta, redact

__all__ = ["RemoteRoot", "fetch", "ensure", "ensure_array", "paged_searchsorted", "Ticket", "remote_mappings"]

_MOST = 8 << 20  # bytes per request at most
_CHUNK = 1 << 20  # an access that asks for at least 1/_DENSE of such an aligned chunk fetches it whole
_DENSE = 16
_EDGE = 64 << 10  # a dense run also brings the missing bytes this close to its ends (rows across the chunk edge)
_HEAD = 4096  # bytes fetched from the start and the end of every file when a shard is prepared
_META = "_remote.json"


# ------------------------------------------------------------------------------------ registry


class _Region:
    __slots__ = ("base", "end", "obj", "root", "key", "etag")

    def __init__(self, base: int, end: int, obj: CachedObject, root: RemoteRoot, key: str, etag: str) -> None:
        self.base, self.end, self.obj, self.root, self.key, self.etag = base, end, obj, root, key, etag


_lock = threading.Lock()
_bases: list[int] = []  # sorted
_regions: dict[int, _Region] = {}
_index: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[_Region]] | None = None  # arrays of _bases, ends


def _register(region: _Region, owner: Any) -> None:
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


def _lookup() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[_Region]]:
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


def remote_mappings() -> int:
    """How many remote files this process has mapped now."""
    return len(_regions)


def _split_by_region(starts: Any, ends: Any) -> list[tuple[_Region, np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
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
    out = []
    for k in np.unique(i).tolist():
        m = i == k
        r = regions[k]
        out.append((r, s[m] - r.base, np.minimum(e[m], r.end) - r.base))
    return out


# ------------------------------------------------------------------------------------- tickets


class Ticket:
    """Requests started by :func:`fetch`: :meth:`wait` returns when their bytes are in the cache (or
    raises the request's error). No wait is unbounded: every request has a timeout and a bounded number
    of retries, and a wait gives up (``RemoteError``) after ``limit`` seconds, longer than all of them."""

    __slots__ = ("futures", "limit")

    def __init__(self, futures: list[Any], limit: float = 600.0) -> None:
        self.futures = futures
        self.limit = limit

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
    region: _Region, s: np.ndarray[Any, Any], e: np.ndarray[Any, Any]
) -> tuple[list[tuple[int, int]], list[Any], list[int]]:
    """(new byte runs to request, futures of requests in flight that bring other missing bytes, chunks
    claimed: to be registered as in flight with the request's future)."""
    obj = region.obj
    rs, re_ = page_runs(s, e)
    re_ = np.minimum(re_, obj.size)
    ms, me = obj.missing(rs, re_)
    if not len(ms):
        return [], [], []
    rs, re_ = _cut_at_chunks(rs, re_)
    ms, me = _cut_at_chunks(ms, me)
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
    ids, inv = np.unique(chunk, return_inverse=True)
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
        fs = np.fromiter((t[0] for t in sparse), dtype=np.int64, count=len(sparse))
        fe = np.fromiter((t[1] for t in sparse), dtype=np.int64, count=len(sparse))
        flight = obj.chunk_flight
        mchunk = ms // _CHUNK
        flown = np.sort(np.fromiter(flight, np.int64, len(flight)))  # chunks requested whole, in flight
        flying = _member(mchunk, flown)
        for c in np.unique(mchunk[flying]).tolist():  # chunks coming whole: wait for them
            waits.append(flight[c])
        whole = ~flying & _member(mchunk, dense)
        if whole.any():
            a = np.unique(mchunk[whole]) * _CHUNK
            cs, ce = obj.missing(a, np.minimum(a + _CHUNK, obj.size))
            claimed.extend(np.unique(_cut_at_chunks(cs, ce)[0] // _CHUNK).tolist())
            # A row that runs over a dense run's edge (a block's last row, 128 bytes into the next chunk,
            # then asked page by page by each later batch that draws it) comes with the run: the
            # missing pages within _EDGE of each end, outside chunks requested whole already.
            ws, we = page_runs(a, np.minimum(a + _CHUNK, obj.size))
            es = np.concatenate((np.maximum(ws - _EDGE, 0), we))
            ee = np.concatenate((ws, np.minimum(we + _EDGE, obj.size)))
            es, ee = page_runs(es[ee > es], ee[ee > es])
            xs, xe = obj.missing(es, np.minimum(ee, obj.size))
            if len(xs) and flight:
                fly = _member(xs // _CHUNK, flown)
                xs, xe = xs[~fly], xe[~fly]
            if len(xs) and len(fs):  # nor the pages a request in flight brings (nothing waits for them)
                xs, xe = _not_coming(xs, xe, fs, fe, obj.size)
            ws, we = np.concatenate((cs, xs)), np.concatenate((ce, xe))
        ms, me = ms[~(flying | whole)], me[~(flying | whole)]
        if len(fs) and len(ms):  # missing runs that a request in flight already brings: wait for it
            j, covered = _brought(fs, fe, ms, me)
            for jj in np.unique(j[covered]).tolist():
                waits.append(sparse[jj][3])
            ms, me = ms[~covered], me[~covered]
    if whole.any():  # with the sparse runs: a sparse run next to a whole one (its edge) joins it
        ms, me = np.concatenate((ws, ms)), np.concatenate((we, me))
    if len(ms):
        cs, ce = page_runs(ms, me, gap=gap, most=_MOST)  # adjacent chunks merge: fewer, larger requests
        runs.extend(zip(cs.tolist(), np.minimum(ce, obj.size).tolist()))
    return runs, waits, claimed


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


def fetch(starts: Any, ends: Any) -> Ticket:
    """Start fetching whatever is not yet in the cache of the byte ranges ``[starts[i], ends[i])``
    (absolute addresses; those outside remote mappings are ignored). Returns at once."""
    futures: list[Any] = []
    by_root: dict[int, tuple[RemoteRoot, list[tuple[str, int, int, str | None]], list[tuple[CachedObject, int]]]] = {}
    chunks: dict[int, list[tuple[CachedObject, list[int]]]] = {}
    for region, s, e in _split_by_region(starts, ends):
        if _all_present(region.obj, s, e):  # e.g. a batch whose requests have arrived: no planning
            continue
        runs, waits, claimed = _missing_requests(region, s, e)
        futures.extend(waits)
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
        futures.append(fut)
        limit = max(limit, root.client.patience())
    return Ticket(futures, limit or 600.0)


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
    again = fetch(starts, ends)  # also what another request was expected to bring and did not
    if not again.futures:
        return
    again.wait()
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


# ----------------------------------------------------------------------------------------- root


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


class RemoteRoot:
    """A store at ``url`` (see the module docstring). ``storage_options``: the client's options and
    seqstore's request options (:class:`~seqstore.io.objects.ObjectClient`); ``filesystem``: an fsspec
    filesystem instead of obstore; ``cache_dir`` / ``cache_bytes``: the node cache."""

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        filesystem: Any = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.filesystem = filesystem
        self.cache_dir = cache_dir
        self.cache_bytes = cache_bytes
        self.client = ObjectClient(self.url, self.storage_options, filesystem)
        self.cache = NodeCache.get(cache_dir, cache_bytes)
        self.mirror: Path | None = None
        self._mirrors: list[Path] = []  # earlier manifest versions' mirrors (shards mapped before a refresh)
        self._metas: dict[str, ObjectMeta] = {}
        self._meta_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RemoteRoot({self.url!r}, storage_options={redact(self.storage_options)!r})"

    def options(self) -> dict[str, Any]:
        """What reopening this root in another process needs."""
        return {
            "storage_options": self.storage_options,
            "filesystem": self.filesystem,
            "cache_dir": None if self.cache_dir is None else os.fspath(self.cache_dir),
            "cache_bytes": self.cache_bytes,
        }

    def digest(self) -> str:
        """A short name of this store's URL (its directory in the node cache)."""
        return _digest(self.url)

    def display(self, path: Path | str) -> str:
        """The URL of a mirror path (for messages)."""
        text = os.fspath(path)
        if self.mirror is not None:
            m = os.fspath(self.mirror)
            if text.startswith(m):
                return self.url + text[len(m) :]
        return text

    def submit(
        self,
        reqs: list[tuple[str, int, int, str | None]],
        fills: list[tuple[CachedObject, int]],
        chunks: Sequence[tuple[CachedObject, list[int]]] = (),
    ) -> Any:
        """Submit range requests whose answers are written into the cache entries ``fills``; ``chunks``:
        the aligned chunks of cache entries these requests bring whole (in flight until they arrive)."""
        self.cache.reserve(sum(_pages(b) - a // PAGE * PAGE for _, a, b, _ in reqs))
        spans = [(obj, a, a + (r[2] - r[1])) for (obj, a), r in zip(fills, reqs)]

        def on_each(i: int, data: memoryview, meta: ObjectMeta | None) -> None:
            obj, a, _ = spans[i]
            obj.fill(a, data)

        fut = self.client.submit(reqs, on_each, with_meta=False)
        for obj, a, b in spans:
            with obj.lock:
                bisect.insort(obj.inflight, (a, b, id(fut), fut))

        for obj, ids in chunks:
            with obj.lock:
                for c in ids:
                    obj.chunk_flight[c] = fut

        def done(_f: Any) -> None:
            for obj, ids in chunks:
                with obj.lock:
                    for c in ids:
                        if obj.chunk_flight.get(c) is fut:
                            del obj.chunk_flight[c]
            for obj, a, b in spans:
                with obj.lock:
                    try:
                        obj.inflight.remove((a, b, id(fut), fut))
                    except ValueError:
                        pass

        fut.add_done_callback(done)
        return fut

    # ---------------------------------------------------------------------------------- manifest

    def load(self) -> Path:
        """Fetch the manifest and the shard table into a mirror directory; return its path."""
        try:
            raw, meta = self.client.get(MANIFEST)
        except RemoteNotFound:
            raise FormatError(f"{self.url}: no seqstore store here ({MANIFEST} does not exist)") from None
        data = bytes(raw)
        version = _digest(meta.etag, str(len(data)), str(zlib.crc32(data)))
        mirror = self.cache.root / "stores" / _digest(self.url) / version
        if not (mirror / MANIFEST).exists():
            self._build_mirror(mirror, data)
        try:
            os.utime(mirror)
        except OSError:
            pass
        self.cache.pin(mirror)  # never evicted while this process may read it
        if self.mirror is not None and self.mirror != mirror:
            self._mirrors.append(self.mirror)
        self.mirror = mirror
        self._metas = {}
        return mirror

    def _build_mirror(self, mirror: Path, manifest_bytes: bytes) -> None:
        tmp = mirror.with_name(f"{mirror.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            (tmp / MANIFEST).write_bytes(manifest_bytes)
            need = 0
            table = TABLE  # or the immutable _shards/<name>.tbl a remote writer's commit names
            try:
                obj = json.loads(manifest_bytes)
                m = Manifest._from_json(obj, int(obj["version"]))
                if m.table is not None and m.table.rows > 0:
                    need = TABLE_HEADER_BYTES + m.table.rows * row_dtype(len(m.ragged)).itemsize
                    table = m.table.file
            except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
                need = 0  # the reader reports the malformed manifest, naming it
            if need:
                try:
                    got = self.client.get_ranges([(table, 0, need, None)])
                except RemoteNotFound:
                    raise CorruptionError(
                        f"{self.url}/{table}: shard table is missing (the manifest lists rows)"
                    ) from None
                (tmp / table).parent.mkdir(parents=True, exist_ok=True)
                (tmp / table).write_bytes(got[0][0])
            self.cache.reserve(_pages(len(manifest_bytes)) + _pages(need))
            try:
                os.rename(tmp, mirror)
            except OSError:  # another process built it first (or left it incomplete: fill it in)
                if not (mirror / MANIFEST).exists():
                    mirror.mkdir(parents=True, exist_ok=True)
                    for f in tmp.iterdir():
                        os.replace(f, mirror / f.name)
        finally:
            if tmp.exists():
                import shutil

                shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------------------------------ shards

    def prepare_shards(self, shards: Sequence[tuple[str, Sequence[str], int | None]]) -> None:
        """Make the descriptors and the file heads of shards ``(name, files, descriptor CRC-32 or None)``
        local, all in one wave of requests: the descriptor (version 3: where a CRC is given; it is written
        into the mirror only if its CRC matches), and per file its first 4 KiB (the ``.npy`` header; the
        answer also carries the object's size and ETag) and, for offsets, its last 4 KiB (the last offset,
        checked at mapping). Nothing is requested for what this node's cache already holds."""
        assert self.mirror is not None
        reqs: list[tuple[str, int, int, str | None]] = []
        todo: list[tuple[str, str, bool]] = []  # (key, what, known) per request
        crcs: dict[str, int] = {}
        for name, files, descriptor in shards:
            if descriptor is not None:
                crcs[f"{name}/{DESCRIPTOR}"] = descriptor
            known = self._known(name)
            if descriptor and not (self.mirror / name / DESCRIPTOR).exists():
                reqs.append((f"{name}/{DESCRIPTOR}", 0, -1, None))
                todo.append((f"{name}/{DESCRIPTOR}", "descriptor", False))
            for rel in files:
                key = f"{name}/{rel}"
                m = known.get(rel)
                if m is not None:
                    with self._meta_lock:
                        self._metas[key] = m
                    obj = self.cache.object(self.client.key_url(key), m.etag, m.size)
                    if not obj.present(0, min(m.size, _HEAD)):
                        reqs.append((key, 0, min(m.size, _HEAD), m.etag or None))
                        todo.append((key, "head", True))
                    if rel.endswith(".offsets.npy") and not obj.present(max(0, m.size - 8), m.size):
                        a = max(0, m.size - _HEAD) // PAGE * PAGE
                        reqs.append((key, a, m.size, m.etag or None))
                        todo.append((key, "tail", True))
                    continue
                reqs.append((key, 0, _HEAD, None))
                todo.append((key, "head", False))
                if rel.endswith(".offsets.npy"):
                    reqs.append((key, -_HEAD, -1, None))
                    todo.append((key, "tail", False))
        if not reqs:
            return
        try:
            got = self.client.get_ranges(reqs)
        except RemoteNotFound as exc:
            raise CorruptionError(f"{exc.url}: object is missing (the shard table lists it)") from None
        fresh: dict[str, dict[str, list[Any]]] = {}
        filled = 0
        for (key, what, _), (data, _m) in zip(todo, got):
            if what == "descriptor" and zlib.crc32(data) != crcs[key]:
                raise CorruptionError(
                    f"{self.client.key_url(key)}: CRC-32 {zlib.crc32(data):#010x} of the descriptor differs from "
                    f"the shard table's {crcs[key]:#010x}: the store was replaced since it was opened (reopen it) "
                    "or the object is damaged"
                )
        for (key, what, known_meta), req, (data, meta) in zip(todo, reqs, got):
            name, _, rel = key.partition("/")
            if what == "descriptor":
                (self.mirror / name).mkdir(parents=True, exist_ok=True)
                self._write(self.mirror / key, bytes(data))
                continue
            assert meta is not None
            have = self._metas.get(key)
            if have is not None and have.etag != meta.etag:
                raise CorruptionError(f"{self.client.key_url(key)}: the object changed while it was read")
            obj = self.cache.object(self.client.key_url(key), meta.etag, meta.size)
            start = req[1] if req[1] >= 0 else max(0, meta.size - len(data))
            filled += _pages(start + len(data)) - start // PAGE * PAGE
            obj.fill(start, data)
            if not known_meta:
                with self._meta_lock:
                    self._metas[key] = ObjectMeta(key, meta.size, meta.etag)
                fresh.setdefault(name, {})[rel] = [meta.size, meta.etag]
        self.cache.reserve(filled)
        for name, saved in fresh.items():
            (self.mirror / name).mkdir(parents=True, exist_ok=True)
            merged = {rel: [m.size, m.etag] for rel, m in self._known(name).items()}
            merged.update(saved)
            self._write(self.mirror / name / _META, json.dumps(merged).encode())

    def _write(self, path: Path, data: bytes) -> None:
        """Write a mirror file atomically, its disk space counted in the cache's budget."""
        self.cache.reserve(_pages(len(data)))
        _atomic_write(path, data)

    def _known(self, name: str) -> dict[str, ObjectMeta]:
        """Sizes and ETags of shard ``name``'s objects this node has seen (``_remote.json`` in the mirror)."""
        assert self.mirror is not None
        try:
            saved = json.loads((self.mirror / name / _META).read_text())
            return {rel: ObjectMeta(f"{name}/{rel}", int(v[0]), str(v[1])) for rel, v in saved.items()}
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError, KeyError, IndexError, OSError, AttributeError):
            return {}

    def _meta(self, key: str) -> ObjectMeta:
        m = self._metas.get(key)
        if m is None:
            name, _, rel = key.rpartition("/")
            # a shard's id files come together, on its first id lookup; others (a merged id index run) alone
            self.prepare_shards([(name, IDS_FILES if rel in IDS_FILES else [rel], None)])
            m = self._metas.get(key)
            if m is None:
                raise CorruptionError(f"{self.client.key_url(key)}: object is missing")
        return m

    def map_npy(
        self, path: Path, info: Any, dtype: np.dtype[Any], shape: tuple[int, ...], *, sequential: bool = False
    ) -> np.ndarray[Any, Any]:
        """The remote counterpart of the reader's ``map_npy``: map the cache entry of the object
        behind mirror path ``path`` after the same checks (size, header)."""
        assert self.mirror is not None
        key = self._key(path)
        url = self.client.key_url(key)
        meta = self._meta(key)
        size = meta.size
        if info is not None and size != info.bytes:
            raise CorruptionError(
                f"{url}: object has {size} bytes, manifest says {info.bytes} (truncated or replaced?)"
            )
        obj = self.cache.object(url, meta.etag, size)
        head_len = min(size, _HEAD)
        if not obj.present(0, head_len):
            got = self.client.get_ranges([(key, 0, head_len, meta.etag or None)])
            obj.fill(0, got[0][0])
        header = parse_header(os.pread(obj.fd, head_len, 0), url)
        if header.data_offset > head_len:  # a header longer than a page
            got = self.client.get_ranges([(key, 0, header.data_offset, meta.etag or None)])
            header = parse_header(bytes(got[0][0]), url)
        if header.dtype != dtype:
            raise CorruptionError(f"{url}: header dtype {header.dtype.str}, expected {dtype.str}")
        if header.shape != shape:
            raise CorruptionError(f"{url}: header shape {header.shape}, expected {shape}")
        if header.data_offset + header.data_bytes != size:
            raise CorruptionError(f"{url}: {size} bytes but header says {header.data_offset + header.data_bytes}")
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            empty = np.empty(shape, dtype=dtype)
            empty.flags.writeable = False
            return empty
        raw = map_fd(obj.fd, size, advice=MADV_SEQUENTIAL if sequential else MADV_RANDOM, name=url)
        base = address(raw)
        _register(_Region(base, base + size, obj, self, key, meta.etag), raw.base if raw.base is not None else raw)
        return np.frombuffer(raw, dtype=dtype, count=count, offset=header.data_offset).reshape(shape)

    def fetch_descriptors(self, names: Sequence[str]) -> None:
        """Fetch the descriptors of shards ``names`` not yet in the mirror, all in one wave (for
        ``info`` and ``verify``, which read every shard's descriptor)."""
        assert self.mirror is not None
        todo = [n for n in names if not (self.mirror / n / DESCRIPTOR).exists()]
        for lo in range(0, len(todo), 4096):
            part = todo[lo : lo + 4096]
            got = self.client.get_ranges([(f"{n}/{DESCRIPTOR}", 0, -1, None) for n in part], missing_ok=True)
            for n, (data, meta) in zip(part, got):
                if meta is None:  # missing: the reader reports it, naming the descriptor
                    continue
                (self.mirror / n).mkdir(parents=True, exist_ok=True)
                self._write(self.mirror / n / DESCRIPTOR, bytes(data))

    def materialize(self, keys: Sequence[str]) -> None:
        """Fetch the whole objects ``keys`` into the cache and link them into the mirror under their
        names, so that code reading local files (``verify``) reads them. Missing objects stay missing."""
        assert self.mirror is not None
        for key in keys:
            try:
                meta = self._meta(key)
            except CorruptionError:
                continue
            obj = self.cache.object(self.client.key_url(key), meta.etag, meta.size)
            ms, me = obj.missing(np.array([0], np.int64), np.array([max(meta.size, 1)], np.int64))
            runs = [(a, min(a + _MOST, int(e))) for s0, e in zip(ms.tolist(), me.tolist()) for a in range(s0, e, _MOST)]
            if runs:
                fut = self.submit([(key, a, b, meta.etag or None) for a, b in runs], [(obj, a) for a, _ in runs])
                fut.result()
            link = self.mirror / key
            link.parent.mkdir(parents=True, exist_ok=True)
            tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
            os.symlink(obj.data_path, tmp)
            os.replace(tmp, link)

    def _key(self, path: Path) -> str:
        """The object key of mirror path ``path`` (of this manifest version's mirror or an earlier one:
        a Store that refreshed keeps the shards it had mapped)."""
        for mirror in (self.mirror, *self._mirrors):
            if mirror is not None and path.is_relative_to(mirror):
                return path.relative_to(mirror).as_posix()
        raise ValueError(f"{path} is not in a mirror of {self.url}")

    def shard_files(self, manifest: Manifest) -> list[str]:
        """The files a shard's records need (its id files are prepared on the first id lookup)."""
        return list(manifest.data_files())


def _pages(n: int) -> int:
    """``n`` rounded up to whole pages (what a file of ``n`` bytes takes on disk)."""
    return -(-n // PAGE) * PAGE


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


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
