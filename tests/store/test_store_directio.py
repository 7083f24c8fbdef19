"""Direct I/O (``O_DIRECT``) writes: one-page headers, the direct path taken for large appends (aligned
ones from the caller's memory, others copied into aligned runs, ragged values too, the bytes after the
last page held back), buffered fallbacks (small appends, a shard's last bytes, EINVAL, no O_DIRECT at all),
other write errors failing the writer, ``aligned_empty``/``pwrite_all``, and the Logger's page-sized
buffers.

These tests write to ``tmp_path`` (a disk filesystem where one exists), not to the tmpfs ``scratch``
directory, so that the real ``O_DIRECT`` path runs where the kernel offers it. Tests of the fallback
logic replace ``open_direct`` by a plain write-only descriptor, so that they run on any filesystem.
"""

from __future__ import annotations

import errno
import os
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_testlib import fds_under, workspaces

import seqstore as ss
from seqstore.format.npy import HEADER_BYTES, PAGE_HEADER_BYTES, read_header
from seqstore.log import Logger
from seqstore.log.logger import _buffer_rows
from seqstore.store import directio
from seqstore.store import writer as writer_api
from seqstore.store.directio import ALIGN, aligned_empty, is_aligned, open_direct, pwrite_all
from seqstore.store.ids import encode_ids
from seqstore.store.verify import verify
from seqstore.store.write import columns as writer_mod

WIDTH = 1024  # float32 columns: one record is one page (4096 bytes)
SCHEMA = {
    "x": ss.Field("float32", (WIDTH,)),
    "p": {"a": ss.Field("float32", (1000,)), "b": ss.Field("float32", (WIDTH - 1000,))},
    "tok": ss.Field("int32", (None,)),
}
PACK = {"grp": ["p/a", "p/b"]}
FIXED_FILES = ("x.npy", "grp.npy")  # written with direct I/O when asked
OTHER_FILES = ("tok.offsets.npy", "_ids.npy", "_ids.offsets.npy", "_ids.hash.npy", "_ids.hash_rows.npy")
RAGGED_FILES = ("tok.npy",)  # written with direct I/O when asked (in page-aligned runs of 1 MiB and more)

Alloc = Callable[[tuple[int, ...], Any], np.ndarray]


