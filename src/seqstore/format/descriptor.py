"""The shard descriptor of a version-3 store: ``shard-NNNNNN/_shard.json``, written once, never changed.

A writer writes it into its workspace next to the shard's files before the commit renames the
directory into the store. It holds what version 1/2 kept for every shard in ``manifest.json``:
records, rows per ragged field, whether there are ids, and each file's size and CRC-32 of its data.
The shard table row of the shard carries the CRC-32 of the descriptor's bytes, so a reader that
first touches the shard checks the descriptor against the row (format/shard_table.py), and the
files against the descriptor, without ``manifest.json`` growing with the number of shards.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import CorruptionError, open_files_exhausted
from .checksums import CHECKS
from .shard_info import FileInfo, ShardInfo
from .shard_table import ShardRow

__all__ = ["DESCRIPTOR", "DESCRIPTOR_FORMAT", "encode_descriptor", "parse_descriptor", "read_descriptor"]

DESCRIPTOR = "_shard.json"
DESCRIPTOR_FORMAT = "seqstore-shard"


def encode_descriptor(records: int, rows: Mapping[str, int], has_ids: bool, files: Mapping[str, FileInfo],
                      checks: FileInfo | None = None) -> bytes:
    """The descriptor's bytes (compact UTF-8 JSON, files in sorted order). ``checks``: the shard's
    per-record checksum file (:mod:`.checksums`), listed under its own key ``"checks"`` (readers
    before verified reads ignore it)."""
    obj: dict[str, Any] = {
        "format": DESCRIPTOR_FORMAT,
        "records": int(records),
        "rows": {k: int(v) for k, v in rows.items()},
        "has_ids": bool(has_ids),
        "files": {k: {"bytes": files[k].bytes, "crc32": files[k].crc32} for k in sorted(files)},
    }
    if checks is not None:
        obj["checks"] = {CHECKS: {"bytes": checks.bytes, "crc32": checks.crc32}}
    return json.dumps(obj, separators=(",", ":")).encode()


def read_descriptor(shard_dir: Path, row: ShardRow, expected_files: Iterable[str]) -> ShardInfo:
    """Read ``shard_dir/_shard.json`` and check it against its shard table ``row`` (CRC-32 of its
    bytes, records, rows, ids) and the file names the schema implies. Raises CorruptionError naming
    the descriptor and what was expected."""
    path = shard_dir / DESCRIPTOR
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CorruptionError(f"{path}: shard descriptor is missing (the shard table lists {shard_dir.name})") from None
    except OSError as exc:
        raise open_files_exhausted(path, exc) or CorruptionError(
            f"{path}: cannot read the shard descriptor ({exc})"
        ) from exc
    return parse_descriptor(raw, str(path), shard_dir.name, row, expected_files)


def parse_descriptor(raw: bytes, where: str, name: str, row: ShardRow, expected_files: Iterable[str]) -> ShardInfo:
    """Check the bytes ``raw`` of shard ``name``'s descriptor (found at ``where``, a path or URL, for
    messages) against its shard table ``row`` and the file names the schema implies, as
    :func:`read_descriptor` does, and return the shard it describes."""
    crc = zlib.crc32(raw)
    if crc != row.desc_crc:
        raise CorruptionError(
            f"{where}: CRC-32 {crc:#010x} of the descriptor differs from the shard table's {row.desc_crc:#010x} "
            f"({len(raw)} bytes; replaced or damaged?)"
        )
    try:
        obj = json.loads(raw)
        if not isinstance(obj, dict) or obj.get("format") != DESCRIPTOR_FORMAT:
            raise ValueError(f"expected \"format\": \"{DESCRIPTOR_FORMAT}\"")
        records = _count(obj["records"])
        rows = {str(k): _count(v) for k, v in obj["rows"].items()}
        has_ids = obj["has_ids"]
        if not isinstance(has_ids, bool):
            raise ValueError(f"has_ids must be true or false, got {has_ids!r}")
        files = {str(k): FileInfo(_count(v["bytes"]), _count(v["crc32"])) for k, v in obj["files"].items()}
        checks = {str(k): FileInfo(_count(v["bytes"]), _count(v["crc32"])) for k, v in obj.get("checks", {}).items()}
        if set(checks) - {CHECKS}:
            raise ValueError(f"\"checks\" may list only {CHECKS}, got {sorted(checks)}")
    except (KeyError, TypeError, ValueError, AttributeError, UnicodeDecodeError) as exc:
        raise CorruptionError(f"{where}: malformed shard descriptor ({type(exc).__name__}: {exc})") from exc
    except RecursionError:  # (json.loads of [[[...: was a bare RecursionError)
        raise CorruptionError(f"{where}: malformed shard descriptor (arrays or objects nested too deeply to "
                              "parse)") from None
    if (records, rows, has_ids) != (row.records, row.rows, row.has_ids):
        raise CorruptionError(
            f"{where}: describes {records} records, rows {rows}, ids {has_ids}; the shard table says "
            f"{row.records} records, rows {row.rows}, ids {row.has_ids}"
        )
    want = set(expected_files)
    if set(files) != want:
        missing, extra = sorted(want - set(files)), sorted(set(files) - want)
        raise CorruptionError(f"{where}: files listed do not match the schema (missing {missing}, unexpected {extra})")
    # the checksum file joins the shard's files (copied, fetched and verified like them)
    return ShardInfo(name, records, rows, {**files, **checks}, has_ids)


def _count(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"expected a non-negative integer, got {v!r}")
    return v
