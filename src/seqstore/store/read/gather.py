"""The gatherer (:class:`Gatherer`): records out of the mapped shards, one (``store[i]``, ``nested``) or a
batch at once, and how stored bfloat16 bits are presented (the store's ``bfloat16`` mode).

A batch is gathered field by field (:meth:`Gatherer.field`, the one place a field's ranges are read)
by numba copies that run without the GIL: fixed fields one ``memcpy`` per record straight into its
place in the batch (:func:`~.copy.take_rows`), ragged fields each record's value rows
(:func:`~.copy.gather_rows`); bytes fetched into memory elsewhere (a read-once run) through a table of
segments (:func:`~.copy.copy_via`). ``alloc(n)`` gives where each field's values go.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..._numba_start import would_wait
from ...format.checksums import SECRET_AT, spans_at
from ...io import address
from ...schema import BFLOAT16, Field, bfloat16_to_float32
from .copy import copy_via, gather_rows, gather_rows_numpy, take_rows
from .readahead import ReadPlanner
from .shards import Group, Shard, checked_bounds
from .verify import ReadVerifier, gather_rows_checked, take_rows_checked

__all__ = ["Alloc", "BF16_MODES", "Gatherer", "present_bf16"]

BF16_MODES = ("bits", "float32", "ml_dtypes")
#: ``alloc(n)``: a C-contiguous ``uint8`` array of ``n`` bytes for a field's values
Alloc = Callable[[int], np.ndarray[Any, Any]]


def present_bf16(bits: Any, mode: str) -> Any:
    """Stored bfloat16 ``bits`` presented per ``mode`` (bits/float32/ml_dtypes)."""
    if mode == "bits":
        return bits
    if mode == "float32":
        return bfloat16_to_float32(bits)
    import ml_dtypes  # type: ignore[import-not-found,unused-ignore]

    return bits.view(ml_dtypes.bfloat16)


def _new(n: int) -> np.ndarray[Any, Any]:
    return np.empty(n, np.uint8)


class Gatherer:
    """Records of ``planner``'s shard map as arrays, bfloat16 fields presented per ``bf16``; with a
    ``verify`` (``verify_reads=True``) each record's bytes checked against their stored checksums."""

    verify: ReadVerifier | None = None

    def __init__(self, planner: ReadPlanner, bf16: str) -> None:
        self.planner, self.shards, self.bf16 = planner, planner.shards, bf16
        self._bf16_cache: tuple[Any, tuple[str, ...]] | None = None

    def record(self, i: int, copy: bool = False) -> dict[str, Any]:
        """Record ``i``: zero-copy views, or with ``copy`` owned arrays (one copy per packed group)."""
        if self.verify is not None:  # (a copy in the node cache failing its checksum: fetched again, read again)
            return self.verify.checked(lambda: self._record(i, copy))
        return self._record(i, copy)

    def _record(self, i: int, copy: bool) -> dict[str, Any]:
        shards = self.shards
        sh, row = shards.record(i)
        if self.planner.lazy:
            self.planner.need_groups([Group(sh, slice(None), np.array([row], np.int64))], list(shards.schema))
        rec = sh.record_copy(row) if copy else sh.record(row)
        if self.verify is not None:
            self.verify.record(sh, row, shards.norm(i), rec)
        if self.bf16 != "bits":
            for name in self._bf16_names(shards.schema):
                if name in rec:
                    rec[name] = present_bf16(rec[name], self.bf16)
        return rec

    def _bf16_names(self, schema: Any) -> tuple[str, ...]:
        """The bfloat16 fields of ``schema`` (found once per schema: ``store[i]`` pays no loop for them)."""
        cached = self._bf16_cache
        if cached is None or cached[0] is not schema:
            cached = self._bf16_cache = (schema, tuple(n for n, f in schema.items() if f.dtype == BFLOAT16))
        return cached[1]

    def batch(self, idx: np.ndarray[Any, Any], groups: list[Group], names: list[str], pad: bool,
              via: Any = None, alloc: Alloc | None = None) -> dict[str, Any]:
        """The batch of records ``idx`` (split by shard into ``groups``), fields ``names`` (see
        ``Store.get_batch``). ``via``: the records' bytes are read not from the mappings but from where
        they were fetched into memory (a table of segments, :func:`~.copy.copy_via`)."""
        if self.verify is None:
            return {name: self.field(name, idx, groups, pad, via, alloc) for name in names}

        def again() -> dict[str, Any]:  # the node's copies fetched anew: read through them (runs were
            if via is not None:  # planned with the offsets found damaged, maybe)
                self.planner.ready(groups, names)
            return {name: self.field(name, idx, groups, pad, None, alloc) for name in names}

        return self.verify.checked(lambda: {name: self.field(name, idx, groups, pad, via, alloc) for name in names},
                                   again)

    def field(self, name: str, idx: np.ndarray[Any, Any], groups: list[Group], pad: bool, via: Any = None,
              alloc: Alloc | None = None) -> Any:
        """Field ``name`` of the batch (see :meth:`batch`): an array, or ``(values, lengths)``."""
        f = self.shards.schema[name]
        sums = None if self.verify is None else np.empty(len(idx), np.uint32)  # the records' checksums, as copied
        got: Any = self._ragged(name, f, idx, groups, pad, via, alloc, sums) if f.ragged else self._fixed(
            name, f, idx, groups, via, alloc, sums)
        if self.verify is not None:  # the bytes as gathered, before any conversion
            self.verify.field(name, idx, groups, got, pad, sums)
        if f.dtype != BFLOAT16:
            return got
        return (present_bf16(got[0], self.bf16), got[1]) if f.ragged else present_bf16(got, self.bf16)

    def _fixed(self, name: str, f: Field, idx: Any, groups: list[Group], via: Any, alloc: Alloc | None,
               sums: np.ndarray[Any, Any] | None = None) -> np.ndarray[Any, Any]:
        width = f.row_bytes
        res = (alloc or _new)(len(idx) * width).view(f.storage_dtype).reshape(len(idx), *f.inner_shape)
        if not len(idx) or not width:
            if sums is not None:
                sums[:] = spans_at(0, np.zeros(len(idx), np.int64), np.zeros(len(idx), np.int64))
            return res
        for sh, pos, rows in groups:  # each shard's rows straight into their places in the batch
            col = sh.columns[name]
            at = np.arange(len(idx), dtype=np.int64) if isinstance(pos, slice) else np.asarray(pos, np.int64)
            if via is not None:
                base, step, _ = sh.span(name)  # the rows as fetched (a packed field: a slice of each row)
                r = np.asarray(rows, dtype=np.int64)
                _copy(name, base + r * step, np.full(len(r), width, np.int64), address(res) + at * width, via, sh)
            elif not (col.flags.c_contiguous and col.strides[0] == width) or would_wait(take_rows):
                # (not a mapped column, or numba not started yet: see seqstore._numba_start)
                res[pos] = np.take(col, rows, axis=0)
            elif sums is not None:  # verified: each row hashed as it is copied, while in cache
                take_rows_checked(address(col), np.ascontiguousarray(rows, dtype=np.int64), address(res),
                                  np.ascontiguousarray(at), width, sums, SECRET_AT)
                continue
            else:
                take_rows(address(col), np.ascontiguousarray(rows, dtype=np.int64), address(res),
                          np.ascontiguousarray(at), width)
            if sums is not None:
                sums[at] = spans_at(address(res), at * width, np.full(len(at), width, np.int64))
        return res

    def _ragged(self, name: str, f: Field, idx: Any, groups: list[Group], pad: bool, via: Any,
                alloc: Alloc | None, sums: np.ndarray[Any, Any] | None = None) -> tuple[Any, Any]:
        lengths = np.empty(len(idx), dtype=np.int64)
        bounds = []
        for sh, pos, rows in groups:
            a, b = checked_bounds(sh, name, rows)
            lengths[pos] = b - a
            bounds.append((a, b))
        stride = f.row_bytes
        longest = int(lengths.max()) if len(lengths) else 0
        if pad:
            if alloc is None:
                flat = np.zeros(len(idx) * longest * stride, dtype=np.uint8)
            else:
                flat = alloc(len(idx) * longest * stride)
                flat.fill(0)
            starts = np.arange(len(idx), dtype=np.int64) * (longest * stride)
        else:
            ends = np.cumsum(lengths)
            flat = (alloc or _new)(int(ends[-1]) * stride if len(ends) else 0)
            starts = (ends - lengths) * stride
        for (sh, pos, rows), (a, b) in zip(groups, bounds):
            col = sh.columns[name]
            data = col.reshape(-1).view(np.uint8) if col.size else np.empty(0, np.uint8)
            if via is None and sums is not None:  # verified: each record hashed as it is copied, while in cache
                at = np.arange(len(idx), dtype=np.int64) if isinstance(pos, slice) else np.asarray(pos, np.int64)
                gather_rows_checked(data, sh.offsets[name], np.ascontiguousarray(rows), flat,
                                    np.ascontiguousarray(starts[pos]), stride, sums, at, SECRET_AT)
                continue
            if via is None:
                copy = gather_rows_numpy if would_wait(gather_rows) else gather_rows
                copy(data, sh.offsets[name], np.ascontiguousarray(rows), flat, np.ascontiguousarray(starts[pos]),
                     stride)
            elif col.size:
                _copy(name, address(data) + a * stride, (b - a) * stride,
                      address(flat) + np.asarray(starts[pos], np.int64), via, sh)
            if sums is not None:
                sums[pos] = spans_at(address(flat) if flat.size else 0, np.asarray(starts[pos], np.int64),
                                     (b - a) * stride)
        values = flat.view(f.storage_dtype)
        if pad:
            return values.reshape(len(idx), longest, *f.inner_shape), lengths
        return values.reshape(int(lengths.sum()), *f.inner_shape), lengths  # not -1: inner dims may be 0


def _copy(name: str, src: Any, n: Any, dst: Any, via: Any, sh: Shard) -> None:
    """:func:`copy_via` of one shard's records of field ``name``; a range no fetched segment holds is a bug
    of the run's planning, reported as such rather than read as zeros."""
    k = copy_via(np.ascontiguousarray(src, np.int64), np.ascontiguousarray(n, np.int64),
                 np.ascontiguousarray(dst, np.int64), *via)
    if k >= 0:
        raise RuntimeError(f"field {name!r} of {sh.display}: bytes at {int(src[k]):#x} (+{int(n[k])}) were not fetched "
                           "for this read-once run (a seqstore bug; please report it)")
