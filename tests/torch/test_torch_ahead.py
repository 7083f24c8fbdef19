"""``SeqDataLoader(procs=K)`` workers get the index arrays of later runs of batches early (``ahead``), so
that a remote store's reads of those batches are in flight while a worker gathers (seqstore.torch._ring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_testlib import LoggedGatherer, make_store  # noqa: E402

import seqstore  # noqa: E402
from seqstore.data import StoreDataset  # noqa: E402
from seqstore.torch import IterableSeqDataset  # noqa: E402
from seqstore.torch._direct import Gatherer  # noqa: E402
from seqstore.torch._ring import run_processes  # noqa: E402


def test_workers_start_the_reads_of_the_batches_sent_ahead_before_they_gather_them(tmp_path: Path) -> None:
    make_store(tmp_path / "s.seqstore", 400)
    ds = IterableSeqDataset(StoreDataset(seqstore.open(tmp_path / "s.seqstore")), batch=8)
    log = tmp_path / "log"
    gather = LoggedGatherer(Gatherer(ds), log)
    arrays = [np.arange(a, a + 8, dtype=np.int64) for a in range(0, 400, 8)]
    want = [gather.gather(a) for a in arrays]
    log.write_text("")
    got = list(run_processes(want[0], iter(arrays[1:]), gather, 2, context="forkserver", ahead=6))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys() and all(torch.equal(g[k], w[k]) for k in w)
    lines = log.read_text().split("\n")
    where = {line: k for k, line in enumerate(lines)}
    # every batch after the first (gathered by the caller) was sent ahead to its worker in its run of 6,
    # once, and its reads started before it was gathered
    for a in arrays[1:]:
        assert where[f"prefetch {a[0]}"] < where[f"gather {a[0]}"], a[0]
    assert sum(line.startswith("prefetch") for line in lines) == len(arrays) - 1


def _own_collate(records: Any) -> Any:  # (not seqstore's: the DataLoader's path, with the dataset's read-ahead)
    from seqstore.torch import collate_padded

    return collate_padded(records)


class _OwnDataset:
    """A dataset of one's own over a store's (the protocol's methods, no ``iter_batches``): the loader
    asks for its next batches' reads itself (``prefetch``)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in ("iter_batches", "__getstate__", "__setstate__"):
            raise AttributeError(name)
        return getattr(self._inner, name)


@pytest.mark.parametrize("helpers", [{"threads": 2}, {"procs": 2}, {"collate_fn": _own_collate}, {"own": True}, {},
                                     {"once": True}, {"once": True, "procs": 2}])
def test_a_failed_read_ahead_surfaces_at_its_own_batch_after_the_earlier_ones(
        helpers: dict[str, Any], moto_s3: Any, s3_bucket: str, s3_proxy: Any, tmp_path: Path) -> None:
    """The batches read ahead on a remote store (in runs with threads= / procs=; by SeqDataset's replay
    of the sampler on the DataLoader's path; by the loader for a dataset without ``iter_batches``): a read
    that is refused (shard 6, records 1200 on) is raised where its batch is due, after the 24 batches
    before it were handed out, not when the read-ahead asked for it; so without helpers (the store's own
    read-ahead), and on a read-once store (runs of batches fetched into memory)."""
    from seqstore.torch import EpochSampler, SeqDataLoader, SeqDataset, collate_padded

    make_store(tmp_path / "s.seqstore", 2000, shard_records=200, max_len=400)
    url = moto_s3.upload_dir(tmp_path / "s.seqstore", s3_bucket, "a/s.seqstore")
    once = {"read_once": "true"} if helpers.pop("once", False) else {}
    store = seqstore.open(url, storage_options=moto_s3.storage_options(s3_proxy.url, **once), cache_dir=tmp_path / "c")
    ds: Any = StoreDataset(store, ordering="default")
    if helpers.pop("own", False):
        ds = _OwnDataset(ds)
    s3_proxy.forbid(path="shard-000006")
    loader = SeqDataLoader(SeqDataset(ds), sampler=EpochSampler(ds), batch_size=50,
                           **{"collate_fn": collate_padded, **helpers})
    got = []
    with pytest.raises(seqstore.errors.SeqstoreError, match="shard-000006"):
        for batch in loader:
            got.append(int(batch["x"][0, 0, 0]))
    assert got == list(range(0, 1200, 50))


@pytest.mark.parametrize("here", [False, True])
def test_an_error_drawing_a_later_batch_comes_after_the_batches_before_it(tmp_path: Path, here: bool) -> None:
    """The ring draws the workers' next batches ahead of those it hands out (a read-once store's runs
    are fetched as they are drawn): a draw that fails is raised where its batch is due, after every batch
    drawn before it was handed out, whoever gathers them."""
    from seqstore.errors import SeqstoreError
    from seqstore.torch._chooser import Chooser

    make_store(tmp_path / "s.seqstore", 400, max_len=400)
    gather = Gatherer(IterableSeqDataset(StoreDataset(seqstore.open(tmp_path / "s.seqstore")), batch=8))
    arrays = [np.arange(a, a + 8, dtype=np.int64) for a in range(0, 400, 8)]

    def drawn() -> Any:
        yield from arrays[1:11]
        raise SeqstoreError("the fetch of batch 11 failed")

    chooser = Chooser(window=1 << 30)  # (never changes sides)
    chooser.here = here
    got = []
    with pytest.raises(SeqstoreError, match="batch 11"):
        for batch in run_processes(gather(arrays[0]), drawn(), gather, 2, context="forkserver", chooser=chooser):
            got.append(int(batch["x"][0, 0, 0]))
    assert got == [int(a[0]) for a in arrays[:11]]


class _SlowAhead:
    """A gatherer for the ring: a batch is its first index; the reads asked ahead for a run whose first
    batch starts with -1 take ``wait`` seconds (a worker busy that long, its pipe left to fill)."""

    def __init__(self, wait: float) -> None:
        self.wait = wait

    def __call__(self, idx: Any) -> dict[str, Any]:
        return {"i": torch.from_numpy(np.asarray(idx[:1], dtype=np.int64).copy())}

    def prefetch(self, run: Any) -> None:
        if int(run[0][0]) == -1:
            import time

            time.sleep(self.wait)


def test_a_timed_out_send_ahead_leaves_the_worker_refused_with_a_named_error() -> None:
    """A run's index arrays sent ahead to a worker busy longer than ``timeout`` (larger than its pipe
    holds): the send gave up with the message written in part, and the timeout was swallowed (the
    read-ahead is advice); the next message was then written after the partial one, and a worker that
    recovered read a corrupt message. Now that worker's pipe is not written to again: the next batch
    for it is refused with a LoaderWorkerError saying it timed out, and the worker is ended."""
    from seqstore.torch._signals import LoaderWorkerError

    gather = _SlowAhead(wait=0.5)
    arrays = [np.full(8, -1, np.int64), np.zeros(1 << 18, np.int64)] + [np.arange(8, dtype=np.int64)] * 4
    ring = run_processes(gather(np.zeros(1, np.int64)), iter(arrays), gather, 1, context="forkserver", ahead=1,
                         timeout=0.3)
    with pytest.raises(LoaderWorkerError, match=r"loader worker 0 .*timed out earlier.*0\.3s"):
        list(ring)


def _wait_for(path: Path) -> None:
    import time

    end = time.monotonic() + 20
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.005)


