"""Errors of a remote store's node cache: a full cache disk, an entry that cannot be opened, a copy
fetched again that does not fit the budget. Each names the store's URL and the cache, and leaves no
temporary file behind."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.forks import AWAIT_CHILD, fork_holding, run_forking
from support.s3 import MotoS3
from support.tmpfs import run_on_small_tmpfs

pytest.importorskip("seqstore.io.remote")

import seqstore as ss  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _uploaded(moto_s3: MotoS3, bucket: str, tmp_path: Path, prefix: str, records: int = 40) -> str:
    root = tmp_path / "s.seqstore"
    with ss.create(root, {"v": ss.Field("int64")}, max_shard_records=10) as w:
        w.append_batch({"v": np.arange(records)})
    return moto_s3.upload_dir(root, bucket, f"{prefix}/s.seqstore")


_FULL_MIRROR = """
import errno, json, os, sys
import seqstore as ss

root = sys.argv[1]
url, opts = json.loads(%r)
cache = os.path.join(root, "cache")
fd = os.open(os.path.join(root, "filler"), os.O_WRONLY | os.O_CREAT)


def fill():
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc


def refused(call, what):
    try:
        call()
    except OSError as exc:
        assert exc.errno == errno.ENOSPC and url in str(exc) and cache in str(exc), repr(exc)
    else:
        raise AssertionError(what + " written to a full disk")
    left = [f for d, _, files in os.walk(os.path.join(cache, "stores")) for f in files + d.split(os.sep)
            if ".tmp-" in f]
    assert left == [], left


os.makedirs(cache)
fill()
refused(lambda: ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=1 << 30), "a store's mirror")
os.ftruncate(fd, 0)
store = ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=1 << 30)
fill()
refused(lambda: store.get_batch([0]), "a shard's metadata")
print("alive")
"""


def test_a_mirror_file_written_on_a_full_cache_disk_is_a_named_error_and_leaves_nothing(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    """Writing a shard's descriptor or saved object sizes into the store's mirror on a full cache disk
    raised a bare ``OSError(28)`` naming a temporary file, and left that ``.<name>.tmp-*`` file in the
    mirror for ever (no eviction deletes it)."""
    url = _uploaded(moto_s3, s3_bucket, tmp_path, "full")
    script = _FULL_MIRROR % json.dumps([url, moto_s3.storage_options()])
    _disk, got = run_on_small_tmpfs(script, tmp_path, "1m")
    assert got.returncode == 0 and "alive" in got.stdout, (got.returncode, got.stdout, got.stderr[-2000:])


def test_an_entry_made_anew_at_every_open_is_an_error_naming_the_object(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process makes a cache entry anew between the opens of its two files, every time: the error
    named only the hashed page-map path, not the object whose entry it is."""
    from seqstore.io import nodecache
    from seqstore.io.mapping import PAGE

    url, tag, size = "s3://bucket/racy-key", '"tag"', 1 << 16
    mine, other = nodecache.NodeCache(tmp_path, 1 << 30), nodecache.NodeCache(tmp_path, 1 << 30)
    real_open = os.open

    def open_then_race(path: Any, flags: int, *more: Any) -> int:
        fd = real_open(path, flags, *more)
        if str(path).endswith(".data"):  # the other process, making the entry anew between the two opens
            racer = object.__new__(nodecache.CachedObject)
            racer.cache, racer.size, racer.pages = other, size, size // PAGE
            racer.data_path, racer.bits_path = Path(path), Path(str(path)[: -len(".data")] + ".bits")
            nodecache.CachedObject._create(racer, Path(path).parent)
        return fd

    monkeypatch.setattr(nodecache.os, "open", open_then_race)
    monkeypatch.setattr(nodecache.time, "sleep", lambda s: None)
    with pytest.raises(OSError, match="made anew") as got:
        mine.object(url, tag, size)
    assert url in str(got.value) and str(tmp_path) in str(got.value)


