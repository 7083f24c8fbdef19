"""The base order kinds that need no bins: ranges, ``default_every_n``, the keyed permutation,
sampling with replacement, explicit orders and the length-sorted orders.

Each is an immutable :class:`~seqstore.order.base.Order` with O(1) state (plus a memory-mapped array
where the ordering is defined by one: explicit orders and sort indexes) and a vectorised ``_take``.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .._numba_start import would_wait
from . import _kernels as K
from . import _keys
from . import _sort_kernels as S
from ._arrays import ArrayRef, PathLike
from .base import IntArray, Order
from .sort_index import lengths_kind, sort_index

__all__ = ["RangeOrder", "EveryNOrder", "PermutationOrder", "SampleOrder", "ExplicitOrder", "SortedOrder",
           "MAX_NUM_SEQS", "CountedOrder", "check_count", "check_key"]

MAX_NUM_SEQS = (1 << 63) - 1
"""Largest supported number of sequences (values and positions are int64)."""


def check_count(value: Any, what: str, low: int = 0) -> int:
    """``value`` as an int in ``[low, MAX_NUM_SEQS]``; TypeError (not an integer) or ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}")
    v = int(value)
    if not low <= v <= MAX_NUM_SEQS:
        raise ValueError(f"{what} must be in [{low}, 2**63 - 1], got {v}")
    return v


def check_key(key: int) -> int:
    """A 64-bit master key as an int (ValueError outside ``[0, 2**64)``)."""
    if not 0 <= int(key) < 1 << 64:
        raise ValueError(f"key must be in [0, 2**64), got {key}")
    return int(key)


class CountedOrder(Order):
    """Base of the orders over ``[0, num_seqs)`` that hold ``num_seqs`` (checked) and, unless a subclass
    says otherwise, have one position per sequence."""

    __slots__ = ("_n",)

    def __init__(self, num_seqs: int) -> None:
        self._n = check_count(num_seqs, "num_seqs")

    @property
    def num_seqs(self) -> int:
        return self._n

    def __len__(self) -> int:
        return self._n


class RangeOrder(CountedOrder):
    """``default`` (0, 1, ..., N-1) or, with ``reverse``, ``reverse`` (N-1, ..., 0). O(1) memory."""

    __slots__ = ("reverse",)

    def __init__(self, num_seqs: int, reverse: bool = False) -> None:
        super().__init__(num_seqs)
        self.reverse = bool(reverse)

    def _take(self, positions: IntArray) -> IntArray:
        return (self._n - 1) - positions if self.reverse else positions.copy()

    def _take_range(self, start: int, stop: int) -> IntArray:
        if self.reverse:
            return np.arange(self._n - 1 - start, self._n - 1 - stop, -1, dtype=np.int64)
        return np.arange(start, stop, dtype=np.int64)

    def __reduce__(self) -> tuple[Any, ...]:
        return (RangeOrder, (self._n, self.reverse))

    def __repr__(self) -> str:
        return f"RangeOrder(num_seqs={self._n}, reverse={self.reverse})"


