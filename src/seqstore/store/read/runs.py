"""Reading runs of batches together: the union of their byte ranges asked for as it lies.

On object storage (``ReadPolicy.together``) ``iter_batches`` asks for the records of ``together``
consecutive batches at once, as the union of their ranges (:meth:`ByteSource.request_runs`), instead of
batch by batch. The batches of a ``random_block`` window each take a sample of every block of the window;
their union is the blocks themselves, fetched as they lie. Asked for batch by batch, a dense sample
makes the reader take the aligned chunks it touches whole, and where a block does not start on a chunk
boundary the chunks at its ends hold mostly other windows' rows: a quarter more bytes than the epoch
delivered in the benchmark, in more, smaller requests.

A run's last batch may take a few rows of the next window's blocks (windows need not start on a batch
boundary); the source leaves those out of the run's union and they go first in the next run's, where the
blocks they belong to are. Ragged fields' value rows are asked for the same way, run by run, once the
run's offsets are resident (when the first of its batches asks for its value rows). Where every field
read is ragged, the first stage (offsets: 8 bytes a record) is asked for one run ahead, so that a run's
offsets are in when its values are asked for: a reader waiting for them there does not gather the
batches before (the ragged epoch ran at 754 MB/s with the offsets asked for a run later, 840 with them
a run ahead). Memory: the index arrays and groups of two runs (three for ragged fields alone), and
the ranges left over (at most one batch's).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Any, Protocol

import numpy as np

from ...io.source import ByteSource
from .shards import Group

__all__ = ["BatchRuns"]

_EMPTY = np.zeros(0, np.int64)


class Reader(Protocol):
    """What reading runs needs of the store reader (:class:`~.batches.Batches`)."""

    @property
    def schema(self) -> Mapping[str, Any]: ...

    @property
    def _source(self) -> ByteSource: ...

    def _norm_many(self, indices: Any) -> np.ndarray[Any, Any]: ...

    def _batch_groups(self, idx: np.ndarray[Any, Any]) -> list[Group]: ...

    def _ranges(self, groups: list[Group], names: list[str], values: bool) -> tuple[list[Any], list[Any]]: ...

    def _need_groups(self, groups: list[Group], names: list[str], values: bool = True) -> None: ...


class _Run:
    """One run of batches: their shard groups, and whether their value rows were asked for."""

    __slots__ = ("groups", "values_asked")

    def __init__(self, groups: list[list[Group]]) -> None:
        self.groups = groups
        self.values_asked = False


class BatchRuns:
    """The runs of ``together`` batches of one ``iter_batches`` call over ``reader``'s fields ``names``."""

    def __init__(self, reader: Reader, names: list[str], together: int) -> None:
        self.reader, self.names, self.together = reader, names, together
        self.ragged = any(reader.schema[n].ragged for n in names)
        self.left: tuple[Any, Any] = (_EMPTY, _EMPTY)  # first-stage ranges left for the next run's union
        self.left_values: tuple[Any, Any] = (_EMPTY, _EMPTY)
        self.most = 0

    def batches(self, items: Iterable[Any]) -> Iterator[tuple[Any, list[Group], _Run]]:
        """``(indices, groups, run)`` of each batch of ``items``, the first-stage reads (fixed fields'
        records, ragged fields' offsets) of each run asked for before its first batch is handed out (a
        run earlier where all of them are offsets)."""
        r = self.reader
        it = iter(items)
        ahead = 1 if self.ragged and all(r.schema[n].ragged for n in self.names) else 0
        queue: list[tuple[list[tuple[Any, list[Group]]], _Run]] = []
        done = False
        while True:
            while not done and len(queue) <= ahead:
                batches = list(islice(it, self.together))
                prepared = []
                for batch in batches:
                    idx = r._norm_many(batch).reshape(-1)
                    groups = r._batch_groups(idx)
                    prepared.append((idx, groups))
                    self.most = self.most or next((g[0].request for g in groups), 0)
                self.left = self._ask([g for _, g in prepared], self.left, values=False, last=not batches)
                if not batches:
                    done = True
                    break
                queue.append((prepared, _Run([g for _, g in prepared])))
            if not queue:
                return
            prepared, run = queue.pop(0)
            for idx, groups in prepared:
                yield idx, groups, run

    def values(self, run: _Run) -> None:
        """Ask for the value rows of ragged fields of ``run``'s batches (once per run), their offsets
        made resident first (asked for with the run's union: they arrive together)."""
        if run.values_asked or not self.ragged:
            return
        run.values_asked = True
        for groups in run.groups:
            self.reader._need_groups(groups, self.names, values=False)
        self.left_values = self._ask(run.groups, self.left_values, values=True, last=False)

    def _ask(self, runs: list[list[Group]], left: tuple[Any, Any], *, values: bool, last: bool) -> tuple[Any, Any]:
        """Ask for the union of ``left`` and the ranges of the batches ``runs`` (the last batch's may be
        left out); ``last``: the end of the batches, everything asked for. Returns what was left out."""
        starts: list[Any] = [left[0]]
        ends: list[Any] = [left[1]]
        must = len(left[0])
        for k, groups in enumerate(runs):
            a, b = self.reader._ranges(groups, self.names, values)
            starts += a
            ends += b
            if k < len(runs) - 1:
                must += sum(len(x) for x in a)
        union_s, union_e = np.concatenate(starts), np.concatenate(ends)
        if not len(union_s):
            return _EMPTY, _EMPTY
        return self.reader._source.request_runs(
            union_s, union_e, most=self.most or 1, must=len(union_s) if last else must
        )
