"""Remote stores (issue 12, item 6): every failure of object storage gives the named error, and none hangs.

Faults are injected by the proxy of tests/support/proxy.py between seqstore and moto: 5xx answers,
connection resets (at the request and in the middle of a body), truncated bodies, a server that never
answers, 403; a missing object is deleted from the bucket. Timeouts and retry bounds are set small so
that every test ends in seconds; pytest-timeout stops a test that hangs.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.forks import AWAIT_CHILD, fork_holding, run_forking
from support.proxy import FaultProxy
from support.s3 import SECRET, MotoS3
from support.stores import build_store, same_batch

pytest.importorskip("seqstore.io.remote")  # the remote layer (lead's work in progress until it lands)

import seqstore as ss  # noqa: E402
from seqstore.errors import CorruptionError, CredentialsError, RemoteError  # noqa: E402

PREFIX = "fail/main.seqstore"
RETRIES = 2  # max_retries: 3 attempts in all
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("local") / "main.seqstore", seed=3)


@pytest.fixture(scope="module")
def remote(moto_s3: MotoS3, local: Path) -> Iterator[tuple[str, str]]:
    bucket = moto_s3.new_bucket("fail")
    url = moto_s3.upload_dir(local, bucket, PREFIX)
    yield bucket, url
    moto_s3.delete_bucket(bucket)


@pytest.fixture(autouse=True)
def _own_cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQSTORE_CACHE_DIR", str(tmp_path / "env-cache"))


@contextlib.contextmanager
def _silent_ftp() -> Iterator[str]:
    """An ``ftp://`` endpoint on loopback whose server accepts every connection and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])  # accepted, never answered
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"ftp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for conn in held:
            conn.close()


def _open(moto_s3: MotoS3, url: str, proxy: FaultProxy, cache: Path, **options: Any) -> ss.Store:
    opts = moto_s3.storage_options(proxy.url, timeout=options.pop("timeout", 5), max_retries=RETRIES,
                                   connect_timeout=2, **options)
    return ss.open(url, storage_options=opts, cache_dir=cache)


def _all(store: ss.Store) -> dict[str, Any]:
    return store.get_batch(np.arange(len(store)), pad=True)


def _no_secret(exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc)) + repr(exc) + repr(getattr(exc, "__dict__", ""))
    assert SECRET not in text, "the error shows the secret key"


# ---------------------------------------------------------------------------------------- 5xx


def test_5xx_then_success_is_retried(moto_s3: MotoS3, remote: tuple[str, str], local: Path, tmp_path: Path,
                                     s3_proxy: FaultProxy) -> None:
    _, url = remote
    on_manifest = s3_proxy.fail(2, status=503, path="manifest.json")
    store = _open(moto_s3, url, s3_proxy, tmp_path / "cache")
    assert on_manifest.hits == 2
    on_data = s3_proxy.fail(2, status=500, path="/shard-")
    same_batch(_all(store), _all(ss.open(local)), "after two 500s")
    assert on_data.hits == 2
    assert s3_proxy.count(status=500) == 2 and s3_proxy.count(status=503) == 2


def test_persistent_5xx_raise_remote_error_with_url_and_attempts(moto_s3: MotoS3, remote: tuple[str, str],
                                                                 local: Path, tmp_path: Path,
                                                                 s3_proxy: FaultProxy) -> None:
    _, url = remote
    s3_proxy.fail(None, status=503, path="manifest.json")
    with pytest.raises(RemoteError) as exc:
        _open(moto_s3, url, s3_proxy, tmp_path / "c0")
    assert exc.value.url.startswith(url) and exc.value.attempts == RETRIES + 1, (exc.value.url, exc.value.attempts)
    assert url in str(exc.value) and str(RETRIES + 1) in str(exc.value)
    assert s3_proxy.count(path="manifest.json") == RETRIES + 1  # bounded: no retry beyond max_retries
    _no_secret(exc.value)
    s3_proxy.clear_faults()
    store = _open(moto_s3, url, s3_proxy, tmp_path / "c1")
    s3_proxy.fail(None, status=500, path="/shard-000001/")
    with pytest.raises(RemoteError) as exc:
        store.get_batch(np.arange(120, 140))  # shard 1: records 128..
    err = exc.value
    assert err.attempts == RETRIES + 1 and err.url.startswith(url + "/shard-000001/"), (err.url, err.attempts)
    assert err.url in str(err) and str(RETRIES + 1) in str(err)
    _no_secret(err)
    # the store is not left broken: once the service answers again, the same object reads
    s3_proxy.clear_faults()
    same_batch(_all(store), _all(ss.open(local)), "after the outage")


