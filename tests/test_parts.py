"""Parts: task attempts write shards into a store's parts area, one driver commit makes them visible.

Covers store/parts.py: all-or-nothing commits (also across an injected crash before and after the
commit point), a SIGKILLed writer process, overwrite (same and new schema) with readers that opened
before and readers opening during commits, schema and id checks, two jobs, discard and clean-up.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
from seqstore.errors import CorruptionError, SchemaError, SeqstoreError
from seqstore.format.manifest import Manifest
from seqstore.store.parts import (
    PARTS_DIR,
    Part,
    PartWriter,
    clean_parts,
    commit_parts,
    discard_parts,
    pending_jobs,
    prepare_store,
)
from seqstore.store.verify import verify
from seqstore.store.write import journal as journal_mod
from seqstore.store.write import local as parts_mod

SCHEMA = {"x": ss.Field("float32", (None, 3)), "y": ss.Field("int64")}


@pytest.fixture
def store() -> Iterator[Path]:
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="seqstore-parts-", dir=shm) as d:
        yield Path(d) / "s.seqstore"


def write_part(root: Path, job: str, task: str, values: range, *, ids: bool = True, max_shard_records: int = 4) -> Part:
    """A part whose record ``k`` has y = values[k] and x = (1 + values[k] % 5) rows of y."""
    w = PartWriter(root, job=job, task=task, max_shard_records=max_shard_records)
    vals = np.asarray(values, dtype=np.int64)
    lengths = 1 + vals % 5
    x = np.repeat(vals, lengths).astype(np.float32)[:, None].repeat(3, axis=1)
    w.append_batch({"x": (x, lengths), "y": vals}, ids=[f"r{v}" for v in vals] if ids else None)
    return w.finish()


def contents(root: Path) -> tuple[list[int], list[str] | None]:
    s = ss.open(root)
    ys = [int(s[i]["y"]) for i in range(len(s))]
    for i in range(len(s)):
        np.testing.assert_array_equal(s[i]["x"], np.full((1 + ys[i] % 5, 3), ys[i], np.float32))
    ids = [s.id(i) for i in range(len(s))] if s.has_ids else None
    return ys, ids


def test_commit_is_all_at_once_in_the_order_of_the_parts(store: Path) -> None:
    prepare_store(store, SCHEMA)
    a = write_part(store, "job1", "a", range(0, 10))
    b = write_part(store, "job1", "b", range(10, 13))
    c = write_part(store, "job1", "c", range(13, 20))
    assert len(ss.open(store)) == 0  # finished parts are not visible
    assert len(a.shards) == 3 and a.records == 10
    assert commit_parts(store, [c, a, b]) == 20
    ys, ids = contents(store)
    assert ys == [*range(13, 20), *range(0, 13)]
    assert ids == [f"r{v}" for v in ys]
    s = ss.open(store)
    assert s.index("r5") == 7 + 5 and s.index("r19") == 6  # id index over all committed shards
    assert verify(store) == []
    # parts are small, picklable and JSON-able; the JSON form commits as well
    assert pickle.loads(pickle.dumps(a)) == a
    assert Part.from_json(json.loads(json.dumps(a.to_json()))) == a
    d = write_part(store, "job2", "d", range(20, 22))
    assert commit_parts(store, [json.loads(json.dumps(d.to_json()))]) == 2
    assert contents(store)[0][-2:] == [20, 21]


def test_committing_twice_missing_parts_and_duplicates_are_clear_errors(store: Path) -> None:
    prepare_store(store, SCHEMA)
    a = write_part(store, "j", "a", range(5))
    b = write_part(store, "j", "b", range(5, 9))
    commit_parts(store, [a])
    with pytest.raises(SeqstoreError, match=r"part 'a' of job 'j'\): already committed"):
        commit_parts(store, [b, a])
    assert len(ss.open(store)) == 5  # b was not committed either
    with pytest.raises(SeqstoreError, match="given twice"):
        commit_parts(store, [b, b])
    discard_parts(store, [b])
    with pytest.raises(SeqstoreError, match=r"part 'b' of job 'j'\): not there"):
        commit_parts(store, [b])
    assert commit_parts(store, []) == 0
    assert contents(store)[0] == list(range(5))
    forged = b.to_json()
    forged["shards"][0]["dir"] = "../../elsewhere"
    with pytest.raises(ValueError, match="not p<number>"):
        commit_parts(store, [forged])
    forged = dict(b.to_json(), job="../j")
    with pytest.raises(ValueError, match="names a directory"):
        discard_parts(store, [forged])


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_crash_before_the_commit_point_commits_nothing_and_is_undone(
    store: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    prepare_store(store, SCHEMA)
    first = write_part(store, "j0", "a", range(100, 103))
    commit_parts(store, [first])
    a = write_part(store, "j", "a", range(10))
    b = write_part(store, "j", "b", range(10, 20))

    def die(self: Manifest, root: object) -> None:
        raise OSError("injected crash before the manifest is saved")

    monkeypatch.setattr(Manifest, "save", die)
    with pytest.raises(OSError, match="injected"):
        commit_parts(store, [a, b], mode=mode)
    monkeypatch.undo()
    assert (store / PARTS_DIR / parts_mod.JOURNAL).exists()  # the state a dead driver leaves
    if mode == "append":
        assert contents(store)[0] == [100, 101, 102]  # nothing visible
    else:  # the new table is in place but not its manifest: readers refuse the pair (after a short wait)
        with pytest.raises(CorruptionError, match="table id"):
            ss.open(store)
    # a plain writer's commit undoes the interrupted one first (shards go back into the parts)
    with ss.append_to(store) as w:
        w.append({"x": np.full((1 + 103 % 5, 3), 103, np.float32), "y": 103}, id="r103")
    assert not (store / PARTS_DIR / parts_mod.JOURNAL).exists()
    assert contents(store)[0] == [100, 101, 102, 103]
    assert commit_parts(store, [a, b], mode=mode) == 20
    assert contents(store)[0] == ([100, 101, 102, 103] if mode == "append" else []) + list(range(20))
    assert verify(store) == []
    assert not list((store / "_tmp").glob(".*tbl*"))


def test_a_stats_only_commit_settles_a_crashed_commit_of_parts_first(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that commits only stats deltas after a commit of parts died before its commit point: the
    generation it saves used to leave the journal matching neither side, and every later writer failed
    with CorruptionError."""
    prepare_store(store, SCHEMA)
    commit_parts(store, [write_part(store, "j0", "a", range(100, 103))])
    a = write_part(store, "j", "a", range(10))
    live = ss.append_to(store)

    def die(self: Manifest, root: object) -> None:
        raise OSError("injected crash before the manifest is saved")

    monkeypatch.setattr(Manifest, "save", die)
    with pytest.raises(OSError, match="injected"):
        commit_parts(store, [a])
    monkeypatch.undo()
    live.add_stats({"seen": 1})
    live.close()
    assert ss.open(store).manifest.stats["seen"] == 1
    assert commit_parts(store, [a]) == 10
    assert contents(store)[0] == [100, 101, 102, *range(10)]
    assert verify(store) == []


