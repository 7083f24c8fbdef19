"""Packing plans from document lengths alone: where each token of a packed sequence comes from.

A *share* (one rank x worker of one run) walks its pending documents: a list of ranges
``[epoch, start, stop, off]`` of positions in the document stream's epochs (``off``: tokens of the
range's first document already used; a re-split also writes runs of blocks, :mod:`._shares`), then,
when they run out, block ``share`` of ``num_shares`` of
every following epoch (:func:`seqstore.order.block_bounds`). A :class:`Planner` pulls documents from
that cursor and cuts them into *pieces* ``(sequence, document id, offset, count)`` by the rules of
the two modes (:mod:`seqstore.data.packing`; ``concat``: the last token of a window is the label of its
last input and the first input of the next; ``best_fit``'s choice of the longest fitting document is numba).

Plans read lengths only, never tokens, so the process that keeps the resume state replays what the
workers packed. :func:`~seqstore.data._shares.resplit` turns the states of ``S`` shares into those of
``S'`` shares with no document token repeated or skipped (elastic resume).
"""

from __future__ import annotations

from typing import Any, Protocol

import numba
import numpy as np

from ..order import block_bounds
from ._lengths import IntArray
from ._shares import block, copy_range, fresh_shares, new_stats, resplit, sum_stats

__all__ = ["DocStream", "Planner", "fresh_shares", "new_stats", "resplit", "sum_stats"]

_PULL = 256
#: at most this many documents pulled at once when best_fit's window runs dry (documents without tokens)
_PULL_MAX = 1 << 16
#: documents pulled at least when a plan runs short (pulling concatenates the pulled arrays: not per batch)
_PULL_AHEAD = 1024
#: documents read from the stream at a time (one ``docs`` call per this many documents, not per batch)
_PULL_MIN = 2048
#: a share whose blocks of this many cycles of epoch lengths (``epoch_period``) in a row hold no token has
#: nothing to pack: an error (a cycle, not an epoch: a dataset's sub-epochs sorted by length may be empty)
_DRY_EPOCHS = 16
#: epochs in a row whose block for a share is empty before it is an error, for a stream that does not
#: say after how many epochs its epoch lengths repeat (``epoch_period``)
_EMPTY_EPOCHS = 1000
#: a plan: pieces' sequence, document id, offset and count, every sequence's padding, and each piece's
#: document length (tokens, no EOS) as planned (what its record must hold)
Plan = tuple[IntArray, IntArray, IntArray, IntArray, IntArray, IntArray]


class DocStream(Protocol):
    """An endless stream of documents in epochs (what packing walks). Optional: ``epoch_period()``, the
    number of epochs after which the epoch lengths repeat (a share whose block is empty in that many
    epochs in a row has no document ever: an error at once), and ``no_documents(span, longest, shares)``,
    the reason of that error in the stream's words (the setting to change), and
    ``token_documents(at_least)``: (documents with a token, documents) of those it draws from, counted
    until ``at_least`` are found (a plan with no token says which)."""

    def epoch_len(self, epoch: int) -> int: ...

    def docs(self, epoch: int, start: int, stop: int) -> tuple[IntArray, IntArray]: ...

    def source_of(self, ids: IntArray) -> IntArray: ...


@numba.njit(cache=True, nogil=True, inline="always")
def _piece(pieces: Any, k: int, seq: int, ticket: int, off: int, count: int) -> int:  # pragma: no cover - numba
    """Write piece ``k`` (a column of ``pieces``); the number of pieces after it."""
    pieces[0, k] = seq
    pieces[1, k] = ticket
    pieces[2, k] = off
    pieces[3, k] = count
    return k + 1


@numba.njit(cache=True, nogil=True, inline="always")
def _drop(order: Any, nbuf: int, i: int) -> int:  # pragma: no cover - numba
    """Remove entry ``i`` of the first ``nbuf`` of ``order`` (the rest moves up); the new count."""
    for q in range(i + 1, nbuf):
        order[q - 1] = order[q]
    return nbuf - 1