def test_a_shard_mapped_again_after_its_object_changed_is_a_stale_store_error(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    """A shard read before its object was replaced, dropped from the mapped shards and mapped again: the
    object's new ETag differs from the one read before. That was a ``CorruptionError`` saying only "the
    object changed while it was read"; docs/remote.md promises ``StaleStoreError`` (reopen the store)."""
    from seqstore.errors import StaleStoreError
    from seqstore.format.npy import read_header

    root = tmp_path / "s.seqstore"
    with ss.create(root, {"v": ss.Field("int64")}, max_shard_records=1000) as w:
        w.append_batch({"v": np.arange(2000)})
    url = moto_s3.upload_dir(root, s3_bucket, "changed/s.seqstore")
    opts, cache = moto_s3.storage_options(), tmp_path / "cache"
    store = ss.open(url, storage_options=opts, cache_dir=cache, max_mapped_shards=1)
    assert int(store.get_batch([0])["v"][0]) == 0
    name = store.manifest.shards[0].name
    raw = bytearray((root / name / "v.npy").read_bytes())
    at = read_header(root / name / "v.npy").data_offset
    raw[at : at + 8] = np.array([7], "<i8").tobytes()  # record 0 is 7 now: other bytes, the same size
    moto_s3.put(s3_bucket, f"changed/s.seqstore/{name}/v.npy", bytes(raw))
    with pytest.raises(StaleStoreError):
        store.get_batch([999])  # a page not fetched yet, asked for at the ETag read before
    store.get_batch([1500])  # shard 0 dropped
    with pytest.raises(StaleStoreError, match="reopen") as got:
        store.get_batch([0])  # mapped again: the object's ETag is not the one read before
    assert f"{url}/{name}/v.npy" in str(got.value)
    again = ss.open(url, storage_options=opts, cache_dir=cache, max_mapped_shards=1)
    assert int(again.get_batch([0])["v"][0]) == 7


def test_damaged_offsets_of_an_object_larger_than_the_cache_are_fetched_again(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    """A ragged field's offsets damaged in the node cache's copy are fetched again once; where the offsets
    object is larger than ``cache_bytes`` that raised ValueError ("bytes are needed at once but the cache
    budget is ..."): the whole object was fetched in one wave. Only the pages the copy held are fetched
    again, in waves within the budget."""
    n, budget = 200_000, 1 << 20  # 1.6 MB of offsets
    root = tmp_path / "big.seqstore"
    with ss.create(root, {"t": ss.Field("int8", (None,))}, max_shard_records=n) as w:
        w.append_batch({"t": (np.arange(n, dtype=np.int64).astype(np.int8), np.ones(n, np.int64))})
    url = moto_s3.upload_dir(root, s3_bucket, "bigoffs/s.seqstore")
    opts, cache = moto_s3.storage_options(max_retries=1), tmp_path / "cache"
    first = ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=budget)
    assert first.get_batch([8])["t"][0].tolist() == [8]
    (rel,) = [p.relative_to(root).as_posix() for p in root.rglob("t.offsets.npy")]
    size = (root / rel).stat().st_size
    assert size > budget
    (copy,) = [p for p in (cache / "objects").glob("*/*.data") if p.stat().st_size == size]
    with open(copy, "r+b") as f:
        f.seek(size - 8)
        f.write(np.array([12345], "<i8").tobytes())
    store = ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=budget)
    values, lengths = store.get_batch([8, n - 1])["t"]
    assert values.tolist() == [8, int(np.int64(n - 1).astype(np.int8))] and lengths.tolist() == [1, 1]
    from seqstore.store.verify import verify

    with pytest.raises(ValueError, match="cache_bytes") as refused:  # a whole file it cannot hold: named
        verify(url, storage_options=opts, cache_dir=cache, cache_bytes=budget)
    assert f"{url}/{rel}" in str(refused.value)