class _Crash(BaseException):
    """The driver process dying at that point (no ``Exception``: nothing handles it)."""


def test_a_crash_after_the_commit_point_is_finished_by_the_next_commit(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepare_store(store, SCHEMA)
    a = write_part(store, "j", "a", range(6))

    def die(root: object, journal: object) -> None:
        raise _Crash("injected crash after the manifest is saved")

    monkeypatch.setattr(journal_mod, "roll_forward", die)
    with pytest.raises(_Crash, match="injected"):
        commit_parts(store, [a])
    monkeypatch.undo()
    assert contents(store)[0] == list(range(6))  # committed
    with pytest.raises(SeqstoreError, match="already committed"):
        commit_parts(store, [a])  # the retry finishes the interrupted commit and reports it
    assert not (store / PARTS_DIR / parts_mod.JOURNAL).exists()
    assert contents(store)[0] == list(range(6))


_KILLED_CHILD = r"""
import sys, numpy as np
from seqstore.store.parts import PartWriter
w = PartWriter(sys.argv[1], job="jk", task="killed-attempt", max_shard_records=50, buffer_bytes=1 << 8)
i = 0
while True:  # never finishes: the parent SIGKILLs it part way through a shard
    w.append({"x": np.full((1 + i % 5, 3), i, np.float32), "y": i}, id=f"k{i}")
    i += 1
    if i == 120:
        print("ready", flush=True)
"""


def test_a_writer_killed_mid_write_leaves_nothing_visible_and_is_discarded(store: Path) -> None:
    prepare_store(store, SCHEMA)
    ok = write_part(store, "jk", "finished-attempt", range(7))
    other = write_part(store, "other-job", "t", range(50, 53))
    child = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, str(store)], stdout=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"ready"
    child.send_signal(signal.SIGKILL)
    child.wait()
    task_dir = store / PARTS_DIR / "jk" / "killed-attempt"
    assert (task_dir / "p000000").is_dir() and (task_dir / "current").is_dir()  # finished shards and a torn one
    assert len(ss.open(store)) == 0
    # another writer's clean-up of dead writers leaves pending parts alone
    with ss.append_to(store) as w:
        w.append({"x": np.full((1 + 60 % 5, 3), 60, np.float32), "y": 60}, id="r60")
    assert task_dir.is_dir() and (store / PARTS_DIR / "jk" / "finished-attempt" / "part.json").exists()
    assert commit_parts(store, [ok]) == 7
    assert contents(store)[0] == [60, *range(7)]
    discard_parts(store, [ok])  # the job: its committed record and the killed attempt
    assert not (store / PARTS_DIR / "jk").exists()
    assert pending_jobs(store) == ["other-job"]
    assert commit_parts(store, [other]) == 3
    assert contents(store)[0] == [60, *range(7), 50, 51, 52]
    assert verify(store) == []


