"""CombinedDataset: RETURNN's sampling windows, sub-epoch unions, weights, lazy laplace, errors."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.data import (
    CombinedDataset,
    ConcatDataset,
    LengthsDataset,
    StoreDataset,
    batch_indices,
    weighted_sizes,
)
from seqstore.order import seq_order


def _children(rng: np.random.Generator, count: int, ordering: str = "random") -> dict[str, LengthsDataset]:
    kids = {}
    for k in range(count):
        n = int(rng.integers(1, 60))
        kids[f"c{k}"] = LengthsDataset(rng.integers(1, 100, n), ordering=ordering, seed=int(rng.integers(0, 99)))
    return kids


def _returnn_window(child: LengthsDataset, epoch: int, size: int) -> np.ndarray:
    """RETURNN's rule, literally: size consecutive sequences of the child's order for this epoch,
    starting at ((epoch-1) * size) % N, wrapping around."""
    order = child.epoch_order(epoch).to_numpy()
    n = len(order)
    start = ((epoch - 1) * size) % n
    return np.array([order[(start + j) % n] for j in range(size)], dtype=np.int64)


@pytest.mark.parametrize("trial", range(12))
def test_windows_follow_returnn_rule(trial: int) -> None:
    rng = np.random.default_rng(trial)
    kids = _children(rng, int(rng.integers(1, 5)))
    sizes = {name: int(rng.integers(0, 3 * d.num_seqs + 1)) for name, d in kids.items()}  # includes K > N
    ordering = ["default", "random", "laplace:.7", "sorted"][trial % 4]
    ds = CombinedDataset(kids, sampling_sizes=sizes, ordering=ordering, seed=trial)
    starts = np.concatenate([[0], np.cumsum([d.num_seqs for d in kids.values()])])
    for epoch in (1, 2, 5):
        expected = np.concatenate(
            [_returnn_window(d, epoch, sizes[name]) + starts[k] for k, (name, d) in enumerate(kids.items())]
        )
        got = ds.epoch_order(epoch).to_numpy()
        assert len(got) == sum(sizes.values())
        # the union of the epoch is exactly the windows' multiset ...
        assert Counter(got.tolist()) == Counter(expected.tolist())
        # ... and the order is the combined ordering over union positions composed with the windows
        lens = np.asarray(ds.lengths())[expected] if len(expected) else np.zeros(0, np.int64)
        union = seq_order(len(expected), ordering, epoch=epoch, seed=trial, lengths=lens).to_numpy()
        np.testing.assert_array_equal(got, expected[union])


def test_sub_epoch_unions_and_shards() -> None:
    rng = np.random.default_rng(7)
    kids = _children(rng, 3)
    sizes = {"c0": 50, "c1": 3, "c2": 0}
    for ordering in ("random", "laplace:.5"):
        ds = CombinedDataset(kids, sampling_sizes=sizes, ordering=ordering, seed=3, partition_epoch=3)
        for full in (1, 2):
            whole = CombinedDataset(kids, sampling_sizes=sizes, ordering=ordering, seed=3).epoch_order(full)
            parts = []
            for sub in range(3):
                epoch = (full - 1) * 3 + sub + 1
                shards = [ds.epoch_order(epoch, s, 2).to_numpy() for s in range(2)]
                parts.extend(shards)
            np.testing.assert_array_equal(np.concatenate(parts), whole.to_numpy())


def test_laplace_union_equals_materialised() -> None:
    rng = np.random.default_rng(1)
    kids = _children(rng, 4)
    ds = CombinedDataset(kids, sampling_sizes=[30, 70, 5, 1], ordering="laplace:.10", seed=9, child_epoch="pass")
    for epoch in (1, 3):
        w = ds.windows(epoch)
        union_vals = w.map(np.arange(w.size))
        lens = np.asarray(ds.lengths())[union_vals]
        ref = seq_order(w.size, "laplace:.10", epoch=epoch, seed=9, lengths=lens).to_numpy()
        np.testing.assert_array_equal(ds.epoch_order(epoch).to_numpy(), union_vals[ref])
        o = ds.epoch_order(epoch)
        pos = rng.integers(0, len(o), 40)
        np.testing.assert_array_equal(o.take(pos), union_vals[ref][pos])


def test_pass_mode_walks_child_orders_completely() -> None:
    child = LengthsDataset(np.arange(1, 11), ordering="random", seed=4)
    ds = CombinedDataset({"a": child}, sampling_sizes={"a": 4}, child_epoch="pass")
    stream = np.concatenate([ds.epoch_order(e).to_numpy() for e in range(1, 6)])  # 20 = two passes of 10
    np.testing.assert_array_equal(stream[:10], child.epoch_order(1).to_numpy())
    np.testing.assert_array_equal(stream[10:], child.epoch_order(2).to_numpy())


@pytest.mark.parametrize("trial", range(30))
def test_weights_sum_exactly(trial: int) -> None:
    rng = np.random.default_rng(trial)
    k = int(rng.integers(1, 8))
    weights = rng.random(k) * (rng.random(k) > 0.2)
    if weights.sum() == 0:
        weights[0] = 1.0
    size = int(rng.integers(0, 10**6))
    sizes = weighted_sizes(list(weights), size)
    assert sizes.sum() == size
    quota = weights / weights.sum() * size
    assert np.all(np.abs(sizes - quota) < 1.0 + 1e-9)
    assert np.all(sizes[weights == 0] == 0)


def test_weights_tie_break_and_dataset() -> None:
    np.testing.assert_array_equal(weighted_sizes([1, 1, 1], 4), [2, 1, 1])
    np.testing.assert_array_equal(weighted_sizes([1, 1, 1], 5), [2, 2, 1])
    kids = {"a": LengthsDataset(np.ones(10, np.int64)), "b": LengthsDataset(np.ones(30, np.int64))}
    ds = CombinedDataset(kids, weights={"a": 1, "b": 3}, epoch_size=9)
    assert ds.sampling_sizes == {"a": 2, "b": 7} and ds.epoch_size == len(ds.epoch_order(1)) == 9
    assert CombinedDataset(kids, epoch_size=8).sampling_sizes == {"a": 2, "b": 6}


def test_errors_and_empty() -> None:
    kids = {"a": LengthsDataset(np.ones(5, np.int64)), "e": LengthsDataset(np.zeros(0, np.int64))}
    with pytest.raises(ValueError, match="empty dataset.*'e'"):
        CombinedDataset(kids, sampling_sizes={"a": 1, "e": 2})
    ds = CombinedDataset(kids, sampling_sizes={"a": 0, "e": 0}, ordering="laplace:.100")
    assert len(ds.epoch_order(1)) == 0 and ds.epoch_order(1).to_numpy().size == 0
    ds = CombinedDataset(kids, sampling_sizes={"a": 3, "e": 0}, ordering="random")
    assert sorted(ds.epoch_order(2).to_numpy().tolist()) == [0, 3, 4]  # window 3, 4, 0 of epoch 2
    with pytest.raises(ValueError, match="unknown dataset"):
        CombinedDataset(kids, sampling_sizes={"a": 1, "x": 1})
    with pytest.raises(ValueError, match=">= 0"):
        CombinedDataset(kids, sampling_sizes={"a": -1, "e": 0})
    with pytest.raises(ValueError, match="not all be zero"):
        CombinedDataset(kids, weights=[0, 0], epoch_size=3)
    with pytest.raises(ValueError, match="either sampling_sizes or weights"):
        CombinedDataset(kids, sampling_sizes=[1, 0], weights=[1, 1], epoch_size=2)
    with pytest.raises(TypeError, match="filter the children"):
        CombinedDataset(kids).filter(max_length=3)
    filtered = CombinedDataset({"a": kids["a"].filter(max_length=3)}, sampling_sizes=[2])
    assert len(filtered.epoch_order(1)) == 2
    with pytest.raises(ValueError, match="partition_epoch"):
        CombinedDataset({"a": LengthsDataset(np.ones(3, np.int64), partition_epoch=2)})


def test_locate_get_batch_and_pickle(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import seqstore
    from seqstore import Field

    stores = []
    for k, n in enumerate((7, 0, 12)):
        p = tmp_path / f"s{k}.seqstore"
        with seqstore.create(p, {"x": Field("float32", (None, 2)), "y": Field("int32")}) as w:
            if n:
                lens = np.arange(n) % 4 + 1
                w.append_batch({"x": (np.full((lens.sum(), 2), k, np.float32), lens), "y": np.arange(n) + 100 * k})
        stores.append(StoreDataset(p, ordering="random", seed=k))
    ds = CombinedDataset({"a": stores[0], "b": stores[1], "c": stores[2]}, sampling_sizes=[5, 0, 20],
                         ordering="laplace:.4", seed=1)
    assert ds.locate(0) == ("a", 0) and ds.locate(7) == ("c", 0) and ds.locate(18) == ("c", 11)
    child, local = ds.locate_many([18, 3, 7])
    assert child.tolist() == [2, 0, 2] and local.tolist() == [11, 3, 0]
    order = ds.epoch_order(2)
    idx = order.to_numpy()
    batch = ds.get_batch(idx[:9])
    for j, i in enumerate(idx[:9].tolist()):
        rec = ds.get(i)
        assert batch["y"][j] == rec["y"]
    values, lengths = batch["x"]
    assert lengths.tolist() == np.asarray(ds.lengths())[idx[:9]].tolist()
    off = np.concatenate([[0], np.cumsum(lengths)])
    for j, i in enumerate(idx[:9].tolist()):
        np.testing.assert_array_equal(values[off[j]:off[j + 1]], ds.get(i)["x"])
    padded = ds.get_batch(idx[:9], pad=True)["x"][0]
    assert padded.shape == (9, lengths.max(), 2)
    blob = pickle.dumps(order)
    assert len(blob) < 4000
    np.testing.assert_array_equal(pickle.loads(blob).to_numpy(), idx)
    again = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(again.epoch_order(2).to_numpy(), idx)
    batches = list(batch_indices(order, ds.lengths(), max_frames=8))
    np.testing.assert_array_equal(np.concatenate(batches), idx)


def test_concat_dataset() -> None:
    a = LengthsDataset(np.array([3, 1, 2]))
    b = LengthsDataset(np.array([9, 8]))
    c = ConcatDataset([a, b], ordering="sorted")
    assert c.num_seqs == 5 and c.locate(3) == (1, 0)
    np.testing.assert_array_equal(np.asarray(c.lengths()), [3, 1, 2, 9, 8])
    np.testing.assert_array_equal(c.epoch_order(1).to_numpy(), [1, 2, 0, 4, 3])
    np.testing.assert_array_equal(c.get_batch([4, 0, 3])["length"], [8, 3, 9])


def test_get_batch_of_no_indices_has_the_fields() -> None:
    """An empty index array gives every field with no rows, as a single child's get_batch does."""
    a = LengthsDataset(np.array([3, 1, 2]))
    b = LengthsDataset(np.array([9, 8]))
    empty = np.empty(0, dtype=np.int64)
    for ds in (ConcatDataset([a, b]), CombinedDataset({"a": a, "b": b}, sampling_sizes=[2, 0])):
        for pad in (False, True):
            got = ds.get_batch(empty, pad=pad)
            assert list(got) == ["length"] and got["length"].shape == (0,)