# ------------------------------------------------------------------------------- resets, bodies


def test_reset_connections_mid_epoch_cost_a_retry(moto_s3: MotoS3, remote: tuple[str, str], local: Path,
                                                  tmp_path: Path, s3_proxy: FaultProxy) -> None:
    _, url = remote
    store = _open(moto_s3, url, s3_proxy, tmp_path / "cache")
    loc = ss.open(local)
    at_request = s3_proxy.reset(2, path="/shard-000002/")
    mid_body = s3_proxy.reset(2, after=100, path="/shard-000001/")
    order = ss.seq_order(len(loc), "random", epoch=1, seed=1)
    chunks = list(order.iter_chunks(25))
    for k, batch in enumerate(store.iter_batches(iter(chunks), pad=True, prefetch=2)):
        same_batch(batch, loc.get_batch(chunks[k], pad=True), f"batch {k}")
    assert at_request.hits == 2 and mid_body.hits == 2


def test_reset_in_dataloader_workers(moto_s3: MotoS3, remote: tuple[str, str], local: Path, tmp_path: Path,
                                     s3_proxy: FaultProxy) -> None:
    pytest.importorskip("torch")
    from seqstore.torch import EpochSampler, SeqDataLoader, SeqDataset, collate_padded

    _, url = remote
    store = _open(moto_s3, url, s3_proxy, tmp_path / "cache")
    rule = s3_proxy.reset(4, path="/shard-")
    # spawn: workers forked from a process that used obstore hang (test_remote_read covers fork)
    spawn: dict[str, Any] = {"timeout": 60, "multiprocessing_context": "spawn"}

    def run(st: Any, workers: int) -> list[Any]:
        sds = SeqDataset(ss.StoreDataset(st, ordering="random", seed=1, length_field="x",
                                         cache_dir=tmp_path / f"ds{workers}"), with_index=True)
        return list(SeqDataLoader(sds, sampler=EpochSampler(sds, rank=0, world_size=1), batch_size=32,
                                  num_workers=workers, collate_fn=collate_padded, **(spawn if workers else {})))

    import torch

    def raw(t: torch.Tensor) -> bytes:
        return bytes(t.contiguous().view(-1).view(torch.uint8).numpy())

    got, want = run(store, 2), run(ss.open(local), 0)
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        assert set(g) == set(w)
        for k in w:
            assert g[k].dtype == w[k].dtype and g[k].shape == w[k].shape and raw(g[k]) == raw(w[k]), (step, k)
    assert rule.hits == 4


def test_forked_child_of_a_reading_process_errors_instead_of_hanging(moto_s3: MotoS3, remote: tuple[str, str],
                                                                     tmp_path: Path) -> None:
    """A plain DataLoader forked after this process read object storage (obstore's runtime threads do
    not survive fork): an error from the worker, never a hang."""
    torch = pytest.importorskip("torch")
    from seqstore.torch import SeqDataset

    _, url = remote
    store = ss.open(url, storage_options=moto_s3.storage_options(max_retries=RETRIES), cache_dir=tmp_path / "c")
    store.get_batch([0])  # shard 0 is prepared here; a worker reading shard 3 must fetch
    ds = SeqDataset(ss.StoreDataset(store, length_field="x", cache_dir=tmp_path / "ds"))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, sampler=[399],
                                         num_workers=1, multiprocessing_context="fork", timeout=60)
    with pytest.raises(Exception) as exc:
        list(loader)
    assert "timed out" not in str(exc.value), "the worker hung until the DataLoader's timeout"
    assert "RemoteError" in str(exc.value) and "forkserver" in str(exc.value), exc.value  # names the remedy


