"""The files of the shard a :class:`~.writer.Writer` is writing: ``current/`` of its workspace.

One column file per storage unit (a field, or a packed group's matrix), with the offsets of the
ragged ones and the ids' files; :meth:`ShardFiles.write` appends a flushed buffer to them and
:meth:`ShardFiles.finish` completes the shard before its commit (docs/format.md, section 7, steps
1-2): final ``.npy`` headers, the id hash index sorted and (version 3) the shard's descriptor, every
file and directory fsynced. A version-3 shard's per-record checksums (``_checks.npy``,
:mod:`seqstore.format.checksums`) are taken from each buffer as it is written, from memory.
"""

from __future__ import annotations

import shutil
import zlib
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ...format.checksums import CHECKS, check_columns, span_checks
from ...format.descriptor import DESCRIPTOR, encode_descriptor
from ...format.manifest import IDS, FileInfo, ShardInfo, fsync_dir
from ...schema import Field, Schema
from ..directio import write_file
from ..ids import encode_ids, hash_ids
from .columns import ColumnFile, coalesce

__all__ = ["ShardFiles"]


class ShardFiles:
    """The open files of one shard of ``schema`` being written in ``cur`` (created here; removed again if
    opening fails), with ids when ``has_ids``, and with ``descriptor`` (version 3) its per-record
    checksums. CRCs run on ``pool``; ``direct`` writes the values with ``O_DIRECT`` through ``io``."""

    def __init__(self, cur: Path, schema: Schema, has_ids: bool, descriptor: bool, pool: ThreadPoolExecutor,
                 io: ThreadPoolExecutor | None, direct: bool) -> None:
        self.cur, self.schema, self.has_ids, self.descriptor = cur, schema, has_ids, descriptor
        self.units: list[tuple[str, Field]] = schema.storage_units()
        self.pool, self.direct = pool, direct
        self.files: dict[str, ColumnFile] = {}
        self.checks: ColumnFile | None = None
        cur.mkdir()
        try:
            for name, f in self.units:
                path = cur / f"{name}.npy"
                path.parent.mkdir(parents=True, exist_ok=True)
                # fixed-size data starts on a page boundary, so a record never straddles more pages than its
                # size requires (a cold random read of a 2 KiB record touches one page, not two)
                self.files[name] = ColumnFile(path, f.storage_dtype, f.inner_shape, pool, direct=direct,
                                              page_header=not f.ragged, io_pool=io)
                if f.ragged:
                    off = ColumnFile(cur / f"{name}.offsets.npy", np.dtype("<i8"), (), pool)
                    off.write(np.zeros(1, dtype="<i8"))
                    self.files[name + ".offsets"] = off
            if has_ids:
                for suffix, dt in (("", "u1"), (".offsets", "<i8"), (".hash_unsorted", "<u8")):
                    self.files[IDS + suffix] = ColumnFile(cur / f"{IDS}{suffix}.npy", np.dtype(dt), (), pool)
                self.files[IDS + ".offsets"].write(np.zeros(1, dtype="<i8"))
            if descriptor:
                self.checks = ColumnFile(cur / CHECKS, np.dtype("<u4"), (len(check_columns(list(schema), has_ids)),),
                                         pool)
        except BaseException:  # e.g. out of descriptors: close what was opened, leave no current/
            self.abort()
            shutil.rmtree(cur, ignore_errors=True)
            raise

    def write(self, buf: Mapping[str, list[np.ndarray[Any, Any]]], lengths: Mapping[str, list[np.ndarray[Any, Any]]],
              ids: list[str]) -> None:
        """Append a buffer: per unit its pieces (and a ragged unit's record lengths), and the ids."""
        # wait for the checksums of the runs that may be the caller's memory (it may reuse it once we
        # return), not for those of arrays made here (offsets, ids), which their checksum task keeps
        # alive: the one checksum thread takes runs in order, and a small one queues behind a large one
        futures: list[Future[int]] = []
        for name, f in self.units:
            col = self.files[name]
            if f.ragged:
                offsets = np.cumsum(np.concatenate(lengths[name])) + col.rows
                self.files[name + ".offsets"].write(offsets.astype("<i8", copy=False))
            for run in coalesce(buf[name], aligned=self.direct):  # large pieces as they are, small ones joined
                futures.append(col.write(run))
        id_spans = None
        if self.has_ids:
            data, offsets = encode_ids(ids, first_record=0)
            ids_col = self.files[IDS]
            self.files[IDS + ".offsets"].write(offsets[1:] + ids_col.rows)
            ids_col.write(data)
            self.files[IDS + ".hash_unsorted"].write(hash_ids(data, offsets))
            id_spans = span_checks(data, offsets[:-1], np.diff(offsets))
        if self.checks is not None:  # (before the caller's memory is released below)
            self.checks.write(self._record_checks(buf, lengths, id_spans))
        for fut in futures:
            fut.result()

    def _record_checks(self, buf: Mapping[str, list[np.ndarray[Any, Any]]],
                       lengths: Mapping[str, list[np.ndarray[Any, Any]]], ids: np.ndarray[Any, Any] | None
                       ) -> np.ndarray[Any, Any]:
        """The ``(records, columns)`` checksums of a buffer's records (format/checksums.py): each field's
        bytes of each record, hashed where they lie in the buffered pieces (a packed field: its columns
        of the group's rows), then the ids' (``ids``, hashed already)."""
        cols = []
        for name, f in self.schema.items():
            gname = self.schema.group_of(name)
            if f.ragged:
                lens = np.concatenate(lengths[name]) if lengths[name] else np.zeros(0, np.int64)
                cols.append(_ragged_checks(buf[name], lens, f.row_bytes))
                continue
            if gname is None:
                size = f.storage_dtype.itemsize * int(np.prod(f.inner_shape, dtype=np.int64))
                at, stride = 0, size
            else:
                g = self.schema.groups[gname]
                a, b = g.columns[name]
                item = g.storage_dtype.itemsize
                at, stride, size = a * item, g.width * item, (b - a) * item
            pieces = buf[gname if gname is not None else name]
            cols.append(np.concatenate([np.zeros(0, np.uint32)] + [
                span_checks(_bytes(p), np.arange(p.shape[0], dtype=np.int64) * stride + at,
                            np.full(p.shape[0], size, np.int64)) for p in pieces]))
        if ids is not None:
            cols.append(ids)
        return np.stack(cols, axis=1)

    def finish(self, records: int) -> tuple[ShardInfo, int | None]:
        """Complete the shard of ``records`` records: the shard (its files' sizes and CRCs) and, for a
        version-3 shard, the CRC-32 of the descriptor written."""
        infos: dict[str, FileInfo] = {}
        rows: dict[str, int] = {}
        for key, col in self.files.items():
            if key == IDS + ".hash_unsorted":
                continue
            infos[col.path.relative_to(self.cur).as_posix()] = col.finish()
            if key in self.schema and self.schema[key].ragged:
                rows[key] = col.rows
        if self.has_ids:
            tmp = self.files[IDS + ".hash_unsorted"]
            tmp.finish(sync=False)  # read back and deleted below: nothing to make durable
            hashes = np.load(tmp.path)
            order = np.argsort(hashes, kind="stable")
            for suffix, arr in ((".hash", hashes[order]), (".hash_rows", order.astype("<i8"))):
                col = ColumnFile(self.cur / f"{IDS}{suffix}.npy", arr.dtype, (), self.pool)
                col.write(np.ascontiguousarray(arr))
                infos[f"{IDS}{suffix}.npy"] = col.finish()
            tmp.path.unlink()
        crc = None
        if self.checks is not None:  # version 3: the shard describes itself (immutable once committed)
            checks = self.checks.finish()
            raw = encode_descriptor(records, rows, self.has_ids, infos, checks)
            write_file(self.cur / DESCRIPTOR, raw)
            crc = zlib.crc32(raw)
            infos[CHECKS] = checks  # (under the descriptor's "checks", not "files"; moved and copied as a file)
        # every directory of the shard (a field "a/b/c" made current/a and current/a/b), the deepest first
        dirs = {d for p in self.cur.rglob("*.npy") for d in p.parents if d == self.cur or self.cur in d.parents}
        for sub in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
            fsync_dir(sub)
        return ShardInfo("", records, rows, infos, self.has_ids), crc

    def abort(self) -> None:
        """Close every file without finishing it (the caller removes the directory)."""
        for col in self.files.values():
            col.abort()
        if self.checks is not None:
            self.checks.abort()


def _bytes(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    a = np.ascontiguousarray(arr)
    return a.reshape(-1).view(np.uint8) if a.size else np.zeros(0, np.uint8)


def _ragged_checks(pieces: list[np.ndarray[Any, Any]], lens: np.ndarray[Any, Any], row_bytes: int
                   ) -> np.ndarray[Any, Any]:
    """Checksums of a ragged unit's buffered records (``lens`` rows each) over its ``pieces``, which
    hold the records' rows in order, no record split between two pieces."""
    ends = np.cumsum(lens)
    starts = ends - lens
    out = np.empty(len(lens), np.uint32)
    first = done = 0
    for p in pieces:
        end = first + p.shape[0]
        upto = int(np.searchsorted(ends, end, side="right"))  # the records that end inside this piece
        out[done:upto] = span_checks(_bytes(p), (starts[done:upto] - first) * row_bytes, lens[done:upto] * row_bytes)
        first, done = end, upto
    assert done == len(lens), (done, len(lens))
    return out
