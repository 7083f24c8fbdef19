"""Writing stores: buffered, crash-safe appends of records into immutable shards.

A :class:`Writer` validates records against the schema, buffers them by bytes, and writes the current
shard into a private workspace (``_tmp/<token>/current``; ``_tmp-<token>/current`` in a version-1/2
store; store/write/shard_files.py). :meth:`Writer.commit` finishes the shard and hands it to the
writer's commit target (store/write/target.py: a local directory, or object storage), which makes it
visible with one manifest replacement (docs/format.md, section 7): a crash before that loses only
the uncommitted records, a crash after it nothing. A store keeps its format version. Packed groups
are buffered and written as one ``(n, width)`` matrix per group; :meth:`Writer.append_batch` also
takes a group's whole ``(B, width)`` matrix under the group's name (no per-field copy).
"""

from __future__ import annotations

import logging
import numbers
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import numpy as np

from ...errors import SchemaError, SeqstoreError, auto_commit_error
from ...schema import Field, Schema, to_storage_array
from . import at_exit, disk
from .checks import RecordChecks
from .columns import DIRECT_BYTES, BatchBytes, caller_ids, row_starts, stage
from .shard_files import ShardFiles
from .target import CommitTarget, Finished, IdsMismatch, NotCommitted, PartOver, Start, stats_number
from .values import ragged_column, shape_text, storage_value

__all__ = ["Writer", "check_sizes"]

log = logging.getLogger(__name__)


