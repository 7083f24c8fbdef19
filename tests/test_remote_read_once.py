"""Read-once epochs (the ``read_once`` storage option): ``iter_batches`` fetches its runs of batches into
memory with the direct HTTP reader, not into the node cache. Every batch equals the local store's; the
requests are presigned (credentials) or plain (``skip_signature``) range GETs; failures are retried and
named as on the obstore path; the node cache does not grow with the epoch.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import numpy as np
import pytest
from support.proxy import FaultProxy
from support.s3 import MotoS3
from support.stores import build_store, same_batch

import seqstore as ss
from seqstore.errors import ConfigError, CredentialsError, RemoteError, RemoteNotFound, StaleStoreError

pytestmark = pytest.mark.timeout(300)
PREFIX = "once/main.seqstore"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("local") / "main.seqstore")


@pytest.fixture(scope="module")
def remote(moto_s3: MotoS3, local: Path) -> Iterator[str]:
    bucket = moto_s3.new_bucket("once")
    yield moto_s3.upload_dir(local, bucket, PREFIX)
    moto_s3.delete_bucket(bucket)


def _open(moto_s3: MotoS3, url: str, cache: Path, endpoint: str | None = None, **options: Any) -> ss.Store:
    opts = moto_s3.storage_options(endpoint, read_once="true", timeout=5, connect_timeout=2, **options)
    return ss.open(url, storage_options=opts, cache_dir=cache)


def _epoch(store: ss.Store, local: ss.Store, order: str, batch: int, **kw: Any) -> int:
    """Read an epoch of ``order`` with ``iter_batches`` and compare every batch with the local store's."""
    chunks = list(ss.seq_order(len(local), order, epoch=1, seed=2).iter_chunks(batch))
    n = 0
    for k, got in enumerate(store.iter_batches(iter(chunks), **kw)):
        same_batch(got, local.get_batch(chunks[k], **kw), f"{order}, batch {k}")
        n += 1
    assert n == len(chunks)
    return n


@pytest.mark.parametrize("order", ["random_block:16:4", "random", "default", "random_block:50:3"])
def test_read_once_batches_equal_the_local_store(moto_s3: MotoS3, remote: str, local: Path, tmp_path: Path,
                                                 order: str) -> None:
    store = _open(moto_s3, remote, tmp_path / "cache")
    loc = ss.open(local)
    _epoch(store, loc, order, 7)
    _epoch(store, loc, order, 32, pad=True)
    _epoch(store, loc, order, 13, fields=["spk", "x"])


def test_read_once_requests_are_presigned_range_gets_and_leave_the_cache_small(
        moto_s3: MotoS3, remote: str, local: Path, tmp_path: Path, s3_proxy: FaultProxy) -> None:
    cache = tmp_path / "cache"
    store = _open(moto_s3, remote, cache, s3_proxy.url)
    s3_proxy.clear_log()
    _epoch(store, ss.open(local), "random_block:16:4", 16)
    values = [r for r in s3_proxy.requests if "/x.npy" in r.target or "/tok.npy" in r.target]
    direct = [r for r in values if "X-Amz-Signature=" in r.target]
    assert direct, "no presigned requests of value files"
    assert all(r.byte_range is not None for r in direct), "a direct read without a Range header"
    # the value bytes did not go into the node cache: it holds less than after the same epoch read through it
    plain = ss.open(remote, storage_options=moto_s3.storage_options(s3_proxy.url), cache_dir=tmp_path / "plain")
    _epoch(plain, ss.open(local), "random_block:16:4", 16)

    def held(root: Path) -> int:
        return sum(os.lstat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(root) for f in fs)

    assert held(cache) + 40_000 < held(tmp_path / "plain"), (held(cache), held(tmp_path / "plain"))


def test_http_store_reads_plain_urls(local: Path, tmp_path: Path) -> None:
    """An ``http://`` store (a static web server: ranges, ETags, If-Match) is read with its own URLs."""
    from support.http import StaticServer

    with StaticServer(local.parent) as srv:
        store = ss.open(f"{srv.url}/{local.name}", storage_options={"allow_http": "true", "read_once": "true"},
                        cache_dir=tmp_path / "cache")
        _epoch(store, ss.open(local), "random_block:16:4", 16)
        _epoch(store, ss.open(local), "random", 9, pad=True)
        assert store._source.remote.client.direct("shard-000000/x.npy", None)[0] == \
            f"{srv.url}/{local.name}/shard-000000/x.npy"


