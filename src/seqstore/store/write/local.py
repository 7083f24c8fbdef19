"""The commit target of a store in a local directory (docs/format.md, section 7).

Every commit holds the store's lock file (``<root>/.lock``, an ``flock``). Committing a writer's
finished shard renames its directory to ``shard-NNNNNN``, records it (version 3: appends one row to
the shard table ``_shards.tbl`` at its committed end; versions 1/2: adds it to the JSON shard list),
merges id-index runs when due (store/write/disk.py) and atomically replaces ``manifest.json``. For
a version-3 store each step is O(1) in the number of committed shards. A crash before the manifest's
rename leaves only files readers never look at, which the next writer deletes (:func:`clean_orphans`).
A distributed write's parts live in ``_parts/<job>/<task>/`` and are committed through a journal
(:mod:`.journal`), so a crash at any step leaves all of the parts committed or all of them pending.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import SchemaError, SeqstoreError
from ...format.manifest import MANIFEST, PARTS_DIR, WORK_DIR, Manifest, ShardInfo, fsync_dir
from ...format.shard_table import (
    encode_row,
    shard_dir_name,
)
from ...schema import Schema
from ..directio import O_CLOEXEC
from .disk import (
    INDEX_DIR,
    append_row,
    held_new_dir,
    hold_owner_lock,
    maybe_merge_index,
    named_full_disk,
    next_shard_number,
    remove_if_dead,
    store_lock,
    workspace_path,
    write_json,
)
from .journal import (
    JOURNAL,
    check_local_parts,
    commit_local_parts,
    discard_job,
    recover_batch_commit,
    remove_dead_temporaries,
    unlink_superseded,
)
from .outputs import temp_sibling
from .state import LocalObjects
from .target import (
    COMMITTED_FILE,
    OWNER,
    PART_FILE,
    STAGED,
    CommitTarget,
    Finished,
    IdsMismatch,
    NotCommitted,
    Part,
    PartShard,
    Start,
    add_stats,
    check_parts_kinds,
    check_v3,
)

log = logging.getLogger(__name__)

DELETED = "deleted"  # the tag of an old store's hidden sibling name while an overwrite deletes it
NEW = "new"  # the tag of a new store's hidden sibling name while a create prepares it (install_new_store)


class LocalTarget(CommitTarget):
    """The store in the local directory ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.where = str(root)
        self._schema: Schema | None = None  # the schema the writer opened with

    def objects(self) -> LocalObjects:
        return LocalObjects(self.root)

    # ---------------------------------------------------------------------------------- the store

    def _recovered(self) -> None:
        """Finish or undo a commit of parts that died part way (the journal, below)."""
        if (self.root / PARTS_DIR / JOURNAL).exists():
            with store_lock(self.root):
                recover_batch_commit(self.root)

    def read_manifest(self) -> Manifest | None:
        self._recovered()
        return Manifest.load(self.root) if (self.root / MANIFEST).exists() else None

    def delete_store(self) -> None:
        root = self.root
        if not root.is_dir():
            raise SeqstoreError(f"{root}: refusing to overwrite a file that is not a store")
        try:
            if not (root / MANIFEST).exists() and any(root.iterdir()):
                raise SeqstoreError(f"{root}: refusing to overwrite a non-empty directory that is not a store")
            if root.is_symlink():  # (rmtree refused one too) moving the link aside would leave its store
                raise SeqstoreError(f"{root}: refusing to overwrite a symbolic link (give the store's own path)")
            # the owner.lock held while the old store is deleted: one a process killed part way left (no lock
            # held) is removed by the next create of this path (remove_dead_deletions); a live one is not
            fd = hold_owner_lock(root, bounded=True)  # (a hung overwrite holding it: LockTimeout)
        except FileNotFoundError:
            return  # another overwrite moved it away meanwhile
        try:
            try:
                if os.stat(root / OWNER).st_ino != os.fstat(fd).st_ino:
                    return  # another overwrite deleted it while this one waited for its lock (its store is new)
            except FileNotFoundError:
                return
            old = temp_sibling(root, DELETED, held=False)
            try:
                os.rename(root, old)  # first: killed while deleting, the path holds the whole store or nothing
            except OSError:
                (root / OWNER).unlink(missing_ok=True)
                raise
            fsync_dir(root.parent)
            for child in old.iterdir():  # the lock last: without it the directory counts as a dead one's
                if child.name == OWNER:
                    continue
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            (old / OWNER).unlink()
            with contextlib.suppress(FileNotFoundError):  # (removed meanwhile by remove_dead_deletions)
                old.rmdir()
        finally:
            os.close(fd)

    def remove_if_empty(self) -> bool:
        """Under the store's lock: a writer commits before the manifest is read (the store stays) or after
        the store is gone (its commit fails), never in between."""
        root = self.root
        if not self._is_store():
            return False
        with store_lock(root):
            try:
                recover_batch_commit(root)
                manifest = Manifest.load(root)
            except (SeqstoreError, FileNotFoundError):  # (gone meanwhile, or not readable: as read_manifest)
                return False
            if manifest.num_shards or self.pending_jobs() or _live_workspace(root / WORK_DIR) or (
                    manifest.table is None and _live_workspace(root, "_tmp-")):  # (versions 1/2: no shard here)
                return False
            self.delete_store()
        return True

    def create(self, manifest: Manifest, *, overwrite: bool) -> None:
        remove_dead_deletions(self.root)
        if self.root.exists():
            if not overwrite:
                raise FileExistsError(f"{self.root}: already exists (pass overwrite=True to replace it)")
            self.delete_store()
        if not install_new_store(self.root, manifest):  # atomic: never a directory without its manifest
            raise FileExistsError(f"{self.root}: already exists (another process created a store here first)")

    def install(self, manifest: Manifest, *, strict: bool = False) -> bool:
        root = self.root
        remove_dead_deletions(root)
        if strict and not (root / MANIFEST).exists() and root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise SeqstoreError(f"{root}: exists and is not a store (a file or a non-empty directory)")
        return install_new_store(root, manifest)

    # --------------------------------------------------------------------------------- one writer

    def open_writer(self) -> Start:
        """Under the store's lock: clean what dead writers left, make this writer's workspace
        (``_tmp/<token>``, or ``_tmp-<token>`` in a version-1/2 store) holding an flock on its
        ``owner.lock``."""
        root = self.root
        if not (root / MANIFEST).exists():
            Manifest.load(root)  # the precise error: no such directory, or not a store
        token = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        with store_lock(root):
            recover_batch_commit(root)  # a commit of parts that died part way
            manifest = Manifest.load(root)
            clean_orphans(root, manifest)
            workspace = workspace_path(root, manifest, token)
            workspace.mkdir(parents=workspace.parent != root)
            fd = hold_owner_lock(workspace)
        self._schema = manifest.schema
        return Start(manifest.schema, manifest.id_lookup, manifest.num_records,
                     manifest.has_ids if manifest.num_shards else None, manifest.table is not None, root, workspace,
                     fd)

    def publish(self, shard: Finished | None, stats: Mapping[str, float]) -> str:
        root = self.root
        with store_lock(root):
            recover_batch_commit(root)  # first: its journal is judged by the generation this save bumps
            manifest = Manifest.load(root)
            self._check_schema(manifest)
            generation = manifest.generation + 1  # the one saved
            if shard is not None:
                if manifest.num_shards and manifest.has_ids != shard.info.has_ids:
                    raise IdsMismatch(manifest.has_ids)
                number = next_shard_number(manifest)
                target = root / shard_dir_name(number)
                if target.exists():  # renamed by a writer that died before saving the manifest
                    shutil.rmtree(target)
                os.rename(shard.path, target)
            try:
                if shard is not None:
                    return self._record(manifest, shard, number, target.name, stats)
                add_stats(manifest.stats, stats)
                manifest.generation = generation
                manifest.save(root)
                return ""
            except Exception as exc:
                if _saved(root, generation):
                    raise  # committed: the manifest lists the shard (or has the stats)
                # nothing committed (a full disk at the table's row or the manifest): the shard goes back to
                # the workspace and the writer keeps it (and the stats deltas) for its next commit
                if shard is not None:
                    os.rename(target, shard.path)
                raise NotCommitted(exc) from exc

    def _record(self, manifest: Manifest, shard: Finished, number: int, name: str, stats: Mapping[str, float]) -> str:
        """Record the shard renamed into the store as ``name`` and save the manifest (under the lock)."""
        root, pending = self.root, shard.info
        fsync_dir(root)
        if manifest.table is not None:
            table, start = manifest.shard_table(), manifest.table.records
            row = encode_row(number, start, pending.records, pending.has_ids,
                             [pending.rows[r] for r in manifest.ragged], shard.desc_crc)
            append_row(root, manifest.table.rows, row, len(manifest.ragged), manifest.table.id)
            count = manifest.table.rows + 1
            manifest.table = manifest.table.after(row, pending.records)

            def locate(k: int) -> tuple[str, int]:
                if k == count - 1:
                    return name, start
                return shard_dir_name(int(table.data["number"][k])), int(table.starts[k])
        else:
            shards = list(manifest.shards) + [ShardInfo(name, pending.records, pending.rows, pending.files,
                                                        pending.has_ids)]
            manifest.shards = shards
            count = len(shards)
            starts = np.concatenate([[0], np.cumsum([s.records for s in shards], dtype=np.int64)])

            def locate(k: int) -> tuple[str, int]:
                return shards[k].name, int(starts[k])

        manifest.generation += 1
        add_stats(manifest.stats, stats)
        superseded = maybe_merge_index(root, manifest, count, locate) if pending.has_ids else []
        manifest.save(root)
        unlink_superseded(root, superseded)
        return name

    def _check_schema(self, manifest: Manifest) -> None:
        if manifest.schema != self._schema:  # an overwrite (commit_parts) installed another since
            raise SchemaError(f"{self.root}: the store's schema is now {manifest.schema!r}, this writer's "
                              f"{self._schema!r}; nothing was committed")

    # ---------------------------------------------------------------------------------- the parts

    def open_part(self, job: str, task: str) -> Start:
        self._recovered()
        manifest = Manifest.load(self.root)
        check_v3(self.where, manifest)
        staged = self.staged()
        schema = Schema.from_json(staged["schema"]) if staged is not None else manifest.schema
        parts = self.root / PARTS_DIR
        job_dir = parts / job
        task_dir = job_dir / task
        new_parts, new_job = not parts.is_dir(), not job_dir.is_dir()
        try:
            while True:
                job_dir.mkdir(parents=True, exist_ok=True)
                try:
                    task_dir.mkdir()
                    break
                except FileNotFoundError:  # the job's (empty) directory removed meanwhile by a discard of the job
                    new_job = True
        except FileExistsError:
            if (task_dir / PART_FILE).exists() or (task_dir / COMMITTED_FILE).exists():
                raise SeqstoreError(
                    f"{task_dir}: task attempt {task!r} of job {job!r} already finished; each attempt "
                    "needs its own task id"
                ) from None
            if not remove_if_dead(task_dir):
                raise _live_attempt(task_dir, job, task) from None
            try:
                task_dir.mkdir()
            except FileExistsError:  # made again meanwhile by another attempt of this task id
                raise _live_attempt(task_dir, job, task) from None
        fd = _claim_task(task_dir, job, task)
        try:
            fsync_dir(job_dir)
            if new_job:
                fsync_dir(parts)
            if new_parts:
                fsync_dir(self.root)
        except BaseException:
            os.close(fd)
            raise
        return Start(schema, manifest.id_lookup, 0, None, True, self.root, task_dir, fd)

    def stage_shard(self, start: Start, current: Path, shard: PartShard) -> None:
        os.rename(current, start.workspace / shard.dir)
        fsync_dir(start.workspace)

    def finish_part(self, start: Start, part: Part) -> None:
        write_json(start.workspace / PART_FILE, part.to_json())

    def close_part(self, start: Start, part: Part | None) -> None:
        if part is None:
            shutil.rmtree(start.workspace, ignore_errors=True)
        os.close(start.owner_fd)

    def staged(self) -> dict[str, Any] | None:
        path = self.root / PARTS_DIR / STAGED
        return json.loads(path.read_bytes()) if path.exists() else None

    def set_staged(self, staged: Mapping[str, Any] | None) -> None:
        path = self.root / PARTS_DIR / STAGED
        if staged is None and not self._is_store():
            return  # nothing staged where there is no store (and nothing made there)
        with store_lock(self.root):
            if staged is None:
                path.unlink(missing_ok=True)
                return
            path.parent.mkdir(exist_ok=True)
            write_json(path, dict(staged))

    def commit_parts(self, plist: list[Part], overwrite: bool) -> int:
        root = self.root
        with store_lock(root):
            recover_batch_commit(root)
            remove_dead_temporaries(root)
            manifest = Manifest.load(root)
            check_v3(self.where, manifest)
            staged = self.staged()
            schema = Schema.from_json(staged["schema"]) if overwrite and staged is not None else manifest.schema
            entries = check_local_parts(root, plist, schema)
            check_parts_kinds(self.where, {sh.has_ids for _, sh in entries},
                              manifest.has_ids if manifest.num_shards and not overwrite else None)
            clean_orphans(root, manifest)
            return commit_local_parts(root, manifest, staged if overwrite else None, schema, plist, entries,
                                      overwrite)

    def _is_store(self) -> bool:
        """Whether a store is at the path: where there is none, there are no parts to clean either (and its
        lock file is not made in a directory that is not a store)."""
        return (self.root / MANIFEST).is_file()

    def discard_jobs(self, jobs: Iterable[str]) -> None:
        self._discard(sorted(jobs))

    def pending_jobs(self) -> list[str]:
        parts = self.root / PARTS_DIR
        if not parts.is_dir():
            return []
        return sorted(e.name for e in os.scandir(parts) if e.is_dir() and not e.name.startswith("."))

    def clean_parts(self, older_than: float) -> list[str]:
        return self._discard(None, older_than)

    def _discard(self, jobs: list[str] | None, older_than: float = 0.0) -> list[str]:
        """Under the store's lock, discard ``jobs`` (None: the pending jobs untouched for ``older_than``
        seconds); the jobs removed."""
        now = time.time()
        if not self._is_store():
            return []
        with store_lock(self.root):
            recover_batch_commit(self.root)
            remove_dead_temporaries(self.root)
            if jobs is None:
                jobs = [job for job in self.pending_jobs() if now - _newest(self.root / PARTS_DIR / job) >= older_than]
            return [job for job in jobs if discard_job(self.root / PARTS_DIR / job)]


