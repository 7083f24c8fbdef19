"""Key derivation for keyed orders: a stable hash of (seed, key epoch, stream) to a 64-bit master key.

The hash is blake2b over a canonical text encoding, so the key of (seed=s, epoch=e) and (s+1, e-1),
or any other pair, coincide only by a 64-bit hash collision, never by arithmetic (unlike seed + epoch
schemes). The same inputs give the same key on every machine and Python/numpy version.
"""

from __future__ import annotations

import decimal
import hashlib
import math

__all__ = ["master_key", "int_text", "key_epoch", "mix64", "round_keys", "child_key", "split"]

_DOMAIN = "seqstore.order/v1"


def master_key(seed: int, key_epoch: int, stream: str) -> int:
    """64-bit master key (a Python int in ``[0, 2**64)``) of ``stream`` for ``seed`` and ``key_epoch``.

    ``seed`` is any Python int (negative allowed), ``key_epoch`` >= 1, ``stream`` names the use
    (e.g. ``"perm"``, ``"random_sample"``, ``"sort_bin_shuffle"``). O(1).
    """
    text = f"{_DOMAIN}\x00{stream}\x00{int_text(seed)}\x00{int_text(key_epoch)}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def int_text(value: int) -> str:
    """``str(value)`` of any int: past Python's int -> str digit limit (``sys.get_int_max_str_digits``, 4300
    by default) the same digits through :mod:`decimal`, which has no such limit."""
    try:
        return str(int(value))
    except ValueError:
        return str(decimal.Decimal(int(value)))


def key_epoch(epoch: int, partition_epoch: int, nth: int) -> int:
    """RETURNN's seed epoch: full epoch ``(epoch-1)//partition_epoch + 1``, grouped by ``nth``:
    ``(full-1)//nth + 1``. All sub-epochs of a full epoch (and ``nth`` full epochs) share one key."""
    full = (epoch - 1) // partition_epoch + 1
    return (full - 1) // nth + 1


_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """Python twin of :func:`seqstore.order._kernels.mix64` (the splitmix64 finaliser) on ints < 2**64."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def round_keys(master: int, rounds: int) -> list[int]:
    """Python twin of the numba ``round_keys``: the splitmix64 stream seeded by ``master``."""
    out = []
    s = master
    for _ in range(rounds):
        s = (s + _GAMMA) & _MASK
        out.append(mix64(s))
    return out


def child_key(parent: int, tag: int) -> int:
    """Python twin of the numba ``child_key``: the master key of a sub-permutation."""
    return mix64(mix64((parent + _GAMMA) & _MASK) ^ tag)


def split(n: int) -> tuple[int, int]:
    """Python twin of the numba ``split``: ``a = ceil(sqrt n)``, ``b = ceil(n / a)`` for ``n >= 1``."""
    a = math.isqrt(n - 1) + 1
    return a, -(-n // a)
