"""Read-once epochs: ``iter_batches`` with each run of batches fetched into memory, not into the node cache
(docs/remote.md, "Read-once epochs").

A run's ranges (the records of fixed fields, the value rows of ragged fields) are merged and received
into one buffer (:func:`seqstore.io.remote_stream.fetch_into`), and each batch is gathered from the
buffers with :func:`~.copy.copy_via`; ragged fields' offsets still go through the node cache, a run
ahead. ``ahead`` runs are in flight while one is gathered, in buffers from a small reused pool, so
memory is a few runs' bytes whatever the epoch's length. A run's last batch leaves its ranges that lie
more than 64 KiB from every other batch's to the next run, and is gathered from both runs' buffers.
A batch ahead that cannot be planned (its shard not mapped, its offsets not read) ends the runs before
it, and raises once the batches before it were handed out.
"""

from __future__ import annotations

import contextlib
import mmap
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, NamedTuple

import numpy as np

from ...errors import StaleStoreError
from ...io.remote_stream import Part, merge_ranges, segment_table
from .readahead import ReadPlanner
from .shards import Group

__all__ = ["Fetched", "FetchedBatch", "Pool", "anonymous", "plan_runs", "via_of"]

_GAP = 64 << 10  # a last batch's range farther than this from every other batch's goes to the next run
_EMPTY = np.zeros(0, np.int64)


def anonymous(size: int) -> np.ndarray[Any, Any]:
    """A buffer of ``size`` bytes in an anonymous mapping of its own (the default for a run's buffer)."""
    # not np.empty: received into, numpy's buffers cost the kernel 1.8 s per 1.9 GB where these cost
    # 0.95-1.0 (a whole fixed epoch in the benchmark; numpy asks for transparent huge pages on large
    # arrays, which this made no difference to on a mapping)
    return np.frombuffer(mmap.mmap(-1, size), np.uint8)


