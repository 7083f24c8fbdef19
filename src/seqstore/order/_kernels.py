"""numba kernels behind every lazy order: the keyed permutation, sampling and bin arithmetic (the kernels
that sort are in :mod:`seqstore.order._sort_kernels`).

This module owns all per-index arithmetic of :mod:`seqstore.order`. Everything here is plain
uint64 arithmetic (no floating point that could round differently, no numpy RNG), so every
machine and numpy/numba version computes the same orders.

The permutation
---------------
A keyed bijection on ``[0, n)`` for every ``1 <= n < 2**63``, built as a *generalised* balanced
Feistel network on the rectangle ``Z_a x Z_b`` with ``a = ceil(sqrt(n))`` and ``b = ceil(n / a)``
(so the domain ``a * b`` is smaller than ``n + a``), then cycle walking down to ``[0, n)``:

* state ``(L, R) = (x // b, x % b)``; round ``i`` maps ``(L, R) -> (R, (L + F_i(R)) mod m_i)`` with
  ``m_i = a`` for even and ``b`` for odd ``i``. The radices swap every round and after the even number
  of rounds (:data:`ROUNDS` = 8) the state is back in ``Z_a x Z_b``; output ``L * b + R``. Each round
  is invertible, so the network is a permutation of ``[0, a*b)`` for any key.
* ``F_i(R) = mulhi(mix64(R ^ k_i), m_i)``: the splitmix64 finaliser of the half xor a 64-bit round key,
  reduced to ``[0, m_i)`` by the high word of a 64x32-bit product (bias < m / 2**64).
* cycle walking: apply the network until the value is ``< n``. The domain exceeds ``n`` by less than
  ``a ~ sqrt(n)``, so the expected walk is ``1 + O(1/sqrt(n))`` evaluations (not up to 4 as with a
  power-of-two domain), and there is no power-of-two edge case (the ``2**k + 1`` aliasing of Grain
  cannot happen: the bijection never depends on the bit width of ``n``).

Round keys are a splitmix64 stream seeded by a 64-bit master key; master keys come from a blake2b
hash of a canonical encoding of (seed, key epoch, stream) (see :mod:`seqstore.order._keys`), or for
sub-permutations (tie runs, inside bins) from :func:`child_key` of a parent key and an integer tag.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from . import _keys

__all__ = ["ROUNDS"]

ROUNDS = 8
"""Feistel rounds of the permutation (the issue asks for at least 6)."""
#: positions a take computes with the NumPy twins below rather than wait for numba's start-up on another
#: thread (:mod:`seqstore._numba_start`)
NUMPY_TAKE = 1 << 16

_U = np.uint64
_M32 = np.uint64(0xFFFFFFFF)
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_ONE = np.uint64(1)
_ZERO = np.uint64(0)


# --------------------------------------------------------------------------------------------- scalar helpers


@njit(cache=True, nogil=True, inline="always")
def mix64(z: np.uint64) -> np.uint64:
    """splitmix64 / murmur3-style finaliser: a bijection on uint64 with full avalanche."""
    z = (z ^ (z >> _U(30))) * _C1
    z = (z ^ (z >> _U(27))) * _C2
    return z ^ (z >> _U(31))


@njit(cache=True, nogil=True, inline="always")
def mulhi64(x: np.uint64, y: np.uint64) -> np.uint64:
    """High 64 bits of the 128-bit product ``x * y`` (exact)."""
    x_lo = x & _M32
    x_hi = x >> _U(32)
    y_lo = y & _M32
    y_hi = y >> _U(32)
    p0 = x_lo * y_lo
    p1 = x_lo * y_hi
    p2 = x_hi * y_lo
    p3 = x_hi * y_hi
    mid = (p0 >> _U(32)) + (p1 & _M32) + (p2 & _M32)
    return p3 + (p1 >> _U(32)) + (p2 >> _U(32)) + (mid >> _U(32))


@njit(cache=True, nogil=True, inline="always")
def _mulhi_small(f: np.uint64, m: np.uint64) -> np.uint64:
    """``floor(f * m / 2**64)`` for ``m < 2**32``: uniform-ish reduction of a hash to ``[0, m)``."""
    return ((f >> _U(32)) * m + (((f & _M32) * m) >> _U(32))) >> _U(32)


@njit(cache=True, nogil=True)
def muldiv(x: np.uint64, y: np.uint64, d: np.uint64) -> np.uint64:
    """``floor(x * y / d)`` exactly with a 128-bit intermediate; requires ``d < 2**63`` and a result < 2**64."""
    hi = mulhi64(x, y)
    lo = x * y
    if hi == _ZERO:
        return lo // d
    rem = hi
    q = _ZERO
    for i in range(63, -1, -1):
        rem = (rem << _ONE) | ((lo >> _U(i)) & _ONE)
        q = q << _ONE
        if rem >= d:
            rem -= d
            q |= _ONE
    return q


@njit(cache=True, nogil=True)
def split(n: np.uint64) -> tuple[np.uint64, np.uint64]:
    """Rectangle ``(a, b)`` for a permutation of ``[0, n)``, ``n >= 1``: ``a = ceil(sqrt(n))``, ``b = ceil(n/a)``."""
    m = n - _ONE
    a = _U(int(math.sqrt(float(m))))
    while a > _ZERO and a * a > m:
        a -= _ONE
    while (a + _ONE) * (a + _ONE) <= m:
        a += _ONE
    a += _ONE
    b = (n + a - _ONE) // a
    return a, b


@njit(cache=True, nogil=True)
def round_keys(master: np.uint64, out: np.ndarray) -> None:
    """Fill ``out`` (uint64, ``(ROUNDS,)``) with the splitmix64 stream seeded by ``master``."""
    s = master
    for i in range(out.shape[0]):
        s += _GAMMA
        out[i] = mix64(s)


@njit(cache=True, nogil=True)
def child_key(parent: np.uint64, tag: np.uint64) -> np.uint64:
    """Master key of a sub-permutation: injective in ``tag`` for a fixed ``parent``."""
    return mix64(mix64(parent + _GAMMA) ^ tag)


@njit(cache=True, nogil=True, inline="always")
def _feistel(x: np.uint64, a: np.uint64, b: np.uint64, keys: np.ndarray) -> np.uint64:
    left = x // b
    right = x - left * b
    for i in range(ROUNDS):
        m = a if (i & 1) == 0 else b
        t = left + _mulhi_small(mix64(right ^ keys[i]), m)
        t -= m * _U(t >= m)  # branchless: keeps the loop vectorisable
        left = right
        right = t
    return left * b + right


@njit(cache=True, nogil=True, inline="always")
def perm_one(x: np.uint64, n: np.uint64, a: np.uint64, b: np.uint64, keys: np.ndarray) -> np.uint64:
    """Image of ``x`` in ``[0, n)`` under the keyed permutation (Feistel + cycle walking)."""
    y = _feistel(x, a, b, keys)
    while y >= n:
        y = _feistel(y, a, b, keys)
    return y


def _mix_numpy(z: np.ndarray, m: np.uint64) -> np.ndarray:
    """``_mulhi_small(mix64(z), m)`` of a uint64 array in NumPy (the same wrapping uint64 arithmetic)."""
    z = (z ^ (z >> _U(30))) * _C1
    z = (z ^ (z >> _U(27))) * _C2
    f = z ^ (z >> _U(31))
    out: np.ndarray = ((f >> _U(32)) * m + (((f & _M32) * m) >> _U(32))) >> _U(32)
    return out


def _feistel_numpy(x: np.ndarray, a: Any, b: Any, keys: np.ndarray) -> np.ndarray:
    """:func:`_feistel` of a uint64 array in NumPy; ``a``, ``b`` scalars or arrays like ``x``, ``keys``
    ``(ROUNDS,)`` or ``(ROUNDS, len(x))`` (each entry its own network)."""
    left = x // b
    right = x - left * b
    for i in range(ROUNDS):
        m = a if (i & 1) == 0 else b
        t = left + _mix_numpy(right ^ keys[i], m)
        t -= m * (t >= m).astype(np.uint64)
        left, right = right, t
    out: np.ndarray = left * b + right
    return out


def _feistel_inv_numpy(y: np.ndarray, a: Any, b: Any, keys: np.ndarray) -> np.ndarray:
    """:func:`_feistel_inv` of a uint64 array in NumPy (arguments as :func:`_feistel_numpy`'s)."""
    left = y // b
    right = y - left * b
    for i in range(ROUNDS - 1, -1, -1):
        m = a if (i & 1) == 0 else b
        f = _mix_numpy(left ^ keys[i], m)
        left, right = right + m * (right < f).astype(np.uint64) - f, left
    out: np.ndarray = left * b + right
    return out


def _walked(x: np.ndarray, n: Any, a: Any, b: Any, keys: np.ndarray, step: Any) -> np.ndarray:
    """``step`` (a network of :func:`_feistel_numpy`'s arguments) again on each entry still ``>= n``
    (cycle walking, in NumPy); ``n``, ``a``, ``b``, ``keys`` scalars or per entry."""
    def at(v: Any, k: np.ndarray) -> Any:
        return v[k] if isinstance(v, np.ndarray) and v.ndim else v

    walk = np.flatnonzero(x >= n)
    while walk.size:
        x[walk] = step(x[walk], at(a, walk), at(b, walk), keys if keys.ndim == 1 else keys[:, walk])
        walk = walk[x[walk] >= at(n, walk)]
    return x.astype(np.int64)


def perm_take_numpy(pos: np.ndarray, n: Any, a: Any, b: Any, keys: np.ndarray) -> np.ndarray:
    """:func:`perm_take` in NumPy, the same values: for a first batch that must not wait for numba's
    start-up (:mod:`seqstore._numba_start`). ``n``, ``a``, ``b``, ``keys`` as :func:`_walked`'s. O(len(pos))
    memory."""
    return _walked(_feistel_numpy(pos.astype(np.uint64), a, b, keys), n, a, b, keys, _feistel_numpy)


def perm_inverse_numpy(values: np.ndarray, n: np.uint64, a: np.uint64, b: np.uint64, keys: np.ndarray) -> np.ndarray:
    """:func:`perm_inverse` in NumPy, the same positions (see :func:`perm_take_numpy`)."""
    return _walked(_feistel_inv_numpy(values.astype(np.uint64), a, b, keys), n, a, b, keys, _feistel_inv_numpy)


def random_block_numpy(pos: np.ndarray, n: np.uint64, bsize: np.uint64, wsize: np.uint64, nblocks: np.uint64,
                       short_slot: np.uint64, ba: np.uint64, bb: np.uint64, bkeys: np.ndarray,
                       wkey: np.uint64, most: int = 1024) -> np.ndarray | None:
    """:func:`random_block` of positions ``pos`` in NumPy, the same values (see :func:`perm_take_numpy`):
    each window's parameters once (a Python step of ~10 us per window the positions fall in), the networks
    of all positions at once. None where the positions fall in more than ``most`` windows."""
    r = n - (nblocks - _ONE) * bsize
    cut = short_slot * bsize + r
    pad = bsize - r
    p = pos.astype(np.uint64)
    wins, which = np.unique(np.where(p < cut, p, p + pad) // bsize // wsize, return_inverse=True)
    if len(wins) > most:
        return None
    first = wins * wsize
    vs, ve = first * bsize, (first + np.minimum(wsize, nblocks - first)) * bsize
    lo = np.where(vs < cut, vs, vs - pad)
    m = np.where(ve < cut, ve, ve - pad) - lo
    ab = np.array([_keys.split(int(k)) for k in m.tolist()], dtype=np.uint64).reshape(-1, 2)
    keys = np.array([_keys.round_keys(_keys.child_key(int(wkey), w), ROUNDS) for w in wins.tolist()],
                    dtype=np.uint64).reshape(-1, ROUNDS).T[:, which]
    q = lo[which] + perm_take_numpy(p - lo[which], m[which], ab[which, 0], ab[which, 1], keys).astype(np.uint64)
    v = np.where(q < cut, q, q + pad)
    t = v // bsize
    out: np.ndarray = perm_take_numpy(t, nblocks, ba, bb, bkeys) * np.int64(bsize) + (v - t * bsize).astype(np.int64)
    return out


# --------------------------------------------------------------------------------------------- vector kernels


@njit(cache=True, nogil=True)
def _walk(n: np.uint64, a: np.uint64, b: np.uint64, keys: np.ndarray, out: np.ndarray) -> None:
    """Second pass of the vector kernels: cycle-walk the (rare) entries of ``out`` that are ``>= n``."""
    for i in range(out.shape[0]):
        y = _U(out[i])
        if y >= n:
            while y >= n:
                y = _feistel(y, a, b, keys)
            out[i] = np.int64(y)


@njit(cache=True, nogil=True)
def perm_take(pos: np.ndarray, n: np.uint64, a: np.uint64, b: np.uint64, keys: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = perm(pos[i])``; ``pos`` int64 in ``[0, n)``, ``out`` int64 of the same size. O(1) memory.

    Two passes: one branch-free network evaluation per entry (SIMD-friendly), then cycle walking of the
    few entries that left ``[0, n)`` (fewer than ``a / n`` of them on average).
    """
    for i in range(pos.shape[0]):
        out[i] = np.int64(_feistel(_U(pos[i]), a, b, keys))
    _walk(n, a, b, keys, out)


@njit(cache=True, nogil=True)
def perm_range(start: np.int64, n: np.uint64, a: np.uint64, b: np.uint64, keys: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = perm(start + i)`` for ``i < out.size``. O(1) memory; two passes as :func:`perm_take`."""
    s = _U(start)
    for i in range(out.shape[0]):
        out[i] = np.int64(_feistel(s + _U(i), a, b, keys))
    _walk(n, a, b, keys, out)


@njit(cache=True, nogil=True)
def sample_take(pos: np.ndarray, n: np.uint64, k0: np.uint64, k1: np.uint64, out: np.ndarray) -> None:
    """``out[i]`` = draw ``pos[i]`` of an i.i.d. uniform sequence on ``[0, n)`` (counter-based hash)."""
    for i in range(pos.shape[0]):
        h = mix64(mix64(_U(pos[i]) * _GAMMA + k0) ^ k1)
        out[i] = np.int64(mulhi64(h, n))


_BLOCK_CACHE_MASK = np.uint64(1023)  # direct-mapped cache of block-permutation values: 1024 slots


@njit(cache=True, nogil=True)
def random_block(
    pos: np.ndarray,
    start: np.uint64,
    ranged: bool,
    n: np.uint64,
    bsize: np.uint64,
    wsize: np.uint64,
    nblocks: np.uint64,
    short_slot: np.uint64,
    ba: np.uint64,
    bb: np.uint64,
    bkeys: np.ndarray,
    wkey: np.uint64,
    out: np.ndarray,
) -> None:
    """``out[k]`` = the record at position ``start + k`` (``ranged``; ``pos`` is not read) or ``pos[k]`` of
    the ``random_block`` order.

    Records are cut into ``nblocks`` blocks of ``bsize`` (the last one, ``nblocks - 1``, holds the
    remaining ``r = n - (nblocks-1)*bsize`` records). Slot ``t`` of the block order visits block
    ``perm(t)`` (keys ``bkeys``); the short block sits at slot ``short_slot``. Laying the slots end to
    end gives the *block-permuted sequence*; its "virtual" coordinates pad the short slot to ``bsize``,
    so slot ``t`` covers virtual ``[t*bsize, (t+1)*bsize)`` and real = virtual - pad after the short slot.
    Window ``w`` = slots ``[w*wsize, min((w+1)*wsize, nblocks))``, a contiguous real range of
    ``m_w`` positions, permuted by the keyed permutation of ``[0, m_w)`` with master
    ``child_key(wkey, w)``. Entries are handled in runs of at most 1024 that fall in one window (an
    ascending range: whole windows): window parameters once per window, the run's offsets copied into
    a local buffer, a branch-free network pass over it in place (SIMD-friendly, as
    :func:`perm_range`), then cycle walking and the block lookup into ``out``; block values go
    through a 1024-slot direct-mapped cache. (Reading ``pos`` and writing ``out`` in the network pass
    itself ran up to 3.5x slower on the benchmark box for some array sizes and addresses.)
    """
    r = n - (nblocks - _ONE) * bsize
    cut = short_slot * bsize + r  # first real position after the short slot
    pad = bsize - r
    pow2 = (bsize & (bsize - _ONE)) == _ZERO  # shifts instead of divisions for B = 2**k
    shift = _ZERO
    while (_ONE << shift) < bsize:
        shift += _ONE
    wk = np.empty(ROUNDS, dtype=np.uint64)
    tags = np.empty(1024, dtype=np.uint64)
    vals = np.empty(1024, dtype=np.uint64)
    buf = np.empty(1024, dtype=np.uint64)
    for k in range(1024):
        tags[k] = ~_ZERO  # no slot is 2**64 - 1
    size = out.shape[0]
    i = np.int64(0)
    while i < size:
        # the window of position p: its real range [lo, lo + m) and permutation parameters
        p = start + _U(i) if ranged else _U(pos[i])
        v = p if p < cut else p + pad
        w = (v // bsize) // wsize
        first = w * wsize
        left = nblocks - first
        cnt = wsize if wsize < left else left
        vs = first * bsize
        ve = (first + cnt) * bsize
        lo = vs if vs < cut else vs - pad
        m = (ve if ve < cut else ve - pad) - lo
        wa, wb = split(m)
        round_keys(child_key(wkey, w), wk)
        while True:  # runs of at most 1024 entries inside this window
            if ranged:
                run = np.int64(min(_U(min(size - i, 1024)), lo + m - p))
                for k in range(run):
                    buf[k] = p - lo + _U(k)
            else:
                run = np.int64(0)
                while i + run < size and run < 1024:
                    x = _U(pos[i + run])
                    if x < lo or x - lo >= m:
                        break
                    buf[run] = x - lo
                    run += 1
            for k in range(run):  # branch-free network pass, in place (SIMD-friendly)
                buf[k] = _feistel(buf[k], wa, wb, wk)
            for k in range(run):
                y = buf[k]
                while y >= m:  # cycle walking: rare, the domain exceeds m by < sqrt(m) + 1
                    y = _feistel(y, wa, wb, wk)
                q = lo + y
                v2 = q if q < cut else q + pad
                t = (v2 >> shift) if pow2 else v2 // bsize
                c = np.int64(t & _BLOCK_CACHE_MASK)
                if tags[c] != t:
                    tags[c] = t
                    vals[c] = perm_one(t, nblocks, ba, bb, bkeys)
                out[i + k] = np.int64(vals[c] * bsize + (v2 - t * bsize))
            i += run
            if i >= size:
                break
            p = start + _U(i) if ranged else _U(pos[i])
            if p < lo or p - lo >= m:
                break


@njit(cache=True, nogil=True)
def bin_start(b: np.uint64, n: np.uint64, bins: np.uint64) -> np.uint64:
    """First position of bin ``b``: ``floor(b * n / bins)`` (RETURNN's bin boundaries), exact."""
    return muldiv(b, n, bins)


@njit(cache=True, nogil=True)
def bin_of(p: np.uint64, n: np.uint64, bins: np.uint64) -> np.uint64:
    """The bin holding position ``p < n``: the largest ``b < bins`` with ``bin_start(b) <= p``."""
    b = muldiv(p + _ONE, bins, n)
    if b >= bins or bin_start(b, n, bins) > p:
        b -= _ONE
    return b


@njit(cache=True, nogil=True)
def bin_bounds(bin_ids: np.ndarray, n: np.uint64, bins: np.uint64, starts: np.ndarray, sizes: np.ndarray) -> None:
    """Start position and size of each bin in ``bin_ids`` (int64 arrays of the same length)."""
    for k in range(bin_ids.shape[0]):
        b = _U(bin_ids[k])
        s = bin_start(b, n, bins)
        starts[k] = np.int64(s)
        sizes[k] = np.int64(bin_start(b + _ONE, n, bins) - s)


@njit(cache=True, nogil=True)
def laplace_locate(pos: np.ndarray, n: np.uint64, bins: np.uint64, slots: np.ndarray, offs: np.ndarray) -> None:
    """Bin and offset inside the bin of each position (laplace bins are visited in order)."""
    for i in range(pos.shape[0]):
        p = _U(pos[i])
        b = bin_of(p, n, bins)
        slots[i] = np.int64(b)
        offs[i] = np.int64(p - bin_start(b, n, bins))


@njit(cache=True, nogil=True)
def perm_bins(
    bin_ids: np.ndarray,
    n: np.uint64,
    bins: np.uint64,
    a: np.uint64,
    b: np.uint64,
    keys: np.ndarray,
    flat: np.ndarray,
) -> None:
    """The permutation's values over the positions of each bin in ``bin_ids``, concatenated into ``flat``."""
    pos = np.int64(0)
    for k in range(bin_ids.shape[0]):
        j = _U(bin_ids[k])
        s = bin_start(j, n, bins)
        m = np.int64(bin_start(j + _ONE, n, bins) - s)
        for t in range(m):
            flat[pos + t] = np.int64(perm_one(s + _U(t), n, a, b, keys))
        pos += m


# --------------------------------------------------------------------------------------------- inverse


@njit(cache=True, nogil=True, inline="always")
def _feistel_inv(y: np.uint64, a: np.uint64, b: np.uint64, keys: np.ndarray) -> np.uint64:
    left = y // b
    right = y - left * b
    for i in range(ROUNDS - 1, -1, -1):
        m = a if (i & 1) == 0 else b
        f = _mulhi_small(mix64(left ^ keys[i]), m)
        t = right + m * _U(right < f) - f
        right = left
        left = t
    return left * b + right


@njit(cache=True, nogil=True)
def perm_inverse(
    values: np.ndarray, n: np.uint64, a: np.uint64, b: np.uint64, keys: np.ndarray, out: np.ndarray
) -> None:
    """``out[i]`` = the position of ``values[i]`` (inverse permutation, walking the cycle backwards)."""
    for i in range(values.shape[0]):
        x = _feistel_inv(_U(values[i]), a, b, keys)
        while x >= n:
            x = _feistel_inv(x, a, b, keys)
        out[i] = np.int64(x)
