"""Reading: zero-copy read-only views, plain .npy files, lengths, ids, refresh, pickling, create rules."""

from __future__ import annotations

import json
import multiprocessing as mp
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from store_testlib import (
    CHILD_SCHEMA,
    check_files,
    child_read,
    child_record,
    mmap_backed,
    npy_files,
)

import seqstore as ss


def _write_child_store(root: Path, n: int, *, max_shard_records: int = 4, ids: bool = True) -> None:
    with ss.create(root, CHILD_SCHEMA, max_shard_records=max_shard_records) as w:
        for i in range(n):
            w.append(child_record(0, i), id=f"w0-{i}" if ids else None)


def test_views_are_read_only_and_zero_copy(scratch: Path) -> None:
    root = scratch / "s"
    _write_child_store(root, 10)
    store = ss.open(root)
    for i in range(10):
        a, b = store[i], store[i]
        for name in ("x", "meta/k"):
            assert a[name].flags.writeable is False
            with pytest.raises(ValueError):
                a[name][...] = 0
            if a[name].size:
                assert mmap_backed(a[name])
                assert np.shares_memory(a[name], b[name])  # two reads: the same mapped bytes
        assert isinstance(a["meta/k"], np.ndarray) and a["meta/k"].shape == ()
    nested = store.nested(3)
    assert set(nested) == {"x", "meta"} and set(nested["meta"]) == {"k"}
    assert nested["meta"]["k"].flags.writeable is False and int(nested["meta"]["k"]) == 3
    # a record with 0 rows is an empty read-only array of the right shape
    empty = store[0]["x"]
    assert empty.shape == (0, 3) and empty.dtype == np.float32 and empty.flags.writeable is False


def test_zero_size_columns_are_read_only(scratch: Path) -> None:
    root = scratch / "s"
    with ss.create(root, {"x": ss.Field("float32", (None, 2)), "z": ss.Field("int8", (0,))}) as w:
        w.append({"x": np.zeros((0, 2), np.float32), "z": np.zeros(0, np.int8)})
    rec = ss.open(root)[0]
    assert rec["x"].shape == (0, 2) and rec["z"].shape == (0,)
    assert rec["x"].flags.writeable is False and rec["z"].flags.writeable is False


def test_np_load_every_file(scratch: Path) -> None:
    """Every .npy of a store (data, offsets, ids, hashes, merged index runs) opens with plain numpy."""
    root = scratch / "s"
    _write_child_store(root, 40, max_shard_records=2)  # 20 shards -> a merged run under _index/
    store = ss.open(root)
    assert store.manifest.index_runs, "expected merged index runs"
    files = npy_files(root)
    kinds = {p.name.split(".", 1)[1] if "." in p.name else p.name for p in files}
    assert {"npy", "offsets.npy", "hash.npy", "hash_rows.npy", "rows.npy"} <= kinds
    assert any(p.parent.name == "meta" for p in files)  # nested field "meta/k" -> meta/k.npy
    for p in files:
        arr = np.load(p, mmap_mode="r")
        assert isinstance(arr, np.memmap)
        ref = np.load(p)  # and without mmap
        np.testing.assert_array_equal(arr, ref)
    # and the contents match what the store returns (check_files compares every file)
    expected = [{"x": store[i]["x"].copy(), "meta/k": store[i]["meta/k"].copy()} for i in range(len(store))]
    for i in range(40):
        want = child_record(0, i)
        np.testing.assert_array_equal(expected[i]["x"], want["x"])
    check_files(store, expected, [f"w0-{i}" for i in range(40)])


