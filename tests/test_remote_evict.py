"""The node cache's eviction of a store's mirror (stores/<url>/<version>) by one process while another
opens that store: the opener sees the mirror whole or makes it again, never a manifest without its
shard table nor a mirror gone between its check and its read."""

from __future__ import annotations

import fcntl
import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from support.s3 import MotoS3

pytest.importorskip("seqstore.io.remote")

import seqstore as ss  # noqa: E402
from seqstore.io.nodecache import NodeCache  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def _uploaded(moto_s3: MotoS3, bucket: str, tmp_path: Path, prefix: str, records: int = 100,
              per_shard: int = 10) -> str:
    """The URL of a store of ``records`` int64 values 0, 1, ... (``per_shard`` a shard), written under
    ``tmp_path`` and uploaded to ``s3://bucket/<prefix>/s.seqstore``."""
    root = tmp_path / "s.seqstore"
    with ss.create(root, {"v": ss.Field("int64")}, max_shard_records=per_shard) as w:
        w.append_batch({"v": np.arange(records)})
    return moto_s3.upload_dir(root, bucket, f"{prefix}/s.seqstore")


def _evict_all(cache: NodeCache) -> list[Path]:
    """Evict all that ``cache`` (another process's view of a node cache) may take; the mirrors left."""
    with cache.locked():
        cache._evict(0)
    return list((cache.root / "stores").glob("*/*"))


def _child_env() -> dict[str, str]:
    """The environment of a child Python that imports this seqstore."""
    return {**os.environ, "PYTHONPATH": str(Path(ss.__file__).resolve().parents[1])}


def test_opening_a_store_while_another_process_evicts_its_mirror(moto_s3: MotoS3, s3_bucket: str,
                                                                 tmp_path: Path) -> None:
    url = _uploaded(moto_s3, s3_bucket, tmp_path, "evict")
    opts, cache, budget = moto_s3.storage_options(), tmp_path / "cache", 1 << 20
    ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=budget)
    other = NodeCache(cache, budget)  # as another process sees the cache: this process's pins do not hold there
    stop = threading.Event()

    def evict() -> None:
        while not stop.is_set():
            with other.locked():
                other._evict(0)
            stop.wait(0.001)  # (a pass now and then, as other processes' reservations make them)

    errors: list[str] = []

    def open_many() -> None:
        for _ in range(60):
            try:
                store = ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=budget)
                assert len(store) == 100
            except Exception as exc:  # noqa: BLE001 (collected: every kind of failure is the defect)
                errors.append(f"{type(exc).__name__}: {exc}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # the threads interleave finely (as processes would)
    try:
        evictor = threading.Thread(target=evict)
        evictor.start()
        openers = [threading.Thread(target=open_many) for _ in range(3)]
        for t in openers:
            t.start()
        for t in openers:
            t.join()
    finally:
        stop.set()
        evictor.join()
        sys.setswitchinterval(interval)
    assert not errors, f"{len(errors)} of 180 opens failed, e.g. {errors[0]}"
    assert not [p for p in (cache / "stores").glob("*/*") if ".tmp-" in p.name], "an evicted mirror was left"


def test_a_store_being_read_keeps_its_mirror_while_another_process_evicts(moto_s3: MotoS3, s3_bucket: str,
                                                                          tmp_path: Path) -> None:
    """An open store's mirror was pinned in its own process only: another process's eviction took it, and
    the store's next shard failed ("shard descriptor is missing") though the remote store is fine."""
    url = _uploaded(moto_s3, s3_bucket, tmp_path, "pinned", records=200, per_shard=4)
    opts, cache, budget = moto_s3.storage_options(), tmp_path / "cache", 1 << 20
    store = ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=budget)
    other = NodeCache(cache, budget)  # another process's view of the cache
    stop = threading.Event()

    def evict() -> None:
        while not stop.is_set():
            with other.locked():
                other._evict(0)
            stop.wait(0.001)

    evictor = threading.Thread(target=evict)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    evictor.start()
    try:
        for k in range(0, 200, 4):  # a shard at a time
            assert store.get_batch(np.arange(k, k + 4))["v"].tolist() == list(range(k, k + 4))
    finally:
        stop.set()
        evictor.join()
        sys.setswitchinterval(interval)
    _evict_all(other)  # and not even by an eviction pass of its own
    assert store.get_batch(np.arange(200))["v"].tolist() == list(range(200))