def test_order_identity_tells_explicit_orders_apart() -> None:
    """A resume state records the children's orders: two explicit orders that print alike (numpy
    elides the middle of a long array) are told apart, so a state of one is refused by the other."""
    from seqstore.data import LengthsDataset

    p1 = np.arange(2000)
    p2 = p1.copy()
    p2[[500, 1500]] = p2[[1500, 500]]

    def make(perm: np.ndarray) -> CombinedDataset:
        return CombinedDataset({"a": LengthsDataset(np.arange(1, 2001), ordering=perm),
                                "b": LengthsDataset(np.arange(1, 31), ordering="random", seed=2)})

    assert make(p1).order_identity() != make(p2).order_identity()
    assert make(p1).order_identity() == make(p1.copy()).order_identity()
    pytest.importorskip("torch")
    from seqstore.torch import EpochSampler, StateError

    s = EpochSampler(make(p1), rank=0, world_size=1)
    it = iter(s)
    for _ in range(10):
        next(it)
    with pytest.raises(StateError, match="differs: \\['children'\\]"):
        EpochSampler(make(p2), rank=0, world_size=1).load_state_dict(s.state_dict())


def test_a_field_bfloat16_in_one_child_and_not_in_another_is_refused(tmp_path: Path) -> None:
    """A field stored as bfloat16 in one store and as float32 in another: the first gives uint16 bits, and
    a concatenation or mixture merged them with the other's numbers into one float32 array (0.5 read as
    16128.0) and called the whole field bfloat16. Both are refused, naming the field and the children."""
    for name, dtype in (("f32", "float32"), ("bf16", "bfloat16")):
        with seqstore.create(tmp_path / name, {"x": Field(dtype, (None,))}) as w:
            for i in range(4):
                w.append({"x": np.arange(i + 1, dtype=np.float32) + 0.5})
    f32, bf16 = StoreDataset(tmp_path / "f32"), StoreDataset(tmp_path / "bf16")
    with pytest.raises(ValueError, match=r"ConcatDataset: field 'x' is bfloat16 .* in \['1'\] but not in \['0'\]"):
        ConcatDataset([f32, bf16])
    with pytest.raises(ValueError, match=r"CombinedDataset: field 'x' is bfloat16 .* in \['b'\] but not in \['a'\]"):
        CombinedDataset({"a": f32, "b": bf16})
    # read as float32, the bfloat16 store merges with the other
    as_f32 = StoreDataset(seqstore.open(tmp_path / "bf16", bfloat16="float32"))
    both = ConcatDataset([f32, as_f32])
    assert both.bfloat16_fields() == frozenset()
    values, lengths = both.get_batch(np.arange(8))["x"]
    assert lengths.tolist() == [1, 2, 3, 4] * 2
    np.testing.assert_array_equal(values[:10], values[10:])
    assert ConcatDataset([bf16, bf16]).bfloat16_fields() == {"x"}


