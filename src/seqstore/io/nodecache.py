"""A node-local, byte-bounded cache of remote objects, shared by every process on the node.

Layout under ``cache_dir``::

    lock                  flock'd while the byte count changes or entries are evicted
    usage                 8 bytes: the bytes the cache holds (little-endian int64)
    objects/ab/<key>.data the object's bytes: a sparse file of the object's size; only fetched pages hold data
    objects/ab/<key>.bits one byte per page of .data (1: the page holds the object's bytes), after a
                          4096-byte header (magic, object size, the inode number of the .data it belongs to)
    objects/ab/<key>.claims  8 bytes per page: which process is fetching it, until when (seqstore.io.claims)
    stores/...            small metadata files (manifests, shard tables, descriptors; seqstore.io.remote)
    stores/<url>/<v>/.pin flock'd shared by each open store reading that metadata: eviction passes it by
    derived/...           datasets' derived arrays (lengths, sort indexes) of remote stores

An entry's key is a hash of the object's URL **and its ETag** (or generation): a replaced object is a
new entry, so stale bytes are never served. A page is marked present only after ``pwrite`` of its bytes,
so a reader that sees the mark sees the bytes; two processes that fill the same page write the same bytes.

Bytes are reserved before they are written: when the count would pass ``budget`` the least recently
used entries (by their ``.bits`` file's mtime) are unlinked until it fits. A process that has an evicted
entry open keeps using its own (unlinked) copy; its disk space comes back when the last process closes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import logging
import mmap
import os
import shutil
import struct
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .claims import Claims
from .mapping import PAGE, allocate, run_pages
from .object_links import reset_in_child
from .tempfiles import abandoned, lock_named, lock_within, locked_temporary

__all__ = ["NodeCache", "CachedObject", "default_cache_dir", "default_cache_bytes", "budget_directory", "charge",
           "temporary", "used", "run_pages"]

_log = logging.getLogger(__name__)

_MAGIC = b"SQCACHE1"
_HEADER = 4096
_EVICTED = ".tmp-evicted-"  # a store's metadata directory being deleted (renamed so; _entries skips .tmp-)
_PIN = ".pin"  # in a store's metadata directory: flock'd shared by each open store reading it (NodeCache.pin)


#: directories whose files count against a node cache's budget (a remote store's derived arrays):
#: directory -> cache; writers of O(N) files call :func:`charge` before writing one there
_budgeted: dict[str, NodeCache] = {}


def budget_directory(path: str | os.PathLike[str], cache: NodeCache) -> None:
    """Count files written directly in directory ``path`` against ``cache``'s budget (see :func:`charge`)."""
    _budgeted[os.fspath(path)] = cache


