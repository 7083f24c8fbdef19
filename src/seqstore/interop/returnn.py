"""RETURNN interop: import RETURNN HDF files into a store (:func:`import_hdf`), export a store as a
RETURNN HDF file (:func:`export_hdf`), and :class:`StoreDataset`, a RETURNN ``Dataset`` over a store.

The HDF layout is the one RETURNN's ``SimpleHDFWriter`` writes and ``HDFDataset`` reads (docs/interop.md,
"RETURNN HDF layout"): ``inputs``, ``seqLengths`` (one column per stream), ``seqTags``, and a stream per
``targets/data/<key>`` with its ``targets/size`` dims and labels. The import keeps dims and labels in
the store's metadata under ``"returnn"``, so that :func:`export_hdf` and :class:`StoreDataset` give
RETURNN the same ``num_outputs`` and labels back. Both directions stream in chunks of about
``chunk_bytes`` of rows: memory is bounded whatever the file size.

``h5py`` is needed for import and export (extra ``seqstore[hdf5]``); RETURNN itself only for
:class:`StoreDataset`, imported when that name is first used.
"""

from __future__ import annotations

import dataclasses
import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np

from ..errors import SchemaError
from ..schema import Field, Schema, field_list
from ..store import Store, Writer
from . import driver
from ._common import (
    DEFAULT_CHUNK_BYTES,
    Progress,
    announce_total,
    check_apart,
    check_named_once,
    check_output,
    check_size,
    local_output,
    name_map,
    parents_undone,
    read_as_float32,
    replaced,
    split_by_budget,
)
from .returnn_hdf import (
    VALIDATE_BLOCK,
    HdfFileInfo,
    HdfStream,
    decode_tag,
    h5py_module,
    inspect_hdf,
    read_dataset,
    recorded_labels,
    stream_dims,
)

if TYPE_CHECKING:
    from ._returnn_dataset import StoreDataset as StoreDataset

__all__ = ["import_hdf", "export_hdf", "inspect_hdf", "HdfFileInfo", "HdfStream", "StoreDataset", "METADATA_KEY"]

#: Key of the RETURNN information (dims, sparse flags, labels, sources) in a store's metadata.
METADATA_KEY = "returnn"

_LENGTHS_BLOCK = 1 << 16  # sequences of seqLengths read at once while streaming
_TAG_COST = 64  # bytes charged per sequence in the chunk budget (its tag string and bookkeeping)
#: A parallel import gives each worker's unit at least this many bytes of rows (less in all: one process).
MIN_UNIT_BYTES = 16 << 20
_read = read_dataset  # looked up when called, so a test can put a failing read in its place


