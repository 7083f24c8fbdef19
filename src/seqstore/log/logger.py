"""The training-time writer of per-example tensors: :class:`Logger` (docs/logging.md).

``logger.log(ids, {"layer1": {"grad": g1}, "loss": l})`` copies a batch (batch first; torch on any
device or numpy) into a preallocated host buffer laid out as the store's files (one ``(cap, width)``
matrix per packed group) and returns. A full buffer goes to a background thread that writes it into a
shard and commits (crash-safe, docs/format.md section 7) every ``commit_every_s`` seconds, when a shard
is full, and on :meth:`Logger.flush`/:meth:`Logger.close`; during a pause in logging it takes the partly
filled buffer itself once nothing was handed off for ``commit_every_s``. Memory: two buffers of ``flush_bytes``;
``log`` blocks while both are busy. A failure of the background thread is raised (as
:class:`LoggerError`, chained to the cause) by the next ``log``/``flush``/``close``; shards committed
before it stay intact. ``on_duplicate`` (``"keep_first"``, ``"keep_last"``, ``"error"``) decides what
an id that is already logged does (:mod:`seqstore.log.duplicates`; docs/logging.md has the table).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from ..errors import AutoCommitError, SchemaError, SeqstoreError
from ..io.objects import is_remote
from ..schema import Field, Schema, flatten_values, to_storage_array
from ..store.directio import aligned_empty
from ..store.reader import Store
from ..store.write import at_exit
from ..store.writer import Writer, existing_manifest, open_or_create
from . import _buffers
from ._buffers import MAX_BUFFER_RECORDS, MAX_INFLIGHT_IDS, STOP, Buffer, Job
from ._buffers import buffer_rows as _buffer_rows
from ._buffers import warm_up_kernels as _warm_up_kernels
from ._tensors import HostStager, check_fields, default_packing, default_rank, ids_to_str, infer_field
from .duplicates import DUPLICATE_POLICIES, DuplicateIdError, LoggedIds

__all__ = ["Logger", "LoggerError", "LoggerCommitError", "DuplicateIdError", "default_packing", "DUPLICATE_POLICIES"]

log = logging.getLogger(__name__)


class LoggerError(SeqstoreError):
    """The logger's background writer failed; the cause is chained (``__cause__``)."""


class LoggerCommitError(LoggerError):
    """A commit failed with the records intact (the store's lock, the network or a full disk unusable for
    a while): nothing logged is lost; ``flush()`` or ``close()`` retries, ``log()`` refuses records until a
    commit succeeds. The cause is chained (``__cause__``)."""


