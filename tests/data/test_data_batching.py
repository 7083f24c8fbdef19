"""batch_indices and bucket_batches: limits on random lengths, greedy semantics, exactly-once, warnings."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from seqstore.data import ArrayLengths, batch_indices, bucket_batches
from seqstore.order import seq_order


def _cost(lens: np.ndarray, padded: bool) -> int:
    return int(lens.max()) * len(lens) if padded else int(lens.sum())


def _naive_greedy(order: np.ndarray, lens: np.ndarray, mf: int | None, ms: int | None, padded: bool) -> list[list[int]]:
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order.tolist():
        ln = int(lens[i])
        if mf is not None and ln > mf:
            if cur:
                out.append(cur)
            out.append([i])
            cur = []
            continue
        cand = cur + [i]
        over = (ms is not None and len(cand) > ms) or (mf is not None and _cost(lens[cand], padded) > mf)
        if cur and over:
            out.append(cur)
            cur = [i]
        else:
            cur = cand
    if cur:
        out.append(cur)
    return out


@pytest.mark.parametrize("trial", range(16))
def test_batch_indices_limits_and_greedy(trial: int) -> None:
    rng = np.random.default_rng(trial)
    n = int(rng.integers(0, 3000))
    lens = rng.integers(0, 200, n)
    mf = None if trial % 5 == 0 else int(rng.integers(50, 2000))
    ms = None if (trial % 3 == 0 and mf is not None) else int(rng.integers(1, 40))
    padded = bool(trial % 2)
    order = seq_order(n, "random", epoch=1, seed=trial)
    it = batch_indices(order, ArrayLengths(lens), max_frames=mf, max_seqs=ms, padded=padded,
                       chunk_size=int(rng.integers(1, 500)))
    batches = [b.tolist() for b in it]
    assert batches == _naive_greedy(order.to_numpy(), lens, mf, ms, padded)
    if batches:
        np.testing.assert_array_equal(np.concatenate(batches), order.to_numpy())
    for b in batches:
        if ms is not None:
            assert len(b) <= ms
        if mf is not None and len(b) > 1:
            assert _cost(lens[b], padded) <= mf
    assert it.overlong == (int((lens > mf).sum()) if mf is not None else 0)


def test_overlong_warned_never_dropped(caplog: pytest.LogCaptureFixture) -> None:
    lens = np.array([5, 50, 5, 5, 60, 1])
    with caplog.at_level(logging.WARNING, logger="seqstore.data.batching"):
        it = batch_indices(np.arange(6), lens, max_frames=20)
        batches = [b.tolist() for b in it]
    assert batches == [[0], [1], [2, 3], [4], [5]]
    assert it.overlong == 2 and "2 sequence(s) longer than max_frames=20" in caplog.text
    with pytest.raises(ValueError, match="needs max_frames or max_seqs"):
        batch_indices(np.arange(3), lens[:3])


@pytest.mark.parametrize("trial", range(12))
def test_bucket_batches_exactly_once(trial: int) -> None:
    rng = np.random.default_rng(100 + trial)
    n = int(rng.integers(0, 5000))
    lens = rng.integers(1, 300, n)
    mf = int(rng.integers(200, 3000))
    ms = None if trial % 2 else int(rng.integers(1, 64))
    buckets = int(rng.integers(1, 9)) if trial % 3 else [20, 50, 100, 200]
    order = seq_order(n, "random", epoch=2, seed=trial)
    kw = dict(buckets=buckets, buffer_size=int(rng.integers(1, 800)), max_frames=mf, max_seqs=ms,
              padded=bool(trial % 2), seed=trial, chunk_size=int(rng.integers(1, 700)))
    it = bucket_batches(order, lens, **kw)
    batches = [b.copy() for b in it]
    flat = np.concatenate(batches) if batches else np.empty(0, np.int64)
    assert sorted(flat.tolist()) == sorted(order.to_numpy().tolist())  # every sequence exactly once
    for b in batches:
        assert len(b) >= 1
        if ms is not None:
            assert len(b) <= ms
        if len(b) > 1:
            assert _cost(lens[b], bool(trial % 2)) <= mf
    assert it.overlong == int((lens > mf).sum())
    again = [b.tolist() for b in bucket_batches(order, lens, **kw)]
    assert again == [b.tolist() for b in batches]  # deterministic


def test_bucket_batches_groups_similar_lengths() -> None:
    rng = np.random.default_rng(5)
    lens = rng.integers(1, 1000, 20000)
    order = seq_order(len(lens), "random", epoch=1, seed=0)
    spread_bucketed = np.mean([np.ptp(lens[b]) for b in
                               bucket_batches(order, lens, buckets=10, buffer_size=2000, max_frames=20000)])
    spread_greedy = np.mean([np.ptp(lens[b]) for b in batch_indices(order, lens, max_frames=20000)])
    assert spread_bucketed < spread_greedy / 3


@pytest.mark.parametrize("chunk_size", [0, -5, 2.5, True])
def test_a_chunk_size_that_is_not_a_positive_integer_is_refused_naming_it(chunk_size: Any) -> None:
    """A negative chunk_size over an index array yielded no batch at all (every sequence silently lost),
    0 a bare 'range() arg 3 must not be zero'; now a ValueError naming chunk_size, when the call is made."""
    order, lens = np.arange(10), np.ones(10, dtype=np.int64)
    with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):
        batch_indices(order, lens, max_seqs=2, chunk_size=chunk_size)
    with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):
        bucket_batches(order, lens, buckets=2, buffer_size=4, max_seqs=2, chunk_size=chunk_size)
