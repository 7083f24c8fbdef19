"""The commit-target interface: where a writer's finished shards go and how they become visible.

A writer (:class:`~seqstore.store.write.writer.Writer`, :class:`~seqstore.store.write.parts.PartWriter`)
always builds its shards in a local directory; committing them is the target's business:
store/write/local.py (a directory) or store/write/objects.py (object storage), picked by
:func:`~seqstore.store.write.api.open_target`. Also the values both share: :class:`Part`, and the
checks of names and schemas.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import re
import shutil
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CorruptionError, FormatError, RemoteError, SchemaError, SeqstoreError
from ...format.manifest import ID_LOOKUPS, Manifest, ShardInfo
from ...format.npy import HEADER_BYTES, encode_header
from ...format.shard_table import TableState
from ...schema import Schema

__all__ = ["CommitTarget", "Finished", "IdsMismatch", "Part", "PartOver", "PartShard", "Start"]

#: The schema (and metadata) a ``mode="overwrite"`` job's commit installs (``_parts/.staged.json``).
STAGED = ".staged.json"
PART_FILE = "part.json"
COMMITTED_FILE = "committed.json"
OWNER = "owner.lock"
MODES = ("create", "append", "overwrite")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._=-]{0,199}\Z")
_SHARD_DIR = re.compile(r"p[0-9]{6,}\Z")


class IdsMismatch(Exception):
    """The store's shards were committed with (or without) ids and this shard is the other kind."""

    def __init__(self, has_ids: bool) -> None:
        super().__init__(has_ids)
        self.has_ids = has_ids


class PartOver(SeqstoreError):
    """A part writer's job was committed or discarded while it wrote: the part is over, and no retry
    (of the upload, of ``finish()``) can help; the writer takes nothing more."""


class NotCommitted(Exception):
    """A commit step failed after the target had moved the finished shard and nothing was committed: the
    shard is back where it was, so the writer stays usable and commits it again. ``error``: what failed."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error

    def take(self) -> BaseException:
        """The error, with this exception's own links to it dropped: raised while this one is handled, the
        error's ``__context__`` is this exception, and a link back would be a reference cycle keeping the failed
        step's frames (and the files they hold open) until the cyclic GC runs."""
        error = self.error
        self.args, self.__cause__, self.__context__ = (), None, None
        del self.error
        return error


@dataclasses.dataclass
class Start:
    """What a writer starts from: the schema it writes, the store's ``id_lookup``, the records committed
    before it (for record numbers in messages), whether those have ids (None: no shard yet), whether
    shards carry a descriptor (version 3), the local directory its shards are built in (``workspace``,
    flocked through ``owner_fd``) and the directory that counts as its root (the store, or a staging copy)."""

    schema: Schema
    id_lookup: str
    records: int
    has_ids: bool | None
    descriptors: bool
    root: Path
    workspace: Path
    owner_fd: int


@dataclasses.dataclass(frozen=True)
class Finished:
    """A finished shard waiting for its commit: its local directory, description and descriptor CRC-32."""

    path: Path
    info: ShardInfo
    desc_crc: int


