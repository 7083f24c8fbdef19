"""The Order API: Sequence protocol, lazy slices, take, chunks, shards, equality, pickling, errors."""

from __future__ import annotations

import collections.abc
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqstore.order import ORDERINGS, Order, PermutationOrder, block_bounds, seq_order

ALL = [
    "default",
    "reverse",
    "default_every_n:3",
    "sorted",
    "sorted_reverse",
    "random",
    "random:3",
    "random_sample",
    "random_block:4:3",
    "random_block:16:4:2",
    "laplace",
    "laplace:.7",
    "laplace:5:2",
    "sort_bin_shuffle",
    "sort_bin_shuffle:.9",
    "sort_bin_shuffle_x2:4",
]


def _lengths(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 40, size=n).astype(np.int32)


def _order(n: int, ordering: str, **kw: Any) -> Order:
    return seq_order(n, ordering, epoch=kw.pop("epoch", 1), lengths=_lengths(n), **kw)


def test_is_a_sequence() -> None:
    o = _order(100, "random")
    assert isinstance(o, collections.abc.Sequence)
    assert len(o) == 100
    full = list(o)
    assert sorted(full) == list(range(100))
    assert o[0] == full[0] and o[-1] == full[-1] and o[-100] == full[0]
    assert isinstance(o[3], int) and isinstance(o[np.int64(3)], int)
    assert list(reversed(o)) == full[::-1]
    assert full[10] in o and 100 not in o and -1 not in o and "x" not in o
    assert o.index(full[17]) == 17 and o.count(full[5]) == 1
    with pytest.raises(IndexError):
        o[100]
    with pytest.raises(IndexError):
        o[-101]
    with pytest.raises(TypeError):
        o[1.0]  # type: ignore[call-overload]


@pytest.mark.parametrize("ordering", ALL)
def test_take_chunks_slices_consistent(ordering: str) -> None:
    n = 533
    o = _order(n, ordering, epoch=2)
    full = o.to_numpy(np.int64)
    assert len(full) == len(o)
    assert np.array_equal(np.concatenate(list(o.iter_chunks(50))), full)
    rng = np.random.default_rng(1)
    pos = rng.integers(-len(o), len(o), size=(7, 11))
    assert np.array_equal(o.take(pos), full[pos])
    assert o.take(pos).dtype == np.int64 and o.take(pos).shape == (7, 11)
    for sl in (slice(10, 100), slice(None, None, -1), slice(500, 3, -7), slice(3, 3), slice(-50, None, 4)):
        view = o[sl]
        assert isinstance(view, Order)
        assert np.array_equal(view.to_numpy(np.int64), full[sl])
        assert np.array_equal(view[::2].to_numpy(np.int64), full[sl][::2])
    assert o == full and o == full.tolist() and o == tuple(full.tolist())
    if len(full) > 1:
        assert o != full[::-1] or np.array_equal(full, full[::-1])
    assert o != full[:-1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 1500),
    ordering=st.sampled_from(ALL),
    start=st.integers(-2000, 2000) | st.none(),
    stop=st.integers(-2000, 2000) | st.none(),
    step=st.sampled_from([None, 1, 2, 3, 17, -1, -2, -5]),
    inner=st.sampled_from([slice(None), slice(1, None, 2), slice(None, None, -3)]),
    chunk=st.integers(1, 400),
    seed=st.integers(-(2**70), 2**70),
)
def test_property_views(
    n: int, ordering: str, start: int | None, stop: int | None, step: int | None, inner: slice, chunk: int, seed: int
) -> None:
    o = seq_order(n, ordering, epoch=1, seed=seed, lengths=_lengths(n, seed % 7))
    full = o.to_numpy(np.int64)
    assert len(full) == len(o)
    sl = slice(start, stop, step)
    view = o[sl][inner]
    expect = full[sl][inner]
    assert len(view) == len(expect)
    assert np.array_equal(np.concatenate([np.empty(0, np.int64), *view.iter_chunks(chunk)]), expect)
    if len(expect):
        pos = np.random.default_rng(chunk).integers(-len(expect), len(expect), size=20)
        assert np.array_equal(view.take(pos), expect[pos])
        assert view[-1] == expect[-1]


