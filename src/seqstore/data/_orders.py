"""Epoch orders of datasets: :func:`dataset_order` supplies lengths to :func:`seqstore.order.seq_order`.

``laplace`` gets the dataset's lazy lengths view: ``seq_order`` gathers one bin's lengths at a time
with ``take`` (O(bin) memory). The global-sort orderings (``sorted*``, ``sort_bin_shuffle*``) need
an array; the dataset supplies one (a cached ``.npy`` where it can, else in memory: O(N)).
"""

from __future__ import annotations

import hashlib
import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..order import Order, ordering_name, ordering_needs_lengths, seq_order
from ._lengths import LengthsView

__all__ = ["dataset_order", "ordering_key"]


def ordering_key(ordering: Any) -> Any:
    """What a resume state records of ``ordering``: the ordering itself, or for an explicit order (an
    array, or a ``.npy`` path) ``explicit[-file]:<length>:<digest of its values>``: O(len) once per array
    (which is not to be changed in place once given) or per file version (path, size, mtime, ctime), then O(1)."""
    if ordering_name(ordering) != "explicit":
        return ordering
    if isinstance(ordering, (str, os.PathLike)):
        st = os.stat(ordering)
        memo: Any = (os.fspath(ordering), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    else:
        memo = id(ordering) if isinstance(ordering, np.ndarray) else None
    key = _DIGESTS.get(memo)
    if key is None:
        if isinstance(ordering, (str, os.PathLike)):
            key = _digest("explicit-file", np.load(os.fspath(ordering), mmap_mode="r"))
        else:
            key = _digest("explicit", np.asarray(ordering))
            if memo is not None:  # an array's entry goes with it (before its id can be another's)
                weakref.finalize(ordering, _DIGESTS.pop, memo, None)
        if memo is not None:
            _DIGESTS[memo] = key
    return key


#: ordering_key's digests by (path, size, mtime, ctime, inode) of a file, or id() of a live array
_DIGESTS: dict[Any, str] = {}


def _digest(tag: str, arr: Any) -> str:
    h = hashlib.blake2b(digest_size=8)
    for a in range(0, len(arr), 1 << 20):
        h.update(np.ascontiguousarray(arr[a : a + (1 << 20)], dtype=np.int64).tobytes())
    return f"{tag}:{len(arr)}:{h.hexdigest()}"


def dataset_order(n: int, ordering: Any, *, epoch: int, seed: int, partition_epoch: int = 1, shard_index: int = 0,
                  num_shards: int = 1, lengths: Callable[[], LengthsView] | None = None,
                  lengths_array: Callable[[], Any] | None = None, sort_cache: Any = None) -> Order:
    """The order of sub-epoch ``epoch`` on shard ``shard_index`` of ``num_shards`` over ``n`` sequences.

    Same meaning and arguments as :func:`seqstore.order.seq_order`; ``lengths`` supplies a lazy view
    (used by ``laplace``), ``lengths_array`` a NumPy array or memmap (used by ``sorted*`` and
    ``sort_bin_shuffle*``), both only called when the ordering needs them; ``sort_cache`` (a path, or a
    callable returning one or None, called after ``lengths_array``) is where the global sort index is
    cached. O(1) construction.
    """
    arr: Any = None
    cache = None
    if ordering_needs_lengths(ordering):
        laplace = ordering_name(ordering) == "laplace"
        supply = lengths if laplace else lengths_array
        if supply is None:
            raise ValueError(f"ordering {ordering!r} needs lengths")
        arr = supply()
        if not laplace:  # sorted*, sort_bin_shuffle*: an array and a global sort index
            cache = sort_cache() if callable(sort_cache) else sort_cache
    return seq_order(n, ordering, epoch=epoch, seed=seed, lengths=arr, partition_epoch=partition_epoch,
                     shard_index=shard_index, num_shards=num_shards, sort_cache=cache)
