"""A writer under failure: errors while writing, opening a shard or deleting superseded index files;
damaged index runs at merge time; a forked child holding a copy of the writer."""

from __future__ import annotations

import errno
import os
import shutil
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from store_testlib import edit_shard_meta, fds_under, workspaces

import seqstore as ss
from seqstore.format.manifest import Manifest
from seqstore.store.verify import verify
from seqstore.store.write import columns as writer_mod
from seqstore.store.writer import merge_sorted_runs

SCHEMA = {"x": ss.Field("float32", (1024,)), "y": ss.Field("float32", (1024,))}


def _batch(n: int, value: float = 1.0) -> dict[str, np.ndarray]:
    return {"x": np.full((n, 1024), value, np.float32), "y": np.full((n, 1024), -value, np.float32)}


@pytest.mark.parametrize("direct_io", [False, True])
def test_abort_after_a_failed_write_releases_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_io: bool
) -> None:
    root = tmp_path / "s"
    with ss.create(root, SCHEMA, direct_io=direct_io) as w:
        w.append_batch(_batch(3))
    w = ss.append_to(root, buffer_bytes=1, direct_io=direct_io)
    w.append_batch(_batch(2, 2.0))
    _disk_full_at_the_second_write(monkeypatch)
    with pytest.raises(OSError, match="No space"):
        w.append_batch(_batch(4, 3.0))
        w.commit()  # direct_io: small appends wait in memory for a whole run of pages; the commit writes them
    monkeypatch.undo()
    w.abort()
    assert fds_under(root) == [] and not workspaces(root)
    with pytest.raises(ss.SeqstoreError, match="closed"):
        w.append_batch(_batch(1))
    st = ss.open(root)
    assert len(st) == 3 and verify(root) == []



def _disk_full_at_the_second_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's second data write from now on fails with ENOSPC (a disk full part way); the others pass."""
    calls = {"n": 0}
    real = writer_mod._write_at

    def full_disk(fd: int, data: memoryview, offset: int) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data, offset)

    monkeypatch.setattr(writer_mod, "_write_at", full_disk)

def test_a_failure_while_opening_a_shard_leaks_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "s"
    w = ss.create(root, SCHEMA, buffer_bytes=1, direct_io=True)
    calls = {"n": 0}
    real = writer_mod.open_direct

    def out_of_fds(path: Any) -> int | None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(path)

    monkeypatch.setattr(writer_mod, "open_direct", out_of_fds)
    with pytest.raises(OSError, match="Too many"):
        w.append_batch(_batch(2))
    monkeypatch.undo()
    assert not (w._workspace / "current").exists()
    assert [p for p in fds_under(root) if not p.endswith("owner.lock")] == []
    with pytest.raises(ss.SeqstoreError, match="abort"):  # the failed batch may be half buffered
        w.append_batch(_batch(2))
    w.abort()
    assert fds_under(root) == []
    with ss.append_to(root, direct_io=True) as w2:
        w2.append_batch(_batch(2))
    assert len(ss.open(root)) == 2 and verify(root) == [] and fds_under(root) == []


@pytest.fixture(scope="module")
def seven_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """63 one-record shards (ids id0..id62): seven level-1 index runs, the next shard merges them. Written
    once per module (63 commits); each test works on its own copy."""
    root = tmp_path_factory.mktemp("seven-runs") / "s"
    with ss.create(root, {"v": ss.Field("int32")}, max_shard_records=1) as w:
        for i in range(63):
            w.append({"v": i}, id=f"id{i}")
    return root


def test_failing_to_delete_superseded_runs_does_not_fail_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seven_runs: Path
) -> None:
    root = tmp_path / "s"
    shutil.copytree(seven_runs, root, symlinks=True)
    real_unlink = Path.unlink

    def refuse(self: Path, missing_ok: bool = False) -> None:
        if "run-" in self.name:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        real_unlink(self, missing_ok=missing_ok)

    w = ss.append_to(root, max_shard_records=1)
    monkeypatch.setattr(Path, "unlink", refuse)
    w.append({"v": 63}, id="id63")
    w.commit()  # merges the seven level-1 runs and the new one into a level-2 run
    monkeypatch.undo()
    assert w.num_committed == 1 and [r.level for r in Manifest.load(root).index_runs] == [2]
    w.append({"v": 64}, id="id64")  # still usable
    w.close()
    assert len(list((root / "_index").iterdir())) > 2  # the superseded files are still there ...
    with ss.append_to(root):  # ... until the next writer cleans up
        pass
    assert len(list((root / "_index").iterdir())) == 2
    st = ss.open(root)
    assert st.index_many([f"id{i}" for i in range(65)]).tolist() == list(range(65)) and verify(root) == []


