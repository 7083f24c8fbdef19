"""Format version 3: the binary shard table and per-shard descriptors (docs/format.md, sections 2 and 7).

Round trips, damage to the table (truncated, torn rows past the committed end, rows damaged inside
it) and to descriptors (missing, wrong CRC, disagreeing with the table), open without touching any
descriptor, versions 1 and 2 next to 3, and many commits into one store.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from store_testlib import CHILD_SCHEMA, child_record, create_legacy, edit_shard_meta

import seqstore as ss
from seqstore.format import descriptor as descriptor_mod
from seqstore.format import manifest as manifest_mod
from seqstore.format.descriptor import DESCRIPTOR
from seqstore.format.manifest import Manifest
from seqstore.format.shard_table import TABLE, TABLE_HEADER_BYTES, ShardTable, row_dtype
from seqstore.store.verify import verify

ROW = row_dtype(1).itemsize  # CHILD_SCHEMA has one ragged field


def _write(root: Path, n: int, per_shard: int = 4, tag: int = 0, first: int = 0) -> None:
    w = ss.append_to(root, max_shard_records=per_shard) if root.exists() else ss.create(
        root, CHILD_SCHEMA, max_shard_records=per_shard
    )
    with w:
        for i in range(first, first + n):
            w.append(child_record(tag, i), id=f"r{i}")


def _check(root: Path, n: int) -> None:
    store = ss.open(root)
    assert len(store) == n
    for i in range(n):
        want = child_record(0, i)
        np.testing.assert_array_equal(store[i]["x"], want["x"])
        assert int(store[i]["meta/k"]) == want["meta"]["k"] and store.id(i) == f"r{i}"
    assert store.index_many([f"r{i}" for i in range(n)]).tolist() == list(range(n))
    assert store.get_batch(np.arange(n)[::-1])["meta/k"].tolist() == [child_record(0, i)["meta"]["k"]
                                                                      for i in reversed(range(n))]


@pytest.fixture
def root(scratch: Path) -> Path:
    r = scratch / "s"
    _write(r, 10)  # shards of 4, 4, 2
    return r


# ----------------------------------------------------------------------------------- round trip


def test_layout_and_round_trip(root: Path) -> None:
    raw = json.loads((root / "manifest.json").read_text())
    assert raw["version"] == 3 and "shards" not in raw
    assert raw["shard_table"] == {"file": TABLE, "rows": 3, "records": 10, "crc32": raw["shard_table"]["crc32"]}
    assert (root / TABLE).stat().st_size == TABLE_HEADER_BYTES + 3 * ROW
    rows = np.frombuffer((root / TABLE).read_bytes(), dtype=row_dtype(1), offset=TABLE_HEADER_BYTES)
    assert rows["number"].tolist() == [0, 1, 2] and rows["start"].tolist() == [0, 4, 8]
    assert rows["records"].tolist() == [4, 4, 2] and rows["flags"].tolist() == [1, 1, 1]
    assert rows["rows"][:, 0].tolist() == [0 + 1 + 2 + 3, 4 + 0 + 1 + 2, 3 + 4]
    for k in range(3):
        d = json.loads((root / f"shard-{k:06d}" / DESCRIPTOR).read_text())
        assert d["records"] == int(rows["records"][k]) and d["has_ids"] is True
        assert set(d["files"]) == {"x.npy", "x.offsets.npy", "meta/k.npy", "_ids.npy", "_ids.offsets.npy",
                                   "_ids.hash.npy", "_ids.hash_rows.npy"}
        for rel, fi in d["files"].items():
            assert (root / f"shard-{k:06d}" / rel).stat().st_size == fi["bytes"]
    _check(root, 10)
    store = ss.open(root)
    assert store.num_shards == 3 and store.has_ids and store.manifest.version == 3
    assert store.manifest.total_rows("x") == sum(i % 5 for i in range(10))
    assert verify(root) == []


def test_appending_continues_the_table(root: Path) -> None:
    _write(root, 7, first=10)
    _check(root, 17)
    assert json.loads((root / "manifest.json").read_text())["shard_table"]["rows"] == 5
    assert verify(root) == []


def test_packed_and_last_id_stores_are_version_3(scratch: Path) -> None:
    schema = {"a": ss.Field("float32", (2,)), "b": ss.Field("float32"), "t": ss.Field("int8", (None,))}
    with ss.create(scratch / "p", schema, packed={"g": ["a", "b"]}, id_lookup="last", max_shard_records=3) as w:
        for i in range(7):
            w.append({"a": [i, i], "b": -i, "t": np.arange(i % 3, dtype=np.int8)}, id=f"k{i % 4}")
    st = ss.open(scratch / "p")
    assert st.manifest.version == 3 and st.manifest.id_lookup == "last" and st.groups
    assert st.index("k1") == 5 and st[6]["a"].tolist() == [6, 6] and verify(scratch / "p") == []
    assert "g.npy" in st.manifest.shards[0].files


# ------------------------------------------------------------------------------ the shard table


def test_a_torn_row_past_the_committed_end_is_ignored_and_overwritten(root: Path) -> None:
    with open(root / TABLE, "ab") as f:  # a writer died while appending row 3 (part of it reached the disk)
        f.write(b"\xab" * (ROW - 5))
    _check(root, 10)
    assert verify(root) == []
    _write(root, 3, first=10)  # the next commit writes its row over the torn one
    assert (root / TABLE).stat().st_size == TABLE_HEADER_BYTES + 4 * ROW
    _check(root, 13)
    assert verify(root) == []


def test_commits_only_append_to_the_table(root: Path) -> None:
    before = (root / TABLE).read_bytes()
    store = ss.open(root)  # a reader that keeps its mapping while others commit
    _write(root, 9, first=10)
    after = (root / TABLE).read_bytes()
    assert after[: len(before)] == before and len(after) == len(before) + 3 * ROW
    assert len(store) == 10 and int(store[9]["meta/k"]) == 9  # the old view is intact
    assert len(store.refresh()) == 19 and store.id(18) == "r18"


def test_a_commit_that_dies_before_the_manifest_leaves_the_store_as_it_was(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def killed(self: Manifest, where: Any) -> None:
        raise KeyboardInterrupt("killed before the manifest was replaced")

    monkeypatch.setattr(Manifest, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        _write(root, 2, first=10)
    monkeypatch.undo()
    # the shard was renamed and its row appended, but the manifest still counts 3 rows
    assert (root / "shard-000003").is_dir() and (root / TABLE).stat().st_size == TABLE_HEADER_BYTES + 4 * ROW
    _check(root, 10)
    assert verify(root) == []
    _write(root, 2, first=10)  # removes the uncommitted shard-000003, then commits its own as number 3
    _check(root, 12)
    assert sorted(p.name for p in root.glob("shard-*")) == [f"shard-{k:06d}" for k in range(4)]
    assert verify(root) == []


def test_a_truncated_table_fails_at_open(root: Path) -> None:
    with open(root / TABLE, "r+b") as f:
        f.truncate(TABLE_HEADER_BYTES + 2 * ROW + 7)
    with pytest.raises(ss.CorruptionError, match=rf"{TABLE}: .* expected at least {TABLE_HEADER_BYTES + 3 * ROW}"):
        ss.open(root)
    assert any(TABLE in p for p in verify(root))


@pytest.mark.parametrize("what", ["missing", "magic", "row size"])
def test_a_missing_or_foreign_table_fails_at_open(root: Path, what: str) -> None:
    if what == "missing":
        (root / TABLE).unlink()
    else:
        raw = bytearray((root / TABLE).read_bytes())
        at = 0 if what == "magic" else 12
        raw[at] ^= 0x40
        (root / TABLE).write_bytes(bytes(raw))
    with pytest.raises(ss.CorruptionError) as info:
        ss.open(root)
    assert str(root / TABLE) in str(info.value)
    assert {"missing": "missing", "magic": "not a shard table", "row size": "expected 1 and 48"}[what] in str(
        info.value
    )


def _flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))


def test_a_damaged_row_is_named_when_its_shard_is_touched(root: Path) -> None:
    _flip(root / TABLE, TABLE_HEADER_BYTES + 0 * ROW + 20)  # inside row 0's record count
    store = ss.open(root)  # open checks the last row only
    assert len(store) == 10
    np.testing.assert_array_equal(store[9]["x"], child_record(0, 9)["x"])  # shard 2: rows 1 and 2 are sound
    for i in (0, 5):  # shard 0 (its own row), shard 1 (the row before it)
        with pytest.raises(ss.CorruptionError, match=rf"{TABLE} row 0: CRC-32 .* differs"):
            store[i]
    problems = verify(root)
    assert any(f"{TABLE} row 0" in p for p in problems), problems
    assert any("committed rows differs from manifest.json" in p for p in problems), problems


@pytest.mark.parametrize("read", ["item", "batch", "id", "matrix", "iter_matrix"])
def test_a_damaged_start_of_row_0_is_named_not_a_crash(root: Path, read: str) -> None:
    """Row 0's start damaged to above the records asked for: finding their shard gave -1, and reads failed
    with AttributeError ('NoneType' object has no attribute ...) instead of naming the damaged row."""
    _flip(root / TABLE, TABLE_HEADER_BYTES + 8 + 2)  # row 0's start becomes 65536
    store = ss.open(root)
    reads = {
        "item": lambda: store[1],
        "batch": lambda: store.get_batch([1, 2]),
        "id": lambda: store.id(1),
        "matrix": lambda: store.matrix("meta/k"),
        "iter_matrix": lambda: list(store.iter_matrix("meta/k", chunk_rows=2)),
    }
    with pytest.raises(ss.CorruptionError, match=rf"{TABLE} row 0: CRC-32 .* differs"):
        reads[read]()


def test_a_damaged_ids_flag_of_row_0_is_named_not_taken_for_no_ids(root: Path) -> None:
    """Row 0's flags decide whether the records have ids: a flipped bit there made the store answer "records
    have no ids" (KeyError from id(), has_ids False, so exports fell back to record numbers) without a check."""
    _flip(root / TABLE, TABLE_HEADER_BYTES + 24)  # row 0's flags: the ids bit
    store = ss.open(root)
    for read in (lambda: store.has_ids, lambda: store.id(5), lambda: store.index("r5")):
        with pytest.raises(ss.CorruptionError, match=rf"{TABLE} row 0: CRC-32 .* differs"):
            read()


