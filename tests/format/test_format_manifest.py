"""manifest.json: round trip, atomic replacement, and strict validation on load."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import seqstore as ss
from seqstore.format.manifest import FORMAT_NAME, FORMAT_VERSION, MANIFEST, FileInfo, IndexRun, Manifest, ShardInfo

SCHEMA = ss.Schema({"x": ss.Field("float16", (None, 16)), "y/z": ss.Field("int32", ())})


def _manifest() -> Manifest:
    shard = ShardInfo(
        "shard-000000",
        3,
        {"x": 10},
        {"x.npy": FileInfo(448, 12345), "x.offsets.npy": FileInfo(160, 1), "y/z.npy": FileInfo(140, 2)},
        has_ids=False,
    )
    shards = [dataclasses.replace(shard, name=f"shard-{k:06d}") for k in range(8)]
    run = IndexRun("_index/run-000000-000008", 0, 8, 100, 1)
    return Manifest(SCHEMA, shards, [run], {"who": "me", "n": [1, 2]}, {"x": {"mean": 3.5}}, generation=4)


def test_round_trip(tmp_path: Path) -> None:
    m = _manifest()
    m.save(tmp_path)
    raw = json.loads((tmp_path / MANIFEST).read_text())
    assert raw["format"] == FORMAT_NAME == "seqstore" and raw["version"] == 1 and FORMAT_VERSION == 3
    back = Manifest.load(tmp_path)
    assert back == m
    assert back.num_records == 24
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST]  # no temporary file left


def test_save_replaces(tmp_path: Path) -> None:
    m = _manifest()
    m.save(tmp_path)
    m.generation = 5
    m.shards = []
    m.index_runs = []
    m.save(tmp_path)
    back = Manifest.load(tmp_path)
    assert back.generation == 5 and back.shards == [] and back.num_records == 0


def test_a_save_that_fails_leaves_no_temporary_file(tmp_path: Path) -> None:
    """The temporary manifest stayed at the top of the store when the rename (or a write) failed."""
    (tmp_path / MANIFEST).mkdir()
    (tmp_path / MANIFEST / "x").write_text("x")  # (a rename onto a non-empty directory fails)
    with pytest.raises(OSError):
        _manifest().save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST]


def _write(tmp_path: Path, obj: Any) -> None:
    (tmp_path / MANIFEST).write_text(json.dumps(obj) if not isinstance(obj, str) else obj)


def _good() -> dict[str, Any]:
    return _manifest().to_json()


@pytest.mark.parametrize(
    "mutate, error",
    [
        (lambda m: m.update(version=FORMAT_VERSION + 1), ss.FormatError),
        (lambda m: m.update(version=99), ss.FormatError),
        (lambda m: m.update(version=0), ss.CorruptionError),
        (lambda m: m.update(version=None), ss.CorruptionError),
        (lambda m: m.pop("version"), ss.CorruptionError),
        (lambda m: m.update(format="other"), ss.FormatError),
        (lambda m: m.pop("format"), ss.FormatError),
        (lambda m: m.pop("schema"), ss.CorruptionError),
        (lambda m: m.update(schema={}), ss.CorruptionError),
        (lambda m: m.update(schema={"x": {"dtype": "float16"}}), ss.CorruptionError),
        (lambda m: m["schema"]["x"].update(dtype=",f2"), ss.CorruptionError),  # numpy: a SyntaxError
        (lambda m: m.pop("shards"), ss.CorruptionError),
        (lambda m: m.update(shards={"a": 1}), ss.CorruptionError),
        (lambda m: m["shards"][0].pop("records"), ss.CorruptionError),
        (lambda m: m["shards"][0].update(records="many"), ss.CorruptionError),
        (lambda m: m["shards"][0].update(records=-1), ss.CorruptionError),
        (lambda m: m["shards"][0].update(rows={}), ss.CorruptionError),  # ragged field without rows
        (lambda m: m["shards"][0].update(rows={"x": 1, "y/z": 1}), ss.CorruptionError),  # rows of a fixed field
        (lambda m: m["shards"][0].update(rows={"x": -5}), ss.CorruptionError),
        (lambda m: m["shards"][0].update(rows=[10]), ss.CorruptionError),
        (lambda m: m["shards"][0].update(files=[]), ss.CorruptionError),
        (lambda m: m["shards"][0]["files"]["x.npy"].pop("crc32"), ss.CorruptionError),
        (lambda m: m["shards"][0].pop("has_ids"), ss.CorruptionError),
        # a name outside the store, not shard-NNNNNN, or not above the one before; has_ids not a bool or not agreed
        (lambda m: m["shards"][1].update(name="../other/shard-000001"), ss.CorruptionError),
        (lambda m: m["shards"][1].update(name="shard-000000"), ss.CorruptionError),
        (lambda m: m["shards"][1].update(name=7), ss.CorruptionError),
        # a shard number past int64 (the shard table's column): an OverflowError naming nothing at open
        (lambda m: m["shards"][7].update(name="shard-" + "9" * 20), ss.CorruptionError),
        (lambda m: m["shards"][1].update(has_ids="no"), ss.CorruptionError),
        (lambda m: m["shards"][1].update(has_ids=True), ss.CorruptionError),
        # a version-1/2 shard's files: those of the schema (a path out of the shard directory was read by
        # verify and copy, and copy wrote it out of the destination), with sizes and CRC-32s in range
        (lambda m: m["shards"][0]["files"].update({"../../a.npy": {"bytes": 1, "crc32": 0}}), ss.CorruptionError),
        (lambda m: m["shards"][0]["files"].update({"/etc/a.npy": {"bytes": 1, "crc32": 0}}), ss.CorruptionError),
        (lambda m: m["shards"][0]["files"].update({"_ids.npy": {"bytes": 1, "crc32": 0}}), ss.CorruptionError),
        (lambda m: m["shards"][0]["files"]["x.npy"].update(bytes=-1), ss.CorruptionError),
        (lambda m: m["shards"][0]["files"]["x.npy"].update(crc32=1 << 32), ss.CorruptionError),
        (lambda m: m["index_runs"][0].pop("level"), ss.CorruptionError),
        # an index run's files are _index/<name>.*.npy: never a path out of the store's _index/
        (lambda m: m["index_runs"][0].update(name="../../run-000000-000008"), ss.CorruptionError),
        (lambda m: m["index_runs"][0].update(name="_index/../../x"), ss.CorruptionError),
        (lambda m: m["index_runs"][0].update(name="/tmp/x"), ss.CorruptionError),
        (lambda m: m["index_runs"][0].update(name="shard-000000/_ids"), ss.CorruptionError),
        (lambda m: m.update(metadata=[1]), ss.CorruptionError),
        (lambda m: m.update(stats="x"), ss.CorruptionError),
    ],
)
def test_invalid_manifests(tmp_path: Path, mutate: Any, error: type[Exception]) -> None:
    obj = _good()
    mutate(obj)
    _write(tmp_path, obj)
    with pytest.raises(error) as info:
        Manifest.load(tmp_path)
    assert str(tmp_path / MANIFEST) in str(info.value)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda m: m["shards"][0].update(records=2.9),
        lambda m: m["shards"][0].update(records="3"),
        lambda m: m["shards"][0].update(records=True),
        lambda m: m["shards"][0].update(rows={"x": 10.5}),
        lambda m: m["shards"][0]["files"]["x.npy"].update(bytes="448"),
        lambda m: m["shards"][0]["files"]["x.npy"].update(crc32=12345.7),
        lambda m: m["index_runs"][0].update(end_shard=7.5),
        lambda m: m["index_runs"][0].update(records="100"),
        lambda m: m["index_runs"][0].update(level=False),
        lambda m: m.update(generation="4"),
        lambda m: m.update(generation=4.5),
        lambda m: m.update(generation=-1),
    ],
)
def test_a_count_that_is_no_integer_is_refused_not_truncated(tmp_path: Path, mutate: Any) -> None:
    """int() turned 2.9 records into 2, "448" bytes into 448 and true into 1: a hand-edited or damaged
    count was read as another number."""
    obj = _good()
    mutate(obj)
    _write(tmp_path, obj)
    with pytest.raises(ss.CorruptionError, match="non-negative integer") as info:
        Manifest.load(tmp_path)
    assert str(tmp_path / MANIFEST) in str(info.value)


@pytest.mark.parametrize("text", ["", "{", "\x00", "[1, 2]", "null", "42", '"seqstore"', "{'single': 1}"])
def test_not_a_manifest(tmp_path: Path, text: str) -> None:
    _write(tmp_path, text)
    with pytest.raises((ss.CorruptionError, ss.FormatError)) as info:
        Manifest.load(tmp_path)
    assert MANIFEST in str(info.value)


def test_non_utf8_and_non_finite(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_bytes(b'{"format": "seqstore", "version": 1, "x": "\xff"}')
    with pytest.raises(ss.CorruptionError, match=MANIFEST):
        Manifest.load(tmp_path)
    text = json.dumps(_good()).replace('"records": 3', '"records": NaN')
    _write(tmp_path, text)
    with pytest.raises(ss.CorruptionError, match=MANIFEST):
        Manifest.load(tmp_path)


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a":' * 100_000])
def test_deeply_nested_json_is_named_corrupt(tmp_path: Path, text: str) -> None:
    """json.loads raised a bare RecursionError for the manifest, and for a shard descriptor."""
    import zlib

    from seqstore.format.descriptor import parse_descriptor
    from seqstore.format.shard_table import ShardRow

    _write(tmp_path, text)
    with pytest.raises(ss.CorruptionError, match=f"{MANIFEST}: not valid JSON .*nested"):
        Manifest.load(tmp_path)
    raw = text.encode()
    row = ShardRow(0, 0, 0, False, {}, zlib.crc32(raw))
    with pytest.raises(ss.CorruptionError, match="shard-000000/_shard.json: malformed shard descriptor .*nested"):
        parse_descriptor(raw, "shard-000000/_shard.json", "shard-000000", row, ())


def test_missing(tmp_path: Path) -> None:
    with pytest.raises(ss.FormatError, match="does not exist"):
        Manifest.load(tmp_path / "nope")
    with pytest.raises(ss.FormatError, match=MANIFEST):
        Manifest.load(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ss.FormatError):
        Manifest.load(tmp_path / "file")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / MANIFEST).mkdir()
    with pytest.raises(ss.FormatError, match=MANIFEST):
        Manifest.load(tmp_path / "d")
