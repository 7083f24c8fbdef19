"""SeqDataLoader building batches in its own process (no workers; ``threads=``): the same batches, order
and resume states as the DataLoader path, exactly once over ranks, errors and early exits."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402
from torch_testlib import make_store  # noqa: E402

from seqstore.data import StoreDataset  # noqa: E402
from seqstore.torch import (  # noqa: E402
    EpochBatchSampler,
    EpochSampler,
    IterableSeqDataset,
    LengthBatching,
    PaddedCollate,
    SeqDataLoader,
    SeqDataset,
    collate_padded,
)
from seqstore.torch._direct import rebatch  # noqa: E402

N = 96
MODES = ("sampler", "sampler-drop", "greedy", "bucket", "iter-fixed", "iter-greedy")


def loader_threads() -> int:
    """Threads the loaders start (by name: other tests' threads come and go meanwhile)."""
    return sum(1 for t in threading.enumerate() if t.name.startswith("seqstore-loader"))


@pytest.fixture(autouse=True)
def parallel_small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batches here are tiny: hand them to the helpers all the same (see test_small_batches_stay_inline)."""
    monkeypatch.setattr("seqstore.torch.loader.PARALLEL_FROM_BYTES", 0)


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> StoreDataset:
    p = tmp_path_factory.mktemp("direct") / "d.seqstore"
    make_store(p, N, seed=5, shard_records=32)
    return StoreDataset(p, ordering="random", seed=3)


def _loader(ds: StoreDataset, mode: str, rank: int, world: int, cls: Any = SeqDataLoader, **kw: Any) -> Any:
    """A loader of ``mode`` for rank ``rank`` of ``world`` (``cls``: SeqDataLoader or the plain DataLoader)."""
    sds = SeqDataset(ds, with_index=True)
    if mode.startswith("sampler"):
        return cls(sds, sampler=EpochSampler(ds, rank=rank, world_size=world), batch_size=5,
                   drop_last=mode.endswith("drop"), collate_fn=sds.collate(masks=True), **kw)
    if mode in ("greedy", "bucket"):
        spec = LengthBatching(max_frames=40, buckets=3 if mode == "bucket" else None, buffer_size=20)
        return cls(sds, batch_sampler=EpochBatchSampler(ds, batching=spec, rank=rank, world_size=world),
                   collate_fn=collate_padded, **kw)
    batch: Any = 6 if mode == "iter-fixed" else LengthBatching(max_frames=40)
    it = IterableSeqDataset(ds, batch=batch, rank=rank, world_size=world, with_index=True, masks=True)
    return cls(it, batch_size=None, **kw)


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


PARALLEL = [{}, {"threads": 2}, {"procs": 2}]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("par", PARALLEL, ids=["inline", "threads", "procs"])
def test_same_batches_as_the_dataloader_path(ds: StoreDataset, mode: str, par: dict[str, int],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import seqstore.torch.loader as loader_module

    _workers_gather(monkeypatch)  # (else the loop's process gathers these few batches itself: ring.Chooser)
    plans: list[Any] = []
    real = loader_module.direct_plan
    monkeypatch.setattr(loader_module, "direct_plan", lambda ld, t: plans.append(real(ld, t)) or plans[-1])
    for rank in range(2):
        want = list(_loader(ds, mode, rank, 2, cls=DataLoader))
        loader = _loader(ds, mode, rank, 2, **par)
        got = list(loader)
        assert len(got) == len(want) == len(loader) and loader.consumed == len(got)
        for a, b in zip(got, want):
            _same(a, b)
    # built here, except a self-batching iterable without threads (one gather per step already)
    assert all((p is not None) == (bool(par) or not mode.startswith("iter")) for p in plans) and plans


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("par", [({}, {"threads": 2}), ({"threads": 2}, {}), ({"procs": 2}, {"threads": 1}),
                                 ({}, {"procs": 2}), ({"num_workers": 2, "procs": 0}, {"num_workers": 2}),
                                 ({"num_workers": 2}, {})],
                         ids=["inline-threads", "threads-inline", "procs-threads", "inline-procs",
                              "dataloader_workers-workers", "workers-inline"])
def test_resume_over_ranks_and_modes_is_exact(ds: StoreDataset, mode: str,
                                              par: tuple[dict[str, int], dict[str, int]],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """2 ranks take k batches each (more are in flight with threads or processes), checkpoint, 1 rank
    resumes in another mode: the states and the remaining batches equal the DataLoader path's, and with no
    tail padding every record comes exactly once."""
    _workers_gather(monkeypatch)  # (else the loop's process gathers these few batches itself: ring.Chooser)
    k = 3

    def run(first: dict[str, int], then: dict[str, int]) -> tuple[dict[str, Any], list[np.ndarray]]:
        states, seen = [], []
        for rank in range(2):
            loader = _loader(ds, mode, rank, 2, **first)
            for step, b in enumerate(loader):
                np.testing.assert_array_equal(b["x"][:, 0, 0].numpy(), b["index"].numpy())  # x[t, 0] = index
                seen.append(b["index"].numpy())
                if step + 1 == k:
                    break
            states.append(loader.state_dict())
        assert states[0] == states[1]
        loader = _loader(ds, mode, 0, 1, **then)
        loader.load_state_dict(states[0])
        rest = [b["index"].numpy() for b in loader]
        assert loader.consumed == len(rest)
        return states[0], seen + rest

    state, got = run(*par)
    ref_state, ref = _reference(ds, mode, k)
    state.pop("num_workers", None)
    assert state == ref_state
    assert len(got) == len(ref) and all(np.array_equal(a, b) for a, b in zip(got, ref))
    if mode in ("sampler", "iter-fixed"):  # 96 records: no padding on 2 ranks
        np.testing.assert_array_equal(np.sort(np.concatenate(got)), np.arange(N))


_REFERENCE: dict[str, tuple[dict[str, Any], list[np.ndarray]]] = {}


def _reference(ds: StoreDataset, mode: str, k: int) -> tuple[dict[str, Any], list[np.ndarray]]:
    """What the DataLoader path (one worker: batches built in a worker process) gives for the same run."""
    if mode not in _REFERENCE:
        _REFERENCE[mode] = _reference_run(ds, mode, k)
    state, batches = _REFERENCE[mode]
    return dict(state), batches


def _reference_run(ds: StoreDataset, mode: str, k: int) -> tuple[dict[str, Any], list[np.ndarray]]:
    states, seen = [], []
    for rank in range(2):
        loader = _loader(ds, mode, rank, 2, num_workers=1, procs=0)
        for step, b in enumerate(loader):
            seen.append(b["index"].numpy())
            if step + 1 == k:
                break
        states.append(loader.state_dict())
    loader = _loader(ds, mode, 0, 1, num_workers=1, procs=0)
    loader.load_state_dict(states[0])
    state = dict(states[0])
    state.pop("num_workers", None)
    rest = [b["index"].numpy() for b in loader]
    return state, seen + rest


def test_num_workers_takes_seqstores_workers_for_its_own_batches(ds: StoreDataset) -> None:
    """``num_workers=K`` on seqstore's own batches is ``procs=K`` (the DataLoader's worker options dropped);
    the DataLoader's workers where they are asked for: ``procs=0``, a ``worker_init_fn``, a collate of the
    user's own."""
    for mode in ("sampler", "greedy", "iter-fixed"):
        loader = _loader(ds, mode, 0, 1, num_workers=2, prefetch_factor=4, persistent_workers=mode != "iter-fixed")
        assert (loader.procs, loader.num_workers) == (2, 0), mode
        got = [b["index"].numpy() for b in loader]
        want = [b["index"].numpy() for b in _loader(ds, mode, 0, 1)]
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert _loader(ds, "sampler", 0, 1, num_workers=2, procs=0).num_workers == 2
    assert _loader(ds, "sampler", 0, 1, num_workers=2, worker_init_fn=lambda w: None).procs == 0
    own = SeqDataLoader(SeqDataset(ds), sampler=EpochSampler(ds), batch_size=4, collate_fn=lambda b: b,
                        num_workers=2)
    assert (own.procs, own.num_workers) == (0, 2)
    records = SeqDataLoader(IterableSeqDataset(ds), batch_size=4, collate_fn=collate_padded, num_workers=2)
    assert (records.procs, records.num_workers) == (0, 2)  # records mode: the DataLoader's workers


