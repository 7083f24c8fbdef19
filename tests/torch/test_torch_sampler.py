"""EpochSampler and EpochBatchSampler: coverage, padding, determinism, elastic resume, bad states."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DistributedSampler  # noqa: E402
from torch_testlib import make_store  # noqa: E402

from seqstore.data import LengthsDataset, StoreDataset  # noqa: E402
from seqstore.torch import EpochBatchSampler, EpochSampler, LengthBatching, StateError  # noqa: E402

N = 203


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("s") / "c.seqstore"
    make_store(p, N)
    return p


def _ranks(make: Any, world: int) -> list[list[int]]:
    return [list(make(r, world)) for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_matches_distributed_sampler_in_default_order(store: Path, world: int, drop_last: bool) -> None:
    ds = StoreDataset(store)
    for r in range(world):
        mine = EpochSampler(ds, rank=r, world_size=world, drop_last=drop_last)
        theirs = DistributedSampler(range(N), num_replicas=world, rank=r, shuffle=False, drop_last=drop_last)
        assert list(mine) == list(theirs)
        assert len(mine) == len(theirs)


@pytest.mark.parametrize("world", [2, 3])
def test_random_order_coverage_and_determinism(store: Path, world: int) -> None:
    ds = StoreDataset(store, ordering="random", seed=5)

    def make(r: int, w: int, epoch: int = 1) -> EpochSampler:
        s = EpochSampler(ds, rank=r, world_size=w, chunk_size=16)
        s.set_epoch(epoch)
        return s

    ranks = _ranks(make, world)
    assert len({len(x) for x in ranks}) == 1
    order = ds.epoch_order(1).to_numpy()
    flat = np.array([ranks[j % world][j // world] for j in range(sum(map(len, ranks)))])
    np.testing.assert_array_equal(flat[:N], order)  # interleaved ranks read the global order
    np.testing.assert_array_equal(flat[N:], order[: len(flat) - N])  # padding repeats from the start
    assert ranks == _ranks(make, world)  # deterministic
    assert ranks != [list(make(r, world, 2)) for r in range(world)]  # a new epoch, a new order


@pytest.mark.parametrize("before,after", [(2, 1), (1, 3), (2, 3), (3, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_elastic_resume_gives_exactly_the_remaining(store: Path, before: int, after: int, drop_last: bool) -> None:
    ds = StoreDataset(store, ordering="laplace:.16", seed=2)
    order = ds.epoch_order(3).to_numpy()
    k = 17
    states = []
    consumed: list[int] = []
    for r in range(before):
        s = EpochSampler(ds, rank=r, world_size=before, epoch=3, drop_last=drop_last)
        it = iter(s)
        consumed += [next(it) for _ in range(k)]
        states.append(s.state_dict())
    assert all(st == states[0] for st in states[1:])  # every rank saves the same global position
    assert states[0]["position"] == k * before
    assert sorted(consumed) == sorted(order[: k * before].tolist())
    rest = []
    for r in range(after):
        s = EpochSampler(ds, rank=r, world_size=after, drop_last=drop_last)
        s.load_state_dict(states[0])
        s.set_epoch(3)  # the usual loop calls set_epoch: the loaded position is kept
        assert s.epoch == 3
        expected = len(s)  # this rank's count from the resume point
        got = list(s)
        assert len(got) == expected
        rest.append(got)
    assert len({len(x) for x in rest}) == 1
    remaining = order[k * before:]
    flat = np.array([rest[j % after][j // after] for j in range(sum(map(len, rest)))], dtype=np.int64)
    if drop_last:
        cut = len(remaining) // after * after
        np.testing.assert_array_equal(flat, remaining[:cut])
    else:
        np.testing.assert_array_equal(flat[: len(remaining)], remaining)
        np.testing.assert_array_equal(flat[len(remaining):], order[: len(flat) - len(remaining)])
    # after a finished pass, the same sampler walks the whole epoch again
    s = EpochSampler(ds, world_size=1, rank=0)
    s.load_state_dict(states[0])
    assert len(list(s)) == N - k * before and len(list(s)) == N


def _check_batches(ds: Any, ranks: list[list[list[int]]], world: int, drop_last: bool) -> None:
    assert len({len(x) for x in ranks}) == 1, [len(x) for x in ranks]  # DDP: same count on every rank
    flat = [ranks[j % world][j // world] for j in range(sum(map(len, ranks)))]
    idx = np.concatenate(flat) if flat else np.empty(0, np.int64)
    if drop_last:
        assert len(np.unique(idx)) == len(idx)
    else:
        assert set(idx.tolist()) == set(range(ds.num_seqs))


@pytest.mark.parametrize("buckets", [None, 3])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_equal_counts_and_coverage(store: Path, buckets: Any, world: int, drop_last: bool) -> None:
    ds = StoreDataset(store, ordering="random", seed=1)
    kw: dict[str, Any] = dict(max_frames=40, buckets=buckets, buffer_size=50, drop_last=drop_last)
    samplers = [EpochBatchSampler(ds, rank=r, world_size=world, **kw) for r in range(world)]
    ranks = [list(s) for s in samplers]
    assert [len(s) for s in samplers] == [len(x) for x in ranks]
    _check_batches(ds, ranks, world, drop_last)
    lens = np.asarray(ds.lengths())
    for b in (b for x in ranks for b in x):
        assert len(b) == 1 or lens[b].max() * len(b) <= 40
    again = [list(EpochBatchSampler(ds, rank=r, world_size=world, **kw)) for r in range(world)]
    assert again == ranks  # the same batches on every run


@pytest.mark.parametrize("buckets", [None, 4])
@pytest.mark.parametrize("before,after", [(2, 1), (1, 3)])
def test_batch_sampler_elastic_resume(store: Path, buckets: Any, before: int, after: int) -> None:
    ds = StoreDataset(store, ordering="random", seed=9)
    spec = LengthBatching(max_frames=30, max_seqs=6, buckets=buckets, buffer_size=40)
    k = 5
    per_rank: list[list[list[int]]] = []
    states = []
    for r in range(before):
        s = EpochBatchSampler(ds, batching=spec, rank=r, world_size=before, epoch=2)
        it = iter(s)
        per_rank.append([next(it) for _ in range(k)])
        states.append(s.state_dict())
    seen = [i for m in range(k) for r in range(before) for i in per_rank[r][m]]
    assert all(st == states[0] for st in states[1:])
    assert (states[0]["batches"] == 0) == (buckets is None)  # greedy resumes from a record position
    rest = []
    for r in range(after):
        s = EpochBatchSampler(ds, batching=spec, rank=r, world_size=after)
        s.load_state_dict(states[0])
        expected = len(s)
        rest.append(list(s))
        assert len(rest[-1]) == expected
    assert len({len(x) for x in rest}) == 1
    real = [rest[j % after][j // after] for j in range(sum(map(len, rest)))]
    # uninterrupted single-rank run of the same epoch: the resumed batches continue it exactly
    full = list(EpochBatchSampler(ds, batching=spec, rank=0, world_size=1, epoch=2))
    assert seen == [i for b in full[: k * before] for i in b]
    n_rest = len(full) - k * before
    assert real[:n_rest] == full[k * before:]
    assert sorted(seen + [i for b in real[:n_rest] for i in b]) == list(range(N))


def test_records_state_loads_into_batch_sampler(store: Path) -> None:
    ds = StoreDataset(store, ordering="random", seed=3)
    s = EpochSampler(ds, rank=0, world_size=2)
    it = iter(s)
    first = [next(it) for _ in range(10)]
    state = s.state_dict()
    b = EpochBatchSampler(ds, max_seqs=4, buckets=2, buffer_size=16, world_size=1, rank=0)
    b.load_state_dict(state)  # a record position: bucketing restarts on the remaining records
    rest = [i for x in b for i in x]
    order = ds.epoch_order(1).to_numpy()
    assert sorted(rest) == sorted(order[20:].tolist())
    assert first == order[:20:2].tolist()


def test_bad_states_raise(store: Path, tmp_path: Path) -> None:
    ds = StoreDataset(store, ordering="random", seed=3)
    s = EpochSampler(ds, rank=0, world_size=1)
    state = s.state_dict(consumed=7)
    other = tmp_path / "o.seqstore"
    make_store(other, N, seed=1)  # same size, other lengths: other offsets CRC
    with pytest.raises(StateError, match="different dataset"):
        EpochSampler(StoreDataset(other, ordering="random", seed=3), rank=0, world_size=1).load_state_dict(state)
    small = tmp_path / "s.seqstore"
    make_store(small, N - 1)
    with pytest.raises(StateError, match="different dataset"):
        EpochSampler(StoreDataset(small, ordering="random", seed=3), rank=0, world_size=1).load_state_dict(state)
    for kw in (dict(ordering="random", seed=4), dict(ordering="default", seed=3),
               dict(ordering="random", seed=3, partition_epoch=2)):
        with pytest.raises(StateError, match="ordering config"):
            EpochSampler(StoreDataset(store, **kw), rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(StateError, match="format"):
        s.load_state_dict({**state, "format": "other"})
    with pytest.raises(StateError, match="a state is a dict"):
        s.load_state_dict([1, 2])  # type: ignore[arg-type]
    with pytest.raises(StateError, match="position"):
        s.load_state_dict({**state, "position": -1})
    with pytest.raises(StateError, match="past the epoch"):
        s.load_state_dict({**state, "position": N + 1})
    with pytest.raises(StateError, match="positions"):
        s.load_state_dict({**state, "num_positions": N + 5, "position": 3})
    with pytest.raises(StateError, match="epoch"):
        s.load_state_dict({**state, "epoch": 0})
    bucket = EpochBatchSampler(ds, max_seqs=4, buckets=2, rank=0, world_size=1)
    bstate = bucket.state_dict(consumed=3)
    with pytest.raises(StateError, match="batches"):
        s.load_state_dict(bstate)
    with pytest.raises(StateError, match="batching"):
        EpochBatchSampler(ds, max_seqs=5, buckets=2, rank=0, world_size=1).load_state_dict(bstate)
    lengths_ds = LengthsDataset(np.ones(N, np.int64), ordering="random", seed=3)
    with pytest.raises(StateError, match="different dataset"):
        EpochSampler(lengths_ds, rank=0, world_size=1).load_state_dict(state)
    s.load_state_dict(state)  # the right one loads
    assert len(s) == N - 7


def test_argument_errors(store: Path) -> None:
    ds = StoreDataset(store)
    with pytest.raises(ValueError, match="1-based"):
        EpochSampler(ds, rank=0, world_size=1).set_epoch(0)
    with pytest.raises(ValueError, match="rank"):
        EpochSampler(ds, rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size"):
        EpochSampler(ds, rank=0, world_size=0)
    with pytest.raises(ValueError, match="consumed"):
        EpochSampler(ds, rank=0, world_size=1).state_dict(consumed=-1)
    with pytest.raises(TypeError, match="lacks"):
        EpochSampler(object())
    with pytest.raises(ValueError, match="max_frames or max_seqs"):
        EpochBatchSampler(ds)
    assert EpochSampler(str(store), rank=0, world_size=1).dataset.num_seqs == N  # a path works too


def test_the_first_chunk_is_small_and_the_chunks_are_the_order() -> None:
    """An epoch's first positions are computed on their own (the first batches do not wait for a whole
    chunk); the chunks together are still this rank's share of the order."""
    from seqstore.order import seq_order
    from seqstore.torch.sampler import _FIRST_CHUNK

    n = 6 * _FIRST_CHUNK + 77  # rank 1 of 2: positions 1, 3, ..., n (padded like DistributedSampler)
    ds = LengthsDataset(np.ones(n, np.int64), ordering="random_block:16:2", seed=4)
    s = EpochSampler(ds, rank=1, world_size=2, chunk_size=2 * _FIRST_CHUNK)
    chunks = list(s.iter_chunks())
    assert [len(c) for c in chunks] == [_FIRST_CHUNK, _FIRST_CHUNK, (n + 1) // 2 - 2 * _FIRST_CHUNK]
    want = seq_order(n, "random_block:16:2", epoch=1, seed=4).to_numpy()[np.arange(1, n + 1, 2) % n]
    assert np.array_equal(np.concatenate(chunks), want)
    assert list(EpochSampler(ds, rank=1, world_size=2, chunk_size=2 * _FIRST_CHUNK)) == want.tolist()


def test_combined_state_refused_when_children_orders_or_sizes_differ() -> None:
    from seqstore.data import CombinedDataset

    def make(child_seed: int = 1, weights: tuple[int, int] = (1, 1), child_epoch: str = "same") -> CombinedDataset:
        a = LengthsDataset(np.arange(1, 51), ordering="random", seed=child_seed)
        b = LengthsDataset(np.arange(1, 31), ordering="random", seed=2)
        return CombinedDataset({"a": a, "b": b}, weights={"a": weights[0], "b": weights[1]}, epoch_size=40,
                               ordering="random", seed=5, child_epoch=child_epoch)

    s = EpochSampler(make(), rank=0, world_size=1)
    it = iter(s)
    taken = [next(it) for _ in range(10)]
    state = s.state_dict()
    for kw, what in (({"child_seed": 9}, "children"), ({"weights": (3, 1)}, "sizes"),
                     ({"child_epoch": "pass"}, "child_epoch")):
        with pytest.raises(StateError, match=f"ordering config.*differs: \\['{what}'\\]"):
            EpochSampler(make(**kw), rank=0, world_size=1).load_state_dict(state)  # type: ignore[arg-type]
    same = EpochSampler(make(), rank=0, world_size=1)
    same.load_state_dict(state)
    assert taken + list(same) == list(EpochSampler(make(), rank=0, world_size=1))
    old = {**state, "ordering": {k: state["ordering"][k] for k in ("ordering", "seed", "partition_epoch")}}
    EpochSampler(make(), rank=0, world_size=1).load_state_dict(old)  # a state saved before these keys loads


def test_length_batching_of_numpy_integers_saves_plain_states(store: Path) -> None:
    """``LengthBatching`` accepts NumPy integers but kept them: a state carried NumPy scalars (not JSON, and
    refused by ``torch.load``'s default ``weights_only``), and ``buckets=np.int64(3)`` made ``config()`` (every
    ``state_dict``) a TypeError. The options are plain ints now, the same batches as with Python ints."""
    import io
    import json

    ds = StoreDataset(store, ordering="random", seed=3)
    spec = LengthBatching(max_frames=np.int64(40), max_seqs=np.int32(6), buckets=np.int64(3), buffer_size=np.uint16(20))
    plain = LengthBatching(max_frames=40, max_seqs=6, buckets=3, buffer_size=20)
    assert spec == plain and spec.config() == plain.config()
    assert all(type(v) in (int, bool) for v in spec.config().values())
    sampler = EpochBatchSampler(ds, batching=spec, rank=0, world_size=2)
    assert list(sampler) == list(EpochBatchSampler(ds, batching=plain, rank=0, world_size=2))
    state = sampler.state_dict(consumed=2)
    assert json.loads(json.dumps(state)) == state
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    assert torch.load(buf) == state


def test_a_refused_state_leaves_the_consumer_as_it_was(store: Path) -> None:
    """A state refused for its epoch length (``StateError``) had already moved the sampler to the state's
    epoch: a loop that caught the error and went on walked another epoch's order. Nothing changes now."""
    ds = StoreDataset(store, ordering="random", seed=3)
    s = EpochSampler(ds, rank=0, world_size=1, epoch=2)
    want = list(s)
    state = EpochSampler(ds, rank=0, world_size=1, epoch=5).state_dict(consumed=7)
    with pytest.raises(StateError, match="positions"):
        s.load_state_dict({**state, "num_positions": N + 5})
    assert s.epoch == 2 and list(s) == want


def test_built_before_init_process_group_under_a_launcher_is_refused(store: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun (WORLD_SIZE=2 in the environment) with torch.distributed not initialised yet, a sampler
    (or iterable dataset) without rank= / world_size= would be rank 0 of 1 on every process, each taking the
    whole epoch: refused, naming init_process_group. Given both, or WORLD_SIZE=1, it is built as asked."""
    from seqstore.torch import IterableSeqDataset

    ds = StoreDataset(store)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for make in (lambda **kw: EpochSampler(ds, **kw), lambda **kw: EpochBatchSampler(ds, max_seqs=4, **kw),
                 lambda **kw: IterableSeqDataset(ds, **kw)):
        with pytest.raises(ValueError, match="WORLD_SIZE=2.*init_process_group"):
            make()
        with pytest.raises(ValueError, match="init_process_group"):
            make(rank=1)
        assert make(rank=1, world_size=2).world_size == 2
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert EpochSampler(ds).world_size == 1


def test_length_batching_keeps_its_boundaries_and_refuses_bad_buckets_when_made(store: Path) -> None:
    """``LengthBatching(buckets=...)`` cut float boundaries to ints (3.5 became 3: records of length 3 went to
    the next bucket), took a string's characters for boundaries ('4': a boundary at 4, not 4 buckets), and let
    a count below 1, a bool or boundaries out of order through to the first epoch's read (where the error did
    not name LengthBatching); a float count was a bare TypeError. Boundaries are kept as given now, and the
    rest is a ValueError naming ``LengthBatching: buckets`` when it is made."""
    ds = StoreDataset(store, ordering="random", seed=3)

    def batches(buckets: Any) -> list[list[int]]:
        return list(EpochBatchSampler(ds, max_frames=40, buckets=buckets, buffer_size=20, rank=0, world_size=1))

    spec = LengthBatching(max_frames=40, buckets=(3.5, 8.5))
    assert spec.buckets == (3.5, 8.5) and spec.config()["buckets"] == [3.5, 8.5]
    assert batches((3.5, 8.5)) == batches((4, 9)) != batches((3, 8))  # integer lengths: 3.5 is 4, not 3
    for given in (np.array([4, 9]), torch.tensor([4, 9]), iter([4, 9])):  # any iterable; plain ints in states
        assert LengthBatching(max_frames=40, buckets=given).config()["buckets"] == [4, 9]
    assert LengthBatching(max_frames=40, buckets=np.array(3)).buckets == 3
    for bad in (2.7, "4", b"4", 0, -2, True, (9, 4), (4, 4), (1, "a"), ((1, 2),), (4, float("nan")), (True, 5),
                np.array([9, 4], np.uint64), np.array(True)):
        with pytest.raises(ValueError, match="LengthBatching: buckets"):
            LengthBatching(max_frames=40, buckets=bad)  # type: ignore[arg-type]


def test_batching_and_its_options_both_given_are_refused(store: Path) -> None:
    """``EpochBatchSampler(ds, max_frames=100, batching=LengthBatching(max_seqs=4))`` took ``batching`` and
    dropped ``max_frames`` without a word (batches of 4 records whatever their frames); a ``batching`` that
    is not a LengthBatching failed at the first iteration. Both are refused when the sampler is made."""
    ds = StoreDataset(store)
    spec = LengthBatching(max_seqs=4)
    for extra in ({"max_frames": 100}, {"max_seqs": 4}, {"padded": False}, {"buckets": 2}, {"buffer_size": 5}):
        with pytest.raises(ValueError, match=f"EpochBatchSampler: batching= .*{next(iter(extra))}"):
            EpochBatchSampler(ds, batching=spec, rank=0, world_size=1, **extra)
    with pytest.raises(TypeError, match="EpochBatchSampler: batching must be a LengthBatching"):
        EpochBatchSampler(ds, batching={"max_seqs": 4}, rank=0, world_size=1)  # type: ignore[arg-type]
    assert EpochBatchSampler(ds, batching=spec, rank=0, world_size=1).batching is spec