def test_which_stores_have_plain_urls() -> None:
    from seqstore.io.object_obstore import _plain_base

    anon = {"skip_signature": "true", "endpoint": "http://h:9000/"}
    assert _plain_base("s3://b/p/c.seqstore", anon) == "http://h:9000/b/p/c.seqstore"
    assert _plain_base("s3://b/c.seqstore", {**anon, "virtual_hosted_style_request": True}) == \
        "http://b.h:9000/c.seqstore"
    assert _plain_base("s3://b/c.seqstore", {"AWS_SKIP_SIGNATURE": "1", "aws_endpoint": "https://e"}) == \
        "https://e/b/c.seqstore"
    assert _plain_base("s3://b/c.seqstore", {"access_key_id": "k"}) is None  # signed: presigned URLs
    assert _plain_base("gs://b/c.seqstore", {}) is None
    assert _plain_base("s3://b/c.seqstore", {"skip_signature": "true"}) == ""  # AWS's own endpoints: obstore
    assert _plain_base("https://h/c.seqstore", {"proxy_url": "http://proxy:3128"}) == ""
    assert _plain_base("https://h/c.seqstore/", {}) == "https://h/c.seqstore"


def test_server_errors_are_retried(moto_s3: MotoS3, remote: str, local: Path, tmp_path: Path,
                                   s3_proxy: FaultProxy) -> None:
    store = _open(moto_s3, remote, tmp_path / "cache", s3_proxy.url, max_retries=5)
    failing = s3_proxy.fail(3, status=503, path="/x.npy", where=lambda r: "X-Amz-Signature=" in r.target)
    cut = s3_proxy.truncate(2, after=10, path="/tok.npy", where=lambda r: "X-Amz-Signature=" in r.target)
    reset = s3_proxy.reset(2, path="/emb.npy", where=lambda r: "X-Amz-Signature=" in r.target)
    _epoch(store, ss.open(local), "random_block:16:4", 16)
    assert failing.hits == 3 and cut.hits == 2 and reset.hits == 2


def test_persistent_errors_raise_naming_the_url(moto_s3: MotoS3, remote: str, tmp_path: Path,
                                                s3_proxy: FaultProxy) -> None:
    store = _open(moto_s3, remote, tmp_path / "cache", s3_proxy.url, max_retries=2)
    s3_proxy.fail(None, status=500, path="/x.npy", where=lambda r: "X-Amz-Signature=" in r.target)
    order = ss.seq_order(len(store), "random", epoch=1, seed=2)
    with pytest.raises(RemoteError) as err:
        for _ in store.iter_batches(order.iter_chunks(16)):
            pass
    assert "x.npy" in str(err.value) and err.value.attempts == 3, err.value
    assert "X-Amz-Signature" not in str(err.value)  # the presigned query stays out of messages


def _query(target: str, name: str) -> str:
    """Parameter ``name`` of a request target's query ("" where it has none)."""
    return dict(parse_qsl(target.partition("?")[2])).get(name, "")