def test_lengths_object(scratch: Path) -> None:
    root = scratch / "s"
    _write_child_store(root, 23, max_shard_records=5)
    store = ss.open(root)
    want = np.array([i % 5 for i in range(23)], dtype=np.int64)
    lengths = store.lengths()  # the only ragged field
    assert isinstance(lengths, ss.Lengths) and lengths.field == "x"
    assert len(lengths) == 23 and lengths.shape == (23,) and lengths.dtype == np.int64
    assert lengths[7] == 2 and lengths[-1] == want[-1] and lengths[np.int64(4)] == 4
    np.testing.assert_array_equal(lengths[3:17:3], want[3:17:3])
    np.testing.assert_array_equal(lengths[[22, 0, 5, 5, -2]], want[[22, 0, 5, 5, -2]])
    np.testing.assert_array_equal(lengths.take(np.array([[1, 2], [3, 4]])), want[[[1, 2], [3, 4]]])
    np.testing.assert_array_equal(np.asarray(lengths), want)
    np.testing.assert_array_equal(np.asarray(lengths, dtype=np.int32), want.astype(np.int32))
    assert list(lengths) == want.tolist()
    chunks = list(lengths.iter_chunks(size=3))
    assert max(len(c) for c in chunks) <= 3
    np.testing.assert_array_equal(np.concatenate(chunks), want)
    assert store.lengths("x")[9] == 4
    for bad in (23, -24):
        with pytest.raises(IndexError):
            lengths[bad]
    with pytest.raises(IndexError):
        lengths[[0, 23]]
    with pytest.raises(ValueError, match="not ragged"):
        store.lengths("meta/k")
    with pytest.raises(ValueError):
        store.lengths("nope")
    assert "Lengths" in repr(lengths)


def test_lengths_save_refuses_a_dtype_that_cannot_hold_them(scratch: Path) -> None:
    """Lengths.save(dtype=...) with an integer dtype too small for the longest record raises, naming the
    record, instead of writing wrapped-around lengths (300 as uint8 would read back as 44)."""
    root = scratch / "s"
    with ss.create(root, {"t": ss.Field("int32", (None,))}, max_shard_records=2) as w:
        for n in (3, 0, 5, 300, 7):
            w.append({"t": np.zeros(n, np.int32)})
    lengths = ss.open(root).lengths()
    assert np.load(lengths.save(scratch / "auto.npy")).dtype == np.uint16
    np.testing.assert_array_equal(np.load(lengths.save(scratch / "i2.npy", dtype=np.int16)), [3, 0, 5, 300, 7])
    for small in (np.uint8, np.int8):
        with pytest.raises(ValueError, match="record 3"):
            lengths.save(scratch / "small.npy", dtype=small)
        assert not (scratch / "small.npy").exists() and not list(scratch.glob(".small.npy.tmp-*"))


def test_get_batch_details(scratch: Path) -> None:
    root = scratch / "s"
    _write_child_store(root, 12, max_shard_records=5)
    store = ss.open(root)
    out = store.get_batch([11, 0, 4, 4, -1], fields=["x"], pad=True)
    assert list(out) == ["x"]
    values, lengths = out["x"]
    assert lengths.tolist() == [1, 0, 4, 4, 1]
    assert values.shape == (5, 4, 3) and values.flags.writeable
    np.testing.assert_array_equal(values[2, :4], child_record(0, 4)["x"])
    assert (values[0, 1:] == 0).all() and (values[1] == 0).all()
    flat, lens = store.get_batch(np.array([2, 3], dtype=np.uint8))["x"]
    np.testing.assert_array_equal(flat, np.concatenate([child_record(0, 2)["x"], child_record(0, 3)["x"]]))
    assert store.get_batch([5, 6])["meta/k"].tolist() == [5, 6]
    with pytest.raises(KeyError, match="nope"):
        store.get_batch([0], fields=["nope"])
    with pytest.raises(IndexError, match="12"):
        store.get_batch([0, 12])
    with pytest.raises(IndexError, match="-13"):
        store.get_batch([-13])
    with pytest.raises(TypeError):
        store.get_batch([0.5])
    with pytest.raises(TypeError):
        store["0"]  # type: ignore[index]


def test_ids_api(scratch: Path) -> None:
    root = scratch / "s"
    _write_child_store(root, 15, max_shard_records=4)
    store = ss.open(root)
    assert store.has_ids
    assert store.id(0) == "w0-0" and store.id(-1) == "w0-14" and store.id(np.int64(7)) == "w0-7"
    with pytest.raises(IndexError):
        store.id(15)
    assert store.index("w0-9") == 9
    with pytest.raises(KeyError, match="w0-99"):
        store.index("w0-99")
    with pytest.raises(TypeError):
        store.index(9)  # type: ignore[arg-type]
    assert store.index_many(["w0-3", "w0-14", "w0-3"]).tolist() == [3, 14, 3]
    assert store.index_many([]).tolist() == []
    with pytest.raises(KeyError) as info:
        store.index_many(["w0-1", "missing-one", "missing-two"])
    assert "missing-one" in str(info.value) and "missing-two" in str(info.value)
    got = store.index_many(["missing", "w0-2"], missing=-1)
    assert got.dtype == np.int64 and got.tolist() == [-1, 2]


