"""``CombinedDataset``: several datasets sampled per epoch, one ordering over the union, all lazy.

Index spaces (the sampling rules in full: docs/datasets.md):

* **combined index** ``i`` in ``[0, sum N_k)``: child ``k``'s record ``j`` is ``start_N[k] + j`` (the
  children end to end); ``get``/``get_batch``/``lengths`` and the epoch orders' values use it;
  :meth:`CombinedDataset.locate_many` maps back by one ``searchsorted`` over the O(children) offsets.
* **union position** ``u`` in ``[0, M)``, ``M = sum K_k``, per full epoch ``e``: ``u`` in child ``k``'s
  block ``[start_K[k], start_K[k+1])`` is window position ``w = u - start_K[k]``, i.e. position
  ``g mod N_k``, ``g = (e-1) * K_k + w``, of the child's order for epoch ``e`` (``child_epoch="same"``,
  RETURNN's) or for epoch ``g // N_k + 1`` (``"pass"``: the child is walked pass after pass).

The epoch order is ``seq_order(M, ordering, ...)`` over union positions (partition epoch and shards
applied to it) composed with the window map (:class:`CombinedOrder`). For ``laplace`` the order's
``values`` callable maps a bin's union positions to (combined index, length) in one pass over the
children: O(children) memory plus O(bin) while walking. ``sorted*``/``sort_bin_shuffle*`` over the
union materialise its lengths (O(M), in memory: the union changes every epoch, nothing to cache).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from functools import partial
from typing import Any

import numpy as np

from ..order import Order, ordering_name, seq_order
from ._lengths import IntArray, LengthsView, MappedLengths, check_int
from ._orders import dataset_order
from .base import Dataset, check_order_params
from .concat import EndToEnd, Split, joint_bfloat16_fields

__all__ = ["CombinedDataset", "CombinedOrder", "EpochWindows", "walk_passes", "weighted_sizes"]

_CHILD_EPOCHS = ("same", "pass")
#: child orders an EpochWindows keeps per child (bounded: a child walked pass after pass has one per pass)
_KEPT_ORDERS = 16


def weighted_sizes(weights: Sequence[float], epoch_size: int) -> IntArray:
    """Per-child sizes ``K`` with ``sum K == epoch_size`` exactly, ``K_k ~ epoch_size * w_k / sum w``.

    Largest-remainder rounding in exact rational arithmetic: every child gets ``floor`` of its quota,
    the ``epoch_size - sum floors`` leftover units go to the largest fractional parts, ties to the lower
    child number. A zero weight gets 0. Raises ValueError for negative, non-finite or all-zero weights.
    """
    epoch_size = check_int(epoch_size, "epoch_size", 0)
    ws: list[Fraction] = []
    for k, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating, Fraction)):
            raise ValueError(f"weight {k} must be a number, got {w!r}")
        if not math.isfinite(float(w)) or w < 0:
            raise ValueError(f"weight {k} must be finite and >= 0, got {w!r}")
        ws.append(Fraction(w) if not isinstance(w, np.floating) else Fraction(float(w)))
    total = sum(ws, Fraction(0))
    if total == 0:
        raise ValueError("weights must not all be zero")
    quotas = [w * epoch_size / total for w in ws]
    sizes = [math.floor(q) for q in quotas]
    left = epoch_size - sum(sizes)
    by_remainder = sorted(range(len(ws)), key=lambda k: (-(quotas[k] - sizes[k]), k))
    for k in by_remainder[:left]:
        sizes[k] += 1
    return np.asarray(sizes, dtype=np.int64)


def walk_passes(g: IntArray, n: int, order: Callable[[int], Order]) -> IntArray:
    """Position ``g mod n`` of ``order(g // n + 1)`` for each ``g`` (a dataset of ``n`` sequences walked
    pass after pass). The positions are grouped by pass with one sort and each pass's order is asked
    once: a scan of every position per pass would be quadratic in a walk over many passes."""
    by = np.argsort(g // n, kind="stable")
    passes = g[by] // n
    cuts = (np.flatnonzero(passes[1:] != passes[:-1]) + 1).tolist()
    local = np.empty(len(g), dtype=np.int64)
    for a, b in zip([0, *cuts], [*cuts, len(g)]):
        local[by[a:b]] = order(int(passes[a]) + 1)._take(g[by[a:b]] % n)
    return local


class EpochWindows:
    """The window map of one full epoch: union position -> combined index (vectorised, O(children)).

    Holds the children, their sizes ``N``, sampling sizes ``K`` and both cumulative offset arrays; child
    orders are built on first use and at most ``16 x children`` of them are kept (``child_epoch="same"``
    needs one per child; ``"pass"`` one per pass touched, rebuilt when asked for again).
    """

    def __init__(self, datasets: Sequence[Dataset], sizes: IntArray, num: IntArray, full_epoch: int,
                 child_epoch: str) -> None:
        self.datasets = list(datasets)
        self.K = np.asarray(sizes, dtype=np.int64)
        self.N = np.asarray(num, dtype=np.int64)
        self.start_K = np.zeros(len(self.K) + 1, dtype=np.int64)
        np.cumsum(self.K, out=self.start_K[1:])
        self.start_N = np.zeros(len(self.N) + 1, dtype=np.int64)
        np.cumsum(self.N, out=self.start_N[1:])
        self.full_epoch = int(full_epoch)
        self.child_epoch = child_epoch
        self._orders: dict[tuple[int, int], Order] = {}

    @property
    def size(self) -> int:
        """M = sum K: union positions per full epoch."""
        return int(self.start_K[-1])

    @property
    def num_values(self) -> int:
        """Sum N: the combined index space."""
        return int(self.start_N[-1])

    def window_start(self, k: int) -> int:
        """First position (before ``mod N_k``) of child ``k``'s window: ``(e-1) * K_k``."""
        return (self.full_epoch - 1) * int(self.K[k])

    def child_order(self, k: int, epoch: int) -> Order:
        key = (k, epoch)
        order = self._orders.get(key)
        if order is None:
            order = self.datasets[k].epoch_order(epoch)
            if len(order) != int(self.N[k]):
                raise ValueError(f"child {k}: its epoch order has {len(order)} positions for {int(self.N[k])} "
                                 "sequences (orderings that drop sequences, like default_every_n, cannot be sampled by "
                                 "windows)")
            if len(self._orders) >= _KEPT_ORDERS * len(self.datasets):
                # ("pass": an epoch much larger than a child walks many of its passes, one order each; the
                # passes are visited in order, so the old ones are not asked for again soon)
                self._orders.clear()
            self._orders[key] = order
        return order

    def _child_local(self, k: int, w: IntArray) -> IntArray:
        n = int(self.N[k])
        g = w + self.window_start(k)
        if self.child_epoch == "same":
            return self.child_order(k, self.full_epoch)._take(g % n)
        return walk_passes(g, n, partial(self.child_order, k))

    def map(self, u: IntArray) -> IntArray:
        """Combined index of each union position (int64 array in, int64 array out). Vectorised per child."""
        return self._map(u, None)[0]

    def map_lengths(self, u: IntArray, lengths: Sequence[LengthsView]) -> tuple[IntArray, IntArray]:
        """(combined index, length) of union positions ``u`` in one pass; ``lengths``: the children's views."""
        out, lens = self._map(u, lengths)
        assert lens is not None
        return out, lens

    def _map(self, u: IntArray, lengths: Sequence[LengthsView] | None) -> tuple[IntArray, IntArray | None]:
        sp = Split(np.asarray(u, dtype=np.int64), self.start_K)
        out = np.empty(len(u), dtype=np.int64)
        lens = None if lengths is None else np.empty(len(u), dtype=np.int64)
        for k, pos in sp.groups():
            local = self._child_local(k, sp.local[pos])
            out[pos] = local + self.start_N[k]
            if lens is not None and lengths is not None:
                lens[pos] = lengths[k].take(local)
        return out, lens

    def __reduce__(self) -> tuple[Any, ...]:
        return (EpochWindows, (self.datasets, self.K, self.N, self.full_epoch, self.child_epoch))


