"""WebDataset tar shards as samples: the reading half of :mod:`seqstore.interop.webdataset`.

:func:`shard_list` expands the sources (files, directories, ``{000..009}`` brace ranges, URLs);
:func:`samples` yields each shard's samples ``(key, {ext: (member name, bytes)})`` in tar order, members
grouped by key as the webdataset module docs say. An uncompressed local shard is read from a memory map
by parsing its 512-byte headers (ustar, GNU long names, pax; checksums checked); a compressed shard or a
URL (seqstore's object-store client, ranged blocks pinned to the ETag) as a stream (gzip, bzip2 or xz
decompressed) with the same header parsing, so that a shard cut short or damaged is an error, never a
shorter shard. A :class:`ByteCounter` tells how far into the shard the reading is (progress).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import mmap
import os
import re
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from ..io.objects import client_for, is_remote
from ._common import SourceFormatError

__all__ = ["expand_shards", "shard_list", "shard_size", "samples", "ByteCounter", "KEY", "META", "URL_BLOCK"]

#: A member name: (key, extension).
KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
#: A name of WebDataset's metadata members (``__key__``...), skipped.
META = re.compile(r"__[^/]*__($|/)")
_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
#: Bytes fetched per request when a shard is read from a URL.
URL_BLOCK = 16 << 20


def _expanded(spec: str) -> Iterator[str]:
    """The names of :func:`expand_shards`, one at a time."""
    m = _RANGE.search(spec)
    if m is None:
        yield spec
        return
    a, b = m.group(1), m.group(2)
    width = len(a) if a.startswith("0") or len(a) == len(b) else 0
    head, tail = spec[: m.start()], spec[m.end() :]
    for i in range(int(a), int(b) + 1):
        yield from _expanded(head + str(i).zfill(width) + tail)


def expand_shards(spec: str) -> list[str]:
    """``"data-{000000..000009}.tar"`` -> the ten names (zero padding kept); other names as they are."""
    return list(_expanded(spec))


def shard_list(sources: Sequence[str | os.PathLike[str]], options: Mapping[str, Any] | None = None
               ) -> list[tuple[str, int]]:
    """The shards behind ``sources`` with their sizes in bytes: brace ranges expanded, a directory's
    ``.tar`` files by name. The names of a range are checked as they are made (a local file by its
    ``stat``, a URL by a HEAD with the client ``options``), so a range mistyped too wide fails at its
    first missing shard instead of listing every name first."""
    out: list[tuple[str, int]] = []
    for s in sources:
        s = os.fspath(s)
        named = False
        for p in _expanded(s):
            named = True
            if is_remote(p):
                out.append((p, shard_size(p, options)))
            elif os.path.isdir(p):
                found = sorted(str(q) for q in Path(p).iterdir() if q.name.endswith((".tar", ".tar.gz", ".tgz")))
                if not found:
                    raise SourceFormatError(p, None, "directory holds no .tar shards")
                out.extend((q, os.path.getsize(q)) for q in found)
            elif not os.path.isfile(p):
                raise FileNotFoundError(f"{p}: no such tar shard")
            else:
                out.append((p, os.path.getsize(p)))
        if not named:
            raise SourceFormatError(s, None, "names no shards (a brace range {A..B} needs A <= B)")
    return out


class _RangeReader(io.RawIOBase):
    """A URL read front to back in blocks of URL_BLOCK bytes (each one ranged GET, pinned to the object's
    ETag), as a file object for the stream reader."""

    def __init__(self, url: str, options: Mapping[str, Any] | None) -> None:
        base, _, self.key = url.rpartition("/")
        self.client = client_for(base, options)
        meta = self.client.head(self.key)
        self.size, self.etag = int(meta.size), meta.etag or None
        self.pos = 0
        self.buf = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if not len(self.buf):
            if self.pos >= self.size:
                return 0
            end = min(self.size, self.pos + URL_BLOCK)
            (data, _), = self.client.get_ranges([(self.key, self.pos, end, self.etag)])
            self.buf = memoryview(data).cast("B")
            self.pos = end
        n = min(len(b), len(self.buf))
        b[:n] = self.buf[:n]
        self.buf = self.buf[n:]
        return n


def shard_size(path: str, options: Mapping[str, Any] | None) -> int:
    """Bytes of the shard file (a HEAD for a URL)."""
    if is_remote(path):
        base, _, key = path.rpartition("/")
        return int(client_for(base, options).head(key).size)
    return os.path.getsize(path)


class ByteCounter:
    """Bytes of a shard read so far (its progress)."""

    count = 0


class _Counting(io.RawIOBase):
    """Counts the bytes read through it into ``counter``."""

    def __init__(self, raw: BinaryIO, counter: ByteCounter) -> None:
        self.raw, self.counter = raw, counter

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = int(self.raw.readinto(b) or 0)  # type: ignore[attr-defined]
        self.counter.count += n
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


_ZERO = bytes(512)
_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"\x28\xb5\x2f\xfd")  # gzip, bzip2, xz, zstd


def _octal(field: bytes) -> int:
    if field[:1] in (b"\x80", b"\xff"):  # GNU base-256 (sizes of 8 GiB and more)
        return int.from_bytes(field[1:], "big", signed=field[:1] == b"\xff")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _pax(data: bytes) -> dict[str, str]:
    """Records ``LEN KEY=VALUE\\n`` of a pax extended header."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        sp = data.index(b" ", pos)
        n = int(data[pos:sp])
        if n <= sp - pos:
            raise ValueError(f"a pax record of length {n} at byte {pos} of its header")
        key, _, value = data[sp + 1 : pos + n - 1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += n
    return out


def _header(path: str, hdr: bytes, pos: int, pax: Mapping[str, str], long_name: str | None) -> tuple[str, bytes, int]:
    """(name, type flag, size) of the 512-byte member header ``hdr`` at byte ``pos`` of the tar: the name
    from a preceding GNU long name or pax ``path`` when there is one, the size from a pax ``size``;
    SourceFormatError for a bad checksum (neither the unsigned nor the signed sum of its bytes)."""
    want = _octal(hdr[148:156])
    unsigned = sum(hdr[:148]) + 256 + sum(hdr[156:])
    # the bytes summed as signed chars (some old tar writers; Python's tarfile accepts either sum)
    if want != unsigned and want != unsigned - 256 * sum(b >= 128 for b in hdr[:148] + hdr[156:]):
        raise SourceFormatError(path, None, f"cannot read as a tar shard: bad header checksum at byte {pos}")
    n = int(pax["size"]) if "size" in pax else _octal(hdr[124:136])
    if n < 0:
        raise SourceFormatError(path, None, f"cannot read as a tar shard: member size {n} in the header at byte {pos}")
    if long_name is not None:
        name = long_name
    elif "path" in pax:
        name = pax["path"]
    else:
        name = hdr[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if hdr[257:262] == b"ustar":
            prefix = hdr[345:500].split(b"\0", 1)[0]
            if prefix:
                name = prefix.decode("utf-8", "surrogateescape") + "/" + name
    return name, hdr[156:157], n


#: Type flags of the members that are files (regular, old regular, contiguous).
_REGULAR = (b"0", b"\0", b"7")


def _members(path: str, f: Any, read: Callable[[int], bytes], ends: tuple[str, str], of: str,
             counter: ByteCounter | None) -> Iterator[tuple[str, bytes]]:
    """Regular members ``(name, bytes)`` of a tar read front to back from ``f`` (``read(n)``: a member's
    bytes) by parsing the 512-byte headers (ustar, GNU long names, pax ``path``/``size``), checksums
    checked; ``counter`` (if any) is set to the tar's byte after each member. A header or member cut
    short by the end, or a damaged header, is an error naming the shard (not the end of the shard);
    ``ends`` (of a member, of a header) and ``of`` say which end."""
    pos = 0
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        hdr = f.read(512)
        if len(hdr) < 512 or hdr == _ZERO:  # the end: of the tar, or an end-of-archive block
            if hdr.count(0) != len(hdr):
                raise SourceFormatError(path, None, f"cannot read as a tar shard: truncated (a header at byte "
                                        f"{pos}{of} is cut short by {ends[1]})")
            return
        name, kind, n = _header(path, hdr, pos, pax, long_name)
        data = read(n)
        pad = -n % 512
        if len(data) < n or len(f.read(pad)) < pad:
            raise SourceFormatError(path, None, f"cannot read as a tar shard: truncated (a member of {n} bytes "
                                    f"at byte {pos + 512}{of} runs past {ends[0]})")
        pos += 512 + n + pad
        if kind == b"L":
            long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif kind == b"x":
            pax = _pax(data)
        elif kind != b"g":
            long_name, pax = None, {}
            if counter is not None:
                counter.count = pos
            if kind in _REGULAR:
                yield name, data


def _local_members(path: str, counter: ByteCounter) -> Iterator[tuple[str, bytes]]:
    """Regular members of an uncompressed local tar file (:func:`_members`), read from a memory map."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    with mm:
        yield from _members(path, mm, mm.read, (f"the end, {size}", f"the end of the file, {size}"), "", counter)
    counter.count = size


def _decompressed(fh: Any, path: str) -> BinaryIO:
    """The tar bytes of a shard stream: gzip, bzip2 and xz decompressed (their readers check the stream's
    end and checksum, so a cut or damaged file is an error), an uncompressed stream as it is."""
    head = fh.peek(6)[:6]
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
    if head.startswith(b"BZh"):
        return bz2.BZ2File(fh)  # type: ignore[return-value]
    if head.startswith(b"\xfd7zXZ"):
        return lzma.LZMAFile(fh)  # type: ignore[return-value]
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        raise SourceFormatError(path, None, "cannot read as a tar shard: zstd-compressed (gzip, bzip2 and xz are read)")
    return fh  # type: ignore[no-any-return]


#: Bytes asked of a stream per read of a member's data.
_READ_BLOCK = 16 << 20


def _read_upto(f: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes of ``f`` (fewer at its end), read in blocks of :data:`_READ_BLOCK`: one read of
    ``n`` bytes allocates them all first, so a header declaring terabytes would fail with a MemoryError
    instead of reaching the end of the stream."""
    if n <= _READ_BLOCK:
        return f.read(n)
    parts: list[bytes] = []
    while n > 0 and (part := f.read(min(n, _READ_BLOCK))):
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def _stream_members(path: str, options: Mapping[str, Any] | None, counter: ByteCounter) -> Iterator[tuple[str, bytes]]:
    """Regular members of a tar stream (a compressed local file, or a URL), read front to back
    (:func:`_members`)."""
    raw: BinaryIO = _RangeReader(path, options) if is_remote(path) else open(path, "rb")  # type: ignore[assignment]
    fh = io.BufferedReader(_Counting(raw, counter), 1 << 20)
    try:
        f = _decompressed(fh, path)
        yield from _members(path, f, lambda n: _read_upto(f, n), ("the end of the stream",) * 2, " of the tar", None)
        while f is not fh and f.read(1 << 20):  # to the compressed stream's end: its checksum is checked
            pass
    finally:
        fh.close()


def samples(path: str, options: Mapping[str, Any] | None, counter: ByteCounter | None = None
             ) -> Iterator[tuple[str, dict[str, tuple[str, bytes]]]]:
    """The samples of one shard: ``(key, {ext: (member name, bytes)})``, in tar order."""
    counter = counter if counter is not None else ByteCounter()
    try:
        plain = False
        if not is_remote(path):
            with open(path, "rb") as f:
                plain = not f.read(6).startswith(_COMPRESSED)
        members = _local_members(path, counter) if plain else _stream_members(path, options, counter)
        key: str | None = None
        cur: dict[str, tuple[str, bytes]] = {}
        for name, data in members:
            if ("/" not in name and name.startswith("__") and name.endswith("__")) or META.match(name):
                continue
            m = KEY.match(name)
            if m is None:
                continue
            k, ext = m.group(1), m.group(2).lower()
            if k != key:
                if key is not None:
                    yield key, cur
                key, cur = k, {}
            if ext in cur:
                raise SourceFormatError(path, name, f"key {k!r} has two members with extension .{ext}")
            cur[ext] = (name, data)
        if key is not None:
            yield key, cur
    except (FileNotFoundError, SourceFormatError):
        raise
    except (EOFError, OSError, ValueError, zlib.error, lzma.LZMAError) as exc:  # damaged compressed data too
        raise SourceFormatError(path, None, f"cannot read as a tar shard: {exc}") from exc
