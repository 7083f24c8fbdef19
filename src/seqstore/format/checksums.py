"""Per-record checksums (``shard-NNNNNN/_checks.npy``): what verified reads compare a read against.

Each committed shard of a version-3 store written by this seqstore has one ``(n, C)`` ``<u4`` matrix:
row ``i`` holds record ``i``'s checksum of every field (schema order) and, where the records have
ids, of its id (last column). A record's checksum of a field is the low 32 bits of XXH3-64 (seed 0,
the default secret) of the field's stored bytes of that record: a fixed field's ``prod(shape) *
itemsize`` bytes (a packed field: its column range of the group's row), a ragged field's value rows
``data[off[i]:off[i+1]]``, an id's UTF-8 bytes. XXH3 mixes in the length, so a record whose offsets
moved (fewer or more rows) fails its check even where the bytes it now covers were intact. One row
per record keeps a random read's checks in one page: 4 bytes per field and record (docs/format.md,
section 4.1).

The hash runs in numba over addresses (no Python object per record) without the GIL, long inputs in
8-lane vector operations; its output is tested against the ``xxhash`` package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
from llvmlite import ir  # type: ignore[import-untyped]
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["CHECKS", "IDS_COLUMN", "SECRET_AT", "check_at", "check_columns", "copy_check_at", "memcpy_at",
           "span_checks", "spans_at"]

#: the checksum file of a shard
CHECKS = "_checks.npy"
#: the column name of the ids' checksums (after the fields)
IDS_COLUMN = "_ids"

# XXH3 (64-bit, seed 0, the default secret), as specified by the xxHash project
_SECRET = np.frombuffer(bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671fcb79e64eccc0e578825ad07dccff7221"
    "b8084674f743248ee03590e6813a264c3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364eac5ac8334d3ebc3c581a0fffa1363eb"
    "170ddd51b7f0da49d316552629d4689e2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
), np.uint8)
#: the secret's address, for numba code (given as an argument: a compiled, cached function must not hold it)
SECRET_AT = _SECRET.__array_interface__["data"][0]
_P32_1 = np.uint64(0x9E3779B1)
_P32_2 = np.uint64(0x85EBCA77)
_P32_3 = np.uint64(0xC2B2AE3D)
_P64_1 = np.uint64(0x9E3779B185EBCA87)
_P64_2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P64_3 = np.uint64(0x165667B19E3779F9)
_P64_4 = np.uint64(0x85EBCA77C2B2AE63)
_P64_5 = np.uint64(0x27D4EB2F165667C5)
_MX1 = np.uint64(0x165667919E3779F9)
_MX2 = np.uint64(0x9FB21C651E98DF25)
_LOW32 = np.uint64(0xFFFFFFFF)


def _loader(bits: int) -> Any:
    @intrinsic
    def load(typingctx: Any, addr: Any) -> Any:  # pragma: no cover - numba
        sig = types.uint64(types.intp)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            ptr = builder.inttoptr(args[0], ir.IntType(bits).as_pointer())
            val = builder.load(ptr, align=1)
            return builder.zext(val, ir.IntType(64)) if bits < 64 else val

        return sig, codegen

    return load


_load64 = _loader(64)
_load32 = _loader(32)
_load8 = _loader(8)


@intrinsic
def _fold(typingctx: Any, a: Any, b: Any) -> Any:  # pragma: no cover - numba
    """The 128-bit product of two uint64, its low and high halves xor-ed."""
    sig = types.uint64(types.uint64, types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        wide = ir.IntType(128)
        prod = builder.mul(builder.zext(args[0], wide), builder.zext(args[1], wide))
        lo = builder.trunc(prod, ir.IntType(64))
        hi = builder.trunc(builder.lshr(prod, ir.Constant(wide, 64)), ir.IntType(64))
        return builder.xor(lo, hi)

    return sig, codegen


@intrinsic
def _bswap64(typingctx: Any, a: Any) -> Any:  # pragma: no cover - numba
    sig = types.uint64(types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bswap(args[0])

    return sig, codegen


@numba.njit(inline="always")
def _rotl(x: Any, r: int) -> Any:  # pragma: no cover - numba
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@numba.njit(inline="always")
def _xxh64_avalanche(h: Any) -> Any:  # pragma: no cover - numba
    h = (h ^ (h >> np.uint64(33))) * _P64_2
    h = (h ^ (h >> np.uint64(29))) * _P64_3
    return h ^ (h >> np.uint64(32))


@numba.njit(inline="always")
def _avalanche(h: Any) -> Any:  # pragma: no cover - numba
    h = (h ^ (h >> np.uint64(37))) * _MX1
    return h ^ (h >> np.uint64(32))


@numba.njit(inline="always")
def _mix16(p: int, s: int) -> Any:  # pragma: no cover - numba
    return _fold(_load64(p) ^ _load64(s), _load64(p + 8) ^ _load64(s + 8))  # type: ignore[call-arg]


def _stripes_codegen(copy: bool) -> Any:
    """LLVM code for :func:`_stripes` (``copy``: :func:`_stripes_copy`)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i64 = ir.IntType(64)
        vt = ir.VectorType(i64, 8)
        a_ptr = builder.inttoptr(args[0], vt.as_pointer())
        slot = cgutils.alloca_once_value(builder, builder.load(a_ptr, align=8))  # type: ignore[no-untyped-call]
        mask, shift = ir.Constant(vt, [0xFFFFFFFF] * 8), ir.Constant(vt, [32] * 8)
        order = ir.Constant(ir.VectorType(ir.IntType(32), 8), [1, 0, 3, 2, 5, 4, 7, 6])
        with cgutils.for_range(builder, args[3]) as loop:
            at = builder.mul(loop.index, ir.Constant(i64, 64))
            v = builder.load(builder.inttoptr(builder.add(args[1], at), vt.as_pointer()), align=1)
            if copy:
                builder.store(v, builder.inttoptr(builder.add(args[4], at), vt.as_pointer()), align=1)
            sec = builder.inttoptr(builder.add(args[2], builder.mul(loop.index, ir.Constant(i64, 8))),
                                   vt.as_pointer())
            key = builder.xor(v, builder.load(sec, align=1))
            prod = builder.mul(builder.and_(key, mask), builder.lshr(key, shift))
            total = builder.add(builder.add(builder.load(slot), builder.shuffle_vector(v, v, order)), prod)
            builder.store(total, slot)
        builder.store(builder.load(slot), a_ptr, align=8)
        return context.get_dummy_value()

    return codegen