def test_store_without_ids(scratch: Path) -> None:
    root = scratch / "s"
    _write_child_store(root, 3, ids=False)
    store = ss.open(root)
    assert not store.has_ids
    with pytest.raises(KeyError):
        store.id(0)
    with pytest.raises(KeyError):
        store.index("w0-0")
    with pytest.raises(KeyError):
        store.index_many(["w0-0"])
    assert not any(p.name.startswith("_ids") for p in npy_files(root))


def test_empty_store(scratch: Path) -> None:
    root = scratch / "s"
    ss.create(root, CHILD_SCHEMA).close()
    store = ss.open(root)
    assert len(store) == 0 and store.num_shards == 0 and list(store) == []
    with pytest.raises(IndexError):
        store[0]
    with pytest.raises(IndexError):
        store[-1]
    out = store.get_batch([], pad=True)
    assert out["x"][0].shape == (0, 0, 3) and out["x"][1].shape == (0,)
    assert out["meta/k"].shape == (0,)
    assert store.get_batch([])["x"][0].shape == (0, 3)
    assert np.asarray(store.lengths()).shape == (0,)
    assert store.index_many([]).tolist() == []
    with pytest.raises(KeyError, match="anything"):
        store.index("anything")
    with pytest.raises(KeyError, match="anything"):
        store.index_many(["anything"])
    assert store.index_many(["anything"], missing=-3).tolist() == [-3]


def test_refresh_sees_new_shards(scratch: Path) -> None:
    root = scratch / "s"
    _write_child_store(root, 5, max_shard_records=5)
    store = ss.open(root)
    old = store[4]
    assert len(store) == 5
    w = ss.append_to(root, max_shard_records=3)
    for i in range(5, 12):
        w.append(child_record(0, i), id=f"w0-{i}")
    w.commit()
    assert len(store) == 5  # a reader sees exactly the shards of the manifest it read
    with pytest.raises(IndexError):
        store[5]
    assert store.refresh() is store
    assert len(store) == 12 and store.num_shards == 4
    np.testing.assert_array_equal(store[11]["x"], child_record(0, 11)["x"])
    assert store.index("w0-10") == 10 and store.id(11) == "w0-11"
    np.testing.assert_array_equal(old["x"], child_record(0, 4)["x"])  # earlier views stay valid
    w.append(child_record(0, 12), id="w0-12")  # not committed: invisible even after refresh
    store.refresh()
    assert len(store) == 12
    w.close()
    assert len(store.refresh()) == 13 and ss.open(root).id(12) == "w0-12"


def test_pickle_is_the_path(scratch: Path) -> None:
    root = scratch / "s"
    _write_child_store(root, 50, max_shard_records=8)
    store = ss.open(root, bfloat16="float32")
    store[3]  # map something: it must not travel
    blob = pickle.dumps(store)
    assert len(blob) < 400, len(blob)
    again = pickle.loads(blob)
    assert isinstance(again, ss.Store) and again is not store
    assert len(again) == 50 and again.root == store.root
    np.testing.assert_array_equal(again[49]["x"], store[49]["x"])
    assert "Store" in repr(store) and "50" in repr(store)


def test_a_pickled_store_keeps_its_view_when_shards_are_added(scratch: Path) -> None:
    """A worker that unpickles a Store sees the records the parent saw, not shards committed since,
    also when a merge of the id index now crosses that boundary; refresh() moves on."""
    root = scratch / "s"
    _write_child_store(root, 13, max_shard_records=2)  # 7 shards, no merged run yet
    store = ss.open(root)
    blob = pickle.dumps(store)
    with ss.append_to(root, max_shard_records=2) as w:  # shards 7..11: a level-1 run over shards 0..8
        for i in range(13, 23):
            w.append(child_record(0, i), id=f"w0-{i}")
    assert [(r.first_shard, r.end_shard) for r in ss.open(root).manifest.index_runs] == [(0, 8)]
    again = pickle.loads(blob)
    assert len(again) == 13 and again.num_shards == 7
    np.testing.assert_array_equal(again[12]["x"], store[12]["x"])
    with pytest.raises(IndexError):
        again[13]
    assert again.index("w0-12") == 12 and again.index_many(["w0-5", "w0-0"]).tolist() == [5, 0]
    with pytest.raises(KeyError):
        again.index("w0-13")
    assert len(again.refresh()) == 23 and again.index("w0-20") == 20
    assert len(pickle.loads(pickle.dumps(again))) == 23