@pytest.mark.timeout(60)
def test_an_unsorted_index_source_is_an_error_not_a_hang() -> None:
    h = np.array([9, 9, 9, 5], np.uint64)
    with pytest.raises(ValueError, match="not sorted"):
        list(merge_sorted_runs([(h, np.arange(4), 0)], chunk=2))
    with pytest.raises(ValueError, match="not sorted"):
        list(merge_sorted_runs([(h, np.arange(4), 0), (np.array([1, 2], np.uint64), np.arange(2), 4)], chunk=1))


@pytest.mark.timeout(120)
def test_a_damaged_run_is_rebuilt_from_its_shards_at_merge(tmp_path: Path, seven_runs: Path) -> None:
    root = tmp_path / "s"
    shutil.copytree(seven_runs, root, symlinks=True)
    run = Manifest.load(root).index_runs[3]
    path = root / f"{run.name}.hash.npy"
    h = np.load(path)
    with open(path, "r+b") as f:  # reversed: no longer sorted (run files carry no checksum)
        f.seek(f.seek(0, 2) - h.nbytes)
        f.write(h[::-1].tobytes())
    with ss.append_to(root, max_shard_records=1) as w:
        w.append({"v": 63}, id="id63")  # the level-2 merge
    assert [r.level for r in Manifest.load(root).index_runs] == [2]
    st = ss.open(root)
    assert st.index_many([f"id{i}" for i in range(64)]).tolist() == list(range(64)) and verify(root) == []


@pytest.mark.parametrize("direct_io", [False, True])
@pytest.mark.parametrize("child", ["abort", "close", "exit"])
def test_a_forked_child_cannot_damage_the_parents_shard(tmp_path: Path, direct_io: bool, child: str) -> None:
    root = tmp_path / "s"
    schema = {"x": ss.Field("float32", (3,))}
    w = ss.create(root, schema, buffer_bytes=1, direct_io=direct_io)
    w.append_batch({"x": np.ones((5, 3), np.float32)})
    pid = os.fork()
    if pid == 0:  # the child: whatever it does with its copy must not touch the parent's files
        code = 0
        try:
            if child == "abort":
                w.abort()
            elif child == "close":
                w.close()
            try:
                w.append_batch({"x": np.zeros((1, 3), np.float32)})
                code = 3  # must refuse
            except ss.SeqstoreError:
                pass
        except BaseException:  # noqa: BLE001
            code = 4
        if child == "exit":  # what an interpreter exit does to the copy: finalisers run
            import gc

            del w
            gc.collect()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    w.append_batch({"x": np.full((5, 3), 2, np.float32)})
    w.close()
    st = ss.open(root)
    assert len(st) == 10 and verify(root) == []
    np.testing.assert_array_equal(st.get_batch(np.arange(10))["x"][:, 0], [1] * 5 + [2] * 5)