class CommitTarget(ABC):
    """Where a writer's finished shards are committed (see the module docs). ``where`` names the store
    (its path or URL) in messages; ``conflicts``/``renumbered`` count the commits a writer lost to
    another writer and retried, and the shards it had to move to a higher number (object storage)."""

    where: str
    kind = ""  #: "Remote" for object storage (in writers' reprs)
    conflicts: int = 0
    renumbered: int = 0

    # ---------------------------------------------------------------------------------- the store

    @abstractmethod
    def objects(self) -> Any:
        """An object client on the store (a :class:`~seqstore.store.write.state.LocalObjects`
        for a directory): what ``seqstore copy`` reads and writes through."""

    @abstractmethod
    def read_manifest(self) -> Manifest | None:
        """The store's manifest, or None when there is no store (a half-done commit of parts is
        finished or undone first, locally)."""

    @abstractmethod
    def create(self, manifest: Manifest, *, overwrite: bool) -> None:
        """Make a new store with ``manifest``; an existing one is FileExistsError unless ``overwrite``."""

    @abstractmethod
    def install(self, manifest: Manifest, *, strict: bool = False) -> bool:
        """Create the store with ``manifest`` unless one is there (exactly one of several processes doing
        this at once succeeds); whether this call created it. ``strict``: refuse anything at the path
        that is not a store."""

    def install_for_writer(self, manifest: Manifest) -> bool:
        """:meth:`install` for a writer that opens next (``open_or_create``): what that writer needs that can
        fail is made before the store (object storage: its staging directory)."""
        return self.install(manifest)

    @abstractmethod
    def delete_store(self) -> None:
        """Delete the store (its manifest first); refuses what is not a store."""

    def remove_if_empty(self) -> bool:
        """Delete the store if it has no committed shard and no job has anything in its parts area; whether
        it was deleted (False also where there is no store, or it cannot be read)."""
        try:
            manifest = self.read_manifest()
        except (SeqstoreError, RemoteError):
            return False
        if manifest is None or manifest.num_shards or self.pending_jobs():
            return False
        self.delete_store()
        return True

    # --------------------------------------------------------------------------- one writer

    @abstractmethod
    def open_writer(self) -> Start:
        """Lock or read the store's state and make the writer's local workspace."""

    @abstractmethod
    def publish(self, shard: Finished | None, stats: Mapping[str, float]) -> str:
        """Commit the finished shard (None: only the ``stats`` deltas) with one manifest replacement and
        return its directory name. Raises :class:`IdsMismatch` when the store's shards are of the other
        kind (``shard`` is left where it is)."""

    def close_writer(self, start: Start) -> None:
        """Remove the writer's workspace (and staging directory) and release its lock."""
        shutil.rmtree(start.workspace, ignore_errors=True)
        os.close(start.owner_fd)

    # ------------------------------------------------------------------------------- the parts

    @abstractmethod
    def open_part(self, job: str, task: str) -> Start:
        """Make the workspace of task attempt ``task`` of ``job`` (refusing one that finished or is live)."""

    @abstractmethod
    def stage_shard(self, start: Start, current: Path, shard: PartShard) -> None:
        """A part's shard is finished in the local directory ``current``: keep it in the part as
        ``shard.dir`` (moved into the part's directory, or uploaded into its staging prefix)."""

    @abstractmethod
    def finish_part(self, start: Start, part: Part) -> None:
        """Record ``part`` as finished (``part.json``, written last)."""

    @abstractmethod
    def close_part(self, start: Start, part: Part | None) -> None:
        """Release a part writer; without a finished ``part``, delete what the attempt staged."""

    @abstractmethod
    def staged(self) -> dict[str, Any] | None:
        """The schema/metadata an overwrite job staged (``_parts/.staged.json``), if any."""

    @abstractmethod
    def set_staged(self, staged: Mapping[str, Any] | None) -> None:
        """Stage settings for an overwrite job's commit (None: remove staged ones)."""

    @abstractmethod
    def commit_parts(self, plist: list[Part], overwrite: bool) -> int:
        """Commit every shard of ``plist`` in order with one manifest commit; the records committed."""

    @abstractmethod
    def discard_jobs(self, jobs: Iterable[str]) -> None:
        """Delete the parts area of each job (what no live writer holds)."""

    @abstractmethod
    def pending_jobs(self) -> list[str]:
        """The jobs with something in the parts area."""

    @abstractmethod
    def clean_parts(self, older_than: float) -> list[str]:
        """Discard jobs untouched for ``older_than`` seconds; the jobs removed."""


# ------------------------------------------------------------------------------------ schemas