def test_unpickling_a_replaced_store_is_an_error(scratch: Path) -> None:
    root = scratch / "s"
    _write_child_store(root, 13, max_shard_records=2)
    blob = pickle.dumps(ss.open(root))
    shutil.rmtree(root)
    _write_child_store(root, 5, max_shard_records=2)
    with pytest.raises(ss.SeqstoreError, match="replaced"):
        pickle.loads(blob)


def test_unpickling_a_store_replaced_by_one_of_the_same_shape_is_an_error(scratch: Path) -> None:
    """A store overwritten by another with as many records in the same shards (or with those shards
    first and more after) is a replaced store too, not the pickled object's view of it."""
    root = scratch / "s"

    def write(first: int, n: int) -> None:
        with ss.create(root, {"v": ss.Field("int64")}, max_shard_records=4, overwrite=True) as w:
            w.append_batch({"v": np.arange(first, first + n)})

    for grown in (8, 12):
        write(0, 8)
        blob = pickle.dumps(ss.open(root))
        write(1000, grown)
        with pytest.raises(ss.SeqstoreError, match="replaced"):
            pickle.loads(blob)
    write(0, 8)
    blob = pickle.dumps(ss.open(root))
    with ss.append_to(root, max_shard_records=4) as w:  # grown, not replaced: the pickled view
        w.append_batch({"v": np.arange(8, 12)})
    again = pickle.loads(blob)
    assert len(again) == 8 and int(again[7]["v"]) == 7


def test_store_in_spawned_process(scratch: Path) -> None:
    root = scratch / "s"
    _write_child_store(root, 30, max_shard_records=8)
    store = ss.open(root)
    indices = [0, 29, 17, 8, 4]
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        got = pool.apply(child_read, (store, indices))
    for i, (sid, x, k) in zip(indices, got):
        want = child_record(0, i)
        assert sid == f"w0-{i}" and k == i
        assert x == want["x"].reshape(-1).tolist()


def test_create_overwrite_and_metadata(scratch: Path) -> None:
    root = scratch / "s"
    meta: dict[str, Any] = {"name": "corpus \u00e9\U0001f600", "n": 3, "nested": {"a": [1, 2.5, None, True]}}
    with ss.create(root, CHILD_SCHEMA, metadata=meta) as w:
        w.append(child_record(0, 1))
    store = ss.open(root)
    assert store.metadata == meta
    store.metadata["name"] = "changed"  # a copy: the store's metadata stays
    assert ss.open(root).metadata == meta
    with pytest.raises(FileExistsError):
        ss.create(root, CHILD_SCHEMA)
    assert len(ss.open(root)) == 1  # untouched
    other = {"y": ss.Field("int8", ())}
    with ss.create(root, other, overwrite=True) as w:
        w.append({"y": 5})
        w.append({"y": 6})
    store = ss.open(root)
    assert store.schema == ss.Schema(other) and len(store) == 2 and store.metadata == {}
    assert not (root / "shard-000000" / "x.npy").exists()
    # never clobber a directory that is not a store
    plain = scratch / "plain"
    plain.mkdir()
    (plain / "precious.txt").write_text("keep me")
    with pytest.raises(ss.SeqstoreError):
        ss.create(plain, other, overwrite=True)
    assert (plain / "precious.txt").read_text() == "keep me"
    # an empty existing directory is fine with overwrite=True
    (scratch / "empty").mkdir()
    ss.create(scratch / "empty", other, overwrite=True).close()
    assert len(ss.open(scratch / "empty")) == 0
    # bad schemas never create anything
    with pytest.raises(ss.SchemaError):
        ss.create(scratch / "bad", {"a": ss.Field("int8"), "a/b": ss.Field("int8")})
    assert not (scratch / "bad").exists()
    with pytest.raises(ss.FormatError):
        ss.open(scratch / "nothing-here")