class EveryNOrder(CountedOrder):
    """``default_every_n:K``: K contiguous blocks of ``N // K`` interleaved round-robin; position
    ``j*K + i`` holds ``i*(N//K) + j``. The last ``N % K`` sequences are dropped (as in RETURNN), so
    ``len == (N // K) * K``. O(1) memory."""

    __slots__ = ("k",)

    def __init__(self, num_seqs: int, k: int) -> None:
        super().__init__(num_seqs)
        if k < 1:
            raise ValueError(f"default_every_n needs K >= 1, got {k}")
        self.k = int(k)

    def __len__(self) -> int:
        return (self._n // self.k) * self.k

    def _take(self, positions: IntArray) -> IntArray:
        block = self._n // self.k
        return (positions % self.k) * block + positions // self.k

    def __reduce__(self) -> tuple[Any, ...]:
        return (EveryNOrder, (self._n, self.k))

    def __repr__(self) -> str:
        return f"EveryNOrder(num_seqs={self._n}, k={self.k})"


class PermutationOrder(CountedOrder):
    """A keyed pseudorandom permutation of ``[0, num_seqs)`` (``random``).

    ``key`` is a 64-bit master key (see :func:`seqstore.order._keys.master_key`). The permutation is
    an 8-round generalised Feistel network on ``ceil(sqrt N) x ceil(N / ceil(sqrt N))`` with cycle
    walking (see :mod:`seqstore.order._kernels`): a bijection for every N in ``[1, 2**63)``, about
    1 network evaluation per index, O(1) memory, tens of millions of indices per second per core.
    :meth:`position_of` inverts it in O(1) per value.
    """

    __slots__ = ("key", "_a", "_b", "_keys")

    def __init__(self, num_seqs: int, key: int) -> None:
        super().__init__(num_seqs)
        self.key = check_key(key)
        self._keys = np.array(_keys.round_keys(self.key, K.ROUNDS), dtype=np.uint64)
        a, b = _keys.split(self._n) if self._n else (1, 1)
        self._a, self._b = np.uint64(a), np.uint64(b)

    def _take(self, positions: IntArray) -> IntArray:
        if positions.shape[0] <= K.NUMPY_TAKE and would_wait(K.perm_take):  # a first batch
            return K.perm_take_numpy(positions, np.uint64(self._n), self._a, self._b, self._keys)
        out = np.empty(positions.shape[0], dtype=np.int64)
        K.perm_take(positions, np.uint64(self._n), self._a, self._b, self._keys, out)
        return out

    def _take_range(self, start: int, stop: int) -> IntArray:
        out = np.empty(stop - start, dtype=np.int64)
        K.perm_range(np.int64(start), np.uint64(self._n), self._a, self._b, self._keys, out)
        return out

    def position_of(self, values: Any) -> IntArray:
        """Inverse permutation: the position of each value (int array-like in ``[0, N)``), int64, O(1) each."""
        vals = np.asarray(values)
        if vals.dtype.kind not in "iu" and vals.size:  # (a float was truncated: another sequence's position)
            raise TypeError(f"values must be integers, got dtype {vals.dtype}")
        flat = vals.reshape(-1)
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= self._n):
            raise ValueError(f"values must be in [0, {self._n})")
        flat = flat.astype(np.int64, copy=False)
        out = np.empty(flat.shape[0], dtype=np.int64)
        K.perm_inverse(flat, np.uint64(self._n), self._a, self._b, self._keys, out)
        return out.reshape(vals.shape)

    def _find(self, value: int, lo: int, hi: int) -> int | None:
        p = int(self.position_of(np.array([value], dtype=np.int64))[0])  # a bijection: O(1)
        return p if lo <= p < hi else None

    def count(self, value: Any) -> int:
        return int(self._member(value) is not None)

    def __contains__(self, value: object) -> bool:
        return self._member(value) is not None

    def __reduce__(self) -> tuple[Any, ...]:
        return (PermutationOrder, (self._n, self.key))

    def __repr__(self) -> str:
        return f"PermutationOrder(num_seqs={self._n}, key={self.key:#018x})"


class SampleOrder(CountedOrder):
    """``random_sample``: N i.i.d. uniform draws from ``[0, N)`` (with replacement), counter based:
    draw ``i`` is a keyed hash of ``i`` mapped to ``[0, N)`` by a 64x64-bit multiply-high (bias below
    N / 2**64). O(1) memory, random access."""

    __slots__ = ("key", "_k0", "_k1")

    def __init__(self, num_seqs: int, key: int) -> None:
        super().__init__(num_seqs)
        self.key = int(key)
        self._k0 = np.uint64(_keys.child_key(self.key, 1))
        self._k1 = np.uint64(_keys.child_key(self.key, 2))

    def _take(self, positions: IntArray) -> IntArray:
        out = np.empty(positions.shape[0], dtype=np.int64)
        K.sample_take(positions, np.uint64(self._n), self._k0, self._k1, out)
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (SampleOrder, (self._n, self.key))

    def __repr__(self) -> str:
        return f"SampleOrder(num_seqs={self._n}, key={self.key:#018x})"


