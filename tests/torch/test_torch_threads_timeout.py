"""``SeqDataLoader(threads=K, timeout=T)``: a helper thread stuck in a batch's read is an error after ``T``
seconds, as a stuck worker process is with ``procs=`` (no ``timeout``: the loop waits, as before)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_testlib import make_store  # noqa: E402

from seqstore.data import StoreDataset  # noqa: E402
from seqstore.errors import SeqstoreError  # noqa: E402
from seqstore.torch import EpochSampler, SeqDataLoader, SeqDataset, collate_padded  # noqa: E402


def test_threads_timeout_bounds_the_wait_for_a_stuck_helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``timeout=`` went unused with ``threads=``: a read that hung in a helper thread hung the training
    loop for ever. Now the loop raises a SeqstoreError naming the timeout, and lets the stuck helper be."""
    monkeypatch.setattr("seqstore.torch.loader.PARALLEL_FROM_BYTES", 0)  # (small batches: the helpers anyway)
    path = tmp_path / "s.seqstore"
    make_store(path, 40)
    release = threading.Event()

    class Stuck(StoreDataset):  # every read in a helper thread hangs (until the test ends)
        def get_batch(self, *args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name.startswith("seqstore-loader"):
                release.wait(30)
            return super().get_batch(*args, **kwargs)

    ds = Stuck(path, ordering="random", seed=1)
    loader = SeqDataLoader(SeqDataset(ds), sampler=EpochSampler(ds), batch_size=2, threads=2, timeout=0.2,
                           collate_fn=collate_padded)
    got = 0
    try:
        with pytest.raises(SeqstoreError, match="0.2s"):
            for _ in loader:
                got += 1
    finally:
        release.set()
    assert got < 20