def test_verify_sees_an_unsorted_shard_index(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with ss.create(root, {"v": ss.Field("int32")}) as w:
        for i in range(6):
            w.append({"v": i}, id=f"id{i}")
    shard = root / "shard-000000"
    for name in ("_ids.hash.npy", "_ids.hash_rows.npy"):  # both reversed: consistent pairs, wrong order
        a = np.load(shard / name)
        with open(shard / name, "r+b") as f:
            f.seek(f.seek(0, 2) - a.nbytes)
            f.write(a[::-1].tobytes())
        crc = zlib.crc32(a[::-1].tobytes())
        edit_shard_meta(root, 0, lambda s, name=name, crc=crc: s["files"][name].update(crc32=crc))
    problems = verify(root)
    assert any("hashes are not sorted" in p for p in problems), problems


class _SlicingInterrupted(list):  # type: ignore[type-arg]
    """ids whose slicing is interrupted, as a Ctrl-C arriving while the writer buffers a batch would be."""

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            raise KeyboardInterrupt
        return list.__getitem__(self, k)


def test_an_interrupted_append_fails_the_writer_instead_of_a_garbled_commit(tmp_path: Path) -> None:
    """Ctrl-C caught by the program in the middle of buffering a batch: an explicit close() must not try to
    commit buffers that no longer agree (it used to fail inside numpy); the writer says an earlier write
    failed, abort() works, and what was committed stays."""
    root = tmp_path / "s"
    schema = {"a": ss.Field("int32"), "b": ss.Field("float32", (None,))}
    w = ss.create(root, schema)
    w.append_batch({"a": np.arange(3), "b": [np.ones(2, np.float32)] * 3}, ids=["x", "y", "z"])
    w.commit()
    w.append_batch({"a": np.arange(2), "b": [np.ones(2, np.float32)] * 2}, ids=["p", "q"])
    with pytest.raises(KeyboardInterrupt):
        w.append_batch({"a": np.arange(2), "b": [np.ones(2, np.float32)] * 2}, ids=_SlicingInterrupted(["r", "s"]))
    with pytest.raises(ss.SeqstoreError, match="earlier write failed"):
        w.close()
    w.abort()
    assert workspaces(root) == []
    store = ss.open(root)
    assert len(store) == 3 and [store.id(i) for i in range(3)] == ["x", "y", "z"]
    assert verify(root) == []


@pytest.mark.parametrize("direct_io", [False, True])
def test_close_after_a_failed_write_closes_the_shards_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_io: bool
) -> None:
    """A disk full part way, then close() (or the end of a ``with`` block whose body caught the error): close
    refuses to commit, and used to keep the shard's files open after deleting them, so the full disk got
    none of their space back while the process lived."""
    root = tmp_path / "s"
    with ss.create(root, SCHEMA, direct_io=direct_io) as w:
        w.append_batch(_batch(3))
    for how in ("close", "with"):
        w = ss.append_to(root, buffer_bytes=1, direct_io=direct_io)
        w.append_batch(_batch(2, 2.0))
        _disk_full_at_the_second_write(monkeypatch)
        with pytest.raises(ss.SeqstoreError, match="earlier write failed"):
            with w:
                with pytest.raises(OSError, match="No space"):
                    w.append_batch(_batch(4, 3.0))
                    w.commit()
                if how == "close":
                    w.close()
        monkeypatch.undo()
        assert fds_under(root) == [] and not workspaces(root), how
    st = ss.open(root)
    assert len(st) == 3 and verify(root) == []


def test_a_shard_whose_commit_failed_is_counted_as_pending(tmp_path: Path) -> None:
    """A full shard whose commit failed (the lock file unusable for a moment) stays pending and is committed
    first next time: the record numbers of later appends and the at-exit line count its records."""
    from seqstore.store.write import at_exit

    root = tmp_path / "s"
    w = ss.create(root, {"x": ss.Field("int64", ())}, max_shard_records=4)
    (root / ".lock").unlink(missing_ok=True)
    (root / ".lock").mkdir()  # open(O_RDWR) of a directory fails: the commit cannot take the lock
    with pytest.raises(ss.SeqstoreError, match="lock"):
        for i in range(4):
            w.append({"x": i})  # the fourth fills the shard, which is committed at once
    (root / ".lock").rmdir()
    w.append({"x": 4})
    with pytest.raises(ss.SchemaError, match="record 5"):
        w.append({"x": 1.5})
    line = w._commit_at_exit("exit")
    assert line is not None and "committed 5 pending record(s)" in line, line
    assert ss.open(root).get_batch(np.arange(5), fields=["x"])["x"].tolist() == [0, 1, 2, 3, 4]
    at_exit.unregister(w)


def _manifest_blocked(root: Path, records: int) -> tuple[Any, Path]:
    """A writer of shards of 2 records at ``root`` holding records 0..``records``-1, and a directory in the
    way of its next manifest save (a full disk, as far as the commit can tell); remove it to make room."""
    w = ss.create(root, {"x": ss.Field("int64", ())}, max_shard_records=2)
    for i in range(records):
        w.append({"x": i})
    blocker = root / "_tmp" / f".manifest.json.tmp-{os.getpid()}"
    blocker.mkdir()
    return w, blocker


