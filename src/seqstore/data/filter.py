"""Length filtering of an index space: the indices whose length is in ``[min_length, max_length]``.

The kept indices are computed in two chunked passes over a :class:`LengthsView` (count, then fill;
O(chunk) memory) and cached as an int64 ``.npy`` keyed by the content fingerprint and the bounds;
without a cache identity they stay in memory (O(kept)). :class:`seqstore.data.FilteredDataset` (in
``base``, next to ``Dataset.filter``) is the dataset over them; :class:`KeptLengths` their lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ._cache import cached_array, fingerprint, write_npy
from ._lengths import IntArray, LengthsView, check_optional_int

__all__ = ["KeptLengths", "check_bounds", "kept_indices"]

_CHUNK = 1 << 20


class KeptLengths(LengthsView):
    """The lengths of ``base`` at the indices ``kept`` (an int64 array or memmap)."""

    def __init__(self, base: LengthsView, kept: Any) -> None:
        self.base, self.kept, self.n = base, kept, len(kept)

    def _take(self, indices: IntArray) -> IntArray:
        return self.base._take(np.asarray(self.kept[indices], dtype=np.int64))

    def iter_chunks(self, size: int = _CHUNK) -> Iterator[IntArray]:
        for a in range(0, len(self.kept), size):
            yield self.base._take(np.asarray(self.kept[a : a + size], dtype=np.int64))


def check_bounds(min_length: Any, max_length: Any) -> tuple[int | None, int | None]:
    """Validate the length bounds (integers or None, ``min_length <= max_length``); raises ValueError."""
    lo = check_optional_int(min_length, "min_length")
    hi = check_optional_int(max_length, "max_length")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"min_length {lo} > max_length {hi}: nothing would be kept")
    return lo, hi


def _mask(chunk: IntArray, lo: int | None, hi: int | None) -> np.ndarray[Any, Any]:
    ok = np.ones(len(chunk), dtype=bool)
    if lo is not None:
        ok &= chunk >= lo
    if hi is not None:
        ok &= chunk <= hi
    return ok


def _kept_chunks(lengths: Callable[[], LengthsView], lo: int | None, hi: int | None) -> Iterator[IntArray]:
    base = 0
    for chunk in lengths().iter_chunks(_CHUNK):
        yield np.flatnonzero(_mask(chunk, lo, hi)) + base
        base += len(chunk)


def kept_indices(lengths: Callable[[], LengthsView], key: Any, cache_dir: Path | None, lo: int | None,
                 hi: int | None) -> Any:
    """The ascending int64 indices ``i`` with ``lo <= lengths()[i] <= hi`` (a bound of None is open).

    ``key`` is the content identity of the lengths' owner (None: unknown); with a key and a
    ``cache_dir`` the result is a memmap of ``kept-<fingerprint>.npy`` there, else an in-memory array.
    """
    if key is None or cache_dir is None:
        parts = list(_kept_chunks(lengths, lo, hi))
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    path = Path(cache_dir) / f"kept-{fingerprint(key, lo, hi)}.npy"

    def compute(p: Path) -> None:
        count = sum(int(_mask(c, lo, hi).sum()) for c in lengths().iter_chunks(_CHUNK))
        write_npy(p, _kept_chunks(lengths, lo, hi), count, np.int64)

    return cached_array(path, compute)