def new_manifest(sch: Schema, metadata: Mapping[str, Any] | None, id_lookup: str) -> Manifest:
    """The manifest of a new, empty store: version 3 (a shard table with no rows yet)."""
    return Manifest(sch, metadata=checked_metadata(metadata), id_lookup=id_lookup, table=TableState(0, 0, 0))


def checked_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """A store's ``metadata`` as the manifest keeps it (a JSON object): TypeError naming the key whose
    value JSON cannot hold, or a key that is not a str, before anything is made."""
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict of str -> JSON values, got {type(metadata).__name__}")
    out = dict(metadata or {})
    for key, value in out.items():
        if not isinstance(key, str):
            raise TypeError(f"metadata key {key!r} ({type(key).__name__}) must be a str")
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"metadata {key!r}: JSON cannot hold its value ({exc}); give str, int, float, bool, "
                            "None, and lists and dicts of them") from None
    return out


def checked_schema(
    schema: Mapping[str, Any] | Schema, packed: Mapping[str, Sequence[str]] | None, id_lookup: str
) -> Schema:
    if id_lookup not in ID_LOOKUPS:
        raise ValueError(f"id_lookup must be one of {ID_LOOKUPS}, got {id_lookup!r}")
    sch = Schema(schema, packed=packed) if packed is not None or not isinstance(schema, Schema) else schema
    for name, f in sch.storage_units():
        try:  # the file's header must fit its final row count, whatever it becomes
            encode_header(f.storage_dtype, (1 << 62, *f.inner_shape))
        except ValueError:
            raise SchemaError(
                f"field {name!r}: shape {f.shape} has too many dimensions for a {HEADER_BYTES}-byte .npy header"
            ) from None
    return sch


def check_v3(where: str, manifest: Manifest) -> None:
    """Parts need a version-3 store."""
    if manifest.table is None:
        raise FormatError(
            f"{where}: a version-{manifest.version} store; parts need a version-3 store (one created by this "
            "seqstore). Convert it or write a new store."
        )


def check_parts_kinds(where: str, kinds: set[bool], store_has_ids: bool | None) -> None:
    """The parts' shards must all have ids or all have none, and be the kind of the store's shards."""
    if len(kinds) > 1:
        raise SchemaError(f"{where}: the parts mix records with and without ids; a store holds one kind")
    if kinds and store_has_ids is not None and kinds != {store_has_ids}:
        want = "with" if store_has_ids else "without"
        raise SchemaError(f"{where}: the store's records are written {want} ids; the parts' are the other kind")


def stats_number(key: str, value: Any) -> int | float:
    """A stats delta as a JSON number: any finite real number (NumPy's too, as a sum of a column gives),
    not a bool (TypeError naming the key otherwise: a NaN or inf would stick in the stat for good). The key
    must be a str (a JSON object's key: another type could not be saved, or an int would be saved as its
    string and then written twice)."""
    if not isinstance(key, str):
        raise TypeError(f"stats key {key!r} ({type(key).__name__}) must be a str")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"stats delta {key!r} must be a finite int or float, got {value!r}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def add_stats(stats: dict[str, Any], delta: Mapping[str, float]) -> None:
    """``stats[k] += v`` for the deltas (a stat that is not a number counts as 0)."""
    for k, v in delta.items():
        old = stats.get(k, 0)
        stats[k] = (old if isinstance(old, (int, float)) else 0) + v


