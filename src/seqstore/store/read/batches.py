"""Many records at once: ``get_batch`` (a vectorised gather, one copy), ``prefetch``, ``iter_batches``
(the next batches' reads in flight while one is consumed) and iteration in order.

A batch is split by shard (:meth:`~.shards.ShardRegistry._batch_groups`); its bytes are asked for
ahead in two stages (:mod:`.readahead`), then gathered by numba copies that run without the GIL:
fixed fields one ``memcpy`` per record straight into its place in the batch (:func:`take_rows`),
ragged fields each record's value rows (:func:`gather_rows`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ...io import address, lookahead
from ...schema import BFLOAT16, Field
from .copy import copy_via, gather_rows, take_rows
from .records import Records
from .runs import BatchRuns
from .shards import Group, checked_bounds
from .stream import Pool, plan_runs, stream_batches

__all__ = ["Batches", "gather_rows", "take_rows"]


class Batches(Records):
    """Gathering many records."""

    def get_batch(
        self, indices: Sequence[int] | np.ndarray[Any, Any], fields: Sequence[str] | None = None, pad: bool = False
    ) -> dict[str, Any]:
        """Gather many records at once (vectorised; one copy).

        Returns a dict: a fixed field -> array (B, *shape); a ragged field -> ``(values, lengths)``
        where ``values`` is the rows of all B records concatenated (sum(lengths), *inner) or, with
        ``pad=True``, zero-padded to (B, max(lengths), *inner); ``lengths`` is int64 (B,).

        Records not in memory are read with all their reads in flight at once (exactly their pages;
        for ragged fields the offsets first, then the values), not one page fault at a time; a batch
        found in memory is gathered straight from the mapping. :meth:`iter_batches` also starts the
        reads of the next batches while this one is consumed.
        """
        idx = self._norm_many(indices).reshape(-1)
        names = self._field_names(fields)
        groups = self._batch_groups(idx)
        if self._ahead:
            self._request_values(self._request(groups, names), names)
            self._need_groups(groups, names)
        return self._gather(idx, groups, names, pad)

    def _field_names(self, fields: Sequence[str] | None) -> list[str]:
        names = list(self.schema) if fields is None else list(fields)
        for name in names:
            if name not in self.schema:
                raise KeyError(f"no field {name!r} in {self.url}; fields are {list(self.schema)}")
        return names

    def prefetch(self, indices: Sequence[int] | np.ndarray[Any, Any], fields: Sequence[str] | None = None) -> None:
        """Start reading records ``indices`` (all fields, or ``fields``) into memory and return without
        waiting for them (for ragged fields this waits for their offsets only). A later
        :meth:`get_batch` or ``store[i]`` of those records finds them arriving or arrived. A no-op for
        records in memory and with ``readahead="never"``."""
        if not self._ahead:
            return
        idx = self._norm_many(indices).reshape(-1)
        names = self._field_names(fields)
        self._request_values(self._request(self._batch_groups(idx), names), names)

    def iter_batches(
        self,
        batches: Iterable[Sequence[int] | np.ndarray[Any, Any]],
        *,
        fields: Sequence[str] | None = None,
        pad: bool = False,
        prefetch: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """``get_batch`` of each index array of ``batches`` (any iterable, consumed lazily: e.g.
        ``order.iter_chunks(1024)`` or :func:`seqstore.batch_indices`), with the reads of the next
        ``prefetch`` batches already in flight while a batch is consumed (default 2; for a remote store 16,
        and up to 64 while few requests are pending: batches that each need few, large requests). With
        the default on a remote store, reads are asked for in runs of 16 batches, as the union of their
        records (a block-shuffled window's blocks, as they lie; :mod:`.runs`). With the ``read_once``
        storage option those runs are received into memory of the reader's own and gathered from there,
        bypassing the node cache (:mod:`.stream`; memory: the runs fetched ahead, at most
        ``max_inflight_bytes`` and two runs).

        Yields the same dicts as :meth:`get_batch`. Memory: the index arrays of ``prefetch + 1``
        batches (and of a run of 16) plus what the page cache holds of the requested records
        (reclaimable, shared).
        """
        names = self._field_names(fields)
        active = self._ahead
        deeper = None
        if prefetch is None and self.read_once:  # runs fetched into memory (.stream)
            yield from stream_batches(self, batches, names, pad, self._together or 16, self._source.stream_budget)
            return
        if prefetch is None:  # the source's default (object storage answers after tens of milliseconds)
            prefetch = self._depth
            if self._deepest > prefetch:  # deeper while the source has few requests pending
                most, source = self._deepest, self._source
                deeper = lambda n: n < most and source.deeper()  # noqa: E731

        # tokens: [indices, groups, value rows requested(, run)]; a staged source requests the value rows
        # of a batch when the ``lag``-th batch after it enters the window (reading its offsets then seldom
        # waits: they have had that many batches' time to arrive), others just before the batch is
        # next (the page cache answers offsets in microseconds)
        lag = max(1, prefetch // 4)
        window: deque[list[Any]] = deque()
        staged = self._staged

        def values(token: list[Any]) -> None:
            if active and not token[2]:
                token[2] = True
                if runs is not None:
                    runs.values(token[3])
                else:
                    self._request_values(token[1], names)

        # with the source's default depth, a source that reads runs of batches together (object storage)
        # asks for their unions, as they lie (.runs)
        runs = BatchRuns(self, names, self._together) if active and deeper is not None and self._together else None

        def request(batch: Any) -> list[Any]:
            if runs is not None:  # asked for with its run of batches
                idx, groups, run = batch
                token = [idx, groups, False, run]
            else:
                idx = self._norm_many(batch).reshape(-1)
                groups = self._batch_groups(idx)
                token = [idx, self._request(groups, names) if active else groups, False]
            if staged:
                window.append(token)
                if len(window) > lag:
                    values(window.popleft())
            return token

        items = batches if runs is None else runs.batches(batches)
        for _batch, token in lookahead(items, prefetch, request, values, deeper):
            idx, groups = token[0], token[1]
            self._need_groups(groups, names)
            yield self._gather(idx, groups, names, pad)

    @property
    def read_once(self) -> bool:
        """Whether :meth:`iter_batches` (at its default depth) receives runs of batches into memory instead
        of the node cache: the ``read_once`` storage option on a remote store."""
        return bool(self._stream and self._ahead)

    def fetch_runs(
        self, batches: Iterable[Sequence[int] | np.ndarray[Any, Any]], pool: Pool, *,
        fields: Sequence[str] | None = None,
    ) -> Iterator[tuple[np.ndarray[Any, Any], list[Any]]]:
        """A read-once store: ``(idx, parts)`` of each batch of ``batches`` once its bytes are in memory,
        fetched as :meth:`iter_batches` fetches them, into buffers from ``pool`` (a
        :class:`~.stream.Pool`). Each part (:class:`~seqstore.io.remote_stream.Part`) is held for the
        caller: call its ``release()`` once the batch was gathered (:meth:`gather_fetched`, in this
        process or one that received the parts' buffers and :func:`~seqstore.io.remote_stream.export_part`)."""
        if not self.read_once:
            raise ValueError(f"{self.url}: fetch_runs needs a remote store opened with read_once")
        names = self._field_names(fields)
        for idx, _groups, parts in plan_runs(self, batches, names, self._together or 16, self._source.stream_budget,
                                             pool, hold=True):
            yield idx, parts

    def gather_fetched(
        self, idx: np.ndarray[Any, Any], via: Any, *, fields: Sequence[str] | None = None, pad: bool = False,
        alloc: Any = None,
    ) -> dict[str, Any]:
        """``get_batch(idx, pad=pad)`` from bytes :meth:`fetch_runs` fetched: ``via`` is their segment table
        (:func:`~.stream.via_of` of the parts), or a function that makes it once the batch's shards are
        mapped (:func:`~seqstore.io.remote_stream.via_from`, in another process). ``alloc(n)``: where each
        field's values go (``n`` bytes, a C-contiguous ``uint8`` array; None: new arrays)."""
        idx = self._norm_many(idx).reshape(-1)
        names = self._field_names(fields)
        groups = self._batch_groups(idx)
        ragged = [n for n in names if self.schema[n].ragged]
        if ragged:
            self._need_groups(groups, ragged, values=False)  # the offsets: through the node cache
        return self._gather(idx, groups, names, pad, via() if callable(via) else via, alloc)

    def __iter__(self) -> Iterator[dict[str, np.ndarray[Any, Any]]]:
        window = 4096
        ahead = self._readahead != "never"
        if ahead and self._n:
            self.prefetch(np.arange(0, min(window, self._n), dtype=np.int64))
        for lo in range(0, self._n, window):
            hi = min(lo + window, self._n)
            if ahead and hi < self._n:  # the next window, while this one is read
                self.prefetch(np.arange(hi, min(hi + window, self._n), dtype=np.int64))
            for i in range(lo, hi):
                yield self[i]

    # ------------------------------------------------------------------------------------ gather

    def _gather(
        self, idx: np.ndarray[Any, Any], groups: list[Group], names: list[str], pad: bool, via: Any = None,
        alloc: Any = None,
    ) -> dict[str, Any]:
        """The batch of records ``idx`` (split by shard into ``groups``), fields ``names``. ``via``: the
        records' bytes are not read from the mappings but from where they were fetched into memory
        (a table of segments, :func:`~.copy.copy_via`; a read-once epoch, :mod:`.stream`). ``alloc(n)``:
        where the values go (``n`` bytes, a ``uint8`` array; None: new arrays)."""
        out: dict[str, Any] = {}
        for name in names:
            f = self.schema[name]
            if f.ragged:
                out[name] = self._gather_ragged(name, f, idx, groups, pad, via, alloc)
            else:
                out[name] = self._gather_fixed(name, f, idx, groups, via, alloc)
            if f.dtype == BFLOAT16 and self._bf16 != "bits":
                if f.ragged:
                    out[name] = (self.bfloat16_view(out[name][0]), out[name][1])
                else:
                    out[name] = self.bfloat16_view(out[name])
        return out

    def _gather_fixed(
        self, name: str, f: Field, idx: Any, groups: list[Group], via: Any = None, alloc: Any = None
    ) -> np.ndarray[Any, Any]:
        shape = (len(idx), *f.inner_shape)
        res = (alloc or _new)(int(np.prod(shape, dtype=np.int64)) * f.storage_dtype.itemsize).view(
            f.storage_dtype).reshape(shape)
        width = res.itemsize * int(np.prod(f.inner_shape, dtype=np.int64))
        if not len(idx) or not width:
            return res
        for sh, pos, rows in groups:  # each shard's rows straight into their places in the batch
            col = sh.columns[name]
            if via is not None:
                at = np.arange(len(idx), dtype=np.int64) if isinstance(pos, slice) else pos
                r = np.asarray(rows, dtype=np.int64)
                base, step, _ = sh.span(name)  # the rows as fetched (a packed field: a slice of each row)
                _copy(name, base + r * step, np.full(len(r), width, np.int64),
                      address(res) + np.asarray(at, np.int64) * width, via, sh)
                continue
            if not (col.flags.c_contiguous and col.strides[0] == width):  # (not a mapped column)
                res[pos] = np.take(col, rows, axis=0)
                continue
            at = np.arange(len(idx), dtype=np.int64) if isinstance(pos, slice) else pos
            take_rows(address(col), np.ascontiguousarray(rows, dtype=np.int64), address(res),
                      np.ascontiguousarray(at, dtype=np.int64), width)
        return res

    def _gather_ragged(
        self, name: str, f: Field, idx: Any, groups: list[Group], pad: bool, via: Any = None, alloc: Any = None
    ) -> tuple[Any, Any]:
        lengths = np.empty(len(idx), dtype=np.int64)
        bounds = []
        for sh, pos, rows in groups:
            a, b = checked_bounds(sh, name, rows)
            lengths[pos] = b - a
            bounds.append((a, b))
        stride = f.row_bytes
        if pad:
            t = int(lengths.max()) if len(lengths) else 0
            if alloc is None:
                flat = np.zeros(len(idx) * t * stride, dtype=np.uint8)
            else:
                flat = alloc(len(idx) * t * stride)
                flat.fill(0)
            starts = np.arange(len(idx), dtype=np.int64) * (t * stride)
        else:
            ends = np.cumsum(lengths)
            flat = (alloc or _new)(int(ends[-1]) * stride if len(ends) else 0)
            starts = (ends - lengths) * stride
        for (sh, pos, rows), (a, b) in zip(groups, bounds):
            col = sh.columns[name]
            data = col.reshape(-1).view(np.uint8) if col.size else np.empty(0, np.uint8)
            if via is not None:
                if col.size:
                    _copy(name, address(data) + a * stride, (b - a) * stride,
                          address(flat) + np.asarray(starts[pos], np.int64), via, sh)
                continue
            off = sh.offsets[name]
            gather_rows(data, off, np.ascontiguousarray(rows), flat, np.ascontiguousarray(starts[pos]), stride)
        values = flat.view(f.storage_dtype)
        if pad:
            values = values.reshape(len(idx), int(lengths.max()) if len(lengths) else 0, *f.inner_shape)
        else:
            values = values.reshape(int(lengths.sum()), *f.inner_shape)  # not -1: inner dims may be 0
        return values, lengths


def _new(n: int) -> np.ndarray[Any, Any]:
    return np.empty(n, np.uint8)


def _copy(name: str, src: Any, n: Any, dst: Any, via: Any, sh: Any) -> None:
    """:func:`copy_via` of one shard's records of field ``name``; a range no fetched segment holds is a bug
    of the run's planning, reported as such rather than read as zeros."""
    k = copy_via(np.ascontiguousarray(src, np.int64), np.ascontiguousarray(n, np.int64),
                 np.ascontiguousarray(dst, np.int64), *via)
    if k >= 0:
        raise RuntimeError(f"field {name!r} of {sh.display}: bytes at {int(src[k]):#x} (+{int(n[k])}) were not fetched "
                           "for this read-once run (a seqstore bug; please report it)")