_OPEN = """
import json, sys
import numpy as np, seqstore as ss
url, opts, cache = json.loads(sys.argv[1])
assert len(ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=1 << 20)) == 100
"""

_KILLED_EVICTION = """
import os, signal, sys
from seqstore.io.nodecache import NodeCache
cache = NodeCache(sys.argv[1], 1 << 20)

def hook(event, args):  # SIGKILL the process at its first file removal (in the evicted mirror)
    if event == "os.remove":
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(hook)
with cache.locked():
    cache._evict(0)
"""


def test_a_mirror_whose_eviction_was_killed_is_deleted_by_the_next(moto_s3: MotoS3, s3_bucket: str,
                                                                 tmp_path: Path) -> None:
    """An eviction killed while deleting a store's mirror left it (renamed aside, a name eviction passes
    by) for ever: its disk space counted against the budget and could never be evicted."""
    url = _uploaded(moto_s3, s3_bucket, tmp_path, "killed")
    cache = tmp_path / "cache"
    env = _child_env()
    arg = json.dumps([url, moto_s3.storage_options(), str(cache)])
    subprocess.run([sys.executable, "-c", _OPEN, arg], check=True, timeout=120, env=env)
    proc = subprocess.run([sys.executable, "-c", _KILLED_EVICTION, str(cache)], timeout=120, env=env)
    assert proc.returncode == -signal.SIGKILL
    assert [p.name for p in (cache / "stores").glob("*/*")] != []  # what the killed one left
    assert _evict_all(NodeCache(cache, 1 << 20)) == []


def _pin_descriptors(cache: Path) -> int:
    """.pin files under ``cache`` this process holds open."""
    fds = [os.path.realpath(f"/proc/self/fd/{f}") for f in os.listdir("/proc/self/fd")]
    return sum(1 for f in fds if f.startswith(str(cache.resolve())) and f.endswith("/.pin"))


def test_threads_opening_and_dropping_stores_leave_the_mirror_evictable(moto_s3: MotoS3, s3_bucket: str,
                                                                        tmp_path: Path) -> None:
    """Two threads opening one store at once each pinned its mirror and the process kept one of the two
    .pin descriptors: the other stayed open (its shared flock held) for ever, so no eviction on the node
    could take that mirror."""
    url = _uploaded(moto_s3, s3_bucket, tmp_path, "threads")
    opts, cache, budget = moto_s3.storage_options(), tmp_path / "cache", 1 << 20
    ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=budget)
    start = threading.Barrier(4)

    def open_many() -> None:
        start.wait()
        for _ in range(25):
            assert len(ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=budget)) == 100

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=open_many) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    gc.collect()
    assert _pin_descriptors(cache) == 0
    assert _evict_all(NodeCache(cache, budget)) == []


def test_a_dropped_store_lets_other_processes_evict_its_mirror(moto_s3: MotoS3, s3_bucket: str,
                                                               tmp_path: Path) -> None:
    """A store dropped (del, garbage-collected) kept its mirror pinned until the process exited, and a
    second store of the same URL in the process lost its pin when the first was refreshed or dropped."""
    url = _uploaded(moto_s3, s3_bucket, tmp_path, "dropped")
    opts, cache, budget = moto_s3.storage_options(), tmp_path / "cache", 1 << 20
    other = NodeCache(cache, budget)  # another process's view of the cache

    def evicted() -> bool:
        return _evict_all(other) == []

    first = ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=budget)
    second = ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=budget)
    del first
    gc.collect()
    assert not evicted()  # (the second store still reads it)
    assert second.get_batch(np.arange(100))["v"].tolist() == list(range(100))
    del second
    gc.collect()
    assert evicted()
    assert _pin_descriptors(cache) == 0


_KILLED_BUILD = """
import json, os, signal, sys
import seqstore as ss
url, opts, cache = json.loads(sys.argv[1])

def hook(event, args):  # SIGKILL the process as it writes the manifest into the mirror it builds
    if event == "open" and ".tmp-" in str(args[0]) and str(args[0]).endswith("manifest.json"):
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(hook)
ss.open(url, storage_options=opts, cache_dir=cache, cache_bytes=1 << 20)
"""


