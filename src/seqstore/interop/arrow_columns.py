"""Arrow columns as seqstore fields: the type mapping and the conversion shared by the Arrow/Parquet
importer (:mod:`~seqstore.interop.arrow`) and the Hugging Face one (:mod:`~seqstore.interop.hf`).

A column's Arrow type gives a :class:`Plan` (:func:`plan_column`): fixed (numbers, nested
``fixed_size_list``) or ragged (``list``/``large_list`` of those, or of lists whose inner length is read
from the data); extension types count as their storage type. :func:`convert_column` turns one chunk of
a column into what ``Writer.append_batch`` takes, without a Python object per record; nulls are errors
naming the column.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from ..errors import SchemaError
from ..schema import Field, Schema
from ._common import name_map

__all__ = [
    "Plan", "pyarrow", "storage_type", "primitive_dtype", "fixed_shape", "plan_column", "storage_array",
    "column_array", "flatten_fixed", "convert_column", "first_inner_len", "id_strings", "check_id_column",
    "column_map", "check_unique", "columns_schema", "resolve_inner",
]


def pyarrow() -> Any:
    """The ``pyarrow`` module (with ``pyarrow.ipc``); ImportError naming the extra to install."""
    try:  # imported by name: pyarrow ships no type information, and is optional
        module = importlib.import_module("pyarrow")
        importlib.import_module("pyarrow.ipc")
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("Arrow/Parquet support needs pyarrow: pip install 'seqstore[arrow]'") from exc
    return module


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one column becomes a field: ``ragged`` or fixed, numpy dtype, row/record shape (``None``
    for an inner list length still to be read from the data), and the nesting of the Arrow type."""

    ragged: bool
    dtype: str
    shape: tuple[int | None, ...]

    def field(self) -> Field:
        return Field(self.dtype, ((None,) if self.ragged else ()) + tuple(int(s or 0) for s in self.shape))


def storage_type(t: Any) -> Any:
    """``t`` with extension types unwrapped (their storage type)."""
    pa = pyarrow()
    while isinstance(t, pa.ExtensionType):
        t = t.storage_type
    return t


def primitive_dtype(t: Any) -> str | None:
    """The numpy dtype of a numeric or bool Arrow type, else None."""
    pa = pyarrow()
    t = storage_type(t)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return str(np.dtype(t.to_pandas_dtype()))
    return None


def fixed_shape(t: Any) -> tuple[str, tuple[int, ...]] | None:
    """(dtype, shape) of a primitive or nested fixed-size list type, else None."""
    pa = pyarrow()
    t = storage_type(t)
    prim = primitive_dtype(t)
    if prim is not None:
        return prim, ()
    if pa.types.is_fixed_size_list(t):
        inner = fixed_shape(t.value_type)
        if inner is not None:
            return inner[0], (int(t.list_size), *inner[1])
    return None


def _is_var_list(t: Any) -> bool:
    pa = pyarrow()
    t = storage_type(t)
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def plan_column(path: str, column: str, t: Any) -> Plan:
    """The field a column of Arrow type ``t`` becomes; SchemaError naming file and column otherwise."""
    fixed = fixed_shape(t)
    if fixed is not None:
        return Plan(False, fixed[0], fixed[1])
    st = storage_type(t)
    if _is_var_list(st):
        inner = fixed_shape(st.value_type)
        if inner is not None:
            return Plan(True, inner[0], inner[1])
        vt = storage_type(st.value_type)
        if _is_var_list(vt):
            leaf = fixed_shape(vt.value_type)
            if leaf is not None:
                return Plan(True, leaf[0], (None, *leaf[1]))
    raise SchemaError(f"{path}, column {column!r}: Arrow type {t} has no seqstore field (numbers, fixed-size lists "
                      "and lists of those are supported; a string column can be the id column); choose columns with "
                      "columns={column: field}")


def storage_array(arr: Any) -> Any:
    """``arr`` with extension types unwrapped (the array of their storage type)."""
    pa = pyarrow()
    while isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    return arr


