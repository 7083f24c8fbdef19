"""Ray Data: write a ``ray.data.Dataset`` into one store in parallel, read a store as a Dataset.

:func:`write` runs a Ray ``Datasink``. The driver prepares the store (``on_write_start``: create,
append or overwrite; nothing becomes visible); every write task attempt writes its blocks as its own
uncommitted part (:class:`~seqstore.store.parts.PartWriter`) and reports it; ``on_write_complete``
commits the reported parts in the order of the write tasks with one manifest commit. Parts of
attempts that died or were retried are never committed; ``on_write_failed`` removes every part of the
job, so a failed job leaves the store as it was. A URL of object storage works the same way (each
attempt uploads its part into the store's staging prefix, :mod:`seqstore.store.write.objects`).

:func:`read` returns a Dataset whose read tasks each cover a range of records or, with ``ordering=``,
of positions of that epoch's lazy order (:mod:`seqstore.order`); the driver holds nothing per record.

Fields are inferred from the Arrow (and Ray tensor) types of the first block and its rows, or given
with ``schema=``: :mod:`.ray_types` (:func:`infer_schema`, :func:`block_columns`) holds that mapping,
docs/distributed.md (section Ray) describes it.
"""

from __future__ import annotations

import importlib
import math
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .ray_types import BFLOAT16_METADATA, WHERE, block_columns, infer_schema  # (imports no Ray)

try:
    import ray
    import ray.data
    from ray.data.block import Block, BlockAccessor, BlockMetadata
    from ray.data.datasource import Datasink, Datasource, ReadTask
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("seqstore.ray needs Ray Data: pip install 'seqstore[ray]'") from exc

from ..data import StoreDataset
from ..errors import SchemaError
from ..interop import to_arrow
from ..io.local_source import local_path
from ..io.object_common import check_not_chained
from ..io.objects import is_remote
from ..order import ordering_needs_lengths
from ..schema import BFLOAT16, Schema, field_list
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
from ..store.write.writer import check_sizes
from ..store.writer import existing_manifest

__all__ = ["write", "read", "infer_schema", "block_columns", "BFLOAT16_METADATA"]

pa: Any = importlib.import_module("pyarrow")  # by name: pyarrow ships no type information

_MODES = ("create", "append", "overwrite")
#: rows of the dataset read on the driver to infer a schema whose Arrow types leave dimensions open
_PEEK_ROWS = 256
#: target bytes of one block that a read task yields
_BLOCK_BYTES = 64 << 20
#: attempts (0.2 s apart) to remove a failed job's parts while its cancelled tasks stop
_DISCARD_TRIES = 50


# ------------------------------------------------------------------------------------------ write


if TYPE_CHECKING:
    _SinkBase = Datasink[tuple[int, Part]]
else:  # Ray < 2.43: Datasink is not generic
    _SinkBase = Datasink


