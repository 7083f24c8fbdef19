"""Import Hugging Face ``datasets`` into a store: a ``Dataset``, one split of a ``DatasetDict``, a
``save_to_disk`` directory, or an ``IterableDataset`` (streamed, never materialised).

The dataset is read in its ``"arrow"`` format (``ds.select_columns(...).with_format("arrow").iter(batch_size)``):
record batches as Arrow tables, slices of the memory-mapped files for a ``Dataset``, so nothing is
decoded to Python objects. Each batch is converted with the Arrow importer's column code
(:mod:`seqstore.interop.arrow`) and appended with one ``append_batch``; memory is O(batch) whatever
the size of the dataset. Columns map to fields as follows:

================================================  ==================================================
``datasets`` feature (Arrow storage)              field
================================================  ==================================================
``Value`` int/uint/float/bool, ``ClassLabel``     fixed scalar, shape ``()``
``List``/``Sequence`` of numbers, nested lists,   as :func:`~seqstore.interop.arrow.import_arrow`: ragged
``Array2D``..``Array5D``                          ``(None,)``/``(None, k)``, fixed ``(k,)``/``(k, m)``
``Value("string")``, ``Value("binary")``          ragged ``uint8`` ``(None,)``: the UTF-8 (or raw) bytes
``Audio``, ``Image``                              ragged ``uint8`` ``(None,)``: the encoded file bytes
                                                  (WAV, FLAC, PNG, ...), read with ``decode=False``
a string or integer column named by ``id_column``  record ids
================================================  ==================================================

Any other column (``Translation``, dicts of features, ...) raises :class:`~seqstore.errors.ColumnTypeError`
naming the column and its feature; leave it out or rename with ``columns``. Nulls are errors.
An ``Audio``/``Image`` value stored as a path only (no embedded bytes) is read from that file.
"""

from __future__ import annotations

import dataclasses
import importlib
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from ..errors import ColumnTypeError, SchemaError, SeqstoreError
from ..io.objects import is_remote
from ..store import Store, Writer
from . import arrow_columns, driver
from ._common import Progress, SourceFormatError, file_url_path

__all__ = ["import_hf", "datasets_module", "SplitError", "METADATA_KEY", "ITERABLE_BATCH_ROWS", "MIN_UNIT_ROWS"]

#: Key of the import information (source, split, column map, features) in the store's metadata.
METADATA_KEY = "hf"
#: Rows per batch of an ``IterableDataset`` when ``batch_size`` is not given (its size is unknown).
ITERABLE_BATCH_ROWS = 1024
#: Rows per unit of work of a parallel import at least (as the Arrow importer): a dataset of fewer than twice
#: as many rows is imported in one process whatever ``workers`` is.
MIN_UNIT_ROWS = 1 << 15
#: At most this many rows per batch of a ``Dataset`` (the batch otherwise holds about ``chunk_bytes``).
MAX_BATCH_ROWS = 1 << 20

SUPPORTED = (
    "numbers (Value int/uint/float/bool, ClassLabel) -> scalar fields; lists of numbers (List, Sequence, "
    "Array2D..5D) -> fixed or ragged fields; strings and binary -> uint8 byte fields or ids (id_column); "
    "Audio/Image -> their encoded bytes"
)


class SplitError(SeqstoreError, ValueError):
    """A ``DatasetDict`` was given without a split (or with one it does not have); ``splits`` lists
    the splits it has."""

    def __init__(self, message: str, splits: Sequence[str]) -> None:
        super().__init__(message)
        self.splits = list(splits)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.splits))


def datasets_module() -> Any:
    """The ``datasets`` module; ImportError naming the extra to install."""
    try:  # imported by name: optional, and without type information
        return importlib.import_module("datasets")
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the Hugging Face import needs the datasets package: pip install 'seqstore[hf]'") from exc


# ---------------------------------------------------------------------------------------- sources


def _resolve(source: Any, split: str | None) -> tuple[Any, str]:
    """The ``Dataset`` / ``IterableDataset`` to import and a name for it in messages."""
    hf = datasets_module()
    name = "dataset"
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(file_url_path(source))
        if not is_remote(path) and not os.path.isdir(path):
            raise FileNotFoundError(f"{path}: no such directory (expected a datasets save_to_disk directory)")
        pa = arrow_columns.pyarrow()
        try:
            source = hf.load_from_disk(path)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{path}: not a datasets save_to_disk directory ({exc})") from exc
        except (ValueError, TypeError, KeyError, AttributeError, OSError, pa.ArrowException) as exc:
            # (a damaged state.json, dataset_info.json or Arrow file: datasets' error names none of them)
            raise SourceFormatError(path, None, f"not a readable datasets save_to_disk directory: "
                                    f"{type(exc).__name__}: {exc}") from exc
        name = path
    if isinstance(source, (hf.DatasetDict, hf.IterableDatasetDict)):
        splits = list(source)
        if split is None:
            raise SplitError(f"{name}: is a DatasetDict with splits {splits}; choose one with split=NAME", splits)
        if split not in source:
            raise SplitError(f"{name}: has no split {split!r}; its splits are {splits}", splits)
        return source[split], f"{name}[{split}]"
    if not isinstance(source, (hf.Dataset, hf.IterableDataset)):
        raise TypeError("import_hf: expected a datasets.Dataset, DatasetDict, IterableDataset or the path of a "
                        f"save_to_disk directory, got {type(source).__name__}")
    if split is not None and str(source.split) != split:
        raise SplitError(f"{name}: split={split!r} was given, but this is one {type(source).__name__} (split "
                         f"{source.split}), not a DatasetDict", [str(source.split)])
    return source, name