def test_errors_in_seqstores_words(ds: StoreDataset) -> None:
    sds = SeqDataset(ds)
    with pytest.raises(ValueError, match="threads must be an integer >= 0"):
        SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=4, collate_fn=collate_padded, threads=-1)
    with pytest.raises(ValueError, match="does not go with num_workers"):
        SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=4, collate_fn=collate_padded, threads=2,
                      num_workers=2)
    for mode in ("threads", "procs"):  # its workers never called a worker_init_fn
        with pytest.raises(ValueError, match=f"{mode}= replaces .* or a worker_init_fn"):
            SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=4, collate_fn=collate_padded,
                          worker_init_fn=lambda w: None, **{mode: 2})
    with pytest.raises(ValueError, match="threads= needs seqstore's own batches"):
        SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=4, collate_fn=lambda b: b, threads=2)
    with pytest.raises(ValueError, match="threads= needs seqstore's own batches"):
        SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=4, threads=2,
                      collate_fn=PaddedCollate(pad_value=-1))
    with pytest.raises(ValueError, match="threads= needs seqstore's own batches"):
        SeqDataLoader(IterableSeqDataset(ds), batch_size=4, threads=2)


def test_num_workers_that_is_not_a_count_is_refused_in_its_own_name(ds: StoreDataset) -> None:
    """``num_workers`` on seqstore's own batches becomes ``procs``: -1 was refused as "procs must be ...", an
    argument never given, and 1.5 or "2" were cut to 1 and 2 workers without a word. Each is a ValueError
    naming num_workers now, on the DataLoader's path too."""
    sds = SeqDataset(ds)
    for bad in (-1, 1.5, "2", True):
        for collate in (collate_padded, lambda b: b):  # seqstore's own workers, the DataLoader's
            with pytest.raises(ValueError, match="SeqDataLoader: num_workers must be an integer >= 0"):
                SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=4, collate_fn=collate, num_workers=bad)
    assert SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=4, collate_fn=collate_padded,
                         num_workers=np.int64(2)).procs == 2


