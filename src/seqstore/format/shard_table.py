"""The shard table of a version-3 store: one fixed-size binary row per committed shard.

``_shards.tbl`` is a 64-byte header followed by rows of :func:`row_dtype`; each commit writes one
row at ``HEADER + committed_rows * row_bytes`` and fsyncs, before the manifest that counts it is
saved. ``manifest.json`` says how many rows are committed (``rows``), how many records they hold
and the CRC-32 of their bytes, so bytes past the committed rows (a torn append of a writer that
died) are never read and the next commit overwrites them. Every row carries its own CRC-32 and the
CRC-32 of the shard's descriptor file (format/descriptor.py).

A reader maps the committed prefix read-only and uses its columns as numpy views: opening costs
O(1) whatever the number of shards, locating a record is a binary search over the ``start`` column,
and a row is checked (its CRC, and that it continues the row before it) when its shard is first
touched. :meth:`ShardTable.from_shards` builds the same columns in memory for a version-1/2 manifest.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptionError

__all__ = ["TABLE", "TABLE_OBJECTS", "TABLE_HEADER_BYTES", "TABLE_MAGIC", "FLAG_IDS", "MapFile", "TableState",
           "ShardRow", "ShardTable", "row_dtype", "encode_table_header", "encode_row", "is_table_file",
           "shard_dir_name"]

TABLE = "_shards.tbl"
#: Where a store on object storage keeps its immutable, generation-specific tables.
TABLE_OBJECTS = "_shards"
_TABLE_OBJECT = re.compile(r"_shards/[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.tbl\Z")
TABLE_MAGIC = b"SEQSHTBL"
TABLE_HEADER_BYTES = 64
#: Version of the table's own layout (header field); readers refuse any other.
TABLE_LAYOUT = 1
#: Row flag: the shard's records have ids (``_ids*`` files). All rows of a table agree.
FLAG_IDS = 1
_HEADER = struct.Struct("<8sIII")  # magic, layout version, row bytes, ragged fields
_ID_OFFSET = 24  # uint64 table id (see TableState.id)
#: Maps the first ``size`` bytes of a file read-only, returning a buffer (see ShardTable.open).
MapFile = Callable[[Path, int], Any]


def _map_prefix(path: Path, size: int) -> mmap.mmap:
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)


def is_table_file(name: str) -> bool:
    """Whether ``name`` may be a manifest's ``shard_table.file``: ``_shards.tbl``, or an immutable table
    object ``_shards/<name>.tbl`` (a store on object storage; docs/format.md section 2.4)."""
    return name == TABLE or bool(_TABLE_OBJECT.match(name))


def row_dtype(ragged: int) -> np.dtype[Any]:
    """The row layout for a schema with ``ragged`` ragged fields: ``40 + 8 * ragged`` bytes."""
    return np.dtype(
        [
            ("number", "<i8"),
            ("start", "<i8"),
            ("records", "<i8"),
            ("flags", "<i8"),
            ("rows", "<i8", (ragged,)),
            ("desc_crc", "<u4"),
            ("row_crc", "<u4"),
        ]
    )


def shard_dir_name(number: int) -> str:
    """Directory of shard number ``number``: ``shard-NNNNNN`` (at least 6 digits)."""
    return f"shard-{number:06d}"


def encode_table_header(ragged: int, table_id: int = 0) -> bytes:
    """The 64-byte header of a table whose rows have ``ragged`` ragged-row columns, with id ``table_id``."""
    head = _HEADER.pack(TABLE_MAGIC, TABLE_LAYOUT, row_dtype(ragged).itemsize, ragged)
    head += bytes(_ID_OFFSET - len(head)) + struct.pack("<Q", table_id)
    return head + bytes(TABLE_HEADER_BYTES - len(head))


def encode_row(number: int, start: int, records: int, has_ids: bool, rows: Sequence[int], desc_crc: int) -> bytes:
    """One row's bytes; its last 4 bytes are the CRC-32 of the bytes before them."""
    body = struct.pack(f"<4q{len(rows)}qI", number, start, records, FLAG_IDS if has_ids else 0, *rows, desc_crc)
    return body + struct.pack("<I", zlib.crc32(body))


