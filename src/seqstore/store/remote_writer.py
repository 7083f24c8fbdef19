"""Writing a store straight to object storage: :func:`create`, :func:`append_to` and
:func:`open_or_create` with an ``s3://``, ``gs://`` or ``az://`` URL (and so ``seqstore.Logger``).

A :class:`RemoteWriter` is a :class:`~seqstore.store.writer.Writer` whose shards are built in a local
staging directory (a temporary directory, or under ``staging_dir``; it holds at most the shard being
written and one finished shard), exactly as a local writer builds them: buffered appends, final
``.npy`` headers, CRC-32s, id index, descriptor. Committing a finished shard (docs/format.md,
section 7.2) then:

1. reads ``manifest.json`` and its ETag, and the shard-table rows committed since this writer last
   read them (store/remote_state.py; one or two requests);
2. claims a shard number: creates ``shard-NNNNNN/_shard.json`` (the descriptor) with a create-only
   write, ``N`` the last committed row's number + 1 (or above this writer's own last number). A
   conflict means another writer holds ``N`` (committed, in progress, or dead): it tries ``N + 1``.
   Two writers therefore never write into the same shard directory;
3. uploads the shard's files into ``shard-NNNNNN/`` (in parallel; large files as multipart uploads);
4. writes a new, immutable shard table ``_shards/<generation>-<writer>.tbl`` (the committed rows and
   this shard's row; a table on object storage cannot be appended in place) and replaces
   ``manifest.json`` with a conditional write: ``If-Match`` the ETag read in 1. This is the commit:
   readers see the shard from here on, never before;
5. if the write loses (another writer committed in between, so the ETag changed), it reads the new
   state and tries 4 again with the new rows. If the other writer committed a shard with a higher
   number than ours (numbers must increase from row to row), it first claims a new number above it,
   uploads the files there and deletes the old claim. At most ``MAX_COMMIT_ATTEMPTS`` tries, then
   :class:`~seqstore.errors.ConflictError`. A write whose answer was lost (retried, then refused) is
   recognised by finding its row in the new state, so a shard is never committed twice;
6. deletes shard tables older than the last ``KEEP_TABLES`` generations (a reader that read an older
   manifest has fetched its table already, within its open).

So two writers racing on one store lose none of each other's shards. A writer that dies leaves a
claimed directory no table row names (and maybe a table object no manifest names): garbage that
readers never look at and that costs later claims one request.

Where the service or the fsspec filesystem has no conditional write (HTTP, fsspec URLs), a remote
writer is refused: write the store locally and copy it (``seqstore copy``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConflictError, FormatError, RemoteError, RemoteNotFound, SchemaError, SeqstoreError
from ..format.descriptor import DESCRIPTOR
from ..format.manifest import MANIFEST, Manifest, ShardInfo
from ..format.shard_table import (
    TABLE_OBJECTS,
    TableState,
    encode_row,
    encode_table_header,
    row_dtype,
    shard_dir_name,
)
from ..io.objects import ObjectClient, is_remote
from ..schema import Schema
from . import writer as _local
from .remote_state import StoreState, read_state
from .writer import Writer, _checked_schema, _new_manifest

__all__ = [
    "KEEP_TABLES",
    "MAX_COMMIT_ATTEMPTS",
    "RemoteWriter",
    "append_to",
    "create",
    "open_or_create",
]

log = logging.getLogger(__name__)

#: Conditional manifest writes a commit tries before it gives up with ConflictError.
MAX_COMMIT_ATTEMPTS = 64
#: Shard numbers a claim tries (each taken one is skipped with one request) before it gives up.
MAX_CLAIMS = 4096
#: Generations of shard-table objects kept (older ones are deleted after a commit).
KEEP_TABLES = 3
_TABLE_GENERATION = re.compile(r"_shards/(\d+)-[A-Za-z0-9]+\.tbl\Z")


def writing_client(url: str, storage_options: Mapping[str, Any] | None = None, filesystem: Any = None) -> ObjectClient:
    """The object client of a store that is to be written at ``url``; refuses a back end without
    conditional writes (a remote writer relies on them not to lose another writer's shards)."""
    client = ObjectClient(url, storage_options, filesystem)
    if not client.conditional_writes():
        raise RemoteError(
            f"{client.url}: this service or filesystem has no conditional write (If-Match), which writing a "
            f"store in place needs (two writers could lose each other's shards); write the store locally and "
            f"copy it: seqstore copy LOCAL_DIR {client.url}",
            url=client.url, attempts=0,
        )
    return client


class StagedWriter(Writer):
    """A Writer whose store directory is a local staging copy of a store at ``self.url``: its errors
    name the URL, and releasing it removes the staging directory (``self._stage_dir``)."""

    url: str
    _stage_dir: Path

    def _check_open(self) -> None:
        try:
            super()._check_open()
        except SeqstoreError as exc:
            raise type(exc)(str(exc).replace(str(self.root), self.url)) from None

    def _release(self) -> None:
        super()._release()
        if os.getpid() == self._pid:
            shutil.rmtree(self._stage_dir, ignore_errors=True)


class RemoteWriter(StagedWriter):
    """Appends records to the version-3 store at ``url`` on object storage (see the module
    documentation). Use :func:`create`, :func:`append_to` or :func:`open_or_create` with a URL.

    ``storage_options``: the client's options (as :func:`seqstore.open` takes them). ``staging_dir``:
    where shards are built before upload (default: a new temporary directory, ``$TMPDIR``); it needs
    room for about two shards (``shard_bytes``). ``upload_workers``: files uploaded at once. The other
    arguments are :class:`~seqstore.store.writer.Writer`'s.
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        staging_dir: str | os.PathLike[str] | None = None,
        upload_workers: int = 8,
        shard_bytes: int = 1 << 30,
        buffer_bytes: int = 64 << 20,
        max_shard_records: int = 1 << 24,
        direct_io: bool = False,
        _client: ObjectClient | None = None,
    ) -> None:
        if upload_workers < 1:
            raise ValueError(f"upload_workers must be >= 1, got {upload_workers}")
        client = _client or writing_client(url, storage_options)
        self.url = client.url
        self._client = client
        self._upload_workers = upload_workers
        state = read_state(client)
        if state is None:
            raise FormatError(f"{self.url}: no seqstore store here ({MANIFEST} does not exist)")
        if not state.v3:
            raise SeqstoreError(
                f"{self.url}: a version-{state.manifest.version} store; writers on object storage append to "
                "version-3 stores only (copy it to a local directory, append there, and copy it back)"
            )
        self._state: StoreState = state
        self._token = uuid.uuid4().hex[:12]
        self._next_claim = 0
        self._ready: tuple[Path, ShardInfo, int] | None = None
        self.conflicts = 0  #: conditional manifest writes this writer lost (and retried)
        self.renumbered = 0  #: shards this writer had to move to a higher number
        if staging_dir is not None:
            Path(staging_dir).mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="seqstore-staging-", dir=staging_dir))
        self._stage_dir = staging
        try:
            m = state.manifest
            Manifest(m.schema, id_lookup=m.id_lookup, table=TableState(0, 0, 0)).save(staging)
            super().__init__(staging, shard_bytes=shard_bytes, buffer_bytes=buffer_bytes,
                             max_shard_records=max_shard_records, direct_io=direct_io)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self._records_before = m.num_records
        self._has_ids = state.has_ids

    def __repr__(self) -> str:
        return f"seqstore.RemoteWriter({self.url!r}, committed={self.num_committed})"

    # ------------------------------------------------------------------------------------ commit

    def _commit_shard_files(self) -> None:
        if self._ready is not None:  # a shard finished earlier whose upload or commit failed: first
            self._publish_ready()
        pending = self._finish_shard_files()
        ready = self._workspace / "ready"
        os.rename(self._workspace / "current", ready)
        self._ready = (ready, pending, self._desc_crc)
        self._shard_open = False
        self._publish_ready()

    def commit(self) -> None:
        """Make everything appended so far visible to readers that open (or refresh) the store."""
        self._check_open()
        self._flush()
        if self._shard_open:
            self._commit_shard()
        elif self._ready is not None:
            with self._failing():
                self._publish_ready()
        elif self._stats_delta:
            with self._failing():
                self._publish(None)

    def _publish_ready(self) -> None:
        assert self._ready is not None
        ready, pending, _ = self._ready
        try:
            name = self._publish(self._ready)
        except _IdsMismatch as exc:
            shutil.rmtree(ready, ignore_errors=True)
            self._ready = None
            self._has_ids = exc.has_ids
            kind = "with" if exc.has_ids else "without"
            raise SchemaError(
                f"{self.url}: cannot mix records with and without ids in one store; its records are now written "
                f"{kind} ids, so the {pending.records} uncommitted records of this writer's shard were discarded"
            ) from None
        shutil.rmtree(ready, ignore_errors=True)
        self._ready = None
        self._committed_records += pending.records
        log.debug("%s: committed %s (%d records)", self.url, name, pending.records)

    def _refresh(self) -> StoreState:
        state = read_state(self._client, known=self._state)
        if state is None:
            raise FormatError(f"{self.url}: {MANIFEST} disappeared (the store was deleted or is being replaced)")
        if not state.v3 or state.manifest.schema != self._state.manifest.schema:
            raise SeqstoreError(f"{self.url}: the store was replaced by one with another schema or format")
        self._state = state
        return state

    def _publish(self, ready: tuple[Path, ShardInfo, int] | None) -> str:
        """Commit the finished shard ``ready`` (None: only the pending stats); returns its name."""
        c = self._client
        state = self._refresh()
        number = -1
        desc = b""
        path, pending, desc_crc = ready if ready is not None else (self._stage_dir, ShardInfo("", 0, {}, {}, False), 0)
        if ready is not None:
            _check_ids(state, pending.has_ids)
            desc = (path / DESCRIPTOR).read_bytes()
            number = self._claim(max(state.next_number(), self._next_claim), desc)
            self._upload(path, number, pending)
        delta = dict(self._stats_delta)
        for _ in range(MAX_COMMIT_ATTEMPTS):
            m = state.manifest
            assert m.table is not None
            gen = m.generation + 1
            stats = dict(m.stats)
            for k, v in delta.items():
                old = stats.get(k, 0)
                stats[k] = (old if isinstance(old, (int, float)) else 0) + v
            table_state, rows, tkey, header = m.table, state.rows, m.table.file, state.header
            if ready is not None:
                row = encode_row(number, m.table.records, pending.records, pending.has_ids,
                                 [pending.rows[r] for r in m.ragged], desc_crc)
                header = state.header or encode_table_header(len(m.ragged), m.table.id)
                tkey = f"{TABLE_OBJECTS}/{gen:012d}-{self._token}.tbl"
                c.put(tkey, header + state.rows_bytes() + row, mode="create")
                after = m.table.after(row, pending.records)
                table_state = TableState(after.rows, after.records, after.crc32, m.table.id, tkey)
                rows = np.concatenate([state.rows, np.frombuffer(row, dtype=row_dtype(len(m.ragged)))])
                rows.flags.writeable = False
            new = dataclasses.replace(m, table=table_state, generation=gen, stats=stats)
            raw = json.dumps(new.to_json(), separators=(",", ":")).encode()
            try:
                etag = c.put(MANIFEST, raw, mode={"e_tag": state.etag})
            except ConflictError:
                seen = len(state.rows)
                state = self._refresh()
                if ready is not None and number in state.rows["number"][seen:]:
                    break  # our write went through; its answer was lost and the retry refused
                if ready is not None:
                    _delete_quietly(c, tkey)
                self.conflicts += 1
                if ready is not None:
                    _check_ids(state, pending.has_ids)
                    if state.next_number() > number:  # a higher number was committed first: move above it
                        old = number
                        number = self._claim(state.next_number(), desc)
                        self._upload(path, number, pending)
                        self._delete_shard(old, pending)
                        self.renumbered += 1
                continue
            self._state = StoreState(raw, etag, new, header, rows)
            break
        else:
            raise ConflictError(
                f"{self.url}/{MANIFEST}: gave up after {MAX_COMMIT_ATTEMPTS} conditional writes, each refused "
                "because another writer committed first", url=c.key_url(MANIFEST), attempts=MAX_COMMIT_ATTEMPTS,
            )
        self._stats_delta = {k: v - delta.get(k, 0) for k, v in self._stats_delta.items() if v != delta.get(k, 0)}
        if ready is None:
            return ""
        self._next_claim = number + 1
        self._clean_tables()
        return shard_dir_name(number)

    def _claim(self, number: int, desc: bytes) -> int:
        """Create ``shard-<n>/_shard.json`` for the first ``n >= number`` nobody holds; return ``n``."""
        for n in range(number, number + MAX_CLAIMS):
            try:
                self._client.put(f"{shard_dir_name(n)}/{DESCRIPTOR}", desc, mode="create")
                return n
            except ConflictError:
                continue
        raise ConflictError(
            f"{self.url}: shard numbers {number} to {number + MAX_CLAIMS - 1} are all taken (claimed by writers that "
            "never committed them?)", url=self.url, attempts=MAX_CLAIMS,
        )

    def _upload(self, path: Path, number: int, pending: ShardInfo) -> None:
        name = shard_dir_name(number)
        files = sorted(pending.files)
        if len(files) == 1 or self._upload_workers == 1:
            for rel in files:
                self._client.put_file(f"{name}/{rel}", path / rel)
            return
        with concurrent.futures.ThreadPoolExecutor(min(self._upload_workers, len(files)),
                                                   thread_name_prefix="seqstore-upload") as pool:
            for fut in [pool.submit(self._client.put_file, f"{name}/{rel}", path / rel) for rel in files]:
                fut.result()

    def _delete_shard(self, number: int, pending: ShardInfo) -> None:
        name = shard_dir_name(number)
        for rel in [*sorted(pending.files), DESCRIPTOR]:  # the claim last: nobody reuses the number meanwhile
            _delete_quietly(self._client, f"{name}/{rel}")

    def _clean_tables(self) -> None:
        """Delete table objects of generations older than the last KEEP_TABLES (never the current)."""
        m = self._state.manifest
        assert m.table is not None
        try:
            metas = list(self._client.list(f"{TABLE_OBJECTS}/"))
        except RemoteError as exc:
            log.warning("%s: could not list old shard tables (%s)", self.url, exc)
            return
        for meta in metas:
            g = _TABLE_GENERATION.match(meta.key)
            if g and meta.key != m.table.file and int(g.group(1)) <= m.generation - KEEP_TABLES:
                _delete_quietly(self._client, meta.key)

    # ------------------------------------------------------------------------------------- close



class _IdsMismatch(Exception):
    def __init__(self, has_ids: bool) -> None:
        super().__init__(has_ids)
        self.has_ids = has_ids


def _check_ids(state: StoreState, has_ids: bool) -> None:
    if state.has_ids is not None and state.has_ids != has_ids:
        raise _IdsMismatch(state.has_ids)


def _delete_quietly(client: ObjectClient, key: str) -> None:
    try:
        client.delete(key)
    except RemoteNotFound:
        pass
    except RemoteError as exc:
        log.warning("%s: could not delete %s (%s)", client.url, key, exc)


# ------------------------------------------------------------------------------ entry points


def _manifest_bytes(sch: Schema, metadata: Mapping[str, Any] | None, id_lookup: str) -> bytes:
    return json.dumps(_new_manifest(sch, metadata, id_lookup).to_json(), separators=(",", ":")).encode()


def _install(client: ObjectClient, raw: bytes) -> bool:
    """Create ``manifest.json`` unless one exists; whether this call created it. Refused on the first
    try: it existed before. Refused on a retry (the answer to an earlier try was lost): ours if the
    manifest there has our bytes."""
    try:
        client.put(MANIFEST, raw, mode="create")
        return True
    except ConflictError as exc:
        if exc.attempts <= 1:
            return False
        try:
            return bytes(client.get(MANIFEST)[0]) == raw
        except RemoteNotFound:
            return False


def _delete_store(client: ObjectClient) -> None:
    """Delete the store at ``client``'s URL: its manifest first (readers see no store from then on),
    then every object under the URL."""
    try:
        client.get(MANIFEST)
    except RemoteNotFound:
        if next(iter(client.list("")), None) is not None:
            raise SeqstoreError(
                f"{client.url}: refusing to overwrite objects that are not a seqstore store (no {MANIFEST})"
            ) from None
        return
    client.delete(MANIFEST)
    for meta in client.list(""):
        _delete_quietly(client, meta.key)


def _writer_args(kw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: kw[k] for k in ("shard_bytes", "buffer_bytes", "max_shard_records", "direct_io")}


def _local_path(path: str | os.PathLike[str]) -> Path:
    text = os.fspath(path)
    return Path(text[len("file://") :] if text.startswith("file://") else text)


def _no_remote_args(path: Any, storage_options: Any, staging_dir: Any, filesystem: Any) -> None:
    if storage_options or staging_dir is not None:
        raise ValueError(f"{path}: storage_options and staging_dir are for URLs of object storage, not local paths")
    if filesystem is not None:
        writing_client(os.fspath(path), None, filesystem)  # refuses: fsspec has no conditional write


def create(
    path: str | os.PathLike[str],
    schema: Mapping[str, Any] | Schema,
    *,
    shard_bytes: int = 1 << 30,
    buffer_bytes: int = 64 << 20,
    max_shard_records: int = 1 << 24,
    overwrite: bool = False,
    metadata: Mapping[str, Any] | None = None,
    packed: Mapping[str, Sequence[str]] | None = None,
    id_lookup: str = "first",
    direct_io: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    staging_dir: str | os.PathLike[str] | None = None,
    filesystem: Any = None,
) -> Writer:
    """:func:`seqstore.store.writer.create` for a local path; for a URL of object storage (``s3://``,
    ``gs://``, ``az://``), a new store there and a :class:`RemoteWriter` on it. ``overwrite=True``
    deletes the store at the URL first (its manifest first, then every object under the URL); without
    it an existing store is ``FileExistsError``. ``storage_options``, ``staging_dir``: see
    :class:`RemoteWriter`. A URL whose back end has no conditional write (``https://``, fsspec URLs,
    ``filesystem=``) is refused with an error that says to write locally and copy."""
    kw = dict(shard_bytes=shard_bytes, buffer_bytes=buffer_bytes, max_shard_records=max_shard_records,
              direct_io=direct_io)
    if not is_remote(path):
        _no_remote_args(path, storage_options, staging_dir, filesystem)
        return _local.create(_local_path(path), schema, overwrite=overwrite, metadata=metadata, packed=packed,
                             id_lookup=id_lookup, **_writer_args(kw))
    url = os.fspath(path)
    client = writing_client(url, storage_options, filesystem)
    sch = _checked_schema(schema, packed, id_lookup)
    if overwrite:
        _delete_store(client)
    if not _install(client, _manifest_bytes(sch, metadata, id_lookup)):
        raise FileExistsError(f"{client.url}: already exists (pass overwrite=True to replace it)")
    return RemoteWriter(client.url, staging_dir=staging_dir, _client=client, **_writer_args(kw))


def open_or_create(
    path: str | os.PathLike[str],
    schema: Mapping[str, Any] | Schema,
    *,
    shard_bytes: int = 1 << 30,
    buffer_bytes: int = 64 << 20,
    max_shard_records: int = 1 << 24,
    metadata: Mapping[str, Any] | None = None,
    packed: Mapping[str, Sequence[str]] | None = None,
    id_lookup: str = "first",
    direct_io: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    staging_dir: str | os.PathLike[str] | None = None,
    filesystem: Any = None,
) -> Writer:
    """:func:`seqstore.store.writer.open_or_create` for a local path or a URL: a writer on the store,
    created (exactly once, when several processes call this at once: a create-only write of the
    manifest) when it does not exist. An existing store must have the same schema and ``id_lookup``."""
    kw = dict(shard_bytes=shard_bytes, buffer_bytes=buffer_bytes, max_shard_records=max_shard_records,
              direct_io=direct_io)
    if not is_remote(path):
        _no_remote_args(path, storage_options, staging_dir, filesystem)
        return _local.open_or_create(_local_path(path), schema, metadata=metadata, packed=packed,
                                     id_lookup=id_lookup, **_writer_args(kw))
    url = os.fspath(path)
    client = writing_client(url, storage_options, filesystem)
    sch = _checked_schema(schema, packed, id_lookup)
    _install(client, _manifest_bytes(sch, metadata, id_lookup))
    writer = RemoteWriter(client.url, staging_dir=staging_dir, _client=client, **_writer_args(kw))
    m = writer._state.manifest
    if m.schema != sch or m.id_lookup != id_lookup:
        writer.abort()
        what = f"schema {m.schema!r}" if m.schema != sch else f"id_lookup {m.id_lookup!r}"
        want = f"{sch!r}" if m.schema != sch else f"{id_lookup!r}"
        raise SchemaError(f"{client.url}: existing store has {what}, expected {want}")
    return writer


def append_to(
    path: str | os.PathLike[str],
    *,
    shard_bytes: int = 1 << 30,
    buffer_bytes: int = 64 << 20,
    max_shard_records: int = 1 << 24,
    direct_io: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    staging_dir: str | os.PathLike[str] | None = None,
    filesystem: Any = None,
) -> Writer:
    """:func:`seqstore.store.writer.append_to` for a local path or a URL: a writer adding shards to an
    existing store. Many processes may do this at once, on any number of machines."""
    kw = dict(shard_bytes=shard_bytes, buffer_bytes=buffer_bytes, max_shard_records=max_shard_records,
              direct_io=direct_io)
    if not is_remote(path):
        _no_remote_args(path, storage_options, staging_dir, filesystem)
        return _local.append_to(_local_path(path), **_writer_args(kw))
    client = writing_client(os.fspath(path), storage_options, filesystem)
    return RemoteWriter(client.url, staging_dir=staging_dir, _client=client, **_writer_args(kw))


def existing_manifest(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> Manifest | None:
    """The manifest of the store at ``path`` (a local path or a URL), or None when there is none (for
    callers that decide between creating and appending, such as the Logger)."""
    if not is_remote(path):
        root = _local_path(path)
        return Manifest.load(root) if (root / MANIFEST).exists() else None
    state = read_state(ObjectClient(os.fspath(path), storage_options))
    return None if state is None else state.manifest