def _misaligned(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An array whose memory starts one element past a page boundary."""
    n = int(np.prod(shape, dtype=np.int64))
    arr = aligned_empty((n + 1,), dtype)[1:].reshape(shape)
    assert not is_aligned(arr)
    return arr


def _np_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.empty(shape, dtype=dtype)


@dataclass
class Batch:
    """Records ``first .. first + n - 1`` of the test store, as the writer gets them."""

    x: np.ndarray
    grp: np.ndarray  # (n, WIDTH): packed group "grp" = p/a | p/b
    tok: np.ndarray  # ragged values
    lengths: np.ndarray
    ids: list[str]
    as_fields: bool = False  # give the packed group as its fields p/a, p/b instead of one matrix
    one_by_one: bool = False  # append() each record instead of append_batch()

    @property
    def n(self) -> int:
        return len(self.ids)


def make_batch(rng: np.random.Generator, first: int, n: int, alloc: Alloc = aligned_empty, **kw: Any) -> Batch:
    x = alloc((n, WIDTH), np.float32)
    x[:] = rng.standard_normal((n, WIDTH), dtype=np.float32)
    grp = alloc((n, WIDTH), np.float32)
    grp[:] = rng.standard_normal((n, WIDTH), dtype=np.float32)
    lengths = rng.integers(0, 6, n)
    tok = rng.integers(-(2**31), 2**31, int(lengths.sum()), dtype=np.int32)
    ids = [f"id-{first + k}" + ("-é🙂" if k % 3 == 0 else "") for k in range(n)]
    return Batch(x, grp, tok, lengths, ids, **kw)


Step = Batch | str  # a batch, or "commit"


def write_store(root: Path, steps: Sequence[Step], **create_kw: Any) -> list[Batch]:
    """Create a store at ``root`` and write ``steps``; return the batches in order."""
    kw: dict[str, Any] = {"packed": PACK, "direct_io": True, **create_kw}
    batches = []
    with ss.create(root, SCHEMA, **kw) as w:
        for step in steps:
            if isinstance(step, str):
                assert step == "commit"
                w.commit()
                continue
            batches.append(step)
            append_batch(w, step)
    return batches


def append_batch(w: ss.Writer, b: Batch) -> None:
    starts = np.concatenate([[0], np.cumsum(b.lengths)])
    if b.one_by_one:
        for k in range(b.n):
            rec = {
                "x": b.x[k],
                "p": {"a": b.grp[k, :1000], "b": b.grp[k, 1000:]},
                "tok": b.tok[starts[k] : starts[k + 1]],
            }
            w.append(rec, id=b.ids[k])
        return
    cols: dict[str, Any] = {"x": b.x, "tok": (b.tok, b.lengths)}
    if b.as_fields:
        cols |= {"p/a": b.grp[:, :1000], "p/b": b.grp[:, 1000:]}
    else:
        cols["grp"] = b.grp
    w.append_batch(cols, ids=b.ids)


def _cat(batches: Sequence[Batch], attr: str) -> np.ndarray:
    return np.concatenate([getattr(b, attr) for b in batches])


def check_store(root: Path, batches: Sequence[Batch], *, header: int = PAGE_HEADER_BYTES,
                ragged_header: int = PAGE_HEADER_BYTES) -> ss.Store:
    """Read the store back every way (seqstore.open, np.load of every file, verify) and compare."""
    x, grp, tok, lengths = (_cat(batches, a) for a in ("x", "grp", "tok", "lengths"))
    ids = [i for b in batches for i in b.ids]
    n = len(ids)
    store = ss.open(root)
    assert len(store) == n
    got = store.get_batch(np.arange(n))
    np.testing.assert_array_equal(got["x"], x)
    np.testing.assert_array_equal(got["p/a"], grp[:, :1000])
    np.testing.assert_array_equal(got["p/b"], grp[:, 1000:])
    np.testing.assert_array_equal(got["tok"][0], tok)
    np.testing.assert_array_equal(got["tok"][1], lengths)
    np.testing.assert_array_equal(store.matrix(["grp"]), grp)
    assert [store.id(i) for i in range(0, n, 97)] == ids[::97]
    np.testing.assert_array_equal(store.index_many(ids), np.arange(n))
    # every shard's files, as plain .npy files
    starts = np.concatenate([[0], np.cumsum(lengths)])
    lo = 0
    for shard in store.manifest.shards:
        d = root / shard.name
        hi = lo + shard.records
        for name, want in (("x.npy", x[lo:hi]), ("grp.npy", grp[lo:hi])):
            np.testing.assert_array_equal(np.load(d / name, mmap_mode="r"), want, err_msg=str(d / name))
            assert read_header(d / name).data_offset == header, d / name
            assert (d / name).stat().st_size == header + want.nbytes
        np.testing.assert_array_equal(np.load(d / "tok.npy", mmap_mode="r"), tok[starts[lo] : starts[hi]])
        np.testing.assert_array_equal(np.load(d / "tok.offsets.npy"), starts[lo : hi + 1] - starts[lo])
        data, offsets = encode_ids(ids[lo:hi])
        np.testing.assert_array_equal(np.load(d / "_ids.npy", mmap_mode="r"), data)
        np.testing.assert_array_equal(np.load(d / "_ids.offsets.npy"), offsets)
        for name in OTHER_FILES:
            assert read_header(d / name).data_offset == HEADER_BYTES, d / name
        for name in RAGGED_FILES:
            assert read_header(d / name).data_offset == ragged_header, d / name
        lo = hi
    assert lo == n
    assert verify(root) == []
    assert not workspaces(root)
    return store


class PwriteSpy:
    """Stands in for ``writer.pwrite_all``: records (file name, bytes, offset) of every direct write."""

    def __init__(self, fail: int | None = None, fail_after: int = 0) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.fail = fail  # errno to raise (after writing ``fail_after`` bytes), None: write normally
        self.fail_after = fail_after

    def __call__(self, fd: int, data: memoryview, offset: int) -> None:
        try:
            name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            name = "?"
        self.calls.append((name, len(data), offset))
        if self.fail is None:
            pwrite_all(fd, data, offset)
            return
        if self.fail_after:
            pwrite_all(fd, data[: self.fail_after], offset)
        raise OSError(self.fail, os.strerror(self.fail))

    def of(self, name: str) -> list[tuple[int, int]]:
        return [(n, off) for f, n, off in self.calls if f == name]


def _plain_direct(path: str | os.PathLike[str]) -> int:
    """A write-only descriptor without O_DIRECT: runs the writer's direct path on any filesystem."""
    return os.open(path, os.O_WRONLY)


def direct_supported(directory: Path) -> bool:
    probe = directory / ".direct-probe"
    probe.touch()
    try:
        fd = open_direct(probe)
        if fd is None:
            return False
        os.close(fd)
        return True
    finally:
        probe.unlink()


# ------------------------------------------------------------------------------------- writer


def test_large_aligned_batches_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several-MiB page-aligned batches (fixed field, packed group, ragged field, str ids) over two
    shards read back identical; fixed and ragged value files have a one-page header, the others keep 128
    bytes; and where the filesystem has O_DIRECT, every fixed byte went through it (the ragged field's
    few KiB per shard wait for a run of 1 MiB that never comes: page cache at the shard's end)."""
    spy = PwriteSpy()
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    rng = np.random.default_rng(0)
    steps: list[Step] = [make_batch(rng, 0, 768), make_batch(rng, 768, 640), "commit", make_batch(rng, 1408, 700)]
    batches = write_store(tmp_path / "s", steps)
    store = check_store(tmp_path / "s", batches)
    assert store.num_shards == 2
    if not direct_supported(tmp_path):
        pytest.skip(f"no O_DIRECT on {tmp_path}: the direct path cannot be observed")
    assert {name for name, _, _ in spy.calls} == set(FIXED_FILES)
    for name in FIXED_FILES:
        writes = spy.of(name)
        # one direct write per batch (each row is a page: no buffered tail), back to back from the header
        assert [n for n, _ in writes] == [b.n * WIDTH * 4 for b in batches]
        assert [off for _, off in writes] == [PAGE_HEADER_BYTES, PAGE_HEADER_BYTES + 768 * 4096, PAGE_HEADER_BYTES]


def test_checksum_covers_directly_written_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CRC-32 in the manifest covers every byte of an append written directly, also when the
    checksum thread gets to it only after ``write()`` has returned (the thread is held busy until then)."""
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    gate = threading.Event()
    real_write = writer_mod.ColumnFile.write

    def write_then_release(self: Any, arr: np.ndarray) -> Any:
        fut = real_write(self, arr)
        gate.set()
        return fut

    monkeypatch.setattr(writer_mod.ColumnFile, "write", write_then_release)
    root = tmp_path / "s"
    x = aligned_empty((1100, WIDTH), np.float32)  # more than DIRECT_BYTES: written from this array
    x[:] = np.random.default_rng(11).standard_normal(x.shape, dtype=np.float32)
    with ss.create(root, {"x": ss.Field("float32", (WIDTH,))}, direct_io=True) as w:
        w._pool.submit(gate.wait)  # the writer's one checksum thread waits for the first write to return
        w.append_batch({"x": x})
    path = root / "shard-000000" / "x.npy"
    np.testing.assert_array_equal(np.load(path), x)
    want = zlib.crc32(path.read_bytes()[PAGE_HEADER_BYTES:])
    assert ss.open(root).manifest.shards[0].files["x.npy"].crc32 == want
    assert verify(root) == []


def test_staged_small_batches_are_written_direct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches below DIRECT_BYTES are copied into the writer's staging arrays, which are page aligned:
    at the commit, a full staging array (4 MiB) and the next one (1 MiB) go through the direct
    descriptor, back to back."""
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    spy = PwriteSpy()
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    rng = np.random.default_rng(1)
    steps: list[Step] = [make_batch(rng, 64 * k, 64, _np_empty) for k in range(20)]
    batches = write_store(tmp_path / "s", steps)
    check_store(tmp_path / "s", batches)
    staging = writer_mod.DIRECT_BYTES  # 1024 records of one page
    for name in FIXED_FILES:
        assert spy.of(name) == [(staging, PAGE_HEADER_BYTES), (256 * 4096, PAGE_HEADER_BYTES + staging)], name


def test_buffer_full_flush_of_small_batches_goes_direct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When a small batch fills the buffer, the flush joins it with the staged rows into page-aligned
    memory, so that flush is a direct write too (not only the one at the commit)."""
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    spy = PwriteSpy()
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    rng = np.random.default_rng(11)
    steps: list[Step] = [make_batch(rng, 64 * k, 64, _np_empty) for k in range(12)]
    batches = write_store(tmp_path / "s", steps, buffer_bytes=3 << 20)  # 384 records of the two columns
    check_store(tmp_path / "s", batches)
    for name in FIXED_FILES:
        sizes = [n for n, _ in spy.of(name)]
        assert sum(sizes) == 12 * 64 * 4096 and len(sizes) >= 2, (name, sizes)


def test_packed_group_given_as_fields_goes_direct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large batch that gives the packed group as its fields is assembled into page-aligned memory."""
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    spy = PwriteSpy()
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    rng = np.random.default_rng(12)
    batches = write_store(tmp_path / "s", [make_batch(rng, 0, 900, as_fields=True)])
    check_store(tmp_path / "s", batches)
    assert spy.of("grp.npy") == [(900 * 4096, PAGE_HEADER_BYTES)]


@pytest.mark.parametrize("alloc", [_misaligned, _np_empty], ids=["misaligned", "np.empty"])
def test_unaligned_memory_is_copied_into_aligned_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      alloc: Alloc) -> None:
    """Large batches from memory that is not page aligned are copied into an aligned buffer and written
    directly, in whole pages back to back from the header, and read back identical."""
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    spy = PwriteSpy()
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    rng = np.random.default_rng(2)
    steps: list[Step] = [make_batch(rng, 0, 600, alloc), "commit", make_batch(rng, 600, 700, alloc)]
    batches = write_store(tmp_path / "s", steps)
    check_store(tmp_path / "s", batches)
    for name in FIXED_FILES:
        writes = spy.of(name)
        assert writes and all(n % ALIGN == 0 and off % ALIGN == 0 for n, off in writes), writes
        assert sum(n for n, _ in writes) == sum(b.n for b in batches) * WIDTH * 4  # page rows: all direct


def test_unaligned_row_size_keeps_going_direct_holding_the_end_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of 4004 bytes: each big append writes whole pages directly and holds back the bytes after
    the last page boundary, which go with the next append's pages (so every direct write starts where
    the previous one ended) and, at the shard's end, through the page cache; a page-sized column of the
    same batches goes direct as it is."""
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    spy = PwriteSpy()
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    rng = np.random.default_rng(3)
    row, b = 1001, 600  # one batch is more than DIRECT_BYTES: written from these arrays
    ys, zs = [], []
    schema = {"y": ss.Field("float32", (row,)), "z": ss.Field("float32", (WIDTH,))}
    with ss.create(tmp_path / "s", schema, direct_io=True) as w:
        for k in range(4):
            y = aligned_empty((b, row), np.float32)
            y[:] = rng.standard_normal(y.shape, dtype=np.float32)
            z = aligned_empty((b, WIDTH), np.float32)
            z[:] = rng.standard_normal(z.shape, dtype=np.float32)
            w.append_batch({"y": y, "z": z}, ids=[f"r{b * k + i}" for i in range(b)])
            ys.append(y)
            zs.append(z)
            if k == 1:
                w.commit()
    store = ss.open(tmp_path / "s")
    assert store.num_shards == 2 and len(store) == 4 * b
    got = store.get_batch(np.arange(4 * b))
    np.testing.assert_array_equal(got["y"], np.concatenate(ys))
    np.testing.assert_array_equal(got["z"], np.concatenate(zs))
    assert store.index(f"r{4 * b - 1}") == 4 * b - 1
    for k, shard in enumerate(store.manifest.shards):
        assert shard.records == 2 * b
        for name, parts in (("y.npy", ys), ("z.npy", zs)):
            path = tmp_path / "s" / shard.name / name
            assert read_header(path).data_offset == PAGE_HEADER_BYTES
            np.testing.assert_array_equal(np.load(path, mmap_mode="r"), np.concatenate(parts[2 * k : 2 * k + 2]))
    assert verify(tmp_path / "s") == []
    body = b * row * 4 // ALIGN * ALIGN
    both = 2 * b * row * 4 // ALIGN * ALIGN
    assert body < b * row * 4 and both < 2 * b * row * 4
    assert spy.of("y.npy") == [(body, PAGE_HEADER_BYTES), (both - body, PAGE_HEADER_BYTES + body)] * 2
    z_bytes = b * WIDTH * 4
    assert spy.of("z.npy") == [(z_bytes, PAGE_HEADER_BYTES), (z_bytes, PAGE_HEADER_BYTES + z_bytes)] * 2


def test_small_and_large_appends_mixed_over_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Single records, small batches and large aligned ones interleaved, with commits and shard splits
    (max_shard_records cuts large batches into pieces): everything reads back, both paths were used."""
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    spy = PwriteSpy()
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    rng = np.random.default_rng(4)
    sizes_kw: list[tuple[int, dict[str, Any]]] = [
        (5, {"one_by_one": True}),
        (700, {}),
        (3, {}),
        (2, {"one_by_one": True}),
        (900, {"as_fields": True}),
        (17, {}),
        (0, {"commit": True}),
        (1100, {}),
        (40, {"alloc": _misaligned}),
        (300, {}),
    ]
    steps: list[Step] = []
    first = 0
    for n, kw in sizes_kw:
        if kw.pop("commit", False):
            steps.append("commit")
            continue
        steps.append(make_batch(rng, first, n, **kw))
        first += n
    batches = write_store(tmp_path / "s", steps, buffer_bytes=256 << 10, max_shard_records=1000)
    store = check_store(tmp_path / "s", batches)
    assert store.num_shards >= 4
    assert max(s.records for s in store.manifest.shards) <= 1000
    assert spy.of("x.npy") and spy.of("grp.npy")  # the big aligned pieces went direct
    for _name, n, off in spy.calls:
        assert n >= writer_mod.DIRECT_IO_BYTES and n % ALIGN == 0 and off % ALIGN == 0


