"""Files of a local store that every local commit step uses: the commit lock, the next shard
number, appending rows to the shard table, atomic JSON files, the owner locks of workspaces; and
the id index's merged runs (LSM): :func:`merge_sorted_runs`, the bounded k-way merge of runs sorted
by hash, and :func:`maybe_merge_index`, which folds every ``MERGE_FANIN`` trailing runs of one level
into a run of the next level (``_index/``)."""

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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CorruptionError, LockError, LockTimeout, SeqstoreError
from ...format.manifest import IDS, WORK_DIR, IndexRun, Manifest, fsync_dir
from ...format.npy import encode_header
from ...format.shard_table import TABLE, TABLE_HEADER_BYTES, check_table_header, encode_table_header, row_dtype
from ...io.tempfiles import LOCK_WAIT_ENV, lock_held_by, lock_polled, lock_wait
from ..directio import O_CLOEXEC, pwrite_all, write_file
from .target import OWNER

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"


def _describe(pid: int | None) -> str:
    if pid is None:
        return "by a process this machine does not show (another machine's, over a network filesystem?)"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read(200).replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    return f"by process {pid}" + (f" ({cmd})" if cmd else "")


def copy_workdir_prefix(pid: int) -> str:
    """How the temporary directory (in ``_tmp/``) of a local copy into a store by process ``pid`` of this
    machine is named: this, then a random token."""
    return f"copy-{socket.gethostname()}-{pid}-"


def _copying(root: Path, pid: int) -> bool:
    """Whether process ``pid`` of this machine has a copy into the store ``root`` under way (its directory)."""
    with contextlib.suppress(OSError):
        return any((root / WORK_DIR).glob(f"{glob.escape(copy_workdir_prefix(pid))}*"))
    return False


def _wait_for_lock(fd: int, path: Path, what: str = "the store's commit lock") -> None:
    """``flock`` ``fd`` exclusively, waiting at most :func:`lock_wait` seconds, then :class:`LockTimeout`."""
    timeout = lock_wait()
    if lock_polled(fd, timeout, longest_pause=0.05):
        return
    holder = lock_held_by(fd)
    if path.name == LOCK_FILE and holder is not None and _copying(path.parent, holder):
        raise LockTimeout(
            f"{path}: {what} is held {_describe(holder)}, which is copying a store into it (a local "
            "seqstore.copy holds the lock until the copy is committed), and was not released within "
            f"{timeout:g} s; nothing was changed. Wait for the copy to end and try again; a long copy "
            f"can outlast the wait, which {LOCK_WAIT_ENV} sets in seconds", path=str(path), holder=holder)
    raise LockTimeout(
        f"{path}: {what} is held {_describe(holder)} and was not released within "
        f"{timeout:g} s (a hung or stopped process?); nothing was changed. Once it is released, try "
        f"again; {LOCK_WAIT_ENV} sets the wait in seconds", path=str(path), holder=holder)


@contextmanager
def store_lock(root: Path) -> Iterator[None]:
    """Hold the store's exclusive commit lock (an ``flock`` on ``<root>/.lock``), waiting for it at most
    :func:`lock_wait` seconds (then :class:`~seqstore.errors.LockTimeout` naming the file and its holder)."""
    path = root / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | O_CLOEXEC, 0o644)
    except OSError as exc:
        raise LockError(f"{path}: cannot open lock file ({exc})") from exc
    try:
        _wait_for_lock(fd, path)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def next_shard_number(manifest: Manifest) -> int:
    """The number the next committed shard gets: the last row's plus one (version 3, O(1)), or one
    above the highest listed (versions 1/2, O(shards) like their manifest)."""
    numbers = manifest.shard_table().data["number"]
    if not len(numbers):
        return 0
    return int(numbers[-1] if manifest.table is not None else numbers.max()) + 1


