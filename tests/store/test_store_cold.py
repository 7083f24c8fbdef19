"""Reads of data that is not in memory: read-ahead of exactly the asked pages, iter_batches with
prefetch, scans, descriptor-free mappings and the bound on mapped shards.

Cold cases drop the page cache of the store's files with ``posix_fadvise(POSIX_FADV_DONTNEED)``
before the store is opened (pages a live mapping holds cannot be dropped); where the filesystem keeps
them anyway (tmpfs, some overlays) the values are still compared, only the "it was cold" checks skip.
The tests of descriptors and mapped shards drop no cache: they write their many-shard stores to the
tmpfs ``scratch`` directory, where a shard's commit costs no fsync wait.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore as ss
from seqstore.io import PAGE, any_cold, lookahead, map_file, page_runs, willneed
from seqstore.io.mapping import holds_descriptors, libc

N = 3000
SCHEMA = {
    "x": ss.Field("float32", (512,)),  # 2 KiB records
    "tok": ss.Field("float16", (None, 16)),
    "label": ss.Field("int64"),
}


def _write(root: Path, n: int = N, *, max_shard_records: int = 1 << 24, packed: Any = None) -> dict[str, Any]:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, 512), dtype=np.float32)
    lengths = rng.integers(0, 200, n)
    tok = rng.standard_normal((int(lengths.sum()), 16)).astype(np.float16)
    label = np.arange(n, dtype=np.int64) * 7
    ids = [f"utt-{i}" for i in range(n)]
    with ss.create(root, SCHEMA, max_shard_records=max_shard_records, packed=packed) as w:
        for a in range(0, n, 700):
            b = min(a + 700, n)
            lo, hi = int(lengths[:a].sum()), int(lengths[:b].sum())
            w.append_batch({"x": x[a:b], "tok": (tok[lo:hi], lengths[a:b]), "label": label[a:b]}, ids=ids[a:b])
    starts = np.concatenate([[0], np.cumsum(lengths)])
    return {"x": x, "tok": tok, "lengths": lengths, "starts": starts, "label": label, "ids": ids}


def _drop_cache(root: Path) -> None:
    os.sync()
    for p in root.rglob("*.npy"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _check_batch(got: dict[str, Any], want: dict[str, Any], idx: np.ndarray[Any, Any], pad: bool) -> None:
    np.testing.assert_array_equal(got["x"], want["x"][idx])
    np.testing.assert_array_equal(got["label"], want["label"][idx])
    values, lengths = got["tok"]
    np.testing.assert_array_equal(lengths, want["lengths"][idx])
    s = want["starts"]
    if pad:
        assert values.shape == (len(idx), int(lengths.max(initial=0)), 16)
        for j, i in enumerate(idx):
            np.testing.assert_array_equal(values[j, : lengths[j]], want["tok"][s[i] : s[i + 1]])
            assert not values[j, lengths[j] :].any()
    else:
        np.testing.assert_array_equal(values, np.concatenate([want["tok"][s[i] : s[i + 1]] for i in idx]))


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("cold") / "s"
    return root, _write(root, max_shard_records=1100)


# ------------------------------------------------------------------------------------- io layer


def test_sorted_unique_is_np_unique_of_sorted_numbers() -> None:
    """The remote planning's distinct values of sorted chunk numbers, with and without the inverse."""
    from seqstore.io.remote_plan import sorted_unique as _sorted_unique

    rng = np.random.default_rng(5)
    for n in (0, 1, 2, 3, 50, 1000):
        a = np.sort(rng.integers(0, max(n // 3, 1), n)).astype(np.int64)
        want, inv = np.unique(a, return_inverse=True)
        got, got_inv = _sorted_unique(a, inverse=True)
        assert np.array_equal(got, want) and np.array_equal(got_inv, inv), n
        assert np.array_equal(_sorted_unique(a), want)


def test_page_runs_align_sort_and_merge() -> None:
    s, e = page_runs([5000, 10, 4000, 9000, 70000, 300], [5001, 20, 4100, 9001, 70000, 400])
    # [10,20), [300,400), [4000,4100) -> page 0; [4000,4100) reaches page 0 only; 5000 -> page 1; 9000 -> page 2
    assert s.tolist() == [0] and e.tolist() == [3 * PAGE]  # pages 0-2 touch: one run; the empty range is dropped
    s, e = page_runs([0, 5 * PAGE], [1, 5 * PAGE + 1])
    assert s.tolist() == [0, 5 * PAGE] and e.tolist() == [PAGE, 6 * PAGE]
    s, e = page_runs([0, 5 * PAGE], [1, 5 * PAGE + 1], gap=4 * PAGE)
    assert s.tolist() == [0] and e.tolist() == [6 * PAGE]
    with pytest.raises(ValueError, match="differ in length"):
        page_runs([0, 1], [2])


def test_map_file_holds_no_descriptor_and_unmaps_when_unused(tmp_path: Path) -> None:
    if holds_descriptors():
        pytest.skip("libc mmap unavailable: mappings hold descriptors here")
    p = tmp_path / "a.npy"
    np.save(p, np.arange(100_000, dtype=np.int64))
    fds = len(os.listdir("/proc/self/fd"))
    arr = map_file(p, p.stat().st_size)
    view = arr[128:].view(np.int64)
    assert len(os.listdir("/proc/self/fd")) == fds
    assert view[99_999] == 99_999 and not view.flags.writeable
    assert str(p) in Path("/proc/self/maps").read_text()
    del arr
    gc.collect()
    assert str(p) in Path("/proc/self/maps").read_text()  # the view keeps the mapping
    assert view[5] == 5
    del view
    gc.collect()
    assert str(p) not in Path("/proc/self/maps").read_text()
    with pytest.raises(FileNotFoundError):
        map_file(tmp_path / "missing.npy", 10)


def test_willneed_reads_exactly_the_asked_pages(tmp_path: Path) -> None:
    p = tmp_path / "big.bin"
    p.write_bytes(os.urandom(256 * PAGE))
    os.sync()
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    arr = map_file(p, 256 * PAGE)
    base = int(arr.__array_interface__["data"][0])
    pages = np.array([3, 50, 51, 200])
    if not any_cold(base + pages * PAGE):
        pytest.skip(f"{tmp_path}: the page cache of this filesystem cannot be dropped")
    assert willneed(base + pages * PAGE + 10, base + pages * PAGE + 20) == 3  # 50 and 51 merge
    wanted = bytes(arr[pages[-1] * PAGE : pages[-1] * PAGE + 64])  # waits for that page
    vec = np.zeros(256, np.uint8)
    assert libc.mincore(base, 256 * PAGE, vec.ctypes.data_as(ctypes.c_void_p)) == 0
    resident = set(np.flatnonzero(vec & 1).tolist())
    assert {3, 50, 51, 200} <= resident
    assert len(resident) <= 8, resident  # nothing read around the asked pages
    assert wanted == p.read_bytes()[200 * PAGE : 200 * PAGE + 64]


def test_lookahead_requests_depth_items_ahead() -> None:
    log: list[str] = []

    def request(x: int) -> int:
        log.append(f"req{x}")
        return x * 10

    def ready(tok: int) -> None:
        log.append(f"ready{tok // 10}")

    out = []
    for item, tok in lookahead(iter(range(5)), 2, request, ready):
        log.append(f"use{item}")
        out.append((item, tok))
    assert out == [(i, i * 10) for i in range(5)]
    # while item k is used, items up to k + 2 are requested and k + 1 is ready; nothing beyond
    assert log == ["req0", "req1", "req2", "ready0", "ready1", "use0", "req3", "ready2", "use1", "req4", "ready3",
                   "use2", "ready4", "use3", "use4"]
    log.clear()
    for item, _ in lookahead(iter(range(3)), 0, request, ready):
        log.append(f"use{item}")
    assert log == ["req0", "ready0", "use0", "req1", "ready1", "use1", "req2", "ready2", "use2"]  # depth 0: none ahead
    assert [x for x, _ in lookahead([1, 2], 0, lambda v: v)] == [1, 2]
    assert list(lookahead([], 3, lambda v: v)) == []
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="prefetch depth"):
            list(lookahead([1], bad, lambda v: v))  # type: ignore[arg-type]


def test_lookahead_grows_past_depth_while_deeper_allows() -> None:
    """``deeper(n)`` is asked after each yield: the window grows by at most GROWTH items a time, never
    before the first item is yielded, and stops growing as soon as ``deeper`` says no."""
    from seqstore.io.ahead import GROWTH

    requested: list[int] = []
    ahead: list[int] = []  # items requested and not yet yielded, seen at each yield
    allow = {"most": 10}

    def request(x: int) -> int:
        requested.append(x)
        return x

    for item, _ in lookahead(iter(range(40)), 2, request, deeper=lambda n: n < allow["most"]):
        ahead.append(len(requested) - item - 1)
        if item == 20:
            allow["most"] = 0  # e.g. many requests pending now: back to the plain depth
    assert requested == list(range(40))
    assert ahead[0] == 2  # the first item waits for nothing beyond ``depth``
    assert ahead[1] == 2 + GROWTH and max(ahead) == 9  # grown while deeper(n) allowed n < 10
    assert ahead[21:28] == [8, 7, 6, 5, 4, 3, 2] and ahead[28:36] == [2] * 8  # then back to depth, one a time
    assert all(b - a <= GROWTH for a, b in zip(ahead, ahead[1:]))


# --------------------------------------------------------------------------------------- store


@pytest.mark.parametrize("readahead", ["auto", "always", "never"])
def test_cold_get_batch_equals_the_data(written: tuple[Path, dict[str, Any]], readahead: str) -> None:
    root, want = written
    _drop_cache(root)
    store = ss.open(root, readahead=readahead)
    rng = np.random.default_rng(1)
    for pad in (False, True):
        idx = rng.permutation(N)[:700]
        _check_batch(store.get_batch(idx), want, idx, pad=False) if not pad else _check_batch(
            store.get_batch(idx, pad=True), want, idx, pad=True
        )
    warm = ss.open(root, readahead="never")
    idx = rng.permutation(N)[:300]
    a, b = store.get_batch(idx), warm.get_batch(idx)
    for name in ("x", "label"):
        np.testing.assert_array_equal(a[name], b[name])
    np.testing.assert_array_equal(a["tok"][0], b["tok"][0])


def test_cold_batch_reads_only_its_pages(tmp_path: Path) -> None:
    """Read amplification, as bytes from disk: a random cold batch of 2 KiB records reads about one
    page per record (the data is page aligned), not the read-around window of each fault."""
    root = tmp_path / "s"
    want = _write(root, n=6000)
    _drop_cache(root)
    store = ss.open(root)
    sh = store._shards.shard(0)
    probe = np.arange(0, 6000, 97) * sh.columns["x"].strides[0] + sh.span("x")[0]
    if not any_cold(probe):
        pytest.skip(f"{tmp_path}: the page cache of this filesystem cannot be dropped")

    def read_bytes() -> int:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
        raise AssertionError("no read_bytes in /proc/self/io")

    idx = np.random.default_rng(2).permutation(6000)[:500]
    before = read_bytes()
    got = store.get_batch(idx, fields=["x"])
    used = read_bytes() - before
    np.testing.assert_array_equal(got["x"], want["x"][idx])
    if used == 0:
        pytest.skip("this filesystem does not count read bytes in /proc/self/io")
    assert used <= 2.5 * 500 * 2048 + 64 * PAGE, used  # one page per record, plus a little metadata


def test_iter_batches_equals_get_batch(written: tuple[Path, dict[str, Any]]) -> None:
    root, want = written
    _drop_cache(root)
    store = ss.open(root)
    order = ss.seq_order(N, "random", epoch=1, seed=3)
    for prefetch in (0, 1, 2, 5):
        for pad in (False, True):
            chunks = list(order.iter_chunks(256))
            n = 0
            for idx, got in zip(chunks, store.iter_batches(iter(chunks), pad=pad, prefetch=prefetch)):
                _check_batch(got, want, idx, pad)
                n += 1
            assert n == len(chunks)
    got = list(store.iter_batches([[5, 1], [2999]], fields=["label"]))
    assert [g["label"].tolist() for g in got] == [[35, 7], [2999 * 7]]
    assert list(store.iter_batches([])) == []
    with pytest.raises(KeyError, match="nope"):
        next(store.iter_batches([[1]], fields=["nope"]))
    with pytest.raises(IndexError, match="out of range"):
        list(store.iter_batches([[1], [N]]))
    with pytest.raises(ValueError, match="prefetch depth"):
        list(store.iter_batches([[1]], prefetch=-1))


def test_prefetch_then_read(written: tuple[Path, dict[str, Any]]) -> None:
    root, want = written
    _drop_cache(root)
    store = ss.open(root)
    idx = np.array([17, 2, 2900, 1500])
    store.prefetch(idx)
    store.prefetch(idx, fields=["tok"])
    for i in idx:
        rec = store[int(i)]
        np.testing.assert_array_equal(rec["x"], want["x"][i])
        np.testing.assert_array_equal(rec["tok"], want["tok"][want["starts"][i] : want["starts"][i + 1]])
    with pytest.raises(IndexError):
        store.prefetch([N])
    with pytest.raises(ValueError, match="readahead"):
        ss.open(root, readahead="sometimes")


def test_cold_scans_equal_the_data(written: tuple[Path, dict[str, Any]]) -> None:
    root, want = written
    _drop_cache(root)
    store = ss.open(root)
    blocks = list(store.iter_matrix(["x"], chunk_rows=400))
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), want["x"])
    assert [f for f, _ in blocks][:4] == [0, 400, 800, 1100]  # blocks never span shards (1100 per shard)
    np.testing.assert_array_equal(np.asarray(store.lengths("tok")), want["lengths"])
    np.testing.assert_array_equal(store.matrix(["x"], slice(1200, 2000)), want["x"][1200:2000])
    labels = [int(r["label"]) for r in store]
    assert labels == want["label"].tolist()