def _arrow_native(ds: Any) -> bool:
    """Whether ``ds`` yields Arrow batches of its own: a ``Dataset``, or a stream over Arrow data
    (``Dataset.to_iterable_dataset()``, Parquet/Arrow files). A stream of Python examples
    (``from_generator``) is read as Python batches instead: ``datasets`` 5.2 builds its Arrow batches
    example by example and fails to concatenate them when the examples' inferred types differ (an empty
    list among full ones)."""
    hf = datasets_module()
    if isinstance(ds, hf.Dataset):
        return True
    return getattr(getattr(ds, "_ex_iterable", None), "iter_arrow", None) is not None


def _tables(ds: Any, columns: list[str], batch_rows: int, types: Mapping[str, Any], where: str) -> Iterator[Any]:
    """The named columns of ``ds`` as Arrow tables of ``batch_rows`` rows (the last may be shorter),
    from the start on every call. A stream of Python examples is converted batch by batch to the Arrow
    storage ``types`` (of its features, or inferred from its first batch: a batch's own inference would
    differ for a batch of empty lists, or of whole numbers in a float column); SchemaError naming the
    source ``where`` and the column for a value that does not convert."""
    sub = ds.select_columns(columns)
    if _arrow_native(ds):
        yield from sub.with_format("arrow").iter(batch_size=batch_rows)
        return
    pa = arrow_columns.pyarrow()
    for batch in sub.iter(batch_size=batch_rows):
        arrays = []
        for c in columns:
            try:
                arrays.append(pa.array(batch[c], type=types[c]))
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise SchemaError(f"{where}, column {c!r}: a batch of examples does not convert to {types[c]}, "
                                  f"the type of the first batch or the features ({exc})") from exc
        yield pa.table(arrays, names=columns)


def _arrow_schema(ds: Any, batch_rows: int) -> Any:
    """The Arrow schema of ``ds``: from its features, else (a stream of unknown features) as pyarrow
    infers it from the first batch."""
    pa = arrow_columns.pyarrow()
    if ds.features is not None:
        return ds.features.arrow_schema
    for batch in ds.iter(batch_size=batch_rows):
        return pa.table({c: pa.array(v) for c, v in batch.items()}).schema
    return pa.schema([])


