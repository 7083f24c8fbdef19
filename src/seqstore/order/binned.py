"""Orders computed one bin at a time: ``laplace`` and ``sort_bin_shuffle[_x2]``.

Both cut an N-position sequence into ``bins`` contiguous parts with RETURNN's boundaries (bin ``j``
covers positions ``floor(j*N/bins)`` to ``floor((j+1)*N/bins)``) and need a whole bin to know any
position in it. :class:`BinnedOrder` maps positions to (bin, offset), computes the missing bins in one
numba call, keeps the few most recently used bins in a small per-object LRU (a chunk boundary inside a
bin does not recompute it) and gathers. Memory: O(largest bin) per touched bin, never O(N).

* ``laplace``: bin ``j`` = the keyed permutation's positions of bin ``j``, stably sorted by length,
  ascending for even ``j`` and descending for odd ``j``; bins are visited in order.
* ``sort_bin_shuffle``: the lengths' stable sort with ties in keyed random order (equivalent to
  RETURNN's stable sort of a random permutation), cut into bins, bins visited in a keyed random order;
  ``_x2`` also shuffles inside each bin. Needs the global sort index (on disk when cached). Finding
  which bin a position falls in, when bins are visited out of order, uses checkpoints of the visited
  sizes every 1024 bins (O(bins / 1024) memory, one O(bins) pass on first use).
"""

from __future__ import annotations

import abc
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _kernels as K
from . import _keys
from . import _sort_kernels as S
from ._arrays import ArrayRef, PathLike
from .base import IntArray
from .kinds import CountedOrder, PermutationOrder, check_count
from .sort_index import lengths_kind, sort_index

__all__ = ["BinnedOrder", "LaplaceOrder", "SortBinShuffleOrder"]

_CACHE_BINS = 4
_CHECKPOINT_EVERY = 1024


class BinnedOrder(CountedOrder):
    """An order whose positions fall into bins that are computed whole (see the module docstring).

    Subclasses provide :meth:`_locate` (position -> visit slot, offset in the bin), :meth:`_bin_ids`
    (visit slot -> bin id) and :meth:`_compute` (bin ids -> concatenated contents).
    """

    __slots__ = ("bins", "lengths", "_cache", "_lock")

    def __init__(self, num_seqs: int, bins: int, lengths: Any) -> None:
        super().__init__(num_seqs)
        self.bins = check_count(bins, "number of bins", 1)
        self.lengths = lengths if isinstance(lengths, ArrayRef) else ArrayRef(lengths, "lengths")
        lengths_kind(np.empty(0, dtype=self.lengths.dtype))
        if len(self.lengths) != self._n:
            raise ValueError(f"lengths has {len(self.lengths)} entries, expected num_seqs = {self._n}")
        self._cache: OrderedDict[int, IntArray] = OrderedDict()
        self._lock = threading.Lock()

    @abc.abstractmethod
    def _locate(self, positions: IntArray) -> tuple[IntArray, IntArray]:
        """Visit slot and offset inside its bin of each position (int64 arrays)."""

    @abc.abstractmethod
    def _bin_ids(self, slots: IntArray) -> IntArray:
        """Bin id visited at each slot."""

    @abc.abstractmethod
    def _compute(self, bin_ids: IntArray, total: int) -> IntArray:
        """Contents of the bins ``bin_ids`` concatenated (``total`` values). O(total) memory."""

    def bin_bounds(self, bin_ids: Any) -> tuple[IntArray, IntArray]:
        """Start (in the binned sequence, before bins are reordered) and size of each bin id. O(len)."""
        ids = np.asarray(bin_ids, dtype=np.int64).reshape(-1)
        starts = np.empty(ids.shape[0], dtype=np.int64)
        sizes = np.empty(ids.shape[0], dtype=np.int64)
        K.bin_bounds(ids, np.uint64(self._n), np.uint64(self.bins), starts, sizes)
        return starts, sizes

    def _take(self, positions: IntArray) -> IntArray:
        if positions.shape[0] == 0:  # no bin to gather from (an empty order's repr, an empty range)
            return np.empty(0, dtype=np.int64)
        slots, offs = self._locate(positions)
        if slots.shape[0] > 1 and bool(np.all(slots[1:] >= slots[:-1])):
            first = np.empty(slots.shape[0], dtype=bool)
            first[0] = True
            np.not_equal(slots[1:], slots[:-1], out=first[1:])
            uniq = slots[first]
            inverse = np.cumsum(first) - 1
        else:
            uniq, inverse = np.unique(slots, return_inverse=True)
        ids = self._bin_ids(uniq)
        _, sizes = self.bin_bounds(ids)
        parts: list[IntArray | None] = [None] * uniq.shape[0]
        missing: list[int] = []
        with self._lock:
            for i, slot in enumerate(uniq.tolist()):
                hit = self._cache.get(slot)
                if hit is None:
                    missing.append(i)
                else:
                    self._cache.move_to_end(slot)
                    parts[i] = hit
        if missing:
            miss = np.asarray(missing, dtype=np.int64)
            flat = self._compute(ids[miss], int(sizes[miss].sum()))
            pos = 0
            for i in missing:
                m = int(sizes[i])
                parts[i] = flat[pos : pos + m]
                pos += m
        flat_all = parts[0] if len(parts) == 1 else np.concatenate(parts)  # type: ignore[arg-type]
        assert flat_all is not None
        base = np.zeros(uniq.shape[0], dtype=np.int64)
        np.cumsum(sizes[:-1], out=base[1:])
        out: IntArray = flat_all[base[inverse] + offs]
        keep = {int(inverse[0]), int(inverse[-1])}
        with self._lock:
            for i in sorted(keep):
                part = parts[i]
                assert part is not None
                slot = int(uniq[i])
                if slot not in self._cache:
                    self._cache[slot] = part.copy() if part.base is not None else part
                self._cache.move_to_end(slot)
            while len(self._cache) > _CACHE_BINS:
                self._cache.popitem(last=False)
        return out


