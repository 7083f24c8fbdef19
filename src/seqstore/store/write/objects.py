"""The commit target of a store on object storage (``s3://``, ``gs://``, ``az://``): what
:func:`~seqstore.create`, :func:`~seqstore.append_to` and ``open_or_create`` with a URL (and so
``seqstore.Logger``) and the parts of a distributed write commit through.

A writer on a URL builds its shards in a local staging directory exactly as a local writer does (it
holds at most the shard being written and one finished shard). Committing one follows docs/format.md,
section 7.2: read the state (store/write/state.py), claim a shard number with a create-only write of
its descriptor, upload the files, write a new table object and replace ``manifest.json`` with
``If-Match`` (the commit point); a lost race re-reads the state and retries (moving the shard above a
higher number another writer committed), at most ``MAX_COMMIT_ATTEMPTS`` times, then
:class:`~seqstore.errors.ConflictError`; a write whose answer was lost is recognised by its row in the
new state, so a shard is never committed twice. Old tables beyond ``KEEP_TABLES`` generations go.
The claim-upload-commit loop is store/write/remote.py's :class:`~seqstore.store.write.remote.Commit`.
A back end without conditional writes (HTTP, fsspec URLs) is refused: write locally and ``seqstore copy``.

Parts follow section 7.3: a task attempt uploads each finished shard under ``_parts/<job>/<task>/p<k>/``
(files, then descriptor) and ``part.json`` (create-only) last; ``commit_parts`` checks every part in one
wave, claims numbers and records them in each part's ``commit.json``, copies the staged files inside the
service (streamed through the driver above :data:`COPY_LIMIT` or without a server-side copy), commits
once, then writes ``committed.json`` and deletes the staged objects. All parts appear at once or none
does. ``discard_parts`` writes ``_parts/.ended/<job>`` first (a running attempt checks it and deletes
what it wrote), then deletes ``_parts/<job>/``: with no lock to show a live writer, call it once the
job's tasks have stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConflictError, FormatError, RemoteError, RemoteNotFound, SchemaError, SeqstoreError
from ...format.descriptor import DESCRIPTOR
from ...format.manifest import MANIFEST, PARTS_DIR, Manifest, ShardInfo
from ...format.shard_table import row_dtype, shard_dir_name
from ...io.objects import ObjectClient
from ...schema import Schema
from .disk import held_new_dir, remove_if_dead
from .remote import (
    COMMITTING_FILE,
    COPY_LIMIT,
    ENDED_DIR,
    STAGED_KEY,
    STREAM_CHUNK,
    WORKERS,
    Commit,
    clean_tables,
    delete_all,
    delete_old_marks,
    delete_quietly,
    delete_store,
    get_many,
    install_manifest,
    job_times,
    list_keys,
    parallel,
    prefix,
    read_v3,
)
from .state import StoreState, read_state
from .target import (
    COMMITTED_FILE,
    PART_FILE,
    CommitTarget,
    Finished,
    IdsMismatch,
    Part,
    PartOver,
    PartShard,
    Start,
    check_part,
    check_parts_kinds,
    check_v3,
)

log = logging.getLogger(__name__)


class ObjectTarget(CommitTarget):
    """The store at ``client``'s URL (see the module docs). ``staging_dir``: where shards are built
    before upload (default: a new temporary directory, ``$TMPDIR``; room for about two shards);
    ``upload_workers``: files uploaded at once."""

    kind = "Remote"

    def __init__(self, client: ObjectClient, *, staging_dir: str | os.PathLike[str] | None = None,
                 upload_workers: int = 8) -> None:
        if upload_workers < 1:
            raise ValueError(f"upload_workers must be >= 1, got {upload_workers}")
        self.client = client
        self.where = client.url
        self.staging_dir = staging_dir
        self.upload_workers = upload_workers
        self._state: StoreState | None = None
        self._token = uuid.uuid4().hex[:12]
        self._next_claim = 0
        # a shard whose commit may have gone through: its number, descriptor CRC and the stats sent with it
        self._unsure: tuple[int, int, dict[str, float]] | None = None
        # a commit of stats alone whose write may have gone through: the manifest bytes sent, the stats
        self._unsure_stats: tuple[bytes, dict[str, float]] | None = None
        self._job = self._task = self._prefix = ""
        self._made: tuple[Path, int] | None = None  # a staging directory create() made for open_writer

    def objects(self) -> ObjectClient:
        return self.client

    # ---------------------------------------------------------------------------------- the store

    def read_manifest(self) -> Manifest | None:
        state = read_state(self.client)
        return None if state is None else state.manifest

    def delete_store(self) -> None:
        delete_store(self.client)

    def create(self, manifest: Manifest, *, overwrite: bool) -> None:
        """The writer's staging directory first (kept for :meth:`open_writer`): where it cannot be made, no
        store is left at the URL (one made before could not be deleted safely: another process may append)."""
        with self._staging_first():
            if overwrite:
                delete_store(self.client)
            if not self.install(manifest):
                raise FileExistsError(f"{self.where}: already exists (pass overwrite=True to replace it)")
        # the writer starts from the manifest just written, with no request that could fail after the store
        # is made (the first commit reads the store's state as it is then)
        raw = json.dumps(manifest.to_json(), separators=(",", ":")).encode()
        self._state = StoreState(raw, "", manifest, b"", np.zeros(0, row_dtype(len(manifest.ragged))))

    def install_for_writer(self, manifest: Manifest) -> bool:
        """As :meth:`create`, the writer's staging directory first: where it cannot be made, no store is made."""
        with self._staging_first():
            return self.install(manifest)

    @contextlib.contextmanager
    def _staging_first(self) -> Iterator[None]:
        """The writer's staging directory, made before the block makes the store (kept for
        :meth:`open_writer`); removed again where the block fails."""
        self._release_made()
        self._made = self._new_stage("staging")
        try:
            yield
        except BaseException:
            self._release_made()
            raise

    def _release_made(self) -> None:
        """Remove the staging directory :meth:`create` made that no writer took."""
        if self._made is not None:
            (path, fd), self._made = self._made, None
            shutil.rmtree(path, ignore_errors=True)
            os.close(fd)

    def install(self, manifest: Manifest, *, strict: bool = False) -> bool:
        # as in a directory, never among objects that are not a store: deleting the store would take them along
        if not self._has_manifest() and next(iter(self.client.list("")), None) is not None:
            if not self._has_manifest():  # (and another process did not just create the store)
                raise SeqstoreError(f"{self.where}: holds objects that are not a seqstore store (no {MANIFEST}); "
                                    "give a new or empty prefix")
        return install_manifest(self.client, json.dumps(manifest.to_json(), separators=(",", ":")).encode())

    def _has_manifest(self) -> bool:
        try:
            self.client.head(MANIFEST)
        except RemoteNotFound:
            return False
        return True

    def _staging(self, schema: Schema, id_lookup: str, records: int, has_ids: bool | None, what: str) -> Start:
        """A new staging directory holding an flock on its ``owner.lock`` (the one :meth:`create` made)."""
        made, self._made = self._made, None
        stage, fd = made if made is not None and what == "staging" else self._new_stage(what)
        return Start(schema, id_lookup, records, has_ids, True, stage, stage, fd)

    def _new_stage(self, what: str) -> tuple[Path, int]:
        """A new staging directory and the descriptor of its flocked ``owner.lock``; those of killed writers go."""
        base = Path(self.staging_dir if self.staging_dir is not None else tempfile.gettempdir())
        try:
            base.mkdir(parents=True, exist_ok=True)
            for old in base.glob(f"seqstore-{what}-*"):
                with contextlib.suppress(OSError):  # (another user's)
                    remove_if_dead(old, missing_is_dead=False)  # (no lock yet: one being made)
            return held_new_dir(lambda: Path(tempfile.mkdtemp(prefix=f"seqstore-{what}-", dir=base)))
        except OSError as exc:
            code = errno.ENOTDIR if isinstance(exc, FileExistsError) else exc.errno
            raise OSError(code, f"{exc.strerror or exc}: cannot make a staging directory under {base} (staging_dir), "
                          f"where the writer of {self.where} builds its shards") from exc

    # --------------------------------------------------------------------------------- one writer

    def open_writer(self) -> Start:
        if self._state is None or self._made is None:  # (else the store create() has just made: its state)
            try:
                state = read_state(self.client)
                if state is None:
                    raise FormatError(f"{self.where}: no seqstore store here ({MANIFEST} does not exist)")
                if not state.v3:
                    raise SeqstoreError(
                        f"{self.where}: a version-{state.manifest.version} store; writers on object storage append "
                        "to version-3 stores only (copy it to a local directory, append there, and copy it back)"
                    )
            except BaseException:
                self._release_made()  # (the staging directory create() made)
                raise
            self._state = state
        m = self._state.manifest
        return self._staging(m.schema, m.id_lookup, m.num_records, self._state.has_ids, "staging")

    def _refresh(self, known: StoreState) -> StoreState:
        """The store's state now (only new rows fetched); it must still be this store."""
        state = read_state(self.client, known=known)
        if state is None:
            raise FormatError(f"{self.where}: {MANIFEST} disappeared (the store was deleted or is being replaced)")
        if not state.v3 or state.manifest.schema != known.manifest.schema:  # (no retry can commit into it)
            now = f"schema {state.manifest.schema!r}" if state.v3 else f"format version {state.manifest.version}"
            raise SchemaError(f"{self.where}: the store was replaced by one with {now}, this writer's schema "
                              f"{known.manifest.schema!r}; nothing was committed")
        self._state = state
        return state

    def publish(self, shard: Finished | None, stats: Mapping[str, float]) -> str:
        """docs/format.md 7.2 for ``shard`` (None: only the ``stats`` deltas)."""
        assert self._state is not None
        info = shard.info if shard is not None else ShardInfo("", 0, {}, {}, False)

        def check(state: StoreState) -> None:
            if shard is not None and state.has_ids is not None and state.has_ids != info.has_ids:
                raise IdsMismatch(state.has_ids)

        state = self._refresh(self._state)
        check(state)
        stale: list[str] = []  # the objects of an earlier try of this shard that did not commit it
        if self._unsure_stats is not None:
            raw, sent = self._unsure_stats
            self._unsure_stats = None
            if state.raw == raw:  # it went through (and nothing was committed since): not again
                stats = {key: v - sent.get(key, 0) for key, v in stats.items() if v != sent.get(key, 0)}
                if shard is None and not stats:
                    return ""
        if shard is not None and self._unsure is not None:
            number, crc, sent = self._unsure
            k = int(np.searchsorted(state.rows["number"], number))
            if crc == shard.desc_crc and k < len(state.rows) and int(state.rows["number"][k]) == number:
                if rest := {key: v - sent.get(key, 0) for key, v in stats.items() if v != sent.get(key, 0)}:
                    self.publish(None, rest)
                self._unsure, self._next_claim = None, number + 1
                return shard_dir_name(number)
            self._unsure = None
            if crc == shard.desc_crc:  # its objects go once this commit makes that write unable to land
                stale = [f"{shard_dir_name(number)}/{rel}" for rel in [*sorted(info.files), DESCRIPTOR]]  # claim last
        shards, descs = [], []
        if shard is not None:
            files = {rel: (f.bytes, f.crc32) for rel, f in info.files.items()}
            shards = [PartShard("", info.records, dict(info.rows), info.has_ids, files, shard.desc_crc)]
            descs = [(shard.path / DESCRIPTOR).read_bytes()]

        def upload(numbers: list[int]) -> None:
            assert shard is not None
            name = shard_dir_name(numbers[0])
            parallel(lambda rel: self.client.put_file(f"{name}/{rel}", shard.path / rel), sorted(info.files),
                     self.upload_workers)

        commit = Commit(self.client, shards, descs, place=upload, refresh=self._refresh, check=check,
                        token=self._token, stats=stats, floor=self._next_claim)
        try:
            self._state = commit.run(state)
        except BaseException:
            if shard is not None and commit.unsure:
                self._unsure = (commit.numbers[0], shard.desc_crc, dict(stats))
            elif commit.unsure:
                self._unsure_stats = (commit.sent, dict(stats))
            raise
        finally:
            self.conflicts += commit.conflicts
            self.renumbered += commit.renumbered
        if stale:
            delete_all(self.client, stale[:-1], self.upload_workers)
            delete_quietly(self.client, stale[-1])
        if shard is None:
            return ""
        self._next_claim = commit.numbers[0] + 1
        m = self._state.manifest
        assert m.table is not None
        clean_tables(self.client, m.generation, m.table.file)
        return shard_dir_name(commit.numbers[0])

    # ---------------------------------------------------------------------------------- the parts

    def open_part(self, job: str, task: str) -> Start:
        client = self.client
        self._job, self._task, self._prefix = job, task, prefix(job, task)
        raw, staged, ended, done, committed = get_many(
            client, [MANIFEST, STAGED_KEY, f"{ENDED_DIR}/{job}", f"{self._prefix}/{PART_FILE}",
                     f"{self._prefix}/{COMMITTED_FILE}"])
        if raw is None:
            raise FormatError(f"{self.where}: no seqstore store here ({MANIFEST} does not exist); the driver "
                              "makes it with prepare_store() before the tasks start")
        manifest = Manifest.parse(raw, client.key_url(MANIFEST))
        check_v3(self.where, manifest)
        if ended is not None:
            raise SeqstoreError(f"{self.where}: job {job!r} was committed or discarded already; task attempt "
                                f"{task!r} writes nothing (on object storage a job id names one job: give "
                                "each job a new one)")
        if done is not None or committed is not None:
            raise SeqstoreError(f"{client.key_url(self._prefix)}: task attempt {task!r} of job {job!r} already "
                                "finished; each attempt needs its own task id")
        schema, id_lookup = manifest.schema, manifest.id_lookup
        if staged is not None:
            obj = json.loads(staged)
            schema, id_lookup = Schema.from_json(obj["schema"]), str(obj["id_lookup"])
        return self._staging(schema, id_lookup, 0, None, "part")

    def _ended(self) -> bool:
        return get_many(self.client, [f"{ENDED_DIR}/{self._job}"])[0] is not None

    def stage_shard(self, start: Start, current: Path, shard: PartShard) -> None:
        """Upload the finished shard into the staging prefix (the files, then the descriptor) and drop
        the local copy (kept when this raises: a PartWriter calls again with it)."""
        dst = f"{self._prefix}/{shard.dir}"
        parallel(lambda rel: self.client.put_file(f"{dst}/{rel}", current / rel), sorted(shard.files),
                 self.upload_workers)
        self.client.put(f"{dst}/{DESCRIPTOR}", (current / DESCRIPTOR).read_bytes())
        if self._ended():
            raise PartOver(f"{self.where}: job {self._job!r} was committed or discarded while task attempt "
                           f"{self._task!r} was writing; it writes nothing, and no retry can help: abort() the "
                           "writer")
        shutil.rmtree(current, ignore_errors=True)

    def finish_part(self, start: Start, part: Part) -> None:
        """Upload ``part.json`` last (create-only). Another attempt's ``part.json`` there, or the job ended:
        the attempt's objects go. A request that failed (RemoteError) leaves them for a second call."""
        key, raw = f"{self._prefix}/{PART_FILE}", json.dumps(part.to_json()).encode()
        try:
            self.client.put(key, raw, mode="create")
        except ConflictError:
            # ours when it holds our bytes: written by an earlier try whose answer was lost, or an earlier call
            if get_many(self.client, [key])[0] != raw:
                self._delete_part()
                raise SeqstoreError(
                    f"{self.client.key_url(self._prefix)}: another writer finished task attempt {self._task!r} "
                    f"of job {self._job!r} too; each attempt needs its own task id"
                ) from None
        if self._ended():
            self._delete_part()
            raise PartOver(f"{self.where}: job {self._job!r} was committed or discarded before task "
                           f"attempt {self._task!r} finished; its part was removed, and no retry can help")

    def close_part(self, start: Start, part: Part | None) -> None:
        self.close_writer(start)
        if part is None:
            self._delete_part()

    def _delete_part(self) -> None:
        try:
            delete_all(self.client, list_keys(self.client, self._prefix), self.upload_workers)
        except RemoteError as exc:
            log.warning("%s: could not delete the objects of task attempt %r (%s); discard_parts removes them",
                        self.where, self._task, exc)

    def staged(self) -> dict[str, Any] | None:
        raw = get_many(self.client, [STAGED_KEY])[0]
        return None if raw is None else dict(json.loads(raw))

    def set_staged(self, staged: Mapping[str, Any] | None) -> None:
        if staged is None:
            delete_quietly(self.client, STAGED_KEY)
        else:
            self.client.put(STAGED_KEY, json.dumps(dict(staged), separators=(",", ":")).encode())

    def commit_parts(self, plist: list[Part], overwrite: bool) -> int:
        """docs/format.md 7.3: every shard of ``plist`` in one manifest commit, in order."""
        state = read_v3(self.client)
        staged = self.staged() if overwrite else None
        schema = Schema.from_json(staged["schema"]) if staged is not None else state.manifest.schema
        entries = _check_parts(self.client, state, plist, schema)
        check_parts_kinds(self.where, {e.shard.has_ids for e in entries}, None if overwrite else state.has_ids)
        return _commit(self.client, plist, entries, schema, staged, overwrite, state, WORKERS)

    def discard_jobs(self, jobs: Iterable[str]) -> None:
        """Write each job's end mark ``_parts/.ended/<job>``, then delete every object under
        ``_parts/<job>/``; end marks older than ENDED_KEEP_S go too."""
        for job in sorted(jobs):
            self.client.put(f"{ENDED_DIR}/{job}", b"")
            delete_all(self.client, list_keys(self.client, f"{PARTS_DIR}/{job}"), WORKERS)
        delete_old_marks(self.client)

    def pending_jobs(self) -> list[str]:
        return sorted(job_times(self.client))

    def clean_parts(self, older_than: float) -> list[str]:
        now = time.time()
        removed = [job for job, newest in sorted(job_times(self.client).items()) if now - newest >= older_than]
        self.discard_jobs(removed)
        return removed