def _live_attempt(task_dir: Path, job: str, task: str) -> SeqstoreError:
    return SeqstoreError(f"{task_dir}: a live PartWriter is writing task attempt {task!r} of job {job!r} (each "
                         "attempt needs its own task id)")


def _claim_task(task_dir: Path, job: str, task: str) -> int:
    """Lock the ``owner.lock`` of the task directory this attempt just made, without waiting: another attempt
    of the same task id may have removed the directory (its lock not taken yet: a dead one's) and made and
    locked it again meanwhile; then this attempt is the one that gives way, with the named error."""
    try:
        fd = os.open(task_dir / OWNER, os.O_RDWR | os.O_CREAT | O_CLOEXEC, 0o644)
    except FileNotFoundError:  # removed by the other attempt
        raise _live_attempt(task_dir, job, task) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(task_dir / OWNER).st_ino != os.fstat(fd).st_ino:  # locked a removed directory's file
            raise FileNotFoundError
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        raise _live_attempt(task_dir, job, task) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _live_workspace(work: Path, prefix: str = "") -> bool:
    """Whether a live writer holds a workspace in ``work`` named ``prefix...`` (its ``owner.lock`` locked);
    O(entries of ``work``)."""
    if not work.is_dir():
        return False
    for entry in os.scandir(work):
        if not entry.name.startswith(prefix):
            continue
        try:
            fd = os.open(Path(entry.path) / OWNER, os.O_RDWR | O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False


def _newest(job_dir: Path) -> float:
    """The latest modification time of a job's directory, its tasks and their files (O(tasks + shards)); a
    file gone since it was listed (an attempt aborting or staging a shard meanwhile) is not counted."""
    newest = 0.0
    for p in [job_dir, *job_dir.glob("*"), *job_dir.glob("*/*")]:
        with contextlib.suppress(FileNotFoundError):
            newest = max(newest, p.stat().st_mtime)
    return newest


def clean_orphans(root: Path, manifest: Manifest) -> None:
    """Delete files of dead writers and of shards renamed but never committed. Caller holds the lock.

    Version 3, O(writers) whatever the number of shards: the only uncommitted shard directory there
    can be is the next number's (every commit takes the last row's number plus one and removes a
    leftover of that name before its rename), and workspaces and temporary manifests live in
    ``_tmp/``, so the store directory itself is never listed. Versions 1/2: the store directory is
    listed and compared with the manifest's shard list, as before."""
    if manifest.table is not None and recover_batch_commit(root):
        manifest = Manifest.load(root)
    if manifest.table is not None:
        work, committed = root / WORK_DIR, None
        leftover = root / shard_dir_name(next_shard_number(manifest))
        if leftover.is_dir():
            log.warning("removing uncommitted shard directory %s", leftover)
            shutil.rmtree(leftover, ignore_errors=True)
    else:
        work, committed = root, {s.name for s in manifest.shards}
    for entry in list(os.scandir(work)) if work.is_dir() else []:
        name = entry.name
        if name.startswith(f".{MANIFEST}.tmp-"):
            Path(entry.path).unlink(missing_ok=True)
        elif committed is not None and name.startswith("shard-") and name not in committed and entry.is_dir():
            log.warning("removing uncommitted shard directory %s", entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)
        elif entry.is_dir() and (committed is None or name.startswith("_tmp-")):  # (every directory in _tmp/)
            remove_if_dead(Path(entry.path), warn=True)
    runs = {r.name for r in manifest.index_runs}
    index_dir = root / INDEX_DIR
    if index_dir.is_dir():
        for path in index_dir.iterdir():
            if f"{INDEX_DIR}/{path.name.split('.', 1)[0]}" not in runs:
                path.unlink(missing_ok=True)


def _saved(root: Path, generation: int) -> bool:
    """Whether ``manifest.json`` of ``root`` has ``generation`` (its save got as far as the rename), or cannot
    be read (then the commit may have happened: nothing is undone)."""
    path = root / MANIFEST
    try:
        return Manifest.parse(path.read_bytes(), str(path)).generation == generation
    except Exception:  # noqa: BLE001
        return True


def remove_dead_deletions(root: Path) -> None:
    """Delete the hidden siblings that overwrites and creates of ``root`` killed part way left: old stores
    (``.<name>.deleted-*``), except those a live overwrite is deleting (it holds their ``owner.lock``), and
    new ones (``.<name>.new-*``), except those a live create holds (:func:`install_new_store`)."""
    with contextlib.suppress(OSError):  # (an unreadable parent: the create reports it)
        for old in root.parent.glob(f".{glob.escape(root.name)}.{DELETED}-*"):
            remove_if_dead(old)
        for new in root.parent.glob(f".{glob.escape(root.name)}.{NEW}-*"):  # (no lock: about to be renamed in)
            remove_if_dead(new, missing_is_dead=False)


def _new_sibling(root: Path) -> Path:
    tmp = root.parent / f".{root.name}.{NEW}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def _make_parent(root: Path) -> None:
    """Make the directory ``root`` goes in; a file where one of its directories should be is named."""
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        blocker = next((p for p in reversed(root.parents) if p.exists() and not p.is_dir()), None)
        if blocker is None:
            raise
        raise NotADirectoryError(errno.ENOTDIR, f"{root}: cannot make the store: {blocker} is a file, not a "
                                 "directory") from exc


def install_new_store(root: Path, manifest: Manifest) -> bool:
    """Create an empty store with ``manifest`` at ``root`` unless one is there; safe when several
    processes call it at once: the store is prepared in a hidden sibling directory and renamed into
    place, so exactly one caller creates it. Returns whether this call created it. A file, or a non-empty
    directory that is not a store, is FileExistsError naming ``root``; a full disk an OSError naming it."""
    if (root / MANIFEST).exists():
        return False
    try:
        _make_parent(root)
        tmp, held = held_new_dir(lambda: _new_sibling(root))  # held: no create of the path deletes it
        try:
            manifest.save(tmp)
            (tmp / OWNER).unlink()  # (not into the store; held, unlinked, until the store is in place)
            try:
                os.rename(tmp, root)  # atomic; replaces an empty directory, fails on a non-empty one
                fsync_dir(root.parent)
                return True
            except OSError as exc:
                if not (root / MANIFEST).exists():
                    # a non-empty directory that is not a store, or one still being created: wait briefly
                    for _ in range(50):
                        time.sleep(0.02)
                        if (root / MANIFEST).exists():
                            break
                    else:
                        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                            raise
                        raise FileExistsError(f"{root}: exists and is not a seqstore store (a file, or a non-empty "
                                              f"directory without {MANIFEST}); give a new or empty path") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            os.close(held)
    except OSError as exc:
        raise named_full_disk(exc, str(root), root.parent)  # noqa: B904  # (exc, or caused by it)
    return False
