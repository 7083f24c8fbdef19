"""The type mapping of the ``"seqstore"`` Spark data source, both ways.

Writing: the store schema a DataFrame's Spark schema becomes (the ``schema`` option, the existing store's
fields, the field recorded in a column's metadata, or the field a column's type gives) and each Arrow
column of a write task's batches as the values ``append_batch`` takes (per list level checks on the
lengths arrays, no Python work per row). Reading: the Spark ``StructType`` a store is read as
(:func:`spark_schema`). See docs/distributed.md (section Spark) for the mapping.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import SchemaError
from ..interop import arrow_columns as acols
from ..schema import BFLOAT16, Field, Schema, field_list
from ..store import Store
from .spark_options import given_schema

try:
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("seqstore.spark needs pyspark>=4.0 (and Java 17+): pip install 'seqstore[spark]'") from exc

__all__ = ["FIELD_METADATA_KEY", "spark_schema"]

#: Key of a column's seqstore field in the Spark column metadata of a read (a write of such a column
#: uses that field: float16 stays float16, ragged rows keep their length).
FIELD_METADATA_KEY = "seqstore"


def import_pyarrow() -> Any:
    return importlib.import_module("pyarrow")


# ------------------------------------------------------------------------ Spark schema -> store schema


@dataclasses.dataclass(frozen=True)
class SparkColumn:
    """How one DataFrame column is written: the field it fills and that field."""

    column: str
    field_name: str
    field: Field


def _list_depth(arrow_type: Any) -> tuple[int, Any]:
    """How many list levels (variable or fixed size) wrap a leaf type, and the leaf type."""
    pa = import_pyarrow()
    t, depth = acols.storage_type(arrow_type), 0
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t, depth = acols.storage_type(t.value_type), depth + 1
    return depth, t


def _infer_field(where: str, column: str, arrow_type: Any) -> Field:
    """The field a column of this Arrow type becomes without the schema option: a number is a scalar
    field, an array a ragged field (a fixed-size list, which Spark does not make, a fixed one)."""
    depth, leaf = _list_depth(arrow_type)
    if depth >= 2 and acols.primitive_dtype(leaf) is not None:
        plan = acols.plan_column(where, column, arrow_type) if depth == 2 else None
        if plan is not None and all(s is not None for s in plan.shape):
            return plan.field()
        example = json.dumps({column: [acols.primitive_dtype(leaf), [None, *([16] * (depth - 1))]]})
        raise SchemaError(
            f"{where}, column {column!r}: {arrow_type} (arrays of arrays) becomes a ragged field of rows whose "
            f"shape Spark's type does not say; give the field with the schema option, e.g. "
            f".option(\"schema\", '{example}')"
        )
    if acols.primitive_dtype(leaf) is None:  # a string, struct, map, ...: no field holds it
        raise SchemaError(
            f"{where}, column {column!r}: its type ({arrow_type} in Arrow) has no seqstore field (numbers, "
            "booleans and arrays of them are written, as their Spark type or the schema option says; no schema "
            "option makes this type one); a string or integer column can hold the record ids with "
            f'.option("idColumn", "{column}"); otherwise drop the column (df.drop("{column}")) before writing'
        )
    return acols.plan_column(where, column, arrow_type).field()


def write_plan(path: str, spark_schema: Any, options: Mapping[str, str],
               existing: Schema | None) -> tuple[Schema, list[SparkColumn], str | None]:
    """The store schema of a write, how each column fills it, and the id column.

    A column's field is the ``schema`` option's, else (appending to or overwriting a store) the store's
    field of that name, else the field in the column's metadata (a column read from a store), else the one
    its Spark type gives (arrays become ragged fields)."""
    where = f"Spark write to {path}"
    arrow_schema = to_arrow_schema(spark_schema)
    names = list(arrow_schema.names)
    id_column = options.get("idColumn")
    if id_column is not None:
        if id_column not in names:
            raise SchemaError(f"{where}: no id column {id_column!r}; columns are {names}")
        pa = import_pyarrow()
        t = arrow_schema.field(id_column).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)):
            raise SchemaError(f"{where}, column {id_column!r}: ids must be strings or integers, got {t}")
    given = given_schema(options, where)
    cols = [c for c in names if c != id_column]
    if not cols:
        raise SchemaError(f"{where}: no columns to write besides the id column")
    if given is not None:
        unknown = [n for n in given if n not in cols]
        if unknown:
            raise SchemaError(f"{where}: option schema names {unknown}, which are not columns of the DataFrame "
                              f"(columns: {cols})")
    meta = {f.name: dict(f.metadata or {}) for f in spark_schema.fields}
    spec: dict[str, Field] = {}
    for c in cols:
        if given is not None and c in given:
            spec[c] = given[c]
        elif existing is not None and c in existing:
            spec[c] = existing[c]
        else:
            try:  # a column read from a store: the field in its metadata (none, or of the wrong kind: its type's)
                spec[c] = Field.from_json(json.loads(meta.get(c, {})[FIELD_METADATA_KEY]))
            except (KeyError, TypeError, SchemaError, ValueError):
                spec[c] = _infer_field(where, c, arrow_schema.field(c).type)
    packed = {g: list(pg.fields) for g, pg in given.groups.items()} if given is not None else {}
    if not packed and existing is not None and set(existing) == set(spec):
        packed = {g: list(pg.fields) for g, pg in existing.groups.items()}
    try:
        schema = Schema(spec, packed=packed or None)
    except SchemaError as exc:
        raise SchemaError(f"{where}: {exc}") from exc
    return schema, [SparkColumn(c, c, spec[c]) for c in cols], id_column


def column_values(arr: Any, col: SparkColumn, where: str) -> Any:
    """One Arrow column as ``append_batch`` wants it for its field: ``(n, *shape)`` for a fixed field,
    ``(values, lengths)`` for a ragged one. Each axis of the field is one list level of the column (a
    variable-size list, as Spark's arrays are, or a fixed-size list); every list but the outermost of a
    ragged field must have the field's length, checked per level on the lengths arrays (no per-row
    Python work); the leaf values are converted by ``seqstore.interop.arrow``."""
    pa = import_pyarrow()
    arr = acols.column_array(arr, where, col.column)
    f = col.field
    n = len(arr)
    lengths: np.ndarray[Any, Any] | None = None
    cur = arr
    for level, size in enumerate(f.shape):
        cur = acols.storage_array(cur)
        t = cur.type
        what = f"{where}, column {col.column!r}" + (f" (level {level + 1} of nested arrays)" if level else "")
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            if cur.null_count:
                raise SchemaError(f"{what}: has {cur.null_count} null arrays; seqstore fields have no nulls")
            if pa.types.is_fixed_size_list(t):
                got = np.full(len(cur), t.list_size, dtype=np.int64)
            else:
                got = np.asarray(cur.value_lengths().to_numpy(zero_copy_only=False), dtype=np.int64)
            if size is None:
                lengths = got
            else:
                bad = np.flatnonzero(got != size)
                if len(bad):
                    row = f"row {int(bad[0])} of the batch" if level == 0 else f"array {int(bad[0])} of the batch"
                    raise SchemaError(f"{what}: {row} has {int(got[bad[0]])} items; field {col.field_name!r} {f} "
                                      f"needs {size}")
            cur = cur.flatten()
        else:
            raise SchemaError(f"{where}, column {col.column!r}: Arrow type {arr.type} has {level} list level(s); "
                              f"field {col.field_name!r} {f} needs {len(f.shape)}")
    cur = acols.storage_array(cur)
    if acols.primitive_dtype(cur.type) is None:
        raise SchemaError(f"{where}, column {col.column!r}: Arrow type {arr.type} has more list levels than field "
                          f"{col.field_name!r} {f} has axes, or a leaf type that is not a number")
    flat = _narrowed(acols.flatten_fixed(cur, where, col.column), f)
    if lengths is not None:
        return flat.reshape(int(lengths.sum()), *f.inner_shape), lengths
    return flat.reshape(n, *f.inner_shape)


def _narrowed(flat: np.ndarray[Any, Any], f: Field) -> np.ndarray[Any, Any]:
    """Spark's float/double values already cast to a narrower float field (float16 from Spark's float,
    the common case) when two reductions show that no value can overflow (and none is NaN or
    infinite): the writer then takes them as they are, instead of casting and comparing every value
    for overflow. Anything else is left to the writer's checked cast (same result, same errors)."""
    target = f.storage_dtype
    if (f.dtype == BFLOAT16 or flat.dtype.kind != "f" or target.kind != "f" or flat.size == 0
            or flat.dtype.itemsize <= target.itemsize):
        return flat
    limit = float(np.finfo(target).max)
    if -limit <= float(flat.min()) and float(flat.max()) <= limit:  # False for NaN
        return flat.astype(target)
    return flat


