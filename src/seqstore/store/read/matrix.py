"""Fixed fields as matrices: ``matrix`` (records as one ``(R, D)`` matrix for GEMMs), ``iter_matrix``
(streamed blocks) and ``matrix_columns`` (each field's column range).

A plan (:class:`MatrixPlan`) resolves the chosen fields into column segments of per-shard source
matrices (a packed group's ``(n, width)`` file, or an unpacked field flattened to ``(n, size)``).
Rows that are a slice inside one shard of one segment are a zero-copy strided view of the mapped
file; anything else is one copy, shard by shard.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...schema import BFLOAT16, bfloat16_to_float32
from .gather import present_bf16
from .readahead import ReadPlanner
from .shards import Shard

__all__ = ["Matrices", "MatrixPlan"]

#: values (the plan's width counts values) of a zero-copy matrix view read ahead when it is made
_VIEW_AHEAD = 8 << 20


@dataclass(frozen=True)
class MatrixPlan:
    """How :meth:`Matrices.matrix` assembles rows: ``segments`` of (source, src_a, src_b, dst_a), where a
    source is a packed group's matrix or an unpacked field flattened to (n, size)."""

    segments: tuple[tuple[str, int, int, int], ...]
    columns: dict[str, tuple[int, int]]
    width: int
    storage_dtype: np.dtype[Any]
    bfloat16: bool