class ExplicitOrder(CountedOrder):
    """A given order: ``array[i]`` (an int array, a memory-mapped array or a ``.npy`` path, mapped).

    Its length may differ from ``num_seqs``; every value must lie in ``[0, num_seqs)``. In-memory
    arrays are checked at construction, mapped ones as they are read (ValueError naming the position).
    Pickles by file reference when mapped, by value otherwise.
    """

    __slots__ = ("ref",)

    def __init__(self, num_seqs: int, array: Any) -> None:
        super().__init__(num_seqs)
        self.ref = array if isinstance(array, ArrayRef) else ArrayRef(array, "explicit order")
        arr = self.ref.array
        if arr.dtype.kind not in "iu" and arr.size:
            raise ValueError(f"explicit order must have an integer dtype, got {arr.dtype}")
        if self.ref.file is None and arr.size:
            self._check(arr)

    def _check(self, values: np.ndarray, start: int = 0, positions: IntArray | None = None) -> None:
        """ValueError naming the first position whose value is outside ``[0, num_seqs)``. O(len(values))."""
        bad = (values < 0) | (values >= self._n)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            where = int(positions[k]) if positions is not None else start + k
            raise ValueError(f"explicit order has value {int(values[k])} at position {where}, outside [0, {self._n})")

    def __len__(self) -> int:
        return len(self.ref)

    def _take(self, positions: IntArray) -> IntArray:
        raw = self.ref.array[positions]
        if self.ref.file is not None:  # (before the cast: uint64 2**64 - 1 read as -1)
            self._check(raw, positions=positions)
        return raw.astype(np.int64)

    def _take_range(self, start: int, stop: int) -> IntArray:
        raw = np.array(self.ref.array[start:stop])  # (one read of the mapping, in the file's dtype)
        if self.ref.file is not None:
            self._check(raw, start)
        return raw.astype(np.int64, copy=False)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ExplicitOrder, (self._n, self.ref))

    def __repr__(self) -> str:
        return f"ExplicitOrder(num_seqs={self._n}, {self.ref!r})"


class SortedOrder(CountedOrder):
    """``sorted`` (stable argsort of the lengths, ties by ascending index) or, with ``descending``,
    ``sorted_reverse`` (stable argsort of ``-lengths``: longest first, ties by ascending index).

    Both read one ascending sort index (:func:`~seqstore.order.sort_index`), computed on first use,
    into ``cache`` when given (then memory-mapped and shared by every process) or into memory (O(N)).
    ``sorted_reverse`` walks the runs of equal length backwards, finding run bounds by bisection:
    O(1) extra memory.
    """

    __slots__ = ("lengths", "descending", "cache", "_sidx", "_lock")

    def __init__(self, lengths: Any, descending: bool = False, cache: PathLike | None = None) -> None:
        self.lengths = lengths if isinstance(lengths, ArrayRef) else ArrayRef(lengths, "lengths")
        lengths_kind(np.empty(0, dtype=self.lengths.dtype))
        self._n = len(self.lengths)
        self.descending = bool(descending)
        self.cache = cache
        self._sidx: np.ndarray | None = None
        self._lock = threading.Lock()

    def sort_index(self) -> np.ndarray:
        """The ascending stable sort index (computed or mapped on first call), shape ``(N,)``."""
        with self._lock:
            if self._sidx is None:
                self._sidx = sort_index(self.lengths, cache=self.cache)
            return self._sidx

    def _take(self, positions: IntArray) -> IntArray:
        sidx = self.sort_index()
        if not self.descending:
            return np.asarray(sidx[positions], dtype=np.int64)
        out = np.empty(positions.shape[0], dtype=np.int64)
        S.reverse_sorted_take(positions, sidx, S.kernel_lengths(self.lengths.array), out)
        return out

    def _take_range(self, start: int, stop: int) -> IntArray:
        if not self.descending:
            return np.array(self.sort_index()[start:stop], dtype=np.int64)
        return self._take(np.arange(start, stop, dtype=np.int64))

    def __reduce__(self) -> tuple[Any, ...]:
        return (SortedOrder, (self.lengths, self.descending, self.cache))

    def __repr__(self) -> str:
        name = "sorted_reverse" if self.descending else "sorted"
        return f"SortedOrder({name}, lengths={self.lengths!r}, cache={self.cache!r})"
