"""Calls on object storage that a writer's commit and the commit of a job's parts (both in
store/write/objects.py) share: the writing client, quiet and parallel deletes,
one-wave reads, shard-number claims, old shard tables, the parts area's jobs."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from ...errors import ConflictError, FormatError, RemoteError, RemoteNotFound, SeqstoreError
from ...format.descriptor import DESCRIPTOR
from ...format.manifest import MANIFEST, PARTS_DIR, Manifest
from ...format.shard_table import TABLE_OBJECTS, TableState, encode_row, encode_table_header, row_dtype, shard_dir_name
from ...io.objects import ObjectClient
from ...schema import Schema
from .state import StoreState, read_state
from .target import STAGED, PartShard, add_stats, check_v3

log = logging.getLogger(__name__)

#: Conditional manifest writes a commit tries before it gives up with ConflictError.
MAX_COMMIT_ATTEMPTS = 64
#: Shard numbers a claim tries (each taken one is skipped with one request) before it gives up.
MAX_CLAIMS = 4096
#: Generations of shard-table objects kept (older ones are deleted after a commit).
KEEP_TABLES = 3
_TABLE_GENERATION = re.compile(r"_shards/(\d+)-[A-Za-z0-9]+\.tbl\Z")
#: The keys of a store's objects other than its manifest.
_STORE_OBJECT = re.compile(r"(shard-[0-9]{6,}|_shards|_index|_parts)/|_shards\.tbl\Z")
#: streamed through the committing process (O(chunk) memory).
COPY_LIMIT = 5 << 30
#: Chunk of a streamed copy.
STREAM_CHUNK = 8 << 20
#: Requests (claims, copies, deletes, marker writes) in flight at once in a commit or a discard.
WORKERS = 16
#: ``commit.json`` in a part: the shard numbers a commit in progress gave the part's shards.
COMMITTING_FILE = "commit.json"
#: ``_parts/.ended/<job>``: the job was committed or discarded; its late task attempts write nothing.
ENDED_DIR = f"{PARTS_DIR}/.ended"
#: End marks older than this are removed by :func:`discard_parts` and :func:`clean_parts`; until then
#: the job id cannot be used again.
ENDED_KEEP_S = 7 * 24 * 3600.0
STAGED_KEY = f"{PARTS_DIR}/{STAGED}"

_T = TypeVar("_T")
_R = TypeVar("_R")


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


def delete_quietly(client: ObjectClient, key: str) -> None:
    try:
        client.delete(key)
    except RemoteNotFound:
        pass
    except RemoteError as exc:
        log.warning("%s: could not delete %s (%s)", client.url, key, exc)


# ------------------------------------------------------------------------------ entry points


def install_manifest(client: ObjectClient, raw: bytes) -> bool:
    """Create ``manifest.json`` unless one exists; whether this call created it. Refused on the first
    try: it existed before. Refused on a retry (the answer to an earlier try was lost): ours if the
    manifest there has our bytes."""
    try:
        client.put(MANIFEST, raw, mode="create")
        return True
    except ConflictError as exc:
        return exc.attempts > 1 and get_many(client, [MANIFEST])[0] == raw


def delete_store(client: ObjectClient) -> None:
    """Delete the store at ``client``'s URL: its manifest first (readers see no store from then on),
    then every object under the URL. Without a manifest, only what is left of a store (a deletion or
    copy that stopped part way) is deleted; other objects are refused."""
    try:
        client.get(MANIFEST)
    except RemoteNotFound:
        other = next((m.key for m in client.list("") if not _STORE_OBJECT.match(m.key)), None)
        if other is not None:
            raise SeqstoreError(
                f"{client.url}: refusing to overwrite objects that are not a seqstore store (no {MANIFEST}; "
                f"{other} is not a store's)"
            ) from None
    else:
        client.delete(MANIFEST)
    for meta in client.list(""):
        delete_quietly(client, meta.key)


def prefix(job: str, task: str) -> str:
    return f"{PARTS_DIR}/{job}/{task}"


def parallel(fn: Callable[[_T], _R], items: Sequence[_T], workers: int = WORKERS) -> list[_R]:
    """``[fn(x) for x in items]`` with up to ``workers`` calls at once; the first exception is raised
    once every call has ended."""
    if len(items) <= 1 or workers <= 1:
        return [fn(x) for x in items]
    with concurrent.futures.ThreadPoolExecutor(min(workers, len(items)), thread_name_prefix="seqstore-parts") as pool:
        futures = [pool.submit(fn, x) for x in items]
        concurrent.futures.wait(futures)
        return [f.result() for f in futures]


def get_many(client: ObjectClient, keys: Sequence[str]) -> list[bytes | None]:
    """The whole objects ``keys`` in one wave of requests; None for a missing one."""
    got = client.get_ranges([(k, 0, -1, None) for k in keys], missing_ok=True)
    return [None if meta is None else bytes(data) for data, meta in got]


def delete_all(client: ObjectClient, keys: Sequence[str], workers: int = WORKERS) -> None:
    parallel(lambda k: delete_quietly(client, k), list(keys), workers)


def list_keys(client: ObjectClient, prefix: str) -> list[str]:
    """Keys under the folder ``prefix`` (only those whose path continues with ``/``)."""
    head = prefix.rstrip("/") + "/"
    return [m.key for m in client.list(prefix.rstrip("/")) if m.key.startswith(head)]


def read_v3(client: ObjectClient, known: StoreState | None = None) -> StoreState:
    """The store's state; a missing store or one older than version 3 is an error."""
    state = read_state(client, known=known)
    if state is None:
        raise FormatError(f"{client.url}: no seqstore store here ({MANIFEST} does not exist)")
    check_v3(client.url, state.manifest)
    return state


