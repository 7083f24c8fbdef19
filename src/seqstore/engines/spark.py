"""A Spark 4 Python data source named ``"seqstore"``: DataFrames are written into a store by Spark's
write tasks in parallel, with one commit on the driver, and stores are read back as DataFrames.

::

    import seqstore.spark
    spark.dataSource.register(seqstore.spark.DataSource)
    df.write.format("seqstore").mode("append").option("idColumn", "key").save("corpus.seqstore")
    back = spark.read.format("seqstore").load("corpus.seqstore")

Writing: every write task (one per partition) writes its rows as its own uncommitted part of the store
(:class:`seqstore.store.parts.PartWriter`, tied to the job and the task attempt) and returns it in its
commit message; ``commit`` on the driver makes all parts visible with one manifest commit, in partition
order (so the store's record order is the DataFrame's); parts of other attempts (and, when the job
fails, all of them) are removed. Reading: one input partition per shard (split into record ranges past
``partitionRecords``), each yielding Arrow record batches of zero-copy views of the mapped files.

Spark 4 refuses the ``errorifexists`` and ``ignore`` modes for Python data sources, so
``errorifexists`` is ``.mode("append").option("errorIfExists", "true")`` (what :func:`write` sets).
URLs of object storage take client options from ``storageOptions`` (JSON) and ``storage.<key>``.
The option parsing is ``spark_options``, the type mapping ``spark_types``, the read tasks
``spark_read``; docs/distributed.md (section Spark) describes the options and the type mapping.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import SchemaError
from ..format.manifest import MANIFEST, PARTS_DIR
from ..interop import arrow_columns as acols
from ..io.local_source import local_path
from ..io.object_common import check_not_chained
from ..io.objects import is_remote
from ..schema import Schema, field_list
from ..store import Store, open_store
from ..store.parts import (
    Part,
    PartWriter,
    commit_parts,
    discard_parts,
    pending_jobs,
    prepare_store,
    remove_if_empty,
    unstage,
)
from ..store.writer import existing_manifest

try:
    from pyspark import TaskContext
    from pyspark.sql.datasource import DataSource as _SparkDataSource
    from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("seqstore.spark needs pyspark>=4.0 (and Java 17+): pip install 'seqstore[spark]'") from exc

# the options, the type mapping and the read side (after the check above: the last two import pyspark)
from .spark_options import (
    READ_OPTIONS,
    STORAGE_PREFIX,
    WRITE_OPTIONS,
    check_options,
    opt_bool,
    opt_int,
    opt_json,
    option_path,
    schema_option,
    storage_options_of,
)
from .spark_read import SparkReader
from .spark_types import SparkColumn, column_values, spark_schema, write_plan

__all__ = ["DataSource", "write", "read", "spark_schema", "schema_option", "NAME", "METADATA_KEY"]

#: The format name: ``df.write.format(NAME)``, ``spark.read.format(NAME)``.
NAME = "seqstore"

#: Key of what a Spark write records in the store's metadata (the id column's name, for reading back).
METADATA_KEY = "spark"

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


# ------------------------------------------------------------------------------------------- writing


@dataclasses.dataclass
class _Message(WriterCommitMessage):
    """What a successful write task reports: its partition, its attempt and the part it wrote."""

    partition: int
    attempt: int
    part: Part


class _Writer(DataSourceArrowWriter):
    """Made on the driver by :meth:`DataSource.writer`, pickled to every write task and to the commit."""

    def __init__(self, path: str, job: str, columns: list[SparkColumn], id_column: str | None, mode: str,
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
        sizes = {"shard_bytes": self.shard_bytes, "max_shard_records": self.max_shard_records}
        kwargs: dict[str, Any] = {k: v for k, v in sizes.items() if v is not None}
        w = PartWriter(self.path, job=self.job, task=task, storage_options=self.storage_options, **kwargs)
        try:
            if _ended(self.path, self.job):  # checked once this attempt's part exists (see _end)
                raise RuntimeError(f"{where}: the Spark job {self.job} ended (committed or aborted) before this "
                                   "attempt started; it writes nothing")
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                cols = {c.field_name: column_values(batch.column(c.column), c, where) for c in self.columns}
                ids = None
                if self.id_column:
                    ids = acols.id_strings(batch.column(self.id_column), where, self.id_column)
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
            remove_if_empty(self.path, storage_options=self.storage_options)
        elif self.mode == "overwrite":  # the schema and metadata the job staged for its commit
            unstage(self.path, storage_options=self.storage_options)

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
    # (a URL: the remote parts keep their own end marks, store/write/objects.py)
    return not is_remote(path) and _ended_mark(path, job).exists()


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


# ---------------------------------------------------------------------------------------- data source


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
        path = option_path(self.options)
        check_options(self.options, READ_OPTIONS, f"Spark read of {path}")
        store = open_store(path, storage_options=storage_options_of(self.options, path, f"Spark read of {path}"))
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

    def reader(self, schema: Any) -> SparkReader:
        store, _, id_column = self._read_setup()
        where = store.url
        partition_records = opt_int(self.options, "partitionRecords", DEFAULT_PARTITION_RECORDS, where)
        batch_records = opt_int(self.options, "batchRecords", None, where)
        if batch_records is None:
            per_record = 1
            for name in schema.fieldNames():
                if name in store.schema:
                    f = store.schema[name]
                    rows = store.manifest.total_rows(name) / max(1, len(store)) if f.ragged else 1
                    per_record += int(rows * f.row_bytes) + (8 if f.ragged else 0)
            batch_records = int(min(max(DEFAULT_BATCH_BYTES // per_record, 16), 1 << 16))
        assert partition_records is not None
        return SparkReader(store, schema, id_column, partition_records, batch_records)

    # --- writing

    def writer(self, schema: Any, overwrite: bool) -> _Writer:
        path = option_path(self.options)
        where = f"Spark write to {path}"
        check_options(self.options, WRITE_OPTIONS, where)
        error_if_exists = opt_bool(self.options, "errorIfExists", where)
        if overwrite and error_if_exists:
            raise ValueError(f"{where}: mode overwrite and option errorIfExists contradict each other")
        so = storage_options_of(self.options, path, where)
        manifest = existing_manifest(path, so) if is_remote(path) else None
        exists = manifest is not None if is_remote(path) else (Path(path) / MANIFEST).exists()
        if exists and error_if_exists:
            raise FileExistsError(f"{path}: a store already exists (mode errorifexists); use mode append or "
                                  "overwrite")
        # appending: the store's fields for columns the schema option leaves out; overwriting: as a new store
        existing = None
        if exists and not overwrite:
            existing = manifest.schema if manifest is not None else open_store(path).schema
        store_schema, columns, id_column = write_plan(path, schema, self.options, existing)
        metadata = opt_json(self.options, "metadata", where)
        if metadata is not None and not isinstance(metadata, dict):
            raise ValueError(f"{where}: option metadata must be a JSON object, got {metadata!r}")
        metadata = dict(metadata or {})
        if id_column is not None:
            metadata.setdefault(METADATA_KEY, {"id_column": id_column})
        mode = "create" if error_if_exists else "overwrite" if overwrite else "append"
        prepare_store(path, store_schema, metadata=metadata or None, mode=mode, storage_options=so)
        return _Writer(
            path, f"spark-{uuid.uuid4().hex[:16]}", columns, id_column, "overwrite" if overwrite else "append",
            not exists, opt_int(self.options, "shardBytes", None, where),
            opt_int(self.options, "maxShardRecords", None, where), so,
        )


# ------------------------------------------------------------------------------------------- helpers


def write(df: Any, path: str | os.PathLike[str], *, mode: str = "errorifexists",
          schema: Schema | Mapping[str, Any] | None = None, id_column: str | None = None,
          shard_bytes: int | None = None, metadata: Mapping[str, Any] | None = None,
          storage_options: Mapping[str, Any] | None = None, **options: Any) -> None:
    """Write DataFrame ``df`` into the store at ``path`` (registers the data source in ``df``'s
    session). ``mode``: ``"errorifexists"`` (default, as Spark's), ``"append"`` or ``"overwrite"``.
    ``schema``: seqstore fields for some or all columns; ``storage_options``: the client options of a
    URL (``s3://``...), passed as ``storage.<key>`` options; other options are passed on as they are. A
    relative local path is the caller's (made absolute: a plain ``.save(path)`` leaves it to Spark's
    Python workers, which resolve it against the directory Spark started in)."""
    if mode not in ("errorifexists", "error", "append", "overwrite"):
        raise ValueError(f"mode must be 'errorifexists', 'append' or 'overwrite', got {mode!r}")
    df.sparkSession.dataSource.register(DataSource)
    w = df.write.format(NAME).mode("overwrite" if mode == "overwrite" else "append")
    given = [("errorIfExists", "true" if mode in ("errorifexists", "error") else None),
             ("schema", None if schema is None else schema_option(schema)), ("idColumn", id_column),
             ("shardBytes", None if shard_bytes is None else str(int(shard_bytes))),
             ("metadata", None if metadata is None else json.dumps(dict(metadata)))]
    storage = {STORAGE_PREFIX + k: v for k, v in (storage_options or {}).items()}
    _with_options(w, given, {**storage, **options}).save(_where(path))


def read(spark: Any, path: str | os.PathLike[str], *, fields: Sequence[str] | None = None,
         id_column: str | None = None, **options: Any) -> Any:
    """The store at ``path`` as a DataFrame (registers the data source in ``spark``)."""
    spark.dataSource.register(DataSource)
    given = [("fields", None if fields is None else ",".join(field_list(fields) or [])), ("idColumn", id_column)]
    return _with_options(spark.read.format(NAME), given, options).load(_where(path))


def _with_options(rw: Any, named: list[tuple[str, Any]], options: Mapping[str, Any]) -> Any:
    """A DataFrameWriter or DataFrameReader with the ``named`` options that are not None, then ``options``."""
    for k, v in [*((k, v) for k, v in named if v is not None), *options.items()]:
        rw = rw.option(k, v)
    return rw


def _where(path: str | os.PathLike[str]) -> str:
    """``path`` as Spark's Python workers must see it: a local path made absolute (they resolve a relative
    one against the directory Spark started in, not the caller's), a ``file://`` URL as its path;
    ConfigError for a chained URL (``simplecache::s3://...``)."""
    check_not_chained(os.fspath(path))
    return os.fspath(path) if is_remote(path) else os.fspath(local_path(path))
