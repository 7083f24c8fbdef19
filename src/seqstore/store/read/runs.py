"""Planning ``iter_batches``: each batch's reads in flight ahead of it (:func:`plan_batches`, tokens
:class:`Planned`), and on object storage runs of batches read together, the union of their byte ranges
asked for as it lies (:class:`BatchRuns`).

On object storage (``ReadPolicy.together``) the records of ``together`` consecutive batches are asked
for at once, as the union of their ranges (:meth:`ByteSource.request_runs`): docs/remote.md says why
(a block-shuffled window's union is its blocks, fetched as they lie, where batch by batch the chunks at
a block's ends would be taken whole) and how a run's last batch leaves a few rows of the next window's
blocks to the next run. Ragged fields' value rows are asked for run by run once the run's offsets are
resident; where every field read is ragged, the offsets are asked for one run ahead, so that a reader
waiting for them does not hold up the batches before (754 against 840 MB/s in docs/benchmarks.md).
What is asked for ahead is advice: a request that fails is dropped (the batch's own wait asks again and
raises), and a later batch that cannot be planned (its shard not mapped) raises when it is due.
Memory: the index arrays and groups of two runs (three for ragged fields alone), and the ranges left
over (at most one batch's).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np

from ...io import lookahead
from .readahead import ReadPlanner
from .shards import Group

__all__ = ["BatchRuns", "Planned", "plan_batches"]

_EMPTY = np.zeros(0, np.int64)


@dataclass(slots=True)
class Run:
    """One run of batches: their shard groups, and whether their value rows were asked for."""

    groups: list[list[Group]]
    values_asked: bool = False


@dataclass(slots=True)
class Planned:
    """A batch of ``iter_batches`` whose first-stage reads were asked for: its records (``idx``, split by
    shard into ``groups``), its run (read with other batches), whether its value rows were asked for."""

    idx: np.ndarray[Any, Any]
    groups: list[Group]
    run: Run | None = None
    values_asked: bool = False
    error: Exception | None = None  # planning it failed: raised when it is due, after the batches before


def _plan(shards: Any, batch: Any) -> Planned:
    """``batch`` planned (its shards mapped), or where that fails a token that raises the error when due."""
    try:
        return Planned(*shards.batch(batch))
    except Exception as exc:  # noqa: BLE001 - raised where the batch is due (plan_batches)
        return Planned(_EMPTY, [], error=exc)


def _advice(ask: Any, *args: Any, **kw: Any) -> Any:
    """``ask(*args, **kw)``, a read asked for ahead; a failure is dropped: the batch's own wait asks again
    for what did not arrive and raises then (None returned)."""
    try:
        return ask(*args, **kw)
    except Exception:  # noqa: BLE001
        return None


def plan_batches(planner: ReadPlanner, batches: Iterable[Any], names: list[str], prefetch: int | None
                 ) -> Iterator[Planned]:
    """Each batch of ``batches`` (index arrays, consumed lazily) once its bytes are resident, with the
    reads of the next ``prefetch`` batches in flight (None: the source's default depth, deeper while the
    source has few requests pending, and with the source's ``together`` in runs of batches)."""
    policy, shards = planner.policy, planner.shards
    active = policy.ahead
    deeper = None
    if prefetch is None:  # the source's default (object storage answers after tens of milliseconds)
        prefetch = policy.depth
        if policy.deepest > prefetch:  # deeper while the source has few requests pending
            most, source = policy.deepest, planner.source
            deeper = lambda n: n < most and source.deeper()  # noqa: E731
    # a staged source requests the value rows of a batch when the ``lag``-th batch after it enters the
    # window (reading its offsets then seldom waits: they have had that many batches' time to arrive),
    # others just before the batch is next (the page cache answers offsets in microseconds)
    lag = max(1, prefetch // 4)
    window: deque[Planned] = deque()
    runs = BatchRuns(planner, names, policy.together) if active and deeper is not None and policy.together else None

    def values(token: Planned) -> None:
        if active and not token.values_asked:
            token.values_asked = True
            if runs is not None and token.run is not None:
                _advice(runs.values, token.run)
            else:
                _advice(planner.request_values, token.groups, names)

    def request(batch: Any) -> Planned:
        if isinstance(batch, Planned):  # planned with its run of batches
            token = batch
        else:
            token = _plan(shards, batch)
            if active and token.error is None:
                _advice(planner.request, token.groups, names)
        if policy.staged:
            window.append(token)
            if len(window) > lag:
                values(window.popleft())
        return token

    items = batches if runs is None else runs.batches(batches)
    for _batch, token in lookahead(items, prefetch, request, values, deeper):
        if token.error is not None:
            raise token.error
        planner.need_groups(token.groups, names)
        yield token


class BatchRuns:
    """The runs of ``together`` batches of one ``iter_batches`` call over fields ``names``."""

    def __init__(self, planner: ReadPlanner, names: list[str], together: int) -> None:
        self.planner, self.names, self.together = planner, names, together
        self.ragged = planner.ragged(names)
        self.left: tuple[Any, Any] = (_EMPTY, _EMPTY)  # first-stage ranges left for the next run's union
        self.left_values: tuple[Any, Any] = (_EMPTY, _EMPTY)
        self.most = 0

    def batches(self, items: Iterable[Any]) -> Iterator[Planned]:
        """Each batch of ``items`` planned, the first-stage reads (fixed fields' records, ragged fields'
        offsets) of each run asked for before its first batch is handed out (a run earlier where all of
        them are offsets)."""
        shards = self.planner.shards
        it = iter(items)
        ahead = 1 if self.ragged and all(shards.schema[n].ragged for n in self.names) else 0
        queue: deque[list[Planned]] = deque()
        done = False
        while True:
            while not done and len(queue) <= ahead:
                got: list[Planned] = []
                for b in islice(it, self.together):
                    got.append(_plan(shards, b))
                    if got[-1].error is not None:  # the last batch planned: it raises when due
                        done = True
                        break
                for p in got:
                    self.most = self.most or next((g.shard.request for g in p.groups), 0)
                left = _advice(self._ask, [p.groups for p in got], self.left, values=False, last=not got or done)
                self.left = (_EMPTY, _EMPTY) if left is None else left
                if not got:
                    done = True
                    break
                run = Run([p.groups for p in got])
                for p in got:
                    p.run = run
                queue.append(got)
            if not queue:
                return
            yield from queue.popleft()

    def values(self, run: Run) -> None:
        """Ask for the value rows of ragged fields of ``run``'s batches (once per run), their offsets
        made resident first (asked for with the run's union: they arrive together)."""
        if run.values_asked or not self.ragged:
            return
        run.values_asked = True
        for groups in run.groups:
            self.planner.need_groups(groups, self.names, values=False)
        left, self.left_values = self.left_values, (_EMPTY, _EMPTY)  # (dropped with the request if it fails)
        self.left_values = self._ask(run.groups, left, values=True, last=False)

    def _ask(self, runs: list[list[Group]], left: tuple[Any, Any], *, values: bool, last: bool) -> tuple[Any, Any]:
        """Ask for the union of ``left`` and the ranges of the batches ``runs`` (the last batch's may be
        left out); ``last``: the end of the batches, everything asked for. Returns what was left out."""
        starts: list[Any] = [left[0]]
        ends: list[Any] = [left[1]]
        must = len(left[0])
        for k, groups in enumerate(runs):
            a, b = self.planner.ranges(groups, self.names, values)
            starts += a
            ends += b
            if k < len(runs) - 1:
                must += sum(len(x) for x in a)
        union_s, union_e = np.concatenate(starts), np.concatenate(ends)
        if not len(union_s):
            return _EMPTY, _EMPTY
        return self.planner.source.request_runs(
            union_s, union_e, most=self.most or 1, must=len(union_s) if last else must
        )