def hold_owner_lock(directory: Path, *, bounded: bool = False) -> int:
    """Create and flock ``directory/owner.lock`` (a live writer's mark); returns the descriptor to keep.
    ``bounded``: where another process may hold it, wait at most as long as for the commit lock."""
    fd = os.open(directory / OWNER, os.O_RDWR | os.O_CREAT | O_CLOEXEC, 0o644)
    try:
        if bounded:
            _wait_for_lock(fd, directory / OWNER, "the lock of an overwrite deleting the store")
        else:
            fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def held_new_dir(make: Callable[[], Path]) -> tuple[Path, int]:
    """A new directory ``make()`` holding an flock on its ``owner.lock`` (returned with it); made anew where
    another process's clean-up removed it before the flock."""
    while True:
        path = make()
        try:
            fd = hold_owner_lock(path)
        except FileNotFoundError:
            continue
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path / OWNER).st_ino == os.fstat(fd).st_ino:
                return path, fd
        os.close(fd)


def remove_if_dead(path: Path, *, warn: bool = False, missing_is_dead: bool = True) -> bool:
    """Delete the workspace or task directory ``path`` unless a live writer holds its ``owner.lock`` (a
    missing lock file counts as dead unless ``missing_is_dead`` is false); returns whether it is gone. It
    is deleted under the lock: one who opened the lock file and waits for it then finds it gone."""
    try:
        fd = os.open(path / OWNER, os.O_RDWR | O_CLOEXEC)
    except FileNotFoundError:
        if not missing_is_dead:
            return False
        fd = -1
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if warn:
            log.warning("removing workspace of a dead writer %s", path)
        shutil.rmtree(path, ignore_errors=True)
    except BlockingIOError:
        return False  # a live writer owns it
    finally:
        if fd >= 0:
            os.close(fd)
    return not path.exists()


def named_full_disk(exc: BaseException, where: str, workspace: Path) -> BaseException:
    """``exc``; where it says the disk is full (or the quota used up), an OSError that also names the store
    ``where`` and the directory its writer was writing under."""
    if not isinstance(exc, OSError) or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return exc
    named = OSError(exc.errno, f"{exc.strerror}: cannot write the store {where} (writing under {workspace}); "
                    "free space there (the records committed before are intact)", exc.filename)
    named.__cause__ = exc
    return named


def write_error(exc: BaseException, where: str, workspace: Path, pending: int) -> BaseException:
    """``exc``, raised while a writer of the store ``where`` wrote under ``workspace`` with ``pending``
    records not committed, named: a SeqstoreError where the workspace itself is gone (deleted while the
    writer was open, as ``create(..., overwrite=True)`` of the store deletes it), else :func:`named_full_disk`."""
    if isinstance(exc, FileNotFoundError) and not workspace.is_dir():
        gone = SeqstoreError(
            f"{where}: the workspace of this writer, {workspace}, was deleted while the writer was open (the store "
            "deleted or replaced, as create(..., overwrite=True) does, or its staging directory removed); the "
            f"{pending} record(s) appended since its last commit are lost and nothing was committed. Call abort()"
        )
        gone.__cause__ = exc
        return gone
    return named_full_disk(exc, where, workspace)


def workspace_path(root: Path, manifest: Manifest, token: str) -> Path:
    """Where a writer with ``token`` keeps its workspace: ``_tmp/<token>`` in a version-3 store,
    ``_tmp-<token>`` at the top of a version-1/2 store (as older writers expect)."""
    return root / WORK_DIR / token if manifest.table is not None else root / f"_tmp-{token}"