def test_a_damaged_last_row_fails_at_open(root: Path) -> None:
    _flip(root / TABLE, TABLE_HEADER_BYTES + 2 * ROW + 3)
    with pytest.raises(ss.CorruptionError, match=rf"{TABLE} row 2: CRC-32"):
        ss.open(root)


def test_rows_that_do_not_continue_each_other_are_corruption(root: Path) -> None:
    edit_shard_meta(root, 1, lambda s: None)  # rewrite the table consistently, then break one start
    raw = bytearray((root / TABLE).read_bytes())
    rows = np.frombuffer(bytes(raw), dtype=row_dtype(1), offset=TABLE_HEADER_BYTES).copy()
    rows[1]["start"] = 3
    from seqstore.format.shard_table import encode_row

    r = rows[1]
    fixed = encode_row(int(r["number"]), 3, int(r["records"]), True, [int(r["rows"][0])], int(r["desc_crc"]))
    raw[TABLE_HEADER_BYTES + ROW : TABLE_HEADER_BYTES + 2 * ROW] = fixed  # a valid CRC, a wrong start
    (root / TABLE).write_bytes(bytes(raw))
    store = ss.open(root)
    with pytest.raises(ss.CorruptionError, match=rf"{TABLE} row 1: starts at record 3 .* expected record 4"):
        store[4]
    assert any("row 1: starts at record 3" in p for p in verify(root))


