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
    FilteredDataset,
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


def test_store_dataset_get_refuses_an_index_that_is_not_an_int(tmp_path: Path) -> None:
    """get(1.7) read record 1 (an int() cast) and get(True) record 1, where the other datasets' get and
    every get_batch refuse them."""
    _make(tmp_path / "c.seqstore", 10, np.random.default_rng(0))
    ds = StoreDataset(tmp_path / "c.seqstore")
    for bad in (1.7, True, np.float64(2.0)):
        with pytest.raises(TypeError, match="StoreDataset index must be an int"):
            ds.get(bad)  # type: ignore[arg-type]
    assert ds.get(np.int32(-1))["spk"] == ds.get(9)["spk"]


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
    for start, stop in ((1.5, 3), (True, 3), (0, 2.9)):  # were cut to integers (1.5 as 1) or taken as 1
        with pytest.raises(ValueError, match="SliceDataset: (start|stop) must be an integer"):
            SliceDataset(ds, start, stop)  # type: ignore[arg-type]


def test_concat_of_stores_in_different_directories_caches(tmp_path: Path) -> None:
    """The concatenation caches its lengths / sort index / kept rows in the first child's cache directory
    (or ``cache_dir=``) instead of recomputing O(N) arrays in memory every epoch and in every worker."""
    from seqstore.data import ConcatDataset

    rng = np.random.default_rng(5)
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    l1 = _make(tmp_path / "d1" / "a.seqstore", 300, rng, shard_records=100)
    l2 = _make(tmp_path / "d2" / "b.seqstore", 200, rng, shard_records=64)
    lens = np.concatenate([l1, l2])
    a, b = StoreDataset(tmp_path / "d1" / "a.seqstore"), StoreDataset(tmp_path / "d2" / "b.seqstore")
    c = ConcatDataset([a, b], ordering="sorted")
    assert c.cache_dir == a.cache_dir
    np.testing.assert_array_equal(c.epoch_order(1).to_numpy(), np.argsort(lens, kind="stable"))
    names = sorted(os.listdir(a.cache_dir))
    assert any(n.startswith("lengths-") for n in names) and any(n.startswith("sortidx-") for n in names)
    assert isinstance(c.lengths_array(), np.memmap)
    f = c.filter(max_length=10)
    assert isinstance(f.kept, np.memmap) and os.path.dirname(f.kept.filename) == str(a.cache_dir)
    np.testing.assert_array_equal(f.kept, np.flatnonzero(lens <= 10))
    # the other order of children is another content: other files, right order
    r = ConcatDataset([b, a], ordering="sorted")
    np.testing.assert_array_equal(r.epoch_order(1).to_numpy(),
                                  np.argsort(np.concatenate([l2, l1]), kind="stable"))
    own = ConcatDataset([a, b], ordering="sorted_reverse", cache_dir=tmp_path / "own")
    assert own.cache_dir == tmp_path / "own"
    np.testing.assert_array_equal(own.epoch_order(1).to_numpy(), np.argsort(-lens, kind="stable"))
    assert any(n.startswith("sortidx-") for n in os.listdir(tmp_path / "own"))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(own)).epoch_order(1).to_numpy(),
                                  own.epoch_order(1).to_numpy())


def test_ordering_name_helpers_are_shared() -> None:
    """One parser of ordering names (seqstore.order), used by the data layer."""
    from seqstore.data import _orders
    from seqstore.order import ordering_name, ordering_needs_lengths

    assert ordering_name("laplace:.1000") == "laplace" and ordering_name("random:3") == "random"
    assert ordering_name("o.npy") == ordering_name(np.arange(3)) == ordering_name([2, 1]) == "explicit"
    for name in ("sorted", "sorted_reverse", "laplace:.10", "sort_bin_shuffle:4", "sort_bin_shuffle_x2:.5:2"):
        assert ordering_needs_lengths(name), name
    for name in ("default", "reverse", "random", "random_sample:2", "default_every_n:3", "x.npy", np.arange(2)):
        assert not ordering_needs_lengths(name), name
    with pytest.raises(ValueError, match="ordering must be a name or an explicit order"):
        ordering_name(3.5)
    assert not hasattr(_orders, "_NEEDS_ARRAY") and _orders.ordering_name is ordering_name


def test_explicit_base_order_is_not_taken_over(tmp_path: Path) -> None:
    """A FilteredDataset / SliceDataset does not apply its base's explicit order (values: base indices) to
    its own indices (an error for values past its size, else silently another order): it asks for an
    ordering; a name is taken over as before."""
    lens = np.arange(1, 11)
    ds = LengthsDataset(lens, ordering=np.array([4, 0]))
    make = {"FilteredDataset": lambda **kw: FilteredDataset(ds, min_length=6, **kw),
            "SliceDataset": lambda **kw: SliceDataset(ds, 2, 7, **kw)}
    for who, new in make.items():
        with pytest.raises(ValueError, match=f"{who}: the ordering of LengthsDataset.* is an explicit order"):
            new()
        np.testing.assert_array_equal(new(ordering=np.array([3, 1])).epoch_order(1).to_numpy(), [3, 1])
    with pytest.raises(ValueError, match="explicit order"):
        ds.filter(max_length=5)
    named = LengthsDataset(lens, ordering="sorted_reverse")
    np.testing.assert_array_equal(named.filter(max_length=5).epoch_order(1).to_numpy(), [4, 3, 2, 1, 0])
    np.testing.assert_array_equal(SliceDataset(named, 2, 7).epoch_order(1).to_numpy(), [4, 3, 2, 1, 0])


