"""Damaged stores raise CorruptionError / FormatError naming the file: never raw errors, never wrong data."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from store_testlib import CHILD_SCHEMA, child_record, create_legacy, edit_shard_meta, replace_in_shard_meta

import seqstore as ss
from seqstore.format.npy import HEADER_BYTES, encode_header
from seqstore.store.verify import verify

N = 10
IDS = [f"w0-{i}" for i in range(N)]


@pytest.fixture(params=[3, 1], ids=["v3", "v1"])
def store_root(scratch: Path, request: pytest.FixtureRequest) -> Path:
    """2 shards of 5 records, in format version 3 (what create writes) or 1 (the JSON shard list)."""
    root = scratch / "s"
    if request.param == 3:
        w = ss.create(root, CHILD_SCHEMA, max_shard_records=5)
    else:
        w = create_legacy(root, CHILD_SCHEMA, max_shard_records=5)
    with w:
        for i in range(N):
            w.append(child_record(0, i), id=IDS[i])
    assert ss.open(root).manifest.version == request.param
    return root


def _version(root: Path) -> int:
    return int(json.loads((root / "manifest.json").read_text())["version"])


def touch_everything(root: Path) -> None:
    """Every read path, so a damage must surface at open or at first touch."""
    store = ss.open(root)
    for i in range(len(store)):
        rec = store[i]
        want = child_record(0, i)
        # if nothing was raised, the data must be right
        np.testing.assert_array_equal(rec["x"], want["x"])
        assert int(rec["meta/k"]) == want["meta"]["k"]
    for pad in (False, True):
        store.get_batch(np.arange(N), pad=pad)
        store.get_batch(np.arange(N)[::-1], fields=["x"], pad=pad)
    lengths = store.lengths("x")
    assert np.asarray(lengths).tolist() == [i % 5 for i in range(N)]
    assert [lengths[i] for i in range(N)] == [i % 5 for i in range(N)]
    assert lengths[np.arange(N)].tolist() == [i % 5 for i in range(N)]
    assert [store.id(i) for i in range(N)] == IDS
    assert store.index_many(IDS).tolist() == list(range(N))
    assert [store.index(s) for s in IDS] == list(range(N))
    assert len(store) == N


def shard(root: Path, k: int = 0) -> Path:
    return root / f"shard-{k:06d}"


def truncate(path: Path, nbytes: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - nbytes)


def rewrite_header(path: Path, dtype: str, shape: tuple[int, ...]) -> None:
    with open(path, "r+b") as f:
        f.write(encode_header(np.dtype(dtype), shape))


def poke_int64(path: Path, index: int, value: int) -> None:
    """Overwrite element ``index`` of a 1-d int64 .npy (same size, header untouched)."""
    with open(path, "r+b") as f:
        f.seek(HEADER_BYTES + 8 * index)
        f.write(struct.pack("<q", value))


def edit_manifest(root: Path, fn: Callable[[dict], object]) -> None:
    m = json.loads((root / "manifest.json").read_text())
    fn(m)
    (root / "manifest.json").write_text(json.dumps(m))


# (case id, damage, error class, text the message must contain (a path relative to the store; or per
# format version, where versions 1 and 3 keep the damaged metadata in different files))
CASES: list[tuple[str, Callable[[Path], None], type[Exception], str | dict[int, str]]] = [
    ("truncated data file", lambda r: truncate(shard(r) / "x.npy", 12), ss.CorruptionError, "shard-000000/x.npy"),
    ("truncated by 1 byte", lambda r: truncate(shard(r, 1) / "meta/k.npy", 1), ss.CorruptionError, "meta/k.npy"),
    (
        "truncated into header",
        lambda r: truncate(shard(r) / "x.npy", os.path.getsize(shard(r) / "x.npy") - 20),
        ss.CorruptionError,
        "shard-000000/x.npy",
    ),
    (
        "empty file",
        lambda r: truncate(shard(r) / "x.npy", os.path.getsize(shard(r) / "x.npy")),
        ss.CorruptionError,
        "shard-000000/x.npy",
    ),
    (
        "extra bytes",
        lambda r: open(shard(r) / "x.offsets.npy", "ab").write(b"\0" * 8),
        ss.CorruptionError,
        "shard-000000/x.offsets.npy",
    ),
    ("missing data file", lambda r: (shard(r, 1) / "x.npy").unlink(), ss.CorruptionError, "shard-000001/x.npy"),
    ("missing offsets", lambda r: (shard(r) / "x.offsets.npy").unlink(), ss.CorruptionError, "x.offsets.npy"),
    ("missing nested", lambda r: shutil.rmtree(shard(r) / "meta"), ss.CorruptionError, "meta/k.npy"),
    ("missing shard dir", lambda r: shutil.rmtree(shard(r, 1)), ss.CorruptionError, "shard-000001"),
    (
        "file is a directory",
        lambda r: ((shard(r) / "x.npy").unlink(), (shard(r) / "x.npy").mkdir()),
        ss.CorruptionError,
        "shard-000000/x.npy",
    ),
    ("missing ids", lambda r: (shard(r) / "_ids.npy").unlink(), ss.CorruptionError, "_ids.npy"),
    ("missing id hash", lambda r: (shard(r, 1) / "_ids.hash.npy").unlink(), ss.CorruptionError, "_ids.hash.npy"),
    (
        "truncated id offsets",
        lambda r: truncate(shard(r) / "_ids.offsets.npy", 8),
        ss.CorruptionError,
        "_ids.offsets.npy",
    ),
    (
        "garbage manifest",
        lambda r: (r / "manifest.json").write_bytes(b"\x00{not json"),
        ss.CorruptionError,
        "manifest.json",
    ),
    ("empty manifest", lambda r: (r / "manifest.json").write_bytes(b""), ss.CorruptionError, "manifest.json"),
    (
        "non-utf8 manifest",
        lambda r: (r / "manifest.json").write_bytes(b'{"a": "\xff\xfe"}'),
        ss.CorruptionError,
        "manifest.json",
    ),
    ("manifest version 4", lambda r: edit_manifest(r, lambda m: m.update(version=4)), ss.FormatError, "manifest.json"),
    (
        "manifest version 0",
        lambda r: edit_manifest(r, lambda m: m.update(version=0)),
        ss.SeqstoreError,
        "manifest.json",
    ),
    (
        "manifest version str",
        lambda r: edit_manifest(r, lambda m: m.update(version="1")),
        ss.CorruptionError,
        "manifest.json",
    ),
    (
        "manifest of another format",
        lambda r: edit_manifest(r, lambda m: m.update(format="zarr")),
        ss.FormatError,
        "manifest.json",
    ),
    ("manifest is a list", lambda r: (r / "manifest.json").write_text("[1, 2]"), ss.FormatError, "manifest.json"),
    ("missing manifest", lambda r: (r / "manifest.json").unlink(), ss.FormatError, "manifest.json"),
    (
        "manifest without shards",
        lambda r: edit_manifest(r, lambda m: m.pop("shards" if "shards" in m else "shard_table")),
        ss.CorruptionError,
        "manifest.json",
    ),
    (
        "manifest rows not a dict",
        lambda r: replace_in_shard_meta(r, 0, '"rows":{"x":10}', '"rows":[1]'),
        ss.CorruptionError,
        {1: "manifest.json", 3: "shard-000000/_shard.json"},
    ),
    (
        "manifest infinite records",
        lambda r: replace_in_shard_meta(r, 0, '"records":5', '"records":Infinity'),
        ss.CorruptionError,
        {1: "manifest.json", 3: "shard-000000/_shard.json"},
    ),
    (
        "manifest bad schema",
        lambda r: edit_manifest(r, lambda m: m["schema"].update(x={"dtype": "U4", "shape": []})),
        ss.CorruptionError,
        "manifest.json",
    ),
    (
        "manifest negative records",
        lambda r: edit_shard_meta(r, 1, lambda s: s.update(records=-1)),
        ss.CorruptionError,
        {1: "manifest.json", 3: "_shards.tbl row 1"},
    ),
    (
        "manifest more records",
        lambda r: edit_shard_meta(r, 1, lambda s: s.update(records=6)),
        ss.CorruptionError,
        "shard-000001",
    ),
    (
        "manifest file size",
        lambda r: edit_shard_meta(r, 0, lambda s: s["files"]["x.npy"].update(bytes=999)),
        ss.CorruptionError,
        "shard-000000/x.npy",
    ),
    (
        "manifest more rows",
        lambda r: edit_shard_meta(r, 0, lambda s: s["rows"].update(x=11)),
        ss.CorruptionError,
        "shard-000000/x",
    ),
    (
        "header dtype",
        lambda r: rewrite_header(shard(r) / "x.npy", "<i4", (10, 3)),
        ss.CorruptionError,
        "shard-000000/x.npy",
    ),
    (
        "header shape",
        lambda r: rewrite_header(shard(r) / "x.npy", "<f4", (5, 6)),
        ss.CorruptionError,
        "shard-000000/x.npy",
    ),
    (
        "header fewer rows",
        lambda r: rewrite_header(shard(r, 1) / "meta/k.npy", "<i8", (4,)),
        ss.CorruptionError,
        "shard-000001/meta/k.npy",
    ),
    (
        "header endianness",
        lambda r: rewrite_header(shard(r, 1) / "meta/k.npy", ">i8", (5,)),
        ss.CorruptionError,
        "meta/k.npy",
    ),
    (
        "header bad magic",
        lambda r: open(shard(r) / "x.npy", "r+b").write(b"\x93NUMPX"),
        ss.CorruptionError,
        "shard-000000/x.npy",
    ),
    (
        "header garbage dict",
        lambda r: open(shard(r) / "x.npy", "r+b").write(b"\x93NUMPY\x01\x00\x76\x00{'descr': ?"),
        ss.CorruptionError,
        "shard-000000/x.npy",
    ),
    (
        "header fortran",
        lambda r: open(shard(r) / "x.npy", "r+b").write(
            encode_header(np.dtype("<f4"), (10, 3)).replace(b"False", b"True ")
        ),
        ss.CorruptionError,
        "shard-000000/x.npy",
    ),
    (
        "last offset beyond rows",
        lambda r: poke_int64(shard(r) / "x.offsets.npy", 5, 11),
        ss.CorruptionError,
        "shard-000000/x.offsets.npy",
    ),
    (
        "last offset short",
        lambda r: poke_int64(shard(r) / "x.offsets.npy", 5, 9),
        ss.CorruptionError,
        "shard-000000/x.offsets.npy",
    ),
    (
        "first offset",
        lambda r: poke_int64(shard(r, 1) / "x.offsets.npy", 0, 1),
        ss.CorruptionError,
        "shard-000001/x.offsets.npy",
    ),
    (
        "middle offset beyond rows",
        lambda r: poke_int64(shard(r) / "x.offsets.npy", 3, 1000),
        ss.CorruptionError,
        "shard-000000/x.offsets.npy",
    ),
    (
        "middle offset huge",
        lambda r: poke_int64(shard(r) / "x.offsets.npy", 2, 2**62),
        ss.CorruptionError,
        "shard-000000/x.offsets.npy",
    ),
    (
        "middle offset negative",
        lambda r: poke_int64(shard(r, 1) / "x.offsets.npy", 2, -4),
        ss.CorruptionError,
        "shard-000001/x.offsets.npy",
    ),
    (
        "middle offset decreasing",
        lambda r: poke_int64(shard(r) / "x.offsets.npy", 4, 0),
        ss.CorruptionError,
        "shard-000000/x.offsets.npy",
    ),
    (
        "id offset beyond",
        lambda r: poke_int64(shard(r) / "_ids.offsets.npy", 2, 10**6),
        ss.CorruptionError,
        "shard-000000/_ids.offsets.npy",
    ),
    (
        "id offset negative",
        lambda r: poke_int64(shard(r, 1) / "_ids.offsets.npy", 3, -3),
        ss.CorruptionError,
        "shard-000001/_ids.offsets.npy",
    ),
    (
        "first id offset",
        lambda r: poke_int64(shard(r) / "_ids.offsets.npy", 0, 2),
        ss.CorruptionError,
        "shard-000000/_ids.offsets.npy",
    ),
    (  # the last offset sizes the mapping of _ids.npy: a damaged one named the ids' header instead
        "last id offset negative",
        lambda r: poke_int64(shard(r) / "_ids.offsets.npy", 5, -(2**56)),
        ss.CorruptionError,
        "shard-000000/_ids.offsets.npy",
    ),
    (
        "last id offset beyond the ids",
        lambda r: poke_int64(shard(r, 1) / "_ids.offsets.npy", 5, 10**9),
        ss.CorruptionError,
        "shard-000001/_ids.offsets.npy",
    ),
    (
        "id hash rows out of range",
        lambda r: [poke_int64(shard(r) / "_ids.hash_rows.npy", j, 77) for j in range(5)],
        ss.CorruptionError,
        "s",
    ),
    (
        "id hash rows negative",
        lambda r: [poke_int64(shard(r, 1) / "_ids.hash_rows.npy", j, -9) for j in range(5)],
        ss.CorruptionError,
        "s",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_corruption_is_reported(
    store_root: Path, case: tuple[str, Callable[[Path], None], type, str | dict[int, str]]
) -> None:
    _, damage, error, where = case
    touch_everything(store_root)  # sane before
    if isinstance(where, dict):
        where = where[_version(store_root)]
    damage(store_root)
    with pytest.raises(error) as info:
        touch_everything(store_root)
    assert isinstance(info.value, (ss.CorruptionError, ss.FormatError))
    msg = str(info.value)
    assert str(store_root) in msg, msg
    assert where in msg, msg


def test_damage_to_one_shard_leaves_the_others_readable(store_root: Path) -> None:
    truncate(shard(store_root, 1) / "x.npy", 4)
    store = ss.open(store_root)  # open reads the manifest only
    np.testing.assert_array_equal(store[4]["x"], child_record(0, 4)["x"])
    with pytest.raises(ss.CorruptionError, match="shard-000001"):
        store[5]
    with pytest.raises(ss.CorruptionError, match="shard-000001"):
        store[5]  # and again: a failed shard is not half-cached


def test_middle_offset_damage_reported_per_record(store_root: Path) -> None:
    poke_int64(shard(store_root) / "x.offsets.npy", 3, 1000)  # records 2 and 3 of shard 0
    store = ss.open(store_root)
    np.testing.assert_array_equal(store[1]["x"], child_record(0, 1)["x"])
    for i in (2, 3):
        with pytest.raises(ss.CorruptionError, match="x.offsets.npy"):
            store[i]
        with pytest.raises(ss.CorruptionError, match="x.offsets.npy"):
            store.get_batch([i])
        with pytest.raises(ss.CorruptionError, match="x.offsets.npy"):
            store.lengths()[i]
    with pytest.raises(ss.CorruptionError):
        np.asarray(store.lengths())
    assert store.get_batch([0, 1, 4], pad=True)["x"][1].tolist() == [0, 1, 4]


def test_an_id_damaged_into_invalid_utf8_is_named(store_root: Path) -> None:
    """A flipped bit that leaves an id's bytes invalid UTF-8: id(i) raised a bare UnicodeDecodeError."""
    path = shard(store_root, 1) / "_ids.npy"
    raw = bytearray(path.read_bytes())
    raw[HEADER_BYTES + len(IDS[5]) + 1] = 0xB5  # inside record 6's id ("w0-6"): a lone continuation byte
    path.write_bytes(bytes(raw))
    store = ss.open(store_root)
    assert store.id(5) == IDS[5]
    with pytest.raises(ss.CorruptionError, match=r"shard-000001/_ids.npy: record 6 \(row 1 of the shard\): its id"):
        store.id(6)


