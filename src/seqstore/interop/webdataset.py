"""WebDataset tar shards into and out of a store.

A WebDataset shard is a tar file whose members are named ``KEY.EXT``: the members of one key, next to
each other in the tar, are one sample (``KEY`` is the name up to the first dot of its last path part,
``EXT`` the rest, lower-cased; members named ``__*__`` are skipped), as ``webdataset.WebDataset``
groups them.

**Import** (:func:`import_webdataset`): one record per key, the key as the record id, shards in the
order given (and records in tar order). Each extension is a field, decoded by its last dotted part:

==================================================  ===============================================
member                                               field
==================================================  ===============================================
``.npy`` (an array of ``numpy.save``)                a 0-d array: a scalar field; else ragged
                                                     ``(None, *shape[1:])`` (the rows are its first axis)
``.cls`` ``.cls2`` ``.class`` ``.count`` ``.index``   int64 scalar (the text as a decimal integer)
``.inx`` ``.id``
anything else (``.json``, ``.txt``, ``.jpg``, ...)   the member's bytes, ragged uint8
==================================================  ===============================================

Fields and their names: :func:`import_webdataset`. Shards are read as tar streams (local files, or URLs
through seqstore's object-store client; gzip-compressed shards too), one after another or ``workers``
at a time (runs of shards as parts of one commit, in shard order). Memory O(``chunk_bytes``).

**Export** (:func:`export_webdataset`): a store as shards ``000000.tar``, ``000001.tar``, ... in a
directory, each record a key (its id, or its index) with one member per field.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import re
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from ..errors import SchemaError
from ..schema import Field, Schema, field_list
from ..store import Store, Writer
from . import driver
from ._common import (
    Progress,
    SourceFormatError,
    announce_total,
    check_apart,
    check_named_once,
    check_output,
    check_size,
    local_output,
    parents_undone,
    read_as_float32,
    replaced,
)
from .tar_shards import KEY, META, ByteCounter, expand_shards, samples, shard_list, shard_size

__all__ = ["import_webdataset", "export_webdataset", "UnknownMemberError", "expand_shards", "METADATA_KEY",
           "INT_EXTENSIONS"]

#: Key of the import information (shards, extension -> field) in the store's metadata.
METADATA_KEY = "webdataset"
#: Extensions (last dotted part) read as a decimal integer, as webdataset's default decoder does.
INT_EXTENSIONS = frozenset({"cls", "cls2", "class", "count", "index", "inx", "id"})
#: Records per appended batch at most (bounds the per-chunk lists of small samples).
CHUNK_RECORDS = 1 << 14


class UnknownMemberError(SourceFormatError):
    """A tar member's extension has no field under a strict mapping; ``path`` is the shard,
    ``dataset`` the member's name."""


# ------------------------------------------------------------------------------------------ plans


def _kind(ext: str) -> str:
    last = ext.rsplit(".", 1)[-1]
    return "npy" if last == "npy" else "int" if last in INT_EXTENSIONS else "bytes"


def _default_field(ext: str) -> str:
    """The field of extension ``ext`` by default: the extension, less a ``.npy`` ending after another part
    (``score.npy`` -> ``score``; field names do not end in ``.npy``)."""
    return ext[: -len(".npy")] if ext.endswith(".npy") and ext != "npy" else ext


_NPY_HEADER = re.compile(r"^\{'descr': '([^']+)', 'fortran_order': False, 'shape': \(([0-9, ]*)\), *\} *\n?$")
_DTYPES: dict[str, np.dtype[Any]] = {}


def _check_room(path: str, member: str, shape: tuple[int, ...], dt: np.dtype[Any], follow: int) -> None:
    """SourceFormatError unless the ``follow`` bytes after a .npy header hold the ``shape`` of ``dt`` it
    declares (numpy.load allocates all of it before reading)."""
    need = math.prod(shape) * dt.itemsize
    if follow < need:
        raise SourceFormatError(path, member, f"not a .npy array: its header says shape {shape} of {dt}, "
                                f"{need} bytes, but {follow} bytes follow")


