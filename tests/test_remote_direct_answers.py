"""The direct HTTP reader (seqstore.io.object_direct) against a raw server whose answers each test writes:
malformed headers are named as the server's fault, the connections it keeps stay within ``max_requests``
after a wave fails, a server that never answers is named as silent, not as slow, an answer of another
version is refused, and a host whose name moves to another address is found there.
"""

from __future__ import annotations

import email.utils
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.forks import AWAIT_CHILD, fork_holding, run_forking

from seqstore.errors import RemoteError, StaleStoreError
from seqstore.io.objects import ObjectClient

pytestmark = pytest.mark.timeout(60)
DATA = bytes(range(256)) * 64
#: answer(conn, start, end) -> whether the connection stays open for another request
Answer = Callable[[socket.socket, int, int], bool]


class RawServer:
    """Range GETs on 127.0.0.1 (a free port), each answered by ``answer`` (a GET of the whole object, with no
    Range, as ``answer(conn, 0, -1)``); counts the connections open at once (``most``)."""

    def __init__(self, answer: Answer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.answer = answer
        self.sock = socket.create_server((host, port))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.open = self.most = 0
        self.heads: list[str] = []  # the requests' heads, as they came (each line with its CRLF)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()  # (after the accept loop ended: no connection is accepted any more)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with self.lock:
            self.open += 1
            self.most = max(self.most, self.open)
        try:
            conn.settimeout(5)
            buf = b""
            while not self.stop.is_set():
                while b"\r\n\r\n" not in buf:
                    got = conn.recv(65536)
                    if not got:
                        return
                    buf += got
                head, _, buf = buf.partition(b"\r\n\r\n")
                self.heads.append(head.decode() + "\r\n")
                ranged = next((ln for ln in head.decode().split("\r\n") if ln.lower().startswith("range:")), None)
                a, b = (int(x) for x in ranged.split("=")[1].split("-")) if ranged else (0, -2)
                if not self.answer(conn, a, b + 1):
                    return
        except OSError:
            pass
        finally:
            with self.lock:
                self.open -= 1
            conn.close()


def _head(a: int, b: int, length: str | None = None) -> bytes:
    return (f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b - 1}/{len(DATA)}\r\n"
            f"Content-Length: {b - a if length is None else length}\r\n\r\n").encode()


def _right(conn: socket.socket, a: int, b: int) -> bool:
    conn.sendall(_head(a, b) + DATA[a:b])
    return True


def _closing(conn: socket.socket, a: int, b: int) -> bool:
    conn.sendall(_head(a, b).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + DATA[a:b])
    return False


@pytest.fixture
def serve() -> Iterator[Callable[[Answer], RawServer]]:
    servers: list[RawServer] = []

    def start(answer: Answer) -> RawServer:
        servers.append(RawServer(answer))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _client(server: RawServer, **options: Any) -> ObjectClient:
    return ObjectClient(f"{server.url}/b", {"timeout": 1, "connect_timeout": 1, "retry_timeout": 2, **options})


def _refused(server: RawServer) -> str:
    """The RemoteError's text for a direct read of bytes 0-100 of ``/b/blob`` (one try)."""
    client = _client(server, max_retries=1)
    with pytest.raises(RemoteError) as err:
        client.direct_reader.submit([(f"{server.url}/b/blob", 0, 100, None, memoryview(bytearray(100)))]).result(30)
    return str(err.value)


def test_a_content_length_that_is_not_a_number_is_named(serve: Callable[[Answer], RawServer]) -> None:
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        conn.sendall(_head(a, b, "12abc") + DATA[a:b])
        return True

    server = serve(answer)
    text = _refused(server)
    assert "Content-Length '12abc'" in text and "/b/blob" in text and "seqstore bug" not in text, text



