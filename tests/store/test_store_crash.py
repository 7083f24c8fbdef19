"""Durability: a writer SIGKILLed mid-write loses nothing committed; its leftovers are ignored and cleaned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from store_testlib import CHILD_SCHEMA, child_record, create_legacy, workspaces

import seqstore as ss
from seqstore.store.verify import verify

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")

HERE = Path(__file__).resolve().parent

CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    import seqstore as ss
    from store_testlib import child_record

    root, flag, committed, mode = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    w = ss.append_to(root, buffer_bytes=64, max_shard_records=7 if mode == "loop" else 1 << 20)
    i = 0
    if mode == "once":
        for i in range(committed):
            w.append(child_record(1, i), id=f"c{i}")
        w.commit()
        open(flag + ".committed", "w").close()
        i = committed
        while True:  # uncommitted from here on; small buffer -> flushed to the workspace
            w.append(child_record(1, i), id=f"c{i}")
            i += 1
            if i == committed + 2000:  # past the file buffers: uncommitted bytes are on disk
                open(flag + ".flushed", "w").close()
                time.sleep(60)
    else:  # "loop": append and commit forever; the parent kills us at some point
        open(flag + ".started", "w").close()
        while True:
            w.append(child_record(1, i), id=f"c{i}")
            i += 1
            if i % 3 == 0:
                w.commit()
    """
)


def _spawn(root: Path, flag: Path, committed: int, mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(HERE), str(root), str(flag), str(committed), mode],
        stderr=subprocess.PIPE,
    )


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"child exited early ({proc.returncode}): {proc.stderr.read().decode()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.01)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert proc.stderr is not None
    proc.stderr.close()


@pytest.fixture(params=[3, 1], ids=["v3", "v1"])
def version(request: pytest.FixtureRequest) -> int:
    """Format version of the store: 3 (what create writes) or 1 (the JSON shard list, kept when appended)."""
    return int(request.param)


def _new_store(root: Path, version: int) -> None:
    (ss.create(root, CHILD_SCHEMA) if version == 3 else create_legacy(root, CHILD_SCHEMA)).close()


def _check_prefix(root: Path, n: int) -> None:
    """The store holds exactly records c0..c{n-1}, intact."""
    store = ss.open(root)
    assert len(store) == n
    for i in range(n):
        rec = store[i]
        want = child_record(1, i)
        np.testing.assert_array_equal(rec["x"], want["x"])
        assert int(rec["meta/k"]) == want["meta"]["k"]
        assert store.id(i) == f"c{i}"
    if n:
        assert store.index_many([f"c{i}" for i in range(n)]).tolist() == list(range(n))
        assert store.get_batch(np.arange(n))["meta/k"].tolist() == [child_record(1, i)["meta"]["k"] for i in range(n)]


def test_sigkill_after_commit_keeps_exactly_the_committed_records(scratch: Path, version: int) -> None:
    root = scratch / "s"
    _new_store(root, version)
    flag = scratch / "flag"
    committed = 12
    proc = _spawn(root, flag, committed, "once")
    try:
        _wait_for(Path(f"{flag}.flushed"), proc)
    finally:
        if proc.poll() is None:
            _kill(proc)
    assert Path(f"{flag}.committed").exists()
    # the dead writer left a workspace with flushed, uncommitted shard files
    left = workspaces(root)
    assert len(left) == 1
    data = left[0] / "current" / "x.npy"
    assert data.exists() and data.stat().st_size > 128, "expected flushed uncommitted data"
    # readers see exactly the committed records and ignore the workspace
    _check_prefix(root, committed)
    assert ss.open(root).num_shards == 1
    # the next writer removes the dead writer's workspace and can append and commit
    w = ss.append_to(root)
    assert not left[0].exists()
    for i in range(committed, committed + 4):
        w.append(child_record(1, i), id=f"c{i}")
    w.commit()
    w.close()
    _check_prefix(root, committed + 4)
    assert not workspaces(root)