@pytest.mark.parametrize("fail_after", [0, 1 << 20], ids=["at-once", "part-way"])
def test_einval_falls_back_to_buffered_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_after: int) -> None:
    """A direct write refused with EINVAL (at once, or after writing part of its bytes) is written
    through the page cache instead, and that file is not tried directly again."""
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    spy = PwriteSpy(fail=errno.EINVAL, fail_after=fail_after)
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    rng = np.random.default_rng(5)
    steps: list[Step] = [make_batch(rng, 0, 700), make_batch(rng, 700, 600), "commit", make_batch(rng, 1300, 500)]
    batches = write_store(tmp_path / "s", steps)
    check_store(tmp_path / "s", batches)
    for name in FIXED_FILES:  # one refused attempt per file and shard
        assert spy.of(name) == [(700 * 4096, PAGE_HEADER_BYTES), (500 * 4096, PAGE_HEADER_BYTES)]


@pytest.mark.parametrize("fail", [None, errno.EINVAL], ids=["direct", "einval"])
def test_ragged_values_go_direct_in_aligned_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 fail: int | None) -> None:
    """A ragged field's values (appends of any byte length) are written in page-aligned runs back to
    back from the one-page header, each at least 1 MiB, with the bytes after the last page boundary
    held back and written through the page cache at the shard's end; the store reads back identical,
    and verifies. A direct write refused with EINVAL writes the held and the new bytes buffered."""
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    spy = PwriteSpy(fail=fail)
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    rng = np.random.default_rng(9)
    schema = {"f": ss.Field("float32", (None, 40)), "n": ss.Field("int64")}
    lengths = rng.integers(50, 301, 3000)
    values = rng.standard_normal((int(lengths.sum()), 40), dtype=np.float32)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    root = tmp_path / "s"
    with ss.create(root, schema, direct_io=True, buffer_bytes=3 << 20) as w:
        for a in range(0, 3000, 97):  # appends of odd sizes: never a whole number of pages
            b = min(a + 97, 3000)
            w.append_batch({"f": (values[starts[a] : starts[b]], lengths[a:b]), "n": np.arange(a, b)})
            if a == 1455:
                w.commit()
    store = ss.open(root)
    got = store.get_batch(np.arange(3000))
    np.testing.assert_array_equal(got["f"][0], values)
    np.testing.assert_array_equal(got["f"][1], lengths)
    assert verify(root) == []
    for shard in store.manifest.shards:
        assert read_header(root / shard.name / "f.npy").data_offset == PAGE_HEADER_BYTES
    writes = spy.of("f.npy")
    if fail is not None:  # one refused attempt per shard, then the page cache
        assert len(writes) == 2
        return
    assert len(writes) > 4 and all(n % ALIGN == 0 and n >= 1 << 20 for n, _ in writes)
    direct = 0
    for n, off in writes:
        if off == PAGE_HEADER_BYTES:  # a new shard's file
            direct = PAGE_HEADER_BYTES
        assert off == direct  # back to back
        direct += n
    total = values.nbytes
    assert sum(n for n, _ in writes) > total - 2 * (1 << 20) * len(store.manifest.shards)


