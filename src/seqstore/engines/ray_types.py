"""The type mapping of the Ray Data engine: the store fields of a Dataset's columns, inferred from their
Arrow (and Ray tensor extension) types and the first rows (:func:`infer_schema`), and a block's columns as
the ``append_batch`` arguments of those fields (:func:`block_columns`), without a Python object per row
except for Ray's pickled-object columns. The table of types is in :mod:`seqstore.engines.ray`.
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import SchemaError
from ..interop.arrow_columns import (
    Plan,
    convert_column,
    first_inner_len,
    fixed_shape,
    flatten_fixed,
    id_strings,
    plan_column,
    storage_array,
    storage_type,
)
from ..schema import BFLOAT16, Field, Schema

__all__ = ["BFLOAT16_METADATA", "block_columns", "infer_schema"]

pa: Any = importlib.import_module("pyarrow")  # by name: pyarrow ships no type information

#: Arrow field metadata that marks a ``uint16`` column as bfloat16 bits (written by
#: :func:`seqstore.ray.read`, recognised by :func:`seqstore.ray.write`).
BFLOAT16_METADATA = {b"seqstore.dtype": b"bfloat16"}

_RAY_TENSOR = ("ray.data.arrow_tensor", "ray.data.arrow_tensor_v2")
_RAY_VAR_TENSOR = "ray.data.arrow_variable_shaped_tensor"
_RAY_OBJECT = "ray.data.arrow_pickled_object"
_ARROW_TENSOR = "arrow.fixed_shape_tensor"
WHERE = "Ray Dataset"


# ------------------------------------------------------------------------------------------ types


def _ext(t: Any) -> str | None:
    return str(t.extension_name) if isinstance(t, pa.ExtensionType) else None


def _value_dtype(t: Any, name: str) -> str:
    fixed = fixed_shape(t)
    if fixed is None or fixed[1]:
        raise SchemaError(f"{WHERE}, column {name!r}: tensor elements of Arrow type {t} are not numbers")
    return fixed[0]


def _element_type(t: Any) -> Any:
    """The element type of a tensor extension type, from its storage (Ray < 2.51 has no value_type)."""
    st = t.storage_type
    if pa.types.is_struct(st):  # Ray's variable-shaped tensor: struct<data: large_list<T>, shape: ...>
        st = st.field("data").type
    return st.value_type


def _whole(col: Any, name: str) -> Any:
    """One contiguous array of a column (chunks combined), its top-level nulls rejected."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count:
        raise SchemaError(f"{WHERE}, column {name!r}: has {arr.null_count} null values; seqstore fields have no nulls")
    return arr


def _numpy(arr: Any, name: str) -> np.ndarray[Any, Any]:
    if arr.null_count:
        raise SchemaError(f"{WHERE}, column {name!r}: has {arr.null_count} null tensor elements")
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def _var_parts(arr: Any, ndim: int, name: str) -> tuple[Any, np.ndarray[Any, Any]]:
    """(flat data array, (n, ndim) int64 shapes) of a Ray variable-shaped tensor array."""
    data, shape = arr.storage.flatten()  # struct children, sliced to the array's rows
    if shape.null_count or data.null_count:
        raise SchemaError(f"{WHERE}, column {name!r}: has null tensors")
    dims = np.asarray(shape.value_lengths().to_numpy(zero_copy_only=False))
    if len(dims) and (dims != ndim).any():
        raise SchemaError(f"{WHERE}, column {name!r}: a tensor has {int(dims[dims != ndim][0])} dims, "
                          f"its type says {ndim}")
    shapes = _numpy(shape.flatten(), name).astype(np.int64, copy=False).reshape(len(arr), ndim)
    return data.flatten(), shapes