def append_row(root: Path, committed: int, row: bytes, ragged: int, table_id: int = 0) -> None:
    """Write ``row`` (one row, or several rows back to back) at the committed end of the shard table and
    fsync it (creating the file with its header for the first row). Bytes a dead writer left past the
    committed rows are overwritten."""
    path = root / TABLE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | O_CLOEXEC, 0o644)
    try:
        if committed == 0:
            pwrite_all(fd, memoryview(encode_table_header(ragged, table_id) + row), 0)
        else:
            check_table_header(os.pread(fd, TABLE_HEADER_BYTES, 0), path, ragged, table_id)
            pwrite_all(fd, memoryview(row), TABLE_HEADER_BYTES + committed * row_dtype(ragged).itemsize)
        os.fsync(fd)
    finally:
        os.close(fd)
    if committed == 0:
        fsync_dir(root)  # the file may be new


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` to ``path`` atomically and durably (temporary file, fsync, rename, fsync dir)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write_file(tmp, json.dumps(obj, separators=(",", ":")).encode())
    os.replace(tmp, path)
    fsync_dir(path.parent)


# ------------------------------------------------------------------------------------ id-index runs


INDEX_DIR = "_index"
MERGE_FANIN = 8
MERGE_CHUNK = 1 << 18


def merge_sorted_runs(
    sources: Sequence[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], int]], chunk: int = MERGE_CHUNK,
    names: Sequence[str] = (),
) -> Iterator[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """Merge runs sorted by hash, ``(hashes, rows, row base)`` each, into ``(hashes, rows + base)``
    chunks in hash order. Equal hashes keep the order of the sources (and within a source their own
    order), so rows stay ascending among equal hashes when the sources are in row order.

    Each round takes, from every source, the entries up to a cut: the smallest of the sources'
    ``chunk``-th next hashes, and all entries equal to it, so no tie is split across rounds. Memory
    is O(sources x chunk) whatever the runs' lengths (they may be memory-mapped). ``names``: the sources'
    files, for the ValueError raised on one that is not sorted.
    """
    pos = [0] * len(sources)
    while True:
        active = [j for j, (h, _, _) in enumerate(sources) if pos[j] < len(h)]
        if not active:
            return
        cut = min(sources[j][0][min(pos[j] + chunk, len(sources[j][0])) - 1] for j in active)
        parts_h, parts_r = [], []
        for j in active:
            h, r, base = sources[j]
            end = pos[j] + int(np.searchsorted(h[pos[j] :], cut, side="right"))
            part = np.asarray(h[pos[j] : end])
            if len(part) > 1 and (part[1:] < part[:-1]).any():
                raise ValueError(f"{names[j] if j < len(names) else f'index source {j}'} is not sorted by hash "
                                 f"(near entry {pos[j]})")
            parts_h.append(part)
            parts_r.append(np.asarray(r[pos[j] : end], dtype=np.int64) + base)
            pos[j] = end
        if not any(len(p) for p in parts_h):  # only an unsorted source can stop progress
            raise ValueError("index sources are not sorted by hash")
        if len(parts_h) == 1:
            yield parts_h[0], parts_r[0]
            continue
        hashes, rows = np.concatenate(parts_h), np.concatenate(parts_r)
        order = np.argsort(hashes, kind="stable")
        yield hashes[order], rows[order]


def maybe_merge_index(
    root: Path, manifest: Manifest, count: int, locate: Callable[[int], tuple[str, int]], tag: str = ""
) -> list[Path]:
    """LSM-style: merge every MERGE_FANIN trailing runs of one level into a run of the next level.

    Level-0 runs are the shards' own indexes; merged runs live in ``_index/`` and cover a contiguous
    range of shards. Lookups probe O(MERGE_FANIN x levels) runs. A merge reads only the MERGE_FANIN
    runs it replaces (memory-mapped) and streams the merged run to disk in chunks, so its memory does
    not grow with the number of ids; ``locate(k)`` gives shard ``k``'s directory and first record,
    so nothing here walks all ``count`` shards. ``tag`` is appended to the names of new runs (an
    overwrite restarts the row numbers, so its runs must not take the names of runs that readers of
    the replaced shards may still use). Returns the files of the replaced runs, to be deleted
    once the manifest that no longer lists them is saved.
    """
    superseded: list[Path] = []
    covered = manifest.index_runs[-1].end_shard if manifest.index_runs else 0
    if count - covered >= MERGE_FANIN and not _merge(root, manifest, covered, count, locate, level=1, replaces=[],
                                                      tag=tag):
        return superseded
    while len(tail := manifest.index_runs[-MERGE_FANIN:]) == MERGE_FANIN and len({r.level for r in tail}) == 1:
        if not _merge(root, manifest, tail[0].first_shard, tail[-1].end_shard, locate, level=tail[0].level + 1,
                      replaces=tail, tag=tag):
            break
        superseded += [root / f"{r.name}{suffix}" for r in tail for suffix in (".hash.npy", ".rows.npy")]
    return superseded


def _merge(
    root: Path,
    manifest: Manifest,
    first: int,
    end: int,
    locate: Callable[[int], tuple[str, int]],
    *,
    level: int,
    replaces: list[IndexRun],
    tag: str = "",
) -> bool:
    """Write the run of shards ``first .. end-1`` and list it in ``manifest`` (in place of ``replaces``).
    A shard index that cannot be read or is not sorted (a damaged committed shard: verify names it)
    leaves no run and returns False with a warning, so that the commit still goes through."""
    name = f"{INDEX_DIR}/run-{first:06d}-{end:06d}{tag}"
    try:
        _write_run(root, manifest, first, end, locate, level, replaces, name)
    except (OSError, ValueError, CorruptionError) as exc:
        if all(r.name != name for r in manifest.index_runs):
            for suffix in (".hash.npy", ".rows.npy"):
                (root / f"{name}{suffix}").unlink(missing_ok=True)
        log.warning("%s: no merged id-index run for shards %d..%d this time (%s); lookups probe those shards' "
                    "own indexes. Run seqstore verify on the store", root, first, end - 1, exc)
        return False
    return True


def _write_run(root: Path, manifest: Manifest, first: int, end: int, locate: Callable[[int], tuple[str, int]],
               level: int, replaces: list[IndexRun], name: str) -> None:
    names: list[str] = []

    def shard_index(k: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], int]:
        shard, start = locate(k)
        d = root / shard
        names.append(str(d / f"{IDS}.hash.npy"))
        try:
            h = np.load(d / f"{IDS}.hash.npy", mmap_mode="r")
            return h, np.load(d / f"{IDS}.hash_rows.npy", mmap_mode="r"), start
        except ValueError as exc:  # (a damaged header: numpy's message names no file)
            raise ValueError(f"{d}: {exc}") from exc

    sources: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], int]] = []
    if not replaces:
        sources = [shard_index(k) for k in range(first, end)]
    for r in replaces:
        try:
            h = np.load(root / f"{r.name}.hash.npy", mmap_mode="r")
            rows = np.load(root / f"{r.name}.rows.npy", mmap_mode="r")
            if len(h) != r.records or len(rows) != r.records:
                raise ValueError(f"{len(h)}/{len(rows)} entries, manifest says {r.records}")
            for a in range(0, len(h), MERGE_CHUNK):  # run files carry no checksum: check the order
                part = np.asarray(h[a : a + MERGE_CHUNK + 1])
                if (part[1:] < part[:-1]).any():
                    raise ValueError("hashes are not sorted")
            sources.append((h, rows, 0))
            names.append(str(root / f"{r.name}.hash.npy"))
        except (OSError, ValueError) as exc:  # lost or damaged: rebuild that range from its shards
            log.warning("%s: index run %s unusable (%s); merging its shards' indexes", root, r.name, exc)
            sources += [shard_index(k) for k in range(r.first_shard, r.end_shard)]
    total = sum(len(h) for h, _, _ in sources)
    (root / INDEX_DIR).mkdir(exist_ok=True)
    with open(root / f"{name}.hash.npy", "wb") as fh, open(root / f"{name}.rows.npy", "wb") as fr:
        fh.write(encode_header(np.dtype("<u8"), (total,)))
        fr.write(encode_header(np.dtype("<i8"), (total,)))
        written = 0
        for hashes, rows in merge_sorted_runs(sources, names=names):
            fh.write(hashes.astype("<u8", copy=False).data)
            fr.write(rows.astype("<i8", copy=False).data)
            written += len(hashes)
        if written != total:
            raise CorruptionError(f"{root / name}: merged {written} index entries, expected {total}")
        for f in (fh, fr):
            f.flush()
            os.fsync(f.fileno())
    fsync_dir(root / INDEX_DIR)
    run = IndexRun(name, first, end, total, level)
    manifest.index_runs = [r for r in manifest.index_runs if r not in replaces] + [run]
