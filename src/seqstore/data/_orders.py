"""Epoch orders of datasets: :func:`dataset_order` supplies lengths to :func:`seqstore.order.seq_order`.

``laplace`` gets the dataset's lazy lengths view: ``seq_order`` gathers one bin's lengths at a time
with ``take`` (O(bin) memory). The global-sort orderings (``sorted*``, ``sort_bin_shuffle*``) need
an array; the dataset supplies one (a cached ``.npy`` where it can, else in memory: O(N)).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..order import Order, seq_order
from ._lengths import LengthsView

__all__ = ["dataset_order", "ordering_name", "needs_lengths"]

_NEEDS_ARRAY = ("sorted", "sorted_reverse", "sort_bin_shuffle", "sort_bin_shuffle_x2")


def ordering_name(ordering: Any) -> str:
    """The ordering's name (``"laplace"`` for ``"laplace:.1000"``); ``"explicit"`` for arrays/paths."""
    if isinstance(ordering, str) and not ordering.endswith(".npy"):
        return ordering.split(":", 1)[0]
    return "explicit"


def needs_lengths(ordering: Any) -> bool:
    return ordering_name(ordering) in ("laplace", *_NEEDS_ARRAY)


def dataset_order(
    n: int,
    ordering: Any,
    *,
    epoch: int,
    seed: int,
    partition_epoch: int = 1,
    shard_index: int = 0,
    num_shards: int = 1,
    lengths: Callable[[], LengthsView] | None = None,
    lengths_array: Callable[[], Any] | None = None,
    sort_cache: Any = None,
) -> Order:
    """The order of sub-epoch ``epoch`` on shard ``shard_index`` of ``num_shards`` over ``n`` sequences.

    Same meaning and arguments as :func:`seqstore.order.seq_order`; ``lengths`` supplies a lazy view
    (used by ``laplace``), ``lengths_array`` a NumPy array or memmap (used by ``sorted*`` and
    ``sort_bin_shuffle*``), both only called when the ordering needs them. O(1) construction.
    """
    name = ordering_name(ordering)
    if name == "laplace":
        if lengths is None:
            raise ValueError(f"ordering {ordering!r} needs lengths")
        return seq_order(
            n,
            ordering,
            epoch=epoch,
            seed=seed,
            lengths=lengths(),
            partition_epoch=partition_epoch,
            shard_index=shard_index,
            num_shards=num_shards,
        )
    arr = None
    if name in _NEEDS_ARRAY:
        if lengths_array is None:
            raise ValueError(f"ordering {ordering!r} needs lengths")
        arr = lengths_array()
    return seq_order(
        n,
        ordering,
        epoch=epoch,
        seed=seed,
        lengths=arr,
        partition_epoch=partition_epoch,
        shard_index=shard_index,
        num_shards=num_shards,
        sort_cache=sort_cache if arr is not None else None,
    )