def test_lost_index_run_falls_back_to_shards(scratch: Path) -> None:
    root = scratch / "s"
    with ss.create(root, CHILD_SCHEMA, max_shard_records=1) as w:
        for i in range(9):
            w.append(child_record(0, i), id=f"w0-{i}")
    store = ss.open(root)
    (run,) = store.manifest.index_runs
    truncate(root / f"{run.name}.rows.npy", 8)
    assert ss.open(root).index_many([f"w0-{i}" for i in range(9)]).tolist() == list(range(9))
    os.unlink(root / f"{run.name}.hash.npy")
    assert ss.open(root).index("w0-8") == 8


def test_damaged_index_run_rows_never_give_wrong_answers(scratch: Path) -> None:
    root = scratch / "s"
    with ss.create(root, CHILD_SCHEMA, max_shard_records=1) as w:
        for i in range(8):
            w.append(child_record(0, i), id=f"w0-{i}")
    (run,) = ss.open(root).manifest.index_runs
    rows = np.load(root / f"{run.name}.rows.npy")
    for j in range(len(rows)):  # rotate the rows: every candidate now names another record
        poke_int64(root / f"{run.name}.rows.npy", j, int(rows[(j + 1) % len(rows)]))
    store = ss.open(root)
    for i in range(8):
        try:
            got = store.index(f"w0-{i}")
        except (KeyError, ss.CorruptionError):
            continue
        assert got == i  # the id bytes are always compared
    for j in range(len(rows)):
        poke_int64(root / f"{run.name}.rows.npy", j, 10**9)
    with pytest.raises(ss.CorruptionError, match="out of range"):
        ss.open(root).index("w0-3")
    with pytest.raises(ss.CorruptionError, match="out of range"):
        ss.open(root).index_many(["w0-3"])


