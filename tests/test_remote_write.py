"""Writers on object storage (moto's S3 server): create / append_to / open_or_create / Logger with an
s3:// URL read back equal to the same records written locally; racing writers (threads with a forced
conflict, and processes) lose no shard; a lost answer to the committing write does not commit twice;
back ends without conditional writes are refused with an error that says to write locally and copy.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from support.races import commit_after, lose_manifest_answer
from support.stores import same_stores as _same

import seqstore as ss
from seqstore.errors import ConflictError, FormatError, RemoteError, SchemaError
from seqstore.store import writer as remote_writer
from seqstore.store.parts import prepare_store
from seqstore.store.verify import verify
from seqstore.store.write import remote
from seqstore.store.write.objects import ObjectTarget

if TYPE_CHECKING:
    from support.proxy import FaultProxy
    from support.s3 import MotoS3

SRC_ROOT = Path(__file__).resolve().parents[1] / "src"
SCHEMA = {
    "x": ss.Field("float32", (None, 3)),
    "spk": ss.Field("int64"),
    "g": {"a": ss.Field("float16", (2,)), "b": ss.Field("float16", (3,))},
}
PACKED = {"pk": ["g/a", "g/b"]}


def _batch(first: int, n: int) -> tuple[dict[str, Any], list[str]]:
    rng = np.random.default_rng(first)
    lens = rng.integers(0, 4, size=n)
    cols = {
        "x": [np.full((int(k), 3), first + j, np.float32) for j, k in enumerate(lens)],
        "spk": np.arange(first, first + n, dtype=np.int64),
        "g/a": rng.standard_normal((n, 2)).astype(np.float16),
        "g/b": rng.standard_normal((n, 3)).astype(np.float16),
    }
    return cols, [f"r{i:05d}" for i in range(first, first + n)]


def _open(url: str, s3: MotoS3, cache: Path) -> Any:
    return ss.open(url, storage_options=s3.storage_options(), cache_dir=cache)


# --------------------------------------------------------------------------------- read back


def test_remote_writes_read_back_equal(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/w/a.seqstore"
    opts = moto_s3.storage_options()
    local = tmp_path / "local.seqstore"
    with ss.create(url, SCHEMA, packed=PACKED, max_shard_records=16, storage_options=opts,
                   metadata={"kind": "test"}, staging_dir=tmp_path / "staging") as w, \
            ss.create(local, SCHEMA, packed=PACKED, max_shard_records=16, metadata={"kind": "test"}) as lw:
        assert isinstance(w.target, ObjectTarget)
        for first in range(0, 70, 10):
            cols, ids = _batch(first, 10)
            w.append_batch(cols, ids=ids)
            lw.append_batch(cols, ids=ids)
        w.add_stats({"seen": 70})
    assert list((tmp_path / "staging").iterdir()) == []  # the staging directory goes with the writer
    store = _open(url, moto_s3, tmp_path / "cache")
    _same(store, ss.open(local))
    assert store.num_shards == 5 and store.metadata == {"kind": "test"} and store.manifest.stats["seen"] == 70
    assert store.manifest.table is not None and store.manifest.table.file.startswith("_shards/")
    assert store.index("r00042") == 42
    assert verify(url, storage_options=opts) == []

    with ss.append_to(url, storage_options=opts, max_shard_records=16) as w, \
            ss.append_to(local, max_shard_records=16) as lw:
        cols, ids = _batch(70, 25)
        w.append_batch(cols, ids=ids)
        lw.append_batch(cols, ids=ids)
        w.commit()
        assert len(_open(url, moto_s3, tmp_path / "cache")) == 95  # visible at commit
        w.append({"x": np.zeros((1, 3), np.float32), "spk": 95, "g/a": np.zeros(2), "g/b": np.zeros(3)},
                 id="r00095")
        lw.append({"x": np.zeros((1, 3), np.float32), "spk": 95, "g/a": np.zeros(2), "g/b": np.zeros(3)},
                  id="r00095")
    store = _open(url, moto_s3, tmp_path / "cache")
    _same(store, ss.open(local))
    assert verify(url, storage_options=opts) == []
    # old shard tables are deleted: the last few generations remain
    tables = [k for k in moto_s3.keys(s3_bucket, "w/a.seqstore/_shards/")]
    assert 1 <= len(tables) <= remote.KEEP_TABLES
    # and the store copies down to a local store that reads the same and verifies
    down = tmp_path / "down.seqstore"
    ss.copy(url, down, src_options=opts)
    _same(ss.open(down), ss.open(local))
    assert verify(down) == [] and (down / "_shards.tbl").is_file()
    with ss.append_to(down) as w:  # a local writer appends to the copy in place
        cols, ids = _batch(96, 4)
        w.append_batch(cols, ids=ids)
    assert len(ss.open(down)) == 100 and verify(down) == []


def test_create_existing_and_overwrite(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/e.seqstore"
    opts = moto_s3.storage_options()
    with ss.create(url, SCHEMA, packed=PACKED, storage_options=opts) as w:
        cols, ids = _batch(0, 5)
        w.append_batch(cols, ids=ids)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        ss.create(url, SCHEMA, packed=PACKED, storage_options=opts)
    with ss.create(url, {"y": ss.Field("int32")}, storage_options=opts, overwrite=True) as w:
        w.append({"y": 3})
    store = _open(url, moto_s3, tmp_path / "c")
    assert len(store) == 1 and list(store.schema) == ["y"]
    assert not [k for k in moto_s3.keys(s3_bucket, "e.seqstore/") if "pk.npy" in k]  # the old store's files went
    with pytest.raises(SchemaError, match="existing store"):
        remote_writer.open_or_create(url, SCHEMA, storage_options=opts)
    with pytest.raises(FormatError, match="no seqstore store"):
        ss.append_to(f"s3://{s3_bucket}/none.seqstore", storage_options=opts)


def test_create_on_an_empty_store_of_the_same_schema_is_refused(moto_s3: MotoS3, s3_bucket: str) -> None:
    """A second create finds a manifest with the very bytes it would write (same schema, no records yet):
    refused on its first try, so it is another writer's store, not ours."""
    url = f"s3://{s3_bucket}/twice.seqstore"
    opts = moto_s3.storage_options()
    ss.create(url, SCHEMA, packed=PACKED, storage_options=opts).close()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        ss.create(url, SCHEMA, packed=PACKED, storage_options=opts)
    with pytest.raises(FileExistsError, match="mode='create'"):
        prepare_store(url, SCHEMA, mode="create", storage_options=opts)


