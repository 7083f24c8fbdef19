"""Remote stores on ``az://`` (Azure Blob Storage), against Azurite, Microsoft's emulator of the Blob
service's REST API: every read API equals the local store, a DataLoader epoch with 2 workers, copy
round trips and resumes, writers with conditional commits (racing writers lose no shard), a replaced
store is never served stale, and the errors for a wrong key and a missing blob.

The service does not answer suffix ranges (``bytes=-n``; obstore will not send one), which opening a
shard asks for on S3: on Azure the client sizes such a request with a HEAD first (tests fail without
it). Stores for reading are written locally and uploaded with obstore (tests/support/azure.py), not
with seqstore's remote code.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from support.proxy import FaultProxy
from support.races import append_rows, race, row_ids, stage_parts, write_schema
from support.stores import assert_same_reads, build_store, digest, same, same_batch, store_files, tensors_equal

import seqstore as ss
from seqstore.errors import CorruptionError, CredentialsError, RemoteError
from seqstore.store.verify import verify

if TYPE_CHECKING:
    from support.azure import Azurite

pytestmark = pytest.mark.timeout(300)
PREFIX = "corpora/main.seqstore"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("local") / "main.seqstore")


@pytest.fixture(scope="module")
def remote(azurite: Azurite, local: Path) -> str:
    """URL of the local store uploaded once for this module."""
    return azurite.upload_dir(local, azurite.new_container("read"), PREFIX)


@pytest.fixture(autouse=True)
def _own_cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQSTORE_CACHE_DIR", str(tmp_path / "env-cache"))


def _open(az: Azurite, url: str, cache: Path, endpoint: str | None = None, **kw: Any) -> ss.Store:
    return ss.open(url, storage_options=az.storage_options(endpoint, **kw.pop("options", {})), cache_dir=cache, **kw)


# ------------------------------------------------------------------------------------ reads


def test_every_read_api_equals_the_local_store(azurite: Azurite, remote: str, local: Path, tmp_path: Path) -> None:
    store = _open(azurite, remote, tmp_path / "cache")
    assert store.url == remote
    assert_same_reads(store, ss.open(local), seed=1)
    assert verify(remote, storage_options=azurite.storage_options()) == []
    for text in (repr(store), str(store)):
        assert azurite.storage_options()["account_key"] not in text
    again = pickle.loads(pickle.dumps(store))  # what a DataLoader worker receives
    assert digest(again) == digest(ss.open(local))


def test_read_once_epoch_equals_the_local_store(azurite: Azurite, remote: str, local: Path, tmp_path: Path) -> None:
    """``read_once``: the runs of ``iter_batches`` come over URLs obstore signs with the account key (a
    SAS), received by seqstore's direct reader, not through the node cache."""
    store = _open(azurite, remote, tmp_path / "cache", options={"read_once": "true"})
    got = store._source.remote.client.direct("shard-000000/x.npy", None)
    assert got is not None and "sig=" in got[0]  # presigned: direct reads
    loc = ss.open(local)
    chunks = list(ss.seq_order(len(loc), "random_block:16:4", epoch=1, seed=5).iter_chunks(11))
    for k, batch in enumerate(store.iter_batches(iter(chunks), pad=True)):
        same_batch(batch, loc.get_batch(chunks[k], pad=True), f"batch {k}")


@pytest.mark.parametrize("form", ["azure://{c}/{p}", "abfs://{c}@devstoreaccount1.dfs.core.windows.net/{p}"])
def test_other_url_forms_open_the_same_store(azurite: Azurite, remote: str, local: Path, tmp_path: Path,
                                             form: str) -> None:
    container, prefix = remote[len("az://"):].split("/", 1)
    url = form.format(c=container, p=prefix)
    store = _open(azurite, url, tmp_path / "cache")
    assert store.url == url and digest(store) == digest(ss.open(local))


