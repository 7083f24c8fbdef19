"""Distributed writes: tasks write parts of a store, one driver commits them all at once.

This is the primitive under ``seqstore convert --workers N`` and the Ray Data and Spark writers
(docs/distributed.md). A *job* is one distributed write; each *task attempt* of the job writes its
records into its own *part*, a directory of finished shards in the store's parts area, and reports
the small :class:`Part` description to the driver. The driver commits the parts it chooses with
one manifest commit: all of their records become visible at once, in the order of the parts given,
or none do. Nothing a task does is visible to readers before that commit, so a failed or retried
attempt that is never committed leaves nothing visible, and :func:`discard_parts` deletes it.

Driver, before the tasks start::

    prepare_store(path, schema, mode="append")          # creates the store if needed, checks the schema

Each task (any process on any machine that sees the store's file system)::

    w = PartWriter(path, job=job_id, task=attempt_id)  # attempt_id unique per attempt of a task
    w.append_batch(columns, ids=ids)                   # as Writer.append_batch / Writer.append
    part = w.finish()                                  # durable; picklable; part.to_json() for JSON
    # on an exception: w.abort() (or leave a ``with`` block), which deletes what it wrote

Driver, once the tasks reported::

    n = commit_parts(path, parts, mode="append")       # one commit; record order = order of ``parts``
    discard_parts(path, job_id)                        # deletes attempts that were not committed
    # on failure instead: discard_parts(path, parts or job_id): nothing of the job remains

Layout (docs/format.md, section 1): ``<store>/_parts/<job>/<task>/`` holds the attempt's files:
``owner.lock`` (flocked while a live PartWriter writes), ``current/`` (the shard being written),
``p000000/``, ``p000001/``, ... (finished shards, each with its ``_shard.json`` descriptor) and, once
finished, ``part.json`` (the :class:`Part`). A part survives the end of the task's process; no
writer's orphan clean-up (:func:`~seqstore.store.commit.clean_orphans`, which looks only at ``_tmp/``,
``_index/`` and one shard name) ever touches ``_parts/``. A job's directory goes away only through
:func:`discard_parts` or :func:`clean_parts` (by age). Once committed, a part's directory keeps only
``committed.json`` (so committing it again is a clear error) until its job is discarded.

:func:`commit_parts` holds the store's commit lock and writes a journal, ``_parts/.commit.json``
(where every part shard goes, the table state the commit ends in), before it renames the part
shards to ``shard-NNNNNN`` and writes their table rows; then it saves the manifest, the commit
point. Whoever takes the lock next (a commit of any writer, a new writer, :func:`discard_parts`)
and finds a journal finishes the commit when the manifest shows it (marks the parts committed,
deletes replaced shards) or undoes it otherwise (moves the shards back into their parts), so a crash
at any step leaves either all of the parts committed or all of them pending, never a mix.
Everything the driver does is O(parts + shards), never O(records).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import re
import shutil
import struct
import time
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptionError, FormatError, SchemaError, SeqstoreError
from ..format.descriptor import DESCRIPTOR
from ..format.manifest import COMMIT_JOURNAL, MANIFEST, PARTS_DIR, WORK_DIR, Manifest, fsync_dir
from ..format.shard_table import (
    TABLE,
    TABLE_HEADER_BYTES,
    TableState,
    encode_row,
    encode_table_header,
    row_dtype,
    shard_dir_name,
)
from ..io.objects import is_remote
from ..schema import Schema
from .commit import (
    _append_row,
    _maybe_merge_index,
    clean_orphans,
    next_shard_number,
    recover_batch_commit,
    store_lock,
)
from .directio import pwrite_all
from .writer import Writer, _checked_schema, install_new_store

__all__ = [
    "PARTS_DIR",
    "Part",
    "PartShard",
    "PartWriter",
    "clean_parts",
    "commit_parts",
    "discard_parts",
    "pending_jobs",
    "prepare_store",
]

log = logging.getLogger(__name__)

#: The journal of a multi-shard commit in progress (``_parts/.commit.json``).
JOURNAL = COMMIT_JOURNAL
#: The schema (and metadata) a ``mode="overwrite"`` job's commit installs (``_parts/.staged.json``).
STAGED = ".staged.json"
#: During an overwrite commit: a hard link to the replaced shard table (``_parts/.old.tbl``).
OLD_TABLE = ".old.tbl"
PART_FILE = "part.json"
COMMITTED_FILE = "committed.json"
OWNER = "owner.lock"
MODES = ("create", "append", "overwrite")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._=-]{0,199}\Z")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(
            f"{what} must be 1-200 characters of letters, digits, '_', '-', '.', '=' not starting with '.' or '-' "
            f"(it names a directory), got {value!r}"
        )
    return value


def _schema_crc(schema: Schema) -> int:
    return zlib.crc32(json.dumps(schema.to_json(), sort_keys=True).encode())


def _write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` to ``path`` atomically and durably (temporary file, fsync, rename, fsync dir)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    data = json.dumps(obj, separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
    try:
        pwrite_all(fd, memoryview(data), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


# ------------------------------------------------------------------------------------------ parts


@dataclasses.dataclass(frozen=True)
class PartShard:
    """One finished shard of a part: its directory in the part (``p000000``), records, rows per ragged
    field, whether it has ids, ``files`` (relative path -> (bytes, CRC-32 of the data bytes)) and the
    CRC-32 of its descriptor ``_shard.json`` (checked by :func:`commit_parts`)."""

    dir: str
    records: int
    rows: dict[str, int]
    has_ids: bool
    files: dict[str, tuple[int, int]]
    desc_crc: int

    def to_json(self) -> dict[str, Any]:
        return {
            "dir": self.dir, "records": self.records, "rows": dict(self.rows), "has_ids": self.has_ids,
            "files": {k: [b, c] for k, (b, c) in self.files.items()}, "desc_crc": self.desc_crc,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PartShard:
        return cls(str(obj["dir"]), int(obj["records"]), {str(k): int(v) for k, v in obj["rows"].items()},
                   bool(obj["has_ids"]), {str(k): (int(v[0]), int(v[1])) for k, v in obj["files"].items()},
                   int(obj["desc_crc"]))


@dataclasses.dataclass(frozen=True)
class Part:
    """What :meth:`PartWriter.finish` returns and :func:`commit_parts` takes: the job and task attempt
    it belongs to, its records and its finished shards (O(shards x files) small values), and the
    CRC-32 of the schema it was written with. Picklable; :meth:`to_json` / :meth:`from_json` give a
    JSON object (``commit_parts`` and ``discard_parts`` also take those objects as they are)."""

    job: str
    task: str
    records: int
    shards: tuple[PartShard, ...]
    schema_crc: int

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "task": self.task, "records": self.records,
                "shards": [s.to_json() for s in self.shards], "schema_crc": self.schema_crc}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Part:
        try:
            return cls(_check_name(obj["job"], "job"), _check_name(obj["task"], "task"), int(obj["records"]),
                       tuple(PartShard.from_json(s) for s in obj["shards"]), int(obj["schema_crc"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a part description ({type(exc).__name__}: {exc}): {obj!r:.200}") from exc


_SHARD_DIR = re.compile(r"p[0-9]{6,}\Z")


def _as_part(p: Part | Mapping[str, Any]) -> Part:
    """``p`` as a Part, its names checked (they become paths: a part from JSON must not point elsewhere)."""
    if isinstance(p, Part):
        _check_name(p.job, "job")
        _check_name(p.task, "task")
        for sh in p.shards:
            if not isinstance(sh.dir, str) or not _SHARD_DIR.match(sh.dir):
                raise ValueError(f"part {p.job}/{p.task}: shard directory {sh.dir!r} is not p<number>")
        return p
    if isinstance(p, Mapping):
        return _as_part(Part.from_json(p))
    raise TypeError(f"expected a Part (or its to_json() object), got {type(p).__name__}")


# ------------------------------------------------------------------------------------ the target


def _target(root: Path) -> tuple[Manifest, dict[str, Any] | None]:
    """The store's manifest (version 3 required) and the staged overwrite settings, if any; a commit
    of parts that died part way is finished or undone first."""
    if (root / PARTS_DIR / JOURNAL).exists():
        with store_lock(root):
            recover_batch_commit(root)
    manifest = Manifest.load(root)
    if manifest.table is None:
        raise FormatError(
            f"{root}: a version-{manifest.version} store; parts need a version-3 store (one created by this "
            "seqstore). Convert it or write a new store."
        )
    staged_path = root / PARTS_DIR / STAGED
    staged = json.loads(staged_path.read_bytes()) if staged_path.exists() else None
    return manifest, staged


def _staged_schema(staged: Mapping[str, Any]) -> Schema:
    return Schema.from_json(staged["schema"])


def _local_root(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None) -> Path:
    """``path`` as a local directory (``file://`` stripped); storage_options belong to URLs only."""
    if storage_options:
        raise ValueError(f"{path}: storage_options are for URLs of object storage, not local paths")
    text = os.fspath(path)
    return Path(text[len("file://") :] if text.startswith("file://") else text)


def prepare_store(
    path: str | os.PathLike[str],
    schema: Mapping[str, Any] | Schema,
    *,
    metadata: Mapping[str, Any] | None = None,
    id_lookup: str = "first",
    mode: str = "create",
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Driver side, before the tasks start: make ``path`` ready for the job's :class:`PartWriter`\\ s.

    ``mode="create"``: create a new (version-3) store; an existing store (or non-empty directory) at
    ``path`` raises :class:`FileExistsError` naming it. ``"append"``: create the store if there is none,
    else check that it has this ``schema`` and ``id_lookup`` (:class:`SchemaError` naming the path and
    both schemas); ``metadata`` is used only when the store is created. ``"overwrite"``: create the store
    if there is none; for an existing one, when the schema, ``id_lookup`` or ``metadata`` differ, they
    are staged (``_parts/.staged.json``) and installed by the ``commit_parts(..., mode="overwrite")``
    that replaces the store's shards, so readers see the old store until that commit. Run one
    overwrite job at a time, and no plain writer of the old schema while it runs.

    A URL of object storage (``s3://``, ``gs://``, ``az://``; with ``storage_options``) is prepared by
    :func:`seqstore.store.remote_parts.prepare_store`, and so are the functions below for a URL.
    """
    if is_remote(path):
        from . import remote_parts

        remote_parts.prepare_store(os.fspath(path), schema, metadata=metadata, id_lookup=id_lookup, mode=mode,
                                   storage_options=storage_options)
        return
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    root = _local_root(path, storage_options)
    sch = _checked_schema(schema, None, id_lookup)
    exists = (root / MANIFEST).exists()
    if not exists and root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise SeqstoreError(f"{root}: exists and is not a store (a file or a non-empty directory)")
    if mode == "create" and exists:
        raise FileExistsError(f"{root}: a store already exists (mode='create'); use mode='append' or 'overwrite'")
    if not exists:
        created = install_new_store(root, sch, metadata, id_lookup)
        if mode == "create" and not created:
            raise FileExistsError(f"{root}: another process created a store here first (mode='create')")
        if created:
            return
    manifest, _ = _target(root)
    same = manifest.schema == sch and manifest.id_lookup == id_lookup
    if mode == "append":
        if manifest.schema != sch:
            raise SchemaError(f"{root}: existing store has schema {manifest.schema!r}, the job writes {sch!r}")
        if manifest.id_lookup != id_lookup:
            raise SchemaError(f"{root}: existing store has id_lookup {manifest.id_lookup!r}, expected {id_lookup!r}")
        return
    staged_path = root / PARTS_DIR / STAGED
    with store_lock(root):
        if same and (metadata is None or dict(metadata) == manifest.metadata):
            staged_path.unlink(missing_ok=True)
            return
        (root / PARTS_DIR).mkdir(exist_ok=True)
        _write_json(staged_path, {"schema": sch.to_json(), "id_lookup": id_lookup,
                                  "metadata": None if metadata is None else dict(metadata)})


# ---------------------------------------------------------------------------------------- writer


class PartWriter(Writer):
    """Writes one task attempt's records as a part of the store at ``path`` (see the module docs).

    ``job`` names the distributed write, ``task`` this attempt (unique within the job: a retried task
    must use a new attempt id). ``append``/``append_batch`` validate and buffer exactly as
    :class:`~seqstore.store.writer.Writer` does (same errors; record numbers in messages count from the
    part's first record); a shard is finished (not committed) whenever it reaches ``shard_bytes`` or
    ``max_shard_records``. :meth:`finish` finishes the last shard, makes the part durable and returns
    its :class:`Part`; nothing becomes visible until the driver's :func:`commit_parts`. :meth:`abort`
    (also on leaving a ``with`` block by an exception, or without ``finish``) deletes the part.
    The schema is the store's, or the one staged by ``prepare_store(..., mode="overwrite")``.

    For a URL of object storage ``PartWriter(url, ..., storage_options=...)`` makes a
    :class:`~seqstore.store.remote_parts.RemotePartWriter` (shards staged locally and uploaded into
    the store's ``_parts/<job>/<task>/``; it also takes ``staging_dir`` and ``upload_workers``).
    """

    def __new__(cls, path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> PartWriter:
        if cls is PartWriter and is_remote(path):
            from .remote_parts import RemotePartWriter

            return super().__new__(RemotePartWriter)
        if cls is PartWriter and (kwargs.get("storage_options") or kwargs.get("staging_dir") is not None):
            raise ValueError(f"{path}: storage_options and staging_dir are for URLs of object storage, not local paths")
        return super().__new__(cls)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        job: str,
        task: str,
        shard_bytes: int = 1 << 30,
        buffer_bytes: int = 64 << 20,
        max_shard_records: int = 1 << 24,
        direct_io: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        staging_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.job = _check_name(job, "job")
        self.task = _check_name(task, "task")
        self._part_shards: list[PartShard] = []
        self._part: Part | None = None
        super().__init__(_local_root(path, storage_options), shard_bytes=shard_bytes, buffer_bytes=buffer_bytes,
                         max_shard_records=max_shard_records, direct_io=direct_io)
        self._has_ids = None  # parts are independent of the store's shards until the commit checks them
        self._records_before = 0
        self._schema_crc = _schema_crc(self.schema)

    def _open_workspace(self) -> Manifest:
        manifest, staged = _target(self.root)
        if staged is not None:
            manifest = dataclasses.replace(manifest, schema=_staged_schema(staged))
        parts = self.root / PARTS_DIR
        job_dir = parts / self.job
        task_dir = job_dir / self.task
        new_parts, new_job = not parts.is_dir(), not job_dir.is_dir()
        job_dir.mkdir(parents=True, exist_ok=True)
        try:
            task_dir.mkdir()
        except FileExistsError:
            if (task_dir / PART_FILE).exists() or (task_dir / COMMITTED_FILE).exists():
                raise SeqstoreError(
                    f"{task_dir}: task attempt {self.task!r} of job {self.job!r} already finished; each attempt "
                    "needs its own task id"
                ) from None
            if not _remove_if_dead(task_dir):
                raise SeqstoreError(
                    f"{task_dir}: a live PartWriter is writing task attempt {self.task!r} of job {self.job!r}"
                ) from None
            task_dir.mkdir()
        fsync_dir(job_dir)
        if new_job:
            fsync_dir(parts)
        if new_parts:
            fsync_dir(self.root)
        self._workspace = task_dir
        self._owner_fd = os.open(task_dir / OWNER, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644)
        fcntl.flock(self._owner_fd, fcntl.LOCK_EX)
        return manifest

    def _commit_shard_files(self) -> None:
        """Finish the current shard and keep it in the part as ``p<k>`` (no store commit)."""
        pending = self._finish_shard_files()
        name = f"p{len(self._part_shards):06d}"
        os.rename(self._workspace / "current", self._workspace / name)
        fsync_dir(self._workspace)
        files = {k: (v.bytes, v.crc32) for k, v in pending.files.items()}
        self._part_shards.append(PartShard(name, pending.records, dict(pending.rows), pending.has_ids, files,
                                           self._desc_crc))
        self._committed_records += pending.records
        self._shard_open = False

    def finish(self) -> Part:
        """Finish the part: write what is buffered, finish the last shard, fsync everything, write
        ``part.json`` and release the writer. Returns the :class:`Part` to hand to the driver (again on
        a second call). No commit: readers see nothing of it until :func:`commit_parts`."""
        if self._part is not None:
            return self._part
        self._check_open()
        self._flush()
        if self._shard_open:
            self._commit_shard()
        part = Part(self.job, self.task, sum(s.records for s in self._part_shards), tuple(self._part_shards),
                    self._schema_crc)
        with self._failing():
            _write_json(self._workspace / PART_FILE, part.to_json())
        self._part = part
        self._release()
        return part

    @property
    def part(self) -> Part | None:
        """The :class:`Part` once :meth:`finish` returned, else None."""
        return self._part

    def commit(self) -> None:
        raise SeqstoreError(
            f"{self.root}: a PartWriter does not commit; call finish() and let the driver call commit_parts()"
        )

    def add_stats(self, delta: Mapping[str, float]) -> None:
        raise SeqstoreError(f"{self.root}: a PartWriter keeps no stats")

    def close(self) -> None:
        """Release the writer; a part not finished is discarded (as :meth:`abort`)."""
        if self._closed:
            return
        log.warning("%s: PartWriter of task %r closed without finish(); its records are discarded", self.root,
                    self.task)
        self.abort()

    def _release(self) -> None:
        self._closed = True
        if os.getpid() != self._pid:  # a forked child's copy: the files belong to the parent
            return
        self._pool.shutdown(wait=True)
        if self._part is None:
            shutil.rmtree(self._workspace, ignore_errors=True)
        os.close(self._owner_fd)

    def __enter__(self) -> PartWriter:
        return self


def _remove_if_dead(task_dir: Path) -> bool:
    """Delete a task directory unless a live PartWriter holds its owner lock; returns whether it is gone."""
    try:
        fd = os.open(task_dir / OWNER, os.O_RDWR | _O_CLOEXEC)
    except FileNotFoundError:
        fd = -1
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)
    shutil.rmtree(task_dir, ignore_errors=True)
    return not task_dir.exists()


# ---------------------------------------------------------------------------------------- commit


def commit_parts(
    path: str | os.PathLike[str],
    parts: Iterable[Part | Mapping[str, Any]],
    *,
    mode: str = "append",
    storage_options: Mapping[str, Any] | None = None,
) -> int:
    """Driver side: commit every shard of ``parts`` with one manifest commit; returns the records committed.

    The parts' records follow the store's (``mode="append"``) or replace them (``"overwrite"``: every
    shard committed before is dropped and the staged schema/metadata of ``prepare_store(...,
    mode="overwrite")`` installed), in the order of ``parts`` (within a part, in the order written).
    All or nothing, also across a crash (see the module docs). Readers that opened the store before keep
    the shards they have mapped; an overwrite deletes the replaced shards right after its commit, so such
    a reader that touches a replaced shard it had not mapped yet gets a CorruptionError naming the
    missing file (open the store again). A reader opening during the commit sees the old or the new store.

    Raises SeqstoreError naming the part when a part is not there (never written, discarded, or written
    to another store) or was committed already (committing is not idempotent: after a crash of the driver,
    calling again with the same parts either commits them or reports which were committed, never twice),
    SchemaError when a part was written with another schema or the parts mix records with and without
    ids (or differ from the store's, appending). Checks each shard's descriptor against its CRC-32:
    O(parts + shards) file operations and memory; nothing here grows with the records.
    """
    if is_remote(path):
        from . import remote_parts

        return remote_parts.commit_parts(os.fspath(path), parts, mode=mode, storage_options=storage_options)
    if mode not in ("append", "overwrite"):
        raise ValueError(f"mode must be 'append' or 'overwrite', got {mode!r}")
    root = _local_root(path, storage_options)
    plist = [_as_part(p) for p in parts]
    seen: set[tuple[str, str]] = set()
    for p in plist:
        if (p.job, p.task) in seen:
            raise SeqstoreError(f"{root}: part {p.job}/{p.task} is given twice")
        seen.add((p.job, p.task))
    overwrite = mode == "overwrite"
    with store_lock(root):
        recover_batch_commit(root)
        manifest, staged = _target(root)
        assert manifest.table is not None
        if overwrite and staged is not None:
            schema = _staged_schema(staged)
        else:
            schema = manifest.schema
        entries = _check_parts(root, plist, schema)
        kinds = {sh.has_ids for _, sh in entries}
        if len(kinds) > 1:
            raise SchemaError(f"{root}: the parts mix records with and without ids; a store holds one kind")
        if not overwrite and manifest.num_shards and kinds and kinds != {manifest.has_ids}:
            want = "with" if manifest.has_ids else "without"
            raise SchemaError(f"{root}: the store's records are written {want} ids; the parts' are the other kind")
        clean_orphans(root, manifest)
        return _commit(root, manifest, staged if overwrite else None, schema, plist, entries, overwrite)


def _check_parts(root: Path, plist: list[Part], schema: Schema) -> list[tuple[Path, PartShard]]:
    crc = _schema_crc(schema)
    entries: list[tuple[Path, PartShard]] = []
    for p in plist:
        task_dir = root / PARTS_DIR / p.job / p.task
        where = f"{task_dir} (part {p.task!r} of job {p.job!r})"
        done = task_dir / COMMITTED_FILE
        if done.exists():
            gen = json.loads(done.read_bytes()).get("generation")
            raise SeqstoreError(f"{where}: already committed (manifest generation {gen})")
        if not (task_dir / PART_FILE).exists():
            raise SeqstoreError(
                f"{where}: not there (never finished, discarded, or written to another store); nothing was committed"
            )
        if p.schema_crc != crc:
            raise SchemaError(f"{where}: written with another schema than the store's ({schema!r}); nothing was "
                              "committed")
        for sh in p.shards:
            d = task_dir / sh.dir
            try:
                raw = (d / DESCRIPTOR).read_bytes()
            except FileNotFoundError:
                raise SeqstoreError(f"{where}: shard {d} is missing; nothing was committed") from None
            if zlib.crc32(raw) != sh.desc_crc:
                raise CorruptionError(f"{d / DESCRIPTOR}: CRC-32 differs from the part's description; nothing was "
                                      "committed")
            entries.append((d, sh))
    return entries


def _commit(
    root: Path,
    manifest: Manifest,
    staged: dict[str, Any] | None,
    schema: Schema,
    plist: list[Part],
    entries: list[tuple[Path, PartShard]],
    overwrite: bool,
) -> int:
    assert manifest.table is not None
    old_state = manifest.table
    old_table = manifest.shard_table()
    ragged = tuple(n for n, f in schema.items() if f.ragged)
    first_number = next_shard_number(manifest)
    generation = manifest.generation + 1
    # an overwrite writes a new table file whose id (the new generation: unique within the store) the new
    # manifest names, so a reader pairing a manifest with the other file notices (format/shard_table.py)
    state = TableState(0, 0, 0, generation) if overwrite else old_state
    base_rows = state.rows
    start = state.records
    rows = bytearray()
    moves: list[tuple[str, str]] = []
    names: list[str] = []
    starts: list[int] = []
    for k, (src, sh) in enumerate(entries):
        number = first_number + k
        row = encode_row(number, start, sh.records, sh.has_ids, [sh.rows[r] for r in ragged], sh.desc_crc)
        rows += row
        state = state.after(row, sh.records)
        moves.append((src.relative_to(root).as_posix(), shard_dir_name(number)))
        names.append(shard_dir_name(number))
        starts.append(start)
        start += sh.records
    parts_dir = root / PARTS_DIR
    journal = {
        "mode": "overwrite" if overwrite else "append",
        "base_generation": manifest.generation,
        "generation": generation,
        "table": state.to_json(),
        "moves": moves,
        "tasks": [[p.job, p.task] for p in plist],
        "old_rows": old_state.rows if overwrite else 0,
        "first_number": first_number,
        "staged": staged is not None,
    }
    _write_json(parts_dir / JOURNAL, journal)
    for src_rel, dst in moves:
        target = root / dst
        if target.exists():  # left by a committer that died: never listed in the table
            shutil.rmtree(target)
        os.rename(root / src_rel, target)
    fsync_dir(root)
    new_table: Path | None = None
    if overwrite:
        if (root / TABLE).exists():
            (parts_dir / OLD_TABLE).unlink(missing_ok=True)
            os.link(root / TABLE, parts_dir / OLD_TABLE)
            fsync_dir(parts_dir)
        (root / WORK_DIR).mkdir(exist_ok=True)
        new_table = root / WORK_DIR / f".{TABLE}.tmp-{os.getpid()}"
        fd = os.open(new_table, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
        try:
            pwrite_all(fd, memoryview(encode_table_header(len(ragged), state.id) + bytes(rows)), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        manifest.index_runs = []
        manifest.schema = schema
        if staged is not None:
            manifest.id_lookup = str(staged["id_lookup"])
            if staged.get("metadata") is not None:
                manifest.metadata = dict(staged["metadata"])
    elif rows:
        _append_row(root, base_rows, bytes(rows), len(ragged), state.id)
    superseded: list[Path] = []
    if entries and entries[0][1].has_ids:
        tag = f"-g{generation}" if overwrite else ""

        def locate(k: int) -> tuple[str, int]:
            if k >= base_rows:
                return names[k - base_rows], starts[k - base_rows]
            return shard_dir_name(int(old_table.data["number"][k])), int(old_table.starts[k])

        for count in range(base_rows + 1, base_rows + len(entries) + 1):  # as one commit per shard would
            superseded += _maybe_merge_index(root, manifest, count, locate, tag)
    if new_table is not None:  # last, so that readers meet a new table without its manifest only briefly
        os.replace(new_table, root / TABLE)
        fsync_dir(root)
    manifest.table = state
    manifest.generation = generation
    manifest.save(root)  # the commit point
    for p in superseded:
        try:
            p.unlink(missing_ok=True)
        except OSError as exc:  # committed already: the next writer's clean-up deletes it
            log.warning("%s: could not delete superseded index file %s (%r)", root, p, exc)
    _roll_forward(root, journal)
    return sum(sh.records for _, sh in entries)


def _roll_forward(root: Path, journal: Mapping[str, Any]) -> None:
    """After the commit point: mark the parts committed, delete what an overwrite replaced, drop the
    journal. Idempotent (a crash part way is finished by the next holder of the lock)."""
    parts_dir = root / PARTS_DIR
    for job, task in journal["tasks"]:
        task_dir = parts_dir / job / task
        if task_dir.is_dir():
            _write_json(task_dir / COMMITTED_FILE, {"generation": journal["generation"]})
            (task_dir / PART_FILE).unlink(missing_ok=True)
            (task_dir / OWNER).unlink(missing_ok=True)
    if journal["mode"] == "overwrite":
        old = parts_dir / OLD_TABLE
        if old.exists() and journal["old_rows"]:
            with open(old, "rb") as f:
                ragged = struct.unpack_from("<I", f.read(TABLE_HEADER_BYTES), 16)[0]
            numbers = np.fromfile(old, dtype=row_dtype(ragged), count=int(journal["old_rows"]),
                                  offset=TABLE_HEADER_BYTES)["number"]
            for number in numbers.tolist():
                if number < int(journal["first_number"]):
                    shutil.rmtree(root / shard_dir_name(int(number)), ignore_errors=True)
        old.unlink(missing_ok=True)
        if journal.get("staged"):
            (parts_dir / STAGED).unlink(missing_ok=True)
    (parts_dir / JOURNAL).unlink(missing_ok=True)
    fsync_dir(parts_dir)


def _roll_back(root: Path, journal: Mapping[str, Any]) -> None:
    """Before the commit point: put the shards back into their parts (and an overwrite's old table)."""
    parts_dir = root / PARTS_DIR
    old = parts_dir / OLD_TABLE
    if journal["mode"] == "overwrite" and old.exists():
        os.replace(old, root / TABLE)
    for tmp in (root / WORK_DIR).glob(f".{TABLE}.tmp-*"):  # an overwrite's new table, not yet in place
        tmp.unlink(missing_ok=True)
    for src_rel, dst in reversed(journal["moves"]):
        src, target = root / src_rel, root / dst
        if target.is_dir() and not src.exists() and src.parent.is_dir():
            os.rename(target, src)
    fsync_dir(root)
    (parts_dir / JOURNAL).unlink(missing_ok=True)
    fsync_dir(parts_dir)


def recover_journal(root: Path) -> None:
    """Finish or undo the multi-shard commit whose journal is in ``_parts/`` (caller holds the lock): the
    manifest's generation and table state say whether its commit point was reached."""
    journal = json.loads((root / PARTS_DIR / JOURNAL).read_bytes())
    obj = json.loads((root / MANIFEST).read_bytes())  # not Manifest.load: the table may be the new one
    generation = obj.get("generation")
    if generation == journal["generation"] and obj.get("shard_table") == journal["table"]:
        log.warning("%s: finishing a commit of parts interrupted after its commit point", root)
        _roll_forward(root, journal)
    elif generation == journal["base_generation"]:
        log.warning("%s: undoing a commit of parts interrupted before its commit point", root)
        _roll_back(root, journal)
    else:
        raise CorruptionError(
            f"{root / PARTS_DIR / JOURNAL}: commit journal of generation {journal['generation']} (from "
            f"{journal['base_generation']}) but manifest.json is at generation {generation}"
        )


# ----------------------------------------------------------------------------------------- clean-up


def discard_parts(
    path: str | os.PathLike[str],
    parts_or_job: str | Iterable[Part | Mapping[str, Any]],
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Driver side: delete parts that will not be committed (an aborted or failed job), or what a job
    left after its commit. Takes a job id or parts; acts on whole jobs: every task directory of the
    job(s) not held by a live PartWriter goes (the parts, attempts killed mid-write that never
    reported, finished attempts nobody committed, the ``committed.json`` records of committed parts),
    then the job's directory when nothing live is left. Committed shards are never touched. Call it
    once the job's tasks have stopped. O(tasks of the job)."""
    if is_remote(path):
        from . import remote_parts

        remote_parts.discard_parts(os.fspath(path), parts_or_job, storage_options=storage_options)
        return
    root = _local_root(path, storage_options)
    if isinstance(parts_or_job, str):
        jobs = {_check_name(parts_or_job, "job")}
    else:
        jobs = {_as_part(p).job for p in parts_or_job}
    with store_lock(root):
        recover_batch_commit(root)
        for job in sorted(jobs):
            _discard_job(root / PARTS_DIR / job)


def _discard_job(job_dir: Path) -> bool:
    if not job_dir.is_dir():
        return True
    live = []
    for entry in os.scandir(job_dir):
        p = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            if not _remove_if_dead(p):
                live.append(entry.name)
        else:
            p.unlink(missing_ok=True)
    if live:
        log.warning("%s: left %d task(s) with a live PartWriter: %s", job_dir, len(live), sorted(live)[:5])
        return False
    shutil.rmtree(job_dir, ignore_errors=True)
    return True


def pending_jobs(path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The job ids that have a directory in the store's parts area (pending, failed or not discarded)."""
    if is_remote(path):
        from . import remote_parts

        return remote_parts.pending_jobs(os.fspath(path), storage_options=storage_options)
    parts = _local_root(path, storage_options) / PARTS_DIR
    if not parts.is_dir():
        return []
    return sorted(e.name for e in os.scandir(parts) if e.is_dir() and not e.name.startswith("."))


def clean_parts(
    path: str | os.PathLike[str], *, older_than: float, storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Discard every job of the store none of whose files changed in the last ``older_than`` seconds
    and none of whose tasks has a live PartWriter (jobs whose driver died); returns the jobs removed."""
    if is_remote(path):
        from . import remote_parts

        return remote_parts.clean_parts(os.fspath(path), older_than=older_than, storage_options=storage_options)
    root = _local_root(path, storage_options)
    now = time.time()
    removed = []
    with store_lock(root):
        recover_batch_commit(root)
        for job in pending_jobs(root):
            job_dir = root / PARTS_DIR / job
            newest = max((p.stat().st_mtime for p in [job_dir, *job_dir.glob("*"), *job_dir.glob("*/*")]),
                         default=0.0)
            if now - newest >= older_than and _discard_job(job_dir):
                removed.append(job)
    return removed
