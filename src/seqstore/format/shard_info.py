"""What the format records about one committed shard and its files (shared by every format version)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FileInfo", "ShardInfo"]


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