def check_sizes(**sizes: int) -> None:
    """Refuse a writer's size (``shard_bytes=``, ``buffer_bytes=``, ``max_shard_records=``) that is not
    positive (``create`` and the engines check them before they make or touch the store)."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}")
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")


class Writer:
    """Appends records to a store. Use :func:`create` or :func:`append_to` to get one.

    Records are buffered up to ``buffer_bytes`` and then written to the current shard; a shard is
    committed when it reaches ``shard_bytes`` or ``max_shard_records``, on :meth:`commit`, and on
    :meth:`close`. Leaving a ``with`` block by an exception discards what was not committed.

    ``direct_io=True`` writes the data of every field with ``O_DIRECT`` in page-aligned runs (no copy
    into the page cache, which is most of the CPU cost of writing GB/s) where the filesystem supports
    it; offsets and ids go through the page cache. docs/store.md says how appends are aligned
    (:func:`~seqstore.store.directio.aligned_empty`) or copied, and what waits for the shard's end.
    """

    _RETRY = "commit() or close()"  # (what retries a failed automatic commit: AutoCommitError's message)

    def __init__(
        self,
        target: CommitTarget,
        *,
        shard_bytes: int = 1 << 30,
        buffer_bytes: int = 64 << 20,
        max_shard_records: int = 1 << 24,
        direct_io: bool = False,
    ) -> None:
        check_sizes(shard_bytes=shard_bytes, buffer_bytes=buffer_bytes, max_shard_records=max_shard_records)
        self.target = target
        self.direct_io = bool(direct_io)
        # (Python ints: a NumPy one would reach the shard's record count, which JSON cannot save)
        self.shard_bytes, self.buffer_bytes, self.max_shard_records = (
            int(shard_bytes), int(buffer_bytes), int(max_shard_records))
        self._pid = os.getpid()
        self._failed: BaseException | None = None
        self._close_error: Exception | None = None  # what a close() that discarded the records raised
        start = self._start = self._open()
        try:
            self.root = start.root  #: the store's directory, or the local staging directory of a store at a URL
            self._workspace = start.workspace
            self.schema: Schema = start.schema
            # what is stored: unpacked fields, then packed groups as fixed (width,) fields
            self._units: list[tuple[str, Field]] = self.schema.storage_units()
            self._stats_delta: dict[str, float] = {}
            self._checks = RecordChecks(self.schema, self.target, self.direct_io, start.has_ids)
            # a store keeps its format version: version 3 shards get a descriptor, 1/2 are listed in the manifest
            self._descriptors = start.descriptors
            self._records_before = start.records
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seqstore-crc")
            # direct writes of copied runs (ragged values), behind the caller's next appends
            self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seqstore-write") if self.direct_io \
                else None
        except BaseException:  # (an interrupt): the workspace just made is released, not held for good
            self._close_target()
            raise
        self._closed = self._target_closed = False
        self._reset_buffer()
        self._shard_open, self._shard_records, self._shard_bytes = False, 0, 0  # (both 0 while no shard is open)
        self._ready: Finished | None = None  # a finished shard whose commit failed: committed first next time
        self._committed_records = 0
        self._exit_unsafe = False  # an interrupt stopped an append part way (at_exit.guarded)
        at_exit.register(self, 1)

    def _open(self) -> Start:
        """Make the workspace (the target locks the store or reads its state); what the writer starts from."""
        return self.target.open_writer()

    def __repr__(self) -> str:
        return f"seqstore.{self.target.kind}Writer({self.target.where!r}, committed={self.num_committed})"

    @property
    def conflicts(self) -> int:
        """Commits this writer lost to another writer and retried (object storage)."""
        return self.target.conflicts

    @property
    def renumbered(self) -> int:
        """Shards this writer had to move to a higher number (object storage)."""
        return self.target.renumbered

    @property
    def usable(self) -> bool:
        """Whether this writer takes records and commits: not closed, and no failure that lost its
        records (a commit that failed with them intact leaves it usable: its next commit retries)."""
        return self._failed is None and not self._closed

    def _reset_buffer(self) -> None:
        # staging arrays are free again once their data is written: keep one per unit for reuse
        self._spare: dict[str, np.ndarray[Any, Any]] = {n: st[0] for n, st in getattr(self, "_staging", {}).items()}
        self._staging: dict[str, tuple[np.ndarray[Any, Any], int, np.ndarray[Any, Any], int]] = {}
        self._buf: dict[str, list[np.ndarray[Any, Any]]] = {n: [] for n, _ in self._units}
        self._buf_lengths: dict[str, list[np.ndarray[Any, Any]]] = {n: [] for n, f in self._units if f.ragged}
        self._buf_ids: list[str] = []
        self._buf_records = self._buf_bytes = 0

    # --------------------------------------------------------------------------------------- append

    @at_exit.guarded
    def append(self, record: Mapping[str, Any], id: str | None = None) -> None:  # noqa: A002
        """Append one record: a (possibly nested) dict of field name -> array-like.

        Raises SchemaError naming the field, record number and id; a rejected record leaves nothing.
        :class:`~seqstore.errors.AutoCommitError`: the automatic commit of a full shard failed, and
        ``taken`` says whether the writer holds the record (1: do not append it again) or not (0).
        """
        self._check_open()
        index = self._records_before + self._committed_records + self._uncommitted_records()
        what = f"record {index}" + (f" (id {id!r})" if id is not None else "")
        if id is not None and not isinstance(id, str):
            raise SchemaError(f"record {index}: id must be a str, got {type(id).__name__} {id!r}")
        flat = self._checks.flatten(record, what)
        converted: dict[str, np.ndarray[Any, Any]] = {}
        nbytes = 0
        for name, f, value in self._checks.given(flat):
            arr = storage_value(f, value, f"{what}, field {name!r}")
            if f.ragged:
                if arr.ndim != len(f.shape) or arr.shape[1:] != f.inner_shape:
                    raise SchemaError(f"{what}, field {name!r}: expected shape {shape_text('n', f.inner_shape)}, "
                                      f"got {arr.shape}")
            elif arr.shape != f.inner_shape:
                raise SchemaError(f"{what}, field {name!r}: expected shape {f.inner_shape}, got {arr.shape}")
            # buffered until the next flush: must not share memory the caller may overwrite
            converted[name] = arr.copy() if arr is value or arr.base is not None else arr
        units: dict[str, np.ndarray[Any, Any]] = {}
        for name, f in self._units:
            if name in self._checks.groups:  # (the fields' converted values reshape to the group's row)
                units[name] = self._checks.pack(name, flat, converted, None, f"{what}, packed group {name!r}")
            else:
                units[name] = converted[name] if f.ragged else converted[name][None]
            nbytes += units[name].nbytes
        self._checks.ids(id is not None, index)  # after the fields: a wrong field is the likelier mistake
        self._commit_if_full(1)
        self._checks.has_ids = id is not None
        try:
            for name, f in self._units:
                self._buf[name].append(units[name])
                if f.ragged:
                    self._buf_lengths[name].append(np.array([units[name].shape[0]], dtype=np.int64))
            if id is not None:
                self._buf_ids.append(id)
            self._buf_records += 1
            self._buf_bytes += nbytes
        except BaseException as exc:  # an interrupt (Ctrl-C) part way: the buffers no longer agree
            self._failed = exc
            raise
        if self._buf_full():
            self._auto_flush(1, 1)

    @at_exit.guarded
    def append_batch(self, columns: Mapping[str, Any], ids: Sequence[str] | None = None) -> None:
        """Append a batch: fixed field -> stacked array (B, ...); ragged field -> list of arrays or a
        ``(values, lengths)`` pair. ``ids``: B str ids or None. All columns are validated before
        anything is buffered; a rejected batch leaves nothing behind. An
        :class:`~seqstore.errors.AutoCommitError` (an automatic commit failed) says in ``taken`` how many
        of the batch's first records the writer holds: append again only the records after those.
        """
        self._check_open()
        first = self._records_before + self._committed_records + self._uncommitted_records()
        if ids is not None:
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
                raise SchemaError(f"batch starting at record {first}: ids must be a sequence of str, got {ids!r}")
            for k, s in enumerate(ids):
                if not isinstance(s, str):
                    raise SchemaError(f"record {first + k}: id must be a str, got {type(s).__name__} {s!r}")
        what = f"batch starting at record {first}" + (f" (id {str(ids[0])!r})" if ids is not None and len(ids) else "")

        def item(k: int) -> str:
            return f"record {first + k}" + (f" (id {str(ids[k])!r})" if ids is not None and k < len(ids) else "")

        flat = self._checks.flatten(columns, what)
        caller = caller_ids(flat.values())
        batch: int | None = None
        prepared: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]] = []
        fixed: dict[str, np.ndarray[Any, Any]] = {}
        for name, f, value in self._checks.given(flat):
            lengths: np.ndarray[Any, Any] | None = None
            fw = f"{what}, field {name!r}"
            if f.ragged:
                values, lengths = ragged_column(f, value, fw, item)
                n = len(lengths)
            else:
                values = to_storage_array(f, value, what=fw, item=item)
                if values.ndim != 1 + len(f.inner_shape) or values.shape[1:] != f.inner_shape:
                    want = shape_text("B", f.inner_shape)
                    raise SchemaError(f"{fw}: expected shape {want} stacked, got {values.shape}")
                n = values.shape[0]
            if batch is None:
                batch = n
            elif n != batch:
                raise SchemaError(f"{fw}: has {n} records but earlier fields have {batch}")
            if self.schema.group_of(name) is None:
                prepared.append((values, lengths))
            else:
                fixed[name] = values
        for gname in self._checks.groups:
            if gname in flat:
                first_dim = np.shape(flat[gname])[0] if np.ndim(flat[gname]) else 0
                batch = first_dim if batch is None else batch
            assert batch is not None
            mat = self._checks.pack(gname, flat, fixed, batch, f"{what}, packed group {gname!r}")
            prepared.append((mat, None))
        assert batch is not None
        if ids is not None and len(ids) != batch:
            raise SchemaError(f"{what}: got {len(ids)} ids for a batch of {batch} records")
        if batch == 0:
            return
        self._checks.ids(ids is not None, first, batch=True)
        self._commit_if_full(batch)
        self._checks.has_ids = ids is not None
        starts = [None if lengths is None else row_starts(lengths) for _, lengths in prepared]
        sizes = BatchBytes(prepared, starts, batch)
        start = 0
        while start < batch:  # a piece ends at the shard's record limit, or with the record reaching shard_bytes
            room = self.max_shard_records - self._shard_records - self._buf_records
            stop = min(batch, start + max(room, 1))
            stop = sizes.reach(start, self.shard_bytes - self._shard_bytes - self._buf_bytes, stop)
            piece_bytes = sizes.at(stop) - sizes.at(start)
            direct = piece_bytes >= DIRECT_BYTES
            if direct:  # written straight from the caller's arrays: flush what is buffered first
                self._auto_flush(start, batch)
            # (_flush judges its own errors: a commit that failed with the shard intact leaves the writer usable)
            try:  # an interrupt (Ctrl-C) part way leaves buffers that no longer agree: the writer fails
                for (name, _f), (values, lengths), rows in zip(self._units, prepared, starts):
                    if rows is None:
                        self._buf[name].append(values[start:stop])
                    else:
                        assert lengths is not None
                        self._buf[name].append(values[rows[start] : rows[stop]])
                        self._buf_lengths[name].append(lengths[start:stop])
                if ids is not None:
                    self._buf_ids.extend(ids[start:stop])
                self._buf_records += stop - start
                self._buf_bytes += piece_bytes
                flush = direct or self._buf_full()
                if not flush:  # the piece stays buffered: copy it (once) out of memory the caller may overwrite
                    for name, _ in self._units:
                        stage(self._buf[name], self._staging, self._spare, name, caller, self.direct_io)
            except BaseException as exc:
                if self._failed is None and not isinstance(exc, SeqstoreError):
                    self._failed = exc
                raise
            if flush:
                self._auto_flush(stop, batch)
            start = stop

    def _buf_full(self) -> bool:
        """Flush when the buffer is full or the shard it goes into would be."""
        return (self._buf_bytes >= self.buffer_bytes or self._shard_bytes + self._buf_bytes >= self.shard_bytes
                or self._shard_records + self._buf_records >= self.max_shard_records)

    def _uncommitted_records(self) -> int:
        """Every record appended and not committed: also a finished shard whose commit failed."""
        return self._buf_records + self._shard_records + (self._ready.info.records if self._ready is not None else 0)

    def _auto_flush(self, taken: int, of: int, full: bool = False) -> None:
        """:meth:`_flush` (``full``: the commit of the full shard) in an append that has taken ``taken`` of
        its ``of`` records: where the automatic commit of a full shard fails with the records intact, an
        :class:`~seqstore.errors.AutoCommitError` (of the failure's class too) says what the writer holds."""
        try:
            (self._commit_shard if full else self._flush)()
        except Exception as exc:
            pending = self._uncommitted_records()
            if self._failed is not None or self._closed or isinstance(exc, SchemaError) or not pending:
                raise  # (discarded: a failed write, or a shard of the other kind of ids)
            if taken == 0:
                note = (f"; none of the {of} record(s) of this call were taken (the writer's shard is full and "
                        f"holds {pending} uncommitted records): append them again once a commit succeeds")
            else:
                rest = f"; the {of - taken} from record {taken} of the call on were not taken" if taken < of else ""
                note = (f"; the writer holds {taken} of the {of} record(s) of this call ({pending} uncommitted in "
                        f"all): do not append them again, {self._RETRY} retries the commit{rest}")
            raise auto_commit_error(exc, taken, pending, note) from exc

    def _commit_if_full(self, of: int) -> None:
        """Before an append of ``of`` records takes any: a full shard whose automatic commit failed is
        committed now, or the append is refused (no shard grows past ``max_shard_records``/``shard_bytes``)."""
        full = self._shard_records >= self.max_shard_records or self._shard_bytes >= self.shard_bytes
        if self._shard_open and full:
            self._auto_flush(0, of, full=True)

    def _flush(self) -> None:
        """Write the buffer to the current shard (no commit). Splits the shard when it is full.

        If writing fails part way (disk full, I/O error), the shard's files no longer agree with each
        other: the writer is marked failed and only :meth:`abort` is allowed (committed data is safe)."""
        if self._buf_records == 0:
            return
        with self._failing():
            if not self._shard_open:
                self._shard = ShardFiles(self._workspace / "current", self.schema, bool(self._checks.has_ids),
                                         self._descriptors, self._pool, self._io, self.direct_io)
                self._shard_open = True
            self._shard.write(self._buf, self._buf_lengths, self._buf_ids)
            self._shard_records += self._buf_records
            self._shard_bytes += self._buf_bytes
            self._reset_buffer()
            if self._shard_bytes >= self.shard_bytes or self._shard_records >= self.max_shard_records:
                self._commit_shard_files()  # (inside _failing already)

    @contextmanager
    def _failing(self) -> Iterator[None]:
        """Mark the writer failed when the block raises anything but a SeqstoreError (I/O errors part
        way through leave the shard's files inconsistent; validation errors leave nothing behind), or
        a PartOver (a part writer's job ended: no retry can help, never an AutoCommitError offering one)."""
        try:
            yield
        except PartOver as exc:
            self._failed = exc
            raise
        except SeqstoreError:
            raise
        except BaseException as exc:
            if isinstance(exc, NotCommitted):  # the finished shard intact: the next commit (or close()) retries it
                exc = exc.take()
            else:
                self._failed = exc
            raise disk.write_error(exc, self.target.where, self._workspace, self._uncommitted_records())  # noqa: B904

    # --------------------------------------------------------------------------------------- commit

    @at_exit.guarded
    def commit(self) -> None:
        """Make everything appended so far durable and visible to readers that open or refresh.

        After this returns, a crash or power cut loses none of these records.
        """
        self._check_open()
        self._flush()
        if self._shard_open:
            self._commit_shard()
        elif self._ready is not None or self._stats_delta:
            with self._failing():
                self._publish()

    def add_stats(self, delta: Mapping[str, float]) -> None:
        """Add numbers to the manifest's ``stats`` (``stats[k] += v``) at the next commit.

        Deltas from several writers of one store add up (they are applied under the commit lock);
        :meth:`commit` saves pending deltas even when no records are pending.
        """
        self._check_open()
        if not isinstance(delta, Mapping):
            raise TypeError(f"add_stats takes a dict of str -> number, got {type(delta).__name__}")
        for k, v in {k: stats_number(k, v) for k, v in delta.items()}.items():  # all checked first
            self._stats_delta[k] = self._stats_delta.get(k, 0) + v

    def _finish_ready(self) -> None:
        """Finish the current shard and move it to the workspace's ``ready/`` (``self._ready``)."""
        info, crc = self._shard.finish(self._shard_records)
        ready = self._workspace / "ready"
        os.rename(self._workspace / "current", ready)
        self._ready = Finished(ready, info, 0 if crc is None else crc)
        self._shard_open, self._shard_records, self._shard_bytes = False, 0, 0

    def _commit_shard(self) -> None:
        with self._failing():
            self._commit_shard_files()

    def _commit_shard_files(self) -> None:
        if self._ready is not None:  # a shard finished earlier whose commit failed: first
            self._publish()
        self._finish_ready()
        self._publish()

    def _publish(self) -> None:
        """Commit the finished shard (if any) and the stats deltas through the target."""
        ready, delta = self._ready, dict(self._stats_delta)
        if not self._workspace.is_dir():  # (never into a store made anew at the path meanwhile: _failing names it)
            raise FileNotFoundError(f"the writer's workspace {self._workspace} is gone")
        try:
            name = self.target.publish(ready, delta)
        except IdsMismatch as exc:
            # another writer committed the other kind first: drop this shard, stay usable
            assert ready is not None
            shutil.rmtree(ready.path, ignore_errors=True)
            self._ready = None
            self._checks.has_ids = exc.has_ids
            kind = "with" if exc.has_ids else "without"
            raise SchemaError(
                f"{self.target.where}: cannot mix records with and without ids in one store; its records are now "
                f"written {kind} ids, so the {ready.info.records} uncommitted records of this writer's shard were "
                "discarded"
            ) from None
        self._stats_delta = {k: v - delta.get(k, 0) for k, v in self._stats_delta.items() if v != delta.get(k, 0)}
        if ready is not None:
            shutil.rmtree(ready.path, ignore_errors=True)  # gone already where the target moved it
            self._ready = None
            self._committed_records += ready.info.records
            log.debug("%s: committed %s (%d records)", self.target.where, name, ready.info.records)

    # ---------------------------------------------------------------------------------------- close

    def _check_open(self) -> None:
        if self._closed:
            raise SeqstoreError(f"{self.target.where}: writer is closed")
        if os.getpid() != self._pid:
            raise SeqstoreError(
                f"{self.target.where}: this writer belongs to process {self._pid}; a forked child cannot use it "
                "(open a writer of its own with seqstore.append_to)"
            )
        if self._failed is not None:
            raise SeqstoreError(
                f"{self.target.where}: an earlier write failed ({self._failed!r}); the records appended since the last "
                "commit cannot be written consistently. Call abort(): committed records are intact."
            )

    @at_exit.guarded
    def abort(self) -> None:
        """Discard everything not yet committed and release the writer. Never fails part way: every
        file is closed and the workspace removed even when closing one of them reports an error.
        In a forked child it only marks the writer closed (the files are the parent's)."""
        if self._closed:
            return
        try:
            if self._shard_open and os.getpid() == self._pid:
                self._shard.abort()
        finally:
            self._reset_buffer()
            self._shard_open, self._shard_records, self._shard_bytes = False, 0, 0
            self._ready = None  # (a ready shard's directory is in the workspace)
            self._release()

    @at_exit.guarded
    def close(self) -> None:
        """Commit what is pending and release the writer. A commit that fails with the records intact (a
        named error: the network or the lock file unusable for a while) leaves the writer open with them:
        close() again commits them, abort() gives them up. A failed write or an interrupt aborts (the
        records are discarded), and a later close() raises the same error again."""
        if self._closed:
            if self._close_error is not None:  # the records were discarded: never a quiet second close()
                raise self._close_error
            return
        if os.getpid() != self._pid:  # a forked child's copy: committing would take the parent's shard
            self._closed = True
            return
        try:
            self.commit()
        except BaseException as exc:
            if self._failed is not None or self._exit_unsafe:
                self._close_error = exc if isinstance(exc, Exception) else SeqstoreError(
                    f"{self.target.where}: close() was interrupted ({exc!r}); the uncommitted records were discarded")
                self.abort()  # releases the writer and closes the shard's files
            raise
        self.abort()  # (nothing is pending any more) releases the writer

    def _release(self) -> None:
        # closed once all is done: interrupted (Ctrl-C), a second close/abort finishes it; a forked child's
        if os.getpid() == self._pid:  # copy only marks itself closed (the workspace is the parent's)
            try:
                self._pool.shutdown(wait=True)
                if self._io is not None:
                    self._io.shutdown(wait=True)
            finally:
                if not self._target_closed:
                    self._close_target()
                self._target_closed = True
        self._closed = True
        at_exit.unregister(self)

    def _close_target(self) -> None:
        self.target.close_writer(self._start)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        (self.close if exc_type is None else self.abort)()  # commits on a normal exit, discards on an exception

    def __del__(self, _getpid: Callable[[], int] = os.getpid) -> None:
        # (os.getpid bound at definition: a writer alive at exit is finalised after module globals may be cleared)
        if getattr(self, "_closed", True):
            return  # closed (or half built): nothing to release
        if getattr(self, "_pid", None) != _getpid():
            return  # a forked child's copy: leave the parent's files alone
        log.warning("%s: writer garbage-collected without close(); uncommitted records are discarded",
                    self.target.where)
        try:
            self.abort()
        except Exception:  # noqa: BLE001
            pass

    def _commit_at_exit(self, why: str) -> str | None:
        """Still open at interpreter exit or SIGTERM (store/write/at_exit.py): commit, or abort when a
        write failed or was interrupted part way. The line to print."""
        if self._closed or os.getpid() != self._pid:
            return None
        pending = self._uncommitted_records()
        if self._failed is not None or self._exit_unsafe:
            self.abort()
            return (f"seqstore: {self.target.where}: writer not closed at {why} after an interrupted or failed "
                    f"write; {pending} uncommitted record(s) discarded")
        self.close()
        return f"seqstore: {self.target.where}: writer not closed at {why}; committed {pending} pending record(s)"

    @property
    def num_committed(self) -> int:
        """Records this writer has committed."""
        return self._committed_records
