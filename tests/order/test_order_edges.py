"""Edges of the Order API: searching an order."""

from __future__ import annotations

import numpy as np
import pytest

from seqstore.order import seq_order


@pytest.mark.parametrize("ordering", ["random", "random_sample", "laplace:.50", "random_block:8:4", "reverse"])
def test_index_and_count_like_a_list(ordering: str) -> None:
    n = 3000
    lengths = np.random.default_rng(0).integers(1, 30, n)
    order = seq_order(n, ordering, epoch=2, seed=5, lengths=lengths, partition_epoch=2, num_shards=2, shard_index=1)
    full = order.to_numpy(np.int64).tolist()
    for value in (full[0], full[len(full) // 2], full[-1]):
        assert order.index(value) == full.index(value)
        assert order.count(value) == full.count(value)
        if value in full[10:-3]:
            assert order.index(value, 10, -3) == full.index(value, 10, -3)
        else:
            with pytest.raises(ValueError, match="is not in the order"):
                order.index(value, 10, -3)
    view = order[::-3]
    assert view.index(full[-1]) == 0 and view.count(full[-1]) == full.count(full[-1])
    absent = next(v for v in range(n) if v not in full)
    with pytest.raises(ValueError, match=f"{absent} is not in the order"):
        order.index(absent)
    for other in (absent, -1, n, "x", 1.5, True):
        assert order.count(other) == 0
        with pytest.raises(ValueError, match="is not in the order"):
            order.index(other)


def test_index_of_a_permutation_is_its_inverse() -> None:
    base = seq_order(10**12, "random", epoch=1, seed=3).base  # type: ignore[attr-defined]
    values = base.take(np.array([0, 5, 10**12 - 1]))
    assert [base.index(int(v)) for v in values] == [0, 5, 10**12 - 1]
    assert base.count(int(values[1])) == 1 and base.count(10**12) == 0
    with pytest.raises(ValueError, match="is not in the order"):
        base.index(int(values[1]), 6)
    assert int(values[2]) in base and 10**12 not in base and True not in base
