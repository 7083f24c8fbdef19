"""The :class:`Order` interface and :class:`SliceOrder`, the lazy view behind slicing, shards and partitions.

An order is an immutable value: a sequence of ``len(order)`` sequence indices in ``[0, order.num_seqs)``.
Concrete orders (``seqstore.order.kinds``, ``seqstore.order.binned``) implement one method,
``_take(positions)``; this module builds the whole ``collections.abc.Sequence[int]`` API, vectorised
``take``, chunked iteration, slicing, RETURNN's contiguous blocks and equality on top of it. Nothing
here allocates more than the positions asked for.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

__all__ = ["Order", "SliceOrder", "block_bounds", "smallest_dtype"]

IntArray = npt.NDArray[np.int64]

_ITER_CHUNK = 1 << 16


def smallest_dtype(num_seqs: int) -> np.dtype[Any]:
    """Smallest signed integer dtype holding every value of ``[0, num_seqs)``."""
    top = max(num_seqs - 1, 0)
    for dt in (np.int8, np.int16, np.int32):
        if top <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.int64)


def block_bounds(length: int, index: int, count: int) -> tuple[int, int]:
    """``[start, stop)`` of block ``index`` when ``length`` items are cut into ``count`` contiguous blocks.

    RETURNN's rule: the first ``length % count`` blocks have ``length // count + 1`` items, the others
    ``length // count``. O(1).
    """
    if count < 1:
        raise ValueError(f"number of blocks must be >= 1, got {count}")
    if not 0 <= index < count:
        raise ValueError(f"block index must be in [0, {count}), got {index}")
    q, r = divmod(length, count)
    start = index * q + min(index, r)
    return start, start + q + (1 if index < r else 0)


def _check_holds(dtype: np.dtype[Any], num_seqs: int) -> None:
    """ValueError unless ``dtype`` holds every index of ``[0, num_seqs)`` exactly (an assignment into a
    narrower one wrapped them silently: 999 became -25 in int8)."""
    top = num_seqs - 1
    if top < 0 or dtype.kind == "O":
        return
    if dtype.kind in "iu":
        ok = top <= np.iinfo(dtype).max
    elif dtype.kind in "fc":
        ok = top <= 1 << (np.finfo(dtype).nmant + 1)  # (every integer up to 2**(mantissa bits + 1) is exact)
    else:
        ok = False
    if not ok:
        raise ValueError(f"dtype {dtype} cannot hold every sequence index of the order (up to {top}); "
                         f"leave dtype out for {smallest_dtype(num_seqs)}")


def _as_index(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}") from None


class Order(Sequence[int], abc.ABC):
    """A lazy epoch order: ``order[i]`` is the sequence index visited at position ``i``.

    Implements ``collections.abc.Sequence[int]``. Values lie in ``[0, num_seqs)``. Slices are lazy
    :class:`SliceOrder` views; :meth:`take` and :meth:`iter_chunks` are vectorised. Orders are values:
    immutable, comparable with any sequence, picklable in O(1) bytes (arrays they hold pickle by file
    reference when memory-mapped, see :class:`seqstore.order._arrays.ArrayRef`).
    """

    __slots__ = ()

    # ------------------------------------------------------------------ what subclasses provide

    @property
    @abc.abstractmethod
    def num_seqs(self) -> int:
        """The size of the index space: every value is in ``[0, num_seqs)``."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of positions."""

    @abc.abstractmethod
    def _take(self, positions: IntArray) -> IntArray:
        """Values at ``positions`` (int64, 1-D, every entry in ``[0, len)``) as a new int64 array."""

    def _take_range(self, start: int, stop: int) -> IntArray:
        """Values at positions ``start..stop-1`` (``0 <= start <= stop <= len``); override when cheaper."""
        return self._take(np.arange(start, stop, dtype=np.int64))

    # ------------------------------------------------------------------ public API

    def take(self, positions: npt.ArrayLike) -> IntArray:
        """Values at ``positions`` (any integer array-like, any shape; negative counts from the end).

        Returns an int64 array of the same shape. Raises IndexError for positions out of range.
        Vectorised; memory O(positions) (plus O(bin) for binned orders).
        """
        pos = np.asarray(positions)
        if pos.dtype.kind not in "iu" and pos.size:
            raise TypeError(f"positions must be integers, got dtype {pos.dtype}")
        n = len(self)
        flat = pos.reshape(-1)
        if flat.size == 0:
            return np.empty(pos.shape, dtype=np.int64)
        lo, hi = int(flat.min()), int(flat.max())
        if lo < -n or hi >= n:
            bad = lo if lo < -n else hi
            raise IndexError(f"position {bad} out of range for an order of length {n}")
        flat = flat.astype(np.int64, copy=False)
        if lo < 0:
            flat = np.where(flat < 0, flat + n, flat)
        return self._take(flat).reshape(pos.shape)

    def iter_chunks(self, size: int = 1 << 20) -> Iterator[IntArray]:
        """Yield the order as consecutive int64 arrays of ``size`` values (the last may be shorter).

        Memory O(size) at a time (plus O(bin) for binned orders).
        """
        size = _as_index(size, "chunk size")
        if size < 1:
            raise ValueError(f"chunk size must be >= 1, got {size}")
        n = len(self)
        for start in range(0, n, size):
            yield self._take_range(start, min(start + size, n))

    def to_numpy(self, dtype: npt.DTypeLike | None = None) -> npt.NDArray[Any]:
        """The whole order as an array of the smallest signed int dtype holding ``num_seqs - 1``
        (or ``dtype``, which must hold every index up to ``num_seqs - 1`` exactly: ValueError otherwise).
        O(len) memory, computed chunk by chunk."""
        dt = smallest_dtype(self.num_seqs) if dtype is None else np.dtype(dtype)
        if dtype is not None:
            _check_holds(dt, self.num_seqs)
        out = np.empty(len(self), dtype=dt)
        pos = 0
        for chunk in self.iter_chunks():
            out[pos : pos + chunk.shape[0]] = chunk
            pos += chunk.shape[0]
        return out

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> npt.NDArray[Any]:
        return self.to_numpy(dtype)

    def shard(self, index: int, count: int) -> SliceOrder:
        """Contiguous block ``index`` of ``count`` near-equal blocks (RETURNN's sharding rule, see
        :func:`block_bounds`): the first ``len % count`` blocks get one extra position. O(1)."""
        index = _as_index(index, "shard index")
        count = _as_index(count, "shard count")
        if count < 1:
            raise ValueError(f"shard count must be >= 1, got {count}")
        if not 0 <= index < count:
            raise ValueError(f"shard index must be in [0, {count}), got {index}")
        start, stop = block_bounds(len(self), index, count)
        return SliceOrder(self, range(start, stop))

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Order: ...

    def __getitem__(self, index: int | slice) -> int | Order:
        if isinstance(index, slice):
            return SliceOrder(self, range(len(self))[index])
        i = _as_index(index, "order index")
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"order index {index} out of range for an order of length {n}")
        return int(self._take(np.array([i], dtype=np.int64))[0])

    def __iter__(self) -> Iterator[int]:
        for chunk in self.iter_chunks(_ITER_CHUNK):
            yield from chunk.tolist()

    def __reversed__(self) -> Iterator[int]:
        return iter(self[::-1])

    def _member(self, value: object) -> int | None:
        """``value`` as a sequence index the order may hold, or None: not an integer (bools included) or
        outside ``[0, num_seqs)``."""
        try:
            v = _as_index(value, "value")
        except TypeError:
            return None
        return v if 0 <= v < self.num_seqs else None

    def __contains__(self, value: object) -> bool:
        v = self._member(value)
        return v is not None and any(bool((chunk == v).any()) for chunk in self.iter_chunks())

    def index(self, value: Any, start: Any = 0, stop: Any = None) -> int:
        """The first position of ``value`` in ``self[start:stop]``, counted from the start of the order (as
        ``list.index``); ValueError naming ``value`` when it is not there. Vectorised, chunk by chunk:
        O(positions searched) time, O(chunk) memory (``Sequence.index`` took one Python call per position)."""
        lo, hi, _ = slice(start, stop).indices(len(self))
        v = self._member(value)
        found = None if v is None or lo >= hi else self._find(v, lo, hi)
        if found is None:
            raise ValueError(f"{value!r} is not in the order")
        return found

    def _find(self, value: int, lo: int, hi: int) -> int | None:
        """First position of ``value`` in ``[lo, hi)`` (``0 <= lo < hi <= len``), or None."""
        pos = lo
        for chunk in self[lo:hi].iter_chunks():
            hit = np.flatnonzero(chunk == value)
            if hit.size:
                return pos + int(hit[0])
            pos += chunk.shape[0]
        return None

    def count(self, value: Any) -> int:
        """How many positions hold ``value`` (0 for anything that is not a sequence index). Vectorised."""
        v = self._member(value)
        return 0 if v is None else sum(int(np.count_nonzero(chunk == v)) for chunk in self.iter_chunks())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (str, bytes, bytearray)):
            return NotImplemented
        if isinstance(other, np.ndarray):
            if other.ndim != 1:
                return False
        elif not isinstance(other, (Sequence, range)):
            return NotImplemented
        n = len(self)
        if len(other) != n:
            return False
        if other is self:
            return True
        start = 0
        for chunk in self.iter_chunks():
            stop = start + chunk.shape[0]
            if isinstance(other, Order):
                theirs: Any = other._take_range(start, stop)
            elif isinstance(other, np.ndarray):
                theirs = other[start:stop]
            else:
                theirs = np.asarray(other[start:stop])
            if not np.array_equal(chunk, theirs):
                return False
            start = stop
        return True

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def _head_repr(self, k: int = 5) -> str:
        n = len(self)
        head = self._take_range(0, min(k, n)).tolist()
        return "[" + ", ".join(map(str, head)) + (", ...]" if n > k else "]")


