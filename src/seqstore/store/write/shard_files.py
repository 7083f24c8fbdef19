"""The files of the shard a :class:`~.writer.Writer` is writing: ``current/`` of its workspace.

One column file per storage unit (a field, or a packed group's matrix), with the offsets of the
ragged ones and the ids' files; :meth:`ShardFiles.write` appends a flushed buffer to them and
:meth:`ShardFiles.finish` completes the shard before its commit (docs/format.md, section 7, steps
1-2): final ``.npy`` headers, the id hash index sorted, the per-record checksums and (version 3)
the shard's descriptor, every file and directory fsynced.
"""

from __future__ import annotations

import shutil
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ...format.checksums import CHECKS
from ...format.descriptor import DESCRIPTOR, encode_descriptor
from ...format.manifest import IDS, FileInfo, ShardInfo, fsync_dir
from ...schema import Field, Schema
from ..ids import encode_ids, hash_ids
from .checks import write_checks
from .columns import ColumnFile, coalesce, write_file

__all__ = ["ShardFiles"]


class ShardFiles:
    """The open files of one shard being written in ``cur`` (created here; removed again if opening
    fails): ``units`` (name, field) as the writer stores them, with ids when ``has_ids``. Checksums run
    on ``pool``; ``direct`` writes the values with ``O_DIRECT`` through ``io``."""

    def __init__(self, cur: Path, units: Sequence[tuple[str, Field]], has_ids: bool, pool: ThreadPoolExecutor,
                 io: ThreadPoolExecutor | None, direct: bool) -> None:
        self.cur, self.units, self.has_ids, self.pool, self.direct = cur, units, has_ids, pool, direct
        self.files: dict[str, ColumnFile] = {}
        cur.mkdir()
        try:
            self._open(io)
        except BaseException:  # e.g. out of descriptors: close what was opened, leave no current/
            self.abort()
            shutil.rmtree(cur, ignore_errors=True)
            raise

    def _open(self, io: ThreadPoolExecutor | None) -> None:
        for name, f in self.units:
            path = self.cur / f"{name}.npy"
            path.parent.mkdir(parents=True, exist_ok=True)
            # fixed-size data starts on a page boundary, so a record never straddles more pages than its
            # size requires (a cold random read of a 2 KiB record touches one page, not two)
            self.files[name] = ColumnFile(
                path, f.storage_dtype, f.inner_shape, self.pool, direct=self.direct, page_header=not f.ragged,
                io_pool=io,
            )
            if f.ragged:
                off = ColumnFile(self.cur / f"{name}.offsets.npy", np.dtype("<i8"), (), self.pool)
                off.write(np.zeros(1, dtype="<i8"))
                self.files[name + ".offsets"] = off
        if self.has_ids:
            for suffix, dt in (("", "u1"), (".offsets", "<i8"), (".hash_unsorted", "<u8")):
                self.files[IDS + suffix] = ColumnFile(self.cur / f"{IDS}{suffix}.npy", np.dtype(dt), (), self.pool)
            self.files[IDS + ".offsets"].write(np.zeros(1, dtype="<i8"))

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
        if self.has_ids:
            data, offsets = encode_ids(ids, first_record=0)
            ids_col = self.files[IDS]
            hashes = hash_ids(data, offsets)
            self.files[IDS + ".offsets"].write(offsets[1:] + ids_col.rows)
            ids_col.write(data)
            self.files[IDS + ".hash_unsorted"].write(hashes)
        for fut in futures:
            fut.result()

    def finish(self, schema: Schema, records: int, descriptor: bool) -> tuple[ShardInfo, int | None]:
        """Complete the shard of ``records`` records: the shard (its files' sizes and CRCs) and, with
        ``descriptor`` (version 3), the CRC-32 of the descriptor written."""
        infos: dict[str, FileInfo] = {}
        rows: dict[str, int] = {}
        for key, col in self.files.items():
            if key == IDS + ".hash_unsorted":
                continue
            infos[col.path.relative_to(self.cur).as_posix()] = col.finish()
            if key in schema and schema[key].ragged:
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
        if descriptor:  # version 3: the shard describes itself (immutable once committed)
            checks = write_checks(self.cur, schema, records, rows, self.has_ids)
            raw = encode_descriptor(records, rows, self.has_ids, infos, checks)
            write_file(self.cur / DESCRIPTOR, raw)
            crc = zlib.crc32(raw)
            infos[CHECKS] = checks  # (under the descriptor's "checks", not "files"; moved and copied as a file)
        fsync_dir(self.cur)
        for sub in {p.parent for p in self.cur.rglob("*.npy")} - {self.cur}:
            fsync_dir(sub)
        return ShardInfo("", records, rows, infos, self.has_ids), crc

    def abort(self) -> None:
        """Close every file without finishing it (the caller removes the directory)."""
        for col in self.files.values():
            col.abort()
