"""Streams: a tf.data-style shuffle buffer over any iterable, and endless sampling with replacement.

Both are deterministic functions of their seed and resumable exactly through ``state_dict()`` /
``load_state_dict()``; their randomness is counter-based (draw ``k`` is a hash of (seed, k)), so the
state is a few integers (plus, for :func:`shuffle_buffer`, the buffered items: O(size), by design).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..order import Order, seq_order
from ..order._keys import mix64
from ._lengths import IntArray, check_int

__all__ = ["ShuffleBuffer", "ReplacementSampler", "shuffle_buffer", "sample_with_replacement"]

_MASK = (1 << 64) - 1


def _check_state(state: dict[str, Any], what: str, counts: tuple[str, ...], **mine: Any) -> None:
    """ValueError unless ``state`` is a dict holding the values ``mine`` (else a state saved by another
    ``what``) and integers >= 0 under ``counts``."""
    if not isinstance(state, dict) or any(k not in state for k in (*mine, *counts)):
        raise ValueError(f"not a {what} state: a dict with {[*mine, *counts]} from its state_dict() expected")
    for k in counts:
        check_int(state[k], f"{what} state[{k!r}]", 0)
    if any(state[k] != v for k, v in mine.items()):
        theirs = ", ".join(f"{k}={state[k]}" for k in mine)
        ours = ", ".join(f"{k}={v}" for k, v in mine.items())
        raise ValueError(f"state is for {theirs}; this {what} has {ours}")


def _mix(seed: int, k: int) -> int:
    """Draw ``k`` of ``seed``: the order layer's splitmix64 finaliser (:func:`seqstore.order._keys.mix64`)
    of a Weyl combination of (seed, k). A 64-bit value, O(1), identical on every platform."""
    return mix64((int(seed) * 0xD1B54A32D192ED03 + (k + 1) * 0x9E3779B97F4A7C15) & _MASK)


class ShuffleBuffer(Iterator[Any]):
    """Iterator over ``source`` shuffled through a buffer of ``size`` items (see :func:`shuffle_buffer`)."""

    def __init__(self, source: Iterable[Any], size: int, seed: int = 0) -> None:
        self.source = source
        self.size = check_int(size, "shuffle buffer size", 1)
        self.seed = check_int(seed, "seed")
        self._buffer: list[Any] = []
        self._consumed = 0
        self._emitted = 0
        self._exhausted = False
        self._it: Iterator[Any] | None = None
        self._source_state: Any = None

    def _start(self) -> Iterator[Any]:
        src = self.source
        if self._source_state is not None and hasattr(src, "load_state_dict"):
            src.load_state_dict(self._source_state)
            return iter(src)
        if self._consumed == 0:
            return iter(src)
        if isinstance(src, (Order, np.ndarray, range, list, tuple)):
            return iter(src[self._consumed :])
        return itertools.islice(iter(src), self._consumed, None)

    def __next__(self) -> Any:
        if self._it is None:
            self._it = self._start()
        buf = self._buffer
        while len(buf) < self.size and not self._exhausted:
            try:
                buf.append(next(self._it))
            except StopIteration:
                self._exhausted = True
                break
            self._consumed += 1
        if not buf:
            raise StopIteration
        j = (_mix(self.seed, self._emitted) * len(buf)) >> 64
        item = buf[j]
        buf[j] = buf[-1]
        buf.pop()
        self._emitted += 1
        return item

    def state_dict(self) -> dict[str, Any]:
        """The exact position: counts, a copy of the buffered items (O(size); NumPy scalars as Python
        numbers) and the source's state."""
        if self._it is None and self._source_state is not None:
            src_state = self._source_state  # loaded, not yet restored into the source (the first item does)
        else:
            src_state = self.source.state_dict() if hasattr(self.source, "state_dict") else None
        # NumPy scalars (an array source yields them) as Python numbers: the state survives JSON
        return {"seed": self.seed, "size": self.size, "consumed": self._consumed, "emitted": self._emitted,
                "exhausted": self._exhausted,
                "buffer": [x.item() if isinstance(x, np.generic) else x for x in self._buffer], "source": src_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (on a buffer built over the same source, freshly created)."""
        _check_state(state, "buffer", ("consumed", "emitted"), seed=self.seed, size=self.size)
        buf = state.get("buffer")
        if not isinstance(buf, list) or len(buf) > self.size:
            got = f"a list of {len(buf)}" if isinstance(buf, list) else f"a {type(buf).__name__}"
            raise ValueError(f"buffer state['buffer'] must be a list of at most {self.size} items, got {got}")
        if not isinstance(state.get("exhausted"), bool):
            raise ValueError(f"buffer state['exhausted'] must be a bool, got {state.get('exhausted')!r}")
        if int(state["consumed"]) != int(state["emitted"]) + len(buf):  # (every item taken is emitted or buffered)
            raise ValueError(f"buffer state: consumed ({state['consumed']}) must be the items emitted "
                             f"({state['emitted']}) plus those buffered ({len(buf)})")
        self._consumed = int(state["consumed"])
        self._emitted = int(state["emitted"])
        self._exhausted = bool(state["exhausted"])
        self._buffer = list(state["buffer"])
        self._source_state = state.get("source")
        self._it = None


def shuffle_buffer(iterable: Iterable[Any], size: int, seed: int = 0) -> ShuffleBuffer:
    """Shuffle ``iterable`` through a buffer of ``size`` items (tf.data's ``shuffle``): fill the buffer,
    then repeatedly emit a uniformly random buffered item and refill from the source. Deterministic in
    ``seed``. Memory O(size). The state adds the source's own where the source has ``state_dict``; on
    resume such a source is restored from it, a sliceable one (an :class:`~seqstore.order.Order`, array,
    range, list) sliced at the consumed count (O(1) for orders), any other iterable skipped forward
    (O(consumed) time, O(1) memory)."""
    return ShuffleBuffer(iterable, size, seed)


class ReplacementSampler(Iterator[int]):
    """Endless uniform sampling with replacement from ``[0, num_seqs)`` (see :func:`sample_with_replacement`)."""

    _BLOCK = 4096

    def __init__(self, num_seqs: int, seed: int = 0) -> None:
        if isinstance(num_seqs, bool) or not isinstance(num_seqs, (int, np.integer)) or num_seqs < 1:
            raise ValueError(f"sampling with replacement needs at least one sequence, got num_seqs={num_seqs!r}")
        self.num_seqs = int(num_seqs)
        self.seed = check_int(seed, "seed")
        self.position = 0
        self._block: IntArray = np.empty(0, dtype=np.int64)
        self._block_start = 0

    def take(self, count: int) -> IntArray:
        """The next ``count`` indices as an int64 array (vectorised), advancing the position.
        ValueError unless ``count`` is an integer >= 0 (a bool or float is not one)."""
        count = check_int(count, "take count", 0)
        out = np.empty(count, dtype=np.int64)
        filled = 0
        n = self.num_seqs
        while filled < count:
            k = self.position
            epoch, off = k // n + 1, k % n
            m = min(count - filled, n - off)
            order = seq_order(n, "random_sample", epoch=epoch, seed=self.seed)
            out[filled : filled + m] = order.take(np.arange(off, off + m, dtype=np.int64))
            filled += m
            self.position += m
        return out

    def __next__(self) -> int:
        i = self.position - self._block_start
        if not 0 <= i < len(self._block):
            start = self.position
            self._block = self.take(self._BLOCK)
            self._block_start = start
            self.position = start
            i = 0
        self.position += 1
        return int(self._block[i])

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "num_seqs": self.num_seqs, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_state(state, "sampler", ("position",), seed=self.seed, num_seqs=self.num_seqs)
        self.position = int(state["position"])
        self._block = np.empty(0, dtype=np.int64)
        self._block_start = 0


def sample_with_replacement(dataset: Any, seed: int = 0) -> ReplacementSampler:
    """Endless uniform sampling with replacement of indices of ``dataset`` (a Dataset, anything with
    ``num_seqs`` or ``len``, or an int N): draw ``k`` is position ``k mod N`` of
    ``seq_order(N, "random_sample", epoch=k // N + 1, seed=seed)``, so the state is ``k``. O(1) memory."""
    n: Any
    if isinstance(dataset, (int, np.integer)):
        n = dataset  # (a bool too, which the sampler refuses)
    elif (n := getattr(dataset, "num_seqs", None)) is None:
        if isinstance(dataset, (str, bytes)) or not hasattr(dataset, "__len__"):
            raise ValueError("sampling with replacement needs a dataset, something with num_seqs or len, or an "
                             f"int N; got {type(dataset).__name__} {dataset!r:.60}")
        n = len(dataset)
    return ReplacementSampler(n, seed)