def test_other_collate_functions_keep_the_dataloader_path(ds: StoreDataset) -> None:
    """A collate function the loader cannot reproduce gets the records, as before."""
    sds = SeqDataset(ds)
    seen: list[int] = []

    def count(records: list[dict[str, Any]]) -> int:
        seen.append(len(records))
        return len(records)

    loader = SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=7, collate_fn=count)
    assert sum(loader) == N and seen[0] == 7
    padded = SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=7, collate_fn=PaddedCollate(pad_value=-1))
    b = next(iter(padded))
    assert float(b["x"][b["x_lengths"].argmin(), -1, 0]) == -1.0


class _Failing(StoreDataset):
    def get_batch(self, indices: Any, *, pad: bool = False) -> dict[str, Any]:
        if 7 in np.asarray(indices):
            raise OSError("disk gone")
        return super().get_batch(indices, pad=pad)


def test_an_error_in_a_thread_is_raised_in_the_loop_and_threads_end(ds: StoreDataset) -> None:
    bad = _Failing(ds.store)
    sds = SeqDataset(bad, prefetch=0)
    before = loader_threads()
    loader = SeqDataLoader(sds, sampler=EpochSampler(bad), batch_size=4, collate_fn=collate_padded, threads=2)
    got = 0
    with pytest.raises(OSError, match="disk gone"):
        for _ in loader:
            got += 1
    assert got == 1  # batch [4, 8) fails; the batch before it came out
    assert loader_threads() == before


def test_breaking_off_stops_the_threads(ds: StoreDataset) -> None:
    before = loader_threads()
    loader = _loader(ds, "greedy", 0, 1, threads=3)
    for step, _ in enumerate(loader):
        if step == 2:
            break
    del _
    import gc

    gc.collect()
    assert loader_threads() == before
    assert loader.consumed == 3


@pytest.mark.parametrize("mode", MODES)
def test_a_new_epoch_is_saved_at_its_start(ds: StoreDataset, mode: str) -> None:
    """``set_epoch(e + 1)`` after epoch ``e`` ran: a checkpoint taken before the new epoch's first batch
    names its start, and resuming from it gives the whole epoch (not an epoch counted as consumed)."""
    loader = _loader(ds, mode, 0, 1)
    assert sum(1 for _ in loader) > 0
    loader.set_epoch(2)
    state = loader.state_dict()
    assert (state["epoch"], state["position"], state["batches"]) == (2, 0, 0)
    resumed = _loader(ds, mode, 0, 1)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    fresh = _loader(ds, mode, 0, 1)
    fresh.set_epoch(2)
    got, want = [b["index"].numpy() for b in resumed], [b["index"].numpy() for b in fresh]
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def test_rebatch() -> None:
    chunks = [np.arange(0, 7), np.arange(7, 9), np.arange(9, 20)]
    assert [b.tolist() for b in rebatch(iter(chunks), 6, False)] == [
        list(range(0, 6)), list(range(6, 12)), list(range(12, 18)), [18, 19]]
    assert [len(b) for b in rebatch(iter(chunks), 6, True)] == [6, 6, 6]
    assert list(rebatch(iter([]), 3, False)) == []


def _children() -> set[int]:
    import os
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # (started with the first shared block, it stays as long as this process)
    pids: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            pids |= {int(x) for x in f.read().split()}
    return pids