def _objects(arr: Any, name: str) -> list[np.ndarray[Any, Any]]:
    """The numpy arrays of a Ray pickled-object column (one unpickling per record: Ray's representation)."""
    out = []
    for k, raw in enumerate(arr.storage.to_pylist()):
        value = np.asarray(pickle.loads(raw))  # noqa: S301 - the column is Ray's own pickled objects
        if value.dtype.kind not in "biuf" and value.dtype.name != BFLOAT16:
            raise SchemaError(f"{WHERE}, column {name!r}, row {k}: holds {type(value).__name__} of dtype "
                              f"{value.dtype}, not numbers")
        out.append(value)
    return out


def _same_inner(shapes: np.ndarray[Any, Any], name: str) -> np.ndarray[Any, Any]:
    """The dims after the first that all rows' ``shapes`` (n >= 1, ndim) share; SchemaError otherwise."""
    bad = np.flatnonzero((shapes[:, 1:] != shapes[0, 1:]).any(axis=1))
    if len(bad):
        raise SchemaError(f"{WHERE}, column {name!r}: rows have shapes {tuple(shapes[0])} and "
                          f"{tuple(shapes[bad[0]])}; a ragged field varies in its first dim only")
    return shapes[0, 1:]


def _objects_ragged(values: Sequence[np.ndarray[Any, Any]], name: str) -> bool:
    """False when the arrays share one shape, True when they differ in their first dim only; else SchemaError."""
    kinds = {v.shape for v in values}
    if len(kinds) <= 1:
        return False
    if any(len(s) == 0 for s in kinds) or len({s[1:] for s in kinds}) != 1:
        raise SchemaError(f"{WHERE}, column {name!r}: arrays of shapes {sorted(kinds)[:3]} are neither one "
                          "shape nor one shape but the first dim")
    return True


def _infer_type(name: str, t: Any, sample: Any) -> Field:
    """The field of one column: from its Arrow type, and from the rows of ``sample`` (an array of the
    first rows, or None) where the type leaves inner dimensions open."""
    ext = _ext(t)
    try:
        if ext in _RAY_TENSOR or ext == _ARROW_TENSOR:
            return Field(_value_dtype(_element_type(t), name), tuple(int(s) for s in t.shape))
        if ext == _RAY_VAR_TENSOR:
            dtype = _value_dtype(_element_type(t), name)
            if t.ndim == 1:
                return Field(dtype, (None,))
            shapes = _var_parts(_whole(sample, name), int(t.ndim), name)[1] if sample is not None else None
            if shapes is None or not len(shapes):
                raise SchemaError(f"{WHERE}, column {name!r}: variable-shaped {t.ndim}-d tensors and no rows to "
                                  f"read their inner dims from; pass schema={{{name!r}: Field(dtype, (None, ...))}}")
            return Field(dtype, (None, *(int(s) for s in _same_inner(shapes, name))))
        if ext == _RAY_OBJECT:
            values = _objects(_whole(sample, name), name) if sample is not None else []
            if not values:
                raise SchemaError(f"{WHERE}, column {name!r}: pickled objects and no rows to infer a field from; "
                                  f"pass schema={{{name!r}: Field(...)}}")
            dt, shape = values[0].dtype, values[0].shape
            dtype = BFLOAT16 if dt.name == BFLOAT16 else str(dt)
            return Field(dtype, (None, *shape[1:]) if _objects_ragged(values, name) else shape)
        st = storage_type(t)
        if (pa.types.is_list(st) or pa.types.is_large_list(st)) and pa.types.is_null(st.value_type):
            raise SchemaError(f"{WHERE}, column {name!r}: the first rows hold only empty lists (Arrow type {t}), "
                              f"which tell no dtype; pass schema={{{name!r}: Field(dtype, (None, ...))}}")
        try:
            plan = plan_column(WHERE, name, t)
        except SchemaError:
            raise SchemaError(
                f"{WHERE}, column {name!r}: Arrow type {t} has no seqstore field (numbers, fixed-size lists, lists "
                "and Ray tensors of numbers are; a string column can be the id column); pass schema= naming the "
                "columns to write, or drop the column (ds.drop_columns)"
            ) from None
        shape = plan.shape
        if shape and shape[0] is None:  # list<list<T>>: the inner list length from the first rows
            inner_len = first_inner_len(_whole(sample, name)) if sample is not None else None
            if inner_len is None:
                raise SchemaError(f"{WHERE}, column {name!r}: lists of lists and no inner list to read their "
                                  f"length from; pass schema={{{name!r}: Field(dtype, (None, k))}}")
            shape = (inner_len, *shape[1:])
        return Field(plan.dtype, ((None,) if plan.ragged else ()) + tuple(int(s or 0) for s in shape))
    except SchemaError as e:
        if str(e).startswith(WHERE):
            raise
        raise SchemaError(f"{WHERE}, column {name!r}: {e}") from e


