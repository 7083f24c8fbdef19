"""Merged id-index runs: the streaming k-way merge, which files a merge reads, and crash safety of
replacing runs (their files go only after the manifest that drops them is saved)."""

from __future__ import annotations

import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_testlib import edit_shard_meta

import seqstore as ss
from seqstore.format.manifest import Manifest
from seqstore.store.verify import verify
from seqstore.store.write import disk as writer_mod
from seqstore.store.writer import merge_sorted_runs

SCHEMA = {"x": ss.Field("int32")}


@given(
    st.lists(st.lists(st.integers(0, 6), max_size=40), min_size=1, max_size=9),
    st.integers(1, 5),
)
@settings(max_examples=200, deadline=None)
def test_merge_equals_a_stable_sort(runs: list[list[int]], chunk: int) -> None:
    """Few distinct hashes (many ties, across and within runs) and tiny chunks: the merged stream is
    the stable sort of the runs in order, and no round takes more than it must."""
    sources = []
    base = 0
    for run in runs:
        h = np.array(sorted(run), dtype=np.uint64)
        rows = np.arange(len(h), dtype=np.int64)  # ascending within equal hashes, as in a real index
        sources.append((h, rows, base))
        base += len(h)
    out = list(merge_sorted_runs(sources, chunk=chunk))
    got_h = np.concatenate([h for h, _ in out]) if out else np.zeros(0, np.uint64)
    got_r = np.concatenate([r for _, r in out]) if out else np.zeros(0, np.int64)
    all_h = np.concatenate([h for h, _, _ in sources])
    all_r = np.concatenate([r + b for _, r, b in sources])
    order = np.argsort(all_h, kind="stable")
    np.testing.assert_array_equal(got_h, all_h[order])
    np.testing.assert_array_equal(got_r, all_r[order])
    for (h1, _), (h2, _) in zip(out, out[1:]):
        assert h1[-1] < h2[0], "a tie was split across rounds"
    assert all(len(h) for h, _ in out)


def test_merge_of_memory_mapped_runs_is_bounded(tmp_path: Path) -> None:
    """Runs read through mmap; every chunk stays within sources x chunk entries (no ties here)."""
    rng = np.random.default_rng(0)
    sources = []
    for k in range(8):
        h = np.sort(rng.integers(0, 2**63, 5000, dtype=np.uint64))
        np.save(tmp_path / f"h{k}.npy", h)
        np.save(tmp_path / f"r{k}.npy", np.arange(5000, dtype=np.int64))
        sources.append(
            (np.load(tmp_path / f"h{k}.npy", mmap_mode="r"), np.load(tmp_path / f"r{k}.npy", mmap_mode="r"), 5000 * k)
        )
    out = list(merge_sorted_runs(sources, chunk=256))
    assert max(len(h) for h, _ in out) <= 8 * 256
    got = np.concatenate([h for h, _ in out])
    assert np.all(got[1:] >= got[:-1]) and len(got) == 40_000
    assert sorted(np.concatenate([r for _, r in out]).tolist()) == list(range(40_000))


def _write(root: Path, first: int, n: int, **kw: Any) -> None:
    with ss.append_to(root, max_shard_records=1, **kw) if (root / "manifest.json").exists() else ss.create(
        root, SCHEMA, max_shard_records=1, **kw
    ) as w:
        for i in range(first, first + n):
            w.append({"x": i}, id=f"id-{i}")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path, int], None]:
    """``written(root, n)``: at ``root``, a copy of the store ``_write(.., 0, n)`` makes (each written once
    per module: its many one-record shards are many commits; a test changes its own copy only)."""
    made: dict[int, Path] = {}

    def copy(root: Path, n: int) -> None:
        if n not in made:
            made[n] = tmp_path_factory.mktemp(f"written-{n}") / "s"
            _write(made[n], 0, n)
        shutil.copytree(made[n], root, symlinks=True)

    return copy


def _check(root: Path, n: int) -> None:
    store = ss.open(root)
    assert len(store) == n
    ids = [f"id-{i}" for i in range(n)]
    assert store.index_many(ids).tolist() == list(range(n))
    assert store.index("id-7") == 7
    for run in store.manifest.index_runs:
        h = np.load(root / f"{run.name}.hash.npy")
        r = np.load(root / f"{run.name}.rows.npy")
        assert len(h) == run.records and np.all(h[1:] >= h[:-1])
        lo = sum(s.records for s in store.manifest.shards[: run.first_shard])
        hi = sum(s.records for s in store.manifest.shards[: run.end_shard])
        assert sorted(r.tolist()) == list(range(lo, hi))
    listed = {f"{r.name.split('/')[1]}{s}" for r in store.manifest.index_runs for s in (".hash.npy", ".rows.npy")}
    on_disk = {p.name for p in (root / "_index").iterdir()} if (root / "_index").exists() else set()
    assert on_disk == listed
    assert verify(root) == []


