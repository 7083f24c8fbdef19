"""Lazy per-sequence lengths: the one small interface every dataset's ``lengths()`` returns.

A :class:`LengthsView` is a read-only 1-D sequence of integer lengths that is *not* materialised:
``take(int_array)`` gathers (vectorised), ``iter_chunks`` walks in bounded chunks, ``np.asarray``
materialises (O(N), only where an ordering really needs a global array). Implementations wrap a
NumPy array or memmap (:class:`ArrayLengths`), a store's lazy ``Lengths`` or any object with a
vectorised ``take`` (:class:`TakeLengths`), a constant (:class:`ConstantLengths`), or compose an index
map over another view (:class:`MappedLengths`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "ArrayLengths", "ConstantLengths", "FuncLengths", "IntArray", "LengthsView", "MappedLengths", "NonzeroCount",
    "OffsetLengths",
    "TakeLengths", "as_lengths", "as_index_array", "check_int", "check_optional_int", "smallest_dtype",
]

IntArray = npt.NDArray[np.int64]

_CHUNK = 1 << 20


def check_int(value: Any, what: str, minimum: int | None = None, *, _none: str = "") -> int:
    """``value`` as an int (a bool is not one) of at least ``minimum``; else ValueError:
    "``what`` must be an integer [>= minimum], got ``value``"."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{what} must be {_none}an integer{bound}, got {value!r}")
    return int(value)


def check_optional_int(value: Any, what: str, minimum: int | None = None) -> int | None:
    """:func:`check_int`, None passing (and named in the error)."""
    return None if value is None else check_int(value, what, minimum, _none="None or ")


def smallest_dtype(top: int) -> Any:
    """The smallest of uint8, uint16, uint32 and int64 that holds ``0 .. top``."""
    return next(dt for dt in (np.uint8, np.uint16, np.uint32, np.int64) if top <= np.iinfo(dt).max)