class _SlowBig:
    """A gatherer for the ring: a batch is its first index, except one whose first index is -2: that makes
    the file ``busy``, waits until the file ``go`` exists and is larger than a slot and the pipe (its answer
    comes over the pipe in parts); the batch from index 8 waits for ``busy``."""

    def __init__(self, where: Path) -> None:
        self.busy, self.go = where / "busy", where / "go"

    def __call__(self, idx: Any) -> dict[str, Any]:
        if int(idx[0]) == -2:
            self.busy.touch()
            _wait_for(self.go)
            return {"i": torch.zeros(1 << 17, dtype=torch.int64)}
        if int(idx[0]) == 8:
            _wait_for(self.busy)
        return {"i": torch.from_numpy(np.asarray(idx[:1], dtype=np.int64).copy())}

    def prefetch(self, run: Any) -> None:
        pass


def test_a_worker_whose_send_ahead_timed_out_is_not_waited_on_for_ever(tmp_path: Path) -> None:
    """Worker 1 busy with a large batch longer than ``timeout`` while the reads of a later run were sent
    ahead to it: that send gave up part way. The loop then waited for worker 1's large batch, which the
    worker had begun to send when it found the partial message on its pipe and waited for its rest: each
    waited for the other for ever, whatever the timeout. Now the batch due from that worker is a
    LoaderWorkerError saying it timed out, after the batches before it."""
    import threading

    from seqstore.torch._signals import LoaderWorkerError

    gather = _SlowBig(tmp_path)
    small = [np.arange(k, k + 8, dtype=np.int64) for k in range(0, 80, 8)]
    # worker 0: batches 1, 3, 5; worker 1: batch 2 (large, done once the loop has handed out batch 1), then
    # 4 and 6, whose reads go ahead in one message larger than the pipe, sent once batch 1 came (after
    # worker 1 began batch 2)
    arrays = [small[1], np.full(8, -2, np.int64), small[3], small[4], small[5],
              np.arange(1 << 15, dtype=np.int64)] + small[7:]
    got: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            # (forked: the workers start at once, inside the timeout of the first batch)
            for batch in run_processes(gather(small[0]), iter(arrays), gather, 2, depth=1, context="fork",
                                       ahead=2, timeout=0.3):
                got.append(int(batch["i"][0]))
                if got[-1] == 8:  # (the send ahead to worker 1 timed out before batch 1 was handed out)
                    gather.go.touch()
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    loop = threading.Thread(target=run, daemon=True)
    loop.start()
    loop.join(15)
    if loop.is_alive():  # (the loop and worker 1 wait for each other: end the workers, then fail)
        import multiprocessing

        for p in multiprocessing.active_children():
            p.kill()
        loop.join(10)
        pytest.fail("the loop waited for ever on a worker whose send ahead timed out")
    assert len(errors) == 1 and isinstance(errors[0], LoaderWorkerError), (errors, got)
    assert "loader worker 1" in str(errors[0]) and "timed out earlier" in str(errors[0])
    assert got == [0, 8]