def test_a_failed_job_is_discarded_whole(store: Path) -> None:
    prepare_store(store, SCHEMA)
    write_part(store, "failed", "t0", range(5))
    live = PartWriter(store, job="failed", task="t1")
    live.append({"x": np.zeros((1, 3), np.float32), "y": 1}, id="z")
    discard_parts(store, "failed")  # the live writer's task stays (and its job directory)
    assert pending_jobs(store) == ["failed"]
    assert sorted(os.listdir(store / PARTS_DIR / "failed")) == ["t1"]
    live.abort()
    assert not (store / PARTS_DIR / "failed" / "t1").exists()
    discard_parts(store, "failed")
    assert pending_jobs(store) == []
    assert len(ss.open(store)) == 0
    with pytest.raises(ValueError, match="names a directory"):
        discard_parts(store, "../x")


def test_an_attempt_id_is_used_once(store: Path) -> None:
    prepare_store(store, SCHEMA)
    write_part(store, "j", "t", range(3))
    with pytest.raises(SeqstoreError, match="already finished"):
        PartWriter(store, job="j", task="t")
    live = PartWriter(store, job="j", task="u")
    with pytest.raises(SeqstoreError, match="live PartWriter"):
        PartWriter(store, job="j", task="u")
    live.abort()
    PartWriter(store, job="j", task="u").abort()
    with pytest.raises(SeqstoreError, match="does not commit"):
        with PartWriter(store, job="j", task="v") as w:
            w.commit()
    assert not (store / PARTS_DIR / "j" / "v").exists()  # left by an exception: aborted


def test_overwrite_replaces_every_shard_and_earlier_readers_keep_theirs(store: Path) -> None:
    prepare_store(store, SCHEMA, mode="overwrite")
    commit_parts(store, [write_part(store, "j1", "a", range(12))])
    old = ss.open(store)
    assert [int(old[i]["y"]) for i in range(len(old))] == list(range(12))  # maps every shard
    old_shards = sorted(p.name for p in store.glob("shard-*"))
    prepare_store(store, SCHEMA, mode="overwrite")
    new = write_part(store, "j2", "a", range(500, 506))
    assert commit_parts(store, [new], mode="overwrite") == 6
    assert contents(store) == (list(range(500, 506)), [f"r{v}" for v in range(500, 506)])
    assert ss.open(store).index("r503") == 3
    assert not any((store / n).exists() for n in old_shards)  # replaced shards are deleted
    assert [int(old[i]["y"]) for i in range(len(old))] == list(range(12))  # the old reader still reads them
    assert verify(store) == []
    # appending after an overwrite continues the new table
    commit_parts(store, [write_part(store, "j3", "a", range(600, 603))])
    assert contents(store)[0] == [*range(500, 506), 600, 601, 602]
    assert verify(store) == []