class CombinedOrder(Order):
    """``windows.map(union[i])``: an order over union positions composed with the window map.

    ``num_seqs`` is the combined index space (sum N); ``len`` is that of ``union``. O(children) memory
    plus whatever ``union`` holds.
    """

    def __init__(self, union: Order, windows: EpochWindows) -> None:
        self.union = union
        self.windows = windows

    @property
    def num_seqs(self) -> int:
        return self.windows.num_values

    def __len__(self) -> int:
        return len(self.union)

    def _take(self, positions: IntArray) -> IntArray:
        return self.windows.map(self.union._take(positions))

    def _take_range(self, start: int, stop: int) -> IntArray:
        return self.windows.map(self.union._take_range(start, stop))

    def __repr__(self) -> str:
        return f"CombinedOrder({self.union!r}, children={len(self.windows.K)})"


def _per_child(value: Any, names: list[str], what: str) -> list[Any]:
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ValueError(f"{what}: unknown dataset name(s) {unknown}; datasets are {names}")
        missing = [k for k in names if k not in value]
        if missing:
            raise ValueError(f"{what}: no value for dataset(s) {missing}")
        return [value[k] for k in names]
    vals = list(value)
    if len(vals) != len(names):
        raise ValueError(f"{what}: got {len(vals)} values for {len(names)} datasets {names}")
    return vals