def _batch_rows(ds: Any, chunk_bytes: int, batch_size: int | None) -> int:
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        return int(batch_size)
    hf = datasets_module()
    if isinstance(ds, hf.IterableDataset):
        return ITERABLE_BATCH_ROWS
    table = ds.data  # the whole table (memory-mapped for a saved dataset): its size costs no reading
    row_bytes = max(1, int(table.nbytes) // max(1, int(table.num_rows)))
    return int(min(max(chunk_bytes // row_bytes, 1), MAX_BATCH_ROWS))


# ------------------------------------------------------------------------------------------ columns


@dataclasses.dataclass(frozen=True)
class _Column:
    """How one column becomes a field: ``kind`` ``"arrow"`` (numbers and lists, by the Arrow importer's
    plan), ``"bytes"`` (string/binary values) or ``"encoded"`` (the ``bytes`` of an Audio/Image struct)."""

    name: str
    field: str
    kind: str
    plan: arrow_columns.Plan


def _is_bytes_type(t: Any) -> bool:
    pa = arrow_columns.pyarrow()
    t = arrow_columns.storage_type(t)
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t))


def _column(where: str, name: str, field: str, arrow_type: Any, feature: Any) -> _Column:
    """The plan of one column; ColumnTypeError naming it, its feature and what is supported otherwise."""
    hf = datasets_module()
    if isinstance(feature, (hf.Audio, hf.Image)):
        return _Column(name, field, "encoded", arrow_columns.Plan(True, "uint8", ()))
    if _is_bytes_type(arrow_type):
        return _Column(name, field, "bytes", arrow_columns.Plan(True, "uint8", ()))
    try:
        return _Column(name, field, "arrow", arrow_columns.plan_column(where, name, arrow_type))
    except SchemaError:
        described = repr(feature) if feature is not None else str(arrow_type)
        raise ColumnTypeError(f"{where}, column {name!r}: feature {described} has no seqstore field (supported: "
                              f"{SUPPORTED}); choose the columns to import with columns={{column: field}}", name,
                              described) from None


def _binary_values(arr: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A string/binary array as (the bytes of all values, one length per value), without copying."""
    pa = arrow_columns.pyarrow()
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint8), np.zeros(0, np.int64)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64 if large else np.int32)[arr.offset : arr.offset + n + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return data[int(offsets[0]) : int(offsets[-1])], np.diff(offsets).astype(np.int64)


def _encoded_bytes(arr: Any, where: str, name: str, base: int) -> Any:
    """The ``bytes`` child of an Audio/Image struct array; a value held as a path only is read from its file."""
    pa = arrow_columns.pyarrow()
    kids = {arr.type.field(i).name: child for i, child in enumerate(arr.flatten())}
    data = kids.get("bytes")
    if data is None:
        raise SchemaError(f"{where}, column {name!r}: Arrow type {arr.type} has no 'bytes' member")
    if not data.null_count:
        return data
    paths = kids.get("path")
    values: list[bytes | None] = data.to_pylist()
    for i, v in enumerate(values):
        if v is None:
            p = paths[i].as_py() if paths is not None else None
            if not p or not os.path.isfile(p):
                raise SchemaError(f"{where}, column {name!r}, record {base + i}: no embedded bytes, and its path "
                                  f"{p!r} is not a readable file (expected encoded audio/image bytes)")
            values[i] = Path(p).read_bytes()
    return pa.array(values, type=pa.large_binary())


def _values(table: Any, col: _Column, inner: tuple[int, ...], where: str, base: int) -> Any:
    """One column of a batch (records ``base``...) as ``append_batch`` takes it."""
    rows = f"{where}, records {base}..{base + int(table.num_rows) - 1}"
    arr = arrow_columns.column_array(table.column(col.name), rows, col.name)
    if col.kind == "arrow":
        return arrow_columns.convert_column(arr, col.plan, inner, rows, col.name)
    if col.kind == "encoded":
        arr = _encoded_bytes(arr, where, col.name, base)
    return _binary_values(arr)


# ------------------------------------------------------------------------------------------ writing


@dataclasses.dataclass(frozen=True)
class _HfJob:
    """What writing the records needs (picklable for a parallel import: a ``Dataset`` of memory-mapped
    files pickles as the files' paths). ``first``: the Arrow schema every batch of a stream without
    features must agree with (None for a typed dataset)."""

    ds: Any
    where: str
    read: list[str]
    cols: list[_Column]
    inner: dict[str, tuple[int, ...]]
    rows: int
    types: dict[str, Any]
    id_column: str | None
    first: Any

    def describe(self, segments: tuple[int, int] | None) -> str:
        return self.where if segments is None else f"{self.where} rows {segments[0]}..{segments[1] - 1}"

    def write(self, writer: Writer, segments: tuple[int, int] | None, progress: Progress | None) -> None:
        """Append the rows ``[a, b)`` of the dataset (``segments``; None: every row), in order."""
        ds, base = (self.ds, 0) if segments is None else (self.ds.select(range(*segments)), segments[0])
        where = self.where
        for table in _tables(ds, self.read, self.rows, self.types, where):
            n = int(table.num_rows)
            if n == 0:
                continue
            for c in self.cols:  # a stream's batches are typed one by one: each must agree with the first
                if self.first is not None and _column(where, c.name, c.field, table.schema.field(c.name).type,
                                                      None) != c:
                    raise SchemaError(f"{where}, column {c.name!r}, records {base}..{base + n - 1}: Arrow type "
                                      f"{table.schema.field(c.name).type} differs from "
                                      f"{self.first.field(c.name).type} of the first batch")
            batch = {c.field: _values(table, c, self.inner[c.name], where, base) for c in self.cols}
            ids = None if self.id_column is None else arrow_columns.id_strings(table.column(self.id_column), where,
                                                                               self.id_column)
            writer.append_batch(batch, ids=ids)
            base += n
            if progress is not None:
                progress(n)


def _file_backed(ds: Any) -> bool:
    """Whether every table of the ``Dataset`` is a memory-mapped Arrow file (a saved or cached dataset):
    then it is handed to a worker as the files' paths, not as its data. An indices mapping (``shuffle``,
    ``select``) goes along as it is: a cache file's path, or 8 bytes a row when it is held in memory."""
    tables = importlib.import_module("datasets.table")
    table = ds.data
    blocks = [b for row in table.blocks for b in row] if isinstance(table, tables.ConcatenationTable) else [table]
    return bool(blocks) and all(isinstance(b, tables.MemoryMappedTable) for b in blocks)


def _units(rows: int, workers: int) -> list[tuple[int, int]]:
    """Rows ``[a, b)`` of about ``rows / (2 x workers)`` each (at least :data:`MIN_UNIT_ROWS`), one part each."""
    if rows < 2 * MIN_UNIT_ROWS:
        return [(0, rows)]
    count = max(1, min(2 * workers, rows // MIN_UNIT_ROWS))
    bounds = [rows * k // count for k in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


# ------------------------------------------------------------------------------------------ import


def import_hf(
    source: Any,
    out: str | os.PathLike[str],
    *,
    split: str | None = None,
    columns: Mapping[str, str] | Sequence[str] | None = None,
    id_column: str | None = None,
    batch_size: int | None = None,
    **options: Unpack[driver.ImportOptions],
) -> Store:
    """Import a Hugging Face dataset into one new store at ``out``, and open it.

    ``source``: a ``datasets.Dataset``, an ``IterableDataset`` (streamed batch by batch, never held
    whole), a ``DatasetDict``/``IterableDatasetDict`` with ``split`` naming the split (without it:
    :class:`SplitError` listing the splits), or the path of a ``save_to_disk`` directory (either kind).
    ``columns``: ``{column: field}`` (or a list of column names) to import; default every column except
    ``id_column``, under its own name. ``id_column``: a string or integer column whose values become
    record ids. Column types map to fields as the module docs say; any other is a ColumnTypeError.

    Records keep the dataset's order (a ``Dataset``'s indices mapping, after ``shuffle``/``select``,
    included). Batches hold ``batch_size`` rows: by default about ``chunk_bytes`` of a ``Dataset``,
    :data:`ITERABLE_BATCH_ROWS` of a stream. ``progress`` gets the rows of each batch (and, through
    ``add_total``, the number of records of a ``Dataset`` up front). All or nothing; ``out`` may be a
    URL of object storage (``storage_options`` configure its client).

    ``workers > 1`` imports a ``Dataset`` of memory-mapped Arrow files (a ``save_to_disk`` directory, a
    dataset loaded or mapped into the cache) in runs of about ``rows / (2 x workers)`` rows (at least
    :data:`MIN_UNIT_ROWS`), one part each; a stream, a dataset held in memory (it would be pickled whole)
    and a small one are imported in this process. The other keywords:
    :class:`~seqstore.interop.driver.Options`.
    """
    opts = driver.options("import_hf", out, options, source)
    hf = datasets_module()
    ds, where = _resolve(source, split)
    rows = _batch_rows(ds, opts.chunk_bytes, batch_size)
    features = ds.features
    schema_pa = _arrow_schema(ds, rows)
    names = list(schema_pa.names)
    mapping = arrow_columns.column_map(where, names, columns, id_column)
    cols = [_column(where, name, field, schema_pa.field(name).type, features[name] if features is not None else None)
            for name, field in mapping.items()]
    if id_column is not None:
        arrow_columns.check_id_column(where, id_column, schema_pa.field(id_column).type)
    for c in cols:  # read Audio/Image as stored (bytes and path), never decoded
        if c.kind == "encoded" and features is not None and getattr(features[c.name], "decode", False):
            ds = ds.cast_column(c.name, dataclasses.replace(features[c.name], decode=False))
    types = {n: arrow_columns.storage_type(schema_pa.field(n).type) for n in names}  # features', or the first batch's
    # each field's row shape (a list of variable lists: the first non-empty inner list's length, read lazily)
    inner = {c.name: arrow_columns.resolve_inner(c.plan, (t.column(0).combine_chunks() for t in _tables(
        ds, [c.name], rows, types, where))) for c in cols}
    schema = arrow_columns.columns_schema(where, ((c.name, c.field, c.plan, inner[c.name]) for c in cols))
    meta = {"source": where, "split": split if split is not None else None if ds.split is None else str(ds.split),
            "columns": mapping, "id_column": id_column,
            "features": {c.name: repr(features[c.name]) if features is not None else None for c in cols}}
    total = len(ds) if isinstance(ds, hf.Dataset) else None
    read = [c.name for c in cols] + ([id_column] if id_column is not None and id_column not in mapping else [])
    job = _HfJob(ds, where, read, cols, inner, rows, types, id_column, schema_pa if features is None else None)
    splits = isinstance(ds, hf.Dataset) and _file_backed(ds)
    conv = driver.Conversion(schema, {METADATA_KEY: meta}, job, None, total,
                             (lambda w: [(job, u) for u in _units(len(ds), w)]) if splits else None, url_as_parts=False)
    return driver.write(conv, out, opts)
