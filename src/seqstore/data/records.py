"""Record by record, gathered in blocks: :func:`iter_records`.

``dataset.get(i)`` per record pays a lookup and, on a store, its read-ahead planning, every time.
:func:`iter_records` walks an index sequence (an epoch order, a slice of one, any int array) in blocks:
one ``get_batch`` per block (the dataset's ``iter_batches``, so the next blocks' reads are in flight),
and hands out each record as a dict of NumPy views into its block.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ._lengths import check_int

__all__ = ["iter_gathered", "iter_records", "split_records", "RECORDS_BLOCK"]

#: records gathered at once by :func:`iter_records` (the default ``block``)
RECORDS_BLOCK = 128


def split_records(batch: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The records of an unpadded ``get_batch`` result as dicts of views into its arrays (no copy):
    a fixed field -> row ``b``, a ragged field -> its rows of record ``b``. O(records) small views."""
    names = list(batch)
    parts: list[Any] = []
    for v in batch.values():
        if isinstance(v, tuple):
            values, lengths = v
            ends = np.cumsum(lengths).tolist()
            starts = [0, *ends[:-1]]
            parts.append([values[a:b] for a, b in zip(starts, ends)])
        else:
            parts.append(list(v))
    for views in zip(*parts):
        yield dict(zip(names, views))


def _ints(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.int64]]:
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"iter_records: indices must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _blocks(indices: Any, block: int) -> Iterator[np.ndarray[Any, np.dtype[np.int64]]]:
    chunks = getattr(indices, "iter_chunks", None)
    if callable(chunks):  # a lazy Order: computed a block at a time
        for c in chunks(block):
            yield np.asarray(c, dtype=np.int64)
        return
    if isinstance(indices, np.ndarray) or not isinstance(indices, Iterable):
        arr = _ints(np.asarray(indices).reshape(-1))
        for lo in range(0, len(arr), block):
            yield arr[lo: lo + block]
        return
    it = iter(indices)
    while buf := list(itertools.islice(it, block)):
        yield _ints(np.array(buf))


def iter_gathered(dataset: Any, arrays: Iterable[Any], *, pad: bool, prefetch: int | None,
                  **options: Any) -> Iterator[tuple[Any, dict[str, Any]]]:
    """``(idx, get_batch(idx, pad=pad))`` of each index array of ``arrays``: through the dataset's
    ``iter_batches`` where it has one (the next ``prefetch`` arrays' reads in flight; ``options``: its
    other keywords), else one ``get_batch`` each. ``iter_batches`` pulls the arrays ahead of what it
    yields, so they are remembered until their batch comes."""
    if not hasattr(dataset, "iter_batches"):
        for idx in arrays:
            yield idx, dataset.get_batch(idx, pad=pad)
        return
    pending: deque[Any] = deque()

    def remember() -> Iterator[Any]:
        for idx in arrays:
            pending.append(idx)
            yield idx

    for batch in dataset.iter_batches(remember(), pad=pad, prefetch=prefetch, **options):
        yield pending.popleft(), batch


def iter_records(dataset: Any, indices: Any, *, block: int = RECORDS_BLOCK, prefetch: int | None = None,
                 with_index: bool = False) -> Iterator[dict[str, Any]]:
    """Records ``indices`` of ``dataset`` in that order, each a dict field -> NumPy view into its block
    (a ragged field: its (T, ...) rows; ``"index"``: the record's index with ``with_index``).

    ``indices``: an :class:`~seqstore.order.Order` (``dataset.epoch_order(e)``, walked a block at a
    time), an int array or any iterable of ints. ``block``: records per ``get_batch``. ``prefetch``:
    blocks whose reads are in flight (None: the dataset's default). A record holds its block's memory
    while it is referenced; views are writable and belong to the caller. Memory O(block x prefetch).
    """
    block = check_int(block, "iter_records: block", 1)
    for idx, batch in iter_gathered(dataset, _blocks(indices, block), pad=False, prefetch=prefetch):
        if with_index:
            if "index" in batch:
                raise KeyError("iter_records: with_index, but the dataset already has a field named 'index'")
            batch = {**batch, "index": idx}
        yield from split_records(batch)