def test_a_failed_background_direct_write_fails_the_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run copied into the writer's aligned buffer is written by its thread; ENOSPC there is raised by
    the next append or the commit, the writer is then aborted, and the committed records stay intact."""
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    rng = np.random.default_rng(10)
    schema = {"f": ss.Field("float32", (None, 40))}
    root = tmp_path / "s"

    def batch(n: int) -> tuple[np.ndarray, np.ndarray]:
        lengths = rng.integers(50, 301, n)
        return rng.standard_normal((int(lengths.sum()), 40), dtype=np.float32), lengths

    first = batch(300)
    w = ss.create(root, schema, direct_io=True, buffer_bytes=1 << 20)
    w.append_batch({"f": first})
    w.commit()
    spy = PwriteSpy(fail=errno.ENOSPC)
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    with pytest.raises(OSError) as info:
        for _ in range(20):
            w.append_batch({"f": batch(300)})
        w.commit()
    assert info.value.errno == errno.ENOSPC and spy.calls
    w.abort()
    store = ss.open(root)
    assert len(store) == 300
    np.testing.assert_array_equal(store.get_batch(np.arange(300))["f"][0], first[0])
    assert verify(root) == []


def test_other_direct_write_errors_fail_the_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC from a direct write propagates; the writer then refuses everything but abort(), which
    releases every file; the committed records stay intact."""
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    root = tmp_path / "s"
    rng = np.random.default_rng(6)
    b0, b1, b2 = make_batch(rng, 0, 600), make_batch(rng, 600, 600), make_batch(rng, 1200, 10)
    w = ss.create(root, SCHEMA, packed=PACK, direct_io=True)
    append_batch(w, b0)
    w.commit()
    spy = PwriteSpy(fail=errno.ENOSPC)
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    with pytest.raises(OSError) as info:
        append_batch(w, b1)
    assert info.value.errno == errno.ENOSPC and len(spy.calls) == 1
    monkeypatch.setattr(writer_mod, "pwrite_all", pwrite_all)
    b2.one_by_one = True
    for refused in (lambda: append_batch(w, b2), lambda: w.append_batch({"x": b2.x}), w.commit):
        with pytest.raises(ss.SeqstoreError, match="abort"):
            refused()
    w.abort()
    assert fds_under(root) == []
    check_store(root, [b0])
    # the store takes new writers afterwards
    with ss.append_to(root, direct_io=True) as w2:
        append_batch(w2, b1)
    check_store(root, [b0, b1])