def test_the_manifest_crc_sees_a_rewritten_row_with_a_valid_crc(root: Path) -> None:
    """Two rows' descriptor CRCs swapped, each row re-sealed with a valid row CRC: only the manifest's
    CRC of the committed rows can tell (it leaves the self-sealing row CRCs out, so it depends on the
    rows' content; over whole rows it would be the same constant for any content)."""
    from seqstore.format.shard_table import encode_row

    raw = bytearray((root / TABLE).read_bytes())
    rows = np.frombuffer(bytes(raw), dtype=row_dtype(1), count=3, offset=TABLE_HEADER_BYTES).copy()
    for k, other in ((0, 1), (1, 0)):
        r = rows[k]
        row = encode_row(int(r["number"]), int(r["start"]), int(r["records"]), True, [int(r["rows"][0])],
                         int(rows[other]["desc_crc"]))
        raw[TABLE_HEADER_BYTES + k * ROW : TABLE_HEADER_BYTES + (k + 1) * ROW] = row
    (root / TABLE).write_bytes(bytes(raw))
    problems = verify(root)
    assert any(f"{TABLE}: CRC-32" in p and "committed rows differs from manifest.json" in p for p in problems), problems
    store = ss.open(root)
    with pytest.raises(ss.CorruptionError, match="_shard.json"):
        store[0]  # the descriptor no longer matches its row's CRC