@pytest.mark.parametrize("workers_gather", [False, True], ids=["loop-gathers", "workers-gather"])
def test_procs_error_in_a_worker_is_raised_in_the_loop_and_workers_end(ds: StoreDataset, workers_gather: bool,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if workers_gather:  # (else the loop's process gathers these few batches itself: ring.Chooser)
        _workers_gather(monkeypatch)
    bad = _Failing(ds.store)
    before = _children()
    loader = SeqDataLoader(SeqDataset(bad, prefetch=0), sampler=EpochSampler(bad), batch_size=4,
                           collate_fn=collate_padded, procs=2)
    got = 0
    with pytest.raises(OSError, match="disk gone"):
        for _ in loader:
            got += 1
    assert got == 1
    assert _children() <= before


def test_procs_a_killed_worker_is_an_error_in_seqstores_words(ds: StoreDataset) -> None:
    import multiprocessing
    import os
    import signal

    from seqstore.errors import SeqstoreError

    loader = _loader(ds, "sampler", 0, 1, procs=2)
    it = iter(loader)
    next(it)  # the first batch comes before the workers start
    assert not [p for p in multiprocessing.active_children() if p.name == "seqstore-loader"]
    next(it)
    workers = [p for p in multiprocessing.active_children() if p.name == "seqstore-loader"]
    assert len(workers) == 2
    for p in workers:
        os.kill(p.pid, signal.SIGKILL)
    for p in workers:  # dead before the next batch: noticed whichever process gathers it (ring.Chooser)
        p.join(timeout=10)
    with pytest.raises(SeqstoreError, match="exited unexpectedly"):
        for _ in it:
            pass


def test_procs_workers_that_died_resting_are_an_error_in_seqstores_words() -> None:
    """Workers that died while the loop's process gathered (ring.Chooser), then given batches again: the
    send to a worker that is gone raised a bare BrokenPipeError; it is a LoaderWorkerError naming it."""
    import os
    import signal

    from seqstore.torch import _ring
    from seqstore.torch._ring import LoaderWorkerError, run_processes

    class Turns(_ring.Chooser):  # the loop's process gathers the first batches, then the workers
        def __init__(self) -> None:
            super().__init__()
            self.ticks = 0

        def tick(self, *args: float) -> None:
            self.ticks += 1
            self.here = self.ticks < 3

    gather = _Growing()
    it = run_processes(gather(np.array([1])), iter([np.array([k]) for k in range(2, 40)]), gather, 2,  # type: ignore[arg-type]
                       chooser=Turns())
    assert [int(next(it)["x"][0]) for _ in range(2)] == [1, 2]  # the workers started after the first
    workers = [p for p in _ring.multiprocessing.active_children() if p.name == "seqstore-loader"]
    assert len(workers) == 2
    for p in workers:
        os.kill(p.pid, signal.SIGKILL)
        p.join(timeout=10)
    with pytest.raises(LoaderWorkerError, match="exited unexpectedly"):
        for _ in it:
            pass


def _workers_gather(monkeypatch: pytest.MonkeyPatch) -> None:
    """``procs=`` workers gather every batch after the first (not the loop's process: ring.Chooser)."""
    from seqstore.torch import _ring

    class Workers(_ring.Chooser):
        def __init__(self) -> None:
            super().__init__()
            self.here = False

        def tick(self, *args: float) -> None:
            pass

    monkeypatch.setattr(_ring, "Chooser", lambda **kw: Workers())


class _ReadError(Exception):
    """An exception made with two arguments: its pickle cannot make it again (it calls ``_ReadError(text)``)."""

    def __init__(self, path: str, code: int) -> None:
        super().__init__(f"cannot read {path}: code {code}")


class _FailingOddly(StoreDataset):
    def get_batch(self, indices: Any, *, pad: bool = False) -> dict[str, Any]:
        if 7 in np.asarray(indices):
            raise _ReadError("shard 3", 5)
        return super().get_batch(indices, pad=pad)


def test_procs_an_error_the_loop_cannot_unpickle_comes_as_its_text(ds: StoreDataset,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's exception that does not survive the pipe is a LoaderWorkerError with its type and text
    (not the TypeError of unpickling it in the loop)."""
    from seqstore.torch._ring import LoaderWorkerError

    _workers_gather(monkeypatch)
    bad = _FailingOddly(ds.store)
    loader = SeqDataLoader(SeqDataset(bad, prefetch=0), sampler=EpochSampler(bad), batch_size=4,
                           collate_fn=collate_padded, procs=2)
    got = 0
    with pytest.raises(LoaderWorkerError, match="_ReadError: cannot read shard 3: code 5"):
        for _ in loader:
            got += 1
    assert got == 1


def test_procs_a_worker_killed_while_it_gathers_is_an_error(ds: StoreDataset, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal

    from seqstore.errors import SeqstoreError
    from seqstore.torch import _ring

    _workers_gather(monkeypatch)
    loader = _loader(ds, "sampler", 0, 1, procs=2)
    it = iter(loader)
    next(it)
    pids = [p.pid for p in _ring.multiprocessing.active_children() if p.name == "seqstore-loader"]
    assert len(pids) == 2
    os.kill(pids[0], signal.SIGKILL)
    with pytest.raises(SeqstoreError, match="exited unexpectedly"):
        for _ in it:
            pass


def test_procs_a_worker_killed_by_sigbus_names_dev_shm(ds: StoreDataset, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker writing into the ring's shared block dies of SIGBUS where /dev/shm has no room for the page (a
    container's 64 MiB): the error said only "exit code -7"; it names the signal, /dev/shm and the block's size."""
    import faulthandler
    import os
    import signal

    from seqstore.torch import _ring

    def bus_error(*args: Any) -> None:  # (the workers are forked: they run this)
        faulthandler.disable()  # (pytest's would print the worker's stack)
        os.kill(os.getpid(), signal.SIGBUS)

    _workers_gather(monkeypatch)
    monkeypatch.setattr(_ring, "_serve", bus_error)
    loader = _loader(ds, "sampler", 0, 1, procs=2)
    got = 0
    with pytest.raises(_ring.LoaderWorkerError, match=r"code -7: killed by SIGBUS.* /dev/shm .*block of \d+ bytes"):
        for _ in loader:
            got += 1
    assert got == 1  # the first batch, gathered in the loop's process


@pytest.mark.timeout(120)
def test_procs_a_worker_stuck_past_the_timeout_is_an_error(ds: StoreDataset, monkeypatch: pytest.MonkeyPatch) -> None:
    """``num_workers=K`` with the DataLoader's ``timeout=``: seqstore's workers replace the DataLoader's, and a
    worker that gives no batch for that long is a LoaderWorkerError, as the DataLoader raises one; the timeout
    was dropped, so a stuck worker (alive, silent) was waited for for ever."""
    import time

    from seqstore.torch import _ring
    from seqstore.torch._ring import LoaderWorkerError

    _workers_gather(monkeypatch)
    monkeypatch.setattr(_ring, "_serve", lambda *args: time.sleep(600))  # (the workers are forked)
    loader = _loader(ds, "sampler", 0, 1, num_workers=2, timeout=2)
    assert loader.procs == 2
    got = 0
    with pytest.raises(LoaderWorkerError, match="no batch in 2s"):
        for _ in loader:
            got += 1
    assert got == 1  # the first batch, gathered in the loop's process


class _Slow:
    """``_ring._serve`` after a pause of ``seconds`` (the workers are forked: they run it)."""

    def __init__(self, serve: Any, seconds: float) -> None:
        self.serve, self.seconds = serve, seconds

    def __call__(self, *args: Any) -> Any:
        import time

        time.sleep(self.seconds)
        return self.serve(*args)


def test_procs_a_timeout_under_a_second_is_kept(ds: StoreDataset, monkeypatch: pytest.MonkeyPatch) -> None:
    """``timeout=0.1`` and workers that take 0.3 s a batch: a LoaderWorkerError. The loop looked at the clock
    only once a second, so a batch that came within the second was taken whatever the timeout was."""
    from seqstore.torch import _ring

    _workers_gather(monkeypatch)
    monkeypatch.setattr(_ring, "_serve", _Slow(_ring._serve, 0.3))
    loader = _loader(ds, "sampler", 0, 1, procs=2, timeout=0.1)
    got = 0
    with pytest.raises(_ring.LoaderWorkerError, match=r"no batch in 0.1s"):
        for _ in loader:
            got += 1
    assert got == 1  # the first batch, gathered in the loop's process


def test_procs_batches_held_by_the_loop_keep_their_values(ds: StoreDataset, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches handed out as views of the shared slots are never overwritten while alive; a loop that
    keeps every batch (or a part of one) gets copies once the worker would run out of slots."""
    _workers_gather(monkeypatch)  # (else the loop's process gathers these few batches itself: ring.Chooser)
    held = []
    parts = []
    for b in _loader(ds, "greedy", 0, 1, procs=2):
        held.append(b)
        parts.append(b["x"][:, 0, 0])
    for b, p in zip(held, parts):
        np.testing.assert_array_equal(b["x"][:, 0, 0].numpy(), b["index"].numpy())
        np.testing.assert_array_equal(p.numpy(), b["index"].numpy())
    got = np.sort(np.concatenate([b["index"].numpy() for b in held]))
    np.testing.assert_array_equal(got, np.arange(N))


def _mapped_blocks() -> set[str]:
    """The shared-memory blocks mapped in this process (by file name)."""
    with open("/proc/self/maps") as f:
        return {line.split(None, 5)[5].strip() for line in f if "/psm_" in line}


def test_procs_a_finished_loops_block_goes_with_its_last_batch(ds: StoreDataset,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The ring's block stays mapped while a batch handed out as its views lives, and goes with the last
    one (not kept until another loop ends, which held two blocks through every epoch after the first)."""
    _workers_gather(monkeypatch)
    before = _mapped_blocks()
    for batch in _loader(ds, "greedy", 0, 1, procs=2):  # noqa: B007 - the variable keeps the last batch
        pass
    assert _mapped_blocks() - before  # the last batch is a view of the block
    np.testing.assert_array_equal(batch["x"][:, 0, 0].numpy(), batch["index"].numpy())
    del batch
    assert not _mapped_blocks() - before


def test_procs_breaking_off_stops_the_workers(ds: StoreDataset) -> None:
    before = _children()
    loader = _loader(ds, "iter-fixed", 0, 1, procs=2)
    for step, _b in enumerate(loader):
        if step == 2:
            break
    assert loader.consumed == 3
    assert _children() <= before


@pytest.mark.parametrize("par", [{"threads": 2}, {"procs": 2}])
def test_small_batches_stay_inline(ds: StoreDataset, par: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches under PARALLEL_FROM_BYTES are gathered in the loop's thread (no helper, no worker)."""
    import seqstore.torch.loader as loader_module

    monkeypatch.setattr(loader_module, "PARALLEL_FROM_BYTES", 1 << 30)
    started: list[str] = []
    monkeypatch.setattr(loader_module, "run_ordered", lambda *a, **k: started.append("threads") or iter(()))
    monkeypatch.setattr(loader_module, "run_processes", lambda *a, **k: started.append("procs") or iter(()))
    want = [b["index"].tolist() for b in _loader(ds, "sampler", 0, 1)]
    got = [b["index"].tolist() for b in _loader(ds, "sampler", 0, 1, **par)]
    assert got == want and not started


def _fake_pinning(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``Tensor.pin_memory`` stood in for (a CPU-only torch) by a copy whose id goes into the list returned."""
    pinned: list[int] = []

    def fake_pin(self: Any) -> Any:
        out = self.clone()
        pinned.append(id(out))
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    return pinned


def _a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """An accelerator (CUDA) for the loader to pin for, on a CPU-only torch."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:  # (torch < 2.6: the DataLoader pins for CUDA only)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    else:
        monkeypatch.setattr(accelerator, "is_available", lambda: True)
        monkeypatch.setattr(accelerator, "current_accelerator", lambda *a: torch.device("cuda"))


@pytest.mark.parametrize("par", PARALLEL, ids=["inline", "threads", "procs"])
def test_pin_memory_without_a_device_warns_as_the_dataloader_does(ds: StoreDataset, par: dict[str, int],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``pin_memory=True`` where torch has no accelerator: the DataLoader's path warns that nothing is pinned;
    seqstore's own batches (no workers, ``threads=``, ``procs=``) were not pinned either, without a word.
    Both say so now, in torch's words, and the batches are those without ``pin_memory``."""
    accelerator = getattr(torch, "accelerator", None)
    if (accelerator.is_available() if accelerator is not None else torch.cuda.is_available()):
        pytest.skip("torch has an accelerator here")
    _workers_gather(monkeypatch)
    want = [b["index"].tolist() for b in _loader(ds, "greedy", 0, 1)]
    with pytest.warns(UserWarning, match="'pin_memory' argument is set as true but no accelerator is found"):
        got = [b["index"].tolist() for b in _loader(ds, "greedy", 0, 1, pin_memory=True, **par)]
    assert got == want
    with pytest.warns(UserWarning, match="'pin_memory' argument is set as true but no accelerator is found"):
        list(_loader(ds, "greedy", 0, 1, pin_memory=True, num_workers=1, procs=0))  # (the DataLoader's own words)


@pytest.mark.parametrize("par", PARALLEL, ids=["inline", "threads", "procs"])
def test_pin_memory_pins_every_batch(ds: StoreDataset, par: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``pin_memory=True`` and a device, every batch handed out is pinned (here: a CPU-only torch, so
    pinning is stood in for by a marked copy) and keeps its values."""
    _a_device(monkeypatch)
    pinned = _fake_pinning(monkeypatch)
    want = [b["index"].tolist() for b in _loader(ds, "greedy", 0, 1)]
    got = []
    for b in _loader(ds, "greedy", 0, 1, pin_memory=True, **par):
        assert all(id(t) in pinned for t in b.values())
        np.testing.assert_array_equal(b["x"][:, 0, 0].numpy(), b["index"].numpy())
        got.append(b["index"].tolist())
    assert got == want


class _Growing:
    """A batch of ``idx[0]`` KiB (float64 values ``idx[0]``); picklable, so the ring's workers get a copy."""

    def __call__(self, idx: np.ndarray) -> dict[str, Any]:
        return {"x": torch.full((int(idx[0]) * 128,), float(idx[0]), dtype=torch.float64)}


def test_procs_pin_memory_pins_batches_larger_than_their_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch larger than its slot (four times the first batch) comes over the pipe; with pin_memory it is
    pinned like every other batch (CPU-only torch: pinning stood in for by a marked copy)."""
    from seqstore.torch._ring import run_processes

    pinned = _fake_pinning(monkeypatch)
    _workers_gather(monkeypatch)
    gather = _Growing()
    sizes = [2, 3, 100, 200, 4]  # KiB; the slots hold 64 KiB
    got = list(run_processes(gather(np.array([1])), iter([np.array([k]) for k in sizes]), gather, 2,  # type: ignore[arg-type]
                             pin=True))
    assert [int(b["x"][0]) for b in got] == [1, *sizes]
    for b in got:
        assert id(b["x"]) in pinned and b["x"].shape == (int(b["x"][0]) * 128,)


@pytest.mark.parametrize("pin", [False, True], ids=["plain", "pin_memory"])
def test_procs_a_batch_larger_than_its_slot_is_held_once(monkeypatch: pytest.MonkeyPatch, pin: bool) -> None:
    """A batch larger than its slot comes over the pipe; the loop copied the bytes it received into a new
    buffer (and that into page-locked memory with pin_memory) and held both while the batch was out: twice
    the batch. Now the batch's tensors lie in the bytes received (one copy into page-locked memory)."""
    import tracemalloc

    from seqstore.torch._ring import run_processes

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self.clone())  # (CPU-only torch)
    _workers_gather(monkeypatch)
    gather = _Growing()
    size = 8000 * 1024  # bytes of the batch of index 8000; the slots hold 64 KiB
    batches = run_processes(gather(np.array([1])), iter([np.array([2]), np.array([8000])]), gather, 2,  # type: ignore[arg-type]
                            pin=pin)
    tracemalloc.start()
    try:
        next(batches), next(batches)
        before = tracemalloc.get_traced_memory()[0]
        big = next(batches)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert int(big["x"][0]) == 8000 and big["x"].shape == (8000 * 128,)
    assert held < 1.5 * size, held
    batches.close()


class _WithEmpty:
    """A batch of 64 KiB and an empty ragged field (B, 0, 3); picklable."""

    def __call__(self, idx: np.ndarray) -> dict[str, Any]:
        return {"x": torch.full((8192,), float(idx[0]), dtype=torch.float64), "y": torch.zeros((4, 0, 3))}


def test_procs_pin_memory_pins_empty_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """With pin_memory every tensor of a batch from the ring is pinned, a zero-element one (an empty ragged
    field) too (CPU-only torch: pinning stood in for by a marked copy)."""
    from seqstore.torch._ring import run_processes

    pinned = _fake_pinning(monkeypatch)
    _workers_gather(monkeypatch)
    gather = _WithEmpty()
    got = list(run_processes(gather(np.array([0])), iter([np.array([k]) for k in range(1, 7)]), gather, 2,  # type: ignore[arg-type]
                             pin=True))
    assert [int(b["x"][0]) for b in got] == list(range(7))
    for b in got:
        assert id(b["x"]) in pinned and id(b["y"]) in pinned and b["y"].shape == (4, 0, 3)


def test_procs_closing_with_large_batches_in_flight_lets_the_workers_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop closed while workers are sending batches larger than their slot (over the pipe, more than it
    holds) ends its workers at once: they see the loop gone and exit by themselves, not blocked on a send
    until they are terminated."""
    import multiprocessing

    from seqstore.torch._ring import run_processes

    _workers_gather(monkeypatch)
    gather = _Growing()
    batches = run_processes(gather(np.array([1])), iter([np.array([8000])] * 20), gather, 2)  # type: ignore[arg-type]
    next(batches)
    assert int(next(batches)["x"][0]) == 8000
    workers = [p for p in multiprocessing.active_children() if p.name == "seqstore-loader"]
    assert len(workers) == 2
    batches.close()
    assert [p.exitcode for p in workers] == [0, 0]


#: the start of the scripts below: the workers gather every batch after the first
_WORKERS = '''
import os
import sys
import time

import numpy as np
import torch

from seqstore.torch import _ring
from seqstore.torch._ring import run_processes


class Workers(_ring.Chooser):  # the workers gather every batch after the first
    def __init__(self) -> None:
        super().__init__()
        self.here = False

    def tick(self, *args: float) -> None:
        pass
'''

_BOTH_LARGE = _WORKERS + '''

def gather(idx: np.ndarray) -> dict:  # a batch of idx[0] KiB, whatever the number of indices
    return {"x": torch.full((int(idx[0]) * 128,), float(idx[0]), dtype=torch.float64)}


if __name__ == "__main__":
    arrays = [np.full(40000, 512 + k) for k in range(12)]  # 320 kB each; batches of 512 KiB, slots of 64 KiB
    got = [int(b["x"][0]) for b in run_processes(gather(np.array([1])), iter(arrays), gather, 2, chooser=Workers())]
    print(got)
'''


def _run_without_deadlock(script: Any, text: str) -> tuple[Any, str, str]:
    """Run ``text`` as the script ``script`` in a session of its own: (process, stdout, stderr); a run past
    two minutes (the loop and a worker each waiting on the other to read) kills its whole group and fails."""
    import os
    import signal
    import subprocess
    import sys

    script.write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the workers too
        proc.communicate()
        pytest.fail("the loop and a worker each waited on the other to read")
    return proc, out, err


def test_procs_large_index_arrays_and_batches_larger_than_their_slot_do_not_deadlock(tmp_path: Any) -> None:
    """An index array larger than the pipe holds, sent to a worker that is itself sending a batch larger than
    its slot (over the pipe, more than it holds): each side waited for the other to read, forever. The
    worker now reads what the loop sends while its large answer goes out."""
    proc, out, err = _run_without_deadlock(tmp_path / "both_large.py", _BOTH_LARGE)
    assert proc.returncode == 0, err
    assert out.strip() == str([1, *range(512, 524)])


_LARGE_ERROR = _WORKERS + '''

def gather(idx: np.ndarray) -> dict:  # an error larger than the pipe holds from batch 520 on
    if int(idx[0]) >= 520:
        raise ValueError("bad batch " + "x" * 300_000)
    return {"x": torch.full((16,), float(idx[0]), dtype=torch.float64)}


if __name__ == "__main__":
    arrays = [np.full(40000, 512 + k) for k in range(30)]  # 320 kB each: more than the pipe holds
    got = []
    try:
        for b in run_processes(gather(np.array([1])), iter(arrays), gather, 2, chooser=Workers()):
            got.append(int(b["x"][0]))
    except ValueError as e:
        print(str(e)[str(e).index("bad batch"):][:9], got)
'''


def test_procs_an_error_larger_than_the_pipe_is_raised_without_deadlock(tmp_path: Any) -> None:
    """A worker sending an error larger than the pipe holds (a long message) while the loop sent it an index
    array larger than the pipe holds: each waited for the other to read, for ever (only batches larger than
    their slot were sent while reading). The error is raised in the loop, the workers end quietly."""
    proc, out, err = _run_without_deadlock(tmp_path / "large_error.py", _LARGE_ERROR)
    assert proc.returncode == 0, err
    assert out.strip() == "bad batch " + str(list(range(512, 520))).replace("[", "[1, ")
    assert "Traceback" not in err, err


_STUCK_WITH_A_FULL_PIPE = _WORKERS + '''

def gather(idx: np.ndarray) -> dict:  # worker 0 is stuck in its first batch
    if int(idx[0]) == 512:
        time.sleep(600)
    return {"x": torch.full((16,), float(idx[0]), dtype=torch.float64)}


if __name__ == "__main__":
    arrays = [np.full(40000, 512 + k) for k in range(12)]  # 320 kB each: more than the pipe holds
    try:
        for b in run_processes(gather(np.array([1])), iter(arrays), gather, 2, chooser=Workers(), timeout=1):
            pass
    except _ring.LoaderWorkerError as e:
        print(e)
'''


def test_procs_timeout_covers_a_send_to_a_stuck_worker_whose_pipe_is_full(tmp_path: Any) -> None:
    """``timeout=`` bounded only the wait for a worker's answer: an index array larger than the pipe holds, sent
    to a worker stuck in its batch, waited for ever. The send is bounded too: a LoaderWorkerError naming the
    worker, and the stuck worker is ended."""
    proc, out, err = _run_without_deadlock(tmp_path / "stuck_full_pipe.py", _STUCK_WITH_A_FULL_PIPE)
    assert proc.returncode == 0, err
    assert "loader worker 0" in out and "in 1s" in out, out


_LOOP_KILLED = _WORKERS + '''

def gather(idx: np.ndarray) -> dict:  # slow: the workers are gathering when the loop's process is killed
    time.sleep(0.5)
    return {"x": torch.full((1024,), float(idx[0]))}


if __name__ == "__main__":
    batches = run_processes(gather(np.array([0])), iter([np.array([k]) for k in range(1, 40)]), gather, 2,
                            chooser=Workers())
    next(batches)
    next(batches)
    time.sleep(0.2)
    os.kill(os.getpid(), 9)
'''


def test_procs_workers_end_quietly_when_the_loops_process_is_killed(tmp_path: Any) -> None:
    """The loop's process killed (SIGKILL: the OOM killer, a preempted job) while its workers gather: each
    worker, failing to send its batch, took the broken pipe for an error of its gather, failed to send that
    too and printed three chained BrokenPipeError tracebacks. Now it sees the loop gone and ends quietly."""
    import os
    import subprocess
    import sys

    script = tmp_path / "loop_killed.py"
    script.write_text(_LOOP_KILLED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          timeout=120)  # (its stderr ends once the workers have: they hold it too)
    assert proc.returncode == -9
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


def test_threads_ctrl_c_in_a_gather_of_the_loops_thread_is_raised_at_once() -> None:
    """The loop's thread gathers later batches while it waits for the next one; a KeyboardInterrupt there
    (Ctrl-C) is raised at once, not kept with that batch while the earlier ones are still handed out.
    Ordinary exceptions still come when their batch is due."""
    from seqstore.torch._direct import run_ordered

    helper_busy, interrupted = threading.Event(), threading.Event()

    def gather(idx: np.ndarray) -> dict[str, Any]:
        if threading.current_thread() is threading.main_thread():
            if not interrupted.is_set():
                interrupted.set()
                raise KeyboardInterrupt
        else:  # the helper holds batch 0 until the loop's thread was interrupted
            helper_busy.set()
            interrupted.wait(10)
        return {"x": torch.from_numpy(idx)}

    def arrays() -> Any:
        yield np.array([0])
        helper_busy.wait(10)  # batch 0 is the helper's: the loop's thread takes batch 1 while it waits
        for k in range(1, 6):
            yield np.array([k])

    batches = run_ordered(arrays(), gather, 1)
    with pytest.raises(KeyboardInterrupt):
        next(batches)

    def failing(idx: np.ndarray) -> dict[str, Any]:
        if int(idx[0]) == 3:
            raise ValueError("batch 3")
        return {"x": torch.from_numpy(idx)}

    got = []
    with pytest.raises(ValueError, match="batch 3"):
        for b in run_ordered(iter([np.array([k]) for k in range(6)]), failing, 2):
            got.append(int(b["x"][0]))
    assert got == [0, 1, 2]


_SECOND_CTRL_C = '''
import os
import signal
import sys
import threading
import time

from seqstore.data import StoreDataset
from seqstore.torch import EpochSampler, SeqDataLoader, SeqDataset, collate_padded

interrupted = threading.Lock()


def joining() -> bool:
    """Whether the loop's thread waits in Thread.join (for the helpers to end)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        if frame.f_code.co_name == "join" and frame.f_code.co_filename == threading.__file__:
            return True
        frame = frame.f_back
    return False


class Interrupting(StoreDataset):  # a helper's first gather: Ctrl-C, and again once the loop waits for it
    def get_batch(self, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread() and interrupted.acquire(blocking=False):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                if joining():
                    break
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        return super().get_batch(*args, **kwargs)


if __name__ == "__main__":
    import seqstore.torch.loader
    seqstore.torch.loader.PARALLEL_FROM_BYTES = 0  # these batches are small: the helpers anyway
    ds = Interrupting(sys.argv[1], ordering="random", seed=1)
    loader = SeqDataLoader(SeqDataset(ds), sampler=EpochSampler(ds), batch_size=4, threads=2,
                           collate_fn=collate_padded)
    try:
        for _ in loader:
            time.sleep(0.1)  # the training step
    except KeyboardInterrupt:
        print("interrupted", sum(t.name.startswith("seqstore-loader") for t in threading.enumerate()))
'''


def test_threads_a_second_ctrl_c_while_the_helpers_end_is_ignored_quietly(tmp_path: Any) -> None:
    """Ctrl-C ends a threads= loop; a second one while it waits for its helper threads to finish their
    gathers cut that wait short (a helper left running) and, where the generator was closed by the garbage
    collector, printed "Exception ignored in generator" with a traceback."""
    import os
    import subprocess
    import sys

    path = tmp_path / "s.seqstore"
    make_store(path, 200, seed=3)
    script = tmp_path / "second_ctrl_c.py"
    script.write_text(_SECOND_CTRL_C)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["interrupted", "0"], done.stdout  # the helpers ended before the loop let go
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_an_error_drawing_a_later_batch_comes_after_the_batches_before_it() -> None:
    """threads= draws the next batches (and, on a remote store, runs of them: ahead_in_runs) ahead of
    those it hands out: a draw that fails is raised where its batch is due, after the batches before it."""
    from seqstore.errors import SeqstoreError
    from seqstore.torch._direct import ahead_in_runs, run_ordered

    def drawn() -> Any:
        yield from (np.full(4, k, np.int64) for k in range(10))
        raise SeqstoreError("planning batch 10 failed")

    def gather(idx: Any) -> dict[str, Any]:
        return {"x": torch.from_numpy(idx)}

    for make in (lambda: run_ordered(drawn(), gather, 2),
                 lambda: run_ordered(ahead_in_runs(drawn(), lambda run: None, 4), gather, 2),
                 lambda: map(gather, ahead_in_runs(drawn(), lambda run: None, 4))):
        got = []
        with pytest.raises(SeqstoreError, match="batch 10"):
            for batch in make():
                got.append(int(batch["x"][0]))
        assert got == list(range(10))
