"""Numba's start-up, begun at import on a helper thread.

The first numba kernel a process calls -- even one loaded from numba's on-disk cache -- first loads
numba's typing and target registries: 0.2-0.3 s on a small machine, which the first sample of an epoch
would otherwise wait for. ``import seqstore.torch`` starts that work (and loads the ``random`` order's
kernel) on a thread, so it runs while the training script goes on importing torch and building its
model. ``SEQSTORE_WARMUP=0`` in the environment turns it off. A ``fork()`` waits for the thread first
(a lock held across fork() would stay held in the child); the thread is not a daemon, so a script that
ends at once waits for it (well under a second).
"""

from __future__ import annotations

import contextlib
import os
import threading

from .._numba_start import loading_on

__all__ = ["start_warmup", "wait_warmup", "warm_up"]

_thread: threading.Thread | None = None


def warm_up() -> None:
    """What the thread does: numba's registries, and the kernel of a ``random`` order's ``take``."""
    import numpy as np

    from ..order import seq_order

    seq_order(16, "random", epoch=1).take(np.arange(2, dtype=np.int64))


def _run() -> None:
    with contextlib.suppress(Exception):  # best effort: the first real call reports what is wrong
        warm_up()


def start_warmup() -> None:
    """Start the warm-up thread once per process (not with ``SEQSTORE_WARMUP=0``)."""
    global _thread
    if _thread is not None or os.environ.get("SEQSTORE_WARMUP", "1").strip() == "0":
        return
    _thread = threading.Thread(target=_run, name="seqstore-warmup")
    os.register_at_fork(before=wait_warmup)
    _thread.start()
    loading_on(_thread)  # a first batch computes in NumPy meanwhile (seqstore._numba_start)


def wait_warmup() -> None:
    """Wait until the warm-up thread (if any) is done."""
    t = _thread
    if t is not None and t is not threading.current_thread() and t.is_alive():
        t.join()


start_warmup()