@given(length=st.integers(0, 300), count=st.integers(1, 40))
def test_block_bounds_like_returnn(length: int, count: int) -> None:
    sizes = [length // count + 1] * (length % count) + [length // count] * (count - length % count)
    edges = np.concatenate([[0], np.cumsum(sizes)])
    for i in range(count):
        assert block_bounds(length, i, count) == (edges[i], edges[i + 1])


def test_shard() -> None:
    o = _order(20, "default")
    assert [list(o.shard(i, 3)) for i in range(3)] == [list(range(0, 7)), list(range(7, 14)), list(range(14, 20))]
    o2 = seq_order(20, "default", epoch=2, partition_epoch=2, num_shards=2, shard_index=1)
    assert list(o2) == list(range(15, 20))
    assert list(seq_order(20, "default", epoch=1, partition_epoch=2, num_shards=2, shard_index=0)) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        o.shard(3, 3)
    with pytest.raises(ValueError):
        o.shard(0, 0)


def test_to_numpy_dtypes() -> None:
    assert _order(100, "random").to_numpy().dtype == np.int8
    assert _order(129, "random").to_numpy().dtype == np.int16
    assert seq_order(70_000, "random", epoch=1).to_numpy().dtype == np.int32
    assert seq_order(2**31 + 1, "random", epoch=1)[:10].to_numpy().dtype == np.int64
    assert np.asarray(_order(10, "reverse")).tolist() == list(range(9, -1, -1))


def test_pickle_small_and_equal(tmp_path: Path) -> None:
    n = 200_000
    path = tmp_path / "lengths.npy"
    np.save(path, _lengths(n))
    mapped = np.load(path, mmap_mode="r")
    np.save(tmp_path / "explicit.npy", np.arange(n)[::-1])
    cases = [
        seq_order(10**10, "random", epoch=5, seed=3, partition_epoch=100, num_shards=8, shard_index=3),
        seq_order(n, "laplace:.1000", epoch=3, lengths=mapped, partition_epoch=10),
        seq_order(n, "sort_bin_shuffle_x2:.100", epoch=1, lengths=path, sort_cache=tmp_path / "sidx.npy"),
        seq_order(n, "sorted_reverse", epoch=1, lengths=mapped[:], sort_cache=tmp_path / "sidx.npy"),
        seq_order(n, "random_sample:2", epoch=1),
        seq_order(n, "default_every_n:4", epoch=1)[::-3],
        seq_order(n, tmp_path / "explicit.npy", epoch=1),
    ]
    for o in cases:
        data = pickle.dumps(o)
        assert len(data) < 1024, (o, len(data))
        back = pickle.loads(data)
        assert back[:1000] == o[:1000]
        assert back[-5:] == o[-5:]
    # a contiguous slice of a memmap keeps pickling by reference, at the right offset
    sub = seq_order(n - 10, "laplace:.50", epoch=1, lengths=mapped[10:])
    back = pickle.loads(pickle.dumps(sub))
    assert len(pickle.dumps(sub)) < 1024 and back == sub


def test_pickle_in_memory_arrays_by_value() -> None:
    o = seq_order(1000, "laplace", epoch=1, lengths=_lengths(1000))
    assert pickle.loads(pickle.dumps(o)) == o


def test_repr_is_useful() -> None:
    o = seq_order(10**8, "random", epoch=3, seed=9, partition_epoch=100, num_shards=8, shard_index=1)
    r = repr(o)
    assert "'random'" in r and "epoch=3" in r and "seed=9" in r and "partition=3/100" in r and "shard=1/8" in r
    assert "125000" in r  # block length
    assert "PermutationOrder" in repr(o[1:5]) and "[" in repr(o[::2])


@pytest.mark.parametrize("ordering", ALL)
def test_empty_orders_print_and_read(ordering: str) -> None:
    """N = 0, the empty shard of N < num_shards and an empty slice: repr and empty reads work."""
    empties = [_order(0, ordering), _order(1, ordering, shard_index=1, num_shards=2), _order(50, ordering)[7:7]]
    for o in empties:
        assert len(o) == 0 and list(o) == [] and o == []
        assert "Order" in repr(o)
        assert o.to_numpy().shape == (0,)
        assert o.take(np.empty(0, dtype=np.int64)).shape == (0,)


def test_equality_semantics() -> None:
    a = seq_order(50, "random", epoch=1)
    b = seq_order(50, "random", epoch=1)
    c = seq_order(50, "random", epoch=2)
    assert a == b and a != c
    assert a != "abc" and a != 5 and a != np.zeros((50, 1))
    assert seq_order(5, "default", epoch=1) == range(5)
    with pytest.raises(TypeError):
        hash(a)


def test_explicit_orders(tmp_path: Path) -> None:
    arr = np.array([3, 1, 2, 0, 4, 4])
    o = seq_order(5, arr, epoch=1)
    assert list(o) == [3, 1, 2, 0, 4, 4]
    np.save(tmp_path / "o.npy", arr.astype(np.int32))
    m = seq_order(5, str(tmp_path / "o.npy"), epoch=2, partition_epoch=2)
    assert list(m) == [0, 4, 4]
    with pytest.raises(ValueError, match="position 1"):
        seq_order(3, [0, 3, 1], epoch=1)
    np.save(tmp_path / "bad.npy", np.array([0, 1, 9]))
    bad = seq_order(3, tmp_path / "bad.npy", epoch=1)  # mapped: checked on read
    with pytest.raises(ValueError, match="position 2"):
        bad.to_numpy()
    with pytest.raises(ValueError, match="integer dtype"):
        seq_order(3, np.array([0.0, 1.0, 2.0]), epoch=1)
    with pytest.raises(ValueError, match="cannot open"):
        seq_order(3, tmp_path / "missing.npy", epoch=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ordering": "shuffle"}, "unknown ordering 'shuffle'"),
        ({"ordering": "random:0"}, "nth must be >= 1"),
        ({"ordering": "random:x"}, "nth must be a positive integer"),
        ({"ordering": "random:1:2"}, "at most one argument"),
        ({"ordering": "laplace:.0", "lengths": np.ones(10)}, r"sequences per bin \(.K\) must be >= 1"),
        ({"ordering": "laplace:0", "lengths": np.ones(10)}, "number of bins must be >= 1"),
        ({"ordering": "laplace:", "lengths": np.ones(10)}, "number of bins must be a positive integer"),
        ({"ordering": "laplace:2:3:4", "lengths": np.ones(10)}, "at most two arguments"),
        ({"ordering": "sort_bin_shuffle_x2:-3", "lengths": np.ones(10)}, "positive integer"),
        ({"ordering": "default_every_n"}, "expected 'default_every_n:K'"),
        ({"ordering": "default_every_n:0"}, "K must be >= 1"),
        ({"ordering": "default:1"}, "takes no arguments"),
        ({"ordering": "sorted"}, "needs lengths"),
        ({"ordering": "laplace:.5"}, "needs lengths"),
        ({"ordering": "sorted", "lengths": np.ones(9)}, "lengths has 9 entries, expected num_seqs = 10"),
        ({"ordering": "random", "lengths": np.ones(11)}, "lengths has 11 entries"),
        ({"ordering": "sorted", "lengths": np.ones((10, 2))}, "lengths must be 1-D"),
        ({"ordering": "sorted", "lengths": np.array(["a"] * 10)}, "integer or float dtype"),
        ({"ordering": "random", "epoch": 0}, "epoch must be >= 1"),
        ({"ordering": "random", "partition_epoch": 0}, "partition_epoch must be >= 1"),
        ({"ordering": "random", "num_shards": 0}, "num_shards must be >= 1"),
        ({"ordering": "random", "num_shards": 2, "shard_index": 2}, "shard_index must be < num_shards = 2"),
        ({"ordering": "random", "shard_index": -1}, "shard_index must be >= 0"),
        ({"ordering": "random", "seed": 1.5}, "seed must be an integer"),
        ({"ordering": "random", "epoch": True}, "epoch must be an integer"),
        ({"ordering": 3.0}, "ordering must be a name"),
    ],
)
def test_errors(kwargs: dict[str, Any], match: str) -> None:
    kwargs.setdefault("epoch", 1)
    with pytest.raises(ValueError, match=match):
        seq_order(10, **kwargs)


