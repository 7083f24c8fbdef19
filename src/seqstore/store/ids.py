"""Record ids: utf-8 encoding, the 64-bit id hash, and vectorised lookup kernels.

The id hash (part of the format, see docs/format.md) is FNV-1a 64 over the utf-8 bytes followed by
the splitmix64 finaliser. Lookups never trust the hash alone: every candidate's bytes are compared,
so equal hashes of different ids (expected about 3 pairs at 1e10 ids) are handled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from ..errors import SchemaError

__all__ = ["checked_query", "encode_ids", "not_str_id", "hash_ids", "hash_kernel", "hash_one", "probe_sorted",
           "id_equal", "FNV_OFFSET", "FNV_PRIME"]

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)


def not_str_id(id: Any) -> str:  # noqa: A002
    """What a lookup's error says of an id that is not a str: its type and value, and for an int how a
    log stores it (docs/logging.md: as its decimal string)."""
    said = f"got {type(id).__name__} {id!r}"
    if isinstance(id, (int, np.integer)) and not isinstance(id, (bool, np.bool_)):
        said += f" (an int id is stored as its decimal string: look it up as index('{int(id)}'))"
    return said


def encode_ids(ids: Sequence[Any], *, first_record: int = 0, query: bool = False
               ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Encode a sequence of str ids as (uint8 bytes, int64 offsets of len(ids)+1).

    Raises SchemaError naming the first non-str id and its record number; for ``query`` (ids to look
    up) a TypeError naming its position in the query.
    """
    encoded = []
    for k, s in enumerate(ids):
        if not isinstance(s, str):
            if query:
                raise TypeError(f"id {k} of the query: ids are str, {not_str_id(s)}")
            raise SchemaError(f"record {first_record + k}: id must be a str, got {type(s).__name__} {s!r}")
        encoded.append(s.encode("utf-8", "surrogatepass"))
    lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return data, offsets


