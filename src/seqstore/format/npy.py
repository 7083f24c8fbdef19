"""``.npy`` headers of a fixed size, so a file can be written before its final shape is known.

seqstore writes every data file as a standard NumPy ``.npy`` file (format 1.0) whose header is padded
to exactly :data:`HEADER_BYTES` bytes, or to :data:`PAGE_HEADER_BYTES` for a file written with direct
I/O (its data then starts on a page boundary). The writer puts a provisional shape first and rewrites
the header in place, at the same size, when the shard is finished.
Readers accept any valid 1.0/2.0/3.0 header (so files written by ``np.save`` also open).
"""

from __future__ import annotations

import ast
import os
import re
import struct
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ..errors import CorruptionError, open_files_exhausted

__all__ = ["HEADER_BYTES", "PAGE_HEADER_BYTES", "NpyHeader", "encode_header", "write_header", "read_header"]

HEADER_BYTES = 128
PAGE_HEADER_BYTES = 4096
_MAGIC = b"\x93NUMPY"
#: the longest header :func:`read_header` reads (a version-1.0 header is at most 65545 bytes; a longer
#: length in a 2.0/3.0 header is damage, reported as a truncated header rather than allocated)
_MAX_HEADER = 1 << 20

#: a header of a plain dtype (not a structured one), parsed without ``ast``: on Python 3.11
#: ``ast.literal_eval`` on several threads at once can fail ("AST constructor recursion depth
#: mismatch"), which made readers opening shards on threads report a sound file as corrupt
_PLAIN = re.compile(
    r"\{'descr': '(?P<descr>[^'\\]*)', 'fortran_order': (?P<fortran>True|False), "
    r"'shape': \((?P<shape>[0-9, ]*)\), \}\s*\Z"
)
#: the other headers (structured dtypes) are parsed by ``ast``, one thread at a time
_AST_LOCK = threading.Lock()


@dataclass(frozen=True)
class NpyHeader:
    """A parsed ``.npy`` header: dtype, C-order shape and the byte offset where data starts."""

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    data_offset: int

    @property
    def data_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def encode_header(dtype: np.dtype[Any], shape: tuple[int, ...], size: int = HEADER_BYTES) -> bytes:
    """Return a format-1.0 ``.npy`` header of exactly ``size`` bytes (a multiple of 64)."""
    shape_repr = repr(tuple(int(s) for s in shape))
    text = f"{{'descr': {dtype.str!r}, 'fortran_order': False, 'shape': {shape_repr}, }}"
    if size % 64 or not 64 <= size <= 65536:
        raise ValueError(f"npy header size must be a multiple of 64 from 64 to 65536, got {size}")
    body_len = size - len(_MAGIC) - 4
    if len(text) + 1 > body_len:
        raise ValueError(f"npy header for shape {shape} does not fit in {size} bytes")
    body = text.ljust(body_len - 1) + "\n"
    return _MAGIC + b"\x01\x00" + struct.pack("<H", body_len) + body.encode("latin1")


def write_header(f: BinaryIO, dtype: np.dtype[Any], shape: tuple[int, ...], size: int = HEADER_BYTES) -> None:
    """Write (or rewrite in place) the ``size``-byte header at the start of ``f``; the position is restored."""
    raw = encode_header(dtype, shape, size)  # checked before the file is touched
    pos = f.tell()
    f.seek(0)
    f.write(raw)
    f.seek(max(pos, size))


def parse_header(raw: bytes, path: str | os.PathLike[str]) -> NpyHeader:
    """Parse a header from the first bytes of a file; raise CorruptionError naming ``path``."""
    if len(raw) < 10 or raw[:6] != _MAGIC:
        raise CorruptionError(f"{path}: not a .npy file (bad magic)")
    major = raw[6]
    if major == 1:
        hlen, start = struct.unpack("<H", raw[8:10])[0], 10
    elif major in (2, 3):
        if len(raw) < 12:
            raise CorruptionError(f"{path}: truncated .npy header")
        hlen, start = struct.unpack("<I", raw[8:12])[0], 12
    else:
        raise CorruptionError(f"{path}: unsupported .npy format version {major}")
    if len(raw) < start + hlen:
        raise CorruptionError(f"{path}: truncated .npy header")
    try:
        text = raw[start : start + hlen].decode("utf-8" if major == 3 else "latin1")
        plain = _PLAIN.match(text)
        if plain is not None:  # what seqstore and np.save write for a plain dtype
            descr: Any = plain["descr"]
            fortran = plain["fortran"] == "True"
            shape = tuple(int(s) for s in plain["shape"].replace(",", " ").split())
        else:
            with _AST_LOCK:
                d = ast.literal_eval(text)
            descr, fortran = d["descr"], bool(d["fortran_order"])
            shape = d["shape"]
        dtype = np.dtype(descr)
    except Exception as exc:  # noqa: BLE001 - anything unparsable is corruption
        raise CorruptionError(f"{path}: unreadable .npy header ({exc})") from exc
    if not isinstance(shape, tuple) or any(type(s) is not int or s < 0 for s in shape):
        raise CorruptionError(f"{path}: .npy header shape {shape!r} is not a tuple of non-negative integers")
    if fortran and len(shape) > 1:
        raise CorruptionError(f"{path}: Fortran-ordered arrays are not supported")
    return NpyHeader(dtype, shape, start + hlen)


def _header_end(raw: bytes) -> int:
    """Where the header whose first bytes are ``raw`` ends (0 where they do not say)."""
    if len(raw) < 12 or raw[:6] != _MAGIC:
        return 0
    if raw[6] == 1:
        return 10 + int(struct.unpack("<H", raw[8:10])[0])
    return 12 + int(struct.unpack("<I", raw[8:12])[0]) if raw[6] in (2, 3) else 0


def read_header(path: str | os.PathLike[str]) -> NpyHeader:
    """Read and parse the header of the ``.npy`` file at ``path``.

    Reads the first page only: the descriptor is advised random access first, so the kernel does not
    read ahead into the data (up to ``read_ahead_kb`` per file, megabytes on some machines, on the
    first touch of every shard file of a cold store)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            raw = os.pread(fd, 4096, 0)
            need = _header_end(raw)
            if len(raw) == 4096 < need <= _MAX_HEADER:  # (a valid header longer than a page: read all of it)
                raw = os.pread(fd, need, 0)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise CorruptionError(f"{path}: file is missing") from None
    except OSError as exc:
        raise open_files_exhausted(path, exc) or CorruptionError(f"{path}: cannot read ({exc})") from exc
    return parse_header(raw, path)
