"""The direct HTTP reader (seqstore.io.object_direct) against a raw server whose answers each test writes:
malformed headers are named as the server's fault, the connections it keeps stay within ``max_requests``
after a wave fails, and a server that never answers is named as silent, not as slow.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from seqstore.errors import RemoteError, StaleStoreError
from seqstore.io.objects import ObjectClient

pytestmark = pytest.mark.timeout(60)
DATA = bytes(range(256)) * 64
#: answer(conn, start, end) -> whether the connection stays open for another request
Answer = Callable[[socket.socket, int, int], bool]


class RawServer:
    """Range GETs on 127.0.0.1 (a free port), each answered by ``answer``; counts the connections open at
    once (``most``)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.open = self.most = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()

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
                ranged = next(ln for ln in head.decode().split("\r\n") if ln.lower().startswith("range:"))
                a, b = (int(x) for x in ranged.split("=")[1].split("-"))
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


def test_a_content_length_that_is_not_a_number_is_named(serve: Callable[[Answer], RawServer]) -> None:
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        conn.sendall(_head(a, b, "12abc") + DATA[a:b])
        return True

    server = serve(answer)
    client = _client(server, max_retries=1)
    with pytest.raises(RemoteError) as err:
        client.direct_reader.submit([(f"{server.url}/b/blob", 0, 100, None, memoryview(bytearray(100)))]).result(30)
    text = str(err.value)
    assert "Content-Length '12abc'" in text and "/b/blob" in text and "seqstore bug" not in text, text


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
