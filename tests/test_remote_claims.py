"""Processes sharing a node cache fetch a page once: claims (seqstore.io.claims).

The reads go through the request-counting proxy of tests/support/proxy.py in front of moto. A claim
by a live process (here a ``sleep`` standing in for a loader worker) is waited for, not fetched again;
once that process is gone the reader fetches the pages itself; a claim left by a process that exited
is not waited for; and two processes that read the same records at the same moment move the bytes
once between them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.proxy import FaultProxy
from support.s3 import MotoS3
from support.tmpfs import run_on_small_tmpfs

pytest.importorskip("obstore")

import seqstore as ss  # noqa: E402

pytestmark = pytest.mark.timeout(300)
PREFIX = "claims/main.seqstore"
N, DIM = 4095, 256  # 1 KiB records, 4 MiB of values in one shard, the file ending mid-page


@pytest.fixture(scope="module")
def values() -> np.ndarray[Any, Any]:
    return np.random.default_rng(5).standard_normal((N, DIM)).astype(np.float32)


@pytest.fixture(scope="module")
def remote(moto_s3: MotoS3, tmp_path_factory: pytest.TempPathFactory, values: np.ndarray[Any, Any]) -> Iterator[str]:
    local = tmp_path_factory.mktemp("claims") / "main.seqstore"
    with ss.create(local, {"v": ss.Field("float32", (DIM,))}) as w:
        w.append_batch({"v": values})
    bucket = moto_s3.new_bucket("claims")
    yield moto_s3.upload_dir(local, bucket, PREFIX)
    moto_s3.delete_bucket(bucket)


def _entry(store: ss.Store, cache: Path) -> Any:
    """The region (cache entry, key) of the store's values file in node cache ``cache``, once mapped."""
    store.get_batch([0])
    regions = [r for r in store.source.fetcher.regions() if r.key.endswith("v.npy") and r.obj.cache.root == cache]
    assert len(regions) == 1, regions
    return regions[0]


def _claim_all(obj: Any, pid: int, seconds: float) -> None:
    """Write claims of process ``pid`` on every page of cache entry ``obj``, as that process would."""
    words = obj.claims._open()
    assert words is not None
    words[:] = np.uint64(pid * (1 << 32) + int(time.time() + seconds))


def _reader_and_claimer(moto_s3: MotoS3, remote: str, proxy: FaultProxy, cache: Path,
                        **options: Any) -> tuple[ss.Store, Any, subprocess.Popen[bytes]]:
    """The store read through ``proxy`` with node cache ``cache``, its values file's region, and a live
    process (a ``sleep``) to stand for another process of the node that claims pages."""
    store = ss.open(remote, storage_options=moto_s3.storage_options(proxy.url, **options), cache_dir=cache)
    region = _entry(store, cache)
    return store, region, subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _gets(proxy: FaultProxy, key: str) -> list[Any]:
    return [r for r in proxy.requests if r.method == "GET" and r.path.endswith(key)]


def test_a_live_process_s_claim_is_waited_for_and_taken_over_once_it_exits(
        moto_s3: MotoS3, remote: str, tmp_path: Path, values: np.ndarray[Any, Any]) -> None:
    with FaultProxy(moto_s3.endpoint) as proxy:
        store, region, sleeper = _reader_and_claimer(moto_s3, remote, proxy, tmp_path / "cache")
        try:
            _claim_all(region.obj, sleeper.pid, 60)
            before = len(_gets(proxy, "v.npy"))
            idx = np.arange(100, 3000, 7)
            store.prefetch(idx)  # all claimed by a live process: nothing is asked for
            time.sleep(0.3)
            assert len(_gets(proxy, "v.npy")) == before
            threading.Timer(0.5, sleeper.kill).start()
            t0 = time.monotonic()
            got = store.get_batch(idx)["v"]  # waits for the claimer, which exits: then fetched here
            assert time.monotonic() - t0 >= 0.4
        finally:
            sleeper.kill()
            sleeper.wait()
        np.testing.assert_array_equal(got, values[idx])
        assert len(_gets(proxy, "v.npy")) > before