@numba.njit(cache=True, nogil=True)
def _best_fit(lens: Any, offs: Any, nb: int, seq_len: int, window: int, split: bool,
              nseq_max: int) -> Any:  # pragma: no cover - numba
    # tickets 0..nb-1: the window in its order; nb..: documents waiting behind it
    ni = lens.size - nb
    rem = lens - offs
    off = offs.copy()
    order = np.empty(max(window, nb) + 1, dtype=np.int64)
    nbuf = 0
    for i in range(nb):
        order[nbuf] = i
        nbuf += 1
    pieces = np.empty((4, nseq_max * (window + 1)), dtype=np.int64)  # rows: sequence, ticket, offset, count
    pads = np.zeros(nseq_max, dtype=np.int64)
    np_ = 0
    nxt = 0
    trunc = 0
    s = 0
    while s < nseq_max:
        while nbuf < window and nxt < ni:
            if rem[nb + nxt] > 0:
                order[nbuf] = nb + nxt
                nbuf += 1
            nxt += 1
        if nbuf < window:
            break  # decisions need a full window: the caller pulls more documents
        cap = seq_len
        t = order[0]
        r = rem[t]
        if r >= cap:
            np_ = _piece(pieces, np_, s, t, off[t], cap)
            if split and r > cap:
                off[t] += cap
                rem[t] -= cap
            else:
                trunc += r - cap
                nbuf = _drop(order, nbuf, 0)
            cap = 0
        else:
            np_ = _piece(pieces, np_, s, t, off[t], r)
            cap -= r
            nbuf = _drop(order, nbuf, 0)
            while cap > 0:
                best = -1
                best_r = 0
                for q in range(nbuf):
                    rq = rem[order[q]]
                    if rq <= cap and rq > best_r:
                        best = q
                        best_r = rq
                        if rq == cap:
                            break
                if best < 0:
                    break
                t = order[best]
                np_ = _piece(pieces, np_, s, t, off[t], best_r)
                cap -= best_r
                nbuf = _drop(order, nbuf, best)
        pads[s] = cap
        s += 1
    keep = order[:nbuf].copy()
    return pieces[0, :np_], pieces[1, :np_], pieces[2, :np_], pieces[3, :np_], keep, off, nxt, s, pads[:s], trunc


@numba.njit(cache=True, nogil=True, inline="always")
def _take_then(c: Any, kept: Any, seen: int) -> Any:  # pragma: no cover - numba
    k = len(kept)
    o = np.empty(k + len(c) - seen, dtype=c.dtype)
    for i in range(k):
        o[i] = c[kept[i]]
    o[k:] = c[seen:]
    return o


@numba.njit(cache=True, nogil=True)
def _reorder(kept: Any, seen: int, ep: Any, pos: Any, ids: Any, lens: Any, offs: Any) -> Any:  # pragma: no cover
    """The pulled arrays as their entries ``kept``, then those from ``seen`` on: the pulled order after a
    best_fit plan (the window, then the documents behind it)."""
    return (_take_then(ep, kept, seen), _take_then(pos, kept, seen), _take_then(ids, kept, seen),
            _take_then(lens, kept, seen), _take_then(offs, kept, seen))


@numba.njit(cache=True, nogil=True)
def _mean_rest(lens: Any, offs: Any) -> float:  # pragma: no cover - numba
    """The mean of ``lens - offs`` (at least 1; 256 when empty): tokens left per pulled document."""
    if len(lens) == 0:
        return 256.0
    return float(max(1.0, (lens.sum() - offs.sum()) / len(lens)))


