"""Vectorised id join between stores, straight from the on-disk id files (no Python string per id).

:func:`join_rows` yields, chunk by chunk of the *control* store's records, the global row of the
record with the same id in the *target* store (-1 where there is none). It reads only what
docs/format.md defines: the control's ``_ids.npy`` / ``_ids.offsets.npy`` (zero-copy slices per
chunk), the target's sorted hash indexes (merged runs under ``_index/`` where their files exist,
else per shard, probed in shard order) and the target's id bytes to confirm every hash match. The
hash (FNV-1a 64 + splitmix64 finaliser, format section 5) is computed by a numba kernel over the raw
bytes. Per chunk: one hash pass, one ``searchsorted`` per probed index, one byte comparison per
candidate, all vectorised; memory O(chunk) plus the mapped files. Duplicate ids resolve to the
lowest target row, as ``Store.index`` does. The hash and the byte comparison are the store's own
(:func:`seqstore.store.ids.hash_ids`, :func:`~seqstore.store.ids.id_equal`): the format's id hash has
one definition. Each chunk's offsets are rebased to its byte slice once (O(chunk)).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numba
import numpy as np

from ..store import Store
from ..store.ids import hash_ids, id_equal
from ._cache import load_npy
from ._lengths import IntArray
from .concat import Split

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


@numba.njit(cache=True, nogil=True)
def _probe_sorted(qh: Any, qorder: Any, hashes: Any, rows: Any, sdata: Any, soff: Any, qdata: Any, qoff: Any,
                  base: np.int64, result: Any) -> None:  # pragma: no cover - numba
    """For queries ``qorder`` (sorted by hash ``qh``, still unresolved) find the lowest local row of one
    shard's sorted hash index whose id bytes equal the query's; write ``row + base`` to ``result``.
    Sorted queries make each binary search start where the previous one ended (cache-friendly).
    ``qoff``: the queries' offsets into ``qdata`` (rebased)."""
    n = hashes.shape[0]
    j = 0
    for t in range(qorder.shape[0]):
        q = qorder[t]
        h = qh[q]
        lo = j
        hi = n
        while lo < hi:  # first position with hashes[pos] >= h, searching from j
            mid = (lo + hi) // 2
            if hashes[mid] < h:
                lo = mid + 1
            else:
                hi = mid
        j = lo
        b0 = qoff[q]
        b1 = qoff[q + 1]
        k = lo
        while k < n and hashes[k] == h:
            r = rows[k]
            a0 = soff[r]
            a1 = soff[r + 1]
            if a1 - a0 == b1 - b0:
                eq = True
                for x in range(a1 - a0):
                    if sdata[a0 + x] != qdata[b0 + x]:
                        eq = False
                        break
                if eq:
                    result[q] = r + base
                    break
            k += 1


class _Target:
    """The target store's id files: probe list (hashes, rows, row base) and per-shard id bytes."""

    def __init__(self, store: Store) -> None:
        self.root = Path(store.root)
        m = store.manifest
        self.names = [s.name for s in m.shards]
        self.starts = np.zeros(len(m.shards) + 1, dtype=np.int64)
        np.cumsum([s.records for s in m.shards], out=self.starts[1:])
        self._bytes: dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
        # (sorted hashes, rows, row base, shard whose id bytes the rows index locally, or -1 for a merged run)
        self.probes: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], int, int]] = []
        runs = {r.first_shard: r for r in m.index_runs}
        k = 0
        while k < len(m.shards):
            run = runs.get(k)
            if run is not None:
                h, r = self.root / f"{run.name}.hash.npy", self.root / f"{run.name}.rows.npy"
                if h.exists() and r.exists():
                    self.probes.append((load_npy(h), load_npy(r), 0, -1))
                    k = run.end_shard
                    continue
            d = self.root / self.names[k]
            if m.shards[k].records:
                self.probes.append((load_npy(d / "_ids.hash.npy"), load_npy(d / "_ids.hash_rows.npy"),
                                    int(self.starts[k]), k))
            k += 1

    def id_bytes(self, k: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        got = self._bytes.get(k)
        if got is None:
            d = self.root / self.names[k]
            got = (load_npy(d / "_ids.npy"), load_npy(d / "_ids.offsets.npy"))
            self._bytes[k] = got
        return got


def _match(target: _Target, qh: np.ndarray[Any, Any], qdata: Any, qoff: Any) -> IntArray:
    """Target rows of the queries (hashes ``qh``, bytes ``qdata``, rebased int64 offsets ``qoff``);
    -1 where absent."""
    n = len(qh)
    result = np.full(n, -1, dtype=np.int64)
    todo = np.arange(n, dtype=np.int64)
    for hashes, rows, base, shard in target.probes:
        if len(todo) == 0:
            break
        if shard >= 0:  # a shard's own index: one numba pass over the hash-sorted queries
            sdata, soff = target.id_bytes(shard)
            qorder = todo[np.argsort(qh[todo], kind="stable")]
            _probe_sorted(qh, qorder, hashes, rows, sdata, soff, qdata, qoff, np.int64(base), result)
            todo = todo[result[todo] < 0]
            continue
        th = qh[todo]
        lo = np.searchsorted(hashes, th, side="left")
        hi = np.searchsorted(hashes, th, side="right")
        counts = hi - lo
        hit = counts > 0
        if not hit.any():
            continue
        c = counts[hit]
        cq = np.repeat(todo[hit], c)
        first = np.cumsum(c) - c
        within = np.arange(len(cq), dtype=np.int64) - np.repeat(first, c)
        cand = np.asarray(rows[np.repeat(lo[hit], c) + within], dtype=np.int64) + base
        ok = np.zeros(len(cand), dtype=np.bool_)
        sp = Split(cand, target.starts)
        for k, pos in sp.groups():
            sdata, soff = target.id_bytes(k)
            res = np.empty(len(pos), dtype=np.bool_)
            id_equal(sdata, soff, np.ascontiguousarray(sp.local[pos]), qdata, qoff, np.ascontiguousarray(cq[pos]),
                     res)
            ok[pos] = res
        if not ok.any():
            continue
        fq, fr = cq[ok], cand[ok]
        # candidates of one query are consecutive; the lowest row wins (rows ascend among equal hashes)
        order = np.lexsort((fr, fq))
        fq, fr = fq[order], fr[order]
        firsts = np.ones(len(fq), dtype=bool)
        firsts[1:] = fq[1:] != fq[:-1]
        result[fq[firsts]] = fr[firsts]
        todo = todo[result[todo] < 0]
    return result


def join_rows(control: Store, target: Store, chunk: int = CHUNK) -> Iterator[IntArray]:
    """Yield int64 arrays: for each control record in order, the target row with the same id, or -1.

    Both stores need ids (a store with no records is fine). O(chunk) memory per step.
    """
    croot = Path(control.root)
    tgt = _Target(target) if len(target) else None
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
            yield _match(tgt, hash_ids(qdata, qoff), qdata, qoff)