class SliceOrder(Order):
    """``base[r]`` for a Python ``range`` ``r`` of base positions: a lazy view, O(1) memory.

    Slicing a SliceOrder composes the ranges, so views never nest. ``label`` only changes the repr
    (:func:`seqstore.order.seq_order` names the ordering, epoch, partition and shard there).
    """

    __slots__ = ("base", "positions", "label")

    base: Order
    positions: range
    label: str | None

    def __init__(self, base: Order, positions: range, label: str | None = None) -> None:
        if isinstance(base, SliceOrder):
            r = base.positions  # compose: element k is r[positions[k]]
            positions = range(
                r.start + positions.start * r.step, r.start + positions.stop * r.step, r.step * positions.step
            )
            base = base.base
        ends = (positions[0], positions[-1]) if len(positions) else (0, 0)
        if len(positions) and not (min(ends) >= 0 and max(ends) < len(base)):
            raise ValueError(f"positions {positions} out of range for an order of length {len(base)}")
        self.base = base
        self.positions = positions
        self.label = label

    @property
    def num_seqs(self) -> int:
        return self.base.num_seqs

    def __len__(self) -> int:
        return len(self.positions)

    def _take(self, positions: IntArray) -> IntArray:
        r = self.positions
        if r.step != 1:
            positions = positions * r.step
        if r.start != 0:
            positions = positions + r.start
        return self.base._take(positions)

    def _take_range(self, start: int, stop: int) -> IntArray:
        r = self.positions
        if r.step == 1:
            return self.base._take_range(r.start + start, r.start + stop)
        if stop <= start:
            return np.empty(0, dtype=np.int64)
        return self.base._take(np.arange(start, stop, dtype=np.int64) * r.step + r.start)

    def __reduce__(self) -> tuple[Any, ...]:
        return (SliceOrder, (self.base, self.positions, self.label))

    def __repr__(self) -> str:
        r = self.positions
        if self.label is not None:
            return f"<Order {self.label}: {len(self)} of {self.num_seqs} seqs {self._head_repr()}>"
        step = "" if r.step == 1 else f":{r.step}"
        return f"{self.base!r}[{r.start}:{r.stop}{step}]"
