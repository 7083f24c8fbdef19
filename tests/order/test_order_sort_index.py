"""sort_index: equal to numpy's stable argsort for every dtype and key range, cached on disk, mapped."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from seqstore.order import seq_order, sort_index


@pytest.mark.parametrize(
    "values",
    [
        np.array([], dtype=np.int32),
        np.array([7], dtype=np.int64),
        np.array([3, 1, 2, 1, 3, 0], dtype=np.int16),
        np.random.default_rng(0).integers(0, 5, 10_000).astype(np.uint8),
        np.random.default_rng(1).integers(1, 3000, 50_000).astype(np.int32),
        np.random.default_rng(2).integers(-(2**40), 2**40, 20_000),  # 3 radix passes
        np.random.default_rng(3).integers(0, 2**64 - 1, 5_000, dtype=np.uint64),
        np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max, -1]),
        np.random.default_rng(4).normal(size=20_000),
        np.array([0.0, -0.0, 1.5, -np.inf, np.inf, -0.0, 0.0, -2.5], dtype=np.float32),
        np.full(1000, 42, dtype=np.int64),
    ],
    ids=lambda v: f"{v.dtype}[{len(v)}]",
)
def test_equals_numpy_stable_argsort(values: np.ndarray) -> None:
    got = sort_index(values)
    assert np.array_equal(got, np.argsort(values, kind="stable"))
    assert got.dtype == np.int32


def test_descending_orders_match_numpy() -> None:
    lengths = np.random.default_rng(5).integers(1, 30, 5000)
    o = seq_order(5000, "sorted_reverse", epoch=1, lengths=lengths)
    assert np.array_equal(o.to_numpy(np.int64), np.argsort(-lengths, kind="stable"))
    f = np.random.default_rng(6).integers(0, 10, 3000).astype(np.float64) / 4
    o = seq_order(3000, "sorted_reverse", epoch=1, lengths=f)
    assert np.array_equal(o.to_numpy(np.int64), np.argsort(-f, kind="stable"))


@pytest.mark.parametrize("ordering", ["sorted", "sorted_reverse", "laplace:4", "sort_bin_shuffle:4",
                                      "sort_bin_shuffle_x2:.7"])
def test_float16_lengths_order_as_float64(tmp_path: Path, ordering: str) -> None:
    """float16 lengths (numba cannot load them; sorted_reverse and sort_bin_shuffle* failed with its
    NotImplementedError) give the order of the same values as float64: negative ones, -0.0 tied with
    0.0, runs of ties, infinities; also mapped from a .npy file."""
    rng = np.random.default_rng(10)
    f = (rng.integers(-8, 40, 3000) / 4).astype(np.float16)
    f[rng.integers(0, 3000, 30)] = -0.0
    f[:3] = [np.inf, -np.inf, 65504]
    np.save(tmp_path / "len.npy", f)
    want = seq_order(3000, ordering, epoch=1, seed=3, lengths=f.astype(np.float64)).to_numpy(np.int64)
    for lengths in (f, tmp_path / "len.npy"):
        got = seq_order(3000, ordering, epoch=1, seed=3, lengths=lengths).to_numpy(np.int64)
        np.testing.assert_array_equal(got, want)
    if ordering == "sorted_reverse":
        np.testing.assert_array_equal(want, np.argsort(-f, kind="stable"))


def test_nan_rejected() -> None:
    with pytest.raises(ValueError, match="NaN"):
        sort_index(np.array([1.0, np.nan]))


def test_cache_written_once_and_mapped(tmp_path: Path) -> None:
    lengths = np.random.default_rng(7).integers(1, 100, 20_000)
    lpath = tmp_path / "lengths.npy"
    np.save(lpath, lengths)
    cache = tmp_path / "sort.npy"
    first = sort_index(lpath, cache=cache)
    assert isinstance(first, np.memmap) and cache.exists()
    assert np.array_equal(first, np.argsort(lengths, kind="stable"))
    assert not list(tmp_path.glob("*.tmp"))  # no scratch left behind
    mtime = cache.stat().st_mtime_ns
    again = sort_index(lengths, cache=cache)
    assert cache.stat().st_mtime_ns == mtime and np.array_equal(again, first)
    # a cache that does not fit the lengths is recomputed
    other = lengths[::-1].copy()
    fixed = sort_index(other, cache=cache)
    assert np.array_equal(fixed, np.argsort(other, kind="stable"))
    np.save(cache, np.arange(5))
    assert np.array_equal(sort_index(lengths, cache=cache), first)


def test_multi_pass_cache_to_disk(tmp_path: Path) -> None:
    values = np.random.default_rng(8).integers(-(2**50), 2**50, 30_000)
    got = sort_index(values, cache=tmp_path / "s.npy")
    assert np.array_equal(got, np.argsort(values, kind="stable"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.npy"]


_THREADS = """
import sys, threading
import numpy as np
from seqstore.order import sort_index
values = np.random.default_rng(0).integers(0, 1 << 30, 2_000_000)
want = np.argsort(values, kind="stable")
for trial in range(3):
    got = []
    threads = [threading.Thread(target=lambda: got.append(sort_index(values, cache=f"{sys.argv[1]}/s{trial}.npy")))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(np.array_equal(g, want) for g in got)
"""


def test_threads_computing_one_cache_at_once(tmp_path: Path) -> None:
    """Threads of one process computing the same cached index wrote the same temporary files (named by
    the process id): one truncated what another had mapped (the process died of SIGBUS) or renamed it
    away under it. Each now has its own; the index is right in every thread."""
    run = subprocess.run([sys.executable, "-c", _THREADS, str(tmp_path)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s0.npy", "s1.npy", "s2.npy"]


def test_sorted_orders_use_cache(tmp_path: Path) -> None:
    lengths = np.random.default_rng(9).integers(1, 50, 10_000).astype(np.int32)
    np.save(tmp_path / "len.npy", lengths)
    mapped = np.load(tmp_path / "len.npy", mmap_mode="r")
    cache = tmp_path / "sidx.npy"
    for name in ("sorted", "sorted_reverse", "sort_bin_shuffle:.100"):
        o = seq_order(10_000, name, epoch=1, lengths=mapped, sort_cache=cache, partition_epoch=3)
        back = pickle.loads(pickle.dumps(o))
        assert back == o
    assert cache.exists()
    o = seq_order(10_000, "sorted", epoch=1, lengths=mapped, sort_cache=cache)
    assert np.array_equal(o.to_numpy(np.int64), np.argsort(lengths, kind="stable"))


_FULL_DISK = """
import errno, os, sys
import numpy as np
from seqstore.order import sort_index

root = sys.argv[1]
path = os.path.join(root, "sortidx.npy")
lengths = np.arange(2_000_000, dtype=np.int64)[::-1] * 100  # 8 MB of index and 8 MB of scratch: two passes
try:
    sort_index(lengths, cache=path)
except OSError as exc:
    assert exc.errno == errno.ENOSPC and path in str(exc), str(exc)
else:
    raise AssertionError("a sort index written to a full disk")
assert os.listdir(root) == [], os.listdir(root)  # no temporaries left
print("alive")
"""


def test_a_sort_index_cache_on_a_full_disk_is_an_error_not_a_crash(tmp_path: Path) -> None:
    """The sort index and its scratch are written through mappings of sparse files: on a file system with
    no room left the first write into a hole ended the process with SIGBUS. Runs on a 2 MiB tmpfs of its
    own (skipped where user namespaces are not allowed)."""
    from support.tmpfs import run_on_small_tmpfs

    _disk, got = run_on_small_tmpfs(_FULL_DISK, tmp_path, "2m")
    assert got.returncode == 0 and "alive" in got.stdout, (got.returncode, got.stdout, got.stderr[-2000:])


def test_a_sort_cache_in_a_missing_directory_names_the_cache(tmp_path: Path) -> None:
    """A ``sort_cache`` whose directory does not exist failed with a FileNotFoundError naming a temporary
    file ('.sidx.npy.tmp-...') the user never gave. The error names the cache and its directory, and
    nothing is created."""
    cache = tmp_path / "nowhere" / "sidx.npy"
    lengths = np.array([3, 1, 2], dtype=np.int32)
    for n in (3, 0):
        with pytest.raises(FileNotFoundError, match=r"sort cache .*sidx\.npy.*nowhere.*does not exist") as info:
            sort_index(lengths[:n], cache=cache)
        assert ".tmp-" not in str(info.value)
    o = seq_order(3, "sorted", epoch=1, lengths=lengths, sort_cache=cache)
    with pytest.raises(FileNotFoundError, match="sort cache"):
        o.to_numpy(np.int64)
    assert list(tmp_path.iterdir()) == []


_KILLED = """\
import glob, os, sys, time
import numpy as np
from seqstore.order import sort_index

class Lengths:  # lazy lengths: the first read once the sort's temporary is made waits
    dtype = np.dtype(np.int64)

    def __len__(self):
        return 5000

    def take(self, idx):
        if glob.glob(os.path.join(os.path.dirname(sys.argv[1]), ".*.tmp-*")):
            print("sorting", flush=True)
            time.sleep(60)
        return np.asarray(idx, dtype=np.int64) * int(sys.argv[2]) % 7

sort_index(Lengths(), cache=sys.argv[1])
"""


def _killed_sorting(cache: Path, factor: int) -> None:
    """A subprocess sorting lengths ``index * factor % 7`` into ``cache``, killed (SIGKILL) part way."""
    import os
    import signal

    proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(cache), str(factor)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "sorting\n"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_sort_killed_part_way_leaves_no_temporary_after_the_next_sort(tmp_path: Path) -> None:
    """A process killed (SIGKILL, OOM) while it sorted into a sort cache outside the node cache left its
    temporary file ('.sidx.npy.tmp-*', as large as the index) beside the cache for ever. The next sort
    into that cache removes the temporaries no live process holds; one a live sort holds is left alone."""
    import os

    from seqstore.io.nodecache import temporary

    cache = tmp_path / "sidx.npy"
    _killed_sorting(cache, 1)
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".sidx.npy.tmp-"), left
    fd, held = temporary(cache)  # a live sort's, under way
    try:
        values = np.arange(5000) % 7
        assert np.array_equal(sort_index(values, cache=cache), np.argsort(values, kind="stable"))
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([Path(held).name, "sidx.npy"])
    finally:
        os.close(fd)
        os.unlink(held)


def test_a_sort_cache_on_a_file_system_without_flock_still_works(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ``flock`` is refused (Lustre without ``-o flock``: ENOSYS; no such file system here, so flock
    is made to fail as it does there), a sort into a cache works as before the temporaries were locked,
    and a temporary there is not taken for a dead process's."""
    import errno
    import fcntl

    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    other = tmp_path / ".sidx.npy.tmp-other"
    other.write_bytes(b"x")
    monkeypatch.setattr(fcntl, "flock", no_flock)
    values = np.arange(3000) % 5
    assert np.array_equal(sort_index(values, cache=tmp_path / "sidx.npy"), np.argsort(values, kind="stable"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, "sidx.npy"]


def test_a_sort_killed_part_way_leaves_no_temporary_after_a_cache_found_whole(tmp_path: Path) -> None:
    """The temporaries of a sort killed part way went only with a sort that computed its index: where
    another process had written the cache meanwhile, every later call found it and returned it, and the
    temporary stayed. Now a call that finds the cache whole removes them too."""
    cache = tmp_path / "sidx.npy"
    values = np.arange(5000) % 7
    sort_index(values, cache=cache)
    _killed_sorting(cache, 3)  # (other lengths: the cache is not theirs, so that process sorted)
    assert len(list(tmp_path.iterdir())) == 2
    assert np.array_equal(sort_index(values, cache=cache), np.argsort(values, kind="stable"))
    assert [p.name for p in tmp_path.iterdir()] == ["sidx.npy"]