def claim(client: ObjectClient, first: int, descs: Sequence[bytes], workers: int, lost: list[int]) -> list[int]:
    """Claim increasing shard numbers from ``first`` on for the descriptors ``descs`` (in order):
    create-only writes of ``shard-<n>/_shard.json``, a wave at a time. Where a number is taken, the
    claims after it in the wave are given back and the rest tried above it. A number whose claim was
    refused to a retry while it holds our descriptor's bytes (the first try's answer was lost: likely
    ours) counts as taken too, and goes into ``lost`` for the commit to delete once that is safe."""
    numbers: list[int] = []
    base = first
    tried = 0
    while len(numbers) < len(descs):
        rest = descs[len(numbers):]
        cand = list(range(base, base + len(rest)))

        def put(i: int, cand: list[int] = cand, rest: Sequence[bytes] = rest) -> bool:
            key = f"{shard_dir_name(cand[i])}/{DESCRIPTOR}"
            try:
                client.put(key, rest[i], mode="create")
                return True
            except ConflictError as exc:
                if exc.attempts > 1 and get_many(client, [key])[0] == rest[i]:
                    lost.append(cand[i])
                return False

        ok = parallel(put, list(range(len(rest))), workers)
        j = ok.index(False) if False in ok else len(rest)
        numbers += cand[:j]
        delete_all(client, [f"{shard_dir_name(cand[i])}/{DESCRIPTOR}" for i in range(j + 1, len(rest)) if ok[i]],
                    workers)
        tried += len(rest)
        if j < len(rest):
            base = cand[j] + 1
            if tried > MAX_CLAIMS + len(descs):
                delete_all(client, [f"{shard_dir_name(n)}/{DESCRIPTOR}" for n in numbers], workers)
                raise ConflictError(
                    f"{client.url}: no free shard numbers between {first} and {base} (claimed by writers that never "
                    "committed them?)", url=client.url, attempts=tried,
                )
    return numbers


def clean_tables(client: ObjectClient, generation: int, current: str, workers: int = WORKERS) -> None:
    """Delete table objects of generations older than the last KEEP_TABLES (never the current one)."""
    try:
        metas = list(client.list(f"{TABLE_OBJECTS}/"))
    except RemoteError as exc:
        log.warning("%s: could not list old shard tables (%s)", client.url, exc)
        return
    old = [m.key for m in metas if (g := _TABLE_GENERATION.match(m.key)) and m.key != current
           and int(g.group(1)) <= generation - KEEP_TABLES]
    delete_all(client, old, workers)