def __getattr__(name: str) -> Any:
    """``StoreDataset`` is built on RETURNN's ``Dataset``: import RETURNN only when it is asked for."""
    if name == "StoreDataset":
        from ._returnn_dataset import StoreDataset

        return StoreDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _merge_schema(infos: Sequence[HdfFileInfo], rename: Mapping[str, str]) -> tuple[Schema, dict[str, Any]]:
    """One schema for all files (same streams, row shapes and dims; dtypes promoted within a kind, signed
    with unsigned integers only to an integer dtype that holds both)."""
    first = infos[0]
    by_key: dict[str, HdfStream] = {s.key: s for s in first.streams}
    dtypes = {k: np.dtype(s.dtype) for k, s in by_key.items()}
    seen = {k: {dt: first.path} for k, dt in dtypes.items()}  # per stream: each dtype and its first file
    for info in infos[1:]:
        keys = [s.key for s in info.streams]
        if sorted(keys) != sorted(by_key):
            raise SchemaError(f"{info.path}: streams {sorted(keys)} differ from {sorted(by_key)} of {first.path}; "
                              "all files of one import must have the same inputs and targets")
        for s in info.streams:
            ref = by_key[s.key]
            if s.inner != ref.inner:
                raise SchemaError(f"{info.path}, dataset {s.dataset!r}: rows of shape {s.inner} but {ref.inner} in "
                                  f"{first.path}")
            if (s.dim, s.ndim) != (ref.dim, ref.ndim):  # (RETURNN's HDFDataset refuses them too)
                raise SchemaError(f"{info.path}, dataset {s.dataset!r}: dim {s.dim} and ndim {s.ndim} (num_outputs) "
                                  f"but dim {ref.dim} and ndim {ref.ndim} in {first.path}; all files of one import "
                                  "must have the same dims")
            dt = np.dtype(s.dtype)
            if dt.kind != dtypes[s.key].kind and not {dt.kind, dtypes[s.key].kind} <= {"i", "u"}:
                raise SchemaError(f"{info.path}, dataset {s.dataset!r}: dtype {dt} does not go with {dtypes[s.key]} of "
                                  f"{first.path}")
            merged = np.promote_types(dtypes[s.key], dt)
            if merged.kind == "f" and dt.kind in "iu":
                # int64 with uint64 promotes to float64: values past 2**53 would be rounded silently
                other = next(d for d in seen[s.key] if d.kind != dt.kind)
                raise SchemaError(f"{info.path}, dataset {s.dataset!r}: dtype {dt} and {other} of "
                                  f"{seen[s.key][other]} have no common integer dtype (numpy would promote them to "
                                  f"{merged}, losing values); convert the files to one dtype first")
            seen[s.key].setdefault(dt, info.path)
            dtypes[s.key] = merged
    # "inputs" (the HDF dataset) or "data" (its key, as the stream list below says) renames the inputs
    unknown = set(rename) - set(by_key) - ({"inputs"} if "data" in by_key else set())
    if unknown:
        raise SchemaError(f"rename: no stream(s) {sorted(unknown)} in {first.path}; streams are {sorted(by_key)}")
    spec: dict[str, Field] = {}
    streams_meta: dict[str, Any] = {}

    def name_of(key: str) -> str:
        return rename.get("inputs", rename.get("data", "data")) if key == "data" else rename.get(key, key)

    for key, s in by_key.items():
        name = name_of(key)
        if name in spec:
            raise SchemaError(f"two streams map to the field {name!r}; pass rename={{stream: field}} to tell them "
                              "apart")
        try:
            spec[name] = Field(dtypes[key], (None, *s.inner))
        except SchemaError as exc:
            raise SchemaError(f"{first.path}, dataset {s.dataset!r}: {exc}") from exc
        streams_meta[name] = {"hdf_key": key, "dim": s.dim, "ndim": s.ndim, "sparse": s.sparse}
    labels = {name_of(key): lab for key, lab in first.labels.items()}
    meta = {"format": "returnn-hdf", "files": [os.path.basename(i.path) for i in infos],
            "inputs": name_of("data") if "data" in by_key else None, "streams": streams_meta, "labels": labels}
    return Schema(spec), meta


# ----------------------------------------------------------------------------------------- import