def check_part(where: str, part: Part, schema: Schema, done: bytes | None, found: bool, listed: Any,
               descs: Sequence[tuple[str, bytes | None]]) -> None:
    """The checks before ``part`` is committed: not committed before (``done``: its ``committed.json``),
    finished (``found``: its ``part.json`` is there; ``listed``: that file's object, compared with the
    part unless None), written with ``schema``, and each shard's descriptor (name, bytes) present
    with the CRC-32 the part records."""
    if done is not None:
        gen = json.loads(done).get("generation")
        raise SeqstoreError(f"{where}: already committed (manifest generation {gen}); nothing was committed")
    if not found:
        raise SeqstoreError(f"{where}: not there (never finished, discarded, or written to another store); nothing "
                            "was committed")
    if listed is not None and listed != part.to_json():
        raise SeqstoreError(f"{where}: its part.json differs from the part given; nothing was committed")
    if part.schema_crc != schema_crc(schema):
        raise SchemaError(f"{where}: written with another schema than the store's ({schema!r}); nothing was "
                          "committed")
    for sh, (name, raw) in zip(part.shards, descs):
        if raw is None:
            raise SeqstoreError(f"{where}: shard {name} is missing; nothing was committed")
        if zlib.crc32(raw) != sh.desc_crc:
            raise CorruptionError(f"{name}: CRC-32 differs from the part's description; nothing was committed")


def schema_crc(schema: Schema) -> int:
    return zlib.crc32(json.dumps(schema.to_json(), sort_keys=True).encode())


def check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(
            f"{what} must be 1-200 characters of letters, digits, '_', '-', '.', '=' not starting with '.' or '-' "
            f"(it names a directory), got {value!r}"
        )
    return value


# -------------------------------------------------------------------------------------- parts


@dataclasses.dataclass(frozen=True)
class PartShard:
    """One finished shard of a part: its directory in the part (``p000000``), records, rows per ragged
    field, whether it has ids, ``files`` (relative path -> (bytes, CRC-32 of the data bytes)) and the
    CRC-32 of its descriptor ``_shard.json`` (checked by :func:`commit_parts`)."""

    dir: str
    records: int
    rows: dict[str, int]
    has_ids: bool
    files: dict[str, tuple[int, int]]
    desc_crc: int

    def to_json(self) -> dict[str, Any]:
        return {
            "dir": self.dir, "records": self.records, "rows": dict(self.rows), "has_ids": self.has_ids,
            "files": {k: [b, c] for k, (b, c) in self.files.items()}, "desc_crc": self.desc_crc,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PartShard:
        return cls(str(obj["dir"]), int(obj["records"]), {str(k): int(v) for k, v in obj["rows"].items()},
                   bool(obj["has_ids"]), {str(k): (int(v[0]), int(v[1])) for k, v in obj["files"].items()},
                   int(obj["desc_crc"]))


@dataclasses.dataclass(frozen=True)
class Part:
    """What :meth:`PartWriter.finish` returns and :func:`commit_parts` takes: the job and task attempt
    it belongs to, its records and its finished shards (O(shards x files) small values), and the
    CRC-32 of the schema it was written with. Picklable; :meth:`to_json` / :meth:`from_json` give a
    JSON object (``commit_parts`` and ``discard_parts`` also take those objects as they are)."""

    job: str
    task: str
    records: int
    shards: tuple[PartShard, ...]
    schema_crc: int

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "task": self.task, "records": self.records,
                "shards": [s.to_json() for s in self.shards], "schema_crc": self.schema_crc}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Part:
        try:
            return cls(check_name(obj["job"], "job"), check_name(obj["task"], "task"), int(obj["records"]),
                       tuple(PartShard.from_json(s) for s in obj["shards"]), int(obj["schema_crc"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a part description ({type(exc).__name__}: {exc}): {obj!r:.200}") from exc


def as_part(p: Part | Mapping[str, Any]) -> Part:
    """``p`` as a Part, its names checked (they become paths: a part from JSON must not point elsewhere)."""
    if isinstance(p, Part):
        check_name(p.job, "job")
        check_name(p.task, "task")
        for sh in p.shards:
            if not isinstance(sh.dir, str) or not _SHARD_DIR.match(sh.dir):
                raise ValueError(f"part {p.job}/{p.task}: shard directory {sh.dir!r} is not p<number>")
        return p
    if isinstance(p, Mapping):
        return as_part(Part.from_json(p))
    raise TypeError(f"expected a Part (or its to_json() object), got {type(p).__name__}")
