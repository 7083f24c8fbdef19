"""Temporary files ``.<name>.tmp-*`` beside a file being written, flock'd by the process writing them.

A process killed part way (SIGKILL, the OOM killer) runs no clean-up: its temporary, as large as the file
it was writing, stays. Its lock went with the process, so a later writer of the same file tells it from
one being written (:func:`remove_stale`), wherever the directory is (a node cache's evictions do the same
for theirs).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
import time
from pathlib import Path

from ..errors import LockTimeout

__all__ = ["abandoned", "lock_held_by", "lock_named", "lock_polled", "lock_wait", "lock_within", "locked_temporary",
           "remove_stale"]

#: Seconds a lock another process holds is waited for at most (a store's commit lock, the node cache's) where
#: ``$SEQSTORE_LOCK_TIMEOUT`` names none (``inf`` waits for ever). Commits hold a store's lock for moments; a copy
#: into the store, and the merge of the largest id-index runs of a store of 10^10 ids (over 100 GB written), for
#: minutes.
LOCK_WAIT = 1800.0
LOCK_WAIT_ENV = "SEQSTORE_LOCK_TIMEOUT"


def _prefix(path: str | os.PathLike[str]) -> tuple[Path, str]:
    p = Path(path)
    return p.parent, f".{p.name}.tmp-"


#: what ``flock`` fails with on a file system without it (Lustre mounted without ``-o flock``: ENOSYS)
_NO_FLOCK = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOLCK, errno.EINVAL})


def locked_temporary(path: str | os.PathLike[str]) -> tuple[int, str]:
    """A new temporary file beside ``path`` and its descriptor, flock'd (exclusive) until the descriptor is
    closed. Made again where another process's :func:`remove_stale` took it before it was locked. On a file
    system without ``flock`` it is not locked (nor is any other there: :func:`remove_stale` removes none)."""
    parent, prefix = _prefix(path)
    while True:
        fd, tmp = tempfile.mkstemp(prefix=prefix, dir=parent)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                if exc.errno not in _NO_FLOCK:
                    raise
                return fd, tmp
            st, mine = os.stat(tmp), os.fstat(fd)
            if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                return fd, tmp
        except FileNotFoundError:  # removed as stale between the two
            pass
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        os.close(fd)


def remove_stale(path: str | os.PathLike[str]) -> None:
    """Remove the temporaries of ``path`` (``.<name>.tmp-*`` beside it) that no process holds locked: those
    of processes that ended before renaming them. O(files in the directory)."""
    parent, prefix = _prefix(path)
    try:
        names = [e.name for e in os.scandir(parent) if e.name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        tmp = os.path.join(parent, name)
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # renamed into place meanwhile, or not a file of ours
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (held: a live writer's; OSError)
            st, held = os.stat(tmp), os.fstat(fd)
            if (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino):  # (not renamed into place meanwhile)
                os.unlink(tmp)
        except OSError:
            pass
        finally:
            os.close(fd)


def lock_named(fd: int, op: int, path: str | os.PathLike[str], needs: str) -> None:
    """``flock(fd, op)`` of file ``path``; where the file system refuses file locks (some network ones:
    ENOLCK, ENOSYS, EOPNOTSUPP) an OSError naming ``path`` and saying ``needs`` (BlockingIOError as it is)."""
    try:
        fcntl.flock(fd, op)
    except BlockingIOError:
        raise
    except OSError as exc:
        raise OSError(exc.errno, f"{exc.strerror}: cannot lock {os.fspath(path)}: {needs}", os.fspath(path)) from None


def abandoned(path: str | os.PathLike[str]) -> bool:
    """Whether no process holds file ``path`` flock'd (a temporary of a process that ended). False where
    that is not known: the file is held, gone, or on a file system that refuses locks."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:  # held (BlockingIOError), or no locks on this file system: kept
        return False
    finally:
        os.close(fd)


def lock_wait() -> float:
    """Seconds to wait for a lock another process holds: ``$SEQSTORE_LOCK_TIMEOUT`` or :data:`LOCK_WAIT`."""
    text = os.environ.get(LOCK_WAIT_ENV, "").strip()
    try:
        value = float(text) if text else LOCK_WAIT
    except ValueError:
        value = -1.0
    if not value >= 0:  # (also NaN)
        raise ValueError(f"{LOCK_WAIT_ENV}={text!r}: expected a number of seconds >= 0 (or 'inf')")
    return value


def lock_held_by(fd: int) -> int | None:
    """The id of the process holding an ``flock`` of the file open as ``fd`` where ``/proc/locks`` shows one
    (None: not known, such as a holder on another machine)."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with contextlib.suppress(OSError, ValueError), open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == key:
                return int(parts[4])
    return None


def lock_within(fd: int, path: str | os.PathLike[str], what: str, needs: str, op: int = fcntl.LOCK_EX) -> None:
    """An exclusive (``op``: or shared) ``flock`` of file ``path`` (open as ``fd``; ``what`` it guards), waited
    for at most :func:`lock_wait` seconds: then :class:`~seqstore.errors.LockTimeout` naming the file and the
    process holding it where known (one stopped or hung while holding it would hold up every other for ever).
    A file system refusing locks: :func:`lock_named`'s OSError (saying ``needs``)."""
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    except OSError:  # refused: as a wait would be (the error names the file system's want)
        lock_named(fd, op, path, needs)
        return
    wait = lock_wait()
    if lock_polled(fd, wait, tried=True, op=op):
        return
    holder = lock_held_by(fd)
    who = f"process {holder}" if holder is not None else "a process this machine does not show"
    raise LockTimeout(f"{os.fspath(path)}: {what} is held by {who} and was not released within {wait:g} s (a "
                      f"stopped or hung process?); {LOCK_WAIT_ENV} sets the wait in seconds",
                      path=os.fspath(path), holder=holder)


def lock_polled(fd: int, seconds: float, *, longest_pause: float = 0.01, tried: bool = False,
                op: int = fcntl.LOCK_EX) -> bool:
    """Whether an exclusive (``op``: or shared) ``flock`` of the file open as ``fd`` was had within ``seconds``,
    tried without blocking (pauses from 1 ms, doubling up to ``longest_pause``; ``tried``: the first try was
    made already). A file system refusing locks: its OSError."""
    deadline, pause = time.monotonic() + seconds, 0.001
    while True:
        if not tried:
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(fd, op | fcntl.LOCK_NB)
                return True
        tried = False
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, longest_pause)
