"""Import of LogIX (and older AnaLog) per-example logs into a store: :func:`import_logix`.

A LogIX log directory holds ``log_rank_{R}_chunk_{C}.mmap`` (raw bytes, records back to back) and
``log_rank_{R}_chunk_{C}_metadata.json`` (see /work/shared/reference/logix-format.md). Two metadata
schemas exist and both are read:

- LogIX: one object per record: ``data_id``, ``path`` (list of key paths, e.g. ``[["fc1", "grad"], ...]``),
  ``offset`` (bytes), ``shape`` (one shape per path), ``block_size`` (elements), ``dtype``;
  the arrays are raveled and concatenated in ``path`` order.
- AnaLog (older): one object per (data_id, module): ``data_id``, ``size`` (bytes), ``path`` (one key
  path), ``offset`` (bytes), ``shape``, ``dtype``; consecutive objects of one data_id form a record.

Chunks are read in LogIX's order (rank, then chunk), one at a time, and written in batches of at most
``batch_records`` records: memory O(one chunk's metadata + one batch). Key paths become field names
joined by ``/`` (other characters than ``[A-Za-z0-9_.-]`` become ``_``), packed one group per dtype.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError, SchemaError
from ..schema import Field, Schema
from ..store import Writer
from ..store.reader import open_store
from ._tensors import default_packing

__all__ = ["import_logix", "ImportReport", "find_logix_chunks"]

_CHUNK_RE = re.compile(r"rank_(\d+)_chunk_(\d+)")
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")


@dataclass
class ImportReport:
    """What :func:`import_logix` did."""

    records: int
    duplicates_skipped: int
    chunks: int
    bytes: int
    seconds: float
    fields: dict[str, str]  # field name -> LogIX key path joined by "/"


def find_logix_chunks(logdir: str | os.PathLike[str]) -> list[tuple[int, int, Path, Path]]:
    """``(rank, chunk, data file, metadata file)`` of every chunk, in LogIX's load order.

    Files are ``log_*.mmap`` with a sibling ``*_metadata.json``; names without ``rank_R_chunk_C``
    sort as rank 0 by their last number.
    """
    root = Path(logdir)
    if not root.is_dir():
        raise FormatError(f"{root}: not a directory")
    out = []
    for p in root.iterdir():
        if not (p.name.startswith("log_") and p.name.endswith(".mmap")):
            continue
        stem = p.name[: -len(".mmap")]
        m = _CHUNK_RE.search(stem)
        if m:
            rank, chunk = int(m.group(1)), int(m.group(2))
        else:
            nums = re.findall(r"\d+", stem)
            rank, chunk = 0, int(nums[-1]) if nums else 0
        meta = root / f"{stem}_metadata.json"
        if not meta.exists():
            raise FormatError(f"{meta}: missing (the metadata of {p.name})")
        out.append((rank, chunk, p, meta))
    if not out:
        raise FormatError(f"{root}: no LogIX chunks (log_*.mmap) found")
    out.sort(key=lambda t: (t[0], t[1], t[2].name))
    return out


@dataclass
class _Record:
    data_id: str
    offsets: list[int]  # byte offset of each field's values in the chunk
    keys: list[tuple[str, ...]]
    shapes: list[tuple[int, ...]]
    dtypes: list[str]


def _records(meta: Any, path: Path) -> Iterator[_Record]:
    """Normalise either metadata schema to one :class:`_Record` per record; an entry that lacks a key or
    holds a value of the wrong kind is a FormatError naming the file and the entry."""
    at = [0]  # the entry being read
    try:
        yield from _parse(meta, path, at)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise FormatError(f"{path}: metadata entry {at[0]} is malformed ({type(exc).__name__}: {exc})") from None


def _parse(meta: Any, path: Path, at: list[int]) -> Iterator[_Record]:
    if not isinstance(meta, list):
        raise FormatError(f"{path}: expected a JSON list of records")
    if meta and "block_size" in meta[0]:  # LogIX: one object per record
        for at[0], e in enumerate(meta):
            keys = [tuple(str(k) for k in p) for p in e["path"]]
            shapes = [tuple(int(s) for s in sh) for sh in e["shape"]]
            itemsize = np.dtype(e["dtype"]).itemsize
            offs, pos = [], int(e["offset"])
            for sh in shapes:
                offs.append(pos)
                pos += int(np.prod(sh, dtype=np.int64)) * itemsize
            if (pos - int(e["offset"])) // itemsize != int(e["block_size"]):
                raise FormatError(
                    f"{path}: data_id {e['data_id']!r}: block_size {e['block_size']} does not match its shapes"
                )
            yield _Record(str(e["data_id"]), offs, keys, shapes, [str(e["dtype"])] * len(keys))
        return
    current: _Record | None = None  # AnaLog: one object per (data_id, module), grouped by data_id
    for at[0], e in enumerate(meta):
        did = str(e["data_id"])
        key = tuple(str(k) for k in e["path"])
        if current is None or current.data_id != did or key in current.keys:
            if current is not None:
                yield current
            current = _Record(did, [], [], [], [])
        shape = tuple(int(s) for s in e["shape"])
        if int(e["size"]) != int(np.prod(shape, dtype=np.int64)) * np.dtype(e["dtype"]).itemsize:
            raise FormatError(f"{path}: data_id {did!r}, {'/'.join(key)}: size {e['size']} does not match its shape")
        current.offsets.append(int(e["offset"]))
        current.keys.append(key)
        current.shapes.append(shape)
        current.dtypes.append(str(e["dtype"]))
    if current is not None:
        yield current


def _field_name(key: tuple[str, ...]) -> str:
    parts = []
    for k in key:
        p = _BAD_CHARS.sub("_", k) or "_"
        if not p[0].isalnum():
            p = "x" + p
        if p.endswith(".offsets") or p.endswith(".npy"):
            p += "_"
        parts.append(p)
    return "/".join(parts)


def _gather(mm: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any], nbytes: int,
            dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """Rows of ``nbytes`` bytes at byte ``offsets`` of ``mm`` as an ``(n, nbytes/itemsize)`` array.

    A strided zero-copy view when the offsets are evenly spaced (LogIX writes records back to back);
    else one copy per row. The caller checked that the rows lie inside ``mm``.
    """
    n = len(offsets)
    if n == 0:
        return np.empty((0, nbytes // dtype.itemsize), dtype=dtype)
    step = int(offsets[1] - offsets[0]) if n > 1 else nbytes
    if n == 1 or (step >= nbytes and np.all(np.diff(offsets) == step)):
        o0 = int(offsets[0])
        raw = np.lib.stride_tricks.as_strided(mm[o0:], shape=(n, nbytes), strides=(step, 1), writeable=False)
        if int(o0) % dtype.itemsize == 0 and step % dtype.itemsize == 0:
            return raw.view(dtype)
        return np.ascontiguousarray(raw).view(dtype)
    out = np.empty((n, nbytes), dtype=np.uint8)
    for k, o in enumerate(offsets.tolist()):
        out[k] = mm[o : o + nbytes]
    return out.view(dtype)


def import_logix(logdir: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False,
                 batch_records: int = 4096, metadata: dict[str, Any] | None = None,
                 progress: Callable[[int], None] | None = None, shard_bytes: int = 1 << 30,
                 storage_options: Mapping[str, Any] | None = None) -> ImportReport:
    """Convert the LogIX log in ``logdir`` into a new store at ``out``; return an :class:`ImportReport`.

    Record ``data_id`` becomes the record id; each logged array a field (``"fc1/grad"``). Records keep
    LogIX's order (rank, chunk, position); a repeated ``data_id`` keeps its first occurrence. All or
    nothing, through the importers' driver (:mod:`seqstore.interop.driver`): the store is built in a
    hidden sibling of ``out`` (committed chunk by chunk there, for the duplicate check) and renamed into
    place at the end, so a failure leaves ``out`` as it was (an existing store, with ``overwrite``,
    intact); a URL ``out`` (``storage_options``: its client's options) is built in a local temporary
    directory (room for the store needed there) and copied to the URL once complete
    (:func:`seqstore.copy`: its manifest last), so a log that fails leaves the URL untouched. Raises
    :class:`~seqstore.FormatError` for a missing/malformed chunk and :class:`~seqstore.SchemaError`
    when records disagree on modules, shapes or dtypes. ``progress`` is called with the running total
    of records imported (not an increment); if it has an ``add_total(n)`` method, that is called with
    the records each chunk will add (duplicates excluded) before they are written. ``shard_bytes``: the
    store's shard size, as for the other importers.
    """
    from ..interop import driver
    from ..interop._common import check_size, file_url_path

    t0 = time.perf_counter()
    logdir = file_url_path(logdir)  # (a file:// URL as its path, as every importer takes its sources)
    opts = driver.options("import_logix", out, {"overwrite": overwrite, "shard_bytes": shard_bytes,
                                                "storage_options": storage_options}, logdir)
    batch_records = check_size("import_logix", "batch_records", batch_records)
    chunks = find_logix_chunks(logdir)
    job = _plan(chunks, logdir, batch_records)
    meta = {"imported_from": "logix", "source": str(Path(logdir).resolve()), "fields": job.fields,
            **(metadata or {})}
    conv = driver.Conversion(job.schema, meta, job, chunks, None, url_as_parts=False,
                             packed=default_packing(job.schema), reads_back=True)
    driver.write(conv, out, dataclasses.replace(opts, progress=progress))
    return ImportReport(job.records, job.skipped, len(chunks), job.nbytes, time.perf_counter() - t0, job.fields)


def _chunk_records(meta_path: Path) -> list[_Record]:
    """The records a chunk's metadata file lists (FormatError naming the file when it cannot be read)."""
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        raise FormatError(f"{meta_path}: cannot read LogIX metadata ({exc})") from exc
    return list(_records(meta, meta_path))


def _plan(chunks: list[tuple[int, int, Path, Path]], logdir: str | os.PathLike[str], batch_records: int) -> _Job:
    """The import's job, its schema taken from the log's first record (FormatError for a log without one)."""
    for _rank, _chunk, _data, meta_path in chunks:
        recs = _chunk_records(meta_path)
        if recs:
            break
    else:
        raise FormatError(f"{logdir}: the log holds no records")
    r0 = recs[0]
    names = [_field_name(k) for k in r0.keys]
    if len(set(names)) != len(names):
        raise SchemaError(f"{meta_path}: module paths {r0.keys} collide after renaming to {names}")
    spec = {}
    for n, key, sh, dt in zip(names, r0.keys, r0.shapes, r0.dtypes):
        try:
            spec[n] = Field(dt, sh)
        except SchemaError as exc:
            raise SchemaError(f"{meta_path}: data_id {r0.data_id!r}, {'/'.join(key)}: {exc}") from None
    return _Job(Schema(spec), names, (r0.keys, r0.shapes, r0.dtypes), batch_records,
                {n: "/".join(k) for n, k in zip(names, r0.keys)})


@dataclass(eq=False)
class _Job:
    """The LogIX import as the driver's job: ``write`` appends the records of the chunks it is given,
    committing after each chunk so that the next chunk's duplicates are found in the store so far;
    it counts what it did."""

    schema: Schema
    names: list[str]
    signature: tuple[Any, ...]  # (keys, shapes, dtypes) of the log's first record
    batch_records: int
    fields: dict[str, str]  # field name -> LogIX key path
    records: int = 0
    skipped: int = 0
    nbytes: int = 0

    def write(self, writer: Writer, chunks: list[tuple[int, int, Path, Path]],
              progress: Callable[[int], None] | None) -> None:
        for _rank, _chunk, data_path, meta_path in chunks:
            recs = _chunk_records(meta_path)
            if recs:
                self._chunk(writer, recs, data_path, meta_path, progress)

    def _chunk(self, writer: Writer, recs: list[_Record], data_path: Path, meta_path: Path,
               progress: Callable[[int], None] | None) -> None:
        schema, names, signature = self.schema, self.names, self.signature
        for r in recs:
            if (r.keys, r.shapes, r.dtypes) != signature:
                raise SchemaError(
                    f"{meta_path}: data_id {r.data_id!r} has modules/shapes/dtypes "
                    f"{list(zip(r.keys, r.shapes, r.dtypes))}, the log's first record has {list(zip(*signature))}"
                )
        # first occurrence wins: within this chunk, then against everything imported before
        first: dict[str, int] = {}
        for k, r in enumerate(recs):
            first.setdefault(r.data_id, k)
        keep = list(first.values())
        if self.records:
            found = open_store(writer.root).index_many([recs[k].data_id for k in keep], missing=-1)
            keep = [k for k, f in zip(keep, found.tolist()) if f < 0]
        self.skipped += len(recs) - len(keep)
        add_total = getattr(progress, "add_total", None)  # a progress bar learns the size chunk by chunk
        if add_total is not None:
            add_total(len(keep))
        mm = np.memmap(data_path, dtype=np.uint8, mode="r") if data_path.stat().st_size else np.empty(0, np.uint8)
        offsets = np.array([r.offsets for r in recs], dtype=np.int64)  # (records, fields)
        ends = offsets + np.array([schema[n].row_bytes for n in names], dtype=np.int64)
        bad = np.asarray(keep, dtype=np.int64)
        bad = bad[((offsets[bad] < 0) | (ends[bad] > len(mm))).any(axis=1)]
        if len(bad):
            raise FormatError(f"{data_path}: data_id {recs[int(bad[0])].data_id!r}: its values lie outside the "
                              f"file ({len(mm)} bytes; {len(bad)} record(s) of this chunk do)")
        for a in range(0, len(keep), self.batch_records):
            sel = np.array(keep[a : a + self.batch_records], dtype=np.int64)
            cols = {}
            for j, name in enumerate(names):
                f = schema[name]
                cols[name] = _gather(mm, offsets[sel, j], f.row_bytes, f.storage_dtype).reshape(
                    len(sel), *f.inner_shape
                )
            writer.append_batch(cols, ids=[recs[k].data_id for k in sel.tolist()])
            self.records += len(sel)
            self.nbytes += sum(c.nbytes for c in cols.values())
            if progress is not None:
                progress(self.records)
        del mm
        writer.add_stats({"duplicates_skipped": len(recs) - len(keep)})
        writer.commit()  # chunk by chunk: ids become visible to the duplicate check
