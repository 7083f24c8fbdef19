"""Verified reads (``seqstore.open(path, verify_reads=True)``; docs/store.md, "Verified reads"): every
record a read returns is checked against the per-record checksums its shard was committed with
(:mod:`seqstore.format.checksums`). :class:`ReadVerifier` hashes the bytes handed out (one numba pass
over the output) and compares them with the shard's ``_checks.npy`` rows of those records, mapped
through the store's byte source (a remote store fetches the rows it needs).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numba
import numpy as np

from ...errors import CorruptionError, SeqstoreError
from ...format.checksums import CHECKS, IDS_COLUMN, check_columns, copy_check_at, span_checks
from ...format.manifest import IDS, Manifest
from ...schema import Schema
from .shards import file_spans, unfetched_pages

__all__ = ["ReadMismatch", "ReadVerifier", "gather_rows_checked", "refuse_unverifiable", "take_rows_checked"]

T = TypeVar("T")


class ReadMismatch(CorruptionError):
    """A record read differs from its stored checksum; ``keys``: the files (relative to the store) of
    the shards involved: the field's, and the checksums'; ``spans``: for those files, the byte ranges
    ``(starts, ends)`` of the records that failed (a file not named: the whole file)."""

    def __init__(self, message: str, keys: Sequence[str] = (),
                 spans: Mapping[str, tuple[Any, Any]] | None = None) -> None:
        super().__init__(message)
        self.keys = list(keys)
        self.spans = dict(spans or {})


@numba.njit(nogil=True, cache=True)
def take_rows_checked(src: int, rows: Any, dst: int, pos: Any, width: int, sums: Any,
                      sec: int) -> None:  # pragma: no cover - numba
    """``take_rows`` (store/read/copy.py) that also hashes each row in the same pass as it copies it
    (:func:`~seqstore.format.checksums.copy_check_at`): ``sums[pos[k]]`` is the checksum of row
    ``pos[k]`` (``sec``: ``SECRET_AT``)."""
    acc = np.empty(8, np.uint64)
    for k in range(rows.shape[0]):
        sums[pos[k]] = copy_check_at(src + rows[k] * width, dst + pos[k] * width, width, sec, acc)


@numba.njit(nogil=True, cache=True)
def gather_rows_checked(data: Any, offsets: Any, rows: Any, out: Any, out_starts: Any, stride: int, sums: Any,
                        pos: Any, sec: int) -> None:  # pragma: no cover - numba
    """``gather_rows`` (store/read/copy.py) that also hashes each record in the same pass as it copies it:
    ``sums[pos[k]]``."""
    src = data.ctypes.data
    dst = out.ctypes.data
    acc = np.empty(8, np.uint64)
    for k in range(rows.shape[0]):
        r = rows[k]
        a = offsets[r] * stride
        n = offsets[r + 1] * stride - a
        sums[pos[k]] = copy_check_at(src + a, dst + out_starts[k], max(n, 0), sec, acc)


def refuse_unverifiable(manifest: Manifest, where: str) -> None:
    """Raise unless ``manifest``'s store can carry read checksums (version 3: its shards' descriptors
    list them; versions 1/2 never do)."""
    if manifest.table is None:
        raise SeqstoreError(
            f"{where}: verify_reads=True needs per-record checksums, which a version-{manifest.version} store "
            "does not have; check it with `seqstore verify`, or copy its records into a new store "
            "(seqstore.create) to read it verified"
        )


class ReadVerifier:
    """Checks records read from shards of ``schema`` against their stored checksums.

    ``need_rows(array, rows)`` makes rows of a mapped array resident (a lazy source: fetches them);
    ``keep``: how many shards' checksum matrices stay mapped; ``refetch(keys, spans)``: fetch the node's
    copies of the store's files ``keys`` (the byte ranges ``spans`` of those it names) again, False where
    the files are the store's own (:meth:`~seqstore.io.source.ByteSource.refetch`)."""

    def __init__(self, schema: Schema, need_rows: Callable[[Any, Any], None], keep: int,
                 refetch: Callable[[Sequence[str], Mapping[str, tuple[Any, Any]] | None], bool]) -> None:
        self.schema = schema
        self.need_rows = need_rows
        self.refetch = refetch
        self.keep = max(1, keep)
        self._column = {name: c for c, name in enumerate(schema)}
        self._mapped: OrderedDict[str, np.ndarray[Any, Any]] = OrderedDict()
        # (groups, [(positions, checksum rows)]) of the last batch: its fields share one read of the rows
        self._rows: tuple[Sequence[Any], list[tuple[Any, np.ndarray[Any, Any]]]] | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------ checksums

    def _checks(self, sh: Any) -> np.ndarray[Any, Any]:
        """Shard ``sh``'s mapped ``(n, C)`` checksum matrix."""
        key = str(sh.path)
        hit = self._mapped.get(key)
        if hit is not None:
            return hit
        info = sh.info
        fi = info.files.get(CHECKS)
        if fi is None:
            raise SeqstoreError(
                f"{sh.display}: this shard was written without per-record checksums (by a seqstore before "
                "verified reads), so verify_reads=True cannot check its records; open the store without "
                "verify_reads (and check it with `seqstore verify`), or copy its records into a new store"
            )
        cols = len(check_columns(list(self.schema), info.has_ids))
        got: np.ndarray[Any, Any] = sh.map_npy(sh.path / CHECKS, fi, np.dtype("<u4"), (info.records, cols))
        with self._lock:
            self._mapped[key] = got
            while len(self._mapped) > self.keep:
                self._mapped.popitem(last=False)
        return got

    def _expected(self, groups: Sequence[Any], n: int, column: int | None) -> np.ndarray[Any, Any]:
        """The stored checksums of a batch's records (``groups``: (shard, positions, rows)) in one
        column (None: the ids' column, the last). The rows of all columns are read once per batch
        (the fields of a batch come with the same ``groups``)."""
        got = self._rows
        if got is None or got[0] is not groups:
            table: list[tuple[Any, np.ndarray[Any, Any]]] = []
            for sh, pos, rows in groups:
                checks = self._checks(sh)
                self.need_rows(checks, rows)
                table.append((pos, checks[rows]))
            got = self._rows = (groups, table)
        want = np.empty(n, np.uint32)
        for pos, stored in got[1]:
            want[pos] = stored[:, -1 if column is None else column]
        return want

    def checked(self, read: Callable[[], T], again: Callable[[], T] | None = None) -> T:
        """``read()``, and where a record it read fails its checksum and the source fetched the bytes
        involved anew (a remote store: maybe only the node cache's copy was damaged), once more
        (``again()`` where given), as long as each failure names pages not yet fetched anew (a batch may
        meet several damaged copies, one field's after another's); a read failing again on pages fetched
        anew already, or a local store's, raises. Only the pages of the records that failed are fetched
        again (their bytes in each file of the field, and their checksums), not the whole files."""
        fetched: dict[str, Any] = {}  # the pages of each file fetched anew (None: the whole file)
        while True:
            try:
                return read()
            except ReadMismatch as exc:
                keys, spans = [], {}
                for key in exc.keys:
                    fresh = unfetched_pages(fetched, key, exc.spans.get(key))
                    if fresh is not None:
                        keys.append(key)
                        if key in exc.spans:
                            spans[key] = fresh
                if not keys or not self.refetch(keys, spans):
                    raise
            self._rows = None  # (the stored checksums of the last batch: maybe read from the damaged copy)
            read = again or read

    # ---------------------------------------------------------------------------------- checks

    def field(self, name: str, idx: np.ndarray[Any, Any], groups: Sequence[Any], out: Any, pad: bool,
              sums: np.ndarray[Any, Any] | None = None) -> None:
        """Check field ``name`` of a gathered batch of records ``idx``: ``out`` as gathered (storage
        dtype): the fixed field's array, or a ragged field's ``(values, lengths)``; ``sums``: their
        checksums where the gather took them (:func:`take_rows_checked`, :func:`gather_rows_checked`)."""
        n = len(idx)
        if n == 0:
            return
        f = self.schema[name]
        if sums is not None:
            got = sums
        elif f.ragged:
            values, lengths = out
            stride = f.row_bytes
            lens = np.asarray(lengths, np.int64) * stride
            if pad:
                starts = np.arange(n, dtype=np.int64) * (values.shape[1] * stride if values.ndim > 1 else 0)
            else:
                starts = np.cumsum(lens) - lens
            buf = _bytes(values)
            inside = starts + lens <= buf.size  # (lengths that disagree with the values read: those records fail)
            got = span_checks(buf, np.where(inside, starts, 0), np.where(inside, lens, 0))
            if not inside.all():
                got[~inside] = ~self._expected(groups, n, self._column[name])[~inside]
        else:
            got = span_checks(_bytes(out), np.arange(n, dtype=np.int64) * f.row_bytes, np.full(n, f.row_bytes))
        want = self._expected(groups, n, self._column[name])
        if not np.array_equal(got, want):
            self._report(name, idx, groups, got, want)

    def record(self, sh: Any, row: int, i: int, rec: dict[str, Any]) -> None:
        """Check record ``i`` (row ``row`` of shard ``sh``) as read: ``rec`` maps field names to arrays
        in the storage dtype (views or copies)."""
        checks = self._checks(sh)
        rows = np.array([row], np.int64)
        self.need_rows(checks, rows)
        stored = checks[row]
        for name, arr in rec.items():
            got = span_checks(_bytes(arr), np.zeros(1, np.int64), np.array([arr.nbytes], np.int64))
            c = self._column[name]
            if got[0] != stored[c]:
                self._report(name, np.array([i], np.int64), [(sh, np.zeros(1, np.int64), rows)], got, stored[c : c + 1])

    def ids(self, idx: np.ndarray[Any, Any], groups: Sequence[Any], data: Any, starts: Any, lens: Any) -> None:
        """Check ids read: record ``idx[k]``'s id is the bytes ``data[starts[k] : starts[k] + lens[k]]``."""
        if len(idx) == 0:
            return
        got = span_checks(_bytes(data), starts, lens)
        want = self._expected(groups, len(idx), None)
        if not np.array_equal(got, want):
            self._report(IDS_COLUMN, idx, groups, got, want)

    # -------------------------------------------------------------------------------- reports

    def _report(self, name: str, idx: np.ndarray[Any, Any], groups: Sequence[Any], got: np.ndarray[Any, Any],
                want: np.ndarray[Any, Any]) -> None:
        """Raise :class:`ReadMismatch` for the first record of the batch ``idx`` whose checksum ``got``
        differs from the stored ``want``, with the byte ranges of every failing record in the files
        involved (the field's and the checksums', of each shard)."""
        bad = np.flatnonzero(got != want)
        k = int(bad[0])
        ids = name == IDS_COLUMN
        stem = IDS if ids else self.schema.group_of(name) or name  # (a ragged field is never packed)
        rels = [f"{stem}.npy", f"{stem}.offsets.npy"] if ids or self.schema[name].ragged else [f"{stem}.npy"]
        what = "its id" if ids else f"field {name!r}"
        keys: list[str] = []
        spans: dict[str, tuple[Any, Any]] = {}
        first = None
        for shard, pos, rows in groups:
            at = np.arange(len(idx), dtype=np.int64)[pos] if isinstance(pos, slice) else np.asarray(pos)
            hit = np.isin(at, bad)
            if not hit.any():
                continue
            failed = np.asarray(rows).reshape(-1)[hit]
            if first is None and k in at[hit]:
                first = shard, int(np.asarray(rows).reshape(-1)[np.flatnonzero(at == k)[0]])
            found = shard.spans(stem, failed)
            found[CHECKS] = file_spans(shard.info, CHECKS, self._checks(shard), failed, failed + 1)
            for rel in (*rels, CHECKS):
                if rel in shard.info.files:
                    key = f"{shard.info.name}/{rel}"
                    keys.append(key)
                    if found.get(rel) is not None:
                        spans[key] = found[rel]
        assert first is not None  # (every position is in one group)
        sh, row = first
        raise ReadMismatch(
            f"{sh.display}/{' or '.join(rels)}: record {int(idx[k])} (row {row} of the shard), {what}: checksum "
            f"{int(got[k]):#010x} of the bytes read differs from the stored {int(want[k]):#010x} (the data, its "
            f"offsets or {CHECKS} is damaged; `seqstore verify` checks the whole store)", keys, spans
        )


def _bytes(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``arr``'s bytes as a flat C-contiguous uint8 array (a view where it is contiguous)."""
    a = np.ascontiguousarray(arr)
    return a.reshape(-1).view(np.uint8) if a.size else np.zeros(0, np.uint8)