class _StoreDatasink(_SinkBase):
    """Writes blocks as parts of job ``self.job``; the driver commits the reported parts at once."""

    def __init__(self, root: str, schema: Schema, *, id_column: str | None, mode: str, shard_bytes: int,
                 max_shard_records: int, metadata: Mapping[str, Any] | None,
                 storage_options: Mapping[str, Any] | None = None, every_column: bool = False) -> None:
        self.root = root
        self.every_column = every_column  # an inferred schema: every column of every block is a field
        self.storage_options = dict(storage_options) if storage_options else None
        self.schema = schema
        self.id_column = id_column
        self.mode = mode
        self.shard_bytes = shard_bytes
        self.max_shard_records = max_shard_records
        self.metadata = dict(metadata) if metadata is not None else None
        self.job = f"ray-{uuid.uuid4().hex[:16]}"
        self._prepared = False
        self._created = False  # no store was there before this job: removed again if the job fails
        self._ended = False  # on_write_complete finished or on_write_failed ran: nothing left to clean up
        self._committed = False  # the commit went through: a failure after it keeps the store as committed
        self.records = 0

    def get_name(self) -> str:
        return "Seqstore"

    def _prepare(self) -> None:
        if not self._prepared:
            self._created = existing_manifest(self.root, self.storage_options) is None
            prepare_store(self.root, self.schema, metadata=self.metadata, mode=self.mode,
                          storage_options=self.storage_options)
            self._prepared = True

    def on_write_start(self, schema: Any = None) -> None:
        self._prepare()

    def write(self, blocks: Iterable[Block], ctx: Any) -> tuple[int, Part]:
        task = int(ctx.task_idx)
        writer = PartWriter(self.root, job=self.job, task=f"t{task:08d}-{uuid.uuid4().hex[:12]}",
                            shard_bytes=self.shard_bytes, max_shard_records=self.max_shard_records,
                            storage_options=self.storage_options)
        try:
            for block in blocks:
                table = BlockAccessor.for_block(block).to_arrow()
                if table.num_rows == 0:
                    continue
                cols, ids = block_columns(table, self.schema, self.id_column, every_column=self.every_column)
                writer.append_batch(cols, ids=ids)
            part = writer.finish()
        except BaseException:
            writer.abort()
            raise
        return task, part

    def on_write_complete(self, write_result: Any) -> None:
        # (ended only once it has finished: an interrupt in here, which Ray does not pass to on_write_failed,
        # leaves the clean-up to write())
        self._prepare()  # an empty dataset starts no write task
        reported = sorted((r for r in write_result.write_returns if r is not None), key=lambda r: r[0])
        self.records = commit_parts(self.root, [part for _, part in reported],  # (none: an overwrite empties it)
                                    mode="overwrite" if self.mode == "overwrite" else "append",
                                    storage_options=self.storage_options)
        self._committed = True
        # attempts that died or were retried, never reported
        discard_parts(self.root, self.job, storage_options=self.storage_options)
        self._ended = True

    def on_write_failed(self, error: BaseException) -> None:
        self._ended = True
        if not self._prepared:
            return
        # Ray cancels the job's running tasks as it fails; one still stopping holds its part (a live
        # PartWriter, which discard_parts leaves alone): try again while it aborts
        for _ in range(_DISCARD_TRIES):
            discard_parts(self.root, self.job, storage_options=self.storage_options)
            if self.job not in pending_jobs(self.root, storage_options=self.storage_options):
                break
            time.sleep(0.2)
        if self._committed:  # (failed after its commit: the store is as committed)
            return
        if self._created:  # the store this job created, if still empty
            remove_if_empty(self.root, storage_options=self.storage_options)
        elif self.mode == "overwrite":  # the schema and metadata it staged for its commit
            unstage(self.root, storage_options=self.storage_options)