def charge(path: str | os.PathLike[str], nbytes: int) -> None:
    """Before writing a file of ``nbytes`` at ``path``: reserve its disk space in the node cache whose
    budget covers its directory (evicting others first); nothing for other directories."""
    cache = _budgeted.get(os.fspath(Path(path).parent))
    if cache is not None:
        cache.reserve(-(-int(nbytes) // PAGE) * PAGE)


def used(path: str | os.PathLike[str]) -> None:
    """A file at ``path`` was opened again: where a node cache's budget covers its directory, mark it
    recently used (evictions take the least recently used first, by mtime); nothing for other directories."""
    if os.fspath(Path(path).parent) in _budgeted:
        with contextlib.suppress(OSError):
            os.utime(path)


def temporary(path: str | os.PathLike[str]) -> tuple[int, str]:
    """A new temporary file ``.<name>.tmp-*`` beside ``path`` and its descriptor, flock'd until closed
    (:func:`~.tempfiles.locked_temporary`). Where a node cache's budget covers its directory it is made
    under that cache's lock, as evictions delete those (``derived/*/.*.npy.tmp-*``) that no process holds."""
    cache = _budgeted.get(os.fspath(Path(path).parent))
    with cache.locked() if cache is not None else contextlib.nullcontext():
        return locked_temporary(path)


def default_cache_dir() -> Path:
    env = os.environ.get("SEQSTORE_CACHE_DIR")
    if env:
        return Path(os.path.expanduser(env))
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")) / "seqstore"


def _cache_root(root: str | os.PathLike[str] | None) -> Path:
    """The cache directory ``root`` names (``~`` and ``~user`` expanded, as a shell would), or the default."""
    return Path(os.path.expanduser(root)) if root is not None else default_cache_dir()


def default_cache_bytes() -> int:
    env = os.environ.get("SEQSTORE_CACHE_BYTES")
    return _parse_bytes(env, "SEQSTORE_CACHE_BYTES") if env else 16 << 30


def _parse_bytes(text: str, what: str) -> int:
    t = text.strip().upper().replace("IB", "").replace("B", "")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if t[-1:] in "KMGT" else t) * mult)
    except (ValueError, OverflowError):  # (OverflowError: inf)
        raise ValueError(f"{what}: expected a byte count such as 10G or 500000000, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"{what}: must be positive, got {text!r}")
    return value


def _budget(budget: int | str | None) -> int:
    """The byte budget ``cache_bytes`` names (None: the default)."""
    if budget is None:
        return default_cache_bytes()
    if isinstance(budget, str):
        return _parse_bytes(budget, "cache_bytes")
    try:
        if isinstance(budget, bool):  # (True is no byte count)
            raise TypeError
        value = int(budget)
    except (TypeError, ValueError, OverflowError):  # e.g. nan, inf, a list: named, not int()'s bare error
        raise ValueError(f"cache_bytes: expected a byte count such as 10G or 500000000, got {budget!r}") from None
    if value <= 0:
        raise ValueError(f"cache_bytes must be positive, got {budget!r}")
    return value


class NodeCache:
    """The cache directory ``root`` with a byte ``budget`` (see the module docstring)."""

    _open: dict[tuple[str, int], NodeCache] = {}
    _open_lock = threading.Lock()

    def __init__(self, root: str | os.PathLike[str] | None = None, budget: int | str | None = None) -> None:
        # absolute: the links materialize makes to entries, and a later chdir, do not depend on the working directory
        self.root = _cache_root(root).absolute()
        self.budget = _budget(budget)
        self._pid = os.getpid()  # (NodeCache.get makes a forked child its own)
        try:
            (self.root / "objects").mkdir(parents=True, exist_ok=True)
            (self.root / "stores").mkdir(exist_ok=True)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot create the seqstore cache directory {self.root}: {exc.strerror}") from exc
        self._lock_path = self.root / "lock"
        self._needs = f"the node cache {self.root} needs file locks (flock): put cache_dir on a local disk"
        self._usage_path = self.root / "usage"
        # open entries of this process; an entry stays open while a mapping of it is alive
        self._objects: weakref.WeakValueDictionary[str, CachedObject] = weakref.WeakValueDictionary()
        self._objects_lock = threading.Lock()
        reset_in_child(self, "_objects_lock")  # (a thread of a process forked meanwhile may hold them)
        reset_in_child(NodeCache, "_open_lock")

    @classmethod
    def get(cls, root: str | os.PathLike[str] | None, budget: int | str | None) -> NodeCache:
        """One NodeCache object per (directory, budget) in a process (made again where it was removed meanwhile)."""
        path = _cache_root(root).resolve()  # (made or not: one key)
        b = _budget(budget)
        key = (str(path), b)
        with cls._open_lock:
            got = cls._open.get(key)
            if got is None or got._pid != os.getpid() or not (got.root / "objects").is_dir():
                got = cls._open[key] = cls(path, b)
        return got

    # ------------------------------------------------------------------------------- accounting

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive against every other process and thread using this cache directory (``flock`` of a descriptor
        opened for this call: one another thread or a forked child shares would not exclude them; LockTimeout
        after ``$SEQSTORE_LOCK_TIMEOUT`` s)."""
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            lock_within(fd, self._lock_path, f"the lock of the node cache {self.root}", self._needs)
            yield
        finally:
            os.close(fd)

    def flock(self, fd: int, op: int, path: Path, *, close: bool = False) -> None:
        """``flock(fd, op)`` of ``path``; a file system refusing locks: an OSError (``fd`` closed if ``close``)."""
        try:
            lock_named(fd, op, path, self._needs)
        except OSError:
            if close:
                os.close(fd)
            raise

    def _read_usage(self) -> int:
        try:
            fd = os.open(self._usage_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0
        try:
            raw = os.pread(fd, 8, 0)
        finally:
            os.close(fd)
        return struct.unpack("<q", raw)[0] if len(raw) == 8 else 0

    def _write_usage(self, value: int) -> None:
        # 8 bytes in place, under the lock: no temporary file and rename (a directory update that cost
        # ~250 us per reservation on a disk-backed cache; this costs ~10 us)
        try:
            fd = os.open(self._usage_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.pwrite(fd, struct.pack("<q", max(0, value)), 0)
            finally:
                os.close(fd)
        except OSError as exc:  # e.g. a full disk: say which (the node cache's byte count), not a bare errno
            raise OSError(exc.errno, f"{exc.strerror}: cannot write the byte count of the node cache {self.root}; "
                          "free space there or lower cache_bytes", str(self._usage_path)) from None

    def disk_usage(self, path: Path | None = None) -> int:
        """Bytes the files under ``path`` (default: the whole cache) take on disk now (allocated blocks),
        counted file by file."""
        total = 0
        for dirpath, _dirs, files in os.walk(self.root if path is None else path):
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
        return total

    def reserve(self, nbytes: int) -> None:
        """Count ``nbytes`` more, evicting least recently used entries first so the count stays within
        the budget. Raises ValueError if ``nbytes`` alone is more than the budget."""
        if nbytes <= 0:
            return
        if nbytes > self.budget:
            raise ValueError(
                f"{self.root}: {nbytes} bytes are needed at once but the cache budget is {self.budget} bytes; "
                "raise cache_bytes (or SEQSTORE_CACHE_BYTES)"
            )
        with self.locked():
            used = self._read_usage() + PAGE  # the usage file itself
            if used + nbytes > self.budget:
                # down to 90% of the budget, so the next reservations need no eviction pass
                used = self._evict(min(self.budget - nbytes, self.budget * 9 // 10))
            self._write_usage(used + nbytes - PAGE)

    def release(self, nbytes: int) -> None:
        """Count ``nbytes`` fewer (pages counted before that are about to be fetched, and counted, again)."""
        if nbytes > 0:
            with self.locked():
                self._write_usage(self._read_usage() - nbytes)

    def pin(self, path: Path) -> int:
        """Keep the metadata directory ``path`` (under ``stores/``) out of every process's evictions: a
        shared ``flock`` of its ``.pin`` file through a descriptor of its own, returned, held until
        :meth:`unpin` closes it (-1, nothing held, where it is gone: the opener, finding it gone, makes it
        again). The wait while an eviction of it holds it is bounded: LockTimeout after
        ``$SEQSTORE_LOCK_TIMEOUT`` s (an eviction stopped there)."""
        for _ in range(8):
            try:
                fd = os.open(path / _PIN, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:
                return -1
            try:
                lock_within(fd, path / _PIN, "the pin of a store's copy in the node cache (held by an eviction)",
                            self._needs, fcntl.LOCK_SH)
            except BaseException:
                os.close(fd)
                raise
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path / _PIN).st_ino == os.fstat(fd).st_ino:  # not one an eviction took meanwhile
                    return fd
            os.close(fd)
        return -1

    @staticmethod
    def unpin(fd: int) -> None:
        """Let evictions take a metadata directory again (the descriptor :meth:`pin` returned)."""
        if fd >= 0:
            os.close(fd)

    @contextlib.contextmanager
    def building(self, tmp: Path) -> Iterator[None]:
        """Make directory ``tmp`` (a ``.tmp-`` name under ``stores/``) for the ``with`` block, and delete it
        after: held meanwhile (an exclusive ``flock`` of its ``.pin``, taken under :meth:`locked`), as
        evictions delete such directories that no process holds."""
        with self.locked():
            tmp.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp / _PIN, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self.flock(fd, fcntl.LOCK_EX, tmp / _PIN, close=True)
        try:
            yield
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            os.close(fd)

    def _entries(self) -> list[tuple[float, Path]]:
        out = []
        objects = (p for sub in (self.root / "objects").iterdir() if sub.is_dir() for p in sub.glob("*.bits"))
        derived = (self.root / "derived").glob("*/*.npy")  # datasets' derived arrays of remote stores
        stores = (p for p in (self.root / "stores").glob("*/*") if ".tmp-" not in p.name)  # (.tmp-: being built)
        for p in itertools.chain(objects, derived, stores):
            with contextlib.suppress(FileNotFoundError):
                out.append((p.stat().st_mtime, p))
        out.sort()
        return out

    def _evict(self, target: int) -> int:
        """Unlink entries, least recently used first, until the cache holds at most ``target`` bytes.
        Returns the bytes held afterwards (recounted from the disk). Called under the lock."""
        for p in (self.root / "stores").glob("*/*.tmp-*"):  # left by an eviction killed part way (a live one,
            if _EVICTED in p.name or abandoned(p / _PIN):  # holding this lock, deletes its own before it ends),
                shutil.rmtree(p, ignore_errors=True)  # or by a process killed building a mirror (see building)
            else:  # empty: killed in building between its mkdir and its .pin (made under this lock)
                with contextlib.suppress(OSError):
                    p.rmdir()
        for p in (self.root / "objects").glob("*/*.bits.tmp-*"):  # by a process killed making an entry (_create)
            if abandoned(p):
                p.with_name(p.name.replace(".bits.tmp-", ".data.tmp-")).unlink(missing_ok=True)
                p.unlink(missing_ok=True)
        for p in (self.root / "derived").glob("*/.*.npy.tmp-*"):  # by a process killed writing one (temporary)
            if abandoned(p):
                p.unlink(missing_ok=True)
        used = self.disk_usage()
        for _mtime, p in self._entries():
            if used <= target:
                break
            if p.suffix in (".npy", ".bits"):  # a derived array; a cache entry's data, page map and claims
                for q in (p,) if p.suffix == ".npy" else (p.with_suffix(".data"), p, p.with_suffix(".claims")):
                    with contextlib.suppress(FileNotFoundError):
                        freed = q.stat().st_blocks * 512
                        q.unlink()
                        used -= freed
            else:  # a store's metadata directory (stores/<url>/<manifest version>): renamed out of the way
                # first (a name _entries skips), so a process opening it sees it whole or not at all
                gone = p.with_name(f"{p.name}{_EVICTED}{os.getpid()}-{threading.get_ident()}")
                try:
                    pin = os.open(p / _PIN, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                except FileNotFoundError:
                    continue
                try:
                    fcntl.flock(pin, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.rename(p, gone)
                except OSError:  # a store reads it (pin), it went meanwhile, or no lock to be had: kept
                    continue
                finally:
                    os.close(pin)
                freed = self.disk_usage(gone)  # (counted as the cache's usage above is: its links too)
                shutil.rmtree(gone, ignore_errors=True)
                used -= freed
        return max(0, used)

    # ---------------------------------------------------------------------------------- entries

    def object(self, url: str, etag: str, size: int) -> CachedObject:
        """The entry of object ``url`` at version ``etag`` (created empty if absent), open in this process."""
        name = hashlib.sha256(f"{url}\0{etag}".encode()).hexdigest()[:40]
        with self._objects_lock:
            got = self._objects.get(name)
            if got is not None and got.alive():
                return got
            got = self._objects[name] = CachedObject(self, name, url, size)
            return got


class CachedObject:
    """One cached object: its sparse data file (descriptor held for writes and mappings) and its page
    map (mapped shared, so every process sees pages the others fetched)."""

    def __init__(self, cache: NodeCache, name: str, url: str, size: int) -> None:
        self.cache = cache
        self.url = url
        self.size = int(size)
        sub = cache.root / "objects" / name[:2]
        sub.mkdir(exist_ok=True)
        self.data_path = sub / f"{name}.data"
        self.bits_path = sub / f"{name}.bits"
        self.pages = -(-self.size // PAGE)
        if not self.bits_path.exists():
            self._create(sub)
        for attempt in range(8):  # the data file and the page map of one making of the entry (see _open)
            if self._open(sub):
                break
            time.sleep(0.005 * (1 << attempt))  # (another process between its two renames: 1.3 s in all)
        else:
            raise OSError(f"{self.url}: its node cache entry ({self.bits_path}, under {cache.root}) was made anew "
                          "by another process each time it was opened, 8 times; try again, or give this process a "
                          "cache_dir of its own")
        self.bits = np.frombuffer(self._bits_map, dtype=np.uint8, count=self.pages, offset=_HEADER)
        # which pages other processes on the node are fetching (mapped when first asked)
        self.claims = Claims(sub / f"{name}.claims", self.pages, self.bits, self.fd, self._make_claims)
        self._ino = os.fstat(self.fd).st_ino
        self.lock = threading.Lock()
        # byte runs requested and not yet arrived (this process), sorted: (start, end, id(future), future)
        self.inflight: list[tuple[int, int, int, Any]] = []
        # aligned chunks (seqstore.io.remote_plan) requested whole and not yet arrived: chunk number -> future
        self.chunk_flight: dict[int, Any] = {}
        reset_in_child(self)
        self._touched = 0.0
        self.touch()

    def reset_after_fork(self) -> None:
        """In a forked child: a free lock, and none of the parent's requests (their answers never come here)."""
        self.lock, self.inflight, self.chunk_flight = threading.Lock(), [], {}

    def _open(self, sub: Path) -> bool:
        """Open the data file and map the page map; False (nothing kept open) where they are not of one
        making: the entry was made anew between the two opens (another process made it at the same
        time, or evicted it and made it again), and pages marked here would be absent from its data."""
        try:
            fd = os.open(self.data_path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:  # evicted between the check and the open: make it again, open it at once
            self._create(sub)
            try:
                fd = os.open(self.data_path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                return False
        try:
            bfd = os.open(self.bits_path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            os.close(fd)
            return False
        try:
            st = os.fstat(bfd)
            whole = st.st_size == _HEADER + self.pages and os.pread(bfd, 8, 0) == _MAGIC
            bits_map = mmap.mmap(bfd, st.st_size) if whole else None
        except OSError:
            os.close(fd)
            raise
        finally:
            os.close(bfd)
        if bits_map is None:  # damaged (e.g. cut short by a power cut after its rename): made again
            os.close(fd)
            self._drop_damaged(st)
            return False
        ino = struct.unpack_from("<Q", bits_map, 16)[0]  # the data file's (0: a page map of an older seqstore)
        if ino and ino != os.fstat(fd).st_ino:
            bits_map.close()
            os.close(fd)
            return False
        self.fd, self._bits_map = fd, bits_map
        return True

    def _drop_damaged(self, st: os.stat_result) -> None:
        """Delete this entry, whose page map (``st``: its status) is not whole, unless it was made anew
        meanwhile: it is only a copy, made again empty by the next open."""
        with self.cache.locked():
            try:
                now = os.stat(self.bits_path)
            except FileNotFoundError:
                return
            if (now.st_ino, now.st_size) != (st.st_ino, st.st_size):
                return
            _log.warning("%s: the node cache's page map of %s is damaged (%d bytes, expected %d, or not a page "
                         "map); dropping the entry (it is fetched again)", self.bits_path, self.url, st.st_size,
                         _HEADER + self.pages)
            freed = self._reserved()  # given back to the byte count: what the making and the fetches counted
            with contextlib.suppress(FileNotFoundError):
                freed += os.stat(self.data_path).st_blocks * 512
            self.data_path.unlink(missing_ok=True)  # (in eviction's order: data, page map, claims)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self.bits_path).st_ino == st.st_ino:  # (not one made meanwhile)
                    self.bits_path.unlink()
                    self.bits_path.with_suffix(".claims").unlink(missing_ok=True)
            self.cache._write_usage(self.cache._read_usage() - freed)

    def _reserved(self) -> int:
        """The bytes a making of this entry counts for its page map and its claims file."""
        return -(-(_HEADER + self.pages) // PAGE) * PAGE + -(-8 * self.pages // PAGE) * PAGE

    def _create(self, sub: Path) -> None:
        """Create the data and page-map files under temporary names and rename them in (bits last:
        an entry exists once its page map does). The temporary page map is made first, under the lock,
        and flock'd until both are renamed: evictions delete the temporary files of a making no process
        holds (:func:`~.tempfiles.abandoned`)."""
        tag = f".tmp-{os.getpid()}-{threading.get_ident()}"
        data_tmp = sub / (self.data_path.name + tag)
        bits_tmp = sub / (self.bits_path.name + tag)
        with self.cache.locked():
            bits = open(bits_tmp, "wb")  # noqa: SIM115  # (closed by the with block below)
            try:
                self.cache.flock(bits.fileno(), fcntl.LOCK_EX, bits_tmp)
            except OSError:
                bits.close()
                bits_tmp.unlink(missing_ok=True)
                raise
        with bits:
            try:
                with open(data_tmp, "wb") as f:
                    f.truncate(self.size)
                    ino = os.fstat(f.fileno()).st_ino  # named in the page map: its pair (a rename keeps it)
                # the page map's disk space, and the claims file's (8 bytes a page, given space as claimed)
                self.cache.reserve(self._reserved())
                bits.write(_MAGIC + struct.pack("<qQ", self.size, ino))
                bits.truncate(_HEADER + self.pages)
                allocate(bits.fileno(), 0, _HEADER + self.pages)  # pages are marked through the mapping
            except OSError as exc:  # e.g. a full disk: say which (the node cache's, not the store's)
                data_tmp.unlink(missing_ok=True)
                bits_tmp.unlink(missing_ok=True)
                if exc.filename is not None:
                    raise
                raise OSError(exc.errno, f"{exc.strerror}: cannot make the node cache's entry of {self.url}; free "
                              f"space under {self.cache.root} or lower cache_bytes", str(self.bits_path)) from None
            os.replace(data_tmp, self.data_path)
            os.replace(bits_tmp, self.bits_path)

    def _make_claims(self) -> bool:
        """Make this entry's (empty) claims file, under the cache's lock, while the entry is still the one in
        the directory; False where it is not (evicted, or made anew): a claims file made then would be
        left beside no page map, which no eviction deletes, or be shared with another making's pages."""
        with self.cache.locked():
            if not self.alive():
                return False
            fd = os.open(self.bits_path.with_suffix(".claims"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            os.close(fd)
            return True

    def alive(self) -> bool:
        """Whether this entry is still the one in the cache directory (not evicted)."""
        try:
            return os.stat(self.data_path).st_ino == self._ino and self.bits_path.exists()
        except FileNotFoundError:
            return False

    def touch(self) -> None:
        """Mark the entry recently used (at most once a second)."""
        now = time.monotonic()
        if now - self._touched > 1.0:
            self._touched = now
            with contextlib.suppress(OSError):
                os.utime(self.bits_path)

    def missing(self, starts: np.ndarray[Any, Any], ends: np.ndarray[Any, Any]) -> tuple[Any, Any]:
        """The parts of page-aligned byte runs ``[starts[i], ends[i])`` (sorted, disjoint, inside the
        object) whose pages are not present, as page-aligned runs (the last clamped to the size)."""
        if len(starts) == 0:
            return starts, ends
        pages = run_pages(starts, ends)
        return self._runs(pages[self.bits[pages] == 0])

    def held(self) -> tuple[Any, Any]:
        """The page-aligned byte runs of the pages present (the last clamped to the size)."""
        return self._runs(np.flatnonzero(self.bits))

    def _runs(self, pages: np.ndarray[Any, Any]) -> tuple[Any, Any]:
        """Sorted page numbers ``pages`` as page-aligned byte runs of consecutive pages (clamped to the size)."""
        if len(pages) == 0:
            return pages, pages
        cut = np.flatnonzero(np.diff(pages) != 1) + 1
        firsts = np.concatenate(([pages[0]], pages[cut]))
        lasts = np.concatenate((pages[cut - 1], [pages[-1]])) + 1
        return firsts * PAGE, np.minimum(lasts * PAGE, self.size)

    def fill(self, start: int, data: memoryview) -> None:
        """Write the object's bytes ``data`` at ``start`` and mark the pages they cover whole present
        (a last, partial page counts when the data reaches the end of the object)."""
        view = memoryview(data).cast("B")
        n = len(view)
        done = 0
        try:
            while done < n:
                done += os.pwrite(self.fd, view[done:], start + done)
        except OSError as exc:  # e.g. a full disk: say which (the node cache's, not the store's)
            raise OSError(exc.errno, f"{exc.strerror}: cannot write the node cache's copy of {self.url}; free space "
                          f"under {self.cache.root} or lower cache_bytes", str(self.data_path)) from None
        first = -(-start // PAGE)
        end = start + n
        last = end // PAGE if end < self.size else self.pages
        self.bits[first:last] = 1  # (nothing where last <= first: no whole page)
        self.touch()

    def present(self, start: int, end: int) -> bool:
        if end <= start:
            return True
        return bool(self.bits[start // PAGE : -(-end // PAGE)].all())

    def close(self) -> None:
        if hasattr(self, "claims"):
            self.claims.close()
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            self.close()