def _load_npy(path: str, member: str, data: bytes) -> np.ndarray[Any, Any]:
    """A .npy member as an array: the plain header ``numpy.save`` writes read by one regular expression
    (a view of ``data``), anything else by ``numpy.load`` once numpy's header reader has shown that the
    data it declares is there."""
    if data[:6] == b"\x93NUMPY" and len(data) >= 10:
        start = 10 if data[6] == 1 else 12  # the header's length: 2 bytes in version 1, 4 after
        end = start + int.from_bytes(data[8:start], "little")
        m = _NPY_HEADER.match(data[start:end].decode("latin1"))
        if m is not None:
            try:
                if (dt := _DTYPES.get(m.group(1))) is None:
                    dt = _DTYPES.setdefault(m.group(1), np.dtype(m.group(1)))
            except TypeError as exc:
                raise SourceFormatError(path, member, f"not a .npy array: {exc}") from exc
            shape = tuple(int(x) for x in m.group(2).replace(" ", "").split(",") if x)
            if dt.kind in "biufc":
                _check_room(path, member, shape, dt, len(data) - end)
                if len(data) - end == math.prod(shape) * dt.itemsize:
                    return np.frombuffer(data, dtype=dt, count=math.prod(shape), offset=end).reshape(shape)
    fp = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(fp)
        # (a version 3 header is a version 2 one in UTF-8: read as Latin-1 its shape and sizes are the same)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dt = read(fp)
        _check_room(path, member, tuple(shape), dt, len(data) - fp.tell())
        return np.load(io.BytesIO(data), allow_pickle=False)  # type: ignore[no-any-return]
    except (ValueError, OSError, EOFError, TypeError, SyntaxError) as exc:
        raise SourceFormatError(path, member, f"not a .npy array: {exc}") from exc


_INT64 = np.iinfo(np.int64)