# ------------------------------------------------------------------------------- descriptors


def test_open_reads_no_descriptor(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in range(3):  # every descriptor unreadable
        d = root / f"shard-{k:06d}" / DESCRIPTOR
        d.unlink()
        d.mkdir()
    calls: list[Path] = []
    real = manifest_mod.read_descriptor

    def spy(shard_dir: Path, *a: Any) -> Any:
        calls.append(shard_dir)
        return real(shard_dir, *a)

    monkeypatch.setattr(manifest_mod, "read_descriptor", spy)
    store = ss.open(root)
    assert len(store) == 10 and store.num_shards == 3 and store.has_ids and calls == []
    assert repr(store).endswith("records=10, shards=3)")
    with pytest.raises(ss.CorruptionError, match="shard-000001/_shard.json: cannot read the shard descriptor"):
        store[5]
    assert calls == [root / "shard-000001"]


def test_a_missing_descriptor_is_named_on_first_touch(root: Path) -> None:
    (root / "shard-000001" / DESCRIPTOR).unlink()
    store = ss.open(root)
    assert len(store) == 10
    np.testing.assert_array_equal(store[8]["x"], child_record(0, 8)["x"])
    with pytest.raises(ss.CorruptionError, match=r"shard-000001/_shard.json: shard descriptor is missing"):
        store[4]
    with pytest.raises(ss.CorruptionError, match="shard-000001/_shard.json"):
        store.index("r5")
    assert any("shard-000001/_shard.json" in p for p in verify(root))


def test_a_changed_descriptor_fails_its_crc(root: Path) -> None:
    path = root / "shard-000000" / DESCRIPTOR
    path.write_text(path.read_text().replace('"records":4', '"records":3'))
    with pytest.raises(ss.CorruptionError, match=r"shard-000000/_shard.json: CRC-32 .* differs from the shard table"):
        ss.open(root)[0]
    problems = verify(root)
    assert len(problems) == 1 and "shard-000000/_shard.json" in problems[0], problems


def test_a_descriptor_disagreeing_with_its_row_is_named(root: Path) -> None:
    # forge a descriptor whose CRC the row carries but whose counts differ from the row's
    from store_testlib import _refresh_row_crc

    path = root / "shard-000002" / DESCRIPTOR
    text = path.read_text().replace('"records":2', '"records":1')
    path.write_text(text)
    _refresh_row_crc(root, 2, text.encode())
    with pytest.raises(ss.CorruptionError, match=r"shard-000002/_shard.json: describes 1 records.* the shard table "
                       r"says 2 records"):
        ss.open(root)[9]


def test_a_descriptor_must_list_the_schemas_files(root: Path) -> None:
    edit_shard_meta(root, 0, lambda s: s["files"].pop("meta/k.npy"))
    with pytest.raises(ss.CorruptionError, match=r"shard-000000/_shard.json: files listed .*\(missing \['meta/k"):
        ss.open(root)[0]


def test_wrong_file_size_or_crc_in_a_descriptor(root: Path) -> None:
    edit_shard_meta(root, 1, lambda s: s["files"]["x.npy"].update(bytes=12345))
    with pytest.raises(ss.CorruptionError, match=r"shard-000001/x.npy: file has \d+ bytes, manifest says 12345"):
        ss.open(root)[4]
    edit_shard_meta(root, 1, lambda s: s["files"]["x.npy"].update(bytes=(root / "shard-000001/x.npy").stat().st_size))
    _check(root, 10)
    edit_shard_meta(root, 0, lambda s: s["files"]["meta/k.npy"].update(crc32=7))
    problems = verify(root)
    assert len(problems) == 1 and "shard-000000/meta/k.npy: CRC-32" in problems[0], problems


# ------------------------------------------------------------------------------ versions 1 and 2


@pytest.mark.parametrize("version", [1, 2])
def test_versions_1_and_2_are_read_and_appended_in_their_own_layout(scratch: Path, version: int) -> None:
    root = scratch / "old"
    kw: dict[str, Any] = {"id_lookup": "last"} if version == 2 else {}
    with create_legacy(root, CHILD_SCHEMA, version=version, max_shard_records=4, **kw) as w:
        for i in range(6):
            w.append(child_record(0, i), id=f"r{i}")
    _write(root, 4, first=6)  # a second writer appends
    raw = json.loads((root / "manifest.json").read_text())
    assert raw["version"] == version and [s["records"] for s in raw["shards"]] == [4, 2, 4]
    assert not (root / TABLE).exists() and not list(root.glob(f"shard-*/{DESCRIPTOR}"))
    _check(root, 10)
    store = ss.open(root)
    assert store.manifest.version == version and store.num_shards == 3
    assert verify(root) == []


def test_a_version_3_manifest_needs_its_table_state(root: Path) -> None:
    raw = json.loads((root / "manifest.json").read_text())
    raw["shard_table"]["records"] = 11
    (root / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ss.CorruptionError, match=rf"{TABLE} row 2 \(the last committed\) ends at record 10, "
                       "expected 11"):
        ss.open(root)
    raw["shard_table"]["records"] = -1
    (root / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ss.CorruptionError, match="manifest.json: malformed manifest"):
        ss.open(root)


# -------------------------------------------------------------------------------- many commits


def test_many_single_shard_commits(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """300 commits of one shard each by one writer: what a commit reads does not grow with the shards
    already committed (one table row checked, no descriptor read, a bounded manifest), and everything
    stays readable, including ids through merged index runs."""
    root = scratch / "many"
    n = 300
    checked: list[int] = []
    descriptors: list[Path] = []
    real_check = ShardTable._check
    real_read = descriptor_mod.read_descriptor

    def count_check(self: ShardTable, k: int) -> Any:
        checked.append(k)
        return real_check(self, k)

    def count_read(shard_dir: Path, *a: Any) -> Any:
        descriptors.append(shard_dir)
        return real_read(shard_dir, *a)

    monkeypatch.setattr(ShardTable, "_check", count_check)
    monkeypatch.setattr(manifest_mod, "read_descriptor", count_read)
    sizes = []
    with ss.create(root, CHILD_SCHEMA) as w:
        for i in range(n):
            w.append(child_record(0, i), id=f"r{i}")
            before = len(checked)
            w.commit()
            assert len(checked) - before <= 1  # the last row, at load
            sizes.append((root / "manifest.json").stat().st_size)
    assert descriptors == []
    assert max(sizes) < 3000, sizes  # O(index levels), not O(shards): a v1 manifest would list all 300
    monkeypatch.undo()
    store = ss.open(root)
    assert store.num_shards == n and (root / TABLE).stat().st_size == TABLE_HEADER_BYTES + n * ROW
    assert sum(r.end_shard - r.first_shard for r in store.manifest.index_runs) >= n - 8  # merged as it went
    assert store.index_many([f"r{i}" for i in range(n)]).tolist() == list(range(n))
    idx = np.random.default_rng(0).permutation(n)
    assert store.get_batch(idx)["meta/k"].tolist() == idx.tolist()
    assert verify(root) == []
    assert sorted(os.listdir(root / "shard-000299")) == sorted(
        [DESCRIPTOR, "x.npy", "x.offsets.npy", "meta", "_ids.npy", "_ids.offsets.npy", "_ids.hash.npy",
         "_ids.hash_rows.npy", "_checks.npy"]
    )


def test_a_writer_never_lists_the_store_directory(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers of a version-3 store keep workspaces and temporary manifests in _tmp/: opening a writer
    (which removes what dead writers left) and committing look at no listing of the store directory,
    whose size grows with the shards."""
    work = root / "_tmp"
    assert work.is_dir() and list(work.iterdir()) == []  # the writers that made it are gone
    (work / "host-1-dead").mkdir()
    (work / "host-1-dead" / "owner.lock").touch()  # nobody holds its lock: a dead writer's
    (work / ".manifest.json.tmp-1").write_text("{")
    (root / "shard-000003").mkdir()  # renamed by a writer that died before its manifest
    listed: list[Path] = []
    real_scandir, real_listdir = os.scandir, os.listdir

    def scandir(path: Any = ".") -> Any:
        if not isinstance(path, int):  # (shutil.rmtree lists by descriptor)
            listed.append(Path(path))
        return real_scandir(path)

    def listdir(path: Any = ".") -> Any:
        if not isinstance(path, int):  # (shutil.rmtree lists by descriptor)
            listed.append(Path(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "listdir", listdir)
    live = ss.append_to(root)
    assert list(work.iterdir()) == [live._workspace] and not (root / "shard-000003").exists()
    live.append(child_record(0, 10), id="r10")
    live.close()
    monkeypatch.undo()
    assert Path(root) not in listed, listed
    assert list(work.iterdir()) == []
    _check(root, 11)


def test_a_pickled_store_sees_its_prefix_of_the_table(root: Path) -> None:
    import pickle

    store = ss.open(root)
    blob = pickle.dumps(store)
    _write(root, 6, first=10)
    again = pickle.loads(blob)
    assert len(again) == 10 and again.num_shards == 3 and again.manifest.num_records == 10
    np.testing.assert_array_equal(again[9]["x"], child_record(0, 9)["x"])
    assert len(again.refresh()) == 16


def test_a_replaced_table_is_not_mixed_with_the_old_one(root: Path) -> None:
    shutil.rmtree(root)
    _write(root, 3)
    _check(root, 3)
    assert verify(root) == []


def test_a_table_replaced_between_its_check_and_its_map_is_refused(root: Path) -> None:
    # an overwrite commit may rename a new table into place after open checked the old file's header
    # but before it mapped the file: the mapped header must be checked too (seen as a torn view in CI)
    manifest = Manifest.load(root)
    state = manifest.table
    assert state is not None
    path = root / state.file
    other = root / "other.tbl"
    raw = bytearray(path.read_bytes())
    raw[24:32] = (state.id + 1).to_bytes(8, "little")  # same rows, the next generation's id
    other.write_bytes(bytes(raw))
    calls = []

    def swap_then_map(p: Path, size: int) -> Any:
        calls.append(p)
        os.replace(other, p)
        with open(p, "rb") as f:
            return f.read(size)

    with pytest.raises(ss.CorruptionError, match="table id"):
        ShardTable.open(root, manifest.ragged, state, swap_then_map)
    assert calls == [path]


def test_verify_names_a_damaged_row_once(root: Path) -> None:
    """verify listed a damaged table row twice: once from the check of every row, and again when the row's
    shard was read (the same message)."""
    _flip(root / TABLE, TABLE_HEADER_BYTES + 0 * ROW + 20)
    problems = verify(root)
    assert sum(f"{TABLE} row 0: CRC-32" in p for p in problems) == 1, problems
