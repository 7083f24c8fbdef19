"""Whether calling a numba kernel now would wait for numba's start-up on another thread.

The first kernel a process calls loads numba's registries and the kernel's cache entry (0.2-0.3 s on a
small machine). ``import seqstore.torch`` does that on a thread (:mod:`seqstore.torch._warm`) so that
the training script's own start-up hides it; until that thread is done, a kernel that is not loaded yet
waits for it on numba's compiler lock. The kernels of a first batch (a ``random`` order's ``take``, the
gathers) have NumPy twins that compute the same bytes: callers use them in that window rather than wait.
"""

from __future__ import annotations

from typing import Any

from numba.core.compiler_lock import global_compiler_lock

__all__ = ["would_wait"]


def would_wait(kernel: Any) -> bool:
    """Whether ``kernel`` (a numba dispatcher) is not loaded in this process while another thread holds
    numba's compiler lock (loading or compiling). False where numba's lock is not where it is expected."""
    if kernel.overloads:
        return False
    lock = getattr(global_compiler_lock, "_lock", None)
    if lock is None:
        return False
    if not lock.acquire(blocking=False):
        return True
    lock.release()
    return False
