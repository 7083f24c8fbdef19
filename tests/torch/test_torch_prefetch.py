"""Read-ahead in the torch loaders: workers know and prefetch their own next batches, batches stay
exactly what they were, and a wrong prediction only stops the read-ahead."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_testlib import make_store  # noqa: E402

import seqstore  # noqa: E402
from seqstore.data import StoreDataset  # noqa: E402
from seqstore.torch import EpochBatchSampler, EpochSampler, IterableSeqDataset, SeqDataLoader, SeqDataset  # noqa: E402
from seqstore.torch._foresight import Foresight  # noqa: E402


class LoggingDataset(StoreDataset):
    """A StoreDataset that appends each prefetch and gather to a per-process JSON-lines file."""

    def __init__(self, path: Path, log_dir: Path) -> None:
        super().__init__(path, ordering="random", seed=4, length_field="x")
        self.log_dir = str(log_dir)

    def _log(self, kind: str, indices: Any) -> None:
        with open(os.path.join(self.log_dir, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps([kind, np.asarray(indices).reshape(-1).tolist()]) + "\n")

    def prefetch(self, indices: Any) -> None:
        self._log("prefetch", indices)
        super().prefetch(indices)

    def get_batch(self, indices: Any, *, pad: bool = False) -> dict[str, Any]:
        self._log("get", indices)
        return super().get_batch(indices, pad=pad)

    def iter_batches(self, batches: Any, *, pad: bool = False, prefetch: int = 2) -> Any:
        """Logs ("ahead", batch) when the store pulls a batch to start its reads, ("get", batch) when
        the batch is handed out."""
        pulled: list[Any] = []

        def logged() -> Any:
            for b in batches:
                self._log("ahead", b)
                pulled.append(b)
                yield b

        for k, out in enumerate(super().iter_batches(logged(), pad=pad, prefetch=prefetch)):
            self._log("get", pulled[k])
            yield out


def _logs(log_dir: Path) -> list[list[tuple[str, list[int]]]]:
    out = []
    for p in sorted(log_dir.glob("*.jsonl")):
        out.append([(k, v) for k, v in (json.loads(line) for line in p.read_text().splitlines())])
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_seqdataset_workers_prefetch_their_next_batches(tmp_path: Path, workers: int) -> None:
    path = tmp_path / "s"
    lens = make_store(path, 300)
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    ds = LoggingDataset(path, log_dir)
    sampler = EpochBatchSampler(ds, max_seqs=16, rank=0, world_size=1)
    loader = SeqDataLoader(SeqDataset(ds, prefetch=2), batch_sampler=sampler, num_workers=workers, procs=0,
                           collate_fn=SeqDataset(ds).collate())
    want = [list(b) for b in EpochBatchSampler(ds, max_seqs=16, rank=0, world_size=1)]
    got = [batch["x_lengths"].tolist() for batch in loader]
    assert got == [lens[b].tolist() for b in want]
    logs = _logs(log_dir)
    assert len(logs) == max(workers, 1)
    seen_gets = []
    for log in logs:
        gets = [v for k, v in log if k == "get"]
        seen_gets.extend(gets)
        if workers == 0:  # built in this process: the store's iter_batches reads ahead
            for j in range(1, min(3, len(gets))):
                assert log.index(("ahead", gets[j])) < log.index(("get", gets[j - 1])), j
            continue
        prefetched = [v for k, v in log if k == "prefetch"]
        # every batch after the first is prefetched before it is gathered, in order, each once
        assert prefetched == gets[1:], (prefetched[:3], gets[:3])
        for j, g in enumerate(gets[1:], start=1):
            assert log.index(("prefetch", g)) < log.index(("get", g)), j
    assert sorted(map(tuple, seen_gets)) == sorted(map(tuple, want))


def test_foresight_stops_at_a_wrong_guess(tmp_path: Path) -> None:
    path = tmp_path / "s"
    make_store(path, 100)
    ds = StoreDataset(path, ordering="random", seed=1)
    sampler = EpochSampler(ds, rank=0, world_size=1)
    batches = [np.asarray(b) for b in torch.utils.data.BatchSampler(sampler, 10, False)]
    fs = Foresight(torch.utils.data.BatchSampler(sampler, 10, False), depth=3)
    first = fs.advance(batches[0])
    assert [b.tolist() for b in first] == [b.tolist() for b in batches[1:4]]
    assert [b.tolist() for b in fs.advance(batches[1])] == [batches[4].tolist()]
    assert fs.advance(batches[5]) == []  # not what the replay says comes next: stop
    assert fs.advance(batches[6]) == []
    fs.reset()
    assert len(fs.advance(batches[0])) == 3
    assert Foresight(sampler, depth=0).advance(batches[0]) == []
    with pytest.raises(ValueError, match="prefetch"):
        SeqDataset(ds, prefetch=-1)


@pytest.mark.parametrize("batch", [8, None])
def test_iterable_prefetch_keeps_batches_and_resume(tmp_path: Path, batch: int | None) -> None:
    path = tmp_path / "s"
    make_store(path, 200)
    def make(prefetch: int | None) -> IterableSeqDataset:
        return IterableSeqDataset(StoreDataset(path, ordering="random", seed=2), batch=batch, rank=0, world_size=1,
                                  fields=["spk"], prefetch=prefetch, with_index=True)

    plain, ahead = make(0), make(3)
    kw: dict[str, Any] = {"batch_size": None} if batch else {"batch_size": 8}
    a = [b["index"].tolist() for b in SeqDataLoader(plain, num_workers=2, **kw)]
    assert [b["index"].tolist() for b in SeqDataLoader(make(None), num_workers=2, **kw)] == a  # the default
    loader = SeqDataLoader(ahead, num_workers=2, **kw)
    b = []
    for j, item in enumerate(loader):
        b.append(item["index"].tolist())
        if j == 6:
            state = loader.state_dict()
    assert a == b
    loader2 = SeqDataLoader(make(3), num_workers=2, **kw)
    loader2.load_state_dict(state)
    assert [x["index"].tolist() for x in loader2] == a[7:]
    with pytest.raises(ValueError, match="prefetch"):
        IterableSeqDataset(StoreDataset(path), batch=4, rank=0, world_size=1, prefetch=-2)


def test_iterable_default_prefetch_is_the_datasets_own(tmp_path: Path) -> None:
    """``prefetch=None`` (the default) hands the choice to the dataset's ``iter_batches`` (a remote store
    keeps more batches in flight than a local one); an explicit value is passed on as it is."""
    path = tmp_path / "s"
    make_store(path, 64)
    asked: list[Any] = []

    class Spy(StoreDataset):
        def iter_batches(self, batches: Any, *, pad: bool = False, prefetch: int | None = None) -> Any:
            asked.append(prefetch)
            return super().iter_batches(batches, pad=pad, prefetch=prefetch)

    for prefetch in (None, 5):
        ds = IterableSeqDataset(Spy(path), batch=8, rank=0, world_size=1, prefetch=prefetch)
        assert sum(len(b["spk"]) for b in ds) == 64
    assert asked == [None, 5]
    with pytest.raises(ValueError, match="prefetch must be None or an integer"):
        IterableSeqDataset(StoreDataset(path), batch=8, rank=0, world_size=1, prefetch=1.5)  # type: ignore[arg-type]


def test_data_layer_iter_batches(tmp_path: Path) -> None:
    path = tmp_path / "s"
    make_store(path, 120)
    child = StoreDataset(path, length_field="x")
    combined = seqstore.ConcatDataset([child, child.filter(min_length=3)])
    order = combined.epoch_order(epoch=1)
    chunks = list(order.iter_chunks(17))
    for prefetch in (0, 2, None):
        for idx, got in zip(chunks, combined.iter_batches(iter(chunks), pad=True, prefetch=prefetch)):
            want = combined.get_batch(idx, pad=True)
            np.testing.assert_array_equal(got["x"][0], want["x"][0])
            np.testing.assert_array_equal(got["spk"], want["spk"])


def test_an_iteration_broken_off_near_its_end_keeps_the_resume_point(tmp_path: Path) -> None:
    """Read-ahead pulls the last items before they are yielded: the iteration is marked finished only
    once everything was yielded, so stopping inside the read-ahead window keeps the resume position."""
    path = tmp_path / "s"
    make_store(path, 80)

    def make() -> IterableSeqDataset:
        return IterableSeqDataset(StoreDataset(path, ordering="random", seed=5), batch=8, rank=0, world_size=1,
                                  fields=["spk"], prefetch=3, with_index=True)

    full = [b["index"].tolist() for b in make()]
    ds = make()
    ds.load_state_dict(make().state_dict(consumed=2))
    first = []
    for j, b in enumerate(ds):
        first.append(b["index"].tolist())
        if j == len(full) - 4:  # stop before the last item, which the read-ahead already pulled
            break
    assert first == full[2 : len(full) - 1]  # all but the last
    assert [b["index"].tolist() for b in ds] == full[2:]  # starts at the resume point again
    assert [b["index"].tolist() for b in ds] == full  # that one ran to its end: the whole epoch next


def _loader(path: Path, kind: str, collate: Any = None, **par: Any) -> SeqDataLoader:
    """A loader of the store at ``path`` with indices (random order, seed 5), batched by an EpochSampler (8
    records, ``kind="sampler"``) or an EpochBatchSampler (60 frames); ``collate``: collate_padded by default."""
    from seqstore.torch import collate_padded

    ds = StoreDataset(path, ordering="random", seed=5)
    sds = SeqDataset(ds, with_index=True)
    collate = collate or collate_padded
    if kind == "sampler":
        return SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=8, collate_fn=collate, **par)
    return SeqDataLoader(sds, batch_sampler=EpochBatchSampler(ds, max_frames=60), collate_fn=collate, **par)


def _resumed(make: Callable[[], SeqDataLoader], taken: int) -> SeqDataLoader:
    """A new loader of ``make`` given the state of another after its first ``taken`` batches."""
    before = make()
    batches = iter(before)
    for _ in range(taken):
        next(batches)
    state = before.state_dict()
    del batches
    loader = make()
    loader.load_state_dict(state)
    return loader


@pytest.mark.parametrize("kind", ["sampler", "batch_sampler"])
@pytest.mark.parametrize("par", [{}, {"num_workers": 2, "procs": 0}], ids=["inline", "dataloader_workers"])
def test_a_loader_broken_off_near_its_end_keeps_the_samplers_resume_point(tmp_path: Path, kind: str,
                                                                           par: dict[str, int]) -> None:
    """The same for a sampler under SeqDataLoader: its read-ahead (the dataset's prefetch, the DataLoader's
    workers) pulled the sampler's last indices before their batches were handed out, which marked the
    iteration finished: broken off there, the next iteration walked the whole epoch instead of starting at
    the resume point again."""
    path = tmp_path / "s"
    make_store(path, 80)

    make = functools.partial(_loader, path, kind, **par)

    full = [b["index"].tolist() for b in make()]
    loader = _resumed(make, 2)
    first = []
    for j, b in enumerate(loader):
        first.append(b["index"].tolist())
        if j == len(full) - 4:  # stop before the last batch, whose indices the read-ahead pulled already
            break
    assert first == full[2 : len(full) - 1]
    assert [b["index"].tolist() for b in loader] == full[2:]  # starts at the resume point again
    assert [b["index"].tolist() for b in loader] == full  # that one ran to its end: the whole epoch next


class _FailingCollate:
    """collate_padded, or an OSError (a read that failed) while ``fail`` is set; picklable for the workers."""

    fail = False

    def __call__(self, samples: Any) -> Any:
        from seqstore.torch import collate_padded

        if self.fail:
            raise OSError("read failed")
        return collate_padded(samples)


def test_a_loader_that_fails_before_its_first_batch_keeps_the_samplers_resume_point(tmp_path: Path) -> None:
    """The DataLoader's workers pulled every index of a resumed epoch's last batches before the first came
    back, which marked the iteration finished; when the first batch failed (a read error, Ctrl-C while
    waiting for it) the next iteration walked the whole epoch instead of starting at the resume point."""
    path = tmp_path / "s"
    make_store(path, 80)
    collate = _FailingCollate()

    make = functools.partial(_loader, path, "sampler", collate, num_workers=2)
    full = [b["index"].tolist() for b in make()]
    loader = _resumed(make, 7)
    collate.fail = True
    with pytest.raises(OSError, match="read failed"):
        next(iter(loader))
    collate.fail = False
    assert [b["index"].tolist() for b in loader] == full[7:]  # starts at the resume point again
    assert [b["index"].tolist() for b in loader] == full


@pytest.mark.parametrize("kind", ["sampler", "batch_sampler"])
@pytest.mark.parametrize("par", [{}, {"threads": 2}, {"procs": 2}, {"num_workers": 2, "procs": 0}],
                         ids=["inline", "threads", "procs", "dataloader_workers"])
def test_len_of_a_resumed_loader_holds_until_its_iteration_ends(tmp_path: Path, kind: str, par: dict[str, int],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """len(loader) in a resumed epoch is the batches left from the resume point until the iteration ends,
    then the whole epoch's. Read-ahead pulled the sampler's last indices before their batches were handed
    out, which marked the iteration finished: len() jumped to the whole epoch's with batches still to come
    (a loop that looks for its last step with len() missed it)."""
    monkeypatch.setattr("seqstore.torch.loader.PARALLEL_FROM_BYTES", 0)  # the threads / processes all the same
    path = tmp_path / "s"
    make_store(path, 80)

    make = functools.partial(_loader, path, kind, **par)

    full = len(make())
    loader = _resumed(make, 3)
    assert len(loader) == full - 3
    seen = [len(loader) for _ in loader]
    assert seen == [full - 3] * (full - 3)
    assert len(loader) == full  # that one ran to its end: the whole epoch next


def test_a_wrapped_seqdatasets_prefetch_and_index_are_kept(tmp_path: Path) -> None:
    """A ``SeqDataset`` wrapped by an ``IterableSeqDataset`` or another ``SeqDataset`` gave its read-ahead
    (``prefetch=``) up: the wrapper read with the dataset's default depth. Its ``prefetch`` (and, in a
    ``SeqDataset``, its ``with_index``) now carry through unless the wrapper is given its own."""
    path = tmp_path / "s"
    make_store(path, 32)
    asked: list[Any] = []

    class Spy(StoreDataset):
        def iter_batches(self, batches: Any, *, pad: bool = False, prefetch: int | None = None) -> Any:
            asked.append(prefetch)
            return super().iter_batches(batches, pad=pad, prefetch=prefetch)

    inner = SeqDataset(Spy(path), with_index=True, prefetch=0)
    assert sum(len(b["index"]) for b in IterableSeqDataset(inner, batch=8)) == 32
    assert sum(len(b["index"]) for b in IterableSeqDataset(inner, batch=8, prefetch=3)) == 32
    outer = SeqDataset(inner)
    loader = SeqDataLoader(outer, sampler=EpochSampler(outer), batch_size=8, collate_fn=outer.collate())
    assert sorted(i for b in loader for i in b["index"].tolist()) == list(range(32))
    assert asked == [0, 3]  # (a prefetch of 0 for the loader: no read-ahead stream at all)
