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

Each task (any process on any machine that sees the store's file system, or its object storage)::

    w = PartWriter(path, job=job_id, task=attempt_id)  # attempt_id unique per attempt of a task
    w.append_batch(columns, ids=ids)                   # as Writer.append_batch / Writer.append
    part = w.finish()                                  # durable; picklable; part.to_json() for JSON
    # on an exception: w.abort() (or leave a ``with`` block), which deletes what it wrote

Driver, once the tasks reported::

    n = commit_parts(path, parts, mode="append")       # one commit; record order = order of ``parts``
    discard_parts(path, job_id)                        # deletes attempts that were not committed
    # on failure instead: discard_parts(path, parts or job_id): nothing of the job remains

A URL of object storage (``s3://``, ``gs://``, ``az://``) takes ``storage_options`` in every call.
Everything goes through the store's commit target (store/write/target.py). The parts area's layout
and the commit protocols, crash-safe locally through a journal and with a conditional manifest write
on object storage, are docs/format.md sections 1, 7.1 and 7.3. A part survives its task's process;
only :func:`discard_parts` and :func:`clean_parts` (by age) empty ``_parts/``. Everything the driver
does is O(parts + shards), never O(records).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from ...errors import FormatError, SchemaError, SeqstoreError
from ...format.manifest import MANIFEST, PARTS_DIR
from ...schema import Schema, schema_difference
from .api import open_target
from .target import (
    MODES,
    Part,
    PartShard,
    Start,
    as_part,
    check_name,
    check_v3,
    checked_metadata,
    checked_schema,
    new_manifest,
    schema_crc,
)
from .writer import Writer

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
    "remove_if_empty",
    "unstage",
]

log = logging.getLogger(__name__)


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

    A URL of object storage (``s3://``, ``gs://``, ``az://``) takes ``storage_options``; ``"create"`` there
    is a create-only write of the manifest.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    target = open_target(path, storage_options)
    where = target.where
    sch = checked_schema(schema, None, id_lookup)
    metadata = None if metadata is None else checked_metadata(metadata)
    manifest = target.read_manifest()
    if manifest is None:
        if target.install(new_manifest(sch, metadata, id_lookup), strict=True):
            return
        if mode == "create":
            raise FileExistsError(f"{where}: another process created a store here first (mode='create')")
        manifest = target.read_manifest()
        if manifest is None:
            raise FormatError(f"{where}: {MANIFEST} appeared and disappeared again (the store is being deleted?)")
    elif mode == "create":
        raise FileExistsError(f"{where}: a store already exists (mode='create'); use mode='append' or 'overwrite'")
    check_v3(where, manifest)
    if mode == "append":
        if manifest.schema != sch:
            raise SchemaError(f"{where}: existing store has schema other than the job writes: "
                              f"{schema_difference(manifest.schema, sch, ('the store', 'the job'))}")
        if manifest.id_lookup != id_lookup:
            raise SchemaError(f"{where}: existing store has id_lookup {manifest.id_lookup!r}, expected {id_lookup!r}")
        return
    if manifest.schema == sch and manifest.id_lookup == id_lookup and (
            metadata is None or dict(metadata) == manifest.metadata):
        target.set_staged(None)
        return
    target.set_staged({"schema": sch.to_json(), "id_lookup": id_lookup,
                       "metadata": None if metadata is None else dict(metadata)})


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

    For a URL of object storage ``PartWriter(url, ..., storage_options=...)`` writes a
    part whose shards are built in ``staging_dir`` (default: a new temporary directory) and each
    uploaded into the store's ``_parts/<job>/<task>/`` when finished; ``upload_workers``: files
    uploaded at once.
    """

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
        upload_workers: int = 8,
    ) -> None:
        self.job = check_name(job, "job")
        self.task = check_name(task, "task")
        self._part_shards: list[PartShard] = []
        self._part: Part | None = None
        target = open_target(path, storage_options, staging_dir=staging_dir, upload_workers=upload_workers)
        super().__init__(target, shard_bytes=shard_bytes, buffer_bytes=buffer_bytes,
                         max_shard_records=max_shard_records, direct_io=direct_io)
        self._schema_crc = schema_crc(self.schema)

    _RETRY = "finish()"

    def _open(self) -> Start:
        """The part's workspace (the schema: the store's, or the one an overwrite job staged)."""
        return self.target.open_part(self.job, self.task)

    def __repr__(self) -> str:
        t = self.target
        return f"seqstore.{t.kind}PartWriter({t.where!r}, job={self.job!r}, task={self.task!r})"

    def _commit_shard_files(self) -> None:
        """Finish the current shard and keep it in the part as ``p<k>`` (no store commit). A finished
        shard that could not be staged before (an upload that failed) is staged first."""
        self._stage_ready()
        if self._shard_open:
            self._finish_ready()
            self._stage_ready()

    def _stage_ready(self) -> None:
        """Keep the finished shard ``self._ready`` in the part (moved into it, or uploaded); it counts
        as the part's only once that succeeded, so a failure can be retried by the next call."""
        ready = self._ready
        if ready is None:
            return
        info = ready.info
        shard = PartShard(f"p{len(self._part_shards):06d}", info.records, dict(info.rows), info.has_ids,
                          {k: (v.bytes, v.crc32) for k, v in info.files.items()}, ready.desc_crc)
        self.target.stage_shard(self._start, ready.path, shard)  # (inside _failing: a PartOver fails the writer)
        self._part_shards.append(shard)
        self._committed_records += info.records
        self._ready = None

    def finish(self) -> Part:
        """Finish the part: write what is buffered, finish the last shard, make everything durable
        (uploaded), write ``part.json`` last and release the writer. Returns the :class:`Part` to hand to
        the driver (again on a second call). No commit: readers see nothing of it until
        :func:`commit_parts`."""
        if self._part is not None:
            if not self._closed:  # an interrupted release: finish it
                self._release()
            return self._part
        self._check_open()
        self._flush()
        self._commit_shard()  # (stages a shard finished earlier, finishes and stages the open one: either may be none)
        part = Part(self.job, self.task, sum(s.records for s in self._part_shards), tuple(self._part_shards),
                    self._schema_crc)
        with self._failing():
            self.target.finish_part(self._start, part)
        self._part = part
        self._release()
        return part

    @property
    def part(self) -> Part | None:
        """The :class:`Part` once :meth:`finish` returned, else None."""
        return self._part

    def commit(self) -> None:
        raise SeqstoreError(
            f"{self.target.where}: a PartWriter does not commit; call finish() and let the driver call commit_parts()"
        )

    def add_stats(self, delta: Mapping[str, float]) -> None:
        raise SeqstoreError(f"{self.target.where}: a PartWriter keeps no stats")

    def close(self) -> None:
        """Release the writer; a part not finished is discarded (as :meth:`abort`)."""
        if self._closed:
            return
        if self._part is None:
            log.warning("%s: PartWriter of task %r closed without finish(); its records are discarded",
                        self.target.where, self.task)
        self.abort()

    def _close_target(self) -> None:
        self.target.close_part(self._start, self._part)

    def _commit_at_exit(self, why: str) -> str | None:
        """Still open at interpreter exit or SIGTERM: a part is never committed here (only the driver
        commits, and it never got this part's description): discarded, as :meth:`close` does."""
        if self._closed or os.getpid() != self._pid:
            return None
        if self._part is not None:  # finished; only its release was interrupted
            self.abort()
            return None
        records = self._committed_records + self._uncommitted_records()
        self.abort()
        return (f"seqstore: {self.target.where}: PartWriter of task {self.task!r} not finished at {why}; "
                f"{records} record(s) discarded")

    def __enter__(self) -> PartWriter:
        return self


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
    O(parts + shards) file operations and memory; nothing here grows with the records. At a URL, the
    replaced shards' objects stay where they are (readers that opened the old store keep reading them)
    and a commit that lost ``MAX_COMMIT_ATTEMPTS`` races to other writers raises ConflictError.
    """
    if mode not in ("append", "overwrite"):
        raise ValueError(f"mode must be 'append' or 'overwrite', got {mode!r}")
    target = open_target(path, storage_options)
    plist = [as_part(p) for p in parts]
    seen: set[tuple[str, str]] = set()
    for p in plist:
        if (p.job, p.task) in seen:
            raise SeqstoreError(f"{target.where}: part {p.job}/{p.task} is given twice")
        seen.add((p.job, p.task))
    return target.commit_parts(plist, mode == "overwrite")


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
    once the job's tasks have stopped. O(tasks of the job).
    At a URL it first writes the job's end mark ``_parts/.ended/<job>`` (a task attempt still running
    removes its own objects when it next finds it), then deletes every object under ``_parts/<job>/``."""
    if isinstance(parts_or_job, str):
        jobs = {check_name(parts_or_job, "job")}
    else:
        jobs = {as_part(p).job for p in parts_or_job}
    open_target(path, storage_options, writing=False).discard_jobs(jobs)


def pending_jobs(path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The job ids that have a directory in the store's parts area (pending, failed or not discarded)."""
    return open_target(path, storage_options, writing=False).pending_jobs()


def clean_parts(
    path: str | os.PathLike[str], *, older_than: float, storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Discard every job of the store none of whose files changed in the last ``older_than`` seconds
    and none of whose tasks has a live PartWriter (jobs whose driver died); returns the jobs removed."""
    return open_target(path, storage_options, writing=False).clean_parts(older_than)


def unstage(path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None) -> None:
    """Delete the schema/metadata ``prepare_store(..., mode="overwrite")`` staged (an overwrite job that
    failed: later jobs then write the store's own schema again)."""
    open_target(path, storage_options, writing=False).set_staged(None)


def remove_if_empty(path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Delete the store at ``path`` if it has no committed shard, no job has staged anything in it and (a
    local store) no writer has it open (the store a failed job created); whether it was deleted. Locally
    this is decided and done under the store's lock, so a writer's commit is never lost with the store."""
    return open_target(path, storage_options, writing=False).remove_if_empty()
