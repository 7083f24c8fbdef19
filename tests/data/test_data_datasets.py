"""StoreDataset, LengthsDataset, SliceDataset, FilteredDataset and the lazily-gathered laplace order."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.data import (
    ArrayLengths,
    FuncLengths,
    LengthsDataset,
    SliceDataset,
    StoreDataset,
)
from seqstore.data._orders import dataset_order
from seqstore.order import seq_order


def _make(path: Path, n: int, rng: np.random.Generator, shard_records: int = 1000) -> np.ndarray:
    lens = rng.integers(0, 30, n)
    with seqstore.create(path, {"x": Field("int32", (None, 3)), "spk": Field("int16")},
                         max_shard_records=shard_records) as w:
        w.append_batch({"x": (np.arange(int(lens.sum()) * 3, dtype=np.int32).reshape(-1, 3), lens),
                        "spk": (np.arange(n) % 7).astype(np.int16)}, ids=[f"s{i}" for i in range(n)])
    return lens


@pytest.mark.parametrize("trial", range(40))
def test_lazy_laplace_equals_seq_order(trial: int) -> None:
    rng = np.random.default_rng(trial)
    n = int(rng.integers(0, 2500))
    lens = rng.integers(0, 40, n) if trial % 3 else rng.integers(0, 1 << 40, n)
    ordering = ["laplace", f"laplace:{rng.integers(1, 60)}", f"laplace:.{rng.integers(1, 90)}",
                f"laplace:{rng.integers(1, 9)}:{rng.integers(1, 4)}"][trial % 4]
    p, s = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    kw = dict(epoch=int(rng.integers(1, 9)), seed=trial, partition_epoch=p, shard_index=int(rng.integers(0, s)),
              num_shards=s)
    ref = seq_order(n, ordering, lengths=lens, **kw)
    got = dataset_order(n, ordering, lengths=lambda: ArrayLengths(lens), **kw)
    np.testing.assert_array_equal(got.to_numpy(), ref.to_numpy())
    if len(ref):
        pos = rng.integers(-len(ref), len(ref), 64)
        np.testing.assert_array_equal(got.take(pos), ref.take(pos))


def test_store_dataset(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lens = _make(tmp_path / "c.seqstore", 2500, rng)
    ds = StoreDataset(tmp_path / "c.seqstore", ordering="laplace:.100", seed=3, partition_epoch=2)
    assert ds.num_seqs == len(ds) == 2500
    np.testing.assert_array_equal(np.asarray(ds.lengths()), lens)
    ref = seq_order(2500, "laplace:.100", epoch=3, seed=3, lengths=lens, partition_epoch=2, shard_index=1,
                    num_shards=2)
    np.testing.assert_array_equal(ds.epoch_order(3, 1, 2).to_numpy(), ref.to_numpy())
    rec = ds.get(17)
    b = ds.get_batch([17, 3])
    np.testing.assert_array_equal(b["x"][0][: len(rec["x"])], rec["x"])
    assert b["spk"].tolist() == [17 % 7, 3]
    blob = pickle.dumps(ds)
    assert len(blob) < 1000
    np.testing.assert_array_equal(pickle.loads(blob).epoch_order(3).to_numpy(), ds.epoch_order(3).to_numpy())
    # a global-sort ordering caches lengths and the sort index beside the store, then maps them
    srt = StoreDataset(tmp_path / "c.seqstore", ordering="sorted")
    np.testing.assert_array_equal(srt.epoch_order(1).to_numpy(), np.argsort(lens, kind="stable"))
    cache = tmp_path / "c.seqstore.cache"
    assert any(f.startswith("lengths-") for f in os.listdir(cache))
    assert isinstance(srt.lengths_array(), np.memmap)
    sub = StoreDataset(tmp_path / "c.seqstore", fields=["spk"])
    assert set(sub.get(0)) == {"spk"} and set(sub.get_batch([0])) == {"spk"}
    with pytest.raises(KeyError, match="no field"):
        StoreDataset(tmp_path / "c.seqstore", fields=["nope"])
    with pytest.raises(ValueError, match="not a ragged field"):
        StoreDataset(tmp_path / "c.seqstore", length_field="spk")


def test_filtered_dataset(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    lens = _make(tmp_path / "f.seqstore", 3000, rng)
    ds = StoreDataset(tmp_path / "f.seqstore", ordering="random", seed=5)
    f = ds.filter(min_length=5, max_length=20)
    kept = np.flatnonzero((lens >= 5) & (lens <= 20))
    assert f.num_seqs == len(kept)
    assert isinstance(f.kept, np.memmap)  # cached on disk, mapped
    np.testing.assert_array_equal(f.kept, kept)
    order = f.epoch_order(2).to_numpy()
    np.testing.assert_array_equal(np.sort(order), np.arange(len(kept)))
    np.testing.assert_array_equal(f.lengths().take(order), lens[kept[order]])
    np.testing.assert_array_equal(f.get_batch(order[:5])["spk"], (kept[order[:5]] % 7))
    again = ds.filter(min_length=5, max_length=20)
    assert again.kept.filename == f.kept.filename
    g = pickle.loads(pickle.dumps(f))
    np.testing.assert_array_equal(g.kept, kept)
    mem = LengthsDataset(lens).filter(max_length=3)  # no cache identity: in memory
    np.testing.assert_array_equal(mem.kept, np.flatnonzero(lens <= 3))
    with pytest.raises(ValueError, match="min_length 9 > max_length 2"):
        ds.filter(min_length=9, max_length=2)
    none = ds.filter(min_length=10**6)
    assert none.num_seqs == 0 and len(none.epoch_order(1)) == 0


def test_slice_and_lengths_dataset(tmp_path: Path) -> None:
    lens = np.arange(100, dtype=np.uint16)
    np.save(tmp_path / "l.npy", lens)
    ds = LengthsDataset(tmp_path / "l.npy", ordering="sorted_reverse", cache_dir=tmp_path / "cache")
    assert len(pickle.dumps(ds)) < 1000
    np.testing.assert_array_equal(ds.epoch_order(1).to_numpy(), np.arange(99, -1, -1))
    sl = SliceDataset(ds, 10, 20, ordering="default")
    np.testing.assert_array_equal(np.asarray(sl.lengths()), np.arange(10, 20))
    assert sl.get(-1)["length"] == 19 and sl.get_batch([0, 9])["length"].tolist() == [10, 19]
    v = LengthsDataset(FuncLengths(10**12, lambda i: i % 97 + 1), ordering="laplace:.1000", seed=1)
    o = v.epoch_order(1)
    assert len(o) == 10**12 and 0 <= o[123456789] < 10**12  # O(bin), no array of 1e12
    with pytest.raises(IndexError):
        sl.get_batch([10])