@intrinsic
def _stripes(typingctx: Any, acc: Any, p: Any, s: Any, count: Any) -> Any:  # pragma: no cover - numba
    """Accumulate the ``count`` 64-byte stripes at address ``p`` (stripe ``k`` with the secret at ``s +
    8k``) into the 8 uint64 at ``acc`` (8-byte aligned), as 8-lane vector operations on an accumulator
    held in registers across the stripes (numba's loops of lanes stay scalar, and an accumulator stored
    back after each stripe waits on its own store: both about half the speed)."""
    return types.void(types.intp, types.intp, types.intp, types.intp), _stripes_codegen(False)


@intrinsic
def _stripes_copy(typingctx: Any, acc: Any, p: Any, s: Any, count: Any, d: Any) -> Any:  # pragma: no cover
    """:func:`_stripes` that also stores each stripe at ``d + 64k`` as it is loaded: a copy that hashes
    in the same pass."""
    return types.void(types.intp, types.intp, types.intp, types.intp, types.intp), _stripes_codegen(True)


@intrinsic
def memcpy_at(typingctx: Any, dst: Any, src: Any, n: Any) -> Any:  # pragma: no cover - numba
    """For numba code: ``memcpy(dst, src, n)`` of addresses given as integers (LLVM's memcpy)."""
    sig = types.void(types.intp, types.intp, types.intp)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        d, s, k = args
        ptr = cgutils.voidptr_t
        cgutils.raw_memcpy(builder, builder.inttoptr(d, ptr), builder.inttoptr(s, ptr), k, 1)  # type: ignore[no-untyped-call]
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(nogil=True, cache=True)
def _long(p: int, n: int, sec: int, acc: Any, d: int) -> Any:  # pragma: no cover - numba
    """XXH3-64 of more than 240 bytes; ``acc``: scratch of 8 uint64; ``d``: where to copy the bytes
    to as they are hashed (0: nowhere)."""
    acc[0], acc[1], acc[2], acc[3] = _P32_3, _P64_1, _P64_2, _P64_3
    acc[4], acc[5], acc[6], acc[7] = _P64_4, _P32_2, _P64_5, _P32_1
    at = acc.ctypes.data
    per_block = (192 - 64) // 8
    block = 64 * per_block
    blocks = (n - 1) // block
    for b in range(blocks):
        if d:
            _stripes_copy(at, p + b * block, sec, per_block, d + b * block)  # type: ignore[call-arg]
        else:
            _stripes(at, p + b * block, sec, per_block)  # type: ignore[call-arg]
        s = sec + 192 - 64
        for j in range(8):
            x = acc[j]
            acc[j] = ((x ^ (x >> np.uint64(47))) ^ _load64(s + 8 * j)) * _P32_1
    q = blocks * block
    tail = ((n - 1) - q) // 64
    if d:
        _stripes_copy(at, p + q, sec, tail, d + q)  # type: ignore[call-arg]
        done = q + 64 * tail
        memcpy_at(d + done, p + done, n - done)
    else:
        _stripes(at, p + q, sec, tail)  # type: ignore[call-arg]
    _stripes(at, p + n - 64, sec + 192 - 64 - 7, 1)
    s = sec + 11
    h = np.uint64(n) * _P64_1
    for j in range(0, 8, 2):
        h += _fold(acc[j] ^ _load64(s + 8 * j), acc[j + 1] ^ _load64(s + 8 * j + 8))
    return _avalanche(h)


