"""The dataset protocol every ``seqstore.data`` dataset implements, the length-filtered dataset its
``filter`` method returns, and batch-merging helpers.

A :class:`Dataset` is an index space ``[0, num_seqs)`` with lazy lengths, an epoch order per
(epoch, shard), and record access:

* ``num_seqs`` / ``len(ds)``; ``lengths()`` -> :class:`~seqstore.data.LengthsView` (lazy, int64);
* ``epoch_order(epoch, shard_index=0, num_shards=1)`` -> :class:`seqstore.order.Order` (lazy; the
  dataset's ``ordering``, ``seed`` and ``partition_epoch``, RETURNN semantics);
* ``get(i)`` -> dict field -> array; ``get_batch(indices)`` -> dict: a fixed field -> array (B, ...),
  a ragged field -> ``(values (sum lengths, ...), lengths int64 (B,))`` (``pad=True``: values
  zero-padded to (B, max length, ...));
* ``prefetch(indices)`` starts reading records that will be asked for soon (a no-op where nothing is
  read from disk); ``iter_batches(batches, pad=, prefetch=)`` gathers a sequence of index arrays with
  the next ``prefetch`` batches' reads in flight (:meth:`seqstore.Store.iter_batches` for datasets);
* ``filter(min_length=, max_length=)`` -> a :class:`~seqstore.data.FilteredDataset`;
* ``bfloat16_fields()`` -> the output names of bfloat16 fields (uint16 bits), after any renaming.

Datasets hold O(1) state (or O(children)) plus memory-mapped files, and pickle small (stores by path).
"""

from __future__ import annotations

import abc
import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..io import lookahead
from ..order import Order
from ..order.api import check_ordering
from ._cache import cached_array, fingerprint, write_npy
from ._lengths import IntArray, LengthsView, as_index_array, check_int, smallest_dtype
from ._orders import dataset_order, ordering_key
from .filter import KeptLengths, check_bounds, kept_indices

__all__ = ["Dataset", "FilteredDataset", "merge_batches", "pad_batch", "pad_ragged", "check_order_params"]


def check_order_params(ordering: Any, seed: Any, partition_epoch: Any, base: Any = None,
                       who: str = "dataset") -> tuple[Any, int, int]:
    """Validate a dataset's (ordering, seed, partition_epoch), each None taken from dataset ``base`` when
    given; raises ValueError naming the bad one. ``who`` (the dataset over ``base``, by name) cannot take
    an explicit order from ``base``: its values are ``base``'s indices, not ``who``'s."""
    if base is not None:
        if ordering is None and not isinstance(base.ordering, str):
            raise ValueError(f"{who}: the ordering of {base!r} is an explicit order of its own indices, which "
                             f"are not the indices of the {who} over it; give it an ordering ({who}(dataset, ..., "
                             f"ordering=...): a name, or an explicit order of the {who}'s indices)")
        ordering = base.ordering if ordering is None else ordering
        seed = base.seed if seed is None else seed
        partition_epoch = base.partition_epoch if partition_epoch is None else partition_epoch
    if not isinstance(ordering, str) and not isinstance(ordering, (np.ndarray, Path, list, tuple, range)):
        raise ValueError(f"ordering must be an ordering name or an explicit order, got {type(ordering).__name__}")
    check_ordering(ordering)  # at construction, not at the first epoch_order
    return ordering, check_int(seed, "seed"), check_int(partition_epoch, "partition_epoch", 1)