# ------------------------------------------------------------------------ store schema -> Spark schema


def _spark_leaf(dtype: str, where: str) -> Any:
    if dtype in (BFLOAT16, "<f2", "<f4"):
        return T.FloatType()
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return T.BooleanType()
    if dt.kind == "f":
        return T.DoubleType()
    if dt.kind == "i":
        return {1: T.ByteType(), 2: T.ShortType(), 4: T.IntegerType(), 8: T.LongType()}[dt.itemsize]
    if dt.kind == "u":  # Spark has no unsigned types: the next wider signed one (uint64: checked on read)
        return {1: T.ShortType(), 2: T.IntegerType(), 4: T.LongType(), 8: T.LongType()}[dt.itemsize]
    raise SchemaError(f"{where}: dtype {dtype} has no Spark type (complex numbers are not supported); "
                      "read other fields with the fields option")


def spark_schema(store: Store, fields: Sequence[str] | None = None, id_column: str | None = None) -> Any:
    """The Spark ``StructType`` a store is read as: one column per field (numbers as the Spark type of
    their dtype, float16 and bfloat16 as float, unsigned as the next wider signed type; a field with a
    per-record shape as arrays, nested once per axis, ragged or not; the field itself in the column's
    metadata under ``"seqstore"``, as JSON), and the ids as a string column ``id_column`` first when the store has
    ids and ``id_column`` is given."""
    names = list(store.schema) if fields is None else field_list(fields) or []
    twice = sorted({n for n in names if names.count(n) > 1})  # (Spark's columns would clash)
    if twice:
        raise SchemaError(f"{store.root}: fields {twice} named twice; name each field once")
    out = []
    if id_column is not None and store.has_ids:
        out.append(T.StructField(id_column, T.StringType(), nullable=False))
    for name in names:
        if name not in store.schema:
            raise SchemaError(f"{store.root}: no field {name!r}; fields are {list(store.schema)}")
        f = store.schema[name]
        t = _spark_leaf(f.dtype, f"{store.root}, field {name!r}")
        for _ in f.shape:
            t = T.ArrayType(t, containsNull=False)
        out.append(T.StructField(name, t, nullable=False, metadata={FIELD_METADATA_KEY: json.dumps(f.to_json())}))
    return T.StructType(out)
