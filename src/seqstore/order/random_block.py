"""``random_block:B:W``: a locality-aware shuffle, O(1) memory (docs/orders.md, section random_block).

Records ``[0, N)`` are cut into ``nb = ceil(N / B)`` blocks of ``B`` consecutive records (the last one
holds the remaining ``N - (nb-1)*B``), visited in the order of a keyed permutation of ``[0, nb)``; the
records of each run of ``W`` visited blocks (a *window*; the last may have fewer blocks) are permuted
by a second keyed permutation, one per window. So positions ``window_bounds(w)`` hold exactly the
records of window ``w``'s blocks: a reader touches at most ``W`` blocks per ``W*B`` consecutive
positions, against about one block per record for ``random``.

Both permutations are the keyed Feistel bijection with cycle walking of ``random``
(:mod:`seqstore.order._kernels`), keyed from the master key of (seed, key epoch, ``"random_block"``):
the block permutation by ``child_key(master, 0)``, window ``w`` by ``child_key(child_key(master, 1), w)``.
Bijective for every N >= 0 and B, W >= 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._numba_start import would_wait
from . import _kernels as K
from . import _keys
from .base import IntArray, Order
from .kinds import CountedOrder, PermutationOrder, check_count, check_key

__all__ = ["RandomBlockOrder"]


class RandomBlockOrder(CountedOrder):
    """``random_block:B:W``: blocks of ``block`` records in keyed random order, the records of each
    run of ``window`` consecutive visited blocks permuted together (see the module docstring).

    ``key``: 64-bit master key. Construction O(1) (one inverse permutation evaluation locates the
    short last block); ``take`` O(1) per position, about two network evaluations (one when the
    block's value is in the kernel's 1024-entry cache, as it is for ascending positions with
    ``window <= 1024``); memory O(1).
    """

    __slots__ = ("key", "block", "window", "_nb", "_ba", "_bb", "_bkeys", "_wkey", "_short_slot")

    def __init__(self, num_seqs: int, key: int, block: int, window: int) -> None:
        super().__init__(num_seqs)
        self.key = check_key(key)
        self.block = check_count(block, "block size B", 1)
        self.window = check_count(window, "window W", 1)
        self._nb = -(-self._n // self.block)
        ba, bb = _keys.split(self._nb) if self._nb else (1, 1)
        self._ba, self._bb = np.uint64(ba), np.uint64(bb)
        self._bkeys = np.array(_keys.round_keys(_keys.child_key(self.key, 0), K.ROUNDS), dtype=np.uint64)
        self._wkey = np.uint64(_keys.child_key(self.key, 1))
        self._short_slot = 0
        if self._nb:
            last = np.array([self._nb - 1], dtype=np.int64)
            if would_wait(K.perm_inverse):  # a first epoch order, while numba starts on another thread
                slot = K.perm_inverse_numpy(last, np.uint64(self._nb), self._ba, self._bb, self._bkeys)
            else:
                slot = np.empty(1, dtype=np.int64)
                K.perm_inverse(last, np.uint64(self._nb), self._ba, self._bb, self._bkeys, slot)
            self._short_slot = int(slot[0])

    @property
    def num_blocks(self) -> int:
        """``ceil(N / B)``."""
        return self._nb

    @property
    def num_windows(self) -> int:
        """``ceil(num_blocks / W)``."""
        return -(-self._nb // self.window)

    def _real(self, slot: int) -> int:
        """First position of the order's block slot ``slot`` (``0 <= slot <= num_blocks``)."""
        start = slot * self.block
        if slot > self._short_slot:
            start -= self.block - (self._n - (self._nb - 1) * self.block)
        return start

    def window_bounds(self, w: int) -> tuple[int, int]:
        """``[start, stop)``: the positions of window ``w`` (``0 <= w < num_windows``), which hold exactly
        the records of the blocks ``block_order()[w*W : (w+1)*W]``. O(1)."""
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)):  # (0.5 gave float bounds, True window 1)
            raise TypeError(f"window must be an integer, got {type(w).__name__}")
        w = int(w)
        if not 0 <= w < self.num_windows:
            raise ValueError(f"window must be in [0, {self.num_windows}), got {w}")
        return self._real(w * self.window), self._real(min((w + 1) * self.window, self._nb))

    def block_order(self) -> Order:
        """The visit order of the blocks: a lazy keyed permutation of ``[0, num_blocks)``."""
        return PermutationOrder(self._nb, _keys.child_key(self.key, 0))

    def _values(self, positions: IntArray, start: int, ranged: bool, size: int) -> IntArray:
        """The order at ``positions`` or (``ranged``) at ``start .. start + size - 1``."""
        n, b, w, nb, short = (np.uint64(v) for v in (self._n, self.block, self.window, self._nb, self._short_slot))
        if not ranged and size <= K.NUMPY_TAKE and would_wait(K.random_block):  # a first batch
            got = K.random_block_numpy(positions, n, b, w, nb, short, self._ba, self._bb, self._bkeys, self._wkey)
            if got is not None:  # else too many windows to walk in Python: the kernel, once numba is up
                return got
        out = np.empty(size, dtype=np.int64)
        K.random_block(positions, np.uint64(start), ranged, n, b, w, nb, short, self._ba, self._bb, self._bkeys,
                       self._wkey, out)
        return out

    def _take(self, positions: IntArray) -> IntArray:
        return self._values(positions, 0, False, positions.shape[0])

    def _take_range(self, start: int, stop: int) -> IntArray:
        return self._values(np.empty(0, dtype=np.int64), start, True, stop - start)

    def __reduce__(self) -> tuple[Any, ...]:
        return (RandomBlockOrder, (self._n, self.key, self.block, self.window))

    def __repr__(self) -> str:
        return f"RandomBlockOrder(num_seqs={self._n}, key={self.key:#018x}, block={self.block}, window={self.window})"
