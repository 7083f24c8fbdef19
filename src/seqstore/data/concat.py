"""Index-space composition: ``ConcatDataset`` (several datasets end to end) and ``SliceDataset``
(a contiguous range of one dataset).

``ConcatDataset`` index ``i`` lies in child ``k`` with ``start[k] <= i < start[k+1]`` (``start`` the
cumulative sizes, O(children)); locating many indices is one ``searchsorted``. Records, lengths and
batches are gathered per child, vectorised, and merged back in request order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numba
import numpy as np

from ._lengths import IntArray, LengthsView, OffsetLengths, as_index_array, check_int
from .base import Dataset, check_order_params, merge_batches, pad_ragged

__all__ = ["ConcatDataset", "SliceDataset", "ConcatLengths", "EndToEnd", "Split"]


@numba.njit(cache=True, nogil=True)
def _split_kernel(
    values: Any, starts: Any, child: Any, local: Any, order: Any, bounds: Any
) -> None:  # pragma: no cover - numba
    """child[i] = the k with starts[k] <= values[i] < starts[k+1] (binary search, last of equal starts),
    local[i] = values[i] - starts[child[i]]; ``order`` groups positions by child (stable counting sort)
    with group k at ``order[bounds[k]:bounds[k+1]]``."""
    count = starts.shape[0] - 1
    for k in range(count + 1):
        bounds[k] = 0
    for i in range(values.shape[0]):
        v = values[i]
        lo = 0
        hi = count  # find the last k with starts[k] <= v
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if starts[mid] <= v:
                lo = mid
            else:
                hi = mid
        child[i] = lo
        local[i] = v - starts[lo]
        bounds[lo + 1] += 1
    for k in range(count):
        bounds[k + 1] += bounds[k]
    fill = bounds[:-1].copy()
    for i in range(values.shape[0]):
        c = child[i]
        order[fill[c]] = i
        fill[c] += 1


class Split:
    """Values split over cumulative ``starts``: ``child``, ``local``, and the positions grouped by child.

    One numba pass, O(len) time and memory, O(children) extra.
    """

    __slots__ = ("child", "local", "order", "bounds")

    def __init__(self, values: IntArray, starts: IntArray) -> None:
        n = len(values)
        self.child = np.empty(n, dtype=np.int64)
        self.local = np.empty(n, dtype=np.int64)
        self.order = np.empty(n, dtype=np.int64)
        self.bounds = np.empty(len(starts), dtype=np.int64)
        if len(starts) < 2:
            raise ValueError("need at least one part")
        _split_kernel(np.ascontiguousarray(values, dtype=np.int64), starts, self.child, self.local, self.order,
                      self.bounds)

    def groups(self) -> Iterator[tuple[int, IntArray]]:
        """``(k, positions of part k)`` for each part that has any, positions ascending."""
        b = self.bounds.tolist()
        for k in range(len(b) - 1):
            if b[k + 1] > b[k]:
                yield k, self.order[b[k] : b[k + 1]]

    def prefetch(self, datasets: Sequence[Dataset]) -> None:
        """``datasets[k].prefetch`` of the local indices of each part ``k``."""
        for k, pos in self.groups():
            datasets[k].prefetch(self.local[pos])

    def get_batch(self, datasets: Sequence[Dataset], pad: bool) -> dict[str, Any]:
        """The records of the split values, one ``datasets[k].get_batch`` per part ``k``, merged in the
        values' order (padded when ``pad``)."""
        parts = [(pos, datasets[k].get_batch(self.local[pos])) for k, pos in self.groups()]
        if not parts:  # no values: the fields with no rows, from the first part
            parts = [(self.local, datasets[0].get_batch(self.local))]
        batch = merge_batches(parts, len(self.child))
        return pad_ragged(batch) if pad else batch


def joint_bfloat16_fields(datasets: Sequence[Dataset], names: Sequence[str], who: str) -> frozenset[str]:
    """The bfloat16 fields of ``datasets`` (named ``names``) merged into one dataset; ValueError where a field
    is bfloat16 bits in some and not in others (bits next to numbers would merge into wrong values)."""
    each = [d.bfloat16_fields() for d in datasets]
    joint = frozenset().union(*each)
    for field in sorted(joint):
        bits = [n for n, f in zip(names, each) if field in f]
        if len(bits) < len(each):
            other = [n for n, f in zip(names, each) if field not in f]
            raise ValueError(f"{who}: field {field!r} is bfloat16 (uint16 bits) in {bits} but not in {other}; "
                             "their records cannot be merged (open the stores with one bfloat16= mode, or give the "
                             "field one dtype in every dataset)")
    return joint


class ConcatLengths(LengthsView):
    """Lengths of several views end to end (``starts``: cumulative sizes, int64 (k+1,))."""

    def __init__(self, parts: Sequence[LengthsView], starts: IntArray) -> None:
        self.parts = list(parts)
        self.starts = starts
        self.n = int(starts[-1])

    def _take(self, indices: IntArray) -> IntArray:
        sp = Split(indices, self.starts)
        out = np.empty(len(indices), dtype=np.int64)
        for k, pos in sp.groups():
            out[pos] = self.parts[k]._take(sp.local[pos])
        return out

    def iter_chunks(self, size: int = 1 << 20) -> Iterator[IntArray]:
        for p in self.parts:
            yield from p.iter_chunks(size)


