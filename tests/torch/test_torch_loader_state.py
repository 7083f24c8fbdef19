"""SeqDataLoader as a PyTorch user drives it: ``state_dict()`` after the source's epoch or state changed behind
the loader's back (``loader.sampler.set_epoch(e)``, the DistributedSampler habit); what making one costs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.data import PackedDataset, StoreDataset

torch = pytest.importorskip("torch")

from torch_testlib import make_store  # noqa: E402

from seqstore.torch import (  # noqa: E402
    EpochBatchSampler,
    EpochSampler,
    IterableSeqDataset,
    PackedIterableDataset,
    SeqDataLoader,
    SeqDataset,
    collate_padded,
)

N = 23


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> StoreDataset:
    p = tmp_path_factory.mktemp("ls") / "s.seqstore"
    make_store(p, N, seed=1, shard_records=8)
    return StoreDataset(p, ordering="random", seed=5)


def _loaders(ds: StoreDataset) -> list[tuple[SeqDataLoader, Any]]:
    s = EpochSampler(ds)
    bs = EpochBatchSampler(ds, max_frames=40)
    it = IterableSeqDataset(ds, batch=4)
    return [(SeqDataLoader(SeqDataset(ds), sampler=s, batch_size=4, collate_fn=collate_padded), s),
            (SeqDataLoader(SeqDataset(ds), batch_sampler=bs, collate_fn=collate_padded), bs),
            (SeqDataLoader(it, batch_size=None), it)]


def test_source_set_epoch_directly_starts_the_state_at_the_new_epoch(ds: StoreDataset) -> None:
    """A whole epoch taken, then ``loader.sampler.set_epoch(2)`` (not the loader's): a state saved before
    the first batch of epoch 2 is its start (it said epoch 2 at its end: a resume skipped the epoch)."""
    for loader, src in _loaders(ds):
        assert sum(1 for _ in loader) > 0
        src.set_epoch(2)
        state = loader.state_dict()
        assert (state["epoch"], state["position"]) == (2, 0), type(src).__name__


def test_source_load_state_dict_directly_is_the_resume_point(ds: StoreDataset) -> None:
    for loader, src in _loaders(ds):
        assert sum(1 for _ in loader) > 0
        src.load_state_dict(type(src)(ds, **({"max_frames": 40} if isinstance(src, EpochBatchSampler) else {}),
                                      **({"batch": 4} if isinstance(src, IterableSeqDataset) else {}),
                                      epoch=3).state_dict())
        state = loader.state_dict()
        assert (state["epoch"], state["position"]) == (3, 0), type(src).__name__


def test_packed_load_state_dict_directly_is_the_resume_point(tmp_path: Path) -> None:
    path = tmp_path / "t.seqstore"
    with seqstore.create(path, {"tokens": Field("int32", (None,))}) as w:
        w.append_batch({"tokens": (np.arange(200 * 7, dtype=np.int32), np.full(200, 7))})

    def packed() -> PackedIterableDataset:
        return PackedIterableDataset(PackedDataset(path, seq_len=8), batch_size=2)

    pk = packed()
    loader = SeqDataLoader(pk, batch_size=None)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    fresh = packed().state_dict(0)
    pk.load_state_dict(fresh)
    assert loader.state_dict()["stats"] == fresh["stats"]


def test_making_a_loader_copies_no_in_memory_dataset() -> None:
    """threads= looks for a remote store in the dataset by pickling it: into a sink that keeps nothing (it
    held the whole pickle, and a copy of each array, in memory: twice an in-memory dataset's size)."""
    import tracemalloc

    from seqstore.data import LengthsDataset

    lengths = LengthsDataset(np.ones(2_000_000, np.int32))  # 8 MB
    tracemalloc.start()
    try:
        SeqDataLoader(SeqDataset(lengths), sampler=EpochSampler(lengths), batch_size=4, collate_fn=collate_padded,
                      threads=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000


@pytest.mark.parametrize("how", [{}, {"threads": 2}, {"collate_fn": lambda records: collate_padded(records)}])
def test_the_samplers_own_state_is_what_the_loop_took(ds: StoreDataset, how: dict[str, Any]) -> None:
    """``loader.sampler.state_dict()`` with no workers is exact (docs/torch.md) also where SeqDataLoader
    builds the batches itself: the sampler's read-ahead had taken a whole chunk (the rest of the epoch)."""
    for kind in (EpochSampler, EpochBatchSampler):
        src = kind(ds) if kind is EpochSampler else kind(ds, max_frames=40)
        given = {"sampler": src, "batch_size": 4} if kind is EpochSampler else {"batch_sampler": src}
        loader = SeqDataLoader(SeqDataset(ds), **{"collate_fn": collate_padded, **given, **how})
        for i, _ in enumerate(loader):
            if i == 1:
                break
        assert src.state_dict()["position"] == loader.state_dict()["position"] > 0, kind.__name__
        assert sum(1 for _ in loader) > 0
        assert src.state_dict() == loader.state_dict(), kind.__name__


_COLLATED = [0]  # batches the failing collate made in this process (a forked worker starts from the loop's 0)


def _fails_at_second(records: list[Any]) -> Any:
    _COLLATED[0] += 1
    if _COLLATED[0] == 2:
        raise ValueError("bad record")
    return collate_padded(records)


def test_a_dataloader_workers_error_names_the_batch(ds: StoreDataset) -> None:
    """An error in one of the DataLoader's workers (a collate of the user's: no seqstore workers) reaches the loop
    as its own class, its message naming the batch of the iteration besides torch's worker number; the error torch
    raised is its cause."""
    loader = SeqDataLoader(SeqDataset(ds), sampler=EpochSampler(ds), batch_size=4, collate_fn=_fails_at_second,
                           num_workers=2, multiprocessing_context="fork")
    got = 0
    with pytest.raises(ValueError, match="bad record") as info:
        for _ in loader:
            got += 1
    assert got == 2  # batch 2 is worker 0's second
    assert "SeqDataLoader: batch 2 of this iteration" in str(info.value) and "worker process 0" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)
