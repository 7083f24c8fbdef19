"""The shared slots of a ``procs=`` loop (:mod:`seqstore.torch._ring`): a batch handed out as views of a slot keeps
it until the last tensor over it goes, and a worker's answer is waited for within ``timeout`` to its end."""

from __future__ import annotations

import os
import types
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from seqstore.torch import _ring  # noqa: E402


class _Workers(_ring.Chooser):
    """The workers gather every batch after the first."""

    def __init__(self) -> None:
        super().__init__()
        self.here = False

    def tick(self, *args: float) -> None:
        pass


class _Filled:
    """A batch of 1 KiB of float64 values ``idx[0]`` (picklable: the workers get a copy)."""

    def __call__(self, idx: np.ndarray) -> dict[str, Any]:
        return {"x": torch.full((128,), float(idx[0]), dtype=torch.float64)}


def test_views_held_keep_their_slot_whatever_the_reference_counts_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot lent as views was taken for free from an exact ``sys.getrefcount`` of its memoryview: an
    interpreter that counts one reference fewer (3.14 borrows references on its stack) gave the slot back
    while the batch was held, and the worker overwrote it. Held batches now keep their values."""
    # (-2: the lambda's own argument, and the one reference fewer)
    fewer = types.SimpleNamespace(getrefcount=lambda obj: __import__("sys").getrefcount(obj) - 2)
    monkeypatch.setattr(_ring, "sys", fewer, raising=False)
    gather = _Filled()
    held = list(_ring.run_processes(gather(np.array([0])), iter([np.array([k]) for k in range(1, 12)]), gather, 1,
                                    depth=4, chooser=_Workers()))
    assert [sorted(set(b["x"].tolist())) for b in held] == [[float(k)] for k in range(12)]


def _in_shared_memory(ptr: int) -> bool:
    """Whether address ``ptr`` of this process lies in a mapping of a file in ``/dev/shm``."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)  # address range, permissions, offset, device, inode[, path]
            lo, hi = (int(a, 16) for a in parts[0].split("-"))
            if lo <= ptr < hi:
                return len(parts) == 6 and parts[5].startswith("/dev/shm/")
    return False


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps")
def test_batches_let_go_as_they_come_are_views_of_their_slots() -> None:
    """Batches dropped before the next one is taken give their slot back: each is handed out as views of
    the shared block (no copy), with its own values."""
    gather = _Filled()
    seen = []
    for b in _ring.run_processes(gather(np.array([0])), iter([np.array([k]) for k in range(1, 12)]), gather, 1,
                                 depth=3, chooser=_Workers()):
        seen.append((float(b["x"][0]), float(b["x"][-1]), _in_shared_memory(b["x"].data_ptr())))
        del b
    assert seen[1:] == [(float(k), float(k), True) for k in range(1, 12)]
