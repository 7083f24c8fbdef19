"""The Logger's host buffers and the jobs its training thread hands to its background thread
(log/logger.py)."""

from __future__ import annotations

import math
import numbers
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import AutoCommitError, SchemaError
from ..store.directio import ALIGN
from ..store.writer import Writer

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
    added: int = 0  # by the training thread: the first rows whose ids are in flight (LoggedIds.add)

    def reset(self, seq: int) -> None:
        self.n = self.taken = self.added = 0
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


def check_options(path: Any, flush_bytes: float, commit_every_s: float, shard_bytes: float, packed: Any,
                  metadata: Any, rank: int | None) -> None:
    """The checks of a Logger's options: ValueError/TypeError naming the log and the option."""
    where = os.fspath(path)
    for name, v in (("flush_bytes", flush_bytes), ("commit_every_s", commit_every_s), ("shard_bytes", shard_bytes)):
        if (isinstance(v, bool) or not isinstance(v, numbers.Real) or not v > 0  # (nan: no timed commit ever)
                or (name != "commit_every_s" and not math.isfinite(v))):  # (a count of bytes)
            raise ValueError(f"Logger {where}: {name} must be a positive number, got {v!r}")
    for option, given, ok, what in (
            ("packed", packed, isinstance(packed, (bool, Mapping)), "True, False or {group: [fields]}"),
            ("metadata", metadata, metadata is None or isinstance(metadata, Mapping), "a dict"),
            ("rank", rank, rank is None or isinstance(rank, numbers.Integral) and not isinstance(rank, bool),
             "an int >= 0")):
        if not ok:
            raise TypeError(f"Logger {where}: {option}={given!r}: expected {what}")
    if rank is not None and rank < 0:  # (its counts would go to stats["rank--1/records"])
        raise ValueError(f"Logger {where}: rank={rank!r}: expected an int >= 0")


def write_buffer(writer: Writer, buf: Buffer, rank: int) -> None:
    """Write one buffer's records into the writer's current shard (no commit), in the Logger's background
    thread. After an automatic commit that failed part way, only the rows the writer did not take."""
    stats = dict(buf.stats)
    if buf.n:  # the rows that went in, exactly (an interrupted log() counts only those)
        key = f"rank-{rank}/records"
        stats[key] = stats.get(key, 0) + buf.n
    if stats and not buf.counted:
        writer.add_stats(stats)
    buf.counted = True
    if buf.n > buf.taken:
        columns = {name: arr[buf.taken : buf.n] for name, arr in buf.arrays.items()}
        try:
            writer.append_batch(columns, ids=buf.ids[buf.taken : buf.n])
        except AutoCommitError as exc:  # never append again what the writer took
            buf.taken += exc.taken
            raise
        buf.taken = buf.n


def writer_intact(writer: Writer | None, exc: BaseException) -> bool:
    """After ``exc`` from the writer's commit: whether the writer still holds its records (a commit that
    failed with the records intact leaves it usable: its next commit retries)."""
    return (isinstance(exc, Exception) and not isinstance(exc, SchemaError)  # (a shard the writer dropped)
            and writer is not None and writer.usable)