@pytest.mark.parametrize("big", [2**63, 2**64 - 1])
def test_uint64_index_past_int64_is_an_index_error(big: int) -> None:
    ds = LengthsDataset(np.arange(1, 11))
    idx = np.array([3, big], dtype=np.uint64)
    for call in (lambda: ds.get_batch(idx), lambda: ds.lengths()[idx], lambda: ds.lengths().take(idx)):
        with pytest.raises(IndexError, match=f"index {big} out of range for 10 sequences"):
            call()
    assert ds.get_batch(np.array([9], dtype=np.uint64))["length"].tolist() == [10]


def test_a_negative_length_is_refused_where_lengths_are_cached(tmp_path: Path) -> None:
    """The lengths cache takes the smallest unsigned dtype: a negative length wrapped into a huge one, so a
    ``sorted`` order with ``cache_dir`` differed from the same order without it. It is a ValueError."""
    np.save(tmp_path / "lengths.npy", np.array([3, -1, 2], dtype=np.int64))
    cached = LengthsDataset(tmp_path / "lengths.npy", ordering="sorted", cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"a sequence length is negative \(-1\)"):
        cached.epoch_order(1)


def test_array_lengths_refuse_a_negative_length_naming_its_position(tmp_path: Path) -> None:
    """A negative length in an array (or a uint64 one past int64, which wrapped to a negative one) was
    handed on: a sorted order put it first, packing and batching planned with it. It is a ValueError
    naming the position and value (and the file), wherever the lengths are read."""
    np.save(tmp_path / "lengths.npy", np.array([3, 4, -7, 2], dtype=np.int64))
    from_file = LengthsDataset(tmp_path / "lengths.npy", ordering="sorted")
    with pytest.raises(ValueError, match=r"negative \(-7\) at position 2 of .*lengths\.npy"):
        from_file.epoch_order(1)
    view = ArrayLengths(np.array([3, 4, -7, 2], dtype=np.int32))
    assert view.take([0, 1, 3]).tolist() == [3, 4, 2]
    for read in (lambda: view.take([1, 2]), lambda: view[2], lambda: np.asarray(view), lambda: list(view)):
        with pytest.raises(ValueError, match=r"negative \(-7\) at position 2;"):
            read()
    huge = ArrayLengths(np.array([1, 2**63 + 5], dtype=np.uint64))
    with pytest.raises(ValueError, match=rf"past int64 \({2**63 + 5}\) at position 1"):
        huge.take([0, 1])
    assert ArrayLengths(np.array([1, 2**40], dtype=np.uint64)).take([1]).tolist() == [2**40]


def test_array_lengths_pickled_before_the_negative_check_still_read() -> None:
    """An ArrayLengths pickled by a version before the check has only ``array`` and ``n``: it reads and
    checks as a new one (nothing the check needs is an attribute it would lack)."""
    old = ArrayLengths.__new__(ArrayLengths)
    old.__dict__.update(array=np.array([4, -1], dtype=np.int16), n=2)
    again = pickle.loads(pickle.dumps(old))
    assert again.take([0]).tolist() == [4]
    with pytest.raises(ValueError, match=r"negative \(-1\) at position 1;"):
        again.take([1])


_FULL_DISK = """
import os, sys
import numpy as np
from pathlib import Path
from seqstore.data._cache import CacheError, write_npy

path = Path(sys.argv[1]) / "cache" / "lengths.npy"
try:
    write_npy(path, iter([np.arange(1 << 20)]), 1 << 20, np.int64)  # 8 MiB
except CacheError as exc:
    assert str(path) in str(exc) and "No space left" in str(exc), str(exc)
else:
    raise AssertionError("a derived array written to a full disk")
assert os.listdir(path.parent) == [], os.listdir(path.parent)  # no temporary left
print("alive")
"""


def test_a_derived_array_on_a_full_disk_is_an_error_not_a_crash(tmp_path: Path) -> None:
    """A derived array (lengths, row maps, kept rows) is written through a mapping of a sparse file: on a
    file system with no room left the first write into a hole ended the process with SIGBUS. Runs on a
    2 MiB tmpfs of its own (skipped where user namespaces are not allowed)."""
    from support.tmpfs import run_on_small_tmpfs

    _disk, got = run_on_small_tmpfs(_FULL_DISK, tmp_path, "2m")
    assert got.returncode == 0 and "alive" in got.stdout, (got.returncode, got.stdout, got.stderr[-2000:])


def test_lengths_dataset_get_refuses_what_get_batch_refuses() -> None:
    """``LengthsDataset.get`` cut a float index to an int (1.5 gave record 1), took a bool or a str
    ("1") as an index, and named -7 for index -10 of 3; it refuses them as ``get_batch`` and the other
    datasets do, naming the index given."""
    d = LengthsDataset(np.array([3, 4, 5]))
    assert d.get(1)["length"] == 4 and d.get(-1)["length"] == 5 and d.get(np.int32(0))["length"] == 3
    for bad in (1.5, True, "1"):
        with pytest.raises(TypeError, match="indexes must be integers"):
            d.get(bad)  # type: ignore[arg-type]
    with pytest.raises(IndexError, match="index -10 out of range for 3 sequences"):
        d.get(-10)
