"""What a :class:`~.writer.Writer` checks before it takes a record or a batch: the fields given against
the schema (a packed group may be given whole), the ids present or not as in the store, and a packed
group's matrix assembled from its fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...errors import SchemaError
from ...schema import Field, PackedGroup, Schema, flatten_values, to_storage_array
from ..directio import aligned_empty
from .columns import DIRECT_IO_BYTES
from .target import CommitTarget

__all__ = ["RecordChecks"]


class RecordChecks:
    """The checks a :class:`~.writer.Writer` makes of what it is given, for the store at ``target``.
    ``has_ids``: whether the store's records have ids (None while it has no record), which the writer
    updates as it takes records or learns of another writer's."""

    def __init__(self, schema: Schema, target: CommitTarget, direct_io: bool, has_ids: bool | None) -> None:
        self.schema, self.target, self.direct_io, self.has_ids = schema, target, direct_io, has_ids
        self.fields: list[tuple[str, Field]] = list(schema.items())
        self.names = set(schema)
        self.groups: dict[str, PackedGroup] = schema.groups

    def ids(self, have_ids: bool, first: int, batch: bool = False) -> None:
        if self.has_ids is None or self.has_ids == have_ids:
            return
        what = f"{self.target.where}: " + (f"the batch from record {first}" if batch else f"record {first}")
        rule = "(a store's records all have ids or none do)"
        if self.has_ids:
            arg = "append_batch(columns, ids=[...])" if batch else "append(record, id=...)"
            raise SchemaError(f"{what} has no {'ids' if batch else 'id'}, but this store's records have ids {rule}; "
                              f"pass {'them' if batch else 'it'}: {arg}")
        raise SchemaError(f"{what} has {'ids' if batch else 'an id'}, but this store's records have none {rule}; "
                          f"append without {'ids=' if batch else 'id='}")

    def flatten(self, record: Mapping[str, Any], what: str) -> Mapping[str, Any]:
        """``record`` flat (not copied when it is already), once its names are checked against the schema."""
        if isinstance(record, Mapping) and not any(isinstance(v, Mapping) for v in record.values()):
            flat = record
        else:
            flat = flatten_values(record, what)
        given = set(flat.keys())  # (keys(): what a Mapping subclass may override)
        names = self.names
        direct = given & set(self.groups)
        if direct:  # a group given as one (B, width) matrix stands for its fields
            names = (names - {m for g in direct for m in self.groups[g].fields}) | direct
        if given != names:
            odd = (("unknown", given - names), ("missing", names - given))
            parts = [f"{kind} field(s) {sorted(s)}" for kind, s in odd if s]
            groups = f" (or packed groups {sorted(self.groups)})" if self.groups else ""
            raise SchemaError(f"{what}: {'; '.join(parts)}; schema fields are {sorted(self.names)}{groups}")
        return flat

    def pack(self, gname: str, flat: Mapping[str, Any], prepared: Mapping[str, np.ndarray[Any, Any]],
             batch: int | None, fw: str) -> np.ndarray[Any, Any]:
        """The (batch, width) matrix of packed group ``gname``: the caller's matrix when given under the
        group's name (converted, not copied when it already has the storage dtype), else a new matrix
        assembled from the fields' converted values ``prepared`` (one copy). ``batch`` None: one record's
        (1, width) row (given under the group's name: a (width,) row, copied: it is buffered)."""
        g = self.groups[gname]
        if gname in flat:
            mat = to_storage_array(g.as_field(), flat[gname], what=fw)
            if batch is None:
                if mat.shape != (g.width,):
                    raise SchemaError(f"{fw}: expected shape ({g.width},), got {mat.shape}")
                return mat[None].copy()
            if mat.shape != (batch, g.width):
                raise SchemaError(
                    f"{fw}: expected a ({batch}, {g.width}) matrix for packed group {gname!r}, got {mat.shape}"
                )
            return mat
        batch = 1 if batch is None else batch
        shape = (batch, g.width)
        big = self.direct_io and batch * g.width * g.storage_dtype.itemsize >= DIRECT_IO_BYTES
        mat = aligned_empty(shape, g.storage_dtype) if big else np.empty(shape, dtype=g.storage_dtype)
        for name in g.fields:
            a, b = g.columns[name]
            mat[:, a:b] = prepared[name].reshape(batch, b - a)
        return mat

    def given(self, flat: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
        """``(name, field, value)`` of the fields in ``flat`` (a packed group given as a whole leaves its
        fields out)."""
        return [(name, f, flat[name]) for name, f in self.fields if name in flat]
