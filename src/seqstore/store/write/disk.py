"""Files of a local store that every local commit step uses: the commit lock, the next shard
number, appending rows to the shard table, atomic JSON files and the owner locks of workspaces."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...errors import LockError
from ...format.manifest import WORK_DIR, Manifest, fsync_dir
from ...format.shard_table import TABLE, TABLE_HEADER_BYTES, check_table_header, encode_table_header, row_dtype
from ..directio import pwrite_all

__all__ = ["LOCK_FILE", "append_row", "next_shard_number", "remove_if_dead", "store_lock", "workspace_path",
           "write_json"]

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
OWNER = "owner.lock"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

@contextmanager
def store_lock(root: Path) -> Iterator[None]:
    """Hold the store's exclusive commit lock (an ``flock`` on ``<root>/.lock``)."""
    try:
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise LockError(f"{root / LOCK_FILE}: cannot open lock file ({exc})") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _shard_number(name: str) -> int:
    try:
        return int(name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def next_shard_number(manifest: Manifest) -> int:
    """The number the next committed shard gets: the last row's plus one (version 3, O(1)), or one
    above the highest listed (versions 1/2, O(shards) like their manifest)."""
    if manifest.table is not None:
        table = manifest.shard_table()
        return int(table.data["number"][-1]) + 1 if len(table) else 0
    return max((_shard_number(s.name) for s in manifest.shards), default=-1) + 1



def remove_if_dead(path: Path, *, warn: bool = False) -> bool:
    """Delete the workspace or task directory ``path`` unless a live writer holds its ``owner.lock``
    (a missing lock file counts as dead); returns whether it is gone."""
    try:
        fd = os.open(path / OWNER, os.O_RDWR | _O_CLOEXEC)
    except FileNotFoundError:
        fd = -1
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a live writer owns it
    finally:
        if fd >= 0:
            os.close(fd)
    if warn:
        log.warning("removing workspace of a dead writer %s", path)
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()


def workspace_path(root: Path, manifest: Manifest, token: str) -> Path:
    """Where a writer with ``token`` keeps its workspace: ``_tmp/<token>`` in a version-3 store,
    ``_tmp-<token>`` at the top of a version-1/2 store (as older writers expect)."""
    return root / WORK_DIR / token if manifest.table is not None else root / f"_tmp-{token}"



def append_row(root: Path, committed: int, row: bytes, ragged: int, table_id: int = 0) -> None:
    """Write ``row`` (one row, or several rows back to back) at the committed end of the shard table and
    fsync it (creating the file with its header for the first row). Bytes a dead writer left past the
    committed rows are overwritten."""
    path = root / TABLE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644)
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
    data = json.dumps(obj, separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
    try:
        pwrite_all(fd, memoryview(data), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
