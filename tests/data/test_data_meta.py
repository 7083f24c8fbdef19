"""MetaDataset: the id join equals a naive dict join; caching, missing ids, field clashes."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.data import MetaDataset, StoreDataset
from seqstore.data._join import id_hashes, join_rows


def _store(path: Path, ids: list[str], field: str, rng: np.random.Generator, shard_records: int = 0) -> StoreDataset:
    n = len(ids)
    lens = rng.integers(0, 5, n)
    vals = np.arange(int(lens.sum()), dtype=np.int64)
    kw = {"max_shard_records": shard_records} if shard_records else {}
    with seqstore.create(path, {field: Field("int64", (None,)), f"{field}_id": Field("int64")}, **kw) as w:
        if n:
            w.append_batch({field: (vals, lens), f"{field}_id": np.array([_num(s) for s in ids])},
                           ids=ids)
    return StoreDataset(path)


def _num(s: str) -> int:
    parts = s.split("-")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1


def _naive(control: list[str], other: list[str]) -> np.ndarray:
    first: dict[str, int] = {}
    for r, s in enumerate(other):
        first.setdefault(s, r)
    return np.array([first.get(s, -1) for s in control], dtype=np.int64)


@pytest.mark.parametrize("trial", range(6))
def test_join_equals_dict_join(tmp_path: Path, trial: int) -> None:
    rng = np.random.default_rng(trial)
    n = int(rng.integers(1, 3000))
    ids = [f"utt-{i}-{'x' * int(rng.integers(0, 4))}" for i in range(n)]
    ctrl_ids = list(rng.permutation(ids))
    keep = rng.random(n) > 0.2  # the other store lacks about 20 % and has extra ids and a duplicate
    other = [s for s, k in zip(ids, keep) if k] + [f"extra-{i}-" for i in range(50)]
    other = list(rng.permutation(other))
    if other:
        other.append(other[0])
    a = _store(tmp_path / "a.seqstore", ctrl_ids, "feat", rng, shard_records=int(rng.integers(50, 700)))
    b = _store(tmp_path / "b.seqstore", other, "text", rng, shard_records=int(rng.integers(50, 700)))
    expected = _naive(ctrl_ids, other)
    got = np.concatenate(list(join_rows(a.store, b.store, chunk=int(rng.integers(10, 500)))))
    np.testing.assert_array_equal(got, expected)

    with pytest.raises(KeyError, match=r"'b' lacks \d+ of the \d+ ids of 'a' \(first: \['utt-"):
        MetaDataset({"a": a, "b": b}, cache_dir=tmp_path / "cache")
    meta = MetaDataset({"a": a, "b": b}, missing="drop", cache_dir=tmp_path / "cache")
    kept = np.flatnonzero(expected >= 0)
    assert meta.num_seqs == len(kept)
    np.testing.assert_array_equal(meta.rows("b", np.arange(meta.num_seqs)), expected[kept])
    idx = rng.integers(0, meta.num_seqs, 20)
    batch = meta.get_batch(idx)
    np.testing.assert_array_equal(batch["feat_id"], batch["text_id"])  # same underlying sequence
    for j, i in enumerate(idx.tolist()):
        rec = meta.get(i)
        assert int(rec["feat_id"]) == int(rec["text_id"]) == int(batch["feat_id"][j])
        np.testing.assert_array_equal(rec["text"], batch["text"][0][batch["text"][1][:j].sum():][: batch["text"][1][j]])
    assert a.store.id(int(meta.control_rows([0])[0])) == b.store.id(int(meta.rows("b", [0])[0]))


def test_hash_matches_store_index(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ids = ["", "a", "ü-ß", "utt-000001", "x" * 300]
    d = _store(tmp_path / "h.seqstore", ids, "f", rng)
    shard = d.store.root / d.store.manifest.shards[0].name
    data, off = np.load(shard / "_ids.npy"), np.load(shard / "_ids.offsets.npy")
    h = id_hashes(data, off)
    stored = np.load(shard / "_ids.hash.npy")
    np.testing.assert_array_equal(np.sort(h), stored)


def test_cache_reuse_and_fingerprint(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    ids = [f"u-{i}" for i in range(5000)]
    a = _store(tmp_path / "a.seqstore", ids, "feat", rng)
    b = _store(tmp_path / "b.seqstore", list(rng.permutation(ids)), "text", rng)
    m1 = MetaDataset({"a": a, "b": b})  # default cache: beside the control store
    cache = tmp_path / "a.seqstore.cache"
    files = sorted(os.listdir(cache))
    assert any(f.endswith(".rows.npy") for f in files) and any(f.endswith(".json") for f in files)
    t = time.perf_counter()
    m2 = MetaDataset({"a": a, "b": b})
    assert time.perf_counter() - t < 0.5
    assert isinstance(m2._rows["b"], np.memmap)
    np.testing.assert_array_equal(m1.rows("b", np.arange(5000)), m2.rows("b", np.arange(5000)))
    m3 = pickle.loads(pickle.dumps(m2))
    assert len(pickle.dumps(m2)) < 5000
    np.testing.assert_array_equal(m3.rows("b", np.arange(5000)), m2.rows("b", np.arange(5000)))
    # appending to b changes its fingerprint: a new row map, never the stale one
    with seqstore.append_to(b.store.root) as w:
        w.append_batch({"text": (np.zeros(1, np.int64), np.array([1])), "text_id": np.array([9])}, ids=["new"])
    b2 = StoreDataset(b.store.root)
    MetaDataset({"a": a, "b": b2})
    assert len([f for f in os.listdir(cache) if f.endswith(".rows.npy")]) == 2


def test_fields_clash_and_rename(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    ids = [f"u-{i}" for i in range(20)]
    a = _store(tmp_path / "a.seqstore", ids, "x", rng)
    b = _store(tmp_path / "b.seqstore", ids[::-1], "x", rng)
    with pytest.raises(ValueError, match="field name clash: 'x' comes from both 'a' and 'b'"):
        MetaDataset({"a": a, "b": b}, cache_dir=tmp_path / "c")
    m = MetaDataset({"a": a, "b": b}, fields={"b": {"x": "bx", "x_id": "bx_id"}}, length_from="b",
                    cache_dir=tmp_path / "c")
    rec = m.get(3)
    assert set(rec) == {"x", "x_id", "bx", "bx_id"} and int(rec["x_id"]) == int(rec["bx_id"]) == 3
    np.testing.assert_array_equal(m.lengths().take([3]), [len(rec["bx"])])
    m = MetaDataset({"a": a, "b": b}, fields={"a": ["x_id"], "b": []}, cache_dir=tmp_path / "c")
    assert set(m.get_batch([0, 1])) == {"x_id"}
    with pytest.raises(ValueError, match="control 'zz'"):
        MetaDataset({"a": a, "b": b}, control="zz")


def _lens_store(path: Path, lens: np.ndarray, ids: list[str]) -> StoreDataset:
    with seqstore.create(path, {"x": Field("int32", (None,))}) as w:
        w.append_batch({"x": (np.zeros(int(lens.sum()), np.int32), lens)}, ids=ids)
    return StoreDataset(path)


def test_length_from_is_part_of_the_cache_key(tmp_path: Path) -> None:
    """Two meta datasets over the same ids (identical id fingerprints) that take their lengths from
    different children must not share the lengths / sort-index / kept-rows cache files."""
    ids = [f"u-{i}" for i in range(8)]
    la, lb = np.arange(1, 9), np.arange(8, 0, -1)
    a = _lens_store(tmp_path / "a.seqstore", la, ids)
    b = _lens_store(tmp_path / "b.seqstore", lb, ids)
    cache = tmp_path / "cache"
    fields = {"b": {"x": "bx"}}
    for name, lens in (("a", la), ("b", lb), ("a", la)):
        m = MetaDataset({"a": a, "b": b}, fields=fields, length_from=name, ordering="sorted", cache_dir=cache)
        np.testing.assert_array_equal(np.asarray(m.lengths_array()), lens)
        np.testing.assert_array_equal(m.epoch_order(1).to_numpy(), np.argsort(lens, kind="stable"))
        f = m.filter(max_length=3)
        np.testing.assert_array_equal(np.asarray(f.kept), np.flatnonzero(lens <= 3))
    ka = MetaDataset({"a": a, "b": b}, fields=fields, length_from="a", cache_dir=cache).cache_key()
    kb = MetaDataset({"a": a, "b": b}, fields=fields, length_from="b", cache_dir=cache).cache_key()
    assert ka != kb
    # a different length field of the same child changes the key too
    with seqstore.create(tmp_path / "c.seqstore", {"x": Field("int32", (None,)), "y": Field("int32", (None,))}) as w:
        w.append_batch({"x": (np.zeros(int(la.sum()), np.int32), la), "y": (np.zeros(int(lb.sum()), np.int32), lb)},
                       ids=ids)
    cx = StoreDataset(tmp_path / "c.seqstore", length_field="x")
    cy = StoreDataset(tmp_path / "c.seqstore", length_field="y")
    mx = MetaDataset({"a": a, "c": cx}, fields={"a": [], "c": ["y"]}, length_from="c", ordering="sorted_reverse",
                     cache_dir=cache)
    my = MetaDataset({"a": a, "c": cy}, fields={"a": [], "c": ["y"]}, length_from="c", ordering="sorted_reverse",
                     cache_dir=cache)
    np.testing.assert_array_equal(mx.epoch_order(1).to_numpy(), np.argsort(-la, kind="stable"))
    np.testing.assert_array_equal(my.epoch_order(1).to_numpy(), np.argsort(-lb, kind="stable"))


def test_bfloat16_fields_are_output_names(tmp_path: Path) -> None:
    ids = [f"u-{i}" for i in range(4)]
    with seqstore.create(tmp_path / "a.seqstore", {"w": Field("bfloat16", (2,)), "x": Field("int32", (None,))}) as w:
        w.append_batch({"w": np.ones((4, 2), np.float32), "x": (np.zeros(4, np.int32), np.ones(4, np.int64))},
                       ids=ids)
    with seqstore.create(tmp_path / "b.seqstore", {"w": Field("uint16", (2,))}) as w:
        w.append_batch({"w": np.ones((4, 2), np.uint16)}, ids=ids)
    a, b = StoreDataset(tmp_path / "a.seqstore"), StoreDataset(tmp_path / "b.seqstore")
    assert a.bfloat16_fields() == {"w"} and b.bfloat16_fields() == frozenset()
    assert StoreDataset(tmp_path / "a.seqstore", fields=["x"]).bfloat16_fields() == frozenset()
    m = MetaDataset({"a": a, "b": b}, fields={"a": {"w": "a_w", "x": "x"}}, cache_dir=tmp_path / "c")
    assert m.bfloat16_fields() == {"a_w"}
    assert m.filter(max_length=5).bfloat16_fields() == {"a_w"}
    from seqstore.data import ConcatDataset, SliceDataset

    assert ConcatDataset([m, m]).bfloat16_fields() == {"a_w"}
    assert SliceDataset(m, 1, 3).bfloat16_fields() == {"a_w"}


def test_join_uses_the_stores_id_hash() -> None:
    """One definition of the on-disk id hash and lookup: the join calls the store, it has no kernel copy."""
    from seqstore.data import _join
    from seqstore.store import ids as store_ids

    assert _join.hash_ids is store_ids.hash_ids
    assert not any(hasattr(_join, k) for k in ("_fnv_splitmix", "_equal", "_probe_sorted", "_match"))
    data, off = store_ids.encode_ids(["a", "bb", "ccc", "dddd"])
    # a slice of an id file: offsets not starting at 0, hashed exactly like the whole file
    np.testing.assert_array_equal(id_hashes(data[1:], off[1:]), store_ids.hash_ids(data, off)[1:])


def test_a_join_whose_kept_rows_were_deleted_is_made_again(tmp_path: Path) -> None:
    """A node cache may evict any derived file: the kept rows of a missing='drop' join too."""
    rng = np.random.default_rng(3)
    a = _store(tmp_path / "a.seqstore", [f"u-{i}" for i in range(40)], "feat", rng)
    b = _store(tmp_path / "b.seqstore", [f"u-{i}" for i in range(0, 40, 3)], "text", rng)
    first = MetaDataset({"a": a, "b": b}, missing="drop", cache_dir=tmp_path / "cache")
    want = first.rows("b", np.arange(first.num_seqs))
    (kept,) = (tmp_path / "cache").rglob("meta-*.kept.npy")
    kept.unlink()
    again = MetaDataset({"a": a, "b": b}, missing="drop", cache_dir=tmp_path / "cache")
    assert again.num_seqs == first.num_seqs == 14
    np.testing.assert_array_equal(again.rows("b", np.arange(again.num_seqs)), want)
    assert kept.exists()


_FULL_CACHE = r"""
import os, sys
from pathlib import Path
import seqstore as ss
from seqstore.data import CacheError
disk = Path(sys.argv[1])
store = ss.StoreDataset(os.environ["META_STORE"])
with open(disk / "filler", "wb") as f:  # no room left
    try:
        while True:
            f.write(bytes(1 << 16))
            f.flush()
    except OSError:
        pass