# ---------------------------------------------------------------------------------- commit of parts


@dataclasses.dataclass
class _Entry:
    """One staged shard to commit: its part's staging prefix, its description, its descriptor's bytes."""

    prefix: str
    shard: PartShard
    desc: bytes


def _check_parts(client: ObjectClient, state: StoreState, plist: list[Part], schema: Schema) -> list[_Entry]:
    """One wave: each part's ``part.json``, ``committed.json`` and ``commit.json``, each shard's
    descriptor; the checks of docs/format.md 7.3, step 1. A part whose earlier commit reached its commit point
    (its ``commit.json`` numbers are committed rows of its shards' descriptors) is marked committed and reported."""
    keys: list[str] = []
    for p in plist:
        pre = prefix(p.job, p.task)
        keys += [f"{pre}/{PART_FILE}", f"{pre}/{COMMITTED_FILE}", f"{pre}/{COMMITTING_FILE}"]
        keys += [f"{pre}/{sh.dir}/{DESCRIPTOR}" for sh in p.shards]
    got = iter(get_many(client, keys))
    answers = [(p, next(got), next(got), next(got), [next(got) for _ in p.shards]) for p in plist]
    committed = dict(zip(state.rows["number"].tolist(), state.rows["desc_crc"].tolist()))
    earlier = []  # parts an earlier commit_parts committed, whose driver stopped before marking them
    for p, desc, done, marker, _ in answers:
        if desc is not None and done is None and marker is not None:
            numbers = [int(n) for n in json.loads(marker)["numbers"]]
            # the rows must be these shards': a failed commit gave its numbers back to other writers
            if numbers and len(numbers) == len(p.shards) and all(
                    committed.get(n) == sh.desc_crc for n, sh in zip(numbers, p.shards)):
                earlier.append(p)
    if earlier:
        gen = state.manifest.generation
        _finish_parts(client, earlier, gen, WORKERS)
        p = earlier[0]
        raise SeqstoreError(
            f"{client.key_url(prefix(p.job, p.task))} (part {p.task!r} of job {p.job!r}"
            + (f" and {len(earlier) - 1} more" if len(earlier) > 1 else "")
            + f"): already committed by an earlier commit_parts whose driver stopped before it finished (the store "
            f"is at manifest generation {gen}); nothing was committed by this call"
        )
    entries: list[_Entry] = []
    for p, desc, done, _, descs in answers:
        pre = prefix(p.job, p.task)
        names = [client.key_url(f"{pre}/{sh.dir}/{DESCRIPTOR}") for sh in p.shards]
        check_part(f"{client.key_url(pre)} (part {p.task!r} of job {p.job!r})", p, schema, done, desc is not None,
                   json.loads(desc) if desc is not None else None, list(zip(names, descs)))
        entries += [_Entry(pre, sh, raw) for sh, raw in zip(p.shards, descs) if raw is not None]
    return entries