def _bodies_crc(rows: np.ndarray[Any, Any], a: int, b: int, crc: int = 0) -> int:
    """CRC-32 (continuing ``crc``) of rows ``a .. b-1`` without their last 4 bytes (``row_crc``)."""
    if b <= a:
        return crc
    raw = rows[a:b].view(np.uint8).reshape(b - a, rows.dtype.itemsize)[:, :-4]
    return zlib.crc32(np.ascontiguousarray(raw).data, crc)


@dataclass(frozen=True)
class TableState:
    """What ``manifest.json`` says about the shard table: committed rows, their records, their CRC-32."""

    rows: int
    records: int
    crc32: int
    #: The table file's id (header bytes 24-31): 0 for a table that only ever grew; a commit that
    #: replaces the whole table (an overwrite, store/parts.py) writes a new file with a new id, so a
    #: reader that pairs a manifest with the other table file finds out in O(1).
    id: int = 0
    #: The table's file: ``_shards.tbl`` (appended in place) or, in a store on object storage written by
    #: a remote writer, an immutable ``_shards/<generation>-<writer>.tbl`` written whole by one commit
    #: (see :func:`is_table_file`). :meth:`after` (a local append) names ``_shards.tbl``.
    file: str = TABLE

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "rows": self.rows, "records": self.records, "crc32": self.crc32}
        if self.id:
            out["id"] = self.id
        return out

    def after(self, row: bytes, records: int) -> TableState:
        """The state once ``row`` (holding ``records`` records) is appended. The CRC runs over the rows
        without their own ``row_crc`` fields: a CRC-32 over bytes that end in their own CRC-32 is the
        same constant whatever the bytes, so chaining whole rows would not depend on their content."""
        return TableState(self.rows + 1, self.records + records, zlib.crc32(row[:-4], self.crc32), self.id)


@dataclass(frozen=True)
class ShardRow:
    """One checked row: shard number, first global record, records, ids flag, rows per ragged field."""

    number: int
    start: int
    records: int
    has_ids: bool
    rows: dict[str, int]
    desc_crc: int

    @property
    def name(self) -> str:
        return shard_dir_name(self.number)


