"""Import Arrow IPC and Parquet data (incl. Hugging Face ``datasets`` ``save_to_disk`` directories) into a store.

Record batches are streamed with pyarrow (Arrow files are memory-mapped, Parquet is read in batches of
about ``chunk_bytes``) and appended with one ``append_batch`` per chunk; nothing is held per record
except one chunk's ids. Column types map to fields as follows:

================================================  ==================================================
Arrow type                                        field
================================================  ==================================================
integer, floating (incl. float16), bool           fixed scalar, shape ``()``
``fixed_size_list<T>[k]`` (nested: ``[k][m]``)    fixed ``(k,)`` / ``(k, m)``
``list<T>`` / ``large_list<T>``                   ragged ``(None,)``
``list<fixed_size_list<T>[k]>``                   ragged ``(None, k)``
``list<list<T>>`` (HF ``Sequence(Sequence(..))``)  ragged ``(None, k)`` when every inner list has the
                                                  same length ``k`` (checked per chunk)
``string`` / ``large_string`` / integer           record ids, when named by ``id_column``
extension types (HF ``Array2D``, ...)             as their storage type
================================================  ==================================================

Anything else (strings other than the id column, structs, maps, binary) is an error that names the
column; pick columns with ``columns={"col": "field"}`` (CLI ``--map col=field``). Nulls are errors.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SchemaError
from ..io.objects import is_remote
from ..schema import Field, Schema
from ..store import Store, Writer, open_store
from ._common import DEFAULT_CHUNK_BYTES, Progress, SourceFormatError, announce_total, new_store, split_by_budget

__all__ = ["import_arrow", "import_parquet", "arrow_sources", "METADATA_KEY"]

#: Key of the import information (source files, column map, id column) in the store's metadata.
METADATA_KEY = "arrow"
#: A parallel import gives each worker's unit at least this many records (fewer in all: one process).
MIN_UNIT_RECORDS = 1 << 15


def _pa() -> Any:
    try:  # imported by name: pyarrow ships no type information, and is optional
        pyarrow = importlib.import_module("pyarrow")
        importlib.import_module("pyarrow.ipc")
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("Arrow/Parquet import needs pyarrow: pip install 'seqstore[arrow]'") from exc
    return pyarrow


# ------------------------------------------------------------------------------------------ plans


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How one column becomes a field: ``ragged`` or fixed, numpy dtype, row/record shape (``None``
    for an inner list length still to be read from the data), and the nesting of the Arrow type."""

    ragged: bool
    dtype: str
    shape: tuple[int | None, ...]

    def field(self) -> Field:
        return Field(self.dtype, ((None,) if self.ragged else ()) + tuple(int(s or 0) for s in self.shape))


def _storage_type(t: Any) -> Any:
    pa = _pa()
    while isinstance(t, pa.ExtensionType):
        t = t.storage_type
    return t


def _primitive_dtype(t: Any) -> str | None:
    pa = _pa()
    t = _storage_type(t)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return str(np.dtype(t.to_pandas_dtype()))
    return None


def _fixed_shape(t: Any) -> tuple[str, tuple[int, ...]] | None:
    """(dtype, shape) of a primitive or nested fixed-size list type, else None."""
    pa = _pa()
    t = _storage_type(t)
    prim = _primitive_dtype(t)
    if prim is not None:
        return prim, ()
    if pa.types.is_fixed_size_list(t):
        inner = _fixed_shape(t.value_type)
        if inner is not None:
            return inner[0], (int(t.list_size), *inner[1])
    return None


def _is_var_list(t: Any) -> bool:
    pa = _pa()
    t = _storage_type(t)
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _plan(path: str, column: str, t: Any) -> _Plan:
    """The field a column of Arrow type ``t`` becomes; SchemaError naming file and column otherwise."""
    fixed = _fixed_shape(t)
    if fixed is not None:
        return _Plan(False, fixed[0], fixed[1])
    st = _storage_type(t)
    if _is_var_list(st):
        inner = _fixed_shape(st.value_type)
        if inner is not None:
            return _Plan(True, inner[0], inner[1])
        vt = _storage_type(st.value_type)
        if _is_var_list(vt):
            leaf = _fixed_shape(vt.value_type)
            if leaf is not None:
                return _Plan(True, leaf[0], (None, *leaf[1]))
    raise SchemaError(
        f"{path}, column {column!r}: Arrow type {t} has no seqstore field (numbers, fixed-size lists and lists "
        "of those are supported; a string column can be the id column); choose columns with "
        "columns={column: field}"
    )