def test_overwrite_with_another_schema_installs_it_at_the_commit(store: Path) -> None:
    prepare_store(store, SCHEMA, metadata={"v": 1})
    commit_parts(store, [write_part(store, "j1", "a", range(5))])
    other = {"tokens": ss.Field("int32", (None,))}
    prepare_store(store, other, mode="overwrite", metadata={"v": 2})
    assert ss.open(store).schema == ss.Schema(SCHEMA)  # staged only: readers see the old store
    with pytest.raises(SchemaError, match="existing store has schema") as exc:
        prepare_store(store, other, mode="append")
    assert "field 'tokens' only in the job" in str(exc.value), exc.value
    w = PartWriter(store, job="j2", task="a")
    w.append_batch({"tokens": [np.arange(3), np.arange(1)]})
    part = w.finish()
    with pytest.raises(SchemaError, match="another schema"):
        commit_parts(store, [part])  # appending parts of the staged schema to the old store
    assert commit_parts(store, [part], mode="overwrite") == 2
    s = ss.open(store)
    assert s.schema == ss.Schema(other) and s.metadata == {"v": 2} and len(s) == 2
    np.testing.assert_array_equal(s[0]["tokens"], np.arange(3))
    assert not s.has_ids and verify(store) == []


def test_a_writer_of_the_old_schema_cannot_commit_into_the_overwritten_store(store: Path) -> None:
    """A plain writer opened before an overwrite job installed another schema committed its shard into
    the new store as it was (files of the old dtype under the new schema): every read of it failed.
    Its commit is refused, naming the store and both schemas, and the store stays readable."""
    prepare_store(store, SCHEMA)
    w = ss.append_to(store)
    w.append_batch({"x": [np.zeros((1, 3), np.float32)] * 2, "y": np.arange(2)}, ids=["a", "b"])
    other = {"x": ss.Field("float16", (None, 3)), "y": ss.Field("int32")}
    prepare_store(store, other, mode="overwrite")
    p = PartWriter(store, job="j", task="a")
    p.append_batch({"x": [np.ones((2, 3), np.float16)], "y": np.arange(1, dtype=np.int32)}, ids=["c"])
    commit_parts(store, [p.finish()], mode="overwrite")
    with pytest.raises(SchemaError, match=rf"^{store}: the store's schema is now .*'<f2'.*, this writer's .*'<f4'"):
        w.commit()
    w.abort()
    s = ss.open(store)
    assert len(s) == 1 and s[0]["x"].tolist() == [[1.0] * 3] * 2 and verify(store) == []


def test_stats_of_a_writer_of_the_old_schema_are_not_added_to_the_overwritten_store(store: Path) -> None:
    """A writer opened before an overwrite job installed another schema: its shard's commit was refused, but a
    commit of its stats deltas alone went through, adding counts of the old records to the new store's stats."""
    prepare_store(store, SCHEMA)
    w = ss.append_to(store)
    w.add_stats({"tokens": 10})
    other = {"x": ss.Field("float16", (None, 3)), "y": ss.Field("int32")}
    prepare_store(store, other, mode="overwrite")
    p = PartWriter(store, job="j", task="a")
    p.append_batch({"x": [np.ones((2, 3), np.float16)], "y": np.arange(1, dtype=np.int32)}, ids=["c"])
    commit_parts(store, [p.finish()], mode="overwrite")
    with pytest.raises(SchemaError, match=rf"^{store}: the store's schema is now "):
        w.commit()
    w.abort()
    assert ss.open(store).manifest.stats == {} and verify(store) == []