def test_lost_answer_to_create_counts_as_created(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The create reached the service but its answer was lost: the retry is refused (the manifest is
    there), and since it holds our bytes, the create succeeded."""
    url = f"s3://{s3_bucket}/lost-create.seqstore"
    lost = lose_manifest_answer(monkeypatch, lambda mode: mode == "create")
    with ss.create(url, SCHEMA, packed=PACKED, storage_options=moto_s3.storage_options()) as w:
        cols, ids = _batch(0, 3)
        w.append_batch(cols, ids=ids)
    assert lost
    assert len(_open(url, moto_s3, tmp_path / "c")) == 3


# ------------------------------------------------------------------------------------- races


def test_racing_writers_lose_no_shard(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                      s3_proxy: FaultProxy) -> None:
    """B's committing write is held back until A has committed a shard (claimed after B's claim, so
    with a higher number): B's conditional write is refused, B re-reads, moves its shard above A's
    and commits; nothing of either is lost."""
    url = f"s3://{s3_bucket}/race.seqstore"
    ss.create(url, SCHEMA, packed=PACKED, storage_options=moto_s3.storage_options()).close()
    a = ss.append_to(url, storage_options=moto_s3.storage_options())
    b = ss.append_to(url, storage_options=moto_s3.storage_options(s3_proxy.url))
    cols, ids = _batch(0, 12)
    a.append_batch(cols, ids=ids)
    cols, ids = _batch(100, 9)
    b.append_batch(cols, ids=ids)
    commit_after(a, b, s3_proxy)
    assert b.conflicts == 1 and b.renumbered == 1 and a.conflicts == 0
    store = _open(url, moto_s3, tmp_path / "c")
    want = [f"r{i:05d}" for i in [*range(12), *range(100, 109)]]
    assert sorted(store.id(i) for i in range(len(store))) == want
    assert [store.manifest.shard_table().row(k).name for k in range(2)] == ["shard-000001", "shard-000002"]
    assert not moto_s3.keys(s3_bucket, "race.seqstore/shard-000000/")  # B's first claim was removed
    assert verify(url, storage_options=moto_s3.storage_options()) == []


_WRITER = textwrap.dedent("""
    import sys, json
    import numpy as np
    import seqstore as ss
    url, k, opts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    with ss.append_to(url, storage_options=opts, max_shard_records=5) as w:
        for i in range(25):
            w.append({"x": np.full((i % 3, 3), i, np.float32), "spk": 1000 * k + i,
                      "g/a": np.zeros(2, np.float16), "g/b": np.zeros(3, np.float16)}, id=f"w{k}-{i:03d}")
    print(w.conflicts)
