"""seq_order against RETURNN's own ``Dataset.get_seq_order_for_epoch``: identical indices for the
deterministic orderings with partition epoch and shards; same bin sizes and sort directions for
laplace and sort_bin_shuffle; same block sizes for the random ones."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from seqstore.order import seq_order
from seqstore.order._kernels import bin_start

returnn_basic = pytest.importorskip("returnn.datasets.basic")
Dataset = returnn_basic.Dataset

PARTITIONS = (1, 2, 3, 7)
SHARDS = (1, 2, 3)


def returnn_order(
    ordering: str,
    n: int,
    epoch: int,
    lengths: np.ndarray | None = None,
    partition_epoch: int = 1,
    num_shards: int = 1,
    shard_index: int = 0,
) -> np.ndarray:
    ds = Dataset(
        seq_ordering=ordering,
        partition_epoch=partition_epoch,
        random_seed_offset=0,
        _num_shards=num_shards,
        _shard_index=shard_index,
    )
    get_len: Any = None if lengths is None else lengths.__getitem__
    return np.asarray(ds.get_seq_order_for_epoch(epoch, n, get_seq_len=get_len), dtype=np.int64)


def _cases(seed: int, count: int) -> list[tuple[int, int, int]]:
    rng = np.random.default_rng(seed)
    cases = []
    for p, s in itertools.product(PARTITIONS, SHARDS):
        for n in rng.integers(1, 501, size=count).tolist() + [1, p * s, p * s + 1]:
            cases.append((int(n), p, s))
    return cases


@pytest.mark.parametrize(
    "ordering",
    ["default", "reverse", "default_every_n:1", "default_every_n:3", "default_every_n:7", "sorted", "sorted_reverse"],
)
def test_deterministic_orderings_equal_returnn(ordering: str) -> None:
    rng = np.random.default_rng(len(ordering))
    for n, p, s in _cases(len(ordering), 3):
        lengths = rng.integers(1, 12, size=n)  # many ties: stability matters
        for epoch in range(1, 2 * p + 1):
            for shard in range(s):
                ours = seq_order(
                    n, ordering, epoch=epoch, lengths=lengths, partition_epoch=p, num_shards=s, shard_index=shard
                )
                theirs = returnn_order(ordering, n, epoch, lengths, p, s, shard)
                assert ours == theirs, (ordering, n, p, s, epoch, shard)
                assert np.array_equal(ours.to_numpy(), theirs)


def test_explicit_order_equal_returnn_partitioning() -> None:
    rng = np.random.default_rng(3)
    for n, p, s in _cases(3, 2):
        explicit = rng.permutation(n)
        for epoch in range(1, p + 2):
            for shard in range(s):
                ours = seq_order(n, explicit, epoch=epoch, partition_epoch=p, num_shards=s, shard_index=shard)
                theirs = Dataset._apply_partition_epoch_and_sharding(explicit, p, epoch, s, shard)
                assert np.array_equal(ours.to_numpy(), theirs)


@pytest.mark.parametrize(
    "ordering", ["random", "random:2", "random_sample", "laplace:.10", "sort_bin_shuffle:3", "sort_bin_shuffle_x2:.7"]
)
def test_random_orderings_block_sizes_equal_returnn(ordering: str) -> None:
    rng = np.random.default_rng(11)
    for n, p, s in _cases(11, 1):
        lengths = rng.integers(1, 50, size=n)
        for shard in range(s):
            for epoch in range(1, p + 1):
                ours = seq_order(
                    n, ordering, epoch=epoch, lengths=lengths, partition_epoch=p, num_shards=s, shard_index=shard
                )
                theirs = returnn_order(ordering, n, epoch, lengths, p, s, shard)
                assert len(ours) == len(theirs)
        # every (sub-epoch, shard) block of one full epoch together is the full order
        blocks = [
            seq_order(n, ordering, epoch=e, lengths=lengths, partition_epoch=p, num_shards=s, shard_index=sh).to_numpy()
            for e in range(1, p + 1)
            for sh in range(s)
        ]
        whole = seq_order(n, ordering, epoch=1, lengths=lengths).to_numpy()
        assert np.array_equal(np.concatenate(blocks), whole)
        if not ordering.startswith("random_sample"):
            assert np.array_equal(np.sort(whole), np.arange(n))


def _bounds(n: int, bins: int) -> list[tuple[int, int]]:
    return [
        (
            int(bin_start(np.uint64(j), np.uint64(n), np.uint64(bins))),
            int(bin_start(np.uint64(j + 1), np.uint64(n), np.uint64(bins))),
        )
        for j in range(bins)
    ]


def _check_laplace(order: np.ndarray, lengths: np.ndarray, bins: int) -> None:
    n = len(lengths)
    assert np.array_equal(np.sort(order), np.arange(n))
    for j, (s, e) in enumerate(_bounds(n, bins)):
        d = np.diff(lengths[order[s:e]])
        assert (d > 0).all() if j % 2 == 0 else (d < 0).all(), (j, s, e)


@pytest.mark.parametrize("spec", ["", ":1", ":2", ":5", ":.7", ":.1", ":600", ":3:2"])
def test_laplace_bins_like_returnn(spec: str) -> None:
    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 10, 99, 257, 500):
        lengths = rng.permutation(n) + 1  # distinct: bin edges show as direction changes
        ordering = "laplace" + spec
        args = spec.split(":")[1:]
        bins = 2 if not args else max(n // int(args[0][1:]), 2) if args[0].startswith(".") else int(args[0])
        for epoch in (1, 2):
            _check_laplace(returnn_order(ordering, n, epoch, lengths), lengths, bins)
            ours = seq_order(n, ordering, epoch=epoch, lengths=lengths)
            _check_laplace(ours.to_numpy(np.int64), lengths, bins)
            assert ours.base.bins == bins  # type: ignore[attr-defined]


def _parse_sort_bin_shuffle(order: np.ndarray, lengths: np.ndarray, bins: int, within: bool) -> list[int]:
    """Split an output into bins of the length-sorted order; return the visited bin ids."""
    n = len(lengths)
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(lengths, kind="stable")] = np.arange(n)
    bounds = _bounds(n, bins)
    starts = np.array([s for s, _ in bounds])
    visited = []
    i = 0
    while i < n:
        r = rank[order[i]]
        j = int(np.searchsorted(starts, r, side="right") - 1)
        while bounds[j][0] == bounds[j][1]:
            j -= 1
        s, e = bounds[j]
        seg = rank[order[i : i + e - s]]
        if within:
            assert np.array_equal(np.sort(seg), np.arange(s, e)), (i, j)
        else:
            assert np.array_equal(seg, np.arange(s, e)), (i, j)
        visited.append(j)
        i += e - s
    nonempty = [j for j, (s, e) in enumerate(bounds) if e > s]
    assert sorted(visited) == nonempty
    return visited


@pytest.mark.parametrize("name", ["sort_bin_shuffle", "sort_bin_shuffle_x2"])
@pytest.mark.parametrize("spec", ["", ":1", ":4", ":.7", ":.1", ":600", ":3:2"])
def test_sort_bin_shuffle_bins_like_returnn(name: str, spec: str) -> None:
    rng = np.random.default_rng(9)
    for n in (1, 2, 5, 64, 257, 500):
        lengths = rng.permutation(n) * 3 + 1
        ordering = name + spec
        args = spec.split(":")[1:]
        bins = 2 if not args else max(n // int(args[0][1:]), 2) if args[0].startswith(".") else int(args[0])
        within = name.endswith("_x2")
        for epoch in (1, 2):
            _parse_sort_bin_shuffle(returnn_order(ordering, n, epoch, lengths), lengths, bins, within)
            ours = seq_order(n, ordering, epoch=epoch, lengths=lengths)
            _parse_sort_bin_shuffle(ours.to_numpy(np.int64), lengths, bins, within)


def test_sort_bin_shuffle_ties_are_shuffled() -> None:
    n = 20_000
    lengths = np.repeat(np.arange(4), n // 4)
    o = seq_order(n, "sort_bin_shuffle:1", epoch=1, lengths=lengths).to_numpy(np.int64)
    # one bin: sorted by length, equal lengths in random order
    assert (np.diff(lengths[o]) >= 0).all()
    for v in range(4):
        run = o[lengths[o] == v]
        assert np.array_equal(np.sort(run), np.arange(v * n // 4, (v + 1) * n // 4))
        stat = np.abs(np.diff(run)).mean() / (n // 4)
        assert abs(stat - 1 / 3) < 0.03