def test_manifest_is_small_and_plain_json(scratch: Path) -> None:
    root = scratch / "s"
    _write_child_store(root, 200, max_shard_records=100)
    raw = json.loads((root / "manifest.json").read_text())
    assert raw["format"] == "seqstore" and raw["version"] == 3 and "shards" not in raw
    assert raw["shard_table"]["rows"] == 2 and raw["shard_table"]["records"] == 200
    assert [s.records for s in ss.open(root).manifest.shards] == [100, 100]
    assert len((root / "manifest.json").read_bytes()) < 2000  # O(fields), not O(shards) or O(records)


@pytest.mark.parametrize("shard_records", [1000, 7])
def test_fixed_field_gathers_equal_numpy_indexing(scratch: Path, shard_records: int) -> None:
    """Fixed fields of every width (1-byte scalars, odd-width rows, zero-width rows, 2-d records) come
    out of ``get_batch`` as numpy indexing of the written arrays gives them: one shard or many, any
    order, repeats, negative indices, one record, none."""
    rng = np.random.default_rng(5)
    n = 120
    cols = {
        "i8": rng.integers(-100, 100, n).astype(np.int8),
        "odd": rng.integers(0, 255, (n, 3)).astype(np.uint8),
        "f16": rng.standard_normal((n, 5)).astype(np.float16),
        "m": rng.standard_normal((n, 2, 7)).astype(np.float32),
        "none": np.zeros((n, 0), np.float64),
    }
    schema = {k: ss.Field(str(v.dtype), v.shape[1:]) for k, v in cols.items()}
    root = scratch / f"g{shard_records}"
    with ss.create(root, schema, max_shard_records=shard_records) as w:
        w.append_batch(cols)
    store = ss.open(root)
    assert store.num_shards == -(-n // shard_records)
    for idx in (rng.permutation(n), rng.integers(0, n, 300), np.array([-1, 0, -1, 5]), np.array([17]),
                np.arange(n), np.zeros(0, np.int64)):
        got = store.get_batch(idx)
        for k, v in cols.items():
            assert got[k].dtype == v.dtype and got[k].shape == (len(idx), *v.shape[1:])
            np.testing.assert_array_equal(got[k], v[idx])
            assert got[k].flags.writeable and got[k].flags.c_contiguous


def test_fields_given_as_one_string_mean_one_field(scratch: Path) -> None:
    # a str is one field's name (as in pandas/HF), not a sequence of one-letter names
    root = scratch / "s"
    with ss.create(root, {"feats": ss.Field("float32", (2,)), "tokens": ss.Field("int32", (None,))}) as w:
        for i in range(5):
            w.append({"feats": np.full(2, i, np.float32), "tokens": np.arange(i, dtype=np.int32)})
    store = ss.open(root)
    idx = np.arange(5)
    assert list(store.get_batch(idx, fields="feats")) == ["feats"]
    np.testing.assert_array_equal(store.get_batch(idx, fields="feats")["feats"][:, 0], np.arange(5))
    store.prefetch(idx, fields="tokens")
    (got,) = store.iter_batches([idx], fields="tokens")
    assert list(got) == ["tokens"]
    np.testing.assert_array_equal(got["tokens"][1], np.arange(5))
    ds = ss.data.StoreDataset(store, fields="feats")  # type: ignore[arg-type]
    assert ds.field_names == ["feats"] and list(ds.get(3)) == ["feats"]
    with pytest.raises(KeyError, match="'feat'"):
        store.get_batch(idx, fields="feat")


def test_torch_datasets_take_one_field_as_a_string(scratch: Path) -> None:
    pytest.importorskip("torch")
    from seqstore.torch import IterableSeqDataset, SeqDataset

    root = scratch / "s"
    with ss.create(root, {"feats": ss.Field("float32", (2,)), "other": ss.Field("int32", ())}) as w:
        for i in range(4):
            w.append({"feats": np.full(2, i, np.float32), "other": np.int32(i)})
    assert list(SeqDataset(root, "feats")[2]) == ["feats"]
    (batch,) = IterableSeqDataset(root, batch=4, fields="feats")
    assert list(batch) == ["feats"]


def test_a_relative_path_is_the_store_it_named_after_a_chdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store opened, or a writer made, by a relative path kept it relative: after ``os.chdir`` the store
    mapped its shards from the new directory (a store of the same name there: 'CRC-32 ... differs', or
    its records), and the writer's commit failed with FileNotFoundError, losing its records."""
    for where, value in (("one", 1), ("two", 2)):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        with ss.create("s", {"x": ss.Field("int32", (3,))}) as w:
            for _ in range(4):
                w.append({"x": np.full(3, value, np.int32)})
    monkeypatch.chdir(tmp_path / "one")
    store = ss.open("s")
    writer = ss.create("w", {"x": ss.Field("int32", (3,))})
    monkeypatch.chdir(tmp_path / "two")
    assert store[0]["x"].tolist() == [1, 1, 1] and store.get_batch([3])["x"].tolist() == [[1, 1, 1]]
    assert store.url == str(tmp_path / "one" / "s")
    writer.append({"x": np.zeros(3, np.int32)})
    writer.close()
    assert len(ss.open(tmp_path / "one" / "w")) == 1 and not (tmp_path / "two" / "w").exists()


_FULL_DISK = """
import errno, os, sys
import seqstore as ss

target = os.path.join(sys.argv[1], "lengths.npy")
try:
    ss.open({store!r}).lengths().save(target, dtype="uint64")  # 2.4 MB
except OSError as exc:
    assert exc.errno == errno.ENOSPC and target in str(exc), str(exc)
else:
    raise AssertionError("lengths saved to a full disk")
assert os.listdir(sys.argv[1]) == [], os.listdir(sys.argv[1])  # no temporary left
print("alive")
"""


def test_lengths_saved_to_a_full_disk_are_an_error_not_a_crash(scratch: Path, tmp_path: Path) -> None:
    """Lengths.save writes through a mapping of a sparse file: on a file system with no room left the first
    write into a hole ended the process with SIGBUS. Runs on a 1 MiB tmpfs of its own (skipped where user
    namespaces are not allowed)."""
    from support.tmpfs import run_on_small_tmpfs

    root = scratch / "s"
    n = 300_000
    with ss.create(root, {"t": ss.Field("int8", (None,))}) as w:
        w.append_batch({"t": (np.zeros(n, np.int8), np.ones(n, np.int64))})
    _disk, got = run_on_small_tmpfs(_FULL_DISK.format(store=str(root)), tmp_path, "1m")
    assert got.returncode == 0 and "alive" in got.stdout, (got.returncode, got.stdout, got.stderr[-2000:])


def test_lengths_iter_chunks_refuses_a_size_below_one(scratch: Path) -> None:
    """iter_chunks(size) with size 0 or negative is a ValueError naming the size: a negative size used to
    yield nothing at all (as if the store were empty) and 0 a bare error of range()."""
    root = scratch / "s"
    _write_child_store(root, 3)
    lengths = ss.open(root).lengths()
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"size must be a positive integer, got {bad}"):
            list(lengths.iter_chunks(bad))