""")


def test_racing_writer_processes_lose_no_shard(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    import json

    url = f"s3://{s3_bucket}/procs.seqstore"
    opts = moto_s3.storage_options()
    ss.create(url, SCHEMA, packed=PACKED, storage_options=opts).close()
    env = dict(os.environ, PYTHONPATH=str(SRC_ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, url, str(k), json.dumps(opts)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    store = _open(url, moto_s3, tmp_path / "c")
    assert len(store) == 50 and store.num_shards == 10
    assert sorted(store.id(i) for i in range(50)) == sorted(f"w{k}-{i:03d}" for k in range(2) for i in range(25))
    spk = store.get_batch(np.arange(50), fields=["spk"])["spk"]
    for k in range(2):  # each writer's records stay in its order
        mine = spk[(spk >= 1000 * k) & (spk < 1000 * k + 25)]
        assert mine.tolist() == [1000 * k + i for i in range(25)]
    assert verify(url, storage_options=opts) == []


def test_lost_answer_to_the_commit_is_not_committed_twice(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    """The committing write reached the service but its answer was lost, and the retry was refused (the
    ETag changed: by our own write). The writer finds its row and does not commit the shard again."""
    url = f"s3://{s3_bucket}/lost.seqstore"
    opts = moto_s3.storage_options()
    w = ss.create(url, SCHEMA, packed=PACKED, storage_options=opts)
    client = w.target.client
    real_put = client.put
    lost: list[str] = []

    def put(key: str, data: Any, *, mode: Any = "overwrite") -> str:
        etag = real_put(key, data, mode=mode)
        if key == "manifest.json" and isinstance(mode, dict) and not lost:
            lost.append(etag)
            raise ConflictError(f"{key}: conditional write refused (the answer to the first try was lost)")
        return etag

    client.put = put  # type: ignore[method-assign]
    cols, ids = _batch(0, 7)
    w.append_batch(cols, ids=ids)
    w.close()
    assert lost and w.conflicts == 0
    store = _open(url, moto_s3, tmp_path / "c")
    assert len(store) == 7 and store.num_shards == 1


def test_lost_answer_to_a_stats_only_commit_adds_the_stats_once(moto_s3: MotoS3, s3_bucket: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit of stats deltas alone reached the service but its answer was lost; the retry was refused
    (the ETag changed: by our own write). Nothing told the commit it went through, so it was made again
    on top of itself and every delta counted twice."""
    url = f"s3://{s3_bucket}/lost-stats.seqstore"
    opts = moto_s3.storage_options()
    w = ss.create(url, SCHEMA, packed=PACKED, storage_options=opts)
    lost = lose_manifest_answer(monkeypatch, lambda mode: isinstance(mode, dict))
    w.add_stats({"tokens": 7, "loss": 0.5})
    w.commit()
    w.close()
    stats = ss.open(url, storage_options=opts).manifest.stats
    assert stats == {"tokens": 7, "loss": 0.5}
    assert lost and w.conflicts == 0


# ------------------------------------------------------------------------------------ Logger


