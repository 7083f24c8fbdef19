"""Tests of the test infrastructure: the fault-injecting proxy (tests/support/proxy.py) and moto helpers.

Most tests put the proxy in front of a small keep-alive HTTP/1.1 origin defined here (moto answers every
request with ``Connection: close`` and has no chunked responses); the last ones go through moto with
obstore and boto3, as the remote-store tests do.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.proxy import FaultProxy, Request

DATA = np.random.default_rng(7).integers(0, 256, size=3 * 1024 * 1024 + 17, dtype=np.uint8).tobytes()
ETAG = '"v1"'


class _QuietServer(ThreadingHTTPServer):
    """Stays silent when the proxy cuts a connection on purpose (the origin then writes to a reset socket)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


class _Origin(BaseHTTPRequestHandler):
    """GET /obj (Range, If-Match, If-None-Match), GET /chunked, PUT /echo, GET /close-after."""

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        self.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers.items())})
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for k in range(0, 100_000, 7_000):
                piece = DATA[k : min(k + 7_000, 100_000)]
                self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
            self.wfile.write(b"0\r\nX-Trailer: 1\r\n\r\n")
            return
        if self.path == "/close-after":
            self._send(200, b"bye")
            self.close_connection = True  # as a server closing an idle keep-alive connection does
            return
        if self.path != "/obj":
            self._send(404, b"no such object")
            return
        if "If-Match" in self.headers and self.headers["If-Match"] != ETAG:
            self._send(412, b"precondition failed")
            return
        if self.headers.get("If-None-Match") == ETAG:
            self.send_response(304)
            self.send_header("ETag", ETAG)
            self.end_headers()
            return
        rng = self.headers.get("Range")
        if rng:
            a, b = (int(x) for x in rng[len("bytes=") :].split("-"))
            b = min(b, len(DATA) - 1)
            self._send(206, DATA[a : b + 1], {"ETag": ETAG, "Content-Range": f"bytes {a}-{b}/{len(DATA)}"})
        else:
            self._send(200, DATA, {"ETag": ETAG})

    def do_PUT(self) -> None:
        headers = dict(self.headers.items())
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append({"method": "PUT", "path": self.path, "headers": headers})
        if self.headers.get("If-None-Match") == "*" and self.path == "/obj":
            self._send(412, b"exists")
            return
        out = {"len": len(body), "sha": hashlib.sha256(body).hexdigest(), "headers": headers}
        self._send(200, json.dumps(out).encode(), {"Content-Type": "application/json"})


@pytest.fixture
def origin() -> Iterator[str]:
    server = _QuietServer(("127.0.0.1", 0), _Origin)
    server.daemon_threads = True
    _Origin.seen = []
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(origin: str) -> Iterator[FaultProxy]:
    with FaultProxy(origin) as p:
        yield p


def _conn(p: FaultProxy, timeout: float = 10) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", p.port, timeout=timeout)


def _get(p: FaultProxy, path: str = "/obj", headers: dict[str, str] | None = None,
         conn: http.client.HTTPConnection | None = None) -> tuple[int, bytes]:
    c = conn or _conn(p)
    c.request("GET", path, headers=headers or {})
    r = c.getresponse()
    return r.status, r.read()


# ------------------------------------------------------------------------------------- forwarding


def test_range_gets_are_byte_exact_over_one_kept_alive_connection(proxy: FaultProxy) -> None:
    rng = np.random.default_rng(1)
    c = _conn(proxy)
    ranges = [(0, 0), (0, 99), (len(DATA) - 10, len(DATA) - 1), (5, 5 + 2 * 1024 * 1024)]
    ranges += [tuple(sorted(int(x) for x in rng.integers(0, len(DATA), 2))) for _ in range(20)]
    for a, b in ranges:
        status, body = _get(proxy, headers={"Range": f"bytes={a}-{b}"}, conn=c)
        assert status == 206
        assert body == DATA[a : b + 1], (a, b)
    status, body = _get(proxy, conn=c)
    assert status == 200 and body == DATA
    reqs = proxy.requests
    assert len(reqs) == len(ranges) + 1 == proxy.count(method="GET", path="/obj")
    assert [r.byte_range for r in reqs[:-1]] == ranges and reqs[-1].byte_range is None
    assert [r.body_bytes for r in reqs] == [b - a + 1 for a, b in ranges] + [len(DATA)]
    assert {r.connection for r in reqs} == {1} and proxy.connections == 1
    assert all(r.status in (200, 206) and r.fault is None and r.end is not None for r in reqs)
    # the sequential requests are one round trip each
    assert proxy.round_trips() == len(reqs)