def test_pages_around_a_claim_are_fetched_up_to_the_object_s_end(
        moto_s3: MotoS3, remote: str, tmp_path: Path, values: np.ndarray[Any, Any]) -> None:
    """Claims by another process in the middle of a run split it; the part that ends the object ends
    where the object does (its last page is partial), not a page later: that request would be answered
    short and retried until it failed."""
    with FaultProxy(moto_s3.endpoint) as proxy:
        store, region, sleeper = _reader_and_claimer(moto_s3, remote, proxy, tmp_path / "cache", retry_timeout=3)
        try:
            assert region.obj.size % 4096, "the values file should end in a partial page"
            words = region.obj.claims._open()
            words[100:200] = np.uint64(sleeper.pid * (1 << 32) + int(time.time() + 60))
            threading.Timer(0.5, sleeper.kill).start()
            idx = np.arange(N)
            got = store.get_batch(idx)["v"]
        finally:
            sleeper.kill()
            sleeper.wait()
        np.testing.assert_array_equal(got, values)
        last = [r.byte_range[1] for r in _gets(proxy, "v.npy") if r.byte_range is not None]  # inclusive
        assert last and max(last) < region.obj.size, (max(last), region.obj.size)  # nothing asked past the end


def test_a_claim_given_back_is_not_waited_for_to_its_deadline(
        moto_s3: MotoS3, remote: str, tmp_path: Path, values: np.ndarray[Any, Any]) -> None:
    """A claimer whose request failed gives its claims back and lives on: the waiter fetches the pages
    itself, long before the claims' deadline (60 s here)."""
    with FaultProxy(moto_s3.endpoint) as proxy:
        store, region, sleeper = _reader_and_claimer(moto_s3, remote, proxy, tmp_path / "cache")
        try:
            _claim_all(region.obj, sleeper.pid, 60)
            idx = np.arange(2000, 4000, 3)
            got: list[Any] = []
            reader = threading.Thread(target=lambda: got.append(store.get_batch(idx)["v"]), daemon=True)
            reader.start()
            time.sleep(0.3)
            assert reader.is_alive()  # waiting for the claimer
            region.obj.claims._open()[:] = 0  # the claimer gives its claims back (its request failed)
            reader.join(timeout=20)
            assert not reader.is_alive() and sleeper.poll() is None  # done while the claimer still runs
        finally:
            sleeper.kill()
            sleeper.wait()
        np.testing.assert_array_equal(got[0], values[idx])


def test_the_claim_of_a_process_that_exited_is_not_waited_for(
        moto_s3: MotoS3, remote: str, tmp_path: Path, values: np.ndarray[Any, Any]) -> None:
    with FaultProxy(moto_s3.endpoint) as proxy:
        store = ss.open(remote, storage_options=moto_s3.storage_options(proxy.url), cache_dir=tmp_path / "cache")
        region = _entry(store, tmp_path / "cache")
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
        _claim_all(region.obj, int(gone.stdout), 60)
        before = len(_gets(proxy, "v.npy"))
        idx = np.arange(0, N, 5)
        store.prefetch(idx)  # the claimer is gone: asked for at once
        time.sleep(0.3)
        assert len(_gets(proxy, "v.npy")) > before
        np.testing.assert_array_equal(store.get_batch(idx)["v"], values[idx])


_READER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import seqstore as ss
    url, options, cache = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    store = ss.open(url, storage_options=options, cache_dir=cache)
    store.get_batch([0])  # the shard set up before the common start
    idx = np.arange(1, 4095, 2)
    print("ready", flush=True)
    sys.stdin.readline()  # go
    v = store.get_batch(idx)["v"]
    print(float(v.astype(np.float64).sum()), flush=True)
