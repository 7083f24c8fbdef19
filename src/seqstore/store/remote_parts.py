"""Distributed writes into a store on object storage: the parts primitive (store/parts.py) for
``s3://``, ``gs://`` and ``az://`` URLs (any :class:`~seqstore.io.objects.ObjectClient` back end with
conditional writes).

``seqstore.store.parts`` dispatches here when the path is a URL, so the calls are the same as for a
local store, plus ``storage_options``::

    prepare_store(url, schema, mode="append", storage_options=opts)           # driver
    w = PartWriter(url, job=job, task=attempt, storage_options=opts)          # each task attempt
    w.append_batch(columns, ids=ids); part = w.finish()                       # picklable Part
    commit_parts(url, parts, storage_options=opts)                            # driver: one commit
    discard_parts(url, job, storage_options=opts)                             # driver: the rest

A task attempt (:class:`RemotePartWriter`) builds its shards in a local temporary directory exactly
as a local :class:`~seqstore.store.parts.PartWriter` does, and uploads each finished shard under the
store's staging prefix ``_parts/<job>/<task>/p<k>/`` (the files, then the descriptor ``_shard.json``),
then ``_parts/<job>/<task>/part.json`` (create-only) last: the part is finished once that object
exists. The :class:`~seqstore.store.parts.Part` it returns (job, task, records, per shard: rows,
files with sizes and CRC-32s, descriptor CRC) is the same small value as for a local part.

The driver's :func:`commit_parts` (docs/format.md, section 7.3):

1. reads the manifest and the committed table rows, and in one wave every part's ``part.json``
   (which must equal the Part given), its markers and every staged descriptor (checked against the
   CRC-32 in the Part): O(parts + shards) small requests;
2. claims final shard numbers above the last committed one, in the order of the parts, with
   create-only writes of the descriptors to ``shard-NNNNNN/_shard.json`` (a number someone else
   holds is skipped), and writes ``commit.json`` into each part (the numbers its shards got);
3. copies every staged file to its ``shard-NNNNNN/`` inside the service (server-side copy; files over
   :data:`COPY_LIMIT` and back ends without a copy are streamed through the driver instead);
4. writes one new immutable table object ``_shards/<generation>-<token>.tbl`` with all the new rows
   and replaces ``manifest.json`` with ``If-Match`` the ETag read in 1: the commit point. Refused (another
   writer committed first), it reads the new state and tries again, first moving its shards above a
   higher number the other writer committed (claim, copy, delete the old claims); bounded by
   ``MAX_COMMIT_ATTEMPTS``. A write whose answer was lost is recognised by its rows in the new state;
5. writes ``committed.json`` into each part and deletes the part's staged objects.

All of the parts appear at once or none does: readers see the new shards only through the manifest,
which is written last. A driver that dies before 4 leaves claimed shard directories that no table
row names (garbage readers never look at, as a remote writer that died leaves); calling
:func:`commit_parts` again with the same parts commits them, or, when the manifest shows the numbers
their ``commit.json`` records, says they were committed (never twice).

:func:`discard_parts` first writes ``_parts/.ended/<job>`` (a task attempt that is still running
checks it after each shard it uploads and when it finishes, and then deletes what it wrote), then
deletes every object under ``_parts/<job>/``: finished parts, parts of attempts that were killed
mid-write and never reported, committed parts' markers. Object storage has no lock that shows a live
writer, so call it once the job's tasks have stopped.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import (
    ConflictError,
    CorruptionError,
    FormatError,
    RemoteError,
    RemoteNotFound,
    SchemaError,
    SeqstoreError,
)
from ..format.descriptor import DESCRIPTOR
from ..format.manifest import MANIFEST, PARTS_DIR, Manifest
from ..format.shard_table import TABLE_OBJECTS, TableState, encode_row, encode_table_header, shard_dir_name
from ..io.objects import ObjectClient
from ..schema import Schema
from .parts import (
    COMMITTED_FILE,
    MODES,
    PART_FILE,
    STAGED,
    Part,
    PartShard,
    PartWriter,
    _as_part,
    _check_name,
    _schema_crc,
)
from .remote_state import StoreState, parse_manifest, read_state
from .remote_writer import (
    _TABLE_GENERATION,
    KEEP_TABLES,
    MAX_CLAIMS,
    MAX_COMMIT_ATTEMPTS,
    StagedWriter,
    _delete_quietly,
    _delete_store,
    _install,
    _manifest_bytes,
    writing_client,
)
from .writer import _checked_schema

__all__ = [
    "COPY_LIMIT",
    "RemotePartWriter",
    "clean_parts",
    "commit_parts",
    "discard_parts",
    "pending_jobs",
    "prepare_store",
    "remove_if_empty",
    "unstage",
]

log = logging.getLogger(__name__)

#: Files larger than this are not copied inside the service (S3's CopyObject stops at 5 GiB) but
#: streamed through the committing process (O(chunk) memory).
COPY_LIMIT = 5 << 30
#: Chunk of a streamed copy.
STREAM_CHUNK = 8 << 20
#: Requests (claims, copies, deletes, marker writes) in flight at once in a commit or a discard.
WORKERS = 16
#: ``commit.json`` in a part: the shard numbers a commit in progress gave the part's shards.
COMMITTING_FILE = "commit.json"
#: ``_parts/.ended/<job>``: the job was committed or discarded; its late task attempts write nothing.
ENDED_DIR = f"{PARTS_DIR}/.ended"
#: End marks older than this are removed by :func:`discard_parts` and :func:`clean_parts`; until then
#: the job id cannot be used again.
ENDED_KEEP_S = 7 * 24 * 3600.0
STAGED_KEY = f"{PARTS_DIR}/{STAGED}"

_T = TypeVar("_T")
_R = TypeVar("_R")


def _prefix(job: str, task: str) -> str:
    return f"{PARTS_DIR}/{job}/{task}"


def _parallel(fn: Callable[[_T], _R], items: Sequence[_T], workers: int = WORKERS) -> list[_R]:
    """``[fn(x) for x in items]`` with up to ``workers`` calls at once; the first exception is raised
    once every call has ended."""
    if len(items) <= 1 or workers <= 1:
        return [fn(x) for x in items]
    with concurrent.futures.ThreadPoolExecutor(min(workers, len(items)), thread_name_prefix="seqstore-parts") as pool:
        futures = [pool.submit(fn, x) for x in items]
        concurrent.futures.wait(futures)
        return [f.result() for f in futures]


def _get_many(client: ObjectClient, keys: Sequence[str]) -> list[bytes | None]:
    """The whole objects ``keys`` in one wave of requests; None for a missing one."""
    got = client.get_ranges([(k, 0, -1, None) for k in keys], missing_ok=True)
    return [None if meta is None else bytes(data) for data, meta in got]


def _delete_all(client: ObjectClient, keys: Sequence[str], workers: int = WORKERS) -> None:
    _parallel(lambda k: _delete_quietly(client, k), list(keys), workers)


def _list_keys(client: ObjectClient, prefix: str) -> list[str]:
    """Keys under the folder ``prefix`` (only those whose path continues with ``/``)."""
    head = prefix.rstrip("/") + "/"
    return [m.key for m in client.list(prefix.rstrip("/")) if m.key.startswith(head)]


# ---------------------------------------------------------------------------------------- writer


class RemotePartWriter(StagedWriter, PartWriter):
    """One task attempt's part of the store at ``url`` on object storage (see the module docs).

    Appending is :class:`~seqstore.store.parts.PartWriter`'s (same validation and errors); shards are
    built in ``staging_dir`` (default: a new temporary directory; room for about one shard is needed)
    and each finished shard is uploaded to ``_parts/<job>/<task>/p<k>/`` and deleted locally.
    :meth:`finish` uploads ``part.json`` last and returns the :class:`Part`; :meth:`abort` (or leaving a
    ``with`` block by an exception) deletes everything the attempt uploaded. ``upload_workers``: files
    uploaded at once. The schema is the store's, or the one ``prepare_store(..., mode="overwrite")``
    staged.
    """

    def __init__(
        self,
        url: str,
        *,
        job: str,
        task: str,
        storage_options: Mapping[str, Any] | None = None,
        staging_dir: str | os.PathLike[str] | None = None,
        upload_workers: int = 8,
        shard_bytes: int = 1 << 30,
        buffer_bytes: int = 64 << 20,
        max_shard_records: int = 1 << 24,
        direct_io: bool = False,
    ) -> None:
        _check_name(job, "job")
        _check_name(task, "task")
        if upload_workers < 1:
            raise ValueError(f"upload_workers must be >= 1, got {upload_workers}")
        client = writing_client(url, storage_options)
        self.url = client.url
        self._client = client
        self._upload_workers = upload_workers
        self._prefix = _prefix(job, task)
        self._remote_part: Part | None = None
        raw, staged, ended, done, committed = _get_many(
            client, [MANIFEST, STAGED_KEY, f"{ENDED_DIR}/{job}", f"{self._prefix}/{PART_FILE}",
                     f"{self._prefix}/{COMMITTED_FILE}"])
        if raw is None:
            raise FormatError(f"{self.url}: no seqstore store here ({MANIFEST} does not exist); the driver "
                              "makes it with prepare_store() before the tasks start")
        manifest = parse_manifest(raw, client.key_url(MANIFEST))
        if manifest.table is None:
            raise FormatError(f"{self.url}: a version-{manifest.version} store; parts need a version-3 store")
        if ended is not None:
            raise SeqstoreError(f"{self.url}: job {job!r} was committed or discarded already; task attempt "
                                f"{task!r} writes nothing (on object storage a job id names one job: give "
                                "each job a new one)")
        if done is not None or committed is not None:
            raise SeqstoreError(f"{client.key_url(self._prefix)}: task attempt {task!r} of job {job!r} already "
                                "finished; each attempt needs its own task id")
        schema, id_lookup = manifest.schema, manifest.id_lookup
        if staged is not None:
            obj = json.loads(staged)
            schema, id_lookup = Schema.from_json(obj["schema"]), str(obj["id_lookup"])
        if staging_dir is not None:
            Path(staging_dir).mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix="seqstore-part-", dir=staging_dir))
        self._stage_dir = stage
        try:
            Manifest(schema, id_lookup=id_lookup, table=TableState(0, 0, 0)).save(stage)
            super().__init__(stage, job=job, task=task, shard_bytes=shard_bytes, buffer_bytes=buffer_bytes,
                             max_shard_records=max_shard_records, direct_io=direct_io)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise

    def __repr__(self) -> str:
        return f"seqstore.RemotePartWriter({self.url!r}, job={self.job!r}, task={self.task!r})"

    def _ended(self) -> bool:
        return _get_many(self._client, [f"{ENDED_DIR}/{self.job}"])[0] is not None

    def _commit_shard_files(self) -> None:
        """Finish the shard (locally, as ``p<k>``), upload it into the staging prefix, drop the local copy."""
        super()._commit_shard_files()
        sh = self._part_shards[-1]
        local = self._workspace / sh.dir
        keys = sorted(sh.files)
        dst = f"{self._prefix}/{sh.dir}"
        _parallel(lambda rel: self._client.put_file(f"{dst}/{rel}", local / rel), keys, self._upload_workers)
        self._client.put(f"{dst}/{DESCRIPTOR}", (local / DESCRIPTOR).read_bytes())
        shutil.rmtree(local, ignore_errors=True)
        if self._ended():
            raise SeqstoreError(f"{self.url}: job {self.job!r} was committed or discarded while task attempt "
                                f"{self.task!r} was writing; it writes nothing")

    def finish(self) -> Part:
        """Finish and upload the last shard, then ``part.json``; return the :class:`Part` (again on a
        second call). Nothing is visible to readers until the driver's :func:`commit_parts`."""
        if self._remote_part is not None:
            return self._remote_part
        part = super().finish()
        try:
            try:
                self._client.put(f"{self._prefix}/{PART_FILE}", json.dumps(part.to_json()).encode(), mode="create")
            except ConflictError:
                raise SeqstoreError(
                    f"{self._client.key_url(self._prefix)}: another writer finished task attempt {self.task!r} of job "
                    f"{self.job!r} too; each attempt needs its own task id"
                ) from None
            if self._ended():
                raise SeqstoreError(f"{self.url}: job {self.job!r} was committed or discarded before task attempt "
                                    f"{self.task!r} finished; its part was removed")
        except BaseException:
            self._part = None
            self._delete_remote()
            raise
        self._remote_part = part
        return part

    def abort(self) -> None:
        """Discard the attempt: its local files and every object it uploaded (a finished part stays)."""
        try:
            super().abort()
        finally:
            if self._remote_part is None:
                self._delete_remote()

    def _delete_remote(self) -> None:
        if os.getpid() != self._pid:
            return
        try:
            _delete_all(self._client, _list_keys(self._client, self._prefix), self._upload_workers)
        except RemoteError as exc:
            log.warning("%s: could not delete the objects of task attempt %r (%s); discard_parts removes them",
                        self.url, self.task, exc)