def test_unreadable_file_is_a_corruption_error(store_root: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = shard(store_root) / "x.npy"
    path.chmod(0)
    try:
        with pytest.raises(ss.CorruptionError, match="x.npy"):
            touch_everything(store_root)
    finally:
        path.chmod(0o644)


def test_overlapping_or_empty_index_runs_are_corruption(tmp_path: Path) -> None:
    import json

    path = tmp_path / "s"
    with ss.create(path, {"x": ss.Field("int8")}, max_shard_records=1) as w:
        for i in range(3):
            w.append({"x": i}, id=f"r{i}")
    m = json.loads((path / "manifest.json").read_text())
    m["index_runs"] = [{"name": "_index/run-000001-000001", "first_shard": 1, "end_shard": 1, "records": 0,
                        "level": 1}]
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ss.CorruptionError, match="index run"):
        ss.open(path)


def test_verify_of_a_badly_damaged_store_is_linear_in_its_shards(scratch: Path) -> None:
    """verify() asked, for every shard, whether any problem found so far named it: O(shards x problems)
    on a store whose every shard is damaged. Counted in Python lines run (not time): twice the shards,
    about twice the work."""
    import sys

    def lines_run(n: int) -> int:
        root = scratch / f"s{n}"
        with create_legacy(root, {"a": ss.Field("int32", ())}) as w:
            w.append({"a": np.int32(0)})
        m = json.loads((root / "manifest.json").read_text())
        m["shards"] = [dict(m["shards"][0], name=f"shard-{k:06d}") for k in range(n)]  # all but one missing
        (root / "manifest.json").write_text(json.dumps(m))
        count = [0]

        def local(frame: object, event: str, arg: object) -> object:
            count[0] += 1
            return local

        def trace(frame: object, event: str, arg: object) -> object:
            return local if "seqstore" in frame.f_code.co_filename else None  # type: ignore[attr-defined]

        old = sys.gettrace()
        sys.settrace(trace)
        try:
            problems = verify(root)
        finally:
            sys.settrace(old)
        assert len(problems) == n - 1 and all("file is missing" in p for p in problems)
        return count[0]

    small, big = lines_run(150), lines_run(300)
    assert big < 2.2 * small, (small, big)