@pytest.mark.parametrize("delay", [0.05, 0.3])
def test_sigkill_at_a_random_point_leaves_a_consistent_prefix(scratch: Path, delay: float, version: int) -> None:
    """Kill a writer that commits in a loop (possibly mid-commit): the store is some intact prefix."""
    root = scratch / "s"
    _new_store(root, version)
    flag = scratch / "flag"
    proc = _spawn(root, flag, 0, "loop")
    try:
        _wait_for(Path(f"{flag}.started"), proc)
        time.sleep(delay)
    finally:
        if proc.poll() is None:
            _kill(proc)
    n = len(ss.open(root))
    _check_prefix(root, n)
    with ss.append_to(root) as w:  # cleans the dead writer's files, then appends
        w.append(child_record(1, n), id=f"c{n}")
    _check_prefix(root, n + 1)
    assert workspaces(root) == []
    committed = {s.name for s in ss.open(root).manifest.shards}
    assert {p.name for p in root.iterdir() if p.name.startswith("shard-")} == committed
    assert ss.open(root).manifest.version == version
    assert verify(root) == []


def test_live_writer_workspace_is_not_cleaned(scratch: Path) -> None:
    """Another writer's workspace is only removed when its owner is dead (flock on owner.lock)."""
    root = scratch / "s"
    ss.create(root, CHILD_SCHEMA).close()
    a = ss.append_to(root, buffer_bytes=1)
    a.append(child_record(1, 0), id="c0")  # flushed into a's workspace
    b = ss.append_to(root)  # cleans orphans: must keep a's live workspace
    a.append(child_record(1, 1), id="c1")
    a.commit()
    b.append(child_record(1, 2), id="c2")
    b.close()
    a.close()
    _check_prefix(root, 3)


_KILLED_OVERWRITE = """
import os, signal, sys
import seqstore as ss
path, at = sys.argv[1], int(sys.argv[2])
removed = [0]

def hook(event, args):  # SIGKILL the process at its at-th file removal
    if event == "os.remove":
        removed[0] += 1
        if removed[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(hook)
ss.create(path, {"v": ss.Field("int32")}, overwrite=True).close()
"""


@pytest.mark.parametrize("at", [3, 40])
def test_create_overwrite_killed_while_deleting_leaves_no_half_store(scratch: Path, at: int) -> None:
    """create(overwrite=True) deleted the old store file by file in place: killed part way, the path held
    a manifest whose shard table was gone (readers: CorruptionError), or shards without a manifest, which
    create(overwrite=True) then refused as "not a store" (the user had to delete it by hand). The old
    store is moved aside first: the path holds it whole or nothing."""
    root = scratch / "s"
    with ss.create(root, {"v": ss.Field("int64")}, max_shard_records=2) as w:
        w.append_batch({"v": np.arange(60)})
    proc = subprocess.run([sys.executable, "-c", _KILLED_OVERWRITE, str(root), str(at)], timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(ss.__file__).resolve().parents[1])})
    assert proc.returncode == -signal.SIGKILL
    assert not root.exists()
    assert [p.name.startswith(".s.deleted-") for p in scratch.iterdir()] == [True]  # the killed one's
    with ss.create(root, {"v": ss.Field("int32")}, overwrite=True) as w:
        w.append({"v": 7})
    assert ss.open(root).get_batch(np.arange(1), fields=["v"])["v"].tolist() == [7]
    assert [p.name for p in scratch.iterdir()] == ["s"], "the killed overwrite's old store was left for ever"


def test_leftovers_of_killed_overwrites_go_but_not_one_being_deleted(scratch: Path) -> None:
    """open_or_create (and create) of a path remove what overwrites of it killed part way left (hidden
    '.<name>.deleted-*' siblings), but not one a live overwrite is deleting (it holds its owner.lock)."""
    from seqstore.store.write.disk import hold_owner_lock
    from seqstore.store.writer import open_or_create

    root = scratch / "s"
    for k in range(3):
        with ss.create(root, {"v": ss.Field("int64")}, max_shard_records=2, overwrite=k > 0) as w:
            w.append_batch({"v": np.arange(6)})
        if k < 2:
            os.rename(root, scratch / f".s.deleted-{k}")  # what an overwrite killed after its rename leaves
    live = scratch / ".s.deleted-live"
    os.rename(root, live)
    fd = hold_owner_lock(live)  # as the overwrite deleting it holds it
    try:
        open_or_create(root, {"v": ss.Field("int64")}).close()
        assert sorted(p.name for p in scratch.iterdir()) == [".s.deleted-live", "s"]
    finally:
        os.close(fd)
    ss.create(root, {"v": ss.Field("int64")}, overwrite=True).close()
    assert [p.name for p in scratch.iterdir()] == ["s"]
    assert len(ss.open(root)) == 0