""")


def test_two_processes_reading_the_same_records_at_once_move_them_once(
        moto_s3: MotoS3, remote: str, tmp_path: Path, values: np.ndarray[Any, Any]) -> None:
    import json

    with FaultProxy(moto_s3.endpoint, latency=0.3) as proxy:  # answers take long: both ask while in flight
        options = json.dumps(moto_s3.storage_options(proxy.url))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        procs = [
            subprocess.Popen([sys.executable, "-c", _READER, remote, options, str(tmp_path / "cache")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            for _ in range(2)
        ]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:  # both at once
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        sums = [float(p.communicate(timeout=120)[0]) for p in procs]
        assert [p.returncode for p in procs] == [0, 0]
        moved = sum(r.body_bytes for r in _gets(proxy, "v.npy"))
    want = float(values[1::2].astype(np.float64).sum())
    assert sums == [want, want]
    pages = values.nbytes  # every other 1 KiB record: every page of the file
    assert moved < 1.3 * pages, (moved, pages)  # once (and the headers), not once per process


_WHOLE = textwrap.dedent("""
    import hashlib, json, sys
    import seqstore as ss
    url, options, cache, how = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
    remote = ss.open(url, storage_options=options, cache_dir=cache)._source.remote
    key = "shard-000000/v.npy"
    remote._meta(key)  # its size, ETag and head: set up before the common start
    print("ready", flush=True)
    sys.stdin.readline()  # go
    remote.refetch([key]) if how == "refetch" else remote.materialize([key])
    print(hashlib.sha256((remote.mirror / key).read_bytes()).hexdigest(), flush=True)
