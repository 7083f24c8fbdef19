"""``LengthsDataset``: a dataset of virtual records that only have a length.

For planning batches, tests and benchmarks: a corpus described by its lengths alone (an array, a
memory-mapped ``.npy`` path, or any lazy :class:`~seqstore.data.LengthsView`, e.g. lengths computed
from the index). ``get(i)`` returns ``{"length": int64 scalar array}``.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ._lengths import ArrayLengths, LengthsView, as_index_array, as_lengths
from .base import Dataset, check_order_params

__all__ = ["LengthsDataset"]


class LengthsDataset(Dataset):
    """Virtual records with lengths ``lengths`` (array, ``.npy`` path mapped read-only, or a LengthsView).

    A path pickles as the path; an array or view pickles by value. Memory: that of ``lengths``.
    """

    def __init__(self, lengths: Any, *, ordering: Any = "default", seed: int = 0, partition_epoch: int = 1,
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        self._path: str | None = None
        if isinstance(lengths, (str, os.PathLike)):
            self._path = os.fspath(lengths)
            lengths = ArrayLengths(np.load(self._path, mmap_mode="r", allow_pickle=False), where=self._path)
        self._lengths = as_lengths(lengths)
        self.ordering, self.seed, self.partition_epoch = check_order_params(ordering, seed, partition_epoch)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None

    def __reduce__(self) -> tuple[Any, ...]:
        src: Any = self._path if self._path is not None else self._lengths
        return (partial(LengthsDataset, src, ordering=self.ordering, seed=self.seed,
                        partition_epoch=self.partition_epoch, cache_dir=self.cache_dir), ())

    @property
    def num_seqs(self) -> int:
        return len(self._lengths)

    def cache_key(self) -> Any:
        if self._path is None:
            return None
        st = os.stat(self._path)
        return ["lengths-file", os.path.abspath(self._path), st.st_size, st.st_mtime_ns]

    def lengths(self) -> LengthsView:
        return self._lengths

    def get(self, i: int) -> dict[str, Any]:
        # (as get_batch and the other datasets: a float, bool or str index is refused, not cut to an int)
        return {"length": self._lengths._take(as_index_array(i, self.num_seqs))[0]}

    def get_batch(self, indices: Any, *, pad: bool = False) -> dict[str, Any]:
        return {"length": self._lengths._take(as_index_array(indices, self.num_seqs))}

    def __repr__(self) -> str:
        return f"LengthsDataset(n={self.num_seqs}, ordering={self.ordering!r}, seed={self.seed})"