def test_packed_store_cold(tmp_path: Path) -> None:
    root = tmp_path / "p"
    schema = {"a": ss.Field("float32", (3,)), "b": ss.Field("float32", ()), "c": ss.Field("int32", (None,))}
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2000, 3), dtype=np.float32)
    b = rng.standard_normal(2000, dtype=np.float32)
    with ss.create(root, schema, packed={"g": ["a", "b"]}, max_shard_records=600) as w:
        w.append_batch({"a": a, "b": b, "c": (np.arange(4000, dtype=np.int32), np.full(2000, 2))})
    _drop_cache(root)
    store = ss.open(root, readahead="always")
    idx = rng.permutation(2000)[:500]
    got = store.get_batch(idx)
    np.testing.assert_array_equal(got["a"], a[idx])
    np.testing.assert_array_equal(got["b"], b[idx])
    np.testing.assert_array_equal(got["c"][0].reshape(-1, 2)[:, 0], idx * 2)


# ------------------------------------------------------------------------- descriptors and maps


def test_mapped_shards_are_bounded(scratch: Path) -> None:
    root = scratch / "s"
    want = _write(root, n=1200, max_shard_records=40)  # 30 shards
    store = ss.open(root, max_mapped_shards=4)
    assert store.num_shards == 30
    order = ss.seq_order(1200, "random", epoch=2, seed=1)
    for idx in order.iter_chunks(100):
        _check_batch(store.get_batch(idx), want, idx, pad=False)
        assert store.mapped_shards <= 4
    held = [store[i]["x"] for i in range(0, 1200, 40)]  # views outlive their shard's eviction
    for j, arr in enumerate(held):
        np.testing.assert_array_equal(arr, want["x"][j * 40])
    np.testing.assert_array_equal(store.index_many(want["ids"][::-7]), np.arange(1200)[::-7])
    assert store.mapped_shards <= 4
    with pytest.raises(ValueError, match="max_mapped_shards"):
        ss.open(root, max_mapped_shards=0)