def test_chunked_bodies_both_ways_and_expect_continue(proxy: FaultProxy) -> None:
    c = _conn(proxy)
    status, body = _get(proxy, "/chunked", conn=c)
    assert status == 200 and body == DATA[:100_000]
    payload = DATA[:300_001]
    c.request("PUT", "/echo", body=iter([payload[:100_000], payload[100_000:]]), encode_chunked=True)
    r = c.getresponse()
    got = json.loads(r.read())
    assert r.status == 200 and got["len"] == len(payload)
    assert got["sha"] == hashlib.sha256(payload).hexdigest()
    # Expect: 100-continue: send the head, wait for the interim 100 through the proxy, then the body
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    body = DATA[:50_000]
    s.sendall(b"PUT /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body))
    interim = b""
    while b"\r\n\r\n" not in interim:
        interim += s.recv(1)
    assert interim.startswith(b"HTTP/1.1 100"), interim
    s.sendall(body)
    f = s.makefile("rb")
    resp = http.client.HTTPResponse(s)
    resp.fp = f
    resp.begin()
    got = json.loads(resp.read())
    s.close()
    assert resp.status == 200 and got["len"] == len(body) and got["sha"] == hashlib.sha256(body).hexdigest()


def test_every_request_header_is_forwarded_verbatim(proxy: FaultProxy) -> None:
    c = _conn(proxy)
    hdrs = {"If-Match": '"other"', "X-Amz-Date": "20260101T000000Z", "Authorization": "AWS4-HMAC-SHA256 x",
            "Range": "bytes=1-2"}
    assert _get(proxy, headers=hdrs, conn=c)[0] == 412  # the origin evaluated the condition
    seen = _Origin.seen[-1]["headers"]
    for k, v in hdrs.items():
        assert seen[k] == v
    assert seen["Host"] == f"127.0.0.1:{proxy.port}"  # Host unchanged: signatures stay valid
    assert _get(proxy, headers={"If-Match": ETAG, "Range": "bytes=1-2"}, conn=c) == (206, DATA[1:3])
    status, body = _get(proxy, headers={"If-None-Match": ETAG}, conn=c)
    assert status == 304 and body == b""
    c.request("HEAD", "/obj")
    r = c.getresponse()
    assert r.status == 200 and r.read() == b"" and int(r.headers["Content-Length"]) == len(DATA)
    c.request("PUT", "/obj", body=b"abc", headers={"If-None-Match": "*"})
    r = c.getresponse()
    assert r.status == 412 and r.read() == b"exists"
    assert _Origin.seen[-1]["headers"]["If-None-Match"] == "*"
    assert proxy.requests[0].headers["if-match"] == '"other"'


def test_server_closing_an_idle_connection_is_transparent(proxy: FaultProxy) -> None:
    c = _conn(proxy)
    assert _get(proxy, "/close-after", conn=c) == (200, b"bye")
    for _ in range(3):  # the proxy opens a new upstream connection; the client's stays
        assert _get(proxy, headers={"Range": "bytes=0-9"}, conn=c) == (206, DATA[:10])
    assert proxy.connections == 1


# ----------------------------------------------------------------------------------------- faults


def test_fail_answers_with_s3_errors_then_forwards(proxy: FaultProxy) -> None:
    rule = proxy.fail(2, status=503)
    outs = [_get(proxy) for _ in range(3)]
    assert [s for s, _ in outs] == [503, 503, 200]
    assert b"<Code>SlowDown</Code>" in outs[0][1] and outs[2][1] == DATA
    assert rule.hits == 2 and rule.spent
    proxy.fail(1, status=500)
    status, body = _get(proxy)
    assert status == 500 and b"<Code>InternalError</Code>" in body
    c = _conn(proxy)
    proxy.fail(1, status=500)
    c.request("HEAD", "/obj")
    r = c.getresponse()
    assert r.status == 500 and r.read() == b""
    # a failed PUT's body is read first, so the client gets the answer and not a reset
    proxy.fail(1, status=503, method="PUT")
    c = _conn(proxy)
    c.request("PUT", "/echo", body=DATA[:200_000])
    assert c.getresponse().status == 503
    assert [r.fault for r in proxy.requests] == ["fail", "fail", None, "fail", "fail", "fail"]
    assert [r.status for r in proxy.requests] == [503, 503, 200, 500, 500, 503]
    assert len(_Origin.seen) == 1  # only the one request that was not failed reached the origin


def test_forbid_until_cleared_and_filters(proxy: FaultProxy) -> None:
    rule = proxy.forbid(path="/obj")
    for _ in range(3):
        status, body = _get(proxy)
        assert status == 403 and b"<Code>AccessDenied</Code>" in body
    assert _get(proxy, "/chunked")[0] == 200  # not matched by the path filter
    proxy.clear_faults()
    assert _get(proxy)[0] == 200 and rule.hits == 3
    proxy.fail(None, status=500, method="HEAD")
    proxy.fail(None, status=503, where=lambda r: r.byte_range == (0, 9))
    assert _get(proxy, headers={"Range": "bytes=0-9"})[0] == 503
    assert _get(proxy, headers={"Range": "bytes=0-8"})[0] == 206
    c = _conn(proxy)
    c.request("HEAD", "/obj")
    assert c.getresponse().status == 500
    assert proxy.count(status=403) == 3 and proxy.count(method="HEAD") == 1


def test_reset_at_the_request_and_mid_body(proxy: FaultProxy) -> None:
    rule = proxy.reset()
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        _get(proxy)
    assert rule.hits == 1 and proxy.requests[-1].fault == "reset" and proxy.requests[-1].status is None
    assert _get(proxy)[0] == 200
    proxy.reset(after=100_000)
    c = _conn(proxy)
    c.request("GET", "/obj")
    r = c.getresponse()
    assert r.status == 200  # the head arrived
    with pytest.raises((ConnectionError, http.client.IncompleteRead)):
        r.read()
    assert proxy.requests[-1].fault == "reset" and proxy.requests[-1].body_bytes == 100_000
    assert _get(proxy) == (200, DATA)


def test_truncate_closes_after_k_body_bytes(proxy: FaultProxy) -> None:
    proxy.truncate(2, after=1234)
    for _ in range(2):
        c = _conn(proxy)
        c.request("GET", "/obj", headers={"Range": "bytes=10-99999"})
        r = c.getresponse()
        assert r.status == 206 and int(r.headers["Content-Length"]) == 99990
        with pytest.raises(http.client.IncompleteRead) as exc:
            r.read()
        assert exc.value.partial == DATA[10 : 10 + 1234]
    # a response no longer than the cut is left alone and does not spend the rule
    rule = proxy.truncate(1, after=50)
    assert _get(proxy, headers={"Range": "bytes=0-49"}) == (206, DATA[:50])
    assert rule.hits == 0
    c = _conn(proxy)
    c.request("GET", "/chunked")
    r = c.getresponse()
    with pytest.raises(http.client.IncompleteRead):
        r.read()
    assert rule.hits == 1
    assert [r.fault for r in proxy.requests] == ["truncate", "truncate", None, "truncate"]


def test_stall_never_answers_until_the_client_gives_up(proxy: FaultProxy) -> None:
    proxy.stall()
    c = _conn(proxy, timeout=0.3)
    with pytest.raises(TimeoutError):
        _get(proxy, conn=c)
    c.close()
    rec = proxy.requests[-1]
    deadline = time.monotonic() + 10
    while rec.end is None and time.monotonic() < deadline:  # ends when the proxy sees the close
        time.sleep(0.01)
    assert rec.fault == "stall" and rec.end is not None and rec.status is None
    proxy.stall(after=1000)
    c = _conn(proxy)
    c.request("GET", "/obj")
    r = c.getresponse()
    assert r.status == 200
    assert c.sock is not None
    c.sock.settimeout(0.3)  # the head came; the body stops after 1000 bytes
    with pytest.raises(TimeoutError):
        r.read()
    c.close()
    assert _get(proxy, headers={"Range": "bytes=0-3"}) == (206, DATA[:4])


def test_stop_ends_stalled_connections(origin: str) -> None:
    p = FaultProxy(origin).start()
    p.stall(None)
    c = http.client.HTTPConnection("127.0.0.1", p.port, timeout=30)
    c.request("GET", "/obj")
    while p.count() < 1:
        time.sleep(0.01)
    p.stop()  # returns, and the client's wait ends with the connection
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        c.getresponse()


def test_latency_is_added_to_every_request(proxy: FaultProxy) -> None:
    proxy.latency = 0.05
    c = _conn(proxy)
    for _ in range(3):
        assert _get(proxy, headers={"Range": "bytes=0-0"}, conn=c) == (206, DATA[:1])
    proxy.fail(1, 503)
    assert _get(proxy)[0] == 503
    for r in proxy.requests:
        assert r.end is not None and r.end - r.start >= 0.05 * 0.99  # the proxy slept that long first


# ------------------------------------------------------------------------------------ round trips


def _req(start: float, end: float) -> Request:
    return Request(method="GET", target="/x", headers={}, start=start, end=end)


def test_round_trips_are_the_longest_start_after_end_chain() -> None:
    p = FaultProxy("http://127.0.0.1:1")  # not started: waves() only reads records
    a, b, c, d = _req(0, 10), _req(5, 20), _req(15, 25), _req(30, 31)
    assert p.round_trips([]) == 0
    assert p.round_trips([a]) == 1
    assert p.round_trips([a, b]) == 1  # overlapping: one round trip
    assert p.round_trips([a, b, c]) == 2  # c began after a ended: it may have waited on a
    assert p.waves([c, a, b, d]) == [[a, b], [c], [d]]
    assert p.round_trips([_req(0, 1), _req(1, 2), _req(2, 3)]) == 3  # touching counts as after
    many = [_req(float(k), float(k) + 1.5) for k in range(10)]  # each overlaps its neighbours
    assert p.round_trips(many) == 5


def test_held_requests_overlap_and_count_as_one_round_trip(proxy: FaultProxy) -> None:
    proxy.hold()
    results: list[tuple[int, bytes]] = []
    threads = [threading.Thread(target=lambda k=k: results.append(
        _get(proxy, headers={"Range": f"bytes={k}-{k + 9}"}))) for k in range(5)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while proxy.count() < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.count() == 5 and not results  # all arrived, none answered
    proxy.release()
    for t in threads:
        t.join(30)
    assert sorted(results) == sorted((206, DATA[k : k + 10]) for k in range(5))
    assert proxy.round_trips() == 1
    _get(proxy, headers={"Range": "bytes=0-0"})
    assert proxy.round_trips() == 2 and [len(w) for w in proxy.waves()] == [5, 1]
    proxy.clear_log()
    assert proxy.requests == [] and proxy.round_trips() == 0


# -------------------------------------------------------------------------------- stand-alone mode


def test_standalone_proxy_process(origin: str) -> None:
    script = Path(__file__).parent / "support" / "proxy.py"
    proc = subprocess.Popen([sys.executable, str(script), "--upstream", origin, "--latency", "0.01"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        c = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=10)
        c.request("GET", "/obj", headers={"Range": "bytes=100-199"})
        r = c.getresponse()
        assert r.status == 206 and r.read() == DATA[100:200]
    finally:
        proc.terminate()
        proc.wait(10)


# ---------------------------------------------------------------------------------- through moto


def test_obstore_and_boto3_through_the_proxy_to_moto(moto_s3: Any, s3_bucket: str, s3_proxy: FaultProxy) -> None:
    import obstore

    blob = DATA[: 64 * 1024 + 3]
    moto_s3.put(s3_bucket, "dir/blob.bin", blob)
    via = moto_s3.obstore(s3_bucket, s3_proxy.url)
    assert bytes(obstore.get(via, "dir/blob.bin").bytes()) == blob
    assert bytes(obstore.get_range(via, "dir/blob.bin", start=100, end=5000)) == blob[100:5000]
    starts, ends = [0, 7, 60_000, 65_000], [3, 9000, 60_001, len(blob)]
    got = obstore.get_ranges(via, "dir/blob.bin", starts=starts, ends=ends)
    assert [bytes(g) for g in got] == [blob[a:b] for a, b in zip(starts, ends)]
    gets = s3_proxy.select(method="GET", path="/dir/blob.bin")
    assert gets and all(r.status in (200, 206) for r in gets)
    assert any(r.byte_range == (100, 4999) for r in gets)
    # writes through the proxy land byte-exact; a conditional create is refused the second time
    obstore.put(via, "dir/new.bin", DATA[:100_000])
    assert moto_s3.get(s3_bucket, "dir/new.bin") == DATA[:100_000]
    obstore.put(via, "dir/once.bin", b"1", mode="create")
    with pytest.raises(Exception) as exc:
        obstore.put(via, "dir/once.bin", b"2", mode="create")
    assert "exist" in str(exc.value).lower() or "precondition" in str(exc.value).lower(), exc.value
    assert moto_s3.get(s3_bucket, "dir/once.bin") == b"1"
    puts = s3_proxy.select(method="PUT", path="/dir/once.bin")
    assert len(puts) == 2 and all(r.headers.get("if-none-match") == "*" for r in puts)
    # boto3 sends Expect: 100-continue with its PUTs
    client = moto_s3.boto3(s3_proxy.url)
    client.put_object(Bucket=s3_bucket, Key="dir/boto.bin", Body=DATA[:70_000])
    assert client.get_object(Bucket=s3_bucket, Key="dir/boto.bin", Range="bytes=5-9")["Body"].read() == DATA[5:10]
    assert moto_s3.get(s3_bucket, "dir/boto.bin") == DATA[:70_000]
    assert moto_s3.keys(s3_bucket, "dir/") == {"dir/blob.bin": len(blob), "dir/new.bin": 100_000,
                                                "dir/once.bin": 1, "dir/boto.bin": 70_000}
    # a fault at the proxy reaches the client as the status it injected
    s3_proxy.forbid(1)
    with pytest.raises(Exception) as exc:
        obstore.get(via, "dir/blob.bin")
    assert s3_proxy.requests[-1].status == 403


def test_upload_replace_and_download_dir(moto_s3: Any, s3_bucket: str, tmp_path: Path) -> None:
    src = tmp_path / "a"
    (src / "shard-000000").mkdir(parents=True)
    (src / "manifest.json").write_text("{}")
    (src / "shard-000000" / "x.npy").write_bytes(os.urandom(1000))
    url = moto_s3.upload_dir(src, s3_bucket, "p/store.seqstore/")
    assert url == f"s3://{s3_bucket}/p/store.seqstore"
    assert set(moto_s3.keys(s3_bucket)) == {"p/store.seqstore/manifest.json", "p/store.seqstore/shard-000000/x.npy"}
    other = tmp_path / "b"
    (other / "shard-000001").mkdir(parents=True)
    (other / "manifest.json").write_text('{"v": 2}')
    (other / "shard-000001" / "y.npy").write_bytes(b"y")
    moto_s3.replace_dir(other, s3_bucket, "p/store.seqstore")
    back = moto_s3.download_dir(s3_bucket, "p/store.seqstore", tmp_path / "c")
    assert sorted(p.relative_to(back).as_posix() for p in back.rglob("*") if p.is_file()) == [
        "manifest.json", "shard-000001/y.npy"]
    assert (back / "manifest.json").read_text() == '{"v": 2}'


def test_keys_are_string_prefixes(moto_s3: Any, s3_bucket: str) -> None:
    for key in ("a/b.npy", "a/b.npy.offsets", "a/bc", "a/c/d", "ab"):
        moto_s3.put(s3_bucket, key, key.encode())
    assert sorted(moto_s3.keys(s3_bucket, "a/b")) == ["a/b.npy", "a/b.npy.offsets", "a/bc"]
    assert sorted(moto_s3.keys(s3_bucket, "a/")) == ["a/b.npy", "a/b.npy.offsets", "a/bc", "a/c/d"]
    assert sorted(moto_s3.keys(s3_bucket, "a")) == ["a/b.npy", "a/b.npy.offsets", "a/bc", "a/c/d", "ab"]
    assert moto_s3.delete_prefix(s3_bucket, "a/b.npy") == 2
    moto_s3.delete(s3_bucket, "ab", "not-there")
    assert sorted(moto_s3.keys(s3_bucket)) == ["a/bc", "a/c/d"]


def test_static_server_ranges_and_conditions(tmp_path: Path) -> None:
    from support.http import StaticServer

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.bin").write_bytes(DATA[:10_000])
    with StaticServer(tmp_path) as srv:
        c = http.client.HTTPConnection("127.0.0.1", int(srv.url.rsplit(":", 1)[1]), timeout=10)
        cases = {"bytes=0-9": DATA[:10], "bytes=9990-": DATA[9990:10_000], "bytes=-5": DATA[9995:10_000],
                 "bytes=9995-20000": DATA[9995:10_000]}
        for rng, want in cases.items():
            c.request("GET", "/d/f.bin", headers={"Range": rng})
            r = c.getresponse()
            assert (r.status, r.read()) == (206, want), rng
        c.request("GET", "/d/f.bin")
        r = c.getresponse()
        etag = r.headers["ETag"]
        assert r.status == 200 and r.read() == DATA[:10_000]
        c.request("HEAD", "/d/f.bin")
        r = c.getresponse()
        assert r.status == 200 and r.read() == b"" and r.headers["Content-Length"] == "10000"
        for headers, status in (({"Range": "bytes=10000-"}, 416), ({"If-Match": '"x"'}, 412),
                                ({"If-None-Match": etag}, 304), ({"If-Match": etag, "Range": "bytes=0-0"}, 206)):
            c.request("GET", "/d/f.bin", headers=headers)
            r = c.getresponse()
            r.read()
            assert r.status == status, headers
        c.request("GET", "/../etc/passwd")
        r = c.getresponse()
        r.read()
        assert r.status == 404