@pytest.mark.parametrize("coding", ["gzip", "br"])
def test_an_encoded_answer_is_refused_not_taken_as_the_bytes(serve: Callable[[Answer], RawServer], coding: str) -> None:
    """A server that compresses an answer (Content-Encoding) sends bytes that are not the object's: the
    reader, which asks for none (Accept-Encoding: identity), refuses it, naming the URL and the encoding."""
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        conn.sendall(_head(a, b).replace(b"\r\n\r\n", f"\r\nContent-Encoding: {coding}\r\n\r\n".encode()) + DATA[a:b])
        return True

    server = serve(answer)
    text = _refused(server)
    assert f"{server.url}/b/blob" in text and coding in text and "Content-Encoding" in text, text
    assert server.heads and all("\r\naccept-encoding: identity" in h.lower() for h in server.heads), server.heads


def test_interim_answers_before_the_answer_are_skipped(serve: Callable[[Answer], RawServer]) -> None:
    """1xx answers (103 Early Hints, an unasked 100 Continue) come before the final one, which a client
    must read on to (RFC 9110, 15.2): the bytes are those of the final 206."""
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </b/other>; rel=preload\r\n\r\n")
        return _right(conn, a, b)

    server = serve(answer)
    client = _client(server, max_retries=1)
    bufs = _first_two_hundreds(client, server)
    assert [bytes(b) for b in bufs] == [DATA[:100], DATA[100:200]]

def _first_two_hundreds(client: ObjectClient, server: RawServer) -> list[bytearray]:
    """Bytes [0, 100) and [100, 200) of the server's blob read through the client's direct reader (one wave)."""
    bufs = [bytearray(100), bytearray(100)]
    client.direct_reader.submit([(f"{server.url}/b/blob", 100 * i, 100 * i + 100, None, memoryview(buf))
                                 for i, buf in enumerate(bufs)]).result(30)
    return bufs


class Switch:
    """Answers nothing (reads until the client closes) while ``silent`` is set, else the right bytes
    after ``delay`` seconds (so that a wave's requests overlap)."""

    def __init__(self) -> None:
        self.silent = threading.Event()
        self.delay = 0.0

    def __call__(self, conn: socket.socket, a: int, b: int) -> bool:
        if self.silent.is_set():
            while conn.recv(65536):
                pass
            return False
        threading.Event().wait(self.delay)
        return _right(conn, a, b)


def _wave(server: RawServer, client: ObjectClient, n: int) -> list[bytearray]:
    bufs = [bytearray(100) for _ in range(n)]
    reqs = [(f"{server.url}/b/blob", 100 * i, 100 * i + 100, None, memoryview(buf)) for i, buf in enumerate(bufs)]
    client.direct_reader.submit(reqs).result(30)
    return bufs


def test_a_server_that_never_answers_is_named_silent_not_slow(serve: Callable[[Answer], RawServer]) -> None:
    switch = Switch()
    switch.silent.set()
    server = serve(switch)
    client = _client(server, max_retries=0)
    with pytest.raises(RemoteError) as err:
        _wave(server, client, 1)
    assert "no progress for 1 s waiting for its answer" in str(err.value), str(err.value)


def test_connections_stay_within_max_requests_after_a_wave_times_out(serve: Callable[[Answer], RawServer]) -> None:
    """A wave whose requests all time out together ends at the first one's error; the connections it
    closed are counted once, so the next waves still open at most ``max_requests``."""
    switch = Switch()
    server = serve(switch)
    client = _client(server, max_retries=0, max_requests=2)
    for _ in range(3):
        switch.silent.set()
        with pytest.raises(RemoteError):
            _wave(server, client, 4)
    switch.silent.clear()
    for _ in range(200):  # the server's side of the closed connections gone
        if server.open == 0:
            break
        threading.Event().wait(0.05)
    server.most = 0
    switch.delay = 0.2
    bufs = _wave(server, client, 12)
    assert [bytes(b) for b in bufs] == [DATA[100 * i : 100 * i + 100] for i in range(12)]
    assert server.most <= 2, f"{server.most} connections at once with max_requests=2"