def test_a_mirror_whose_building_was_killed_is_deleted_by_the_next_eviction(moto_s3: MotoS3, s3_bucket: str,
                                                                           tmp_path: Path) -> None:
    """A process killed while building a store's mirror left its .tmp- directory for ever: a name eviction
    passes by, its disk space counted against the budget. A mirror being built is kept."""
    url = _uploaded(moto_s3, s3_bucket, tmp_path, "killed-build")
    cache = tmp_path / "cache"
    env = _child_env()
    arg = json.dumps([url, moto_s3.storage_options(), str(cache)])
    proc = subprocess.run([sys.executable, "-c", _KILLED_BUILD, arg], timeout=120, env=env)
    assert proc.returncode == -signal.SIGKILL
    left = [p for p in (cache / "stores").glob("*/*") if ".tmp-" in p.name]
    assert len(left) == 1  # what the killed one left
    other = NodeCache(cache, 1 << 20)
    assert _evict_all(other) == []
    with other.building(left[0]):  # one being built (another process's, alive)
        assert _evict_all(other) == left
    assert list((cache / "stores").glob("*/*")) == []


def test_opening_cache_entries_while_another_process_evicts_them(tmp_path: Path) -> None:
    """An entry evicted between its check and its open was made again, then slept on before it was opened
    (the retry's backoff): evicted again meanwhile, eight times, the open failed ("the cache entry is made
    anew faster than it can be opened") though each making was whole."""
    cache = NodeCache(tmp_path / "cache", 1 << 20)
    other = NodeCache(tmp_path / "cache", 1 << 20)  # another process's view of the cache
    stop = threading.Event()

    def evict() -> None:
        while not stop.is_set():
            with other.locked():
                other._evict(0)

    evictor = threading.Thread(target=evict)
    errors: list[str] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    evictor.start()
    try:
        for i in range(2000):
            try:
                cache.object(f"s3://bucket/object-{i % 5}", "etag", 100_000)
            except OSError as exc:
                errors.append(str(exc))
    finally:
        stop.set()
        evictor.join()
        sys.setswitchinterval(interval)
    assert not errors, f"{len(errors)} of 2000 opens failed, e.g. {errors[0]}"


_KILLED_ENTRY = """
import os, signal, sys
from seqstore.io.nodecache import NodeCache
cache, tmp = sys.argv[1], sys.argv[2]

def hook(event, args):  # SIGKILL the process as it renames one of a new cache entry's files into place
    if event == "os.rename" and tmp in str(args[0]):
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(hook)
NodeCache(cache, 1 << 20).object("s3://bucket/object", "etag", 1 << 26)
"""