def test_logger_to_url(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQSTORE_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{s3_bucket}/log.seqstore"
    opts = moto_s3.storage_options()
    with ss.Logger(url, storage_options=opts, shard_bytes=2048, flush_bytes=1024) as lg:
        for step in range(6):
            ids = [f"ex{step}-{j}" for j in range(12)]
            lg.log(ids, {"grad": np.full((12, 4), step, np.float32), "loss": np.arange(12, dtype=np.float32)})
        lg.log(["ex0-0"], {"grad": np.zeros((1, 4), np.float32), "loss": np.zeros(1, np.float32)})  # kept first
    with ss.Logger(url, storage_options=opts) as lg:  # a later run appends
        lg.log(["late"], {"grad": np.ones((1, 4), np.float32), "loss": np.ones(1, np.float32)})
    store = ss.open(url, storage_options=opts)
    assert len(store) == 73 and store.num_shards >= 2
    assert store.get_batch([store.index("ex3-5")])["grad"].tolist() == [[3, 3, 3, 3]]
    assert store.id(72) == "late"
    assert verify(url, storage_options=opts) == []


def test_a_logger_whose_commit_at_a_url_fails_keeps_its_records(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service answering 503 to the manifest's upload while a Logger commits: LoggerCommitError (not a
    dead logger whose close() discarded what the writer held); once the service answers, close() commits
    every record once."""
    from seqstore.log import LoggerCommitError

    monkeypatch.setenv("SEQSTORE_CACHE_DIR", str(tmp_path / "cache"))
    url = f"s3://{s3_bucket}/failing-log.seqstore"
    lg = ss.Logger(url, storage_options=moto_s3.storage_options(s3_proxy.url, max_retries=1), shard_bytes=2048,
                   flush_bytes=1024)
    grad = np.ones((8, 4), np.float32)
    lg.log([f"a{j}" for j in range(8)], {"grad": grad})
    lg.flush()
    s3_proxy.fail(None, method="PUT", path="manifest.json")  # answered 503, never forwarded
    logged = 8
    with pytest.raises(LoggerCommitError, match="manifest.json"):
        for step in range(1, 40):
            lg.log([f"a{j}" for j in range(step * 8, step * 8 + 8)], {"grad": grad * step})
            logged += 8
    s3_proxy.clear_faults()
    lg.close()
    store = ss.open(url, storage_options=moto_s3.storage_options())
    assert [store.id(i) for i in range(len(store))] == [f"a{j}" for j in range(logged)]
    assert verify(url, storage_options=moto_s3.storage_options()) == []


# ------------------------------------------------------------------------------------ refused


def test_back_ends_without_conditional_writes_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    import fsspec

    for call in (
        lambda: ss.create("memory://bucket/a.seqstore", SCHEMA),
        lambda: ss.append_to("memory://bucket/a.seqstore"),
        lambda: remote_writer.open_or_create("https://example.invalid/data/a.seqstore", SCHEMA),
        lambda: ss.create(tmp_path / "x.seqstore", SCHEMA, filesystem=fsspec.filesystem("memory")),
        lambda: ss.Logger("memory://bucket/log.seqstore", schema={"g": ss.Field("float32", (2,))}),
    ):
        with pytest.raises(RemoteError) as exc:
            call()
        msg = str(exc.value)
        assert "no conditional write" in msg and "write the store locally and copy it" in msg, msg
        assert "seqstore copy" in msg
    assert not (tmp_path / "x.seqstore").exists()
    import fsspec.implementations.memory as mem

    assert not any("a.seqstore" in k for k in mem.MemoryFileSystem.store)


def test_no_store_is_made_among_objects_that_are_not_one(moto_s3: MotoS3, s3_bucket: str) -> None:
    """A prefix holding other objects: create, open_or_create and prepare_store used to write a manifest among
    them (a directory is refused), and deleting that store later (remove_if_empty after a failed job, or
    create(overwrite=True)) deleted the user's objects too."""
    from seqstore.store.parts import remove_if_empty

    opts = moto_s3.storage_options()
    moto_s3.put(s3_bucket, "data/precious.txt", b"keep me")
    url = f"s3://{s3_bucket}/data"
    schema = {"x": ss.Field("int32")}
    for make in (lambda: ss.create(url, schema, storage_options=opts),
                 lambda: remote_writer.open_or_create(url, schema, storage_options=opts),
                 lambda: prepare_store(url, schema, mode="create", storage_options=opts)):
        with pytest.raises(ss.SeqstoreError, match="holds objects that are not a seqstore store"):
            make()
    assert remove_if_empty(url, storage_options=opts) is False
    assert moto_s3.keys(s3_bucket, "") == {"data/precious.txt": 7}


def test_overwrite_after_an_interrupted_deletion_goes_through(moto_s3: MotoS3, s3_bucket: str,
                                                               s3_proxy: FaultProxy) -> None:
    """create(overwrite=True) deletes the manifest first, then the store's objects: when that stopped part
    way (a delete refused, a killed process), the shards left without a manifest made every later
    create(overwrite=True) refuse the prefix as "objects that are not a seqstore store"; the user had to
    delete them by hand. What is left of a store is deleted like a store."""
    url = f"s3://{s3_bucket}/half.seqstore"
    opts = moto_s3.storage_options()
    with ss.create(url, SCHEMA, packed=PACKED, storage_options=opts, max_shard_records=4) as w:
        cols, ids = _batch(0, 12)
        w.append_batch(cols, ids=ids)
    deletes: list[Any] = []

    def later_delete(req: Any) -> bool:  # (S3 deletes go as POST ?delete) the manifest's first, then the rest
        if "delete" not in req.target:
            return False
        deletes.append(req)
        return len(deletes) > 1

    s3_proxy.forbid(method="POST", where=later_delete)
    with pytest.raises(ss.SeqstoreError):
        ss.create(url, {"y": ss.Field("int8")}, overwrite=True, storage_options=moto_s3.storage_options(s3_proxy.url))
    s3_proxy.clear_faults()
    s3_proxy.clear_faults()
    assert "half.seqstore/manifest.json" not in moto_s3.keys(s3_bucket, "half.seqstore/")
    with ss.create(url, {"y": ss.Field("int8")}, overwrite=True, storage_options=opts) as w:
        w.append({"y": 3})
    store = ss.open(url, storage_options=opts)
    assert len(store) == 1 and store.schema == ss.Schema({"y": ss.Field("int8")})
    assert not any("shard-000002" in k for k in moto_s3.keys(s3_bucket, "half.seqstore/"))


_KILLED_WRITER = textwrap.dedent("""
    import sys, json
    import numpy as np
    import seqstore as ss
    url, staging, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    w = ss.append_to(url, storage_options=opts, staging_dir=staging, buffer_bytes=1)
    for i in range(5):
        w.append({"x": np.zeros((2, 3), np.float32), "spk": i, "g/a": np.zeros(2, np.float16),
                  "g/b": np.zeros(3, np.float16)}, id=f"k{i}")
    print("written", flush=True)
    sys.stdin.read()  # killed here, its shard in the staging directory
""")


def test_a_killed_writer_s_staging_directory_is_removed_by_the_next_writer(moto_s3: MotoS3, s3_bucket: str,
                                                                           tmp_path: Path) -> None:
    """A writer on a URL SIGKILLed with a shard in its local staging directory left that directory (up to
    two shards) for good: every killed run of a job leaked its disk space. The next writer that stages in
    the same directory removes a dead writer's, never a live one's."""
    import json

    url = f"s3://{s3_bucket}/killed.seqstore"
    opts = moto_s3.storage_options()
    staging = tmp_path / "staging"
    ss.create(url, SCHEMA, packed=PACKED, storage_options=opts).close()
    env = dict(os.environ, PYTHONPATH=str(SRC_ROOT))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, url, str(staging), json.dumps(opts)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "written", proc.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    [dead] = list(staging.iterdir())
    assert any(p.suffix == ".npy" for p in dead.rglob("*"))
    live = ss.append_to(url, storage_options=opts, staging_dir=staging)
    assert not dead.exists()
    [mine] = list(staging.iterdir())
    with ss.append_to(url, storage_options=opts, staging_dir=staging) as w:  # a live writer's is kept
        cols, ids = _batch(0, 3)
        w.append_batch(cols, ids=ids)
        assert mine.exists()
    live.close()
    assert list(staging.iterdir()) == [] and len(_open(url, moto_s3, tmp_path / "c")) == 3


def test_a_commit_that_went_through_unanswered_is_not_made_again(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                                 s3_proxy: FaultProxy) -> None:
    """The committing write of manifest.json took effect, but no answer to it came back before the retries
    gave up (RemoteError; the writer keeps its shard for the next commit). That next commit (here close())
    claimed a new number and committed the shard again: every record and stats delta counted twice."""
    url = f"s3://{s3_bucket}/unanswered.seqstore"
    opts = moto_s3.storage_options()
    ss.create(url, SCHEMA, packed=PACKED, storage_options=opts).close()
    w = ss.append_to(url, storage_options=moto_s3.storage_options(s3_proxy.url, max_retries=1))
    cols, ids = _batch(0, 5)
    w.append_batch(cols, ids=ids)
    w.add_stats({"n": 5})
    rule = s3_proxy.lose(None, method="PUT", path="manifest.json")
    with pytest.raises(RemoteError):
        w.commit()
    s3_proxy.clear_faults()
    assert rule.hits == 2 and len(_open(url, moto_s3, tmp_path / "c1")) == 5  # the first try went through
    w.add_stats({"n": 2})
    w.close()
    store = _open(url, moto_s3, tmp_path / "c2")
    assert len(store) == 5 and store.num_shards == 1 and store.manifest.stats == {"n": 7}
    assert sorted(store.id(i) for i in range(5)) == ids
    assert verify(url, storage_options=opts) == []


def test_a_table_deleted_by_newer_commits_between_two_requests_is_no_corruption(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, s3_proxy: FaultProxy) -> None:
    """B read the manifest and, before its request for the shard table that manifest names came, A committed
    three times and deleted that table (commits keep the last few). B's commit failed with CorruptionError
    ("shard table is missing") though nothing was damaged: the manifest had moved on."""
    url = f"s3://{s3_bucket}/tables.seqstore"
    opts = moto_s3.storage_options()
    ss.create(url, SCHEMA, packed=PACKED, storage_options=opts).close()
    a = ss.append_to(url, storage_options=opts)
    b = ss.append_to(url, storage_options=moto_s3.storage_options(s3_proxy.url))
    cols, ids = _batch(0, 2)
    a.append_batch(cols, ids=ids)
    a.commit()  # B's next commit reads the table again
    fired: list[int] = []

    def three_commits_first(req: Any) -> bool:
        if req.method == "GET" and "/_shards/" in req.path and not fired:
            fired.append(1)
            for k in range(3):
                cols, ids = _batch(10 + k, 1)
                a.append_batch(cols, ids=ids)
                a.commit()
        return False  # then forward the request

    s3_proxy.fail(None, where=three_commits_first)
    cols, ids = _batch(100, 2)
    b.append_batch(cols, ids=ids)
    b.commit()
    s3_proxy.clear_faults()
    a.close()
    b.close()
    assert fired
    store = _open(url, moto_s3, tmp_path / "c")
    assert sorted(store.id(i) for i in range(len(store))) == [f"r{i:05d}" for i in (0, 1, 10, 11, 12, 100, 101)]


def test_a_staging_directory_that_cannot_be_checked_is_left_alone(moto_s3: MotoS3, s3_bucket: str,
                                                                  tmp_path: Path) -> None:
    """Another user's staging directory in a shared $TMPDIR cannot be opened (mode 0700): looking for
    dead writers' directories must not make opening a writer fail (here the owner.lock that cannot be
    opened is a directory, which root cannot open either)."""
    url = f"s3://{s3_bucket}/shared.seqstore"
    opts = moto_s3.storage_options()
    ss.create(url, SCHEMA, packed=PACKED, storage_options=opts).close()
    other = tmp_path / "staging" / "seqstore-staging-other"
    (other / "owner.lock").mkdir(parents=True)
    with ss.append_to(url, storage_options=opts, staging_dir=tmp_path / "staging") as w:
        cols, ids = _batch(0, 3)
        w.append_batch(cols, ids=ids)
    assert other.is_dir() and len(_open(url, moto_s3, tmp_path / "c")) == 3


def test_a_stats_only_commit_that_went_through_unanswered_adds_the_stats_once(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, s3_proxy: FaultProxy) -> None:
    """A commit of stats deltas alone took effect, but no answer came back before the retries gave up
    (RemoteError; the deltas stay pending). The next commit sent them again: every delta counted twice."""
    url = f"s3://{s3_bucket}/unanswered-stats.seqstore"
    opts = moto_s3.storage_options()
    ss.create(url, SCHEMA, packed=PACKED, storage_options=opts).close()
    w = ss.append_to(url, storage_options=moto_s3.storage_options(s3_proxy.url, max_retries=1))
    w.add_stats({"n": 5})
    rule = s3_proxy.lose(None, method="PUT", path="manifest.json")
    with pytest.raises(RemoteError):
        w.commit()
    s3_proxy.clear_faults()
    assert rule.hits == 2 and _open(url, moto_s3, tmp_path / "c1").manifest.stats == {"n": 5}  # it went through
    w.add_stats({"n": 2})
    w.close()
    assert _open(url, moto_s3, tmp_path / "c2").manifest.stats == {"n": 7}


def test_a_commit_that_failed_unanswered_leaves_no_objects_once_retried(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, s3_proxy: FaultProxy) -> None:
    """The committing write of manifest.json failed without effect, but the writer could not know (RemoteError):
    it kept the shard's claimed number and uploaded files, and the next commit put the shard at the next
    number, leaving the first copy's objects in the bucket for good. Once the retry is committed (so the
    first write can never take effect any more), they are deleted."""
    url = f"s3://{s3_bucket}/unlanded.seqstore"
    opts = moto_s3.storage_options()
    ss.create(url, SCHEMA, packed=PACKED, storage_options=opts).close()
    w = ss.append_to(url, storage_options=moto_s3.storage_options(s3_proxy.url, max_retries=1))
    cols, ids = _batch(0, 5)
    w.append_batch(cols, ids=ids)
    s3_proxy.fail(None, method="PUT", path="manifest.json")  # answered 503, never forwarded
    with pytest.raises(RemoteError):
        w.commit()
    s3_proxy.clear_faults()
    assert len(_open(url, moto_s3, tmp_path / "c1")) == 0
    w.close()
    store = _open(url, moto_s3, tmp_path / "c2")
    assert len(store) == 5 and store.num_shards == 1
    shard_dirs = {k.split("/")[1] for k in moto_s3.keys(s3_bucket, "unlanded.seqstore/shard-")}
    assert shard_dirs == {"shard-000001"}, shard_dirs  # (number 0 was claimed by the first try)
    assert verify(url, storage_options=opts) == []


def test_a_claim_that_went_through_unanswered_leaves_no_descriptor(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                                    s3_proxy: FaultProxy) -> None:
    """The create-only write of a shard's descriptor (the claim of its number) took effect but its answer was
    lost; the retry was refused (by that first write) and the commit took the next number, leaving the first
    claim's descriptor in the bucket for good: a shard directory no table lists."""
    url = f"s3://{s3_bucket}/claim.seqstore"
    opts = moto_s3.storage_options()
    ss.create(url, SCHEMA, packed=PACKED, storage_options=opts).close()
    w = ss.append_to(url, storage_options=moto_s3.storage_options(s3_proxy.url))
    cols, ids = _batch(0, 5)
    w.append_batch(cols, ids=ids)
    rule = s3_proxy.lose(1, method="PUT", path="/_shard.json")
    w.close()
    assert rule.hits == 1
    store = _open(url, moto_s3, tmp_path / "c")
    assert len(store) == 5 and store.num_shards == 1
    shard_dirs = {k.split("/")[1] for k in moto_s3.keys(s3_bucket, "claim.seqstore/shard-")}
    assert shard_dirs == {"shard-000001"}, shard_dirs  # (number 0 is the lost claim's)
    assert verify(url, storage_options=opts) == []


def test_create_whose_staging_directory_cannot_be_made_leaves_no_store(moto_s3: MotoS3, s3_bucket: str,
                                                                       tmp_path: Path) -> None:
    """create() at a URL made the store first and only then its writer's local staging directory: where that
    failed (staging_dir a file, unwritable, a full disk) an empty store stayed at the URL, and the corrected
    call got FileExistsError. The staging directory is now made first; its error names it and the store."""
    url = f"s3://{s3_bucket}/staging-first.seqstore"
    opts = moto_s3.storage_options()
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_bytes(b"")
    with pytest.raises(OSError, match=f"{not_a_dir}.*staging_dir.*{url}"):
        ss.create(url, SCHEMA, storage_options=opts, staging_dir=not_a_dir)
    assert remote_writer.existing_manifest(url, opts) is None
    with ss.create(url, SCHEMA, storage_options=opts, staging_dir=tmp_path / "staging") as w:
        w.append_batch(*_batch(0, 3))
    assert len(_open(url, moto_s3, tmp_path / "c")) == 3


def test_an_automatic_commit_that_fails_at_a_url_is_a_remote_error_saying_what_was_taken(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, s3_proxy: FaultProxy) -> None:
    """The automatic commit of a full shard at a URL gave up (the service answering 503): the error is still
    a RemoteError naming the object, and an AutoCommitError saying the writer took the record; close() then
    commits every record once."""
    from seqstore.errors import AutoCommitError

    url = f"s3://{s3_bucket}/auto-commit.seqstore"
    ss.create(url, {"x": ss.Field("int64", ())}, storage_options=moto_s3.storage_options()).close()
    w = ss.append_to(url, storage_options=moto_s3.storage_options(s3_proxy.url, max_retries=1), max_shard_records=2)
    w.append({"x": 0})
    s3_proxy.fail(None, method="PUT", path="manifest.json")  # answered 503, never forwarded
    with pytest.raises(RemoteError, match="manifest.json") as err:
        w.append({"x": 1})
    assert isinstance(err.value, AutoCommitError) and err.value.taken == 1 and "manifest.json" in err.value.url
    s3_proxy.clear_faults()
    w.close()
    store = _open(url, moto_s3, tmp_path / "c")
    assert store.get_batch(np.arange(2), fields=["x"])["x"].tolist() == [0, 1] and len(store) == 2


def test_create_at_a_url_needs_no_read_after_its_manifest_is_written(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, s3_proxy: FaultProxy) -> None:
    """create() at a URL wrote the new store's manifest, then read it back to open its writer: a network
    failure at that read raised from create() and left an empty store at the URL (the corrected call got
    FileExistsError). The writer now starts from the manifest it has just written, so nothing can fail
    between the store being made and create() returning its writer."""
    url = f"s3://{s3_bucket}/no-read-back.seqstore"
    opts = moto_s3.storage_options(s3_proxy.url, max_retries=1)
    rule = s3_proxy.fail(None, method="GET", path="manifest.json")  # answered 503, never forwarded
    w = ss.create(url, SCHEMA, storage_options=opts, staging_dir=tmp_path / "staging")
    assert rule.hits == 0
    s3_proxy.clear_faults()
    with w:
        w.append_batch(*_batch(0, 3))
    assert len(_open(url, moto_s3, tmp_path / "c")) == 3 and verify(url, storage_options=opts) == []


def test_an_automatic_commit_into_a_store_replaced_with_another_schema_offers_no_retry(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    """A writer at a URL whose store was replaced meanwhile by one of another schema: its automatic commit
    raised a plain SeqstoreError, wrapped as AutoCommitError saying close() retries the commit, which can
    never succeed. It is a SchemaError naming the store, as a local writer's is, and not an AutoCommitError."""
    from seqstore.errors import AutoCommitError

    url = f"s3://{s3_bucket}/replaced.seqstore"
    opts = moto_s3.storage_options()
    ss.create(url, {"x": ss.Field("int64", ())}, storage_options=opts).close()
    w = ss.append_to(url, storage_options=opts, staging_dir=tmp_path / "staging", max_shard_records=2)
    w.append({"x": 0})
    ss.create(url, {"y": ss.Field("int8", ())}, storage_options=opts, overwrite=True).close()
    with pytest.raises(SchemaError, match=f"{url}: the store was replaced") as err:
        w.append({"x": 1})
    assert not isinstance(err.value, AutoCommitError)
    w.abort()
    assert list(_open(url, moto_s3, tmp_path / "c").schema) == ["y"]


def test_open_or_create_whose_staging_directory_cannot_be_made_leaves_no_store(moto_s3: MotoS3, s3_bucket: str,
                                                                               tmp_path: Path) -> None:
    """open_or_create at a URL made the store and only then its writer's staging directory: where that failed,
    an empty store with the failed call's metadata stayed, and the corrected call appended to it. As create()
    does, the staging directory is made first."""
    url = f"s3://{s3_bucket}/staging-first-ooc.seqstore"
    opts = moto_s3.storage_options()
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_bytes(b"")
    with pytest.raises(OSError, match=f"{not_a_dir}.*staging_dir.*{url}"):
        remote_writer.open_or_create(url, SCHEMA, storage_options=opts, staging_dir=not_a_dir,
                                     metadata={"wrong": 1})
    assert remote_writer.existing_manifest(url, opts) is None
    with remote_writer.open_or_create(url, SCHEMA, storage_options=opts, staging_dir=tmp_path / "staging",
                                      metadata={"right": 1}) as w:
        w.append_batch(*_batch(0, 3))
    assert remote_writer.existing_manifest(url, opts).metadata == {"right": 1}
