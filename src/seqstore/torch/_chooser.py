"""Who gathers the batches of a ``SeqDataLoader(num_workers=K)`` / ``procs=K`` loop: its worker
processes, or the loop's own process (used by :func:`~seqstore.torch._ring.run_processes`)."""

from __future__ import annotations

import os

__all__ = ["Chooser", "cores"]


class Chooser:
    """Who gathers the next batches of :func:`~seqstore.torch._ring.run_processes`: the workers, or the
    loop's own process.

    Where the training loop takes batches faster than the workers deliver them (no step, few cores), a
    batch gathered in the loop's process costs it less than the wait for a worker's: then it gathers them
    itself and the workers rest. The sides are compared by what the loop sees, the time from one batch
    to the next, over windows of ``window`` batches. It starts with the loop's process for ``first``
    windows, tries the workers for a window, and keeps the faster side for ``stay`` windows, twice as
    long each time a trial confirms it (at most ``longest``); then the other side is tried again (a step
    that appears, or other work on the machine, moves the balance).

    A side is only tried where it could win. The loop's process: where the loop waited on the workers
    for more than a fifth of a window. The workers: where there is a core for them besides the loop's
    (``spare``), where the loop spends more than a fifth of a window outside (a training step the workers
    can hide), or where the loop's own gathers spend more than a fifth of their time waiting (on the
    disk: the workers' reads would overlap). Otherwise the workers only add a hand-over to the same CPU."""

    def __init__(self, window: int = 32, stay: int = 8, longest: int = 256, first: int = 1, spare: bool = True) -> None:
        self.window, self.stay, self.longest, self.spare = window, stay, longest, spare
        self.here = True  # whether the loop's process gathers the batches
        self.trial = False  # whether the current window tries ``here`` against the other side
        self.left = first  # windows before the other side may be tried
        self.hold = stay  # windows the side that won the last trial is kept
        self.last: dict[bool, float] = {}  # seconds per batch of the last window of each side
        self.restart()

    def restart(self, skip: int = 0) -> None:
        """Count a new window from the batch after the next ``skip`` (the workers' first batches after they
        were resting: the pipeline fills)."""
        self.count, self.spent, self.busy, self.idle, self.ignore = 0, 0.0, 0.0, 0.0, skip

    def tick(self, spent: float, busy: float, idle: float = 0.0) -> None:
        """One batch of the current side: ``spent`` seconds since the previous one, ``busy`` of them in the
        loader (waiting on a worker, or gathering here), ``idle`` of those not on this thread's CPU."""
        if self.ignore:
            self.ignore -= 1
            return
        self.count += 1
        self.spent += spent
        self.busy += busy
        self.idle += idle
        if self.count < self.window:
            return
        per = self.spent / self.count
        if self.here:
            worth = self.spare or self.spent - self.busy > self.spent / 5 or self.idle > self.busy / 5
        else:
            worth = self.busy > self.spent / 5
        self.restart()
        self.last[self.here] = per
        if self.trial:  # keep the faster side
            self.trial = False
            if per >= self.last.get(not self.here, float("inf")):  # confirmed: kept longer each time
                self.here = not self.here
                self.left, self.hold = self.hold, min(2 * self.hold, self.longest)
            else:
                self.left = self.hold = self.stay
            return
        self.left -= 1
        if self.left <= 0 and worth:
            self.here, self.trial = not self.here, True


def cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
