"""Vectorised id join between stores, straight from the on-disk id files (no Python string per id).

:func:`join_rows` yields, chunk by chunk of the *control* store's records, the global row of the
record with the same id in the *target* store (-1 where there is none). The control's ids are read
straight from its ``_ids.npy`` / ``_ids.offsets.npy`` (zero-copy slices per chunk, offsets rebased
once) and looked up with the target's :meth:`~seqstore.Store.index_encoded`, the same vectorised
hash search and byte comparison as ``Store.index_many``: memory O(chunk) plus the mapped files.
Duplicate ids resolve as ``Store.index`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..store import Store
from ..store.ids import hash_ids
from ._cache import load_npy
from ._lengths import IntArray

__all__ = ["join_rows", "id_hashes"]

CHUNK = 1 << 18


def _rebased(offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """int64 ``offsets - offsets[0]``: offsets of a slice of ids into that slice's own bytes."""
    off = np.asarray(offsets, dtype=np.int64)
    return off - off[0] if len(off) else off


def id_hashes(data: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The format's 64-bit hash of ids ``data[offsets[i]-offsets[0] : offsets[i+1]-offsets[0]]``
    (``offsets`` of a slice of an id file, ``data`` that slice's bytes): :func:`seqstore.store.ids.hash_ids`
    on the rebased offsets. O(bytes)."""
    return hash_ids(data, _rebased(offsets))


def join_rows(control: Store, target: Store, chunk: int = CHUNK) -> Iterator[IntArray]:
    """Yield int64 arrays: for each control record in order, the target row with the same id, or -1.

    Both stores need ids (a store with no records is fine). O(chunk) memory per step.
    """
    croot = Path(control.root)
    tgt = target if len(target) else None
    for s in control.manifest.shards:
        if s.records == 0:
            continue
        if not s.has_ids:
            raise KeyError(f"{croot}: records have no ids; MetaDataset joins by id")
        ids = load_npy(croot / s.name / "_ids.npy")
        off = load_npy(croot / s.name / "_ids.offsets.npy")
        for a in range(0, s.records, chunk):
            b = min(a + chunk, s.records)
            raw = np.asarray(off[a : b + 1])
            if tgt is None:
                yield np.full(b - a, -1, dtype=np.int64)
                continue
            qdata = ids[int(raw[0]) : int(raw[-1])]
            qoff = _rebased(raw)
            yield tgt.index_encoded(np.asarray(qdata), qoff)