def test_a_higher_level_merge_reads_only_the_runs_it_replaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             written: Callable[[Path, int], None]) -> None:
    root = tmp_path / "s"
    written(root, 63)  # 63 shards: seven level-1 runs and 7 shards not yet merged
    assert [r.level for r in Manifest.load(root).index_runs] == [1] * 7
    loaded: list[str] = []
    real_load = np.load

    def spy(path: Any, *a: Any, **k: Any) -> Any:
        loaded.append(Path(path).name)
        return real_load(path, *a, **k)

    monkeypatch.setattr(writer_mod.np, "load", spy)
    _write(root, 63, 1)  # shard 64: level-1 run of shards 56..63, then level 2 of the eight level-1 runs
    monkeypatch.undo()
    runs = Manifest.load(root).index_runs
    assert [(r.level, r.first_shard, r.end_shard) for r in runs] == [(2, 0, 64)]
    assert loaded.count("_ids.hash.npy") == 8 and loaded.count("_ids.hash_rows.npy") == 8  # the level-1 merge
    assert sum(name.startswith("run-") and name.endswith(".hash.npy") for name in loaded) == 8  # the level-2 one
    _check(root, 64)


def test_replaced_runs_are_deleted_only_after_the_manifest_is_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: Callable[[Path, int], None]
) -> None:
    root = tmp_path / "s"
    written(root, 63)
    before = sorted(p.name for p in (root / "_index").iterdir())
    assert len(before) == 14

    def crash(self: Manifest, root_: Path) -> None:
        raise KeyboardInterrupt("killed while saving the manifest")

    monkeypatch.setattr(Manifest, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        _write(root, 63, 1)
    monkeypatch.undo()
    # the saved manifest still lists the seven level-1 runs, and their files are all there
    assert set(before) <= {p.name for p in (root / "_index").iterdir()}
    _check_readable = ss.open(root)
    assert len(_check_readable) == 63 and _check_readable.index("id-62") == 62
    # the next writer drops the unlisted new runs and the dead writer's workspace; ids keep working
    _write(root, 63, 1)
    _check(root, 64)


def test_a_lost_run_is_rebuilt_from_its_shards(tmp_path: Path, written: Callable[[Path, int], None]) -> None:
    root = tmp_path / "s"
    written(root, 63)
    runs = Manifest.load(root).index_runs
    (root / f"{runs[2].name}.hash.npy").unlink()  # e.g. deleted by hand
    (root / f"{runs[4].name}.rows.npy").write_bytes(b"junk")
    _write(root, 63, 1)  # the level-2 merge takes shards 16..24 and 32..40 from the shards' indexes
    assert [r.level for r in Manifest.load(root).index_runs] == [2]
    _check(root, 64)


# ------------------------------------------------------------------------------------------ verify


def _run_files(root: Path) -> tuple[Path, Path]:
    (run,) = Manifest.load(root).index_runs
    return root / f"{run.name}.hash.npy", root / f"{run.name}.rows.npy"


def _rewrite(path: Path, edit: Any) -> None:
    arr = np.load(path)
    edit(arr)
    with open(path, "r+b") as f:  # in place: same header, same size
        f.seek(f.seek(0, 2) - arr.nbytes)
        f.write(arr.tobytes())


@pytest.mark.parametrize(
    "file, edit, match",
    [
        ("hash", lambda a: a.__setitem__(slice(3, 5), a[3:5][::-1].copy()), "not sorted"),
        ("rows", lambda a: a.__setitem__(0, 10_000), "rows outside"),
        ("rows", lambda a: a.__setitem__(5, a[6]), "pairs differ"),  # a duplicate row, one row missing
        ("rows", lambda a: a.__setitem__(slice(2, 4), a[2:4][::-1].copy()), "pairs differ"),
        ("hash", lambda a: a.__setitem__(slice(None), np.sort(a ^ np.uint64(1))), "pairs differ"),
    ],
)
def test_verify_checks_merged_runs(tmp_path: Path, file: str, edit: Any, match: str,
                                   written: Callable[[Path, int], None]) -> None:
    root = tmp_path / "s"
    written(root, 9)  # one level-1 run over shards 0..7
    assert verify(root) == []
    hash_path, rows_path = _run_files(root)
    _rewrite(hash_path if file == "hash" else rows_path, edit)
    problems = verify(root)
    assert len(problems) == 1 and match in problems[0], problems
    assert "_index/run-000000-000008" in problems[0]


def test_verify_checks_row_order_among_equal_hashes(tmp_path: Path) -> None:
    """A shard holding one id twice: its index lists the two rows ascending (index() finds the first)."""
    root = tmp_path / "s"
    with ss.create(root, SCHEMA) as w:
        for i, name in enumerate(["a", "dup", "b", "dup", "c"]):
            w.append({"x": i}, id=name)
    assert verify(root) == [] and ss.open(root).index("dup") == 1
    shard = root / "shard-000000"
    h = np.load(shard / "_ids.hash.npy")
    (k,) = np.flatnonzero(h[1:] == h[:-1])

    def swap(a: np.ndarray) -> None:
        a[k], a[k + 1] = a[k + 1], a[k]

    _rewrite(shard / "_ids.hash_rows.npy", swap)
    data = (shard / "_ids.hash_rows.npy").read_bytes()[-8 * 5 :]  # make the checksum agree: only the order is wrong
    edit_shard_meta(root, 0, lambda s: s["files"]["_ids.hash_rows.npy"].update(crc32=zlib.crc32(data)))
    problems = verify(root)
    assert len(problems) == 1 and "not ascending among equal hashes" in problems[0], problems