def infer_schema(arrow_schema: Any, sample: Any = None, *, id_column: str | None = None,
                 columns: Sequence[str] | None = None) -> Schema:
    """The store schema for a Dataset's columns: ``arrow_schema`` (a ``pyarrow.Schema``) and, for types
    that leave inner dims open, the rows of ``sample`` (a ``pyarrow.Table`` of the first rows). Every
    column but ``id_column`` (or those in ``columns``) becomes a field of its own name. Raises
    :class:`SchemaError` naming the column for a type with no field."""
    names = list(arrow_schema.names)
    if id_column is not None and id_column not in names:
        raise SchemaError(f"{WHERE}: no id column {id_column!r}; columns are {names}")
    wanted = [c for c in (names if columns is None else columns) if c != id_column]
    if not wanted:
        raise SchemaError(f"{WHERE}: no columns to write (columns are {names}, id column {id_column!r})")
    spec = {}
    for c in wanted:
        if c not in names:
            raise SchemaError(f"{WHERE}: no column {c!r}; columns are {names}")
        col = sample.column(c) if sample is not None and c in sample.column_names else None
        f = _infer_type(c, arrow_schema.field(c).type, col)
        marked = (arrow_schema.field(c).metadata or {}).get(b"seqstore.dtype") == b"bfloat16"  # BFLOAT16_METADATA
        spec[c] = Field(BFLOAT16, f.shape) if marked and f.dtype == "<u2" else f
    return Schema(spec)


# ------------------------------------------------------------------------------- block conversion


def _view(col: Any, name: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]:
    """A column as ``(values, None)`` with values ``(n, *shape)`` (one shape per row) or as
    ``(values, lengths)`` with values ``(sum(lengths), *row_shape)`` (rows of varying counts)."""
    arr = _whole(col, name)
    n = len(arr)
    t = arr.type
    ext = _ext(t)
    if ext in _RAY_TENSOR:
        flat = _numpy(storage_array(arr).flatten(), name)
        return flat.reshape(n, *t.shape), None
    if ext == _ARROW_TENSOR:
        if t.permutation is not None and list(t.permutation) != list(range(len(t.shape))):
            raise SchemaError(f"{WHERE}, column {name!r}: tensors with permutation {t.permutation} are not "
                              "supported (store them row-major)")
        return flatten_fixed(arr.storage, WHERE, name).reshape(n, *t.shape), None
    if ext == _RAY_VAR_TENSOR:
        ndim = int(t.ndim)
        data, shapes = _var_parts(arr, ndim, name)
        flat = _numpy(data, name)
        if ndim == 1:
            return flat, shapes[:, 0]
        row = _same_inner(shapes, name) if n else np.zeros(ndim - 1, np.int64)
        lengths = shapes[:, 0]
        return flat.reshape(int(lengths.sum()), *(int(s) for s in row)), lengths
    if ext == _RAY_OBJECT:
        values = _objects(arr, name)
        if not _objects_ragged(values, name):
            return (np.stack(values) if values else np.empty((0,))), None
        return np.concatenate(values), np.array([v.shape[0] for v in values], dtype=np.int64)
    st = storage_type(t)
    if (pa.types.is_list(st) or pa.types.is_large_list(st)) and pa.types.is_null(st.value_type):
        lengths = np.asarray(storage_array(arr).value_lengths().to_numpy(zero_copy_only=False), dtype=np.int64)
        if lengths.any():  # lists of nulls
            raise SchemaError(f"{WHERE}, column {name!r}: lists hold null values; seqstore fields have no nulls")
        return np.empty((0,)), lengths  # only empty lists: no dtype, nothing to store
    plan = plan_column(WHERE, name, t)
    if not plan.ragged:
        return flatten_fixed(arr, WHERE, name).reshape(n, *(int(s or 0) for s in plan.shape)), None
    inner: tuple[int, ...]
    if plan.shape and plan.shape[0] is None:
        first = first_inner_len(arr)
        inner = (first or 0, *(int(s or 0) for s in plan.shape[1:]))
    else:
        inner = tuple(int(s or 0) for s in plan.shape)
    values, lengths = convert_column(storage_array(arr), Plan(True, plan.dtype, plan.shape), inner, WHERE, name)
    return values, lengths