class Matrices:
    """Fixed fields as ``(rows, D)`` matrices, read through ``planner``; bfloat16 presented per ``bf16``."""

    def __init__(self, planner: ReadPlanner, bf16: str) -> None:
        self.planner, self.shards, self.bf16 = planner, planner.shards, bf16

    def _matrix_plan(self, fields: Sequence[str] | str | None) -> MatrixPlan:
        """Resolve ``fields`` (names of fixed fields and/or packed groups; None = all fixed fields,
        groups first in column order) into copy segments of per-shard source matrices."""
        if isinstance(fields, str):
            fields = [fields]
        schema = self.shards.schema
        groups = schema.groups
        names: list[str] = []
        if fields is None:
            for g in groups.values():
                names.extend(g.fields)
            names.extend(n for n, f in schema.items() if not f.ragged and schema.group_of(n) is None)
        else:
            for item in fields:
                if item in groups:
                    names.extend(groups[item].fields)
                elif item in schema:
                    names.append(item)
                else:
                    raise KeyError(f"no field or packed group {item!r} in {self.shards.url}; fields are {list(schema)}")
        if not names:
            raise ValueError(f"{self.shards.url}: no fixed fields to put in a matrix")
        if len(set(names)) != len(names):
            raise ValueError(f"fields {names} name a field more than once")
        dtypes = {schema[n].dtype for n in names}
        if len(dtypes) != 1:
            raise ValueError(f"fields {names} have different dtypes {sorted(dtypes)}; a matrix has one dtype")
        segments: list[list[Any]] = []
        columns: dict[str, tuple[int, int]] = {}
        width = 0
        for name in names:
            f = schema[name]
            if f.ragged:
                raise ValueError(f"field {name!r} is ragged; matrix() takes fixed fields only")
            gname = schema.group_of(name)
            if gname is None:
                source, (a, b) = name, (0, int(np.prod(f.inner_shape, dtype=np.int64)))
            else:
                source, (a, b) = gname, groups[gname].columns[name]
            columns[name] = (width, width + b - a)
            if segments and segments[-1][0] == source and segments[-1][2] == a:
                segments[-1][2] = b
            else:
                segments.append([source, a, b, width])
            width += b - a
        f0 = schema[names[0]]
        return MatrixPlan(tuple((str(sg[0]), int(sg[1]), int(sg[2]), int(sg[3])) for sg in segments), columns, width,
                          f0.storage_dtype, f0.dtype == BFLOAT16)

    def matrix_columns(self, fields: Sequence[str] | str | None) -> dict[str, tuple[int, int]]:
        return dict(self._matrix_plan(fields).columns)

    def _source_matrix(self, sh: Shard, source: str) -> np.ndarray[Any, Any]:
        if source in sh.groups:
            return sh.groups[source]
        col = sh.columns[source]
        return col.reshape(col.shape[0], -1)  # contiguous: a view

    def _block(self, sh: Shard, plan: MatrixPlan, rows: slice | np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Rows ``rows`` (a slice or local row numbers) of one shard: a view for one segment and a slice."""
        if self.planner.lazy:
            for source, _a, _b, _ in plan.segments:
                self.planner.need_rows(self._source_matrix(sh, source), rows)
        if len(plan.segments) == 1:
            source, a, b, _ = plan.segments[0]
            return self._source_matrix(sh, source)[rows, a:b]
        n = len(range(*rows.indices(sh.info.records))) if isinstance(rows, slice) else len(rows)
        out = np.empty((n, plan.width), dtype=plan.storage_dtype)
        for source, a, b, dst in plan.segments:
            out[:, dst : dst + b - a] = self._source_matrix(sh, source)[rows, a:b]
        return out

    def _present(self, arr: np.ndarray[Any, Any], plan: MatrixPlan, dtype: Any) -> np.ndarray[Any, Any]:
        if plan.bfloat16:
            if dtype is not None and np.dtype(dtype).kind == "f":
                return np.asarray(bfloat16_to_float32(arr), dtype=dtype)
            arr = present_bf16(arr, self.bf16)
        if dtype is not None and arr.dtype != np.dtype(dtype):
            return arr.astype(dtype)
        return arr

    def matrix(self, fields: Sequence[str] | str | None, rows: Any, dtype: Any) -> np.ndarray[Any, Any]:
        plan = self._matrix_plan(fields)
        n = self.shards.n
        if rows is None:
            rows = slice(0, n)
        if isinstance(rows, slice):
            start, stop, step = rows.indices(n)
            if step < 0:
                return self.matrix(fields, np.arange(start, stop, step, dtype=np.int64), dtype)
            count = len(range(start, stop, step))
            if count == 0:
                return self._present(np.empty((0, plan.width), dtype=plan.storage_dtype), plan, dtype)
            k0, r0 = self.shards.locate(start)
            k1, _ = self.shards.locate(start + (count - 1) * step)
            if k0 == k1:
                if step == 1:  # a view: ask for its first stretch only, the caller may not touch it all
                    self._scan_rows(plan, k0, r0, r0 + min(count, max(1, _VIEW_AHEAD // max(1, plan.width))))
                block = self._block(self.shards.shard(k0), plan, slice(r0, r0 + (count - 1) * step + 1, step))
                return self._present(block, plan, dtype)
            out = np.empty((count, plan.width), dtype=plan.storage_dtype)
            for k in range(k0, k1 + 1):
                s_k, e_k = self.shards.start_index[k], self.shards.table.end(k)
                first = max(start, s_k)
                first += (-(first - start)) % step
                if first >= min(stop, e_k):
                    continue
                last = min(stop, e_k)
                pos = (first - start) // step
                block = self._block(self.shards.shard(k), plan, slice(first - s_k, last - s_k, step))
                out[pos : pos + len(block)] = block
            return self._present(out, plan, dtype)
        idx = self.shards.norm_many(rows).reshape(-1)
        out = np.empty((len(idx), plan.width), dtype=plan.storage_dtype)
        for k, pos, local in self.shards.group(idx):
            out[pos] = self._block(self.shards.shard(k), plan, np.asarray(local))
        return self._present(out, plan, dtype)

    def iter_matrix(self, fields: Sequence[str] | str | None, chunk_rows: int, start: int, stop: int | None
                    ) -> Iterator[tuple[int, np.ndarray[Any, Any]]]:
        if chunk_rows <= 0:
            raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
        plan = self._matrix_plan(fields)
        stop = self.shards.n if stop is None else min(stop, self.shards.n)
        if start < 0 or start > stop:
            raise IndexError(f"row range [{start}, {stop}) is not inside 0..{self.shards.n}")
        pos = start
        while pos < stop:
            k, r = self.shards.locate(pos)
            end = min(stop, self.shards.table.end(k), pos + chunk_rows)
            if pos == start:
                self._scan_rows(plan, k, r, r + end - pos)
            if end < stop:  # the next block's reads run while the caller works on this one
                nk, nr = self.shards.locate(end)
                self._scan_rows(plan, nk, nr, nr + min(stop, self.shards.table.end(nk), end + chunk_rows) - end)
            yield pos, self._block(self.shards.shard(k), plan, slice(r, r + end - pos))
            pos = end

    def _scan_rows(self, plan: MatrixPlan, k: int, a: int, b: int) -> None:
        """Read ahead rows ``[a, b)`` of shard ``k`` in every source matrix of ``plan``."""
        if not self.planner.scans or b <= a:
            return
        sh = self.shards.shard(k)
        for source, _, _, _ in plan.segments:
            self.planner.scan_ahead(self._source_matrix(sh, source)[a:b], sh.request)
