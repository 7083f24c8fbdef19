"""Reading stores: :func:`open_store` (``seqstore.open``) and the public :class:`Store`.

Where the bytes live is the store's :class:`~seqstore.io.source.ByteSource`, chosen once at open; the
Store reads through it without asking which kind it is. The Store owns parts, each with its own state
(:mod:`seqstore.store.read`; docs/architecture.md); this module holds the public methods (each a few
calls into the parts), opening, the state of one manifest, refresh and pickling. A shard's files are
mapped on first touch, after cheap checks against the manifest (a :class:`~seqstore.CorruptionError`
naming the file on failure).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from ..errors import SeqstoreError
from ..format.manifest import Manifest
from ..io.object_common import option_flag
from ..io.options import StoreOptions
from ..io.source import READAHEAD_MODES, ByteSource
from ..io.sources import open_source
from ..schema import PackedGroup, Schema, field_list
from .ids import checked_query
from .read.gather import BF16_MODES, Alloc, Gatherer, present_bf16
from .read.lookup import IdLookup
from .read.matrix import Matrices
from .read.ragged import Lengths, RaggedFields
from .read.readahead import ReadPlanner
from .read.runs import plan_batches
from .read.shards import ShardMap, is_index, manifest_identity
from .read.stream import FetchedBatch, Pool, plan_runs, via_of
from .read.verify import ReadVerifier, refuse_unverifiable

T = TypeVar("T")

__all__ = ["Store", "open_store", "Lengths"]

Indices = Sequence[int] | np.ndarray[Any, Any]


class Store:
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
        verify_reads: bool = False,
        storage_options: StoreOptions | Mapping[str, Any] | None = None,
        **remote: Any,
    ) -> None:
        if bfloat16 not in BF16_MODES:
            raise ValueError(f"bfloat16 must be one of {BF16_MODES}, got {bfloat16!r}")
        if readahead not in READAHEAD_MODES:
            raise ValueError(f"readahead must be one of {READAHEAD_MODES}, got {readahead!r}")
        if max_mapped_shards is not None and (not is_index(max_mapped_shards) or max_mapped_shards < 1):
            raise ValueError(f"max_mapped_shards must be a positive integer, got {max_mapped_shards!r}")
        if not isinstance(verify_reads, (bool, np.bool_)) and not (is_index(verify_reads) and verify_reads in (0, 1)):
            raise ValueError(f"verify_reads must be True or False, got {verify_reads!r}")  # ("false" was true)
        if isinstance(storage_options, Mapping) and "verify_reads" in storage_options:  # the Store's option
            storage_options = dict(storage_options)  # (option_flag: a ConfigError where it is not a flag)
            verify_reads = option_flag(storage_options.pop("verify_reads"), str(path), "verify_reads") or verify_reads
        elif isinstance(storage_options, StoreOptions):
            verify_reads = storage_options.verify_reads or verify_reads
        self._verify_reads = bool(verify_reads)
        if isinstance(path, ByteSource):
            if storage_options or any(v is not None for v in remote.values()):
                raise ValueError("a Store opened on a ByteSource takes no storage_options, filesystem or cache")
            self._source = path
        else:
            self._source = open_source(path, storage_options, **remote)
        identity = manifest_identity(self._source)  # (before the read: a commit in between is no false alarm)
        manifest = self._source.load()
        self.root = self._source.root  # the manifest's directory (a remote store: its local mirror)
        self._bf16, self._readahead = bfloat16, readahead
        policy = self._source.policy(readahead)  # how reads are planned on this source
        self._shards = ShardMap(self._source, max_mapped_shards, policy.setup, identity)
        self._planner = ReadPlanner(self._shards, policy, readahead)
        self._gatherer = Gatherer(self._planner, bfloat16)
        self._matrices = Matrices(self._planner, bfloat16)
        self._ragged = RaggedFields(self._planner, self)
        self._load(manifest)

    def _load(self, manifest: Manifest) -> None:
        self._shards.load(manifest)
        self._manifest = manifest
        self.schema: Schema = manifest.schema
        self._ids = IdLookup(self._planner, manifest.id_lookup == "last")
        verify = None
        if self._verify_reads:  # (for each manifest: a refresh may bring another schema)
            refuse_unverifiable(manifest, self.url)
            verify = ReadVerifier(self.schema, self._planner.need_rows, self._shards.max_mapped, self._source.refetch)
        self._gatherer.verify = self._ids.verify = self._ragged.verify = verify
        self._nest_paths = [(name, tuple(name.split("/"))) for name in self.schema]

    # ---------------------------------------------------------------------------------- the store

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

    @property
    def is_remote(self) -> bool:
        """Whether the store is read from object storage (through the node cache)."""
        return self._source.is_remote

    @property
    def bfloat16(self) -> str:
        """How bfloat16 fields are returned: ``"bits"`` (uint16), ``"float32"`` or ``"ml_dtypes"`` (``open``'s)."""
        return self._bf16

    @property
    def url(self) -> str:
        """Where the store is: its URL for a remote store, else its path."""
        return self._source.url

    def __len__(self) -> int:
        return self._shards.n

    @property
    def num_shards(self) -> int:
        return self._shards.num_shards

    @property
    def mapped_shards(self) -> int:
        """How many shards this Store holds mapped now (bounded by ``max_mapped_shards``)."""
        return len(self._shards.mapped)

    @property
    def groups(self) -> dict[str, PackedGroup]:
        """The store's packed groups by name (empty for a store without them)."""
        return self.schema.groups

    def refresh(self) -> Store:
        """Re-read the manifest to see shards committed since open. Mapped shards are kept."""
        identity = manifest_identity(self._source)
        manifest = self._source.load()
        self._shards.identity = identity
        self.root = self._source.root
        self._load(manifest)
        return self

    def __repr__(self) -> str:
        return f"seqstore.Store({self.url!r}, records={len(self)}, shards={self.num_shards})"

    # ------------------------------------------------------------------------------------ records

    def bfloat16_view(self, bits: Any) -> Any:
        """Present stored bfloat16 bits per the store's ``bfloat16`` mode (bits/float32/ml_dtypes)."""
        return present_bf16(bits, self._bf16)

    def __getitem__(self, i: int) -> dict[str, np.ndarray[Any, Any]]:
        """Record ``i`` as a dict of field name -> read-only zero-copy view. O(log shards)."""
        if not isinstance(i, (int, np.integer)) or i.__class__ is bool:  # (is_index, inline: the hot path)
            raise TypeError(f"store[i] takes an int; use get_batch() for many records, got {type(i).__name__} {i!r}")
        return self._gatherer.record(int(i))

    def nested(self, i: int, *, copy: bool = False) -> dict[str, Any]:
        """Record ``i`` as a nested dict (``"a/b"`` -> ``{"a": {"b": ...}}``) of zero-copy views.

        ``copy=True``: owned, writable arrays instead (valid after the store is closed), made with one
        copy per packed group (the record's row) and one per other field.
        """
        if not is_index(i):
            raise TypeError(f"nested(i) takes an int, got {type(i).__name__} {i!r}")
        flat = self._gatherer.record(int(i), copy)
        out: dict[str, Any] = {}
        for name, parts in self._nest_paths:
            node = out
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = flat[name]
        return out

    def __iter__(self) -> Iterator[dict[str, np.ndarray[Any, Any]]]:
        window, n = 4096, len(self)
        ahead = self._readahead != "never"
        if ahead and n:
            self.prefetch(np.arange(0, min(window, n), dtype=np.int64))
        for lo in range(0, n, window):
            hi = min(lo + window, n)
            if ahead and hi < n:  # the next window, while this one is read
                self.prefetch(np.arange(hi, min(hi + window, n), dtype=np.int64))
            for i in range(lo, hi):
                yield self[i]

    # ------------------------------------------------------------------------------------ batches

    def _fields(self, fields: Sequence[str] | str | None) -> list[str]:
        names = field_list(fields)
        if names is None:
            names = list(self.schema)
        for name in names:
            if name not in self.schema:
                raise KeyError(f"no field {name!r} in {self.url}; fields are {list(self.schema)}")
        return names

    def get_batch(
        self, indices: Indices, fields: Sequence[str] | str | None = None, pad: bool = False
    ) -> dict[str, Any]:
        """Gather many records at once (vectorised; one copy).

        Returns a dict: a fixed field -> array (B, *shape); a ragged field -> ``(values, lengths)``
        where ``values`` is the rows of all B records concatenated (sum(lengths), *inner) or, with
        ``pad=True``, zero-padded to (B, max(lengths), *inner); ``lengths`` is int64 (B,).

        Records not in memory are read with all their reads in flight at once (exactly their pages;
        for ragged fields the offsets first, then the values), not one page fault at a time; a batch
        found in memory is gathered straight from the mapping. :meth:`iter_batches` also starts the
        reads of the next batches while this one is consumed.
        """
        idx, groups = self._shards.batch(indices)
        names = self._fields(fields)
        self._planner.ready(groups, names)
        return self._gatherer.batch(idx, groups, names, pad)

    def prefetch(self, indices: Indices, fields: Sequence[str] | str | None = None) -> None:
        """Start reading records ``indices`` (all fields, or ``fields``) into memory and return without
        waiting for them (for ragged fields this waits for their offsets only). A later
        :meth:`get_batch` or ``store[i]`` of those records finds them arriving or arrived. A no-op for
        records in memory and with ``readahead="never"``."""
        names, idx = self._fields(fields), self._shards.norm_many(indices)  # (checked in every mode)
        if self._planner.policy.ahead and not self._planner.skipping():
            self._planner.request_values(self._planner.request(self._shards.groups(idx.reshape(-1)), names), names)

    def iter_batches(
        self, batches: Iterable[Indices], *, fields: Sequence[str] | str | None = None, pad: bool = False,
        prefetch: int | None = None, cached: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """``get_batch`` of each index array of ``batches`` (any iterable, consumed lazily: e.g.
        ``order.iter_chunks(1024)`` or :func:`seqstore.batch_indices`), with the reads of the next
        ``prefetch`` batches already in flight while a batch is consumed (default 2; for a remote store 16,
        and up to 64 while few requests are pending: batches that each need few, large requests). With
        the default on a remote store, reads are asked for in runs of 16 batches, as the union of their
        records (a block-shuffled window's blocks, as they lie; :mod:`.read.runs`). With the ``read_once``
        storage option those runs are received into memory of the reader's own and gathered from there,
        bypassing the node cache (:mod:`.read.stream`; memory: the runs fetched ahead, at most
        ``max_inflight_bytes`` and two runs). ``cached=True``: through the node cache all the same (for
        readers that share a store's blocks: each would fetch them whole).

        Yields the same dicts as :meth:`get_batch`. Memory: the index arrays of ``prefetch + 1``
        batches (and of a run of 16) plus what the page cache holds of the requested records
        (reclaimable, shared).
        """
        names = self._fields(fields)
        gather = self._gatherer.batch
        if prefetch is None and self.read_once and not cached:  # runs fetched into memory (.read.stream)
            for got in plan_runs(self._planner, batches, names, Pool(4)):
                yield gather(got.idx, got.groups, names, pad, via_of(got.parts))
            return
        for token in plan_batches(self._planner, batches, names, prefetch):
            yield gather(token.idx, token.groups, names, pad)

    @property
    def read_once(self) -> bool:
        """Whether :meth:`iter_batches` (at its default depth) receives runs of batches into memory instead
        of the node cache: the ``read_once`` storage option on a remote store, or where it is not given,
        whether the store's data exceed the node cache's budget."""
        policy = self._planner.policy
        return bool(policy.stream and policy.ahead)

    fetches_runs = read_once  # (what a loader asks: whether fetch_runs may be called)

    def fetch_runs(
        self, batches: Iterable[Indices], pool: Pool, *, fields: Sequence[str] | str | None = None
    ) -> Iterator[FetchedBatch]:
        """A read-once store: ``(idx, parts)`` of each batch of ``batches`` once its bytes are in memory,
        fetched as :meth:`iter_batches` fetches them, into buffers from ``pool`` (a
        :class:`~.read.stream.Pool`). Each part (:class:`~seqstore.io.remote_stream.Part`) is held for the
        caller: call its ``release()`` once the batch was gathered (:meth:`gather_fetched`, in this
        process or one that received the parts' buffers and their ``export()``)."""
        if not self.read_once:
            raise ValueError(f"{self.url}: fetch_runs needs a store that reads its epochs once (a remote store "
                             "with read_once=true, or one bigger than its node cache)")
        for got in plan_runs(self._planner, batches, self._fields(fields), pool, hold=True):
            yield FetchedBatch(got.idx, got.parts)

    def gather_fetched(
        self, idx: np.ndarray[Any, Any], via: Any, *, fields: Sequence[str] | str | None = None, pad: bool = False,
        alloc: Alloc | None = None,
    ) -> dict[str, Any]:
        """``get_batch(idx, pad=pad)`` from bytes :meth:`fetch_runs` fetched: ``via`` is the batch's parts
        (a list: this process's parts, or ``(part.export(), address of its buffer here)`` of parts another
        process fetched; the source finds them once the batch's shards are mapped), or their segment
        table (:func:`~.read.stream.via_of`). ``alloc(n)``: where each field's values go (``n`` bytes, a
        C-contiguous ``uint8`` array; None: new arrays)."""
        idx, groups = self._shards.batch(idx)
        names = self._fields(fields)
        ragged = [n for n in names if self.schema[n].ragged]
        if ragged:
            self._planner.need_groups(groups, ragged, values=False)  # the offsets: through the node cache
        via = self._source.segments(via) if isinstance(via, list) else via() if callable(via) else via
        return self._gatherer.batch(idx, groups, names, pad, via, alloc)

    # ------------------------------------------------------- ids, matrices, ragged fields (the parts)

    def _checked(self, read: Callable[[], T]) -> T:
        """``read()`` of ids; verified, a node-cache copy failing its checksums is fetched again, read again."""
        verify = self._ids.verify
        return read() if verify is None else verify.checked(read)

    @property
    def has_ids(self) -> bool:
        return self._shards.table.has_ids

    def id(self, i: int) -> str:
        """The id of record ``i``."""
        if not is_index(i):
            raise TypeError(f"id(i) takes an int; use ids() for many records, got {type(i).__name__} {i!r}")
        return self._checked(lambda: self._ids.id(i))

    def ids(self, indices: Indices) -> tuple[np.ndarray[Any, np.dtype[np.uint8]], np.ndarray[Any, np.dtype[np.int64]]]:
        """The utf-8 ids of records ``indices`` at once, as ``(data, offsets)``: the id of
        ``indices[j]`` is ``data[offsets[j]:offsets[j + 1]]`` (``offsets``: int64, ``len(indices) + 1``
        of them, from 0; e.g. the buffers of an Arrow string column). No Python object per record: the
        bytes are gathered shard by shard, and the ids of consecutive records of one shard are a
        read-only view of the mapped file. Negative indices count from the end. KeyError when the
        records have no ids."""
        return self._checked(lambda: self._ids.ids(indices))

    def index(self, id: str) -> int:  # noqa: A002
        """Global index of the record with id ``id``.

        When an id was written more than once this is the first such record, or the last one in a
        store created with ``id_lookup="last"`` (e.g. a log written with ``on_duplicate="keep_last"``).
        """
        return self._checked(lambda: self._ids.index(id))

    def index_many(self, ids: Sequence[str], *, missing: str | int = "error") -> np.ndarray[Any, np.dtype[np.int64]]:
        """Global indexes of many ids at once (vectorised hash search, then byte comparison).

        ``missing="error"`` raises KeyError naming the first missing ids; an int fills them instead.
        Repeated ids resolve as in :meth:`index` (first record, or last with ``id_lookup="last"``).
        """
        return self._checked(lambda: self._ids.index_many(ids, missing))

    def index_encoded(self, qdata: np.ndarray[Any, Any], qoff: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Global indexes of ids given as utf-8 bytes ``qdata[qoff[i]:qoff[i+1]]`` (int64 offsets from 0),
        -1 where absent; what :meth:`index_many` and joins between stores use. Vectorised per probed
        index; memory O(queries + candidates)."""
        data, offsets = checked_query(qdata, qoff, self.url)
        return self._checked(lambda: self._ids.index_encoded(data, offsets))

    def matrix_columns(self, fields: Sequence[str] | str | None = None) -> dict[str, tuple[int, int]]:
        """Column range ``[a, b)`` of each field in :meth:`matrix` (same ``fields``): for module-wise scores."""
        return self._matrices.matrix_columns(fields)

    def matrix(self, fields: Sequence[str] | str | None = None, rows: slice | Indices | None = None, *,
               dtype: Any = None) -> np.ndarray[Any, Any]:
        """Records as one ``(R, D)`` matrix: row ``r`` is the chosen fields of a record, flattened and
        concatenated in order (:meth:`matrix_columns` gives each field's column range).

        ``fields``: fixed field names and/or packed group names (None: all fixed fields, packed
        groups first); all must share one dtype. ``rows``: None (all), a slice, or record numbers.
        ``dtype``: cast the result (bfloat16 bits are widened exactly when a float dtype is asked).

        Zero-copy (a read-only strided view of the mapped file) when the fields are consecutive
        columns of one packed group (or one unpacked field) and the rows are a slice inside one
        shard; otherwise one copy, shard by shard. Use :meth:`iter_matrix` to stream a large store.
        """
        return self._matrices.matrix(fields, rows, dtype)

    def iter_matrix(self, fields: Sequence[str] | str | None = None, *, chunk_rows: int = 1 << 16, start: int = 0,
                    stop: int | None = None) -> Iterator[tuple[int, np.ndarray[Any, Any]]]:
        """Stream records ``[start, stop)`` as ``(first_row, block)`` pairs, ``block`` an
        ``(r, D)`` matrix of at most ``chunk_rows`` rows that never spans two shards.

        Blocks are zero-copy views of the mapped files where :meth:`matrix` would be; bfloat16 is
        returned as stored bits (uint16) whatever the store's ``bfloat16`` mode. O(chunk) memory.
        """
        return self._matrices.iter_matrix(fields, chunk_rows, start, stop)

    def lengths(self, field: str | None = None) -> Lengths:
        """Lazy lengths of a ragged field (the only ragged field when ``field`` is None)."""
        return self._ragged.lengths(field)

    def iter_ragged(self, field: str | None = None, *, chunk_records: int = 1 << 16, start: int = 0,
                    stop: int | None = None) -> Iterator[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        """Stream records ``[start, stop)`` of a ragged field as ``(first_record, values, lengths)``:
        ``values`` the rows of at most ``chunk_records`` consecutive records, a read-only zero-copy
        view of the mapped file (``(sum(lengths), *inner)``, never spanning two shards), ``lengths``
        int64. The ragged counterpart of :meth:`iter_matrix`: the next block is read ahead while the
        caller works on this one. bfloat16 comes as stored bits. O(chunk) memory.
        """
        return self._ragged.iter_ragged(field, chunk_records, start, stop)

    # ------------------------------------------------------------------------------------ pickling

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as (path, options, shard count, record count, and for a version-3 store the CRC-32 of
        its shard table's rows): a worker process reopens the store, maps its own files and sees the
        same records as this object, even if shards were committed since (shards are append-only;
        :meth:`refresh` in the worker moves on to the newest)."""
        path, options = self._source.reopen()
        options = {"readahead": self._readahead, "max_mapped_shards": self._shards.max_mapped_opt, **options}
        if self._verify_reads:
            options["verify_reads"] = True
        rows_crc = None if self._manifest.table is None else self._manifest.table.crc32
        return (_unpickle_store, (path, self._bf16, self.num_shards, len(self), options, rows_crc))

    def _pin(self, num_shards: int, records: int, rows_crc: int | None = None) -> None:
        """Restrict this view to the first ``num_shards`` shards (what a pickled Store saw; ``rows_crc``:
        the CRC-32 of those rows of a version-3 shard table, which a store replaced since does not have)."""
        m = self._manifest
        if m.num_shards == num_shards:
            if len(self) != records or (rows_crc is not None and (m.table is None or m.table.crc32 != rows_crc)):
                raise SeqstoreError(f"{self.url}: the store was replaced since this Store was pickled")
            return
        table = self._shards.table.prefix(num_shards) if m.num_shards > num_shards else None
        crc = None if table is None or m.table is None else table.crc32()
        if table is None or table.total != records or (rows_crc is not None and crc != rows_crc):
            raise SeqstoreError(
                f"{self.url}: the store was replaced since this Store was pickled (it had {records} records in "
                f"{num_shards} shards, it now has {m.num_records} in {m.num_shards})"
            )
        runs = [r for r in m.index_runs if r.end_shard <= num_shards]  # others fall back to shard indexes
        state = m.table
        if state is not None and crc is not None:  # version 3: the first rows of the shard table
            state = dataclasses.replace(state, rows=num_shards, records=records, crc32=crc)
        self._load(dataclasses.replace(m, shards=m.shards[:num_shards], index_runs=runs, table=state))


def _unpickle_store(path: Any, bfloat16: str, num_shards: int | None = None, records: int | None = None,
                    options: dict[str, Any] | None = None, rows_crc: int | None = None) -> Store:
    store = Store(path, bfloat16=bfloat16, **(options or {}))
    if num_shards is not None and records is not None:
        store._pin(num_shards, records, rows_crc)
    return store


def open_store(
    path: str | os.PathLike[str],
    bfloat16: str = "bits",
    *,
    readahead: str = "auto",
    max_mapped_shards: int | None = None,
    verify_reads: bool = False,
    storage_options: StoreOptions | Mapping[str, Any] | None = None,
    **remote: Any,
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

    ``verify_reads``: check every record a read returns against the checksums its shard was committed
    with, raising :class:`~seqstore.CorruptionError` naming the file, record and field (docs/store.md,
    "Verified reads"; for a URL also the storage option ``verify_reads``). A store without them is
    refused: version 1/2 at open, a shard written before them when it is first read.

    Remote stores (docs/remote.md): ``storage_options`` (a mapping, or a
    :class:`~seqstore.io.options.StoreOptions` parsed from one) configures the client (obstore's keys for S3,
    GCS and Azure, e.g. ``endpoint``, ``region``, ``access_key_id``; credentials otherwise come from the
    environment the way the cloud SDKs find them) and seqstore's requests (``max_requests``,
    ``coalesce_gap``, ``timeout``, ``retry_timeout``, ``max_retries``); ``filesystem``: an fsspec filesystem to read
    through instead; ``cache_dir`` / ``cache_bytes``: the node-local cache every process on the node
    shares (default ``$SEQSTORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/seqstore``, else ``~/.cache/seqstore``;
    and ``$SEQSTORE_CACHE_BYTES`` or 16 GiB).
    """
    return Store(path, bfloat16=bfloat16, readahead=readahead, max_mapped_shards=max_mapped_shards,
                 verify_reads=verify_reads, storage_options=storage_options, **remote)
