"""Pages that another process on the node is fetching: claims beside the node cache's page maps, so
that the processes sharing a cache (DataLoader workers, the ranks of a node) fetch a page once. (Without
them, the workers of a ``random_block`` epoch each asked for all of a window's blocks: two workers moved
4x the bytes they delivered in the benchmark.)

A claim is a word per page in ``<entry>.claims`` (sparse, beside the page map): the claiming process's
id and a deadline (seconds since the epoch). A process about to request pages takes, under an exclusive
``flock`` of the entry's data file, those without a live claim (none, past its deadline, or its process
gone), and waits for the others (:class:`ClaimWait`); then the caller asks again and fetches what is
still missing itself. A request that fails gives its claims back. Claims are advice: the page map alone
says what is present, so a wrong claim costs a wait or a second fetch, never a wrong byte. The deadline
is one request's time (``timeout`` + ``connect_timeout``): a process that dies fetching holds up the
others at most that long.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .mapping import allocate
from .object_links import reset_in_child
from .tempfiles import lock_polled

__all__ = ["Claims", "ClaimWait"]

_PID = 1 << 32  # a claim: pid * _PID + deadline (seconds)
_BLOCK = 512  # claim words in a 4 KiB block of the claims file (given disk space before a first write)
#: how often a waiter looks whether the claiming processes are still there
_ALIVE_EVERY = 0.5


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs and is not a zombie (one in another pid namespace counts as gone: its
    claims are not waited for, a second fetch at worst)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _others(held: np.ndarray[Any, Any], now: int) -> np.ndarray[Any, Any]:
    """Which claim words ``held`` are another process's, their deadlines not passed."""
    return (held % _PID > now) & (held // _PID != os.getpid())  # type: ignore[no-any-return]


class Claims:
    """The claims of one cache entry's pages (``pages`` of them), in ``path``, mapped on first use;
    ``bits``: the entry's page map (what waiters poll); ``lock_fd``: a descriptor of the entry's data
    file, ``flock``'d while claims are checked and written (no descriptor is kept for the claims)."""

    def __init__(self, path: Path, pages: int, bits: np.ndarray[Any, Any], lock_fd: int,
                 make: Callable[[], bool] | None = None) -> None:
        self.path = path
        # makes the claims file where there is none; False (none made) where the entry is no longer in the
        # cache directory: a file made then would be left behind (None: made as it is needed)
        self._make = make
        self.pages = pages
        self.bits = bits
        self._fd = lock_fd
        self._lock = threading.Lock()
        reset_in_child(self, "_lock")  # (a thread of a process forked meanwhile may hold it)
        self._words: np.ndarray[Any, Any] | None = None
        self._ready = np.zeros(-(-max(1, pages) // _BLOCK), dtype=bool)  # blocks with disk space (this process knows)
        self._failed = False
        self._wait = 1.0  # seconds the lock is waited for at most (one request's time, as take was last given)

    def _open(self) -> np.ndarray[Any, Any] | None:
        if self._words is not None or self._failed:
            return self._words
        with self._lock:
            if self._words is None and not self._failed:
                try:
                    try:
                        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
                    except FileNotFoundError:
                        if self._make is not None and not self._make():
                            raise  # (an evicted entry: the copy is this process's alone, nobody to share with)
                        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                    try:
                        size = 8 * max(1, self.pages)
                        if os.fstat(fd).st_size < size:
                            os.ftruncate(fd, size)  # zeros: no claims (two processes extend it alike)
                        m = mmap.mmap(fd, size)
                    finally:
                        os.close(fd)
                    self._words = np.frombuffer(m, dtype=np.uint64, count=self.pages)
                except OSError:  # e.g. a read-only cache, an evicted entry: no claims, each process fetches for itself
                    self._failed = True
        return self._words

    def take(self, pages: np.ndarray[Any, Any], seconds: float) -> tuple[np.ndarray[Any, Any], ClaimWait | None]:
        """Claim those of ``pages`` (page numbers) that no live process claims, for ``seconds``. Returns
        (a mask of the pages now claimed by this process, a wait for the rest or None)."""
        words = self._open()
        if words is None or not len(pages):
            return np.ones(len(pages), dtype=bool), None
        now = int(time.time())
        self._wait = seconds
        with self._locked() as locked:  # check and claim as one step across processes
            if not locked or not self._allocate(pages):  # the entry was closed meanwhile (evicted), or no
                return np.ones(len(pages), dtype=bool), None  # room on the cache's disk: fetch as without claims
            held = words[pages]
            pid = (held // _PID).astype(np.int64)
            live = _others(held, now)
            if live.any():  # claims by processes that are gone do not count
                for p in np.unique(pid[live]).tolist():
                    if not _alive(p):
                        live &= pid != p
            mine = ~live
            words[pages[mine]] = np.uint64(os.getpid() * _PID + now + int(seconds) + 1)
        if mine.all():
            return mine, None
        until = float((held[live] % _PID).max())
        return mine, ClaimWait(self.bits, words, pages[live], np.unique(pid[live]), until)

    def _allocate(self, pages: np.ndarray[Any, Any]) -> bool:
        """Give the blocks of the claims file that hold the words of ``pages`` their disk space before they
        are touched through the mapping (where a write into a hole of a full file system, and on tmpfs a
        read, is a SIGBUS, not an error). False where the disk has no room."""
        blocks = np.unique(pages // _BLOCK)
        new = blocks[~self._ready[blocks]]
        if not len(new):
            return True
        size = 8 * max(1, self.pages)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            try:
                for b in new.tolist():
                    allocate(fd, b * _BLOCK * 8, min(_BLOCK * 8, size - b * _BLOCK * 8))
            finally:
                os.close(fd)
        except OSError:
            return False
        self._ready[new] = True
        return True

    def give_back(self, pages: np.ndarray[Any, Any]) -> None:
        """Clear this process's claims of ``pages`` (its request failed: others need not wait for it)."""
        words = self._open()
        pages = pages[self._ready[pages // _BLOCK]]  # (this process claimed none in blocks it never touched)
        if words is None or not len(pages):
            return
        with self._locked() as locked:
            if locked:  # (closed meanwhile: the claims run out at their deadline)
                words[pages[words[pages] // _PID == os.getpid()]] = 0

    @contextlib.contextmanager
    def _locked(self) -> Iterator[bool]:
        """An exclusive ``flock`` of the entry's data file while the block runs; yields False (and locks
        nothing) where that descriptor is closed already, or where another process held it for longer than
        one request takes (one stopped or hung while holding it: the claims are advice, not waited for)."""
        try:
            had = lock_polled(self._fd, self._wait)
        except OSError:
            had = False
        if not had:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Stop claiming (the entry's descriptor is about to close): every page counts as this process's."""
        self._failed = True
        self._words = None


class ClaimWait:
    """Waiting for pages other processes claimed: :meth:`result` returns once the page map ``bits`` says
    they are present, their claims (in ``words``) have run out (``until``) or been given back, or their
    processes (``pids``) have exited; it raises ``concurrent.futures.TimeoutError`` after ``timeout``
    seconds, as a future does. Polls the page map every 0.5 to 5 ms, claims and processes every 0.5 s."""

    __slots__ = ("bits", "words", "pages", "pids", "until")

    def __init__(self, bits: np.ndarray[Any, Any], words: np.ndarray[Any, Any], pages: np.ndarray[Any, Any],
                 pids: np.ndarray[Any, Any], until: float) -> None:
        self.bits, self.words, self.pages, self.pids, self.until = bits, words, pages, pids, until

    def _claimed(self) -> bool:
        """Whether a page still missing is claimed by another process, its claim not run out."""
        missing = self.pages[self.bits[self.pages] == 0]
        return bool(_others(self.words[missing], int(time.time())).any())

    def result(self, timeout: float | None = None) -> None:
        start = time.monotonic()
        seen = start
        delay = 0.0005
        while True:
            if bool(self.bits[self.pages].all()) or time.time() >= self.until:
                return
            now = time.monotonic()
            if now - seen >= _ALIVE_EVERY:
                seen = now
                if not self._claimed() or not any(_alive(int(p)) for p in self.pids.tolist()):
                    return
            if timeout is not None and now - start >= timeout:
                raise concurrent.futures.TimeoutError
            time.sleep(delay)
            delay = min(2 * delay, 0.005)
