"""The read planner (:class:`ReadPlanner`): the byte ranges an access will touch, asked for before it
touches them, and waited for where the source needs it, as the source's read policy says.

A batch's ranges come in two stages (:meth:`ReadPlanner.ranges`): the records of its fixed fields and
the offsets of its ragged fields, then the value rows of its ragged fields (which need the offsets).
The store's byte source turns them into requests (a local store: ``madvise(MADV_WILLNEED)`` of
exactly those pages, after a ``mincore`` sample says they are not in memory; a remote store: fetches
into the node cache). A source whose mapped bytes read as zeros until fetched (``lazy``) is also
asked to wait for them (:meth:`ReadPlanner.need_groups`) before they are read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...io import address
from ...io.source import ReadPolicy
from .shards import Group, ShardMap, checked_bounds

__all__ = ["ReadPlanner"]

#: records per field and read-ahead stage whose pages are probed with mincore (about 2 us each)
_SAMPLE = 4

#: probes in a row that found an access's sample in memory after which the probes thin out: the next
#: comes after as many skipped accesses as that run is long, at most ``_SKIP_MOST`` (a probe costs about
#: 25-50 us, a third of a warm batch of 64 records; data evicted meanwhile are read by page faults for at
#: most that many accesses, then requested again)
_WARM_RUN = 8
_SKIP_MOST = 32


class ReadPlanner:
    """Asking the byte source of ``shards`` for what an access is about to read, by ``policy`` (the
    source's :class:`~seqstore.io.source.ReadPolicy` for the store's ``readahead`` mode)."""

    def __init__(self, shards: ShardMap, policy: ReadPolicy, readahead: str) -> None:
        self.shards, self.source, self.policy = shards, shards.source, policy
        self.lazy = policy.lazy
        self.scans = readahead != "never"  # scans (iteration, matrices, ragged streams) read ahead
        self.warm_run = 0  # probes in a row that found the sample in memory
        self.skip = 0  # accesses left to go unprobed (see _WARM_RUN)

    def skipping(self) -> bool:
        """Whether the next access goes unprobed and unrequested, the data having been found in memory
        (see ``_WARM_RUN``); it counts as one such access. For callers that can skip their own work too."""
        if self.skip and self.policy.probe:
            self.skip -= 1
            return True
        return False

    def ready(self, groups: list[Group], names: list[str]) -> None:
        """A batch about to be gathered: its reads asked for at once (both stages) and waited for."""
        if self.policy.ahead:
            self.request_values(self.request(groups, names), names)
            self.need_groups(groups, names)

    def ragged(self, names: list[str]) -> bool:
        return any(self.shards.schema[n].ragged for n in names)

    def need(self, *arrays: Any) -> None:
        """A lazy source: wait until every byte of these views of mapped files is resident."""
        if self.lazy:
            for arr in arrays:
                self.source.ensure_array(arr)

    def need_groups(self, groups: list[Group], names: list[str], values: bool = True) -> None:
        """A lazy source: wait until the records of ``groups`` (offsets, then with ``values`` the value
        rows of ragged fields) are resident."""
        if not self.lazy:
            return
        for stage in (False, True) if values else (False,):
            if stage and not self.ragged(names):
                break
            starts, ends = self.ranges(groups, names, stage)
            if starts:
                self.source.ensure(np.concatenate(starts), np.concatenate(ends))

    def need_rows(self, src: np.ndarray[Any, Any], rows: slice | np.ndarray[Any, Any]) -> None:
        """A lazy source: wait for rows ``rows`` of the 2-d view ``src`` of a mapped file."""
        if isinstance(rows, slice):
            self.need(src[rows])
            return
        r = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(r):
            starts = address(src) + r * int(src.strides[0])
            self.source.ensure(starts, starts + src.shape[1] * src.itemsize)

    def ranges(self, groups: list[Group], names: list[str], values: bool) -> tuple[list[Any], list[Any]]:
        """Byte ranges (absolute addresses) of ``groups``' records: with ``values`` False the fixed
        fields' records and the ragged fields' offset pairs, with ``values`` True the ragged fields'
        value rows (reading their offsets)."""
        starts: list[np.ndarray[Any, Any]] = []
        ends: list[np.ndarray[Any, Any]] = []
        for sh, _pos, rows in groups:
            for name in names:
                base, step, size = sh.span(name)
                if name in sh.offsets:
                    if values:
                        if base:
                            a, b = checked_bounds(sh, name, rows)
                            starts.append(base + a * step)
                            ends.append(base + b * step)
                    else:
                        s = size + rows * 8  # offsets[row] and offsets[row + 1]
                        starts.append(s)
                        ends.append(s + 16)
                elif base and not values:
                    s = base + rows * step
                    starts.append(s)
                    ends.append(s + size)
        return starts, ends

    def advise(self, groups: list[Group], names: list[str], values: bool) -> None:
        """Request the pages of :meth:`ranges` unless a sample finds them in memory (where the source's
        policy probes): per field, ``_SAMPLE`` records (at least one) from at most as many groups, so a
        batch spread over many shards costs no more, and a field in memory cannot hide a cold one. After
        ``_WARM_RUN`` warm samples in a row, accesses go unprobed in between (see there). On a lazy
        source the value rows are asked for once their offsets are resident."""
        if values and self.lazy:
            self.need_groups(groups, names, values=False)
        if self.policy.probe:
            if self.skipping():
                return
            picked = groups[:: max(1, len(groups) // _SAMPLE)][:_SAMPLE]
            per = -(-_SAMPLE // max(1, len(picked)))
            sample = [Group(sh, pos, rows[:: max(1, len(rows) // per)][:per]) for sh, pos, rows in picked]
            probes = []
            for name in names:
                probe, _ = self.ranges(sample, [name], values)
                if probe:
                    addrs = np.concatenate(probe)
                    probes.append(addrs[:: max(1, len(addrs) // _SAMPLE)][:_SAMPLE])
            if not probes:
                return
            addrs = np.concatenate(probes)
            if not self.source.any_cold(addrs, sample=len(addrs)):
                self.warm_run += 1
                if self.warm_run >= _WARM_RUN:
                    self.skip = min(self.warm_run, _SKIP_MOST)
                return
            self.warm_run = 0
        starts, ends = self.ranges(groups, names, values)
        if starts:
            self.source.request(np.concatenate(starts), np.concatenate(ends), most=groups[0][0].request)

    def request(self, groups: list[Group], names: list[str]) -> list[Group]:
        """First read-ahead stage of a batch: start reading the records of its fixed fields and the
        offsets of its ragged fields. Returns ``groups``."""
        self.advise(groups, names, values=False)
        return groups

    def request_values(self, groups: list[Group], names: list[str]) -> None:
        """Second stage: start reading the value rows of the batch's ragged fields (reads their offsets,
        which the first stage asked for)."""
        if self.ragged(names):
            self.advise(groups, names, values=True)

    def scan_ahead(self, block: np.ndarray[Any, Any], most: int) -> None:
        """A scan is about to read all of ``block`` (a view of a mapping): start reading it (in requests of
        ``most`` bytes), unless the source's policy probes and a sample of its pages is in memory."""
        if block.size == 0 or not self.scans:
            return
        first = address(block)
        last = first + block.itemsize + sum((n - 1) * st for n, st in zip(block.shape, block.strides) if st > 0)
        if self.policy.probe and not self.source.any_cold(np.linspace(first, last - 1, 16).astype(np.int64)):
            return
        self.source.request_span(first, last, most=most)