def test_an_answer_of_another_version_is_stale(serve: Callable[[Answer], RawServer]) -> None:
    """A server that ignores If-Match answers the range of the object's new version: refused by its ETag."""
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        conn.sendall(_head(a, b).replace(b"\r\n\r\n", b'\r\nETag: "v2"\r\n\r\n') + DATA[a:b])
        return True

    server = serve(answer)
    client = _client(server, max_retries=1)
    url = f"{server.url}/b/blob"
    with pytest.raises(StaleStoreError, match='another version of the object .ETag "v2", expected "v1"') as err:
        client.direct_reader.submit([(url, 0, 100, '"v1"', memoryview(bytearray(100)))]).result(30)
    assert err.value.url == url
    buf = bytearray(100)
    client.direct_reader.submit([(url, 0, 100, '"v2"', memoryview(buf))]).result(30)
    client.direct_reader.submit([(url, 100, 200, None, memoryview(buf))]).result(30)  # no version asked
    assert bytes(buf) == DATA[100:200]


def test_a_failed_precondition_names_the_url_and_says_reopen(serve: Callable[[Answer], RawServer]) -> None:
    """A 412 to a read pinned to an ETag: the object at the URL changed since the store was opened, and the
    message says what to do about it (reopen the store)."""
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        conn.sendall(b"HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n")
        return True

    server = serve(answer)
    url = f"{server.url}/b/blob"
    with pytest.raises(StaleStoreError) as err:
        _client(server, max_retries=1).direct_reader.submit([(url, 0, 100, '"v1"', memoryview(bytearray(100)))]
                                                            ).result(30)
    text = str(err.value)
    assert err.value.url == url and text.startswith(url), text
    assert "changed since the store was opened" in text and "reopen the store" in text, text


class Throttle:
    """Refuses range requests with ``status`` (and ``Retry-After: retry_after()`` where given) while
    ``refusing`` is set, for ``gate`` seconds after its first refusal and ``times`` times at most (None:
    no limit), else answers them right after ``delay`` seconds; counts its refusals."""

    def __init__(self, status: int = 503, *, retry_after: Callable[[], str] | None = None,
                 gate: float | None = None, times: int | None = None, refusing: bool = True) -> None:
        self.status, self.retry_after, self.gate, self.times = status, retry_after, gate, times
        self.refusing = refusing
        self.delay = 0.0
        self.refused = 0
        self.first: float | None = None
        self.lock = threading.Lock()

    def __call__(self, conn: socket.socket, a: int, b: int) -> bool:
        with self.lock:
            now = time.monotonic()
            if self.refusing and self.first is None:
                self.first = now
            refuse = (self.refusing and (self.gate is None or now - (self.first or now) < self.gate)
                      and (self.times is None or self.refused < self.times))
            self.refused += refuse
        if not refuse:
            threading.Event().wait(self.delay)
            return _right(conn, a, b)
        extra = f"Retry-After: {self.retry_after()}\r\n" if self.retry_after is not None else ""
        conn.sendall(f"HTTP/1.1 {self.status} Refused\r\n{extra}Content-Length: 0\r\n\r\n".encode())
        return True  # (kept alive, as S3 does with its 503 SlowDown)


def test_an_error_status_on_a_kept_alive_connection_is_an_attempt(serve: Callable[[Answer], RawServer]) -> None:
    """A 503 on a connection kept alive from earlier answers was taken for a connection the server had
    closed while idle: the request was asked again at once on the next idle connection, uncounted and
    without a backoff, so a throttling server got a request for each idle connection. Each refusal is
    one attempt."""
    throttle = Throttle(refusing=False)
    server = serve(throttle)
    client = _client(server, max_retries=1, max_requests=8)
    throttle.delay = 0.2  # the wave's requests overlap: 8 connections, kept alive after it
    _wave(server, client, 8)
    throttle.refusing = True
    with pytest.raises(RemoteError) as err:
        _wave(server, client, 1)
    assert "HTTP 503" in str(err.value), err.value
    assert throttle.refused == err.value.attempts == 2, (throttle.refused, err.value)