""")


@pytest.mark.parametrize("how", ["materialize", "refetch"])
def test_two_processes_fetching_a_whole_object_at_once_move_it_once(
        moto_s3: MotoS3, remote: str, tmp_path: Path, how: str) -> None:
    """``materialize`` (verify's whole-object fetch) and ``refetch`` (a copy found damaged) took no claims:
    two processes of the node doing it at once each moved the whole object, and a refetch marked absent
    pages another process had just fetched again."""
    import hashlib
    import json

    key = "shard-000000/v.npy"
    cache = tmp_path / "cache"
    first = ss.open(remote, storage_options=moto_s3.storage_options(), cache_dir=cache)._source.remote
    if how == "refetch":
        first.materialize([key])  # the node holds the whole copy (taken as found damaged by both)
    size = first._meta(key).size
    want = hashlib.sha256(moto_s3.get(remote.split("/")[2], f"{PREFIX}/{key}")).hexdigest()
    with FaultProxy(moto_s3.endpoint, latency=0.3) as proxy:  # answers take long: both ask while in flight
        options = json.dumps(moto_s3.storage_options(proxy.url))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        procs = [subprocess.Popen([sys.executable, "-c", _WHOLE, remote, options, str(cache), how],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        before = sum(r.body_bytes for r in _gets(proxy, "v.npy"))
        for p in procs:  # both at once
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        digests = [p.communicate(timeout=120)[0].strip() for p in procs]
        assert [p.returncode for p in procs] == [0, 0]
        moved = sum(r.body_bytes for r in _gets(proxy, "v.npy")) - before
    assert digests == [want, want]
    assert moved < 1.3 * size, (moved, size)  # once, not once per process


_FULL_DISK = """
import errno, os, sys
import numpy as np
from seqstore.io.nodecache import NodeCache

root = sys.argv[1]
cache = NodeCache(os.path.join(root, "cache"), 1 << 30)
obj = cache.object("s3://bucket/key", '"tag"', 64 << 20)  # 16384 pages: claims and page map mostly holes
fd = os.open(os.path.join(root, "filler"), os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, bytes(4096))
except OSError as exc:
    assert exc.errno == errno.ENOSPC, exc
mine, wait = obj.claims.take(np.arange(9000, 9010), 10.0)  # a write into a hole of the claims file
assert mine.all() and wait is None
obj.claims.give_back(np.arange(9000, 9010))
os.ftruncate(fd, 0)  # room for one page of data, none for the page map's next block
os.write(fd, bytes(4096 * (os.statvfs(root).f_bavail - 1)))
obj.fill(12000 * 4096, memoryview(bytes(4096)))
assert obj.present(12000 * 4096, 12001 * 4096)
try:  # no room for another page: an error naming the cache's file
    obj.fill(13000 * 4096, memoryview(bytes(4096)))
except OSError as exc:
    assert exc.errno == errno.ENOSPC and str(obj.data_path) in str(exc), str(exc)
else:
    raise AssertionError("a page written to a full disk")
assert not obj.present(13000 * 4096, 13001 * 4096)
print("alive")
"""


def test_a_full_cache_disk_is_an_error_not_a_crash(tmp_path: Path) -> None:
    """On a cache file system with no room left, claiming pages and marking a fetched page present write
    into holes of mapped files: that must raise (or fall back), never end the process with SIGBUS. Runs in
    a mount namespace of its own with a 1 MiB tmpfs (skipped where user namespaces are not allowed)."""
    disk, got = run_on_small_tmpfs(_FULL_DISK, tmp_path, "1m")
    assert got.returncode == 0 and "alive" in got.stdout, (got.returncode, got.stdout, got.stderr[-2000:])


_FULL_DISK_ENTRY = """
import errno, os, sys
from seqstore.io.nodecache import NodeCache

root = sys.argv[1]
cache = NodeCache(os.path.join(root, "cache"), 1 << 30)
fd = os.open(os.path.join(root, "filler"), os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, bytes(4096))
except OSError as exc:
    assert exc.errno == errno.ENOSPC, exc
os.ftruncate(fd, os.fstat(fd).st_size - 8 * 4096)  # room for a few pages, not for a 64 KiB page map
try:
    cache.object("s3://bucket/key", '"tag"', 1 << 28)
except OSError as exc:
    assert exc.errno == errno.ENOSPC and "s3://bucket/key" in str(exc) and str(cache.root) in str(exc), str(exc)
else:
    raise AssertionError("a cache entry made on a full disk")
left = [f for _, _, files in os.walk(os.path.join(root, "cache", "objects")) for f in files]
assert left == [], left  # its temporary files are gone
print("alive")
"""


def test_a_cache_entry_that_does_not_fit_on_the_disk_is_a_named_error(tmp_path: Path) -> None:
    """Making a cache entry whose page map finds no room on the cache's file system raised a bare
    ``OSError(28, 'No space left on device')``, naming neither the object nor the cache, and left its
    temporary files behind."""
    disk, got = run_on_small_tmpfs(_FULL_DISK_ENTRY, tmp_path, "1m")
    assert got.returncode == 0 and "alive" in got.stdout, (got.returncode, got.stdout, got.stderr[-2000:])


def test_an_entry_made_again_between_the_opens_of_its_files_is_not_mixed_up(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process makes the same cache entry anew (both found none at once, or it was evicted and made
    again) just after this one opened the data file and before it opened the page map: the renames swap
    both files. The pages this process then marks present must be in the data file that page map
    belongs to; else every other process reads zeros as fetched bytes."""
    from seqstore.io import nodecache
    from seqstore.io.mapping import PAGE

    url, tag, size = "s3://bucket/key", '"tag"', 1 << 20
    mine, other = nodecache.NodeCache(tmp_path, 1 << 30), nodecache.NodeCache(tmp_path, 1 << 30)
    real_open = os.open
    made: list[Any] = []

    def open_then_race(path: Any, flags: int, *more: Any) -> int:
        fd = real_open(path, flags, *more)
        if str(path).endswith(".data") and not made:
            made.append(path)
            racer = object.__new__(nodecache.CachedObject)  # the other process, in the middle of its _create
            racer.cache, racer.size, racer.pages = other, size, size // PAGE
            racer.data_path, racer.bits_path = Path(path), Path(str(path)[: -len(".data")] + ".bits")
            nodecache.CachedObject._create(racer, Path(path).parent)
        return fd

    monkeypatch.setattr(nodecache.os, "open", open_then_race)
    entry = mine.object(url, tag, size)
    monkeypatch.setattr(nodecache.os, "open", real_open)
    assert made
    entry.fill(0, memoryview(b"\7" * PAGE))  # a page this process fetched
    seen = nodecache.NodeCache(tmp_path, 1 << 30).object(url, tag, size)  # a third process
    assert not seen.present(0, PAGE) or os.pread(seen.fd, PAGE, 0) == b"\7" * PAGE, "a page marked, its bytes zeros"


def test_claims_of_a_fetch_that_could_not_start_are_given_back(moto_s3: MotoS3, remote: str, tmp_path: Path) -> None:
    """A fetch that fails before its requests are sent (here: it needs more bytes at once than the cache's
    budget) leaves no claims behind: other processes would wait for them until their deadline."""
    cache = tmp_path / "cache"
    store = ss.open(remote, storage_options=moto_s3.storage_options(), cache_dir=cache, cache_bytes=1 << 20)
    region = _entry(store, cache)
    with pytest.raises(ValueError, match="cache budget"):
        store.get_batch(np.arange(N))  # 4 MiB of values at once
    words = region.obj.claims._open()
    assert words is not None
    absent = region.obj.bits == 0  # (pages fetched keep their claims until the deadline: they are present)
    assert absent.any()
    assert not (words[absent] // (1 << 32) == os.getpid()).any(), "claims left by a fetch that never started"


@pytest.mark.parametrize("damage", ["empty", "short", "magic"])
def test_a_damaged_page_map_is_made_again_not_an_error_for_ever(tmp_path: Path, damage: str) -> None:
    """A cache entry's page map left damaged (empty or cut short, as a power cut after its rename can leave
    it, or overwritten) made every open of the object raise until someone deleted the cache by hand: it
    is only a copy, so it is dropped and made again, empty, and nothing of it is served."""
    from seqstore.io.nodecache import NodeCache

    url, tag, size = "s3://bucket/key", '"tag"', 1 << 20
    obj = NodeCache(tmp_path, 1 << 30).object(url, tag, size)
    obj.fill(0, memoryview(bytes(range(256)) * 64))
    assert obj.present(0, 16384)
    bits = obj.bits_path
    obj.close()
    raw = bits.read_bytes()
    bits.write_bytes({"empty": b"", "short": raw[:4096], "magic": b"X" * 8 + raw[8:]}[damage])
    again = NodeCache(tmp_path, 1 << 30).object(url, tag, size)  # (another process's view of the cache)
    assert not again.present(0, 4096)
    assert again.missing(np.array([0]), np.array([size]))[0].tolist() == [0]
    again.fill(0, memoryview(bytes(4096)))
    assert again.present(0, 4096)


def test_a_damaged_entry_dropped_gives_its_bytes_back_to_the_count(tmp_path: Path) -> None:
    """An entry dropped for a damaged page map went from the disk but not from the cache's byte count: its
    fetched pages and its page map were counted again as the entry was made and filled anew."""
    from seqstore.io.nodecache import NodeCache

    url, tag, size = "s3://bucket/key", '"tag"', 1 << 20
    cache = NodeCache(tmp_path, 1 << 30)
    obj = cache.object(url, tag, size)
    made = cache._read_usage()  # (the page map's and the claims' space)
    cache.reserve(16384)  # as a fetch does before it writes
    obj.fill(0, memoryview(bytes(range(256)) * 64))
    obj.close()
    obj.bits_path.write_bytes(b"")  # damaged
    again = NodeCache(tmp_path, 1 << 30).object(url, tag, size)  # (another process's view of the cache)
    assert not again.present(0, 4096)
    assert cache._read_usage() == made  # the old entry's bytes given back, the new one's page map counted


@pytest.mark.timeout(60)
def test_claims_locked_by_a_stopped_process_are_not_waited_for_for_ever(tmp_path: Path) -> None:
    """A process stopped (SIGSTOP, a hung network file system) while it held the lock of an entry's claims
    held up every process reading that entry for ever: the lock was waited for without a limit. Claims
    are advice: after one request's time the pages are fetched as without them."""
    from seqstore.io.claims import Claims

    data = tmp_path / "entry.data"
    data.write_bytes(bytes(8 * 4096))
    fd = os.open(data, os.O_RDWR)
    hold = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX);"
            " print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(data)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        claims = Claims(tmp_path / "entry.claims", 8, np.zeros(8, dtype=np.uint8), fd)
        mine, wait = claims.take(np.arange(8), 0.2)
        assert mine.all() and wait is None
        claims.give_back(np.arange(8))
    finally:
        holder.communicate("", timeout=10)
        os.close(fd)
