"""A store's commit state read straight from its objects, without the node cache: ``manifest.json``
and, for version 3, the committed rows of the shard table, checked. What ``seqstore copy``
(store/copy.py) and the object-storage commit target (store/write/objects.py) work from, through an
:class:`~seqstore.io.objects.ObjectClient` or :class:`LocalObjects` (the same calls on a directory).

:func:`read_state` costs two requests; given the state it read before, it fetches only the rows
committed since (checked with the old ones against the new manifest's CRC-32): O(new rows).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import threading
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConflictError, CorruptionError, RemoteNotFound
from ...format.manifest import IDS_FILES, MANIFEST, WORK_DIR, Manifest, fsync_dir
from ...format.shard_table import TABLE_HEADER_BYTES, ShardRow, check_table_header, row_dtype, shard_dir_name
from ...io.objects import ObjectMeta
from ..directio import O_CLOEXEC, pwrite_all
from .disk import INDEX_DIR, copy_workdir_prefix, hold_owner_lock, remove_if_dead, store_lock
from .target import OWNER


@dataclass
class StoreState:
    """What one read of a store found: the manifest's bytes, ETag and parsed form, and for version 3
    the table's header and committed rows (a structured array of ``row_dtype``; O(shards) small bytes,
    no per-shard Python object)."""

    raw: bytes
    etag: str
    manifest: Manifest
    header: bytes
    rows: np.ndarray[Any, Any]

    @property
    def v3(self) -> bool:
        return self.manifest.table is not None

    @property
    def num_shards(self) -> int:
        return len(self.rows) if self.v3 else len(self.manifest.shards)

    @property
    def table_key(self) -> str:
        """The object a version-3 manifest names as its shard table."""
        assert self.manifest.table is not None
        return self.manifest.table.file

    def name(self, k: int) -> str:
        """Directory of shard ``k`` (in record order)."""
        if self.v3:
            return shard_dir_name(int(self.rows["number"][k]))
        return self.manifest.shards[k].name

    @property
    def has_ids(self) -> bool | None:
        """Whether the committed shards have ids (None: no shard yet)."""
        if self.num_shards == 0:
            return None
        if self.v3:
            return bool(int(self.rows["flags"][0]) & 1)
        return self.manifest.shards[0].has_ids

    def next_number(self) -> int:
        """Version 3: the lowest number the next committed shard may take (the last row's + 1)."""
        return int(self.rows["number"][-1]) + 1 if len(self.rows) else 0

    def row(self, k: int) -> ShardRow:
        r = self.rows[k]
        rows = {name: int(v) for name, v in zip(self.manifest.ragged, r["rows"])}
        return ShardRow(int(r["number"]), int(r["start"]), int(r["records"]), bool(int(r["flags"]) & 1), rows,
                        int(r["desc_crc"]))

    def expected_files(self, has_ids: bool) -> tuple[str, ...]:
        return self.manifest.data_files() + (IDS_FILES if has_ids else ())


def _bodies_crc(buf: bytes, row_bytes: int, crc: int) -> int:
    """CRC-32 (continuing ``crc``) of rows back to back in ``buf``, each without its last 4 bytes."""
    n = len(buf) // row_bytes
    if n == 0:
        return crc
    arr = np.frombuffer(buf, dtype=np.uint8).reshape(n, row_bytes)[:, :-4]
    return zlib.crc32(np.ascontiguousarray(arr).data, crc)


def _check_rows(new: np.ndarray[Any, Any], raw: bytes, where: str, first: int, prev: np.ndarray[Any, Any] | None,
                ids_flag: int | None) -> None:
    """Check rows ``first ..`` (``new``, their bytes ``raw``): each row's CRC, starts continuing one
    another from the row before (``prev``), strictly increasing numbers, one ids flag."""
    rb = new.dtype.itemsize
    for j in range(len(new)):
        body = raw[j * rb : (j + 1) * rb - 4]
        if zlib.crc32(body) != int(new["row_crc"][j]):
            raise CorruptionError(f"{where} row {first + j}: CRC-32 of the row differs from the one it carries")
    starts, records, numbers = new["start"], new["records"], new["number"]
    prev_end = int(prev["start"] + prev["records"]) if prev is not None else 0
    prev_number = int(prev["number"]) if prev is not None else -1
    exp_starts = np.concatenate([[prev_end], (starts[:-1] + records[:-1])]) if len(new) else starts
    bad = np.flatnonzero((starts != exp_starts) | (records < 0) | (new["rows"] < 0).reshape(len(new), -1).any(1))
    if len(bad):
        k = int(bad[0])
        raise CorruptionError(f"{where} row {first + k}: starts at record {int(starts[k])}, expected "
                              f"{int(exp_starts[k])} (or has a negative count)")
    nums = np.concatenate([[prev_number], numbers])
    bad = np.flatnonzero(nums[1:] <= nums[:-1])
    if len(bad):
        k = int(bad[0])
        raise CorruptionError(f"{where} row {first + k}: shard number {int(numbers[k])} does not increase")
    flags = new["flags"] & 1
    want = flags[0] if ids_flag is None and len(new) else ids_flag
    if len(new) and (flags != want).any():
        k = int(np.flatnonzero(flags != want)[0])
        raise CorruptionError(f"{where} row {first + k}: has_ids differs from the other rows")


def read_state(objects: Any, *, known: StoreState | None = None) -> StoreState | None:
    """The store's state at ``objects`` (an ObjectClient or :class:`LocalObjects`), or None when there
    is no ``manifest.json``. ``known``: a state read before; only the rows committed since are fetched
    when the new manifest's rows extend it (checked by the CRC-32 of all committed rows)."""
    try:
        raw_mv, meta = objects.get(MANIFEST)
    except RemoteNotFound:
        return None
    raw = bytes(raw_mv)
    if known is not None and raw == known.raw:  # unchanged (a new ETag at most: the same bytes rewritten)
        return dataclasses.replace(known, etag=meta.etag)
    where = objects.key_url(MANIFEST)
    manifest = Manifest.parse(raw, where)
    dt = row_dtype(len(manifest.ragged))
    state = manifest.table
    if state is None or state.rows == 0:
        if state is not None and state.records:
            raise CorruptionError(f"{where}: 0 shard-table rows but {state.records} records")
        return StoreState(raw, meta.etag, manifest, b"", np.zeros(0, dt))
    count = state.rows
    key = state.file
    turl = objects.key_url(key)
    usable = (
        known is not None and known.manifest.table is not None and 0 < len(known.rows) <= count
        and known.rows.dtype == dt and known.manifest.schema == manifest.schema
    )
    for attempt in (0, 1):
        have = known.rows if usable and attempt == 0 and known is not None else np.zeros(0, dt)
        crc0 = known.manifest.table.crc32 if len(have) and known is not None and known.manifest.table else 0
        reqs: list[tuple[str, int, int, str | None]] = [(key, 0, TABLE_HEADER_BYTES, None)]
        if count > len(have):
            reqs.append((key, TABLE_HEADER_BYTES + len(have) * dt.itemsize, TABLE_HEADER_BYTES + count * dt.itemsize,
                         None))
        try:
            got = objects.get_ranges(reqs)
        except RemoteNotFound:
            if manifest_bytes(objects) != raw:  # newer commits deleted that table meanwhile (or the store went)
                return read_state(objects, known=known)
            raise CorruptionError(f"{turl}: shard table is missing (manifest.json lists {count} rows)") from None
        header = bytes(got[0][0])
        check_table_header(header, turl, len(manifest.ragged), state.id)
        new_raw = bytes(got[1][0]) if len(got) > 1 else b""
        if len(new_raw) != (count - len(have)) * dt.itemsize:
            raise CorruptionError(
                f"{turl}: holds fewer bytes than the {count} committed rows of {dt.itemsize} bytes (truncated?)"
            )
        if len(have) and known is not None and header != known.header:
            continue  # another table (replaced store): read it whole
        if _bodies_crc(new_raw, dt.itemsize, crc0) != state.crc32:
            if len(have):
                continue
            raise CorruptionError(
                f"{turl}: CRC-32 of the {count} committed rows differs from manifest.json's {state.crc32:#010x}"
            )
        new = np.frombuffer(new_raw, dtype=dt)
        _check_rows(new, new_raw, turl, len(have), have[-1] if len(have) else None,
                    int(have["flags"][0] & 1) if len(have) else None)
        rows = np.concatenate([have, new]) if len(have) else new.copy()
        end = int(rows["start"][-1] + rows["records"][-1])
        if end != state.records:
            raise CorruptionError(f"{turl}: the committed rows end at record {end}, manifest.json says {state.records}")
        rows.flags.writeable = False
        return StoreState(raw, meta.etag, manifest, header, rows)
    raise AssertionError("unreachable")  # pragma: no cover


def manifest_bytes(objects: Any) -> bytes | None:
    """The bytes of ``manifest.json`` at ``objects`` now; None where there is none."""
    try:
        return bytes(objects.get(MANIFEST)[0])
    except RemoteNotFound:
        return None


# ------------------------------------------------------------------------------------ local objects


STAGE = "stage"  # in a copy's temporary directory: what it adds to a local store, until its commit


def _content_tag(data: bytes) -> str:
    return f"{zlib.crc32(data):08x}-{len(data)}"


class LocalObjects:
    """The calls of :class:`~seqstore.io.objects.ObjectClient` that copying and writing use, on a
    local directory: keys are paths relative to ``root``. Every write is atomic and durable (a
    temporary file in the store's ``_tmp/copy-<token>/``, fsync, rename, fsync of the directory); a
    write of ``manifest.json`` with a ``mode`` is decided under the store's commit lock, comparing
    the content tag of the manifest it replaces. Call :meth:`close` when done (removes the temporary
    directory; a dead process's is removed by the next writer or copy, as its ``owner.lock`` is free).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.url = str(self.root)
        self._tmp: Path | None = None
        self._owner_fd = -1
        self._dirs: set[Path] = set()
        self._lock = threading.Lock()  # copies write from several threads
        self._held = False  # the store's commit lock is held throughout (:meth:`locked`)
        self._staging: frozenset[str] = frozenset()  # the names :meth:`stage` sends to the staging directory

    def key_url(self, key: str) -> str:
        return str(self.root / key)

    def conditional_writes(self) -> bool:
        return True

    def _path(self, key: str) -> Path:
        if self._staging and (key.split("/", 1)[0] in self._staging or key.split(".", 1)[0] in self._staging):
            return self._workdir() / STAGE / key
        return self.root / key

    def stage(self, names: Iterable[str]) -> None:
        """Keep what is written (and read) under each of ``names`` (a shard's directory, an index run's name,
        ``_index/run-...``) in this object's staging directory (``_tmp/copy-<token>/stage/``), out of the
        store, until :meth:`commit` moves it in under the store's lock: a copy that adds shards to a local
        store does not hold the lock while it transfers them (its writers commit meanwhile, and no writer
        removes them as a dead one's leftovers). A dead copy's staging directory is taken over by the next
        copy that stages (a rerun resumes), or removed as a dead one's by the store's writers."""
        self._staging = frozenset(names)

    def _missing(self, key: str) -> RemoteNotFound:
        return RemoteNotFound(f"{self.key_url(key)}: no such file", url=self.key_url(key), attempts=1)

    def head(self, key: str) -> ObjectMeta:
        try:
            st = os.stat(self._path(key))
        except FileNotFoundError:
            raise self._missing(key) from None
        return ObjectMeta(key, st.st_size, f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}")

    def get(self, key: str) -> tuple[memoryview, ObjectMeta]:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            raise self._missing(key) from None
        return memoryview(data), ObjectMeta(key, len(data), _content_tag(data))

    def get_ranges(self, requests: Sequence[tuple[str, int, int, str | None]]) -> list[tuple[memoryview, ObjectMeta]]:
        out = []
        for key, start, end, _ in requests:
            meta = self.head(key)
            with open(self._path(key), "rb") as f:  # (ranges within the file: no negative offsets here)
                f.seek(start)
                out.append((memoryview(f.read(max(0, end - start))), meta))
        return out

    def read_chunks(self, key: str, chunk: int) -> Iterator[bytes]:
        try:
            f = open(self._path(key), "rb")
        except FileNotFoundError:
            raise self._missing(key) from None
        with f:
            while True:
                data = f.read(chunk)
                if not data:
                    return
                yield data

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        base = self._path(prefix)
        if not base.is_dir():
            return
        head = f"{prefix.rstrip('/')}/" if prefix else ""
        for p in sorted(base.rglob("*")):
            if p.is_file():  # (the key under ``prefix``: the directory may be a staged one)
                yield ObjectMeta(head + p.relative_to(base).as_posix(), p.stat().st_size, "")

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    # writes -------------------------------------------------------------------------------------

    def _workdir(self) -> Path:
        with self._lock:
            if self._tmp is None:
                work = self.root / WORK_DIR
                work.mkdir(parents=True, exist_ok=True)
                for entry in list(os.scandir(work)):  # temporary directories of copies that died
                    if entry.name.startswith("copy-") and entry.is_dir() and not self._adopt(Path(entry.path)):
                        remove_if_dead(Path(entry.path))
                if self._tmp is not None:  # a dead copy's staged shards, taken over
                    return self._tmp
                tmp = work / f"{copy_workdir_prefix(os.getpid())}{uuid.uuid4().hex[:8]}"
                tmp.mkdir()
                self._owner_fd = hold_owner_lock(tmp)
                self._tmp = tmp
            return self._tmp

    def _adopt(self, path: Path) -> bool:
        """Take over the staging directory of a dead copy (once, and only to stage): whether it was."""
        if self._tmp is not None or not self._staging or not (path / STAGE).is_dir():
            return False
        try:
            fd = os.open(path / OWNER, os.O_RDWR | O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False  # a live copy's
        for tmp in path.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        self._tmp, self._owner_fd = path, fd
        return True

    def _install(self, key: str, chunks: Iterable[bytes | memoryview]) -> str:
        """Write ``chunks`` back to back into a temporary file, fsync it and rename it to ``key``."""
        tmp = self._workdir() / f"{uuid.uuid4().hex}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o644)
        except FileNotFoundError:  # another process's clean-up took the directory before it was locked
            with self._lock:
                if self._tmp is not None and not self._tmp.is_dir():
                    os.close(self._owner_fd)
                    self._tmp, self._owner_fd = None, -1
            tmp = self._workdir() / f"{uuid.uuid4().hex}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o644)
        try:
            try:
                pos = 0
                for c in chunks:
                    pwrite_all(fd, memoryview(c), pos)
                    pos += len(c)
                os.fsync(fd)
            finally:
                os.close(fd)
            dst = self._path(key)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        with self._lock:  # every directory the key may have made (shard-000000/a/ for a field "a/b/c")
            self._dirs.update(d for d in (dst.parent, *dst.parent.parents) if d == self.root or self.root in d.parents)
        return self.head(key).etag

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's commit lock for the whole block (a copy into the store: a writer neither
        commits into the shard numbers it fills nor removes them as a dead writer's meanwhile)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with store_lock(self.root):
            self._workdir()  # (from the start: a writer timed out waiting for the lock is told a copy holds it)
            self._held = True
            try:
                yield
            finally:
                self._held = False

    def _commit_lock(self) -> contextlib.AbstractContextManager[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        return contextlib.nullcontext() if self._held else store_lock(self.root)

    def put(self, key: str, data: bytes | memoryview, *, mode: str | dict[str, Any] = "overwrite") -> str:
        if mode == "overwrite":
            return self._install(key, [data])
        with self._commit_lock():
            self._check_mode(key, mode)
            self._install(key, [data])
            self.sync()
        return _content_tag(bytes(data))

    def commit(self, files: Sequence[tuple[str, bytes]], manifest: bytes, mode: str | dict[str, Any],
               unlink: Sequence[str] = ()) -> None:
        """Under the store's lock: check ``manifest.json`` as ``mode`` says (``"create"``: there is none;
        ``{"e_tag": tag}``: its content tag is ``tag``; ``"overwrite"``: anything), move what was staged
        (:meth:`stage`) into the store, then replace each of ``files`` and then the manifest, atomically
        each, fsync the directories, and delete the keys ``unlink`` (files the new manifest does not use)."""
        with self._commit_lock():
            try:
                self._check_mode(MANIFEST, mode)
            except ConflictError:
                self._staging = frozenset()  # (staged for a state of the store that is gone: of no more use)
                raise
            self.sync()  # (the staged directories' entries: they move with them)
            self._move_staged()
            self._staging = frozenset()
            for key, data in [*files, (MANIFEST, manifest)]:
                self._install(key, [data])
            self.sync()
            for key in unlink:
                self._path(key).unlink(missing_ok=True)

    def _move_staged(self) -> None:
        """Rename each staged shard directory and index run file into the store (what is at those names is
        uncommitted: the manifest is unchanged since the copy read it, and does not list them). Only the names
        this copy stages: a dead copy's directory taken over may hold others (they go with the directory)."""
        stage = self._tmp / STAGE if self._tmp is not None and self._staging else None
        if stage is None or not stage.is_dir():
            return
        for entry in sorted(os.scandir(stage), key=lambda e: e.name):
            if entry.name == INDEX_DIR:
                (self.root / INDEX_DIR).mkdir(exist_ok=True)
                for run in os.scandir(entry.path):
                    if f"{INDEX_DIR}/{run.name.split('.', 1)[0]}" in self._staging:
                        os.replace(run.path, self.root / INDEX_DIR / run.name)
                self._dirs.add(self.root / INDEX_DIR)
                continue
            if entry.name not in self._staging:
                continue
            target = self.root / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.rename(entry.path, target)
        self._dirs.add(self.root)

    def _check_mode(self, key: str, mode: str | dict[str, Any]) -> None:
        try:
            current: str | None = _content_tag(self._path(key).read_bytes())
        except FileNotFoundError:
            current = None
        url = self.key_url(key)
        if mode == "create" and current is not None:
            raise ConflictError(f"{url}: already exists", url=url, attempts=1)
        if isinstance(mode, dict) and current != mode.get("e_tag"):
            raise ConflictError(f"{url}: conditional write refused: the file changed", url=url, attempts=1)

    def put_stream(self, key: str, chunks: Callable[[], Iterable[bytes]]) -> str:
        return self._install(key, chunks())

    def sync(self) -> None:
        """fsync the directories files were renamed into since the last call."""
        with self._lock:
            dirs, self._dirs = self._dirs, set()
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            fsync_dir(d)
        if dirs:
            fsync_dir(self.root)

    def close(self, *, keep_staged: bool = True) -> None:
        """Remove the temporary directory; one with staged shards not committed (a copy that failed or was
        interrupted) is left for the next copy to take over (a rerun resumes) or the store's writers to remove,
        unless ``keep_staged`` is False (a version-1/2 store, whose writers never look in ``_tmp/``)."""
        if self._tmp is not None:
            if keep_staged and self._staging and (self._tmp / STAGE).is_dir():
                for tmp in self._tmp.glob("*.tmp"):
                    tmp.unlink(missing_ok=True)
            else:
                shutil.rmtree(self._tmp, ignore_errors=True)
            os.close(self._owner_fd)
            self._tmp, self._owner_fd = None, -1