def test_truncated_body_is_retried_then_raises(moto_s3: MotoS3, remote: tuple[str, str], local: Path,
                                               tmp_path: Path, s3_proxy: FaultProxy) -> None:
    _, url = remote
    store = _open(moto_s3, url, s3_proxy, tmp_path / "cache")
    once = s3_proxy.truncate(1, after=10, path="/shard-000000/")
    idx = np.arange(0, 100)
    same_batch(store.get_batch(idx), ss.open(local).get_batch(idx), "after one truncated body")
    assert once.hits == 1
    always = s3_proxy.truncate(None, after=10, path="/shard-000003/")
    with pytest.raises(RemoteError) as exc:
        store.get_batch(np.arange(390, 400))
    assert exc.value.attempts == RETRIES + 1 and "/shard-000003/" in exc.value.url
    assert always.hits >= RETRIES + 1  # one per attempt (of each range asked)
    _no_secret(exc.value)


# ---------------------------------------------------------------------------------------- stalls


def test_stalled_server_times_out(moto_s3: MotoS3, remote: tuple[str, str], tmp_path: Path,
                                  s3_proxy: FaultProxy) -> None:
    _, url = remote
    s3_proxy.stall(None, path="manifest.json")
    with pytest.raises(RemoteError) as exc:
        _open(moto_s3, url, s3_proxy, tmp_path / "c0", timeout=0.5)  # each stalled attempt is waited out: short
    assert exc.value.attempts == RETRIES + 1 and "manifest.json" in exc.value.url
    s3_proxy.clear_faults()
    store = _open(moto_s3, url, s3_proxy, tmp_path / "c1", timeout=0.5)
    s3_proxy.stall(None, path="/shard-000001/")  # never answers
    with pytest.raises(RemoteError) as exc:
        store.get_batch(np.arange(130, 140))
    assert "/shard-000001/" in exc.value.url
    s3_proxy.clear_faults()
    s3_proxy.stall(None, after=16, path="/shard-000002/")  # the head and a few bytes, then nothing
    with pytest.raises(RemoteError) as exc:
        store.get_batch(np.arange(260, 270))
    assert "/shard-000002/" in exc.value.url
    _no_secret(exc.value)


# ------------------------------------------------------------------------------ missing objects


def test_missing_object_is_corruption_naming_the_key(moto_s3: MotoS3, s3_bucket: str, local: Path,
                                                     tmp_path: Path) -> None:
    url = moto_s3.upload_dir(local, s3_bucket, "gone/main.seqstore")
    assert moto_s3.delete_prefix(s3_bucket, "gone/main.seqstore/shard-000001/x.npy") == 1
    store = ss.open(url, storage_options=moto_s3.storage_options(max_retries=RETRIES), cache_dir=tmp_path / "c")
    loc = ss.open(local)
    same_batch(store.get_batch(np.arange(0, 128)), loc.get_batch(np.arange(0, 128)), "shard 0 still reads")
    with pytest.raises(CorruptionError) as exc:
        store.get_batch(np.arange(128, 140))
    assert "shard-000001/x.npy" in str(exc.value)
    # a URL where there is no store: an error that names it
    empty = f"s3://{s3_bucket}/nothing/here.seqstore"
    with pytest.raises((ss.SeqstoreError, FileNotFoundError)) as exc2:
        ss.open(empty, storage_options=moto_s3.storage_options(max_retries=RETRIES), cache_dir=tmp_path / "c")
    assert "nothing/here.seqstore" in str(exc2.value)


# ----------------------------------------------------------------------------------- credentials


