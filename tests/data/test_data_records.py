"""iter_records: record by record from gathered blocks, views equal to ``get``."""

from __future__ import annotations

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.data import ConcatDataset, StoreDataset, iter_records


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> StoreDataset:
    p = tmp_path_factory.mktemp("recs") / "r.seqstore"
    rng = np.random.default_rng(1)
    n = 301
    lens = rng.integers(0, 9, n)
    with seqstore.create(p, {"x": Field("float32", (None, 2)), "y": Field("int16"), "m": Field("uint8", (3,))},
                         max_shard_records=70) as w:
        w.append_batch({"x": (rng.standard_normal((int(lens.sum()), 2), dtype=np.float32), lens),
                        "y": np.arange(n, dtype=np.int16), "m": rng.integers(0, 255, (n, 3), dtype=np.uint8)})
    return StoreDataset(p, ordering="random", seed=3)


def _same(rec: dict, want: dict) -> None:
    assert list(rec) == list(want)
    for k in want:
        np.testing.assert_array_equal(rec[k], want[k])
        assert rec[k].shape == np.asarray(want[k]).shape and rec[k].dtype == np.asarray(want[k]).dtype


@pytest.mark.parametrize("block,prefetch", [(128, None), (1, 0), (7, 3), (1000, None)])
def test_records_of_an_order(ds: StoreDataset, block: int, prefetch: int | None) -> None:
    order = ds.epoch_order(1)
    recs = list(iter_records(ds, order, block=block, prefetch=prefetch, with_index=True))
    np.testing.assert_array_equal([int(r.pop("index")) for r in recs], order.to_numpy())
    for r, i in zip(recs, order.to_numpy()):
        _same(r, ds.get(int(i)))


def test_arrays_lists_and_other_datasets(ds: StoreDataset) -> None:
    idx = [5, 0, 300, 5, 17]
    for given in (idx, np.array(idx), iter(idx)):
        recs = list(iter_records(ds, given, block=2))
        assert [int(r["y"]) for r in recs] == idx
    both = ConcatDataset([ds, ds])
    recs = list(iter_records(both, [0, 301, 600], block=2))
    for r, i in zip(recs, [0, 0, 299]):
        _same(r, ds.get(i))
    assert list(iter_records(ds, [])) == []
    with pytest.raises(ValueError, match="block"):
        next(iter_records(ds, idx, block=0))


def test_float_indices_are_refused_not_truncated(ds: StoreDataset) -> None:
    """Indices of floats are a TypeError, as in ``get_batch`` (they were cast to int64: 1.7 read record 1)."""
    for given in (np.array([0.0, 1.7]), [1.7], iter([2.5])):
        with pytest.raises(TypeError, match="integers"):
            next(iter_records(ds, given))
    assert [int(r["y"]) for r in iter_records(ds, np.array([2, 1], dtype=np.uint8))] == [2, 1]


def test_views_share_their_block(ds: StoreDataset) -> None:
    a, b = iter_records(ds, [3, 4], block=2)
    assert a["x"].base is not None and a["x"].base is b["x"].base  # rows of one gathered array
    assert a["m"].base is b["m"].base
    a["m"][:] = 0  # writable: the caller's
    np.testing.assert_array_equal(b["m"], ds.get(4)["m"])
