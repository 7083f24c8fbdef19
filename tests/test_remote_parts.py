"""Distributed writes into a store on object storage (moto's S3 server): parts written by several task
attempts, staged under the store's ``_parts/`` prefix, committed by the driver in one manifest commit
(read back equal to the same records written locally); failed, aborted and killed attempts leave no
staging object once the job is discarded; appends and overwrites of an existing remote store; a
commit racing another remote writer loses nothing; a driver that died after the commit point does not
commit twice; ``seqstore convert --workers 2`` into an ``s3://`` URL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from support.races import lose_manifest_answer
from support.stores import same_stores as _same

import seqstore as ss
from seqstore.errors import FormatError, RemoteError, SchemaError, SeqstoreError
from seqstore.store import parts as remote_parts
from seqstore.store.parts import PartWriter, clean_parts, commit_parts, discard_parts, pending_jobs, prepare_store
from seqstore.store.verify import verify
from seqstore.store.write import objects as remote_commit
from seqstore.store.write.objects import ObjectTarget

if TYPE_CHECKING:
    from support.proxy import FaultProxy
    from support.s3 import MotoS3

SRC_ROOT = Path(__file__).resolve().parents[1] / "src"
SCHEMA = {"x": ss.Field("float32", (None, 3)), "spk": ss.Field("int64")}


def _batch(first: int, n: int) -> tuple[dict[str, Any], list[str]]:
    lens = (np.arange(first, first + n) * 7) % 4
    cols = {
        "x": [np.full((int(k), 3), first + j, np.float32) for j, k in enumerate(lens)],
        "spk": np.arange(first, first + n, dtype=np.int64),
    }
    return cols, [f"r{i:05d}" for i in range(first, first + n)]


def _task(url: str, opts: dict[str, Any], job: str, task: str, first: int, n: int, tmp: Path) -> Any:
    """One task attempt: records first..first+n-1 in batches of 5, shards of at most 4 records."""
    w = PartWriter(url, job=job, task=task, storage_options=opts, staging_dir=tmp / "staging",
                   max_shard_records=4)
    with w:
        for a in range(first, first + n, 5):
            cols, ids = _batch(a, min(5, first + n - a))
            w.append_batch(cols, ids=ids)
        return w.finish()


def _local(tmp: Path, name: str, ranges: list[tuple[int, int]]) -> Any:
    with ss.create(tmp / name, SCHEMA) as w:
        for first, n in ranges:
            cols, ids = _batch(first, n)
            w.append_batch(cols, ids=ids)
    return ss.open(tmp / name)


def _open(url: str, s3: MotoS3, cache: Path) -> Any:
    return ss.open(url, storage_options=s3.storage_options(), cache_dir=cache)


def _staged(s3: MotoS3, bucket: str, store: str) -> dict[str, int]:
    """Objects under the store's staging prefix, end marks of finished jobs excepted."""
    return {k: v for k, v in s3.keys(bucket, f"{store}/_parts/").items() if "/_parts/.ended/" not in k}


# ------------------------------------------------------------------------------------- commits