@pytest.mark.parametrize("packed", [None, {"g": ["a", "b"]}])
def test_a_version_1_2_store_replaced_under_a_reader_is_an_error(scratch: Path, packed: object) -> None:
    """A version-1/2 store replaced by another with files of the same names and sizes: a Store opened on
    the old one mapped the new store's files for a shard it had not touched yet and answered the new
    store's records as the old ones, silently (version 3 finds it by the CRC of the shard's descriptor).
    A commit that only appends is no alarm."""
    root = scratch / "s"
    schema = {"a": ss.Field("int32", ()), "b": ss.Field("int32", ())}

    def write(base: int) -> None:
        with create_legacy(root, schema, version=1 if packed is None else 2, packed=packed,
                           max_shard_records=2) as w:
            w.append_batch({"a": np.arange(base, base + 6, dtype=np.int32), "b": np.zeros(6, np.int32)})

    write(0)
    store = ss.open(root)
    assert int(store[0]["a"]) == 0
    with ss.append_to(root) as w:  # a commit since open: the shards the Store knows are the same
        w.append({"a": np.int32(6), "b": np.int32(0)})
    assert int(store[2]["a"]) == 2 and len(store) == 6
    shutil.rmtree(root)
    write(100)
    with pytest.raises(ss.CorruptionError, match="replaced since this Store read its manifest"):
        store[4]
    assert int(store[1]["a"]) == 1  # (a shard mapped before: its own files, still)
    assert int(store.refresh()[4]["a"]) == 104


