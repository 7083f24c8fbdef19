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

from ...errors import ConflictError, CorruptionError, RemoteError, RemoteNotFound, SchemaError, SeqstoreError
from ...format.descriptor import DESCRIPTOR
from ...format.manifest import MANIFEST
from ...format.shard_table import TABLE_OBJECTS, TableState, encode_row, encode_table_header, shard_dir_name
from ...io.objects import ObjectClient
from ...schema import Schema
from .remote import (
    COMMITTING_FILE,
    COPY_LIMIT,
    MAX_COMMIT_ATTEMPTS,
    STAGED_KEY,
    STREAM_CHUNK,
    WORKERS,
    claim,
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
    return _Commit(client, plist, entries, schema, staged, overwrite, workers).run(state)


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


class _Commit:
    """The steps 2-5 of the module docs for one call of :func:`commit_parts`."""

    def __init__(self, client: ObjectClient, plist: list[Part], entries: list[_Entry], schema: Schema,
                 staged: Mapping[str, Any] | None, overwrite: bool, workers: int) -> None:
        self.c = client
        self.plist = plist
        self.entries = entries
        self.schema = schema
        self.staged = staged
        self.overwrite = overwrite
        self.workers = max(1, workers)
        self.token = uuid.uuid4().hex[:12]
        self.numbers: list[int] = []
        self.conflicts = 0
        self.renumbered = 0

    def run(self, state: StoreState) -> int:
        records = sum(e.shard.records for e in self.entries)
        if not self.entries and not self.overwrite:
            _finish_parts(self.c, self.plist, state.manifest.generation, self.workers)
            return 0
        sent = False  # a manifest write whose fate is unknown: the claims must stay
        try:
            self._place(state.next_number())
            for _ in range(MAX_COMMIT_ATTEMPTS):
                m = state.manifest
                gen = m.generation + 1
                tkey, raw = self._manifest(state, gen)
                try:
                    sent = True
                    self.c.put(MANIFEST, raw, mode={"e_tag": state.etag})
                except ConflictError:
                    before = state
                    state = read_v3(self.c, known=state)
                    if self.numbers and self.numbers[0] in state.rows["number"]:
                        gen = state.manifest.generation  # ours went through; the answer was lost
                        break
                    sent = False
                    delete_quietly(self.c, tkey)
                    self.conflicts += 1
                    self._check_refreshed(before, state)
                    if not self.overwrite and self.numbers and state.next_number() > self.numbers[0]:
                        old = self.numbers
                        self._place(state.next_number())  # above the shard the other writer committed
                        self._delete_shards(old)
                        self.renumbered += 1
                    continue
                break
            else:
                raise ConflictError(
                    f"{self.c.url}/{MANIFEST}: gave up after {MAX_COMMIT_ATTEMPTS} conditional writes, each refused "
                    "because another writer committed first; nothing was committed",
                    url=self.c.key_url(MANIFEST), attempts=MAX_COMMIT_ATTEMPTS,
                )
        except BaseException:
            if not sent and self.numbers:
                self._delete_shards(self.numbers)
            raise
        _finish_parts(self.c, self.plist, gen, self.workers)
        if self.overwrite and self.staged is not None:
            delete_quietly(self.c, STAGED_KEY)
        clean_tables(self.c, gen, tkey, self.workers)
        log.debug("%s: committed %d parts (%d shards, %d records) as generation %d", self.c.url, len(self.plist),
                  len(self.entries), records, gen)
        return records

    # ---------------------------------------------------------------------------------- steps

    def _place(self, first: int) -> None:
        """Claim numbers from ``first`` on for the shards (in order), record them in each part's
        ``commit.json``, copy the staged files there."""
        self.numbers = claim(self.c, first, [e.desc for e in self.entries], self.workers)
        k = 0
        markers: list[tuple[str, bytes]] = []
        for p in self.plist:
            nums = self.numbers[k : k + len(p.shards)]
            k += len(p.shards)
            markers.append((f"{prefix(p.job, p.task)}/{COMMITTING_FILE}",
                            json.dumps({"token": self.token, "numbers": nums}).encode()))
        parallel(lambda kv: self.c.put(kv[0], kv[1]), markers, self.workers)
        copies = [(f"{e.prefix}/{e.shard.dir}/{rel}", f"{shard_dir_name(n)}/{rel}", size)
                  for n, e in zip(self.numbers, self.entries) for rel, (size, _) in sorted(e.shard.files.items())]
        try:
            parallel(lambda t: _copy(self.c, *t), copies, self.workers)
        except RemoteNotFound as exc:
            raise SeqstoreError(f"{exc.url}: a staged file of a part is missing (discarded while committing?); "
                                "nothing was committed") from None

    def _manifest(self, state: StoreState, gen: int) -> tuple[str, bytes]:
        """Write the new table object for ``state``; return its key and the new manifest's bytes."""
        m = state.manifest
        assert m.table is not None
        ragged = tuple(n for n, f in self.schema.items() if f.ragged)
        if self.overwrite:
            table = TableState(0, 0, 0, gen)
            header, base = encode_table_header(len(ragged), gen), b""
        else:
            table = m.table
            header, base = state.header or encode_table_header(len(ragged), m.table.id), state.rows_bytes()
        rows = bytearray()
        start = table.records
        for n, e in zip(self.numbers, self.entries):
            sh = e.shard
            row = encode_row(n, start, sh.records, sh.has_ids, [sh.rows[r] for r in ragged], sh.desc_crc)
            rows += row
            table = table.after(row, sh.records)
            start += sh.records
        tkey = f"{TABLE_OBJECTS}/{gen:012d}-{self.token}.tbl"
        self.c.put(tkey, header + base + bytes(rows))
        new = dataclasses.replace(m, table=TableState(table.rows, table.records, table.crc32, table.id, tkey),
                                  generation=gen)
        if self.overwrite:
            new.schema = self.schema
            new.index_runs = []
            if self.staged is not None:
                new.id_lookup = str(self.staged["id_lookup"])
                if self.staged.get("metadata") is not None:
                    new.metadata = dict(self.staged["metadata"])
        return tkey, json.dumps(new.to_json(), separators=(",", ":")).encode()

    def _check_refreshed(self, before: StoreState, state: StoreState) -> None:
        """After a lost race: the store must still take these parts."""
        if self.overwrite:
            return
        if state.manifest.schema != self.schema:
            raise SchemaError(f"{self.c.url}: the store was replaced by one with schema {state.manifest.schema!r} "
                              "while committing; nothing was committed")
        kind = self.entries[0].shard.has_ids if self.entries else None
        if kind is not None and state.has_ids is not None and state.has_ids != kind:
            want = "with" if state.has_ids else "without"
            raise SchemaError(f"{self.c.url}: another writer committed records {want} ids first; the parts' are the "
                              "other kind; nothing was committed")

    def _delete_shards(self, numbers: Sequence[int]) -> None:
        """Delete shard directories this commit claimed and did not commit (the claims last)."""
        files = [f"{shard_dir_name(n)}/{rel}" for n, e in zip(numbers, self.entries) for rel in sorted(e.shard.files)]
        try:
            delete_all(self.c, files, self.workers)
            delete_all(self.c, [f"{shard_dir_name(n)}/{DESCRIPTOR}" for n in numbers], self.workers)
        except BaseException as exc:  # noqa: BLE001 - garbage no reader looks at; the error that got here counts
            log.warning("%s: could not delete the shards this commit claimed (%r)", self.c.url, exc)


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