class Logger:
    """Logs per-example tensors into a seqstore store from a training loop.

    Args:
        path: the store directory; created (atomically, safe for several ranks) when missing, else
            appended to (its schema must match). A URL of object storage (``s3://``, ``gs://``,
            ``az://``) logs there: shards are staged locally and uploaded at each commit
            (store/write/objects.py); ``storage_options`` configures the client.
        schema: a (nested) dict of name -> :class:`~seqstore.Field` (fixed shapes only). None: inferred
            from the first :meth:`log` call (dtype and ``shape[1:]`` of each tensor).
        flush_bytes: bytes of one host buffer (two exist at most). A buffer holds
            about ``flush_bytes // record_bytes`` records (at least one, at most MAX_BUFFER_RECORDS;
            rounded down to whole pages).
        commit_every_s: commit (make durable and visible) at least this often while logging, also
            during a pause with no ``log`` call (a crash loses at most about this many seconds of
            logging), and earlier when more than MAX_INFLIGHT_IDS logged ids are not committed yet.
        on_duplicate: ``"keep_first"`` (skip a record whose id is already logged or earlier in the batch),
            ``"keep_last"`` (write every record; ``index(id)`` returns the last) or ``"error"`` (raise
            :class:`DuplicateIdError` naming the ids; nothing of that batch is written).
        rank: this process's rank (default: ``torch.distributed.get_rank()`` when initialised, else 0);
            each rank writes its own shards into the one store and its counts go to
            ``stats["rank-<r>/records"]``.
        packed: pack fixed fields into one matrix per dtype (:func:`default_packing`, default), or a
            ``{group: [fields]}`` dict, or False for one file per field. Ignored when the store exists.
        shard_bytes: a shard is committed when it reaches this size.
        metadata: user metadata for a new store.
        direct_io: write the buffers with ``O_DIRECT`` where the filesystem allows it (default): the
            data goes from the page-aligned buffers to the device without a copy into the page cache,
            which on most machines is the largest CPU cost of logging, and the log does not evict
            training data from the cache. Readers then read it from disk, not from the cache, the
            first time. False: ordinary buffered writes.

    Thread safety: call ``log``/``flush``/``close`` from one thread (the training loop).
    """

    def __init__(self, path: str | os.PathLike[str], *, schema: Mapping[str, Any] | Schema | None = None,
                 flush_bytes: int = 64 << 20, commit_every_s: float = 60.0, on_duplicate: str = "keep_first",
                 rank: int | None = None, packed: bool | Mapping[str, list[str]] = True, shard_bytes: int = 1 << 30,
                 metadata: Mapping[str, Any] | None = None, direct_io: bool = True,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        _buffers.check_options(path, flush_bytes, commit_every_s, shard_bytes, packed, metadata, rank)
        self.path: Path | str = os.fspath(path) if is_remote(path) else Path(os.path.abspath(path))  # (a chdir later)
        self._storage_options = dict(storage_options or {}) or None
        self.flush_bytes = max(1, int(flush_bytes))
        self.commit_every_s = float(commit_every_s)
        self.on_duplicate = on_duplicate
        self._ids = LoggedIds(self.path, on_duplicate)  # checks the policy's name
        self.rank = default_rank() if rank is None else int(rank)
        self._packed = packed
        self._shard_bytes = max(1, int(shard_bytes))  # (1e9: the writer takes an int)
        self._metadata = dict(metadata or {})
        self._direct_io = bool(direct_io)
        self._stager = HostStager()
        self._writer: Writer | None = None
        self._reader: Store | None = None
        self.schema: Schema | None = None
        self._units: list[tuple[str, Field]] = []
        self._error: BaseException | None = None
        # a commit that failed with the records intact: flush()/close() retry; log() refuses until then
        self._commit_error: BaseException | None = None
        self._held: list[Buffer] = []  # by the background thread: buffers handed off, not all written yet
        self._closed = False
        self._closing = False
        self._stopping = False  # close() has asked the background thread to stop
        self._discard = False  # abort(): nothing more is written or committed
        self._thread: threading.Thread | None = None
        # SimpleQueue: its put is one C call, which an interrupt (Ctrl-C) cannot stop half way
        self._work: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._outgoing: Job | None = None  # a handoff an interrupt stopped before it was queued
        self._buffers: list[Buffer] = []  # made so far (two at most)
        self._returned = threading.Event()  # set by the background thread when a buffer becomes free
        self._spare: Buffer | None = None  # a free buffer being made current (see _take_buffer)
        self._cur: Buffer | None = None
        # held by log/flush/close while they use the current buffer and the in-flight ids, and by the
        # background thread while it takes a buffer that a pause in logging left waiting (_idle_job)
        self._lock = threading.Lock()
        self._seq = 0
        self._committed_seq = -1  # written by the background thread: last buffer seq that is committed
        self._last_handoff = time.monotonic()
        self._num_committed = 0
        self._num_logged = 0
        self._num_skipped = 0
        self._pid = os.getpid()
        at_exit.register(self, 0)  # committed at interpreter exit and on SIGTERM when never closed
        if schema is not None:
            self._start(Schema(schema))
        elif (existing := existing_manifest(self.path, self._storage_options)) is not None:
            self._start(existing.schema)

    # ------------------------------------------------------------------------------------ setup

    def _start(self, schema: Schema) -> None:
        """Open/create the store for ``schema``, start the background thread. Buffers come lazily."""
        ragged = [n for n, f in schema.items() if f.ragged]
        if ragged:
            raise SchemaError(f"{self.path}: a Logger logs fixed-shape per-example tensors; ragged fields {ragged}")
        packed = None if schema.groups or self._packed is False else (
            default_packing(schema) if self._packed is True else self._packed)
        # each step is skipped when done: an interrupt (Ctrl-C) in the first log() leaves the next to finish
        if self._writer is None:
            existing = existing_manifest(self.path, self._storage_options)
            if existing is not None:  # an existing store decides the layout
                if Schema(existing.schema, packed={}) != Schema(schema, packed={}):
                    raise SchemaError(f"{self.path}: existing store has schema {existing.schema!r}, logged {schema!r}")
                self._ids.check_lookup(existing.id_lookup)
                schema, packed = existing.schema, None
            elif isinstance(self._packed, Mapping) and packed is not None:  # (the schema's error names neither)
                try:
                    Schema(schema, packed=packed)
                except SchemaError as exc:
                    raise SchemaError(f"Logger {self.path}: packed={dict(self._packed)!r}: {exc}") from None
            self._writer = open_or_create(
                self.path, schema, packed=packed, id_lookup=self._ids.lookup, shard_bytes=self._shard_bytes,
                buffer_bytes=1,  # every append_batch is written through: no second copy
                metadata=self._metadata, direct_io=self._direct_io, storage_options=self._storage_options,
            )
        at_exit.unregister(self._writer)  # this logger closes it
        self._units = self._writer.schema.storage_units()
        self._cap = _buffer_rows(self.flush_bytes, [f.row_bytes for _, f in self._units], MAX_BUFFER_RECORDS)
        if self._reader is None:
            self._reader = Store(self.path, storage_options=self._storage_options)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"seqstore-logger-{self.rank}", daemon=True)
            self._thread.start()
        self.schema = self._writer.schema  # last: log() starts again while it is None

    def _take_buffer(self) -> Buffer:
        """Make a free buffer current; makes at most two, then blocks until the background thread frees
        one. An interrupt (Ctrl-C) anywhere loses no buffer: the next call finishes with ``_spare``."""
        while self._spare is None:
            self._returned.clear()
            spare = next((b for b in self._buffers if b.free), None)
            if spare is not None:
                self._spare = spare
            elif len(self._buffers) < 2:  # page aligned, so that full buffers can be written with direct I/O
                self._buffers.append(Buffer({name: aligned_empty((self._cap, *f.inner_shape), f.storage_dtype)
                                             for name, f in self._units}, self._cap, free=True))
            elif self._commit_error is not None:  # both held for a retry of the commit: no wait for ever
                raise self._commit_failure() from self._commit_error
            else:
                self._returned.wait()
        buf = self._spare
        buf.free = False
        buf.reset(self._seq)
        self._seq += 1
        self._cur = buf
        self._spare = None  # (an interrupt before this: _detach clears it)
        return buf

    # ------------------------------------------------------------------------------- background

    def _run(self) -> None:
        last_commit = time.monotonic()
        warm = False
        written_seq = -1
        dirty = False
        while True:
            job: Job | None
            try:
                job = self._work.get(timeout=max(0.05, min(self.commit_every_s, 1.0)))
            except queue.Empty:
                job = self._idle_job()
            if job is STOP:
                return
            if job is not None:
                if job.taken:  # queued again by a handoff resumed after an interrupt
                    continue
                job.taken = True
            committing = False
            try:
                if job is not None and job.buffer is not None:
                    if self._error is None and not self._discard:
                        self._held.append(job.buffer)
                    else:  # discarded at close() or abort()
                        job.buffer.free = True
                if self._error is None and not self._discard:
                    retry = self._commit_error is not None
                    if not retry or (job is not None and job.commit):  # after a failed commit: flush/close
                        while self._held:  # in order; a buffer stays held until the writer took all of it
                            self._write_buffer(self._held[0])
                            buf = self._held.pop(0)
                            written_seq, buf.free, dirty = buf.seq, True, True
                        now = time.monotonic()
                        due = (job is not None and job.commit) or now - last_commit >= self.commit_every_s
                        if (dirty or retry) and due:
                            assert self._writer is not None
                            committing = True
                            self._writer.commit()
                            committing = False
                            self._commit_error = None
                            self._num_committed = self._writer.num_committed
                            if not warm and not self._closing:
                                # the training thread looks ids up in committed shards from now on (numba
                                # kernels): load them here, once, before it sees the commit
                                warm = True
                                _warm_up_kernels()
                            self._committed_seq = written_seq
                            last_commit = now
                            dirty = False
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                if isinstance(exc, AutoCommitError) or (committing and _buffers.writer_intact(self._writer, exc)):
                    # the records intact (the lock, the network, a full disk for a while): kept for a retry
                    log.warning("%s: a commit failed, the records are kept for a retry: %r", self.path, exc)
                    self._commit_error = exc
                else:
                    log.error("%s: background writer failed: %r", self.path, exc)
                    self._error = exc
                    while self._held:  # discarded at close(): the training thread must not wait for them
                        self._held.pop(0).free = True
            finally:
                self._returned.set()  # (also after a failure: a log() waiting for a buffer sees it)
                if job is not None and job.done is not None:
                    job.done.set()

    def _idle_job(self) -> Job | None:
        """Nothing handed off for ``commit_every_s`` (a pause in logging: evaluation, a checkpoint): take
        the training thread's partly filled buffer, to be written and committed now rather than at the
        next ``log``. Never waits: while a ``log``/``flush``/``close`` runs, it hands off itself."""
        if self._error is not None or time.monotonic() - self._last_handoff < self.commit_every_s:
            return None
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._outgoing is not None:  # a handoff interrupted in the training thread: queue it now
                self._resume_handoff()
                return None
            cur = self._cur
            # a job queued meanwhile is older than the current buffer: buffers are written in order
            if cur is None or not (cur.n or cur.stats) or not self._work.empty():
                return None
            buf = self._detach()
            self._cur = None
            return Job(buf, True)
        finally:
            self._lock.release()

    def _write_buffer(self, buf: Buffer) -> None:
        """Write one buffer's records into the current shard (no commit); in the background thread."""
        assert self._writer is not None
        _buffers.write_buffer(self._writer, buf, self.rank)

    # ---------------------------------------------------------------------------------- logging

    def _check(self, retry: bool = False) -> None:
        """Refuse a call: from a forked child, after a failure, on a closed logger. ``retry``: a call that
        retries a failed commit (``flush``) is not refused for it."""
        if os.getpid() != self._pid:  # its background thread is not in a forked child: calls would block
            raise SeqstoreError(f"{self.path}: this logger belongs to process {self._pid}; a forked child cannot "
                                "use it (open a Logger of its own in the child)")
        self._raise_failure(retry)
        if self._closed or self._closing:
            raise SeqstoreError(f"{self.path}: logger is closed")

    def _raise_failure(self, retry: bool = False) -> None:
        """Raise the background writer's failure (every call after it, ``close`` included), and a failed
        commit until a retry succeeds (unless ``retry``)."""
        if self._error is not None:
            raise LoggerError(
                f"{self.path}: the background writer failed ({type(self._error).__name__}: {self._error}); "
                f"records committed before the failure ({self._num_committed} by this logger) are intact"
            ) from self._error
        if self._commit_error is not None and not retry:
            raise self._commit_failure() from self._commit_error

    def _commit_failure(self, note: str = "") -> LoggerCommitError:
        err = self._commit_error
        cause = getattr(err, "error", err)  # (an AutoCommitError's note is about the writer's own retry)
        return LoggerCommitError(
            f"{self.path}: a commit failed ({type(cause).__name__}: {cause}); nothing logged is lost: the "
            f"{self._num_logged - self._num_committed} record(s) logged and not committed are kept, and flush() "
            f"or close() retries the commit; log() takes no records until one succeeds{note}")

    @at_exit.guarded
    def log(self, ids: Any, tensors: Mapping[str, Any]) -> None:
        """Log a batch: ``ids`` (B str or int ids) and a nested dict of batch-first tensors ``(B, *shape)``.

        torch tensors on any device (bfloat16 included) or numpy arrays. The first call infers the
        schema when none was given. Raises :class:`~seqstore.SchemaError` naming the field and id for a
        missing or unknown field, a wrong shape or an unsafe dtype (nothing of the batch is logged),
        :class:`DuplicateIdError` under ``on_duplicate="error"``, and :class:`LoggerError` when the
        background writer failed. Blocks only while both buffers are busy. Cost: one copy of the
        batch into the buffer (plus the device->host copy for device tensors).
        """
        self._check()
        id_list = ids_to_str(ids)
        batch = len(id_list)
        first = id_list[0] if id_list else "<none>"
        flat = flatten_values(tensors, f"log() of the batch starting at id {first!r}")
        if self.schema is None:
            if batch == 0:
                return
            self._start(Schema({n: infer_field(n, v, batch, first) for n, v in flat.items()}))
        assert self.schema is not None
        schema = self.schema
        check_fields(schema, flat, id_list)
        host = self._stager.to_host(flat)
        converted: dict[str, np.ndarray[Any, Any]] = {}
        for name, f in schema.items():
            arr = to_storage_array(f, host[name], what=f"log(): field {name!r} of id {first!r}")
            converted[name] = arr.reshape(batch, math.prod(f.inner_shape)) if schema.group_of(name) is not None else arr
        assert self._reader is not None
        with self._lock:
            self._resume_handoff()
            if self._cur is not None:  # (the rows an interrupted log() copied: in flight first)
                self._ids.add(self._cur)
            self._ids.see_commits(self._reader, self._committed_seq)
            keep, stats, skipped = self._ids.check(self._reader, id_list)
            self._append(converted, id_list, keep, stats, skipped)
            if time.monotonic() - self._last_handoff >= self.commit_every_s:
                self._handoff(commit=True)
            elif len(self._ids) > MAX_INFLIGHT_IDS and self._ids.commit_asked < 0:
                # commit early, once, until that commit is seen (the buffer handed off now, or the last one)
                self._ids.commit_asked = self._cur.seq if self._cur is not None else self._seq - 1
                self._handoff(commit=True)

    def _append(self, converted: Mapping[str, np.ndarray[Any, Any]], ids: list[str], keep: np.ndarray[Any, Any] | None,
                stats: dict[str, int], skipped: int) -> None:
        """Copy the kept rows into buffers, handing full buffers to the background thread. The batch's
        duplicate counts go in with its last rows (the record counts are the buffers' own), so that a
        batch stopped by an interrupt before that and logged again is counted once."""
        assert self.schema is not None
        groups = self.schema.groups
        if keep is not None:
            ids = [ids[k] for k in keep]
        total = len(ids)
        cur = self._cur if self._cur is not None else self._take_buffer()
        if not total:
            self._count_duplicates(cur, stats, skipped)
            return
        pos = 0
        while pos < total:
            try:
                buf = self._cur if self._cur is not None else self._take_buffer()
            except LoggerCommitError:  # (the commit failed while this batch was copied)
                raise self._commit_failure(
                    f"; of this batch, the {pos} record(s) up to id {ids[pos - 1]!r} are logged, the {total - pos} "
                    f"from id {ids[pos]!r} on are not: log those again after a flush()") from self._commit_error
            take = min(total - pos, buf.cap - buf.n)
            src = slice(pos, pos + take) if keep is None else keep[pos : pos + take]
            dst = slice(buf.n, buf.n + take)
            for name, _f in self._units:
                if name in groups:
                    mat = buf.arrays[name]
                    for fname in groups[name].fields:
                        a, b = groups[name].columns[fname]
                        mat[dst, a:b] = converted[fname][src]
                else:
                    buf.arrays[name][dst] = converted[name][src]
            del buf.ids[buf.n :]  # (ids an interrupted copy left)
            buf.ids.extend(ids[pos : pos + take])
            buf.n += take
            self._num_logged += take
            # only then in flight (an interrupt before this must not leave ids marked as logged whose rows
            # were never counted: keep_first would drop them); the next log() or handoff finishes it
            self._ids.add(buf)
            pos += take
            if pos == total:
                self._count_duplicates(buf, stats, skipped)
            if buf.n == buf.cap:
                self._handoff(commit=False)

    def _count_duplicates(self, buf: Buffer, stats: Mapping[str, int], skipped: int) -> None:
        for k, v in stats.items():
            buf.stats[k] = buf.stats.get(k, 0) + v
        self._num_skipped += skipped

    def _handoff(self, *, commit: bool, wait: bool = False) -> None:
        """Give the current buffer (possibly empty) to the background thread. Called holding the lock. An
        interrupt (Ctrl-C) may stop it anywhere: before ``_outgoing`` is set nothing was given (the buffer
        stays current), after it the next call under the lock, or the idle background thread, queues it."""
        self._resume_handoff()
        done = threading.Event() if wait else None
        job = Job(self._detach(), commit, done)
        self._outgoing = job
        self._resume_handoff()
        if done is not None:
            done.wait()

    def _resume_handoff(self) -> None:
        """Queue the handoff in ``_outgoing`` and take its buffer away. Under the lock; redone whole when
        interrupted (a job queued twice runs once)."""
        job = self._outgoing
        if job is None:
            return
        if job.buffer is not None and self._cur is job.buffer:
            self._cur = None
        self._work.put(job)
        self._outgoing = None

    def _detach(self) -> Buffer | None:
        """The current buffer, about to be handed off, all its ids in flight (an interrupted log() may
        have left some out). Under the lock; it stays current (the caller takes it away); may be repeated."""
        self._last_handoff = time.monotonic()
        buf = self._cur
        if buf is not None:
            if self._spare is buf:  # _take_buffer was interrupted after making it current
                self._spare = None
            self._ids.add(buf)
            self._ids.handed_off(buf.seq, buf.ids)
        return buf

    # ---------------------------------------------------------------------------------- control

    @at_exit.guarded
    def flush(self) -> None:
        """Write and commit everything logged so far; returns when it is durable and visible."""
        self._check(retry=True)
        if self._thread is None:
            return
        with self._lock:
            self._handoff(commit=True, wait=True)
            self._check()  # (a retry of a failed commit that failed again too)
            assert self._reader is not None
            self._ids.see_commits(self._reader, self._committed_seq)

    @at_exit.guarded
    def close(self) -> None:
        """Commit what is pending, stop the background thread and release the store.

        Raises :class:`LoggerError` if the background writer failed (then what was not committed
        before the failure is discarded; committed shards stay), and again at every later call, as
        ``log`` and ``flush`` do. A commit that fails with the records intact raises
        :class:`LoggerCommitError` and leaves the logger closing with them: ``close`` again retries.
        After a clean close, a second one does nothing. An interrupt (Ctrl-C) leaves the logger
        closing: a second ``close`` (or the interpreter's exit) finishes it.
        """
        if self._closed or os.getpid() != self._pid:  # (a forked child's copy: the parent's thread, buffers, writer)
            if os.getpid() == self._pid:
                self._raise_failure()
            self._closed = True
            return
        self._closing = True
        # each step may be redone: an interrupt anywhere leaves the rest to the next close (or the exit hook)
        if self._discard:  # an abort() that an interrupt stopped: finish it
            self.abort()
            return
        if self._thread is not None and self._error is None and not self._stopping:
            with self._lock:
                self._handoff(commit=True, wait=True)
            if self._commit_error is not None and self._error is None:  # kept: close() again retries
                raise self._commit_failure() from self._commit_error
        if self._thread is not None:
            self._stopping = True
            self._work.put(STOP)  # a second one (a close resumed) is never read
            self._thread.join()
        if self._writer is not None:
            if self._error is None:
                self._writer.close()
            else:
                self._writer.abort()
        self._closed = True
        at_exit.unregister(self)
        self._raise_failure()

    @at_exit.guarded
    def abort(self) -> None:
        """Give up what is not committed: the records logged since the last commit (kept for a retry
        after a failed commit, or still in the buffers) are discarded, the background thread stops and
        the store's writer is released (its workspace removed). Committed records stay. Never raises for
        a failed commit; the logger is closed after it (a later ``close``/``abort`` does nothing, ``log``
        and ``flush`` raise). An interrupt (Ctrl-C) leaves the rest to the next ``abort``, ``close`` or
        the interpreter's exit, which discard as well."""
        if self._closed or os.getpid() != self._pid:  # (a forked child's copy: the parent's thread, buffers, writer)
            self._closed = True
            return
        self._closing = self._discard = True
        if self._thread is not None:
            self._stopping = True
            self._work.put(STOP)  # (after jobs already queued: their buffers are freed, not written)
            self._thread.join()
            self._held.clear()
        if self._writer is not None:
            self._writer.abort()
        self._commit_error = None  # given up: not raised by a later call
        self._closed = True
        at_exit.unregister(self)

    def _commit_at_exit(self, why: str) -> str | None:
        """Still open at interpreter exit or SIGTERM (store/write/at_exit.py): close, committing what
        was logged. The line to print."""
        if self._closed:
            return None
        if self._thread is None:  # nothing was ever logged: nothing to commit or say
            self.close()
            return None
        if self._discard:  # an abort() that an interrupt stopped: finished, discarding
            self.abort()
            return None
        pending = self._num_logged - self._num_committed
        try:
            self.close()
        except LoggerCommitError as exc:  # retried at exit, failed again: the records go with the process
            self._error = exc
            with contextlib.suppress(LoggerError):
                self.close()  # (stops the thread, removes the writer's workspace)
            return (f"seqstore: {self.path}: logger not closed at {why}; its commit failed ({exc.__cause__!r}): "
                    f"{pending} uncommitted record(s) discarded")
        except LoggerError as exc:
            return f"seqstore: {self.path}: logger not closed at {why}; {exc}"
        return f"seqstore: {self.path}: logger not closed at {why}; committed {pending} pending record(s)"

    def __enter__(self) -> Logger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---------------------------------------------------------------------------------- numbers

    @property
    def num_committed(self) -> int:
        """Records this logger has committed (durable and visible to readers)."""
        return self._num_committed

    @property
    def num_logged(self) -> int:
        """Records accepted by :meth:`log` (duplicates skipped under keep_first are not counted)."""
        return self._num_logged

    @property
    def num_skipped(self) -> int:
        """Records not written because their id was already logged (keep_first)."""
        return self._num_skipped

    def __repr__(self) -> str:
        return f"seqstore.Logger({str(self.path)!r}, rank={self.rank}, logged={self._num_logged})"