# ------------------------------------------------------------------------------------- prepare


def _read(client: ObjectClient, known: StoreState | None = None) -> StoreState:
    state = read_state(client, known=known)
    if state is None:
        raise FormatError(f"{client.url}: no seqstore store here ({MANIFEST} does not exist)")
    if not state.v3:
        raise FormatError(f"{client.url}: a version-{state.manifest.version} store; parts need a version-3 store "
                          "(one created by this seqstore)")
    return state


def prepare_store(
    url: str,
    schema: Mapping[str, Any] | Schema,
    *,
    metadata: Mapping[str, Any] | None = None,
    id_lookup: str = "first",
    mode: str = "create",
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """:func:`seqstore.store.parts.prepare_store` for a URL: ``"create"`` writes a new store's manifest
    with a create-only write (FileExistsError when there is one), ``"append"`` creates the store if
    there is none or checks its schema and ``id_lookup``, ``"overwrite"`` creates it if needed or, when
    the schema, ``id_lookup`` or ``metadata`` differ, stages them in ``_parts/.staged.json`` for the
    overwrite commit to install. Run one overwrite job at a time."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    client = writing_client(url, storage_options)
    sch = _checked_schema(schema, None, id_lookup)
    raw = _get_many(client, [MANIFEST])[0]
    if raw is None:
        created = _install(client, _manifest_bytes(sch, metadata, id_lookup))
        if created:
            return
        if mode == "create":
            raise FileExistsError(f"{client.url}: another process created a store here first (mode='create')")
        raw = _get_many(client, [MANIFEST])[0]
        if raw is None:
            raise FormatError(f"{client.url}: {MANIFEST} appeared and disappeared again (the store is being deleted?)")
    elif mode == "create":
        raise FileExistsError(f"{client.url}: a store already exists (mode='create'); use mode='append' or 'overwrite'")
    manifest = parse_manifest(raw, client.key_url(MANIFEST))
    if manifest.table is None:
        raise FormatError(f"{client.url}: a version-{manifest.version} store; parts need a version-3 store")
    if mode == "append":
        if manifest.schema != sch:
            raise SchemaError(f"{client.url}: existing store has schema {manifest.schema!r}, the job writes {sch!r}")
        if manifest.id_lookup != id_lookup:
            raise SchemaError(f"{client.url}: existing store has id_lookup {manifest.id_lookup!r}, expected "
                              f"{id_lookup!r}")
        return
    if manifest.schema == sch and manifest.id_lookup == id_lookup and (metadata is None or dict(metadata) ==
                                                                        manifest.metadata):
        _delete_quietly(client, STAGED_KEY)
        return
    staged = {"schema": sch.to_json(), "id_lookup": id_lookup, "metadata": None if metadata is None else dict(metadata)}
    client.put(STAGED_KEY, json.dumps(staged, separators=(",", ":")).encode())


# -------------------------------------------------------------------------------------- commit


@dataclasses.dataclass
class _Entry:
    """One staged shard to commit: its part's staging prefix, its description, its descriptor's bytes."""

    prefix: str
    shard: PartShard
    desc: bytes


def commit_parts(
    url: str,
    parts: Iterable[Part | Mapping[str, Any]],
    *,
    mode: str = "append",
    storage_options: Mapping[str, Any] | None = None,
    workers: int = WORKERS,
) -> int:
    """:func:`seqstore.store.parts.commit_parts` for a URL (see the module docs): every shard of
    ``parts`` in one manifest commit, in the order of ``parts``; returns the records committed.
    ``"overwrite"`` writes a table that lists only the new shards (and installs a staged schema);
    the replaced shards' objects are left where they are (readers that opened the old store keep
    reading them). ``workers``: requests in flight at once. O(parts + shards) requests and memory.

    Raises SeqstoreError naming the part when a part is not at the store's staging prefix (never
    finished, discarded, written to another store) or was committed already, SchemaError when a part
    was written with another schema or the parts mix records with and without ids (or differ from the
    store's), ConflictError when other writers won ``MAX_COMMIT_ATTEMPTS`` races in a row."""
    if mode not in ("append", "overwrite"):
        raise ValueError(f"mode must be 'append' or 'overwrite', got {mode!r}")
    plist = [_as_part(p) for p in parts]
    seen: set[tuple[str, str]] = set()
    for p in plist:
        if (p.job, p.task) in seen:
            raise SeqstoreError(f"{url}: part {p.job}/{p.task} is given twice")
        seen.add((p.job, p.task))
    overwrite = mode == "overwrite"
    client = writing_client(url, storage_options)
    state = _read(client)
    staged_raw = _get_many(client, [STAGED_KEY])[0] if overwrite else None
    staged = json.loads(staged_raw) if staged_raw is not None else None
    schema = Schema.from_json(staged["schema"]) if staged is not None else state.manifest.schema
    entries = _check_parts(client, state, plist, schema)
    kinds = {e.shard.has_ids for e in entries}
    if len(kinds) > 1:
        raise SchemaError(f"{client.url}: the parts mix records with and without ids; a store holds one kind")
    if not overwrite and kinds and state.has_ids is not None and kinds != {state.has_ids}:
        want = "with" if state.has_ids else "without"
        raise SchemaError(f"{client.url}: the store's records are written {want} ids; the parts' are the other kind")
    commit = _Commit(client, plist, entries, schema, staged, overwrite, workers)
    records = commit.run(state)
    return records


def _check_parts(client: ObjectClient, state: StoreState, plist: list[Part], schema: Schema) -> list[_Entry]:
    """One wave: each part's ``part.json``, ``committed.json`` and ``commit.json``, each shard's
    descriptor; the checks of the module docs. A part whose earlier commit reached its commit point
    (its ``commit.json`` numbers are committed rows) is marked committed and reported."""
    keys: list[str] = []
    for p in plist:
        pre = _prefix(p.job, p.task)
        keys += [f"{pre}/{PART_FILE}", f"{pre}/{COMMITTED_FILE}", f"{pre}/{COMMITTING_FILE}"]
        keys += [f"{pre}/{sh.dir}/{DESCRIPTOR}" for sh in p.shards]
    got = iter(_get_many(client, keys))
    answers = [(p, next(got), next(got), next(got), [next(got) for _ in p.shards]) for p in plist]
    committed = set(state.rows["number"].tolist())
    earlier = []  # parts an earlier commit_parts committed, whose driver stopped before marking them
    for p, desc, done, marker, _ in answers:
        if desc is not None and done is None and marker is not None:
            numbers = [int(n) for n in json.loads(marker)["numbers"]]
            if numbers and all(n in committed for n in numbers):
                earlier.append(p)
    if earlier:
        gen = state.manifest.generation
        _finish_parts(client, earlier, gen, WORKERS)
        p = earlier[0]
        raise SeqstoreError(
            f"{client.key_url(_prefix(p.job, p.task))} (part {p.task!r} of job {p.job!r}"
            + (f" and {len(earlier) - 1} more" if len(earlier) > 1 else "")
            + f"): already committed by an earlier commit_parts whose driver stopped before it finished (the store "
            f"is at manifest generation {gen}); nothing was committed by this call"
        )
    crc = _schema_crc(schema)
    entries: list[_Entry] = []
    for p, desc, done, _, descs in answers:
        pre = _prefix(p.job, p.task)
        where = f"{client.key_url(pre)} (part {p.task!r} of job {p.job!r})"
        if done is not None:
            gen = json.loads(done).get("generation")
            raise SeqstoreError(f"{where}: already committed (manifest generation {gen}); nothing was committed")
        if desc is None:
            raise SeqstoreError(f"{where}: not there (never finished, discarded, or written to another store); nothing "
                                "was committed")
        if json.loads(desc) != p.to_json():
            raise SeqstoreError(f"{where}: its part.json differs from the part given; nothing was committed")
        if p.schema_crc != crc:
            raise SchemaError(f"{where}: written with another schema than the store's ({schema!r}); nothing was "
                              "committed")
        for sh, raw in zip(p.shards, descs):
            key = f"{pre}/{sh.dir}/{DESCRIPTOR}"
            if raw is None:
                raise SeqstoreError(f"{where}: shard {client.key_url(key)} is missing; nothing was committed")
            if zlib.crc32(raw) != sh.desc_crc:
                raise CorruptionError(f"{client.key_url(key)}: CRC-32 differs from the part's description; nothing "
                                      "was committed")
            entries.append(_Entry(pre, sh, raw))
    return entries


def _staged_keys(p: Part) -> list[str]:
    pre = _prefix(p.job, p.task)
    keys = [f"{pre}/{sh.dir}/{rel}" for sh in p.shards for rel in [*sorted(sh.files), DESCRIPTOR]]
    return [*keys, f"{pre}/{PART_FILE}", f"{pre}/{COMMITTING_FILE}"]


def _finish_parts(client: ObjectClient, plist: Sequence[Part], generation: int, workers: int) -> None:
    """After the commit point: ``committed.json`` into each part, then its staged objects deleted."""
    marker = json.dumps({"generation": generation}).encode()
    try:
        _parallel(lambda p: client.put(f"{_prefix(p.job, p.task)}/{COMMITTED_FILE}", marker), list(plist), workers)
    except RemoteError as exc:  # committed all the same; a repeated commit_parts finds commit.json
        log.warning("%s: committed, but could not mark every part committed (%s)", client.url, exc)
        return
    _delete_all(client, [k for p in plist for k in _staged_keys(p)], workers)


class _Commit:
    """The steps 2-5 of the module docs for one call of :func:`commit_parts`."""

    def __init__(self, client: ObjectClient, plist: list[Part], entries: list[_Entry], schema: Schema,
                 staged: Mapping[str, Any] | None, overwrite: bool, workers: int) -> None:
        self.c = client
        self.plist = plist
        self.entries = entries
        self.schema = schema
        self.staged = staged
        self.overwrite = overwrite
        self.workers = max(1, workers)
        self.token = uuid.uuid4().hex[:12]
        self.numbers: list[int] = []
        self.conflicts = 0
        self.renumbered = 0

    def run(self, state: StoreState) -> int:
        records = sum(e.shard.records for e in self.entries)
        if not self.entries and not self.overwrite:
            _finish_parts(self.c, self.plist, state.manifest.generation, self.workers)
            return 0
        sent = False  # a manifest write whose fate is unknown: the claims must stay
        try:
            self._place(state.next_number())
            for _ in range(MAX_COMMIT_ATTEMPTS):
                m = state.manifest
                gen = m.generation + 1
                tkey, raw = self._manifest(state, gen)
                try:
                    sent = True
                    self.c.put(MANIFEST, raw, mode={"e_tag": state.etag})
                except ConflictError:
                    before = state
                    state = _read(self.c, known=state)
                    if self.numbers and self.numbers[0] in state.rows["number"]:
                        gen = state.manifest.generation  # ours went through; the answer was lost
                        break
                    sent = False
                    _delete_quietly(self.c, tkey)
                    self.conflicts += 1
                    self._check_refreshed(before, state)
                    if not self.overwrite and self.numbers and state.next_number() > self.numbers[0]:
                        old = self.numbers
                        self._place(state.next_number())  # above the shard the other writer committed
                        self._delete_shards(old)
                        self.renumbered += 1
                    continue
                break
            else:
                raise ConflictError(
                    f"{self.c.url}/{MANIFEST}: gave up after {MAX_COMMIT_ATTEMPTS} conditional writes, each refused "
                    "because another writer committed first; nothing was committed",
                    url=self.c.key_url(MANIFEST), attempts=MAX_COMMIT_ATTEMPTS,
                )
        except BaseException:
            if not sent and self.numbers:
                self._delete_shards(self.numbers)
            raise
        _finish_parts(self.c, self.plist, gen, self.workers)
        if self.overwrite and self.staged is not None:
            _delete_quietly(self.c, STAGED_KEY)
        self._clean_tables(gen, tkey)
        log.debug("%s: committed %d parts (%d shards, %d records) as generation %d", self.c.url, len(self.plist),
                  len(self.entries), records, gen)
        return records

    # ---------------------------------------------------------------------------------- steps

    def _place(self, first: int) -> None:
        """Claim numbers from ``first`` on for the shards (in order), record them in each part's
        ``commit.json``, copy the staged files there."""
        self.numbers = _claim(self.c, first, [e.desc for e in self.entries], self.workers)
        k = 0
        markers: list[tuple[str, bytes]] = []
        for p in self.plist:
            nums = self.numbers[k : k + len(p.shards)]
            k += len(p.shards)
            markers.append((f"{_prefix(p.job, p.task)}/{COMMITTING_FILE}",
                            json.dumps({"token": self.token, "numbers": nums}).encode()))
        _parallel(lambda kv: self.c.put(kv[0], kv[1]), markers, self.workers)
        copies = [(f"{e.prefix}/{e.shard.dir}/{rel}", f"{shard_dir_name(n)}/{rel}", size)
                  for n, e in zip(self.numbers, self.entries) for rel, (size, _) in sorted(e.shard.files.items())]
        try:
            _parallel(lambda t: _copy(self.c, *t), copies, self.workers)
        except RemoteNotFound as exc:
            raise SeqstoreError(f"{exc.url}: a staged file of a part is missing (discarded while committing?); "
                                "nothing was committed") from None

    def _manifest(self, state: StoreState, gen: int) -> tuple[str, bytes]:
        """Write the new table object for ``state``; return its key and the new manifest's bytes."""
        m = state.manifest
        assert m.table is not None
        ragged = tuple(n for n, f in self.schema.items() if f.ragged)
        if self.overwrite:
            table = TableState(0, 0, 0, gen)
            header, base = encode_table_header(len(ragged), gen), b""
        else:
            table = m.table
            header, base = state.header or encode_table_header(len(ragged), m.table.id), state.rows_bytes()
        rows = bytearray()
        start = table.records
        for n, e in zip(self.numbers, self.entries):
            sh = e.shard
            row = encode_row(n, start, sh.records, sh.has_ids, [sh.rows[r] for r in ragged], sh.desc_crc)
            rows += row
            table = table.after(row, sh.records)
            start += sh.records
        tkey = f"{TABLE_OBJECTS}/{gen:012d}-{self.token}.tbl"
        self.c.put(tkey, header + base + bytes(rows))
        new = dataclasses.replace(m, table=TableState(table.rows, table.records, table.crc32, table.id, tkey),
                                  generation=gen)
        if self.overwrite:
            new.schema = self.schema
            new.index_runs = []
            if self.staged is not None:
                new.id_lookup = str(self.staged["id_lookup"])
                if self.staged.get("metadata") is not None:
                    new.metadata = dict(self.staged["metadata"])
        return tkey, json.dumps(new.to_json(), separators=(",", ":")).encode()

    def _check_refreshed(self, before: StoreState, state: StoreState) -> None:
        """After a lost race: the store must still take these parts."""
        if self.overwrite:
            return
        if state.manifest.schema != self.schema:
            raise SchemaError(f"{self.c.url}: the store was replaced by one with schema {state.manifest.schema!r} "
                              "while committing; nothing was committed")
        kind = self.entries[0].shard.has_ids if self.entries else None
        if kind is not None and state.has_ids is not None and state.has_ids != kind:
            want = "with" if state.has_ids else "without"
            raise SchemaError(f"{self.c.url}: another writer committed records {want} ids first; the parts' are the "
                              "other kind; nothing was committed")

    def _delete_shards(self, numbers: Sequence[int]) -> None:
        """Delete shard directories this commit claimed and did not commit (the claims last)."""
        files = [f"{shard_dir_name(n)}/{rel}" for n, e in zip(numbers, self.entries) for rel in sorted(e.shard.files)]
        try:
            _delete_all(self.c, files, self.workers)
            _delete_all(self.c, [f"{shard_dir_name(n)}/{DESCRIPTOR}" for n in numbers], self.workers)
        except BaseException as exc:  # noqa: BLE001 - garbage no reader looks at; the error that got here counts
            log.warning("%s: could not delete the shards this commit claimed (%r)", self.c.url, exc)

    def _clean_tables(self, generation: int, current: str) -> None:
        try:
            metas = list(self.c.list(TABLE_OBJECTS))
        except RemoteError as exc:
            log.warning("%s: could not list old shard tables (%s)", self.c.url, exc)
            return
        old = []
        for meta in metas:
            g = _TABLE_GENERATION.match(meta.key)
            if g and meta.key != current and int(g.group(1)) <= generation - KEEP_TABLES:
                old.append(meta.key)
        _delete_all(self.c, old, self.workers)


def _claim(client: ObjectClient, first: int, descs: Sequence[bytes], workers: int) -> list[int]:
    """Claim increasing shard numbers from ``first`` on for the descriptors ``descs`` (in order):
    create-only writes of ``shard-<n>/_shard.json``, a wave at a time. Where a number is taken, the
    claims after it in the wave are given back and the rest tried above it."""
    numbers: list[int] = []
    base = first
    tried = 0
    while len(numbers) < len(descs):
        rest = descs[len(numbers):]
        cand = list(range(base, base + len(rest)))

        def put(i: int, cand: list[int] = cand, rest: Sequence[bytes] = rest) -> bool:
            try:
                client.put(f"{shard_dir_name(cand[i])}/{DESCRIPTOR}", rest[i], mode="create")
                return True
            except ConflictError:
                return False

        ok = _parallel(put, list(range(len(rest))), workers)
        j = ok.index(False) if False in ok else len(rest)
        numbers += cand[:j]
        _delete_all(client, [f"{shard_dir_name(cand[i])}/{DESCRIPTOR}" for i in range(j + 1, len(rest)) if ok[i]],
                    workers)
        tried += len(rest)
        if j < len(rest):
            base = cand[j] + 1
            if tried > MAX_CLAIMS + len(descs):
                _delete_all(client, [f"{shard_dir_name(n)}/{DESCRIPTOR}" for n in numbers], workers)
                raise ConflictError(
                    f"{client.url}: no free shard numbers between {first} and {base} (claimed by writers that never "
                    "committed them?)", url=client.url, attempts=tried,
                )
    return numbers


def _copy(client: ObjectClient, src: str, dst: str, size: int) -> None:
    """Copy the staged object ``src`` to ``dst``: inside the service, or streamed (large or no copy)."""
    if size <= COPY_LIMIT:
        try:
            client.copy(src, dst)
            return
        except NotImplementedError:
            pass

    def chunks() -> Iterator[bytes]:
        for a in range(0, size, STREAM_CHUNK):
            data, _ = client.get_ranges([(src, a, min(size, a + STREAM_CHUNK), None)])[0]
            yield bytes(data)

    client.put_stream(dst, chunks)


# ------------------------------------------------------------------------------------- clean-up


def discard_parts(
    url: str,
    parts_or_job: str | Iterable[Part | Mapping[str, Any]],
    *,
    storage_options: Mapping[str, Any] | None = None,
    workers: int = WORKERS,
) -> None:
    """:func:`seqstore.store.parts.discard_parts` for a URL: for each job (the one given, or those of
    the parts) write its end mark ``_parts/.ended/<job>``, then delete every object under
    ``_parts/<job>/`` (finished parts, parts of attempts killed mid-write, committed parts' markers).
    Committed shards are never touched. Call it once the job's tasks have stopped (an attempt still
    running removes its own objects when it next finds the mark). End marks older than
    :data:`ENDED_KEEP_S` are deleted. O(objects of the job + end marks)."""
    if isinstance(parts_or_job, str):
        jobs = {_check_name(parts_or_job, "job")}
    else:
        jobs = {_as_part(p).job for p in parts_or_job}
    client = ObjectClient(url, storage_options)
    for job in sorted(jobs):
        client.put(f"{ENDED_DIR}/{job}", b"")
        _delete_all(client, _list_keys(client, f"{PARTS_DIR}/{job}"), workers)
    _delete_old_marks(client, workers)


def _delete_old_marks(client: ObjectClient, workers: int = WORKERS) -> None:
    """Delete end marks older than ENDED_KEEP_S (one listing of ``_parts/.ended/``)."""
    now = time.time()
    try:
        marks = [m.key for m in client.list(ENDED_DIR) if m.mtime and now - m.mtime > ENDED_KEEP_S]
    except RemoteError as exc:
        log.warning("%s: could not list the end marks of finished jobs (%s)", client.url, exc)
        return
    _delete_all(client, marks, workers)


def pending_jobs(url: str, *, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The job ids that have objects in the store's staging prefix ``_parts/`` (pending, failed or not
    discarded). Lists the whole prefix: O(objects there)."""
    return sorted(_jobs(ObjectClient(url, storage_options)))


def _jobs(client: ObjectClient) -> dict[str, float]:
    """Job -> the newest modification time of its objects."""
    out: dict[str, float] = {}
    for meta in client.list(PARTS_DIR):
        bits = meta.key.split("/")
        if len(bits) >= 3 and bits[0] == PARTS_DIR and not bits[1].startswith("."):
            out[bits[1]] = max(out.get(bits[1], 0.0), meta.mtime)
    return out


def clean_parts(url: str, *, older_than: float, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Discard every job none of whose objects changed in the last ``older_than`` seconds (jobs whose
    driver died), and end marks older than :data:`ENDED_KEEP_S`; returns the jobs removed."""
    client = ObjectClient(url, storage_options)
    now = time.time()
    removed = [job for job, newest in sorted(_jobs(client).items()) if now - newest >= older_than]
    for job in removed:
        discard_parts(url, job, storage_options=storage_options)
    _delete_old_marks(client)
    return removed


def unstage(url: str, *, storage_options: Mapping[str, Any] | None = None) -> None:
    """Delete the schema/metadata ``prepare_store(..., mode="overwrite")`` staged (an overwrite job that
    failed: later jobs then write the store's own schema again)."""
    _delete_quietly(ObjectClient(url, storage_options), STAGED_KEY)


def remove_if_empty(url: str, *, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Delete the store at ``url`` if it has no committed shard and no job has staged objects in it
    (the store a failed job created); whether it was deleted."""
    client = ObjectClient(url, storage_options)
    try:
        state = read_state(client)
    except (SeqstoreError, RemoteError):
        return False
    if state is None or state.num_shards or _jobs(client):
        return False
    _delete_store(client)
    return True
