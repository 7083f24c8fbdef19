"""Reading stores: :func:`open_store` (``seqstore.open``) and the public :class:`Store`.

Opening reads the manifest only (and maps the shard table of a version-3 store): O(1) in the number
of shards. A shard's files are mapped the first time one of its records is touched, after cheap
checks (file size, ``.npy`` header, the first and last offsets) against the manifest; every failure
is a :class:`~seqstore.CorruptionError` naming the file. Where the bytes live (a local directory,
object storage through the node cache) is the store's :class:`~seqstore.io.source.ByteSource`,
chosen once at open; the Store reads through it without asking which kind it is.

The Store is put together from the parts in :mod:`seqstore.store.read` (one idea per module:
shards, read-ahead, records, batches, ids, matrices, ragged fields); this module holds what ties
them together: opening, the state of one manifest, refresh and pickling.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import OrderedDict
from typing import Any

from ..errors import SeqstoreError
from ..format.manifest import Manifest
from ..io.source import READAHEAD_MODES, ByteSource
from ..io.sources import open_source
from ..schema import BFLOAT16, Schema
from .read.batches import Batches
from .read.lookup import IdLookup
from .read.matrix import Matrices
from .read.ragged import Lengths, RaggedFields
from .read.shards import Shard, mapped_shard_limit

__all__ = ["Store", "open_store", "Lengths"]

_BF16_MODES = ("bits", "float32", "ml_dtypes")


class Store(Batches, IdLookup, Matrices, RaggedFields):
    """A read-only view of the shards a manifest lists. See :func:`open_store`.

    ``path`` may also be a :class:`~seqstore.io.source.ByteSource` (the store's bytes from elsewhere,
    e.g. in memory); the remote options are then not taken."""

    def __init__(
        self,
        path: str | os.PathLike[str] | ByteSource,
        *,
        bfloat16: str = "bits",
        readahead: str = "auto",
        max_mapped_shards: int | None = None,
        storage_options: dict[str, Any] | None = None,
        filesystem: Any = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | str | None = None,
    ) -> None:
        if bfloat16 not in _BF16_MODES:
            raise ValueError(f"bfloat16 must be one of {_BF16_MODES}, got {bfloat16!r}")
        if readahead not in READAHEAD_MODES:
            raise ValueError(f"readahead must be one of {READAHEAD_MODES}, got {readahead!r}")
        if max_mapped_shards is not None and (isinstance(max_mapped_shards, bool) or max_mapped_shards < 1):
            raise ValueError(f"max_mapped_shards must be a positive integer, got {max_mapped_shards!r}")
        if isinstance(path, ByteSource):
            if storage_options or filesystem is not None or cache_dir is not None or cache_bytes is not None:
                raise ValueError("a Store opened on a ByteSource takes no storage_options, filesystem or cache")
            self._source = path
        else:
            self._source = open_source(path, storage_options, filesystem, cache_dir, cache_bytes)
        manifest = self._source.load()
        self.root = self._source.root  # the manifest's directory (a remote store: its local mirror)
        # how reads are planned on this source (see ReadPolicy), as plain attributes: read on every batch
        policy = self._source.policy(readahead)
        self._ahead, self._probe, self._lazy = policy.ahead, policy.probe, policy.lazy
        self._setup, self._depth, self._staged = policy.setup, policy.depth, policy.staged
        self._deepest, self._together, self._stream = policy.deepest, policy.together, policy.stream
        self._bf16 = bfloat16
        self._readahead = readahead
        self._max_mapped_opt = max_mapped_shards
        # mapped shards, least recently used first; at most self._max_mapped of them (see _shard)
        self._shards: OrderedDict[int, Shard] = OrderedDict()
        self._lru_lock = threading.Lock()
        self._load(manifest)

    def _load(self, manifest: Manifest) -> None:
        old_table: Any = getattr(self, "_table", None)
        self._manifest = manifest
        self.schema: Schema = manifest.schema
        # the shards as numpy columns: the mapped shard table of a version-3 store (nothing is built per
        # shard, so open is O(1)); for version 1/2 a table built from the manifest's shard list
        self._table = manifest.shard_table()
        self._starts = self._table.starts  # (num_shards,) first record of each shard: a view, no total at the end
        self._start_index = self._table.start_index()  # the same as Python ints, for bisect
        self._n = self._table.total
        # a mapped shard stays only if the new manifest lists the same shard at its position (an overwrite
        # replaces the shards: same positions, other shards), with the same records
        for k in list(self._shards):
            if k >= len(self._table) or not self._same_shard(k, self._shards[k], old_table):
                del self._shards[k]
        self._last: tuple[int, Any] = (-1, None)  # (shard number, Shard) of the last _shard call
        self._max_mapped = self._max_mapped_opt or mapped_shard_limit(self.schema)
        self._runs = {}
        self._probes = None
        self._bf16_fields = [n for n, f in self.schema.items() if f.dtype == BFLOAT16]
        self._id_last = manifest.id_lookup == "last"
        self._nest_paths = None

    @property
    def metadata(self) -> dict[str, Any]:
        """User metadata given at :func:`~seqstore.create`."""
        return dict(self._manifest.metadata)

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    @property
    def source(self) -> ByteSource:
        """Where the store's bytes come from (a :class:`~seqstore.io.source.ByteSource`)."""
        return self._source

    def refresh(self) -> Store:
        """Re-read the manifest to see shards committed since open. Mapped shards are kept."""
        manifest = self._source.load()
        self.root = self._source.root
        self._load(manifest)
        return self

    @property
    def is_remote(self) -> bool:
        """Whether the store is read from object storage (through the node cache)."""
        return self._source.is_remote

    def __repr__(self) -> str:
        return f"seqstore.Store({self.url!r}, records={self._n}, shards={self.num_shards})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as (path, options, shard count, record count): a worker process reopens the store,
        maps its own files and sees the same records as this object, even if shards were committed
        since (shards are append-only; :meth:`refresh` in the worker moves on to the newest)."""
        path, options = self._source.reopen()
        options = {"readahead": self._readahead, "max_mapped_shards": self._max_mapped_opt, **options}
        return (_unpickle_store, (path, self._bf16, self.num_shards, self._n, options))

    def _pin(self, num_shards: int, records: int) -> None:
        """Restrict this view to the first ``num_shards`` shards (what a pickled Store saw)."""
        m = self._manifest
        if m.num_shards == num_shards:
            if self._n != records:
                raise SeqstoreError(f"{self.url}: the store was replaced since this Store was pickled")
            return
        table = self._table.prefix(num_shards) if m.num_shards > num_shards else None
        if table is None or table.total != records:
            raise SeqstoreError(
                f"{self.url}: the store was replaced since this Store was pickled (it had {records} records in "
                f"{num_shards} shards, it now has {m.num_records} in {m.num_shards})"
            )
        runs = [r for r in m.index_runs if r.end_shard <= num_shards]  # others fall back to shard indexes
        state = m.table
        if state is not None:  # version 3: the first rows of the shard table
            state = dataclasses.replace(state, rows=num_shards, records=records, crc32=table.crc32())
        self._load(dataclasses.replace(m, shards=m.shards[:num_shards], index_runs=runs, table=state))


def _unpickle_store(
    path: Any,
    bfloat16: str,
    num_shards: int | None = None,
    records: int | None = None,
    options: dict[str, Any] | None = None,
) -> Store:
    store = Store(path, bfloat16=bfloat16, **(options or {}))
    if num_shards is not None and records is not None:
        store._pin(num_shards, records)
    return store


def open_store(
    path: str | os.PathLike[str],
    bfloat16: str = "bits",
    *,
    readahead: str = "auto",
    max_mapped_shards: int | None = None,
    storage_options: dict[str, Any] | None = None,
    filesystem: Any = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_bytes: int | str | None = None,
) -> Store:
    """Open the store at ``path`` (a local path, or a URL: ``s3://``, ``gs://``, ``az://``/``abfs://``,
    ``https://``, ``file://``, or any fsspec URL) for reading. Reads the manifest only (and maps the
    shard table of a version-3 store): O(1) in the number of shards (O(fields x shards) for version 1/2).

    ``bfloat16``: how bfloat16 fields are returned: ``"bits"`` (uint16 views, default, zero-copy),
    ``"float32"`` (converted copies) or ``"ml_dtypes"`` (zero-copy ``ml_dtypes.bfloat16`` views).

    ``readahead``: how batch reads and scans meet data that is not in memory. ``"auto"`` (default): a
    batch samples whether its pages are in memory (``mincore``) and, if not, asks the kernel for exactly
    its pages, all at once, before gathering; scans ask for the next stretch ahead. ``"always"``: ask
    without sampling. ``"never"``: plain page faults (each reads one page, one at a time). Mappings are
    always advised random access, so a fault never reads around the page it needs.

    ``max_mapped_shards``: how many shards stay mapped at once (least recently used are dropped;
    default from ``vm.max_map_count``, or from the open-files limit where a mapping holds a descriptor).
    A mapping holds no file descriptor on Linux, so the open-files limit does not bound the shard count.

    Remote stores (docs/remote.md): ``storage_options`` configures the client (obstore's keys for S3,
    GCS and Azure, e.g. ``endpoint``, ``region``, ``access_key_id``; credentials otherwise come from the
    environment the way the cloud SDKs find them) and seqstore's requests (``max_requests``,
    ``coalesce_gap``, ``timeout``, ``retry_timeout``, ``max_retries``); ``filesystem``: an fsspec filesystem to read
    through instead; ``cache_dir`` / ``cache_bytes``: the node-local cache every process on the node
    shares (default ``$SEQSTORE_CACHE_DIR`` or ``~/.cache/seqstore``, and ``$SEQSTORE_CACHE_BYTES`` or
    16 GiB).
    """
    return Store(
        path, bfloat16=bfloat16, readahead=readahead, max_mapped_shards=max_mapped_shards,
        storage_options=storage_options, filesystem=filesystem, cache_dir=cache_dir, cache_bytes=cache_bytes,
    )
