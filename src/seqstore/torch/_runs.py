"""The run buffers of a read-once ``procs=`` loop (:mod:`seqstore.torch._ring`): files in ``/dev/shm`` that
the loop's process fetches runs of batches into and its workers map by name, and their clean-up."""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import secrets
import weakref
from multiprocessing import resource_tracker
from typing import Any

import numpy as np

from ..errors import SeqstoreError
from ..io import address

__all__ = ["RunBuffers", "SHM_DIR", "attach_run"]

SHM_DIR = "/dev/shm"


def attach_run(runs: dict[str, Any], name: str) -> int:
    """The address in this process of the loop's run buffer ``name`` (mapped on first use, kept in ``runs``)."""
    got = runs.get(name)
    if got is None:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY)
        try:  # its pages mapped at once (one call instead of a page fault each)
            m = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        got = runs[name] = np.frombuffer(m, np.uint8)
    return address(got)


class RunBuffers:
    """A read-once loop's run buffers: files in ``/dev/shm`` that the workers map by name (``make`` and
    ``drop`` for a :class:`~seqstore.store.Pool`). A dropped buffer's file is removed and the
    workers are told (``tell``) to let it go; :meth:`close` removes every file left (as does the
    interpreter's exit, for a loop left open until then, and the resource tracker, for a process killed)."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.tell: Any = None
        self._count = itertools.count()
        self._tag = f"seqstore-run-{os.getpid()}-{secrets.token_hex(4)}"
        weakref.finalize(self, _unlink_all, self.names)  # at exit, or when dropped unclosed

    def make(self, size: int) -> np.ndarray[Any, Any]:
        name = f"{self._tag}-{next(self._count)}"
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            try:  # the pages reserved now: a full /dev/shm is an error here, not a SIGBUS when written
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                raise SeqstoreError(f"{SHM_DIR} has no room for a read-once run buffer of {size} bytes "
                                    f"({exc.strerror}); give it more (e.g. docker --shm-size) or use "
                                    "SeqDataLoader without procs=") from None
            buf = np.frombuffer(mmap.mmap(fd, size), np.uint8)
        except BaseException:  # (a Ctrl-C meanwhile, a mapping refused too) the file is nobody's yet
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        # a process killed (SIGKILL, OOM) runs no exit handler: the resource tracker removes the file, as the block
        resource_tracker.register("/" + name, "shared_memory")
        self.names[address(buf)] = name
        return buf

    def name(self, buf: np.ndarray[Any, Any]) -> str:
        return self.names[address(buf)]

    def drop(self, buf: np.ndarray[Any, Any]) -> None:
        name = self.names.pop(address(buf), None)
        if name is not None:
            _unlink(name)
            if self.tell is not None:
                self.tell(("forget", name))

    def close(self) -> None:
        _unlink_all(self.names)


def _unlink_all(names: dict[int, str]) -> None:
    for name in names.values():
        _unlink(name)
    names.clear()


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))
    with contextlib.suppress(Exception):  # (interpreter shutdown)
        resource_tracker.unregister("/" + name, "shared_memory")
