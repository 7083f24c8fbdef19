"""The Logger's host buffers and the jobs its training thread hands to its background thread
(log/logger.py)."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..store.directio import ALIGN

# A buffer's ids are Python strings until written, and the ids of written but uncommitted buffers
# are kept for keep_first: both are bounded by record count, not only by bytes, so that logs of tiny
# records (a loss per example) do not hold millions of Python objects.
MAX_BUFFER_RECORDS = 1 << 18
MAX_INFLIGHT_IDS = 1 << 20


def buffer_rows(flush_bytes: int, row_bytes: list[int], max_rows: int = MAX_BUFFER_RECORDS) -> int:
    """Records per buffer: as many as fit in ``flush_bytes`` (at most ``max_rows``), rounded down (when
    that leaves any) to a count that makes every unit's buffer a whole number of pages, so that one full
    buffer after another keeps each file's end page aligned for direct I/O."""
    cap = max(1, min(flush_bytes // max(sum(row_bytes), 1), max_rows))
    step = 1
    for rb in row_bytes:
        if rb:
            step = math.lcm(step, ALIGN // math.gcd(rb, ALIGN))
    return cap - cap % step if cap >= step else cap


def warm_up_kernels() -> None:
    """Call the id hashing/compare kernels once so their one-time load is not paid inside ``log``."""
    from ..store.ids import encode_ids, hash_kernel, id_equal

    data, off = encode_ids(["warm-up"])
    hash_kernel(data, off, np.zeros(1, dtype=np.uint64))  # directly: hash_ids would use numpy here
    res = np.zeros(1, dtype=np.bool_)
    id_equal(data, off, np.zeros(1, np.int64), data, off, np.zeros(1, np.int64), res)


@dataclass
class Buffer:
    """One host buffer: a ``(cap, *shape)`` array per storage unit (packed group or field)."""

    arrays: dict[str, np.ndarray[Any, Any]]
    cap: int
    n: int = 0
    ids: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    seq: int = 0
    free: bool = False  # set by the background thread when written
    # by the background thread: the rows the store's writer has taken, and whether the stats went in (an
    # automatic commit that failed may leave a buffer part written, to be finished after a commit succeeds)
    taken: int = 0
    counted: bool = False

    def reset(self, seq: int) -> None:
        self.n = self.taken = 0
        self.counted = False
        self.ids = []  # a new list: the training thread may still hold the old one
        self.stats = {}
        self.seq = seq


@dataclass
class Job:
    buffer: Buffer | None
    commit: bool
    done: threading.Event | None = None
    taken: bool = False  # by the background thread: a job queued twice (an interrupted handoff) runs once


STOP = Job(None, False)