def test_filesystem_without_o_direct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where open_direct finds no O_DIRECT, files still get one-page headers and hold the same bytes."""
    monkeypatch.setattr(writer_mod, "open_direct", lambda path: None)
    spy = PwriteSpy()
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    rng = np.random.default_rng(7)
    steps: list[Step] = [make_batch(rng, 0, 700), make_batch(rng, 700, 30), "commit", make_batch(rng, 730, 600)]
    batches = write_store(tmp_path / "s", steps)
    check_store(tmp_path / "s", batches)
    assert spy.calls == []


def test_direct_io_off_still_page_aligns_fixed_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """direct_io=False (the default of create): no direct writes, but fixed-size and packed files still
    start their data on a page (one-page header; ragged, offsets and id files keep 128 bytes)."""
    spy = PwriteSpy()
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    rng = np.random.default_rng(8)
    batches = write_store(tmp_path / "s", [make_batch(rng, 0, 700)], direct_io=False)
    check_store(tmp_path / "s", batches, header=PAGE_HEADER_BYTES, ragged_header=HEADER_BYTES)
    assert spy.calls == []


def test_open_or_create_and_append_to_take_direct_io(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """open_or_create/append_to pass direct_io on; shards of writers with and without direct I/O (both
    with one-page headers on fixed files) read back and verify."""
    monkeypatch.setattr(writer_mod, "open_direct", _plain_direct)
    spy = PwriteSpy()
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    root = tmp_path / "s"
    rng = np.random.default_rng(9)
    b = [make_batch(rng, 0, 600), make_batch(rng, 600, 500), make_batch(rng, 1100, 400)]
    with writer_api.open_or_create(root, SCHEMA, packed=PACK, direct_io=True) as w:
        append_batch(w, b[0])
    with ss.append_to(root) as w:
        append_batch(w, b[1])
    with ss.append_to(root, direct_io=True) as w:
        append_batch(w, b[2])
    store = ss.open(root)
    assert store.num_shards == 3
    for shard in store.manifest.shards:
        for name in FIXED_FILES:
            assert read_header(root / shard.name / name).data_offset == PAGE_HEADER_BYTES
    assert len(spy.of("x.npy")) == 2
    # check_store's per-file header check assumes one size: compare the data of the mixed store here
    x = _cat(b, "x")
    np.testing.assert_array_equal(store.get_batch(np.arange(len(x)))["x"], x)
    np.testing.assert_array_equal(store.matrix(["grp"]), _cat(b, "grp"))
    assert verify(root) == []


# ------------------------------------------------------------------------------------ directio


@pytest.mark.parametrize(
    "shape",
    [(), (0,), (0, 7), (5, 0), (1,), (3, 5), (1000, 3), (1 << 20,), (600, 1024)],
)
@pytest.mark.parametrize("dtype", ["float32", "int8", "complex128", "bool", "<u2"])
def test_aligned_empty(shape: tuple[int, ...], dtype: str) -> None:
    """Page aligned, writable, C-contiguous arrays of the requested shape and dtype (zero-size too)."""
    arr = aligned_empty(shape, dtype)
    assert arr.shape == shape and arr.dtype == np.dtype(dtype)
    assert is_aligned(arr) and arr.flags.writeable and arr.flags.c_contiguous
    arr[...] = np.arange(arr.size).reshape(shape).astype(dtype)
    np.testing.assert_array_equal(arr, np.arange(arr.size).reshape(shape).astype(dtype))


def test_aligned_empty_arrays_are_independent() -> None:
    a = aligned_empty((3000,), np.int64)
    b = aligned_empty((3000,), np.int64)
    a[:] = 1
    b[:] = 2
    assert int(a.sum()) == 3000 and int(b.sum()) == 6000
    assert not np.shares_memory(a, b)


def test_is_aligned() -> None:
    a = aligned_empty((2 * ALIGN,), np.uint8)
    assert is_aligned(a) and is_aligned(a[ALIGN:]) and not is_aligned(a[1:]) and not is_aligned(a[ALIGN - 8 :])


def test_open_direct(tmp_path: Path) -> None:
    """A write-only descriptor (or None without O_DIRECT) on an existing file; a missing file is an error."""
    p = tmp_path / "f"
    p.write_bytes(b"")
    fd = open_direct(p)
    if fd is not None:
        try:
            buf = aligned_empty((ALIGN,), np.uint8)
            buf[:] = 7
            pwrite_all(fd, memoryview(buf), 0)
            with pytest.raises(OSError):
                os.read(fd, 1)  # write-only
        finally:
            os.close(fd)
        assert p.read_bytes() == b"\x07" * ALIGN
    with pytest.raises(FileNotFoundError):
        open_direct(tmp_path / "missing")


def test_pwrite_all_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pwrite_all keeps writing after short writes, and raises on a write of nothing."""
    real = os.pwrite
    sizes: list[int] = []

    def short(fd: int, data: Any, offset: int) -> int:
        n = real(fd, memoryview(data)[:1000], offset)
        sizes.append(n)
        return n

    monkeypatch.setattr(directio.os, "pwrite", short)
    p = tmp_path / "f"
    p.write_bytes(b"x" * 10)
    payload = np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)
    fd = os.open(p, os.O_WRONLY)
    try:
        pwrite_all(fd, memoryview(payload), 3)
        assert sizes == [1000] * 5
        monkeypatch.setattr(directio.os, "pwrite", lambda fd, data, offset: 0)
        with pytest.raises(OSError) as info:
            pwrite_all(fd, memoryview(payload), 0)
        assert info.value.errno == errno.EIO
    finally:
        os.close(fd)
    assert p.read_bytes() == b"xxx" + payload.tobytes()


