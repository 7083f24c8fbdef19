"""Byte ranges of remote mappings fetched into memory the reader owns, not into the node cache.

A read-once epoch (:class:`~seqstore.io.options.StoreOptions`) reads each run of batches once; through
the node cache every byte would be copied twice more and take page-cache memory never read again.
:func:`fetch_into` merges the ranges a run needs (per mapped file, closer than ``coalesce_gap``), receives
the merged segments into one buffer from the caller's pool (with the
:class:`~seqstore.io.object_direct.DirectReader` where the objects have URLs, else through the back end:
one copy more) and returns a :class:`Part`. :func:`segments`: the table a batch is gathered through, in
this process or in another that maps the same store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import StaleStoreError
from .mapping import address
from .remote_fetch import MOST, Fetcher, Ticket

__all__ = ["Part", "fetch_into", "merge_ranges", "segment_table", "segments"]


def merge_ranges(s: np.ndarray[Any, Any], e: np.ndarray[Any, Any], gap: int) -> tuple[Any, Any, Any]:
    """Ranges ``[s, e)`` merged where they overlap or lie at most ``gap`` bytes apart: the merged
    starts and ends (ascending) and, for each given range, the index of the merged range holding it."""
    if not len(s):
        z = np.zeros(0, np.int64)
        return z, z, z
    o = np.argsort(s)  # any order of equal starts merges the same
    ss, es = s[o], e[o]
    reach = np.maximum.accumulate(es)
    new = np.empty(len(ss), bool)
    new[0] = True
    new[1:] = ss[1:] > reach[:-1] + gap
    first = np.flatnonzero(new)
    ids = np.empty(len(s), np.int64)
    ids[o] = np.cumsum(new) - 1
    return ss[first], np.maximum.reduceat(es, first), ids


class Part:
    """Fetched segments: bytes of addresses ``[seg_s[j], seg_e[j])`` of the mappings land at address
    ``seg_at[j]`` (inside ``buffer``); :meth:`wait` returns once all are in, or raises the fetch's error
    (bounded as a :class:`~seqstore.io.remote_fetch.Ticket`'s wait). ``users``: holders of the buffer
    (1, its fetcher, to begin with); :meth:`release` drops one, and the last calls ``on_free(buffer)``."""

    __slots__ = ("fetcher", "seg_s", "seg_e", "seg_at", "buffer", "ticket", "nbytes", "users", "on_free", "exported")

    def __init__(self, fetcher: Fetcher, seg_s: Any, seg_e: Any, seg_at: Any, buffer: Any, futures: list[Any],
                 limit: float) -> None:
        self.fetcher = fetcher
        self.seg_s, self.seg_e, self.seg_at, self.buffer = seg_s, seg_e, seg_at, buffer
        self.ticket = Ticket(futures, limit, url=fetcher.client.url)
        self.nbytes = int((seg_e - seg_s).sum()) if len(seg_s) else 0
        self.users = 1
        self.on_free: Callable[[Any], None] | None = None
        self.exported: Any = None  # (see export_part)

    def wait(self) -> None:
        try:
            self.ticket.wait()
        except StaleStoreError:
            self.fetcher.changed(r.key for r, _, _ in self.fetcher.split(self.seg_s, self.seg_e))
            raise

    def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.on_free is not None:
            self.on_free(self.buffer)

    def export(self) -> tuple[list[tuple[str, str]], Any, Any, Any, Any]:
        """The segments as another process that maps the same store finds them: the objects (store URL,
        key), and per segment its object's number in that list, its offsets in the object and its offset
        in the buffer. Computed once."""
        if self.exported is None:
            base = address(self.buffer) if len(self.buffer) else 0
            url = self.fetcher.client.url
            split = self.fetcher.split(self.seg_s, self.seg_e, self.seg_at - base)  # (region, starts, ends, at)
            ids = [np.full(len(p[1]), k, np.int64) for k, p in enumerate(split)]
            cols = (ids, *([p[j] for p in split] for j in (1, 2, 3)))
            z = np.zeros(0, np.int64)
            self.exported = ([(url, p[0].key) for p in split], *(np.concatenate(x) if x else z for x in cols))
        return self.exported  # type: ignore[no-any-return]


def fetch_into(fetcher: Fetcher, starts: Any, ends: Any, alloc: Callable[[int], np.ndarray[Any, Any]]) -> Part:
    """Start fetching the bytes of ranges ``[starts, ends)`` (absolute addresses inside ``fetcher``'s
    mappings; others are ignored) into a buffer of ``alloc(nbytes)`` (a C-contiguous ``uint8`` array of at least
    that many bytes). Returns at once; the :class:`Part` says where each merged segment lands."""
    client = fetcher.client
    merged = []
    total = 0
    for region, s, e in fetcher.split(starts, ends):
        ms, me, _ = merge_ranges(s, e, int(client.coalesce_gap))
        merged.append((region, ms, me))
        total += int((me - ms).sum())
    buffer = alloc(total)
    at = address(buffer) if total else 0
    seg_s, seg_e, seg_at = [], [], []
    direct_reqs: list[Any] = []
    fallback: list[Any] = []
    view = buffer.data.cast("B") if total else memoryview(b"")
    off = 0
    for region, ms, me in merged:
        lens = me - ms
        offs = off + np.concatenate(([0], np.cumsum(lens)[:-1])) if len(lens) else lens
        seg_s.append(region.base + ms)
        seg_e.append(region.base + me)
        seg_at.append(at + offs)
        off += int(lens.sum())
        direct = client.direct(region.key, region.etag)
        for a, b, o in zip(ms.tolist(), me.tolist(), offs.tolist()):
            for p in range(a, b, MOST):  # requests of at most MOST bytes, each into its place
                q = min(b, p + MOST)
                dest = view[o + p - a : o + q - a]
                if direct is not None:
                    direct_reqs.append((direct[0], p, q, direct[1], dest))
                else:
                    fallback.append(((region.key, p, q, region.etag), dest))
    futures = []
    if direct_reqs:
        futures.append(client.direct_reader.submit(direct_reqs))
    if fallback:
        dests = [d for _, d in fallback]

        def on_each(i: int, data: memoryview, meta: Any) -> None:
            dests[i][:] = data

        futures.append(client.submit([r for r, _ in fallback], on_each, with_meta=False))
    return Part(fetcher, *segment_table(seg_s, seg_e, seg_at), buffer, futures, max(600.0, client.patience()))


def segments(fetcher: Fetcher, parts: list[Any]) -> tuple[Any, Any, Any]:
    """The segment table (starts, ends, buffer addresses; by start) that
    :func:`~seqstore.store.read.copy.copy_via` reads ``parts`` through in this process: parts
    (:class:`Part`) fetched here, or ``(p.export(), address of p's buffer here)`` of parts another
    process fetched from the same store (``fetcher`` is this process's). Segments of objects not
    mapped here are left out: look the batch's shards up first (a run's parts hold other batches' too)."""
    if parts and isinstance(parts[0], Part):
        if len(parts) == 1:  # a part's own table is sorted already
            return parts[0].seg_s, parts[0].seg_e, parts[0].seg_at
        return segment_table([p.seg_s for p in parts], [p.seg_e for p in parts], [p.seg_at for p in parts])
    url = fetcher.client.url
    here = {(url, r.key): r.base for r in fetcher.regions()}
    seg_s, seg_e, seg_at = [], [], []
    for (objects, ids, s, e, at), buf in parts:
        bases = np.array([here.get(o, -1) for o in objects], np.int64)
        b = bases[ids] if len(ids) else ids
        mine = b >= 0
        seg_s.append(b[mine] + s[mine])
        seg_e.append(b[mine] + e[mine])
        seg_at.append(buf + at[mine])
    return segment_table(seg_s, seg_e, seg_at)


def segment_table(seg_s: list[Any], seg_e: list[Any], seg_at: list[Any]) -> tuple[Any, Any, Any]:
    """Segment lists (starts, ends, buffer addresses; one array per part) as one table sorted by start,
    as :func:`~seqstore.store.read.copy.copy_via` reads it."""
    if not seg_s:
        z = np.zeros(0, np.int64)
        return z, z, z
    s_all = np.concatenate(seg_s)
    o = np.argsort(s_all, kind="stable")
    return s_all[o], np.concatenate(seg_e)[o], np.concatenate(seg_at)[o]