class ShardTable:
    """The committed rows of a shard table as read-only numpy columns (no per-shard Python object).

    ``path`` is the table file (None for a table built in memory from a version-1/2 manifest);
    ``ragged`` the ragged field names in schema order (the ``rows`` columns); ``total`` the records
    of all rows, as the manifest says.
    """

    def __init__(self, data: np.ndarray[Any, Any], ragged: tuple[str, ...], total: int, path: Path | None) -> None:
        self.data = data
        self.ragged = ragged
        self.total = total
        self.path = path
        self._has_ids: bool | None = None

    # ------------------------------------------------------------------------------------ build

    @classmethod
    def empty(cls, ragged: Sequence[str], path: Path | None = None) -> ShardTable:
        return cls(np.zeros(0, dtype=row_dtype(len(ragged))), tuple(ragged), 0, path)

    @classmethod
    def from_shards(cls, shards: Sequence[Any], ragged: Sequence[str]) -> ShardTable:
        """Columns of a version-1/2 manifest's shard list (ShardInfo objects): O(shards), in memory."""
        dt = row_dtype(len(ragged))
        out = np.zeros(len(shards), dtype=dt)
        start = 0
        for k, s in enumerate(shards):
            number = _name_number(s.name)
            out[k] = (number, start, s.records, FLAG_IDS if s.has_ids else 0, [s.rows[r] for r in ragged], 0, 0)
            start += s.records
        out.flags.writeable = False
        return cls(out, tuple(ragged), start, None)

    @classmethod
    def open(cls, root: Path, ragged: Sequence[str], state: TableState, map_file: MapFile | None = None) -> ShardTable:
        """Map the committed rows of ``<root>/_shards.tbl``: O(1). Checks the header, that the file
        holds every committed row, and the last row (its CRC, and that it ends at ``state.records``).
        ``map_file(path, size)`` maps the first ``size`` bytes read-only (default: ``mmap.mmap``,
        which keeps a descriptor open while mapped)."""
        path = root / state.file
        dt = row_dtype(len(ragged))
        if state.rows == 0:
            if state.records != 0:
                raise CorruptionError(f"{root / 'manifest.json'}: 0 shard-table rows but {state.records} records")
            return cls.empty(ragged, path)
        need = TABLE_HEADER_BYTES + state.rows * dt.itemsize
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                check_table_header(f.read(TABLE_HEADER_BYTES), path, len(ragged), state.id)
            if size < need:
                raise CorruptionError(
                    f"{path}: {size} bytes, expected at least {need} for the {state.rows} committed rows "
                    f"of {dt.itemsize} bytes (truncated?)"
                )
            buf = (map_file or _map_prefix)(path, need)
        except FileNotFoundError:
            raise CorruptionError(f"{path}: shard table is missing (the manifest lists {state.rows} rows)") from None
        except (OSError, ValueError) as exc:
            raise CorruptionError(f"{path}: cannot read the shard table ({exc})") from exc
        # the file may have been replaced (an overwrite commit) between the check above and the map:
        # check the mapped header too, before touching a row (a smaller new file would fault past its end)
        check_table_header(bytes(memoryview(buf)[:TABLE_HEADER_BYTES]), path, len(ragged), state.id)
        data = np.frombuffer(buf, dtype=dt, count=state.rows, offset=TABLE_HEADER_BYTES)
        table = cls(data, tuple(ragged), state.records, path)
        last = table.row(state.rows - 1, chain=False)
        if last.start + last.records != state.records:
            raise CorruptionError(
                f"{path} row {state.rows - 1} (the last committed) ends at record {last.start + last.records}, "
                f"expected {state.records} as manifest.json says"
            )
        return table

    def prefix(self, rows: int) -> ShardTable:
        """The first ``rows`` rows (what a pinned reader sees)."""
        total = self.total if rows == len(self) else int(self.data["start"][rows]) if rows else 0
        return ShardTable(self.data[:rows], self.ragged, total, self.path)

    # ------------------------------------------------------------------------------------- read

    def __len__(self) -> int:
        return len(self.data)

    @property
    def starts(self) -> np.ndarray[Any, Any]:
        """First global record of every shard (a strided view; non-decreasing in a sound table)."""
        return self.data["start"]

    @property
    def records(self) -> np.ndarray[Any, Any]:
        return self.data["records"]

    @property
    def has_ids(self) -> bool:
        """Whether the records have ids (False for a table without rows): row 0's flag. A set flag is
        checked where ids are read (against the shard's row and descriptor); an unset one is the answer
        itself, so its row is checked (once): a damaged flag is named rather than read as "no ids"."""
        if self._has_ids is None:
            flag = bool(len(self.data)) and bool(int(self.data["flags"][0]) & FLAG_IDS)
            self._has_ids = flag or (bool(len(self.data)) and self.row(0, chain=False).has_ids)
        return self._has_ids

    def start_index(self) -> Sequence[int]:
        """The ``start`` column as a sequence of Python ints for :func:`bisect.bisect_right` (a strided
        memoryview of the rows: no copy, about a microsecond per search at 10^5 shards)."""
        flat = self.data.view(np.uint8).data.cast("q")
        return flat[1 :: self.data.dtype.itemsize // 8]

    def crc32(self) -> int:
        """CRC-32 of the rows' bytes without their ``row_crc`` fields (what manifest.json records for the
        committed rows; see :meth:`TableState.after`). O(shards)."""
        return _bodies_crc(self.data, 0, len(self.data))

    def end(self, k: int) -> int:
        """One past the last global record of shard ``k``."""
        return self.total if k == len(self.data) - 1 else int(self.data["start"][k + 1])

    def rows_total(self, name: str) -> int:
        """Rows of ragged field ``name`` in all shards (sums a column: O(shards) in C)."""
        j = self.ragged.index(name)
        return int(self.data["rows"][:, j].sum()) if len(self.data) else 0

    def _where(self, k: int) -> str:
        return f"{self.path} row {k}" if self.path is not None else f"shard {k}"

    def row(self, k: int, *, chain: bool = True) -> ShardRow:
        """Row ``k``, checked: its CRC-32, counts not negative, and (``chain``) that it starts where row
        ``k - 1`` ends (with a higher shard number) and ends where row ``k + 1`` starts (O(1)).
        Raises CorruptionError naming the table file and row."""
        n = len(self.data)
        if not 0 <= k < n:
            raise IndexError(f"shard {k} out of range for {n} shards")
        r = self._check(k)
        if chain:
            if k > 0:
                p = self._check(k - 1)
                if r["start"] != p["start"] + p["records"] or r["number"] <= p["number"]:
                    raise CorruptionError(
                        f"{self._where(k)}: starts at record {int(r['start'])} as shard number {int(r['number'])}, "
                        f"expected record {int(p['start'] + p['records'])} and a number above {int(p['number'])} "
                        f"(row {k - 1})"
                    )
            elif r["start"] != 0:
                raise CorruptionError(f"{self._where(k)}: starts at record {int(r['start'])}, expected 0")
            end = self.total if k == n - 1 else int(self._check(k + 1)["start"])
            if int(r["start"]) + int(r["records"]) != end:
                what = "the manifest's record count" if k == n - 1 else "the start of the next row"
                raise CorruptionError(
                    f"{self._where(k)}: ends at record {int(r['start'] + r['records'])}, expected {end} ({what})"
                )
        rows = {name: int(v) for name, v in zip(self.ragged, r["rows"])}
        return ShardRow(int(r["number"]), int(r["start"]), int(r["records"]), bool(int(r["flags"]) & FLAG_IDS), rows,
                        int(r["desc_crc"]))

    def _check(self, k: int) -> Any:
        r = self.data[k]
        if self.path is None:
            return r
        raw = self.data[k : k + 1].tobytes()
        crc = zlib.crc32(raw[:-4])
        if crc != int(r["row_crc"]):
            raise CorruptionError(
                f"{self._where(k)}: CRC-32 {crc:#010x} of the row differs from the one it carries "
                f"{int(r['row_crc']):#010x} (damaged)"
            )
        if r["records"] < 0 or r["start"] < 0 or r["number"] < 0 or (r["rows"] < 0).any():
            raise CorruptionError(f"{self._where(k)}: negative shard number, start, record or row count")
        return r

    def check_all(self, crc32: int | None) -> list[str]:
        """Every row (the full check of ``seqstore verify``): CRCs, starts, numbers, flags, the
        manifest's record total and CRC-32 of the committed bytes. Returns the problems found."""
        problems: list[str] = []
        if self.path is None:
            return problems
        crc = 0
        flags = None
        step = 1 << 16
        for a in range(0, len(self.data), step):
            crc = _bodies_crc(self.data, a, min(a + step, len(self.data)), crc)
        if crc32 is not None and crc != crc32:
            problems.append(f"{self.path}: CRC-32 {crc:#010x} of the committed rows differs from manifest.json's "
                            f"{crc32:#010x}")
        for k in range(len(self.data)):
            try:
                r = self.row(k)
            except CorruptionError as exc:
                problems.append(str(exc))
                break
            if flags is None:
                flags = r.has_ids
            elif r.has_ids != flags:
                problems.append(f"{self._where(k)}: has_ids is {r.has_ids}, row 0 says {flags}")
                break
        return problems


def check_table_header(raw: bytes, path: str | Path, ragged: int, table_id: int | None = None) -> None:
    """Check the 64-byte header against the schema's number of ragged fields (and ``table_id``, the id
    the manifest names, unless None)."""
    if len(raw) < TABLE_HEADER_BYTES:
        raise CorruptionError(f"{path}: {len(raw)} bytes, shorter than the {TABLE_HEADER_BYTES}-byte header")
    magic, layout, row_bytes, n_ragged = _HEADER.unpack_from(raw)
    if magic != TABLE_MAGIC:
        raise CorruptionError(f"{path}: not a shard table (magic {magic!r}, expected {TABLE_MAGIC!r})")
    if layout != TABLE_LAYOUT:
        raise CorruptionError(f"{path}: shard table layout {layout}, expected {TABLE_LAYOUT}")
    want = row_dtype(ragged).itemsize
    if n_ragged != ragged or row_bytes != want:
        raise CorruptionError(
            f"{path}: header says {n_ragged} ragged fields and {row_bytes}-byte rows, expected {ragged} and {want} "
            "(from the schema)"
        )
    if table_id is not None:
        got = struct.unpack_from("<Q", raw, _ID_OFFSET)[0]
        if got != table_id:
            raise CorruptionError(
                f"{path}: table id {got}, manifest.json names table id {table_id} (the table was replaced by an "
                "overwrite, or the manifest was)"
            )


def _name_number(name: str) -> int:
    try:
        return int(name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1
