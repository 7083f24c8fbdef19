"""Position arithmetic shared by the samplers and the iterable dataset (no torch in here).

Everything is expressed over the *global* epoch order (length ``L``) from a resume point ``position``
(records of the order already consumed, a prefix). Consumers are ``S = W x K`` streams: rank ``r`` of
``W`` times DataLoader worker ``w`` of ``K`` (``K = 1`` for a sampler) is stream ``w * W + r``. Global
*item* ``j`` (a record, ``B`` consecutive records, or a length-based batch), counted from the resume
point, goes to stream ``j mod S``; a DataLoader reads a rank's workers round-robin, so the rank's
``k``-th item is global item ``k * W + r`` and ranks in lockstep have together consumed a prefix.

The tail is padded so that every rank gets the same number of items (fixed-size items: by repeating the
epoch order from its start, like ``DistributedSampler``; length-based batches: by repeating the first
batches), or cut (``drop_last``). docs/torch.md ("How positions are split") has the details. Memory:
O(chunk) positions at a time; O(W) held batches for padding / look-ahead.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ..data._lengths import check_int, check_optional_int
from ..data.batching import batch_indices, bucket_batches
from ..order._keys import master_key

__all__ = ["LengthBatching", "fixed_total", "fixed_item_positions", "fixed_item_blocks", "fixed_stream_positions",
           "select_items", "batch_stream", "GreedyCursor", "bucket_seed"]

IntArray = npt.NDArray[np.int64]
T = TypeVar("T")


@dataclass(frozen=True)
class LengthBatching:
    """Length-based batching: greedy (:func:`seqstore.data.batch_indices`) or bucketed
    (:func:`seqstore.data.bucket_batches`) batches over the global epoch order.

    ``max_frames``: frame budget of one batch (``max length x count`` when ``padded``, else the sum
    of lengths). ``max_seqs``: most sequences per batch. At least one of the two is required.
    ``buckets``: None for greedy batches in order; a number of buckets or ascending length boundaries
    for bucketing with a shuffle buffer of ``buffer_size`` sequences (seeded per epoch from the
    dataset seed). Greedy batches resume in O(1) from a record position; bucketed batches resume by
    recomputing the batch boundaries of the epoch up to the resume point (index arithmetic only, no
    record is read; O(position) time, O(buffer_size) memory).
    """

    max_frames: int | None = None
    max_seqs: int | None = None
    padded: bool = True
    buckets: int | tuple[float, ...] | None = None
    buffer_size: int = 10_000

    def __post_init__(self) -> None:
        # plain ints kept (NumPy integers are accepted): a resume state records config(), JSON and torch.load safe
        for name in ("max_frames", "max_seqs"):
            object.__setattr__(self, name, check_optional_int(getattr(self, name), f"LengthBatching: {name}", 1))
        if self.max_frames is None and self.max_seqs is None:
            raise ValueError("LengthBatching needs max_frames or max_seqs (or both)")
        object.__setattr__(self, "buffer_size", check_int(self.buffer_size, "LengthBatching: buffer_size", 1))
        if self.buckets is not None:
            object.__setattr__(self, "buckets", _buckets(self.buckets))

    @property
    def greedy(self) -> bool:
        """True for greedy batches in order (resumable from a record position)."""
        return self.buckets is None

    def config(self) -> dict[str, Any]:
        """JSON-encodable description (stored in resume states)."""
        buckets: Any = self.buckets if self.buckets is None or isinstance(self.buckets, int) else list(self.buckets)
        return {"max_frames": self.max_frames, "max_seqs": self.max_seqs, "padded": bool(self.padded),
                "buckets": buckets, "buffer_size": int(self.buffer_size)}


def _buckets(value: Any) -> int | tuple[float, ...]:
    """``buckets`` of :class:`LengthBatching` as plain Python numbers: a count (an integer >= 1), or length
    boundaries (any iterable of ints or floats, strictly ascending, kept as given); else a ValueError."""
    expected = "LengthBatching: buckets must be a number of buckets (an integer >= 1) or ascending length boundaries"
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        if value < 1:
            raise ValueError(f"{expected}, got {value!r}")
        return int(value)
    if not isinstance(value, Iterable) or isinstance(value, (str, bytes, bytearray)):
        raise ValueError(f"{expected}, got {value!r}")
    items = list(value)
    edges = np.asarray(items) if items else np.empty(0, np.int64)
    if any(isinstance(b, (bool, np.bool_)) for b in items) or edges.ndim != 1 or edges.dtype.kind not in "iuf" \
            or (edges.dtype.kind == "f" and bool(np.isnan(edges).any())):
        raise ValueError(f"{expected}, got {value!r}")
    if bool(np.any(edges[1:] <= edges[:-1])):
        raise ValueError(f"LengthBatching: buckets as boundaries must be strictly ascending, got {edges.tolist()}")
    return tuple(edges.tolist())


# ----------------------------------------------------------------------------- fixed-size items


def fixed_total(remaining: int, item: int, world: int, drop_last: bool) -> int:
    """Records (real + padding) the ranks read from ``remaining`` records in items of ``item`` records:
    a multiple of ``item * world``, rounded up (padding) or down (``drop_last``). O(1)."""
    if remaining <= 0:
        return 0
    unit = item * world
    return (remaining // unit if drop_last else -(-remaining // unit)) * unit


def _positions(q: IntArray, position: int, remaining: int, length: int) -> IntArray:
    """Relative positions ``q`` -> order positions: real ``position + q`` or padding ``(q - rem) mod L``."""
    out = q + position
    pad = q >= remaining
    if pad.any():
        out[pad] = (q[pad] - remaining) % length
    return out


def fixed_stream_positions(length: int, position: int, *, world: int, streams: int, stream: int, drop_last: bool,
                           chunk: int) -> Iterator[IntArray]:
    """Order positions of single records for ``stream`` of ``streams`` (item size 1), in chunks.

    Stream ``s`` takes relative positions ``s, s + S, s + 2S, ...`` below :func:`fixed_total`. Yields
    int64 arrays of at most ``chunk`` positions; memory O(chunk).
    """
    remaining = max(length - position, 0)
    total = fixed_total(remaining, 1, world, drop_last)
    step = streams * chunk
    for q0 in range(stream, total, step):
        q = np.arange(q0, min(total, q0 + step), streams, dtype=np.int64)
        yield _positions(q, position, remaining, length)


def fixed_item_positions(length: int, position: int, *, item: int, world: int, streams: int, stream: int,
                         drop_last: bool) -> Iterator[IntArray]:
    """Order positions of the items (``item`` consecutive records each) of ``stream`` of ``streams``.

    Yields one int64 array of exactly ``item`` positions per item; O(item) memory.
    """
    remaining = max(length - position, 0)
    total = fixed_total(remaining, item, world, drop_last)
    for j in range(stream, total // item, streams):
        q = np.arange(j * item, (j + 1) * item, dtype=np.int64)
        yield _positions(q, position, remaining, length)


def fixed_item_blocks(length: int, position: int, *, item: int, world: int, streams: int, stream: int,
                      drop_last: bool, items: int) -> Iterator[IntArray]:
    """:func:`fixed_item_positions` of ``items`` consecutive items of ``stream`` at once: one int64 array
    of ``items * item`` positions per block (the last block may hold fewer items). O(items * item) memory."""
    remaining = max(length - position, 0)
    total = fixed_total(remaining, item, world, drop_last)
    within = np.arange(item, dtype=np.int64)
    step = streams * items
    for j0 in range(stream, total // item, step):
        js = np.arange(j0, min(total // item, j0 + step), streams, dtype=np.int64)
        q = (js[:, None] * item + within).reshape(-1)
        yield _positions(q, position, remaining, length)


# ---------------------------------------------------------------------------- length-based items


def select_items(items: Iterable[T], *, world: int, streams: int, stream: int, drop_last: bool) -> Iterator[T]:
    """The items of ``stream`` (global item ``j`` goes to stream ``j mod streams``) from a stream of
    unknown length, padded (repeating its first items) or cut (``drop_last``) to a multiple of ``world``.

    Holds at most ``world - 1`` items for padding and ``streams // world`` for the look-ahead.
    """
    first: list[T] = []
    held: list[T] = []
    count = 0
    for j, it in enumerate(items):
        if len(first) < world - 1:
            first.append(it)
        mine = j % streams == stream
        if drop_last:
            if mine:
                held.append(it)
            if j % world == world - 1:  # the block of `world` items holding j is complete
                yield from held
                held.clear()
        elif mine:
            yield it
        count = j + 1
    if drop_last or count == 0 or count % world == 0:
        return
    padded = -(-count // world) * world
    for j in range(count, padded):
        if j % streams == stream:
            yield first[(j - count) % count]


def bucket_seed(seed: int, epoch: int) -> int:
    """The bucket-buffer seed of ``epoch``: the order layer's stable key of (dataset seed, epoch) for
    stream ``"torch.bucket"`` (:func:`seqstore.order._keys.master_key`), cut to 63 bits. O(1)."""
    return master_key(seed, epoch, "torch.bucket") & ((1 << 63) - 1)


def batch_stream(order: Any, lengths: Any, spec: LengthBatching, *, position: int, skip: int,
                 seed: int) -> Iterator[IntArray]:
    """Global length-based batches (int64 arrays of dataset indices) of the records from ``position``
    on of ``order``, after skipping the first ``skip`` batches. (Bucketed batching started at
    ``position`` buckets the remaining records afresh; its own states keep the position where its run
    started and count batches after it.) Lazy; memory O(chunk + buffer_size)."""
    rest = order[position:] if position else order
    if spec.greedy:
        it: Iterator[IntArray] = batch_indices(rest, lengths, max_frames=spec.max_frames, max_seqs=spec.max_seqs,
                                               padded=spec.padded)
    else:
        it = bucket_batches(rest, lengths, buckets=spec.buckets, buffer_size=spec.buffer_size,
                            max_frames=spec.max_frames, max_seqs=spec.max_seqs, padded=spec.padded, seed=seed)
    return itertools.islice(it, skip, None) if skip else it


class GreedyCursor:
    """Walks greedy batches from a record position to turn "batches consumed" into a record position.

    Greedy batching restarted at a batch boundary yields the same batches as the uninterrupted run
    (its state resets at every cut), so a record position is a complete resume state. ``advance(n)``
    moves ``n`` batches on (incrementally: a checkpoint costs the batches since the last one).
    Memory O(chunk).
    """

    def __init__(self, order: Any, lengths: Any, spec: LengthBatching, position: int) -> None:
        self._it = batch_stream(order, lengths, spec, position=position, skip=0, seed=0)
        self.position, self.batches, self.length = position, 0, len(order)

    def advance_to(self, batches: int) -> int:
        """Record position after ``batches`` batches from the start (the end of the order if fewer)."""
        if batches < self.batches:
            raise ValueError(f"cursor is at batch {self.batches}, cannot go back to {batches}")
        while self.batches < batches:
            b = next(self._it, None)
            if b is None:
                self.position = self.length
                self.batches = batches
                break
            self.position += len(b)
            self.batches += 1
        return self.position
