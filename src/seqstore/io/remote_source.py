"""A store on object storage as a byte source: a local mirror of its root, its files mapped from the
node cache, and bytes fetched into the cache before they are read.

The mirror and the mappings are :class:`~seqstore.io.remote.RemoteRoot`'s; the requests that fill the
mappings are the store's own :class:`~seqstore.io.remote_fetch.Fetcher`'s. This module adds what a reader
plans around (its :class:`~seqstore.io.source.ReadPolicy`): mapped pages read as zeros until fetched,
answers take tens of milliseconds, and a shard's first touch costs one wave of requests. Messages name
objects by URL.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptionError, FormatError
from ..format.manifest import IDS_FILES, MANIFEST, FileInfo, Manifest
from ..format.shard_table import TABLE_HEADER_BYTES, ShardTable, row_dtype
from .mapping import map_file
from .nodecache import budget_directory
from .objects import fork_unsafe
from .options import StoreOptions
from .remote import RemoteRoot
from .remote_stream import fetch_into, segments
from .source import ByteSource, ReadPolicy

__all__ = ["RemoteSource"]

#: batches ``iter_batches`` keeps in flight by default: object storage answers after tens of milliseconds
_DEPTH = 16
#: batches it may keep in flight while few requests are pending (a block-shuffled epoch's few, large
#: requests of 16 batches are too few bytes to cover an answer's time at network speed)
_DEEPEST = 64
#: batches whose first-stage reads ``iter_batches`` asks for together (a block-shuffled window's batches:
#: their union is its blocks, fetched as they lie, not the whole chunks at a block's ends)
_TOGETHER = 16
#: "few requests pending": at most this many times ``max_requests`` (a random batch of 1024 records
#: makes about 1000 requests: never deeper; a random_block batch a few dozen)
_FEW = 2


class RemoteSource(ByteSource):
    """The store at ``url`` on object storage, opened with ``options``
    (:class:`~seqstore.io.options.StoreOptions`), read through the node cache."""

    is_remote = True

    @staticmethod
    def any_cold(starts: Any, sample: int = 16) -> bool:
        """Residency is not probed on a remote source: a fetch skips what the node cache holds by itself."""
        return True

    def __init__(self, url: str, options: StoreOptions) -> None:
        self.options = options
        self.data_bytes = 0  # the store's values and offsets (set by load)
        self.remote = RemoteRoot(url, options)
        self.fetcher = fetcher = self.remote.fetcher
        # the fetcher's own methods (no call layer added on the read path)
        self.ensure, self.ensure_array = fetcher.ensure, fetcher.ensure_array  # type: ignore[method-assign]
        self.searchsorted = fetcher.searchsorted

    @property
    def url(self) -> str:
        return self.remote.url

    def load(self) -> Manifest:
        for _ in range(8):
            self.root = self.remote.load()  # the local mirror of the manifest and the shard table
            with self.remote.cache.locked():  # (an eviction, which takes this lock, waits until it is read)
                if (self.root / MANIFEST).exists():  # else another process evicted it since: made again
                    with self._by_url():
                        manifest = Manifest.load(self.root, map_file=map_file)
                    break
        else:
            raise OSError(f"{self.url}: its copy in the node cache {self.remote.cache.root} is evicted as fast as "
                          "it is made; raise cache_bytes")
        self.data_bytes = manifest.data_bytes()
        # version 1/2 (no descriptor CRCs): shards first touched after the manifest changed are checked
        self.remote.manifest_check = None if manifest.table is not None else partial(_unreplaced, self.url, manifest)
        self.remote.run_check = partial(_runs_unreplaced, self.remote, manifest)  # (runs have no descriptor)
        return manifest

    @contextlib.contextmanager
    def _by_url(self) -> Iterator[None]:
        """Errors of the block that name files of the mirror raised again naming them by URL."""
        try:
            yield
        except (CorruptionError, FormatError) as exc:
            text = self.display(str(exc))
            if text == str(exc):
                raise
            raise type(exc)(text) from exc.__cause__

    @property
    def read_once(self) -> bool:
        """Whether epochs read once (runs received into memory, not the node cache): the ``read_once``
        option, or where it is not given, whether the store's data exceed the node cache's budget (an
        epoch would evict its own blocks before a later epoch could reuse them; read once, they cost
        no cache writes and no copies out of it)."""
        if self.options.read_once is not None:
            return self.options.read_once
        return self.data_bytes > self.remote.cache.budget

    def map_npy(
        self, path: Path, info: FileInfo | None, dtype: np.dtype[Any], shape: tuple[int, ...], *,
        sequential: bool = False,
    ) -> np.ndarray[Any, Any]:
        return self.remote.map_npy(path, info, dtype, shape, sequential=sequential)

    def policy(self, readahead: str) -> ReadPolicy:
        # "readahead" governs scans only: a batch always asks, as faults would read zeros
        return ReadPolicy(ahead=True, probe=False, lazy=True, setup=True, depth=_DEPTH, deepest=_DEEPEST,
                          staged=True, together=_TOGETHER, stream=self.read_once)

    def deeper(self) -> bool:
        return self.fetcher.pending < _FEW * self.options.max_requests

    def reopen(self) -> tuple[Any, dict[str, Any]]:
        return self.url, {"storage_options": self.options}

    def request(self, starts: Any, ends: Any, *, most: int) -> None:
        self.fetcher.fetch(starts, ends)

    def request_runs(self, starts: Any, ends: Any, *, most: int, must: int) -> tuple[Any, Any]:
        return self.fetcher.fetch_runs(starts, ends, must)

    def request_span(self, start: int, stop: int, *, most: int) -> None:
        self.fetcher.fetch(np.array([start], np.int64), np.array([stop], np.int64))

    def fetch_into(self, starts: Any, ends: Any, alloc: Any) -> Any:
        return fetch_into(self.fetcher, starts, ends, alloc)

    def segments(self, parts: list[Any]) -> tuple[Any, Any, Any]:
        return segments(self.fetcher, parts)

    @property
    def stream_budget(self) -> int:
        """Bytes a read-once ``iter_batches`` keeps fetched ahead at most: ``max_inflight_bytes``."""
        return int(self.options.max_inflight_bytes)

    def prepare_shards(self, manifest: Manifest, table: ShardTable, shards: Iterable[int]) -> None:
        """Fetch what mapping ``shards`` needs (descriptors, file heads), one wave for all."""
        files = list(manifest.data_files())  # (a shard's id files are prepared on its first id lookup)
        todo: list[tuple[str, Sequence[str], int | None]] = []
        sizes: dict[str, dict[str, int]] = {}  # (version 1/2: the manifest's; version 3: the descriptors')
        for k in shards:
            if manifest.table is not None:
                row = table.row(k)
                todo.append((row.name, files, row.desc_crc))
            else:
                info = manifest.shards[k]
                todo.append((info.name, files, None))
                sizes[info.name] = {rel: fi.bytes for rel, fi in info.files.items()}
        with self._by_url():
            self.remote.prepare_shards(todo, sizes)

    def prepare_ids(self, name: str, crc: int | None) -> None:
        with self._by_url():
            self.remote.prepare_shards([(name, IDS_FILES, crc)])

    def shard_display(self, name: str) -> str:
        return f"{self.url}/{name}"

    def display(self, text: str) -> str:
        return self.remote.display(text)

    def fetch_descriptors(self, manifest: Manifest) -> None:
        if manifest.table is not None:  # version 3: every shard's descriptor, in one wave
            table = manifest.shard_table()
            rows = [table.row(k, chain=False) for k in range(len(table))]
            self.remote.fetch_descriptors([r.name for r in rows], [r.desc_crc for r in rows])

    def materialize(self, keys: Sequence[str]) -> None:
        self.remote.materialize(keys)

    def refetch(self, keys: Sequence[str], spans: Mapping[str, tuple[Any, Any]] | None = None) -> bool:
        self.remote.refetch(keys, spans)
        return True

    def derived_dir(self) -> Path | None:
        path: Path = self.remote.cache.root / "derived" / self.remote.digest()
        budget_directory(path, self.remote.cache)  # what datasets write there counts in the cache's budget
        return path

    @property
    def fork_safe(self) -> bool:
        return not fork_unsafe()

    def __repr__(self) -> str:
        return f"RemoteSource({self.remote!r})"


def _unreplaced(url: str, manifest: Manifest, data: bytes, names: Sequence[str]) -> None:
    """Raise CorruptionError unless ``data``, the bytes of the store's manifest now, lists shards ``names``
    (of version-1/2 ``manifest``, the one read) as ``manifest`` does: at the same places, with the same
    records and files (sizes and CRCs). Called only when the manifest changed (O(shards), as the list)."""
    where = f"{url}/{MANIFEST}"
    try:
        current: Manifest | None = Manifest.parse(data, where)
    except (CorruptionError, FormatError):
        current = None
    wanted = set(names)
    for k, info in enumerate(manifest.shards):
        if info.name not in wanted:
            continue
        if current is None or current.table is not None or k >= current.num_shards or current.shards[k] != info:
            what = "it is not a valid one now" if current is None else \
                f"shard {k} is not {info.name} of {info.records} records now"
            raise CorruptionError(f"{where}: the store was replaced since this Store read its manifest ({what}); "
                                  "open the store again")


def _runs_unreplaced(remote: RemoteRoot, manifest: Manifest, data: bytes, keys: Sequence[str]) -> None:
    """Raise CorruptionError unless the merged id-index runs whose files ``keys`` are (learned after the store's
    manifest changed; ``data``: its bytes now) index the shards ``manifest``, the one read, lists: the manifest
    lists each run now as it did, over the same shards (version 1/2: the same entries of its shard list;
    version 3: the same bytes in the rows of them of the table it names). A lookup then leaves such a run out for those
    shards' own indexes, which are checked on their own (a replaced store is named there)."""
    try:
        current: Manifest | None = Manifest.parse(data, f"{remote.url}/{MANIFEST}")
    except (CorruptionError, FormatError):
        current = None
    stems = {k.removesuffix(".hash.npy").removesuffix(".rows.npy") for k in keys}
    listed = {r.name: r for r in current.index_runs} if current is not None else {}
    for run in manifest.index_runs:
        if run.name in stems and (current is None or listed.get(run.name) != run
                                  or not _same_shards(remote, manifest, current, run.first_shard, run.end_shard)):
            raise CorruptionError(f"{remote.url}/{run.name}: the store's manifest changed since this Store read it, "
                                  "and this merged id index is not the one of the shards read (replaced?): not used")


def _same_shards(remote: RemoteRoot, manifest: Manifest, current: Manifest, a: int, b: int) -> bool:
    """Whether ``current`` (the store's manifest now) lists shards ``[a, b)`` as ``manifest`` did."""
    t, now = manifest.table, current.table
    if t is None or now is None:
        return t is None and now is None and current.num_shards >= b and all(
            current.shards[k] == manifest.shards[k] for k in range(a, b))
    if now.rows < b or len(current.ragged) != len(manifest.ragged):  # (another table: a remote writer's commit)
        return False
    size = row_dtype(len(manifest.ragged)).itemsize
    start, end = TABLE_HEADER_BYTES + a * size, TABLE_HEADER_BYTES + b * size
    assert remote.mirror is not None
    try:
        fd = os.open(remote.mirror / t.file, os.O_RDONLY | os.O_CLOEXEC)
        try:
            mine = os.pread(fd, end - start, start)
        finally:
            os.close(fd)
    except OSError:
        return False
    (got, _), = remote.client.get_ranges([(now.file, start, end, None)])
    return bytes(got) == mine
