"""Ragged fields as a whole: lazy per-record lengths (:class:`Lengths`, ``Store.lengths``) and the
values streamed in zero-copy blocks (``Store.iter_ragged``), both read from the offsets files with
the next stretch asked for ahead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CorruptionError
from ...io.mapping import allocate_whole
from .readahead import ReadPlanner
from .shards import Shard, checked_bounds, is_index
from .verify import ReadVerifier

__all__ = ["Lengths", "RaggedFields"]


class Lengths:
    """Lazy per-record lengths of one ragged field, computed from the offsets on demand.

    ``len``, ``[i]``, ``[a:b]`` and ``[int_array]`` (vectorised) work without materialising all
    lengths; :meth:`iter_chunks` walks them in chunks; ``np.asarray(lengths)`` materialises (O(N)).
    """

    def __init__(self, planner: ReadPlanner, field: str, owner: Any) -> None:
        self._planner, self._shards, self._owner = planner, planner.shards, owner
        self.field = field
        self.dtype = np.dtype(np.int64)
        self.ndim = 1

    @property
    def shape(self) -> tuple[int]:
        return (self._shards.n,)  # (the store's records now: a refresh may add some)

    def __len__(self) -> int:
        return self._shards.n

    def __reduce__(self) -> tuple[Any, ...]:  # the owner (a Store) reopens; its lengths of the same field
        return (self._owner.lengths, (self.field,))

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (bool, np.bool_)):
            raise TypeError(f"lengths[i] takes an int, a slice or an int array, got {type(key).__name__} {key!r}")
        if is_index(key):
            sh, row = self._shards.record(int(key))
            off = sh.offsets[self.field]
            self._planner.need(off[row : row + 2])
            a, b = int(off[row]), int(off[row + 1])
            if not 0 <= a <= b <= sh.columns[self.field].shape[0]:  # raises, naming the file, unless a node-cache
                a, b = (int(v[0]) for v in checked_bounds(sh, self.field, np.array([row])))  # copy fetched anew
            return b - a
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            return self.take(np.arange(start, stop, step, dtype=np.int64))
        return self.take(np.asarray(key))

    def take(self, indices: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Lengths of records ``indices`` (any int array), as int64."""
        planner = self._planner
        idx = self._shards.norm_many(indices)
        flat = idx.reshape(-1)
        groups = self._shards.groups(flat)
        out = np.empty(flat.shape, dtype=np.int64)
        if planner.scans and len(flat) > 1:  # cold offsets: all their reads at once
            planner.advise(groups, [self.field], values=False)
        planner.need_groups(groups, [self.field], values=False)
        for sh, pos, rows in groups:
            a, b = checked_bounds(sh, self.field, rows)
            out[pos] = b - a
        return out.reshape(idx.shape)

    def iter_chunks(self, size: int = 1 << 20) -> Iterator[np.ndarray[Any, np.dtype[np.int64]]]:
        """Yield the lengths in order, in arrays of at most ``size`` (per shard, from the offsets)."""
        if size < 1:
            raise ValueError(f"size must be a positive integer, got {size}")
        planner = self._planner
        for k in range(self._shards.num_shards):
            sh = self._shards.shard(k)
            off = sh.offsets[self.field]
            for a in range(0, len(off) - 1, size):
                if planner.scans:  # this chunk and the next, so the disk reads while this one is processed
                    planner.scan_ahead(off[a : min(a + 2 * size, len(off) - 1) + 1], sh.request)
                planner.need(off[a : min(a + size, len(off) - 1) + 1])
                chunk = np.diff(off[a : min(a + size, len(off) - 1) + 1])
                if chunk.size and chunk.min() < 0:  # ends are checked at open: monotone means in range
                    raise CorruptionError(f"{sh.display}/{(self.field + '.offsets.npy')}: offsets decrease")
                yield chunk

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        parts = list(self.iter_chunks())
        arr = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return arr if dtype is None else arr.astype(dtype)

    def __iter__(self) -> Iterator[int]:
        for chunk in self.iter_chunks():
            yield from chunk.tolist()

    def save(self, path: str | os.PathLike[str], dtype: Any = None) -> Path:
        """Write the lengths to a ``.npy`` file (two chunked passes; O(chunk) memory) and return its path.

        ``dtype`` defaults to the smallest unsigned integer type that holds the longest record; a
        ``dtype`` that cannot hold a record's length exactly (a small integer type, bool, a float type
        past its exact integers) is a ValueError naming the record. The file
        is written under a temporary name and renamed, so a reader never sees a partial file. Map it with
        ``np.load(path, mmap_mode="r")`` or pass the path as ``lengths`` to :func:`seqstore.seq_order`.
        """
        target = Path(path)
        if dtype is None:
            longest = max((int(c.max()) for c in self.iter_chunks() if c.size), default=0)
            dtype = next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64) if longest <= np.iinfo(t).max)
        dt = np.dtype(dtype)
        if dt.kind not in "iubf":
            raise ValueError(f"{self._shards.url}: lengths cannot be saved as dtype {dt}; give an integer dtype")
        # the longest length the dtype holds exactly (a float: every integer up to 2 ** (mantissa bits + 1))
        most = int(np.iinfo(dt).max) if dt.kind in "iu" else 1 if dt.kind == "b" else 2 ** (np.finfo(dt).nmant + 1)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dt, shape=(len(self),))
        try:
            with open(tmp, "r+b") as f:  # its disk space now: a write into a hole of a full disk is a SIGBUS
                allocate_whole(f.fileno(), os.fstat(f.fileno()).st_size, f"cannot save the lengths to {target}",
                               str(target))
            pos = 0
            for chunk in self.iter_chunks():
                if chunk.size and int(chunk.max()) > most:
                    at = pos + int(np.argmax(chunk > most))
                    raise ValueError(f"{self._shards.url}: record {at} of field {self.field!r} has length "
                                     f"{int(chunk[at - pos])}, more than dtype {dt} holds ({most})")
                out[pos : pos + len(chunk)] = chunk
                pos += len(chunk)
            out.flush()
        except BaseException:
            del out
            tmp.unlink(missing_ok=True)
            raise
        del out
        os.replace(tmp, target)
        return target

    def __repr__(self) -> str:
        return f"Lengths({self._shards.url}, field={self.field!r}, n={len(self)})"


