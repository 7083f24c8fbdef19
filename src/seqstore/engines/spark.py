"""A Spark 4 Python data source named ``"seqstore"``: DataFrames are written into a store by Spark's
write tasks in parallel, with one commit on the driver, and stores are read back as DataFrames.

::

    import seqstore.spark
    spark.dataSource.register(seqstore.spark.DataSource)
    df.write.format("seqstore").mode("append").option("idColumn", "key").save("corpus.seqstore")
    back = spark.read.format("seqstore").load("corpus.seqstore")

Writing: every write task (one per partition) writes its rows as its own uncommitted part of the store
(:class:`seqstore.store.parts.PartWriter`, tied to the job and the task attempt) and returns a commit
message carrying the part; when every task has succeeded, ``commit`` on the driver makes all parts
visible with one manifest commit, in partition order (so the store's record order is the DataFrame's).
A failed or retried task attempt leaves nothing: only the parts of the attempts Spark reports are
committed, and the others (and, when the job fails, all of them) are removed. Spark's Arrow batches
are converted column by column (``seqstore.interop.arrow``), without a Python object per row.

Reading: one input partition per shard (shards larger than ``partitionRecords`` are split into record
ranges); every partition yields Arrow record batches built from zero-copy views of the mapped files.

Spark 4 lets a Python data source be written only in the ``append`` and ``overwrite`` modes (Spark
itself rejects ``errorifexists``, its default, and ``ignore`` with ``UNSUPPORTED_DATA_SOURCE_SAVE_MODE``
before the source is asked), so the ``errorifexists`` semantics are the option
``.mode("append").option("errorIfExists", "true")``, which :func:`write` sets for ``mode="errorifexists"``.
A URL of object storage (``s3://``, ``gs://``, ``az://``) is written the same way: each write task
uploads its part into the store's staging prefix (:mod:`seqstore.store.remote_parts`) and ``commit``
makes them visible with one conditional manifest write. The client's options come from the option
``storageOptions`` (a JSON object) and from options named ``storage.<key>`` (one per key; Spark's
default redaction hides the values of keys such as ``storage.secret_access_key`` in its UI and logs).

See docs/distributed.md (section Spark) for the options and the type mapping.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError, SchemaError
from ..format.manifest import MANIFEST
from ..interop import arrow as _arrow
from ..interop import to_arrow
from ..io.objects import is_remote
from ..schema import BFLOAT16, Field, Schema
from ..store import Store, open_store
from ..store.parts import PARTS_DIR, Part, PartWriter, commit_parts, discard_parts, pending_jobs, prepare_store
from ..store.writer import existing_manifest

try:
    from pyspark import TaskContext
    from pyspark.sql import types as T
    from pyspark.sql.datasource import DataSource as _SparkDataSource
    from pyspark.sql.datasource import (
        DataSourceArrowWriter,
        DataSourceReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.pandas.types import to_arrow_schema
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("seqstore.spark needs pyspark>=4.0 (and Java 17+): pip install 'seqstore[spark]'") from exc

__all__ = ["DataSource", "write", "read", "spark_schema", "schema_option", "NAME", "METADATA_KEY"]

#: The format name: ``df.write.format(NAME)``, ``spark.read.format(NAME)``.
NAME = "seqstore"

#: Key of what a Spark write records in the store's metadata (the id column's name, for reading back).
METADATA_KEY = "spark"

#: Key of a column's seqstore field in the Spark column metadata of a read (a write of such a column
#: uses that field: float16 stays float16, ragged rows keep their length).
FIELD_METADATA_KEY = "seqstore"

#: Default target size of one Arrow batch a read task hands to Spark.
DEFAULT_BATCH_BYTES = 8 << 20

#: Default largest number of records of one input partition (a larger shard is split into ranges).
DEFAULT_PARTITION_RECORDS = 1 << 20

#: How long the driver waits for the writers of uncommitted attempts to stop before removing their parts.
DISCARD_WAIT_S = 60.0

#: ``_parts/.spark-ended/<job>`` marks a job that was committed or aborted: a write task of the job
#: that finds it writes nothing (or removes what it wrote). Marks are removed after ENDED_KEEP_S.
ENDED_DIR = ".spark-ended"
ENDED_KEEP_S = 7 * 24 * 3600.0

#: what an error about too many values (or id bytes) in one Arrow array of a read suggests
_BATCH_HINT = "; lower the batchRecords option"


def _pa() -> Any:
    return importlib.import_module("pyarrow")


# ------------------------------------------------------------------------------------------- options


def _opt_int(options: Mapping[str, str], key: str, default: int | None, where: str) -> int | None:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = int(str(raw))
    except ValueError:
        raise ValueError(f"{where}: option {key}={raw!r} is not an integer") from None
    if value <= 0:
        raise ValueError(f"{where}: option {key}={raw!r} must be positive")
    return value


def _opt_bool(options: Mapping[str, str], key: str, where: str) -> bool:
    raw = str(options.get(key, "false")).strip().lower()
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no", ""):
        return False
    raise ValueError(f"{where}: option {key}={options.get(key)!r} must be true or false")


def _opt_json(options: Mapping[str, str], key: str, where: str) -> Any:
    raw = options.get(key)
    if raw is None:
        return None
    try:
        return json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: option {key} is not JSON ({exc}): {str(raw)[:200]!r}") from None


#: prefix of the options that are single keys of the remote store's client (``storage.endpoint``)
STORAGE_PREFIX = "storage."


def _storage_options(options: Mapping[str, str], path: str, where: str) -> dict[str, Any] | None:
    """The client options of a store at a URL: the ``storageOptions`` JSON object, then every
    ``storage.<key>`` option (None when there are none); refused for a local path."""
    out: dict[str, Any] = {}
    obj = _opt_json(options, "storageOptions", where)
    if obj is not None:
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: option storageOptions must be a JSON object")
        out.update(obj)
    for key, value in options.items():
        if str(key).lower().startswith(STORAGE_PREFIX) and len(key) > len(STORAGE_PREFIX):
            out[str(key)[len(STORAGE_PREFIX):]] = value
    if out and not is_remote(path):
        raise ValueError(f"{where}: storageOptions / storage.* options are for URLs of object storage, not local paths")
    return out or None


def _path(options: Mapping[str, str]) -> str:
    path = options.get("path")
    if not path:
        raise ValueError("seqstore data source: no path; use .save(path) / .load(path)")
    return str(path)


def schema_option(schema: Schema | Mapping[str, Any]) -> str:
    """The value of the ``schema`` write option for seqstore fields: ``{"col": Field(...)}`` or a
    :class:`~seqstore.Schema` (packed groups included) as JSON."""
    return json.dumps((schema if isinstance(schema, Schema) else Schema(schema)).to_json())


def _given_schema(options: Mapping[str, str], where: str) -> Schema | None:
    obj = _opt_json(options, "schema", where)
    if obj is None:
        return None
    if isinstance(obj, dict):  # shorthand {"col": ["float16", [null, 16]]} besides {"col": {"dtype":, "shape":}}
        obj = {k: ({"dtype": v[0], "shape": v[1] if len(v) > 1 else []} if isinstance(v, list) else v)
               for k, v in obj.items()}
    try:
        return Schema.from_json(obj)
    except SchemaError as exc:
        raise SchemaError(f"{where}: option schema: {exc}") from exc


# ------------------------------------------------------------------------ Spark schema -> store schema


@dataclasses.dataclass(frozen=True)
class _Column:
    """How one DataFrame column is written: the field it fills and that field."""

    column: str
    field_name: str
    field: Field


def _list_depth(arrow_type: Any) -> tuple[int, Any]:
    """How many list levels (variable or fixed size) wrap a leaf type, and the leaf type."""
    pa = _pa()
    t, depth = _arrow._storage_type(arrow_type), 0
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t, depth = _arrow._storage_type(t.value_type), depth + 1
    return depth, t


def _infer_field(where: str, column: str, arrow_type: Any) -> Field:
    """The field a column of this Arrow type becomes without the schema option: a number is a scalar
    field, an array a ragged field (a fixed-size list, which Spark does not make, a fixed one)."""
    depth, leaf = _list_depth(arrow_type)
    if depth >= 2 and _arrow._primitive_dtype(leaf) is not None:
        plan = _arrow._plan(where, column, arrow_type) if depth == 2 else None
        if plan is not None and all(s is not None for s in plan.shape):
            return plan.field()
        example = json.dumps({column: [_arrow._primitive_dtype(leaf), [None, *([16] * (depth - 1))]]})
        raise SchemaError(
            f"{where}, column {column!r}: {arrow_type} (arrays of arrays) becomes a ragged field of rows whose "
            f"shape Spark's type does not say; give the field with the schema option, e.g. "
            f".option(\"schema\", '{example}')"
        )
    return _arrow._plan(where, column, arrow_type).field()


def _write_plan(
    path: str, spark_schema: Any, options: Mapping[str, str], existing: Schema | None
) -> tuple[Schema, list[_Column], str | None]:
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
        pa = _pa()
        t = arrow_schema.field(id_column).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)):
            raise SchemaError(f"{where}, column {id_column!r}: ids must be strings or integers, got {t}")
    given = _given_schema(options, where)
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
        elif isinstance(meta.get(c, {}).get(FIELD_METADATA_KEY), str):
            try:
                spec[c] = Field.from_json(json.loads(meta[c][FIELD_METADATA_KEY]))
            except (SchemaError, ValueError):
                spec[c] = _infer_field(where, c, arrow_schema.field(c).type)
        else:
            spec[c] = _infer_field(where, c, arrow_schema.field(c).type)
    packed = {g: list(pg.fields) for g, pg in given.groups.items()} if given is not None else {}
    if not packed and existing is not None and set(existing) == set(spec):
        packed = {g: list(pg.fields) for g, pg in existing.groups.items()}
    try:
        schema = Schema(spec, packed=packed or None)
    except SchemaError as exc:
        raise SchemaError(f"{where}: {exc}") from exc
    return schema, [_Column(c, c, spec[c]) for c in cols], id_column


def _column_values(arr: Any, col: _Column, where: str) -> Any:
    """One Arrow column as ``append_batch`` wants it for its field: ``(n, *shape)`` for a fixed field,
    ``(values, lengths)`` for a ragged one. Each axis of the field is one list level of the column (a
    variable-size list, as Spark's arrays are, or a fixed-size list); every list but the outermost of a
    ragged field must have the field's length, checked per level on the lengths arrays (no per-row
    Python work); the leaf values are converted by ``seqstore.interop.arrow``."""
    pa = _pa()
    arr = _arrow._array(arr, where, col.column)
    f = col.field
    n = len(arr)
    lengths: np.ndarray[Any, Any] | None = None
    cur = arr
    for level, size in enumerate(f.shape):
        cur = _arrow._storage_array(cur)
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
    cur = _arrow._storage_array(cur)
    if _arrow._primitive_dtype(cur.type) is None:
        raise SchemaError(f"{where}, column {col.column!r}: Arrow type {arr.type} has more list levels than field "
                          f"{col.field_name!r} {f} has axes, or a leaf type that is not a number")
    flat = _narrowed(_arrow._flatten_fixed(cur, where, col.column), f)
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


# ------------------------------------------------------------------------------------------- writing


@dataclasses.dataclass
class _Message(WriterCommitMessage):
    """What a successful write task reports: its partition, its attempt and the part it wrote."""

    partition: int
    attempt: int
    part: Part


class _Writer(DataSourceArrowWriter):
    """Made on the driver by :meth:`DataSource.writer`, pickled to every write task and to the commit."""

    def __init__(self, path: str, job: str, columns: list[_Column], id_column: str | None, mode: str,
                 created: bool, shard_bytes: int | None, max_shard_records: int | None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self.storage_options = dict(storage_options) if storage_options else None
        self.job = job
        self.columns = columns
        self.id_column = id_column
        self.mode = mode  # what commit_parts does: "append" or "overwrite"
        self.created = created  # the store was created by this job: removed again on abort if still empty
        self.shard_bytes = shard_bytes
        self.max_shard_records = max_shard_records

    def write(self, iterator: Iterator[Any]) -> _Message:
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        task = f"p{partition}-a{attempt}-t{ctx.taskAttemptId() if ctx is not None else uuid.uuid4().hex}"
        where = f"{self.path} (Spark partition {partition}, attempt {attempt})"
        kwargs: dict[str, Any] = {}
        if self.shard_bytes is not None:
            kwargs["shard_bytes"] = self.shard_bytes
        if self.max_shard_records is not None:
            kwargs["max_shard_records"] = self.max_shard_records
        w = PartWriter(self.path, job=self.job, task=task, storage_options=self.storage_options, **kwargs)
        try:
            if _ended(self.path, self.job):  # checked once this attempt's part exists (see _end)
                raise RuntimeError(f"{where}: the Spark job {self.job} ended (committed or aborted) before this "
                                   "attempt started; it writes nothing")
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                cols = {c.field_name: _column_values(batch.column(c.column), c, where) for c in self.columns}
                ids = None
                if self.id_column:
                    ids = _arrow._id_strings(batch.column(self.id_column), where, self.id_column)
                w.append_batch(cols, ids=ids)
            part = w.finish()
        except BaseException:
            w.abort()
            if _ended(self.path, self.job):
                discard_parts(self.path, self.job)  # the job's directory too, if this attempt was its last
            raise
        if _ended(self.path, self.job):  # too late to be committed: nobody else may be left to remove it
            discard_parts(self.path, self.job)
        # (a URL: the remote PartWriter checks the job's end mark itself and removes its own objects)
        return _Message(partition, attempt, part)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        got = [m for m in messages if isinstance(m, _Message)]
        if len(got) != len(messages):  # Spark calls commit only when every task succeeded
            raise RuntimeError(f"{self.path}: Spark commit with {len(messages) - len(got)} missing task messages")
        got.sort(key=lambda m: m.partition)
        commit_parts(self.path, [m.part for m in got], mode=self.mode, storage_options=self.storage_options)
        self._end()  # parts of attempts Spark did not report (failed, killed, speculative)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._end()
        if self.created:
            _remove_if_empty(self.path, self.storage_options)

    def _end(self) -> None:
        """Mark the job ended, then remove every part of it that was not committed.

        Tasks of a failed job may still be running when Spark calls abort (they are being killed), or
        only starting, and a speculative attempt may when it calls commit. Each write task checks the
        mark after its part exists and again after finishing it, and removes the job's parts itself if
        the job ended; here the parts of attempts whose writers have stopped are removed, waiting up
        to ``DISCARD_WAIT_S`` for live ones. Whatever the order, no part of the job stays behind (a
        writer still running after the wait removes its own when it ends)."""
        _mark_ended(self.path, self.job)
        so = self.storage_options
        deadline = time.monotonic() + DISCARD_WAIT_S
        discard_parts(self.path, self.job, storage_options=so)  # a URL: writes the job's end mark first
        while self.job in pending_jobs(self.path, storage_options=so) and time.monotonic() < deadline:
            time.sleep(0.1)
            discard_parts(self.path, self.job, storage_options=so)


def _ended_mark(path: str, job: str) -> Path:
    return Path(path) / PARTS_DIR / ENDED_DIR / job


def _ended(path: str, job: str) -> bool:
    if is_remote(path):  # the remote parts keep their own end marks (store/remote_parts.py)
        return False
    return _ended_mark(path, job).exists()


def _mark_ended(path: str, job: str) -> None:
    """Record that ``job`` was committed or aborted (an empty file ``_parts/.spark-ended/<job>``, which
    readers and the parts functions ignore); marks older than ``ENDED_KEEP_S`` are removed. A URL:
    nothing here (``discard_parts`` writes the remote parts' own mark)."""
    if is_remote(path):
        return
    mark = _ended_mark(path, job)
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()
    now = time.time()
    for old in mark.parent.iterdir():
        try:
            if now - old.stat().st_mtime > ENDED_KEEP_S:
                old.unlink()
        except OSError:
            pass


def _remove_if_empty(path: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Remove the store a failed job created, if nothing was committed to it since and no other job
    writes parts into it."""
    if is_remote(path):
        from ..store.parts import remove_if_empty

        remove_if_empty(path, storage_options=storage_options)
        return
    try:
        store = open_store(path)
    except (FormatError, OSError):
        return
    if len(store) == 0 and store.num_shards == 0 and not pending_jobs(path):
        shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------------------- reading


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
    names = list(store.schema) if fields is None else list(fields)
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


class _Range(InputPartition):
    """Records ``[start, stop)`` of one shard."""

    def __init__(self, start: int, stop: int) -> None:
        super().__init__((start, stop))
        self.start = start
        self.stop = stop


def _leaf_array(flat: np.ndarray[Any, Any], dtype: str, leaf_type: Any, what: str) -> Any:
    """A flat numpy array of stored values as an Arrow array of Spark's leaf type."""
    pa = _pa()
    flat = to_arrow.numbers(flat, dtype)  # bfloat16 as float32
    target = np.dtype(leaf_type.to_pandas_dtype())
    if flat.dtype == np.uint64 and flat.size and int(flat.max()) > np.iinfo(np.int64).max:
        bad = int(np.flatnonzero(flat > np.iinfo(np.int64).max)[0])
        raise ValueError(f"{what}: value {int(flat[bad])} does not fit Spark's long (field is uint64)")
    if flat.dtype != target:
        flat = flat.astype(target)
    return pa.array(np.ascontiguousarray(flat), type=leaf_type)


def _field_array(values: np.ndarray[Any, Any], f: Field, records: int | np.ndarray[Any, Any], arrow_type: Any,
                 what: str) -> Any:
    """A field's values (fixed: ``(r, D)`` rows of ``records`` records; ragged: the rows of records of
    lengths ``records``) as an Arrow column of ``arrow_type``, one array level per axis."""
    flat = _leaf_array(values.reshape(-1), f.dtype, to_arrow.leaf_type(arrow_type, len(f.shape)), what)
    return to_arrow.field_lists(flat, f, records, arrow_type, what=what, hint=_BATCH_HINT)


class _Reader(DataSourceReader):
    """Pickled to every read task with the store (which reopens there, pinned to the records seen here)."""

    def __init__(self, store: Store, schema: Any, id_column: str | None, partition_records: int,
                 batch_records: int) -> None:
        self.store = store
        self.schema = schema
        self.id_column = id_column
        self.partition_records = partition_records
        self.batch_records = batch_records
        where = f"{store.root}"
        for sf in schema.fields:
            if sf.name != id_column and sf.name not in store.schema:
                ids = f", ids: {id_column!r}" if id_column else ""
                raise SchemaError(f"{where}: the read schema has column {sf.name!r}, which is no field of the "
                                  f"store (fields: {list(store.schema)}{ids})")
        if id_column is not None and id_column in schema.fieldNames() and not store.has_ids:
            raise SchemaError(f"{where}: the read schema has the id column {id_column!r} but the records have no ids")

    def partitions(self) -> list[_Range]:
        table = self.store.manifest.shard_table()
        n = len(self.store)
        starts = np.asarray(table.starts[: self.store.num_shards], dtype=np.int64)
        ends = np.append(starts[1:], n)
        out: list[_Range] = []
        step = self.partition_records
        for s, e in zip(starts.tolist(), ends.tolist()):  # O(shards): Spark keeps a partition per shard anyway
            for a in range(s, e, step):
                out.append(_Range(a, min(e, a + step)))
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Range)
        pa = _pa()
        store = self.store
        arrow_schema = to_arrow_schema(self.schema)
        names = arrow_schema.names
        for a in range(partition.start, partition.stop, self.batch_records):
            b = min(partition.stop, a + self.batch_records)
            arrays = []
            for name in names:
                t = arrow_schema.field(name).type
                what = f"{store.root}, records {a}..{b - 1}, field {name!r}"
                if name == self.id_column:
                    ids_what = f"{store.root}, ids of records {a}..{b - 1}"
                    arrays.append(to_arrow.id_array(store, np.arange(a, b, dtype=np.int64),
                                                    large=pa.types.is_large_string(t), what=ids_what, hint=_BATCH_HINT))
                    continue
                f = store.schema[name]
                if f.ragged:
                    _, values, lengths = next(store.iter_ragged(name, chunk_records=b - a, start=a, stop=b))
                    arrays.append(_field_array(values, f, lengths, t, what))
                else:
                    _, block = next(store.iter_matrix([name], chunk_rows=b - a, start=a, stop=b))
                    arrays.append(_field_array(block, f, b - a, t, what))
            yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


# ---------------------------------------------------------------------------------------- data source


def _store_exists(path: str) -> bool:
    return (Path(path) / MANIFEST).exists()


class DataSource(_SparkDataSource):
    """The ``"seqstore"`` Spark data source; register with ``spark.dataSource.register(DataSource)``.

    Write options: ``schema`` (JSON of seqstore fields for some or all columns, see :func:`schema_option`;
    the shorthand ``{"col": ["float16", [null, 16]]}`` works too), ``idColumn`` (a string or integer
    column whose values become record ids), ``shardBytes``, ``maxShardRecords``, ``metadata`` (a JSON
    object for a new store's metadata), ``errorIfExists`` (with mode append: fail if the store exists),
    ``storageOptions`` (a JSON object) and ``storage.<key>`` (one client option each) for a URL.
    Read options: ``fields`` (comma-separated), ``idColumn`` (the ids' column name; default: the one
    the store was written from by Spark, else ``id``; ``""`` for none), ``partitionRecords``,
    ``batchRecords``.
    """

    @classmethod
    def name(cls) -> str:
        return NAME

    # --- reading

    def _read_setup(self) -> tuple[Store, list[str] | None, str | None]:
        path = _path(self.options)
        store = open_store(path, storage_options=_storage_options(self.options, path, f"Spark read of {path}"))
        raw = self.options.get("fields")
        fields = [s.strip() for s in str(raw).split(",") if s.strip()] if raw is not None else None
        id_column: str | None
        if "idColumn" in self.options:
            id_column = str(self.options["idColumn"]) or None
        else:
            meta = store.metadata.get(METADATA_KEY)
            id_column = str(meta.get("id_column") or "id") if isinstance(meta, dict) else "id"
        if id_column is not None and store.has_ids and id_column in store.schema and \
                (fields is None or id_column in fields):
            raise SchemaError(f"{path}: the id column {id_column!r} is also a field; name the ids' column with "
                              "the idColumn option")
        return store, fields, id_column if store.has_ids else None

    def schema(self) -> Any:
        store, fields, id_column = self._read_setup()
        return spark_schema(store, fields, id_column)

    def reader(self, schema: Any) -> _Reader:
        store, _, id_column = self._read_setup()
        where = store.url
        partition_records = _opt_int(self.options, "partitionRecords", DEFAULT_PARTITION_RECORDS, where)
        batch_records = _opt_int(self.options, "batchRecords", None, where)
        if batch_records is None:
            per_record = 1
            for name in schema.fieldNames():
                if name in store.schema:
                    f = store.schema[name]
                    rows = store.manifest.total_rows(name) / max(1, len(store)) if f.ragged else 1
                    per_record += int(rows * f.row_bytes) + (8 if f.ragged else 0)
            batch_records = int(min(max(DEFAULT_BATCH_BYTES // per_record, 16), 1 << 16))
        assert partition_records is not None
        return _Reader(store, schema, id_column, partition_records, batch_records)

    # --- writing

    def writer(self, schema: Any, overwrite: bool) -> _Writer:
        path = _path(self.options)
        where = f"Spark write to {path}"
        error_if_exists = _opt_bool(self.options, "errorIfExists", where)
        if overwrite and error_if_exists:
            raise ValueError(f"{where}: mode overwrite and option errorIfExists contradict each other")
        so = _storage_options(self.options, path, where)
        manifest = existing_manifest(path, so) if is_remote(path) else None
        exists = manifest is not None if is_remote(path) else _store_exists(path)
        if exists and error_if_exists:
            raise FileExistsError(f"{path}: a store already exists (mode errorifexists); use mode append or "
                                  "overwrite")
        # appending: the store's fields for columns the schema option leaves out; overwriting: as a new store
        existing = None
        if exists and not overwrite:
            existing = manifest.schema if manifest is not None else open_store(path).schema
        store_schema, columns, id_column = _write_plan(path, schema, self.options, existing)
        metadata = _opt_json(self.options, "metadata", where)
        if metadata is not None and not isinstance(metadata, dict):
            raise ValueError(f"{where}: option metadata must be a JSON object, got {metadata!r}")
        metadata = dict(metadata or {})
        if id_column is not None:
            metadata.setdefault(METADATA_KEY, {"id_column": id_column})
        mode = "create" if error_if_exists else "overwrite" if overwrite else "append"
        prepare_store(path, store_schema, metadata=metadata or None, mode=mode, storage_options=so)
        return _Writer(
            path, f"spark-{uuid.uuid4().hex[:16]}", columns, id_column, "overwrite" if overwrite else "append",
            not exists, _opt_int(self.options, "shardBytes", None, where),
            _opt_int(self.options, "maxShardRecords", None, where), so,
        )


# ------------------------------------------------------------------------------------------- helpers


def _register(session: Any) -> None:
    session.dataSource.register(DataSource)


def write(df: Any, path: str | os.PathLike[str], *, mode: str = "errorifexists",
          schema: Schema | Mapping[str, Any] | None = None, id_column: str | None = None,
          shard_bytes: int | None = None, metadata: Mapping[str, Any] | None = None,
          storage_options: Mapping[str, Any] | None = None, **options: Any) -> None:
    """Write DataFrame ``df`` into the store at ``path`` (registers the data source in ``df``'s
    session). ``mode``: ``"errorifexists"`` (default, as Spark's), ``"append"`` or ``"overwrite"``.
    ``schema``: seqstore fields for some or all columns; ``storage_options``: the client options of a
    URL (``s3://``...), passed as ``storage.<key>`` options; other options are passed on as they are."""
    if mode not in ("errorifexists", "error", "append", "overwrite"):
        raise ValueError(f"mode must be 'errorifexists', 'append' or 'overwrite', got {mode!r}")
    _register(df.sparkSession)
    w = df.write.format(NAME).mode("overwrite" if mode == "overwrite" else "append")
    if mode in ("errorifexists", "error"):
        w = w.option("errorIfExists", "true")
    if schema is not None:
        w = w.option("schema", schema_option(schema))
    if id_column is not None:
        w = w.option("idColumn", id_column)
    if shard_bytes is not None:
        w = w.option("shardBytes", str(int(shard_bytes)))
    if metadata is not None:
        w = w.option("metadata", json.dumps(dict(metadata)))
    for k, v in (storage_options or {}).items():
        w = w.option(STORAGE_PREFIX + k, v)
    for k, v in options.items():
        w = w.option(k, v)
    w.save(os.fspath(path))


def read(spark: Any, path: str | os.PathLike[str], *, fields: Sequence[str] | None = None,
         id_column: str | None = None, **options: Any) -> Any:
    """The store at ``path`` as a DataFrame (registers the data source in ``spark``)."""
    _register(spark)
    r = spark.read.format(NAME)
    if fields is not None:
        r = r.option("fields", ",".join(fields))
    if id_column is not None:
        r = r.option("idColumn", id_column)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(os.fspath(path))
