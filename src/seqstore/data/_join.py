"""Vectorised id join between stores, from the stores' id files (no Python string per id).

:func:`join_rows` yields, chunk by chunk of the *control* store's records, the global row of the
record with the same id in the *target* store (-1 where there is none). The control's ids are read
with :meth:`~seqstore.Store.ids` (a chunk within one shard: a zero-copy slice of its mapped
``_ids.npy``; a remote store fetches the shards first) and looked up with the target's
:meth:`~seqstore.Store.index_encoded`, the same vectorised hash search and byte comparison as
``Store.index_many``: memory O(chunk) plus the mapped files.
Duplicate ids resolve as ``Store.index`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..store import Store
from ..store.ids import hash_ids
from ._lengths import IntArray

__all__ = ["join_rows", "id_hashes"]

CHUNK = 1 << 18


def id_hashes(data: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The format's 64-bit hash of ids ``data[offsets[i]-offsets[0] : offsets[i+1]-offsets[0]]``
    (``offsets`` of a slice of an id file, ``data`` that slice's bytes): :func:`seqstore.store.ids.hash_ids`
    on the rebased offsets. O(bytes)."""
    off = np.asarray(offsets, dtype=np.int64)
    return hash_ids(data, off - off[0] if len(off) else off)


def join_rows(control: Store, target: Store, chunk: int = CHUNK) -> Iterator[IntArray]:
    """Yield int64 arrays: for each control record in order, the target row with the same id, or -1.

    Both stores need ids (a store with no records is fine). O(chunk) memory per step.
    """
    tgt = target if len(target) else None
    n = len(control)
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        if tgt is None:
            yield np.full(b - a, -1, dtype=np.int64)
            continue
        # through the store (a remote store fetches the shards it maps; no shard's files are opened by path)
        qdata, qoff = control.ids(np.arange(a, b, dtype=np.int64))
        yield tgt.index_encoded(np.asarray(qdata), qoff)
