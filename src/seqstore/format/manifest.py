"""The manifest: the one small JSON file that says what a store holds.

``manifest.json`` names the format and version, the schema, every committed shard (record count,
rows per ragged field, and size and CRC-32 of every file) and user metadata. Its size is
O(fields x shards), never O(records). A store is written as version 1 unless it needs a version-2 feature
(packed groups, or ``"id_lookup": "last"``); readers accept versions 1 and 2. It is replaced atomically:
written to a temporary file,
fsynced, renamed over the old one, and the directory fsynced.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CorruptionError, FormatError
from ..schema import Schema

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "BASE_VERSION",
    "ID_LOOKUPS",
    "MANIFEST",
    "FileInfo",
    "ShardInfo",
    "IndexRun",
    "Manifest",
]

FORMAT_NAME = "seqstore"
#: The newest format version this seqstore reads and writes.
FORMAT_VERSION = 2
#: The version written for stores that use no version-2 feature (what version-1 readers read).
BASE_VERSION = 1
#: Which record ``index(id)`` returns when an id occurs more than once: the first (default) or the last.
ID_LOOKUPS = ("first", "last")
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class FileInfo:
    """Size in bytes of a data file and the CRC-32 of its data bytes (everything after the header)."""

    bytes: int
    crc32: int


@dataclass(frozen=True)
class ShardInfo:
    """One committed shard: its directory name, record count, rows per ragged field, and files."""

    name: str
    records: int
    rows: dict[str, int]
    files: dict[str, FileInfo]
    has_ids: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "records": self.records,
            "rows": self.rows,
            "has_ids": self.has_ids,
            "files": {k: {"bytes": v.bytes, "crc32": v.crc32} for k, v in self.files.items()},
        }


@dataclass(frozen=True)
class IndexRun:
    """A merged id index over shards ``[first_shard, end_shard)``: files ``<name>.hash.npy`` / ``.rows.npy``."""

    name: str
    first_shard: int
    end_shard: int
    records: int
    level: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "first_shard": self.first_shard,
            "end_shard": self.end_shard,
            "records": self.records,
            "level": self.level,
        }


@dataclass
class Manifest:
    """In-memory form of ``manifest.json``."""

    schema: Schema
    shards: list[ShardInfo] = field(default_factory=list)
    index_runs: list[IndexRun] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    generation: int = 0
    id_lookup: str = "first"

    @property
    def num_records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def version(self) -> int:
        """The lowest format version that describes this store: 2 with packed groups or last-id lookup."""
        return FORMAT_VERSION if self.schema.groups or self.id_lookup != "first" else BASE_VERSION

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": self.version,
            "generation": self.generation,
            "schema": self.schema.to_json(),
            "shards": [s.to_json() for s in self.shards],
            "index_runs": [r.to_json() for r in self.index_runs],
            "metadata": self.metadata,
            "stats": self.stats,
        }
        if self.version >= 2:
            out["id_lookup"] = self.id_lookup
        return out

    # ------------------------------------------------------------------------------------------ read

    @classmethod
    def load(cls, root: str | os.PathLike[str]) -> Manifest:
        """Read and validate ``<root>/manifest.json``.

        Raises FormatError when ``root`` is not a store or is of a newer format version, and
        CorruptionError when the manifest exists but is not valid.
        """
        path = Path(root) / MANIFEST
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            if not Path(root).exists():
                raise FormatError(f"{root}: no such store (directory does not exist)") from None
            raise FormatError(f"{path}: missing; {root} is not a seqstore store") from None
        except OSError as exc:
            raise FormatError(f"{path}: cannot read ({exc})") from exc
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptionError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
            raise FormatError(f"{path}: not a seqstore manifest (expected \"format\": \"{FORMAT_NAME}\")")
        version = obj.get("version")
        if not isinstance(version, int):
            raise CorruptionError(f"{path}: \"version\" must be an integer, got {version!r}")
        if version < 1:
            raise CorruptionError(f"{path}: \"version\" must be a positive integer, got {version}")
        if version > FORMAT_VERSION:
            raise FormatError(
                f"{path}: store format version {version} is newer than this seqstore reads "
                f"(up to {FORMAT_VERSION}); upgrade seqstore"
            )
        try:
            manifest = cls._from_json(obj)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise CorruptionError(f"{path}: malformed manifest ({type(exc).__name__}: {exc})") from exc
        if manifest.version > version:
            raise CorruptionError(
                f"{path}: says version {version} but uses version-{manifest.version} features "
                "(packed groups or \"id_lookup\": \"last\")"
            )
        return manifest

    @classmethod
    def _from_json(cls, obj: dict[str, Any]) -> Manifest:
        schema = Schema.from_json(obj["schema"])
        ragged = [n for n, f in schema.items() if f.ragged]
        shards = []
        for k, s in enumerate(obj["shards"]):
            records = int(s["records"])
            rows = {str(n): int(v) for n, v in s["rows"].items()}
            if records < 0 or any(v < 0 for v in rows.values()) or sorted(rows) != sorted(ragged):
                raise ValueError(f"shard {k} ({s.get('name')!r}): bad record or row counts")
            files = {str(n): FileInfo(int(v["bytes"]), int(v["crc32"])) for n, v in s["files"].items()}
            shards.append(ShardInfo(str(s["name"]), records, rows, files, bool(s["has_ids"])))
        runs = [
            IndexRun(str(r["name"]), int(r["first_shard"]), int(r["end_shard"]), int(r["records"]), int(r["level"]))
            for r in obj.get("index_runs", [])
        ]
        covered = 0
        for r in runs:  # in shard order, non-empty, not overlapping, inside the shard list
            if not covered <= r.first_shard < r.end_shard <= len(shards) or r.records < 0:
                raise ValueError(f"index run {r.name!r} covers shards [{r.first_shard}, {r.end_shard}): "
                                 f"expected ordered, non-overlapping ranges inside [0, {len(shards)})")
            covered = r.end_shard
        metadata = obj.get("metadata", {})
        stats = obj.get("stats", {})
        if not isinstance(metadata, dict) or not isinstance(stats, dict):
            raise ValueError("metadata and stats must be objects")
        id_lookup = obj.get("id_lookup", "first")
        if id_lookup not in ID_LOOKUPS:
            raise ValueError(f"id_lookup must be one of {ID_LOOKUPS}, got {id_lookup!r}")
        return cls(schema, shards, runs, metadata, stats, int(obj.get("generation", 0)), id_lookup)

    # ----------------------------------------------------------------------------------------- write

    def save(self, root: str | os.PathLike[str]) -> None:
        """Replace ``<root>/manifest.json`` atomically and durably."""
        root = Path(root)
        data = json.dumps(self.to_json(), separators=(",", ":")).encode()
        tmp = root / f".{MANIFEST}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / MANIFEST)
        fsync_dir(root)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that renames inside it survive a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
