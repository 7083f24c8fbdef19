"""Helpers shared by the store tests: scratch directories, random records and deep checks.

Not a test module (no ``test_`` prefix); imported by the tests in this folder and by the spawned
child processes of the multi-process tests (so everything a child runs lives here).
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import seqstore as ss
from seqstore.format.checksums import CHECKS
from seqstore.io.mapping import _Mapping
from seqstore.store.ids import encode_ids, hash_ids

INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOAT_DTYPES = ["float16", "float32", "float64"]
COMPLEX_DTYPES = ["complex64", "complex128"]
ALL_DTYPES = [*INT_DTYPES, *FLOAT_DTYPES, *COMPLEX_DTYPES, "bool", "bfloat16"]


def scratch_parent() -> str | None:
    """A tmpfs directory when there is one (fsync is free there), else the default temp dir."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return None


def new_scratch() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="seqstore-test-", dir=scratch_parent())


# --------------------------------------------------------------------------------------- values


def random_value(rng: np.random.Generator, field: ss.Field, rows: int | None = None) -> np.ndarray[Any, Any]:
    """A random input value for ``field`` (``rows`` rows when ragged). bfloat16 inputs are float32."""
    shape = ((rows,) if field.ragged else ()) + field.inner_shape
    if field.dtype == "bfloat16":
        vals = (rng.standard_normal(shape) * 100).astype(np.float32)
        return _sprinkle(rng, vals)
    dt = np.dtype(field.dtype)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    if dt.kind == "f":
        return _sprinkle(rng, (rng.standard_normal(shape) * 1000).astype(dt))
    real = rng.standard_normal(shape) * 1000
    imag = rng.standard_normal(shape) * 1000
    return _sprinkle(rng, (real + 1j * imag).astype(dt))