def test_index_keeps_the_mapped_shards_bounded_without_merged_runs(scratch: Path) -> None:
    """A store whose manifest lists no merged id-index runs (as a remote writer leaves it, and a local
    copy of such a store) has every shard probed by its own index: index() maps them through the
    bounded set of mapped shards, as index_many() does, rather than keeping every shard's index mapped."""
    root = scratch / "s"
    with ss.create(root, {"v": ss.Field("int64")}, max_shard_records=2) as w:
        w.append_batch({"v": np.arange(80)}, ids=[f"id-{i}" for i in range(80)])
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["index_runs"]
    manifest["index_runs"] = []  # runs are an accelerator: the shards' own indexes answer alike
    (root / "manifest.json").write_text(json.dumps(manifest))

    def mapped_indexes() -> int:
        maps = Path("/proc/self/maps").read_text().splitlines()
        return sum(str(root) in line and "_ids.hash" in line for line in maps)

    store = ss.open(root, max_mapped_shards=4)
    assert [store.index(f"id-{i}") for i in (79, 0, 41)] == [79, 0, 41]
    assert store.mapped_shards <= 4 and mapped_indexes() <= 2 * 4
    with pytest.raises(KeyError):
        store.index("id-80")
    assert mapped_indexes() <= 2 * 4


