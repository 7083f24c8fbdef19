"""Edges of the Order API: searching an order, non-integer arguments of the order kinds'
own methods, and what a laplace ``values`` callable returns."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from seqstore.order import seq_order
from seqstore.order.api import check_ordering


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


def test_position_of_refuses_values_that_are_no_integers() -> None:
    """A float or bool value used to be truncated to an integer: the position of another sequence."""
    perm = seq_order(100, "random", epoch=1).base  # type: ignore[attr-defined]
    assert perm.position_of(np.array([perm[7]], dtype=np.uint8)).tolist() == [7]
    assert perm.position_of([]).shape == (0,)
    for bad in ([1.7], np.array([2.0]), [True, False]):
        with pytest.raises(TypeError, match="values must be integers"):
            perm.position_of(bad)
    with pytest.raises(ValueError, match=r"values must be in \[0, 100\)"):
        perm.position_of(np.array([2**64 - 1], dtype=np.uint64))


def test_window_bounds_refuses_a_window_that_is_no_integer() -> None:
    """``window_bounds(0.5)`` returned float bounds; ``window_bounds(True)`` was window 1."""
    rb = seq_order(100, "random_block:4:3", epoch=1).base  # type: ignore[attr-defined]
    assert rb.window_bounds(np.int64(1)) == rb.window_bounds(1) == (12, 24)
    for bad in (0.5, 1.0, True, "1"):
        with pytest.raises(TypeError, match="window must be an integer"):
            rb.window_bounds(bad)
    with pytest.raises(ValueError, match=r"window must be in \[0, 9\)"):
        rb.window_bounds(9)


class _Values:
    """A laplace ``values`` callable: position -> (value, length), with ``scale`` for values out of range
    and ``short`` for a callable that answers fewer entries than asked."""

    def __init__(self, scale: int = 1, short: int = 0) -> None:
        self.scale, self.short = scale, short

    def __call__(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = pos[: len(pos) - self.short]
        return pos * self.scale, pos % 7


def test_laplace_values_are_checked_against_num_values() -> None:
    good = seq_order(40, "laplace:4", epoch=1, values=_Values(3), num_values=120)
    assert sorted(good.to_numpy(np.int64).tolist()) == list(range(0, 120, 3))
    with pytest.raises(ValueError, match=r"values callable returned \d+ .*outside \[0, 100\)"):
        seq_order(40, "laplace:4", epoch=1, values=_Values(3), num_values=100).to_numpy()
    with pytest.raises(ValueError, match=r"returned 39 values \(int64\) and 39 lengths for 40 positions"):
        seq_order(40, "laplace", epoch=1, values=_Values(short=1)).to_numpy()
    for bad in (-1, 1.5, True, "9"):
        with pytest.raises((TypeError, ValueError), match="num_values"):
            seq_order(40, "laplace", epoch=1, values=_Values(), num_values=bad)
    with pytest.raises(ValueError, match="num_values= goes with values="):
        seq_order(40, "random", epoch=1, num_values=40)


@pytest.mark.parametrize("ordering", [f"laplace:{2**63}", f"sort_bin_shuffle:{2**64}:2",
                                      f"sort_bin_shuffle_x2:{2**70}"])
def test_a_bin_count_past_int64_is_refused_when_the_ordering_is_checked(ordering: str) -> None:
    """check_ordering (what datasets call up front) let it through; seq_order then failed without the name."""
    from seqstore.order.api import check_ordering

    for check in (lambda: check_ordering(ordering), lambda: seq_order(10, ordering, epoch=1, lengths=np.ones(10))):
        with pytest.raises(ValueError, match=rf"ordering '{ordering}': number of bins must be <= 2\*\*63 - 1"):
            check()


@pytest.mark.parametrize("ordering", ["random:" + "1" * 5000, "laplace:." + "9" * 5000, "random_block:2:" + "3" * 5000,
                                      "default_every_n:" + "7" * 5000])
def test_an_argument_of_thousands_of_digits_is_named(ordering: str) -> None:
    name = ordering.split(":")[0]
    with pytest.raises(ValueError, match=f"ordering '{name}:.*(nth|K|W|per bin).*5000 digits"):
        check_ordering(ordering)


def test_to_numpy_refuses_a_dtype_that_cannot_hold_every_index() -> None:
    """to_numpy(np.int8) of 5000 records wrapped 4999 to -121 (another record, or a negative index)."""
    order = seq_order(5000, "reverse", epoch=1)
    for dtype in (np.int8, np.uint8, np.float16, bool):
        with pytest.raises(ValueError, match=f"dtype {np.dtype(dtype)} cannot hold .* 4999"):
            order.to_numpy(dtype)
        with pytest.raises(ValueError, match="cannot hold"):
            np.asarray(order, dtype=dtype)
    big = seq_order(2**60, "reverse", epoch=1)[:3]
    with pytest.raises(ValueError, match="cannot hold"):
        big.to_numpy(np.float64)
    assert order.to_numpy(np.int16)[0] == 4999 and order.to_numpy(np.uint16)[-1] == 0
    assert np.asarray(order, dtype=np.float32)[0] == 4999.0
    assert seq_order(256, "reverse", epoch=1).to_numpy(np.uint8)[0] == 255  # (uint8 holds 0..255)
    assert seq_order(0, "default", epoch=1).to_numpy(np.int8).shape == (0,)


def _laplace_reference(order: np.ndarray, lengths: np.ndarray, bins: int) -> list[int]:
    """RETURNN's laplace: bin j of the permutation stably sorted by length, ascending for even j."""
    n, out = len(order), []
    for j in range(bins):
        part = order[j * n // bins : (j + 1) * n // bins].tolist()
        out += sorted(part, key=lambda i: int(lengths[i]), reverse=False) if j % 2 == 0 else \
            sorted(part, key=lambda i: -int(lengths[i]))
    return out


@pytest.mark.parametrize("lengths", [
    np.array([2**64 - 1, 0, 2**63, 5, 2**63 - 1, 2**64 - 1, 7, 2**63 + 9], dtype=np.uint64),
    np.tile(np.array([-2**63, 0, 2**63 - 1, -1, 1, -2**63, 2**40, -2**40], dtype=np.int64), 5),
])
def test_laplace_sorts_lengths_at_the_ends_of_64_bits(lengths: np.ndarray) -> None:
    """uint64 lengths >= 2**63 were sorted as negative numbers, and -2**63 as the longest where a bin sorts
    descending (its negation overflowed back to -2**63)."""
    n = len(lengths)
    for bins in (1, 2, 3, 5):
        got = seq_order(n, f"laplace:{bins}", epoch=1, seed=2, lengths=lengths).to_numpy(np.int64).tolist()
        perm = seq_order(n, "random", epoch=1, seed=2).to_numpy(np.int64)
        assert got == _laplace_reference(perm, lengths, bins)


def test_unpickling_an_order_whose_mapped_lengths_shrank_names_the_file(tmp_path: Path) -> None:
    """np.memmap's bare "mmap length is greater than file size" named neither the file nor the order."""
    path = tmp_path / "lengths.npy"
    np.save(path, np.arange(1000))
    data = pickle.dumps(seq_order(1000, "laplace:.100", epoch=1, lengths=str(path)))
    os.truncate(path, 200)
    with pytest.raises(ValueError, match=f"{path}: cannot map 1000 .* at byte 128 .*changed since"):
        pickle.loads(data)


def test_a_mapped_explicit_order_names_a_uint64_value_past_int64_as_it_is(tmp_path: Path) -> None:
    """The value was cast to int64 before the check, so 2**64 - 1 was reported as -1."""
    path = tmp_path / "order.npy"
    np.save(path, np.array([0, 2**64 - 1, 1], dtype=np.uint64))
    order = seq_order(3, str(path), epoch=1)
    for read in (lambda: order.to_numpy(), lambda: order.take(np.array([2, 1])), lambda: order[1]):
        with pytest.raises(ValueError, match=f"value {2**64 - 1} at position 1, outside"):
            read()


def test_a_seed_of_more_digits_than_python_prints_keys_an_order() -> None:
    """docs/orders.md: seed is any Python int; one past Python's int -> str digit limit raised its bare error."""
    seed = -(10**5000) - 7
    a, b = (seq_order(100, "laplace:3", epoch=10**4400, seed=seed, lengths=np.arange(100)) for _ in range(2))
    assert a == b and sorted(a) == list(range(100))
    assert seq_order(100, "random", epoch=1, seed=seed + 1) != seq_order(100, "random", epoch=1, seed=seed)
    assert "seed=<5002-character int>" in repr(a)