@numba.njit(nogil=True, cache=True)
def _xxh3(p: int, n: int, sec: int, acc: Any) -> Any:  # pragma: no cover - numba
    """XXH3-64 (seed 0, the secret at address ``sec``) of the ``n`` bytes at address ``p``."""
    if n <= 16:
        if n > 8:
            lo = _load64(p) ^ (_load64(sec + 24) ^ _load64(sec + 32))
            hi = _load64(p + n - 8) ^ (_load64(sec + 40) ^ _load64(sec + 48))
            return _avalanche(np.uint64(n) + _bswap64(lo) + hi + _fold(lo, hi))  # type: ignore[call-arg]
        if n >= 4:
            x = _load32(p + n - 4) + (_load32(p) << np.uint64(32))
            h = x ^ (_load64(sec + 8) ^ _load64(sec + 16))
            h ^= _rotl(h, 49) ^ _rotl(h, 24)
            h *= _MX2
            h ^= (h >> np.uint64(35)) + np.uint64(n)
            h *= _MX2
            return h ^ (h >> np.uint64(28))
        if n > 0:
            c = ((_load8(p) << np.uint64(16)) | (_load8(p + (n >> 1)) << np.uint64(24))
                 | _load8(p + n - 1) | (np.uint64(n) << np.uint64(8)))
            return _xxh64_avalanche(c ^ (_load32(sec) ^ _load32(sec + 4)))
        return _xxh64_avalanche(_load64(sec + 56) ^ _load64(sec + 64))
    if n <= 128:
        h = np.uint64(n) * _P64_1
        if n > 32:
            if n > 64:
                if n > 96:
                    h += _mix16(p + 48, sec + 96)
                    h += _mix16(p + n - 64, sec + 112)
                h += _mix16(p + 32, sec + 64)
                h += _mix16(p + n - 48, sec + 80)
            h += _mix16(p + 16, sec + 32)
            h += _mix16(p + n - 32, sec + 48)
        h += _mix16(p, sec)
        h += _mix16(p + n - 16, sec + 16)
        return _avalanche(h)
    if n <= 240:
        h = np.uint64(n) * _P64_1
        for i in range(8):
            h += _mix16(p + 16 * i, sec + 16 * i)
        end = _mix16(p + n - 16, sec + 136 - 17)
        h = _avalanche(h)
        for i in range(8, n // 16):
            end += _mix16(p + 16 * i, sec + 16 * (i - 8) + 3)
        return _avalanche(h + end)
    return _long(p, n, sec, acc, 0)


@numba.njit(nogil=True, cache=True)
def check_at(p: int, n: int, sec: int, acc: Any) -> Any:  # pragma: no cover - numba
    """For numba code: the checksum of the ``n`` bytes at address ``p`` (``sec``: :data:`SECRET_AT`;
    ``acc``: scratch of 8 uint64)."""
    return np.uint32(_xxh3(p, n, sec, acc) & _LOW32)


@numba.njit(nogil=True, cache=True)
def copy_check_at(src: int, dst: int, n: int, sec: int, acc: Any) -> Any:  # pragma: no cover - numba
    """For numba code: copy the ``n`` bytes at address ``src`` to address ``dst`` (not overlapping)
    and return their checksum, hashing long inputs as they are copied (one pass over them)."""
    if n > 240:
        return np.uint32(_long(src, n, sec, acc, dst) & _LOW32)
    if n > 0:
        memcpy_at(dst, src, n)  # type: ignore[call-arg]
    return np.uint32(_xxh3(dst, n, sec, acc) & _LOW32)


@numba.njit(nogil=True, cache=True)
def _spans(base: int, starts: Any, lens: Any, out: Any, sec: int) -> None:  # pragma: no cover - numba
    acc = np.empty(8, np.uint64)
    for k in range(starts.shape[0]):
        out[k] = np.uint32(_xxh3(base + starts[k], lens[k], sec, acc) & _LOW32)


def span_checks(buf: np.ndarray[Any, Any], starts: Any, lens: Any) -> np.ndarray[Any, np.dtype[np.uint32]]:
    """The checksum of each span ``buf[starts[k] : starts[k] + lens[k]]`` (byte offsets into the
    C-contiguous array ``buf``; the caller guarantees they lie inside it)."""
    if buf.size and not buf.flags.c_contiguous:
        raise ValueError("span_checks needs a C-contiguous buffer")
    return spans_at(buf.__array_interface__["data"][0] if buf.size else 0, starts, lens)


def spans_at(base: int, starts: Any, lens: Any) -> np.ndarray[Any, np.dtype[np.uint32]]:
    """:func:`span_checks` of spans given as absolute addresses ``base + starts[k]`` (of live arrays)."""
    s = np.ascontiguousarray(starts, dtype=np.int64)
    out = np.empty(len(s), np.uint32)
    if len(s):
        _spans(base, s, np.ascontiguousarray(lens, dtype=np.int64), out, SECRET_AT)
    return out


def check_columns(fields: Sequence[str], has_ids: bool) -> list[str]:
    """The columns of a shard's checksum matrix: the fields in schema order, then the ids."""
    return [*fields, IDS_COLUMN] if has_ids else list(fields)
