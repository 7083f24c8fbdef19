"""Calls on object storage that the object-store commit target (store/write/objects.py) and its
commit of parts (store/write/remote_commit.py) share: the writing client, quiet and parallel deletes,
one-wave reads, shard-number claims, old shard tables, the parts area's jobs."""

from __future__ import annotations

import concurrent.futures
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ...errors import ConflictError, FormatError, RemoteError, RemoteNotFound, SeqstoreError
from ...format.descriptor import DESCRIPTOR
from ...format.manifest import MANIFEST, PARTS_DIR
from ...format.shard_table import TABLE_OBJECTS, shard_dir_name
from ...io.objects import ObjectClient
from .state import StoreState, read_state
from .target import STAGED

log = logging.getLogger(__name__)

#: Conditional manifest writes a commit tries before it gives up with ConflictError.
MAX_COMMIT_ATTEMPTS = 64
#: Shard numbers a claim tries (each taken one is skipped with one request) before it gives up.
MAX_CLAIMS = 4096
#: Generations of shard-table objects kept (older ones are deleted after a commit).
KEEP_TABLES = 3
_TABLE_GENERATION = re.compile(r"_shards/(\d+)-[A-Za-z0-9]+\.tbl\Z")
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
        if exc.attempts <= 1:
            return False
        try:
            return bytes(client.get(MANIFEST)[0]) == raw
        except RemoteNotFound:
            return False


def delete_store(client: ObjectClient) -> None:
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
    if not state.v3:
        raise FormatError(f"{client.url}: a version-{state.manifest.version} store; parts need a version-3 store "
                          "(one created by this seqstore)")
    return state


def claim(client: ObjectClient, first: int, descs: Sequence[bytes], workers: int) -> list[int]:
    """Claim increasing shard numbers from ``first`` on for the descriptors ``descs`` (in order):
    create-only writes of ``shard-<n>/_shard.json``, a wave at a time. Where a number is taken, the
    claims after it in the wave are given back and the rest tried above it."""
    numbers: list[int] = []
    base = first
    tried = 0
    while len(numbers) < len(descs):
        rest = descs[len(numbers):]
        cand = list(range(base, base + len(rest)))

        def put(i: int, cand: list[int] = cand, rest: Sequence[bytes] = rest) -> bool:
            try:
                client.put(f"{shard_dir_name(cand[i])}/{DESCRIPTOR}", rest[i], mode="create")
                return True
            except ConflictError:
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
    old = []
    for meta in metas:
        g = _TABLE_GENERATION.match(meta.key)
        if g and meta.key != current and int(g.group(1)) <= generation - KEEP_TABLES:
            old.append(meta.key)
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

