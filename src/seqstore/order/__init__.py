"""Lazy epoch orders: every RETURNN ordering, partition epoch and sharding, in O(1) memory.

``seq_order(num_seqs, ordering, epoch=...)`` returns an :class:`Order`, a lazy
``collections.abc.Sequence[int]``; nothing of size N is allocated unless the ordering needs a global
sort (``sorted*``, ``sort_bin_shuffle*``), whose index :func:`sort_index` writes to disk once and maps.

Modules: ``api`` (names, epochs, partition/shards), ``base`` (the Order API, slices), ``kinds``
(range, every-n, permutation, sampling, explicit, sorted), ``binned`` (laplace, sort_bin_shuffle),
``random_block`` (the locality-aware block/window shuffle),
``sort_index`` (bounded-memory radix argsort), ``_kernels`` (numba), ``_keys`` (key derivation),
``_arrays`` (arrays that pickle by file reference).
"""

from .api import ORDERINGS, ordering_name, ordering_needs_lengths, seq_order
from .base import Order, SliceOrder, block_bounds
from .binned import BinnedOrder, LaplaceOrder, SortBinShuffleOrder
from .kinds import EveryNOrder, ExplicitOrder, PermutationOrder, RangeOrder, SampleOrder, SortedOrder
from .random_block import RandomBlockOrder
from .sort_index import sort_index

__all__ = ["ORDERINGS", "BinnedOrder", "EveryNOrder", "ExplicitOrder", "LaplaceOrder", "Order", "PermutationOrder",
           "RandomBlockOrder", "RangeOrder", "SampleOrder", "SliceOrder", "SortBinShuffleOrder", "SortedOrder",
           "block_bounds", "ordering_name", "ordering_needs_lengths", "seq_order", "sort_index"]