def test_opening_a_shard_sizes_its_offsets_by_head(azurite: Azurite, remote: str, local: Path,
                                                   tmp_path: Path) -> None:
    """Azure answers no suffix range: the last page of an offsets file (which opening a shard needs
    before its size is known) is asked for with a HEAD, then a plain range; no request fails. The first
    batch after open costs one round trip more than on S3 (docs/remote.md): 4 with ragged fields."""
    with FaultProxy(azurite.endpoint, latency=0.2) as proxy:  # requests sent together overlap, even under load
        store = _open(azurite, remote, tmp_path / "cache", proxy.url)
        assert proxy.round_trips() <= 2
        proxy.clear_log()
        got = store.get_batch(np.arange(0, 400, 7), pad=True)
        assert proxy.round_trips() <= 4, [[(r.method, r.path) for r in w] for w in proxy.waves()]
        same_batch(got, ss.open(local).get_batch(np.arange(0, 400, 7), pad=True), "first batch")
        heads = [r for r in proxy.requests if r.method == "HEAD"]
        assert heads and all(r.path.endswith(".offsets.npy") for r in heads), [(r.method, r.path) for r in heads]
        statuses = [(r.method, r.path, r.status) for r in proxy.requests]
        assert all(r.status in (200, 206) for r in proxy.requests), statuses
        assert not any((r.range or "").startswith("bytes=-") for r in proxy.requests)