def test_a_relative_cache_dir_is_one_node_cache_in_the_process(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``cache_dir="cache"`` named a new NodeCache at its second use (keyed by the relative path while the
    directory did not exist, by the resolved one after): two stores of one process kept apart the entries
    they share, each fetching what the other had in flight. And the links ``materialize`` (``verify``)
    makes to entries were relative paths taken from the working directory: they led nowhere."""
    from seqstore.io.nodecache import NodeCache

    url = _uploaded(moto_s3, s3_bucket, tmp_path, "relative")
    monkeypatch.chdir(tmp_path)
    first = NodeCache.get("cache", 1 << 30)
    assert NodeCache.get("cache", 1 << 30) is first
    assert NodeCache.get(tmp_path / "cache", 1 << 30) is first
    remote = ss.open(url, storage_options=moto_s3.storage_options(), cache_dir="cache")._source.remote
    remote.materialize(["shard-000000/v.npy"])
    assert (remote.mirror / "shard-000000/v.npy").stat().st_size > 0


_FULL_USAGE = """
import errno, os, sys
from seqstore.io.nodecache import NodeCache

cache = NodeCache(os.path.join(sys.argv[1], "cache"), 1 << 30)
fd = os.open(os.path.join(sys.argv[1], "filler"), os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, bytes(4096))
except OSError as exc:
    assert exc.errno == errno.ENOSPC, exc
try:
    cache.reserve(4096)
except OSError as exc:
    assert exc.errno == errno.ENOSPC and str(cache.root) in str(exc) and "cache_bytes" in str(exc), repr(exc)
else:
    raise AssertionError("counted on a full disk")
print("alive")
"""


def test_counting_bytes_on_a_full_cache_disk_is_a_named_error(tmp_path: Path) -> None:
    """The node cache's first byte count written on a full disk raised a bare ``OSError(28)`` naming no file
    and no cache directory."""
    _disk, got = run_on_small_tmpfs(_FULL_USAGE, tmp_path, "1m")
    assert got.returncode == 0 and "alive" in got.stdout, (got.returncode, got.stdout, got.stderr[-2000:])


def test_a_cache_dir_starting_with_a_tilde_is_under_the_home_directory(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``cache_dir="~/cache"`` (or ``SEQSTORE_CACHE_DIR=~/cache``) made a directory literally named ``~``
    in the working directory and cached there, not in the home directory."""
    from seqstore.io.nodecache import NodeCache, default_cache_dir

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert NodeCache.get("~/cache", 1 << 30).root == home / "cache"
    assert NodeCache("~/cache2", 1 << 30).root == home / "cache2"
    monkeypatch.setenv("SEQSTORE_CACHE_DIR", "~/env-cache")
    assert default_cache_dir() == home / "env-cache"
    assert NodeCache.get(None, 1 << 30).root == home / "env-cache"
    assert not (work / "~").exists()


def test_a_file_system_refusing_locks_is_named_and_does_not_stop_evictions(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Some network file systems refuse ``flock`` (ENOLCK, ENOSYS, EOPNOTSUPP). The eviction's check of a
    left temporary file (``abandoned``) let that error out of a read that only needed room in the cache,
    and the cache's own lock raised it bare (``[Errno 37] No locks available``, no file, no cache)."""
    import errno
    import fcntl

    from seqstore.io import nodecache

    cache = nodecache.NodeCache(tmp_path / "cache", 1 << 20)
    left = cache.root / "objects" / "ab" / "ab01.bits.tmp-1-2"  # a making's temporary page map
    left.parent.mkdir()
    left.write_bytes(bytes(4096))
    real = fcntl.flock

    def refused_unless_waiting(fd: int, op: int) -> None:  # the probe of a temporary file is refused
        if op & fcntl.LOCK_NB:
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        real(fd, op)

    monkeypatch.setattr(nodecache.fcntl, "flock", refused_unless_waiting)
    cache.reserve(1 << 19)
    cache.reserve(1 << 19)  # (past the budget: an eviction pass, which meets the temporary file)
    assert left.exists()  # (not known abandoned: kept)

    def refused(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(nodecache.fcntl, "flock", refused)
    with pytest.raises(OSError, match="file locks") as got:
        cache.reserve(4096)
    assert got.value.errno == errno.ENOLCK and str(cache.root) in str(got.value)


def test_a_cache_lock_held_by_a_stopped_process_is_a_named_timeout(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A process stopped (SIGSTOP, a hung network file system) while holding the node cache's lock held up
    every reader on the node for ever: the lock was waited for without a limit. After
    ``SEQSTORE_LOCK_TIMEOUT`` seconds it is a LockTimeout naming the cache and the process holding it."""
    import subprocess
    import sys

    from seqstore.errors import LockTimeout
    from seqstore.io.nodecache import NodeCache

    cache = NodeCache(tmp_path / "cache", 1 << 20)
    hold = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX);"
            " print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(cache.root / "lock")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("SEQSTORE_LOCK_TIMEOUT", "0.2")
        with pytest.raises(LockTimeout) as got:
            cache.reserve(4096)
        assert str(cache.root) in str(got.value) and got.value.holder == holder.pid, str(got.value)
    finally:
        holder.communicate("", timeout=10)
    cache.reserve(4096)  # (released: taken at once)


_FORKED_CACHE = """
import os, sys, threading, time
from seqstore.io.nodecache import NodeCache

cache = NodeCache.get(sys.argv[1], 1 << 30)
entry = cache.object("http://h/b/one", "e1", 8192)
""" + fork_holding("cache._objects_lock, entry.claims._lock",
                      "a thread opening another entry does, while it makes its files") + """
if pid == 0:
    entry.claims._words, entry.claims._failed = None, False  # (its claims file opened again in the child)
    entry.claims._open()
    cache.object("http://h/b/two", "e1", 8192)
    os._exit(0)
""" + AWAIT_CHILD


def test_a_child_forked_while_a_thread_held_the_caches_locks_opens_entries(tmp_path: Path) -> None:
    """The node cache's lock of its open entries, and an entry's claims lock, were not made anew in a
    forked child (a DataLoader worker forked while a thread of the parent opened an entry): the child's
    first open of an entry hung for ever."""
    out = run_forking(tmp_path / "forked_cache.py", _FORKED_CACHE, str(tmp_path / "cache"))
    assert out.stdout.strip() == "child 0", (out.stdout, out.stderr[-2000:])


_FORKED_FLIGHT = """
import concurrent.futures, os, sys, threading, time
from seqstore.io.nodecache import NodeCache

cache = NodeCache.get(sys.argv[1], 1 << 30)
entry = cache.object("http://h/b/one", "e1", 1 << 20)
never = concurrent.futures.Future()  # a request of the parent's, in flight at the fork
entry.inflight.append((0, 8192, id(never), never))
entry.chunk_flight[0] = never
""" + fork_holding("entry.lock",
                      "a thread planning a fetch does") + """
if pid == 0:
    with entry.lock:
        os._exit(0 if not entry.inflight and not entry.chunk_flight else 3)
""" + AWAIT_CHILD


def test_a_forked_child_waits_for_none_of_its_parents_requests(tmp_path: Path) -> None:
    """A child forked while its parent fetched pages of an entry (a DataLoader worker forked during a
    read-ahead) inherited the entry's lock, held for ever where a thread held it at the fork, and the
    parent's requests in flight: a read of those pages waited for answers that never come to the child,
    until its limit (600 s). The child has a free lock and no requests of its parent's."""

    out = run_forking(tmp_path / "forked_flight.py", _FORKED_FLIGHT, str(tmp_path / "cache"))
    assert out.stdout.strip() == "child 0", (out.stdout, out.stderr[-2000:])


_FORKED_FETCHER = """
import os, sys, threading, time
from seqstore.io.nodecache import NodeCache
from seqstore.io.objects import ObjectClient
from seqstore.io.remote_fetch import Fetcher

fetcher = Fetcher(ObjectClient("http://127.0.0.1:9/b"), NodeCache.get(sys.argv[1], 1 << 30))
""" + fork_holding("fetcher._lock",
                      "a thread mapping a file of the store does") + """
if pid == 0:
    os._exit(0 if fetcher.regions() == [] else 3)
""" + AWAIT_CHILD


def test_a_child_forked_while_a_thread_held_the_fetchers_lock_reads(tmp_path: Path) -> None:
    """The lock of a remote store's table of mapped files (and of its objects' versions) was not made anew
    in a forked child: a fork while another thread of the parent held it hung the child's first read."""

    out = run_forking(tmp_path / "forked_fetcher.py", _FORKED_FETCHER, str(tmp_path / "cache"))
    assert out.stdout.strip() == "child 0", (out.stdout, out.stderr[-2000:])


def test_a_pin_waited_for_past_the_lock_timeout_is_a_named_timeout(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinning a store's metadata directory waits while an eviction holds its ``.pin`` (a moment); an
    eviction stopped there held every opener of that store up for ever. After ``SEQSTORE_LOCK_TIMEOUT``
    seconds it is a LockTimeout naming the file."""
    import fcntl
    import os
    import threading

    from seqstore.errors import LockTimeout
    from seqstore.io.nodecache import NodeCache

    cache = NodeCache(tmp_path / "cache", 1 << 20)
    mirror = cache.root / "stores" / "x" / "y"
    mirror.mkdir(parents=True)
    held = os.open(mirror / ".pin", os.O_RDWR | os.O_CREAT)  # (an open of its own: the lock excludes this one's pin)
    fcntl.flock(held, fcntl.LOCK_EX)
    monkeypatch.setenv("SEQSTORE_LOCK_TIMEOUT", "0.2")
    got: list[BaseException | int] = []

    def pin() -> None:
        try:
            got.append(cache.pin(mirror))
        except BaseException as exc:  # noqa: BLE001 - what the test looks at
            got.append(exc)

    waiter = threading.Thread(target=pin, daemon=True)
    waiter.start()
    waiter.join(10)
    os.close(held)  # (an old waiter ends now)
    waiter.join(10)
    assert got and isinstance(got[0], LockTimeout), got
    assert str(mirror / ".pin") in str(got[0]) and got[0].path == str(mirror / ".pin"), str(got[0])
    NodeCache.unpin(cache.pin(mirror))  # (released: taken at once)
