"""``SeqDataLoader(procs=K)`` workers get the index arrays of later runs of batches early (``ahead``), so
that a remote store's reads of those batches are in flight while a worker gathers (seqstore.torch._ring)."""

from __future__ import annotations

from pathlib import Path

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
