"""The keyed permutation behind ``random``: bijectivity, statistics, key separation, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from seqstore.order import PermutationOrder, seq_order
from seqstore.order import _kernels as K
from seqstore.order._keys import key_epoch, master_key


def _is_permutation(values: np.ndarray, n: int) -> bool:
    if values.shape != (n,) or (n and (values.min() < 0 or values.max() >= n)):
        return False
    seen = np.zeros(n, dtype=bool)
    seen[values] = True
    return bool(seen.all())


def test_bijective_every_n_up_to_3000() -> None:
    for n in range(1, 3001):
        p = PermutationOrder(n, master_key(n, 1, "test"))
        assert _is_permutation(p.take(np.arange(n)), n), n


def _powers(lo: int, hi: int) -> list[int]:
    return sorted({m for k in range(lo, hi + 1) for m in (2**k - 1, 2**k, 2**k + 1)})


@pytest.mark.parametrize("n", _powers(1, 20) + [2**24 + 1])
def test_bijective_powers_of_two(n: int) -> None:
    # 2**k + 1 for even k >= 16 is where Grain's permutation aliases the top index onto 0.
    p = seq_order(n, "random", epoch=1, seed=7)
    assert _is_permutation(p.to_numpy(np.int64), n)


@pytest.mark.slow
@pytest.mark.parametrize("n", [m for m in _powers(21, 24) if m != 2**24 + 1])
def test_bijective_powers_of_two_large(n: int) -> None:
    p = seq_order(n, "random", epoch=3, seed=1)
    assert _is_permutation(p.to_numpy(np.int64), n)


@pytest.mark.parametrize("n", [2**31 - 1, 2**31 + 1, 10**10, 2**62 + 1, 2**63 - 1])
def test_huge_n_values_in_range_and_invertible(n: int) -> None:
    p = PermutationOrder(n, master_key(0, 1, "perm"))
    pos = np.concatenate([np.arange(1000), n - 1 - np.arange(1000)]).astype(np.int64)
    vals = p.take(pos)
    assert vals.min() >= 0 and vals.max() < n
    assert len(np.unique(vals)) == len(vals)
    assert np.array_equal(p.position_of(vals), pos)


def test_inverse_round_trip_small() -> None:
    for n in (1, 2, 3, 17, 1000):
        p = PermutationOrder(n, 12345)
        vals = p.take(np.arange(n))
        assert np.array_equal(p.position_of(vals), np.arange(n))


def test_python_and_numba_key_schedules_agree() -> None:
    from seqstore.order import _keys

    out = np.empty(K.ROUNDS, dtype=np.uint64)
    for master in (0, 1, 2**63, 2**64 - 1, master_key(3, 4, "perm")):
        K.round_keys(np.uint64(master), out)
        assert out.tolist() == _keys.round_keys(master, K.ROUNDS)
        for tag in (0, 1, 5, 2**64 - 1):
            assert int(K.child_key(np.uint64(master), np.uint64(tag))) == _keys.child_key(master, tag)
        assert int(K.mix64(np.uint64(master))) == _keys.mix64(master)
    for n in (1, 2, 3, 10**10, 2**63 - 1):
        assert tuple(int(v) for v in K.split(np.uint64(n))) == _keys.split(n)


def test_split_matches_integer_sqrt() -> None:
    for n in [1, 2, 3, 4, 5, 99, 100, 101, 2**32, 2**32 + 1, 2**62, 2**63 - 1, 10**18 + 7]:
        a, b = K.split(np.uint64(n))
        assert int(a) == math.isqrt(n - 1) + 1
        assert int(b) == -(-n // int(a))
        assert n <= int(a) * int(b) < n + int(a)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_neighbour_statistic(seed: int) -> None:
    # Uniform random permutation: E|p(i+1) - p(i)| / N -> 1/3 (Grain's 4-round Feistel gives 0.227).
    n = 2**20 + 12345
    v = seq_order(n, "random", epoch=1, seed=seed).to_numpy(np.int64)
    stat = float(np.abs(np.diff(v)).mean()) / n
    assert abs(stat - 1 / 3) < 0.005, stat


def test_position_value_independence_chi_square() -> None:
    # 16 position buckets x 16 value buckets of one order: counts must look independent.
    n = 2**16 + 3
    for seed in range(4):
        v = seq_order(n, "random", epoch=1, seed=seed).to_numpy(np.int64)
        pb = np.arange(n) * 16 // n
        vb = v * 16 // n
        table = np.zeros((16, 16))
        np.add.at(table, (pb, vb), 1)
        expected = np.outer(table.sum(1), table.sum(0)) / n
        chi2 = float(((table - expected) ** 2 / expected).sum())
        # 225 degrees of freedom: mean 225, sd 21.2; 330 is p ~ 1e-5.
        assert chi2 < 330, (seed, chi2)


def test_fixed_position_uniform_over_keys_chi_square() -> None:
    n, trials, buckets = 1000, 3000, 10
    for pos in (0, 1, n - 1):
        vals = np.array([PermutationOrder(n, master_key(s, 1, "perm"))[pos] for s in range(trials)])
        counts = np.bincount(vals * buckets // n, minlength=buckets)
        e = trials / buckets
        chi2 = float(((counts - e) ** 2 / e).sum())
        assert chi2 < 40, (pos, chi2)  # 9 dof: p ~ 1e-5


def test_distinct_across_seeds_and_epochs() -> None:
    n = 10_000
    orders = {}
    for seed in range(4):
        for epoch in range(1, 5):
            orders[(seed, epoch)] = seq_order(n, "random", epoch=epoch, seed=seed).to_numpy().tobytes()
    assert len(set(orders.values())) == len(orders)
    # The Grain defect: seed s epoch 2 must differ from seed s+1 epoch 1.
    assert orders[(0, 2)] != orders[(1, 1)]
    assert master_key(0, 2, "perm") != master_key(1, 1, "perm")
    assert master_key(-1, 1, "perm") != master_key(1, 1, "perm")


def test_key_epoch_groups() -> None:
    assert [key_epoch(e, 3, 1) for e in range(1, 8)] == [1, 1, 1, 2, 2, 2, 3]
    assert [key_epoch(e, 1, 2) for e in range(1, 6)] == [1, 1, 2, 2, 3]
    assert [key_epoch(e, 2, 2) for e in range(1, 10)] == [1, 1, 1, 1, 2, 2, 2, 2, 3]
    n = 1000
    a = seq_order(n, "random:2", epoch=1).to_numpy()
    b = seq_order(n, "random:2", epoch=2).to_numpy()
    c = seq_order(n, "random:2", epoch=3).to_numpy()
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_golden_values() -> None:
    """The permutation is part of the on-disk/experiment contract: it must never change silently."""
    got = seq_order(10**9, "random", epoch=1, seed=0)[:8].to_numpy().tolist()
    again = PermutationOrder(10**9, master_key(0, 1, "perm")).take(np.arange(8)).tolist()
    assert got == again
    assert got == GOLDEN_1E9


GOLDEN_1E9 = [383871683, 723425824, 341947652, 221102253, 721848371, 733494662, 179839677, 610681663]


def test_random_sample_distribution() -> None:
    n = 100_000
    v = seq_order(n, "random_sample", epoch=1, seed=5).to_numpy(np.int64)
    assert v.min() >= 0 and v.max() < n
    # With replacement: about N(1 - 1/e) distinct values.
    distinct = len(np.unique(v)) / n
    assert abs(distinct - (1 - math.exp(-1))) < 0.01
    counts = np.bincount(v * 20 // n, minlength=20)
    e = n / 20
    assert float(((counts - e) ** 2 / e).sum()) < 60
    w = seq_order(n, "random_sample", epoch=2, seed=5).to_numpy(np.int64)
    assert not np.array_equal(v, w)
    assert seq_order(10**12, "random_sample", epoch=1).take(np.arange(100)).max() < 10**12


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 12_345, 1_000_003, 2**40 + 17, 2**62 + 5])
def test_numpy_twin_of_the_permutation_equals_the_kernel(n: int) -> None:
    """``perm_take_numpy`` (a first batch computed before numba has started) gives the kernel's values."""
    from seqstore.order import _kernels as K
    from seqstore.order.kinds import PermutationOrder

    order = PermutationOrder(n, 0x1234_5678_9ABC_DEF0)
    pos = np.random.default_rng(n % 97).integers(0, n, size=5_000, dtype=np.int64)
    want = np.empty(len(pos), dtype=np.int64)
    K.perm_take(pos, np.uint64(n), order._a, order._b, order._keys, want)
    got = K.perm_take_numpy(pos, np.uint64(n), order._a, order._b, order._keys)
    assert got.dtype == np.int64 and np.array_equal(got, want)
