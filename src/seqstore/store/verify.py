"""Full integrity check of a store (``seqstore verify``): every check of docs/format.md, section 8.

:func:`verify` reads every byte of every committed file once (chunked, O(chunk) memory) and returns
a list of problems, each naming the file and what is wrong. An empty list means the store is intact.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SeqstoreError
from ..format.checksums import CHECKS, check_columns, span_checks
from ..format.manifest import IDS, IndexRun, Manifest
from ..format.npy import read_header
from ..format.shard_table import shard_dir_name
from ..io.local_source import map_npy
from ..io.options import StoreOptions
from ..io.source import ByteSource
from ..io.sources import open_source
from .ids import hash_ids

__all__ = ["verify", "total_bytes"]

CHUNK = 16 << 20


def _crc_of_data(path: Path, offset: int, progress: Callable[[int], None] | None) -> int:
    crc = 0
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                return crc
            crc = zlib.crc32(chunk, crc)
            if progress is not None:
                progress(len(chunk))


def _check_monotone(off: np.ndarray[Any, Any], path: Path, limit: int) -> list[str]:
    """The problem of offsets ``off`` (as a list of none or one)."""
    if len(off) == 0 or off[0] != 0:
        return [f"{path}: first offset is {off[0] if len(off) else 'missing'}, expected 0"]
    for start in range(0, len(off) - 1, CHUNK // 8):
        part = np.asarray(off[start : start + CHUNK // 8 + 1])
        bad = np.flatnonzero(np.diff(part) < 0)
        if len(bad):
            return [f"{path}: offsets decrease at record {start + int(bad[0])}"]
    return [f"{path}: last offset is {off[-1]}, expected {limit}"] if off[-1] != limit else []


def total_bytes(manifest: Manifest) -> int:
    """Bytes of all committed data files listed in the manifest (version 3: in the shards' descriptors,
    read one per shard)."""
    return sum(fi.bytes for s in manifest.shards for fi in s.files.values())


def verify(
    path: str | os.PathLike[str],
    progress: Callable[[int], None] | None = None,
    *,
    storage_options: StoreOptions | Mapping[str, Any] | None = None,
    **remote: Any,
) -> list[str]:
    """Check every committed file of the store at ``path``; return the problems found (empty if none).

    ``progress`` is called with the bytes of each file's ``.npy`` header, then with the bytes checksummed
    after each chunk (for a progress bar): on an intact store the calls add up to :func:`total_bytes`.
    Reads each file once; memory O(chunk + largest id index of one shard).

    A remote store (a URL; the other arguments as for :func:`seqstore.open`) is checked shard by shard:
    each shard's objects are fetched whole into the node cache and checked there; problems name URLs.
    """
    try:
        source = open_source(path, storage_options, **remote)
    except SeqstoreError as exc:
        return [str(exc)]
    try:
        manifest = source.load()
        source.fetch_descriptors(manifest)  # a remote store: every shard's descriptor, in one wave
    except SeqstoreError as exc:
        return [source.display(str(exc))]
    problems = _verify_root(source.root, manifest, progress, source)
    return [source.display(p) for p in problems]


def _verify_root(
    root: Path, manifest: Manifest, progress: Callable[[int], None] | None, source: ByteSource
) -> list[str]:
    problems: list[str] = []
    schema = manifest.schema
    if manifest.table is not None:
        problems.extend(manifest.shard_table().check_all(manifest.table.crc32))
    named = set(problems)
    for k in range(manifest.num_shards):
        try:
            info = manifest.shards[k]
        except SeqstoreError as exc:  # a version-3 shard whose table row or descriptor is bad
            if str(exc) not in named:  # (a row the check of every row above named already)
                problems.append(str(exc))
            continue
        sdir = root / info.name
        before = len(problems)  # this shard's problems are the ones added from here
        try:  # a remote store: its objects, whole, into the node cache, linked into the mirror
            source.materialize([f"{info.name}/{rel}" for rel in info.files])
        except SeqstoreError as exc:
            problems.append(str(exc))
            continue
        units = schema.storage_units()  # unpacked fields and packed groups (<group>.npy)
        expected = {f"{n}.npy" for n, _ in units} | {f"{n}.offsets.npy" for n, f in units if f.ragged}
        if info.has_ids:
            expected |= {f"{IDS}{s}.npy" for s in ("", ".offsets", ".hash", ".hash_rows")}
        for rel in sorted(expected - set(info.files)):
            problems.append(f"{sdir / rel}: not listed in the manifest")
        for rel, fi in info.files.items():
            p = sdir / rel
            try:
                size = os.stat(p).st_size
            except FileNotFoundError:
                problems.append(f"{p}: file is missing")
                continue
            if size != fi.bytes:
                problems.append(f"{p}: file has {size} bytes, manifest says {fi.bytes}")
                continue
            fetched = False  # (a remote store's file: maybe only the node cache's copy is damaged)
            try:
                try:
                    header = read_header(p)
                except SeqstoreError:
                    if not source.refetch([f"{info.name}/{rel}"]):
                        raise
                    fetched, header = True, read_header(p)
                if progress is not None:  # the header counts too: a sound file reports exactly fi.bytes
                    progress(header.data_offset)
                crc = _crc_of_data(p, header.data_offset, progress)
                if crc != fi.crc32 and not fetched and source.refetch([f"{info.name}/{rel}"]):
                    crc = _crc_of_data(p, header.data_offset, None)
            except SeqstoreError as exc:
                problems.append(str(exc))
                continue
            if crc != fi.crc32:
                problems.append(f"{p}: CRC-32 {crc:#010x} of the data differs from the manifest's {fi.crc32:#010x}"
                                + _first_failing(sdir, info, schema, rel, manifest, k))
        if len(problems) > before:  # (its files' problems: their structure is not checked)
            continue
        try:
            problems.extend(_check_shard_structure(sdir, info, schema))
        except SeqstoreError as exc:
            problems.append(str(exc))
    if not problems:  # runs are compared with the shard indexes, which must be sound first
        for run in manifest.index_runs:
            try:
                source.materialize([f"{run.name}.hash.npy", f"{run.name}.rows.npy"])
                problems.extend(_check_index_run(root, manifest, run))
            except SeqstoreError as exc:
                if not _superseded(root, run):
                    problems.append(str(exc))
    return problems


def _first_failing(sdir: Path, info: Any, schema: Any, rel: str, manifest: Manifest, k: int) -> str:
    """Where the records of file ``rel`` of shard ``k`` first fail their per-record checksums (docs/format.md
    section 4.1): ``"; first at record G (row R of the shard), field F"``, or "" (the shard has no checksums,
    the file holds no record's bytes, or none fails). O(chunk) memory; run on a CRC mismatch only."""
    n, cols = info.records, check_columns(list(schema), info.has_ids)
    stem = rel.removesuffix(".npy").removesuffix(".offsets")
    names = schema.groups[stem].fields if stem in schema.groups else [stem]
    if CHECKS not in info.files or not n or not set(names) <= set(cols):
        return ""

    def mapped(rel: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        return map_npy(sdir / rel, info.files.get(rel), np.dtype(dtype), shape)

    with contextlib.suppress(SeqstoreError, ValueError, OSError):
        if _crc_of_data(sdir / CHECKS, read_header(sdir / CHECKS).data_offset, None) != info.files[CHECKS].crc32:
            return ""  # (the checksums themselves damaged: they cannot tell)
        checks = mapped(CHECKS, "<u4", (n, len(cols)))
        for name in names:
            spans = _record_spans(mapped, schema, n, info.rows, name)
            for lo in range(0, n, CHUNK // 8):
                hi = min(n, lo + CHUNK // 8)
                buf, starts, lens = spans(lo, hi)
                inside = (starts >= 0) & (lens >= 0) & (starts + lens <= buf.size)  # (damaged offsets: outside)
                got = span_checks(buf, np.where(inside, starts, 0), np.where(inside, lens, 0))
                bad = np.flatnonzero(~inside | (got != checks[lo:hi, cols.index(name)]))
                if len(bad):
                    r, what = lo + int(bad[0]), "its id" if name == IDS else f"field {name!r}"
                    first = int(manifest.shard_table().starts[k])
                    return f"; first at record {first + r} (row {r} of the shard), {what}"
    return ""


def _record_spans(mapped: Callable[..., np.ndarray[Any, Any]], schema: Any, n: int, rows: Mapping[str, int],
                  name: str) -> Callable[[int, int], tuple[Any, Any, Any]]:
    """``spans(lo, hi)``: the bytes of the file holding column ``name`` of a shard of ``n`` records, and the
    byte starts and lengths of records ``[lo, hi)`` in them (what section 4.1 hashes)."""
    if name == IDS or schema[name].ragged:
        off = mapped(f"{name}.offsets.npy", "<i8", (n + 1,))
        if name == IDS:
            data, stride = mapped(f"{IDS}.npy", "u1", (int(off[-1]),)), 1
        else:
            f = schema[name]
            data, stride = mapped(f"{name}.npy", f.storage_dtype, (rows[name], *f.inner_shape)), f.row_bytes
        buf = data.reshape(-1).view(np.uint8)

        def ragged(lo: int, hi: int) -> tuple[Any, Any, Any]:
            o = np.asarray(off[lo : hi + 1])
            return buf, o[:-1] * stride, np.diff(o) * stride

        return ragged
    f, g = schema[name], schema.group_of(name)
    if g is None:
        a, b = 0, int(np.prod(f.inner_shape, dtype=np.int64))
        data, width = mapped(f"{name}.npy", f.storage_dtype, (n, *f.inner_shape)), b
    else:
        (a, b), width = schema.groups[g].columns[name], schema.groups[g].width
        data = mapped(f"{g}.npy", f.storage_dtype, (n, width))
    buf, size = data.reshape(-1).view(np.uint8), f.storage_dtype.itemsize

    def fixed(lo: int, hi: int) -> tuple[Any, Any, Any]:
        return buf, (np.arange(lo, hi, dtype=np.int64) * width + a) * size, np.full(hi - lo, (b - a) * size, np.int64)

    return fixed


def _superseded(root: Path, run: IndexRun) -> bool:
    """Whether a commit since the manifest was read merged ``run`` into a bigger run (whose files it then
    deletes, docs/format.md section 6): its files missing is no problem of the store."""
    try:
        return all(r.name != run.name for r in Manifest.load(root).index_runs)
    except (SeqstoreError, OSError):
        return False


def _pair_fingerprint(hashes: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]) -> int:
    """Sum (mod 2^64) of a 64-bit mix of every (hash, row) pair: equal for equal multisets of pairs,
    whatever their order, and different for any other with probability about 1 - 2^-64."""
    x = np.asarray(hashes, dtype=np.uint64) ^ (np.asarray(rows).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return int(x.sum(dtype=np.uint64))


def _check_index_run(root: Path, manifest: Manifest, run: IndexRun) -> list[str]:
    """A merged run (docs/format.md section 6) against the shard indexes it covers."""
    problems: list[str] = []
    hp, rp = root / f"{run.name}.hash.npy", root / f"{run.name}.rows.npy"
    h = map_npy(hp, None, np.dtype("<u8"), (run.records,), sequential=True)
    r = map_npy(rp, None, np.dtype("<i8"), (run.records,), sequential=True)
    table = manifest.shard_table()
    shards = f"{run.first_shard}..{run.end_shard - 1}"
    lo = int(table.starts[run.first_shard])
    hi = table.end(run.end_shard - 1)
    if run.records != hi - lo:
        return [f"{hp}: the run has {run.records} entries, its shards {hi - lo} records"]
    step = CHUNK // 8
    got = 0
    for a in range(0, run.records, step):
        hc = np.asarray(h[a : a + step + 1])  # one entry of overlap: order across chunk borders
        rc = np.asarray(r[a : a + step + 1])
        if len(hc) > 1:
            down = np.flatnonzero(hc[1:] < hc[:-1])
            if len(down):
                problems.append(f"{hp}: hashes are not sorted (at entry {a + int(down[0])})")
                break
            tie = hc[1:] == hc[:-1]
            if (rc[1:][tie] <= rc[:-1][tie]).any():
                problems.append(f"{rp}: rows are not ascending among equal hashes (near entry {a})")
                break
        rc = rc[:step] if a + step < run.records else rc
        if ((rc < lo) | (rc >= hi)).any():
            problems.append(f"{rp}: rows outside {lo}..{hi - 1}, the records of shards {shards}")
            break
        got = (got + _pair_fingerprint(hc[: len(rc)], rc)) % (1 << 64)
    if problems:
        return problems
    want = 0
    start = lo
    for k in range(run.first_shard, run.end_shard):
        name = shard_dir_name(int(table.data["number"][k])) if manifest.table is not None else manifest.shards[k].name
        sdir = root / name
        sh = np.load(sdir / f"{IDS}.hash.npy", mmap_mode="r")
        sr = np.load(sdir / f"{IDS}.hash_rows.npy", mmap_mode="r")
        for a in range(0, len(sh), step):
            want = (want + _pair_fingerprint(sh[a : a + step], np.asarray(sr[a : a + step]) + start)) % (1 << 64)
        start += int(table.records[k])
    if got != want:
        problems.append(f"{hp}: the run's (hash, row) pairs differ from those of shards {shards}")
    return problems


def _check_shard_structure(sdir: Path, info: Any, schema: Any) -> list[str]:
    problems: list[str] = []
    n = info.records

    def mapped(rel: str, dtype: Any, shape: tuple[int, ...], sequential: bool = True) -> np.ndarray[Any, Any]:
        return map_npy(sdir / rel, info.files.get(rel), np.dtype(dtype), shape, sequential=sequential)

    for name, f in schema.storage_units():
        if not f.ragged:
            mapped(f"{name}.npy", f.storage_dtype, (n, *f.inner_shape), sequential=False)
            continue
        rows = info.rows[name]
        problems += _check_monotone(mapped(f"{name}.offsets.npy", "<i8", (n + 1,)), sdir / f"{name}.offsets.npy", rows)
        mapped(f"{name}.npy", f.storage_dtype, (rows, *f.inner_shape), sequential=False)
    if CHECKS in info.files:  # per-record checksums: one column per field, and one for the ids
        mapped(CHECKS, "<u4", (n, len(check_columns(list(schema), info.has_ids))), sequential=False)
    if info.has_ids:
        off = mapped(f"{IDS}.offsets.npy", "<i8", (n + 1,))
        total = int(off[-1])  # (n + 1 offsets: never empty)
        bad = _check_monotone(off, sdir / f"{IDS}.offsets.npy", total)
        if bad:
            return problems + bad
        data = mapped(f"{IDS}.npy", "u1", (total,))
        h = np.asarray(mapped(f"{IDS}.hash.npy", "<u8", (n,)))
        rows_ = np.asarray(mapped(f"{IDS}.hash_rows.npy", "<i8", (n,)))
        hp, rp = sdir / f"{IDS}.hash.npy", sdir / f"{IDS}.hash_rows.npy"
        if n:
            if n > 1 and (h[1:] < h[:-1]).any():  # (np.diff of uint64 wraps)
                problems.append(f"{hp}: hashes are not sorted")
            tie = h[1:] == h[:-1]
            if not np.array_equal(np.sort(rows_), np.arange(n)):
                problems.append(f"{rp}: rows are not a permutation of 0..{n - 1}")
            elif (rows_[1:][tie] <= rows_[:-1][tie]).any():
                problems.append(f"{rp}: rows are not ascending among equal hashes")
            elif not np.array_equal(hash_ids(np.asarray(data), np.asarray(off))[rows_], h):
                problems.append(f"{hp}: hashes do not match the ids")
    return problems
