"""Ray Data: write a ``ray.data.Dataset`` into one store in parallel, read a store as a Dataset.

:func:`write` runs a Ray ``Datasink``. On the driver, ``on_write_start`` prepares the store (create,
append or overwrite; nothing becomes visible). Every write task attempt writes its blocks as its own
uncommitted shard(s) with a :class:`~seqstore.store.parts.PartWriter` and returns a small
:class:`~seqstore.store.parts.Part`. ``on_write_complete`` commits the reported parts in the order of
the write tasks with one manifest commit: the rows appear all at once. A task attempt that dies or is
retried reports nothing, so its shards are never committed (they are removed with the job's orphans);
``on_write_failed`` removes every part of the job: a failed job leaves the store as it was.
A URL of object storage (``s3://``..., with ``storage_options``) works the same way: each task
attempt uploads its part into the store's staging prefix (:mod:`seqstore.store.remote_parts`) and
the driver's one conditional manifest write commits them.

:func:`read` returns a Dataset over a ``Datasource`` whose read tasks each cover a range of records
(the store's order) or, with ``ordering=``, a range of positions of that epoch's order: each task
builds the lazy order itself (O(1), :mod:`seqstore.order`) and gathers its records in blocks; the
driver holds nothing per record.

Columns and fields (inferred from the Arrow schema of the first block; the rows of that block decide
the inner dimensions a type leaves open, such as the 16 of variable-shaped ``(L, 16)`` tensors):

=============================================================  =========================================
Arrow / Ray type                                               field
=============================================================  =========================================
integer, floating (float16 too), bool                          scalar ``()``
``fixed_size_list`` (nested), Arrow ``fixed_shape_tensor``,    fixed shape ``(k, ...)``
Ray's fixed-shape tensor (``ArrowTensorType``, ``...V2``)
``list`` / ``large_list`` of those, ``list<list<T>>``,          ragged ``(None, ...)``
Ray's variable-shaped tensor (``ndim`` dims, equal inner dims)
``uint16`` with field metadata ``seqstore.dtype=bfloat16``      ``bfloat16`` (what :func:`read` returns)
Ray's pickled-object column of numpy arrays (how Ray keeps     their dtype (``bfloat16`` too) and shape;
``ml_dtypes.bfloat16`` arrays)                                 converted one record at a time
``string`` / ``large_string`` / integer                         record ids, when named by ``id_column``
=============================================================  =========================================

A block whose column holds equal-length rows as a fixed-shape tensor writes into a ragged field (Ray
turns a batch of equal shapes into a fixed-shape tensor), and variable-shaped tensors whose shapes all
agree write into a fixed field. Pass ``schema=`` to fix the fields instead of inferring them.
"""

from __future__ import annotations

import importlib
import math
import os
import pickle
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import ray
    import ray.data
    from ray.data.block import Block, BlockAccessor, BlockMetadata
    from ray.data.datasource import Datasink, Datasource, ReadTask
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("seqstore.ray needs Ray Data: pip install 'seqstore[ray]'") from exc

from ..data import StoreDataset
from ..errors import SchemaError, SeqstoreError
from ..format.manifest import Manifest
from ..interop import to_arrow
from ..interop.arrow import (
    _convert,
    _first_inner_len,
    _fixed_shape,
    _flatten_fixed,
    _id_strings,
    _Plan,
    _plan,
    _storage_array,
    _storage_type,
)
from ..io.objects import is_remote
from ..order import ordering_needs_lengths
from ..schema import BFLOAT16, Field, Schema
from ..store import Store, open_store
from ..store.parts import Part, PartWriter, commit_parts, discard_parts, pending_jobs, prepare_store

__all__ = ["write", "read", "infer_schema", "block_columns", "BFLOAT16_METADATA"]

pa: Any = importlib.import_module("pyarrow")  # by name: pyarrow ships no type information

#: Arrow field metadata that marks a ``uint16`` column as bfloat16 bits (written by :func:`read`,
#: recognised by :func:`write`).
BFLOAT16_METADATA = {b"seqstore.dtype": b"bfloat16"}