def job_times(client: ObjectClient) -> dict[str, float]:
    """Job -> the newest modification time of its objects."""
    out: dict[str, float] = {}
    for meta in client.list(PARTS_DIR):
        bits = meta.key.split("/")
        if len(bits) >= 3 and bits[0] == PARTS_DIR and not bits[1].startswith("."):
            out[bits[1]] = max(out.get(bits[1], 0.0), meta.mtime)
    return out


def delete_old_marks(client: ObjectClient, workers: int = WORKERS) -> None:
    """Delete end marks older than ENDED_KEEP_S (one listing of ``_parts/.ended/``)."""
    now = time.time()
    try:
        marks = [m.key for m in client.list(ENDED_DIR) if m.mtime and now - m.mtime > ENDED_KEEP_S]
    except RemoteError as exc:
        log.warning("%s: could not list the end marks of finished jobs (%s)", client.url, exc)
        return
    delete_all(client, marks, workers)


class Commit:
    """One conditional commit of finished shards, in order (docs/format.md 7.2 and 7.3, steps 2-5):
    claim numbers, ``place(numbers)`` the files, write a table object, replace the manifest If-Match;
    after a lost race ``refresh``, ``check`` and move above a higher number committed meanwhile.
    ``stats``: deltas for the manifest's stats; ``overwrite``: the table lists only these shards and
    the manifest takes ``schema`` and the ``staged`` settings."""

    def __init__(self, client: ObjectClient, shards: Sequence[PartShard], descs: Sequence[bytes], *,
                 place: Callable[[list[int]], None], refresh: Callable[[StoreState], StoreState],
                 check: Callable[[StoreState], None], token: str,
                 stats: Mapping[str, float] | None = None, floor: int = 0, overwrite: bool = False,
                 schema: Schema | None = None, staged: Mapping[str, Any] | None = None, workers: int = WORKERS) -> None:
        self.c = client
        self.shards, self.descs = list(shards), list(descs)
        self.place, self.refresh, self.check = place, refresh, check
        self.token, self.stats, self.floor = token, dict(stats or {}), floor
        self.overwrite, self.schema, self.staged = overwrite, schema, staged
        self.workers = max(1, workers)
        self.numbers: list[int] = []
        self.lost: list[int] = []  # numbers whose claim answered "taken" to a retry of our own claim
        self.conflicts = 0
        self.renumbered = 0
        self.unsure = False  # run raised after a manifest write that may have gone through (claims kept)
        self.sent = b""  # the manifest bytes of the last write tried

    def run(self, state: StoreState) -> StoreState:
        """Commit; returns the store's state with the commit in it."""
        state = self._run(state)
        if self.lost and not self.overwrite:  # (an overwrite's table does not show the numbers it replaced)
            # claims of ours whose answers were lost, below the shards just committed and not committed
            # themselves: no commit can list them any more (a commit moves above a higher committed number;
            # an overwrite job runs with no other writer), so their descriptors go
            stale = [n for n in self.lost if n not in set(self.numbers) and n not in state.rows["number"]]
            if stale and (not self.numbers or max(stale) < self.numbers[0]):
                delete_all(self.c, [f"{shard_dir_name(n)}/{DESCRIPTOR}" for n in stale], self.workers)
        return state

    def _run(self, state: StoreState) -> StoreState:
        sent = False  # a manifest write whose fate is unknown: the claims must stay
        try:
            if self.shards:
                self._place(max(state.next_number(), self.floor))
            for _ in range(MAX_COMMIT_ATTEMPTS):
                tkey, new, header, rows = self._next(state)
                raw = json.dumps(new.to_json(), separators=(",", ":")).encode()
                try:
                    sent, self.sent = True, raw
                    etag = self.c.put(MANIFEST, raw, mode={"e_tag": state.etag})
                except ConflictError as exc:
                    state = self.refresh(state)
                    ours = (self.shards or self.overwrite) and state.v3 and state.table_key == tkey
                    if ours or (self.numbers and self.numbers[0] in state.rows["number"]):
                        return state  # ours went through; its answer was lost and the retry refused
                    # (an overwrite with no shards has no numbers: the manifest naming our table object tells;
                    # stats alone have neither: the manifest there being the bytes a retried write sent does)
                    if exc.attempts > 1 and state.raw == raw:
                        return state
                    sent = False
                    if self.shards or self.overwrite:  # a table object of its own
                        delete_quietly(self.c, tkey)
                    self.conflicts += 1
                    self.check(state)
                    if not self.overwrite and self.numbers and state.next_number() > self.numbers[0]:
                        old = self.numbers
                        self._place(state.next_number())  # above the shard the other writer committed
                        self._unplace(old)
                        self.renumbered += 1
                    continue
                return StoreState(raw, etag, new, header, rows)
            raise ConflictError(
                f"{self.c.url}/{MANIFEST}: gave up after {MAX_COMMIT_ATTEMPTS} conditional writes, each refused "
                "because another writer committed first; nothing was committed",
                url=self.c.key_url(MANIFEST), attempts=MAX_COMMIT_ATTEMPTS,
            )
        except BaseException:
            if not sent and self.numbers:
                self._unplace(self.numbers)
            self.unsure = sent
            raise

    def _place(self, first: int) -> None:
        self.numbers = claim(self.c, first, self.descs, self.workers, self.lost)
        self.place(self.numbers)

    def _next(self, state: StoreState) -> tuple[str, Manifest, bytes, np.ndarray[Any, Any]]:
        """The next generation for ``state``: its table object (written), manifest, table header and rows."""
        m = state.manifest
        assert m.table is not None
        gen = m.generation + 1
        ragged = tuple(n for n, f in (self.schema or m.schema).items() if f.ragged)
        dt = row_dtype(len(ragged))
        if self.overwrite:
            table, header, base = TableState(0, 0, 0, gen), encode_table_header(len(ragged), gen), np.zeros(0, dt)
        else:
            table, header, base = m.table, state.header or encode_table_header(len(ragged), m.table.id), state.rows
        tkey, rows = table.file, base
        if self.shards or self.overwrite:
            new_rows = bytearray()
            for n, sh in zip(self.numbers, self.shards):
                row = encode_row(n, table.records, sh.records, sh.has_ids, [sh.rows[r] for r in ragged], sh.desc_crc)
                new_rows += row
                table = table.after(row, sh.records)
            tkey = f"{TABLE_OBJECTS}/{gen:012d}-{self.token}.tbl"
            self.c.put(tkey, header + base.tobytes() + bytes(new_rows))
            rows = np.concatenate([base, np.frombuffer(bytes(new_rows), dtype=dt)])
            rows.flags.writeable = False
        stats = dict(m.stats)
        add_stats(stats, self.stats)
        new = dataclasses.replace(m, table=TableState(table.rows, table.records, table.crc32, table.id, tkey),
                                  generation=gen, stats=stats)
        if self.overwrite:
            assert self.schema is not None
            new.schema, new.index_runs = self.schema, []
            if self.staged is not None:
                new.id_lookup = str(self.staged["id_lookup"])
                if self.staged.get("metadata") is not None:
                    new.metadata = dict(self.staged["metadata"])
        return tkey, new, header, rows

    def _unplace(self, numbers: Sequence[int]) -> None:
        """Delete shard directories this commit claimed and did not commit (the claims last)."""
        files = [f"{shard_dir_name(n)}/{rel}" for n, sh in zip(numbers, self.shards) for rel in sorted(sh.files)]
        try:
            delete_all(self.c, files, self.workers)
            delete_all(self.c, [f"{shard_dir_name(n)}/{DESCRIPTOR}" for n in numbers], self.workers)
        except BaseException as exc:  # noqa: BLE001 - garbage no reader looks at; the error that got here counts
            log.warning("%s: could not delete the shards this commit claimed (%r)", self.c.url, exc)