@numba.njit(cache=True, nogil=True)
def _concat(lens: Any, offs: Any, nseq: int, seq_len: int) -> Any:  # pragma: no cover - numba
    """``concat`` pieces of ``nseq`` windows over the pulled documents (``lens - offs`` tokens each,
    back to back): window ``r`` covers stream tokens ``[r * seq_len, (r + 1) * seq_len + 1)``. Walking
    the documents in order gives the pieces sorted by window (a document's last window is the next
    one's first). Returns the pieces (4 x k: window, pulled entry, offset, count), the number ``done``
    of documents whose input tokens (``[0, nseq * seq_len)``) are all used, and the input tokens used of
    each document up to the partly used one (``done + 1`` entries, at most one per document)."""
    used = nseq * seq_len
    end = used + 1
    pieces = np.empty((4, len(lens) + nseq + 1), dtype=np.int64)
    cut = np.zeros(len(lens) + 1, dtype=np.int64)
    k = 0
    done = 0
    a = 0
    for d in range(len(lens)):
        if a >= end:
            break
        b = a + lens[d] - offs[d]
        r = max(0, (a - 1) // seq_len)
        while r < nseq and r * seq_len < b:
            s, t = max(a, r * seq_len), min(b, r * seq_len + seq_len + 1)
            if t > s:
                k = _piece(pieces, k, r, d, offs[d] + s - a, t - s)
            r += 1
        cut[d] = min(b, used) - min(a, used)
        if b <= used:
            done = d + 1
        a = b
    return pieces[:, :k], done, cut[: min(done + 1, len(lens))]


def _as_ranges(epoch: IntArray, pos: IntArray, off: IntArray) -> list[list[int]]:
    """Documents (in list order) as ranges ``[epoch, start, stop, off]``: runs of consecutive positions."""
    if len(pos) == 0:
        return []
    brk = np.ones(len(pos), dtype=bool)
    brk[1:] = (epoch[1:] != epoch[:-1]) | (pos[1:] != pos[:-1] + 1) | (off[1:] != 0)
    starts = np.flatnonzero(brk)
    stops = np.append(starts[1:], len(pos))
    return [[int(epoch[a]), int(pos[a]), int(pos[b - 1]) + 1, int(off[a])] for a, b in zip(starts, stops)]


class Planner:
    """One share's packing plan (see the module docstring). ``state`` (a share state dict or None for a
    fresh share at ``epoch``). Holds O(window + pulled block) documents."""

    def __init__(self, stream: DocStream, *, mode: str, seq_len: int, window: int, split: bool, eos: bool,
                 share: int, num_shares: int, state: dict[str, Any]) -> None:
        self.stream = stream
        self.mode = mode
        self.seq_len = int(seq_len)
        self.window = int(window)
        self.split = bool(split)
        self.eos = 1 if eos else 0
        self.share = int(share)
        self.num_shares = int(num_shares)
        # (a range of no document, start == stop, which a state may hold, is dropped: nothing to pull from it;
        # an entry {"blocks": [first, stop], "share": s, "of": S} is the blocks s of S of those epochs)
        self.ranges: list[Any] = [copy_range(r) for r in state["ranges"]
                                  if (isinstance(r, dict) and r["blocks"][1] > r["blocks"][0])
                                  or (not isinstance(r, dict) and int(r[2]) > int(r[1]))]
        self.next_epoch = int(state["next_epoch"])
        self.stats: dict[str, Any] = {k: (list(v) if isinstance(v, list) else int(v))
                                      for k, v in state["stats"].items()}
        # pulled documents: epoch, position, offset, id, length (with EOS); the first ``nbuf`` form
        # best_fit's window (in its order), the rest wait behind them
        z = np.empty(0, dtype=np.int64)
        self.ep, self.pos, self.off, self.ids, self.lens = z, z, z, z, z
        self.nbuf = 0
        self._cache: tuple[int, int, IntArray, IntArray] | None = None  # (epoch, start, ids, lengths)
        self._mean = 256.0  # tokens left per pulled document (what a best_fit plan pulls ahead by)
        self._dry = 0  # fresh blocks taken since the last document with a token was pulled
        self._dry_docs = 0  # documents pulled since then (about: those of a part with a token are not)
        self._wall: tuple[int, int] | None = None  # (epoch, position) of a document not read ahead: it failed
        period = getattr(stream, "epoch_period", None)
        self._period = int(period()) if period is not None else _EMPTY_EPOCHS
        self._dry_limit = _DRY_EPOCHS * (self._period if period is not None else 1)
        buffered = int(state.get("buffered", 0))
        if buffered:
            self._pull(buffered)
            self.nbuf = min(buffered, len(self.ids))

    # ---------------------------------------------------------------------------------- cursor

    def _pull(self, k: int, need: int | None = None) -> int:
        """Move up to ``k`` more documents from the ranges (and fresh blocks) to the pulled arrays; the
        number moved. The first ``need`` (default: all ``k``) are needed now: a failure to read their
        lengths is raised (:meth:`plan` then undoes the pull). The rest are read ahead, in the blocks already
        taken (the next epoch's block is taken when a document of it is needed: how far the share has gone,
        where a mixture's changed schedule starts): a document whose length cannot be read (a refused
        shard) ends the pull before it, and the plan that needs it reads it then (and raises there)."""
        need = k if need is None else need
        parts: list[tuple[IntArray, ...]] = []
        got = 0
        empty_epochs = longest = 0  # fresh blocks in a row with no document; the longest of their epochs
        while got < k:
            if not self.ranges:
                if got >= need:
                    break  # reading ahead stays in the blocks taken: the next epoch's is taken when needed
                e = self.next_epoch
                n = self.stream.epoch_len(e)
                a, b = block_bounds(n, self.share, self.num_shares) if n else (0, 0)
                self.next_epoch += 1
                if b > a:
                    self.ranges.append([e, a, b, 0])
                    empty_epochs = 0
                    self._dry += 1
                    if self._dry == 2 or self._dry > self._dry_limit:  # a whole block, or many, held no token
                        self._dry_error(e)
                else:
                    empty_epochs += 1
                    longest = max(longest, n)
                    if empty_epochs >= self._period:  # a whole cycle of epoch lengths: empty for good
                        raise ValueError(self._no_documents(e + 1 - empty_epochs, e, longest))
                continue
            head = self.ranges[0]
            if isinstance(head, dict):  # the next epoch's block of a run of them (a re-split's lagging share)
                e, stop = head["blocks"]
                a, b = block(self.stream, e, head["share"], head["of"])
                rest = [{**head, "blocks": [e + 1, stop]}] if e + 1 < stop else []
                self.ranges[0:1] = ([[e, a, b, 0]] if b > a else []) + rest
                continue
            e, a, b, o = head
            if got < need:
                take = min(b - a, need - got)
                ids, lens = self._docs(e, a, take, b)
                w = self._wall
                if w is not None and w[0] == e and a <= w[1] < a + take:
                    self._wall = None  # read after all (the failure has passed)
            else:
                take = self._readable(e, a, min(b - a, k - got), b)
                if take == 0:
                    break
                ids, lens = self._docs(e, a, take, b)
            off = np.zeros(take, dtype=np.int64)
            off[0] = o
            lens = np.asarray(lens, dtype=np.int64) + self.eos
            if o > int(lens[0]):  # (a planner's offsets never pass their document's tokens: a state edited?)
                eos = " and an eos" if self.eos else ""
                raise ValueError(f"share {self.share} of {self.num_shares}: malformed state: range {[e, a, b, o]} "
                                 f"starts {o} tokens into document {int(ids[0])} (position {a} of epoch {e}), which "
                                 f"has {int(lens[0]) - self.eos} tokens{eos}; a state is for the data it was made with")
            if int(lens.sum()) > o:
                self._dry = self._dry_docs = 0
            else:
                self._dry_docs += take
            parts.append((np.full(take, e, dtype=np.int64), np.arange(a, a + take, dtype=np.int64), off,
                          np.asarray(ids, dtype=np.int64), lens))
            if a + take == b:
                self.ranges.pop(0)
            else:
                self.ranges[0] = [e, a + take, b, 0]
            got += take
        if parts:
            cols = list(zip(*parts))
            self.ep, self.pos, self.off, self.ids, self.lens = (
                np.concatenate([old, *new]) for old, new in
                zip((self.ep, self.pos, self.off, self.ids, self.lens), cols))
            if self.nbuf == 0 and not (self.lens > self.off).any():
                # only documents with no token left: every plan finishes them before any token (as a
                # finished plan would count them); dropped now so that a dry run does not grow
                self._count(self.ids)
                self._drop(len(self.ids))
            self._mean = _mean_rest(self.lens, self.off)
        return got

    def _dry_error(self, e: int) -> None:
        """ValueError when the blocks this share took hold no token: at once where no document the stream
        draws from has one (``token_documents``: ``have`` of ``total``), else after ``_dry_limit`` blocks
        in a row that are also at least ``16 x total / have`` documents (a shuffled order gives such a
        streak by chance about e**-16 of the time: the documents with tokens are too few for the shares,
        or an order keeps them out of this share's block). The lengths are counted only as far as these
        questions need (up to the first document with a token; up to ``16 x total / dry documents``)."""
        count = getattr(self.stream, "token_documents", None)
        have, total = count(1) if count is not None else (None, None)
        where = f"share {self.share} of {self.num_shares}"
        if have == 0:
            raise ValueError(f"{where}: none of the {total} documents it draws from has a token (every one is "
                             "empty) and no eos token is appended: nothing to pack (pass eos=...)")
        if self._dry <= self._dry_limit:
            return
        if count is not None:
            need = -(-_DRY_EPOCHS * int(total or 0) // max(1, self._dry_docs))
            have, total = count(need)
            if have < need:  # (counted to the end) so few documents have tokens that such a streak is expected
                return
        d = self._dry - 1
        why = ("every document empty? then pass an eos token" if have is None else
               f"at least {have} of the {total} documents have tokens, too few for {self.num_shares} shares, or "
               "an order that keeps them out of this share's block (sorted by length?); use fewer shares, "
               "a shuffled order or an eos token")
        raise ValueError(f"{where}: no token in its documents of {d} epochs in a row (epochs {e - d} to "
                         f"{e - 1}): packing needs documents with tokens ({why})")

    def _readable(self, e: int, a: int, take: int, b: int) -> int:
        """How many of the ``take`` documents from position ``a`` of epoch ``e`` (range ``[a, b)``) to read
        ahead: those before the first whose length cannot be read, which is found by bisection when a read
        fails and then not read ahead again (``_wall``) until a plan needs it."""
        w = self._wall
        if w is not None and w[0] == e and a <= w[1]:
            take = min(take, w[1] - a)
        if take == 0:
            return 0
        try:
            self._docs(e, a, take, b)
            return take
        except Exception:  # noqa: BLE001 - read again, and raised, by the plan that needs the document
            pass
        lo, hi = 0, take  # documents [a, a + lo) can be read, [a, a + hi) cannot
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                self._docs(e, a, mid, a + mid)
                lo = mid
            except Exception:  # noqa: BLE001 - as above
                hi = mid
        self._wall = (e, a + lo)
        return lo

    def _no_documents(self, first: int, last: int, longest: int) -> str:
        """The error of a share whose block is empty in every epoch (those from ``first`` to ``last``, a
        cycle of the stream's epoch lengths, have at most ``longest`` documents): what to change."""
        span = f"epoch {first}" if first == last else f"epochs {first} to {last}"
        say = getattr(self.stream, "no_documents", None)
        why = say(span, longest, self.num_shares) if say is not None else (
            f"no documents in {span} (the dataset is empty, or an epoch has fewer documents than the "
            f"{self.num_shares} shares)")
        return f"share {self.share} of {self.num_shares}: {why}"

    def _docs(self, e: int, a: int, take: int, b: int) -> tuple[IntArray, IntArray]:
        """``stream.docs(e, a, a + take)`` of the range ``[a, b)``, read ``_PULL_MIN`` documents at a time
        (one ``docs`` call per block, not per batch; the state is untouched: the range still holds them); the
        ``take`` documents alone where reading the block fails."""
        c = self._cache
        if c is None or c[0] != e or a < c[1] or a + take > c[1] + len(c[2]):
            m = max(take, min(_PULL_MIN, b - a))
            w = self._wall
            if w is not None and w[0] == e and a <= w[1]:
                m = max(take, min(m, w[1] - a))  # not across a document whose length could not be read
            try:
                ids, lens = self.stream.docs(e, a, a + m)
            except Exception:
                if m == take:
                    raise
                m = take  # the documents asked for alone: the failure may be in those read ahead
                ids, lens = self.stream.docs(e, a, a + m)
            c = self._cache = (e, a, np.asarray(ids, dtype=np.int64), np.asarray(lens, dtype=np.int64))
        i = a - c[1]
        return c[2][i : i + take], c[3][i : i + take]

    def _drop(self, k: int) -> None:
        self.ep, self.pos, self.off, self.ids, self.lens = (
            a[k:] for a in (self.ep, self.pos, self.off, self.ids, self.lens))

    def state(self) -> dict[str, Any]:
        """This share's state: pulled documents first (the window in its order), then the ranges."""
        rng = _as_ranges(self.ep[: self.nbuf], self.pos[: self.nbuf], self.off[: self.nbuf])
        rng += _as_ranges(self.ep[self.nbuf:], self.pos[self.nbuf:], self.off[self.nbuf:])
        return {"ranges": rng + [copy_range(r) for r in self.ranges], "next_epoch": self.next_epoch,
                "buffered": self.nbuf, "stats": {k: (list(v) if isinstance(v, list) else v)
                                                 for k, v in self.stats.items()}}

    # ---------------------------------------------------------------------------------- plans

    def plan(self, nseq: int) -> Plan:
        """The next ``nseq`` sequences: pieces (sequence, document id, offset, count), each
        sequence's padding and each piece's document length. ``concat`` pieces cover ``seq_len + 1``
        tokens per sequence."""
        step = self._plan_concat if self.mode == "concat" else self._plan_best_fit
        if nseq == 0:  # nothing to plan, nothing pulled (best_fit's steps hold at least one sequence)
            return tuple(np.empty(0, dtype=np.int64) for _ in range(6))  # type: ignore[return-value]
        before = self.mark()
        try:
            if nseq <= 1024:  # one step (a batch): no concatenation
                return step(nseq)
            parts = []
            for done in range(0, nseq, 1024):
                p = step(min(nseq - done, 1024))
                parts.append((p[0] + done, *p[1:]))
            return tuple(np.concatenate(c) for c in zip(*parts))  # type: ignore[return-value]
        except BaseException:  # (a read refused, Ctrl-C): the plan never happened, the next one asks again
            self.restore(before)
            raise

    def skip(self, nseq: int) -> None:
        """Plan ``nseq`` sequences and drop the plans, 1024 at a time (the state after it is that of
        ``plan(nseq)``, in memory bounded however many); a failure undoes the whole skip."""
        step = self._plan_concat if self.mode == "concat" else self._plan_best_fit
        before = self.mark()
        try:
            for done in range(0, nseq, 1024):
                step(min(nseq - done, 1024))
        except BaseException:
            self.restore(before)
            raise

    def mark(self) -> tuple[Any, ...]:
        """What a plan changes, for :meth:`restore` to go back to (a plan that failed, or whose batch could
        not be read; the pulled arrays are replaced, never written in place: kept as they are).
        O(ranges + sources)."""
        return (self.ep, self.pos, self.off, self.ids, self.lens, self.nbuf, [copy_range(r) for r in self.ranges],
                self.next_epoch, {k: (list(v) if isinstance(v, list) else v) for k, v in self.stats.items()},
                self._mean, self._dry, self._dry_docs)

    def restore(self, mark: tuple[Any, ...]) -> None:
        (self.ep, self.pos, self.off, self.ids, self.lens, self.nbuf, self.ranges, self.next_epoch, self.stats,
         self._mean, self._dry, self._dry_docs) = mark

    def _count(self, ids: IntArray, tokens: IntArray | None = None) -> None:
        """Count documents ``ids`` finished or, given ``tokens``, the tokens taken from each: in total
        and per source."""
        key, total = ("documents", len(ids)) if tokens is None else ("tokens", int(tokens.sum()))
        st = self.stats
        st[key] += total
        per_source = st["source_" + key]
        if len(per_source) == 1:  # one source: no lookup
            per_source[0] += total
            return
        add = np.bincount(self.stream.source_of(ids), weights=tokens, minlength=len(per_source)).astype(np.int64)
        st["source_" + key] = (np.asarray(per_source, dtype=np.int64) + add).tolist()

    def _plan_concat(self, nseq: int) -> Plan:
        L = self.seq_len
        need = nseq * L + 1
        have = int((self.lens - self.off).sum())
        passed = len(self.ids)  # documents pulled for this plan, the empty ones dropped below included
        while have < need:
            mean = max(1.0, have / passed) if passed else 256.0
            more = max(_PULL_AHEAD, int((need - have) / mean * 1.25) + 16)
            passed += self._pull(more, 1)  # one more is needed; the rest is read ahead
            have = int((self.lens - self.off).sum())
            if have < need:
                # the plan passes every document pulled so far: the empty ones are finished (and dropped, so
                # that sparse documents with tokens do not make it hold every empty one it passes)
                empty = self.lens <= self.off
                self._count(self.ids[empty])
                self.ep, self.pos, self.off, self.ids, self.lens = (
                    a[~empty] for a in (self.ep, self.pos, self.off, self.ids, self.lens))
        pieces, k, cut = _concat(self.lens, self.off, nseq, L)
        seq, j, off, cnt = pieces
        ids = self.ids[j]
        planned = self.lens[j] - self.eos
        # tokens are counted as inputs: [0, nseq * L) of the stream
        self._count(self.ids[: len(cut)], cut)
        self._count(self.ids[:k])
        self._drop(k)
        if len(self.ids):  # the partly used document (cut has an entry for it)
            self.off = self.off.copy()
            self.off[0] += cut[k]
        self.stats["sequences"] += nseq
        return seq, ids, off, cnt, np.zeros(nseq, dtype=np.int64), planned

    def _plan_best_fit(self, nseq: int) -> Plan:
        parts: list[Plan] = []
        done, more = 0, _PULL
        while done < nseq:
            # documents behind the window: enough to refill it for the sequences left (estimated from the
            # mean length of what was pulled), and to fill it first
            extra = len(self.ids) - self.nbuf
            want = self.window - self.nbuf + int((nseq - done) * self.seq_len / self._mean * 1.1) + 16
            if extra < want:  # pull ahead: one pull every few dozen batches, not one per batch
                self._pull(max(want - extra, _PULL_AHEAD), 0)  # (an estimate: none is needed yet)
            made, plan = self._best_fit_step(nseq - done)
            if made:
                parts.append((plan[0] + done, *plan[1:]))
                done += made
            if done < nseq:
                # short documents ate the pull: the window took all of it (as any later plan would) and the
                # rest was dropped, so pulling more holds the window and one pull, not every document passed
                self._pull(more, 1)  # the window ran dry: one more is needed
                more = min(2 * more, _PULL_MAX)
        if len(parts) == 1:
            return parts[0]
        return tuple(np.concatenate(c) for c in zip(*parts))  # type: ignore[return-value]

    def _best_fit_step(self, nseq: int) -> tuple[int, Plan]:
        """Up to ``nseq`` sequences from the pulled documents (fewer where the window runs dry: it then
        holds every pulled document with a token left); the number made and their plan."""
        nb = self.nbuf
        res = _best_fit(self.lens, self.off, nb, self.seq_len, self.window, self.split, nseq)
        p_seq, p_tick, p_off, p_n, keep, offs, nxt, made, pads, trunc = res
        ids = self.ids[p_tick]
        planned = self.lens[p_tick] - self.eos
        # documents finished: tickets before ``nb + nxt`` not kept; new pulled order: window, then the rest
        kept = np.asarray(keep, dtype=np.int64)
        seen = nb + int(nxt)
        if len(self.stats["source_documents"]) == 1:
            self.stats["documents"] += seen - len(kept)
            self.stats["source_documents"][0] += seen - len(kept)
        else:
            used = np.ones(seen, dtype=bool)
            used[kept] = False
            self._count(self.ids[:seen][used])
        self._count(ids, p_n)
        self.ep, self.pos, self.ids, self.lens, self.off = _reorder(kept, seen, self.ep, self.pos, self.ids,
                                                                   self.lens, offs)
        self._mean = _mean_rest(self.lens, self.off)
        self.nbuf = len(kept)
        st = self.stats
        st["sequences"] += int(made)
        st["padding"] += int(pads.sum())
        st["truncated"] += int(trunc)
        return int(made), (p_seq, ids, p_off, p_n, pads, planned)