_RAY_TENSOR = ("ray.data.arrow_tensor", "ray.data.arrow_tensor_v2")
_RAY_VAR_TENSOR = "ray.data.arrow_variable_shaped_tensor"
_RAY_OBJECT = "ray.data.arrow_pickled_object"
_ARROW_TENSOR = "arrow.fixed_shape_tensor"
_MODES = ("create", "append", "overwrite")
#: rows of the dataset read on the driver to infer a schema whose Arrow types leave dimensions open
_PEEK_ROWS = 256
#: target bytes of one block that a read task yields
_BLOCK_BYTES = 64 << 20
_WHERE = "Ray Dataset"
#: attempts (0.2 s apart) to remove a failed job's parts while its cancelled tasks stop
_DISCARD_TRIES = 50


# ------------------------------------------------------------------------------------------ types


def _ext(t: Any) -> str | None:
    return str(t.extension_name) if isinstance(t, pa.ExtensionType) else None


def _is_bf16(field: Any) -> bool:
    md = field.metadata or {}
    return bool(md.get(b"seqstore.dtype") == b"bfloat16")


def _value_dtype(t: Any, name: str) -> str:
    fixed = _fixed_shape(t)
    if fixed is None or fixed[1]:
        raise SchemaError(f"{_WHERE}, column {name!r}: tensor elements of Arrow type {t} are not numbers")
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
        raise SchemaError(f"{_WHERE}, column {name!r}: has {arr.null_count} null values; seqstore fields have no nulls")
    return arr


def _numpy(arr: Any, name: str) -> np.ndarray[Any, Any]:
    if arr.null_count:
        raise SchemaError(f"{_WHERE}, column {name!r}: has {arr.null_count} null tensor elements")
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def _var_parts(arr: Any, ndim: int, name: str) -> tuple[Any, np.ndarray[Any, Any]]:
    """(flat data array, (n, ndim) int64 shapes) of a Ray variable-shaped tensor array."""
    data, shape = arr.storage.flatten()  # struct children, sliced to the array's rows
    if shape.null_count or data.null_count:
        raise SchemaError(f"{_WHERE}, column {name!r}: has null tensors")
    dims = np.asarray(shape.value_lengths().to_numpy(zero_copy_only=False))
    if len(dims) and (dims != ndim).any():
        raise SchemaError(f"{_WHERE}, column {name!r}: a tensor has {int(dims[dims != ndim][0])} dims, "
                          f"its type says {ndim}")
    shapes = _numpy(shape.flatten(), name).astype(np.int64, copy=False).reshape(len(arr), ndim)
    return data.flatten(), shapes


def _objects(arr: Any, name: str) -> list[np.ndarray[Any, Any]]:
    """The numpy arrays of a Ray pickled-object column (one unpickling per record: Ray's representation)."""
    out = []
    for k, raw in enumerate(arr.storage.to_pylist()):
        value = np.asarray(pickle.loads(raw))  # noqa: S301 - the column is Ray's own pickled objects
        if value.dtype.kind not in "biuf" and value.dtype.name != BFLOAT16:
            raise SchemaError(f"{_WHERE}, column {name!r}, row {k}: holds {type(value).__name__} of dtype "
                              f"{value.dtype}, not numbers")
        out.append(value)
    return out


def _object_dtype(values: Sequence[np.ndarray[Any, Any]]) -> str:
    dt = values[0].dtype
    return BFLOAT16 if dt.name == BFLOAT16 else str(dt)


def _infer_field(name: str, field: Any, sample: Any) -> Field:
    """The field of one column: from its Arrow type, and from the rows of ``sample`` (an array of the
    first rows, or None) where the type leaves inner dimensions open. A uint16 column marked with
    :data:`BFLOAT16_METADATA` is bfloat16."""
    f = _infer_type(name, field.type, sample)
    if _is_bf16(field) and f.dtype == "<u2":
        return Field(BFLOAT16, f.shape)
    return f