class Pool:
    """Buffers for the runs in flight, reused: memory does not follow the epoch's length (``keep``:
    free buffers kept at most). ``make(size)``: a new buffer (a C-contiguous ``uint8`` array; default
    :func:`anonymous`); ``drop(buffer)``: told of a buffer no longer kept."""

    def __init__(self, keep: int, make: Callable[[int], np.ndarray[Any, Any]] = anonymous,
                 drop: Callable[[np.ndarray[Any, Any]], None] | None = None) -> None:
        self.free: list[np.ndarray[Any, Any]] = []
        self.keep = keep
        self.make, self.drop = make, drop

    def alloc(self, n: int) -> np.ndarray[Any, Any]:
        fits = [k for k, b in enumerate(self.free) if len(b) >= n]
        if fits:
            return self.free.pop(min(fits, key=lambda k: len(self.free[k])))
        return self.make(-(-max(n, 1) * 5 // 4 // (1 << 20)) << 20)  # room to be reused by a larger run

    def give_back(self, b: np.ndarray[Any, Any]) -> None:
        self.free.append(b)
        if len(self.free) > self.keep:
            gone = self.free.pop(min(range(len(self.free)), key=lambda k: len(self.free[k])))
            if self.drop is not None:
                self.drop(gone)


class Fetched(NamedTuple):
    """A batch of :func:`plan_runs`: its records (``idx``, split by shard into ``groups``) and the fetched
    runs that hold their bytes (one :class:`Part`, or two for a run's last batch whose lone ranges went
    to the next run); gathered through ``via_of(parts)``."""

    idx: np.ndarray[Any, Any]
    groups: list[Group]
    parts: list[Part]


class FetchedBatch(NamedTuple):
    """A batch of ``Store.fetch_runs``: its index array and the fetched parts holding it."""

    idx: np.ndarray[Any, Any]
    parts: list[Part]


@dataclass(slots=True)
class _Run:
    batches: list[tuple[Any, list[Group]]] = field(default_factory=list)
    part: Part | None = None
    next_part: Part | None = None  # holds the ranges of the last batch left to the next run
    carried: bool = False


def plan_runs(
    planner: ReadPlanner, batches: Iterable[Any], names: list[str], pool: Pool, hold: bool = False
) -> Iterator[Fetched]:
    """Each batch of ``batches`` once its bytes are in (:class:`Fetched`), read in runs of the source's
    ``together`` batches (16 by default), in flight or waiting while they hold fewer than the source's
    ``stream_budget`` bytes (at least two runs; see the module docstring); their buffers come from ``pool``.

    A run's buffer goes back to the pool once the generator has moved past its last batch, and, with
    ``hold``, once every batch's consumer has called ``release()`` on each of its parts (a batch gathered
    elsewhere, later: another process reading the buffer)."""
    schema, source = planner.shards.schema, planner.source
    together, budget = planner.policy.together or 16, source.stream_budget
    fixed = [n for n in names if not schema[n].ragged]
    ragged = [n for n in names if schema[n].ragged]
    held = [0]  # bytes of the runs fetched and not yet given back
    out = [0]  # batches handed out
    it = iter(batches)
    prepared: deque[_Run] = deque()  # runs whose offsets were asked for, not fetched yet
    fetching: deque[_Run] = deque()  # runs fetched (in flight or in), in order
    carry: tuple[Any, Any] = (_EMPTY, _EMPTY)
    tail: list[Part] = []  # the fetch of what the last run carried (no run of its own)
    failed: list[Exception] = []  # a batch that could not be planned: raised after the batches before it
    done = False

    def prepare() -> None:
        nonlocal done
        got = list(islice(it, together))
        if not got:
            done = True
            return
        run = _Run()
        for batch in got:
            try:
                idx, groups = planner.shards.batch(batch)
            except Exception as exc:  # noqa: BLE001 - raised where this batch is due, after those before it
                failed.append(exc)
                done = True
                break
            if ragged:  # the offsets, through the node cache (advice: fetch() waits for them, raising then)
                with contextlib.suppress(Exception):
                    planner.request(groups, ragged)
            run.batches.append((idx, groups))
        if run.batches:
            prepared.append(run)

    def fetch(run: _Run | None) -> None:
        """Fetch ``run``'s ranges (with those carried from the run before); None: the end, fetch what is carried."""
        nonlocal carry, done
        starts, ends, tags = [carry[0]], [carry[1]], [np.full(len(carry[0]), -1, np.int64)]
        batches = run.batches if run is not None else []
        for k, (_idx, groups) in enumerate(batches):
            try:
                if ragged:
                    planner.need_groups(groups, ragged, values=False)
                a, b = planner.ranges(groups, fixed, False)
                ra, rb = planner.ranges(groups, ragged, True)
            except Exception as exc:  # noqa: BLE001 - batch k's offsets: the run ends before it, which raises when due
                failed[:] = [exc]  # (before any later run's)
                done = True
                prepared.clear()
                assert run is not None
                batches = run.batches = run.batches[:k]
                break
            a, b = a + ra, b + rb
            if a:
                starts += a
                ends += b
                tags.append(np.full(sum(len(x) for x in a), k, np.int64))
        if run is not None and not batches:  # (its first batch failed) what the run before carried, alone
            run = None
        s, e, t = np.concatenate(starts), np.concatenate(ends), np.concatenate(tags)
        if run is None and not len(s):
            return
        keep = np.ones(len(s), bool)
        if run is not None and len(batches) == together and len(s):  # not the last run: leave the lone ranges
            _, _, ids = merge_ranges(s, e, _GAP)
            shared = np.zeros(int(ids.max()) + 1, bool)
            shared[ids[t != len(batches) - 1]] = True
            keep = shared[ids]
        part = source.fetch_into(s[keep], e[keep], pool.alloc)
        part.on_free = pool.give_back
        if fetching and fetching[-1].carried:
            fetching[-1].next_part = part
        carry = (s[~keep], e[~keep])
        if run is None:
            tail.append(part)
            return
        run.part = part
        held[0] += part.nbytes
        run.carried = bool(len(carry[0]))
        fetching.append(run)

    def fill() -> None:
        if not done and not prepared:  # the first run is fetched before the next is planned
            prepare()
        # two runs at first, then deeper as batches go out (at most ``budget`` bytes): the first batch
        # does not share the link with a whole window of runs asked for at once
        while prepared and (len(fetching) < 2 or (held[0] < budget and len(fetching) < 2 + out[0] // 2)):
            fetch(prepared.popleft())
            if not done and len(prepared) < 2:
                prepare()
        while not done and len(prepared) < 2:  # offsets asked for a run before they are needed
            prepare()
        if done and not prepared and len(carry[0]):
            fetch(None)

    def alone(groups: list[Group]) -> Part:
        """The bytes of one batch fetched by themselves (its offsets are in the node cache), waited for."""
        a, b = planner.ranges(groups, fixed, False)
        ra, rb = planner.ranges(groups, ragged, True)
        a, b = a + ra, b + rb
        part: Part = source.fetch_into(np.concatenate(a) if a else _EMPTY, np.concatenate(b) if b else _EMPTY,
                                       pool.alloc)
        part.on_free = pool.give_back
        try:
            part.wait()
        except BaseException:
            part.release()
            raise
        return part

    try:
        fill()
        while fetching:
            run = fetching[0]
            assert run.part is not None
            for k, (idx, groups) in enumerate(run.batches):
                parts = [run.part]
                if k == len(run.batches) - 1 and run.carried:
                    fill()  # the next run's fetch holds the rest of this batch
                    assert run.next_part is not None
                    parts.append(run.next_part)
                own = None
                try:
                    for p in parts:
                        p.wait()
                except StaleStoreError:
                    raise
                except Exception:  # noqa: BLE001 - a range of the run failed, maybe another batch's:
                    own = alone(groups)  # this batch fetches its own, raising if that fails too
                    parts = [own]
                if hold:
                    for p in parts:
                        p.users += 1
                out[0] += 1
                fill()  # the next runs' requests (the window deepens as batches go out)
                try:
                    yield Fetched(idx, groups, parts)
                finally:
                    if own is not None:
                        own.release()
            fetching.popleft()
            held[0] -= run.part.nbytes
            run.part.release()
            run.part = run.next_part = None
            fill()
        if failed:
            raise failed[0]
    finally:  # closed early or failed: the buffers of the runs still here go back (or to their holders)
        for run in fetching:
            if run.part is not None:
                run.part.release()
            run.part = run.next_part = None
        fetching.clear()
        for part in tail:
            part.release()


def via_of(parts: list[Part]) -> tuple[Any, Any, Any]:
    """The segment table (starts, ends, buffer addresses; by start) that ``copy_via`` reads ``parts`` through."""
    if len(parts) == 1:  # a part's own table is sorted already
        return parts[0].seg_s, parts[0].seg_e, parts[0].seg_at
    return segment_table([p.seg_s for p in parts], [p.seg_e for p in parts], [p.seg_at for p in parts])
