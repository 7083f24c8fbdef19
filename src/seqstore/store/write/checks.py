"""A finished shard's per-record checksums (``_checks.npy``, :mod:`seqstore.format.checksums`), written
next to its files before the commit: what ``seqstore.open(..., verify_reads=True)`` checks reads against."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ...format.checksums import CHECKS, encode_checks, shard_checks
from ...format.shard_info import FileInfo
from ...schema import Schema
from .columns import write_file

__all__ = ["write_checks"]


def write_checks(shard_dir: Path, schema: Schema, records: int, rows: Mapping[str, int], has_ids: bool) -> FileInfo:
    """Hash every record of the finished shard in ``shard_dir`` (its files, read back once), write
    ``_checks.npy`` there (fsynced) and return its size and CRC-32 for the descriptor."""
    raw, info = encode_checks(shard_checks(shard_dir, schema, records, rows, has_ids))
    write_file(shard_dir / CHECKS, raw)
    return info
