"""PackedIterableDataset through SeqDataLoader and a plain DataLoader: batches, exact resume, resume on
another world size / worker count, num_batches iterations that continue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.data import LengthsDataset, MixtureStream, PackedDataset

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from seqstore.torch import PackedIterableDataset, SeqDataLoader, StateError  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 40, 1500)
    path = tmp_path_factory.mktemp("packed") / "t.seqstore"
    with seqstore.create(path, {"tokens": Field("int32", (None,))}) as w:
        w.append_batch({"tokens": (np.arange(int(lens.sum()), dtype=np.int32), lens)})
    return path


def _packed(store: Path, mode: str = "best_fit") -> PackedDataset:
    return PackedDataset(store, seq_len=32, mode=mode, eos=1 << 30, window=16, ordering="random", seed=3)


def _take(loader: Any, n: int) -> list[dict[str, Any]]:
    out = []
    for i, b in enumerate(loader):
        out.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()})
        if i + 1 == n:
            break
    return out


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in ("tokens", "labels", "position_ids", "loss_mask", "cu_seqlens"):
            assert torch.equal(x[k], y[k]), k


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_seqdataloader_exact_resume(store: Path, mode: str) -> None:
    ref = _take(SeqDataLoader(PackedIterableDataset(_packed(store, mode), batch_size=4), batch_size=None), 9)
    assert ref[0]["tokens"].shape == (4, 32) and ref[0]["tokens"].dtype == torch.int64
    loader = SeqDataLoader(PackedIterableDataset(_packed(store, mode), batch_size=4), batch_size=None)
    _same(_take(loader, 4), ref[:4])
    state = loader.state_dict()
    assert state["stats"]["sequences"] == 16
    again = SeqDataLoader(PackedIterableDataset(_packed(store, mode), batch_size=4), batch_size=None)
    again.load_state_dict(state)
    _same(_take(again, 5), ref[4:9])


def _share_batches(packed: PackedDataset, state: Any, share: int, shares: int, n: int) -> list[dict[str, Any]]:
    s = packed.open(packed.shares(state, shares)[share], share, shares)
    return [{k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in s.batch(4).items()}
            for _ in range(n)]


def test_workers_round_robin_then_resume_on_other_topologies(store: Path) -> None:
    packed = _packed(store)
    ds = PackedIterableDataset(packed, batch_size=4)
    loader = SeqDataLoader(ds, batch_size=None, num_workers=2, procs=0)
    got = _take(loader, 5)
    # batch j came from worker j % 2's share, its (j // 2)-th batch
    per = [_share_batches(packed, None, s, 2, 3) for s in range(2)]
    _same(got, [per[j % 2][j // 2] for j in range(5)])
    state = loader.state_dict()
    assert state["num_shares"] == 2 and state["stats"]["sequences"] == 20
    # a plain DataLoader reports the same state when told what was consumed
    plain = PackedIterableDataset(packed, batch_size=4)
    _take(DataLoader(plain, batch_size=None, num_workers=2), 5)
    assert plain.state_dict(5, num_workers=2)["shares"] == state["shares"]
    # resume on 2 ranks without workers: each rank's stream is the re-split share's
    for rank in range(2):
        r = PackedIterableDataset(_packed(store), batch_size=4, rank=rank, world_size=2)
        r.load_state_dict(state)
        _same(_take(SeqDataLoader(r, batch_size=None), 2), _share_batches(packed, state, rank, 2, 2))
    # and on one process: the remaining work re-split over one share
    one = PackedIterableDataset(_packed(store), batch_size=4)
    one.load_state_dict(state)
    _same(_take(SeqDataLoader(one, batch_size=None), 3), _share_batches(_packed(store), state, 0, 1, 3))


def test_ranks_agree_on_the_state_and_resume_elsewhere(store: Path) -> None:
    packed = _packed(store, "concat")
    ranks = [PackedIterableDataset(packed, batch_size=4, rank=r, world_size=3) for r in range(3)]
    for r in ranks:
        _take(SeqDataLoader(r, batch_size=None), 3)
    states = [r.state_dict(3) for r in ranks]
    assert states[0]["shares"] == states[1]["shares"] == states[2]["shares"]
    nxt = PackedIterableDataset(_packed(store, "concat"), batch_size=4, rank=1, world_size=2)
    nxt.load_state_dict(states[0])
    _same(_take(SeqDataLoader(nxt, batch_size=None), 2), _share_batches(packed, states[0], 1, 2, 2))


def test_num_batches_iterations_continue(store: Path) -> None:
    ref = _take(SeqDataLoader(PackedIterableDataset(_packed(store), batch_size=4), batch_size=None), 6)
    ds = PackedIterableDataset(_packed(store), batch_size=4, num_batches=3)
    loader = SeqDataLoader(ds, batch_size=None)
    first = _take(loader, 10)
    second = _take(loader, 10)
    assert len(first) == 3
    _same(first + second, ref)


def test_mixture_through_the_loader_and_bad_states(store: Path) -> None:
    srcs = {n: LengthsDataset(np.full(400, 7), ordering="random", seed=i) for i, n in enumerate(["a", "b"])}
    mix = MixtureStream(srcs, {"a": 1, "b": 3}, chunk=256)
    # LengthsDataset has no tokens: plan only (state_dict replays lengths)
    ds = PackedIterableDataset(PackedDataset(mix, tokens="data", seq_len=64, mode="best_fit"), batch_size=2)
    st = ds.state_dict(10)
    assert st["stats"]["sequences"] == 20
    toks = st["stats"]["source_tokens"]
    assert abs(toks["b"] / (toks["a"] + toks["b"]) - 0.75) < 0.05
    with pytest.raises(StateError):
        PackedIterableDataset(_packed(store), batch_size=4).load_state_dict(st)
    with pytest.raises(ValueError, match="batch_size=None"):
        SeqDataLoader(PackedIterableDataset(_packed(store), batch_size=4), batch_size=4)


PARALLEL = [{"threads": 2}, {"procs": 2}]


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
@pytest.mark.parametrize("par", PARALLEL, ids=["threads", "procs"])
def test_threads_and_procs_same_stream_and_exact_resume(store: Path, mode: str, par: dict[str, int]) -> None:
    ref = _take(SeqDataLoader(PackedIterableDataset(_packed(store, mode), batch_size=4), batch_size=None), 9)
    loader = SeqDataLoader(PackedIterableDataset(_packed(store, mode), batch_size=4), batch_size=None, **par)
    got = _take(loader, 4)
    _same(got, ref[:4])
    assert got[0]["max_seqlen"] == ref[0]["max_seqlen"] and isinstance(got[0]["max_seqlen"], int)
    state = loader.state_dict()
    plain = SeqDataLoader(PackedIterableDataset(_packed(store, mode), batch_size=4), batch_size=None)
    _take(plain, 4)
    assert state == plain.state_dict()  # the same state as without workers
    again = SeqDataLoader(PackedIterableDataset(_packed(store, mode), batch_size=4), batch_size=None, **par)
    again.load_state_dict(state)
    _same(_take(again, 5), ref[4:9])


def _token_mixture(tmp_path: Path) -> Any:
    """A maker of a packed mixture of two stores ("web": tokens 1, "code": tokens 2), code from 400 tokens on."""
    datasets = {}
    rng = np.random.default_rng(1)
    for i, name in enumerate(["web", "code"]):
        lens = rng.integers(1, 30, 400)
        path = tmp_path / f"{name}.seqstore"
        with seqstore.create(path, {"tokens": Field("int32", (None,))}) as w:
            w.append_batch({"tokens": (np.full(int(lens.sum()), i + 1, dtype=np.int32), lens)})
        datasets[name] = seqstore.data.StoreDataset(path, length_field="tokens", ordering="random", seed=i)

    def make() -> PackedDataset:
        mix = MixtureStream(datasets, [(0, {"web": 1}), (400, {"code": 1})], unit="tokens", chunk=64)
        return PackedDataset(mix, seq_len=32, mode="best_fit", window=8)

    return make


def test_schedule_in_tokens_through_dataloader_workers(tmp_path: Path) -> None:
    make = _token_mixture(tmp_path)
    loader = SeqDataLoader(PackedIterableDataset(make(), batch_size=4), batch_size=None, num_workers=2,
                           procs=0)
    got = _take(loader, 5)
    per = [_share_batches(make(), None, s, 2, 3) for s in range(2)]
    _same(got, [per[j % 2][j // 2] for j in range(5)])
    state = loader.state_dict()
    one = PackedIterableDataset(make(), batch_size=4)
    one.load_state_dict(state)
    _same(_take(SeqDataLoader(one, batch_size=None), 3), _share_batches(make(), state, 0, 1, 3))


@pytest.mark.parametrize("par", PARALLEL, ids=["threads", "procs"])
def test_threads_and_procs_num_batches_and_a_schedule_in_tokens(tmp_path: Path, par: dict[str, int]) -> None:
    make = _token_mixture(tmp_path)

    def ds() -> PackedIterableDataset:
        return PackedIterableDataset(make(), batch_size=4, num_batches=3)

    plain = SeqDataLoader(ds(), batch_size=None)
    ref = _take(plain, 10) + _take(plain, 10) + _take(plain, 10)  # three iterations of num_batches=3
    loader = SeqDataLoader(ds(), batch_size=None, **par)
    got = _take(loader, 10) + _take(loader, 10)  # two iterations of num_batches=3, the second continues
    assert len(got) == 6
    _same(got, ref[:6])
    toks = torch.cat([b["tokens"].flatten() for b in got])
    assert set(toks.unique().tolist()) == {0, 1, 2}  # web, then code after 400 tokens (0: padding)
    state = loader.state_dict()
    again = SeqDataLoader(ds(), batch_size=None, **par)
    again.load_state_dict(state)
    _same(_take(again, 10), ref[6:9])


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_state_dict_with_more_shares_than_documents_names_the_counts(mode: str) -> None:
    """A small set read by more ranks x workers than an epoch has documents: a share whose block is empty in
    every epoch cannot make a batch (it would yield fewer than its rank's others and break the round-robin
    the state counts on), so the replay of ``state_dict`` says so at once, naming the counts and the
    setting to change; it walked 1000 epoch orders first and blamed an empty dataset."""
    packed = PackedDataset(LengthsDataset(np.array([5, 7, 3])), tokens="data", seq_len=4, mode=mode)
    ds = PackedIterableDataset(packed, batch_size=1, rank=1, world_size=2)
    assert ds.state_dict(1, num_workers=2)["stats"]["sequences"] == 2  # worker 1 (shares 2, 3) made nothing yet
    with pytest.raises(ValueError, match=r"share 3 of 4: .*fewer documents than the 4 shares "
                                         r"\(ranks x DataLoader workers\).*at most 3 documents"):
        ds.state_dict(2, num_workers=2)
    # with partition epochs the blocks cycle: a share empty in some sub-epochs only still packs
    parted = PackedDataset(LengthsDataset(np.full(10, 4), partition_epoch=3), tokens="data", seq_len=4, mode=mode)
    st = PackedIterableDataset(parted, batch_size=1, world_size=4, rank=0).state_dict(3, num_workers=1)
    assert st["stats"]["sequences"] == 12


def test_state_dict_refuses_a_worker_count_that_is_not_one() -> None:
    """``num_workers`` decides how the replay splits the consumed batches between the workers' shares:
    -2 was taken as 1 worker, 2.5 as 2 and "2" as 2 (a state of another split, silently); now each is a
    ValueError naming ``num_workers`` (None and 0 still mean no DataLoader workers)."""
    packed = PackedDataset(LengthsDataset(np.full(200, 7)), tokens="data", seq_len=8)
    ds = PackedIterableDataset(packed, batch_size=2)
    for bad in (-2, 2.5, "2", True):
        with pytest.raises(ValueError, match=r"PackedIterableDataset: num_workers must be None or an integer >= 0"):
            ds.state_dict(3, num_workers=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"PackedIterableDataset: num_workers must be None or an integer >= 0"):
            ds.finish_epoch(bad)  # type: ignore[arg-type]
    assert ds.state_dict(3, num_workers=None)["shares"] == ds.state_dict(3, num_workers=0)["shares"]
    assert ds.state_dict(4, num_workers=np.int64(2))["num_workers"] == 2


def test_persistent_workers_follow_set_epoch_and_refuse_a_loaded_state(store: Path) -> None:
    """A plain DataLoader with ``persistent_workers=True``: ``set_epoch`` before a run has a position reaches the
    workers (they kept their first copy); a state loaded in the main process cannot, and their next iteration
    raises naming persistent_workers instead of repeating the batches they made."""
    def run(epoch: int, workers: int, persistent: bool) -> tuple[list[dict[str, Any]], Any]:
        ds = PackedIterableDataset(_packed(store), batch_size=4, num_batches=3)
        loader = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=persistent)
        if persistent:
            _take(loader, 3)  # the workers start with epoch 1
        ds.set_epoch(epoch)
        return _take(loader, 3), (ds, loader)

    _same(run(2, 2, True)[0], run(2, 2, False)[0])
    _, (ds, loader) = run(1, 2, True)
    ds.load_state_dict(ds.state_dict(3, num_workers=2))
    with pytest.raises(StateError, match="persistent_workers"):
        _take(loader, 3)


def test_epoch_zero_says_what_to_pass(store: Path) -> None:
    """``set_epoch(0)`` (Lightning's ``trainer.current_epoch`` counts from 0) is a ValueError saying epochs are
    1-based and to pass the 0-based epoch + 1, as the samplers and IterableSeqDataset say."""
    ds = PackedIterableDataset(_packed(store), batch_size=4)
    for call in (lambda: ds.set_epoch(0), lambda: PackedIterableDataset(_packed(store), batch_size=4, epoch=0)):
        with pytest.raises(ValueError, match=r"1-based.*current_epoch \+ 1"):
            call()