class Dataset(abc.ABC):
    """Base class of the datasets (see the module docstring for the protocol).

    Subclasses set ``ordering``, ``seed``, ``partition_epoch`` and implement ``num_seqs``,
    ``lengths``, ``get`` and ``get_batch``; ``epoch_order`` is generic (override for composite orders).
    ``cache_dir`` (or None) is where O(N) derived arrays go; ``cache_key()`` identifies the content.
    """

    ordering: Any = "default"
    seed: int = 0
    partition_epoch: int = 1
    cache_dir: Path | None = None

    @property
    @abc.abstractmethod
    def num_seqs(self) -> int:
        """Number of sequences."""

    def __len__(self) -> int:
        return self.num_seqs

    @abc.abstractmethod
    def lengths(self) -> LengthsView:
        """Lazy int64 lengths of all sequences (the dataset's length measure, e.g. frames)."""

    @abc.abstractmethod
    def get(self, i: int) -> dict[str, Any]:
        """Record ``i`` as a dict field -> array (views where the source allows)."""

    @abc.abstractmethod
    def get_batch(self, indices: Any, *, pad: bool = False) -> dict[str, Any]:
        """Records ``indices`` at once; see the module docstring for the layout."""

    def prefetch(self, indices: Any) -> None:
        """Start reading records ``indices`` without waiting (datasets over stores pass it on; others
        have nothing to read ahead)."""
        return None

    def iter_batches(self, batches: Iterable[Any], *, pad: bool = False, prefetch: int | None = None,
                     cached: bool = False) -> Iterator[dict[str, Any]]:
        """``get_batch`` of each index array of ``batches`` (consumed lazily), with :meth:`prefetch` of
        the next ``prefetch`` batches (None: 2) issued before each batch is gathered (``cached``: a
        store's, see ``Store.iter_batches``; nothing here)."""
        for batch, _ in lookahead(batches, 2 if prefetch is None else prefetch, self._advise):
            yield self.get_batch(batch, pad=pad)

    def _advise(self, batch: Any) -> None:
        """:meth:`prefetch` of a batch ahead, as advice: a read that fails is asked for again by that
        batch's ``get_batch``, which raises where it is due (not in place of the batches before it)."""
        with contextlib.suppress(Exception):
            self.prefetch(batch)

    def cache_key(self) -> Any:
        """JSON-encodable identity of the content (for cache file names), or None if unknown."""
        return None

    def bfloat16_fields(self) -> frozenset[str]:
        """Names, as ``get``/``get_batch`` return them, of the fields stored as bfloat16 (returned as uint16
        bits unless the store was opened with another ``bfloat16`` mode). Default: none. O(fields)."""
        return frozenset()

    def order_identity(self) -> dict[str, Any]:
        """What a resume state records of this dataset's epoch orders (JSON-able): its type, size, content
        key and order parameters (a combination adds what its children's windows depend on); a state is
        refused by a dataset whose identity differs."""
        return {"type": f"{type(self).__module__}.{type(self).__qualname__}", "num_seqs": int(self.num_seqs),
                "key": self.cache_key(), "ordering": str(ordering_key(self.ordering)), "seed": int(self.seed),
                "partition_epoch": int(self.partition_epoch)}

    def epoch_order(self, epoch: int, shard_index: int = 0, num_shards: int = 1) -> Order:
        """The lazy order of sub-epoch ``epoch`` (1-based) on shard ``shard_index`` of ``num_shards``.

        Values are indices in ``[0, num_seqs)``. O(1) to build (``sorted*`` / ``sort_bin_shuffle*``
        need the lengths array and a global sort index: cached on disk where ``cache_dir`` is set).
        """
        return dataset_order(self.num_seqs, self.ordering, epoch=epoch, seed=self.seed,
                             partition_epoch=self.partition_epoch, shard_index=shard_index, num_shards=num_shards,
                             lengths=self.lengths, lengths_array=self.lengths_array, sort_cache=self._sort_cache)

    def _cache_path(self, kind: str, *extra: Any) -> Path | None:
        key = self.cache_key()
        if self.cache_dir is None or key is None:
            return None
        return Path(self.cache_dir) / f"{kind}-{fingerprint(key, *extra)}.npy"

    def _sort_cache(self) -> Path | None:
        return self._cache_path("sortidx")

    def lengths_array(self) -> np.ndarray[Any, Any]:
        """All lengths as one array (smallest unsigned dtype): a cached memmap when ``cache_dir`` is set,
        else computed in memory (O(N)). Only the global-sort orderings need it."""
        view = self.lengths()
        path = self._cache_path("lengths")
        if path is None:
            return view.to_numpy()

        def compute(p: Path) -> None:
            low, top = 0, 0
            for chunk in view.iter_chunks():
                if chunk.size:
                    low, top = min(low, int(chunk.min())), max(top, int(chunk.max()))
            if low < 0:  # (an unsigned cache would wrap it into a huge length)
                raise ValueError(f"{self!r}: a sequence length is negative ({low}); lengths must be >= 0")
            write_npy(p, view.iter_chunks(), len(view), smallest_dtype(top))

        return cached_array(path, compute, length=len(view))

    def filter(self, *, min_length: int | None = None, max_length: int | None = None,
               cache_dir: Any = None) -> FilteredDataset:
        """The sequences with ``min_length <= length <= max_length`` (see :class:`FilteredDataset`)."""
        return FilteredDataset(self, min_length=min_length, max_length=max_length, cache_dir=cache_dir)