def _int(path: str, member: str, data: bytes) -> int:
    try:
        value = int(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SourceFormatError(path, member, f"expected a decimal integer, got {data[:40]!r}") from exc
    if not _INT64.min <= value <= _INT64.max:
        raise SourceFormatError(path, member, f"{value} does not fit in int64, the dtype of an integer member's "
                                "field")
    return value


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How one extension becomes a field."""

    ext: str
    field: str
    kind: str  # "npy", "int" or "bytes"
    dtype: str
    shape: tuple[int | None, ...]

    def as_field(self) -> Field:
        return Field(self.dtype, self.shape)


def _plan(path: str, ext: str, field: str, member: str, data: bytes) -> _Plan:
    kind = _kind(ext)
    if kind == "int":
        _int(path, member, data)
        return _Plan(ext, field, kind, "int64", ())
    if kind == "bytes":
        return _Plan(ext, field, kind, "uint8", (None,))
    arr = _load_npy(path, member, data)
    if (dtype := _field_dtype(arr)) is None:
        raise SourceFormatError(path, member, f"array of dtype {arr.dtype} has no seqstore field")
    return _Plan(ext, field, kind, dtype, () if arr.ndim == 0 else (None, *arr.shape[1:]))


def _field_dtype(a: np.ndarray[Any, Any]) -> str | None:
    """The dtype of the field an array's values go to; None when no field holds them."""
    try:
        return str(Field(a.dtype).dtype)
    except SchemaError:
        return None


@dataclasses.dataclass(frozen=True)
class _WdsJob:
    """What a conversion needs to turn samples into appends (picklable, for parallel workers)."""

    shards: list[str]
    plans: dict[str, _Plan]
    strict: bool
    chunk_bytes: int
    options: dict[str, Any] | None

    def describe(self, segments: Sequence[int]) -> str:
        return ", ".join(self.shards[k] for k in segments)

    def write(self, writer: Writer, segments: Sequence[int], progress: Progress | None) -> None:
        """Append the samples of the shards ``segments`` (indices into ``shards``), in order."""
        for k in segments:
            path = self.shards[k]
            counter = ByteCounter()
            reported = 0
            keys: list[str] = []
            cols: dict[str, list[Any]] = {e: [] for e in self.plans}
            size = 0
            for key, members in samples(path, self.options, counter):
                for ext in members:
                    if ext not in self.plans and self.strict:
                        raise UnknownMemberError(path, members[ext][0], f"key {key!r}: extension .{ext} has no field "
                                                 f"(fields are { {e: p.field for e, p in self.plans.items()} }); map "
                                                 "it with fields={ext: field} or pass strict=False to skip such "
                                                 "members")
                for ext, plan in self.plans.items():
                    got = members.get(ext)
                    if got is None:
                        raise SourceFormatError(path, None, f"key {key!r} has no .{ext} member (field {plan.field!r} "
                                                "needs one in every sample)")
                    cols[ext].append(got)
                    size += len(got[1])
                keys.append(key)
                if size >= self.chunk_bytes or len(keys) >= CHUNK_RECORDS:
                    self._append(writer, path, keys, cols)
                    keys, cols, size = [], {e: [] for e in self.plans}, 0
                    if progress is not None:
                        progress(counter.count - reported)
                        reported = counter.count
            if keys:
                self._append(writer, path, keys, cols)
            if progress is not None:
                progress(shard_size(path, self.options) - reported)

    def _append(self, writer: Writer, path: str, keys: list[str], cols: dict[str, list[Any]]) -> None:
        batch: dict[str, Any] = {}
        for ext, plan in self.plans.items():
            items = cols[ext]
            if plan.kind == "bytes":
                lens = np.fromiter((len(d) for _, d in items), dtype=np.int64, count=len(items))
                batch[plan.field] = (np.frombuffer(b"".join(d for _, d in items), dtype=np.uint8), lens)
            elif plan.kind == "int":
                batch[plan.field] = np.fromiter((_int(path, m, d) for m, d in items), dtype=np.int64,
                                                count=len(items))
            else:
                arrays = [_load_npy(path, m, d) for m, d in items]
                want = plan.as_field()
                for (m, _), a in zip(items, arrays):
                    if _field_dtype(a) != want.dtype or (a.ndim == 0) != (not plan.shape) or (
                            a.ndim and a.shape[1:] != want.inner_shape):
                        raise SourceFormatError(path, m, f"array {a.dtype}{list(a.shape)} does not fit field "
                                                f"{plan.field!r} ({want}, from the first sample)")
                if plan.shape:
                    lens = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
                    batch[plan.field] = (np.concatenate(arrays).reshape(-1, *want.inner_shape), lens)
                else:
                    batch[plan.field] = np.stack(arrays)
        writer.append_batch(batch, ids=keys)


def import_webdataset(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    fields: Mapping[str, str] | None = None,
    strict: bool = True,
    source_options: Mapping[str, Any] | None = None,
    **options: Unpack[driver.ImportOptions],
) -> Store:
    """Import WebDataset tar shards into one new store at ``out``, and open it (see the module docs
    for how members become fields).

    ``sources``: tar files (``.tar``, ``.tar.gz``), directories of them (sorted by name), brace ranges
    (``"data-{000..099}.tar"``) or URLs (``https://``, ``s3://``, ... read through seqstore's
    object-store client with ``source_options``). ``fields``: ``{extension: field}`` to import (default:
    every extension of the first sample, named as the extension less a final ``.npy``). ``strict``: an
    extension without a field is an :class:`UnknownMemberError` (else skipped). Records are the samples
    in shard order, their keys the ids; a sample without a member of some field is an error naming the
    shard and key. The shards are checked to exist, and the first sample read, before anything is
    written. ``workers > 1`` reads that many shards at once (runs of shards as parts). ``progress``
    counts bytes of the shard files. The other keywords: :class:`~seqstore.interop.driver.Options`.
    """
    opts = driver.options("import_webdataset", out, options, sources)
    given = driver.source_list(sources, "import_webdataset")
    reading = dict(source_options) if source_options else None
    listed = shard_list(given, reading)  # (a URL's size by a HEAD as its name is made)
    shards = [name for name, _ in listed]
    first, where = None, shards[0]
    for where in shards:  # the first sample (empty shards before it hold no records)
        if (first := next(iter(samples(where, reading)), None)) is not None:
            break
    if first is None:
        every = shards[0] if len(shards) == 1 else f"{shards[0]} ... {shards[-1]} (all {len(shards)} shards)"
        raise SourceFormatError(every, None, "holds no samples (no member named KEY.EXT)")
    key, members = first
    mapping = dict(fields) if fields is not None else {ext: _default_field(ext) for ext in members}
    plans: dict[str, _Plan] = {}
    for ext, field in mapping.items():
        if ext not in members:
            raise SourceFormatError(where, None, f"first sample {key!r} has no .{ext} member; its extensions are "
                                    f"{sorted(members)}")
        name, data = members[ext]
        plans[ext] = _plan(where, ext, field, name, data)
    if len({p.field for p in plans.values()}) != len(plans):
        raise SchemaError(f"two extensions map to one field: {mapping}")
    try:
        schema = Schema({p.field: p.as_field() for p in plans.values()})
    except SchemaError as exc:
        raise SchemaError(f"{exc}; name the fields with fields={{ext: field}}") from exc
    total = sum(size for _, size in listed)
    meta = {"shards": [s.rsplit("/", 1)[-1] for s in shards],
            "fields": {e: {"field": p.field, "kind": p.kind} for e, p in plans.items()}}
    job = _WdsJob(shards, plans, strict, opts.chunk_bytes, reading)

    def units(workers: int) -> list[tuple[_WdsJob, list[int]]]:  # runs of shards, in order
        runs = np.array_split(np.arange(len(shards)), max(1, min(len(shards), 4 * workers)))
        return [(job, [int(i) for i in run]) for run in runs if len(run)]

    conv = driver.Conversion(schema, {METADATA_KEY: meta}, job, list(range(len(shards))), total, units)
    return driver.write(conv, out, opts)


# ------------------------------------------------------------------------------------------- export


def _export_plan(st: Store, fields: Sequence[str] | Mapping[str, str] | None) -> dict[str, tuple[str, str]]:
    """field -> (extension, kind) of each exported field."""
    recorded: dict[str, str] = {}
    meta = st.metadata.get(METADATA_KEY, {})
    if not isinstance(fields, Mapping) and isinstance(meta, dict) and isinstance(meta.get("fields"), dict):
        for e, v in meta["fields"].items():
            if isinstance(v, dict) and "field" in v:
                if not isinstance(v["field"], str):
                    raise SchemaError(f"{st.url}: metadata['webdataset']['fields'][{e!r}]['field'] is "
                                      f"{v['field']!r:.100}; expected a field name; pass fields={{field: extension}}")
                recorded[v["field"]] = e
    if isinstance(fields, Mapping):
        chosen: dict[str, str | None] = dict(fields)
    else:
        names = list(st.schema) if fields is None else field_list(fields) or []
        check_named_once(st.url, names)
        chosen = {n: recorded.get(n) for n in names}
    out: dict[str, tuple[str, str]] = {}
    for n, ext in chosen.items():
        if n not in st.schema:
            raise KeyError(f"{st.url}: no field {n!r}; fields are {list(st.schema)}")
        f = st.schema[n]
        if ext is None:
            byte_like = f.ragged and not f.inner_shape and f.dtype == "|u1"
            ext = n if (_kind(n) != "bytes" or byte_like) else f"{n}.npy"
        if not isinstance(ext, str) or "/" in ext or not ext or ext != ext.lower():
            raise SchemaError(f"field {n!r}: {ext!r} cannot be a tar member extension (lower case, no '/'); "
                              "pass fields={field: ext}")
        kind = _kind(ext)
        if kind == "int" and (f.ragged or f.inner_shape or f.dtype == "bfloat16"
                              or np.dtype(f.storage_dtype).kind not in "iub"):
            raise SchemaError(f"field {n!r}: .{ext} members hold one integer; the field is {f}")
        if kind == "bytes" and not (f.ragged and not f.inner_shape and f.dtype == "|u1"):
            raise SchemaError(f"field {n!r}: .{ext} members hold bytes, which need a ragged uint8 field; the field "
                              f"is {f} (name it NAME.npy to write arrays)")
        out[n] = (ext, kind)
    if len({e for e, _ in out.values()}) != len(out):
        raise SchemaError(f"two fields map to one extension: {out}")
    if not out:
        raise SchemaError(f"{st.url}: no fields to export (a sample without a member is no WebDataset sample)")
    return out


#: digits of the exported shards' numbers (more where there are more shards than these hold)
SHARD_DIGITS = 6


def _member(kind: str, value: Any) -> bytes:
    if kind == "int":
        return str(int(value)).encode()
    if kind == "bytes":
        return bytes(np.ascontiguousarray(value).data)
    buf = io.BytesIO()
    np.save(buf, np.asarray(value), allow_pickle=False)
    return buf.getvalue()


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
    tf.addfile(ti, io.BytesIO(data))


@parents_undone
def export_webdataset(
    store: str | os.PathLike[str] | Store,
    out: str | os.PathLike[str],
    *,
    fields: Sequence[str] | Mapping[str, str] | None = None,
    keys: str = "auto",
    shard_records: int = 10_000,
    shard_bytes: int = 1 << 30,
    chunk_records: int = 4096,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write a store as WebDataset shards ``out/000000.tar``, ``out/000001.tar``, ... that
    ``webdataset.WebDataset`` reads; returns the directory.

    Each record is a sample with one member per field: ``fields`` picks them (a list, or a mapping
    field -> extension); by default every field, with the extension :func:`import_webdataset`
    recorded, else the field's name when that already says how to read it (``.npy``, an integer
    extension such as ``.cls``, or any name for a ragged uint8 field: its bytes), else ``NAME.npy``;
    bfloat16 values are written as float32.
    ``keys``: ``"ids"`` (the record ids; an id with a ``.`` in its last path part, a NUL (where a tar
    member's name ends), a leading ``/`` or a ``..`` part (a name that climbs out of the directory a
    tar is extracted in) cannot be a key, nor
    one repeated in the next record, whose members a reader would join to the first's),
    ``"index"`` (the record number, 9 digits) or ``"auto"`` (ids when the store has them). A shard
    holds at most ``shard_records`` records and ends after the record that passes ``shard_bytes``.

    The shards are written in a hidden sibling directory renamed to ``out`` at the end (all or
    nothing; an existing ``out`` is replaced with ``overwrite`` only if it holds nothing but tar
    files). Memory O(``chunk_records``). ``progress`` gets records.
    """
    root = local_output(out, "export_webdataset")
    check_apart(store, [root], "export_webdataset")
    st = read_as_float32(store)  # (bfloat16 as float32, which a member's reader knows)
    plan = _export_plan(st, fields)
    if keys == "auto":
        keys = "ids" if st.has_ids else "index"
    if keys not in ("ids", "index"):
        raise ValueError(f"keys must be 'auto', 'ids' or 'index', got {keys!r}")
    if keys == "ids" and not st.has_ids:
        raise KeyError(f"{st.url}: records have no ids; pass keys='index'")
    shard_records = check_size("export_webdataset", "shard_records", shard_records)
    shard_bytes = check_size("export_webdataset", "shard_bytes", shard_bytes)
    chunk_records = check_size("export_webdataset", "chunk_records", chunk_records)
    check_output(root, overwrite, lambda r: not r.is_dir() or any(not p.name.endswith(".tar") for p in r.iterdir()),
                 "what is not a directory of tar shards", SchemaError)
    n = len(st)
    announce_total(progress, n)
    names = list(plan)
    with replaced(root) as tmp:
        tmp.mkdir()
        shard, in_shard, size = 0, 0, 0
        tf: tarfile.TarFile | None = None
        last_key = ""  # the key of the record before, in the shard open
        try:
            for a in range(0, n, chunk_records):
                b = min(n, a + chunk_records)
                batch = st.get_batch(np.arange(a, b), fields=names)
                # each ragged field's record offsets in the batch
                starts = {n: np.concatenate(([0], np.cumsum(batch[n][1], dtype=np.int64))) for n in names
                          if st.schema[n].ragged}
                if keys == "ids":
                    data, offs = st.ids(np.arange(a, b))
                    blob = bytes(data)
                for j in range(b - a):
                    if keys == "ids":
                        key = blob[int(offs[j]) : int(offs[j + 1])].decode("utf-8", "surrogatepass")
                        m = KEY.match(key + ".x")
                        if (m is None or m.group(1) != key or META.match(key) or "\0" in key
                                or key.startswith("/") or ".." in key.split("/")):  # (out of the directory)
                            raise SchemaError(f"{st.url}: record {a + j}: id {key!r} cannot be a WebDataset key (no "
                                              "'.' in its last path part, no NUL, not __name__, neither absolute nor "
                                              "with a '..' part); pass keys='index'")
                        if tf is not None and key == last_key:  # (in one shard: a reader joins them)
                            raise SchemaError(f"{st.url}: records {a + j - 1} and {a + j}: id {key!r} twice in a row; "
                                              "WebDataset reads the members of adjacent samples of one key as one "
                                              "sample, so they cannot be two; pass keys='index'")
                        last_key = key
                    else:
                        key = f"{a + j:09d}"
                    if tf is None:
                        tf = tarfile.open(tmp / f"{shard:0{SHARD_DIGITS}d}.tar", "w", format=tarfile.USTAR_FORMAT
                                          if keys == "index" else tarfile.PAX_FORMAT)
                    for name in names:
                        ext, kind = plan[name]
                        got = batch[name]
                        value = got[0][int(starts[name][j]) : int(starts[name][j + 1])] if name in starts else got[j]
                        data_j = _member(kind, value)
                        _add(tf, f"{key}.{ext}", data_j)
                        size += len(data_j)
                    in_shard += 1
                    if in_shard >= shard_records or size >= shard_bytes:
                        tf.close()
                        tf, shard, in_shard, size = None, shard + 1, 0, 0
                if progress is not None:
                    progress(b - a)
        finally:
            if tf is not None:
                tf.close()
                shard += 1
        wide = len(str(max(shard - 1, 0)))
        if wide > SHARD_DIGITS:  # more names than the digits hold: all as wide, so that their order is by name
            for k in range(shard):
                os.replace(tmp / f"{k:0{SHARD_DIGITS}d}.tar", tmp / f"{k:0{wide}d}.tar")
    return root