def test_a_presigned_url_refused_once_its_credentials_expired_is_signed_anew(
        moto_s3: MotoS3, remote: str, local: Path, tmp_path: Path, s3_proxy: FaultProxy) -> None:
    """A presigned URL is kept for up to 50 minutes, but temporary credentials (an instance role, a web
    identity) may expire before it does: the service then refuses every URL signed with them (S3: 400
    ExpiredToken or 403), though obstore has fresh credentials. The epoch after they rotated failed with
    CredentialsError. A refused presigned URL is signed anew and asked once more; a URL refused again
    raises, naming the object and not the signature."""
    store = _open(moto_s3, remote, tmp_path / "cache", s3_proxy.url)
    _epoch(store, ss.open(local), "random_block:16:4", 16)
    signed = [r for r in s3_proxy.requests if "X-Amz-Signature=" in r.target]
    assert signed
    expired = {_query(r.target, "X-Amz-Signature") for r in signed}  # every URL signed so far
    latest = max(_query(r.target, "X-Amz-Date") for r in signed)
    while time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) <= latest:  # (a signature names its second: a URL
        time.sleep(0.05)  # signed anew in the same second would be the same URL; the epoch took longer)
    refused = s3_proxy.forbid(path="/x.npy", where=lambda r: _query(r.target, "X-Amz-Signature") in expired)
    ended = s3_proxy.fail(None, status=400, path="/tok.npy",
                          where=lambda r: _query(r.target, "X-Amz-Signature") in expired)
    _epoch(store, ss.open(local), "random_block:16:4", 16)
    assert refused.hits and ended.hits
    s3_proxy.clear_faults()
    s3_proxy.forbid(None, path="/x.npy", where=lambda r: "X-Amz-Signature=" in r.target)
    with pytest.raises(CredentialsError) as err:
        _epoch(store, ss.open(local), "random_block:16:4", 16)
    assert "x.npy: HTTP 403: access refused, also at a URL signed anew" in str(err.value), err.value
    assert "X-Amz-Signature" not in str(err.value)


def test_a_second_request_refused_at_the_same_presigned_url_gets_the_url_signed_anew() -> None:
    """Requests in flight share an object's presigned URL: once one of them was refused and the URL signed
    anew, the next refused one is given that URL (it got None, and its epoch failed with CredentialsError)."""
    import itertools
    import types

    from seqstore.io.objects import ObjectClient

    client = ObjectClient("s3://b/c.seqstore", {"access_key_id": "k", "secret_access_key": "s", "region": "us-east-1"})
    backend: Any = client.backend
    n = itertools.count()
    backend.obs = types.SimpleNamespace(sign=lambda store, method, key, expires_in: f"https://h/b/{key}?s={next(n)}")
    first = client.direct("x.npy", None)
    assert first is not None
    again = client.resign(first[0])
    assert again is not None and again != first[0]
    assert client.resign(first[0]) == again
    newest = client.resign(again)
    assert newest not in (None, again) and client.resign(again) == newest
    assert client.resign(first[0]) is None  # (two signings back: no longer kept)