def column_array(col: Any, path: str, name: str) -> Any:
    """One contiguous Arrow array of a table column, extension types unwrapped, nulls rejected."""
    pa = pyarrow()
    arr = storage_array(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    if arr.null_count:
        raise SchemaError(f"{path}, column {name!r}: has {arr.null_count} null values; seqstore fields have no nulls")
    return arr


def flatten_fixed(arr: Any, path: str, name: str) -> np.ndarray[Any, Any]:
    """Leaf values of a primitive or (nested) fixed-size list array, flat, as numpy."""
    pa = pyarrow()
    while True:
        arr = storage_array(arr)
        if not pa.types.is_fixed_size_list(arr.type):
            break
        if arr.null_count:
            raise SchemaError(f"{path}, column {name!r}: has null lists")
        arr = arr.flatten()
    if arr.null_count:
        raise SchemaError(f"{path}, column {name!r}: has {arr.null_count} null values")
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def convert_column(arr: Any, plan: Plan, inner: tuple[int, ...], path: str, name: str) -> Any:
    """A column array as ``append_batch`` wants it: (n, *shape) or a ``(values, lengths)`` pair."""
    n = len(arr)
    if not plan.ragged:
        return flatten_fixed(arr, path, name).reshape(n, *inner)
    lengths = np.asarray(arr.value_lengths().to_numpy(zero_copy_only=False), dtype=np.int64)
    values = arr.flatten()
    if plan.shape and plan.shape[0] is None:  # list<list<...>>: every inner list must have length inner[0]
        if values.null_count:
            raise SchemaError(f"{path}, column {name!r}: has null inner lists")
        inner_len = np.asarray(values.value_lengths().to_numpy(zero_copy_only=False))
        bad = np.flatnonzero(inner_len != inner[0])
        if len(bad):
            raise SchemaError(f"{path}, column {name!r}: inner lists have length {int(inner_len[bad[0]])} and "
                              f"{inner[0]}; a ragged field needs rows of one shape")
        values = values.flatten()
    flat = flatten_fixed(values, path, name)
    return flat.reshape(int(lengths.sum()), *inner), lengths


def first_inner_len(arr: Any) -> int | None:
    """The length of the first inner list of a list-of-lists array; None when its lists are all empty."""
    values = storage_array(storage_array(arr).flatten())
    if not len(values):
        return None
    return int(values.value_lengths()[0].as_py())


def resolve_inner(plan: Plan, columns: Iterable[Any]) -> tuple[int, ...]:
    """The row shape of a planned field: a ``None`` inner dim (a list of variable lists) is the length
    of the first non-empty inner list among ``columns`` (chunks of the column, read lazily)."""
    if not plan.shape or plan.shape[0] is not None:
        return tuple(int(s or 0) for s in plan.shape)
    rest = tuple(int(s or 0) for s in plan.shape[1:])
    for col in columns:
        first = first_inner_len(col)
        if first is not None:
            return (first, *rest)
    return (0, *rest)


def id_strings(col: Any, path: str, name: str) -> list[str]:
    """An id column of a batch as the str ids a writer takes: strings as they are, integers in decimal;
    SchemaError naming the column for nulls or any other type."""
    pa = pyarrow()
    arr = column_array(col, path, name)
    check_id_column(path, name, arr.type)
    if pa.types.is_integer(arr.type):
        arr = arr.cast(pa.string())
    return cast(list[str], arr.to_pylist())  # the writer's API takes Python str ids


def check_id_column(where: str, name: str, t: Any) -> None:
    """SchemaError unless the id column's Arrow type ``t`` is a string or integer type."""
    pa = pyarrow()
    t = storage_type(t)
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)):
        raise SchemaError(f"{where}, column {name!r}: ids must be strings or integers, got {t}")


def column_map(where: str, names: Sequence[str], columns: Mapping[str, str] | Sequence[str] | None,
               id_column: str | None) -> dict[str, str]:
    """``{column: field}`` to import: ``columns`` (a mapping, or names kept as they are), by default every
    column but ``id_column``; SchemaError naming ``where`` for a missing column or nothing to import."""
    if id_column is not None and id_column not in names:
        raise SchemaError(f"{where}: no id column {id_column!r}; columns are {list(names)}")
    mapping = name_map(columns, (c for c in names if c != id_column))
    if not mapping:
        raise SchemaError(f"{where}: no columns to import")
    for c in mapping:
        if c not in names:
            raise SchemaError(f"{where}: no column {c!r}; columns are {list(names)}")
    check_unique(where, names, [*mapping, *([id_column] if id_column is not None else [])])
    return mapping


def check_unique(where: str, names: Sequence[str], chosen: Iterable[str]) -> None:
    """SchemaError naming ``where`` for a column of ``chosen`` that ``names`` (a schema's) holds more than
    once: Arrow and Parquet allow that, and it cannot be read by its name."""
    for c in chosen:
        if (k := list(names).count(c)) > 1:
            raise SchemaError(f"{where}: column {c!r} is there {k} times; a column to import needs a name of its "
                              "own (choose the others with columns={column: field})")


def columns_schema(where: str, columns: Iterable[tuple[str, str, Plan, tuple[int, ...]]]) -> Schema:
    """The schema of ``(column, field, plan, row shape)`` items; SchemaError naming the column at fault."""
    spec: dict[str, Field] = {}
    for col, field, plan, inner in columns:
        if field in spec:
            raise SchemaError(f"two columns map to the field {field!r}")
        try:
            spec[field] = Field(plan.dtype, ((None,) if plan.ragged else ()) + inner)
        except SchemaError as exc:
            raise SchemaError(f"{where}, column {col!r}: {exc}") from exc
    try:
        return Schema(spec)
    except SchemaError as exc:
        raise SchemaError(f"{exc}; rename columns with columns={{column: field}}") from exc