class CombinedDataset(EndToEnd):
    """Several datasets sampled per epoch with one ordering over the union (see the module docstring).

    ``datasets``: name -> dataset (children keep their own ordering and seed; their ``partition_epoch``
    must be 1: partition the combined dataset instead). Per full epoch child ``k`` contributes ``K_k``
    sequences:

    * ``sampling_sizes`` (name -> int, or a sequence): ``K_k`` directly (0 skips the child);
    * ``weights`` + ``epoch_size``: ``K`` from :func:`weighted_sizes` (sums to ``epoch_size`` exactly);
    * ``epoch_size`` alone: weights proportional to the children's sizes;
    * nothing: ``K_k = N_k`` (every child whole, every epoch).

    ``ordering`` / ``seed`` / ``partition_epoch`` order the union; ``child_epoch`` picks which child
    order a window is cut from (``"same"``, RETURNN's, or ``"pass"``). Memory O(children).
    """

    _kind = "combined"

    def __init__(self, datasets: Mapping[str, Dataset], *,
                 sampling_sizes: Mapping[str, int] | Sequence[int] | None = None,
                 weights: Mapping[str, float] | Sequence[float] | None = None, epoch_size: int | None = None,
                 ordering: Any = "default", seed: int = 0, partition_epoch: int = 1, child_epoch: str = "same") -> None:
        if not isinstance(datasets, Mapping) or not datasets:
            raise ValueError("CombinedDataset needs a non-empty mapping name -> dataset")
        self.names = [str(k) for k in datasets]
        self.datasets = list(datasets.values())
        for name, d in zip(self.names, self.datasets):
            if not isinstance(d, Dataset):
                raise TypeError(f"CombinedDataset: {name!r} is a {type(d).__name__}, not a seqstore.data Dataset")
            if d.partition_epoch != 1:
                raise ValueError(f"CombinedDataset: dataset {name!r} has partition_epoch={d.partition_epoch}; children "
                                 "must have partition_epoch=1 (set partition_epoch on the CombinedDataset)")
        self.bf16 = joint_bfloat16_fields(self.datasets, self.names, "CombinedDataset")
        if child_epoch not in _CHILD_EPOCHS:
            raise ValueError(f"child_epoch must be one of {_CHILD_EPOCHS}, got {child_epoch!r}")
        self.child_epoch = child_epoch
        self.ordering, self.seed, self.partition_epoch = check_order_params(ordering, seed, partition_epoch)
        self.num = np.array([d.num_seqs for d in self.datasets], dtype=np.int64)
        self._ends = self.start_N = np.zeros(len(self.num) + 1, dtype=np.int64)
        np.cumsum(self.num, out=self.start_N[1:])

        if sampling_sizes is not None and (weights is not None or epoch_size is not None):
            raise ValueError("give either sampling_sizes or weights/epoch_size, not both")
        if sampling_sizes is not None:
            raw = _per_child(sampling_sizes, self.names, "sampling_sizes")
            sizes = np.asarray([check_int(v, f"sampling_sizes[{name!r}]", 0) for name, v in zip(self.names, raw)],
                               dtype=np.int64)
        elif weights is not None:
            if epoch_size is None:
                raise ValueError("weights need epoch_size (the number of sequences per full epoch)")
            sizes = weighted_sizes(_per_child(weights, self.names, "weights"), epoch_size)
        elif epoch_size is not None:
            if int(self.num.sum()) == 0:
                raise ValueError("epoch_size without weights weights children by size, but every dataset is empty")
            sizes = weighted_sizes([int(n) for n in self.num], epoch_size)
        else:
            sizes = self.num.copy()
        empty = [(n, int(k)) for n, k, m in zip(self.names, sizes, self.num) if k > 0 and m == 0]
        if empty:
            raise ValueError("cannot sample from empty dataset(s): "
                             + ", ".join(f"{n!r} (0 sequences, {k} requested per epoch)" for n, k in empty))
        self.sizes = sizes

    # ------------------------------------------------------------------------------ structure

    @property
    def epoch_size(self) -> int:
        """Sequences per full epoch: sum of the sampling sizes."""
        return int(self.sizes.sum())

    @property
    def sampling_sizes(self) -> dict[str, int]:
        return {n: int(k) for n, k in zip(self.names, self.sizes)}

    def order_identity(self) -> dict[str, Any]:
        """The union's order parameters, and the sampling sizes and child orders its windows are cut from."""
        return {**super().order_identity(), "sizes": self.sizes.tolist(), "child_epoch": self.child_epoch,
                "children": [d.order_identity() for d in self.datasets]}

    def windows(self, epoch: int) -> EpochWindows:
        """The window map of (sub-)epoch ``epoch``'s full epoch."""
        full = (check_int(epoch, "epoch", 1) - 1) // self.partition_epoch + 1
        return EpochWindows(self.datasets, self.sizes, self.num, full, self.child_epoch)

    def window(self, name: str, epoch: int) -> tuple[int, int]:
        """(first position before ``mod N``, length K) of child ``name``'s window in ``epoch``'s full epoch."""
        if name not in self.names:
            raise ValueError(f"CombinedDataset.window: unknown dataset {name!r}; datasets are {self.names}")
        k = self.names.index(name)
        return self.windows(epoch).window_start(k), int(self.sizes[k])

    def locate(self, i: int) -> tuple[str, int]:
        """(child name, index in the child) of combined index ``i``."""
        c, j = self.locate_many(np.array([i]))
        return self.names[int(c[0])], int(j[0])

    # ------------------------------------------------------------------------------ protocol

    def epoch_order(self, epoch: int, shard_index: int = 0, num_shards: int = 1) -> Order:
        """The combined order of sub-epoch ``epoch``: values are combined indices. O(1) to build."""
        w = self.windows(epoch)
        m = w.size
        common: dict[str, Any] = {"epoch": epoch, "seed": self.seed, "partition_epoch": self.partition_epoch,
                                  "shard_index": shard_index, "num_shards": num_shards}
        if ordering_name(self.ordering) == "laplace":  # values are combined indices: one window lookup each
            # (picklable: a bound method of the picklable window map)
            values = partial(w.map_lengths, lengths=[d.lengths() for d in self.datasets])
            return seq_order(m, self.ordering, **common, values=values, num_values=w.num_values)
        union = dataset_order(m, self.ordering, **common, lengths=lambda: MappedLengths(self.lengths(), m, w.map),
                              lengths_array=lambda: MappedLengths(self.lengths(), m, w.map).to_numpy())
        return CombinedOrder(union, w)

    def filter(self, *, min_length: int | None = None, max_length: int | None = None, cache_dir: Any = None) -> Any:
        """Not supported: a filter over combined indices would lose the sampling windows. Filter the
        children (``child.filter(...)``) and combine the filtered datasets."""
        raise TypeError("CombinedDataset.filter would drop the per-epoch sampling; filter the children instead: "
                        "CombinedDataset({name: ds.filter(min_length=..., max_length=...), ...}, ...)")

    def __repr__(self) -> str:
        return (f"CombinedDataset({self.sampling_sizes}, ordering={self.ordering!r}, seed={self.seed}, "
                f"partition_epoch={self.partition_epoch})")