class RaggedFields:
    """Lengths and streamed values of ragged fields, read through ``planner``; ``owner``: the Store (what a
    pickled :class:`Lengths` reopens). With a ``verify`` (``verify_reads=True``), :meth:`iter_ragged`
    checks each block's records against their stored checksums."""

    verify: ReadVerifier | None = None

    def __init__(self, planner: ReadPlanner, owner: Any) -> None:
        self.planner, self.shards, self.owner = planner, planner.shards, owner

    def lengths(self, field: str | None = None) -> Lengths:
        ragged = [n for n, f in self.shards.schema.items() if f.ragged]
        if field is None:
            if len(ragged) != 1:
                raise ValueError(f"{self.shards.url}: name the ragged field; ragged fields are {ragged}")
            field = ragged[0]
        if field not in ragged:
            raise ValueError(f"{self.shards.url}: field {field!r} is not ragged; ragged fields are {ragged}")
        return Lengths(self.planner, field, self.owner)

    def iter_ragged(self, field: str | None, chunk_records: int, start: int, stop: int | None
                    ) -> Iterator[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        name = self.lengths(field).field  # checks that the field exists and is ragged
        if chunk_records <= 0:
            raise ValueError(f"chunk_records must be positive, got {chunk_records}")
        stop = self.shards.n if stop is None else min(stop, self.shards.n)
        if start < 0 or start > stop:
            raise IndexError(f"record range [{start}, {stop}) is not inside 0..{self.shards.n}")

        def block(pos: int) -> tuple[Shard, int, int, int, int]:
            k, r = self.shards.locate(pos)
            end = min(stop, self.shards.table.end(k), pos + chunk_records)
            sh = self.shards.shard(k)
            off = sh.offsets[name]
            self.planner.need(off[r : r + end - pos + 1])
            a, b = int(off[r]), int(off[r + end - pos])
            if not 0 <= a <= b <= sh.columns[name].shape[0]:  # raises, naming the file, unless a node-cache
                checked_bounds(sh, name, np.arange(r, r + end - pos))  # copy fetched anew is sound
                a, b = int(off[r]), int(off[r + end - pos])
            return sh, r, end, a, b

        pos = start
        cur = block(pos) if pos < stop else None
        if cur is not None:
            self.planner.scan_ahead(cur[0].columns[name][cur[3] : cur[4]], cur[0].request)

        def read(at: int, got: tuple[Any, int, int, int, int]) -> tuple[Any, int, Any]:
            """The block ``got`` of records from ``at``: (values, its end, lengths), checked."""
            sh, r, end, a, b = got
            lengths = np.diff(sh.offsets[name][r : r + end - at + 1])
            if lengths.size and lengths.min() < 0 and sh.fetch_again(  # (a node-cache copy: the offsets found damaged)
                    f"{name}.offsets.npy", sh.offsets[name], r + np.flatnonzero(lengths < 0)):
                sh, r, end, a, b = block(at)  # (fetched anew: the values' range read anew with the lengths)
                lengths = np.diff(sh.offsets[name][r : r + end - at + 1])
            self.planner.need(sh.columns[name][a:b])
            if lengths.size and lengths.min() < 0:
                raise CorruptionError(f"{sh.display}/{(name + '.offsets.npy')}: offsets decrease in records "
                                      f"{at}..{end - 1}")
            if self.verify is not None:
                rows = np.arange(r, r + end - at, dtype=np.int64)
                self.verify.field(name, rows + (at - r), [(sh, slice(None), rows)],
                                  (sh.columns[name][a:b], lengths), False)
            return sh.columns[name][a:b], end, lengths

        def reread(at: int) -> tuple[Any, int, Any]:
            return read(at, block(at))

        while cur is not None:
            end = cur[2]
            nxt = block(end) if end < stop else None
            if nxt is not None:  # the next block's reads run while the caller works on this one
                self.planner.scan_ahead(nxt[0].columns[name][nxt[3] : nxt[4]], nxt[0].request)
            if self.verify is None:
                values, end, lengths = read(pos, cur)
            else:  # a node-cache copy failing its checksums: fetched again, the block read again (its offsets too)
                values, end, lengths = self.verify.checked(partial(read, pos, cur), partial(reread, pos))
            yield pos, values, lengths
            pos, cur = end, nxt