def test_lengths_shape_follows_a_refresh(scratch: Path) -> None:
    """A Lengths taken before refresh() has len() of the refreshed store; its shape (what numpy and
    torch read) must say the same, not the record count at the time it was made."""
    root = scratch / "s"
    _write_child_store(root, 3)
    store = ss.open(root)
    lengths = store.lengths()
    with ss.append_to(root) as w:
        w.append(child_record(0, 3), id="w0-3")
    store.refresh()
    assert len(lengths) == 4 and lengths.shape == (4,) and np.asarray(lengths).shape == lengths.shape


@pytest.mark.parametrize("readahead", ["auto", "always", "never"])
def test_prefetch_checks_its_arguments_in_every_mode(scratch: Path, readahead: str) -> None:
    """prefetch() raised for an out-of-range index or an unknown field when it requested reads, and took
    them silently with readahead="never" (or while warm batches skipped the sample): a program passed
    with one mode and failed with another."""
    root = scratch / "s"
    _write_child_store(root, 3)
    store = ss.open(root, readahead=readahead)
    store.prefetch([0, -1], fields="x")
    with pytest.raises(IndexError, match="record index 3"):
        store.prefetch([3])
    with pytest.raises(TypeError):
        store.prefetch([0.5])
    with pytest.raises(KeyError, match="nope"):
        store.prefetch([0], fields="nope")