def test_forbidden_is_credentials_error_naming_the_url_not_the_secret(moto_s3: MotoS3, remote: tuple[str, str],
                                                                     tmp_path: Path, s3_proxy: FaultProxy) -> None:
    _, url = remote
    s3_proxy.forbid()
    with pytest.raises(CredentialsError) as exc:
        _open(moto_s3, url, s3_proxy, tmp_path / "c0")
    err = exc.value
    assert isinstance(err, RemoteError) and url in str(err) and err.url.startswith(url)
    _no_secret(err)
    assert err.attempts == 1 and s3_proxy.count(status=403) == 1, "a refused credential is not retried"
    s3_proxy.clear_faults()
    store = _open(moto_s3, url, s3_proxy, tmp_path / "c1")
    s3_proxy.forbid(path="/shard-000003/")
    with pytest.raises(CredentialsError) as exc:
        store.get_batch([395, 396])
    assert "/shard-000003/" in exc.value.url and url in str(exc.value)
    _no_secret(exc.value)


def test_materialize_gives_up_when_the_client_thread_is_stuck(moto_s3: MotoS3, remote: tuple[str, str],
                                                              local: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``verify``'s whole-object fetch waits no longer than the client's patience: a RemoteError naming
    the object, never a hang, when the thread that runs the requests is stuck."""
    import threading

    from seqstore.io.object_obstore import _Loop

    _, url = remote
    store = ss.open(url, storage_options=moto_s3.storage_options(max_retries=RETRIES), cache_dir=tmp_path / "c")
    root = store._source.remote
    big = max((p for p in (local / "shard-000000").iterdir() if p.suffix == ".npy"), key=lambda p: p.stat().st_size)
    key = f"shard-000000/{big.name}"
    assert big.stat().st_size > 4096  # more than the head that opening fetches
    root._meta(key)  # its head is in; the rest is fetched by materialize
    monkeypatch.setattr(root.client, "patience", lambda: 1.0)
    stuck = threading.Event()
    _Loop.get().loop.call_soon_threadsafe(stuck.wait, 20)  # the requests' thread blocks
    try:
        with pytest.raises(RemoteError) as exc:
            root.materialize([key])
    finally:
        stuck.set()
    assert key in str(exc.value) and url in exc.value.url


def test_a_silent_endpoint_through_fsspec_raises_a_named_error(tmp_path: Path) -> None:
    """An fsspec back end (here ``ftp://``) whose server accepts connections and never answers: its calls
    are bounded by the store's ``timeout``, retried within the budget, then a RemoteError naming the
    endpoint, not the filesystem's own exception after its own timeout (or never)."""
    pytest.importorskip("fsspec")
    opts = {"timeout": 0.5, "connect_timeout": 1, "retry_timeout": 2, "max_retries": 1}
    with _silent_ftp() as endpoint, pytest.raises(RemoteError) as err:
        ss.open(f"{endpoint}/s.seqstore", storage_options=opts, cache_dir=tmp_path / "cache")
    assert endpoint in str(err.value) and "unreachable" in str(err.value), err.value


def test_calls_stuck_on_a_silent_fsspec_endpoint_do_not_pile_up_threads(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A call of the filesystem that does not return in time is left running in its thread (Python cannot
    stop it; ftplib here waits 30 s, webhdfs forever): each retry on a silent server left one more. The
    threads of such calls are bounded per process (here 1): a call finding none free fails as a timeout."""
    pytest.importorskip("fsspec")
    from seqstore.io import object_fsspec

    monkeypatch.setattr(object_fsspec, "CALLS_MOST", 1)
    opts = {"timeout": 0.2, "connect_timeout": 0.2, "retry_timeout": 1.5}
    with _silent_ftp() as endpoint:
        before = set(threading.enumerate())
        with pytest.raises(RemoteError) as err:
            ss.open(f"{endpoint}/s.seqstore", storage_options=opts, cache_dir=tmp_path / "cache")
        calls = [t for t in set(threading.enumerate()) - before if t.name == "seqstore-fsspec-call"]
    assert endpoint in str(err.value) and "unreachable" in str(err.value), err.value
    assert "attempts" in str(err.value) and len(calls) <= 1, calls


def test_an_fsspec_endpoint_that_answers_garbage_raises_a_named_error(tmp_path: Path) -> None:
    """``hf://`` through an endpoint whose server answers every request with a status line of garbage:
    the HTTP library's own failure (httpx's ``RemoteProtocolError``, not an ``OSError``) is a network
    failure like any other: retried within the budget, then a RemoteError naming the store's URL."""
    import socket
    import threading

    pytest.importorskip("huggingface_hub")
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        while True:
            try:
                conn = server.accept()[0]
            except OSError:
                return
            try:
                conn.recv(65536)
                conn.sendall(b"\x16\x03garbage, not HTTP at all\r\n\r\n")
            except OSError:
                pass
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    url = "hf://datasets/someone/data/s.seqstore"
    opts = {"endpoint": f"http://127.0.0.1:{server.getsockname()[1]}", "timeout": 1, "connect_timeout": 1,
            "retry_timeout": 2, "max_retries": 1}
    try:
        with pytest.raises(RemoteError) as err:
            ss.open(url, storage_options=opts, cache_dir=tmp_path / "cache")
    finally:
        server.close()
    assert url in str(err.value) and err.value.attempts == 2, err.value


@pytest.mark.parametrize("status", [401, 403])
def test_an_fsspec_refusal_is_a_credentials_error_at_once(tmp_path: Path, status: int) -> None:
    """``hf://`` through an endpoint that refuses every request (401, 403): the library's error carries the
    HTTP status (an ``OSError``, as its network failures are), which is an answer, not a failure to retry
    for the whole budget and then call the endpoint unreachable: a CredentialsError naming the URL."""
    import socket
    import threading

    pytest.importorskip("huggingface_hub")
    server = socket.create_server(("127.0.0.1", 0))
    asked: list[int] = []

    def answer() -> None:
        body = b'{"error": "refused"}'
        while True:
            try:
                conn = server.accept()[0]
            except OSError:
                return
            try:
                conn.recv(65536)
                asked.append(1)
                conn.sendall(f"HTTP/1.1 {status} Refused\r\nContent-Type: application/json\r\nContent-Length: "
                             f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            except OSError:
                pass
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    url = "hf://datasets/someone/data/s.seqstore"
    opts = {"endpoint": f"http://127.0.0.1:{server.getsockname()[1]}", "timeout": 1, "connect_timeout": 1,
            "retry_timeout": 30}
    try:
        with pytest.raises(CredentialsError) as err:
            ss.open(url, storage_options=opts, cache_dir=tmp_path / "cache")
    finally:
        server.close()
    assert url in str(err.value) and err.value.attempts == 1 and len(asked) < 3, (err.value, len(asked))
    assert "unreachable" not in str(err.value), err.value


@pytest.mark.parametrize("chunk", [None, 256])
def test_an_upload_to_a_silent_fsspec_endpoint_raises_a_named_error(tmp_path: Path, chunk: int | None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy to an fsspec URL (here ``webhdfs://``, whose requests have no timeout of their own) whose
    server answers lookups but never answers an upload: each upload (a whole object, or a streamed one's
    chunks: ``chunk``) is bounded like a read, retried, then a RemoteError naming the object; it hung."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    pytest.importorskip("requests")
    from seqstore.store import copy as copy_mod

    if chunk is not None:
        monkeypatch.setattr(copy_mod, "CHUNK", chunk)  # the shards' files are streamed in several chunks
    released = threading.Event()

    class WebHdfs(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, status: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # every lookup: no such file
            self._answer(404, {"RemoteException": {"exception": "FileNotFoundException", "message": "none"}})

        def do_PUT(self) -> None:
            if "op=CREATE" in self.path:
                released.wait()  # an upload: accepted, never answered
            else:
                self._answer(200, {"boolean": True})

    server = ThreadingHTTPServer(("127.0.0.1", 0), WebHdfs)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"webhdfs://127.0.0.1:{server.server_address[1]}/dst.seqstore"
    opts = {"timeout": 0.5, "connect_timeout": 1, "retry_timeout": 2, "max_retries": 1}
    try:
        with pytest.raises(RemoteError) as err:
            ss.copy(build_store(tmp_path / "s.seqstore", seed=5), url, dst_options=opts, workers=1)
    finally:
        released.set()
        server.shutdown()
        server.server_close()
    assert err.value.url.startswith(f"{url}/shard-") and err.value.attempts == 2, err.value


def test_a_failing_lookup_of_an_object_through_fsspec_is_retried_then_named(tmp_path: Path) -> None:
    """Through an fsspec filesystem, the lookup of an object's size and version that a range read makes
    first fails (here: its shard directory became a file): it is retried like the read itself, then a
    RemoteError naming the object, never the back end's internal retry signal."""
    fsspec = pytest.importorskip("fsspec")
    store = build_store(tmp_path / "s.seqstore", seed=3)
    opened = ss.open(str(store), filesystem=fsspec.filesystem("file"), cache_dir=tmp_path / "cache",
                     storage_options={"max_retries": 1, "retry_timeout": 2})
    import shutil

    shutil.rmtree(store / "shard-000000")
    (store / "shard-000000").write_bytes(b"not a directory")
    with pytest.raises(RemoteError) as err:
        opened.get_batch([0])
    assert "shard-000000/" in str(err.value) and err.value.attempts == 2, err.value



def test_a_listing_through_a_silent_fsspec_endpoint_raises_a_named_error(tmp_path: Path) -> None:
    """A copy run again to an fsspec URL (``webhdfs://``: requests without a timeout of their own) that
    holds the store already, whose server answers lookups and reads but never a listing: the listing
    of a shard's objects (are they all there?) hung for ever; each of its requests is now bounded like
    a read, retried, then a RemoteError naming the shard."""
    import json
    import threading
    import urllib.parse
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    pytest.importorskip("requests")
    src = build_store(tmp_path / "s.seqstore", seed=5)
    served = tmp_path / "served"
    shutil.copytree(src, served / "dst.seqstore")  # a copy that ran before
    released = threading.Event()

    class WebHdfs(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(parts.query))
            path = served / urllib.parse.unquote(parts.path).removeprefix("/webhdfs/v1/")
            if query["op"] == "LISTSTATUS":
                released.wait()  # a listing: accepted, never answered
            elif not path.exists():
                self._answer(404, json.dumps({"RemoteException": {"exception": "FileNotFoundException",
                                                                  "message": "none"}}).encode())
            elif query["op"] == "GETFILESTATUS":
                kind = "DIRECTORY" if path.is_dir() else "FILE"
                size = 0 if path.is_dir() else path.stat().st_size
                status = {"type": kind, "length": size, "modificationTime": int(path.stat().st_mtime * 1000)}
                self._answer(200, json.dumps({"FileStatus": status}).encode())
            else:  # OPEN
                start = int(query.get("offset", 0))
                data = path.read_bytes()[start:]
                self._answer(200, data[: int(query["length"])] if "length" in query else data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), WebHdfs)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"webhdfs://127.0.0.1:{server.server_address[1]}/dst.seqstore"
    opts = {"timeout": 1, "connect_timeout": 1, "retry_timeout": 2, "max_retries": 1}
    try:
        with pytest.raises(RemoteError) as err:
            ss.copy(src, url, dst_options=opts, workers=1)
    finally:
        released.set()
        server.shutdown()
        server.server_close()
    assert err.value.url.startswith(f"{url}/shard-") and err.value.attempts == 2, err.value


def test_a_large_range_through_fsspec_arriving_steadily_is_not_cut(tmp_path: Path) -> None:
    """A range read through an fsspec URL (``webhdfs://``) whose answer arrives at about 160 KiB/s, faster
    than the 64 KiB/s the store's timeouts promise to wait for, but longer than ``timeout`` +
    ``connect_timeout`` in all: its call is given the time its bytes take at 64 KiB/s, as an upload's
    and as the direct reader's answers are, instead of being cut and retried until the budget ends."""
    import json
    import threading
    import time
    import urllib.parse
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    pytest.importorskip("requests")
    pytest.importorskip("fsspec")
    data = np.random.default_rng(9).integers(0, 255, 512 << 10, dtype=np.uint8).tobytes()

    class WebHdfs(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
            if query["op"] == "GETFILESTATUS":
                body = json.dumps({"FileStatus": {"type": "FILE", "length": len(data),
                                                  "modificationTime": 1000}}).encode()
            else:  # OPEN: the bytes asked for, 16 KiB every 0.1 s
                start = int(query.get("offset", 0))
                body = data[start : start + int(query.get("length", len(data)))]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for i in range(0, len(body), 16 << 10):
                if i:
                    time.sleep(0.1)
                self.wfile.write(body[i : i + (16 << 10)])

    server = ThreadingHTTPServer(("127.0.0.1", 0), WebHdfs)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    from seqstore.io.objects import ObjectClient

    client = ObjectClient(f"webhdfs://127.0.0.1:{server.server_address[1]}/d",
                          {"timeout": 0.5, "connect_timeout": 0.5, "retry_timeout": 2, "max_retries": 1})
    try:
        got = client.get_ranges([("blob", 0, len(data), None)])
    finally:
        server.shutdown()
        server.server_close()
    assert bytes(got[0][0]) == data


def test_an_fsspec_endpoint_whose_lookups_answer_is_not_named_unreachable(tmp_path: Path) -> None:
    """Through ``webhdfs://``, an object's lookup answers but its reads never do: the endpoint has answered
    (the lookups), so the reads' error says they failed, not that the endpoint is unreachable."""
    import json
    import threading
    import urllib.parse
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    pytest.importorskip("requests")
    pytest.importorskip("fsspec")
    released = threading.Event()

    class WebHdfs(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
            if query["op"] != "GETFILESTATUS":
                released.wait()  # a read: accepted, never answered
                return
            body = json.dumps({"FileStatus": {"type": "FILE", "length": 1000, "modificationTime": 1000}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), WebHdfs)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    from seqstore.io.objects import ObjectClient

    client = ObjectClient(f"webhdfs://127.0.0.1:{server.server_address[1]}/d",
                          {"timeout": 0.5, "connect_timeout": 0.5, "retry_timeout": 30, "max_retries": 1})
    try:
        with pytest.raises(RemoteError) as err:
            client.get_ranges([("blob", 0, 100, None)])
    finally:
        released.set()
        server.shutdown()
        server.server_close()
    assert "unreachable" not in str(err.value) and err.value.attempts == 2, err.value


_FORKED_FSSPEC = """
import os, sys, threading, time
from seqstore.io import object_fsspec

object_fsspec._calls_live = object_fsspec.CALLS_MOST  # the parent's calls stuck on a silent server
""" + fork_holding("object_fsspec._calls_freed",
                      "a filesystem call ending in a thread of the parent does") + """
if pid == 0:
    os._exit(0 if object_fsspec._bounded(lambda: 7, 2.0) == 7 else 3)
""" + AWAIT_CHILD


def test_a_forked_child_counts_none_of_its_parents_filesystem_calls(tmp_path: Path) -> None:
    """The count of fsspec calls running (at most 128 a process) and its lock were inherited by a forked
    child: its parent's calls, whose threads the child has not, counted against it for ever (every call
    of a child forked while 128 hung failed), and a lock held at the fork hung the child's first call."""

    out = run_forking(tmp_path / "forked_fsspec.py", _FORKED_FSSPEC)
    assert out.stdout.strip() == "child 0", (out.stdout, out.stderr[-2000:])


_FORKED_LOOP = """
import os, sys, threading, time
from seqstore.io import object_obstore

""" + fork_holding('object_obstore._Loop._lock', "a thread starting the client's event loop does") + """if pid == 0:
    os._exit(0 if object_obstore._Loop.get().thread.is_alive() else 3)
""" + AWAIT_CHILD


def test_a_child_forked_while_the_event_loop_was_started_starts_its_own(tmp_path: Path) -> None:
    """The lock under which a process starts the object clients' event loop was inherited by a forked
    child as it was: held for ever where another thread of the parent held it at the fork, so the child's
    first request hung."""

    out = run_forking(tmp_path / "forked_loop.py", _FORKED_LOOP)
    assert out.stdout.strip() == "child 0", (out.stdout, out.stderr[-2000:])