@pytest.mark.parametrize("version", [1, 3])
def test_ids_of_a_shard_mapped_before_its_store_was_replaced_are_an_error(scratch: Path, version: int) -> None:
    """A shard's id files are mapped on its first id lookup, after its other files: a Store that had
    mapped a shard before the store was replaced (same file names) answered the new store's ids for the
    old records (id(2) was "new-2" beside record 2's old values), unchecked in every version."""
    root = scratch / "s"

    def write(tag: str) -> None:
        if version == 3:
            w = ss.create(root, {"a": ss.Field("int32", ())}, max_shard_records=2, overwrite=root.exists())
        else:
            if root.exists():
                shutil.rmtree(root)
            w = create_legacy(root, {"a": ss.Field("int32", ())}, max_shard_records=2)
        with w:
            w.append_batch({"a": np.arange(6, dtype=np.int32)}, ids=[f"{tag}-{i}" for i in range(6)])

    write("old")
    store = ss.open(root)
    assert int(store[2]["a"]) == 2  # shard 1 mapped, its ids not
    write("new")
    for lookup in (lambda: store.id(2), lambda: store.ids([3]), lambda: store.index("old-3")):
        with pytest.raises(ss.CorruptionError, match="replaced"):
            lookup()
    assert store.refresh().id(2) == "new-2"