_CHILD = textwrap.dedent(
    """
    import os, resource, sys
    import numpy as np
    import seqstore as ss
    root, n, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    store = ss.open(root)
    base = len(os.listdir("/proc/self/fd"))
    most = base
    order = ss.seq_order(n, "random", epoch=1, seed=9)
    total = 0
    for idx in order.iter_chunks(512):
        b = store.get_batch(idx, fields=["label"])
        assert (b["label"] == idx * 7).all()
        total += len(idx)
        most = max(most, len(os.listdir("/proc/self/fd")))
    found = store.index_many([f"utt-{i}" for i in range(0, n, 3)])
    assert (found == np.arange(0, n, 3)).all()
    most = max(most, len(os.listdir("/proc/self/fd")))
    print(total, store.num_shards, base, most)
    """
)


def test_random_epoch_and_index_many_under_a_small_open_files_limit(scratch: Path) -> None:
    """More shard files than the open-files limit allows descriptors: a random epoch and a lookup of
    every third id still work, and the descriptors the process holds stay flat."""
    if holds_descriptors():
        pytest.skip("mappings hold descriptors here (no libc mmap)")
    root = scratch / "s"
    n = 2400
    _write(root, n=n, max_shard_records=8)  # 300 shards x 8 files each: 2,400 files
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(root), str(n), "64"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    total, shards, base, most = map(int, proc.stdout.split())
    assert total == n and shards == 300
    assert most - base <= 8, (base, most)