def _infer_type(name: str, t: Any, sample: Any) -> Field:
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
                raise SchemaError(f"{_WHERE}, column {name!r}: variable-shaped {t.ndim}-d tensors and no rows to "
                                  f"read their inner dims from; pass schema={{{name!r}: Field(dtype, (None, ...))}}")
            inner = shapes[0, 1:]
            bad = np.flatnonzero((shapes[:, 1:] != inner).any(axis=1))
            if len(bad):
                raise SchemaError(
                    f"{_WHERE}, column {name!r}: rows have shapes {tuple(shapes[0])} and {tuple(shapes[bad[0]])}; a "
                    "ragged field varies in its first dim only"
                )
            return Field(dtype, (None, *(int(s) for s in inner)))
        if ext == _RAY_OBJECT:
            values = _objects(_whole(sample, name), name) if sample is not None else []
            if not values:
                raise SchemaError(f"{_WHERE}, column {name!r}: pickled objects and no rows to infer a field from; "
                                  f"pass schema={{{name!r}: Field(...)}}")
            kinds = {v.shape for v in values}
            if len(kinds) == 1:
                return Field(_object_dtype(values), values[0].shape)
            if len({s[1:] for s in kinds}) == 1 and all(len(s) >= 1 for s in kinds):
                return Field(_object_dtype(values), (None, *values[0].shape[1:]))
            raise SchemaError(f"{_WHERE}, column {name!r}: arrays of shapes {sorted(kinds)[:3]} are neither one "
                              "shape nor one shape but the first dim")
        st = _storage_type(t)
        if (pa.types.is_list(st) or pa.types.is_large_list(st)) and pa.types.is_null(st.value_type):
            raise SchemaError(f"{_WHERE}, column {name!r}: the first rows hold only empty lists (Arrow type {t}), "
                              f"which tell no dtype; pass schema={{{name!r}: Field(dtype, (None, ...))}}")
        try:
            plan = _plan(_WHERE, name, t)
        except SchemaError:
            raise SchemaError(
                f"{_WHERE}, column {name!r}: Arrow type {t} has no seqstore field (numbers, fixed-size lists, lists "
                "and Ray tensors of numbers are; a string column can be the id column); pass schema= naming the "
                "columns to write, or drop the column (ds.drop_columns)"
            ) from None
        dtype = plan.dtype
        shape = plan.shape
        if shape and shape[0] is None:  # list<list<T>>: the inner list length from the first rows
            inner_len = _first_inner_len(_whole(sample, name)) if sample is not None else None
            if inner_len is None:
                raise SchemaError(f"{_WHERE}, column {name!r}: lists of lists and no inner list to read their "
                                  f"length from; pass schema={{{name!r}: Field(dtype, (None, k))}}")
            shape = (inner_len, *shape[1:])
        return Field(dtype, ((None,) if plan.ragged else ()) + tuple(int(s or 0) for s in shape))
    except SchemaError as e:
        if str(e).startswith(_WHERE):
            raise
        raise SchemaError(f"{_WHERE}, column {name!r}: {e}") from e