def _record_fsyncs(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[Path]:
    """The directories ``module``'s ``fsync_dir`` is called with from now on (each still fsynced)."""
    synced: list[Path] = []
    real = module.fsync_dir

    def recording(path: Any) -> None:
        synced.append(Path(path))
        real(path)

    monkeypatch.setattr(module, "fsync_dir", recording)
    return synced


def test_every_directory_of_a_shard_with_deeply_nested_fields_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Field "a/b/c" lives in current/a/b/c.npy: the entry "b" of current/a must be made durable too, or a
    power cut after the commit could lose the field's directory."""
    from seqstore.store.write import shard_files

    synced = _record_fsyncs(monkeypatch, shard_files)
    root = tmp_path / "s"
    schema = {"a": {"b": {"c": ss.Field("float32", (2,)), "r": ss.Field("int8", (None,))}}, "x": ss.Field("int8")}
    with ss.create(root, schema) as w:
        w.append({"a": {"b": {"c": np.zeros(2, np.float32), "r": np.ones(3, np.int8)}}, "x": 1})
    current = next(p for p in synced if p.name == "current")
    assert {p.relative_to(current).as_posix() for p in synced if p.is_relative_to(current)} >= {".", "a", "a/b"}
    assert sorted(p.relative_to(root).as_posix() for p in (root / "shard-000000").rglob("*") if p.is_dir()) == [
        "shard-000000/a", "shard-000000/a/b"]


def test_a_copy_to_a_local_directory_fsyncs_every_directory_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """seqstore copy into a local directory: shard-000000/a/ (made for field "a/b/c") is fsynced too."""
    from seqstore.store.copy import copy
    from seqstore.store.write import state

    synced = _record_fsyncs(monkeypatch, state)
    with ss.create(tmp_path / "s", {"a": {"b": {"c": ss.Field("float32", (2,))}}, "x": ss.Field("int8")}) as w:
        w.append({"a": {"b": {"c": np.zeros(2, np.float32)}}, "x": 1})
    dst = tmp_path / "t"
    copy(tmp_path / "s", dst)
    made = {p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_dir()} - {"_tmp"}
    assert made == {"shard-000000", "shard-000000/a", "shard-000000/a/b"}
    assert {p.relative_to(dst).as_posix() for p in synced if p.is_relative_to(dst)} >= made | {"."}
    assert len(ss.open(dst)) == 1 and verify(dst) == []


def test_a_local_commit_of_top_level_files_fsyncs_the_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LocalObjects.commit of keys at the top (the shard table, manifest.json) makes their renames durable:
    the store's root is fsynced."""
    from seqstore.store.write import state

    synced = _record_fsyncs(monkeypatch, state)
    objects = state.LocalObjects(tmp_path / "s")
    try:
        objects.commit([("_table.bin", b"x")], b"{}", "overwrite")
    finally:
        objects.close()
    assert tmp_path / "s" in synced


def test_a_close_whose_commit_failed_can_be_called_again(tmp_path: Path) -> None:
    """close() could not commit (the lock file unusable for a moment; at a URL: the network down): it
    released the writer all the same and discarded the records it had just failed to commit, and a second
    close() returned without a word. The writer now stays open: close() again commits, abort() discards."""
    root = tmp_path / "s"
    w = ss.create(root, {"x": ss.Field("int64", ())})
    for i in range(3):
        w.append({"x": i})
    (root / ".lock").unlink(missing_ok=True)
    (root / ".lock").mkdir()
    with pytest.raises(ss.SeqstoreError, match="lock"):
        w.close()
    (root / ".lock").rmdir()
    w.close()
    assert ss.open(root).get_batch(np.arange(3), fields=["x"])["x"].tolist() == [0, 1, 2]
    assert fds_under(root) == [] and not workspaces(root)
    w.close()  # closed: nothing more to do
    w2 = ss.append_to(root)
    w2.append({"x": 3})
    (root / ".lock").unlink()
    (root / ".lock").mkdir()
    with pytest.raises(ss.SeqstoreError, match="lock"):
        w2.close()
    w2.abort()  # gives the records up
    (root / ".lock").rmdir()
    assert len(ss.open(root)) == 3 and fds_under(root) == [] and not workspaces(root)



def test_a_writer_whose_store_was_replaced_says_so(tmp_path: Path) -> None:
    """create(path, overwrite=True) deleted the store (and the workspaces in it) while a writer on it was
    open: that writer's next commit failed with a bare FileNotFoundError naming a file of its workspace,
    and a writer holding only stats deltas added them to the new store."""
    root = tmp_path / "s"
    w = ss.create(root, SCHEMA)
    w.append_batch(_batch(2))
    stats_only = ss.append_to(root)
    stats_only.add_stats({"seen": 2})
    ss.create(root, SCHEMA, overwrite=True).close()
    with pytest.raises(ss.SeqstoreError, match=f"{root}.*deleted or replaced.*2 record"):
        w.commit()
    with pytest.raises(ss.SeqstoreError, match=f"{root}.*deleted or replaced"):
        stats_only.commit()
    w.abort()
    stats_only.abort()
    st = ss.open(root)
    assert len(st) == 0 and "seen" not in st.manifest.stats
    assert fds_under(root) == [] and not workspaces(root)


def test_a_commit_that_fails_after_its_shard_is_in_the_store_keeps_the_records(tmp_path: Path) -> None:
    """A local commit renamed the finished shard into the store and then could not save the manifest (a full
    disk; here its temporary file's path is taken by a directory): the writer was marked failed and its
    records lost, though the shard was whole. The shard now goes back to the writer's workspace, the writer
    stays open, and its next commit commits it first (here a full shard's own commit, from append)."""
    root = tmp_path / "s"
    w, blocker = _manifest_blocked(root, 3)
    with pytest.raises(OSError):
        w.append({"x": 3})  # the shard of records 2, 3 is full: committed here
    assert len(ss.open(root)) == 2 and not (root / "shard-000001").exists()
    blocker.rmdir()
    w.append({"x": 4})
    w.close()
    assert ss.open(root).get_batch(np.arange(5), fields=["x"])["x"].tolist() == [0, 1, 2, 3, 4]
    assert verify(root) == [] and fds_under(root) == [] and not workspaces(root)


def test_a_full_disk_at_the_shard_tables_row_keeps_the_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shard table's row could not be written (ENOSPC) after the shard was renamed into the store: the
    records were lost and the writer unusable. Now the error names the store, the writer goes on, and the
    shard is committed (before the next one) once there is room."""
    from seqstore.store.write import disk

    root = tmp_path / "s"
    w = ss.create(root, {"x": ss.Field("int64", ())})
    w.append({"x": 0})
    w.commit()
    w.append({"x": 1})

    def full(fd: int, data: memoryview, offset: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(disk, "pwrite_all", full)
        with pytest.raises(OSError, match=f"cannot write the store {root}"):
            w.commit()
    assert len(ss.open(root)) == 1
    w.append({"x": 2})
    w.close()
    assert ss.open(root).get_batch(np.arange(3), fields=["x"])["x"].tolist() == [0, 1, 2]
    assert verify(root) == [] and fds_under(root) == [] and not workspaces(root)


def test_a_second_close_after_a_failed_write_raises_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """close() after a failed write raised once and discarded the uncommitted records; a second close()
    returned without a word, as if they had been committed. It now raises the same error again."""
    root = tmp_path / "s"
    w = ss.create(root, SCHEMA, buffer_bytes=1)
    w.append_batch(_batch(2))
    _disk_full_at_the_second_write(monkeypatch)
    with pytest.raises(OSError, match="No space"):
        w.append_batch(_batch(2, 2.0))
    monkeypatch.undo()
    with pytest.raises(ss.SeqstoreError, match="earlier write failed") as first:
        w.close()
    with pytest.raises(ss.SeqstoreError, match="earlier write failed") as second:
        w.close()
    assert second.value is first.value
    w.abort()  # (abort stays quiet: discarding is what it is for)
    assert len(ss.open(root)) == 0 and fds_under(root) == [] and not workspaces(root)


def test_a_full_disk_at_a_commit_of_stats_only_keeps_the_writer(tmp_path: Path) -> None:
    """A commit of add_stats deltas alone whose manifest could not be saved (a full disk; here the temporary
    file's path is taken by a directory) marked the writer failed: close() then discarded the deltas and
    its records appended since. Nothing was changed, so the writer now stays usable and commits them later."""
    root = tmp_path / "s"
    ss.create(root, {"x": ss.Field("int64", ())}).close()
    w = ss.append_to(root)
    w.add_stats({"seen": 2})
    blocker = root / "_tmp" / f".manifest.json.tmp-{os.getpid()}"
    blocker.mkdir()
    with pytest.raises(OSError):
        w.commit()
    blocker.rmdir()
    w.append({"x": 7})
    w.close()
    st = ss.open(root)
    assert st.manifest.stats["seen"] == 2 and st.get_batch(np.arange(1), fields=["x"])["x"].tolist() == [7]
    assert fds_under(root) == [] and not workspaces(root)


def test_a_failed_local_commit_holds_no_file_of_the_store_without_the_cycle_collector(tmp_path: Path) -> None:
    """The error of a local commit that failed after renaming its shard into the store and the wrapper that
    told the writer nothing was committed pointed at each other: a reference cycle that kept the failed
    step's frames, and the shard table they had open, until the cyclic GC ran. Dropping the error now
    releases them."""
    import gc

    root = tmp_path / "s"
    w, blocker = _manifest_blocked(root, 3)
    gc.disable()
    try:
        with pytest.raises(OSError):
            w.append({"x": 3})
        held = [p for p in fds_under(root) if not p.endswith("owner.lock")]  # (the writer's own flock)
    finally:
        gc.enable()
    blocker.rmdir()
    w.close()
    assert held == [] and fds_under(root) == []


def test_append_batch_whose_commit_fails_with_the_shard_intact_keeps_the_writer_open(tmp_path: Path) -> None:
    """append_batch's automatic commit of a full shard could not save the manifest (the shard intact, back in
    the workspace): append() kept the writer open with the records, as documented, but append_batch() marked
    the writer failed, so close() discarded them. Now the writer stays open and close() commits them."""
    root = tmp_path / "s"
    w, blocker = _manifest_blocked(root, 0)
    with pytest.raises(OSError):
        w.append_batch({"x": np.arange(2)})  # one full shard: committed here
    assert len(ss.open(root)) == 0
    blocker.rmdir()
    w.close()
    assert ss.open(root).get_batch(np.arange(2), fields=["x"])["x"].tolist() == [0, 1]
    assert verify(root) == [] and fds_under(root) == [] and not workspaces(root)


def test_an_automatic_commit_that_fails_says_how_many_records_the_writer_took(tmp_path: Path) -> None:
    """append()/append_batch() raised the failure of the automatic commit of a full shard after taking the
    record(s), with nothing saying so: a caller that appended them again stored them twice, and a batch did not
    say how much of it was taken. The error is now an AutoCommitError (still of the failure's own class) whose
    ``taken`` and message say how many records of the call the writer holds."""
    from seqstore.errors import AutoCommitError, LockError

    root = tmp_path / "s"
    w, blocker = _manifest_blocked(root, 1)
    with pytest.raises(OSError) as err:
        w.append({"x": 1})  # fills the shard: its commit cannot save the manifest
    assert isinstance(err.value, AutoCommitError) and (err.value.taken, err.value.pending) == (1, 2)
    assert "holds 1 of the 1 record(s) of this call (2 uncommitted in all): do not append them again" in str(err.value)
    blocker.rmdir()
    (root / ".lock").unlink(missing_ok=True)
    (root / ".lock").mkdir()  # the lock file unusable for a moment
    with pytest.raises(LockError) as lock_err:
        w.append_batch({"x": np.arange(2, 7)})  # records 2, 3 fill the next shard; the first is not committed
    e = lock_err.value
    assert isinstance(e, AutoCommitError) and (e.taken, e.pending) == (2, 4)
    assert "holds 2 of the 5 record(s)" in str(e) and "the 3 from record 2 of the call on were not taken" in str(e)
    (root / ".lock").rmdir()
    w.append_batch({"x": np.arange(2 + e.taken, 7)})  # the rest, as the error says
    w.close()
    assert ss.open(root).get_batch(np.arange(7), fields=["x"])["x"].tolist() == list(range(7))
    assert len(ss.open(root)) == 7 and verify(root) == [] and not workspaces(root)


def test_a_full_shard_whose_commit_keeps_failing_grows_no_further(tmp_path: Path) -> None:
    """While the automatic commits kept failing, every append went into the full shard: it grew past
    max_shard_records (and shard_bytes) without a bound, and so did the staging disk. An append now first
    retries the commit of the full shard and, failing, takes nothing (AutoCommitError, taken 0)."""
    from seqstore.errors import AutoCommitError

    root = tmp_path / "s"
    w, blocker = _manifest_blocked(root, 1)
    with pytest.raises(AutoCommitError, match="holds 1 of the 1 record"):
        w.append({"x": 1})  # shard [0, 1] full: not committed
    w.append({"x": 2})
    with pytest.raises(AutoCommitError, match="holds 1 of the 1 record"):
        w.append({"x": 3})  # shard [2, 3] full: the one before it first, which fails again
    with pytest.raises(AutoCommitError, match="none of the 1 record") as err:
        w.append({"x": 4})
    assert (err.value.taken, err.value.pending) == (0, 4)
    with pytest.raises(OSError, match="none of the 2 record"):
        w.append_batch({"x": np.arange(4, 6)})
    blocker.rmdir()
    w.append_batch({"x": np.arange(4, 6)})
    w.close()
    assert Manifest.load(root).shard_table().data["records"].tolist() == [2, 2, 2]
    assert ss.open(root).get_batch(np.arange(6), fields=["x"])["x"].tolist() == list(range(6))