@pytest.mark.slow
def test_twenty_thousand_shards_under_ulimit_1024(tmp_path: Path) -> None:
    """The issue's case: 20,000 shards (about 160,000 files), a random epoch and a lookup of every
    third id in a process limited to 1,024 open files; descriptors stay flat. Built on /dev/shm
    where there is one (a commit there costs no fsync wait: ~80 s instead of ~12 min)."""
    if holds_descriptors():
        pytest.skip("mappings hold descriptors here (no libc mmap)")
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    try:
        root = base / "s"
        n = 20_000
        label = np.arange(n, dtype=np.int64) * 7
        with ss.create(root, {"label": ss.Field("int64"), "tok": ss.Field("float16", (None, 16))},
                       max_shard_records=1) as w:
            w.append_batch({"label": label, "tok": (np.ones((n, 16), np.float16), np.ones(n, np.int64))},
                           ids=[f"utt-{i}" for i in range(n)])
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(root), str(n), "1024"], capture_output=True,
                              text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
        total, shards, before, most = map(int, proc.stdout.split())
        assert total == n and shards == n
        assert most - before <= 8, (before, most)
    finally:
        if base != tmp_path:
            shutil.rmtree(base, ignore_errors=True)


def test_scans_request_the_next_stretch(written: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """iter_matrix asks for each block's bytes (the first block, then always the next one) before the
    caller touches them; Lengths.iter_chunks asks for its offsets."""
    import seqstore.io.local_source as source_mod

    root, want = written
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(source_mod, "willneed_span", lambda a, b, **kw: asked.append((a, b)) or 1)
    store = ss.open(root, readahead="always")
    blocks = []
    for first, block in store.iter_matrix(["x"], chunk_rows=500):
        lo = int(block.__array_interface__["data"][0])
        blocks.append((first, lo, lo + block.nbytes))
        assert (lo, lo + block.nbytes) in asked  # requested no later than handed out
    assert len(asked) == len(blocks) and asked == [(lo, hi) for _, lo, hi in blocks]
    asked.clear()
    np.testing.assert_array_equal(np.asarray(store.lengths("tok")), want["lengths"])
    off = store._shards.shard(0).offsets["tok"]
    lo = int(off.__array_interface__["data"][0])
    assert asked and asked[0] == (lo, lo + off.nbytes)
    asked.clear()
    list(ss.open(root, readahead="never").iter_matrix(["x"], chunk_rows=500))
    assert asked == []


# ---------------------------------------------------------------------------- review findings


def test_views_are_readable_at_interpreter_exit(scratch: Path) -> None:
    """Mappings are not unmapped by exit-time finalizers while an atexit handler still reads a view."""
    root = scratch / "s"
    _write(root, n=50)
    code = textwrap.dedent(
        f"""
        import atexit
        def late():
            print(float(rec["x"][0]), int(store.get_batch([3])["label"][0]))
        atexit.register(late)
        import seqstore as ss
        store = ss.open({str(root)!r})
        rec = store[0]
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.split()[1] == "21"


def test_a_batch_maps_each_shard_once_whatever_the_limit(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import seqstore.store.read.shards as shards_mod

    root = scratch / "s"
    want = _write(root, n=400, max_shard_records=10)  # 40 shards
    made: list[str] = []
    real = shards_mod.Shard

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            made.append("x")
            super().__init__(*a, **kw)

    monkeypatch.setattr(shards_mod, "Shard", Counting)
    store = ss.open(root, max_mapped_shards=3, readahead="always")
    idx = np.arange(400)[::-1]
    for pad in (False, True):
        made.clear()
        _check_batch(store.get_batch(idx, pad=pad), want, idx, pad)
        assert len(made) == 40  # once per shard per batch, not once per field and stage
    made.clear()
    assert len(list(store.iter_batches([idx[:200], idx[200:]], prefetch=1))) == 2
    assert len(made) == 40
    assert store.mapped_shards <= 3


def test_a_store_shared_by_threads(scratch: Path) -> None:
    import threading

    root = scratch / "s"
    want = _write(root, n=300, max_shard_records=10)  # 30 shards
    store = ss.open(root, max_mapped_shards=2)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(30):
                idx = rng.integers(0, 300, 20)
                np.testing.assert_array_equal(store.get_batch(idx, fields=["label"])["label"], want["label"][idx])
                i = int(idx[0])
                np.testing.assert_array_equal(store[i]["x"], want["x"][i])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert store.mapped_shards <= 2


def test_the_sample_looks_at_every_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A field in memory must not hide a cold one from the sample (fields asked in either order)."""
    import seqstore.io.local_source as source_mod

    root = tmp_path / "s"
    _write(root, n=2000, max_shard_records=500)
    requested: list[int] = []
    real = source_mod.willneed
    monkeypatch.setattr(source_mod, "willneed", lambda s, e, **kw: requested.append(len(s)) or real(s, e, **kw))
    idx = np.random.default_rng(0).permutation(2000)[:300]
    for names in (["label", "x"], ["x", "label"], ["label", "tok"]):
        store = sh = None  # unmap the previous round's files: pages a live mapping holds cannot be dropped
        gc.collect()
        _drop_cache(root)
        store = ss.open(root)
        sh = store._shards.shard(0)
        if not any_cold(np.array([sh.span("x")[0]])):
            pytest.skip(f"{tmp_path}: the page cache of this filesystem cannot be dropped")
        np.asarray(store.get_batch(np.arange(2000), fields=["label"])["label"])  # label now in memory
        requested.clear()
        store.get_batch(idx, fields=names)
        assert requested and sum(requested) >= 300, (names, requested)


def test_a_matrix_view_reads_ahead_only_its_first_stretch(written: tuple[Path, dict[str, Any]],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import seqstore.io.local_source as source_mod
    import seqstore.store.read.matrix as matrix_mod

    root, want = written
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(source_mod, "willneed_span", lambda a, b, **kw: asked.append((a, b)) or 1)
    monkeypatch.setattr(matrix_mod, "_VIEW_AHEAD", 512 * 100)  # 100 rows of x
    store = ss.open(root, readahead="always")
    view = store.matrix(["x"], slice(0, 1000))
    np.testing.assert_array_equal(view, want["x"][:1000])
    assert len(asked) == 1 and asked[0][1] - asked[0][0] == 100 * 2048


def test_store_dataset_pickles_its_store_options(written: tuple[Path, dict[str, Any]]) -> None:
    import pickle

    from seqstore.data import StoreDataset

    root, _ = written
    ds = StoreDataset(ss.open(root, readahead="never", max_mapped_shards=3))
    back = pickle.loads(pickle.dumps(ds))
    assert back.store._readahead == "never" and back.store._shards.max_mapped == 3
    assert len(back) == len(ds)


def test_too_many_open_files_is_not_corruption(scratch: Path) -> None:
    """Running out of descriptors while a shard is first touched is an OSError naming the limit."""
    root = scratch / "s"
    _write(root, n=40, max_shard_records=10)
    code = textwrap.dedent(
        f"""
        import os, resource, seqstore as ss
        store = ss.open({str(root)!r})
        held = []
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        try:
            store[25]
        except ss.CorruptionError as exc:
            print("corruption", exc)
        except OSError as exc:
            print("oserror", exc)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("oserror") and "ulimit -n" in proc.stdout, proc.stdout


def test_first_touch_of_a_shard_reads_no_data(tmp_path: Path) -> None:
    """Mapping a cold shard (header and descriptor checks) leaves its data pages on disk: the header is
    read without the kernel's read-ahead into the data."""
    root = tmp_path / "s"
    _write(root, n=1500)
    _drop_cache(root)
    x = next(root.glob("shard-*/x.npy"))
    probe = map_file(x, x.stat().st_size)  # mapping alone reads nothing
    base = int(probe.__array_interface__["data"][0])
    pages = base + PAGE * np.arange(2, x.stat().st_size // PAGE, 7)
    if not any_cold(pages, sample=len(pages)):
        pytest.skip(f"{tmp_path}: the page cache of this filesystem cannot be dropped")
    store = ss.open(root)
    store._shards.shard(0)
    vec = np.zeros(1, np.uint8)
    resident = 0
    for a in pages.tolist():
        libc.mincore(a & ~(PAGE - 1), PAGE, vec.ctypes.data_as(ctypes.c_void_p))
        resident += int(vec[0] & 1)
    assert resident == 0, f"{resident} of {len(pages)} data pages read by the first touch"


def test_request_size_follows_the_device(tmp_path: Path) -> None:
    from seqstore.io.advice import REQUEST_BYTES, request_bytes

    got = request_bytes(tmp_path)
    assert REQUEST_BYTES <= got <= 8 << 20 and got % PAGE == 0
    if Path("/dev/shm").is_dir():
        assert request_bytes("/dev/shm") == REQUEST_BYTES  # not a block device: the safe default
    assert request_bytes(tmp_path / "missing") == REQUEST_BYTES


def test_iter_ragged_streams_zero_copy_blocks(written: tuple[Path, dict[str, Any]],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import seqstore.io.local_source as source_mod

    root, want = written
    _drop_cache(root)
    asked: list[tuple[int, int]] = []
    real = source_mod.willneed_span
    monkeypatch.setattr(source_mod, "willneed_span", lambda a, b, **kw: asked.append((a, b)) or real(a, b, **kw))
    store = ss.open(root, readahead="always")
    s = want["starts"]
    firsts = []
    for first, values, lengths in store.iter_ragged("tok", chunk_records=400):
        n = len(lengths)
        firsts.append(first)
        np.testing.assert_array_equal(lengths, want["lengths"][first : first + n])
        np.testing.assert_array_equal(values, want["tok"][s[first] : s[first + n]])
        assert not values.flags.writeable and not values.flags.owndata  # a view of the mapping
        lo = int(values.__array_interface__["data"][0])
        assert values.size == 0 or any(a <= lo < b for a, b in asked)  # requested before it was handed out
    assert firsts[:4] == [0, 400, 800, 1100]  # blocks stop at shard ends (1100 records per shard)
    got = list(store.iter_ragged(chunk_records=10_000, start=1050, stop=1150))
    assert [(f, len(ln)) for f, _, ln in got] == [(1050, 50), (1100, 50)]
    assert list(store.iter_ragged("tok", start=5, stop=5)) == []
    with pytest.raises(ValueError, match="not ragged"):
        next(store.iter_ragged("x"))
    with pytest.raises(ValueError, match="chunk_records"):
        next(store.iter_ragged("tok", chunk_records=0))
    with pytest.raises(IndexError, match="record range"):
        next(store.iter_ragged("tok", start=10, stop=5))


def test_probes_thin_out_while_batches_are_in_memory_and_come_back_when_cold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After runs of warm samples the residency probe skips accesses (as many as the run is long, at
    most 32); a cold sample ends the run: the batch's pages are requested and every access probed again."""
    import seqstore.io.local_source as source_mod
    from seqstore.store.read import readahead

    root = tmp_path / "s"
    _write(root, n=2000, max_shard_records=500)
    store = ss.open(root)
    cold = [False]
    probes: list[int] = []
    requested: list[int] = []
    monkeypatch.setattr(store.source, "any_cold", lambda a, **kw: probes.append(len(a)) or cold[0])
    monkeypatch.setattr(source_mod, "willneed", lambda s, e, **kw: requested.append(len(s)) or 0)
    idx = np.random.default_rng(1).permutation(2000)[:64]
    for _ in range(200):
        store.get_batch(idx)
    # two accesses a batch (records, then ragged values): 400; the first _WARM_RUN probed each, then fewer
    assert readahead._WARM_RUN <= len(probes) < 400 // 8, len(probes)
    assert not requested
    cold[0] = True
    probes.clear()
    for _ in range(40):  # within _SKIP_MOST accesses a probe finds it cold
        store.get_batch(idx)
    assert probes and requested
    n = len(probes)
    store.get_batch(idx)
    assert len(probes) == n + 2  # cold: each access probed again