def infer_schema(
    arrow_schema: Any, sample: Any = None, *, id_column: str | None = None, columns: Sequence[str] | None = None
) -> Schema:
    """The store schema for a Dataset's columns: ``arrow_schema`` (a ``pyarrow.Schema``) and, for types
    that leave inner dims open, the rows of ``sample`` (a ``pyarrow.Table`` of the first rows). Every
    column but ``id_column`` (or those in ``columns``) becomes a field of its own name. Raises
    :class:`SchemaError` naming the column for a type with no field."""
    names = list(arrow_schema.names)
    if id_column is not None and id_column not in names:
        raise SchemaError(f"{_WHERE}: no id column {id_column!r}; columns are {names}")
    wanted = [c for c in (names if columns is None else columns) if c != id_column]
    if not wanted:
        raise SchemaError(f"{_WHERE}: no columns to write (columns are {names}, id column {id_column!r})")
    spec = {}
    for c in wanted:
        if c not in names:
            raise SchemaError(f"{_WHERE}: no column {c!r}; columns are {names}")
        col = sample.column(c) if sample is not None and c in sample.column_names else None
        spec[c] = _infer_field(c, arrow_schema.field(c), col)
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
        flat = _numpy(_storage_array(arr).flatten(), name)
        return flat.reshape(n, *t.shape), None
    if ext == _ARROW_TENSOR:
        if t.permutation is not None and list(t.permutation) != list(range(len(t.shape))):
            raise SchemaError(f"{_WHERE}, column {name!r}: tensors with permutation {t.permutation} are not "
                              "supported (store them row-major)")
        return _flatten_fixed(arr.storage, _WHERE, name).reshape(n, *t.shape), None
    if ext == _RAY_VAR_TENSOR:
        ndim = int(t.ndim)
        data, shapes = _var_parts(arr, ndim, name)
        flat = _numpy(data, name)
        if ndim == 1:
            return flat, shapes[:, 0]
        row = shapes[0, 1:] if n else np.zeros(ndim - 1, np.int64)
        bad = np.flatnonzero((shapes[:, 1:] != row).any(axis=1))
        if len(bad):
            raise SchemaError(f"{_WHERE}, column {name!r}: rows have shapes {tuple(shapes[0])} and "
                              f"{tuple(shapes[bad[0]])}; a ragged field varies in its first dim only")
        lengths = shapes[:, 0]
        return flat.reshape(int(lengths.sum()), *(int(s) for s in row)), lengths
    if ext == _RAY_OBJECT:
        values = _objects(arr, name)
        kinds = {v.shape for v in values}
        if len(kinds) <= 1:
            return (np.stack(values) if values else np.empty((0,))), None
        if any(len(s) == 0 for s in kinds) or len({s[1:] for s in kinds}) != 1:
            raise SchemaError(f"{_WHERE}, column {name!r}: arrays of shapes {sorted(kinds)[:3]} are neither one "
                              "shape nor one shape but the first dim")
        return np.concatenate(values), np.array([v.shape[0] for v in values], dtype=np.int64)
    st = _storage_type(t)
    if (pa.types.is_list(st) or pa.types.is_large_list(st)) and pa.types.is_null(st.value_type):
        lengths = np.asarray(_storage_array(arr).value_lengths().to_numpy(zero_copy_only=False), dtype=np.int64)
        if lengths.any():  # lists of nulls
            raise SchemaError(f"{_WHERE}, column {name!r}: lists hold null values; seqstore fields have no nulls")
        return np.empty((0,)), lengths  # only empty lists: no dtype, nothing to store
    plan = _plan(_WHERE, name, t)
    if not plan.ragged:
        return _flatten_fixed(arr, _WHERE, name).reshape(n, *(int(s or 0) for s in plan.shape)), None
    inner: tuple[int, ...]
    if plan.shape and plan.shape[0] is None:
        first = _first_inner_len(arr)
        inner = (first or 0, *(int(s or 0) for s in plan.shape[1:]))
    else:
        inner = tuple(int(s or 0) for s in plan.shape)
    values, lengths = _convert(_storage_array(arr), _Plan(True, plan.dtype, plan.shape), inner, _WHERE, name)
    return values, lengths


def _fit(name: str, f: Field, view: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None], n: int) -> Any:
    """A column view as ``append_batch`` wants it for field ``f``, or a SchemaError naming the column."""
    values, lengths = view
    inner = f.inner_shape
    if lengths is not None and values.size == 0 and not lengths.any():
        values = np.empty((0, *inner), dtype=f.storage_dtype)  # only empty rows: any inner shape fits
    if f.ragged:
        if lengths is None:  # one shape per row: (n, L, *inner) -> n rows of L each
            if values.ndim < 1 + 1 or values.shape[2:] != inner:
                raise SchemaError(f"{_WHERE}, column {name!r}: rows of shape {values.shape[1:]} do not fit field "
                                  f"{f.shape} (ragged rows of shape {inner})")
            length = values.shape[1]
            return values.reshape(n * length, *inner), np.full(n, length, dtype=np.int64)
        if values.shape[1:] != inner:
            raise SchemaError(f"{_WHERE}, column {name!r}: rows of shape {values.shape[1:]} do not fit field "
                              f"{f.shape} (ragged rows of shape {inner})")
        return values, lengths
    if lengths is None:
        if values.shape[1:] != inner:
            raise SchemaError(f"{_WHERE}, column {name!r}: records of shape {values.shape[1:]} do not fit field "
                              f"{f.shape}")
        return values
    bad = np.flatnonzero(lengths != (inner[0] if inner else -1))
    if len(bad) or values.shape[1:] != inner[1:]:
        k = int(bad[0]) if len(bad) else 0
        raise SchemaError(f"{_WHERE}, column {name!r}: record {k} has shape {(int(lengths[k]), *values.shape[1:])}, "
                          f"field {f.shape} is fixed (pass schema= with a ragged field (None, ...))")
    return values.reshape(n, *inner)