@pytest.mark.parametrize("at", [".data.tmp-", ".bits.tmp-"])
def test_a_cache_entry_whose_making_was_killed_is_deleted_by_the_next_eviction(tmp_path: Path, at: str) -> None:
    """A process killed while making a cache entry left its temporary files (the page map's disk space
    counted against the budget) for ever: no eviction took them. One being made is kept."""
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-c", _KILLED_ENTRY, str(cache), at], timeout=120, env=_child_env())
    assert proc.returncode == -signal.SIGKILL
    left = sorted((cache / "objects").glob("*/*.tmp-*"))
    assert any(".bits.tmp-" in p.name for p in left), left  # what the killed one left
    other = NodeCache(cache, 1 << 20)
    with open(next(p for p in left if ".bits.tmp-" in p.name), "rb") as held:  # one being made (alive)
        fcntl.flock(held, fcntl.LOCK_EX)
        _evict_all(other)
        assert sorted((cache / "objects").glob("*/*.tmp-*")) == left
    before = other.disk_usage()
    _evict_all(other)
    assert list((cache / "objects").glob("*/*.tmp-*")) == []
    assert other.disk_usage() <= before - (4096 + (1 << 26) // 4096)  # the page map's blocks came back


_KILLED_DERIVED = """
import os, signal, sys
import numpy as np
from seqstore.data._cache import write_npy
from seqstore.io.nodecache import NodeCache, budget_directory
cache = NodeCache(sys.argv[1], 1 << 24)
derived = cache.root / "derived" / "store"
budget_directory(derived, cache)

def chunks():  # SIGKILL the process part way through writing the derived array
    yield np.arange(1 << 18)
    os.kill(os.getpid(), signal.SIGKILL)

write_npy(derived / "lengths.npy", chunks(), 1 << 19, np.int64)
"""


def test_a_derived_array_whose_writing_was_killed_is_deleted_by_the_next_eviction(tmp_path: Path) -> None:
    """A process killed while writing a remote store's derived array (lengths) left its temporary file,
    counted against the budget, for ever: no eviction took it. One being written is kept."""
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-c", _KILLED_DERIVED, str(cache)], timeout=120, env=_child_env())
    assert proc.returncode == -signal.SIGKILL
    left = sorted((cache / "derived").glob("*/.*.tmp-*"))
    assert len(left) == 1, left
    other = NodeCache(cache, 1 << 24)
    with open(left[0], "rb") as held:  # one being written (alive)
        fcntl.flock(held, fcntl.LOCK_EX)
        _evict_all(other)
        assert sorted((cache / "derived").glob("*/.*.tmp-*")) == left
    _evict_all(other)
    assert list((cache / "derived").glob("*/.*.tmp-*")) == []
    assert other.disk_usage() <= 4096


_KILLED_BUILDING = """
import os, signal, sys
from pathlib import Path
from seqstore.io.nodecache import NodeCache

def hook(event, args):  # SIGKILL the process after it made the directory, as it opens its .pin
    if event == "open" and str(args[0]).endswith(".pin"):
        os.kill(os.getpid(), signal.SIGKILL)

cache = NodeCache(sys.argv[1], 1 << 20)
sys.addaudithook(hook)
with cache.building(cache.root / "stores" / "url" / "v1.tmp-1-1"):
    pass
"""


def test_a_mirror_directory_whose_making_was_killed_before_its_pin_is_deleted_by_the_next_eviction(
        tmp_path: Path) -> None:
    """A process killed between making a mirror's temporary directory and its .pin left the directory
    for ever: no eviction took it. One being built (its .pin held) is kept."""
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-c", _KILLED_BUILDING, str(cache)], timeout=120, env=_child_env())
    assert proc.returncode == -signal.SIGKILL
    assert [p.name for p in (cache / "stores" / "url").iterdir()] == ["v1.tmp-1-1"]
    other = NodeCache(cache, 1 << 20)
    with other.building(cache / "stores" / "url" / "v2.tmp-2-2"):
        _evict_all(other)
        assert [p.name for p in (cache / "stores" / "url").iterdir()] == ["v2.tmp-2-2"]


_KILLED_SORT = """
import importlib, os, signal, sys
import numpy as np
si = importlib.import_module("seqstore.order.sort_index")
from seqstore.io.nodecache import NodeCache, budget_directory
cache = NodeCache(sys.argv[1], 1 << 24)
derived = cache.root / "derived" / "store"
derived.mkdir(parents=True)
budget_directory(derived, cache)
passes = []

def radix_pass(*args):  # SIGKILL the process in the second pass (its output and scratch files made)
    passes.append(1)
    if len(passes) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    real(*args)

real, si._radix_pass = si._radix_pass, radix_pass
si.sort_index(np.arange(100_000, dtype=np.int64) * 100, cache=derived / "sortidx-1.npy")  # (two passes)
"""


def test_a_sort_index_whose_computing_was_killed_is_deleted_by_the_next_eviction(tmp_path: Path) -> None:
    """A process killed while computing a remote store's sort index left its output and scratch files
    (``*.out.tmp``, ``*.scratch.tmp``), counted against the budget, for ever: no eviction took them."""
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-c", _KILLED_SORT, str(cache)], timeout=120, env=_child_env())
    assert proc.returncode == -signal.SIGKILL
    derived = cache / "derived" / "store"
    assert len(list(derived.iterdir())) == 2, list(derived.iterdir())  # what the killed one left
    other = NodeCache(cache, 1 << 24)
    _evict_all(other)
    assert list(derived.iterdir()) == []
    assert other.disk_usage() <= 4096


def test_a_sort_index_being_computed_keeps_its_files_while_another_process_evicts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Evictions between the passes of a remote store's sort index leave the files it is writing."""
    from seqstore.io.nodecache import budget_directory

    si = importlib.import_module("seqstore.order.sort_index")

    cache = NodeCache(tmp_path / "cache", 1 << 24)
    derived = cache.root / "derived" / "store"
    derived.mkdir(parents=True)
    budget_directory(derived, cache)
    other = NodeCache(tmp_path / "cache", 1 << 24)  # another process's view of the cache
    real = si._radix_pass

    def radix_pass(*args: object) -> None:
        _evict_all(other)
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(si, "_radix_pass", radix_pass)
    lengths = np.arange(100_000, dtype=np.int64)[::-1] * 100
    got = si.sort_index(lengths, cache=derived / "sortidx-1.npy")
    assert np.array_equal(got, np.argsort(lengths, kind="stable"))
    assert [p.name for p in derived.iterdir()] == ["sortidx-1.npy"]


def test_a_derived_array_in_use_is_not_evicted_before_entries_used_less_recently(tmp_path: Path) -> None:
    """Evictions take the least recently used first, by each file's mtime; a derived array (lengths, a
    sort index) kept its writing's mtime however often it was opened again, so one read by every epoch
    went before entries untouched since, and each later open computed it again (O(N))."""
    from seqstore.data._cache import cached_array, write_npy
    from seqstore.io.nodecache import budget_directory

    si = importlib.import_module("seqstore.order.sort_index")
    cache = NodeCache(tmp_path / "cache", 1 << 24)
    derived = cache.root / "derived" / "store"
    derived.mkdir(parents=True)
    budget_directory(derived, cache)
    lengths = np.arange(50_000, dtype=np.int64)[::-1]

    def compute(p: Path) -> None:
        write_npy(p, iter([lengths]), len(lengths), np.int64)

    made = [cached_array(derived / "lengths-1.npy", compute), si.sort_index(lengths, cache=derived / "sortidx-1.npy")]
    obj = cache.object("s3://bucket/object", "etag", 1 << 20)
    obj.fill(0, memoryview(bytes(1 << 20)))
    now = os.stat(obj.bits_path).st_mtime
    for p in derived.iterdir():  # written long ago
        os.utime(p, (now - 100, now - 100))
    os.utime(obj.bits_path, (now - 50, now - 50))  # used since
    del made

    def fail(p: Path) -> None:
        raise AssertionError(f"{p} computed again")

    again = [cached_array(derived / "lengths-1.npy", fail), si.sort_index(lengths, cache=derived / "sortidx-1.npy")]
    assert np.array_equal(again[1], np.argsort(lengths, kind="stable"))
    with cache.locked():
        cache._evict(cache.disk_usage() - 1)  # room for one more byte: the least recently used goes
    assert not obj.bits_path.exists()
    assert sorted(p.name for p in derived.iterdir()) == ["lengths-1.npy", "sortidx-1.npy"]


def test_claims_on_an_entry_another_process_evicted_leave_no_file_behind(tmp_path: Path) -> None:
    """A process that keeps reading an entry another process evicted fetches its missing pages into its
    own (unlinked) copy. Its first claim of them made the entry's claims file anew in the cache directory,
    beside no page map: no eviction deleted or counted it, and a new making of the entry shared it (its
    readers waited on claims of pages that went into the old copy). That copy is claimed by nobody now."""
    cache = NodeCache(tmp_path / "cache", 1 << 30)
    obj = cache.object("s3://bucket/key", '"tag"', 1 << 20)
    _evict_all(NodeCache(tmp_path / "cache", 1 << 30))  # (another process's)
    assert not obj.alive()
    mine, wait = obj.claims.take(np.arange(4), 30.0)
    assert mine.all() and wait is None
    assert [p.name for p in (tmp_path / "cache" / "objects").rglob("*") if p.is_file()] == []
    again = cache.object("s3://bucket/key", '"tag"', 1 << 20)  # made anew: claims as before
    mine, wait = again.claims.take(np.arange(4), 30.0)
    assert mine.all() and wait is None and again.claims.path.exists()


def test_an_entry_read_from_the_cache_counts_as_recently_used(moto_s3: MotoS3, s3_bucket: str,
                                                            tmp_path: Path) -> None:
    """Evictions take the least recently used entries first, by their page map's mtime: it was set when pages
    were fetched only, so an entry read from the cache all day, never fetching, went before one fetched once
    and never read again."""
    import time

    url = _uploaded(moto_s3, s3_bucket, tmp_path, "lru", records=2000, per_shard=1000)
    store = ss.open(url, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "cache")
    store.get_batch(np.arange(2000))  # both shards' values fetched
    objs = {r.key: r.obj for r in store.source.fetcher.regions()}
    hot, cold = objs["shard-000000/v.npy"], objs["shard-000001/v.npy"]
    now = time.time()
    os.utime(hot.bits_path, (now - 100, now - 100))  # fetched first
    os.utime(cold.bits_path, (now - 50, now - 50))  # fetched later, not read since
    hot._touched -= 10  # (this process marked it used more than a second ago)
    assert (store.get_batch(np.arange(0, 1000, 3))["v"] == np.arange(0, 1000, 3)).all()  # from the cache
    assert hot.bits_path.stat().st_mtime > cold.bits_path.stat().st_mtime