def write(ds: Any, path: str | os.PathLike[str], *, schema: Mapping[str, Any] | Schema | None = None,
          id_column: str | None = None, shard_bytes: int = 1 << 30, max_shard_records: int = 1 << 24,
          mode: str = "create", metadata: Mapping[str, Any] | None = None,
          storage_options: Mapping[str, Any] | None = None, preserve_order: bool = True, concurrency: int | None = None,
          ray_remote_args: Mapping[str, Any] | None = None) -> int:
    """Write the ``ray.data.Dataset`` ``ds`` into the store at ``path`` in parallel; return the number
    of records written.

    Every write task writes its blocks as shard(s) of its own (``shard_bytes`` / ``max_shard_records``
    bound one shard); the driver commits the tasks' shards with one manifest commit when the whole
    Dataset is written: the rows appear at once, or, when the job fails, not at all (the job's shards
    are removed). ``mode``: ``"create"`` (a new store; an existing path is an error), ``"append"`` (a
    store there must have the same schema; a missing one is created) or ``"overwrite"`` (the commit
    replaces all records).

    ``schema``: the fields, ``{column: Field}`` (each a column of ``ds``); default: inferred from the
    first block (see the module docstring), every column but ``id_column``. ``id_column``: a string (or
    integer) column whose values become record ids. ``preserve_order`` (default True) sets Ray's
    ``preserve_order`` on ``ds`` for this write: records are stored in the Dataset's order (each
    task's blocks in order, tasks in order). With False (and the context's own setting False) Ray
    feeds the write tasks as upstream tasks finish; the store holds the blocks in the order the
    write tasks received them (the Dataset's order still where the write is fused with its input).

    ``path`` may be a URL of object storage (``s3://``, ``gs://``, ``az://``) with ``storage_options``
    (its client's options, as :func:`seqstore.open` takes them; they travel to the write tasks, so
    prefer credentials from the workers' environment): every write task, on any machine, uploads its
    part into the store and the driver commits them with one conditional manifest write.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if storage_options and not is_remote(path):
        raise ValueError(f"{path}: storage_options are for URLs of object storage, not local paths")
    check_sizes(shard_bytes=shard_bytes, max_shard_records=max_shard_records)
    check_not_chained(os.fspath(path))  # (no local path: it was written as a directory named ``simplecache::s3:``)
    # a local path absolute (the tasks' directory is not ours), a file:// URL as its path
    root = os.fspath(path) if is_remote(path) else os.fspath(local_path(path))
    if mode == "create" and existing_manifest(root, storage_options) is not None:
        # before Ray runs anything (the inference below is a Ray job): the error is seqstore's, alone
        raise FileExistsError(f"{root}: a store already exists (mode='create'); use mode='append' or 'overwrite'")
    if schema is not None:
        sch = Schema(schema)
        known = ds.schema(fetch_if_missing=False)  # no execution: None when Ray does not know it yet
        names = set(known.names) if known is not None else set()
        missing = [c for c in [*sch, *([id_column] if id_column else [])] if names and c not in names]
        if missing:
            raise SchemaError(f"{WHERE}: no column(s) {missing}; columns are {sorted(names)}")
    else:
        options = ds.context.execution_options
        before, options.preserve_order = options.preserve_order, True  # the first rows, not the first done
        try:
            sample = ds.limit(_PEEK_ROWS).take_batch(_PEEK_ROWS, batch_format="pyarrow")
        except ValueError:  # Ray: "The dataset is empty."
            sample = None
        finally:
            options.preserve_order = before
        if sample is None or sample.num_rows == 0:
            raise SchemaError(f"{WHERE} is empty: no rows to infer fields from; pass schema= ({root})")
        sch = infer_schema(sample.schema, sample, id_column=id_column)
    sink = _StoreDatasink(root, sch, id_column=id_column, mode=mode, shard_bytes=shard_bytes,
                          max_shard_records=max_shard_records, metadata=metadata, storage_options=storage_options,
                          every_column=schema is None)
    # the target is checked (mode, an existing store's schema) and made ready here on the driver: an error
    # is raised to the caller as it is, not from inside Ray's execution (which logs it as an internal error)
    sink._prepare()
    options = ds.context.execution_options
    before = options.preserve_order
    options.preserve_order = before or preserve_order  # for this write only
    try:
        ds.write_datasink(sink, ray_remote_args=dict(ray_remote_args or {}), concurrency=concurrency)
    except BaseException as exc:
        if not sink._ended:  # Ray failed before its own failure callback: undo what the driver prepared
            sink.on_write_failed(exc)
        raise
    finally:
        options.preserve_order = before
    return sink.records


# ------------------------------------------------------------------------------------------- read


def _arrow_fixed(values: np.ndarray[Any, Any]) -> Any:
    if values.ndim == 1:
        return pa.array(values)
    from ray.data.extensions import ArrowTensorArray

    return ArrowTensorArray.from_numpy(np.ascontiguousarray(values))


def _arrow_ragged(values: np.ndarray[Any, Any], lengths: np.ndarray[Any, Any]) -> Any:
    """Ray's variable-shaped tensor array of ``len(lengths)`` records: record k is ``values`` rows
    ``[sum(lengths[:k]), sum(lengths[:k+1]))``, built from the flat values (nothing per record)."""
    from ray.data.extensions import ArrowVariableShapedTensorType

    n = len(lengths)
    inner = values.shape[1:]
    ndim = 1 + len(inner)
    per_row = int(np.prod(inner, dtype=np.int64))
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    data = to_arrow.list_array(to_arrow.offsets(lengths * per_row, large=True), flat)
    shapes = np.empty((n, ndim), dtype=np.int64)
    shapes[:, 0] = lengths
    shapes[:, 1:] = np.asarray(inner, dtype=np.int64)
    shape = to_arrow.fixed_lists(pa.array(shapes.reshape(-1)), (ndim,), n)  # n lists of ndim dims
    storage = pa.StructArray.from_arrays([data, shape], names=["data", "shape"])
    return ArrowVariableShapedTensorType(flat.type, ndim).wrap_array(storage)


def _table(store: Store, idx: np.ndarray[Any, Any], fields: list[str], id_column: str | None,
           bfloat16: str) -> Any:
    batch = store.get_batch(idx, fields=fields)
    arrays = []
    schema_fields = []
    if id_column is not None:
        arrays.append(to_arrow.id_array(store, idx, large=True))
        schema_fields.append(pa.field(id_column, pa.large_string(), nullable=False))
    for name in fields:
        f = store.schema[name]
        values, lengths = batch[name] if f.ragged else (batch[name], None)
        values = to_arrow.numbers(values, f.dtype, bfloat16=bfloat16)
        metadata = BFLOAT16_METADATA if f.dtype == BFLOAT16 and bfloat16 == "bits" else None
        arr = _arrow_fixed(values) if lengths is None else _arrow_ragged(values, lengths)
        arrays.append(arr)
        schema_fields.append(pa.field(name, arr.type, nullable=False, metadata=metadata))
    return pa.Table.from_arrays(arrays, schema=pa.schema(schema_fields))


class _StoreDatasource(Datasource):
    """Read tasks over contiguous ranges of records or of an epoch order's positions."""

    def __init__(self, store: Store, source: StoreDataset | None, epoch: int, fields: list[str],
                 id_column: str | None, bfloat16: str, block_records: int | None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.store = store
        self.source = source
        self.epoch = epoch
        self.fields = fields
        self.id_column = id_column
        self.bfloat16 = bfloat16
        self.length = len(source.epoch_order(epoch)) if source is not None else len(store)
        self.record_bytes = _record_bytes(store, fields, id_column)
        self.block_records = block_records or max(1, _BLOCK_BYTES // max(1, self.record_bytes))

    def get_name(self) -> str:
        return "Seqstore"

    def estimate_inmemory_data_size(self) -> int:
        return self.length * self.record_bytes

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[Any]:
        n = self.length
        tasks = max(1, min(int(parallelism) if parallelism and parallelism > 0 else 1, n))
        out = []
        for k in range(tasks):
            a, b = n * k // tasks, n * (k + 1) // tasks
            if a == b:
                continue
            meta = BlockMetadata(num_rows=b - a, size_bytes=(b - a) * self.record_bytes, input_files=None,
                                 exec_stats=None)

            def fn(start: int = a, stop: int = b) -> Iterable[Any]:
                """Blocks of records ``[start, stop)`` (the store's order; no source) or of positions
                ``[start, stop)`` of the source's order of the epoch, ``block_records`` records each."""
                order = self.source.epoch_order(self.epoch) if self.source is not None else None  # O(1): lazy
                for c in range(start, stop, self.block_records):
                    idx = np.arange(c, min(c + self.block_records, stop), dtype=np.int64)
                    yield _table(self.store, idx if order is None else order.take(idx), self.fields, self.id_column,
                                 self.bfloat16)

            kwargs = {} if per_task_row_limit is None else {"per_task_row_limit": per_task_row_limit}
            out.append(ReadTask(fn, meta, **kwargs))
        return out


def _record_bytes(store: Store, fields: list[str], id_column: str | None) -> int:
    """Mean bytes of one record's ``fields`` (ragged fields: from the lengths of the first records)."""
    total = 0.0
    sample = min(len(store), 4096)
    for name in fields:
        f = store.schema[name]
        if f.ragged:
            mean = float(np.mean(store.lengths(name)[0:sample])) if sample else 0.0
            total += mean * f.row_bytes + 8
        else:
            total += f.row_bytes
    if id_column is not None:
        total += 24
    return max(1, math.ceil(total))


def read(path: str | os.PathLike[str], *, fields: Sequence[str] | None = None, ordering: Any = None, epoch: int = 1,
         seed: int = 0, partition_epoch: int = 1, length_field: str | None = None,
         cache_dir: str | os.PathLike[str] | None = None, id_column: str | None = None, bfloat16: str = "bits",
         block_records: int | None = None, preserve_order: bool = True, override_num_blocks: int | None = None,
         storage_options: Mapping[str, Any] | None = None) -> Any:
    """The store at ``path`` (a directory, or a URL of object storage with ``storage_options`` as
    :func:`seqstore.open` takes them) as a ``ray.data.Dataset``: one row per record.

    ``fields``: the fields to read (default all). ``ordering`` (a :func:`seqstore.seq_order` name or an
    explicit order) with ``epoch``, ``seed``, ``partition_epoch``, ``length_field`` and ``cache_dir``
    as in :class:`seqstore.StoreDataset`: the rows are that (sub-)epoch's order; default: the store's
    order. ``id_column``: a column of that name holds the record ids. Fixed fields with a shape become
    Ray fixed-shape tensors, ragged fields Ray variable-shaped tensors (``(L, *inner)`` per row),
    scalars plain columns. ``bfloat16``: ``"bits"`` (uint16 columns marked with
    :data:`BFLOAT16_METADATA`, which :func:`write` stores as bfloat16 again) or ``"float32"``.

    Each read task covers a contiguous range of records (or of order positions) and yields blocks of
    ``block_records`` records (default: about 64 MiB). ``preserve_order`` (default True) sets Ray's
    ``preserve_order`` on the Dataset, so iterating it yields the records in that order.
    """
    if bfloat16 not in ("bits", "float32"):
        raise ValueError(f"bfloat16 must be 'bits' or 'float32', got {bfloat16!r}")
    store = open_store(path, storage_options=dict(storage_options) if storage_options else None)
    if block_records is not None:  # (checked here: a read task would fail inside Ray)
        integral = isinstance(block_records, (int, np.integer)) and not isinstance(block_records, bool)
        if not integral or block_records <= 0:
            raise (ValueError if integral else TypeError)(
                f"{store.url}: block_records must be a positive int, got {block_records!r}")
    names = list(store.schema) if fields is None else field_list(fields) or []
    for name in names:
        if name not in store.schema:
            raise KeyError(f"no field {name!r} in {store.url}; fields are {list(store.schema)}")
        if (dt := np.dtype(store.schema[name].storage_dtype)).kind == "c":
            raise ValueError(f"{store.url}: field {name!r} is {dt.name}, and Arrow (so Ray Data) has no complex "
                             "numbers; leave it out with fields=")
    twice = sorted({n for n in names if names.count(n) > 1})  # (a block's columns would clash)
    if twice:
        raise ValueError(f"{store.url}: fields {twice} named twice; name each field once")
    if not names and id_column is None:  # Ray has no rows without a column
        raise ValueError(f"{store.url}: nothing to read (no fields and no id_column)")
    if id_column is not None:
        if not store.has_ids and len(store):
            raise KeyError(f"{store.url}: records have no ids (id_column={id_column!r})")
        if id_column in names:
            raise ValueError(f"id_column {id_column!r} is also a field name; choose another")
    source = None
    if ordering is not None:
        if length_field is None and not ordering_needs_lengths(ordering):
            # the order does not look at lengths: any ragged field will do for StoreDataset
            length_field = next((n for n, f in store.schema.items() if f.ragged), None)
        source = StoreDataset(store, ordering=ordering, seed=seed, partition_epoch=partition_epoch,
                              length_field=length_field, cache_dir=cache_dir)
    datasource = _StoreDatasource(store, source, epoch, names, id_column if store.has_ids else None, bfloat16,
                                  block_records)
    ds = ray.data.read_datasource(datasource, override_num_blocks=override_num_blocks)
    if preserve_order:
        ds.context.execution_options.preserve_order = True
    return ds
