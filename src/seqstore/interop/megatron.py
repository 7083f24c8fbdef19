"""Megatron-LM indexed datasets (``.bin`` + ``.idx``, the ``MMIDIDX`` layout) into and out of a store.

The layout, as Megatron-Core's ``IndexedDataset`` reads it (all little-endian):

=========================  ================================================================
``.idx`` bytes             meaning
=========================  ================================================================
0..9                       magic ``b"MMIDIDX\\x00\\x00"``
9..17                      version, uint64, 1
17                         dtype code, uint8 (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
                           6 float64, 7 float32, 8 uint16)
18..26                     sequence count N, uint64
26..34                     document count D + 1, uint64 (the length of the array below)
then                       sequence lengths, int32[N] (tokens per sequence)
then                       sequence pointers, int64[N] (byte offset of each sequence in ``.bin``)
then                       document indices, int64[D + 1] (document d is sequences
                           ``[idx[d], idx[d + 1])``; ``idx[0] == 0``, ``idx[D] == N``)
then (multimodal only)     sequence modes, int8[N]
=========================  ================================================================

The ``.bin`` file holds the tokens, in the dtype of the code, at the pointers.

**Import** (:func:`import_megatron`): one record per sequence, its tokens as a ragged field, with
the document boundaries and a multimodal index's modes as scalar fields where there are any; the files
are memory-mapped and read with array operations (no Python object per sequence). **Export**
(:func:`export_megatron`): a ragged field with 1-d rows to ``PREFIX.bin`` / ``PREFIX.idx``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from ..errors import SchemaError
from ..format.manifest import fsync_dir
from ..io.mapping import allocate_whole
from ..schema import Field, Schema
from ..store import Store, Writer, open_store
from . import driver
from ._common import (
    DEFAULT_CHUNK_BYTES,
    Progress,
    SourceFormatError,
    announce_total,
    check_apart,
    check_output,
    check_size,
    local_output,
    parents_undone,
    replaced,
    runs_across,
    split_by_budget,
)

__all__ = ["import_megatron", "export_megatron", "read_index", "MegatronIndex", "MegatronIndexError", "METADATA_KEY",
           "MAGIC"]

#: Key of the import information in the store's metadata.
METADATA_KEY = "megatron"
MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = 34
#: Megatron-Core's dtype codes (``megatron.core.datasets.indexed_dataset.DType``).
DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype("uint8"), 2: np.dtype("int8"), 3: np.dtype("int16"), 4: np.dtype("int32"),
    5: np.dtype("int64"), 6: np.dtype("float64"), 7: np.dtype("float32"), 8: np.dtype("uint16"),
}
CODES = {str(dt): code for code, dt in DTYPES.items()}
#: Sequences checked per vectorised step of validation and per block of a conversion (bounds memory).
BLOCK = 1 << 17
#: A parallel import gives each worker's unit at least this many sequences.
MIN_UNIT_SEQUENCES = 1 << 16


class MegatronIndexError(SourceFormatError):
    """A Megatron ``.idx`` / ``.bin`` pair is not in the ``MMIDIDX`` layout or contradicts itself
    (wrong magic, unknown version or dtype code, a file too short, pointers outside ``.bin``);
    ``path`` names the file."""


@dataclasses.dataclass
class MegatronIndex:
    """A memory-mapped ``.idx`` file: ``lengths`` (int32[N]), ``pointers`` (int64[N]), ``documents``
    (int64[D + 1]) and ``modes`` (int8[N] or None) are read-only views of the mapping."""

    prefix: str
    dtype: np.dtype[Any]
    lengths: np.ndarray[Any, Any]
    pointers: np.ndarray[Any, Any]
    documents: np.ndarray[Any, Any]
    modes: np.ndarray[Any, Any] | None
    bin_bytes: int

    @property
    def idx_path(self) -> str:
        return self.prefix + ".idx"

    @property
    def bin_path(self) -> str:
        return self.prefix + ".bin"

    @property
    def num_sequences(self) -> int:
        return len(self.lengths)

    @property
    def num_documents(self) -> int:
        return len(self.documents) - 1

    def one_per_document(self) -> bool:
        """Whether every document is exactly one sequence (document indices ``0, 1, ..., N``)."""
        n = self.num_sequences
        if len(self.documents) != n + 1:
            return False
        for a in range(0, n + 1, BLOCK):
            b = min(a + BLOCK, n + 1)
            if not np.array_equal(self.documents[a:b], np.arange(a, b, dtype=np.int64)):
                return False
        return True

    def tokens(self) -> np.ndarray[Any, Any]:
        """The ``.bin`` file as a read-only memory-mapped array of ``dtype`` (empty file: empty array)."""
        count = self.bin_bytes // self.dtype.itemsize
        if count == 0:
            return np.empty(0, dtype=self.dtype)
        return np.memmap(self.bin_path, dtype=self.dtype, mode="r", shape=(count,))


def _prefix(path: str | os.PathLike[str]) -> str:
    p = os.fspath(path)
    return p[:-4] if p.endswith((".idx", ".bin")) else p


def read_index(path: str | os.PathLike[str], *, check: bool = True) -> MegatronIndex:
    """Map the ``.idx`` of the pair at ``path`` (a prefix, or either file's name) and check it.

    Raises :class:`MegatronIndexError` naming the file for a wrong magic, version, dtype code or size,
    and (``check``) for lengths below 0, document indices that do not run from 0 up to N, or a pointer
    not aligned to the dtype or a sequence outside ``.bin``. The checks are vectorised over blocks of
    the mapped arrays: O(N) time, O(1) memory.
    """
    prefix = _prefix(path)
    idx, binp = prefix + ".idx", prefix + ".bin"
    for f in (idx, binp):
        if not os.path.isfile(f):
            raise FileNotFoundError(f"{f}: no such file (a Megatron dataset is PREFIX.bin + PREFIX.idx)")
    size = os.path.getsize(idx)
    with open(idx, "rb") as fh:
        head = fh.read(HEADER_BYTES)
    if head[:9] != MAGIC:
        raise MegatronIndexError(idx, None, f"magic is {head[:9]!r}, expected {MAGIC!r} (not a Megatron MMIDIDX index)")
    if len(head) < HEADER_BYTES:
        raise MegatronIndexError(idx, None, f"only {size} bytes; the header alone is {HEADER_BYTES}")
    version, code, n, ndoc = struct.unpack("<QBQQ", head[9:HEADER_BYTES])
    if version != VERSION:
        raise MegatronIndexError(idx, None, f"version {version}; this reader knows version {VERSION}")
    if code not in DTYPES:
        raise MegatronIndexError(idx, None, f"dtype code {code}; known codes are {sorted(DTYPES)}")
    if ndoc < 1:
        raise MegatronIndexError(idx, None, "document count is 0; the document indices hold at least [0]")
    plain = HEADER_BYTES + 12 * n + 8 * ndoc
    if size not in (plain, plain + n):
        raise MegatronIndexError(idx, None, f"{size} bytes, expected {plain} for {n} sequences and {ndoc - 1} "
                                 f"documents (or {plain + n} with sequence modes)")
    mm = np.memmap(idx, dtype=np.uint8, mode="r")
    lengths = mm[HEADER_BYTES : HEADER_BYTES + 4 * n].view("<i4")
    pointers = mm[HEADER_BYTES + 4 * n : HEADER_BYTES + 12 * n].view("<i8")
    documents = mm[HEADER_BYTES + 12 * n : plain].view("<i8")
    modes = mm[plain : plain + n].view(np.int8) if size > plain else None
    index = MegatronIndex(prefix, DTYPES[code], lengths, pointers, documents, modes, os.path.getsize(binp))
    if check:
        _check(index)
    return index


def _check(ix: MegatronIndex) -> None:
    n, item = ix.num_sequences, ix.dtype.itemsize
    for a in range(0, n, BLOCK):
        b = min(a + BLOCK, n)
        lens = ix.lengths[a:b].astype(np.int64)
        ptr = ix.pointers[a:b]
        if lens.size and int(lens.min()) < 0:
            k = a + int(np.argmin(lens))
            raise MegatronIndexError(ix.idx_path, None, f"sequence {k} has length {int(lens[k - a])}")
        bad = np.flatnonzero((ptr < 0) | (ptr % item != 0) | (ptr > ix.bin_bytes - lens * item))  # (no overflow)
        if len(bad):
            k = int(bad[0])
            raise MegatronIndexError(ix.bin_path, None, f"sequence {a + k} (pointer {int(ptr[k])}, {int(lens[k])} "
                                     f"tokens of {ix.dtype}) is not inside the file's {ix.bin_bytes} bytes or not "
                                     f"aligned to {item} bytes")
    docs = ix.documents
    if int(docs[0]) != 0 or int(docs[-1]) != n:
        raise MegatronIndexError(ix.idx_path, None, f"document indices run from {int(docs[0])} to {int(docs[-1])}, "
                                 f"expected 0 to the sequence count {n}")
    for a in range(0, len(docs) - 1, BLOCK):
        b = min(a + BLOCK + 1, len(docs))
        step = np.diff(docs[a:b])
        if step.size and int(step.min()) < 0:
            k = a + int(np.argmin(step))
            raise MegatronIndexError(ix.idx_path, None, f"document indices decrease at document {k}")


# ------------------------------------------------------------------------------------------- import


def _sequence_chunks(ix: MegatronIndex, a: int, b: int, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """Runs ``[x, y)`` of sequences ``[a, b)`` with about ``chunk_bytes`` of tokens each (blocks of at
    most BLOCK sequences cut by budget: O(BLOCK) memory)."""
    for s in range(a, b, BLOCK):
        e = min(s + BLOCK, b)
        cost = ix.lengths[s:e].astype(np.int64) * ix.dtype.itemsize + 8
        for x, y in split_by_budget(cost, chunk_bytes):
            yield s + x, s + y


def _gather(tokens: np.ndarray[Any, Any], ix: MegatronIndex, a: int, b: int,
            lens: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Tokens of sequences ``[a, b)``, concatenated: one slice when they lie back to back in ``.bin``,
    else one vectorised gather (positions from a repeat of each sequence's start)."""
    item = ix.dtype.itemsize
    ptr = ix.pointers[a:b]
    total = int(lens.sum())
    if total == 0:
        return np.empty(0, dtype=ix.dtype)
    start = int(ptr[0]) // item
    if b - a == 1 or bool(np.array_equal(ptr[1:], ptr[:-1] + lens[:-1] * item)):
        return tokens[start : start + total]
    starts = np.zeros(len(lens), dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    pos = np.arange(total, dtype=np.int64) + np.repeat(ptr // item - starts, lens)
    return tokens[pos]


@dataclasses.dataclass(frozen=True)
class _MegatronJob:
    """What a conversion needs to append sequences (picklable, for parallel workers)."""

    prefixes: list[str]
    doc_offsets: list[int]
    field: str
    document_field: str | None
    mode_field: str | None
    chunk_bytes: int

    def describe(self, segments: Sequence[tuple[int, int, int]]) -> str:
        return ", ".join(f"{self.prefixes[k]} sequences {a}..{b - 1}" for k, a, b in segments)

    def write(self, writer: Writer, segments: Sequence[tuple[int, int, int]], progress: Progress | None) -> None:
        """Append sequences ``[a, b)`` of source ``k`` for each ``(k, a, b)`` of ``segments``, in order."""
        for k, a, b in segments:
            ix = read_index(self.prefixes[k], check=False)  # checked by the driver
            tokens = ix.tokens()
            for x, y in _sequence_chunks(ix, a, b, self.chunk_bytes):
                lens = ix.lengths[x:y].astype(np.int64)
                batch: dict[str, Any] = {self.field: (_gather(tokens, ix, x, y, lens), lens)}
                if self.document_field is not None:
                    doc = np.searchsorted(ix.documents, np.arange(x, y, dtype=np.int64), side="right") - 1
                    batch[self.document_field] = doc + self.doc_offsets[k]
                if self.mode_field is not None:
                    assert ix.modes is not None
                    batch[self.mode_field] = np.asarray(ix.modes[x:y])
                writer.append_batch(batch)
                if progress is not None:
                    progress(y - x)
            del tokens


def _units(counts: Sequence[int], workers: int) -> list[list[tuple[int, int, int]]]:
    """The sources' sequences, in order, cut into about ``4 x workers`` runs of similar counts."""
    return runs_across(counts, max(MIN_UNIT_SEQUENCES, -(-sum(counts) // (4 * max(workers, 1)))))


def import_megatron(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    field: str = "tokens",
    document_field: str = "document",
    mode_field: str = "mode",
    **options: Unpack[driver.ImportOptions],
) -> Store:
    """Import Megatron indexed datasets (each a ``PREFIX`` of ``PREFIX.bin`` + ``PREFIX.idx``, or
    either file's name) into one new store at ``out``, and open it.

    One record per sequence, in the sources' order: ``field`` (ragged, the index's dtype) holds its
    tokens. ``document_field`` (int64 scalar) numbers each sequence's document, counted across the
    sources, and is written only when some document holds more than one sequence (or none); a
    multimodal index's sequence modes become ``mode_field`` (int8). All sources must share one
    dtype. Every index is checked (:func:`read_index`) before the store is created; the store is all
    or nothing. Memory O(``chunk_bytes``): the files are memory-mapped. ``progress`` gets sequences.

    ``workers > 1``: runs of sequences written as parts. The other keywords:
    :class:`~seqstore.interop.driver.Options`.
    """
    opts = driver.options("import_megatron", out, options, sources)
    given = driver.source_list(sources, "import_megatron")
    indexes = [read_index(s) for s in given]
    first = indexes[0]
    for ix in indexes[1:]:
        if ix.dtype != first.dtype:
            raise MegatronIndexError(ix.idx_path, None, f"tokens are {ix.dtype}, but {first.idx_path} has "
                                     f"{first.dtype}; import sources of one dtype together")
    multimodal = [ix.modes is not None for ix in indexes]
    if any(multimodal) and not all(multimodal):
        raise MegatronIndexError(indexes[multimodal.index(False)].idx_path, None,
                                 "has no sequence modes, but other sources are multimodal")
    doc = None if all(ix.one_per_document() for ix in indexes) else document_field
    mode = mode_field if all(multimodal) else None
    spec = [(n, f) for n, f in ((field, Field(first.dtype, (None,))), (doc, Field("int64")), (mode, Field("int8")))
            if n is not None]
    if len(dict(spec)) != len(spec):
        raise SchemaError(f"field names {[n for n, _ in spec]} must differ")
    schema = Schema(dict(spec))
    offsets = [0, *itertools.accumulate(ix.num_documents for ix in indexes[:-1])]
    counts = [ix.num_sequences for ix in indexes]
    total = sum(counts)
    meta = {
        "files": [os.path.basename(ix.prefix) for ix in indexes], "dtype": str(first.dtype), "field": field,
        "sequences": total, "documents": sum(ix.num_documents for ix in indexes),
        "document_field": doc, "mode_field": mode,
    }
    job = _MegatronJob([ix.prefix for ix in indexes], offsets, field, doc, mode, opts.chunk_bytes)
    del indexes, first
    conv = driver.Conversion(schema, {METADATA_KEY: meta}, job, [(k, 0, n) for k, n in enumerate(counts)], total,
                             lambda workers: [(job, segs) for segs in _units(counts, workers)])
    return driver.write(conv, out, opts)


# ------------------------------------------------------------------------------------------- export


def _ragged_field(st: Store, field: str | None) -> str:
    ragged = [n for n, f in st.schema.items() if f.ragged and not f.inner_shape]
    if field is None:
        if len(ragged) != 1:
            raise SchemaError(f"{st.url}: name the field to export; ragged fields with 1-d rows are {ragged}")
        return ragged[0]
    if field not in st.schema:
        raise KeyError(f"{st.url}: no field {field!r}; fields are {list(st.schema)}")
    if field not in ragged:
        raise SchemaError(f"{st.url}, field {field!r}: {st.schema[field]} is not ragged with 1-d rows; a Megatron "
                          "dataset holds sequences of scalar tokens")
    return field


@contextlib.contextmanager
def _naming_full_disk(target: Path, tmp: Path, need: str) -> Iterator[None]:
    """Writes of the file ``target`` (as ``tmp``) that need ``need``: an OSError of a full disk (or quota)
    that names no file is raised again naming both, with what the file needs."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or exc.filename is not None:
            raise
        raise OSError(exc.errno, f"{exc.strerror}: cannot write {target} ({need}); free space under "
                      f"{target.parent}", str(tmp)) from exc


@parents_undone
def export_megatron(
    store: str | os.PathLike[str] | Store,
    out: str | os.PathLike[str],
    *,
    field: str | None = None,
    dtype: Any = None,
    documents: str | None = "auto",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write a ragged field of a store as the Megatron dataset ``out.bin`` + ``out.idx`` (``out``: the
    prefix; a trailing ``.bin``/``.idx`` is dropped) that Megatron-Core's ``IndexedDataset(out)`` reads.
    Returns the prefix.

    ``field``: a ragged field with 1-d rows (default: the only one). ``dtype``: the tokens' dtype in
    the files (default the field's; one of Megatron's: uint8, int8, int16, int32, int64, float64,
    float32, uint16; a value that the cast would change is an error naming the record range).
    ``documents``: an integer scalar field whose value changes where a new document starts;
    ``"auto"`` is the one :func:`import_megatron` recorded, if any, else one document per record;
    None: one document per record. Sequences longer than 2**31-1 tokens are refused (int32 lengths).

    Both files are written in one pass in chunks of about ``chunk_bytes`` (O(chunk) memory) under
    temporary names and installed at the end: an existing ``.idx`` deleted, then ``.bin`` renamed into
    place, then ``.idx`` (killed part way, a new ``.bin`` is never left beside an old ``.idx``; export
    again with ``overwrite``). ``progress`` gets bytes of tokens.
    """
    prefix = _prefix(local_output(out, "export_megatron"))
    check_apart(store, [prefix + ".bin", prefix + ".idx"], "export_megatron")
    chunk_bytes = check_size("export_megatron", "chunk_bytes", chunk_bytes)
    st = store if isinstance(store, Store) else open_store(store)
    name = _ragged_field(st, field)
    if st.schema[name].dtype == "bfloat16":
        raise SchemaError(f"field {name!r}: bfloat16 values are not tokens Megatron's .idx can describe "
                          f"(its dtypes: {', '.join(CODES)})")
    src_dt = st.schema[name].storage_dtype
    try:
        known = str(np.dtype(dtype) if dtype is not None else src_dt)
    except TypeError:  # not a numpy dtype at all: the same error as for one Megatron has no code for
        known = ""
    if known not in CODES:
        raise SchemaError(f"field {name!r}: dtype {dtype or st.schema[name].dtype} is not one of Megatron's "
                          f"({', '.join(CODES)}); pass dtype=...")
    out_dt = np.dtype(known)
    if documents == "auto":
        meta = st.metadata.get(METADATA_KEY, {})
        doc = meta.get("document_field") if isinstance(meta, dict) else None
        if doc is not None and not isinstance(doc, str):
            raise SchemaError(f"{st.url}: metadata['megatron']['document_field'] is {doc!r:.100}; expected a field "
                              "name (or None); pass documents=")
        documents = doc if doc in st.schema else None
    if documents is not None:
        if documents not in st.schema:
            raise KeyError(f"{st.url}: no field {documents!r} for documents; fields are {list(st.schema)}")
        f = st.schema[documents]
        if f.ragged or f.inner_shape or np.dtype(f.storage_dtype).kind not in "iub":
            raise SchemaError(f"field {documents!r}: documents need an integer scalar field, got {f}")
    binp, idxp = Path(prefix + ".bin"), Path(prefix + ".idx")
    for p in (binp, idxp):  # (the files, never a directory, even with overwrite)
        check_output(p, overwrite, lambda r: r.is_dir() and not r.is_symlink(),
                     "a directory (a Megatron dataset is two files)")
    n = len(st)
    item = out_dt.itemsize
    total_rows = st.manifest.total_rows(name) if n else 0
    announce_total(progress, total_rows * item)
    per_record = max(1, total_rows * item // max(n, 1))
    chunk_records = int(min(max(chunk_bytes // per_record, 1), BLOCK))
    # on success the old .idx is deleted, then .bin renamed into place, then .idx: killed between those
    # steps, what is left is never a new .bin beside an old .idx (readable as a pair of wrong sequences)
    had_idx = idxp.exists() or idxp.is_symlink()  # (checked: overwrite was given)
    bin_need = f"{total_rows * item} bytes"
    idx_need = f"{HEADER_BYTES + 12 * n} bytes and 8 per document"
    with replaced(idxp) as tidx, replaced(binp) as tbin:
        # (an error of a full disk names its file, also one of the closing flush)
        with _naming_full_disk(binp, tbin, bin_need), open(tbin, "wb") as fb, \
                _naming_full_disk(idxp, tidx, idx_need), open(tidx, "w+b") as fi:
            fi.write(MAGIC + struct.pack("<QBQQ", VERSION, CODES[str(out_dt)], n, 0))
            fi.truncate(HEADER_BYTES + 12 * n)
            # its disk space now: on a full disk a write into the mapping's hole would be a SIGBUS
            allocate_whole(fi.fileno(), HEADER_BYTES + 12 * n, f"cannot write {idxp} ({idx_need})", str(tidx))
            lens_mm = np.memmap(tidx, dtype="<i4", mode="r+", offset=HEADER_BYTES, shape=(n,)) if n else None
            ptr_mm = np.memmap(tidx, dtype="<i8", mode="r+", offset=HEADER_BYTES + 4 * n, shape=(n,)) if n else None
            fi.seek(HEADER_BYTES + 12 * n)
            fi.write(np.zeros(1, dtype="<i8").tobytes())  # document indices start at 0
            ndoc = 1
            pos = 0
            last_doc: int | None = None
            for first, values, lens in st.iter_ragged(name, chunk_records=chunk_records):
                b = first + len(lens)
                if len(lens) and int(lens.max()) > np.iinfo(np.int32).max:
                    raise SchemaError(f"field {name!r}: a record of {first}..{b - 1} has over 2**31-1 tokens")
                vals = np.asarray(values)
                if vals.dtype != out_dt:
                    with np.errstate(invalid="ignore", over="ignore"):  # (what the cast changes is refused below)
                        cast = vals.astype(out_dt)
                    # the signs too: between signed and unsigned integers of one size a wrap casts back;
                    # a NaN that a narrower float holds is kept (it never equals itself)
                    same = np.array_equal(cast.astype(vals.dtype), vals, equal_nan=vals.dtype.kind == "f")
                    if not (same and np.array_equal(cast < 0, vals < 0)):
                        raise SchemaError(f"field {name!r}: records {first}..{b - 1} hold values that {out_dt} "
                                          "cannot represent; pick a wider dtype")
                    vals = cast
                with _naming_full_disk(binp, tbin, bin_need):  # (inside the .idx's: named as the .bin's)
                    fb.write(np.ascontiguousarray(vals).reshape(-1).view(np.uint8).data)
                assert lens_mm is not None and ptr_mm is not None
                lens_mm[first:b] = lens
                ends = np.cumsum(lens * item) + pos
                ptr_mm[first:b] = ends - lens * item
                pos = int(ends[-1]) if len(ends) else pos
                # document ends: records after which the document value changes (and the last record)
                if documents is None:
                    ends_doc = np.arange(first + 1, b + 1, dtype=np.int64)
                else:
                    d = np.asarray(st.get_batch(np.arange(first, b), fields=[documents])[documents]).astype(np.int64)
                    prev = np.concatenate(([d[0] if last_doc is None else last_doc], d))
                    change = np.flatnonzero(prev[1:] != prev[:-1]) + first  # a new document starts at these
                    ends_doc = change[change > 0]
                    last_doc = int(d[-1])
                fi.write(ends_doc.astype("<i8").tobytes())
                ndoc += len(ends_doc)
                if progress is not None:
                    progress(len(vals) * item)
            if documents is not None and n:
                fi.write(np.array([n], dtype="<i8").tobytes())
                ndoc += 1
            fi.seek(HEADER_BYTES - 8)
            fi.write(struct.pack("<Q", ndoc))
            for mm in (lens_mm, ptr_mm):
                if mm is not None:
                    mm.flush()
            del lens_mm, ptr_mm
            with _naming_full_disk(binp, tbin, bin_need):  # (inside the .idx's: named as the .bin's)
                fb.flush()
                os.fsync(fb.fileno())
            fi.flush()
            os.fsync(fi.fileno())
        if had_idx:
            idxp.unlink(missing_ok=True)
            fsync_dir(idxp.parent)
    return Path(prefix)