@pytest.mark.parametrize("status", [507, 520, 599])
def test_every_5xx_is_retried(serve: Callable[[Answer], RawServer], status: int) -> None:
    """docs/remote.md: an HTTP 5xx is retried, as obstore and fsspec do. The direct reader retried 500, 502,
    503 and 504 only: a CDN's 520 (or 522, 524) or a 507 raised at once as an unexpected answer."""
    throttle = Throttle(status, times=1)
    server = serve(throttle)
    client = _client(server, max_retries=2)
    assert [bytes(b) for b in _wave(server, client, 2)] == [DATA[:100], DATA[100:200]]
    assert throttle.refused == 1


@pytest.mark.parametrize("form", ["seconds", "date"])
def test_a_retry_after_within_the_budget_is_waited_for(serve: Callable[[Answer], RawServer], form: str) -> None:
    """A throttling server's 503 asks for a second (Retry-After, as a number or as an HTTP date) and refuses
    what comes sooner: the client waits for it, and its second attempt is answered, instead of spending
    both attempts within a tenth of a second, both refused."""
    def when() -> str:
        return "1" if form == "seconds" else email.utils.formatdate(time.time() + 2, usegmt=True)

    throttle = Throttle(retry_after=when, gate=0.8)
    server = serve(throttle)
    client = _client(server, max_retries=1)
    assert [bytes(b) for b in _wave(server, client, 1)] == [DATA[:100]]
    assert throttle.refused == 1


@pytest.mark.parametrize("status", [429, 503])
def test_a_retry_after_past_the_budget_gives_up_at_once(serve: Callable[[Answer], RawServer], status: int) -> None:
    """A refusal that asks for an hour, with 2 s of retry budget: no attempt within the budget can be
    answered, so the error comes at once and names the Retry-After, instead of 2 s of refused requests."""
    throttle = Throttle(status, retry_after=lambda: "3600")
    server = serve(throttle)
    with pytest.raises(RemoteError) as err:
        _wave(server, _client(server), 1)
    assert f"HTTP {status}, Retry-After 3600 s" in str(err.value), err.value
    assert throttle.refused == 1 and err.value.attempts == 1, (throttle.refused, err.value)


_MOVED = """
import sys
sys.path.insert(0, sys.argv[2])
from test_remote_direct_answers import DATA, RawServer, _closing
from seqstore.io.objects import ObjectClient

hosts = sys.argv[1]
old = RawServer(_closing, "127.0.0.2")
with open(hosts, "w") as f:
    f.write("127.0.0.2 seqstore-moved.test\\n")
client = ObjectClient(f"http://seqstore-moved.test:{old.port}/b", {"timeout": 1, "connect_timeout": 1,
                                                                  "retry_timeout": 3})
url = f"http://seqstore-moved.test:{old.port}/b/blob"
buf = bytearray(100)
client.direct_reader.submit([(url, 0, 100, None, memoryview(buf))]).result(30)
assert bytes(buf) == DATA[:100]
old.close()  # (its answer closed the connection: the next request connects again)
new = RawServer(_closing, "127.0.0.3", old.port)
with open(hosts, "w") as f:
    f.write("127.0.0.3 seqstore-moved.test\\n")
client.direct_reader.submit([(url, 100, 200, None, memoryview(buf))]).result(30)
assert bytes(buf) == DATA[100:200]
print("found")
"""


