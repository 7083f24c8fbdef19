"""Mixture schedules: which source the g-th sample of a training run comes from, by arithmetic.

A :class:`MixtureSchedule` is a list of stages ``[(start, {source: weight}), ...]`` in samples (the
first stage starts at 0). Inside a stage the samples are dealt to the sources by a chain of
counting rules: source 0 takes ``C_0(m) = floor(m * u_0 / r_0 + 1/2)`` of the first ``m`` samples
(``u_k``: source ``k``'s weight in units of 2**-24, ``r_k = u_k + ... + u_{K-1}``), source 1 the same
share of what source 0 left, and so on; the last source takes the rest. Each rule grows by at most 1
per sample, so both questions a loader asks are O(sources) arithmetic, vectorised over NumPy arrays:

* ``assign(g)``: the source of sample ``g`` and how many samples of that source came before it;
* ``counts(g)``: per source, the samples among ``[0, g)``.

Every source's count stays within ``sources`` samples of ``g * weight`` inside a stage, so the
proportions over any 10**6 consecutive samples are within about 1e-5 of the schedule.

:class:`MixtureStream` draws documents from several datasets by a schedule: sample ``g`` of source
``k``, the ``p``-th of that source, is position ``p mod N_k`` of the source's epoch order
``p // N_k + 1`` (every source walks its own order, epoch after epoch). Its resume state is a list of
segments ``(g_from, stages, base positions)``: a run resumed with another schedule starts a new segment
where the old one stopped, with every source's position carried over, so no source repeats a sample
within its epoch. Memory O(sources x stages x segments).

Stages in tokens (``unit="tokens"``): a stage starts at the first sample whose preceding documents hold
at least its token count. That sample depends on the lengths drawn, so the stream finds it by walking
the lengths from the previous stage's start, lazily, as far as the samples asked for; found stages are
stages in samples, and the walk's point (sample, tokens before it) and the found starts are in the state.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from ..order import Order
from ._lengths import IntArray, NonzeroCount, check_int
from ._stages import MixtureSchedule, StageWalk, sample_array
from .base import Dataset
from .combined import CombinedDataset, walk_passes

__all__ = ["MixtureSchedule", "MixtureStream"]

class MixtureStream:
    """An endless stream of documents drawn from ``datasets`` by a :class:`MixtureSchedule`.

    ``datasets``: name -> dataset (any ``seqstore.data`` dataset; each walks its own epoch orders).
    ``stages``: ``[(start sample, {name: weight}), ...]``, one ``{name: weight}``, or a
    :class:`MixtureSchedule` (e.g. :meth:`MixtureSchedule.sampled` of a callable); ``unit``: what the
    stage starts count, ``"samples"`` or ``"tokens"`` (see the module docstring). The stream is cut
    into chunks of ``chunk`` samples, its "epochs" for sharding (:class:`seqstore.data.PackedDataset`
    shares each chunk over ranks x workers). Records are read through a :class:`CombinedDataset` of the
    sources (``combined``): document ids are its combined indices. O(sources) memory.
    """

    def __init__(self, datasets: Mapping[str, Dataset],
                 stages: Sequence[tuple[int, Mapping[str, float]]] | Mapping[str, float] | MixtureSchedule, *,
                 chunk: int = 1 << 16, unit: str = "samples") -> None:
        if not isinstance(datasets, Mapping) or not datasets:
            got = "an empty mapping" if isinstance(datasets, Mapping) else f"a {type(datasets).__name__}"
            raise ValueError(f"MixtureStream: datasets must be a non-empty mapping name -> dataset, got {got}")
        for name, d in datasets.items():
            if not isinstance(d, Dataset):
                raise TypeError(f"MixtureStream: source {name!r} is a {type(d).__name__}, not a seqstore.data Dataset "
                                "(a store: StoreDataset(store, length_field=...))")
        parted = {n: d.partition_epoch for n, d in datasets.items() if d.partition_epoch != 1}
        if parted:
            raise ValueError(f"MixtureStream: source(s) with partition_epoch {parted}; every source walks whole "
                             "epochs of its documents (open them with partition_epoch=1)")
        self.combined = CombinedDataset(datasets)
        self.names = list(self.combined.names)
        if isinstance(stages, MixtureSchedule):
            if unit != "samples" and unit != stages.unit:  # (the default takes the schedule's own unit)
                raise ValueError(f"MixtureStream: unit={unit!r}, but the schedule given counts {stages.unit}; make "
                                 f"it with MixtureSchedule(..., unit={unit!r})")
            if stages.names != self.names:
                raise ValueError(f"MixtureStream: the schedule's sources {stages.names} are not {self.names}")
            self.schedule = stages
        else:
            self.schedule = MixtureSchedule(stages, self.names, unit=unit)
        self.chunk = check_int(chunk, "chunk", 1)
        weighted = self.schedule.units.max(axis=0) > 0
        empty = [n for n, d, w in zip(self.names, self.combined.datasets, weighted) if d.num_seqs == 0 and w]
        if empty:
            raise ValueError(f"MixtureStream: source(s) {empty} have no documents but a weight > 0 in the schedule")
        self._orders: dict[tuple[int, int], Order] = {}
        self._totals: dict[int, int] = {}  # per source, the tokens of all its documents (as needed)
        self._with_tokens: dict[int, NonzeroCount] = {}  # per source, its documents with a token (as needed)
        # segments: (first sample, schedule in samples, positions of every source at that sample)
        self.segments: list[tuple[int, MixtureSchedule, IntArray]] = []
        self._walk: StageWalk | None = None  # the last segment's schedule in tokens, as far as resolved
        self._own = self.schedule
        self._loaded = False  # whether the segments are a loaded state's (not this stream's own from 0)
        self._id: str | None = None  # (schedule_id, until the segments change)
        self._start_segment(0, 0, np.zeros(len(self.names), dtype=np.int64))

    def reset(self) -> None:
        """Back to this stream's own schedule from sample 0 (a fresh run), after :meth:`load_state`."""
        if self._loaded:
            self.schedule, self.segments, self._loaded = self._own, [], False
            self._start_segment(0, 0, np.zeros(len(self.names), dtype=np.int64))

    # -------------------------------------------------------------------------------- stages in tokens

    def _start_segment(self, g0: int, tokens: int, base: IntArray) -> None:
        """This stream's schedule from sample ``g0`` on (``tokens``: the documents' tokens before it)."""
        self._id = None
        if self.schedule.unit == "samples":
            self._walk = None
            self.segments.append((g0, self.schedule, base))
            return
        self._walk = StageWalk(self.schedule, g0, tokens)
        self.segments.append((g0, self._walk.effective(), base))

    def _ensure(self, upto: int) -> None:
        """Find the start sample of every stage in tokens that begins before sample ``upto``."""
        w = self._walk
        if w is not None and w.pending() and w.f < upto:
            self._advance(upto, exact=False)

    def _advance(self, upto: int, *, exact: bool) -> None:
        """Walk the documents' lengths from the walk's sample to ``upto`` (``exact``: stop there even
        when every stage is found, so that its token count is that of sample ``upto``)."""
        w = self._walk
        assert w is not None
        mean = 0.0  # tokens per sample of the last window read
        while w.f < upto and (exact or w.pending()):
            nxt = w.next_start()
            # samples after a stage's start are dealt by it, so the window is read again from there: sized
            # to reach about the next stage, not a whole chunk per stage (many close stages read chunks each)
            size = self.chunk
            if nxt is not None:
                size = min(size, int((nxt - w.t) / mean * 1.25) + 64) if mean > 0 else min(size, 1024)
            g = np.arange(w.f, min(upto, w.f + size), dtype=np.int64)
            cum = w.t + np.cumsum(self._lengths_at(g))
            mean = max(int(cum[-1]) - w.t, 1) / len(g)
            if nxt is not None and cum[-1] >= nxt:
                j = int(np.searchsorted(cum, nxt, side="left"))  # samples [0, g[j]] hold >= nxt tokens
                w.f, w.t = int(g[j]) + 1, int(cum[j])
                w.resolve()
                g0, _, base = self.segments[-1]
                self.segments[-1] = (g0, w.effective(), base)
            else:
                w.f, w.t = int(g[-1]) + 1, int(cum[-1])

    def _lengths_at(self, g: IntArray) -> IntArray:
        return self._docs_resolved(g)[1]

    def tokens_before(self, g: int) -> int:
        """The documents' tokens (their lengths, no EOS) of samples ``[0, g)``. Near the point a schedule
        in tokens walked to, a walk from there; else, per source, its tokens in the positions dealt before
        ``g``: whole epochs (the source's total) and a part of one, so at most about twice each source's
        lengths are read however far into the run ``g`` is (a walk read every sample's)."""
        g = check_int(g, "MixtureStream.tokens_before: the sample number", 0)
        pos = self.positions(g)  # (finds the stages in tokens that begin before g)
        w = self._walk
        walked = abs(g - w.f) if w is not None and w.g0 <= g else g
        if walked <= sum(min(int(p), 2 * int(n)) for p, n in zip(pos, self.combined.num)):
            if w is not None and w.f <= g:
                self._advance(g, exact=True)
                return w.t
            if w is not None and w.g0 <= g:  # back from the walk over resolved samples
                return w.t - int(self._lengths_at(np.arange(g, w.f, dtype=np.int64)).sum())
            return sum(int(self._lengths_at(np.arange(a, min(g, a + self.chunk), dtype=np.int64)).sum())
                       for a in range(0, g, self.chunk))
        return sum(self._source_tokens(k, int(p)) for k, p in enumerate(pos))

    def _source_tokens(self, k: int, p: int) -> int:
        """Tokens of source ``k``'s first ``p`` positions (its epochs back to back): its total per whole
        epoch, and the part of the last epoch (or the total less the rest of it, whichever is shorter)."""
        n = int(self.combined.num[k])
        full, r = divmod(p, n) if n else (0, 0)
        if r == 0 and full == 0:
            return 0
        lens = self.combined.datasets[k].lengths()
        total = self._totals.get(k)
        if total is None and (full or 2 * r > n):
            total = self._totals[k] = sum(int(c.sum()) for c in lens.iter_chunks())
        if r == 0:
            return full * int(total or 0)
        order = self._order(k, full + 1)
        a, b = (0, r) if total is None or 2 * r <= n else (r, n)
        step = max(self.chunk, 1 << 16)
        part = sum(int(lens.take(order._take_range(x, min(b, x + step))).sum()) for x in range(a, b, step))
        return full * int(total or 0) + (part if a == 0 else int(total or 0) - part)

    @property
    def dataset(self) -> Dataset:
        """The dataset the document ids index (the sources end to end)."""
        return self.combined

    def epoch_len(self, epoch: int) -> int:
        return self.chunk

    def epoch_period(self) -> int:
        """Every chunk has ``chunk`` samples."""
        return 1

    def no_documents(self, span: str, longest: int, num_shares: int) -> str:
        return (f"no documents in its block of any chunk ({span}): MixtureStream chunk={self.chunk} has fewer "
                f"samples than the {num_shares} shares (ranks x DataLoader workers) that split every chunk; pass a "
                f"chunk of at least the {num_shares} shares")

    def identity(self) -> dict[str, Any]:
        """What a resume state records of this stream: its sources, their sizes and epoch orders
        (:meth:`~seqstore.data.Dataset.order_identity`), and the chunk."""
        return {"type": "MixtureStream", "sources": self.names, "sizes": [int(n) for n in self.combined.num],
                "chunk": self.chunk, "orders": [d.order_identity() for d in self.combined.datasets]}

    # -------------------------------------------------------------------------------- positions

    def _segment_of(self, g: IntArray) -> IntArray:
        starts = np.array([s for s, _, _ in self.segments], dtype=np.int64)
        return np.searchsorted(starts, g, side="right") - 1

    def positions(self, g: int) -> IntArray:
        """Per source, how many of its samples the stream dealt before sample ``g`` (its position)."""
        g = check_int(g, "MixtureStream.positions: the sample number", 0)
        self._ensure(g)
        seg = int(self._segment_of(np.array([g], dtype=np.int64))[0])
        g0, sched, base = self.segments[seg]
        return base + sched.counts(int(g)) - sched.counts(g0)

    def assign(self, g: IntArray) -> tuple[IntArray, IntArray]:
        """(source, position in that source's stream of epochs) of samples ``g``."""
        return self._assign_resolved(self._known(g))

    def _known(self, g: IntArray) -> IntArray:
        """``g`` as int64, every stage that begins up to its largest sample found."""
        g = sample_array(g)  # (integers: a float is refused, not cut to the sample below it)
        if g.size:
            self._ensure(int(g.max()) + 1)
        return g

    def _assign_resolved(self, g: IntArray) -> tuple[IntArray, IntArray]:
        seg = self._segment_of(g)
        src = np.empty(len(g), dtype=np.int64)
        pos = np.empty(len(g), dtype=np.int64)
        for i in np.unique(seg).tolist():
            sel = seg == i
            g0, sched, base = self.segments[i]
            s, j = sched.assign(g[sel])
            src[sel] = s
            pos[sel] = j + (base - sched.counts(g0))[s]
        return src, pos

    def _order(self, k: int, epoch: int) -> Order:
        key = (k, epoch)
        order = self._orders.get(key)
        if order is None:
            if len(self._orders) > 4 * len(self.names):
                self._orders.clear()
            order = self.combined.datasets[k].epoch_order(epoch)
            if len(order) != int(self.combined.num[k]):
                raise ValueError(f"source {self.names[k]!r}: its epoch order drops documents; a mixture needs "
                                 "orderings that visit every document once per epoch")
            self._orders[key] = order
        return order

    def docs(self, epoch: int, start: int, stop: int) -> tuple[IntArray, IntArray]:
        """(document ids, lengths) of positions ``[start, stop)`` of chunk ``epoch`` (1-based)."""
        g = np.arange((epoch - 1) * self.chunk + start, (epoch - 1) * self.chunk + stop, dtype=np.int64)
        return self.docs_at(g)

    def docs_at(self, g: IntArray) -> tuple[IntArray, IntArray]:
        """(document ids, lengths) of samples ``g``."""
        return self._docs_resolved(self._known(g))

    def _docs_resolved(self, g: IntArray) -> tuple[IntArray, IntArray]:
        src, pos = self._assign_resolved(g)
        ids = np.empty(len(g), dtype=np.int64)
        lens = np.empty(len(g), dtype=np.int64)
        for k in np.unique(src).tolist():
            sel = src == k
            local = walk_passes(pos[sel], int(self.combined.num[k]), partial(self._order, k))
            ids[sel] = local + self.combined.start_N[k]
            lens[sel] = self.combined.datasets[k].lengths().take(local)
        return ids, lens

    def token_documents(self, at_least: int | None = None) -> tuple[int, int]:
        """(documents with a token, documents) of the sources this stream's schedule draws from (a weight
        above 0 in a stage), counted until ``at_least`` are found (None: all), per source on from where
        the last call stopped (:class:`~seqstore.data._lengths.NonzeroCount`)."""
        weighted = np.flatnonzero(self.schedule.units.max(axis=0) > 0).tolist()
        have = 0
        for k in weighted:
            count = self._with_tokens.get(k)
            if count is None:
                count = self._with_tokens[k] = NonzeroCount(self.combined.datasets[k].lengths())
            have += count.at_least(None if at_least is None else max(0, at_least - have))
        return have, sum(int(self.combined.num[k]) for k in weighted)

    def source_of(self, ids: IntArray) -> IntArray:
        """Source number of document ids."""
        return np.searchsorted(self.combined.start_N, ids, side="right") - 1

    # -------------------------------------------------------------------------------- state

    def state(self) -> list[list[Any]]:
        out = [[int(g0), s.to_json(), [int(b) for b in base]] for g0, s, base in self.segments]
        if self._walk is not None:
            out[-1].append(self._walk.to_json())
        return out

    def schedule_id(self) -> str:
        """A short digest of the segments this stream deals samples by (a stage walk's stages in tokens,
        not how far it found them): share states carry it, so that a share packed after a schedule change
        is not opened on a stream that never loaded that run's segments. O(stages x segments), once per
        change of segments."""
        if self._id is None:
            segs = [[int(g0), s.to_json(), [int(b) for b in base]] for g0, s, base in self.segments]
            if self._walk is not None:
                segs[-1][1] = self._walk.schedule.to_json()
            text = json.dumps(segs, sort_keys=True, separators=(",", ":"))
            self._id = hashlib.sha256(text.encode()).hexdigest()[:16]
        return self._id

    def load_state(self, segments: Any, frontier: int) -> None:
        """Take the segments of a saved stream; if this stream's schedule differs from the last saved
        one, it applies from sample ``frontier`` on (the first sample no share has started), every
        source continuing from its position there."""
        try:
            segs = [(int(seg[0]), MixtureSchedule.from_json(seg[1], self.names), np.asarray(seg[2], dtype=np.int64))
                    for seg in segments]
            walk = None
            if segments and len(segments[-1]) > 3:
                walk = StageWalk.from_json(segments[-1][3], self.names, segs[-1][0])
        except (TypeError, ValueError, KeyError, IndexError) as e:
            raise ValueError(f"MixtureStream: malformed schedule state: {e}") from None
        if not segs or any(len(b) != len(self.names) for _, _, b in segs):
            raise ValueError(f"MixtureStream: the state's segments do not match the sources {self.names}")
        _check_segments(segs)
        if walk is not None and walk.effective() != segs[-1][1]:
            raise ValueError("MixtureStream: malformed schedule state: the last segment's stages are not those its "
                             f"walk found (stages in tokens {walk.schedule.to_json()!r:.200} starting at samples "
                             f"{walk.starts[:8]})")
        mine = self._own
        saved = walk.schedule if walk is not None else segs[-1][1]
        if saved != mine and frontier < segs[-1][0]:
            raise ValueError(f"MixtureStream: schedule change at sample {frontier} before the last segment")
        before = (self.schedule, self.segments, self._walk, self._loaded)
        self.schedule, self.segments, self._walk, self._loaded, self._id = mine, segs, walk, True, None
        if saved == mine:
            self.schedule = saved  # the walk's resolved starts carry on
            return
        try:  # (reads lengths: a read that fails leaves the stream as it was)
            base = self.positions(frontier)
            tokens = self.tokens_before(frontier) if mine.unit == "tokens" else 0
        except BaseException:
            self.schedule, self.segments, self._walk, self._loaded = before
            self._id = None
            raise
        if frontier == segs[-1][0]:
            self.segments = self.segments[:-1]
        self._start_segment(int(frontier), tokens, base)

    def __repr__(self) -> str:
        return f"MixtureStream({self.names}, {self.schedule!r}, chunk={self.chunk})"


def _check_segments(segs: list[tuple[int, MixtureSchedule, IntArray]]) -> None:
    """ValueError naming the first segment of a loaded state that no stream writes: the first starts at
    sample 0 with every position 0, starts increase, positions are >= 0 and never go back. O(segments)."""
    for i, (g0, _, base) in enumerate(segs):
        if i == 0 and (g0 != 0 or base.any()):
            raise ValueError(f"MixtureStream: malformed schedule state: segment 0 starts at sample {g0} with "
                             f"positions {base.tolist()}; expected sample 0 with every position 0")
        if i and g0 <= segs[i - 1][0]:
            raise ValueError(f"MixtureStream: malformed schedule state: segment {i} starts at sample {g0}, not "
                             f"after segment {i - 1} (sample {segs[i - 1][0]})")
        if i and (base < segs[i - 1][2]).any():
            raise ValueError(f"MixtureStream: malformed schedule state: segment {i} has positions {base.tolist()}, "
                             f"before those of segment {i - 1} ({segs[i - 1][2].tolist()}); positions are >= 0 "
                             "and never go back")
