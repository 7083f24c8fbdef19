"""``random_block:B:W``: bijection, windows of W blocks, keys, spec errors, partitions and shards, datasets."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.order import (
    ORDERINGS,
    PermutationOrder,
    RandomBlockOrder,
    block_bounds,
    ordering_needs_lengths,
    seq_order,
)


def _rb(n: int, b: int, w: int, epoch: int = 1, seed: int = 0, **kw: int) -> RandomBlockOrder:
    o = seq_order(n, f"random_block:{b}:{w}", epoch=epoch, seed=seed, **kw)
    base = o.base  # type: ignore[attr-defined]
    assert isinstance(base, RandomBlockOrder)
    return base


def _check_windows(o: RandomBlockOrder, values: np.ndarray) -> None:
    """Windows tile the positions; window w holds exactly the records of its <= W blocks."""
    b, w = o.block, o.window
    blocks = o.block_order().to_numpy(np.int64)
    assert np.array_equal(np.sort(blocks), np.arange(o.num_blocks))
    stop = 0
    for k in range(o.num_windows):
        s, e = o.window_bounds(k)
        assert s == stop and e > s
        mine = blocks[k * w : (k + 1) * w]
        expected = np.sort(np.concatenate([np.arange(j * b, min((j + 1) * b, o.num_seqs)) for j in mine]))
        assert np.array_equal(np.sort(values[s:e]), expected), (o, k)
        stop = e
    assert stop == o.num_seqs


def test_bijective_and_windowed_exhaustive_small() -> None:
    rng = np.random.default_rng(0)
    for n in [*range(0, 41), 63, 64, 65, 127, 129, 200]:
        for b in (1, 2, 3, 4, 5, 7, 8, 16, 50, 300):
            for w in (1, 2, 3, 5, 8, 100):
                o = _rb(n, b, w, seed=n)
                vals = o.to_numpy(np.int64)
                assert np.array_equal(np.sort(vals), np.arange(n)), (n, b, w)
                _check_windows(o, vals)
                if n:
                    pos = rng.integers(0, n, 30)
                    assert np.array_equal(o.take(pos), vals[pos])  # random access = sequential


@pytest.mark.parametrize(("n", "b", "w"), [(100_003, 64, 16), (99_999, 1000, 3), (65_536, 256, 1), (12_345, 7, 200)])
def test_bijective_and_windowed_larger(n: int, b: int, w: int) -> None:
    o = _rb(n, b, w, seed=5)
    vals = o.to_numpy(np.int64)
    assert np.array_equal(np.sort(vals), np.arange(n))
    _check_windows(o, vals)
    chunks = np.concatenate(list(o.iter_chunks(977)))  # chunk edges inside windows
    assert np.array_equal(chunks, vals)
    rev = o.take(np.arange(n - 1, -1, -1))  # descending positions: one run per entry boundary
    assert np.array_equal(rev, vals[::-1])


@pytest.mark.parametrize(("n", "b", "w"), [(50_000, 32, 8), (4_001, 8, 4), (2_001, 4, 1), (3_003, 5, 3)])
def test_locality_of_any_span(n: int, b: int, w: int) -> None:
    """A window draws from exactly its blocks; any L consecutive positions meet at most
    ceil(L / (W*B)) + 2 windows; W*B of them draw from at most 2W blocks, 3W if they hold the window
    of the short last block whole."""
    o = _rb(n, b, w, seed=11)
    vals = o.to_numpy(np.int64)
    span = w * b
    ends = np.array([o.window_bounds(k)[1] for k in range(o.num_windows)])
    blocks = o.block_order()
    assert isinstance(blocks, PermutationOrder)
    short_slot = int(blocks.position_of([o.num_blocks - 1])[0])
    short_start, short_stop = o.window_bounds(short_slot // w)
    step = 1 if n < 10_000 else 37
    for s in range(0, n - span + 1, step):
        touched = len(np.unique(vals[s : s + span] // b))
        holds_short = s <= short_start and short_stop <= s + span
        assert touched <= (3 if holds_short else 2) * w
    for length in (1, span - 1, span, 3 * span + 1, 10 * span):
        for s in range(0, max(n - length, 0) + 1, max(step, 7)):
            met = int(np.searchsorted(ends, min(s + length, n) - 1, side="right") - np.searchsorted(ends, s, "right"))
            assert met + 1 <= math.ceil(length / span) + 2
            assert len(np.unique(vals[s : s + length] // b)) <= w * (met + 1)
    full = 0
    for k in range(o.num_windows):
        s, e = o.window_bounds(k)
        assert len(np.unique(vals[s:e] // b)) == min(w, o.num_blocks - k * w)
        full += e - s == span
    assert full >= o.num_windows - 2  # only the short block's window and the last can be shorter


def test_records_inside_a_window_are_shuffled() -> None:
    n, b, w = 200_000, 64, 16
    vals = _rb(n, b, w, seed=1).to_numpy(np.int64)
    steps = np.diff(vals)
    assert np.mean(steps == 1) < 0.01  # not block-sequential inside windows
    assert 0.4 < np.mean(steps > 0) < 0.6
    same_block = np.mean(vals[1:] // b == vals[:-1] // b)
    assert abs(same_block - 1 / w) < 0.02  # a neighbour is in the same block ~1/W of the time
    random_vals = seq_order(n, "random", epoch=1, seed=1).to_numpy(np.int64)
    assert not np.array_equal(vals, random_vals)


def test_degenerate_parameters() -> None:
    n = 37
    assert _rb(n, 1000, 1).num_blocks == 1  # N < B: one short block, one window
    assert sorted(_rb(n, 1000, 4).to_numpy(np.int64).tolist()) == list(range(n))
    one = _rb(n, 1, 1).to_numpy(np.int64)  # windows of one record: the block permutation itself
    assert np.array_equal(one, _rb(n, 1, 1).block_order().to_numpy(np.int64))
    whole = _rb(n, 5, 10**6)  # one window over everything
    assert whole.num_windows == 1 and whole.window_bounds(0) == (0, n)
    blocks_in_order = _rb(n, 4, 1).to_numpy(np.int64) // 4  # W = 1: each block read whole, in block order
    runs = blocks_in_order[np.r_[0, np.flatnonzero(np.diff(blocks_in_order)) + 1]]
    assert np.array_equal(runs, _rb(n, 4, 1).block_order().to_numpy(np.int64))
    assert len(seq_order(0, "random_block:4:2", epoch=1)) == 0
    huge = seq_order(2**63 - 1, "random_block:64:16", epoch=1, seed=3)
    v = huge.take(np.array([0, 1, 2**62, 2**63 - 2]))
    assert ((v >= 0) & (v < 2**63 - 1)).all() and len(set(v.tolist())) == 4


def test_golden_values() -> None:
    """Pinned values: the same (seed, epoch) gives the same order on every machine and version."""
    assert seq_order(1000, "random_block:16:4", epoch=1, seed=0).take(np.arange(8)).tolist() == [
        939,
        881,
        103,
        269,
        260,
        887,
        932,
        259,
    ]
    big = seq_order(10**12, "random_block:64:16", epoch=3, seed=7)
    assert big.take(np.array([0, 1, 2, 10**12 - 1])).tolist() == [
        461356879044,
        318605640426,
        427699766899,
        998713274883,
    ]


def test_deterministic_and_keyed_per_seed_and_epoch() -> None:
    n, spec = 5000, "random_block:16:4"
    a = seq_order(n, spec, epoch=2, seed=9)
    assert a == seq_order(n, spec, epoch=2, seed=9)
    assert pickle.loads(pickle.dumps(a)) == a and len(pickle.dumps(a)) < 1000
    others = [
        seq_order(n, spec, epoch=3, seed=9),
        seq_order(n, spec, epoch=2, seed=10),
        seq_order(n, spec, epoch=1, seed=10),
        seq_order(n, "random_block:16:5", epoch=2, seed=9),
    ]
    for o in others:
        assert o != a
    # block orders of different epochs differ too (not only the shuffles inside windows)
    blocks = [_rb(n, 16, 4, epoch=e, seed=9).block_order().to_numpy(np.int64) for e in (1, 2)]
    assert not np.array_equal(*blocks)
    # :nth keeps one order for nth full epochs; sub-epochs of one full epoch share it
    assert seq_order(n, "random_block:16:4:2", epoch=1) == seq_order(n, "random_block:16:4:2", epoch=2)
    assert seq_order(n, "random_block:16:4:2", epoch=2) != seq_order(n, "random_block:16:4:2", epoch=3)
    parts = [seq_order(n, spec, epoch=e, partition_epoch=3).to_numpy(np.int64) for e in (4, 5, 6)]
    assert np.array_equal(np.concatenate(parts), seq_order(n, spec, epoch=2).to_numpy(np.int64))


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("random_block", r"expected 'random_block:B:W\[:nth\]'"),
        ("random_block:64", r"expected 'random_block:B:W\[:nth\]'"),
        ("random_block:1:2:3:4", r"expected 'random_block:B:W\[:nth\]'"),
        ("random_block:0:4", r"block size B must be >= 1, got 0"),
        ("random_block:4:0", r"window W \(blocks\) must be >= 1, got 0"),
        ("random_block:x:4", r"block size B must be a positive integer, got 'x'"),
        ("random_block:4:-2", r"window W \(blocks\) must be a positive integer, got '-2'"),
        ("random_block:4:2.5", r"window W \(blocks\) must be a positive integer"),
        ("random_block::4", r"block size B must be a positive integer, got ''"),
        ("random_block:4:4:0", r"nth must be >= 1"),
        (f"random_block:{2**63}:4", r"block size B must be <= 2\*\*63 - 1"),
        (f"random_block:4:{2**64}", r"window W must be <= 2\*\*63 - 1"),
    ],
)
def test_spec_errors(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        seq_order(100, spec, epoch=1)


def test_listed_and_needs_no_lengths() -> None:
    assert "random_block:B:W[:nth]" in ORDERINGS
    assert not ordering_needs_lengths("random_block:64:16")
    with pytest.raises(TypeError, match="block size B"):
        RandomBlockOrder(10, 0, 2.0, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window W"):
        RandomBlockOrder(10, 0, 2, 0)
    with pytest.raises(ValueError, match="window must be in"):
        RandomBlockOrder(10, 0, 2, 2).window_bounds(3)


@pytest.mark.parametrize("partition_epoch", [1, 2, 3])
@pytest.mark.parametrize("num_shards", [1, 2, 5])
def test_partitions_and_shards_are_contiguous_cuts(partition_epoch: int, num_shards: int) -> None:
    """RETURNN's rule, as for every ordering: the full order cut into P*S contiguous near-equal blocks."""
    n, b, w, spec = 10_007, 16, 8, "random_block:16:8"
    full = seq_order(n, spec, epoch=1, seed=4).to_numpy(np.int64)
    pieces = []
    for e in range(1, partition_epoch + 1):
        for s in range(num_shards):
            o = seq_order(
                n, spec, epoch=e, seed=4, partition_epoch=partition_epoch, shard_index=s, num_shards=num_shards
            )
            start, stop = block_bounds(n, (e - 1) * num_shards + s, partition_epoch * num_shards)
            assert len(o) == stop - start
            mine = o.to_numpy(np.int64)
            assert np.array_equal(mine, full[start:stop])
            # a share is a contiguous range: whole windows plus at most one cut window at each end
            touched = len(np.unique(mine // b))
            assert touched <= w * (math.ceil(len(o) / (w * b)) + 2)
            pieces.append(mine)
            # DataLoader workers: Order.shard cuts the share the same way
            parts = [o.shard(k, 3).to_numpy(np.int64) for k in range(3)]
            assert np.array_equal(np.concatenate(parts), mine)
    assert np.array_equal(np.concatenate(pieces), full)


def _store(path: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 6, n)
    x = np.repeat(np.arange(n), lens).astype(np.float32)[:, None]
    with seqstore.create(path, {"x": Field("float32", (None, 1))}, max_shard_records=50) as wr:
        wr.append_batch({"x": (x, lens)})
    return path


def test_store_dataset_and_epoch_sampler_end_to_end(tmp_path: Path) -> None:
    torch_sampler = pytest.importorskip("seqstore.torch")
    from seqstore.data import CombinedDataset, LengthsDataset, StoreDataset

    n, spec = 301, "random_block:8:4"
    ds = StoreDataset(_store(tmp_path / "s.seqstore", n), ordering=spec, seed=3, partition_epoch=2)
    for epoch in (1, 2, 3):
        expected = seq_order(n, spec, epoch=epoch, seed=3, partition_epoch=2)
        assert ds.epoch_order(epoch) == expected
    full = np.concatenate([ds.epoch_order(1).to_numpy(np.int64), ds.epoch_order(2).to_numpy(np.int64)])
    assert np.array_equal(np.sort(full), np.arange(n))

    world = 2
    samplers = [torch_sampler.EpochSampler(ds, rank=r, world_size=world, chunk_size=16) for r in range(world)]
    ranks = [list(s) for s in samplers]
    order = ds.epoch_order(1).to_numpy(np.int64)
    flat = [ranks[j % world][j // world] for j in range(sum(map(len, ranks)))]
    assert flat[: len(order)] == order.tolist()  # ranks interleave the global order
    for i in flat[:40]:  # records come back from the store
        assert float(ds.get(i)["x"][0, 0]) == i

    # exact resume, into another world size
    k = 17
    state = samplers[0].state_dict(consumed=k)
    rest = []
    for r in range(3):
        s = torch_sampler.EpochSampler(ds, rank=r, world_size=3, drop_last=True)
        s.load_state_dict(state)
        rest.append(list(s))
    merged = [rest[j % 3][j // 3] for j in range(sum(map(len, rest)))]
    assert merged == order[k * world : k * world + len(merged)].tolist()

    # CombinedDataset: the ordering over union positions, composed with the sampling windows
    kids = {"a": LengthsDataset(np.arange(1, 31), ordering="random", seed=1), "b": LengthsDataset(np.arange(1, 12))}
    comb = CombinedDataset(kids, sampling_sizes={"a": 20, "b": 11}, ordering=spec, seed=5)
    eo = comb.epoch_order(1).to_numpy(np.int64)
    assert len(eo) == 31 and len(set(eo.tolist())) == 31


def test_fixed_position_uniform_over_keys_chi_square() -> None:
    """Over seeds, the record at a fixed position is uniform over [0, N), and so is its offset in its block."""
    n, b, w, trials = 1000, 10, 4, 3000
    for pos in (0, 1, 517, n - 1):
        vals = np.array([seq_order(n, f"random_block:{b}:{w}", epoch=1, seed=s)[pos] for s in range(trials)])
        for counts in (np.bincount(vals * 10 // n, minlength=10), np.bincount(vals % b, minlength=b)):
            e = trials / 10
            chi2 = float(((counts - e) ** 2 / e).sum())
            assert chi2 < 40, (pos, chi2)  # 9 dof: p ~ 1e-5


@pytest.mark.parametrize(
    ("n", "b", "w"),
    [
        (10, 2**63 - 1, 1),
        (10, 2**63 - 1, 2**63 - 1),
        (2**63 - 1, 2**63 - 1, 2**63 - 1),
        (2**63 - 1, 2**62, 2),
        (2**63 - 1, 3, 2**63 - 1),
        (2**63 - 1, 2**40 + 3, 5),
        (1000, 7, 2**63 - 1),
    ],
)
def test_extreme_parameters(n: int, b: int, w: int) -> None:
    o = seq_order(n, f"random_block:{b}:{w}", epoch=1, seed=2)
    k = min(n, 1000)
    for first in (0, n - k):
        v = o.take(np.arange(first, first + k))
        assert ((v >= 0) & (v < n)).all() and len(np.unique(v)) == k
        assert np.array_equal(np.concatenate(list(o[first : first + k].iter_chunks(77))), v)
    if n <= 1000:
        assert sorted(o.to_numpy(np.int64).tolist()) == list(range(n))


def test_returnn_dataset_seq_ordering(tmp_path: Path) -> None:
    pytest.importorskip("returnn")
    from seqstore.interop.returnn import StoreDataset as ReturnnStoreDataset

    n, spec = 301, "random_block:8:4"
    ds = ReturnnStoreDataset(
        path=str(_store(tmp_path / "r.seqstore", n)), seq_ordering=spec, partition_epoch=2, random_seed_offset=5
    )
    ds.initialize()
    ds.set_sharding(num_shards=3, shard_index=1)
    ds.init_seq_order(epoch=3)
    want = seq_order(n, spec, epoch=3, seed=5, partition_epoch=2, shard_index=1, num_shards=3)
    assert list(ds.get_current_seq_order()) == list(want)


@pytest.mark.parametrize(("n", "block", "window"), [(1, 1, 1), (7, 3, 2), (1000, 256, 1), (10_001, 64, 4),
                                                    (123_457, 1000, 16), (2**40 + 3, 4096, 8)])
def test_numpy_twins_equal_the_kernels(n: int, block: int, window: int) -> None:
    """``random_block_numpy`` and ``perm_inverse_numpy`` (a first batch computed before numba has started)
    give the kernels' values, the short last block included."""
    from seqstore.order import _kernels as K

    order = RandomBlockOrder(n, 0x0F1E_2D3C_4B5A_6978, block, window)
    rng = np.random.default_rng(n % 101)
    pos = rng.integers(0, n, size=4_000, dtype=np.int64)
    pos[:2] = [0, n - 1]
    args = [np.uint64(v) for v in (n, block, window, order.num_blocks, order._short_slot)]
    want = np.empty(len(pos), dtype=np.int64)
    K.random_block(pos, np.uint64(0), False, *args, order._ba, order._bb, order._bkeys, order._wkey, want)
    got = K.random_block_numpy(pos, *args, order._ba, order._bb, order._bkeys, order._wkey, most=len(pos))
    assert got is not None and got.dtype == np.int64 and np.array_equal(got, want)
    if order.num_windows > 1:  # positions over more windows than allowed: no twin
        assert K.random_block_numpy(pos, *args, order._ba, order._bb, order._bkeys, order._wkey, most=1) is None
    blocks = rng.integers(0, order.num_blocks, size=500, dtype=np.int64)
    want = np.empty(len(blocks), dtype=np.int64)
    nb = np.uint64(order.num_blocks)
    K.perm_inverse(blocks, nb, order._ba, order._bb, order._bkeys, want)
    assert np.array_equal(K.perm_inverse_numpy(blocks, nb, order._ba, order._bb, order._bkeys), want)