def checked_query(qdata: Any, qoff: Any, where: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Ids to look up given as utf-8 bytes ``qdata[qoff[i]:qoff[i + 1]]``, checked, as (uint8 bytes, int64
    offsets): the kernels read them unchecked (an offset past the bytes read memory past the array, or
    crashed the process). ``qdata``: a 1-D array of bytes (or ``bytes``); ``qoff``: 1-D integers from 0,
    not decreasing, at most ``len(qdata)``. TypeError or ValueError naming ``where`` and the first bad
    offset. O(queries), no copy of the bytes."""
    data = np.frombuffer(qdata, np.uint8) if isinstance(qdata, (bytes, bytearray, memoryview)) else np.asarray(qdata)
    if data.ndim != 1 or data.dtype.kind not in "iu" or data.dtype.itemsize != 1:
        raise TypeError(f"{where}: index_encoded takes the ids' utf-8 bytes as a 1-D uint8 array, got "
                        f"dtype {data.dtype} shape {data.shape}")
    off = np.asarray(qoff)
    if off.ndim != 1 or off.dtype.kind not in "iu":
        raise TypeError(f"{where}: index_encoded takes 1-D integer offsets (one more than the ids), got "
                        f"dtype {off.dtype} shape {off.shape}")
    if len(off) == 0:
        raise ValueError(f"{where}: index_encoded takes one offset more than the ids (at least [0]), got none")
    big = off.dtype.kind == "u" and int(off.max()) > len(data)  # (before int64: 2**63 and up would wrap)
    off = off.astype(np.int64, copy=False)
    bad = np.flatnonzero(np.diff(off) < 0)
    if big or off[0] != 0 or len(bad) or off[-1] > len(data):
        at = 0 if off[0] != 0 else int(bad[0]) + 1 if len(bad) else len(off) - 1
        raise ValueError(f"{where}: index_encoded offsets must run from 0, not decreasing, to at most the "
                         f"{len(data)} bytes given; offset {at} is {qoff[at]}")
    return data.view(np.uint8), np.ascontiguousarray(off)


@numba.njit(cache=True, nogil=True)
def _hash_range(data: Any, a: int, b: int) -> Any:  # pragma: no cover - numba
    """The id hash of ``data[a:b]`` (docs/format.md section 5)."""
    prime = np.uint64(0x100000001B3)
    h = np.uint64(0xCBF29CE484222325)
    for j in range(a, b):
        h = (h ^ np.uint64(data[j])) * prime
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@numba.njit(cache=True, nogil=True)
def hash_kernel(data: Any, offsets: Any, out: Any) -> None:  # pragma: no cover - numba
    for i in range(out.shape[0]):
        out[i] = _hash_range(data, offsets[i], offsets[i + 1])


def hash_one(key: bytes) -> int:
    """The id hash of one utf-8 encoded id. About a microsecond."""
    return int(_hash_range(np.frombuffer(key, dtype=np.uint8), 0, len(key)))


# While the numba kernel is not loaded in this process, (ids x longest id) is below NUMPY_HASH_BYTES
# and no id is longer than NUMPY_HASH_LONGEST bytes, ids are hashed with numpy: the first numba call
# of a process costs about 0.3 s (holding the GIL), which a Logger writing its first buffers should
# not pay. Both give the same hashes (tests/store/test_store_ids.py).
NUMPY_HASH_BYTES = 1 << 22
NUMPY_HASH_LONGEST = 256


def hash_ids(data: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Hash every id (bytes ``data[offsets[i]:offsets[i+1]]``) to uint64. O(total bytes)."""
    out = np.empty(len(offsets) - 1, dtype=np.uint64)
    if len(out):
        # the numpy path costs (ids x longest id) element operations plus a Python step per byte
        # position of the longest id
        longest = int(np.max(np.diff(offsets)))
        if hash_kernel.signatures or longest > NUMPY_HASH_LONGEST or len(out) * longest > NUMPY_HASH_BYTES:
            hash_kernel(data, offsets, out)
        else:
            _hash_numpy(np.asarray(data), np.asarray(offsets), out)
    return out


def _hash_numpy(data: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
    """The id hash of every id, vectorised over ids one byte position at a time (numpy integer
    arrays wrap on overflow, as the hash wants)."""
    starts = offsets[:-1].astype(np.int64)
    lengths = offsets[1:].astype(np.int64) - starts
    h = np.full(len(lengths), FNV_OFFSET, dtype=np.uint64)
    shortest = int(lengths.min())
    for j in range(int(lengths.max())):
        if j < shortest:  # every id has a byte here
            h ^= data[starts + j]
            h *= FNV_PRIME
        else:
            live = np.flatnonzero(lengths > j)
            h[live] = (h[live] ^ data[starts[live] + j]) * FNV_PRIME
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    out[:] = h


@numba.njit(cache=True, nogil=True)
def _same_bytes(a: Any, a0: int, a1: int, b: Any, b0: int, b1: int) -> bool:  # pragma: no cover - numba
    """Whether ``a[a0:a1]`` and ``b[b0:b1]`` are the same bytes."""
    if a1 - a0 != b1 - b0:
        return False
    for j in range(a1 - a0):
        if a[a0 + j] != b[b0 + j]:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def id_equal(
    sdata: Any, soff: Any, rows: Any, qdata: Any, qoff: Any, qidx: Any, out: Any
) -> None:  # pragma: no cover - numba
    """out[k] = (stored id at row rows[k]) == (query id qidx[k]), comparing bytes."""
    for k in range(rows.shape[0]):
        r = rows[k]
        q = qidx[k]
        out[k] = _same_bytes(sdata, soff[r], soff[r + 1], qdata, qoff[q], qoff[q + 1])


@numba.njit(cache=True, nogil=True)
def probe_sorted(
    qh: Any, qorder: Any, hashes: Any, rows: Any, sdata: Any, soff: Any, qdata: Any, qoff: Any, base: Any, result: Any
) -> int:  # pragma: no cover - numba
    """For queries ``qorder`` (sorted by their hashes ``qh``) find the lowest local row of one shard's
    sorted hash index whose id bytes equal the query's, and write ``row + base`` to ``result``.
    Sorted queries let each binary search start where the previous one ended. Returns -1, or (and
    stops at) the position of an entry that is damaged: its row is outside the shard or not above the
    previous row of its hash, its row's id offsets are out of range, or its row's id has another hash."""
    n = hashes.shape[0]
    n_rows = soff.shape[0] - 1
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
        prev = -1
        while k < n and hashes[k] == h:
            r = rows[k]
            if r <= prev or r >= n_rows:
                return k
            prev = r
            a0 = soff[r]
            a1 = soff[r + 1]
            if a0 < 0 or a1 < a0 or a1 > sdata.shape[0]:
                return k
            if _same_bytes(sdata, a0, a1, qdata, b0, b1):
                result[q] = r + base
                k += 1
                while k < n and hashes[k] == h:  # the rest of the run: a damaged entry may name this row too
                    if rows[k] <= prev:
                        return k
                    prev = rows[k]
                    k += 1
                break
            if _hash_range(sdata, a0, a1) != h:
                return k
            k += 1
    return -1