def as_index_array(indices: Any, n: int) -> IntArray:
    """``indices`` (any int array-like, negative counts from the end) as a flat int64 array checked
    against ``[0, n)``. Raises IndexError naming the first bad value. O(len(indices))."""
    arr = np.asarray(indices)
    if arr.dtype.kind not in "iu":
        if arr.size == 0:
            return np.empty(0, dtype=np.int64)
        raise TypeError(f"indexes must be integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size:  # 2**63 and above would wrap to negative (from the end)
        over = np.flatnonzero(arr.reshape(-1) >= np.uint64(n))
        if over.size:
            raise IndexError(f"index {int(arr.reshape(-1)[over[0]])} out of range for {n} sequences")
    flat = arr.reshape(-1).astype(np.int64, copy=True)
    if flat.size:
        neg = flat < 0
        if neg.any():
            flat[neg] += n
        bad = (flat < 0) | (flat >= n)
        if bad.any():
            first = int(np.asarray(arr).reshape(-1)[int(np.flatnonzero(bad)[0])])
            raise IndexError(f"index {first} out of range for {n} sequences")
    return flat


class LengthsView(abc.ABC):
    """Lazy int64 lengths of ``len(self)`` sequences. Subclasses implement ``_take`` and set ``n`` (the
    number of sequences) or implement ``__len__``."""

    n: int

    def __len__(self) -> int:
        return self.n

    @abc.abstractmethod
    def _take(self, indices: IntArray) -> IntArray:
        """Lengths at ``indices`` (int64, 1-D, already in range) as a new int64 array."""

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def ndim(self) -> int:
        return 1

    @property
    def dtype(self) -> np.dtype[np.int64]:
        return np.dtype(np.int64)

    def take(self, indices: Any) -> IntArray:
        """Lengths of ``indices`` (any int array-like, any shape) as int64 of the same shape. Vectorised."""
        arr = np.asarray(indices)
        flat = as_index_array(arr, len(self))
        return self._take(flat).reshape(arr.shape)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return int(self.take(np.array([int(key)]))[0])
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            return self.take(np.arange(start, stop, step, dtype=np.int64))
        return self.take(key)

    def iter_chunks(self, size: int = _CHUNK) -> Iterator[IntArray]:
        """Yield all lengths in order, ``size`` at a time. Memory O(size)."""
        n = len(self)
        for a in range(0, n, size):
            yield self._take(np.arange(a, min(a + size, n), dtype=np.int64))

    def to_numpy(self, dtype: npt.DTypeLike | None = None) -> npt.NDArray[Any]:
        """All lengths as one array (default: the smallest unsigned dtype holding the maximum). O(N)."""
        parts = list(self.iter_chunks())
        if dtype is None:
            top = max((int(p.max()) for p in parts if p.size), default=0)
            lo = min((int(p.min()) for p in parts if p.size), default=0)
            dtype = np.int64 if lo < 0 else smallest_dtype(top)
        return np.concatenate(parts, dtype=dtype, casting="unsafe") if parts else np.empty(0, dtype=dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> npt.NDArray[Any]:
        return self.to_numpy(dtype)

    def __iter__(self) -> Iterator[int]:
        for chunk in self.iter_chunks(1 << 16):
            yield from chunk.tolist()


class ArrayLengths(LengthsView):
    """Lengths held in a 1-D integer NumPy array or memmap (pickles by value unless memmapped is wanted:
    a dataset that needs small pickles keeps a path, not this object). ``where``: what the lengths are
    (e.g. the file), named in errors. A negative length (or a uint64 one past int64) is a ValueError
    naming its position and value when it is read (not checked up front: opening stays O(1))."""

    def __init__(self, array: npt.ArrayLike, *, where: str | None = None) -> None:
        arr = np.asarray(array)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise ValueError(f"lengths must be a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}")
        self.array = arr
        self.n = int(arr.shape[0])
        self.where = where

    def _checked(self, raw: npt.NDArray[Any], indices: IntArray | None, start: int = 0) -> IntArray:
        """``raw`` (the values at ``indices``, or from position ``start`` on) as int64, checked >= 0."""
        out = np.asarray(raw, dtype=np.int64)
        # (signed values, or uint64 ones that int64 wraps, can be negative; read from the array, not kept: an
        # ArrayLengths pickled before this check unpickles without such an attribute)
        if (raw.dtype.kind == "i" or raw.dtype.itemsize >= 8) and out.size and int(out.min()) < 0:
            k = int(np.argmax(out < 0))  # (the first: a pass more only when there is one)
            i = start + k if indices is None else int(indices[k])
            v = int(raw[k])
            what = f"negative ({v})" if v < 0 else f"past int64 ({v})"
            where = "" if getattr(self, "where", None) is None else f" of {self.where}"
            raise ValueError(f"a sequence length is {what} at position {i}{where}; lengths must be integers >= 0")
        return out

    def _take(self, indices: IntArray) -> IntArray:
        return self._checked(self.array[indices], indices)

    def iter_chunks(self, size: int = _CHUNK) -> Iterator[IntArray]:
        for a in range(0, len(self), size):
            yield self._checked(self.array[a : a + size], None, a)


class TakeLengths(LengthsView):
    """Any object with ``len`` and a vectorised ``take(int64 array)`` (e.g. a store's ``Lengths``)."""

    def __init__(self, source: Any) -> None:
        if not hasattr(source, "take"):
            raise TypeError(f"lengths source needs a vectorised take(), got {type(source).__name__}")
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def _take(self, indices: IntArray) -> IntArray:
        return np.asarray(self.source.take(indices), dtype=np.int64)

    def iter_chunks(self, size: int = _CHUNK) -> Iterator[IntArray]:
        it = getattr(self.source, "iter_chunks", None)
        if it is None:
            yield from super().iter_chunks(size)
            return
        for chunk in it(size):
            yield np.asarray(chunk, dtype=np.int64)


class ConstantLengths(LengthsView):
    """Every one of ``n`` sequences has length ``value`` (datasets of fixed-size records). O(1)."""

    def __init__(self, n: int, value: int = 1) -> None:
        self.n = int(n)
        self.value = int(value)

    def _take(self, indices: IntArray) -> IntArray:
        return np.full(indices.shape, self.value, dtype=np.int64)


class FuncLengths(LengthsView):
    """Virtual lengths computed from the index by a vectorised ``func(int64 array) -> int array``. O(1)."""

    def __init__(self, n: int, func: Callable[[IntArray], npt.ArrayLike]) -> None:
        self.n = int(n)
        self.func = func

    def _take(self, indices: IntArray) -> IntArray:
        return np.asarray(self.func(indices), dtype=np.int64)


class MappedLengths(LengthsView):
    """``base`` lengths seen through an index map: ``self[i] = base[index_map(i)]``, ``len = n``."""

    def __init__(self, base: LengthsView, n: int, index_map: Callable[[IntArray], IntArray]) -> None:
        self.base = base
        self.n = int(n)
        self.index_map = index_map

    def _take(self, indices: IntArray) -> IntArray:
        return self.base._take(self.index_map(indices))


class OffsetLengths(LengthsView):
    """``base[start : start + n]`` as a view (picklable; O(1))."""

    def __init__(self, base: LengthsView, start: int, n: int) -> None:
        self.base = base
        self.start = int(start)
        self.n = int(n)

    def _take(self, indices: IntArray) -> IntArray:
        return self.base._take(indices + self.start)


class NonzeroCount:
    """How many of ``lengths`` are above 0 (documents with a token), counted lazily: :meth:`at_least`
    reads on from where the last call stopped, and only until it has found what it was asked for. O(1)
    memory (one chunk at a time)."""

    def __init__(self, lengths: LengthsView) -> None:
        self.lengths = lengths
        self.found = 0  # documents with a token among the first ``upto``
        self.upto = 0

    def at_least(self, want: int | None) -> int:
        """The documents with a token, counted until ``want`` of them are found (None: all): the exact
        count where it is below ``want``, else a number at least ``want``."""
        n = len(self.lengths)
        while self.upto < n and (want is None or self.found < want):
            stop = min(n, self.upto + min(_CHUNK, max(1 << 16, self.upto)))  # (small first: often one is enough)
            self.found += int(np.count_nonzero(self.lengths[self.upto : stop]))
            self.upto = stop
        return self.found


def as_lengths(source: Any) -> LengthsView:
    """Wrap ``source`` as a :class:`LengthsView`: a view is returned as is; objects with ``take``
    (store ``Lengths``) are wrapped lazily; anything else is taken as a 1-D integer array."""
    if isinstance(source, LengthsView):
        return source
    if hasattr(source, "take") and not isinstance(source, np.ndarray):
        return TakeLengths(source)
    return ArrayLengths(source)