def test_a_missing_object_and_a_changed_one_are_named(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    a = build_store(tmp_path / "a.seqstore", seed=1)
    b = build_store(tmp_path / "b.seqstore", seed=1, values_seed=7)
    url = moto_s3.upload_dir(a, s3_bucket, "swap/c.seqstore")
    store = _open(moto_s3, url, tmp_path / "cache")
    order = ss.seq_order(len(store), "random", epoch=1, seed=3)
    store.get_batch(np.arange(len(store)), fields=["spk"])  # shards mapped with A's ETags
    moto_s3.replace_dir(b, s3_bucket, "swap/c.seqstore")
    with pytest.raises((StaleStoreError, ss.CorruptionError)) as err:
        for _ in store.iter_batches(order.iter_chunks(50)):
            pass
    assert "swap/c.seqstore" in str(err.value)
    store2 = _open(moto_s3, url, tmp_path / "cache2")
    store2.get_batch([0], fields=["spk"])
    moto_s3.delete(s3_bucket, *[k for k in moto_s3.keys(s3_bucket, "swap/c.seqstore/") if k.endswith("/x.npy")])
    with pytest.raises((RemoteNotFound, ss.CorruptionError)) as err2:
        for _ in store2.iter_batches(order.iter_chunks(50)):
            pass
    assert "x.npy" in str(err2.value)


def test_direct_reader_checks_the_answer(moto_s3: MotoS3, s3_bucket: str) -> None:
    from seqstore.io.objects import ObjectClient

    moto_s3.put(s3_bucket, "k/blob", bytes(range(256)) * 64)
    client = ObjectClient(f"s3://{s3_bucket}/k", moto_s3.storage_options(timeout=5, max_retries=1))
    url, _ = client.direct("blob", None)
    buf = bytearray(100)
    client.direct_reader.submit([(url, 1000, 1100, None, memoryview(buf))]).result(30)
    assert bytes(buf) == (bytes(range(256)) * 64)[1000:1100]
    with pytest.raises(ValueError, match="needs a buffer of 100 bytes"):
        client.direct_reader.submit([(url, 0, 100, None, memoryview(bytearray(10)))])
    with pytest.raises(StaleStoreError, match="changed"):
        client.direct_reader.submit([(url, 0, 100, '"not-the-etag"', memoryview(buf))]).result(30)
    missing, _ = client.direct("nothing-here", None)
    with pytest.raises(RemoteNotFound, match="nothing-here"):
        client.direct_reader.submit([(missing, 0, 100, None, memoryview(buf))]).result(30)


def test_runs_ahead_follow_max_inflight_bytes(moto_s3: MotoS3, remote: str, local: Path, tmp_path: Path) -> None:
    """The runs fetched ahead hold at most ``max_inflight_bytes`` (but two runs at least): the smallest
    budget still reads every batch right, reusing the buffers of the runs before."""
    store = _open(moto_s3, remote, tmp_path / "cache", max_inflight_bytes=1)
    assert store._source.stream_budget == 1
    _epoch(store, ss.open(local), "random_block:16:4", 3)
    _epoch(store, ss.open(local), "random", 5, pad=True)


def test_buffer_pool_reuses_the_smallest_buffer_that_fits() -> None:
    from seqstore.store.read.stream import Pool

    dropped: list[Any] = []
    pool = Pool(keep=2, drop=dropped.append)
    a, b, c = pool.alloc(3 << 20), pool.alloc(1 << 20), pool.alloc(10)
    assert len(a) >= 3 << 20 and len(b) >= 1 << 20 and len(c) >= 10
    for x in (a, b, c):
        pool.give_back(x)
    assert len(pool.free) == 2 and all(x is not c for x in pool.free)  # the smallest was dropped
    assert len(dropped) == 1 and dropped[0] is c
    got = pool.alloc(1 << 20)
    assert got is b  # the smallest that fits, found by identity (numpy arrays do not compare as bools)
    assert pool.alloc(3 << 20) is a
    assert pool.alloc(1 << 20) is not b  # none free: a new one


def test_read_once_by_default_where_the_store_exceeds_the_node_cache(moto_s3: MotoS3, tmp_path: Path) -> None:
    """Without the option, epochs read once where the store's data are more bytes than the node cache's
    budget, and through the cache where they fit; the option decides where it is given."""
    local = build_store(tmp_path / "big.seqstore", n=3000, max_rows=200)
    bucket = moto_s3.new_bucket("auto")
    remote = moto_s3.upload_dir(local, bucket, "auto/big.seqstore")
    loc = ss.open(local)
    data = loc.manifest.data_bytes()
    assert 1 << 20 < data < sum(f.stat().st_size for f in local.rglob("*.npy"))
    opts = moto_s3.storage_options(timeout=5, connect_timeout=2)
    small, big = data // 2, data * 4

    def opened(budget: int, **extra: str) -> ss.Store:
        return ss.open(remote, storage_options={**opts, **extra}, cache_dir=tmp_path / f"c{budget}{extra}",
                       cache_bytes=budget)

    store = opened(small)
    assert store.read_once
    _epoch(store, loc, "random_block:16:4", 64)  # the runs, received into memory
    assert not opened(big).read_once
    assert not opened(small, read_once="false").read_once
    assert opened(big, read_once="true").read_once
    moto_s3.delete_bucket(bucket)


def test_read_once_takes_true_or_false(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="read_once='sometimes': expected true or false"):
        ss.open("s3://bucket/c.seqstore", storage_options={"read_once": "sometimes"}, cache_dir=tmp_path)


def test_direct_reader_over_tls(tmp_path: Path) -> None:
    """HTTPS: the handshake, bodies of many TLS records received into place, a kept-alive connection
    reused, and a server certificate the client does not trust refused at once."""
    import shutil
    import ssl
    import subprocess

    from support.http import StaticServer

    from seqstore.io.objects import ObjectClient

    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (it makes the test's certificate)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    blob = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "blob").write_bytes(blob)
    with StaticServer(tmp_path / "site") as srv:
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)
        srv._server.socket = server_ctx.wrap_socket(srv._server.socket, server_side=True)
        base = srv.url.replace("http://", "https://")
        client = ObjectClient(base, {"timeout": 5, "max_retries": 1, "max_requests": 2})
        reader = client.direct_reader
        reader._ssl = ssl.create_default_context(cafile=str(cert))  # trust the test's certificate
        bufs = [bytearray(b - a) for a, b in ((0, 1 << 20), (5, 2_500_005), (3_000_000, 3 << 20))]
        reqs = [(f"{base}/blob", a, b, None, memoryview(buf))
                for (a, b), buf in zip(((0, 1 << 20), (5, 2_500_005), (3_000_000, 3 << 20)), bufs)]
        reader.submit(reqs).result(60)  # three requests on at most two connections: one is reused
        for (_, a, b, _, _), buf in zip(reqs, bufs):
            assert bytes(buf) == blob[a:b]
        strict = ObjectClient(base, {"timeout": 5, "max_retries": 1})  # the system's CAs only
        with pytest.raises(RemoteError, match="TLS certificate was refused") as err:
            strict.direct_reader.submit([(f"{base}/blob", 0, 10, None, memoryview(bytearray(10)))]).result(60)
        assert err.value.attempts == 1  # refused at once, not retried


def test_direct_reader_thread_ends_when_idle(moto_s3: MotoS3, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop thread and its connections go after a while without requests, and come back for the next."""
    from seqstore.io import object_direct
    from seqstore.io.objects import ObjectClient

    monkeypatch.setattr(object_direct, "_IDLE_END", 0.3)
    moto_s3.put(s3_bucket, "k/blob", bytes(range(256)))
    client = ObjectClient(f"s3://{s3_bucket}/k", moto_s3.storage_options(timeout=5))
    url, _ = client.direct("blob", None)
    reader = client.direct_reader
    buf = bytearray(16)
    reader.submit([(url, 0, 16, None, memoryview(buf))]).result(30)
    thread = reader._thread
    assert thread is not None and thread.is_alive()
    thread.join(10)
    assert not thread.is_alive() and reader._thread is None and reader._open == 0
    reader.submit([(url, 16, 32, None, memoryview(buf))]).result(30)
    assert bytes(buf) == bytes(range(16, 32)) and reader._thread is not None


def test_receive_buffer_follows_rmem_max(tmp_path: Path) -> None:
    """4 MiB where the kernel allows it, what it allows down to 1 MiB, else the kernel's own tuning (0)."""
    from seqstore.io.object_direct import receive_buffer

    f = tmp_path / "rmem_max"
    for text, want in (("8388608\n", 4 << 20), ("4194304\n", 4 << 20), ("2097152\n", 2 << 20),
                       ("1048576\n", 1 << 20), ("212992\n", 0), ("", 0), ("lots\n", 0)):
        f.write_text(text)
        assert receive_buffer(str(f)) == want, text
    assert receive_buffer(str(tmp_path / "missing")) == 0


def test_direct_reader_connections_ask_for_the_receive_buffer(moto_s3: MotoS3, s3_bucket: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The buffer is set on every connection before it connects (Linux reports twice what was asked)."""
    from seqstore.io import object_direct
    from seqstore.io.objects import ObjectClient

    monkeypatch.setattr(object_direct, "receive_buffer", lambda: 200_000)  # under any rmem_max
    seen: list[int] = []
    connect = object_direct.DirectReader._connect

    def recorded(self: Any, origin: Any) -> Any:
        c = connect(self, origin)
        seen.append(c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
        return c

    monkeypatch.setattr(object_direct.DirectReader, "_connect", recorded)
    moto_s3.put(s3_bucket, "k/blob", bytes(range(256)) * 16)
    client = ObjectClient(f"s3://{s3_bucket}/k", moto_s3.storage_options(timeout=5))
    url, _ = client.direct("blob", None)
    reader = client.direct_reader
    bufs = [bytearray(256) for _ in range(4)]
    reader.submit([(url, 256 * k, 256 * (k + 1), None, memoryview(b)) for k, b in enumerate(bufs)]).result(30)
    assert all(bytes(b) == bytes(range(256)) for b in bufs)
    assert seen and all(n == 400_000 for n in seen)


def _loader_batches(store: ss.Store, kind: str = "iterable", **loader: Any) -> list[dict[str, Any]]:
    from seqstore.data import StoreDataset
    from seqstore.torch import EpochSampler, IterableSeqDataset, SeqDataLoader, SeqDataset

    ds = StoreDataset(store, ordering="random_block:16:4", seed=5, length_field="x")
    if kind == "iterable":
        batches = SeqDataLoader(IterableSeqDataset(ds, batch=24, masks=True), batch_size=None, **loader)
    else:  # a map-style dataset with seqstore's sampler and collation
        sds = SeqDataset(ds, with_index=True)
        batches = SeqDataLoader(sds, sampler=EpochSampler(ds), batch_size=20, collate_fn=sds.collate(masks=True),
                                **loader)
    return [{k: v.clone() for k, v in b.items()} for b in batches]


def _run_files() -> list[str]:
    return [f for f in os.listdir("/dev/shm") if f.startswith("seqstore-run-")]


@pytest.mark.parametrize("kind,keep", [("iterable", 1), ("iterable", 12), ("map", 12)])
def test_procs_workers_gather_the_runs_the_loop_fetched_once(moto_s3: MotoS3, remote: str, local: Path,
                                                               tmp_path: Path, s3_proxy: FaultProxy,
                                                               monkeypatch: pytest.MonkeyPatch, kind: str,
                                                               keep: int) -> None:
    """``procs=`` on a read-once store: the loop fetches each run once into buffers the workers map, the
    workers gather every batch from them (the same batches as without workers); keep=1: buffers dropped
    and made again all along (the workers told to let them go)."""
    import torch

    from seqstore.torch import loader as loader_mod

    monkeypatch.setattr(loader_mod, "PARALLEL_FROM_BYTES", 1)  # these batches are small: workers anyway
    monkeypatch.setattr(loader_mod, "_RUN_BUFFERS", keep)
    want = _loader_batches(ss.open(local), kind)
    store = _open(moto_s3, remote, tmp_path / "cache", s3_proxy.url)
    s3_proxy.clear_log()
    got = _loader_batches(store, kind, procs=2, multiprocessing_context="forkserver")
    assert len(got) == len(want) > 10
    for k, (g, w) in enumerate(zip(got, want)):
        assert list(g) == list(w) and all(torch.equal(g[n], w[n]) for n in w), k
    moved = sum(r.byte_range[1] - r.byte_range[0] for r in s3_proxy.requests
                if r.byte_range is not None and "X-Amz-Signature=" in r.target)
    values = sum(os.path.getsize(p) for p in local.rglob("*.npy") if not p.name.endswith("offsets.npy"))
    assert 0 < moved < 1.3 * values, (moved, values)  # each byte fetched about once, not once per worker
    assert not _run_files()


def test_procs_read_once_closed_early_leaves_nothing(moto_s3: MotoS3, remote: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from seqstore.data import StoreDataset
    from seqstore.torch import IterableSeqDataset, SeqDataLoader
    from seqstore.torch import loader as loader_mod

    monkeypatch.setattr(loader_mod, "PARALLEL_FROM_BYTES", 1)
    store = _open(moto_s3, remote, tmp_path / "cache")
    data = IterableSeqDataset(StoreDataset(store, ordering="random", seed=1, length_field="x"), batch=10)
    loader = SeqDataLoader(data, batch_size=None, procs=2, multiprocessing_context="forkserver")
    for _ in range(2):
        it = iter(loader)
        first = [next(it) for _ in range(3)]
        assert all(len(b["spk"]) == 10 for b in first)
        del it
        assert not _run_files()
    assert len(list(loader)) == 40 and not _run_files()


def test_procs_read_once_without_room_in_dev_shm_reads_through_the_cache(
        moto_s3: MotoS3, remote: str, local: Path, tmp_path: Path, s3_proxy: FaultProxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where /dev/shm has too little room (a container's 64 MiB), ``procs=`` workers read the store
    themselves, as without ``read_once``: the same batches, no run buffers, no direct run fetches."""
    import torch

    from seqstore.torch import _ring
    from seqstore.torch import loader as loader_mod

    monkeypatch.setattr(loader_mod, "PARALLEL_FROM_BYTES", 1)
    monkeypatch.setattr(_ring, "SHM_NEEDED", 1 << 62)
    assert not _ring.shared_runs_possible()
    want = _loader_batches(ss.open(local))
    store = _open(moto_s3, remote, tmp_path / "cache", s3_proxy.url)
    got = _loader_batches(store, procs=2, multiprocessing_context="forkserver")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert all(torch.equal(g[n], w[n]) for n in w)
    assert not _run_files()


def test_direct_reader_survives_stale_events_and_its_own_bugs(moto_s3: MotoS3, s3_bucket: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An event of a connection a failed wave closed earlier in the same round is ignored; an unexpected
    error while reading an answer ends that wave with a ``RemoteError`` naming it, and the loop thread
    goes on serving later requests."""
    from seqstore.io import object_direct
    from seqstore.io.objects import ObjectClient

    moto_s3.put(s3_bucket, "k/blob", bytes(range(256)))
    client = ObjectClient(f"s3://{s3_bucket}/k", moto_s3.storage_options(timeout=5, max_retries=1))
    url, _ = client.direct("blob", None)
    reader = client.direct_reader
    stale = object_direct.Conn(socket.socket(), ("127.0.0.1", 1, False))
    stale.state = "body"
    reader._step(stale, set())  # no job: nothing to do (it used to trip an assertion and end the thread)
    stale.sock.close()
    receive = object_direct.DirectReader._receive
    calls = [0]

    def broken(self: Any, c: Any, active: Any) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise ValueError("a bug")
        receive(self, c, active)

    monkeypatch.setattr(object_direct.DirectReader, "_receive", broken)
    buf = bytearray(16)
    with pytest.raises(RemoteError, match="direct reader failed: ValueError: a bug"):
        reader.submit([(url, 0, 16, None, memoryview(buf))]).result(30)
    reader.submit([(url, 16, 32, None, memoryview(buf))]).result(30)
    assert bytes(buf) == bytes(range(16, 32)) and reader._thread is not None and reader._thread.is_alive()


def test_plain_urls_name_the_objects_obstore_reads_where_the_store_url_holds_escapes(
        moto_s3: MotoS3, s3_bucket: str, local: Path, tmp_path: Path) -> None:
    """obstore decodes ``%20`` in an ``s3://`` URL's path (the store ``s3://b/a%20b`` is the objects under
    ``a b/``): the plain URLs of ``skip_signature`` reads name those objects, not ``a%20b/...``."""
    from seqstore.io.object_obstore import _plain_base

    moto_s3.upload_dir(local, s3_bucket, "sp ace/c+d.seqstore")
    anyone = {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{s3_bucket}/*"}
    moto_s3.boto3().put_bucket_policy(Bucket=s3_bucket, Policy=json.dumps({"Version": "2012-10-17",
                                                                          "Statement": [anyone]}))
    store = _open(moto_s3, f"s3://{s3_bucket}/sp%20ace/c+d.seqstore", tmp_path / "cache", skip_signature="true")
    _epoch(store, ss.open(local), "random_block:16:4", 16)
    anon = {"skip_signature": "true", "endpoint": "http://h:9000"}
    assert _plain_base("s3://b/a%20b/c+d.seqstore", anon) == "http://h:9000/b/a%20b/c%2Bd.seqstore"


def test_an_http_store_whose_url_holds_a_space_is_read_by_the_direct_reader(tmp_path: Path) -> None:
    """obstore sends ``http://h/my data ü/x`` as ``/my%20data%20%C3%BC/x``; the direct reader sent the space
    as it was, a request line the server refused (HTTP 400: every read-once epoch of such a store failed)."""
    from support.http import StaticServer

    served = tmp_path / "served"
    local = build_store(served / "my data ü" / "x+y.seqstore", seed=1)
    with StaticServer(served) as srv:
        store = ss.open(f"{srv.url}/my data ü/x+y.seqstore", cache_dir=tmp_path / "cache",
                        storage_options={"allow_http": "true", "read_once": "true", "timeout": 5, "max_retries": 1})
        _epoch(store, ss.open(local), "random_block:16:4", 16)