def test_id_takes_an_int_only(scratch: Path) -> None:
    """store.id(2.9) answered record 2's id and id("3") record 3's (the argument went through int()),
    where store[2.9] raises: a float or str record number is a TypeError."""
    root = scratch / "s"
    _write_child_store(root, 5)
    store = ss.open(root)
    for bad in (2.9, np.float64(1.5), "3"):
        with pytest.raises(TypeError, match="takes an int"):
            store.id(bad)  # type: ignore[arg-type]
    assert store.id(np.uint8(3)) == "w0-3"


def test_a_bool_is_not_a_record_number(scratch: Path) -> None:
    """store[True] answered record 1 (and id(True), nested(True), lengths()[True] too) while
    get_batch([True]) is a TypeError, as NumPy refuses a bool as an integer index: one rule, a TypeError
    naming the index, for every way of asking for a record."""
    root = scratch / "s"
    _write_child_store(root, 5)
    store = ss.open(root)
    lengths = store.lengths("x")
    for bad in (True, False, np.bool_(True)):
        for ask in (store.__getitem__, store.nested, store.id, lengths.__getitem__):
            with pytest.raises(TypeError, match="takes an int"):
                ask(bad)
        for ask in (store.get_batch, store.ids, lengths.take):
            with pytest.raises(TypeError, match="dtype bool"):
                ask([bad])
    assert store[np.int8(1)]["meta/k"] == 1 and store.id(1) == "w0-1" and lengths[1] == 1


def test_max_mapped_shards_is_a_positive_int(scratch: Path) -> None:
    """max_mapped_shards=2.5 was taken (as 2, silently) and "4" failed with a bare str < int TypeError: a
    ValueError naming the option for anything but a positive integer."""
    root = scratch / "s"
    _write_child_store(root, 5)
    for bad in (0, -1, 2.5, "4", True, None.__class__):
        with pytest.raises(ValueError, match="max_mapped_shards must be a positive integer"):
            ss.open(root, max_mapped_shards=bad)  # type: ignore[arg-type]
    assert ss.open(root, max_mapped_shards=np.int64(1)).mapped_shards == 0


def test_lengths_save_refuses_bool_and_inexact_float_dtypes(scratch: Path) -> None:
    """save(dtype=bool) wrote every nonzero length as True (1) and dtype=float16 rounded 3001 to 3000,
    silently: a dtype that cannot hold a length exactly is a ValueError naming the record, like a small
    integer dtype."""
    root = scratch / "s"
    with ss.create(root, {"t": ss.Field("int8", (None,))}) as w:
        for n in (0, 1, 3001):
            w.append({"t": np.zeros(n, np.int8)})
    lengths = ss.open(root).lengths()
    with pytest.raises(ValueError, match="record 2"):
        lengths.save(scratch / "b.npy", dtype=bool)
    with pytest.raises(ValueError, match="record 2"):
        lengths.save(scratch / "h.npy", dtype=np.float16)
    with pytest.raises(ValueError, match="complex64"):
        lengths.save(scratch / "c.npy", dtype=np.complex64)
    assert np.load(lengths.save(scratch / "f.npy", dtype=np.float32)).tolist() == [0, 1, 3001]
    assert not list(scratch.glob(".*.tmp-*"))


def test_human_bytes_never_says_1024_of_a_unit() -> None:
    """human_bytes(2**20 - 1) was "1024.0 KiB" (1023.999 rounded after the unit was chosen): a size that
    rounds to 1024 of a unit is said in the next one."""
    from seqstore.store.describe import human_bytes

    assert [human_bytes(n) for n in (0, 1023, 1024, 2**20 - 1, 2**20, 2**30 - 2**14, 5 * 2**40)] == [
        "0 B", "1023 B", "1.0 KiB", "1.0 MiB", "1.0 MiB", "1.0 GiB", "5.0 TiB"]
    assert human_bytes(1023.96 * 2**30) == "1.0 TiB" and human_bytes(1023.94 * 2**20) == "1023.9 MiB"
