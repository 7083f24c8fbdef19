"""Length filtering: the sequences of a dataset with ``min_length <= length <= max_length``.

The kept indices are computed once in two chunked passes over the lengths (count, then fill; O(chunk)
memory) and cached as an int64 ``.npy`` in the dataset's cache directory, keyed by the dataset's
content fingerprint and the bounds; later opens memory-map it. A dataset without a cache identity
(in-memory lengths) keeps the indices in memory (O(kept)). Orders run over the kept index space
``[0, num_kept)`` with the base dataset's ordering parameters.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ._cache import cached_array, fingerprint, write_npy
from ._lengths import IntArray, LengthsView, as_index_array
from .base import Dataset, check_order_params

__all__ = ["FilteredDataset"]

_CHUNK = 1 << 20


class _KeptLengths(LengthsView):
    def __init__(self, base: LengthsView, kept: Any) -> None:
        self.base, self.kept = base, kept

    def __len__(self) -> int:
        return len(self.kept)

    def _take(self, indices: IntArray) -> IntArray:
        return self.base._take(np.asarray(self.kept[indices], dtype=np.int64))

    def iter_chunks(self, size: int = _CHUNK) -> Iterator[IntArray]:
        for a in range(0, len(self.kept), size):
            yield self.base._take(np.asarray(self.kept[a : a + size], dtype=np.int64))


class FilteredDataset(Dataset):
    """``dataset`` restricted to lengths in ``[min_length, max_length]`` (either bound may be None).

    Index ``i`` is base index ``kept[i]`` (ascending). ``cache_dir`` defaults to the base's.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        min_length: int | None = None,
        max_length: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        ordering: Any = None,
        seed: int | None = None,
        partition_epoch: int | None = None,
    ) -> None:
        for what, v in (("min_length", min_length), ("max_length", max_length)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
                raise ValueError(f"{what} must be an integer or None, got {v!r}")
        if min_length is not None and max_length is not None and min_length > max_length:
            raise ValueError(f"min_length {min_length} > max_length {max_length}: nothing would be kept")
        self.dataset = dataset
        self.min_length = None if min_length is None else int(min_length)
        self.max_length = None if max_length is None else int(max_length)
        self.ordering, self.seed, self.partition_epoch = check_order_params(
            dataset.ordering if ordering is None else ordering,
            dataset.seed if seed is None else seed,
            dataset.partition_epoch if partition_epoch is None else partition_epoch,
        )
        self.cache_dir = Path(cache_dir) if cache_dir is not None else dataset.cache_dir
        self.kept = self._compute_kept()

    def _mask(self, chunk: IntArray) -> np.ndarray[Any, Any]:
        ok = np.ones(len(chunk), dtype=bool)
        if self.min_length is not None:
            ok &= chunk >= self.min_length
        if self.max_length is not None:
            ok &= chunk <= self.max_length
        return ok

    def _kept_chunks(self) -> Iterator[IntArray]:
        base = 0
        for chunk in self.dataset.lengths().iter_chunks(_CHUNK):
            yield np.flatnonzero(self._mask(chunk)) + base
            base += len(chunk)

    def _compute_kept(self) -> Any:
        key = self.dataset.cache_key()
        if key is None or self.cache_dir is None:
            parts = list(self._kept_chunks())
            return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        path = Path(self.cache_dir) / f"kept-{fingerprint(key, self.min_length, self.max_length)}.npy"

        def compute(p: Path) -> None:
            count = sum(int(self._mask(c).sum()) for c in self.dataset.lengths().iter_chunks(_CHUNK))
            write_npy(p, self._kept_chunks(), count, np.int64)

        return cached_array(path, compute)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.dataset, self.min_length, self.max_length,
                           None if self.cache_dir is None else str(self.cache_dir), self.ordering, self.seed,
                           self.partition_epoch))

    @property
    def num_seqs(self) -> int:
        return len(self.kept)

    def cache_key(self) -> Any:
        k = self.dataset.cache_key()
        return None if k is None else ["filter", k, self.min_length, self.max_length]

    def bfloat16_fields(self) -> frozenset[str]:
        return self.dataset.bfloat16_fields()

    def base_indices(self, indices: Any) -> IntArray:
        """Base dataset indices of ``indices`` (int64, vectorised)."""
        return np.asarray(self.kept[as_index_array(indices, self.num_seqs)], dtype=np.int64)

    def lengths(self) -> LengthsView:
        return _KeptLengths(self.dataset.lengths(), self.kept)

    def get(self, i: int) -> dict[str, Any]:
        return self.dataset.get(int(self.base_indices(np.array([i]))[0]))

    def prefetch(self, indices: Any) -> None:
        self.dataset.prefetch(self.base_indices(indices))

    def get_batch(self, indices: Any, *, pad: bool = False) -> dict[str, Any]:
        return self.dataset.get_batch(self.base_indices(indices), pad=pad)

    def __repr__(self) -> str:
        return f"FilteredDataset({self.dataset!r}, {self.min_length}..{self.max_length}, kept={self.num_seqs})"


def _rebuild(dataset: Dataset, lo: int | None, hi: int | None, cache_dir: str | None, ordering: Any, seed: int,
             partition_epoch: int) -> FilteredDataset:
    return FilteredDataset(dataset, min_length=lo, max_length=hi, cache_dir=cache_dir, ordering=ordering, seed=seed,
                           partition_epoch=partition_epoch)