def _with_hosts(tmp_path: Path, code: str, hosts_text: str, *, pass_hosts: bool = False,
                resolv_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Python ``code`` run in a user and mount namespace of its own whose /etc/hosts is a file holding
    ``hosts_text``; its arguments: that file (``pass_hosts``), then this directory. ``resolv_text``: the
    namespace's /etc/resolv.conf too, in a network namespace of its own (loopback only). Skips where user
    (and network) namespaces are not allowed."""
    spaces = ["--user", "--map-root-user", "--mount"] + (["--net"] if resolv_text is not None else [])
    probe = subprocess.run(["unshare", *spaces, "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user namespaces here: {probe.stderr.decode().strip()}")
    script, hosts, resolv = tmp_path / "script.py", tmp_path / "hosts", tmp_path / "resolv.conf"
    script.write_text(code)
    hosts.write_text(hosts_text)
    args = f'"{hosts}" "{Path(__file__).parent}"' if pass_hosts else f'"{Path(__file__).parent}"'
    shell = f'mount --bind "{hosts}" /etc/hosts && exec "{sys.executable}" "{script}" {args}'
    if resolv_text is not None:
        resolv.write_text(resolv_text)
        shell = f'ip link set lo up && mount --bind "{resolv}" /etc/resolv.conf && {shell}'
    return subprocess.run(["unshare", *spaces, "sh", "-c", shell], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_a_host_that_moved_to_another_address_is_looked_up_again(tmp_path: Path) -> None:
    """The name of the endpoint now names another address (the old one refuses): a failed connection
    forgets the address it went to, so a retry looks the name up again. Runs in a user and mount
    namespace of its own, with /etc/hosts replaced by a file the test writes (skipped where user
    namespaces are not allowed)."""
    got = _with_hosts(tmp_path, _MOVED, "", pass_hosts=True)
    assert got.returncode == 0 and "found" in got.stdout, (got.returncode, got.stdout, got.stderr[-2000:])


_TWO = """
import sys
sys.path.insert(0, sys.argv[1])
from test_remote_direct_answers import DATA, RawServer, _right
from seqstore.io.objects import ObjectClient

server = RawServer(_right, "127.0.0.9")  # (127.0.0.2, nearer to the source address, is sorted first: it refuses)
client = ObjectClient(f"http://seqstore-two.test:{server.port}/b", {"timeout": 1, "connect_timeout": 1,
                                                                   "retry_timeout": 3})
buf = bytearray(100)
client.direct_reader.submit([(f"http://seqstore-two.test:{server.port}/b/blob", 0, 100, None, memoryview(buf))]
                            ).result(30)
assert bytes(buf) == DATA[:100]
print("found")
"""


def test_a_host_with_two_addresses_is_reached_at_the_one_that_answers(tmp_path: Path) -> None:
    """The endpoint's name has two addresses and the first refuses (a dual-stack name whose IPv6 address
    nothing listens on, as ``localhost`` often is): the direct reader connects to the next address, as
    obstore does, instead of calling the endpoint unreachable. Runs with /etc/hosts replaced, as above."""
    got = _with_hosts(tmp_path, _TWO, "127.0.0.2 seqstore-two.test\n127.0.0.9 seqstore-two.test\n")
    assert got.returncode == 0 and "found" in got.stdout, (got.returncode, got.stdout, got.stderr[-2000:])


def test_a_host_name_the_resolver_refuses_fails_its_wave_not_the_reader(serve: Callable[[Answer], RawServer]) -> None:
    """A URL whose host name has a label over 63 characters: the resolver refuses it with a UnicodeError
    (not an OSError), which ended the reader's loop thread, so that wave and every later one waited for
    ever. It is the wave's RemoteError naming the URL, and the reader goes on serving other waves."""
    server = serve(_right)
    client = _client(server, max_retries=1)
    bad = f"http://{'a' * 70}.test:{server.port}/b/blob"
    with pytest.raises(RemoteError) as err:
        client.direct_reader.submit([(bad, 0, 100, None, memoryview(bytearray(100)))]).result(30)
    assert err.value.url == bad and "seqstore bug" not in str(err.value), err.value
    assert [bytes(b) for b in _wave(server, client, 2)] == [DATA[:100], DATA[100:200]]


_STALLED = """
import socket, sys
sys.path.insert(0, sys.argv[1])
from test_remote_direct_answers import DATA, RawServer, _right
from seqstore.errors import RemoteError
from seqstore.io.objects import ObjectClient

dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dns.bind(("127.0.0.1", 53))  # the resolver's server: it takes the questions and never answers
server = RawServer(_right)
client = ObjectClient(f"{server.url}/b", {"timeout": 1, "connect_timeout": 0.5, "retry_timeout": 1})
stalled = client.direct_reader.submit([(f"http://seqstore-stalled.test:{server.port}/b/blob", 0, 100, None,
                                        memoryview(bytearray(100)))])
buf = bytearray(100)
client.direct_reader.submit([(f"{server.url}/b/blob", 0, 100, None, memoryview(buf))]).result(10)
assert bytes(buf) == DATA[:100]
try:
    stalled.result(10)
except RemoteError as exc:
    print("named:", exc)
"""


