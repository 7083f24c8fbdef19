"""Ids: the id of a record (``id``, ``ids``) and the record of an id (``index``, ``index_many``,
``index_encoded``).

Ids are found through sorted 64-bit hash indexes (per shard, and merged runs under ``_index/``),
comparing the id bytes of every candidate; the hash and comparison kernels are in
:mod:`seqstore.store.ids`. On a lazy source the searches read only the pages they visit and the
candidates' id bytes are made resident before they are compared.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ...errors import CorruptionError
from ...format.manifest import IDS, IndexRun
from ...io import address
from ..ids import encode_ids, hash_ids, hash_one, id_equal, probe_sorted
from .batches import gather_rows
from .readahead import ReadAhead
from .shards import Shard

__all__ = ["IdLookup", "id_bounds"]


def id_bounds(sh: Shard, row: int) -> tuple[int, int]:
    """Byte range of the id of local ``row`` in ``sh.ids``, checked to lie in range."""
    assert sh.ids is not None and sh.id_offsets is not None
    a, b = int(sh.id_offsets[row]), int(sh.id_offsets[row + 1])
    if not 0 <= a <= b <= len(sh.ids):
        raise CorruptionError(
            f"{sh.display}/{(IDS + '.offsets.npy')}: record {row} has id offsets {a}..{b}, outside 0..{len(sh.ids)}"
        )
    return a, b


class IdLookup(ReadAhead):
    """Ids of records and records of ids."""

    _id_last: bool
    _runs: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None]
    _probes: list[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any], int]] | None

    @property
    def has_ids(self) -> bool:
        return self._table.has_ids

    def id(self, i: int) -> str:
        """The id of record ``i``."""
        if not self.has_ids:
            raise KeyError(f"{self.url}: records have no ids")
        k, row = self._locate(self._norm(int(i)))
        sh = self._shard(k)
        sh.load_ids()
        assert sh.ids is not None and sh.id_offsets is not None
        self._need(sh.id_offsets[row : row + 2])
        a, b = id_bounds(sh, row)
        self._need(sh.ids[a:b])
        return bytes(sh.ids[a:b]).decode("utf-8", "surrogatepass")

    def ids(
        self, indices: Sequence[int] | np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, np.dtype[np.uint8]], np.ndarray[Any, np.dtype[np.int64]]]:
        """The utf-8 ids of records ``indices`` at once, as ``(data, offsets)``: the id of
        ``indices[j]`` is ``data[offsets[j]:offsets[j + 1]]`` (``offsets``: int64, ``len(indices) + 1``
        of them, from 0; e.g. the buffers of an Arrow string column). No Python object per record: the
        bytes are gathered shard by shard, and the ids of consecutive records of one shard are a
        read-only view of the mapped file. Negative indices count from the end. KeyError when the
        records have no ids."""
        if not self.has_ids:
            raise KeyError(f"{self.url}: records have no ids")
        idx = self._norm_many(indices).reshape(-1)
        n = len(idx)
        offsets = np.zeros(n + 1, dtype=np.int64)
        if n == 0:
            return np.empty(0, dtype=np.uint8), offsets
        counts = np.empty(n, dtype=np.int64)
        groups = []
        for k, pos, local in self._group(idx):
            sh = self._shard(k)
            a, b = self._id_ranges(sh, local)
            counts[pos] = b - a
            groups.append((sh, pos, local, int(a[0])))
        np.cumsum(counts, out=offsets[1:])
        total = int(offsets[-1])
        if len(groups) == 1:  # one shard: records in a row are one slice of its ids
            sh, _, local, first = groups[0]
            if int(local[-1]) - int(local[0]) == n - 1 and (n == 1 or bool((np.diff(local) == 1).all())):
                assert sh.ids is not None
                return sh.ids[first : first + total], offsets
        data = np.empty(total, dtype=np.uint8)
        for sh, pos, local, _ in groups:
            gather_rows(sh.ids, sh.id_offsets, np.ascontiguousarray(local), data,
                         np.ascontiguousarray(offsets[:-1][pos]), 1)
        return data, offsets

    def _probe_targets(self) -> Iterator[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any], int]]:
        """Yield (first shard, sorted hashes, rows, row base) for every index to probe, in shard order.

        Rows of a merged run are global (base 0); rows of a shard index are local (base = shard start).
        A merged run whose files were superseded after this manifest was read falls back to its shards.
        """
        shard = 0
        runs: list[IndexRun] = list(self._manifest.index_runs)
        while shard < self.num_shards:
            run = next((r for r in runs if r.first_shard == shard), None)
            arrays = self._run_arrays(run) if run is not None else None
            if run is not None and arrays is not None:
                yield shard, arrays[0], arrays[1], 0
                shard = run.end_shard
                continue
            sh = self._shard(shard)
            sh.load_ids()
            assert sh.id_hash is not None and sh.id_rows is not None
            yield shard, sh.id_hash, sh.id_rows, self._start_index[shard]
            shard += 1

    def _probe_list(self) -> list[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any], int]]:
        """:meth:`_probe_targets` as a list, built once per manifest (``refresh`` rebuilds it)."""
        if self._probes is None:
            self._probes = list(self._probe_targets())
        return self._probes

    def _run_arrays(self, run: IndexRun) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
        if run.name not in self._runs:
            try:
                h = self._source.map_npy(self.root / f"{run.name}.hash.npy", None, np.dtype("<u8"), (run.records,))
                r = self._source.map_npy(self.root / f"{run.name}.rows.npy", None, np.dtype("<i8"), (run.records,))
                self._runs[run.name] = (h, r)
            except CorruptionError:
                self._runs[run.name] = None
        return self._runs[run.name]

    def _verify(self, rows: np.ndarray[Any, Any], qdata: Any, qoff: Any, qidx: Any) -> np.ndarray[Any, Any]:
        """Compare the stored ids of global ``rows`` with query ids ``qidx`` byte by byte."""
        ok = np.zeros(len(rows), dtype=np.bool_)
        for k, pos, local in self._group(rows):
            sh = self._shard(k)
            self._id_ranges(sh, local)
            res = np.empty(len(local), dtype=np.bool_)
            assert sh.ids is not None and sh.id_offsets is not None
            local = np.ascontiguousarray(local)
            id_equal(sh.ids, sh.id_offsets, local, qdata, qoff, np.ascontiguousarray(qidx[pos]), res)
            ok[pos] = res
        return ok

    def _id_ranges(self, sh: Shard, local: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Byte ranges ``(a, b)`` of the ids of local rows ``local`` of ``sh`` in ``sh.ids`` (mapped, and on a
        lazy source made resident), checked to lie in range."""
        sh.load_ids()
        assert sh.ids is not None and sh.id_offsets is not None
        if self._lazy:
            self._need_ids(sh, local)
        a = np.asarray(sh.id_offsets[local])
        b = np.asarray(sh.id_offsets[local + 1])
        if ((a < 0) | (b < a) | (b > len(sh.ids))).any():
            raise CorruptionError(f"{sh.display}/{IDS}.offsets.npy: id offsets out of range")
        return a, b

    def _need_ids(self, sh: Shard, local: np.ndarray[Any, Any]) -> None:
        """A lazy source: wait for the ids (offsets, then bytes) of local rows ``local`` of ``sh``."""
        ensure = self._source.ensure
        assert sh.ids is not None and sh.id_offsets is not None
        base = address(sh.id_offsets)
        ensure(base + local * 8, base + local * 8 + 16)
        a = np.asarray(sh.id_offsets[local])
        b = np.asarray(sh.id_offsets[local + 1])
        ok = (a >= 0) & (b >= a) & (b <= len(sh.ids))
        if ok.any() and len(sh.ids):
            ensure(address(sh.ids) + a[ok], address(sh.ids) + b[ok])

    def index(self, id: str) -> int:  # noqa: A002
        """Global index of the record with id ``id``.

        When an id was written more than once this is the first such record, or the last one in a
        store created with ``id_lookup="last"`` (e.g. a log written with ``on_duplicate="keep_last"``).
        """
        if not isinstance(id, str):
            raise TypeError(f"ids are str, got {type(id).__name__}")
        if not self.has_ids:
            raise KeyError(f"id {id!r} not in {self.url} (records have no ids)")
        key = id.encode("utf-8", "surrogatepass")
        h = np.uint64(hash_one(key))
        found = -1
        for _first, hashes, rows, base in self._probe_list():
            j = int(self._source.searchsorted(hashes, np.array([h]), "left")[0])
            if self._lazy:  # the run of equal hashes (almost always 0 or 1 entries)
                k = int(self._source.searchsorted(hashes, np.array([h]), "right")[0])
                self._need(hashes[j : k + 1], rows[j : k + 1])
            while j < len(hashes) and hashes[j] == h:
                row = int(rows[j]) + base
                if not 0 <= row < self._n:
                    raise CorruptionError(f"{self.url}: id index (from shard {_first}) names row {row}, out of range")
                k, local = self._locate(row)
                sh = self._shard(k)
                sh.load_ids()
                assert sh.ids is not None and sh.id_offsets is not None
                if self._lazy:
                    self._need_ids(sh, np.array([local], np.int64))
                a, b = id_bounds(sh, local)
                if bytes(sh.ids[a:b]) == key:
                    if not self._id_last:
                        return row
                    found = max(found, row)
                j += 1
        if found >= 0:
            return found
        raise KeyError(f"id {id!r} not in {self.url}")

    def index_many(self, ids: Sequence[str], *, missing: str | int = "error") -> np.ndarray[Any, np.dtype[np.int64]]:
        """Global indexes of many ids at once (vectorised hash search, then byte comparison).

        ``missing="error"`` raises KeyError naming the first missing ids; an int fills them instead.
        Repeated ids resolve as in :meth:`index` (first record, or last with ``id_lookup="last"``).
        """
        if not self.has_ids:
            if len(self) == 0:
                qn = len(ids)
                if missing == "error" and qn:
                    raise KeyError(f"id {ids[0]!r} not in {self.url} (store is empty)")
                return np.full(qn, missing if isinstance(missing, int) else -1, dtype=np.int64)
            raise KeyError(f"{self.url}: records have no ids")
        qdata, qoff = encode_ids(ids)
        result = self.index_encoded(qdata, qoff)
        todo = np.flatnonzero(result < 0)
        if len(todo):
            if missing == "error":
                names = ", ".join(repr(ids[int(t)]) for t in todo[:10])
                raise KeyError(f"{len(todo)} id(s) not in {self.url}: {names}")
            result[todo] = int(missing)
        return result

    def index_encoded(self, qdata: np.ndarray[Any, Any], qoff: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Global indexes of ids given as utf-8 bytes ``qdata[qoff[i]:qoff[i+1]]`` (int64 offsets from 0),
        -1 where absent; what :meth:`index_many` and joins between stores use. Vectorised per probed
        index; memory O(queries + candidates)."""
        if not self.has_ids:
            return np.full(len(qoff) - 1, -1, dtype=np.int64)
        q = hash_ids(qdata, qoff)
        result = np.full(len(q), -1, dtype=np.int64)
        todo = np.arange(len(q), dtype=np.int64)
        for _first, hashes, rows, base in self._probe_targets():
            if len(todo) == 0:
                break
            sh = self._shards.get(_first)
            if not self._id_last and sh is not None and rows is sh.id_rows and not self._lazy:
                # a shard's own index (first-id lookup): one numba pass over the hash-sorted queries
                assert sh.ids is not None and sh.id_offsets is not None
                qorder = todo[np.argsort(q[todo], kind="stable")]
                fine = probe_sorted(q, qorder, hashes, rows, sh.ids, sh.id_offsets, qdata, qoff, np.int64(base), result)
                if not fine:
                    raise CorruptionError(f"{sh.display}/{(IDS + '.hash_rows.npy')}: names rows outside the shard")
                todo = todo[result[todo] < 0]
                continue
            qh = q[todo]
            lo = self._source.searchsorted(hashes, qh, "left")
            hi = self._source.searchsorted(hashes, qh, "right")
            counts = hi - lo
            hit = counts > 0
            if not hit.any():
                continue
            cq = np.repeat(todo[hit], counts[hit])
            run_starts = np.repeat(lo[hit], counts[hit])
            within = np.arange(len(cq)) - np.repeat(np.cumsum(counts[hit]) - counts[hit], counts[hit])
            if self._lazy:
                self._need_rows(rows.reshape(-1, 1), run_starts + within)
            cand_rows = np.asarray(rows[run_starts + within]) + base
            if (cand_rows < 0).any() or (cand_rows >= self._n).any():
                raise CorruptionError(f"{self.url}: id index (from shard {_first}) names rows out of range")
            ok = self._verify(cand_rows, qdata, qoff, cq)
            if not ok.any():
                continue
            found_q, found_r = cq[ok], cand_rows[ok]
            if self._id_last:  # every index may hold a later copy: keep probing all of them
                np.maximum.at(result, found_q, found_r)
                continue
            best = np.full(len(q), np.iinfo(np.int64).max, dtype=np.int64)
            np.minimum.at(best, found_q, found_r)
            newly = np.unique(found_q)
            result[newly] = best[newly]
            todo = todo[result[todo] < 0]
        return result