# ---------------------------------------------------------------------------------------- sources


def arrow_sources(path: str | os.PathLike[str], fmt: str) -> list[Path]:
    """The files behind ``path``: the file itself, or for a directory its ``.arrow``/``.parquet`` files —
    in ``state.json`` order for a Hugging Face ``save_to_disk`` directory, else sorted by name."""
    p = Path(path)
    if not p.is_dir():
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
        return [p]
    if (p / "dataset_dict.json").exists():
        splits = json.loads((p / "dataset_dict.json").read_text()).get("splits", [])
        example = p / (splits or ["train"])[0]
        raise SourceFormatError(p, None, f"is a DatasetDict; import one split directory, e.g. {example}")
    state = p / "state.json"
    if state.exists():
        files = [f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
        if files:
            return [p / f for f in files]
    ext = ".parquet" if fmt == "parquet" else ".arrow"
    found = sorted(q for q in p.iterdir() if q.suffix == ext)
    if not found:
        raise SourceFormatError(p, None, f"directory holds no {ext} files")
    return found


class _Source:
    """One Arrow IPC (file or stream format, memory-mapped) or Parquet file: schema and batch iterator."""

    def __init__(self, path: Path, fmt: str) -> None:
        pa = _pa()
        self.path = str(path)
        self.fmt = fmt
        try:
            if fmt == "parquet":
                pq = importlib.import_module("pyarrow.parquet")
                self._pf = pq.ParquetFile(self.path)
                self.schema = self._pf.schema_arrow
                md = self._pf.metadata
                self.num_rows = int(md.num_rows)
                size = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
                self.row_bytes = max(1, size // max(1, self.num_rows))
            else:
                self._mm = pa.memory_map(self.path, "r")
                try:
                    self._reader: Any = pa.ipc.open_file(self._mm)
                    self._stream = False
                except pa.ArrowInvalid:
                    self._mm.seek(0)
                    self._reader = pa.ipc.open_stream(self._mm)
                    self._stream = True
                self.schema = self._reader.schema
        except (OSError, pa.ArrowException) as exc:
            raise SourceFormatError(self.path, None, f"cannot read as {fmt}: {exc}") from exc

    def count_rows(self) -> int:
        """Records in the file: Parquet's footer; for Arrow IPC the record batches' lengths (metadata
        only: the mapped bodies are not read)."""
        if self.fmt == "parquet":
            return self.num_rows
        pa = _pa()
        try:
            if self._stream:
                self._mm.seek(0)
                return sum(b.num_rows for b in pa.ipc.open_stream(self._mm))
            return sum(self._reader.get_batch(i).num_rows for i in range(self._reader.num_record_batches))
        except (OSError, pa.ArrowException) as exc:
            raise SourceFormatError(self.path, None, f"cannot read record batches: {exc}") from exc

    def pieces(self) -> list[int]:
        """Rows of each piece the file can be read by on its own (parallel convert): Parquet row groups,
        Arrow IPC file record batches; an IPC stream is one piece (it can only be read from the start)."""
        if self.fmt == "parquet":
            md = self._pf.metadata
            return [int(md.row_group(i).num_rows) for i in range(md.num_row_groups)]
        if self._stream:
            return [self.count_rows()]
        return [int(self._reader.get_batch(i).num_rows) for i in range(self._reader.num_record_batches)]

    def batches(self, columns: list[str], chunk_bytes: int, pieces: tuple[int, int] | None = None) -> Iterator[Any]:
        """Record batches of the named columns, from the start of the file on every call (or of the
        pieces ``[a, b)`` of :meth:`pieces`)."""
        pa = _pa()
        try:
            if self.fmt == "parquet":
                rows = int(min(max(chunk_bytes // self.row_bytes, 1), 1 << 20))
                groups = None if pieces is None else list(range(*pieces))
                yield from self._pf.iter_batches(batch_size=rows, columns=columns, row_groups=groups)
            elif self._stream:  # a stream reader is single-pass: every walk starts a new one on the mapping
                self._mm.seek(0)
                for b in pa.ipc.open_stream(self._mm):
                    yield b.select(columns)
            else:
                a, b = (0, self._reader.num_record_batches) if pieces is None else pieces
                for i in range(a, b):
                    yield self._reader.get_batch(i).select(columns)
        except (OSError, pa.ArrowException) as exc:
            raise SourceFormatError(self.path, None, f"cannot read record batches: {exc}") from exc


def _chunks(src: _Source, columns: list[str], chunk_bytes: int, pieces: tuple[int, int] | None = None) -> Iterator[Any]:
    """Tables of about ``chunk_bytes`` (whole record batches, concatenated)."""
    pa = _pa()
    pending: list[Any] = []
    size = 0
    for b in src.batches(columns, chunk_bytes, pieces):
        if b.num_rows == 0:
            continue
        pending.append(b)
        size += b.nbytes
        if size >= chunk_bytes:
            yield pa.Table.from_batches(pending)
            pending, size = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


# -------------------------------------------------------------------------------------- converting


def _storage_array(arr: Any) -> Any:
    """``arr`` with extension types unwrapped (the array of their storage type)."""
    pa = _pa()
    while isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    return arr


def _array(col: Any, path: str, name: str) -> Any:
    """One contiguous Arrow array of a table column, extension types unwrapped, nulls rejected."""
    pa = _pa()
    arr = _storage_array(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    if arr.null_count:
        raise SchemaError(f"{path}, column {name!r}: has {arr.null_count} null values; seqstore fields have no nulls")
    return arr


def _flatten_fixed(arr: Any, path: str, name: str) -> np.ndarray[Any, Any]:
    """Leaf values of a primitive or (nested) fixed-size list array, flat, as numpy."""
    pa = _pa()
    while True:
        arr = _storage_array(arr)
        if not pa.types.is_fixed_size_list(arr.type):
            break
        if arr.null_count:
            raise SchemaError(f"{path}, column {name!r}: has null lists")
        arr = arr.flatten()
    if arr.null_count:
        raise SchemaError(f"{path}, column {name!r}: has {arr.null_count} null values")
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def _convert(arr: Any, plan: _Plan, inner: tuple[int, ...], path: str, name: str) -> Any:
    """A column array as ``append_batch`` wants it: (n, *shape) or a ``(values, lengths)`` pair."""
    n = len(arr)
    if not plan.ragged:
        return _flatten_fixed(arr, path, name).reshape(n, *inner)
    lengths = np.asarray(arr.value_lengths().to_numpy(zero_copy_only=False), dtype=np.int64)
    values = arr.flatten()
    if plan.shape and plan.shape[0] is None:  # list<list<...>>: every inner list must have length inner[0]
        if values.null_count:
            raise SchemaError(f"{path}, column {name!r}: has null inner lists")
        inner_len = np.asarray(values.value_lengths().to_numpy(zero_copy_only=False))
        bad = np.flatnonzero(inner_len != inner[0])
        if len(bad):
            raise SchemaError(
                f"{path}, column {name!r}: inner lists have length {int(inner_len[bad[0]])} and {inner[0]}; a ragged "
                "field needs rows of one shape"
            )
        values = values.flatten()
    flat = _flatten_fixed(values, path, name)
    return flat.reshape(int(lengths.sum()), *inner), lengths


def _first_inner_len(arr: Any) -> int | None:
    """The length of the first inner list of a list-of-lists array; None when its lists are all empty."""
    values = _storage_array(_storage_array(arr).flatten())
    if not len(values):
        return None
    return int(values.value_lengths()[0].as_py())


def _discover_inner(srcs: list[_Source], col: str, plan: _Plan, chunk_bytes: int) -> tuple[int, ...]:
    """Resolve a ``None`` inner dim (list of variable lists) from the first non-empty inner list."""
    if not plan.shape or plan.shape[0] is not None:
        return tuple(int(s or 0) for s in plan.shape)
    for src in srcs:
        for batch in src.batches([col], chunk_bytes):
            first = _first_inner_len(batch.column(0))
            if first is not None:
                return (first, *(int(s or 0) for s in plan.shape[1:]))
    return (0, *(int(s or 0) for s in plan.shape[1:]))


def _id_strings(col: Any, path: str, name: str) -> list[str]:
    """An id column of a batch as the str ids a writer takes: strings as they are, integers in decimal;
    SchemaError naming the column for nulls or any other type."""
    pa = _pa()
    arr = _array(col, path, name)
    if pa.types.is_integer(arr.type):
        arr = arr.cast(pa.string())
    elif not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        raise SchemaError(f"{path}, column {name!r}: ids must be strings or integers, got {arr.type}")
    ids: list[str] = arr.to_pylist()  # the writer's API takes Python str ids
    return ids


def _import(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    fmt: str,
    *,
    columns: Mapping[str, str] | None,
    id_column: str | None,
    chunk_bytes: int,
    shard_bytes: int,
    overwrite: bool,
    progress: Progress | None,
    workers: int = 1,
    storage_options: Mapping[str, Any] | None = None,
) -> Store:
    remote = is_remote(out)
    if storage_options and not remote:
        raise ValueError(f"{out}: storage_options are for URLs of object storage, not local paths")
    pa = _pa()
    given = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    if not given:
        raise ValueError(f"import_{fmt}: no sources given")
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    srcs = [_Source(f, fmt) for s in given for f in arrow_sources(s, fmt)]
    first = srcs[0]
    names = list(first.schema.names)
    if id_column is not None and id_column not in names:
        raise SchemaError(f"{first.path}: no id column {id_column!r}; columns are {names}")
    mapping = dict(columns) if columns is not None else {c: c for c in names if c != id_column}
    if not mapping:
        raise SchemaError(f"{first.path}: no columns to import")
    plans: dict[str, _Plan] = {}
    for col in mapping:
        if col not in names:
            raise SchemaError(f"{first.path}: no column {col!r}; columns are {names}")
        plans[col] = _plan(first.path, col, first.schema.field(col).type)
    if id_column is not None:
        t = _storage_type(first.schema.field(id_column).type)
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)):
            raise SchemaError(f"{first.path}, column {id_column!r}: ids must be strings or integers, got {t}")
    for src in srcs[1:]:  # every file must agree before anything is written
        for col in [*mapping, *([id_column] if id_column else [])]:
            if col not in src.schema.names:
                raise SchemaError(f"{src.path}: no column {col!r} (present in {first.path})")
            if col in plans and _plan(src.path, col, src.schema.field(col).type) != plans[col]:
                raise SchemaError(
                    f"{src.path}, column {col!r}: type {src.schema.field(col).type} differs from "
                    f"{first.schema.field(col).type} in {first.path}"
                )
    inner = {col: _discover_inner(srcs, col, p, chunk_bytes) for col, p in plans.items()}
    spec: dict[str, Field] = {}
    for col, field_name in mapping.items():
        if field_name in spec:
            raise SchemaError(f"two columns map to the field {field_name!r}")
        p = plans[col]
        try:
            spec[field_name] = Field(p.dtype, ((None,) if p.ragged else ()) + inner[col])
        except SchemaError as exc:
            raise SchemaError(f"{first.path}, column {col!r}: {exc}") from exc
    try:
        schema = Schema(spec)
    except SchemaError as exc:
        raise SchemaError(f"{exc}; rename columns with columns={{column: field}}") from exc
    meta = {
        "format": fmt, "files": [os.path.basename(s.path) for s in srcs], "columns": mapping, "id_column": id_column,
    }

    job = _ArrowJob(fmt, [s.path for s in srcs], mapping, plans, inner, id_column, chunk_bytes)
    total = sum(src.count_rows() for src in srcs)
    units = [(job, segs) for segs in _arrow_units(srcs, total, workers)] if workers > 1 or remote else []
    if len(units) > 1 or remote:  # a URL: always as parts (tasks upload, one commit)
        from ._parallel import convert_in_parallel

        return convert_in_parallel(out, schema, units, total, overwrite=overwrite, shard_bytes=shard_bytes,
                                   metadata={METADATA_KEY: meta}, workers=workers, progress=progress,
                                   storage_options=storage_options)

    def fill(writer: Writer) -> None:  # called once the output path is checked too
        announce_total(progress, total)
        job.write(writer, [(k, None) for k in range(len(srcs))], progress)

    new_store(out, schema, fill, overwrite=overwrite, shard_bytes=shard_bytes, metadata={METADATA_KEY: meta})
    return open_store(out)


@dataclasses.dataclass(frozen=True)
class _ArrowJob:
    """What a conversion needs to turn record batches into appends (picklable, for parallel workers)."""

    fmt: str
    paths: list[str]
    mapping: dict[str, str]
    plans: dict[str, _Plan]
    inner: dict[str, tuple[int, ...]]
    id_column: str | None
    chunk_bytes: int

    def write(
        self,
        writer: Writer,
        segments: Sequence[tuple[int, tuple[int, int] | None]],
        progress: Progress | None,
    ) -> None:
        """Append the records of ``segments`` (file number, pieces ``[a, b)`` or None for all), in order.
        Each file is opened afresh and let go after its segment: a ParquetFile that was read keeps
        hundreds of MB of Arrow buffers alive (the validation's sources are not reused for this)."""
        read_cols = [*self.mapping, *([self.id_column] if self.id_column else [])]
        for k, pieces in segments:
            src = _Source(Path(self.paths[k]), self.fmt)
            for table in _chunks(src, read_cols, self.chunk_bytes, pieces):
                batch = {
                    self.mapping[c]: _convert(_array(table.column(c), src.path, c), self.plans[c], self.inner[c],
                                              src.path, c)
                    for c in self.mapping
                }
                ids = None
                if self.id_column is not None:
                    ids = _id_strings(table.column(self.id_column), src.path, self.id_column)
                writer.append_batch(batch, ids=ids)
                if progress is not None:
                    progress(int(table.num_rows))


def _arrow_units(
    srcs: Sequence[_Source], total: int, workers: int
) -> list[list[tuple[int, tuple[int, int] | None]]]:
    """Cut the files' pieces, in order, into about ``4 x workers`` runs of similar row counts: each run
    (one part of a parallel convert) is a list of (file number, pieces [a, b))."""
    flat: list[tuple[int, int]] = []  # (file, piece)
    rows: list[int] = []
    for k, src in enumerate(srcs):
        for j, n in enumerate(src.pieces()):
            flat.append((k, j))
            rows.append(n)
    budget = max(MIN_UNIT_RECORDS, -(-total // (4 * workers)))
    units: list[list[tuple[int, tuple[int, int] | None]]] = []
    for a, b in split_by_budget(np.asarray(rows, dtype=np.int64), budget):
        segs: list[tuple[int, tuple[int, int] | None]] = []
        for k, j in flat[a:b]:
            if segs and segs[-1][0] == k and segs[-1][1] is not None and segs[-1][1][1] == j:
                segs[-1] = (k, (segs[-1][1][0], j + 1))
            else:
                segs.append((k, (j, j + 1)))
        units.append(segs)
    return units


def import_arrow(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    columns: Mapping[str, str] | None = None,
    id_column: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    shard_bytes: int = 1 << 30,
    overwrite: bool = False,
    progress: Progress | None = None,
    workers: int = 1,
    storage_options: Mapping[str, Any] | None = None,
) -> Store:
    """Import Arrow IPC files (file or stream format) or directories of them (e.g. a Hugging Face
    ``Dataset.save_to_disk`` directory) into one new store at ``out``, and open it.

    ``columns``: ``{column: field}`` to import (default: every column except ``id_column``, under its
    own name). ``id_column``: a string (or integer) column whose values become record ids. Records keep
    the files' order. All files' schemas are checked before the store is created; a failure while
    streaming deletes the new store (all or nothing). Files are memory-mapped and converted in chunks
    of about ``chunk_bytes``: O(chunk) memory. ``progress`` gets the records of each chunk (and, through
    ``add_total`` if it has one, the number of records in all files once they are validated).

    ``workers > 1`` converts in that many processes (record batches, or Parquet row groups, split into
    about ``4 x workers`` runs in file order, each written as a part, one commit at the end;
    docs/distributed.md): the same records in the same order, only the shard boundaries differ.

    ``out`` may be a URL of object storage (``s3://``, ``gs://``, ``az://``, with ``storage_options``):
    the workers upload their parts into the store and one commit makes them visible; a failure leaves
    no store (or the existing one, with ``overwrite``, as it was).
    """
    return _import(sources, out, "arrow", columns=columns, id_column=id_column, chunk_bytes=chunk_bytes,
                   shard_bytes=shard_bytes, overwrite=overwrite, progress=progress, workers=workers,
                   storage_options=storage_options)


def import_parquet(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    columns: Mapping[str, str] | None = None,
    id_column: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    shard_bytes: int = 1 << 30,
    overwrite: bool = False,
    progress: Progress | None = None,
    workers: int = 1,
    storage_options: Mapping[str, Any] | None = None,
) -> Store:
    """Import Parquet files (or directories of ``.parquet`` files) into one new store at ``out``; as
    :func:`import_arrow`, reading batches of about ``chunk_bytes`` (from the row groups' sizes)."""
    return _import(sources, out, "parquet", columns=columns, id_column=id_column, chunk_bytes=chunk_bytes,
                   shard_bytes=shard_bytes, overwrite=overwrite, progress=progress, workers=workers,
                   storage_options=storage_options)