class FilteredDataset(Dataset):
    """``dataset`` restricted to lengths in ``[min_length, max_length]`` (either bound may be None).

    Index ``i`` is base index ``kept[i]`` (ascending; computed and cached by
    :func:`seqstore.data.filter.kept_indices`). ``cache_dir`` defaults to the base's. Orders run over the
    kept index space ``[0, num_kept)`` with the base dataset's ordering parameters unless given. It lives
    here, next to :meth:`Dataset.filter`, because each of the two needs the other.
    """

    def __init__(self, dataset: Dataset, *, min_length: int | None = None, max_length: int | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, ordering: Any = None, seed: int | None = None,
                 partition_epoch: int | None = None) -> None:
        self.min_length, self.max_length = check_bounds(min_length, max_length)
        self.dataset = dataset
        self.ordering, self.seed, self.partition_epoch = check_order_params(ordering, seed, partition_epoch, dataset,
                                                                            "FilteredDataset")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else dataset.cache_dir
        self.kept = kept_indices(dataset.lengths, dataset.cache_key(), self.cache_dir, self.min_length, self.max_length)

    def __reduce__(self) -> tuple[Any, ...]:
        return (partial(FilteredDataset, self.dataset, min_length=self.min_length, max_length=self.max_length,
                        cache_dir=None if self.cache_dir is None else str(self.cache_dir), ordering=self.ordering,
                        seed=self.seed, partition_epoch=self.partition_epoch), ())

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
        return KeptLengths(self.dataset.lengths(), self.kept)

    def get(self, i: int) -> dict[str, Any]:
        return self.dataset.get(int(self.base_indices(np.array([i]))[0]))

    def prefetch(self, indices: Any) -> None:
        self.dataset.prefetch(self.base_indices(indices))

    def get_batch(self, indices: Any, *, pad: bool = False) -> dict[str, Any]:
        return self.dataset.get_batch(self.base_indices(indices), pad=pad)

    def __repr__(self) -> str:
        return f"FilteredDataset({self.dataset!r}, {self.min_length}..{self.max_length}, kept={self.num_seqs})"


def pad_batch(values: np.ndarray[Any, Any], lengths: IntArray) -> np.ndarray[Any, Any]:
    """Concatenated ragged ``values`` (sum(lengths), ...) -> zero-padded (B, max(lengths), ...)."""
    b = len(lengths)
    t = int(lengths.max()) if b else 0
    out = np.zeros((b, t, *values.shape[1:]), dtype=values.dtype)
    if b and t:
        rows = np.repeat(np.arange(b), lengths)
        starts = np.cumsum(lengths) - lengths
        cols = np.arange(len(values)) - np.repeat(starts, lengths)
        out[rows, cols] = values
    return out


def pad_ragged(batch: dict[str, Any]) -> dict[str, Any]:
    """Pad every ragged ``(values, lengths)`` entry of ``batch`` in place (see :func:`pad_batch`)."""
    for name, v in batch.items():
        if isinstance(v, tuple):
            batch[name] = (pad_batch(v[0], v[1]), v[1])
    return batch


def merge_batches(parts: Sequence[tuple[IntArray, Mapping[str, Any]]], total: int) -> dict[str, Any]:
    """Merge per-source batches into one in request order.

    ``parts``: (positions in the merged batch (int64), batch dict) per source; positions of all parts
    together are a permutation of ``range(total)``. Every part must have the same fields. Fixed
    fields are arrays (B_k, ...); ragged fields ``(values, lengths)`` (unpadded). Vectorised:
    O(total rows) time and memory.
    """
    if not parts:
        return {}
    names = list(parts[0][1])
    for _pos, batch in parts[1:]:
        if list(batch) != names and set(batch) != set(names):
            raise KeyError(f"cannot merge batches with different fields: {sorted(names)} vs {sorted(batch)}")
    if len(parts) == 1:
        pos, batch = parts[0]
        if np.array_equal(pos, np.arange(total)):
            return dict(batch)
    all_pos = np.concatenate([p for p, _ in parts])
    perm = np.argsort(all_pos, kind="stable")
    out: dict[str, Any] = {}
    for name in names:
        first = parts[0][1][name]
        if isinstance(first, tuple):
            values = np.concatenate([b[name][0] for _, b in parts])
            lens = np.concatenate([np.asarray(b[name][1], dtype=np.int64) for _, b in parts])
            starts = np.cumsum(lens) - lens
            new_lens = lens[perm]
            new_starts = np.cumsum(new_lens) - new_lens
            rows = np.repeat(starts[perm] - new_starts, new_lens) + np.arange(int(new_lens.sum()), dtype=np.int64)
            out[name] = (values[rows], new_lens)
        else:
            out[name] = np.concatenate([np.asarray(b[name]) for _, b in parts])[perm]
    return out
