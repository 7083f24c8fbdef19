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

import contextlib
import dataclasses
import importlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from ..errors import SchemaError
from ..store import Store, Writer
from . import driver
from ._common import Progress, SourceFormatError, split_by_budget
from .arrow_columns import (
    Plan,
    check_id_column,
    check_unique,
    column_array,
    column_map,
    columns_schema,
    convert_column,
    id_strings,
    plan_column,
    pyarrow,
    resolve_inner,
)

__all__ = ["import_arrow", "import_parquet", "arrow_sources", "METADATA_KEY"]

#: Key of the import information (source files, column map, id column) in the store's metadata.
METADATA_KEY = "arrow"
#: A parallel import gives each worker's unit at least this many records (fewer in all: one process).
MIN_UNIT_RECORDS = 1 << 15


def _plain(name: str) -> bool:
    """Whether ``name`` is a file name of its directory (not empty, no path separator, not ``..``)."""
    return name not in ("", ".", "..") and "/" not in name and os.sep not in name


def _json_object(path: Path) -> dict[str, Any]:
    """The JSON object in the file ``path``; SourceFormatError naming it for anything else."""
    try:
        value = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise SourceFormatError(path, None, f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise SourceFormatError(path, None, f"expected a JSON object, got {type(value).__name__}")
    return value


def arrow_sources(path: str | os.PathLike[str], fmt: str) -> list[Path]:
    """The files behind ``path``: the file itself, or for a directory its ``.arrow``/``.parquet`` files —
    in ``state.json`` order for a Hugging Face ``save_to_disk`` directory, else sorted by name."""
    p = Path(path)
    if not p.is_dir():
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
        return [p]
    if (p / "dataset_dict.json").exists():
        splits = _json_object(p / "dataset_dict.json").get("splits", [])
        if not isinstance(splits, list) or not all(isinstance(x, str) and _plain(x) for x in splits):
            raise SourceFormatError(p / "dataset_dict.json", None, f"splits should be a list of names, got {splits!r}")
        example = p / (splits or ["train"])[0]
        raise SourceFormatError(p, None, f"is a DatasetDict; import one split directory, e.g. {example}")
    state = p / "state.json"
    if state.exists():
        listed = _json_object(state).get("_data_files", [])
        if not isinstance(listed, list) or not all(
                isinstance(f, dict) and isinstance(f.get("filename"), str) and _plain(f["filename"]) for f in listed):
            raise SourceFormatError(state, None, '_data_files should be a list of {"filename": NAME} (files of the '
                                    f"directory), got {listed!r:.200}")
        files = [f["filename"] for f in listed]
        if len(set(files)) < len(files):  # datasets would read it twice: its records twice
            twice = next(f for k, f in enumerate(files) if f in files[:k])
            raise SourceFormatError(state, None, f"_data_files lists {twice!r} twice; each file of the dataset "
                                    "should be listed once")
        if files and fmt == "parquet":
            raise SourceFormatError(p, None, "is a Hugging Face datasets save_to_disk directory (Arrow files, not "
                                    "Parquet); import it with import_hf")
        for f in files:
            if not (p / f).is_file():
                raise FileNotFoundError(f"{p / f}: no such file, but {state} lists it in _data_files (a partial "
                                        "copy of the save_to_disk directory?)")
        if files:
            return [p / f for f in files]
    ext = ".parquet" if fmt == "parquet" else ".arrow"
    found = sorted(q for q in p.iterdir() if q.suffix == ext)
    if not found:
        raise SourceFormatError(p, None, f"directory holds no {ext} files")
    return found


def _unreadable(path: str, fmt: str, exc: BaseException) -> SourceFormatError:
    """The error for a file pyarrow cannot read as ``fmt``, naming the importer that reads it instead
    when it is an Arrow IPC file given as Parquet (or the other way round)."""
    with open(path, "rb") as f:
        head = f.read(8)
    hint = ""
    if fmt == "parquet" and (head.startswith(b"ARROW1") or head[:4] == b"\xff\xff\xff\xff"):
        hint = "; it is an Arrow IPC file: import it with import_arrow"
    elif fmt == "arrow" and head.startswith(b"PAR1"):
        hint = "; it is a Parquet file: import it with import_parquet"
    return SourceFormatError(path, None, f"cannot read as {fmt}: {exc}{hint}")


def _check_stream_end(path: str) -> None:
    """An Arrow IPC stream file ends with an end-of-stream marker (4 zero bytes before Arrow 0.15): one
    without was cut short, maybe at the end of a record batch, where a reader takes it for the end."""
    with open(path, "rb") as f:
        modern = f.read(4) == b"\xff\xff\xff\xff"
        f.seek(max(0, os.fstat(f.fileno()).st_size - 8))
        tail = f.read(8)
    if tail[-4:] != bytes(4) or (modern and tail[:4] != b"\xff\xff\xff\xff"):
        raise SourceFormatError(path, None, "cannot read as arrow: the IPC stream has no end-of-stream marker "
                                "(the file was cut short)")


class _Source:
    """One Arrow IPC (file or stream format, memory-mapped) or Parquet file: schema and batch iterator.

    The file is open only while it is read (:meth:`_opened`): a directory of more files than the
    open-files limit is validated and imported one file at a time."""

    def __init__(self, path: Path, fmt: str) -> None:
        pa = pyarrow()
        self.path = str(path)
        self.fmt = fmt
        self._stream = False
        try:
            if fmt == "parquet":
                with self._opened(reading=False) as pf:
                    self.schema = pf.schema_arrow
                    self._md = md = pf.metadata
                self.num_rows = int(md.num_rows)
                size = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
                self.row_bytes = max(1, size // max(1, self.num_rows))
            else:
                try:
                    with self._opened(reading=False) as reader:
                        self.schema = reader.schema
                except pa.ArrowInvalid:
                    self._stream = True
                    with self._opened(reading=False) as reader:
                        self.schema = reader.schema
                    _check_stream_end(self.path)
        except (OSError, pa.ArrowException) as exc:
            raise _unreadable(self.path, fmt, exc) from exc

    @contextlib.contextmanager
    def _opened(self, reading: bool = True) -> Iterator[Any]:
        """The file opened: a ParquetFile, or an IPC file or stream reader over a memory map (the record
        batches read keep the mapping alive after it is closed). ``reading``: a failure to open or read
        it is a SourceFormatError naming the file (the schema's reading, in ``__init__``, words its own)."""
        pa = pyarrow()
        try:
            if self.fmt == "parquet":
                with importlib.import_module("pyarrow.parquet").ParquetFile(self.path) as pf:
                    yield pf
            else:
                with pa.memory_map(self.path, "r") as mm:
                    yield pa.ipc.open_stream(mm) if self._stream else pa.ipc.open_file(mm)
        except (OSError, pa.ArrowException) as exc:
            if not reading:
                raise
            raise SourceFormatError(self.path, None, f"cannot read record batches: {exc}") from exc

    def count_rows(self) -> int:
        """Records in the file: Parquet's footer; for Arrow IPC the record batches' lengths (metadata
        only: the mapped bodies are not read)."""
        if self.fmt == "parquet":
            return self.num_rows
        return sum(self.pieces())

    def pieces(self) -> list[int]:
        """Rows of each piece the file can be read by on its own (parallel convert): Parquet row groups,
        Arrow IPC file record batches; an IPC stream is one piece (it can only be read from the start)."""
        if self.fmt == "parquet":
            return [int(self._md.row_group(i).num_rows) for i in range(self._md.num_row_groups)]
        with self._opened() as reader:
            if self._stream:
                return [sum(b.num_rows for b in reader)]
            return [int(reader.get_batch(i).num_rows) for i in range(reader.num_record_batches)]

    def batches(self, columns: list[str], chunk_bytes: int, pieces: tuple[int, int] | None = None) -> Iterator[Any]:
        """Record batches of the named columns, from the start of the file on every call (or of the
        pieces ``[a, b)`` of :meth:`pieces`)."""
        with self._opened() as reader:
            if self.fmt == "parquet":
                rows = int(min(max(chunk_bytes // self.row_bytes, 1), 1 << 20))
                groups = None if pieces is None else list(range(*pieces))
                yield from reader.iter_batches(batch_size=rows, columns=columns, row_groups=groups)
            elif self._stream:
                for b in reader:
                    yield b.select(columns)
            else:
                a, b = (0, reader.num_record_batches) if pieces is None else pieces
                for i in range(a, b):
                    yield reader.get_batch(i).select(columns)


def _chunks(src: _Source, columns: list[str], chunk_bytes: int, pieces: tuple[int, int] | None = None) -> Iterator[Any]:
    """Tables of about ``chunk_bytes`` (whole record batches, concatenated)."""
    pa = pyarrow()
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


class ArrowImportOptions(driver.ImportOptions, total=False):
    """The keywords of :func:`import_arrow` and :func:`import_parquet`: the common ones and these two."""

    columns: Mapping[str, str] | None
    id_column: str | None


def _import(fmt: str, sources: Any, out: str | os.PathLike[str], options: ArrowImportOptions) -> Store:
    """Check every file's schema against the first one's and plan the columns (nothing written), then
    hand the conversion to the driver."""
    columns, id_column = options.get("columns"), options.get("id_column")
    common = {k: v for k, v in options.items() if k not in ("columns", "id_column")}
    opts = driver.options(f"import_{fmt}", out, common, sources)
    srcs = [_Source(f, fmt) for s in driver.source_list(sources, f"import_{fmt}") for f in arrow_sources(s, fmt)]
    first = srcs[0]
    names = list(first.schema.names)
    mapping = column_map(first.path, names, columns, id_column)
    plans = {col: plan_column(first.path, col, first.schema.field(col).type) for col in mapping}
    if id_column is not None:
        check_id_column(first.path, id_column, first.schema.field(id_column).type)
    for src in srcs[1:]:  # every file must agree before anything is written
        for col in [*mapping, *([id_column] if id_column else [])]:
            if col not in src.schema.names:
                raise SchemaError(f"{src.path}: no column {col!r} (present in {first.path})")
            check_unique(src.path, src.schema.names, [col])
            if col in plans and plan_column(src.path, col, src.schema.field(col).type) != plans[col]:
                raise SchemaError(f"{src.path}, column {col!r}: type {src.schema.field(col).type} differs from "
                                  f"{first.schema.field(col).type} in {first.path}")
    # a None inner dim (a list of variable lists): the length of the first non-empty inner list
    inner = {col: resolve_inner(p, (b.column(0) for src in srcs for b in src.batches([col], opts.chunk_bytes)))
             for col, p in plans.items()}
    schema = columns_schema(first.path, ((c, f, plans[c], inner[c]) for c, f in mapping.items()))
    meta = {
        "format": fmt, "files": [os.path.basename(s.path) for s in srcs], "columns": mapping, "id_column": id_column,
    }
    job = _ArrowJob(fmt, [s.path for s in srcs], mapping, plans, inner, id_column, opts.chunk_bytes)
    total = sum(src.count_rows() for src in srcs)
    conv = driver.Conversion(schema, {METADATA_KEY: meta}, job, [(k, None) for k in range(len(srcs))], total,
                             lambda workers: [(job, segs) for segs in _arrow_units(srcs, total, workers)])
    return driver.write(conv, out, opts)


@dataclasses.dataclass(frozen=True)
class _ArrowJob:
    """What a conversion needs to turn record batches into appends (picklable, for parallel workers)."""

    fmt: str
    paths: list[str]
    mapping: dict[str, str]
    plans: dict[str, Plan]
    inner: dict[str, tuple[int, ...]]
    id_column: str | None
    chunk_bytes: int

    def describe(self, segments: Sequence[tuple[int, tuple[int, int] | None]]) -> str:
        return ", ".join(dict.fromkeys(self.paths[k] for k, _ in segments))

    def write(self, writer: Writer, segments: Sequence[tuple[int, tuple[int, int] | None]],
              progress: Progress | None) -> None:
        """Append the records of ``segments`` (file number, pieces ``[a, b)`` or None for all), in order.
        Each file is opened afresh and let go after its segment: a ParquetFile that was read keeps
        hundreds of MB of Arrow buffers alive (the validation's sources are not reused for this)."""
        read_cols = [*self.mapping, *([self.id_column] if self.id_column else [])]
        for k, pieces in segments:
            src = _Source(Path(self.paths[k]), self.fmt)
            for table in _chunks(src, read_cols, self.chunk_bytes, pieces):
                batch = {
                    self.mapping[c]: convert_column(column_array(table.column(c), src.path, c), self.plans[c],
                                                    self.inner[c], src.path, c)
                    for c in self.mapping
                }
                ids = None if self.id_column is None else id_strings(table.column(self.id_column), src.path,
                                                                     self.id_column)
                writer.append_batch(batch, ids=ids)
                if progress is not None:
                    progress(int(table.num_rows))


def _arrow_units(srcs: Sequence[_Source], total: int, workers: int) -> list[list[tuple[int, tuple[int, int] | None]]]:
    """Cut the files' pieces, in order, into about ``4 x workers`` runs of similar row counts: each run
    (one part of a parallel convert) is a list of (file number, pieces [a, b))."""
    pieces = [(k, j, n) for k, src in enumerate(srcs) for j, n in enumerate(src.pieces())]  # (file, piece, rows)
    budget = max(MIN_UNIT_RECORDS, -(-total // (4 * workers)))
    units: list[list[tuple[int, tuple[int, int] | None]]] = []
    for a, b in split_by_budget(np.asarray([n for _, _, n in pieces], dtype=np.int64), budget):
        spans: dict[int, list[int]] = {}  # file -> [first, end) of its pieces in the run (consecutive)
        for k, j, _ in pieces[a:b]:
            spans.setdefault(k, [j, j])[1] = j + 1
        units.append([(k, (first, end)) for k, (first, end) in spans.items()])
    return units


def import_arrow(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
                 **options: Unpack[ArrowImportOptions]) -> Store:
    """Import Arrow IPC files (file or stream format) or directories of them (e.g. a Hugging Face
    ``Dataset.save_to_disk`` directory) into one new store at ``out``, and open it.

    ``columns``: ``{column: field}`` to import (default: every column except ``id_column``, under its
    own name). ``id_column``: a string (or integer) column whose values become record ids. Records keep
    the files' order; all files' schemas are checked before the store is created. Files are
    memory-mapped and converted in chunks of about ``chunk_bytes``: O(chunk) memory. ``progress`` counts
    records. ``workers > 1``: record batches (Parquet row groups) in about ``4 x workers`` runs in file
    order, one part each (the same records in the same order, only the shard boundaries differ). The
    other keywords, and an ``out`` at a URL of object storage: :class:`~seqstore.interop.driver.Options`.
    """
    return _import("arrow", sources, out, options)


def import_parquet(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
                   **options: Unpack[ArrowImportOptions]) -> Store:
    """Import Parquet files (or directories of ``.parquet`` files) into one new store at ``out``; as
    :func:`import_arrow`, reading batches of about ``chunk_bytes`` (from the row groups' sizes)."""
    return _import("parquet", sources, out, options)