def _stream_file(info: HdfFileInfo, writer: Writer, fields: Mapping[str, str], chunk_bytes: int,
                 progress: Progress | None, seqs: tuple[int, int], first_rows: Mapping[str, int] | None) -> None:
    """Append the sequences ``seqs = [a, b)`` of one file, whose rows start at ``first_rows[stream key]``
    (None: at the file's start), to ``writer`` in chunks of about ``chunk_bytes`` of rows."""
    h5py = h5py_module()
    p = info.path
    with h5py.File(p, "r") as fin:
        sl = fin["seqLengths"]
        tags_ds = fin["seqTags"]
        data = {s.key: fin[s.dataset] for s in info.streams}
        row_pos = {s.key: int(first_rows[s.key]) if first_rows else 0 for s in info.streams}
        cost_per_row = [s.row_bytes for s in info.streams]
        lo, n = seqs
        for a in range(lo, n, _LENGTHS_BLOCK):
            b = min(a + _LENGTHS_BLOCK, n)
            block = np.asarray(_read(sl, slice(a, b), p, "seqLengths"), dtype=np.int64).reshape(b - a, -1)
            cost = np.full(b - a, _TAG_COST, dtype=np.int64)
            for s, rb in zip(info.streams, cost_per_row):
                cost += block[:, s.column] * rb
            for x, y in split_by_budget(cost, chunk_bytes):
                columns: dict[str, Any] = {}
                nbytes = 0
                for s in info.streams:
                    lengths = block[x:y, s.column]
                    r0 = row_pos[s.key]
                    r1 = r0 + int(lengths.sum())
                    values = _read(data[s.key], slice(r0, r1), p, s.dataset)
                    row_pos[s.key] = r1
                    columns[fields[s.key]] = (values, lengths)
                    nbytes += values.nbytes
                ids = [decode_tag(t) for t in _read(tags_ds, slice(a + x, a + y), p, "seqTags").tolist()]
                try:
                    writer.append_batch(columns, ids=ids)
                except SchemaError as exc:
                    raise SchemaError(f"{p}, sequences {a + x}..{a + y - 1}: {exc}") from exc
                if progress is not None:
                    progress(nbytes)


def import_hdf(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    rename: Mapping[str, str] | None = None,
    **options: Unpack[driver.ImportOptions],
) -> Store:
    """Convert one or more RETURNN HDF files into one new store at ``out`` and open it.

    Fields: ``data`` for ``inputs`` ((None, dim) dense or (None,) sparse ints) and one field per
    ``targets/data/<key>`` ((None,) or (None, *row)); dtypes as in the files. ``rename`` maps a stream
    (``"inputs"``, or its key ``"data"``, or a target key) to another field name. Tags become record
    ids; records keep the files' order (file 1's sequences, then file 2's, ...). Dims, sparse flags,
    labels and the source file names go to ``store.metadata["returnn"]``.

    All files are validated before the store is created (:func:`inspect_hdf`; same streams in every
    file), so a bad file 2 of 3 fails before anything is written; a later read failure (a damaged HDF5
    chunk) leaves no store either. Memory O(``chunk_bytes``) of rows plus that chunk's tags; one
    sequential pass over each dataset. ``progress`` counts bytes of rows. ``workers > 1``: the sequences
    in about ``4 x workers`` runs in file order, one part each (only the shard boundaries differ). The
    other keywords: :class:`~seqstore.interop.driver.Options`.
    """
    opts = driver.options("import_hdf", out, options, sources)
    infos = [inspect_hdf(p) for p in driver.source_list(sources, "import_hdf")]
    schema, meta = _merge_schema(infos, dict(rename or {}))
    job = _HdfJob(list(infos), {v["hdf_key"]: name for name, v in meta["streams"].items()}, opts.chunk_bytes)
    whole = [(k, 0, info.num_seqs, None) for k, info in enumerate(infos)]
    conv = driver.Conversion(schema, {METADATA_KEY: meta}, job, whole, sum(info.total_bytes for info in infos),
                             lambda workers: [(job, segs) for segs in _hdf_units(infos, workers)])
    return driver.write(conv, out, opts)


@dataclasses.dataclass(frozen=True)
class _HdfJob:
    """What the workers of a parallel import need (picklable): the files, stream -> field, chunk size."""

    infos: list[HdfFileInfo]
    fields: dict[str, str]
    chunk_bytes: int

    def describe(self, segments: Sequence[tuple[int, int, int, dict[str, int] | None]]) -> str:
        return ", ".join(f"{self.infos[k].path} sequences {a}..{b - 1}" for k, a, b, _ in segments)

    def write(self, writer: Writer, segments: Sequence[tuple[int, int, int, dict[str, int] | None]],
              progress: Progress | None) -> None:
        """Append the sequences of ``segments`` (file number, first and end sequence, first row of each
        stream or None for the file's first sequence), in order."""
        for k, a, b, rows in segments:
            _stream_file(self.infos[k], writer, self.fields, self.chunk_bytes, progress, (a, b), rows)