def test_two_overwrites_at_once_one_wins_and_nothing_is_left(scratch: Path) -> None:
    """Two create(overwrite=True) of one path at once: one replaces the store, the other is refused
    (never deletes the store the first just made), and no old store is left beside it."""
    import threading

    root = scratch / "s"
    with ss.create(root, {"v": ss.Field("int64")}, max_shard_records=1) as w:
        w.append_batch({"v": np.arange(300)})
    got: list[str] = []

    def overwrite(k: int) -> None:
        try:
            with ss.create(root, {"v": ss.Field("int64")}, overwrite=True) as w:
                w.append({"v": k})
            got.append(f"ok {k}")
        except FileExistsError:
            got.append("refused")

    threads = [threading.Thread(target=overwrite, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got)[0].startswith("ok") and sorted(got)[1] == "refused", got
    assert [p.name for p in scratch.iterdir()] == ["s"]
    assert ss.open(root).get_batch(np.arange(1))["v"].tolist() == [int(sorted(got)[0][3:])]


_KILLED_CREATE = """
import os, signal, sys
import seqstore as ss
path = sys.argv[1]

def hook(event, args):  # SIGKILL the process as it writes the manifest into the store it prepares
    path = str(args[0]) if event == "open" else ""
    if os.path.basename(os.path.dirname(path)).startswith(".s.") and "manifest" in os.path.basename(path):
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(hook)
ss.create(path, {"v": ss.Field("int32")}).close()
"""


def test_a_create_killed_before_its_store_is_in_place_leaves_nothing_for_ever(scratch: Path) -> None:
    """A create killed between the making of the hidden sibling it prepares the new store in and its rename
    left that sibling for ever; the next create (or open_or_create) of the path deletes it, but not one a
    live create holds."""
    from seqstore.store.write.disk import hold_owner_lock
    from seqstore.store.writer import open_or_create

    root = scratch / "s"
    proc = subprocess.run([sys.executable, "-c", _KILLED_CREATE, str(root)], timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(ss.__file__).resolve().parents[1])})
    assert proc.returncode == -signal.SIGKILL
    left = list(scratch.iterdir())
    assert [p.name.startswith(".s.") for p in left] == [True]  # the killed one's
    with ss.create(root, {"v": ss.Field("int32")}) as w:
        w.append({"v": 7})
    assert [p.name for p in scratch.iterdir()] == ["s"], "the killed create's sibling was left for ever"
    os.mkdir(left[0])
    fd = hold_owner_lock(left[0])  # as a live create holds the sibling it prepares
    try:
        open_or_create(root, {"v": ss.Field("int32")}).close()
        assert sorted(p.name for p in scratch.iterdir()) == [left[0].name, "s"]
    finally:
        os.close(fd)
    open_or_create(root, {"v": ss.Field("int32")}).close()
    assert [p.name for p in scratch.iterdir()] == ["s"]


_MOVE_AT_LISTDIR: list[Path] = []  # armed by the test below: the audit hook lives as long as the process


def _move_at_listdir(event: str, args: tuple[object, ...]) -> None:
    if event == "os.listdir" and _MOVE_AT_LISTDIR and str(args[0]) == str(_MOVE_AT_LISTDIR[0]):
        root = _MOVE_AT_LISTDIR.pop()
        os.rename(root, root.with_name(f".{root.name}.deleted-other"))


def test_an_overwrite_whose_directory_another_overwrite_moves_away_goes_on(scratch: Path) -> None:
    """The other create(overwrite=True) moves the path aside between this one's checks of it: this one
    makes its store (it was a FileNotFoundError from the check that the directory is empty)."""
    root = scratch / "s"
    root.mkdir()  # an empty directory, which overwrite=True may replace
    if not getattr(sys, "_seqstore_test_listdir_hook", False):
        sys.addaudithook(_move_at_listdir)
        sys._seqstore_test_listdir_hook = True  # type: ignore[attr-defined]
    _MOVE_AT_LISTDIR.append(root)
    with ss.create(root, {"v": ss.Field("int64")}, overwrite=True) as w:
        w.append({"v": 7})
    assert not _MOVE_AT_LISTDIR
    assert ss.open(root).get_batch(np.arange(1))["v"].tolist() == [7]