try:
    ss.MetaDataset({"a": store}, cache_dir=disk / "cache")
except CacheError as exc:
    print("CacheError", exc)
except BaseException as exc:
    print("other", type(exc).__name__, exc)
else:
    print("no error")
print("left", sorted(p.name for p in (disk / "cache").iterdir()))
"""


def test_a_join_on_a_full_cache_disk_names_the_file_and_leaves_nothing(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The join's sidecar on a cache file system with no room left raised a bare OSError and left its
    temporary file behind; now a CacheError names the file (and the cache_dir= way out), and nothing is left.
    Runs on a small tmpfs of its own (skipped where user namespaces are not allowed)."""
    from support.tmpfs import run_on_small_tmpfs

    _store(tmp_path / "a.seqstore", [f"u{i}" for i in range(20)], "feat", np.random.default_rng(0))
    monkeypatch.setenv("META_STORE", str(tmp_path / "a.seqstore"))
    disk, got = run_on_small_tmpfs(_FULL_CACHE, tmp_path, "256k")
    assert got.returncode == 0, got.stderr[-2000:]
    assert "CacheError" in got.stdout and "meta-" in got.stdout and "cache_dir=" in got.stdout, got.stdout
    assert "left []" in got.stdout, got.stdout


def test_a_reused_row_map_in_a_node_cache_is_marked_used(tmp_path: Path) -> None:
    """A MetaDataset's row maps (and kept rows) in a node cache's derived directory kept their writing's
    mtime however often they were reused, so evictions took them first though every open used them, and
    the next open joined the stores again (O(N)). Reusing one marks it recently used, as cached arrays are."""
    from seqstore.io.nodecache import NodeCache, budget_directory

    rng = np.random.default_rng(0)
    a = _store(tmp_path / "a.seqstore", [f"u-{i}" for i in range(300)], "feat", rng)
    b = _store(tmp_path / "b.seqstore", [f"u-{i}" for i in range(0, 300, 2)], "text", rng)
    cache = NodeCache(tmp_path / "cache", 1 << 24)
    derived = cache.root / "derived" / "meta"
    derived.mkdir(parents=True)
    budget_directory(derived, cache)
    MetaDataset({"a": a, "b": b}, missing="drop", cache_dir=derived)
    made = sorted(p.name for p in derived.glob("*.npy"))
    assert len(made) == 2  # the row map of b and the kept rows
    obj = cache.object("s3://bucket/object", "etag", 1 << 20)
    obj.fill(0, memoryview(bytes(1 << 20)))
    now = os.stat(obj.bits_path).st_mtime
    for p in derived.iterdir():  # written long ago
        os.utime(p, (now - 100, now - 100))
    os.utime(obj.bits_path, (now - 50, now - 50))  # used since
    again = MetaDataset({"a": a, "b": b}, missing="drop", cache_dir=derived)  # reuses them
    assert len(again) == 150
    with cache.locked():
        cache._evict(cache.disk_usage() - 1)  # room for one more byte: the least recently used goes
    assert not obj.bits_path.exists()
    assert sorted(p.name for p in derived.glob("*.npy")) == made
