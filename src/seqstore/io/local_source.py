"""A store in a local directory as a byte source: its files mapped with no descriptor held, read
ahead with ``madvise(MADV_WILLNEED)`` of exactly the pages an access will touch, probed with
``mincore``.

:func:`map_npy` is also what ``verify`` uses to map a file it checks.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptionError, open_files_exhausted
from ..format.manifest import FileInfo, Manifest
from ..format.npy import NpyHeader, read_header
from .advice import request_bytes, willneed, willneed_span
from .mapping import MADV_RANDOM, MADV_SEQUENTIAL, map_file
from .source import ByteSource, ReadPolicy

__all__ = ["LocalSource", "map_npy", "local_path"]


def local_path(path: str | os.PathLike[str]) -> Path:
    """A local store's directory, absolute (a later ``os.chdir`` does not move it), from its path or a
    ``file://`` URL."""
    if isinstance(path, str) and path.startswith("file://"):
        path = path[len("file://") :]
    return Path(path).absolute()


def map_npy(
    path: Path, info: FileInfo | None, dtype: np.dtype[Any], shape: tuple[int, ...], *, sequential: bool = False
) -> np.ndarray[Any, Any]:
    """Memory-map a ``.npy`` file read-only after checking it against what the manifest promises.

    Advised random access (a cold fault reads one page), or sequential access with ``sequential=True``
    for callers that read the whole file in order (``verify``)."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise CorruptionError(f"{path}: file is missing") from None
    except OSError as exc:
        raise CorruptionError(f"{path}: cannot stat ({exc})") from exc
    if info is not None and size != info.bytes:
        raise CorruptionError(f"{path}: file has {size} bytes, manifest says {info.bytes} (truncated or replaced?)")

    def mapped() -> np.ndarray[Any, Any]:
        try:
            return map_file(path, size, advice=MADV_SEQUENTIAL if sequential else MADV_RANDOM)  # no descriptor held
        except OSError as exc:
            limit = open_files_exhausted(path, exc)
            if limit is not None:
                raise limit from exc
            if exc.errno == errno.ENOMEM:
                raise OSError(exc.errno, f"cannot map {path} ({exc.strerror}): too many mappings in this process "
                              "(vm.max_map_count) or no address space left; open the store with a smaller "
                              "max_mapped_shards") from exc
            raise CorruptionError(f"{path}: cannot map ({exc})") from exc

    return npy_array(path, size, read_header(path), dtype, shape, mapped)


def npy_array(
    name: str | os.PathLike[str], size: int, header: NpyHeader, dtype: np.dtype[Any], shape: tuple[int, ...],
    mapped: Callable[[], np.ndarray[Any, Any]],
) -> np.ndarray[Any, Any]:
    """The array of the ``.npy`` file ``name`` of ``size`` bytes with ``header``, after checking the header
    against ``dtype`` and ``shape`` (a :class:`CorruptionError` names the file); ``mapped()``: the file's
    bytes, mapped (not called for an empty array)."""
    if header.dtype != dtype:
        raise CorruptionError(f"{name}: header dtype {header.dtype.str}, expected {dtype.str}")
    if header.shape != shape:
        raise CorruptionError(f"{name}: header shape {header.shape}, expected {shape}")
    if header.data_offset + header.data_bytes != size:
        raise CorruptionError(f"{name}: {size} bytes but header says {header.data_offset + header.data_bytes}")
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        empty = np.empty(shape, dtype=dtype)
        empty.flags.writeable = False
        return empty
    return np.frombuffer(mapped(), dtype=dtype, count=count, offset=header.data_offset).reshape(shape)


class LocalSource(ByteSource):
    """The store in directory ``path`` (a path or a ``file://`` URL). Reads through the page cache:
    a page fault reads a missing page, so nothing needs to wait for bytes before reading them;
    read-ahead asks the kernel for exact page runs, after a ``mincore`` sample in ``"auto"`` mode."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = local_path(path)

    @property
    def url(self) -> str:
        return str(self.root)

    def load(self) -> Manifest:
        # a version-3 shard table is mapped through seqstore.io (no descriptor held)
        return Manifest.load(self.root, map_file=map_file)

    map_npy = staticmethod(map_npy)
    request_bytes = staticmethod(request_bytes)

    def policy(self, readahead: str) -> ReadPolicy:
        # "never": plain page faults; "always": ask without sampling first
        return ReadPolicy(ahead=readahead != "never", probe=readahead == "auto")

    def reopen(self) -> tuple[Any, dict[str, Any]]:
        return str(self.root), {}

    def request(self, starts: Any, ends: Any, *, most: int) -> None:
        willneed(starts, ends, most=most)

    def request_span(self, start: int, stop: int, *, most: int) -> None:
        willneed_span(start, stop, most=most)
