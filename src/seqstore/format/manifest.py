"""The manifest: the one small JSON file that says what a store holds.

``manifest.json`` names the format and version, the schema, the committed shards and user metadata.
In versions 1 and 2 it lists every shard (record count, rows per ragged field, size and CRC-32 of
every file): O(fields x shards). Version 3 (what :func:`seqstore.create` writes) keeps it O(1): it
names how many rows of the binary shard table ``_shards.tbl`` are committed (format/shard_table.py),
and each shard's files are described by the shard's own immutable ``_shard.json``
(format/descriptor.py), read on the shard's first touch. Readers accept versions 1 to 3; a store
keeps the version it was created with. The manifest is replaced atomically: written to a temporary
file, fsynced, renamed over the old one, and the directory fsynced.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, overload

from ..errors import CorruptionError, FormatError
from ..schema import Schema
from .checksums import CHECKS
from .descriptor import read_descriptor
from .shard_info import FileInfo, ShardInfo
from .shard_table import TABLE, MapFile, ShardTable, TableState, is_table_file

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "BASE_VERSION", "ID_LOOKUPS", "MANIFEST", "TABLE_VERSION", "FileInfo",
           "ShardInfo", "ShardList", "IndexRun", "Manifest", "IDS", "IDS_FILES", "WORK_DIR", "PARTS_DIR",
           "COMMIT_JOURNAL"]

FORMAT_NAME = "seqstore"
#: The newest format version this seqstore reads and writes.
FORMAT_VERSION = 3
#: The lowest version of a store with a JSON shard list (1 unless it uses a version-2 feature).
BASE_VERSION = 1
#: The version of stores with a shard table (what new stores are created as).
TABLE_VERSION = 3
#: The name stem of a shard's id files (a shard whose records have ids), and those files.
IDS = "_ids"
IDS_FILES = ("_ids.npy", "_ids.offsets.npy", "_ids.hash.npy", "_ids.hash_rows.npy")
#: Which record ``index(id)`` returns when an id occurs more than once: the first (default) or the last.
ID_LOOKUPS = ("first", "last")
MANIFEST = "manifest.json"
#: Version 3: the directory of writers' workspaces and temporary manifests (versions 1/2 keep them at
#: the top of the store as ``_tmp-*`` and ``.manifest.json.tmp-*``), so a writer finds what dead
#: writers left without listing the store's (possibly 10^5) shard directories.
WORK_DIR = "_tmp"
#: Version 3: the parts area of distributed writes (store/parts.py): ``_parts/<job>/<task>/``.
PARTS_DIR = "_parts"
#: The journal of a commit of parts in progress, in ``_parts/``.
COMMIT_JOURNAL = ".commit.json"
_SHARD_NAME = re.compile(r"shard-([0-9]{6,})")
#: A merged index run's name: a file stem in ``_index/`` (``_index/run-AAAAAA-BBBBBB``, with a tag).
_RUN_NAME = re.compile(r"_index/[A-Za-z0-9_-][A-Za-z0-9_.-]*")


class ShardList(Sequence[ShardInfo]):
    """The shards of a version-3 manifest: ``len`` and numpy columns from the mapped shard table, and a
    :class:`ShardInfo` built on demand by ``[k]`` from row ``k`` and the shard's descriptor (both
    checked). Holds no per-shard Python object, so it costs O(1) to make however many shards there are.
    """

    def __init__(self, root: Path, table: ShardTable, expected_files: tuple[str, ...], with_ids: tuple[str, ...]):
        self.root = root
        self.table = table
        self._files = expected_files
        self._ids = with_ids

    def __len__(self) -> int:
        return len(self.table)

    @overload
    def __getitem__(self, k: int) -> ShardInfo: ...

    @overload
    def __getitem__(self, k: slice) -> Sequence[ShardInfo]: ...

    def __getitem__(self, k: int | slice) -> ShardInfo | Sequence[ShardInfo]:
        if isinstance(k, slice):
            start, stop, step = k.indices(len(self))
            if start == 0 and step == 1:
                return ShardList(self.root, self.table.prefix(stop), self._files, self._ids)
            return [self[j] for j in range(start, stop, step)]
        n = len(self)
        j = k + n if k < 0 else k
        if not 0 <= j < n:
            raise IndexError(f"shard {k} out of range for {n} shards")
        row = self.table.row(j)
        expected = self._files + (self._ids if row.has_ids else ())
        return read_descriptor(self.root / row.name, row, expected)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardList):
            return self.root == other.root and len(self) == len(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"ShardList({str(self.root)!r}, shards={len(self)})"


@dataclass(frozen=True)
class IndexRun:
    """A merged id index over shards ``[first_shard, end_shard)``: files ``<name>.hash.npy`` / ``.rows.npy``."""

    name: str
    first_shard: int
    end_shard: int
    records: int
    level: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Manifest:
    """In-memory form of ``manifest.json``."""

    schema: Schema
    #: A list of ShardInfo (versions 1 and 2) or a lazy :class:`ShardList` (version 3).
    shards: Sequence[ShardInfo] = field(default_factory=list)
    index_runs: list[IndexRun] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    generation: int = 0
    id_lookup: str = "first"
    #: Version 3: what the manifest says about the shard table (None: a version-1/2 shard list).
    table: TableState | None = None

    @property
    def num_records(self) -> int:
        if self.table is not None:
            return self.table.records
        return sum(s.records for s in self.shards)

    @property
    def num_shards(self) -> int:
        return self.table.rows if self.table is not None else len(self.shards)

    @property
    def version(self) -> int:
        """3 with a shard table; else the lowest version that describes the store (2 with packed
        groups or last-id lookup, else 1)."""
        if self.table is not None:
            return TABLE_VERSION
        return 2 if self.schema.groups or self.id_lookup != "first" else BASE_VERSION

    @property
    def ragged(self) -> tuple[str, ...]:
        """Ragged field names in schema order (the shard table's ``rows`` columns)."""
        return tuple(n for n, f in self.schema.items() if f.ragged)

    def shard_table(self) -> ShardTable:
        """The shards as numpy columns: the mapped table of a version-3 store (O(1)); for a version
        1/2 shard list, a table built from it in memory (O(shards), like the list itself)."""
        if isinstance(self.shards, ShardList):
            return self.shards.table
        return ShardTable.from_shards(self.shards, self.ragged)

    @property
    def has_ids(self) -> bool:
        """Whether the records have ids (False while there are no shards)."""
        if isinstance(self.shards, ShardList):
            return self.shards.table.has_ids
        return bool(self.shards) and self.shards[0].has_ids

    def total_rows(self, name: str) -> int:
        """Rows of ragged field ``name`` in all shards."""
        if isinstance(self.shards, ShardList):
            return self.shards.table.rows_total(name)
        return sum(int(s.rows[name]) for s in self.shards)

    def data_bytes(self) -> int:
        """Bytes of the records' values and offsets in all shards (ids and checksums left out): what an
        epoch over every record reads. From the schema and the shard table's totals (O(shards), in C)."""
        n, total = self.num_records, 0
        for name, f in self.schema.storage_units():
            if f.ragged:
                total += self.total_rows(name) * f.row_bytes + 8 * (n + self.num_shards)
            else:
                total += n * f.row_bytes
        return total

    def data_files(self) -> tuple[str, ...]:
        """The files every shard has whatever its ids (relative paths): one per unpacked field and packed
        group, plus the offsets of ragged fields."""
        units = self.schema.storage_units()
        return tuple(sorted({f"{n}.npy" for n, _ in units} | {f"{n}.offsets.npy" for n, f in units if f.ragged}))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": self.version,
            "generation": self.generation,
            "schema": self.schema.to_json(),
        }
        if self.table is not None:
            out["shard_table"] = self.table.to_json()
        else:
            out["shards"] = [s.to_json() for s in self.shards]
        out.update(index_runs=[r.to_json() for r in self.index_runs], metadata=self.metadata, stats=self.stats)
        if self.version >= 2:
            out["id_lookup"] = self.id_lookup
        return out

    # ------------------------------------------------------------------------------------------ read

    @classmethod
    def load(cls, root: str | os.PathLike[str], *, map_file: MapFile | None = None, _retries: int = 400) -> Manifest:
        """Read and validate ``<root>/manifest.json`` (version 3: and map the shard table's committed
        rows, with ``map_file`` if given; see :meth:`ShardTable.open`).

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
        manifest = cls.parse(raw, str(path))
        if manifest.table is not None:  # map the committed rows of the shard table: O(1)
            try:
                table = ShardTable.open(Path(root), manifest.ragged, manifest.table, map_file)
            except CorruptionError:
                # an overwrite of all shards (store/parts.py) renames a new table into place just before
                # it replaces manifest.json: when the manifest changed since it was read, read both again
                # (or just before: wait while its journal says the commit is in progress, up to ~2 s)
                for wait in range(_retries):
                    if _read_or_none(path) not in (None, raw):
                        return cls.load(root, map_file=map_file, _retries=_retries - wait - 1)
                    if not (Path(root) / PARTS_DIR / COMMIT_JOURNAL).exists():
                        break
                    time.sleep(0.005)
                raise
            manifest.shards = ShardList(Path(root), table, manifest.data_files(), IDS_FILES)
        return manifest

    @classmethod
    def parse(cls, raw: bytes, where: str) -> Manifest:
        """Validate and parse the bytes of a ``manifest.json`` found at ``where`` (a path or URL, for
        messages) without opening its shard table (a version-3 result's ``shards`` are empty until
        :meth:`load` maps the table). FormatError: not a manifest, or a newer format version;
        CorruptionError: not valid."""
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptionError(f"{where}: not valid JSON ({exc})") from exc
        except RecursionError:  # ([[[... deeper than the parser's recursion goes: was a bare RecursionError)
            raise CorruptionError(f"{where}: not valid JSON (arrays or objects nested too deeply to parse)") from None
        if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
            raise FormatError(f"{where}: not a seqstore manifest (expected \"format\": \"{FORMAT_NAME}\")")
        version = obj.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise CorruptionError(f"{where}: \"version\" must be a positive integer, got {version!r}")
        if version > FORMAT_VERSION:
            raise FormatError(f"{where}: store format version {version} is newer than this seqstore reads "
                              f"(up to {FORMAT_VERSION}); upgrade seqstore")
        try:
            manifest = cls._from_json(obj, version)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise CorruptionError(f"{where}: malformed manifest ({type(exc).__name__}: {exc})") from exc
        if manifest.version > version:
            raise CorruptionError(f"{where}: says version {version} but uses version-{manifest.version} features "
                                  "(packed groups or \"id_lookup\": \"last\")")
        return manifest

    @classmethod
    def _from_json(cls, obj: dict[str, Any], version: int) -> Manifest:
        schema = Schema.from_json(obj["schema"])
        ragged = [n for n, f in schema.items() if f.ragged]
        shards: list[ShardInfo] = []
        table: TableState | None = None
        if version >= TABLE_VERSION:
            t = obj["shard_table"]
            if not isinstance(t, dict) or not isinstance(t.get("file"), str) or not is_table_file(t["file"]):
                raise ValueError(f"shard_table must be an object naming \"file\": \"{TABLE}\" or "
                                 f"\"_shards/<name>.tbl\", got {t!r}")
            vals = [t["rows"], t["records"], t["crc32"]]
            if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in vals) or vals[2] >= 1 << 32:
                raise ValueError(f"shard_table rows, records and crc32 must be non-negative integers, got {vals}")
            table_id = t.get("id", 0)
            if not isinstance(table_id, int) or isinstance(table_id, bool) or not 0 <= table_id < 1 << 64:
                raise ValueError(f"shard_table id must be an integer in [0, 2**64), got {table_id!r}")
            table = TableState(vals[0], vals[1], vals[2], table_id, t["file"])
        number = -1
        data_files = {f"{n}.npy" for n, _ in schema.storage_units()} | {f"{n}.offsets.npy" for n in ragged}
        for k, s in enumerate(obj["shards"] if table is None else []):
            records = _count(s["records"], f"shard {k} records")
            rows = {str(n): _count(v, f"shard {k} rows of {n!r}") for n, v in s["rows"].items()}
            if sorted(rows) != sorted(ragged):
                raise ValueError(f"shard {k} ({s.get('name')!r}): bad record or row counts")
            name, has_ids = s["name"], s["has_ids"]
            # (a directory of this store: shard-NNNNNN, numbers increasing; every shard has ids or none)
            m = _SHARD_NAME.fullmatch(name) if isinstance(name, str) else None
            if m is None or int(m[1]) <= number or int(m[1]) >= 1 << 63:  # (the table's int64 number column)
                raise ValueError(f"shard {k}: name {name!r}, expected shard-NNNNNN (6+ digits) numbered above the "
                                 "shard before and below 2**63")
            number = int(m[1])
            if not isinstance(has_ids, bool) or (shards and has_ids != shards[0].has_ids):
                raise ValueError(f"shard {k} ({name!r}): has_ids {has_ids!r}, expected true or false as shard 0 says")
            files = {str(n): FileInfo(_count(v["bytes"], f"shard {k} file {n!r} bytes"),
                                      _count(v["crc32"], f"shard {k} file {n!r} crc32")) for n, v in s["files"].items()}
            extra = set(files) - data_files - {CHECKS, *(IDS_FILES if has_ids else ())}
            if extra:  # (a name such as ../x would be read, verified and copied outside the store)
                raise ValueError(f"shard {k} ({name!r}): files {sorted(extra)} are not files of the schema")
            if any(f.bytes < 0 or not 0 <= f.crc32 < 1 << 32 for f in files.values()):
                raise ValueError(f"shard {k} ({name!r}): file sizes and CRC-32s must be non-negative 32-bit integers")
            shards.append(ShardInfo(name, records, rows, files, has_ids))
        runs = [
            IndexRun(str(r["name"]), *(_count(r[key], f"index run {r['name']!r} {key}")
                                       for key in ("first_shard", "end_shard", "records", "level")))
            for r in obj.get("index_runs", [])
        ]
        covered = 0
        count = table.rows if table is not None else len(shards)
        for r in runs:  # in shard order, non-empty, not overlapping, inside the shard list
            if not _RUN_NAME.fullmatch(r.name) or ".." in r.name:  # (its files are read, verified and copied)
                raise ValueError(f"index run name {r.name!r}: expected _index/<name> (a file stem in _index/)")
            if not covered <= r.first_shard < r.end_shard <= count or r.records < 0:
                raise ValueError(f"index run {r.name!r} covers shards [{r.first_shard}, {r.end_shard}): "
                                 f"expected ordered, non-overlapping ranges inside [0, {count})")
            covered = r.end_shard
        metadata = obj.get("metadata", {})
        stats = obj.get("stats", {})
        if not isinstance(metadata, dict) or not isinstance(stats, dict):
            raise ValueError("metadata and stats must be objects")
        id_lookup = obj.get("id_lookup", "first")
        if id_lookup not in ID_LOOKUPS:
            raise ValueError(f"id_lookup must be one of {ID_LOOKUPS}, got {id_lookup!r}")
        generation = _count(obj.get("generation", 0), "generation")
        return cls(schema, shards, runs, metadata, stats, generation, id_lookup, table)

    # ----------------------------------------------------------------------------------------- write

    def save(self, root: str | os.PathLike[str]) -> None:
        """Replace ``<root>/manifest.json`` atomically and durably. The temporary file is written in
        ``<root>/_tmp/`` when a version-3 store has that directory, else next to the manifest."""
        root = Path(root)
        data = json.dumps(self.to_json(), separators=(",", ":")).encode()
        work = root / WORK_DIR
        tmp = (work if self.table is not None and work.is_dir() else root) / f".{MANIFEST}.tmp-{os.getpid()}"
        f = open(tmp, "wb")  # (not in the try: a file in the way is not ours to remove)
        try:
            with f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, root / MANIFEST)
        except BaseException:  # (a full disk, an interrupt: the file it wrote stayed beside the manifest)
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(root)


def _count(value: Any, what: str) -> int:
    """``value`` if it is a non-negative JSON integer, else ValueError naming ``what`` (``int()`` read
    2.9 as 2, "448" as 448 and true as 1)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return value


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that renames inside it survive a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
