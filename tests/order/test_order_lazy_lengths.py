"""Lengths given as a lazy object (len, dtype, take) are gathered per bin, never materialised by laplace."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from seqstore.order import seq_order


class LazyLengths:
    """Counts what was gathered and refuses to be materialised."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.dtype = values.dtype
        self.gathered = 0

    def __len__(self) -> int:
        return len(self.values)

    def take(self, idx: np.ndarray) -> np.ndarray:
        self.gathered += len(idx)
        return self.values[idx]

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        raise AssertionError("laplace must not materialise lazy lengths")


@pytest.mark.parametrize("ordering", ["laplace:.100", "laplace:7", "laplace:.50:2"])
def test_laplace_with_lazy_lengths_equals_array_lengths(ordering: str) -> None:
    values = np.random.default_rng(3).integers(1, 500, 5000).astype(np.int32)
    lazy = LazyLengths(values)
    kw = {"seed": 9, "partition_epoch": 3, "shard_index": 1, "num_shards": 2}
    for epoch in (1, 2, 5):
        a = seq_order(5000, ordering, epoch=epoch, lengths=lazy, **kw)
        b = seq_order(5000, ordering, epoch=epoch, lengths=values, **kw)
        np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    assert 0 < lazy.gathered


def test_laplace_gathers_only_the_bins_it_touches() -> None:
    values = np.arange(100_000, dtype=np.int64) % 977
    lazy = LazyLengths(values)
    order = seq_order(100_000, "laplace:.1000", epoch=1, lengths=lazy, partition_epoch=100)
    order.to_numpy()  # one sub-epoch: about 1000 sequences, one or two bins
    assert lazy.gathered <= 3 * 1000


def test_sorted_materialises_lazy_lengths_on_demand() -> None:
    values = np.random.default_rng(1).integers(0, 50, 300)

    class Materialisable(LazyLengths):
        def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
            return self.values

    order = seq_order(300, "sorted", epoch=1, lengths=Materialisable(values))
    np.testing.assert_array_equal(order.to_numpy(), np.argsort(values, kind="stable"))


def test_lazy_lengths_order_pickles_with_the_lazy_object() -> None:
    values = np.arange(50, dtype=np.int16)
    order = seq_order(50, "laplace:5", epoch=1, lengths=LazyLengths(values))
    again = pickle.loads(pickle.dumps(order))
    np.testing.assert_array_equal(again.to_numpy(), order.to_numpy())


def test_sort_index_reads_lazy_lengths_in_chunks_and_reuses_its_cache(tmp_path: object) -> None:
    from pathlib import Path

    from seqstore.order import sort_index

    values = np.random.default_rng(2).integers(0, 300, 20_000).astype(np.int32)
    lazy = LazyLengths(values)  # materialising raises
    cache = Path(str(tmp_path)) / "sidx.npy"
    idx = sort_index(lazy, cache=cache)
    np.testing.assert_array_equal(idx, np.argsort(values, kind="stable"))
    before = lazy.gathered
    order = seq_order(20_000, "sorted", epoch=1, lengths=lazy, sort_cache=cache)
    np.testing.assert_array_equal(order[:100], np.argsort(values, kind="stable")[:100])
    assert lazy.gathered - before < len(values) // 2  # the cache's spot check, not another pass


class _AffineValues:
    """u -> (3u + 7, lengths[u]): items addressed by values other than their positions."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def __call__(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return 3 * u + 7, self.lengths[u]


def test_laplace_values_yield_mapped_items_in_the_same_order() -> None:
    values = np.random.default_rng(4).integers(1, 90, 3000)
    kw = {"seed": 2, "partition_epoch": 2, "shard_index": 1, "num_shards": 3}
    for epoch in (1, 2, 3):
        plain = seq_order(3000, "laplace:.64", epoch=epoch, lengths=values, **kw)
        mapped = seq_order(3000, "laplace:.64", epoch=epoch, values=_AffineValues(values), num_values=9007, **kw)
        np.testing.assert_array_equal(mapped.to_numpy(), 3 * plain.to_numpy() + 7)
        assert mapped.num_seqs == 9007
        again = pickle.loads(pickle.dumps(mapped))
        np.testing.assert_array_equal(again.to_numpy(), mapped.to_numpy())


def test_values_are_only_for_laplace() -> None:
    with pytest.raises(ValueError, match="laplace"):
        seq_order(10, "random", epoch=1, values=_AffineValues(np.ones(10)))


@pytest.mark.parametrize("span", [1, 7, 300, 70_000, 1 << 30])
def test_sort_segments_is_a_stable_sort_both_ways(span: int) -> None:
    from seqstore.order._sort_kernels import sort_segments

    rng = np.random.default_rng(span)
    sizes = rng.integers(0, 400, 30).astype(np.int64)
    total = int(sizes.sum())
    vals = rng.integers(-5, span, total).astype(np.int64)  # many ties for small spans
    desc = rng.integers(0, 2, 30).astype(bool)
    flat = rng.permutation(total).astype(np.int64)
    original = flat.copy()
    expect = flat.copy()
    pos = 0
    for m, d in zip(sizes.tolist(), desc.tolist()):
        key = -vals[pos : pos + m] if d else vals[pos : pos + m]
        expect[pos : pos + m] = flat[pos : pos + m][np.argsort(key, kind="stable")]
        pos += m
    sort_segments(flat, vals, sizes, desc)
    np.testing.assert_array_equal(flat, expect)
    floats = original.copy()  # float keys take the merge-sort path: same stable result
    sort_segments(floats, vals.astype(np.float64) / 3, sizes, desc)
    np.testing.assert_array_equal(floats, expect)