def _staged_keys(p: Part) -> list[str]:
    pre = prefix(p.job, p.task)
    keys = [f"{pre}/{sh.dir}/{rel}" for sh in p.shards for rel in [*sorted(sh.files), DESCRIPTOR]]
    return [*keys, f"{pre}/{PART_FILE}", f"{pre}/{COMMITTING_FILE}"]


def _finish_parts(client: ObjectClient, plist: Sequence[Part], generation: int, workers: int) -> None:
    """After the commit point: ``committed.json`` into each part, then its staged objects deleted."""
    marker = json.dumps({"generation": generation}).encode()
    try:
        parallel(lambda p: client.put(f"{prefix(p.job, p.task)}/{COMMITTED_FILE}", marker), list(plist), workers)
    except RemoteError as exc:  # committed all the same; a repeated commit_parts finds commit.json
        log.warning("%s: committed, but could not mark every part committed (%s)", client.url, exc)
        return
    delete_all(client, [k for p in plist for k in _staged_keys(p)], workers)


def _commit(client: ObjectClient, plist: list[Part], entries: list[_Entry], schema: Schema,
            staged: Mapping[str, Any] | None, overwrite: bool, state: StoreState, workers: int) -> int:
    """Steps 2-6 of docs/format.md 7.3."""
    records = sum(e.shard.records for e in entries)
    if not entries and not overwrite:
        _finish_parts(client, plist, state.manifest.generation, workers)
        return 0
    token = uuid.uuid4().hex[:12]
    base, crcs = state.num_shards, np.array([e.shard.desc_crc for e in entries], dtype="<u4")

    def place(numbers: list[int]) -> None:
        """Record the numbers in each part's ``commit.json``, copy the staged files there."""
        it = iter(numbers)
        markers = [(f"{prefix(p.job, p.task)}/{COMMITTING_FILE}",
                    json.dumps({"token": token, "numbers": list(itertools.islice(it, len(p.shards)))}).encode())
                   for p in plist]
        parallel(lambda kv: client.put(kv[0], kv[1]), markers, workers)
        copies = [(f"{e.prefix}/{e.shard.dir}/{rel}", f"{shard_dir_name(n)}/{rel}", size)
                  for n, e in zip(numbers, entries) for rel, (size, _) in sorted(e.shard.files.items())]
        try:
            parallel(lambda t: _copy(client, *t), copies, workers)
        except RemoteNotFound as exc:
            raise SeqstoreError(f"{exc.url}: a staged file of a part is missing (discarded while committing?); "
                                "nothing was committed") from None

    def check(state: StoreState) -> None:
        """After a lost race: the store must still take these parts."""
        if overwrite:
            return
        if state.manifest.schema != schema:
            raise SchemaError(f"{client.url}: the store was replaced by one with schema {state.manifest.schema!r} "
                              "while committing; nothing was committed")
        kind = entries[0].shard.has_ids if entries else None
        if kind is not None and state.has_ids is not None and state.has_ids != kind:
            want = "with" if state.has_ids else "without"
            raise SchemaError(f"{client.url}: another writer committed records {want} ids first; the parts' are the "
                              "other kind; nothing was committed")
        if _holds_run(state.rows["desc_crc"][base:], crcs):  # another driver committed these parts meanwhile
            _finish_parts(client, plist, state.manifest.generation, workers)
            raise SeqstoreError(f"{client.url}: the parts' shards were committed meanwhile by another commit_parts of "
                                f"them (manifest generation {state.manifest.generation}); nothing was committed by "
                                "this call")

    state = Commit(client, [e.shard for e in entries], [e.desc for e in entries], place=place,
                   refresh=lambda known: read_v3(client, known=known), check=check,
                   token=token, overwrite=overwrite, schema=schema, staged=staged, workers=workers).run(state)
    m = state.manifest
    assert m.table is not None
    _finish_parts(client, plist, m.generation, workers)
    if overwrite and staged is not None:
        delete_quietly(client, STAGED_KEY)
    clean_tables(client, m.generation, m.table.file, workers)
    log.debug("%s: committed %d parts (%d shards, %d records) as generation %d", client.url, len(plist),
              len(entries), records, m.generation)
    return records


def _holds_run(values: np.ndarray[Any, Any], run: np.ndarray[Any, Any]) -> bool:
    """Whether ``run`` occurs in ``values`` as consecutive items."""
    k = len(run)
    if not k or len(values) < k:
        return False
    return any(np.array_equal(values[i : i + k], run) for i in np.flatnonzero(values[: len(values) - k + 1] == run[0]))


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