def _hdf_units(infos: Sequence[HdfFileInfo], workers: int) -> list[list[tuple[int, int, int, dict[str, int]]]]:
    """Cut the files' sequences, in order, into about ``4 x workers`` runs of similar bytes of rows. Each
    run is a list of (file number, first sequence, end sequence, first row per stream). Reads every
    file's ``seqLengths`` once in blocks (O(block) memory)."""
    h5py = h5py_module()
    total = sum(info.total_bytes + _TAG_COST * info.num_seqs for info in infos)
    budget = max(MIN_UNIT_BYTES, -(-total // (4 * workers)))
    units: list[list[tuple[int, int, int, dict[str, int]]]] = []
    segs: list[tuple[int, int, int, dict[str, int]]] = []
    done = end = 0  # bytes before the current run, and before the current block
    for k, info in enumerate(infos):
        start = 0  # first sequence of the open segment
        first = {s.key: 0 for s in info.streams}  # its first row of each stream
        before = {s.key: 0 for s in info.streams}  # rows before the current block
        with h5py.File(info.path, "r") as fin:
            sl = fin["seqLengths"]
            for a in range(0, info.num_seqs, VALIDATE_BLOCK):
                n = min(VALIDATE_BLOCK, info.num_seqs - a)
                block = np.asarray(_read(sl, slice(a, a + n), info.path, "seqLengths"), dtype=np.int64).reshape(n, -1)
                cost = np.full(n, _TAG_COST, dtype=np.int64)
                for s in info.streams:
                    cost += block[:, s.column] * s.row_bytes
                cum = end + np.cumsum(cost)  # bytes up to each sequence of the block
                while (i := int(np.searchsorted(cum, done + budget, side="left"))) < n:  # a run full at i
                    segs.append((k, start, a + i + 1, first))
                    units.append(segs)
                    segs, done, start = [], int(cum[i]), a + i + 1
                    first = {s.key: before[s.key] + int(block[: i + 1, s.column].sum()) for s in info.streams}
                end = int(cum[-1])
                for s in info.streams:
                    before[s.key] += int(block[:, s.column].sum())
        if start < info.num_seqs:
            segs.append((k, start, info.num_seqs, first))
    if segs:
        units.append(segs)
    return units


# ----------------------------------------------------------------------------------------- export


def _chunks_of_store(store: Store, fields: Sequence[str], chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """Record ranges ``[a, b)`` holding about ``chunk_bytes`` of the fields' rows each."""
    n = len(store)
    schema = store.schema
    for a in range(0, n, _LENGTHS_BLOCK):
        b = min(a + _LENGTHS_BLOCK, n)
        cost = np.full(b - a, _TAG_COST, dtype=np.int64)
        for name in fields:
            f = schema[name]
            if f.ragged:
                cost += store.lengths(name)[a:b] * f.row_bytes
            else:
                cost += f.row_bytes
        for x, y in split_by_budget(cost, chunk_bytes):
            yield a + x, a + y


def _tag_bytes(tag: str, url: str, i: int) -> bytes:
    """Id ``tag`` of record ``i`` as the bytes of its HDF tag: UTF-8, where a tag imported from bytes that are
    not UTF-8 (kept as surrogate escapes, see ``decode_tag``) gets its own bytes back."""
    try:
        return tag.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise SchemaError(f"{url}: record {i}: id {tag!r} is not valid Unicode (a lone surrogate), which an HDF "
                          "tag cannot hold") from None


@parents_undone
def export_hdf(
    store: str | os.PathLike[str] | Store,
    out: str | os.PathLike[str],
    *,
    inputs: str | None = "auto",
    fields: Sequence[str] | Mapping[str, str] | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write a store as one RETURNN HDF file that RETURNN's ``HDFDataset`` loads.

    ``inputs``: the field written as ``inputs`` (``"auto"``: the one import_hdf recorded, else
    ``data`` if present; ``None``: no ``inputs``, targets only). ``fields``: the other fields to write
    as ``targets/data/<key>`` (a list, or a mapping field -> key; default: every other field, which
    must then have names without ``/``). A ragged field is a stream of its rows; a fixed field is a
    stream with one row per record (RETURNN's convention for per-sequence values). Rows must be 1-d
    (sparse) or 2-d (dense), as RETURNN's HDF streams are. Dims and labels come from the store's
    ``returnn`` metadata when present; a sparse stream without one gets dim = max value + 1. bfloat16
    fields are written as float32. Tags are the record ids (``seq-<i>`` without ids).

    Written in bulk: every dataset is allocated at its final size, then filled in record chunks of
    about ``chunk_bytes`` (one gather per chunk and field, one slice write per dataset): memory
    O(``chunk_bytes``). The file appears atomically (written under a temporary name, then renamed).
    ``progress`` gets the bytes of rows written (their total first, through ``add_total``).
    """
    h5py = h5py_module()
    target = local_output(out, "export_hdf")
    check_apart(store, [target], "export_hdf")
    chunk_bytes = check_size("export_hdf", "chunk_bytes", chunk_bytes)
    st = read_as_float32(store)
    schema = st.schema
    meta = st.metadata.get(METADATA_KEY, {})
    meta = meta if isinstance(meta, dict) else {}
    if inputs == "auto":
        recorded = meta.get("inputs")
        if recorded is not None and not isinstance(recorded, str):
            raise SchemaError(f"{st.url}: metadata['returnn']['inputs'] is {recorded!r:.100}; expected a field name "
                              "(or None); pass inputs=")
        inputs = recorded if recorded in schema else ("data" if "data" in schema else None)
    if inputs is not None and inputs not in schema:
        raise KeyError(f"{st.url}: no field {inputs!r} for inputs; fields are {list(schema)}")
    if fields is not None and not isinstance(fields, Mapping):
        check_named_once(st.url, field_list(fields) or [])
    keyed = name_map(fields, (n for n in schema if n != inputs))
    check_named_once(st.url, list(keyed.values()), "target key")
    for n, k in keyed.items():
        if n not in schema:
            raise KeyError(f"{st.url}: no field {n!r}; fields are {list(schema)}")
        if not isinstance(k, str) or "/" in k or k in ("", "data") or k == inputs:
            raise SchemaError(f"field {n!r}: {k!r} cannot be an HDF target key (no '/', not 'data'); "
                              "pass fields={field: key} to name it")
    if inputs is None and not keyed:
        raise SchemaError(f"{st.url}: nothing to export (no inputs field and no target fields)")
    streams: list[tuple[str, str]] = ([(inputs, "inputs")] if inputs else []) + [
        (n, f"targets/data/{k}") for n, k in sorted(keyed.items(), key=lambda kv: kv[1])
    ]
    for n, _ in streams:
        if len(schema[n].inner_shape) > 1:
            raise SchemaError(f"field {n!r}: rows of shape {schema[n].inner_shape}; RETURNN HDF streams have 1-d or "
                              "2-d rows")
    n_seqs = len(st)
    labels_meta = recorded_labels(st.url, meta, schema)
    dims = {n: stream_dims(st, n, schema[n]) for n, _ in streams}
    ncols = (1 if inputs else 0) + (len(keyed) if keyed else 1)
    check_output(target, overwrite, lambda r: r.is_dir(), "a directory (the output is one HDF5 file)")
    measured_max: dict[str, int] = {}
    with replaced(target) as tmp:
        with h5py.File(tmp, "w") as fout:
            dsets: dict[str, Any] = {}
            for n, hname in streams:
                f = schema[n]
                dt = np.dtype("float32") if f.dtype == "bfloat16" else f.storage_dtype
                rows = st.manifest.total_rows(n) if f.ragged else n_seqs
                dsets[n] = fout.create_dataset(hname, shape=(rows, *f.inner_shape), dtype=dt)
            seq_lengths = fout.create_dataset("seqLengths", shape=(n_seqs, ncols), dtype="int32")
            tags = fout.create_dataset("seqTags", shape=(n_seqs,), dtype=h5py.string_dtype("utf-8"))
            # bytes of one row as written (bfloat16 as float32): the unit of ``progress``
            row_out = {n: dsets[n].dtype.itemsize * int(np.prod(schema[n].inner_shape)) for n, _ in streams}
            announce_total(progress, sum(int(dsets[n].shape[0]) * row_out[n] for n, _ in streams))
            pos = {n: 0 for n, _ in streams}
            pending: deque[tuple[int, int]] = deque()  # chunks handed to iter_batches, not yet written

            def ranges() -> Iterator[np.ndarray[Any, Any]]:
                for a, b in _chunks_of_store(st, [n for n, _ in streams], chunk_bytes):
                    pending.append((a, b))
                    yield np.arange(a, b, dtype=np.int64)

            # the next chunk is read from disk while this one is written to HDF5
            for batch in st.iter_batches(ranges(), fields=[n for n, _ in streams], prefetch=1):
                a, b = pending.popleft()
                lens = np.zeros((b - a, ncols), dtype=np.int64)
                nbytes = 0
                for col, (n, _) in enumerate(streams):
                    values, lengths = batch[n] if schema[n].ragged else (batch[n], np.ones(b - a, dtype=np.int64))
                    if dims[n][0] is None and values.size:
                        measured_max[n] = max(measured_max.get(n, -1), int(values.max()))
                    dsets[n][pos[n] : pos[n] + len(values)] = values
                    pos[n] += len(values)
                    lens[:, col] = lengths
                    nbytes += len(values) * row_out[n]
                if lens.size and lens.max() > np.iinfo(np.int32).max:
                    raise SchemaError(f"{st.url}: a record of records {a}..{b - 1} has more than 2**31-1 rows")
                seq_lengths[a:b] = lens.astype(np.int32)
                ids = [st.id(i) for i in range(a, b)] if st.has_ids else [f"seq-{i}" for i in range(a, b)]
                if (bad := next((j for j, t in enumerate(ids) if "\0" in t), None)) is not None:
                    raise SchemaError(f"{st.url}: record {a + bad}: id {ids[bad]!r} holds a NUL, which an HDF tag "
                                      "cannot (h5py refuses it, and RETURNN cuts a tag at its first NUL)")
                tags[a:b] = np.array([_tag_bytes(t, st.url, a + j) for j, t in enumerate(ids)], dtype=object)
                if progress is not None:
                    progress(nbytes)

            def dim_of(n: str) -> int:
                d = dims[n][0]
                return d if d is not None else measured_max.get(n, 0) + 1

            d = dim_of(inputs) if inputs else 1
            fout.attrs.update({"inputPattSize": d, "numLabels": d, "numTimesteps": pos[inputs] if inputs else 0,
                               "numDims": 1, "numSeqs": n_seqs})
            if inputs:
                lab = labels_meta.get(inputs)
                if lab:
                    fout.create_dataset("labels", data=np.array(lab, dtype=object), dtype=h5py.string_dtype("utf-8"))
                else:
                    fout.create_dataset("labels", (0,), dtype="S5")
            if keyed:
                size = fout.require_group("targets/size")
                lab_group = fout.require_group("targets/labels")
                for n, k in keyed.items():
                    size.attrs[k] = np.array([dim_of(n), dims[n][1]], dtype=np.int64)
                    lab = labels_meta.get(n) or ["dummy-label"]
                    lab_group.create_dataset(k, data=np.array(lab, dtype=object), dtype=h5py.string_dtype("utf-8"))
    return target

