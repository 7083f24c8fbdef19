"""Retries of transient failures are a time budget (``retry_timeout``), not a count of attempts (issue 23).

A server that answers every request with an error (or a link that refuses every connection) makes each
attempt fail at once: a count of six attempts would be spent in two seconds. Here the budget holds the
reads through an outage shorter than it, ends a longer one with a named ``RemoteError`` within the budget
plus one request timeout, and the client's failure streak keeps requests asked again from getting a
fresh budget each. The outages are made by the fault proxy of tests/support/proxy.py in front of moto.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.proxy import FaultProxy
from support.s3 import MotoS3
from support.stores import build_store, same_batch

import seqstore as ss
from seqstore.errors import RemoteError
from seqstore.io.objects import ObjectClient

pytestmark = pytest.mark.timeout(120)
PREFIX = "budget/main.seqstore"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("local") / "main.seqstore", seed=5)


@pytest.fixture(scope="module")
def remote(moto_s3: MotoS3, local: Path) -> Iterator[str]:
    bucket = moto_s3.new_bucket("budget")
    yield moto_s3.upload_dir(local, bucket, PREFIX)
    moto_s3.delete_bucket(bucket)


def _open(moto_s3: MotoS3, url: str, proxy: FaultProxy, cache: Path, **options: Any) -> ss.Store:
    opts = moto_s3.storage_options(proxy.url, timeout=options.pop("timeout", 5), connect_timeout=2, **options)
    return ss.open(url, storage_options=opts, cache_dir=cache)


def test_an_outage_shorter_than_the_budget_is_ridden_out(moto_s3: MotoS3, remote: str, local: Path,
                                                         tmp_path: Path, s3_proxy: FaultProxy) -> None:
    store = _open(moto_s3, remote, s3_proxy, tmp_path / "c", retry_timeout=30)
    rule = s3_proxy.fail(None, status=503)  # every request fails at once, for 3 s
    timer = threading.Timer(3.0, s3_proxy.clear_faults)
    timer.start()
    try:
        t0 = time.monotonic()
        got = store.get_batch(np.arange(len(store)), pad=True)
        took = time.monotonic() - t0
    finally:
        timer.cancel()
    same_batch(got, ss.open(local).get_batch(np.arange(len(store)), pad=True), "after a 3 s outage")
    # more attempts than the old count of 6 allowed, and the outage was outlived
    assert rule.hits > 6 and 2.5 < took < 3.0 + 2 * 5.0 * 1.5 + 5, (rule.hits, took)


def test_an_outage_longer_than_the_budget_ends_in_a_named_error(moto_s3: MotoS3, remote: str, tmp_path: Path,
                                                                s3_proxy: FaultProxy) -> None:
    store = _open(moto_s3, remote, s3_proxy, tmp_path / "c", retry_timeout=2.0, timeout=3)
    s3_proxy.fail(None, status=503)
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as exc:
        store.get_batch(np.arange(len(store)), pad=True)
    took = time.monotonic() - t0
    assert 2.0 <= took < 2.0 + 3 + 2 + 3, took  # the budget plus one request timeout (and slack)
    assert remote in exc.value.url and exc.value.attempts > 1
    assert "retry_timeout=2 s" in str(exc.value), str(exc.value)


def test_a_refused_connection_is_retried_for_the_budget(tmp_path: Path) -> None:
    """Nothing listens: every connect is refused at once (as with a store restarting). The budget here,
    1.5 s, is under the 3 s an endpoint that never answered gets (io/retry.py), so it is the limit."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ObjectClient("s3://nobucket/x.seqstore", {
        "endpoint": f"http://127.0.0.1:{port}", "allow_http": "true", "region": "us-east-1",
        "access_key_id": "k", "secret_access_key": "s", "retry_timeout": 1.5, "timeout": 2, "connect_timeout": 1,
    })
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as exc:
        client.get_ranges([("manifest.json", 0, 10, None)])
    took = time.monotonic() - t0
    assert 1.5 <= took < 1.5 + 2 + 1 + 2, took
    assert exc.value.attempts >= 3, exc.value.attempts
    # the streak: asked again at once, the request gives up at its first failure (no fresh budget)
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as again:
        client.head("manifest.json")
    assert time.monotonic() - t0 < 1.0 and again.value.attempts == 1


def test_max_retries_still_bounds_the_count(moto_s3: MotoS3, remote: str, tmp_path: Path,
                                            s3_proxy: FaultProxy) -> None:
    s3_proxy.fail(None, status=500, path="manifest.json")
    with pytest.raises(RemoteError) as exc:
        _open(moto_s3, remote, s3_proxy, tmp_path / "c", max_retries=1)
    assert exc.value.attempts == 2 and s3_proxy.count(path="manifest.json") == 2


@pytest.mark.parametrize("bad", [{"retry_timeout": -1}, {"retry_timeout": "soon"}, {"max_retries": -1}])
def test_bad_budgets_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=f"{next(iter(bad))}=.*expected .* >= 0"):
        ObjectClient("s3://b/x", bad)


def test_a_definite_answer_ends_the_failure_streak(moto_s3: MotoS3, remote: str, tmp_path: Path,
                                                   s3_proxy: FaultProxy) -> None:
    """A request that failed once and then got a definite answer (a missing object) ends the streak: a
    blip long after it is retried with a budget of its own, not raised at its first failure."""
    opts = moto_s3.storage_options(s3_proxy.url, timeout=5, connect_timeout=2, retry_timeout=0.5)
    client = ObjectClient(remote, opts)
    s3_proxy.fail(1, status=503, path="no-such-object")
    with pytest.raises(ss.errors.RemoteNotFound):
        client.head("no-such-object")
    assert s3_proxy.count(path="no-such-object") == 2
    time.sleep(1.0)  # past the budget, counted from that first failure
    s3_proxy.fail(1, status=503, path="manifest.json")
    assert client.head("manifest.json").size > 0
    assert s3_proxy.count(path="manifest.json") == 2


@pytest.mark.parametrize("status", [429, 503])
def test_a_retry_after_past_the_budget_through_fsspec_gives_up_at_once(tmp_path: Path, status: int) -> None:
    """One retry policy for every back end (docs/remote.md): an fsspec filesystem (here ``webhdfs://``,
    whose errors carry the answer) refused with a Retry-After of an hour, past the 2 s budget, was retried
    with the plain backoff, its Retry-After ignored; as the direct reader, the error now comes at once and
    names the Retry-After."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    pytest.importorskip("requests")
    asked: list[str] = []

    class Throttled(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(status)
            self.send_header("Retry-After", "3600")
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Throttled)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"webhdfs://127.0.0.1:{server.server_address[1]}/s.seqstore"
    try:
        with pytest.raises(RemoteError) as err:
            ss.open(url, storage_options={"timeout": 1, "connect_timeout": 1, "retry_timeout": 2, "max_retries": 3},
                    cache_dir=tmp_path / "cache")
    finally:
        server.shutdown()
        server.server_close()
    assert f"HTTP {status}, Retry-After 3600 s" in str(err.value), err.value
    assert err.value.attempts == 1 and len(asked) == 1, (err.value, asked)
