"""Batching by length: greedy batches in order (:func:`batch_indices`) and length-bucketed batches
from a bounded buffer (:func:`bucket_batches`).

Both walk the order in chunks (an :class:`~seqstore.order.Order`'s ``iter_chunks`` or slices of an
array), gather the chunk's lengths in one vectorised ``take`` and run a numba kernel over it; batches
come out lazily as int64 arrays of indices. Nothing per sequence is kept beyond the current chunk
(plus the open batch, or the bucket buffer).

Limits: a batch never has more than ``max_seqs`` sequences, nor more than ``max_frames`` frames,
counted as ``max length x count`` (``padded=True``, what a padded tensor costs) or as the sum of
lengths (``padded=False``). A sequence longer than ``max_frames`` on its own becomes a batch of its
own; such sequences are counted (``.overlong``) and reported with one ``logging`` warning when the
iteration ends; they are never dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numba
import numpy as np

from ._lengths import IntArray, LengthsView, as_lengths, check_int

__all__ = ["BatchIterator", "batch_indices", "bucket_batches"]

log = logging.getLogger(__name__)

_CHUNK = 1 << 16
_NO_LIMIT = np.int64(-1)


def _chunks(order: Any, size: int) -> Iterator[IntArray]:
    it = getattr(order, "iter_chunks", None)
    if it is not None:
        for c in it(size):
            yield np.asarray(c, dtype=np.int64)
        return
    arr = np.asarray(order)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"order must be an Order or a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}")
    for a in range(0, len(arr), size):
        yield np.asarray(arr[a : a + size], dtype=np.int64)


def _limits(max_frames: int | None, max_seqs: int | None, owner: str) -> tuple[np.int64, np.int64]:
    """(max_frames, max_seqs) for the kernels, ``_NO_LIMIT`` for None; at least one must be given."""
    if max_frames is None and max_seqs is None:
        raise ValueError(f"{owner} needs max_frames or max_seqs (or both)")
    return _limit(max_frames, "max_frames"), _limit(max_seqs, "max_seqs")


def _limit(value: int | None, what: str) -> np.int64:
    return _NO_LIMIT if value is None else np.int64(check_int(value, what, 1))


@numba.njit(cache=True, nogil=True)
def _cost(count: np.int64, maxlen: np.int64, total: np.int64, padded: bool) -> Any:  # pragma: no cover
    return maxlen * count if padded else total


@numba.njit(cache=True, nogil=True)
def _greedy(lens: Any, max_frames: np.int64, max_seqs: np.int64, padded: bool, state: Any,
            cuts: Any) -> Any:  # pragma: no cover - numba
    """Scan ``lens``; ``state`` = [count, max, sum, overlong] of the open batch (carried between chunks).
    Writes chunk positions where a batch ends (exclusive) to ``cuts``; returns how many."""
    cnt, mx, tot = state[0], state[1], state[2]
    k = 0
    for i in range(lens.shape[0]):
        ln = lens[i]
        if max_frames >= 0 and ln > max_frames:
            if cnt > 0:
                cuts[k] = i
                k += 1
            cuts[k] = i + 1
            k += 1
            state[3] += 1
            cnt, mx, tot = 0, 0, 0
            continue
        ncnt = cnt + 1
        nmx = max(mx, ln)
        ntot = tot + ln
        over = (max_seqs >= 0 and ncnt > max_seqs) or (max_frames >= 0 and _cost(ncnt, nmx, ntot, padded) > max_frames)
        if cnt > 0 and over:
            cuts[k] = i
            k += 1
            cnt, mx, tot = 1, ln, ln
        else:
            cnt, mx, tot = ncnt, nmx, ntot
    state[0], state[1], state[2] = cnt, mx, tot
    return k


class BatchIterator(Iterator[IntArray]):
    """An iterable of batches (int64 index arrays). ``overlong`` counts sequences longer than
    ``max_frames`` (each alone in a batch); ``num_batches`` counts batches yielded so far."""

    def __init__(self, gen: Iterator[IntArray], max_frames: int | None) -> None:
        self._gen = gen
        self._max_frames = max_frames
        self.overlong = 0
        self.num_batches = 0
        self._warned = False

    def __next__(self) -> IntArray:
        try:
            batch = next(self._gen)
        except StopIteration:
            if self.overlong and not self._warned:
                log.warning("%d sequence(s) longer than max_frames=%s were put in batches of their own",
                            self.overlong, self._max_frames)
                self._warned = True
            raise
        self.num_batches += 1
        return batch


def batch_indices(order: Any, lengths: Any, *, max_frames: int | None = None, max_seqs: int | None = None,
                  padded: bool = True, chunk_size: int = _CHUNK) -> BatchIterator:
    """Greedy batches of ``order`` (an Order or 1-D int array of indices), in order.

    ``lengths``: the lengths of the index space (a LengthsView, store ``Lengths``, array or memmap),
    gathered per chunk. A batch is closed when the next sequence would break ``max_seqs`` or
    ``max_frames`` (see the module docstring). Yields int64 arrays; memory O(chunk_size + batch).
    """
    mf, ms = _limits(max_frames, max_seqs, "batch_indices")
    chunk_size = check_int(chunk_size, "batch_indices: chunk_size", 1)
    view = as_lengths(lengths)
    it = BatchIterator(iter(()), max_frames)

    def gen() -> Iterator[IntArray]:
        state = np.zeros(4, dtype=np.int64)
        carry = np.empty(0, dtype=np.int64)
        for chunk in _chunks(order, chunk_size):
            lens = view.take(chunk)
            cuts = np.empty(2 * len(chunk) + 1, dtype=np.int64)
            k = int(_greedy(lens, mf, ms, padded, state, cuts))
            it.overlong = int(state[3])
            prev = 0
            for c in cuts[:k].tolist():
                if len(carry):
                    yield np.concatenate([carry, chunk[prev:c]])
                    carry = np.empty(0, dtype=np.int64)
                elif c > prev:
                    yield chunk[prev:c]
                prev = c
            rest = chunk[prev:]
            carry = np.concatenate([carry, rest]) if len(carry) else rest.copy()
        if len(carry):
            yield carry

    it._gen = gen()
    return it


# ------------------------------------------------------------------------------------ buckets


@numba.njit(cache=True, nogil=True)
def _next_rand(rng: Any) -> Any:  # pragma: no cover - numba
    """splitmix64 step on rng[0]."""
    rng[0] += np.uint64(0x9E3779B97F4A7C15)
    z = rng[0]
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, nogil=True)
def _emit(b: np.int64, head: Any, tail: Any, count: Any, total: Any, maxl: Any, nxt: Any, sidx: Any, slen: Any,
          free: Any, st: Any, max_frames: np.int64, max_seqs: np.int64, padded: bool, out: Any, cuts: Any,
          no: Any) -> None:  # pragma: no cover - numba
    """Pop a greedy batch from the front of bucket ``b`` into ``out``; record its end in ``cuts``."""
    cnt, mx, tot = np.int64(0), np.int64(0), np.int64(0)
    s = head[b]
    while s >= 0:
        ln = slen[s]
        ncnt = cnt + 1
        nmx = max(mx, ln)
        ntot = tot + ln
        over = (max_seqs >= 0 and ncnt > max_seqs) or (max_frames >= 0 and _cost(ncnt, nmx, ntot, padded) > max_frames)
        if cnt > 0 and over:
            break
        out[no[0]] = sidx[s]
        no[0] += 1
        cnt, mx, tot = ncnt, nmx, ntot
        nx = nxt[s]
        free[st[1]] = s
        st[1] += 1
        st[0] -= 1
        s = nx
    head[b] = s
    if s < 0:
        tail[b] = -1
    count[b] -= cnt
    total[b] -= tot
    m = np.int64(0)
    t = s
    while t >= 0:
        m = max(m, slen[t])
        t = nxt[t]
    maxl[b] = m
    cuts[no[1]] = no[0]
    no[1] += 1


@numba.njit(cache=True, nogil=True)
def _pick(count: Any, total: Any, maxl: Any, max_frames: np.int64, max_seqs: np.int64, padded: bool, rng: Any,
          largest: bool) -> Any:  # pragma: no cover - numba
    """A uniformly random bucket holding a full batch; else the fullest (``largest``) or a random
    non-empty one; -1 if all are empty."""
    nb = count.shape[0]
    ready = 0
    nonempty = 0
    for b in range(nb):
        if count[b] > 0:
            nonempty += 1
            if (max_seqs >= 0 and count[b] >= max_seqs) or (
                max_frames >= 0 and _cost(count[b], maxl[b], total[b], padded) >= max_frames
            ):
                ready += 1
    if nonempty == 0:
        return -1
    if ready > 0:
        r = np.int64(_next_rand(rng) % np.uint64(ready))
        for b in range(nb):
            if count[b] > 0 and ((max_seqs >= 0 and count[b] >= max_seqs) or (
                max_frames >= 0 and _cost(count[b], maxl[b], total[b], padded) >= max_frames
            )):
                if r == 0:
                    return b
                r -= 1
    if largest:
        best = 0
        for b in range(nb):
            if count[b] > count[best]:
                best = b
        return best
    r = np.int64(_next_rand(rng) % np.uint64(nonempty))
    for b in range(nb):
        if count[b] > 0:
            if r == 0:
                return b
            r -= 1
    return -1


@numba.njit(cache=True, nogil=True)
def _bucket_feed(idx: Any, lens: Any, bkt: Any, final: bool, head: Any, tail: Any, count: Any, total: Any,
                 maxl: Any, nxt: Any, sidx: Any, slen: Any, free: Any, st: Any, rng: Any, capacity: np.int64,
                 max_frames: np.int64, max_seqs: np.int64, padded: bool, out: Any, cuts: Any,
                 no: Any) -> None:  # pragma: no cover - numba
    """Insert a chunk into the bucket buffer (emitting a batch whenever it is full), then drain if
    ``final``. ``st`` = [buffered, free top, overlong]; ``no`` = [out used, cuts used]."""
    for i in range(idx.shape[0]):
        ln = lens[i]
        if max_frames >= 0 and ln > max_frames:
            out[no[0]] = idx[i]
            no[0] += 1
            cuts[no[1]] = no[0]
            no[1] += 1
            st[2] += 1
            continue
        if st[0] >= capacity:
            b = _pick(count, total, maxl, max_frames, max_seqs, padded, rng, True)
            _emit(b, head, tail, count, total, maxl, nxt, sidx, slen, free, st, max_frames, max_seqs, padded,
                  out, cuts, no)
        st[1] -= 1
        s = free[st[1]]
        st[0] += 1
        sidx[s] = idx[i]
        slen[s] = ln
        nxt[s] = -1
        b = bkt[i]
        if tail[b] >= 0:
            nxt[tail[b]] = s
        else:
            head[b] = s
        tail[b] = s
        count[b] += 1
        total[b] += ln
        maxl[b] = max(maxl[b], ln)
    if final:
        while True:
            b = _pick(count, total, maxl, max_frames, max_seqs, padded, rng, False)
            if b < 0:
                break
            _emit(b, head, tail, count, total, maxl, nxt, sidx, slen, free, st, max_frames, max_seqs, padded,
                  out, cuts, no)


def _boundaries(buckets: Any, order: Any, view: LengthsView, buffer_size: int) -> IntArray:
    if isinstance(buckets, (int, np.integer)) and not isinstance(buckets, bool):
        nb = int(buckets)
        if nb < 1:
            raise ValueError(f"buckets must be >= 1, got {nb}")
        head = next(_chunks(order, max(buffer_size, 1)), np.empty(0, dtype=np.int64))
        sample = view.take(head)
        if nb == 1 or sample.size == 0:
            return np.empty(0, dtype=np.int64)
        qs = np.quantile(sample, np.arange(1, nb) / nb, method="lower")
        return np.unique(np.asarray(qs, dtype=np.int64) + 1)
    edges = np.asarray(buckets)
    if edges.ndim != 1 or (edges.size and edges.dtype.kind not in "iuf"):
        raise ValueError(f"buckets must be a number of buckets or ascending boundaries, got {buckets!r}")
    if edges.size > 1 and bool(np.any(np.diff(edges) <= 0)):
        raise ValueError(f"bucket boundaries must be strictly ascending, got {edges.tolist()}")
    return edges


def bucket_batches(order: Any, lengths: Any, *, buckets: Any, buffer_size: int, max_frames: int | None = None,
                   max_seqs: int | None = None, padded: bool = True, seed: int = 0,
                   chunk_size: int = _CHUNK) -> BatchIterator:
    """Length-bucketed batches from a bounded buffer, deterministic (Lhotse's dynamic bucketing idea).

    ``buckets``: ascending length boundaries (bucket ``k`` holds ``boundaries[k-1] <= length <
    boundaries[k]``) or a number of buckets (boundaries from quantiles of the first ``buffer_size``
    lengths of the order). Sequences are read in order into a buffer of at most ``buffer_size``; when
    it is full one batch is emitted: the greedy front batch of a random bucket that holds a full batch
    (else of the fullest bucket). At the end the buffer drains the same way. Every sequence of the
    order comes out exactly once; batches obey the limits of :func:`batch_indices`. The randomness is
    a splitmix64 stream seeded by ``seed``. Memory O(buffer_size + chunk_size).
    """
    mf, ms = _limits(max_frames, max_seqs, "bucket_batches")
    cap = check_int(buffer_size, "buffer_size", 1)
    chunk_size = check_int(chunk_size, "bucket_batches: chunk_size", 1)
    view = as_lengths(lengths)
    edges = _boundaries(buckets, order, view, cap)
    nb = len(edges) + 1
    it = BatchIterator(iter(()), max_frames)

    def gen() -> Iterator[IntArray]:
        head = np.full(nb, -1, dtype=np.int64)
        tail = np.full(nb, -1, dtype=np.int64)
        count = np.zeros(nb, dtype=np.int64)
        total = np.zeros(nb, dtype=np.int64)
        maxl = np.zeros(nb, dtype=np.int64)
        nxt = np.full(cap, -1, dtype=np.int64)
        sidx = np.zeros(cap, dtype=np.int64)
        slen = np.zeros(cap, dtype=np.int64)
        free = np.arange(cap - 1, -1, -1, dtype=np.int64)
        st = np.array([0, cap, 0], dtype=np.int64)
        rng = np.array([np.uint64(int(seed) & ((1 << 64) - 1))], dtype=np.uint64)
        chunks = _chunks(order, chunk_size)
        pending = next(chunks, None)
        while True:
            chunk = pending if pending is not None else np.empty(0, dtype=np.int64)
            pending = next(chunks, None) if pending is not None else None
            final = pending is None
            lens = view.take(chunk)
            bkt = np.searchsorted(edges, lens, side="right").astype(np.int64) if len(edges) else np.zeros(
                len(chunk), dtype=np.int64)
            room = len(chunk) + cap + 1  # a chunk can flush everything buffered before it plus itself
            out = np.empty(room, dtype=np.int64)
            cuts = np.empty(room, dtype=np.int64)
            no = np.zeros(2, dtype=np.int64)
            _bucket_feed(chunk, lens, bkt, final, head, tail, count, total, maxl, nxt, sidx, slen, free, st, rng,
                         np.int64(cap), mf, ms, padded, out, cuts, no)
            it.overlong = int(st[2])
            prev = 0
            for c in cuts[: int(no[1])].tolist():
                yield out[prev:c]
                prev = c
            if final:
                return

    it._gen = gen()
    return it