def test_append_checks_the_schema_and_the_ids(store: Path) -> None:
    with pytest.raises(ValueError, match="mode"):
        prepare_store(store, SCHEMA, mode="upsert")
    prepare_store(store, SCHEMA, mode="append")  # creates
    prepare_store(store, SCHEMA, mode="append")  # same schema: fine
    with pytest.raises(FileExistsError, match=str(store)):
        prepare_store(store, SCHEMA, mode="create")
    with pytest.raises(SchemaError, match=str(store)):
        prepare_store(store, {"x": ss.Field("float16", (None, 3)), "y": ss.Field("int64")}, mode="append")
    commit_parts(store, [write_part(store, "j", "a", range(3))])
    no_ids = write_part(store, "j", "b", range(3, 5), ids=False)
    with pytest.raises(SchemaError, match="with ids"):
        commit_parts(store, [no_ids])
    with_ids = write_part(store, "j", "c", range(5, 7))
    with pytest.raises(SchemaError, match="mix records with and without ids"):
        commit_parts(store, [with_ids, no_ids])
    assert commit_parts(store, [with_ids]) == 2
    w = PartWriter(store, job="j", task="d")
    with pytest.raises(SchemaError, match="record 0.*field 'x'"):
        w.append({"x": np.zeros((2, 4), np.float32), "y": 1}, id="bad")
    w.abort()


def test_parts_of_two_jobs(store: Path) -> None:
    prepare_store(store, SCHEMA)
    a1 = write_part(store, "A", "1", range(0, 4))
    b1 = write_part(store, "B", "1", range(100, 103))
    a2 = write_part(store, "A", "2", range(4, 9))
    b2 = write_part(store, "B", "2", range(103, 104))
    assert commit_parts(store, [a1, a2]) == 9
    assert pending_jobs(store) == ["A", "B"]
    discard_parts(store, "A")
    assert commit_parts(store, [b2, b1]) == 4  # job B untouched by A's clean-up
    assert contents(store)[0] == [*range(9), 103, 100, 101, 102]
    c = write_part(store, "C", "1", range(200, 202))
    d = write_part(store, "D", "1", range(300, 301))
    assert commit_parts(store, [d, c]) == 3  # one commit may take parts of several jobs
    assert contents(store)[0][-3:] == [300, 200, 201]
    assert clean_parts(store, older_than=3600) == []
    assert sorted(clean_parts(store, older_than=0)) == ["B", "C", "D"]
    assert verify(store) == []