def _sort_keys(lengths: np.ndarray) -> np.ndarray:
    """Lengths as :func:`~seqstore.order._sort_kernels.sort_segments` sorts them, in the same order: float64,
    or int64 (uint64 shifted down by 2**63: as int64, those from 2**63 up were negative)."""
    if lengths.dtype.kind == "f":
        return np.asarray(lengths, dtype=np.float64)
    if lengths.dtype.kind == "u" and lengths.dtype.itemsize == 8:
        return (lengths ^ np.uint64(1 << 63)).view(np.int64)
    return np.asarray(lengths, dtype=np.int64)


class _ByValues:
    """Stands in for the lengths of a :class:`LaplaceOrder` whose ``values`` callable yields them."""

    def __init__(self, n: int) -> None:
        self.dtype = np.dtype(np.int64)
        self._n = n

    def __len__(self) -> int:
        return self._n

    def take(self, indices: Any) -> IntArray:
        raise TypeError("lengths come from the order's values callable")


class LaplaceOrder(BinnedOrder):
    """``laplace:bins``: the keyed permutation (``key``, the same as ``random`` with that key) cut into
    ``bins`` parts; even parts sorted ascending by length, odd parts descending (stable). Position
    ``i`` needs its whole bin: O(N / bins) memory and time per bin touched.

    ``values`` (optional): a picklable vectorised callable mapping positions (int64) to ``(values,
    lengths)``; the order then yields those values, sorted within each bin by those lengths, and
    ``lengths`` is not used. This lets a caller order items it addresses differently (a combined
    dataset's union positions -> combined indices) with one lookup per item. ``num_values`` bounds
    the values (it is the order's ``num_seqs``).
    """

    __slots__ = ("perm", "values", "_num_values")

    def __init__(self, num_seqs: int, key: int, bins: int, lengths: Any,
                 values: Callable[[IntArray], tuple[Any, Any]] | None = None, num_values: int | None = None) -> None:
        super().__init__(num_seqs, bins, _ByValues(num_seqs) if values is not None else lengths)
        self.perm = PermutationOrder(self._n, key)
        self.values = values
        self._num_values = self._n if num_values is None else check_count(num_values, "num_values")

    @property
    def num_seqs(self) -> int:
        return self._num_values

    def _locate(self, positions: IntArray) -> tuple[IntArray, IntArray]:
        slots = np.empty(positions.shape[0], dtype=np.int64)
        offs = np.empty(positions.shape[0], dtype=np.int64)
        K.laplace_locate(positions, np.uint64(self._n), np.uint64(self.bins), slots, offs)
        return slots, offs

    def _bin_ids(self, slots: IntArray) -> IntArray:
        return slots

    def _compute(self, bin_ids: IntArray, total: int) -> IntArray:
        _, sizes = self.bin_bounds(bin_ids)
        flat = np.empty(total, dtype=np.int64)
        p = self.perm
        K.perm_bins(bin_ids, np.uint64(self._n), np.uint64(self.bins), p._a, p._b, p._keys, flat)
        if self.values is not None:
            flat, lens = self._mapped(flat)
        else:
            lens = np.asarray(self.lengths.gather(flat))
        S.sort_segments(flat, _sort_keys(lens), sizes, (bin_ids & 1) == 1)
        return flat

    def _mapped(self, positions: IntArray) -> tuple[IntArray, np.ndarray]:
        """``values(positions)`` checked: as many integer values in ``[0, num_values)`` and lengths as positions
        (a value out of range went into ``to_numpy``'s narrower dtype as another sequence's index)."""
        assert self.values is not None
        got, lens = (np.asarray(a) for a in self.values(positions))
        if got.shape != positions.shape or lens.shape != positions.shape or got.dtype.kind not in "iu":
            raise ValueError(f"laplace values callable returned {got.size} values ({got.dtype}) and {lens.size} "
                             f"lengths for {positions.size} positions; expected as many of each, integer values")
        bad = np.flatnonzero((got < 0) | (got >= self._num_values))
        if bad.size:
            k = int(bad[0])
            raise ValueError(f"laplace values callable returned {int(got[k])} for position {int(positions[k])}, "
                             f"outside [0, {self._num_values}) (num_values)")
        return np.ascontiguousarray(got, dtype=np.int64), lens

    def __reduce__(self) -> tuple[Any, ...]:
        if self.values is not None:
            return (LaplaceOrder, (self._n, self.perm.key, self.bins, None, self.values, self._num_values))
        return (LaplaceOrder, (self._n, self.perm.key, self.bins, self.lengths))

    def __repr__(self) -> str:
        return (f"LaplaceOrder(num_seqs={self._n}, key={self.perm.key:#018x}, bins={self.bins}, "
                f"lengths={self.lengths!r})")


