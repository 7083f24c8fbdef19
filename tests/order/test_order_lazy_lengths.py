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