class EndToEnd(Dataset):
    """Datasets end to end: index ``_ends[k] + j`` is record ``j`` of ``datasets[k]`` (``_ends``: the
    cumulative sizes; ``_kind``: the cache key's tag). Records, lengths and batches are gathered per child,
    vectorised, and merged in request order (the children must return the same fields)."""

    datasets: list[Dataset]
    bf16: frozenset[str]
    _ends: IntArray
    _kind: str

    @property
    def num_seqs(self) -> int:
        return int(self._ends[-1])

    def cache_key(self) -> Any:
        keys = [d.cache_key() for d in self.datasets]
        return None if any(k is None for k in keys) else [self._kind, keys]

    def bfloat16_fields(self) -> frozenset[str]:
        return self.bf16

    def locate_many(self, indices: Any) -> tuple[IntArray, IntArray]:
        """(child number, index in the child) of each index. Vectorised: one search over O(children) offsets."""
        sp = Split(as_index_array(indices, self.num_seqs), self._ends)
        return sp.child, sp.local

    def lengths(self) -> LengthsView:
        """Lengths over the index space (the children's end to end), lazy."""
        return ConcatLengths([d.lengths() for d in self.datasets], self._ends)

    def get(self, i: int) -> dict[str, Any]:
        c, j = self.locate_many(np.array([i]))
        return self.datasets[int(c[0])].get(int(j[0]))

    def prefetch(self, indices: Any) -> None:
        Split(as_index_array(indices, self.num_seqs), self._ends).prefetch(self.datasets)

    def get_batch(self, indices: Any, *, pad: bool = False) -> dict[str, Any]:
        return Split(as_index_array(indices, self.num_seqs), self._ends).get_batch(self.datasets, pad)


class ConcatDataset(EndToEnd):
    """Datasets end to end: index ``start[k] + j`` is record ``j`` of ``datasets[k]``.

    The concatenation has its own ``ordering`` / ``seed`` / ``partition_epoch`` (children's are ignored).
    ``get_batch`` requires the children to return the same fields. ``cache_dir``: where the derived
    arrays of the concatenation (lengths and sort index for ``sorted*``/``sort_bin_shuffle*``, kept rows
    of a filter) are cached; default the first child's cache directory (file names are content
    fingerprints of all children, so any directory is safe). Memory O(children).
    """

    _kind = "concat"

    def __init__(self, datasets: Sequence[Dataset], *, ordering: Any = "default", seed: int = 0,
                 partition_epoch: int = 1, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset needs at least one dataset")
        for k, d in enumerate(self.datasets):
            if not isinstance(d, Dataset):
                raise TypeError(f"ConcatDataset: item {k} is a {type(d).__name__}, not a seqstore.data Dataset")
        self.bf16 = joint_bfloat16_fields(self.datasets, [str(k) for k in range(len(self.datasets))], "ConcatDataset")
        self.ordering, self.seed, self.partition_epoch = check_order_params(ordering, seed, partition_epoch)
        self._ends = self.starts = np.zeros(len(self.datasets) + 1, dtype=np.int64)
        np.cumsum([d.num_seqs for d in self.datasets], out=self.starts[1:])
        first = next((d.cache_dir for d in self.datasets if d.cache_dir is not None), None)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else first

    def locate(self, i: int) -> tuple[int, int]:
        c, j = self.locate_many(np.array([i]))
        return int(c[0]), int(j[0])

    def __repr__(self) -> str:
        return f"ConcatDataset({len(self.datasets)} datasets, n={self.num_seqs}, ordering={self.ordering!r})"


class SliceDataset(Dataset):
    """Records ``start .. stop-1`` of ``dataset`` as indices ``0 .. stop-start-1`` (O(1), no copy).

    Takes the base's ordering parameters unless given.
    """

    def __init__(self, dataset: Dataset, start: int, stop: int, *, ordering: Any = None, seed: int | None = None,
                 partition_epoch: int | None = None) -> None:
        n = dataset.num_seqs
        start, stop = check_int(start, "SliceDataset: start"), check_int(stop, "SliceDataset: stop")
        if not 0 <= start <= stop <= n:
            raise ValueError(f"SliceDataset: need 0 <= start <= stop <= {n}, got start={start}, stop={stop}")
        self.dataset = dataset
        self.start, self.stop = int(start), int(stop)
        self.ordering, self.seed, self.partition_epoch = check_order_params(ordering, seed, partition_epoch, dataset,
                                                                            "SliceDataset")
        self.cache_dir = dataset.cache_dir

    @property
    def num_seqs(self) -> int:
        return self.stop - self.start

    def cache_key(self) -> Any:
        k = self.dataset.cache_key()
        return None if k is None else ["slice", k, self.start, self.stop]

    def bfloat16_fields(self) -> frozenset[str]:
        return self.dataset.bfloat16_fields()

    def lengths(self) -> LengthsView:
        return OffsetLengths(self.dataset.lengths(), self.start, self.num_seqs)

    def get(self, i: int) -> dict[str, Any]:
        return self.dataset.get(int(as_index_array(np.array([i]), self.num_seqs)[0]) + self.start)

    def prefetch(self, indices: Any) -> None:
        self.dataset.prefetch(as_index_array(indices, self.num_seqs) + self.start)

    def get_batch(self, indices: Any, *, pad: bool = False) -> dict[str, Any]:
        return self.dataset.get_batch(as_index_array(indices, self.num_seqs) + self.start, pad=pad)

    def __repr__(self) -> str:
        return f"SliceDataset({self.dataset!r}[{self.start}:{self.stop}])"