def block_columns(table: Any, schema: Schema, id_column: str | None) -> tuple[dict[str, Any], list[str] | None]:
    """One block (a ``pyarrow.Table``) as ``append_batch`` arguments: (columns, ids)."""
    n = table.num_rows
    cols = {}
    for name, f in schema.items():
        if name not in table.column_names:
            raise SchemaError(f"{_WHERE}: block has no column {name!r} (columns {table.column_names}); "
                              f"the store's fields are {list(schema)}")
        cols[name] = _fit(name, f, _view(table.column(name), name), n)
    ids = _id_strings(table.column(id_column), _WHERE, id_column) if id_column is not None else None
    return cols, ids


# ------------------------------------------------------------------------------------------ write


if TYPE_CHECKING:
    _SinkBase = Datasink[tuple[int, Part]]
else:  # Ray < 2.43: Datasink is not generic
    _SinkBase = Datasink


class _StoreDatasink(_SinkBase):
    """Writes blocks as parts of job ``self.job``; the driver commits the reported parts at once."""

    def __init__(
        self,
        root: str,
        schema: Schema,
        *,
        id_column: str | None,
        mode: str,
        shard_bytes: int,
        max_shard_records: int,
        metadata: Mapping[str, Any] | None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.root = root
        self.storage_options = dict(storage_options) if storage_options else None
        self.schema = schema
        self.id_column = id_column
        self.mode = mode
        self.shard_bytes = shard_bytes
        self.max_shard_records = max_shard_records
        self.metadata = dict(metadata) if metadata is not None else None
        self.job = f"ray-{uuid.uuid4().hex[:16]}"
        self._prepared = False
        self.records = 0

    def get_name(self) -> str:
        return "Seqstore"

    def _prepare(self) -> None:
        if not self._prepared:
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
                cols, ids = block_columns(table, self.schema, self.id_column)
                writer.append_batch(cols, ids=ids)
            part = writer.finish()
        except BaseException:
            writer.abort()
            raise
        return task, part

    def on_write_complete(self, write_result: Any) -> None:
        self._prepare()  # an empty dataset starts no write task
        reported = sorted((r for r in write_result.write_returns if r is not None), key=lambda r: r[0])
        self.records = commit_parts(self.root, [part for _, part in reported],
                                    mode="overwrite" if self.mode == "overwrite" else "append",
                                    storage_options=self.storage_options)
        # attempts that died or were retried, never reported
        discard_parts(self.root, self.job, storage_options=self.storage_options)

    def on_write_failed(self, error: Exception) -> None:
        if not self._prepared:
            return
        # Ray cancels the job's running tasks as it fails; one still stopping holds its part (a live
        # PartWriter, which discard_parts leaves alone): try again while it aborts
        for _ in range(_DISCARD_TRIES):
            discard_parts(self.root, self.job, storage_options=self.storage_options)
            if self.job not in pending_jobs(self.root, storage_options=self.storage_options):
                break
            time.sleep(0.2)
        if is_remote(self.root):
            if self.mode == "create":  # the store this job created, if still empty
                from ..store.parts import remove_if_empty

                remove_if_empty(self.root, storage_options=self.storage_options)
            return
        if self.mode == "create" and self._created_empty():
            shutil.rmtree(self.root, ignore_errors=True)  # the store this job created, still empty

    def _created_empty(self) -> bool:
        root = Path(self.root)
        try:
            return Manifest.load(root).num_shards == 0 and not pending_jobs(root)
        except (OSError, SeqstoreError):
            return False


def _check_mode(mode: str) -> str:
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    return mode


def _given_schema(schema: Mapping[str, Any] | Schema) -> Schema:
    return schema if isinstance(schema, Schema) else Schema(schema)


def write(
    ds: Any,
    path: str | os.PathLike[str],
    *,
    schema: Mapping[str, Any] | Schema | None = None,
    id_column: str | None = None,
    shard_bytes: int = 1 << 30,
    max_shard_records: int = 1 << 24,
    mode: str = "create",
    metadata: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    preserve_order: bool = True,
    concurrency: int | None = None,
    ray_remote_args: Mapping[str, Any] | None = None,
) -> int:
    """Write the ``ray.data.Dataset`` ``ds`` into the store at ``path`` in parallel; return the number
    of records written.

    Every write task writes its blocks as shard(s) of its own (``shard_bytes`` / ``max_shard_records``
    bound one shard); the driver commits the tasks' shards with one manifest commit when the whole
    Dataset is written: the rows appear at once, or, when the job fails, not at all (the job's shards
    are removed). ``mode``: ``"create"`` (a new store; an existing path is an error), ``"append"`` (the
    store must exist with the same schema) or ``"overwrite"`` (the commit replaces all records).

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
    mode = _check_mode(mode)
    if storage_options and not is_remote(path):
        raise ValueError(f"{path}: storage_options are for URLs of object storage, not local paths")
    if shard_bytes <= 0 or max_shard_records <= 0:
        raise ValueError("shard_bytes and max_shard_records must be positive")
    root = os.fspath(path)
    if schema is not None:
        sch = _given_schema(schema)
        known = ds.schema(fetch_if_missing=False)  # no execution: None when Ray does not know it yet
        names = set(known.names) if known is not None else set()
        missing = [c for c in [*sch, *([id_column] if id_column else [])] if names and c not in names]
        if missing:
            raise SchemaError(f"{_WHERE}: no column(s) {missing}; columns are {sorted(names)}")
    else:
        try:
            sample = ds.limit(_PEEK_ROWS).take_batch(_PEEK_ROWS, batch_format="pyarrow")
        except ValueError:  # Ray: "The dataset is empty."
            sample = None
        if sample is None or sample.num_rows == 0:
            raise SchemaError(f"{_WHERE} is empty: no rows to infer fields from; pass schema= ({root})")
        sch = infer_schema(sample.schema, sample, id_column=id_column)
    sink = _StoreDatasink(root, sch, id_column=id_column, mode=mode, shard_bytes=shard_bytes,
                          max_shard_records=max_shard_records, metadata=metadata, storage_options=storage_options)
    options = ds.context.execution_options
    before = options.preserve_order
    options.preserve_order = before or preserve_order  # for this write only
    try:
        ds.write_datasink(sink, ray_remote_args=dict(ray_remote_args or {}), concurrency=concurrency)
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


def _read_range(store: Store, source: StoreDataset | None, epoch: int, start: int, stop: int, block: int,
                fields: list[str], id_column: str | None, bfloat16: str) -> Iterable[Any]:
    """Blocks of records ``[start, stop)`` (the store's order; ``source`` None) or of positions
    ``[start, stop)`` of ``source``'s order of epoch ``epoch``, ``block`` records each."""
    order = source.epoch_order(epoch) if source is not None else None  # O(1): a lazy order
    for a in range(start, stop, block):
        b = min(a + block, stop)
        idx = np.arange(a, b, dtype=np.int64) if order is None else order.take(np.arange(a, b, dtype=np.int64))
        yield _table(store, idx, fields, id_column, bfloat16)


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

            def fn(a: int = a, b: int = b) -> Iterable[Any]:
                return _read_range(self.store, self.source, self.epoch, a, b, self.block_records, self.fields,
                                   self.id_column, self.bfloat16)

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


def read(
    path: str | os.PathLike[str],
    *,
    fields: Sequence[str] | None = None,
    ordering: Any = None,
    epoch: int = 1,
    seed: int = 0,
    partition_epoch: int = 1,
    length_field: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    id_column: str | None = None,
    bfloat16: str = "bits",
    block_records: int | None = None,
    preserve_order: bool = True,
    override_num_blocks: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Any:
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
    if block_records is not None and block_records <= 0:
        raise ValueError(f"block_records must be positive, got {block_records}")
    store = open_store(path, storage_options=dict(storage_options) if storage_options else None)
    names = list(store.schema) if fields is None else list(fields)
    for name in names:
        if name not in store.schema:
            raise KeyError(f"no field {name!r} in {store.url}; fields are {list(store.schema)}")
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
