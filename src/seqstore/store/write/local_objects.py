"""The object-client calls that copying and writing use, on a local directory (:class:`LocalObjects`)."""

from __future__ import annotations

import concurrent.futures
import fcntl
import functools
import os
import shutil
import socket
import threading
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConflictError, RemoteNotFound
from ...format.manifest import MANIFEST, WORK_DIR, fsync_dir
from ...io.objects import ObjectMeta
from .disk import remove_if_dead, store_lock

__all__ = ["LocalObjects"]

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


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

    def key_url(self, key: str) -> str:
        return str(self.root / key)

    def conditional_writes(self) -> bool:
        return True

    def _path(self, key: str) -> Path:
        return self.root / key

    def head(self, key: str) -> ObjectMeta:
        try:
            st = os.stat(self._path(key))
        except FileNotFoundError:
            raise RemoteNotFound(f"{self.key_url(key)}: no such file", url=self.key_url(key), attempts=1) from None
        return ObjectMeta(key, st.st_size, f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}")

    def get(self, key: str) -> tuple[memoryview, ObjectMeta]:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            raise RemoteNotFound(f"{self.key_url(key)}: no such file", url=self.key_url(key), attempts=1) from None
        return memoryview(data), ObjectMeta(key, len(data), _content_tag(data))

    def get_ranges(self, requests: Sequence[tuple[str, int, int, str | None]]) -> list[tuple[memoryview, ObjectMeta]]:
        out = []
        for key, start, end, _ in requests:
            meta = self.head(key)
            with open(self._path(key), "rb") as f:
                if start < 0:
                    start = max(0, meta.size + start)
                if end < 0:
                    end = meta.size
                f.seek(start)
                out.append((memoryview(f.read(max(0, end - start))), meta))
        return out

    def submit(self, requests: Sequence[tuple[str, int, int, str | None]], on_each: Any = None) -> Any:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            fut.set_result(self.get_ranges(requests))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            fut.set_exception(exc)
        return fut

    def read_chunks(self, key: str, chunk: int) -> Iterator[bytes]:
        try:
            f = open(self._path(key), "rb")
        except FileNotFoundError:
            raise RemoteNotFound(f"{self.key_url(key)}: no such file", url=self.key_url(key), attempts=1) from None
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
        for p in sorted(base.rglob("*")):
            if p.is_file():
                yield ObjectMeta(p.relative_to(self.root).as_posix(), p.stat().st_size, "")

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass

    # writes -------------------------------------------------------------------------------------

    def _workdir(self) -> Path:
        with self._lock:
            return self._make_workdir()

    def _make_workdir(self) -> Path:
        if self._tmp is None:
            work = self.root / WORK_DIR
            work.mkdir(parents=True, exist_ok=True)
            for entry in list(os.scandir(work)):  # temporary directories of copies that died
                if entry.name.startswith("copy-") and entry.is_dir():
                    remove_if_dead(Path(entry.path))
            tmp = work / f"copy-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            self._owner_fd = os.open(tmp / "owner.lock", os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644)
            fcntl.flock(self._owner_fd, fcntl.LOCK_EX)
            self._tmp = tmp
        return self._tmp

    def _install(self, key: str, write: Callable[[int], None]) -> str:
        """Write through ``write(fd)`` into a temporary file, fsync it and rename it to ``key``."""
        tmp = self._workdir() / f"{uuid.uuid4().hex}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
        except FileNotFoundError:  # another process's clean-up took the directory before it was locked
            with self._lock:
                if self._tmp is not None and not self._tmp.is_dir():
                    os.close(self._owner_fd)
                    self._tmp, self._owner_fd = None, -1
            tmp = self._workdir() / f"{uuid.uuid4().hex}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
        try:
            try:
                write(fd)
                os.fsync(fd)
            finally:
                os.close(fd)
            dst = self._path(key)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        with self._lock:
            self._dirs.add(dst.parent)
        st = os.stat(dst)
        return f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}"

    def put(self, key: str, data: bytes | memoryview, *, mode: str | dict[str, Any] = "overwrite") -> str:
        def write(fd: int) -> None:
            _write_all(fd, memoryview(data))

        if mode == "overwrite":
            return self._install(key, write)
        self.root.mkdir(parents=True, exist_ok=True)
        with store_lock(self.root):
            self._check_mode(key, mode)
            self._install(key, write)
            self.sync()
        return _content_tag(bytes(data))

    def commit(self, files: Sequence[tuple[str, bytes]], manifest: bytes, mode: str | dict[str, Any]) -> None:
        """Under the store's lock: check ``manifest.json`` as ``mode`` says (``"create"``: there is none;
        ``{"e_tag": tag}``: its content tag is ``tag``; ``"overwrite"``: anything), then replace each of
        ``files`` and then the manifest, atomically each, and fsync the directories."""
        self.root.mkdir(parents=True, exist_ok=True)
        with store_lock(self.root):
            self._check_mode(MANIFEST, mode)
            for key, data in [*files, (MANIFEST, manifest)]:
                self._install(key, functools.partial(_write_at, data=data))
            self.sync()

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
        def write(fd: int) -> None:
            pos = 0
            for c in chunks():
                _write_all(fd, memoryview(c), pos)
                pos += len(c)

        return self._install(key, write)

    def sync(self) -> None:
        """fsync the directories files were renamed into since the last call."""
        with self._lock:
            dirs, self._dirs = self._dirs, set()
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            fsync_dir(d)
        if dirs:
            fsync_dir(self.root)

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            os.close(self._owner_fd)
            self._tmp, self._owner_fd = None, -1


def _write_at(fd: int, data: bytes) -> None:
    _write_all(fd, memoryview(data))


def _write_all(fd: int, data: memoryview, pos: int = 0) -> None:
    while len(data):
        n = os.pwrite(fd, data, pos)
        data, pos = data[n:], pos + n