def test_readers_opening_during_overwrites_see_the_old_or_the_new_store(store: Path) -> None:
    prepare_store(store, SCHEMA)
    sizes = {0: 30}
    commit_parts(store, [write_part(store, "g0", "a", range(0, 30))])
    stop = threading.Event()
    seen: set[int] = set()
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                s = ss.open(store)
                ys = np.array([int(s[i]["y"]) for i in range(len(s))])
            except CorruptionError as exc:  # a shard of the old store deleted before this reader touched it
                if "missing" not in str(exc) and "No such file" not in str(exc):
                    errors.append(exc)
                continue
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                continue
            gen = int(ys[0]) // 1000
            if len(ys) != sizes.get(gen) or not (ys // 1000 == gen).all():
                errors.append(AssertionError(f"mixed or torn view: {len(ys)} records {ys[:3]}...{ys[-3:]}"))
            seen.add(gen)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for gen in range(1, 8):
            n = 10 + 7 * gen
            sizes[gen] = n
            part = write_part(store, f"g{gen}", "a", range(gen * 1000, gen * 1000 + n), max_shard_records=3)
            commit_parts(store, [part], mode="overwrite")
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert [str(e) for e in errors] == []
    assert len(seen) >= 2
    assert contents(store)[0] == list(range(7000, 7000 + 59))
    assert verify(store) == []


def test_a_part_writer_left_open_at_exit_says_it_discarded_its_records(store: Path) -> None:
    """At exit a PartWriter that was never finished is discarded (only the driver commits); the line on stderr
    used to say "committed 5 pending record(s)" (the plain Writer's words)."""
    from seqstore.store.write import at_exit

    prepare_store(store, SCHEMA)
    w = PartWriter(store, job="j", task="t", max_shard_records=3)
    w.append_batch({"x": [np.zeros((1, 3), np.float32)] * 5, "y": np.arange(5)})
    line = w._commit_at_exit("exit")
    at_exit.unregister(w)
    assert line is not None and "not finished at exit; 5 record(s) discarded" in line, line
    assert "committed" not in line
    assert not (store / PARTS_DIR / "j" / "t").exists() and len(ss.open(store)) == 0


def test_a_commit_of_no_part_appends_nothing_or_overwrites_to_an_empty_store(store: Path) -> None:
    """A job whose tasks wrote no part (an empty input) commits an empty list: on a store where no part
    was ever staged, that failed with FileNotFoundError (the journal's ``_parts`` directory was missing)."""
    with ss.create(store, SCHEMA) as w:
        w.append({"x": np.full((3, 3), 7, np.float32), "y": 7})
    assert commit_parts(store, []) == 0
    assert contents(store)[0] == [7]
    prepare_store(store, SCHEMA, mode="overwrite")
    assert commit_parts(store, [], mode="overwrite") == 0
    assert len(ss.open(store)) == 0 and verify(store) == []


def test_temporaries_of_a_driver_that_died_writing_the_journal_or_the_staged_schema_go(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver that died (here: failed) between writing ``_parts/..commit.json.tmp-PID`` (or
    ``..staged.json.tmp-PID``) and renaming it left that file for good: no later commit, discard or
    writer removed it. The next commit_parts (or discard_parts, clean_parts) under the store's lock does."""
    prepare_store(store, SCHEMA)
    a = write_part(store, "j", "a", range(5))
    real = os.replace

    def die(src: object, dst: object) -> None:
        if Path(str(dst)).name in (parts_mod.JOURNAL, ".staged.json"):
            raise OSError("injected crash before the rename")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", die)
    with pytest.raises(OSError, match="injected"):
        commit_parts(store, [a])
    with pytest.raises(OSError, match="injected"):
        prepare_store(store, {"y": ss.Field("int64")}, mode="overwrite")
    monkeypatch.undo()
    left = sorted(p.name for p in (store / PARTS_DIR).glob(".*.tmp-*"))
    assert len(left) == 2, left  # the state dead drivers leave
    assert commit_parts(store, [a]) == 5
    assert sorted(p.name for p in (store / PARTS_DIR).glob(".*.tmp-*")) == []
    assert contents(store)[0] == list(range(5))
    assert verify(store) == []


def test_a_driver_that_died_saving_the_manifest_leaves_no_temporary_manifest(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store written only by commit_parts has no ``_tmp/``: the commit wrote its temporary manifest at the top
    of the store (docs/format.md: in ``_tmp/`` for version 3), where no writer's clean-up looks, so a driver
    that died between writing and renaming it left ``.manifest.json.tmp-PID`` there for good."""
    prepare_store(store, SCHEMA)
    a = write_part(store, "j", "a", range(5))
    real = os.replace

    def die(src: object, dst: object) -> None:
        if Path(str(dst)).name == "manifest.json":
            raise OSError("injected crash before the rename")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", die)
    with pytest.raises(OSError, match="injected"):
        commit_parts(store, [a])
    monkeypatch.undo()
    ss.append_to(store).abort()  # a writer opening cleans up after dead ones (and undoes the commit)
    assert sorted(p.name for p in [*store.glob(".manifest.json.tmp-*"), *store.glob("_tmp/.*")]) == []
    assert commit_parts(store, [a]) == 5
    assert contents(store)[0] == list(range(5))


def test_an_error_after_the_commit_point_does_not_report_a_committed_commit_as_failed(
    store: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Marking the parts committed failed after the manifest was saved (here: no space for committed.json):
    commit_parts raised OSError though every record was committed, so a driver that took the error at its
    word (all or nothing) discarded the job and ran it again, committing its records twice."""
    prepare_store(store, SCHEMA)
    a = write_part(store, "j", "a", range(6))
    real = journal_mod.write_json

    def full(path: Path, obj: object) -> None:
        if path.name == "committed.json":
            raise OSError(28, "No space left on device (injected)")
        real(path, obj)

    monkeypatch.setattr(journal_mod, "write_json", full)
    assert commit_parts(store, [a]) == 6  # committed: said so, with a warning about the rest
    monkeypatch.undo()
    assert "committed" in caplog.text and "No space" in caplog.text
    assert contents(store)[0] == list(range(6))
    with pytest.raises(SeqstoreError, match="already committed"):
        commit_parts(store, [a])  # the next holder of the lock finishes it
    assert not (store / PARTS_DIR / parts_mod.JOURNAL).exists()


_RACE: list[Path] = []  # the owner.lock another attempt takes just before this one opens it (armed by a test)
_RACE_HELD: list[int] = []


def _race_hook(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _RACE and str(args[0]) == str(_RACE[0]):
        path = _RACE.pop()  # (disarmed first: the open below comes through here too)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        import fcntl
        fcntl.flock(fd, fcntl.LOCK_EX)
        _RACE_HELD.append(fd)


sys.addaudithook(_race_hook)


def test_an_attempt_racing_another_of_the_same_task_id_fails_and_never_hangs(store: Path) -> None:
    """Two attempts with one task id: the other one takes the new task directory's owner.lock between this
    one's mkdir and its lock (it removed the directory as a dead one's and made it again). This one waited
    for that lock for ever; it is now the named error."""
    prepare_store(store, SCHEMA)
    _RACE.append(store / PARTS_DIR / "j" / "t" / "owner.lock")
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            PartWriter(store, job="j", task="t").abort()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    _RACE.clear()
    hung = t.is_alive()
    for fd in _RACE_HELD:
        os.close(fd)
    _RACE_HELD.clear()
    t.join(10)
    assert not hung, "the attempt waited for the other attempt's lock"
    assert isinstance(outcome[0], SeqstoreError) and "live PartWriter" in str(outcome[0])


def test_remove_if_empty_never_deletes_a_store_a_writer_commits_to_meanwhile(store: Path, monkeypatch) -> None:
    """remove_if_empty read the manifest (no shard) and then deleted the store without the store's lock: a
    writer opening and committing in between lost its committed records with the store. Both are done under
    the lock now: the writer comes first (the store stays) or waits and finds no store (an error)."""
    from seqstore.errors import LockTimeout
    from seqstore.store.parts import remove_if_empty

    prepare_store(store, SCHEMA)
    committed: list[bool] = []
    pending_jobs_of = parts_mod.LocalTarget.pending_jobs

    def commit_meanwhile(self: parts_mod.LocalTarget) -> list[str]:  # (after the manifest was read)
        if not committed:
            monkeypatch.setenv("SEQSTORE_LOCK_TIMEOUT", "0")
            try:
                with ss.append_to(store) as w:
                    w.append_batch({"x": (np.zeros((2, 3), np.float32), np.array([1, 1])), "y": np.arange(2)})
                committed.append(True)
            except LockTimeout:
                committed.append(False)
        return pending_jobs_of(self)

    monkeypatch.setattr(parts_mod.LocalTarget, "pending_jobs", commit_meanwhile)
    removed = remove_if_empty(store)
    assert committed == [not removed]
    if committed[0]:
        assert len(ss.open(store)) == 2
    else:
        assert not store.exists()


def test_cleaning_up_parts_where_there_is_no_store_leaves_nothing_behind(tmp_path: Path) -> None:
    """discard_parts, clean_parts and unstage took the store's lock before looking: a directory that is not a
    store got a '.lock' file left in it, and a path with nothing there was a LockError about that lock file
    (a late task's clean-up after the failed job's empty store was removed). There is nothing to clean there:
    they do nothing and leave nothing."""
    from seqstore.store.parts import unstage

    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep")
    for path in (other, tmp_path / "gone.seqstore"):
        discard_parts(path, "job")
        assert clean_parts(path, older_than=0) == []
        unstage(path)
        assert pending_jobs(path) == []
    assert sorted(os.listdir(other)) == ["todo.txt"]
    assert not (tmp_path / "gone.seqstore").exists()


def test_clean_parts_while_a_task_of_the_job_removes_its_files(store: Path, monkeypatch) -> None:
    """clean_parts took the time of every file of a job from a listing: a file that went between the listing
    and its stat (an attempt of the job aborting, or staging a shard, meanwhile) made it a bare
    FileNotFoundError. A file gone meanwhile is not counted."""
    prepare_store(store, SCHEMA)
    write_part(store, "old", "a", range(6))
    glob_of = Path.glob

    def vanishing(self: Path, pattern: str) -> Iterator[Path]:
        found = list(glob_of(self, pattern))
        if pattern == "*/*" and found:
            os.rename(found[0], found[0].with_name("gone"))  # moved away between the listing and its stat
            os.utime(found[0].parent, (0, 0))  # (by a task dead long ago, for the age test)
        return iter(found)

    monkeypatch.setattr(Path, "glob", vanishing)
    assert clean_parts(store, older_than=0) == ["old"]
    monkeypatch.undo()
    assert pending_jobs(store) == [] and len(ss.open(store)) == 0


def test_remove_if_empty_leaves_a_store_a_writer_has_open(store: Path) -> None:
    """remove_if_empty deleted an empty store that a writer had open (its records not committed yet): the
    writer's records went with the store. A store with a live writer's workspace is not empty: it stays."""
    from seqstore.store.parts import remove_if_empty

    prepare_store(store, SCHEMA)
    w = ss.append_to(store)
    w.append_batch({"x": (np.zeros((2, 3), np.float32), np.array([1, 1])), "y": np.arange(2)})
    assert remove_if_empty(store) is False
    w.close()
    assert len(ss.open(store)) == 2
    other = store.with_name("empty.seqstore")
    prepare_store(other, SCHEMA)
    ss.append_to(other).close()  # a writer that came and went leaves nothing that keeps the store
    assert remove_if_empty(other) is True and not other.exists()


def test_discarding_a_job_keeps_a_task_that_starts_meanwhile(store: Path, monkeypatch) -> None:
    """discard_parts scanned the job's tasks and then removed the whole job directory: a task that started
    after the scan (open_part does not wait for the store's lock) lost its directory under its live
    PartWriter. Such a task is left, as a live one found by the scan is."""
    prepare_store(store, SCHEMA)
    write_part(store, "job", "dead", range(3))
    removed = journal_mod.remove_if_dead
    late: list[PartWriter] = []

    def then_a_task_starts(path: Path, **kw: bool) -> bool:
        gone = removed(path, **kw)
        if not late:
            late.append(PartWriter(store, job="job", task="late", max_shard_records=4))
        return gone

    monkeypatch.setattr(journal_mod, "remove_if_dead", then_a_task_starts)
    discard_parts(store, "job")
    monkeypatch.undo()
    assert sorted(os.listdir(store / PARTS_DIR / "job")) == ["late"]
    w = late[0]
    w.append({"x": np.full((3, 3), 7, np.float32), "y": 7}, id="r7")
    commit_parts(store, [w.finish()])
    assert contents(store) == ([7], ["r7"])


def test_a_task_starting_while_its_job_is_discarded_makes_the_job_directory_again(store: Path, monkeypatch) -> None:
    """A discard of the job removing its (empty) directory between a starting task's making of it and of the
    task's own directory made PartWriter() a bare FileNotFoundError. The task makes the job directory again."""
    prepare_store(store, SCHEMA)
    mkdir = Path.mkdir
    raced: list[Path] = []

    def discarded_meanwhile(self: Path, *args: object, **kw: object) -> None:
        if self.name == "t" and not raced:
            raced.append(self)
            discard_parts(store, "job")  # (the job directory is empty: removed)
        mkdir(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", discarded_meanwhile)
    w = PartWriter(store, job="job", task="t", max_shard_records=4)
    monkeypatch.undo()
    assert raced
    w.append({"x": np.full((3, 3), 7, np.float32), "y": 7}, id="r7")
    commit_parts(store, [w.finish()])
    assert contents(store) == ([7], ["r7"])