def test_a_lookup_that_hangs_holds_up_no_other_request(tmp_path: Path) -> None:
    """A DNS server that never answers: the lookup of one host's name ran on the reader's loop thread,
    so a request to another host, by its address, waited for the resolver's timeout (20 s here) too.
    That request is answered at once, and the one whose name cannot be looked up fails within its
    budget, naming the resolver. Runs in a network namespace of its own, with /etc/resolv.conf
    replaced (skipped where user namespaces are not allowed)."""
    if shutil.which("ip") is None:
        pytest.skip("the ip command is not installed (it brings the namespace's loopback up)")
    got = _with_hosts(tmp_path, _STALLED, "", resolv_text="nameserver 127.0.0.1\noptions timeout:20 attempts:1\n")
    assert got.returncode == 0 and "named:" in got.stdout, (got.returncode, got.stdout, got.stderr[-2000:])
    assert "resolver" in got.stdout and "seqstore-stalled.test" in got.stdout, got.stdout


def test_bytes_past_the_content_length_close_the_connection(serve: Callable[[Answer], RawServer]) -> None:
    """A server that sends more than its Content-Length (here more than one read holds, ending in an answer
    to the range asked next): the bytes past the body in the read that took the headers were dropped and
    the connection kept, so the next request on it took the rest of them for its answer, and got the
    stray answer's bytes. Such a connection is closed: the next request is asked on a new one."""
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        stray = b"\xff" * 100_000 + _head(b, b + 100) + b"\xee" * 100
        conn.sendall(_head(a, b) + DATA[a:b] + stray)
        return True

    server = serve(answer)
    client = _client(server, max_retries=0, max_requests=1)
    bufs = [bytearray(100), bytearray(100), bytearray(100)]
    for i, buf in enumerate(bufs):
        client.direct_reader.submit([(f"{server.url}/b/blob", 100 * i, 100 * i + 100, None, memoryview(buf))]
                                    ).result(30)
    assert [bytes(b) for b in bufs] == [DATA[:100], DATA[100:200], DATA[200:300]]