def test_num_seqs_errors_and_edges() -> None:
    with pytest.raises(ValueError, match="num_seqs"):
        seq_order(-1, "random", epoch=1)
    with pytest.raises(ValueError, match="num_seqs"):
        seq_order(2**63, "random", epoch=1)
    assert len(seq_order(0, "random", epoch=1)) == 0
    assert list(seq_order(0, "laplace", epoch=1, lengths=[])) == []
    assert list(seq_order(1, "sort_bin_shuffle_x2", epoch=1, lengths=[5])) == [0]
    assert len(seq_order(5, "default_every_n:7", epoch=1)) == 0  # RETURNN drops N % K
    assert list(seq_order(7, "default_every_n:2", epoch=1)) == [0, 3, 1, 4, 2, 5]


def test_take_errors() -> None:
    o = seq_order(10, "random", epoch=1)
    with pytest.raises(IndexError):
        o.take([10])
    with pytest.raises(IndexError):
        o.take(np.array([-11]))
    with pytest.raises(IndexError):
        o.take(np.array([10], dtype=np.uint64))
    with pytest.raises(TypeError):
        o.take([0.5])
    assert o.take([]).shape == (0,)
    with pytest.raises(ValueError):
        list(o.iter_chunks(0))


def test_permutation_position_of() -> None:
    o = seq_order(10**6, "random", epoch=1)
    p = o.base  # type: ignore[attr-defined]
    assert isinstance(p, PermutationOrder)
    vals = o.take(np.arange(0, 10**6, 997))
    assert np.array_equal(p.position_of(vals), np.arange(0, 10**6, 997))


def test_orderings_table_documented() -> None:
    assert "laplace[:B|:.K][:nth]" in ORDERINGS
