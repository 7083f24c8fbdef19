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
