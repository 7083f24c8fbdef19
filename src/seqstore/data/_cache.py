"""On-disk caches of derived O(N) arrays (id-join row maps, kept rows of a length filter, lengths).

Everything a dataset derives in O(N) is computed once, written as a standard ``.npy`` file and
memory-mapped afterwards, so every process (ranks x DataLoader workers) shares it through the page
cache. This module owns where those files live, how they are named (a content fingerprint, so a
changed store never reuses a stale file) and how they are written (temporary file + fsync + atomic
rename: concurrent processes computing the same file race harmlessly, the last rename wins with
identical content). A process killed part way leaves its temporary (as large as the file); the next
process to write or find that file removes the temporaries no live process holds
(:func:`~seqstore.io.tempfiles.remove_stale`).

Default location: a sibling directory ``<store>.cache/`` next to a store (``corpus.seqstore`` ->
``corpus.seqstore.cache/``), never inside the store itself, so the store's committed layout stays
exactly what its manifest lists. Any dataset takes ``cache_dir=`` to put it elsewhere (read-only
data directories).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import SeqstoreError
from ..io.mapping import allocate
from ..io.nodecache import charge, temporary, used
from ..io.tempfiles import remove_stale

__all__ = [
    "CacheError", "default_cache_dir", "fingerprint", "store_fingerprint", "cached_array", "write_npy", "load_npy",
]

_VERSION = "seqstore.data.cache/v1"


class CacheError(SeqstoreError):
    """A cache directory cannot be created or written."""


def default_cache_dir(store: Any) -> Path:
    """``<store>.cache`` next to a local store's directory (``store``: a Store or its path). For a
    remote store: ``derived/<store>/`` in the node cache, whose budget then counts what is written."""
    source = getattr(store, "source", None)
    derived: Path | None = source.derived_dir() if source is not None else None
    if derived is not None:  # the source decides (a remote store: in the node cache, within its budget)
        return derived
    root = Path(getattr(store, "root", store))
    return root.with_name(root.name + ".cache")


def fingerprint(*parts: Any) -> str:
    """A 16-hex-digit blake2b digest of JSON-encodable ``parts`` (plus the cache format version)."""
    text = json.dumps([_VERSION, *parts], sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def store_fingerprint(store: Any, files: tuple[str, ...] = ()) -> list[Any]:
    """What identifies a store's content for a cache: every shard's name, record count and the CRC-32
    of the named ``files`` (e.g. ``"_ids.npy"``) from the manifest. O(shards). For a version-3 store:
    the number of committed shard-table rows and the CRC-32 of their bytes, which covers every shard's
    number, record count and descriptor (so the CRC of each of its files): O(1) in Python objects, no
    descriptor read (a change to any file of a shard, not only ``files``, gives a new fingerprint)."""
    m = store.manifest
    if m.table is not None:
        return ["table", m.table.rows, m.table.records, m.table.crc32]
    return [[s.name, s.records, [s.files[f].crc32 if f in s.files else None for f in files]] for s in m.shards]


def write_npy(path: Path, chunks: Iterator[npt.NDArray[Any]], length: int, dtype: npt.DTypeLike) -> None:
    """Write ``length`` values of ``dtype`` from ``chunks`` to ``.npy`` file ``path`` atomically.

    Memory O(largest chunk). Raises CacheError naming the directory when it cannot be written. The
    temporaries of ``path`` left by processes killed while writing it are removed first.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path)
        fd, tmp = temporary(path)  # (held until renamed: an eviction deletes only a dead process's)
    except OSError as exc:
        raise CacheError(
            f"cannot write cache file {path} ({exc}); pass cache_dir= to put the cache somewhere writable"
        ) from exc
    try:
        charge(path, length * np.dtype(dtype).itemsize + 4096)  # counted where a node cache's budget covers it
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.dtype(dtype), shape=(length,))
        try:  # its disk space now: a write through the mapping into a hole of a full disk is a SIGBUS
            allocate(fd, 0, os.fstat(fd).st_size)
        except OSError as exc:
            raise CacheError(f"cannot write cache file {path} ({exc}); free space there or pass cache_dir= to put "
                             "the cache elsewhere") from exc
        pos = 0
        for chunk in chunks:
            out[pos : pos + len(chunk)] = chunk
            pos += len(chunk)
        if pos != length:
            raise RuntimeError(f"cache file {path}: got {pos} values, expected {length}")
        out.flush()
        del out
        os.fsync(fd)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)


def load_npy(path: Path) -> np.ndarray[Any, Any]:
    """``np.load(path, mmap_mode="r")``, also for zero-length arrays (which cannot be mapped)."""
    try:
        arr: np.ndarray[Any, Any] = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError:
        arr = np.load(path, allow_pickle=False)
        if arr.size:
            raise
    return arr


def cached_array(path: Path, compute: Callable[[Path], None], *, length: int | None = None) -> npt.NDArray[Any]:
    """Memory-map ``.npy`` ``path``, first calling ``compute(path)`` to write it if it does not exist.

    ``length``, when given, is checked against the file (a damaged or foreign file is recomputed). The
    temporaries of processes killed while writing it are removed, also where another process wrote it since.
    """
    remove_stale(path)
    if path.exists():
        try:
            arr = load_npy(path)
            if arr.ndim == 1 and (length is None or arr.shape[0] == length):
                used(path)  # (in a node cache: recently used, not the first to evict)
                return arr
        except (OSError, ValueError):
            pass
    compute(path)
    return load_npy(path)