def test_two_tasks_one_commit_read_back_equal(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/d/a.seqstore"
    opts = moto_s3.storage_options()
    prepare_store(url, SCHEMA, mode="create", storage_options=opts, metadata={"by": "parts"})
    with pytest.raises(FileExistsError, match="mode='create'"):
        prepare_store(url, SCHEMA, mode="create", storage_options=opts)
    w = PartWriter(url, job="job1", task="t1-a0", storage_options=opts)
    assert isinstance(w.target, ObjectTarget)
    w.abort()
    p1 = _task(url, opts, "job1", "t1-a1", 100, 13, tmp_path)  # the second task finishes first
    p0 = _task(url, opts, "job1", "t0-a0", 0, 9, tmp_path)
    assert list((tmp_path / "staging").iterdir()) == []  # local staging goes with each writer
    assert [len(p.shards) for p in (p0, p1)] == [3, 4] and p0.records == 9 and p1.records == 13
    staged = _staged(moto_s3, s3_bucket, "d/a.seqstore")
    assert "d/a.seqstore/_parts/job1/t0-a0/part.json" in staged and "d/a.seqstore/_parts/job1/t1-a0/part.json" \
        not in staged
    assert not any(k.startswith("d/a.seqstore/shard-") for k in moto_s3.keys(s3_bucket, "d/a.seqstore/"))
    assert len(_open(url, moto_s3, tmp_path / "c")) == 0  # nothing visible before the commit
    # record order = the order of the parts given; the Part survives a JSON round trip
    assert commit_parts(url, [p0.to_json(), p1], storage_options=opts) == 22
    store = _open(url, moto_s3, tmp_path / "c")
    _same(store, _local(tmp_path, "l.seqstore", [(0, 9), (100, 13)]))
    assert store.num_shards == 7 and store.metadata == {"by": "parts"} and store.index("r00104") == 13
    assert verify(url, storage_options=opts) == []
    # the commit deleted the staged objects and left a committed.json per part, which discard removes
    assert sorted(_staged(moto_s3, s3_bucket, "d/a.seqstore")) == [
        "d/a.seqstore/_parts/job1/t0-a0/committed.json", "d/a.seqstore/_parts/job1/t1-a1/committed.json"]
    with pytest.raises(SeqstoreError, match="already committed"):
        commit_parts(url, [p1], storage_options=opts)
    assert pending_jobs(url, storage_options=opts) == ["job1"]
    discard_parts(url, "job1", storage_options=opts)
    assert _staged(moto_s3, s3_bucket, "d/a.seqstore") == {} and pending_jobs(url, storage_options=opts) == []
    with pytest.raises(SeqstoreError, match="not there"):
        commit_parts(url, [p0], storage_options=opts)
    with pytest.raises(SeqstoreError, match="committed or discarded already"):  # a late attempt of the job
        PartWriter(url, job="job1", task="t2-a0", storage_options=opts)
    assert len(_open(url, moto_s3, tmp_path / "c2")) == 22


_KILLED = textwrap.dedent("""
    import sys, json
    import numpy as np
    from seqstore.store.parts import PartWriter
    url, opts = sys.argv[1], json.loads(sys.argv[2])
    w = PartWriter(url, job="job2", task="t3-a0", storage_options=opts, max_shard_records=2)
    for i in range(5):
        w.append({"x": np.zeros((1, 3), np.float32), "spk": i}, id=f"k{i}")
    print("uploaded", flush=True)
    sys.stdin.read()  # killed here, mid-part
""")


def test_failed_job_leaves_nothing(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    """A job whose tasks finished, failed (aborted) and were killed (SIGKILL, shards uploaded but
    no part.json): discarding it leaves no staging object and nothing visible; the store the job
    created is removed again."""
    url = f"s3://{s3_bucket}/f.seqstore"
    opts = moto_s3.storage_options()
    prepare_store(url, SCHEMA, mode="create", storage_options=opts)
    _task(url, opts, "job2", "t0-a0", 0, 7, tmp_path)
    with pytest.raises(ValueError, match="planned failure"):
        with PartWriter(url, job="job2", task="t1-a0", storage_options=opts, max_shard_records=2) as w:
            cols, ids = _batch(0, 5)
            w.append_batch(cols, ids=ids)  # two shards uploaded
            assert any("/t1-a0/p000001/" in k for k in _staged(moto_s3, s3_bucket, "f.seqstore"))
            raise ValueError("planned failure")
    assert not any("/t1-a0/" in k for k in _staged(moto_s3, s3_bucket, "f.seqstore"))  # the abort removed it
    env = dict(os.environ, PYTHONPATH=str(SRC_ROOT))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, url, json.dumps(opts)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "uploaded", proc.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    orphans = [k for k in _staged(moto_s3, s3_bucket, "f.seqstore") if "/t3-a0/" in k]
    assert any(k.endswith("/t3-a0/p000001/_shard.json") for k in orphans)
    assert not any(k.endswith("part.json") for k in orphans)
    discard_parts(url, "job2", storage_options=opts)
    assert _staged(moto_s3, s3_bucket, "f.seqstore") == {}
    assert len(_open(url, moto_s3, tmp_path / "c")) == 0
    assert not any("/shard-" in k for k in moto_s3.keys(s3_bucket, "f.seqstore/"))
    assert remote_parts.remove_if_empty(url, storage_options=opts)
    assert moto_s3.keys(s3_bucket, "f.seqstore/") == {}
    with pytest.raises(FormatError, match="no seqstore store"):
        PartWriter(url, job="job3", task="t0", storage_options=opts)


def test_clean_parts_by_age(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/old.seqstore"
    opts = moto_s3.storage_options()
    prepare_store(url, SCHEMA, mode="create", storage_options=opts)
    _task(url, opts, "dead", "t0", 0, 5, tmp_path)  # a job whose driver never committed nor discarded
    assert clean_parts(url, older_than=3600, storage_options=opts) == []
    assert pending_jobs(url, storage_options=opts) == ["dead"]
    assert clean_parts(url, older_than=0, storage_options=opts) == ["dead"]
    assert _staged(moto_s3, s3_bucket, "old.seqstore") == {} and pending_jobs(url, storage_options=opts) == []


# ------------------------------------------------------------------------- existing stores


def test_append_and_overwrite_existing_store(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://{s3_bucket}/e.seqstore"
    opts = moto_s3.storage_options()
    with ss.create(url, SCHEMA, storage_options=opts, max_shard_records=8) as w:
        cols, ids = _batch(0, 10)
        w.append_batch(cols, ids=ids)
    with pytest.raises(SchemaError, match="existing store has schema"):
        prepare_store(url, {"y": ss.Field("int32")}, mode="append", storage_options=opts)
    prepare_store(url, SCHEMA, mode="append", storage_options=opts)
    parts = [_task(url, opts, "app", f"t{k}", 10 + 6 * k, 6, tmp_path) for k in range(2)]
    monkeypatch.setattr(remote_commit, "COPY_LIMIT", 0)  # every file streamed through the driver
    assert commit_parts(url, parts, storage_options=opts) == 12
    monkeypatch.undo()
    discard_parts(url, parts, storage_options=opts)
    store = _open(url, moto_s3, tmp_path / "c")
    _same(store, _local(tmp_path, "l.seqstore", [(0, 10), (10, 12)]))
    assert verify(url, storage_options=opts) == []
    with ss.append_to(url, storage_options=opts) as w:  # an ordinary remote writer appends after the parts
        cols, ids = _batch(22, 3)
        w.append_batch(cols, ids=ids)
    assert len(_open(url, moto_s3, tmp_path / "c")) == 25

    # overwrite with another schema: staged; readers see the old store until the commit
    other = {"y": ss.Field("int16", (2,))}
    prepare_store(url, other, mode="overwrite", storage_options=opts, metadata={"v": 2})
    with PartWriter(url, job="ow", task="t0", storage_options=opts) as w:
        w.append_batch({"y": np.arange(8, dtype=np.int16).reshape(4, 2)})
        part = w.finish()
    assert len(_open(url, moto_s3, tmp_path / "c")) == 25
    assert commit_parts(url, [part], mode="overwrite", storage_options=opts) == 4
    store = _open(url, moto_s3, tmp_path / "c2")
    assert list(store.schema) == ["y"] and len(store) == 4 and store.metadata == {"v": 2} and not store.has_ids
    assert store.get_batch(np.arange(4))["y"].ravel().tolist() == list(range(8))
    assert not moto_s3.keys(s3_bucket, "e.seqstore/_parts/.staged.json")
    assert verify(url, storage_options=opts) == []


def test_commit_racing_a_remote_writer_loses_nothing(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                     s3_proxy: FaultProxy) -> None:
    """The driver's committing write is held back until a remote writer has committed a shard, which it
    claimed after the driver's claims (so with a higher number): the driver's conditional write is
    refused, it re-reads, moves its shards above the writer's and commits; nothing is lost."""
    url = f"s3://{s3_bucket}/race.seqstore"
    opts = moto_s3.storage_options()
    prepare_store(url, SCHEMA, mode="create", storage_options=opts)
    parts = [_task(url, opts, "race", f"t{k}", 5 * k, 5, tmp_path) for k in range(2)]
    other = ss.append_to(url, storage_options=opts)
    cols, ids = _batch(500, 3)
    other.append_batch(cols, ids=ids)
    fired: list[int] = []

    def writer_commits_first(req: Any) -> bool:
        if req.method == "PUT" and req.path.endswith("/manifest.json") and not fired:
            fired.append(1)
            other.commit()  # claims above the driver's four shards, commits first
        return False

    s3_proxy.fail(None, where=writer_commits_first)
    assert commit_parts(url, parts, storage_options=moto_s3.storage_options(s3_proxy.url)) == 10
    other.close()
    assert fired
    store = _open(url, moto_s3, tmp_path / "c")
    _same(store, _local(tmp_path, "l.seqstore", [(500, 3), (0, 10)]))
    names = [store.manifest.shard_table().row(k).name for k in range(store.num_shards)]
    assert names == ["shard-000004", "shard-000005", "shard-000006", "shard-000007", "shard-000008"]
    keys = moto_s3.keys(s3_bucket, "race.seqstore/")
    assert not any(k.startswith(("race.seqstore/shard-000000/", "race.seqstore/shard-000003/")) for k in keys)
    assert verify(url, storage_options=opts) == []


def test_driver_died_after_the_commit_point(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest was replaced but the driver died before marking the parts: a second commit_parts
    of the same parts finds their shards committed, marks them and commits nothing twice."""
    url = f"s3://{s3_bucket}/crash.seqstore"
    opts = moto_s3.storage_options()
    prepare_store(url, SCHEMA, mode="create", storage_options=opts)
    parts = [_task(url, opts, "cr", f"t{k}", 4 * k, 4, tmp_path) for k in range(2)]

    def die(*args: Any) -> None:
        raise KeyboardInterrupt("driver killed")

    monkeypatch.setattr(remote_commit, "_finish_parts", die)
    with pytest.raises(KeyboardInterrupt):
        commit_parts(url, parts, storage_options=opts)
    monkeypatch.undo()
    assert len(_open(url, moto_s3, tmp_path / "c")) == 8
    with pytest.raises(SeqstoreError, match="already committed by an earlier commit_parts"):
        commit_parts(url, parts, storage_options=opts)
    assert len(_open(url, moto_s3, tmp_path / "c")) == 8
    assert sorted(_staged(moto_s3, s3_bucket, "crash.seqstore")) == [
        "crash.seqstore/_parts/cr/t0/committed.json", "crash.seqstore/_parts/cr/t1/committed.json"]


def test_two_drivers_committing_the_same_parts_at_once_commit_them_once(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two drivers commit the same parts at once (the first, thought dead, was retried), and the one
    that wins dies right after its commit point: the other lost the race, took the new rows for another
    writer's, moved its shards above them and committed the parts a second time (every record twice).
    It finds its parts' shards among the rows committed meanwhile and commits nothing."""
    url = f"s3://{s3_bucket}/twice.seqstore"
    opts = moto_s3.storage_options()
    prepare_store(url, SCHEMA, mode="create", storage_options=opts)
    parts = [_task(url, opts, "tw", f"t{k}", 4 * k, 4, tmp_path) for k in range(2)]
    other: list[str] = []

    def die(*args: Any) -> None:
        raise KeyboardInterrupt("driver killed")

    def other_driver_first(req: Any) -> bool:
        if req.method == "PUT" and req.path.endswith("/manifest.json") and not other:
            other.append("started")
            with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
                m.setattr(remote_commit, "_finish_parts", die)  # past its commit point
                commit_parts(url, parts, storage_options=opts)
        return False  # then forward the request

    s3_proxy.fail(None, where=other_driver_first)
    with pytest.raises(SeqstoreError, match="committed meanwhile by another commit_parts"):
        commit_parts(url, parts, storage_options=moto_s3.storage_options(s3_proxy.url))
    assert other
    s3_proxy.clear_faults()
    with pytest.raises(SeqstoreError, match="already committed"):  # and later, as after any commit
        commit_parts(url, parts, storage_options=opts)
    store = _open(url, moto_s3, tmp_path / "c")
    assert sorted(store.id(i) for i in range(len(store))) == sorted(_batch(0, 8)[1])
    assert verify(url, storage_options=opts) == []


# ----------------------------------------------------------------------------------- convert


def test_convert_workers_to_s3(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    n = 40_000  # above the size parallel conversion splits
    ids = np.arange(n)
    table = pa.table({"id": pa.array([f"u{i}" for i in ids]), "lab": pa.array(ids % 97, pa.int32()),
                      "seq": pa.array([list(range(i % 3)) for i in ids], pa.list_(pa.int16()))})
    src = tmp_path / "in.parquet"
    pq.write_table(table, src, row_group_size=5000)
    url = f"s3://{s3_bucket}/conv.seqstore"
    cmd = [sys.executable, "-m", "seqstore.cli", "convert", "--from", "parquet", "--id-column", "id", "--workers",
           "2", "-q", str(src), url]
    env = dict(os.environ, PYTHONPATH=str(SRC_ROOT), SEQSTORE_CACHE_DIR=str(tmp_path / "cache"))
    opt_args = [a for k, v in moto_s3.storage_options().items() for a in ("-o", f"{k}={v}")]
    done = subprocess.run(cmd + opt_args, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    store = _open(url, moto_s3, tmp_path / "c")
    from seqstore.interop.arrow import import_parquet

    local = import_parquet(src, tmp_path / "l.seqstore", id_column="id")
    _same(store, local)
    assert store.num_shards >= 2 and verify(url, storage_options=moto_s3.storage_options()) == []
    assert _staged(moto_s3, s3_bucket, "conv.seqstore") == {}
    again = subprocess.run(cmd + opt_args, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 2 and "already exists" in again.stderr, again.stderr


def test_lost_answer_to_an_empty_overwrite_counts_as_committed(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An overwrite with no records claims no shard numbers; when its manifest write lands but the answer
    is lost, the refused retry must still see the commit as its own (the manifest names its table
    object), not delete that table object and commit again."""
    url = f"s3://{s3_bucket}/empty-ow.seqstore"
    opts = moto_s3.storage_options()
    with ss.create(url, SCHEMA, storage_options=opts) as w:
        cols, ids = _batch(0, 5)
        w.append_batch(cols, ids=ids)
    prepare_store(url, SCHEMA, mode="overwrite", storage_options=opts)
    with PartWriter(url, job="empty", task="t0", storage_options=opts) as pw:
        part = pw.finish()
    before = json.loads(moto_s3.get(s3_bucket, "empty-ow.seqstore/manifest.json"))["generation"]
    lost = lose_manifest_answer(monkeypatch, lambda mode: isinstance(mode, dict))
    assert commit_parts(url, [part], mode="overwrite", storage_options=opts) == 0
    monkeypatch.undo()
    assert lost
    manifest = json.loads(moto_s3.get(s3_bucket, "empty-ow.seqstore/manifest.json"))
    assert manifest["generation"] == before + 1  # one commit, not a second one after a "conflict"
    assert len(_open(url, moto_s3, tmp_path / "c")) == 0
    assert verify(url, storage_options=opts) == []


def test_a_commit_of_no_part_appends_nothing_or_overwrites_to_an_empty_store(moto_s3: MotoS3, s3_bucket: str,
                                                                             tmp_path: Path) -> None:
    """A job whose tasks wrote no part (an empty input) commits an empty list, at a URL as locally."""
    url, opts = f"s3://{s3_bucket}/none.seqstore", moto_s3.storage_options()
    with ss.create(url, SCHEMA, storage_options=opts) as w:
        cols, ids = _batch(0, 3)
        w.append_batch(cols, ids=ids)
    assert commit_parts(url, [], storage_options=opts) == 0
    assert len(_open(url, moto_s3, tmp_path / "c1")) == 3
    prepare_store(url, SCHEMA, mode="overwrite", storage_options=opts)
    assert commit_parts(url, [], mode="overwrite", storage_options=opts) == 0
    assert len(_open(url, moto_s3, tmp_path / "c2")) == 0


def test_a_failed_commit_s_numbers_taken_by_another_writer_are_not_the_parts(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, s3_proxy: FaultProxy) -> None:
    """A commit_parts failed after it had recorded its claimed numbers in the parts' commit.json (the
    copies into the shards were refused) and gave the numbers back; another writer then committed
    shards with those numbers. The repeated commit_parts took that writer's shards for its parts',
    reported them committed by an earlier commit_parts and deleted their staged objects: lost."""
    url = f"s3://{s3_bucket}/reuse.seqstore"
    opts = moto_s3.storage_options()
    prepare_store(url, SCHEMA, mode="create", storage_options=opts)
    parts = [_task(url, opts, "re", f"t{k}", 4 * k, 4, tmp_path) for k in range(2)]
    s3_proxy.forbid(None, method="PUT", where=lambda req: "x-amz-copy-source" in req.headers)
    with pytest.raises(SeqstoreError):
        commit_parts(url, parts, storage_options=moto_s3.storage_options(s3_proxy.url))
    s3_proxy.clear_faults()
    with ss.append_to(url, storage_options=opts, max_shard_records=1) as other:
        cols, ids = _batch(500, 2)
        other.append_batch(cols, ids=ids)  # shards 0 and 1: the numbers the failed commit had given t0
    assert commit_parts(url, parts, storage_options=opts) == 8
    store = _open(url, moto_s3, tmp_path / "c")
    _same(store, _local(tmp_path, "l.seqstore", [(500, 2), (0, 8)]))
    assert verify(url, storage_options=opts) == []


def test_a_finish_that_went_through_unanswered_keeps_the_part(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                              s3_proxy: FaultProxy) -> None:
    """The create-only write of part.json took effect but its answer was lost; the retry was refused (the
    file was there: its own) and finish() reported another writer of the same task attempt and deleted
    the part it had just finished."""
    url = f"s3://{s3_bucket}/fin.seqstore"
    opts = moto_s3.storage_options()
    prepare_store(url, SCHEMA, mode="create", storage_options=opts)
    rule = s3_proxy.lose(1, method="PUT", path="/part.json")
    part = _task(url, moto_s3.storage_options(s3_proxy.url), "fin", "t0", 0, 6, tmp_path)
    assert rule.hits == 1
    assert commit_parts(url, [part], storage_options=opts) == 6
    _same(_open(url, moto_s3, tmp_path / "c"), _local(tmp_path, "l.seqstore", [(0, 6)]))


def test_a_part_shard_whose_upload_failed_is_uploaded_by_the_next_call(moto_s3: MotoS3, s3_bucket: str,
                                                                       tmp_path: Path, s3_proxy: FaultProxy) -> None:
    """Uploading a finished shard of a part failed (RemoteError). The PartWriter had counted the shard as in
    the part already: its next shard could not be started (its directory was still there) and a finish()
    returned a part listing the shard that was never uploaded, so the driver's commit_parts failed."""
    url = f"s3://{s3_bucket}/stage.seqstore"
    opts = moto_s3.storage_options()
    prepare_store(url, SCHEMA, mode="create", storage_options=opts)
    w = PartWriter(url, job="st", task="t0", storage_options=moto_s3.storage_options(s3_proxy.url, max_retries=1),
                   staging_dir=tmp_path / "staging", max_shard_records=4)
    s3_proxy.fail(None, method="PUT", path="/p000000/_shard.json")
    cols, ids = _batch(0, 4)
    with pytest.raises(RemoteError):
        w.append_batch(cols, ids=ids)  # the shard is full: finished and uploaded at once
    s3_proxy.clear_faults()
    cols, ids = _batch(4, 3)
    w.append_batch(cols, ids=ids)
    part = w.finish()
    assert part.records == 7 and len(part.shards) == 2
    assert commit_parts(url, [part], storage_options=opts) == 7
    _same(_open(url, moto_s3, tmp_path / "c"), _local(tmp_path, "l.seqstore", [(0, 7)]))
    assert list((tmp_path / "staging").iterdir()) == []


def test_a_finish_that_failed_on_the_network_can_be_called_again(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                                  s3_proxy: FaultProxy) -> None:
    """The write of part.json failed (RemoteError): finish() deleted every object of the part and raised, but
    left the writer usable, so a second finish() wrote part.json for shards that were gone and returned
    that part; the driver's commit_parts then failed on the missing shards."""
    url = f"s3://{s3_bucket}/fin2.seqstore"
    opts = moto_s3.storage_options()
    prepare_store(url, SCHEMA, mode="create", storage_options=opts)
    w = PartWriter(url, job="f2", task="t0", storage_options=moto_s3.storage_options(s3_proxy.url, max_retries=1),
                   staging_dir=tmp_path / "staging", max_shard_records=4)
    cols, ids = _batch(0, 6)
    w.append_batch(cols, ids=ids)
    s3_proxy.fail(None, method="PUT", path="/part.json")
    with pytest.raises(RemoteError):
        w.finish()
    s3_proxy.clear_faults()
    part = w.finish()
    assert part.records == 6
    assert commit_parts(url, [part], storage_options=opts) == 6
    _same(_open(url, moto_s3, tmp_path / "c"), _local(tmp_path, "l.seqstore", [(0, 6)]))


def test_a_part_whose_job_ended_says_a_retry_cannot_help(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    """A PartWriter whose job was discarded (or committed) while it wrote: its next automatic shard upload
    found the job's end mark and was wrapped as AutoCommitError, whose message said finish() retries the
    commit. A retry cannot help: the error is the plain one saying the part is over, and the writer takes
    nothing more; abort() removes what it uploaded."""
    from seqstore.errors import AutoCommitError

    url = f"s3://{s3_bucket}/ended.seqstore"
    opts = moto_s3.storage_options()
    prepare_store(url, SCHEMA, mode="create", storage_options=opts)
    w = PartWriter(url, job="jobE", task="t0", storage_options=opts, staging_dir=tmp_path / "staging",
                   max_shard_records=2)
    cols, ids = _batch(0, 2)
    w.append_batch(cols, ids=ids)  # one shard uploaded
    discard_parts(url, "jobE", storage_options=opts)
    cols, ids = _batch(2, 2)
    with pytest.raises(SeqstoreError, match="committed or discarded while task attempt 't0'") as info:
        w.append_batch(cols, ids=ids)
    assert not isinstance(info.value, AutoCommitError) and "no retry can help" in str(info.value)
    assert not w.usable
    with pytest.raises(SeqstoreError, match="committed or discarded"):
        w.finish()
    w.abort()
    assert _staged(moto_s3, s3_bucket, "ended.seqstore") == {}
    assert list((tmp_path / "staging").iterdir()) == []
