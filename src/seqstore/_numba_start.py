"""Whether calling a numba kernel now would wait for numba's start-up on another thread.

The first kernel a process calls loads numba's registries and the kernel's cache entry (0.2-0.3 s on a
small machine). ``import seqstore.torch`` does that on a thread (:mod:`seqstore.torch._warm`, which
registers it here) so that the training script's own start-up hides it; until that thread is done, a
kernel that is not loaded yet waits for it on numba's compiler lock. The kernels of a first batch (a
``random`` order's ``take``, the gathers) have NumPy twins that compute the same bytes: callers use them
in that window rather than wait.

The window is short on purpose (:data:`GRACE_S` from the first call that did not wait): the twins cost
more per call than the kernels, and a thread busy with them takes the GIL from the thread loading numba,
so that a loop that went on with them would slow down for as long as it did. After it, callers wait.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from numba.core.compiler_lock import global_compiler_lock

__all__ = ["GRACE_S", "loading_on", "would_wait"]

#: seconds after the first call that did not wait in which others may not wait either
GRACE_S = 0.05
_first: list[float] = []
_loader: list[threading.Thread] = []


def loading_on(thread: threading.Thread) -> None:
    """Say that ``thread`` is starting numba (its kernels are to be waited for only after :data:`GRACE_S`)."""
    _loader[:] = [thread]


def would_wait(kernel: Any) -> bool:
    """Whether ``kernel`` (a numba dispatcher) is not loaded in this process while another thread is
    starting numba (the registered one, or any holding numba's compiler lock), within :data:`GRACE_S` of
    the first time this said so."""
    if kernel.overloads or (_first and time.monotonic() - _first[0] > GRACE_S):
        return False
    busy = bool(_loader) and _loader[0].is_alive() and _loader[0] is not threading.current_thread()
    lock = getattr(global_compiler_lock, "_lock", None)
    if not busy and lock is not None:
        busy = not lock.acquire(blocking=False)
        if not busy:
            lock.release()
    if busy and not _first:
        _first.append(time.monotonic())
    return busy
