"""IterableSeqDataset over ranks x DataLoader workers: coverage, equal counts, elastic resume, real workers."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_testlib import as_worker, make_store, simulate  # noqa: E402

from seqstore.data import StoreDataset  # noqa: E402
from seqstore.torch import IterableSeqDataset, LengthBatching, SeqDataLoader, StateError  # noqa: E402

N = 157

MODES: dict[str, dict[str, Any]] = {
    "records": dict(group=4),
    "fixed": dict(batch=5),
    "greedy": dict(batch=LengthBatching(max_frames=36, max_seqs=8)),
    "bucket": dict(batch=LengthBatching(max_frames=36, buckets=3, buffer_size=30)),
}


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> StoreDataset:
    p = tmp_path_factory.mktemp("it") / "c.seqstore"
    make_store(p, N, seed=4, shard_records=50)
    return StoreDataset(p, ordering="laplace:.20", seed=11)


def _maker(ds: StoreDataset, mode: str, drop_last: bool = False, epoch: int = 1) -> Any:
    def make(rank: int, world: int) -> IterableSeqDataset:
        return IterableSeqDataset(ds, rank=rank, world_size=world, drop_last=drop_last, epoch=epoch, **MODES[mode])
    return make


def _interleave(ranks: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Global item order: rank r's m-th item is global item m*W + r."""
    w = len(ranks)
    return [ranks[j % w][j // w] for j in range(sum(map(len, ranks)))]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("drop_last", [False, True])
def test_two_ranks_two_workers_cover_each_index_once(ds: StoreDataset, mode: str, drop_last: bool) -> None:
    ranks = simulate(_maker(ds, mode, drop_last), 2, 2)
    assert len(ranks[0]) == len(ranks[1])  # same number of items on every rank
    items = _interleave(ranks)
    flat = np.concatenate(items)
    order = ds.epoch_order(1).to_numpy()
    if mode in ("records", "fixed"):
        size = MODES[mode].get("group", MODES[mode].get("batch"))
        assert all(len(i) == size for i in items)
        if drop_last:
            np.testing.assert_array_equal(flat, order[: len(flat)])
            assert len(order) - len(flat) < 2 * size
        else:
            np.testing.assert_array_equal(flat[:N], order)  # the global order, a prefix per step
            np.testing.assert_array_equal(flat[N:], order[: len(flat) - N])  # padding from the start
    elif drop_last:
        assert len(np.unique(flat)) == len(flat)
    else:
        assert set(flat.tolist()) == set(range(N))
    again = simulate(_maker(ds, mode, drop_last), 2, 2)  # deterministic: the same items on every run
    assert [len(x) for x in again] == [len(x) for x in ranks]
    assert all(np.array_equal(a, b) for x, y in zip(ranks, again) for a, b in zip(x, y))


def _state_after(ds: StoreDataset, mode: str, world: int, workers: int, k: int) -> tuple[dict[str, Any], np.ndarray]:
    """Ranks consume k items each; return the (common) state and what was consumed."""
    ranks = simulate(_maker(ds, mode, epoch=2), world, workers)
    consumed = np.concatenate([np.concatenate(r[:k]) for r in ranks])
    states = []
    for r in range(world):
        main = _maker(ds, mode, epoch=2)(r, world)  # the main-process copy never iterates
        states.append(main.state_dict(consumed=k, num_workers=workers))
    assert all(s == states[0] for s in states)
    return states[0], consumed


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("before,after", [((2, 2), (1, 1)), ((1, 1), (3, 2)), ((2, 2), (3, 1))])
def test_elastic_resume_exact_remaining(ds: StoreDataset, mode: str, before: tuple[int, int],
                                        after: tuple[int, int]) -> None:
    k = 3
    state, consumed = _state_after(ds, mode, *before, k)
    rest = simulate(_maker(ds, mode), *after, state=state)
    assert len({len(r) for r in rest}) == 1
    order = ds.epoch_order(2).to_numpy()
    items = _interleave(rest)
    if mode in ("records", "fixed"):
        size = MODES[mode].get("group", MODES[mode].get("batch"))
        g = k * before[0] * size
        np.testing.assert_array_equal(np.sort(consumed), np.sort(order[:g]))
        flat = np.concatenate(items)
        np.testing.assert_array_equal(flat[: N - g], order[g:])
    else:
        # compare with one uninterrupted rank: the resumed batches continue it
        full = simulate(_maker(ds, mode, epoch=2), 1, 1)[0]
        done = k * before[0]
        assert sum(len(b) for b in full[:done]) == len(consumed)
        np.testing.assert_array_equal(np.sort(np.concatenate(full[:done])), np.sort(consumed))
        real = full[done:]
        for a, b in zip(items[: len(real)], real):
            np.testing.assert_array_equal(a, b)
        seen = np.concatenate([consumed, *items[: len(real)]])
        np.testing.assert_array_equal(np.sort(seen), np.arange(N))


def test_state_errors(ds: StoreDataset, tmp_path: Path) -> None:
    it = IterableSeqDataset(ds, batch=LengthBatching(max_frames=30, buckets=2), rank=0, world_size=1)
    st = it.state_dict(consumed=2)
    with pytest.raises(StateError, match="batching"):
        IterableSeqDataset(ds, batch=LengthBatching(max_frames=31, buckets=2), rank=0, world_size=1).load_state_dict(st)
    with pytest.raises(StateError, match="batches"):
        IterableSeqDataset(ds, batch=4, rank=0, world_size=1).load_state_dict(st)
    other = StoreDataset(ds.store.root, ordering="random", seed=11)
    with pytest.raises(StateError, match="ordering"):
        IterableSeqDataset(other, batch=4, rank=0, world_size=1).load_state_dict(it.state_dict())
    with pytest.raises(ValueError, match="batch must be"):
        IterableSeqDataset(ds, batch=0)
    with pytest.raises(ValueError, match="group"):
        IterableSeqDataset(ds, batch=4, group=2)


def test_pickles_small(ds: StoreDataset) -> None:
    it = IterableSeqDataset(ds, batch=LengthBatching(max_frames=30))
    list(it.iter_indices())
    assert len(pickle.dumps(it)) < 4096


def test_real_workers_two_ranks_resume_one_rank(ds: StoreDataset) -> None:
    """Real DataLoader workers (2 per simulated rank; ``procs=0``: the DataLoader's, not seqstore's) with
    prefetching: break mid-epoch, checkpoint from the main process (SeqDataLoader counts), resume on one
    rank: exactly the remaining records."""
    spec = LengthBatching(max_frames=36)
    k = 4
    states, consumed = [], []
    for r in range(2):
        it = IterableSeqDataset(ds, batch=spec, rank=r, world_size=2, with_index=True, masks=True)
        loader = SeqDataLoader(it, batch_size=None, num_workers=2, prefetch_factor=4, procs=0)
        for step, b in enumerate(loader):
            assert b["x"].shape[:2] == b["x_mask"].shape and b["x"].dtype == torch.float32
            np.testing.assert_array_equal(b["x"][:, 0, 0].numpy(), b["index"].numpy())  # x[t, 0] = index
            consumed.append(b["index"].numpy())
            if step + 1 == k:
                break
        states.append(loader.state_dict())
    assert states[0] == states[1] and states[0]["num_workers"] == 2
    it1 = IterableSeqDataset(ds, batch=spec, rank=0, world_size=1, with_index=True)
    loader1 = SeqDataLoader(it1, batch_size=None, num_workers=2, procs=0)
    loader1.load_state_dict(states[0])
    rest = [b["index"].numpy() for b in loader1]
    allseen = np.concatenate(consumed + rest)
    np.testing.assert_array_equal(np.sort(allseen), np.arange(N))
    assert loader1.state_dict()["position"] == N  # the epoch is done
    assert sum(len(b["index"]) for b in loader1) == N  # a new pass walks the whole epoch


def test_loader_checks_options(ds: StoreDataset) -> None:
    it = IterableSeqDataset(ds, batch=4)
    with pytest.raises(ValueError, match="batch_size=None"):
        SeqDataLoader(it, batch_size=2)
    with pytest.raises(ValueError, match="persistent_workers"):
        SeqDataLoader(it, batch_size=None, num_workers=1, persistent_workers=True, procs=0)
    with pytest.raises(ValueError, match="in_order"):
        SeqDataLoader(it, batch_size=None, in_order=False)
    rec = IterableSeqDataset(ds)
    SeqDataLoader(rec, batch_size=6)
    assert rec.group == 6 and len(rec) == -(-N // 6) * 6


def test_several_dataloader_workers_read_through_the_node_cache(ds: StoreDataset,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that reads epochs once would have each of several DataLoader workers fetch every block of
    a window its batches draw on: their ``iter_batches`` asks for the node cache instead (one worker, or
    none, reads as the store does)."""
    asked: list[Any] = []
    real = StoreDataset.iter_batches

    def spy(self: StoreDataset, batches: Any, **kw: Any) -> Any:
        asked.append(kw.get("cached"))
        return real(self, batches, **kw)

    monkeypatch.setattr(StoreDataset, "iter_batches", spy)
    it = IterableSeqDataset(ds, batch=4)
    n = len(list(it))
    for workers in (1, 2):
        with as_worker(0, workers):
            assert len(list(pickle.loads(pickle.dumps(it)))) == (n if workers == 1 else (n + 1) // 2)
    assert asked == [None, None, True]


@pytest.mark.parametrize("batch", [None, 2], ids=["records", "batches"])
def test_with_index_refuses_a_field_named_index(tmp_path: Path, batch: int | None) -> None:
    """``with_index=True`` over a dataset with a field named ``index`` is a KeyError naming it (as for
    SeqDataset), not the field's values silently replaced by the record indices."""
    import seqstore
    from seqstore import Field

    path = tmp_path / "i.seqstore"
    with seqstore.create(path, {"x": Field("float32", (None,)), "index": Field("int32")}) as w:
        w.append_batch({"x": (np.arange(10, dtype=np.float32), np.full(5, 2)),
                        "index": np.arange(100, 105, dtype=np.int32)})
    with pytest.raises(KeyError, match="already has a field named 'index'"):  # when made, not in a worker
        IterableSeqDataset(path, batch=batch, with_index=True)
    assert int(next(iter(IterableSeqDataset(path, batch=batch)))["index"].reshape(-1)[0]) == 100
    IterableSeqDataset(path, batch=batch, fields=["x"], with_index=True)  # the field left out: no clash


def test_records_without_fields_are_empty_records(ds: StoreDataset) -> None:
    """``fields=[]`` without ``with_index``: records mode yields one empty record per record of the epoch
    (as SeqDataset gives for the same arguments, and as ``len`` says), not an empty epoch."""
    from seqstore.torch import SeqDataset

    it = IterableSeqDataset(ds, fields=[])
    records = list(it)
    assert records == [{}] * N == [SeqDataset(ds, fields=[])[i] for i in range(N)]
    assert len(records) == len(it)
    assert [sorted(r) for r in IterableSeqDataset(ds, fields=[], with_index=True)] == [["index"]] * N


def test_a_wrapped_seqdataset_keeps_its_fields_and_index(ds: StoreDataset) -> None:
    """IterableSeqDataset(SeqDataset(..., fields=[...], with_index=True)) returns the SeqDataset's fields and
    index (not every field of the dataset it wraps); fields= beyond them is a KeyError naming them."""
    from seqstore.torch import SeqDataset

    wide = StoreDataset(ds.store, fields=["x", "spk"])
    narrow = SeqDataset(wide, fields=["x"], with_index=True)
    rec = next(iter(IterableSeqDataset(narrow)))
    assert sorted(rec) == ["index", "x"]
    batch = next(iter(IterableSeqDataset(narrow, batch=4)))
    assert sorted(batch) == ["index", "x", "x_lengths"]
    with pytest.raises(KeyError, match="spk"):
        IterableSeqDataset(narrow, fields=["spk"])


def test_state_dict_num_workers_is_a_plain_count(ds: StoreDataset) -> None:
    """``state_dict(consumed=k, num_workers=np.int64(2))`` (a plain DataLoader's worker count from a config
    array) kept the NumPy scalar in the state: ``json.dumps`` failed and ``torch.load`` (weights_only, the
    default) refused the checkpoint; -1 or "a" were recorded as they came. The count is a plain int now, and
    anything else a ValueError naming num_workers."""
    import io
    import json

    it = IterableSeqDataset(ds, batch=5, rank=0, world_size=1)
    state = it.state_dict(consumed=np.int64(2), num_workers=np.int64(2))
    assert type(state["num_workers"]) is int and state["num_workers"] == 2
    assert json.loads(json.dumps(state)) == state
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    assert torch.load(buf) == state
    for bad in (-1, "a", 1.5, True):
        with pytest.raises(ValueError, match="IterableSeqDataset: num_workers"):
            it.state_dict(consumed=1, num_workers=bad)


def test_persistent_workers_follow_set_epoch(ds: StoreDataset) -> None:
    """A plain DataLoader with ``persistent_workers=True``: ``set_epoch`` (and ``load_state_dict``) in the main
    process reach the workers at their next iteration; the same epoch iterated again (an evaluation loop)
    gives that epoch again."""
    from torch.utils.data import DataLoader

    def walk(loader: Any) -> list[int]:
        return sorted(torch.cat([b["index"] for b in loader]).tolist())

    it = IterableSeqDataset(ds, batch=16, with_index=True, drop_last=True)
    want = {}
    for e in (1, 2):
        it.set_epoch(e)
        want[e] = [ds.epoch_order(e).to_numpy()[: len(it) * 16]]
    loader = DataLoader(it, batch_size=None, num_workers=2, persistent_workers=True)
    got = {}
    for e in (1, 2, 2):
        it.set_epoch(e)
        got.setdefault(e, []).append(walk(loader))
    assert got[1][0] == sorted(want[1][0].tolist())
    assert got[2][0] == got[2][1] == sorted(want[2][0].tolist())
    it.load_state_dict(it.state_dict(consumed=3))  # epoch 2 after 3 batches: the rest of it
    assert walk(loader) == sorted(want[2][0][48:].tolist())


def test_a_copy_follows_set_epoch_in_persistent_workers_too(ds: StoreDataset) -> None:
    """A copy of the dataset (``copy.deepcopy``, a pickle) has its own shared epoch: its ``set_epoch`` reaches the
    persistent workers of a DataLoader over the copy, and the original's does not change it."""
    import copy

    from torch.utils.data import DataLoader

    it = copy.deepcopy(IterableSeqDataset(ds, batch=16, with_index=True, drop_last=True))
    loader = DataLoader(it, batch_size=None, num_workers=2, persistent_workers=True)
    got = []
    for e in (1, 2):
        it.set_epoch(e)
        got.append(sorted(torch.cat([b["index"] for b in loader]).tolist()))
    assert got[1] == sorted(ds.epoch_order(2).to_numpy()[: len(it) * 16].tolist()) != got[0]