def test_torch_loader_with_two_workers_runs_an_epoch(azurite: Azurite, remote: str, local: Path,
                                                     tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from seqstore.torch import EpochSampler, SeqDataLoader, SeqDataset, collate_padded

    store = _open(azurite, remote, tmp_path / "cache")
    store.get_batch([0, 1])  # this process has used the client before the workers start

    def batches(st: Any, workers: int) -> list[dict[str, Any]]:
        sds = SeqDataset(ss.StoreDataset(st, ordering="random", seed=4, length_field="x",
                                         cache_dir=tmp_path / f"c{workers}"), with_index=True)
        loader = SeqDataLoader(sds, sampler=EpochSampler(sds, rank=0, world_size=1), batch_size=16,
                               num_workers=workers, collate_fn=collate_padded, **({"timeout": 60} if workers else {}))
        return list(loader)

    got, want = batches(store, 2), batches(ss.open(local), 0)
    assert len(got) == len(want) == -(-len(store) // 16)
    for k, (g, w) in enumerate(zip(got, want)):
        tensors_equal(g, w, f"batch {k}")
    seen = np.sort(np.concatenate([b["index"].numpy() for b in got]))
    same(seen, np.arange(len(store), dtype=np.int64), "one epoch covers every record once")


def test_replaced_store_is_never_served_stale(azurite: Azurite, az_container: str, tmp_path: Path) -> None:
    """Same URL, same cache directory, the blobs overwritten with another store's: the new ETags key new
    cache entries, so the second open reads the new values."""
    a = build_store(tmp_path / "a.seqstore", values_seed=1)
    b = build_store(tmp_path / "b.seqstore", values_seed=2)
    assert digest(ss.open(a)) != digest(ss.open(b))
    url = azurite.upload_dir(a, az_container, "x.seqstore")
    assert digest(_open(azurite, url, tmp_path / "cache")) == digest(ss.open(a))
    assert set(store_files(a)) == set(store_files(b))  # the same blobs, overwritten
    azurite.upload_dir(b, az_container, "x.seqstore")
    assert digest(_open(azurite, url, tmp_path / "cache")) == digest(ss.open(b))


# ------------------------------------------------------------------------------------ copy


def test_copy_round_trip_local_azure_local_is_byte_identical(azurite: Azurite, az_container: str, local: Path,
                                                            tmp_path: Path) -> None:
    url = f"az://{az_container}/up/main.seqstore"
    opts = azurite.storage_options()
    want = store_files(local)
    up = ss.copy(local, url, dst_options=opts, workers=2)
    assert up.copied == up.shards > 1 and up.skipped == 0
    got = {k[len("up/main.seqstore/"):]: azurite.get(az_container, k) for k in azurite.keys(az_container, "up/")}
    assert got == want  # every blob, byte for byte
    assert verify(url, storage_options=opts) == []

    back = ss.copy(url, tmp_path / "back.seqstore", src_options=opts)
    assert (back.copied, back.skipped, back.bytes) == (up.shards, 0, up.bytes)
    assert store_files(tmp_path / "back.seqstore") == want
    again = ss.copy(local, url, dst_options=opts)  # resumable: every shard is there with its CRC
    assert (again.copied, again.skipped) == (0, up.shards)


# ------------------------------------------------------------------------------------ writers

SCHEMA = write_schema()


def test_writers_commit_conditionally_and_racing_writers_lose_no_shard(azurite: Azurite, az_container: str,
                                                                        tmp_path: Path) -> None:
    """As on S3: B's committing write is held back until A has committed a shard, so B's write, made
    with the manifest's old ETag, is refused (HTTP 412 from the service); B re-reads, renumbers its
    shard and commits. Both writers' records are there, in their order."""
    url = f"az://{az_container}/race.seqstore"
    opts = azurite.storage_options()
    with ss.create(url, SCHEMA, storage_options=opts) as w:
        append_rows(w, -1, 1)
    with pytest.raises(FileExistsError, match="overwrite=True"):  # If-None-Match: * refused by the service
        ss.create(url, SCHEMA, storage_options=opts)
    with FaultProxy(azurite.endpoint) as proxy:
        a, b = race(url, opts, azurite.storage_options(proxy.url), proxy)
        assert any(r.status == 412 for r in proxy.requests), "the service refused B's stale write"
    assert b.conflicts == 1 and b.renumbered == 1 and a.conflicts == 0
    store = _open(azurite, url, tmp_path / "c")
    want = [f"r{i:05d}" for i in [-1, *range(12), *range(100, 109)]]
    assert [store.id(i) for i in range(len(store))] == want  # A's shard before B's: A committed first
    same(store.get_batch(np.arange(len(store)), fields=["spk"])["spk"], np.array([-1, *range(12), *range(100, 109)]),
         "records in commit order")
    assert verify(url, storage_options=opts) == []


def test_an_overwrite_whose_delete_went_through_unanswered_goes_on(azurite: Azurite, az_container: str,
                                                                   tmp_path: Path) -> None:
    """create(overwrite=True) deletes the old manifest first: that delete took effect but its answer was
    lost, and the retry was answered 404 (the service, unlike S3, refuses to delete a missing blob), so the
    overwrite failed with RemoteNotFound naming the manifest it had itself deleted."""
    url = f"az://{az_container}/del.seqstore"
    opts = azurite.storage_options()
    with ss.create(url, SCHEMA, storage_options=opts) as w:
        append_rows(w, 0, 3)
    with FaultProxy(azurite.endpoint) as proxy:
        rule = proxy.lose(1, method="POST", path="comp=batch")  # obstore deletes a blob with a batch request
        with ss.create(url, SCHEMA, overwrite=True, storage_options=azurite.storage_options(proxy.url)) as w:
            append_rows(w, 10, 2)
        assert rule.hits == 1
    assert [_open(azurite, url, tmp_path / "c").id(i) for i in range(2)] == row_ids(10, 2)


# ------------------------------------------------------------------------------------ errors


def test_wrong_account_key_is_credentials_error_without_the_key(azurite: Azurite, remote: str,
                                                                tmp_path: Path) -> None:
    import base64

    wrong = base64.b64encode(b"not the emulator's key, 64 bytes long: padding padding padd").decode()
    with pytest.raises(CredentialsError) as exc:
        _open(azurite, remote, tmp_path / "c", options={"account_key": wrong, "max_retries": 1})
    assert isinstance(exc.value, RemoteError) and remote in str(exc.value)
    assert wrong not in str(exc.value) and wrong not in repr(exc.value)


def test_missing_blob_is_corruption_naming_the_key(azurite: Azurite, az_container: str, local: Path,
                                                   tmp_path: Path) -> None:
    url = azurite.upload_dir(local, az_container, "gone/main.seqstore")
    azurite.delete(az_container, "gone/main.seqstore/shard-000001/x.npy")
    store = _open(azurite, url, tmp_path / "c", options={"max_retries": 1})
    loc = ss.open(local)
    same_batch(store.get_batch(np.arange(0, 128)), loc.get_batch(np.arange(0, 128)), "shard 0 still reads")
    with pytest.raises(CorruptionError) as exc:
        store.get_batch(np.arange(128, 140))
    assert "shard-000001/x.npy" in str(exc.value) and az_container in str(exc.value)


def test_parts_from_two_tasks_commit_once(azurite: Azurite, az_container: str, tmp_path: Path) -> None:
    """Distributed writes (docs/distributed.md) on Azure: two task attempts stage parts under the store,
    the driver commits them with server-side copies (Azure's Copy Blob) and one conditional manifest write."""
    from seqstore.store.parts import commit_parts

    url = f"az://{az_container}/d/a.seqstore"
    opts = azurite.storage_options()
    parts = stage_parts(url, opts, tmp_path / "staging")
    assert len(_open(azurite, url, tmp_path / "c0")) == 0  # nothing visible before the commit
    assert commit_parts(url, parts, storage_options=opts) == 22
    store = _open(azurite, url, tmp_path / "c1")
    assert store.num_shards == 7 and [store.id(i) for i in range(22)] == [*row_ids(0, 9), *row_ids(100, 13)]
    same(store.get_batch(np.arange(22), fields=["spk"])["spk"], np.r_[0:9, 100:113], "spk in part order")
    assert verify(url, storage_options=opts) == []