class SortBinShuffleOrder(BinnedOrder):
    """``sort_bin_shuffle[_x2]:bins``: lengths sorted (stable, ties in keyed random order), cut into
    ``bins`` parts, parts visited in keyed random order, with ``shuffle_within`` (``_x2``) each part
    shuffled. Needs the global ascending sort index, computed on first use into ``sort_cache`` (then
    mapped) or into memory (O(N)). Otherwise O(bin) per touched bin plus O(bins / 1024) checkpoints.
    """

    __slots__ = ("key", "shuffle_within", "sort_cache", "_bin_perm", "_tie_key", "_within_key", "_sidx", "_checkpoints")

    def __init__(self, num_seqs: int, key: int, bins: int, lengths: Any, shuffle_within: bool = False,
                 sort_cache: PathLike | None = None) -> None:
        super().__init__(num_seqs, bins, lengths)
        self.key = int(key)
        self.shuffle_within = bool(shuffle_within)
        self.sort_cache = sort_cache
        self._bin_perm = PermutationOrder(self.bins, _keys.child_key(self.key, 1))
        self._tie_key = np.uint64(_keys.child_key(self.key, 2))
        self._within_key = np.uint64(_keys.child_key(self.key, 3))
        self._sidx: np.ndarray | None = None
        self._checkpoints: IntArray | None = None

    def _state(self) -> tuple[np.ndarray, IntArray]:
        with self._lock:
            if self._sidx is None:
                self._sidx = sort_index(self.lengths, cache=self.sort_cache)
            if self._checkpoints is None:
                bp = self._bin_perm
                cps = np.empty(-(-self.bins // _CHECKPOINT_EVERY) + 1, dtype=np.int64)
                S.sbs_checkpoints(np.uint64(self.bins), np.uint64(self._n), bp._a, bp._b, bp._keys,
                                  np.int64(_CHECKPOINT_EVERY), cps)
                self._checkpoints = cps
            return self._sidx, self._checkpoints

    def _locate(self, positions: IntArray) -> tuple[IntArray, IntArray]:
        _, cps = self._state()
        slots = np.empty(positions.shape[0], dtype=np.int64)
        offs = np.empty(positions.shape[0], dtype=np.int64)
        bp = self._bin_perm
        S.sbs_locate(positions, cps, np.int64(_CHECKPOINT_EVERY), np.uint64(self._n), np.uint64(self.bins),
                     bp._a, bp._b, bp._keys, slots, offs)
        return slots, offs

    def _bin_ids(self, slots: IntArray) -> IntArray:
        return self._bin_perm._take(slots)

    def _compute(self, bin_ids: IntArray, total: int) -> IntArray:
        sidx, _ = self._state()
        flat = np.empty(total, dtype=np.int64)
        S.sbs_bins(bin_ids, np.uint64(self._n), np.uint64(self.bins), sidx, S.kernel_lengths(self.lengths.array),
                   self._tie_key, self._within_key, self.shuffle_within, flat)
        return flat

    def __reduce__(self) -> tuple[Any, ...]:
        return (SortBinShuffleOrder, (self._n, self.key, self.bins, self.lengths, self.shuffle_within, self.sort_cache))

    def __repr__(self) -> str:
        name = "sort_bin_shuffle_x2" if self.shuffle_within else "sort_bin_shuffle"
        return (f"SortBinShuffleOrder({name}, num_seqs={self._n}, key={self.key:#018x}, bins={self.bins}, "
                f"lengths={self.lengths!r}, sort_cache={self.sort_cache!r})")
