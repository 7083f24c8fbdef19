"""Distributed writes into a store on object storage: staging and committing parts (store/write/parts.py)
for ``s3://``, ``gs://`` and ``az://`` URLs (any :class:`~seqstore.io.objects.ObjectClient` back end with
conditional writes).

``seqstore.store.parts`` dispatches here when the path is a URL, so the calls are the same as for a
local store, plus ``storage_options``::

    prepare_store(url, schema, mode="append", storage_options=opts)           # driver
    w = PartWriter(url, job=job, task=attempt, storage_options=opts)          # each task attempt
    w.append_batch(columns, ids=ids); part = w.finish()                       # picklable Part
    commit_parts(url, parts, storage_options=opts)                            # driver: one commit
    discard_parts(url, job, storage_options=opts)                             # driver: the rest

A task attempt (:class:`RemotePartWriter`) builds its shards in a local temporary directory exactly
as a local :class:`~seqstore.store.parts.PartWriter` does, and uploads each finished shard under the
store's staging prefix ``_parts/<job>/<task>/p<k>/`` (the files, then the descriptor ``_shard.json``),
then ``_parts/<job>/<task>/part.json`` (create-only) last: the part is finished once that object
exists. The :class:`~seqstore.store.parts.Part` it returns (job, task, records, per shard: rows,
files with sizes and CRC-32s, descriptor CRC) is the same small value as for a local part.

The driver's :func:`commit_parts` (docs/format.md, section 7.3):

1. reads the manifest and the committed table rows, and in one wave every part's ``part.json``
   (which must equal the Part given), its markers and every staged descriptor (checked against the
   CRC-32 in the Part): O(parts + shards) small requests;
2. claims final shard numbers above the last committed one, in the order of the parts, with
   create-only writes of the descriptors to ``shard-NNNNNN/_shard.json`` (a number someone else
   holds is skipped), and writes ``commit.json`` into each part (the numbers its shards got);
3. copies every staged file to its ``shard-NNNNNN/`` inside the service (server-side copy; files over
   :data:`COPY_LIMIT` and back ends without a copy are streamed through the driver instead);
4. writes one new immutable table object ``_shards/<generation>-<token>.tbl`` with all the new rows
   and replaces ``manifest.json`` with ``If-Match`` the ETag read in 1: the commit point. Refused (another
   writer committed first), it reads the new state and tries again, first moving its shards above a
   higher number the other writer committed (claim, copy, delete the old claims); bounded by
   ``MAX_COMMIT_ATTEMPTS``. A write whose answer was lost is recognised by its rows in the new state;
5. writes ``committed.json`` into each part and deletes the part's staged objects.

All of the parts appear at once or none does: readers see the new shards only through the manifest,
which is written last. A driver that dies before 4 leaves claimed shard directories that no table
row names (garbage readers never look at, as a remote writer that died leaves); calling
:func:`commit_parts` again with the same parts commits them, or, when the manifest shows the numbers
their ``commit.json`` records, says they were committed (never twice).

:func:`discard_parts` first writes ``_parts/.ended/<job>`` (a task attempt that is still running
checks it after each shard it uploads and when it finishes, and then deletes what it wrote), then
deletes every object under ``_parts/<job>/``: finished parts, parts of attempts that were killed
mid-write and never reported, committed parts' markers. Object storage has no lock that shows a live
writer, so call it once the job's tasks have stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ...errors import CorruptionError, RemoteError, RemoteNotFound, SchemaError, SeqstoreError
from ...format.descriptor import DESCRIPTOR
from ...format.shard_table import shard_dir_name
from ...io.objects import ObjectClient
from ...schema import Schema
from .remote import (
    COMMITTING_FILE,
    COPY_LIMIT,
    STAGED_KEY,
    STREAM_CHUNK,
    WORKERS,
    Commit,
    clean_tables,
    delete_all,
    delete_quietly,
    get_many,
    parallel,
    prefix,
    read_v3,
)
from .state import StoreState
from .target import COMMITTED_FILE, PART_FILE, Part, PartShard, check_parts_kinds, schema_crc

log = logging.getLogger(__name__)


def commit_remote_parts(client: ObjectClient, plist: list[Part], overwrite: bool, workers: int = WORKERS) -> int:
    """Steps 1-5 of the module docs: every shard of ``plist`` in one manifest commit, in order."""
    state = read_v3(client)
    staged_raw = get_many(client, [STAGED_KEY])[0] if overwrite else None
    staged = json.loads(staged_raw) if staged_raw is not None else None
    schema = Schema.from_json(staged["schema"]) if staged is not None else state.manifest.schema
    entries = _check_parts(client, state, plist, schema)
    check_parts_kinds(client.url, {e.shard.has_ids for e in entries}, None if overwrite else state.has_ids)
    return _commit(client, plist, entries, schema, staged, overwrite, state, max(1, workers))


@dataclasses.dataclass
class _Entry:
    """One staged shard to commit: its part's staging prefix, its description, its descriptor's bytes."""

    prefix: str
    shard: PartShard
    desc: bytes



def _check_parts(client: ObjectClient, state: StoreState, plist: list[Part], schema: Schema) -> list[_Entry]:
    """One wave: each part's ``part.json``, ``committed.json`` and ``commit.json``, each shard's
    descriptor; the checks of the module docs. A part whose earlier commit reached its commit point
    (its ``commit.json`` numbers are committed rows) is marked committed and reported."""
    keys: list[str] = []
    for p in plist:
        pre = prefix(p.job, p.task)
        keys += [f"{pre}/{PART_FILE}", f"{pre}/{COMMITTED_FILE}", f"{pre}/{COMMITTING_FILE}"]
        keys += [f"{pre}/{sh.dir}/{DESCRIPTOR}" for sh in p.shards]
    got = iter(get_many(client, keys))
    answers = [(p, next(got), next(got), next(got), [next(got) for _ in p.shards]) for p in plist]
    committed = set(state.rows["number"].tolist())
    earlier = []  # parts an earlier commit_parts committed, whose driver stopped before marking them
    for p, desc, done, marker, _ in answers:
        if desc is not None and done is None and marker is not None:
            numbers = [int(n) for n in json.loads(marker)["numbers"]]
            if numbers and all(n in committed for n in numbers):
                earlier.append(p)
    if earlier:
        gen = state.manifest.generation
        _finish_parts(client, earlier, gen, WORKERS)
        p = earlier[0]
        raise SeqstoreError(
            f"{client.key_url(prefix(p.job, p.task))} (part {p.task!r} of job {p.job!r}"
            + (f" and {len(earlier) - 1} more" if len(earlier) > 1 else "")
            + f"): already committed by an earlier commit_parts whose driver stopped before it finished (the store "
            f"is at manifest generation {gen}); nothing was committed by this call"
        )
    crc = schema_crc(schema)
    entries: list[_Entry] = []
    for p, desc, done, _, descs in answers:
        pre = prefix(p.job, p.task)
        where = f"{client.key_url(pre)} (part {p.task!r} of job {p.job!r})"
        if done is not None:
            gen = json.loads(done).get("generation")
            raise SeqstoreError(f"{where}: already committed (manifest generation {gen}); nothing was committed")
        if desc is None:
            raise SeqstoreError(f"{where}: not there (never finished, discarded, or written to another store); nothing "
                                "was committed")
        if json.loads(desc) != p.to_json():
            raise SeqstoreError(f"{where}: its part.json differs from the part given; nothing was committed")
        if p.schema_crc != crc:
            raise SchemaError(f"{where}: written with another schema than the store's ({schema!r}); nothing was "
                              "committed")
        for sh, raw in zip(p.shards, descs):
            key = f"{pre}/{sh.dir}/{DESCRIPTOR}"
            if raw is None:
                raise SeqstoreError(f"{where}: shard {client.key_url(key)} is missing; nothing was committed")
            if zlib.crc32(raw) != sh.desc_crc:
                raise CorruptionError(f"{client.key_url(key)}: CRC-32 differs from the part's description; nothing "
                                      "was committed")
            entries.append(_Entry(pre, sh, raw))
    return entries


def _staged_keys(p: Part) -> list[str]:
    pre = prefix(p.job, p.task)
    keys = [f"{pre}/{sh.dir}/{rel}" for sh in p.shards for rel in [*sorted(sh.files), DESCRIPTOR]]
    return [*keys, f"{pre}/{PART_FILE}", f"{pre}/{COMMITTING_FILE}"]


def _finish_parts(client: ObjectClient, plist: Sequence[Part], generation: int, workers: int) -> None:
    """After the commit point: ``committed.json`` into each part, then its staged objects deleted."""
    marker = json.dumps({"generation": generation}).encode()
    try:
        parallel(lambda p: client.put(f"{prefix(p.job, p.task)}/{COMMITTED_FILE}", marker), list(plist), workers)
    except RemoteError as exc:  # committed all the same; a repeated commit_parts finds commit.json
        log.warning("%s: committed, but could not mark every part committed (%s)", client.url, exc)
        return
    delete_all(client, [k for p in plist for k in _staged_keys(p)], workers)


def _commit(client: ObjectClient, plist: list[Part], entries: list[_Entry], schema: Schema,
            staged: Mapping[str, Any] | None, overwrite: bool, state: StoreState, workers: int) -> int:
    """Steps 2-5 of the module docs."""
    records = sum(e.shard.records for e in entries)
    if not entries and not overwrite:
        _finish_parts(client, plist, state.manifest.generation, workers)
        return 0
    token = uuid.uuid4().hex[:12]

    def place(numbers: list[int]) -> None:
        """Record the numbers in each part's ``commit.json``, copy the staged files there."""
        k = 0
        markers: list[tuple[str, bytes]] = []
        for p in plist:
            nums = numbers[k : k + len(p.shards)]
            k += len(p.shards)
            markers.append((f"{prefix(p.job, p.task)}/{COMMITTING_FILE}",
                            json.dumps({"token": token, "numbers": nums}).encode()))
        parallel(lambda kv: client.put(kv[0], kv[1]), markers, workers)
        copies = [(f"{e.prefix}/{e.shard.dir}/{rel}", f"{shard_dir_name(n)}/{rel}", size)
                  for n, e in zip(numbers, entries) for rel, (size, _) in sorted(e.shard.files.items())]
        try:
            parallel(lambda t: _copy(client, *t), copies, workers)
        except RemoteNotFound as exc:
            raise SeqstoreError(f"{exc.url}: a staged file of a part is missing (discarded while committing?); "
                                "nothing was committed") from None

    def check(state: StoreState) -> None:
        """After a lost race: the store must still take these parts."""
        if overwrite:
            return
        if state.manifest.schema != schema:
            raise SchemaError(f"{client.url}: the store was replaced by one with schema {state.manifest.schema!r} "
                              "while committing; nothing was committed")
        kind = entries[0].shard.has_ids if entries else None
        if kind is not None and state.has_ids is not None and state.has_ids != kind:
            want = "with" if state.has_ids else "without"
            raise SchemaError(f"{client.url}: another writer committed records {want} ids first; the parts' are the "
                              "other kind; nothing was committed")

    state = Commit(client, [e.shard for e in entries], [e.desc for e in entries], place=place,
                   refresh=lambda known: read_v3(client, known=known), check=check,
                   token=token, overwrite=overwrite, schema=schema, staged=staged, workers=workers).run(state)
    m = state.manifest
    assert m.table is not None
    _finish_parts(client, plist, m.generation, workers)
    if overwrite and staged is not None:
        delete_quietly(client, STAGED_KEY)
    clean_tables(client, m.generation, m.table.file, workers)
    log.debug("%s: committed %d parts (%d shards, %d records) as generation %d", client.url, len(plist),
              len(entries), records, m.generation)
    return records


def _copy(client: ObjectClient, src: str, dst: str, size: int) -> None:
    """Copy the staged object ``src`` to ``dst``: inside the service, or streamed (large or no copy)."""
    if size <= COPY_LIMIT:
        try:
            client.copy(src, dst)
            return
        except NotImplementedError:
            pass

    def chunks() -> Iterator[bytes]:
        for a in range(0, size, STREAM_CHUNK):
            data, _ = client.get_ranges([(src, a, min(size, a + STREAM_CHUNK), None)])[0]
            yield bytes(data)

    client.put_stream(dst, chunks)


# ------------------------------------------------------------------------------------- clean-up
