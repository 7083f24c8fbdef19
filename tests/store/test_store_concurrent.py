"""Several writer processes into one store: every record exactly once, unique shards, ids resolvable."""

from __future__ import annotations

import multiprocessing as mp
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from store_testlib import CHILD_SCHEMA, child_record, child_write, workspaces

import seqstore as ss


def test_two_writer_processes(scratch: Path) -> None:
    root = scratch / "s"
    with ss.create(root, CHILD_SCHEMA) as w:
        w.append(child_record(0, 0), id="w0-0")
    counts = {1: 40, 2: 33}
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = [pool.apply_async(child_write, (str(root), tag, n, 5)) for tag, n in counts.items()]
        assert [r.get(timeout=300) for r in results] == list(counts.values())
    store = ss.open(root)
    total = 1 + sum(counts.values())
    assert len(store) == total
    ids = [store.id(i) for i in range(total)]
    assert len(set(ids)) == total  # each record exactly once
    assert Counter(s.split("-")[0] for s in ids) == {"w0": 1, "w1": 40, "w2": 33}
    for tag, n in counts.items():
        want_ids = [f"w{tag}-{i}" for i in range(n)]
        rows = store.index_many(want_ids)
        assert len(set(rows.tolist())) == n
        # each writer's records keep their order and their contents
        assert np.all(np.diff(rows) > 0)
        for i, r in enumerate(rows.tolist()):
            rec = store[r]
            want = child_record(tag, i)
            np.testing.assert_array_equal(rec["x"], want["x"])
            assert int(rec["meta/k"]) == want["meta"]["k"]
            assert store.index(want_ids[i]) == r
    names = [s.name for s in store.manifest.shards]
    assert len(names) == len(set(names))
    on_disk = sorted(p.name for p in root.iterdir() if p.name.startswith("shard-"))
    assert on_disk == sorted(names)
    assert not workspaces(root)
    # shards of 5 records with commits every 7 appends: each writer committed several shards
    assert store.num_shards >= 1 + 2 * 8


_PAUSED_CREATE = '''
import sys, time, os
from pathlib import Path
import seqstore as ss
path, ready, go = sys.argv[1:4]

def hook(event, args):  # pause create() just before it writes its manifest, until the test says go
    if event == "open" and isinstance(args[0], str) and ".manifest.json.tmp-" in args[0] and not os.path.exists(ready):
        Path(ready).touch()
        while not os.path.exists(go):
            time.sleep(0.01)

sys.addaudithook(hook)
try:
    ss.create(path, {"x": ss.Field("int64")}).close()
    print("created")
except FileExistsError as exc:
    print("FileExistsError", exc)
'''


def test_create_racing_open_or_create_in_another_process_loses_nothing(scratch: Path) -> None:
    """create() made the store's directory and then wrote its manifest into it: an open_or_create in
    another process between the two took the empty directory as its own (its rename replaces an empty
    directory), committed records, and create then wrote an empty manifest over them (the records lost,
    both callers told they created the store). Exactly one may create it; the other appends or is told."""
    import subprocess
    import sys
    import time

    from seqstore.store.writer import open_or_create

    path, ready, go = scratch / "s", scratch / "ready", scratch / "go"
    src = Path(ss.__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-c", _PAUSED_CREATE, str(path), str(ready), str(go)],
                            env={**__import__("os").environ, "PYTHONPATH": str(src)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        with open_or_create(path, {"x": ss.Field("int64")}) as w:  # while create is paused
            w.append_batch({"x": np.arange(5)})
    finally:
        go.touch()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert ss.open(path).get_batch(np.arange(5), fields=["x"])["x"].tolist() == list(range(5))
    assert out.startswith("FileExistsError"), out


def test_a_commit_lock_held_by_a_hung_process_is_a_named_error_not_a_hang(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer waited on the store's lock file without a bound: a process that hung holding it (here this
    process through a descriptor of its own, as another process would) hung every writer for ever. The wait
    is now bounded (SEQSTORE_LOCK_TIMEOUT): a LockTimeout names the lock file and the process holding it,
    and the writer keeps its records for the next commit."""
    import fcntl
    import os

    from seqstore.errors import LockError, LockTimeout

    root = scratch / "s"
    w = ss.create(root, {"x": ss.Field("int64", ())})
    w.append({"x": 1})
    monkeypatch.setenv("SEQSTORE_LOCK_TIMEOUT", "0.05")
    fd = os.open(root / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(LockTimeout, match=f"{root / '.lock'}.*held by process {os.getpid()}") as err:
            w.commit()
        assert isinstance(err.value, LockError) and err.value.holder == os.getpid()
        with pytest.raises(LockTimeout):
            ss.append_to(root)
    finally:
        os.close(fd)
    w.close()
    assert ss.open(root).get_batch(np.arange(1), fields=["x"])["x"].tolist() == [1]
    monkeypatch.setenv("SEQSTORE_LOCK_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="SEQSTORE_LOCK_TIMEOUT='soon'"):
        ss.append_to(root)


def test_an_overwrite_held_up_by_a_hung_overwrite_is_a_named_error_not_a_hang(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """create(path, overwrite=True) waited without a bound for the owner.lock at the old store's top, which
    another overwrite of the path holds while it deletes the store: a hung one hung it for ever. The wait is
    now bounded as the commit lock's is (LockTimeout naming the lock file); the old store is untouched."""
    import fcntl
    import os

    from seqstore.errors import LockTimeout

    root = scratch / "s"
    with ss.create(root, {"x": ss.Field("int64", ())}) as w:
        w.append({"x": 5})
    monkeypatch.setenv("SEQSTORE_LOCK_TIMEOUT", "0.05")
    fd = os.open(root / "owner.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(LockTimeout, match=f"{root / 'owner.lock'}: the lock of an overwrite.*{os.getpid()}"):
            ss.create(root, {"y": ss.Field("int8", ())}, overwrite=True)
    finally:
        os.close(fd)
    assert ss.open(root).get_batch(np.arange(1), fields=["x"])["x"].tolist() == [5]
    ss.create(root, {"y": ss.Field("int8", ())}, overwrite=True).close()
    assert list(ss.open(root).schema) == ["y"]