def _sprinkle(rng: np.random.Generator, arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Put some NaN / inf / -0.0 into a float or complex array (compared bit-exactly later)."""
    if arr.size and rng.random() < 0.5:
        flat = arr.reshape(-1)
        for special in (np.nan, np.inf, -np.inf, -0.0):
            flat[rng.integers(0, flat.size)] = special
    return arr


def storage_of(field: ss.Field, value: Any) -> np.ndarray[Any, Any]:
    """What the store must return (in ``bfloat16="bits"`` mode) for input ``value``."""
    if field.dtype == "bfloat16":
        return ss.float32_to_bfloat16(value)
    return np.asarray(value, dtype=field.storage_dtype)


def random_record(rng: np.random.Generator, schema: ss.Schema, max_rows: int = 4) -> dict[str, Any]:
    rec = {}
    for name, f in schema.items():
        rows = int(rng.integers(0, max_rows + 1)) if f.ragged else None
        rec[name] = random_value(rng, f, rows)
    return rec


# ----------------------------------------------------------------------------------- comparisons


def assert_same_bits(got: Any, want: Any, what: str = "") -> None:
    """Same dtype, shape and bytes (NaN payloads and -0.0 included)."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.tobytes() == want.tobytes(), f"{what}: values differ:\n{got!r}\n!=\n{want!r}"


def mmap_backed(arr: np.ndarray[Any, Any]) -> bool:
    """True when ``arr`` is a view whose memory belongs to a file mapping (zero-copy read): a mapping of
    seqstore.io (no descriptor held) or, where that is unavailable, an ``mmap.mmap``."""
    base: Any = arr
    while isinstance(base, np.ndarray) or isinstance(base, memoryview):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return isinstance(base, (mmap.mmap, _Mapping))


def npy_files(root: str | os.PathLike[str]) -> list[Path]:
    """Every ``.npy`` file of a store outside writer workspaces."""
    root = Path(root)
    return sorted(p for p in root.rglob("*.npy") if not p.relative_to(root).parts[0].startswith("_tmp"))


# ------------------------------------------------------------------------------------ deep check


def check_store(
    store: ss.Store,
    expected: Sequence[Mapping[str, np.ndarray[Any, Any]]],
    ids: Sequence[str] | None,
    rng: np.random.Generator,
) -> None:
    """Check every read path of ``store`` against ``expected`` (storage-dtype arrays per record)."""
    schema = store.schema
    n = len(expected)
    assert len(store) == n
    for i, want in enumerate(expected):
        rec = store[i]
        assert list(rec) == list(schema)
        for name in schema:
            got = rec[name]
            assert isinstance(got, np.ndarray), (name, type(got))
            assert got.flags.writeable is False, f"record {i} field {name} is writeable"
            assert_same_bits(got, want[name], f"record {i} field {name}")
            if got.size:
                assert mmap_backed(got), f"record {i} field {name} is not a view of the mmap"
        neg = store[i - n]
        for name in schema:
            assert_same_bits(neg[name], want[name], f"record {i - n}")
        nested = store.nested(i)
        for name in schema:
            node: Any = nested
            for part in name.split("/"):
                node = node[part]
            assert_same_bits(node, want[name], f"nested record {i} field {name}")
    for bad in (n, n + 7, -n - 1):
        try:
            store[bad]
        except IndexError as exc:
            assert str(bad) in str(exc)
        else:
            raise AssertionError(f"store[{bad}] of {n} records did not raise IndexError")

    # get_batch against per-record reads (random indices with repeats, all, and none)
    batches = [np.arange(n), np.array([], dtype=np.int64)]
    if n:
        batches.append(rng.integers(-n, n, size=int(rng.integers(1, 2 * n + 1))))
    for idx in batches:
        norm = [int(i) % n for i in idx] if n else []
        for pad in (False, True):
            out = store.get_batch(idx, pad=pad)
            assert list(out) == list(schema)
            for name, f in schema.items():
                rows = [expected[i][name] for i in norm]
                if not f.ragged:
                    want = np.stack(rows) if rows else np.empty((0, *f.inner_shape), f.storage_dtype)
                    assert_same_bits(out[name], want, f"get_batch {name}")
                    continue
                values, lengths = out[name]
                assert_same_bits(lengths, np.array([len(r) for r in rows], dtype=np.int64), f"lengths {name}")
                if pad:
                    t = max((len(r) for r in rows), default=0)
                    want = np.zeros((len(rows), t, *f.inner_shape), f.storage_dtype)
                    for k, r in enumerate(rows):
                        want[k, : len(r)] = r
                else:
                    want = np.concatenate(rows) if rows else np.empty((0, *f.inner_shape), f.storage_dtype)
                assert_same_bits(values, want, f"get_batch {name} pad={pad}")
    if n:
        some = [name for name in schema][:1]
        sub = store.get_batch([n - 1], fields=some)
        assert list(sub) == some

    # lengths
    for name, f in schema.items():
        if not f.ragged:
            continue
        want_len = np.array([len(r[name]) for r in expected], dtype=np.int64)
        lengths = store.lengths(name)
        assert len(lengths) == n
        assert_same_bits(np.asarray(lengths), want_len, f"np.asarray(lengths {name})")
        assert list(lengths) == want_len.tolist()
        chunks = list(lengths.iter_chunks(size=2))
        assert all(len(c) <= 2 for c in chunks)
        got = np.concatenate(chunks) if chunks else np.empty(0, np.int64)
        assert_same_bits(got, want_len, "iter_chunks")
        if n:
            for i in (0, n - 1, -1, -n):
                assert lengths[i] == want_len[i] and isinstance(lengths[i], int)
            assert_same_bits(lengths[1::2], want_len[1::2], "lengths[1::2]")
            assert_same_bits(lengths[::-1], want_len[::-1], "lengths[::-1]")
            pick = rng.integers(-n, n, size=5)
            assert_same_bits(lengths[pick], want_len[pick], "lengths[array]")

    # ids
    if ids is not None and n:
        assert store.has_ids
        for i, s in enumerate(ids):
            assert store.id(i) == s
            assert store.index(s) == i
        assert store.id(-1) == ids[-1]
        assert_same_bits(store.index_many(list(ids)), np.arange(n, dtype=np.int64), "index_many")
        missing = "\U0001f47b-not-there"
        assert missing not in ids
        try:
            store.index(missing)
        except KeyError as exc:
            assert missing in str(exc)
        else:
            raise AssertionError("index of a missing id did not raise")
        try:
            store.index_many([ids[0], missing])
        except KeyError as exc:
            assert missing in str(exc)
        else:
            raise AssertionError("index_many of a missing id did not raise")
        assert store.index_many([missing, ids[-1]], missing=-7).tolist() == [-7, n - 1]

    check_files(store, expected, ids)


def check_files(
    store: ss.Store, expected: Sequence[Mapping[str, np.ndarray[Any, Any]]], ids: Sequence[str] | None
) -> None:
    """``np.load(mmap_mode="r")`` every ``.npy`` of the store and compare with what it must hold."""
    root = store.root
    seen = set()
    starts = np.concatenate([[0], np.cumsum([s.records for s in store.manifest.shards])]).astype(int)
    for k, shard in enumerate(store.manifest.shards):
        recs = expected[starts[k] : starts[k + 1]]
        d = root / shard.name
        for name, f in store.schema.items():
            path = d / f"{name}.npy"
            arr = np.load(path, mmap_mode="r")
            seen.add(path)
            parts = [r[name] for r in recs]
            if f.ragged:
                want = np.concatenate(parts) if parts else np.empty((0, *f.inner_shape), f.storage_dtype)
                offsets = np.load(d / f"{name}.offsets.npy", mmap_mode="r")
                seen.add(d / f"{name}.offsets.npy")
                want_off = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype("<i8")
                assert_same_bits(offsets, want_off, f"{d}/{name}.offsets.npy")
            else:
                want = np.stack(parts) if parts else np.empty((0, *f.inner_shape), f.storage_dtype)
            assert_same_bits(arr, want, str(path))
        if CHECKS in shard.files:  # per-record checksums: XXH3 of each record's bytes per field (and id)
            checks = np.load(d / CHECKS, mmap_mode="r")
            seen.add(d / CHECKS)
            cols = [[np.ascontiguousarray(r[name]).tobytes() for r in recs] for name in store.schema]
            if shard.has_ids:
                assert ids is not None
                cols.append([i.encode("utf-8", "surrogatepass") for i in ids[starts[k] : starts[k + 1]]])
            want_checks = np.array([[_xxh3_low32(b) for b in col] for col in cols], np.uint32).T
            assert_same_bits(checks, want_checks.reshape(len(recs), len(cols)), f"{d}/{CHECKS}")
        if shard.has_ids:
            assert ids is not None
            mine = list(ids[starts[k] : starts[k + 1]])
            data, offsets = encode_ids(mine)
            loaded = {s: np.load(d / f"_ids{s}.npy", mmap_mode="r") for s in ("", ".offsets", ".hash", ".hash_rows")}
            seen.update(d / f"_ids{s}.npy" for s in loaded)
            assert_same_bits(loaded[""], data, "_ids.npy")
            assert_same_bits(loaded[".offsets"], offsets, "_ids.offsets.npy")
            hashes = hash_ids(data, offsets)
            assert np.all(loaded[".hash"][1:] >= loaded[".hash"][:-1])
            assert sorted(loaded[".hash_rows"].tolist()) == list(range(len(mine)))
            assert_same_bits(loaded[".hash"], hashes[loaded[".hash_rows"]], "_ids.hash.npy")
    for run in store.manifest.index_runs:
        h = np.load(root / f"{run.name}.hash.npy", mmap_mode="r")
        r = np.load(root / f"{run.name}.rows.npy", mmap_mode="r")
        seen.update({root / f"{run.name}.hash.npy", root / f"{run.name}.rows.npy"})
        assert ids is not None
        lo, hi = starts[run.first_shard], starts[run.end_shard]
        assert len(h) == len(r) == run.records == hi - lo
        assert sorted(r.tolist()) == list(range(lo, hi))
        data, offsets = encode_ids(list(ids))
        assert_same_bits(h, hash_ids(data, offsets)[r], f"{run.name}.hash.npy")
        assert np.all(h[1:] >= h[:-1])
    # nothing else: every .npy of the store was loaded and checked above
    assert set(npy_files(root)) == seen, sorted(set(npy_files(root)) ^ seen)


def _xxh3_low32(data: bytes) -> int:
    """The per-record checksum of docs/format.md section 4.1, from the reference implementation."""
    import xxhash

    return int(xxhash.xxh3_64_intdigest(data)) & 0xFFFFFFFF


def iter_chunks(seq: Sequence[Any], sizes: Sequence[int]) -> Iterator[tuple[int, int]]:
    """(start, end) pairs cutting ``range(len(seq))`` by ``sizes`` (cycled), each at least 1 long."""
    start, k = 0, 0
    while start < len(seq):
        size = max(1, sizes[k % len(sizes)]) if sizes else len(seq)
        yield start, min(len(seq), start + size)
        start += size
        k += 1


# ------------------------------------------------------------------------- child-process helpers

CHILD_SCHEMA = {"x": ss.Field("float32", (None, 3)), "meta": {"k": ss.Field("int64", ())}}


def child_record(tag: int, i: int) -> dict[str, Any]:
    """A deterministic record: rows ``i % 5``, values derived from (tag, i)."""
    x = np.full((i % 5, 3), tag * 100000 + i, dtype=np.float32) + np.arange(3, dtype=np.float32)
    return {"x": x, "meta": {"k": np.int64(tag * 100000 + i)}}


def child_write(root: str, tag: int, count: int, max_shard_records: int) -> int:
    """Writer process body for the two-writer test: append ``count`` records, committing shards."""
    with ss.append_to(root, max_shard_records=max_shard_records, buffer_bytes=512) as w:
        for i in range(count):
            w.append(child_record(tag, i), id=f"w{tag}-{i}")
            if i % 7 == 6:
                w.commit()
    return count


def child_read(store: ss.Store, indices: list[int]) -> list[tuple[str, list[float], int]]:
    """Reader process body: read records of a pickled Store."""
    out = []
    for i in indices:
        rec = store[i]
        out.append((store.id(i), rec["x"].reshape(-1).tolist(), int(rec["meta/k"])))
    return out


def fds_under(root: Path) -> list[str]:
    """Paths under ``root`` that this process holds open descriptors on (Linux /proc)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            out.append(target)
    return out


# ------------------------------------------------------------------------- format versions


def workspaces(root: Path) -> list[Path]:
    """What writers keep in a store besides committed data: workspaces and temporary manifests, in
    ``_tmp/`` (version 3) or at the top as ``_tmp-*`` and ``.manifest.json.tmp-*`` (versions 1/2)."""
    top = [p for p in Path(root).iterdir() if p.name.startswith(("_tmp-", ".manifest.json.tmp"))]
    work = Path(root) / "_tmp"
    return top + (sorted(work.iterdir()) if work.is_dir() else [])


def create_legacy(root: Path, schema: Any, *, version: int = 1, packed: Any = None, id_lookup: str = "first",
                  **writer_kw: Any) -> ss.Writer:
    """A new store in the JSON shard-list layout of format version 1 (or 2 with ``packed`` or
    ``id_lookup="last"``), as seqstore wrote before version 3, and a writer appending to it (a store
    keeps its version). ``version`` is what the manifest must end up saying (checked)."""
    from seqstore.format.manifest import Manifest

    sch = ss.Schema(schema, packed=packed) if not isinstance(schema, ss.Schema) else schema
    root.mkdir(parents=True)
    m = Manifest(sch, id_lookup=id_lookup)
    assert m.version == version, (m.version, version)
    m.save(root)
    return ss.append_to(root, **writer_kw)


def edit_shard_meta(root: Path, k: int, fn: Any) -> None:
    """Change what the store records about shard ``k`` (``records``, ``rows``, ``has_ids``, ``files``
    as in the format's JSON) *consistently*: a version-1/2 manifest entry, or a version-3 shard's
    descriptor together with its table row and the manifest's CRC-32 and record count, so that only
    the files disagree with the metadata."""
    import json
    import zlib

    from seqstore.format.descriptor import DESCRIPTOR
    from seqstore.format.shard_table import TABLE, TABLE_HEADER_BYTES, encode_row

    mpath = root / "manifest.json"
    m = json.loads(mpath.read_text())
    if m["version"] < 3:
        fn(m["shards"][k])
        mpath.write_text(json.dumps(m))
        return
    ragged = [n for n, f in m["schema"].items() if f["shape"] and f["shape"][0] is None]
    _, rows, raw = _table_rows(root, m)
    n = len(rows)
    dpath = root / f"shard-{int(rows['number'][k]):06d}" / DESCRIPTOR
    d = json.loads(dpath.read_bytes())
    fn(d)
    dpath.write_bytes(json.dumps(d, separators=(",", ":")).encode())
    out, start, crc = b"", 0, 0
    for j in range(n):
        r = rows[j]
        records = int(d["records"]) if j == k else int(r["records"])
        row_rows = [int(d["rows"][name]) for name in ragged] if j == k else [int(v) for v in r["rows"]]
        desc_crc = zlib.crc32(dpath.read_bytes()) if j == k else int(r["desc_crc"])
        row = encode_row(int(r["number"]), start, records, bool(int(r["flags"]) & 1), row_rows, desc_crc)
        crc = zlib.crc32(row[:-4], crc)  # the manifest's CRC leaves out each row's own CRC
        out += row
        start += records
    (root / TABLE).write_bytes(raw[:TABLE_HEADER_BYTES] + out + raw[TABLE_HEADER_BYTES + len(out) :])
    m["shard_table"].update(records=start, crc32=crc)
    mpath.write_text(json.dumps(m))


def replace_in_shard_meta(root: Path, k: int, old: str, new: str) -> None:
    """Replace text in shard ``k``'s JSON metadata (version 3: its descriptor, with the table row's
    CRC of it made to agree; version 1/2: the manifest, first occurrence)."""
    import json

    from seqstore.format.descriptor import DESCRIPTOR

    m = json.loads((root / "manifest.json").read_text())
    path = root / "manifest.json"
    if m["version"] >= 3:
        _, rows, _ = _table_rows(root, m)
        path = root / f"shard-{int(rows['number'][k]):06d}" / DESCRIPTOR
    text = path.read_text()
    assert old in text, text
    forged = text.replace(old, new, 1)
    path.write_text(forged)
    if m["version"] >= 3:
        _refresh_row_crc(root, k, forged.encode())


def _table_rows(root: Path, m: dict[str, Any]) -> tuple[np.dtype[Any], np.ndarray[Any, Any], bytes]:
    from seqstore.format.shard_table import TABLE, TABLE_HEADER_BYTES, row_dtype

    ragged = [n for n, f in m["schema"].items() if f["shape"] and f["shape"][0] is None]
    dt = row_dtype(len(ragged))
    raw = (root / TABLE).read_bytes()
    return dt, np.frombuffer(raw, dtype=dt, count=m["shard_table"]["rows"], offset=TABLE_HEADER_BYTES), raw


def _refresh_row_crc(root: Path, k: int, desc: bytes) -> None:
    """Make table row ``k`` carry the CRC-32 of descriptor bytes ``desc`` (and the manifest agree)."""
    import json
    import zlib

    from seqstore.format.shard_table import TABLE, TABLE_HEADER_BYTES, encode_row

    mpath = root / "manifest.json"
    m = json.loads(mpath.read_text())
    dt, rows, raw_bytes = _table_rows(root, m)
    r = rows[k]
    row = encode_row(int(r["number"]), int(r["start"]), int(r["records"]), bool(int(r["flags"]) & 1),
                     [int(v) for v in r["rows"]], zlib.crc32(desc))
    raw = bytearray(raw_bytes)
    at = TABLE_HEADER_BYTES + k * dt.itemsize
    raw[at : at + len(row)] = row
    (root / TABLE).write_bytes(bytes(raw))
    crc = 0
    for j in range(len(rows)):
        at = TABLE_HEADER_BYTES + j * dt.itemsize
        crc = zlib.crc32(bytes(raw[at : at + dt.itemsize - 4]), crc)  # each row without its own CRC
    m["shard_table"]["crc32"] = crc
    mpath.write_text(json.dumps(m))
