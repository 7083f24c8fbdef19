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
from ..ids import encode_ids, hash_ids, hash_one, id_equal, not_str_id, probe_sorted
from .copy import gather_rows
from .readahead import ReadPlanner
from .shards import Shard
from .verify import ReadVerifier

__all__ = ["IdLookup", "IndexDamaged"]

_DISORDER = "the rows of one hash out of order (or one row twice)"


class IndexDamaged(CorruptionError):
    """An id index names what it cannot (a row out of range, rows out of order, a record of another id's
    hash); ``keys``: its files, relative to the store."""

    def __init__(self, message: str, keys: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.keys = list(keys)


class IdLookup:
    """Ids of records and records of ids, read through ``planner``, for one manifest (a new one: a new
    IdLookup). ``last``: an id written more than once resolves to its last record. With a ``verify``
    (``verify_reads=True``) the ids read, and the candidates of a lookup, are checked against their
    stored checksums."""

    verify: ReadVerifier | None = None

    def __init__(self, planner: ReadPlanner, last: bool) -> None:
        self.planner, self.shards = planner, planner.shards
        self._id_last = last
        self._runs: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None] = {}
        self._probes: list[tuple[int, Any, Any, int]] | None = None

    def id(self, i: int) -> str:
        if not self.shards.table.has_ids and self.shards.n:  # an empty store: IndexError below
            raise KeyError(f"{self.shards.url}: records have no ids")
        sh, row = self.shards.record(i)
        sh.load_ids()
        assert sh.ids is not None and sh.id_offsets is not None
        self.planner.need(sh.id_offsets[row : row + 2])
        a, b = int(sh.id_offsets[row]), int(sh.id_offsets[row + 1])
        if not 0 <= a <= b <= len(sh.ids) and sh.fetch_again(f"{IDS}.offsets.npy", sh.id_offsets, [row]):
            a, b = int(sh.id_offsets[row]), int(sh.id_offsets[row + 1])
        if not 0 <= a <= b <= len(sh.ids):
            raise CorruptionError(f"{sh.display}/{IDS}.offsets.npy: record {row} has id offsets {a}..{b}, "
                                  f"outside 0..{len(sh.ids)}")
        self.planner.need(sh.ids[a:b])
        if self.verify is not None:
            self.verify.ids(np.array([self.shards.norm(i)], np.int64), [(sh, slice(None), np.array([row], np.int64))],
                            sh.ids, [a], [b - a])
        try:
            return bytes(sh.ids[a:b]).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:  # (a damage that leaves valid UTF-8: only verify_reads sees it)
            raise CorruptionError(f"{sh.display}/{IDS}.npy: record {self.shards.norm(i)} (row {row} of the shard): "
                                  f"its id's bytes are not UTF-8 ({exc.reason}): damaged") from None

    def ids(
        self, indices: Sequence[int] | np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, np.dtype[np.uint8]], np.ndarray[Any, np.dtype[np.int64]]]:
        if not self.shards.table.has_ids and self.shards.n:  # an empty store: any index is out of range
            raise KeyError(f"{self.shards.url}: records have no ids")
        idx = self.shards.norm_many(indices).reshape(-1)
        n = len(idx)
        offsets = np.zeros(n + 1, dtype=np.int64)
        if n == 0:
            return np.empty(0, dtype=np.uint8), offsets
        counts = np.empty(n, dtype=np.int64)
        groups = []
        for k, pos, local in self.shards.group(idx):
            sh = self.shards.shard(k)
            a, b = self._id_ranges(sh, local)
            counts[pos] = b - a
            if self.verify is not None:  # the bytes handed out (copied or a view) are these
                self.verify.ids(idx[pos], [(sh, slice(None), local)], sh.ids, a, b - a)
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

    def _probe_plan(self) -> Iterator[tuple[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None]]:
        """Yield (first shard, a merged run's (hashes, rows)) for every run to probe and (shard, None) for
        every shard probed by its own index, in shard order. A merged run whose files were superseded
        after this manifest was read falls back to its shards."""
        shard = 0
        runs: list[IndexRun] = list(self.shards.manifest.index_runs)
        while shard < self.shards.num_shards:
            run = next((r for r in runs if r.first_shard == shard), None)
            arrays = None if run is None else self._run_arrays(run)
            yield shard, arrays
            shard = shard + 1 if run is None or arrays is None else run.end_shard

    def _target(self, shard: int, arrays: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None
                ) -> tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any], int]:
        """(first shard, sorted hashes, rows, row base) of one entry of :meth:`_probe_plan`: rows of a
        merged run are global (base 0), rows of a shard index local (base = shard start); a shard is
        mapped now (through the bounded set of mapped shards)."""
        if arrays is not None:
            return shard, arrays[0], arrays[1], 0
        sh = self.shards.shard(shard)
        sh.load_ids()
        assert sh.id_hash is not None and sh.id_rows is not None
        return shard, sh.id_hash, sh.id_rows, self.shards.start_index[shard]

    def _run_arrays(self, run: IndexRun) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
        if run.name not in self._runs:
            source = self.shards.source
            try:
                h = source.map_npy(source.root / f"{run.name}.hash.npy", None, np.dtype("<u8"), (run.records,))
                r = source.map_npy(source.root / f"{run.name}.rows.npy", None, np.dtype("<i8"), (run.records,))
                self._runs[run.name] = (h, r)
            except CorruptionError:
                self._runs[run.name] = None
        return self._runs[run.name]

    def _verify(self, rows: np.ndarray[Any, Any], qdata: Any, qoff: Any, qidx: Any) -> np.ndarray[Any, Any]:
        """Compare the stored ids of global ``rows`` with query ids ``qidx`` byte by byte."""
        ok = np.zeros(len(rows), dtype=np.bool_)
        for k, pos, local in self.shards.group(rows):
            sh = self.shards.shard(k)
            a, b = self._id_ranges(sh, local)
            if self.verify is not None:  # a candidate's id is checked: a lookup never answers a damaged one
                self.verify.ids(rows[pos], [(sh, slice(None), local)], sh.ids, a, b - a)
            res = np.empty(len(local), dtype=np.bool_)
            assert sh.ids is not None and sh.id_offsets is not None
            local = np.ascontiguousarray(local)
            id_equal(sh.ids, sh.id_offsets, local, qdata, qoff, np.ascontiguousarray(qidx[pos]), res)
            ok[pos] = res
        return ok

    def _misses(self, rows: np.ndarray[Any, Any], hashes: np.ndarray[Any, Any], first: int) -> None:
        """Candidates (global ``rows``) found under ``hashes`` whose ids were not the query: a true hash
        collision, or a damaged index entry, which a last-id lookup would otherwise pass over for an
        older copy of the id. Rare, so checked one by one."""
        for k, pos, local in self.shards.group(rows):
            sh = self.shards.shard(k)
            a, b = self._id_ranges(sh, local)
            assert sh.ids is not None
            for r, h, x, y in zip(rows[pos].tolist(), hashes[pos].tolist(), a.tolist(), b.tolist()):
                if hash_one(bytes(sh.ids[x:y])) != h:
                    raise self._damaged(first, f"record {r} for an id of another hash")

    def _check_around(self, first: int, hashes: Any, rows: Any, base: int, at: np.ndarray[Any, Any]) -> None:
        """A verified lookup's misses in the index probed from shard ``first``: the entries on either side of
        where each missed hash would lie (positions ``at - 1`` and ``at``) must hold their records' id hashes.
        A damaged hash entry of a stored id lies there (the others stay ordered around it), and would
        otherwise answer "no such id"; two entries per miss, each record's id checked against its checksum."""
        p = np.unique(np.concatenate((at - 1, at)))
        p = p[(p >= 0) & (p < len(hashes))]
        if not len(p):
            return
        if self.planner.lazy:
            self.planner.need_rows(hashes.reshape(-1, 1), p)
            self.planner.need_rows(rows.reshape(-1, 1), p)
        r = np.asarray(rows[p]) + base
        if (r < 0).any() or (r >= self.shards.n).any():
            raise self._damaged(first, "rows out of range")
        bad = hash_ids(*self.ids(r)) != np.asarray(hashes[p])
        if bad.any():
            raise self._damaged(first, f"record {int(r[bad][0])} under a hash its id does not have")

    def _index_file(self, first: int) -> tuple[str, list[str]]:
        """The files of the index probed from shard ``first``, a merged run's or else the shard's own: how
        messages name them, and their keys (relative to the store)."""
        run = next((r for r in self.shards.manifest.index_runs if r.first_shard == first and self._runs.get(r.name)),
                   None)
        if run is not None:
            return (f"{self.shards.url}/{run.name}.hash.npy or .rows.npy",
                    [f"{run.name}.hash.npy", f"{run.name}.rows.npy"])
        sh = self.shards.shard(first)
        return (f"{sh.display}/{IDS}.hash.npy or {IDS}.hash_rows.npy",
                [f"{sh.info.name}/{IDS}.hash.npy", f"{sh.info.name}/{IDS}.hash_rows.npy"])

    def _damaged(self, first: int, what: str) -> IndexDamaged:
        where, keys = self._index_file(first)
        return IndexDamaged(f"{where}: id index (from shard {first}) names {what} (damaged; `seqstore verify` "
                            "checks the indexes)", keys)

    def _checked_entry(self, first: int, sh: Shard, hashes: Any, rows: Any, k: int, base: int) -> None:
        """Raise naming what is wrong with entry ``k`` of shard ``sh``'s own index (found by the fast probe)."""
        r = int(rows[k])
        if not 0 <= r < sh.info.records:
            raise self._damaged(first, f"row {r}, outside the shard's {sh.info.records} records")
        self._id_ranges(sh, np.array([r]))
        self._misses(np.array([r + base]), hashes[k : k + 1], first)
        raise self._damaged(first, _DISORDER)

    def _id_ranges(self, sh: Shard, local: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Byte ranges ``(a, b)`` of the ids of local rows ``local`` of ``sh`` in ``sh.ids`` (mapped, and on a
        lazy source made resident), checked to lie in range."""
        sh.load_ids()
        assert sh.ids is not None and sh.id_offsets is not None
        if self.planner.lazy:
            self._need_ids(sh, local)
        a, b = np.asarray(sh.id_offsets[local]), np.asarray(sh.id_offsets[local + 1])
        bad = (a < 0) | (b < a) | (b > len(sh.ids))
        if bad.any() and sh.fetch_again(f"{IDS}.offsets.npy", sh.id_offsets, np.asarray(local)[bad]):
            if self.planner.lazy:  # (a remote store's node-cache copy, fetched anew: the ids it points at)
                self._need_ids(sh, local)
            a, b = np.asarray(sh.id_offsets[local]), np.asarray(sh.id_offsets[local + 1])
        if ((a < 0) | (b < a) | (b > len(sh.ids))).any():
            raise CorruptionError(f"{sh.display}/{IDS}.offsets.npy: id offsets out of range")
        return a, b

    def _need_ids(self, sh: Shard, local: np.ndarray[Any, Any]) -> None:
        """A lazy source: wait for the ids (offsets, then bytes) of local rows ``local`` of ``sh``."""
        ensure = self.shards.source.ensure
        assert sh.ids is not None and sh.id_offsets is not None
        base = address(sh.id_offsets)
        ensure(base + local * 8, base + local * 8 + 16)
        a, b = np.asarray(sh.id_offsets[local]), np.asarray(sh.id_offsets[local + 1])
        ok = (a >= 0) & (b >= a) & (b <= len(sh.ids))
        if ok.any() and len(sh.ids):
            ensure(address(sh.ids) + a[ok], address(sh.ids) + b[ok])

    def index(self, id: str) -> int:  # noqa: A002
        if not isinstance(id, str):
            raise TypeError(f"{self.shards.url}: ids are str, {not_str_id(id)}")
        if not self.shards.table.has_ids:
            raise KeyError(f"id {id!r} not in {self.shards.url} (records have no ids)")
        if self.planner.lazy or self.verify is not None:  # the vectorised path waits for and checks the bytes
            found = int(self.index_encoded(*encode_ids([id]))[0])
        else:
            found = self._index_one(id.encode("utf-8", "surrogatepass"))
        if found < 0:
            raise KeyError(f"id {id!r} not in {self.shards.url}")
        return found

    def _index_one(self, key: bytes) -> int:
        """One id in a local store without checks: a binary search per index (their list built once for
        this manifest; shards not in a merged run are mapped as they are probed, so their indexes stay
        within ``max_mapped_shards``) and a byte comparison of the (almost always one) candidate; about
        10x cheaper than the vectorised path for a single id."""
        if self._probes is None:  # a shard probed by its own index: (shard, None, None, 0)
            self._probes = [self._target(k, arrays) if arrays is not None else (k, None, None, 0)
                            for k, arrays in self._probe_plan()]
        h = np.uint64(hash_one(key))
        found = -1
        for first, hashes, rows, base in self._probes:
            if hashes is None:
                first, hashes, rows, base = self._target(first, None)
            j = int(np.searchsorted(hashes, h, "left"))
            prev = -1
            while j < len(hashes) and hashes[j] == h:
                row = int(rows[j]) + base
                if not 0 <= row < self.shards.n:
                    raise self._damaged(first, f"row {row}, out of range")
                if row <= prev:
                    raise self._damaged(first, _DISORDER)
                prev = row
                k, local = self.shards.locate(row)
                sh = self.shards.shard(k)
                sh.load_ids()
                assert sh.ids is not None and sh.id_offsets is not None
                a, b = int(sh.id_offsets[local]), int(sh.id_offsets[local + 1])
                if not 0 <= a <= b <= len(sh.ids):
                    raise CorruptionError(f"{sh.display}/{IDS}.offsets.npy: id offsets out of range")
                if bytes(sh.ids[a:b]) == key:
                    found = max(found, row) if self._id_last or found < 0 else found
                else:
                    self._misses(np.array([row]), np.array([h]), first)
                j += 1
            if found >= 0 and not self._id_last:
                return found
        return found

    def index_many(self, ids: Sequence[str], missing: str | int = "error") -> np.ndarray[Any, np.dtype[np.int64]]:
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"{self.shards.url}: index_many takes a sequence of ids, got one {type(ids).__name__} "
                            f"{ids!r}; look up one id with index(), or pass [{ids!r}]")
        fill = isinstance(missing, (int, np.integer)) and not isinstance(missing, (bool, np.bool_))
        if not fill and not (isinstance(missing, str) and missing == "error"):
            raise ValueError(f"index_many: missing must be 'error' or an int to fill missing ids with, got {missing!r}")
        if not self.shards.table.has_ids:
            if self.shards.n == 0:
                if missing == "error" and len(ids):
                    raise KeyError(f"id {ids[0]!r} not in {self.shards.url} (store is empty)")
                return np.full(len(ids), -1 if missing == "error" else int(missing), dtype=np.int64)
            raise KeyError(f"{self.shards.url}: records have no ids")
        qdata, qoff = encode_ids(ids, query=True)
        result = self.index_encoded(qdata, qoff)
        todo = np.flatnonzero(result < 0)
        if len(todo):
            if missing == "error":
                names = ", ".join(repr(ids[int(t)]) for t in todo[:10])
                raise KeyError(f"{len(todo)} id(s) not in {self.shards.url}: {names}")
            result[todo] = int(missing)
        return result

    def index_encoded(self, qdata: np.ndarray[Any, Any], qoff: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """:meth:`_index_encoded`; an index found damaged whose files are a node cache's copies (a remote
        store: maybe only the copy is damaged) is fetched again and the lookup made once more, as long as
        each failure names an index not yet fetched again."""
        fetched: set[str] = set()
        while True:
            try:
                return self._index_encoded(qdata, qoff)
            except IndexDamaged as exc:
                new = [k for k in exc.keys if k not in fetched]
                if not new or not self.shards.source.refetch(new):
                    raise
                fetched.update(new)

    def _index_encoded(self, qdata: np.ndarray[Any, Any], qoff: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if not self.shards.table.has_ids:
            return np.full(len(qoff) - 1, -1, dtype=np.int64)
        q = hash_ids(qdata, qoff)
        result = np.full(len(q), -1, dtype=np.int64)
        todo = np.arange(len(q), dtype=np.int64)
        for _first, hashes, rows, base in (self._target(k, arrays) for k, arrays in self._probe_plan()):
            if len(todo) == 0:
                break
            sh = self.shards.mapped.get(_first)
            if not self._id_last and sh is not None and rows is sh.id_rows and not self.planner.lazy \
                    and self.verify is None:
                # a shard's own index (first-id lookup): one numba pass over the hash-sorted queries
                assert sh.ids is not None and sh.id_offsets is not None
                qorder = todo[np.argsort(q[todo], kind="stable")]
                bad = probe_sorted(q, qorder, hashes, rows, sh.ids, sh.id_offsets, qdata, qoff, np.int64(base), result)
                if bad >= 0:  # the checked path names what is wrong with that entry
                    self._checked_entry(_first, sh, hashes, rows, bad, base)
                todo = todo[result[todo] < 0]
                continue
            qh = q[todo]
            lo = self.shards.source.searchsorted(hashes, qh, "left")
            hi = self.shards.source.searchsorted(hashes, qh, "right")
            counts = hi - lo
            hit = counts > 0
            if self.verify is not None and not hit.all():
                self._check_around(_first, hashes, rows, base, lo[~hit])
            if not hit.any():
                continue
            cq = np.repeat(todo[hit], counts[hit])
            run_starts = np.repeat(lo[hit], counts[hit])
            within = np.arange(len(cq)) - np.repeat(np.cumsum(counts[hit]) - counts[hit], counts[hit])
            if self.planner.lazy:
                self.planner.need_rows(rows.reshape(-1, 1), run_starts + within)
            cand_rows = np.asarray(rows[run_starts + within]) + base
            if (cand_rows < 0).any() or (cand_rows >= self.shards.n).any():
                raise self._damaged(_first, "rows out of range")
            if ((cq[1:] == cq[:-1]) & (cand_rows[1:] <= cand_rows[:-1])).any():
                raise self._damaged(_first, _DISORDER)
            ok = self._verify(cand_rows, qdata, qoff, cq)
            if not ok.all():
                self._misses(cand_rows[~ok], q[cq[~ok]], _first)
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