def _fit(name: str, f: Field, view: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None], n: int) -> Any:
    """A column view as ``append_batch`` wants it for field ``f``, or a SchemaError naming the column."""
    values, lengths = view
    inner = f.inner_shape
    if lengths is not None and values.size == 0 and not lengths.any():
        values = np.empty((0, *inner), dtype=f.storage_dtype)  # only empty rows: any inner shape fits
    if f.ragged:
        rows = values.shape[1:]
        if lengths is None and values.ndim >= 2:  # one shape per row: (n, L, *inner) -> n rows of L each
            lengths = np.full(n, values.shape[1], dtype=np.int64)
            values = values.reshape(n * values.shape[1], *values.shape[2:])
        if lengths is None or values.shape[1:] != inner:
            raise SchemaError(f"{WHERE}, column {name!r}: rows of shape {rows} do not fit field "
                              f"{f.shape} (ragged rows of shape {inner})")
        return values, lengths
    if lengths is None:
        if values.shape[1:] != inner:
            raise SchemaError(f"{WHERE}, column {name!r}: records of shape {values.shape[1:]} do not fit field "
                              f"{f.shape}")
        return values
    bad = np.flatnonzero(lengths != (inner[0] if inner else -1))
    if len(bad) or values.shape[1:] != inner[1:]:
        k = int(bad[0]) if len(bad) else 0
        raise SchemaError(f"{WHERE}, column {name!r}: record {k} has shape {(int(lengths[k]), *values.shape[1:])}, "
                          f"field {f.shape} is fixed (pass schema= with a ragged field (None, ...))")
    return values.reshape(n, *inner)


def block_columns(table: Any, schema: Schema, id_column: str | None, *, every_column: bool = False
                  ) -> tuple[dict[str, Any], list[str] | None]:
    """One block (a ``pyarrow.Table``) as ``append_batch`` arguments: (columns, ids). ``every_column``
    (an inferred schema): a column that is neither a field nor the id column is a SchemaError."""
    n = table.num_rows
    extra = [c for c in table.column_names if c not in schema and c != id_column] if every_column else []
    if extra:
        raise SchemaError(f"{WHERE}: a block has column(s) {extra}, which the first rows (the fields inferred: "
                          f"{list(schema)}) lack; pass schema= naming the columns to write")
    cols = {}
    for name, f in schema.items():
        if name not in table.column_names:
            raise SchemaError(f"{WHERE}: block has no column {name!r} (columns {table.column_names}); "
                              f"the store's fields are {list(schema)}")
        cols[name] = _fit(name, f, _view(table.column(name), name), n)
    ids = id_strings(table.column(id_column), WHERE, id_column) if id_column is not None else None
    return cols, ids