def test_a_loop_that_ends_on_an_error_fails_its_waves_and_starts_again(serve: Callable[[Answer], RawServer],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An error that escaped the reader's loop (here: no thread could be started for a host's lookup, as at
    the system's thread limit) ended its thread for good: the wave it carried never ended, and every
    later wave waited out its caller's limit, since the thread was never started again. The waves in
    flight fail with a RemoteError naming the URL and the error, and the next wave starts a new loop."""
    server = serve(_right)
    client = _client(server, max_retries=0)
    reader = client.direct_reader

    def no_thread(name: tuple[str, int]) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(reader._lookups, "start", no_thread)
    with pytest.raises(RemoteError, match="can't start new thread") as err:
        reader.submit([(f"{server.url}/b/blob", 0, 100, None, memoryview(bytearray(100)))]).result(5)
    assert err.value.url == f"{server.url}/b/blob", err.value
    monkeypatch.undo()
    assert [bytes(b) for b in _wave(server, client, 2)] == [DATA[:100], DATA[100:200]]



def test_requests_waiting_for_a_lookup_go_with_their_failed_wave(serve: Callable[[Answer], RawServer],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A wave failed (a 404) while another of its requests waited for its host's name to be looked up: that
    one was still retried when its ``connect_timeout`` ran out, a failure that started the client's
    failure streak (its later requests got less of the retry budget). It is dropped with its wave."""
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        return True

    server = serve(answer)
    looked_up = socket.getaddrinfo
    release = threading.Event()

    def slow(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "seqstore-slow.test":
            release.wait(10)
            host = "127.0.0.1"
        return looked_up(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    client = _client(server, max_retries=3, connect_timeout=0.3)
    reader = client.direct_reader
    try:
        with pytest.raises(RemoteError, match="no such object"):
            reader.submit([(f"{server.url}/b/blob", 0, 100, None, memoryview(bytearray(100))),
                           (f"http://seqstore-slow.test:{server.port}/b/blob", 100, 200, None,
                            memoryview(bytearray(100)))]).result(10)
        for _ in range(100):  # until nothing waits for a lookup or a backoff
            if not reader._parked and not reader._later:
                break
            threading.Event().wait(0.03)
        assert client.retry.failing_since is None, "a request of the failed wave was retried"
    finally:
        release.set()


def test_a_status_line_that_does_not_begin_with_http_is_not_an_answer(serve: Callable[[Answer], RawServer]) -> None:
    """A status line with bytes before its ``HTTP/`` (stray bytes a server left on a kept-alive connection)
    was taken for an answer as long as its second word was a number: the body after it went into the
    caller's buffer. It is named as not an HTTP answer."""
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        conn.sendall(b"\xff\xff" + _head(a, b) + DATA[a:b])
        return True

    server = serve(answer)
    client = _client(server, max_retries=0)
    with pytest.raises(RemoteError, match="not an HTTP answer"):
        client.direct_reader.submit([(f"{server.url}/b/blob", 0, 100, None, memoryview(bytearray(100)))]).result(30)


_FORKED = """
import os, sys, threading, time
sys.path.insert(0, sys.argv[1])
from test_remote_direct_answers import DATA, RawServer, _right
from seqstore.io.objects import ObjectClient

server = RawServer(_right)
client = ObjectClient(f"{server.url}/b", {"timeout": 1, "connect_timeout": 1, "retry_timeout": 2})
reader = client.direct_reader
buf = bytearray(100)
reader.submit([(f"{server.url}/b/blob", 0, 100, None, memoryview(buf))]).result(30)
""" + fork_holding("reader._lock",
                      "the loop thread does, for a moment, many times a second") + """
if pid == 0:
    reader.submit([(f"{server.url}/b/blob", 100, 200, None, memoryview(buf))]).result(10)
    os._exit(0 if bytes(buf) == DATA[100:200] else 3)
""" + AWAIT_CHILD


def test_a_child_forked_while_the_loop_held_its_lock_reads(tmp_path: Path) -> None:
    """A process forked while the direct reader's loop thread held the reader's lock (it takes it many
    times a second) gave its child that lock held for ever, with no thread to release it: the child's
    first read hung. A forked child has a lock of its own (and none of its parent's queued requests)."""
    out = run_forking(tmp_path / "forked.py", _FORKED, str(Path(__file__).parent))
    assert out.stdout.strip() == "child 0", (out.stdout, out.stderr[-2000:])


_FORKED_CLIENT = """
import os, sys, threading, time
sys.path.insert(0, sys.argv[1])
from test_remote_direct_answers import DATA, RawServer, _right
from seqstore.io.objects import ObjectClient

server = RawServer(_right)
client = ObjectClient(f"{server.url}/b", {"timeout": 1, "connect_timeout": 1, "retry_timeout": 2})
""" + fork_holding('client._lock', "a thread making the client's back end or direct reader does") + """if pid == 0:
    buf = bytearray(100)
    client.direct_reader.submit([(f"{server.url}/b/blob", 100, 200, None, memoryview(buf))]).result(10)
    os._exit(0 if bytes(buf) == DATA[100:200] else 3)
""" + AWAIT_CHILD


def test_a_child_forked_while_a_thread_held_the_clients_lock_reads(tmp_path: Path) -> None:
    """The object client's lock (taken to make its back end, its direct reader, to count bytes in flight)
    was not made anew in a forked child: a fork while another thread of the parent held it gave the child
    a lock held for ever, and its first read hung."""
    out = run_forking(tmp_path / "forked_client.py", _FORKED_CLIENT, str(Path(__file__).parent))
    assert out.stdout.strip() == "child 0", (out.stdout, out.stderr[-2000:])


def test_bytes_sent_on_a_kept_alive_connection_between_answers_are_not_the_next_answer(
        serve: Callable[[Answer], RawServer]) -> None:
    """A server that sends more after an answer, once the client had taken it (a second answer to the same
    request, as a broken proxy does), left those bytes in a kept-alive connection: the next request asked
    on it took them for its own answer, and another range's bytes went into its buffer. A kept connection
    with bytes (or an end) waiting is closed, and the request is asked on a new one."""
    go, sent = threading.Event(), threading.Event()
    first = [True]

    def answer(conn: socket.socket, a: int, b: int) -> bool:
        _right(conn, a, b)
        if first[0]:
            first[0] = False
            go.wait(10)
            conn.sendall(_head(100, 200) + b"\xee" * 100)  # a stray answer that fits the next request
            sent.set()
        return True

    server = serve(answer)
    client = _client(server, max_retries=1, max_requests=1)
    bufs = [bytearray(100), bytearray(100)]
    client.direct_reader.submit([(f"{server.url}/b/blob", 0, 100, None, memoryview(bufs[0]))]).result(30)
    go.set()
    assert sent.wait(10)
    client.direct_reader.submit([(f"{server.url}/b/blob", 100, 200, None, memoryview(bufs[1]))]).result(30)
    assert [bytes(b) for b in bufs] == [DATA[:100], DATA[100:200]]


def test_a_head_that_never_ends_is_named_as_such_not_as_silence(serve: Callable[[Answer], RawServer]) -> None:
    """A server that keeps sending interim answers (103 Early Hints) and never the answer was named as
    unreachable, "it has not answered once", after "no progress" while its bytes kept coming. The error
    says that the answer's head did not end in time, and the endpoint counts as reached."""
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        for _ in range(100):
            conn.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </b/x>; rel=preload\r\n\r\n")
            threading.Event().wait(0.05)
        return False

    server = serve(answer)
    client = _client(server, max_retries=0, timeout=0.5)
    with pytest.raises(RemoteError) as err:
        client.direct_reader.submit([(f"{server.url}/b/blob", 0, 100, None, memoryview(bytearray(100)))]).result(30)
    text = str(err.value)
    assert "did not end within 0.5 s" in text and "unreachable" not in text and "/b/blob" in text, text


def test_an_answer_whose_lines_end_in_a_bare_lf_is_read(serve: Callable[[Answer], RawServer]) -> None:
    """A server that ends its status line and header lines with a bare LF (a recipient may take one as a
    line's end: RFC 9112, 2.2) was waited on until its timeout, every attempt, and named as slow or
    silent. Its answer is read."""
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        conn.sendall(_head(a, b).replace(b"\r\n", b"\n") + DATA[a:b])
        return True

    server = serve(answer)
    client = _client(server, max_retries=0)
    bufs = _first_two_hundreds(client, server)
    assert [bytes(b) for b in bufs] == [DATA[:100], DATA[100:200]]


def test_kept_alive_connections_that_went_dead_cost_one_timeout_not_one_each(
        serve: Callable[[Answer], RawServer]) -> None:
    """Kept-alive connections that a middlebox dropped without a word (a NAT's or a firewall's idle
    timeout) take a request and never answer. A request that timed out on one was asked again at once,
    not counted, on the next of them: one ``timeout`` each, as many as the reader kept (``max_requests``),
    past every limit of the retry policy. After the first, the others kept to that server are dropped,
    and the request goes on a new connection."""
    old: set[socket.socket] = set()
    dead = threading.Event()
    asked_dead = [0]

    def answer(conn: socket.socket, a: int, b: int) -> bool:
        if dead.is_set() and conn in old:
            asked_dead[0] += 1
            while conn.recv(65536):  # (until the client closes it)
                pass
            return False
        old.add(conn)
        threading.Event().wait(0.2)  # (the first wave's requests overlap: one connection each)
        return _right(conn, a, b)

    server = serve(answer)
    client = _client(server, max_retries=0, max_requests=4, timeout=0.5)
    assert [bytes(b) for b in _wave(server, client, 4)] == [DATA[100 * i:100 * i + 100] for i in range(4)]
    dead.set()
    assert [bytes(b) for b in _wave(server, client, 1)] == [DATA[:100]]
    assert asked_dead[0] == 1, asked_dead