# -------------------------------------------------------------------------------------- logger


def test_buffer_rows_examples() -> None:
    """Records per Logger buffer: rounded down to whole pages per unit when that leaves any."""
    assert _buffer_rows(2 << 20, [49152]) == 42  # 12 pages a record: any count is whole pages
    assert _buffer_rows(1 << 20, [12]) == 87040  # 87381 fit; 1024 records are 3 pages
    assert _buffer_rows(64 << 20, [12]) % 1024 == 0
    assert _buffer_rows(4096, [12]) == 341  # fewer than 1024 fit: kept
    assert _buffer_rows(100, [4096]) == 1  # a record larger than the buffer: one per buffer
    assert _buffer_rows(2 << 20, [4000, 8]) == 512  # lcm(128, 512) records
    assert _buffer_rows(1 << 20, [0, 4]) == 1 << 18


@given(
    st.integers(1, 1 << 28), st.lists(st.integers(0, 1 << 17), min_size=1, max_size=5), st.integers(1, 1 << 20)
)
@settings(max_examples=200, deadline=None)
def test_buffer_rows_properties(flush_bytes: int, row_bytes: list[int], max_rows: int) -> None:
    """At most what fits and at most max_rows (at least 1); whole pages per unit, as many as fit,
    whenever one page-whole count fits at all; else everything that fits."""
    fits = max(1, min(flush_bytes // max(sum(row_bytes), 1), max_rows))
    rows = _buffer_rows(flush_bytes, row_bytes, max_rows)
    assert 1 <= rows <= fits
    step = next(m for m in range(1, ALIGN + 1) if all(rb * m % ALIGN == 0 for rb in row_bytes))
    if fits >= step:
        assert all(rb * rows % ALIGN == 0 for rb in row_bytes)
        assert rows + step > fits  # the largest such count
    else:
        assert rows == fits


@pytest.mark.parametrize("direct_io", [True, False])
def test_logger_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_io: bool) -> None:
    """A Logger with buffers of more than 1 MiB (float32 group and an int64 group), then a second Logger
    appending to the same store: reopened, the records are identical. direct_io=True: one-page headers
    on the packed files and (where the filesystem has O_DIRECT) direct writes of whole pages."""
    spy = PwriteSpy()
    monkeypatch.setattr(writer_mod, "pwrite_all", spy)
    path = tmp_path / "log"
    rng = np.random.default_rng(10)
    grads, losses, labels, ids = [], [], [], []

    def log_some(lg: Logger, first: int, count: int) -> None:
        for start in range(first, first + count, 100):
            n = min(100, first + count - start)
            grad = rng.standard_normal((n, 999), dtype=np.float32)
            loss = rng.random(n, dtype=np.float32)
            label = np.arange(start, start + n, dtype=np.int64)
            batch_ids = [f"ex{i}" for i in range(start, start + n)]
            lg.log(batch_ids, {"grad": grad, "loss": loss, "label": label})
            grads.append(grad)
            losses.append(loss)
            labels.append(label)
            ids.extend(batch_ids)

    kw: dict[str, Any] = {"flush_bytes": 2 << 20, "commit_every_s": 3600, "direct_io": direct_io}
    with Logger(path, **kw) as lg:
        log_some(lg, 0, 1300)
    with Logger(path, **kw) as lg:
        log_some(lg, 1300, 400)
    store = ss.open(path)
    n = len(ids)
    assert len(store) == n == 1700
    got = store.get_batch(np.arange(n))
    np.testing.assert_array_equal(got["grad"], np.concatenate(grads))
    np.testing.assert_array_equal(got["loss"], np.concatenate(losses))
    np.testing.assert_array_equal(got["label"], np.concatenate(labels))
    np.testing.assert_array_equal(store.index_many(ids), np.arange(n))
    assert store.id(1699) == "ex1699"
    assert verify(path) == []
    assert set(store.groups) == {"packed-float32", "packed-int64"}
    for shard in store.manifest.shards:
        for name in ("packed-float32.npy", "packed-int64.npy"):
            assert read_header(path / shard.name / name).data_offset == PAGE_HEADER_BYTES
        assert read_header(path / shard.name / "_ids.npy").data_offset == HEADER_BYTES
    if not direct_io:
        assert spy.calls == []
        return
    if not direct_supported(tmp_path):
        pytest.skip(f"no O_DIRECT on {tmp_path}: the direct path cannot be observed")
    writes = spy.of("packed-float32.npy")
    # buffers of 512 records x 4000 bytes (500 pages): the two full ones go direct whole, back to back
    full = 512 * 4000
    assert (full, PAGE_HEADER_BYTES) in writes and (full, PAGE_HEADER_BYTES + full) in writes
    for n_bytes, off in writes:
        assert n_bytes % ALIGN == 0 and off % ALIGN == 0
