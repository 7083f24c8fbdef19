"""Remote stores on ``gs://`` (Google Cloud Storage): reads against fake-gcs-server (every read API equals
the local store, copy down, a replaced store not served stale), writes against the XML-API server of
tests/support/gcs.py (remote writers, racing writers, copy up and its resume, distributed parts).

GCS replaces an object conditionally on its generation, not its ETag (obstore refuses a conditional
put without one: "Version required for conditional update"), so on ``gs://`` seqstore's version tags
carry both; every write test below failed before that.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.gcs import FakeGcs, XmlGcs, fake_gcs_binary
from support.proxy import FaultProxy
from support.races import append_rows, race, stage_parts, write_schema
from support.stores import assert_same_reads, build_store, digest, same, same_batch, same_stores, store_files

import seqstore as ss
from seqstore.store.verify import verify

pytest.importorskip("obstore", reason="obstore is not installed (it is in the dev and remote extras)")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def fake_gcs() -> Iterator[FakeGcs]:
    if fake_gcs_binary() is None:
        pytest.skip("fake-gcs-server is not installed (the dev extra installs it on Linux x86-64)")
    with FakeGcs() as gcs:
        yield gcs


@pytest.fixture(scope="module")
def xml_gcs() -> Iterator[XmlGcs]:
    with XmlGcs() as gcs:
        yield gcs


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("local") / "main.seqstore")


@pytest.fixture(autouse=True)
def _own_cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQSTORE_CACHE_DIR", str(tmp_path / "env-cache"))


# ------------------------------------------------------------------------------------ reads


def test_every_read_api_equals_the_local_store(fake_gcs: FakeGcs, local: Path, tmp_path: Path) -> None:
    url = fake_gcs.upload_dir(local, fake_gcs.new_bucket("read"), "corpora/main.seqstore")
    opts = fake_gcs.storage_options()
    store = ss.open(url, storage_options=opts, cache_dir=tmp_path / "cache")
    assert store.url == url
    assert_same_reads(store, ss.open(local), seed=1)
    assert verify(url, storage_options=opts) == []
    down = ss.copy(url, tmp_path / "down.seqstore", src_options=opts)
    assert down.copied == down.shards > 1
    assert store_files(tmp_path / "down.seqstore") == store_files(local)


def test_read_once_epoch_equals_the_local_store(fake_gcs: FakeGcs, local: Path, tmp_path: Path) -> None:
    """``read_once`` where obstore cannot presign (the emulator's anonymous access: no key to sign with):
    the runs come through obstore and are copied into the reader's buffers; the batches are the same."""
    url = fake_gcs.upload_dir(local, fake_gcs.new_bucket("once"), "corpora/main.seqstore")
    store = ss.open(url, storage_options={**fake_gcs.storage_options(), "read_once": "true"},
                    cache_dir=tmp_path / "cache")
    assert store._source.remote.client.direct("shard-000000/x.npy", None) is None
    loc = ss.open(local)
    chunks = list(ss.seq_order(len(loc), "random_block:16:4", epoch=1, seed=5).iter_chunks(11))
    for k, batch in enumerate(store.iter_batches(iter(chunks), pad=True)):
        same_batch(batch, loc.get_batch(chunks[k], pad=True), f"batch {k}")


def test_replaced_store_is_never_served_stale(fake_gcs: FakeGcs, tmp_path: Path) -> None:
    a = build_store(tmp_path / "a.seqstore", values_seed=1)
    b = build_store(tmp_path / "b.seqstore", values_seed=2)
    bucket = fake_gcs.new_bucket()
    url = fake_gcs.upload_dir(a, bucket, "x.seqstore")
    opts = fake_gcs.storage_options()
    assert digest(ss.open(url, storage_options=opts, cache_dir=tmp_path / "cache")) == digest(ss.open(a))
    fake_gcs.upload_dir(b, bucket, "x.seqstore")  # the same objects, new contents and generations
    assert digest(ss.open(url, storage_options=opts, cache_dir=tmp_path / "cache")) == digest(ss.open(b))


# ------------------------------------------------------------------------------------ writes

SCHEMA = write_schema()


def _local(tmp: Path, name: str, ranges: list[tuple[int, int]]) -> ss.Store:
    with ss.create(tmp / name, SCHEMA) as w:
        for first, n in ranges:
            append_rows(w, first, n)
    return ss.open(tmp / name)


def test_writers_and_racing_writers(xml_gcs: XmlGcs, tmp_path: Path) -> None:
    """create, append_to, and two writers racing for one commit (as on S3: B's committing write waits
    until A has committed, so B's write names an old generation and is refused with HTTP 412)."""
    url = f"gs://{xml_gcs.new_bucket()}/race.seqstore"
    opts = xml_gcs.storage_options()
    with ss.create(url, SCHEMA, storage_options=opts) as w:
        append_rows(w, -1, 1)
    with FaultProxy(xml_gcs.endpoint) as proxy:
        a, b = race(url, opts, xml_gcs.storage_options(proxy.url), proxy)
        assert any(r.status == 412 for r in proxy.requests), "the service refused B's stale write"
    assert b.conflicts == 1 and b.renumbered == 1 and a.conflicts == 0
    store = ss.open(url, storage_options=opts, cache_dir=tmp_path / "c")
    same_stores(store, _local(tmp_path, "want.seqstore", [(-1, 1), (0, 12), (100, 9)]))
    assert verify(url, storage_options=opts) == []


def test_copy_up_resume_and_down(xml_gcs: XmlGcs, tmp_path: Path) -> None:
    """Copying a grown source onto its earlier copy copies only the new shard and replaces the manifest
    conditionally (on its generation); the copy back is byte-identical."""
    src = tmp_path / "src.seqstore"
    with ss.create(src, SCHEMA, max_shard_records=10) as w:
        append_rows(w, 0, 30)
    url = f"gs://{xml_gcs.new_bucket()}/up/main.seqstore"
    opts = xml_gcs.storage_options()
    first = ss.copy(src, url, dst_options=opts, workers=2)
    assert (first.shards, first.copied) == (3, 3)
    with ss.append_to(src, max_shard_records=10) as w:  # the source grows by a shard
        append_rows(w, 30, 10)
    again = ss.copy(src, url, dst_options=opts)
    assert (again.copied, again.skipped) == (1, 3)
    same_stores(ss.open(url, storage_options=opts, cache_dir=tmp_path / "c"), ss.open(src))
    ss.copy(url, tmp_path / "back.seqstore", src_options=opts)
    assert store_files(tmp_path / "back.seqstore") == store_files(src)


def test_parts_from_two_tasks_commit_once(xml_gcs: XmlGcs, tmp_path: Path) -> None:
    """Distributed writes: parts staged by two task attempts, committed with server-side copies
    (``x-goog-copy-source``) and one manifest write conditional on its generation."""
    from seqstore.store.parts import commit_parts

    url = f"gs://{xml_gcs.new_bucket()}/d/a.seqstore"
    opts = xml_gcs.storage_options()
    parts = stage_parts(url, opts, tmp_path / "staging")
    assert commit_parts(url, parts, storage_options=opts) == 22
    store = ss.open(url, storage_options=opts, cache_dir=tmp_path / "c")
    assert store.num_shards == 7
    same_stores(store, _local(tmp_path, "want.seqstore", [(0, 9), (100, 13)]))
    same(store.get_batch(np.arange(22), fields=["spk"])["spk"], np.r_[0:9, 100:113], "spk in part order")
    assert verify(url, storage_options=opts) == []