def test_pass_mode_keeps_a_bounded_number_of_child_orders() -> None:
    """With ``child_epoch="pass"`` an epoch much larger than a child walks the child pass after pass; the
    window map kept every pass's order (memory growing with the epoch size); it keeps a bounded number
    now, and the positions are those of each pass's order."""
    small = LengthsDataset(np.arange(1, 4), ordering="random", seed=3)
    big = LengthsDataset(np.arange(1, 11), ordering="random", seed=4)
    ds = CombinedDataset({"s": small, "b": big}, sampling_sizes={"s": 600, "b": 10}, child_epoch="pass")
    order = ds.epoch_order(2)
    got = order.to_numpy()
    windows = order.windows
    assert len(windows._orders) <= 64  # 200 passes of "s" were touched
    sel = got < 3
    w = np.arange(600) + 600  # epoch 2: window positions 600..1199 of "s", i.e. passes 200..399
    want = np.concatenate([small.epoch_order(int(g) // 3 + 1).to_numpy()[[int(g) % 3]] for g in w])
    assert sorted(got[sel].tolist()) == sorted(want.tolist())
    np.testing.assert_array_equal(windows.map(np.arange(600)), want)


@pytest.mark.timeout(45)  # it took minutes: each pass touched scanned every position of the epoch
def test_pass_mode_epoch_of_many_passes_maps_in_one_sort() -> None:
    """An epoch that walks a child thousands of times maps each position to its pass's order (one sort
    of the positions by pass, not one scan of them all per pass)."""
    child = LengthsDataset(np.arange(1, 151), ordering="random", seed=5)
    ds = CombinedDataset({"c": child}, sampling_sizes={"c": 3_000_000}, child_epoch="pass")
    got = ds.windows(1).map(np.arange(3_000_000 - 1, -1, -1, dtype=np.int64))
    for p in (0, 1, 9999, 19999):
        np.testing.assert_array_equal(got[::-1][p * 150 : (p + 1) * 150], child.epoch_order(p + 1).to_numpy())


def test_window_of_an_unknown_child_names_the_children() -> None:
    """window('x', 1) was a bare "'x' is not in list"; it names the name and the children now."""
    ones = np.ones(5, dtype=np.int64)
    comb = CombinedDataset({"a": LengthsDataset(ones), "b": LengthsDataset(ones[:3])})
    assert comb.window("b", 2) == (3, 3)
    with pytest.raises(ValueError, match=r"CombinedDataset.window: unknown dataset 'x'; datasets are \['a', 'b'\]"):
        comb.window("x", 1)
