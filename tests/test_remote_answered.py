"""A server that answers, but badly, is not an unreachable endpoint: both range readers (the direct reader
and obstore) against the raw server of tests/test_remote_direct_answers.py. The short budget and the
"unreachable ... check that the server is running" message are for endpoints that never answered; one
whose answers arrive cut short or of another range has answered, and its error says what was wrong.
"""

from __future__ import annotations

import gzip
import socket
from collections.abc import Callable, Iterator

import pytest
from test_remote_direct_answers import DATA, Answer, RawServer, _head

from seqstore.errors import RemoteError
from seqstore.io.objects import ObjectClient

pytestmark = pytest.mark.timeout(60)


def _cut(conn: socket.socket, a: int, b: int) -> bool:
    """The right head, half the body, then the connection closed."""
    conn.sendall(_head(a, b) + DATA[a : a + (b - a) // 2])
    return False


def _reset(conn: socket.socket, a: int, b: int) -> bool:
    """The right head, a few bytes of the body, then the connection reset."""
    conn.sendall(_head(a, b) + DATA[a : a + 10])
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    return False


def _other_range(conn: socket.socket, a: int, b: int) -> bool:
    """A 206 of the range one byte further on, its Content-Range saying so."""
    conn.sendall(_head(a + 1, b + 1) + DATA[a + 1 : b + 1])
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


@pytest.mark.parametrize("answer", [_cut, _reset, _other_range], ids=["cut", "reset", "other-range"])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "obstore"])
def test_a_bad_answer_is_not_named_unreachable(serve: Callable[[Answer], RawServer], answer: Answer,
                                               direct: bool) -> None:
    server = serve(answer)
    client = ObjectClient(f"{server.url}/b", {"timeout": 1, "connect_timeout": 1, "retry_timeout": 30,
                                             "max_retries": 2, "allow_http": "true"})
    url = f"{server.url}/b/blob"
    with pytest.raises(RemoteError) as err:
        if direct:
            client.direct_reader.submit([(url, 100, 200, None, memoryview(bytearray(100)))]).result(30)
        else:
            client.get_ranges([("blob", 100, 200, None)])
    text = str(err.value)
    assert url in text and "unreachable" not in text and "has not answered" not in text, text
    assert 1 <= err.value.attempts <= 3, text


def test_an_answer_in_a_transfer_coding_is_refused_not_taken_as_the_bytes(serve: Callable[[Answer], RawServer]
                                                                          ) -> None:
    """A 206 whose body is in a transfer coding other than chunked (gzip), with a Content-Length as well:
    the coding decides how the body ends (RFC 9112, 6.3), not the Content-Length, and the bytes are not
    the range's. The direct reader refuses it, naming the URL, instead of taking the coded bytes."""
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        coded = gzip.compress(DATA[a:b])
        body = (coded + bytes(b - a))[: b - a]  # as many bytes as the Content-Length says
        conn.sendall(_head(a, b).replace(b"\r\n\r\n", b"\r\nTransfer-Encoding: gzip\r\n\r\n") + body)
        return False

    server = serve(answer)
    client = ObjectClient(f"{server.url}/b", {"timeout": 1, "connect_timeout": 1, "retry_timeout": 2,
                                             "max_retries": 1})
    url = f"{server.url}/b/blob"
    buf = bytearray(100)
    with pytest.raises(RemoteError, match="Transfer-Encoding") as err:
        client.direct_reader.submit([(url, 100, 200, None, memoryview(buf))]).result(30)
    assert url in str(err.value), err.value


def _huge_headers(conn: socket.socket, a: int, b: int) -> bool:
    """The right answer with 1 MiB of header lines."""
    filler = "".join(f"X-Filler-{i}: {'y' * 1000}\r\n" for i in range(1024)).encode()
    conn.sendall(_head(a, b).replace(b"\r\n\r\n", b"\r\n" + filler + b"\r\n") + DATA[a:b])
    return True


def _garbage(conn: socket.socket, a: int, b: int) -> bool:
    """A status line of garbage."""
    conn.sendall(b"\x16\x03garbage, not HTTP at all\r\n\r\n")
    return False


@pytest.mark.parametrize(("answer", "said", "attempts"), [(_huge_headers, "headers are larger", 1),
                                                        (_garbage, "not HTTP", 3)], ids=["huge-headers", "garbage"])
def test_an_answer_obstore_cannot_parse_is_named(serve: Callable[[Answer], RawServer], answer: Answer, said: str,
                                                 attempts: int) -> None:
    """obstore's error for an answer it cannot parse says only "error sending request": the error says
    what was wrong with the answer (headers over the client's bound are refused at once, as the direct
    reader does; garbage is retried), not that the endpoint is unreachable."""
    server = serve(answer)
    client = ObjectClient(f"{server.url}/b", {"timeout": 1, "connect_timeout": 1, "retry_timeout": 30,
                                             "max_retries": 2, "allow_http": "true"})
    with pytest.raises(RemoteError) as err:
        client.get_ranges([("blob", 100, 200, None)])
    text = str(err.value)
    assert said in text and "unreachable" not in text and err.value.attempts == attempts, text


def test_a_redirect_loop_is_named_at_once(serve: Callable[[Answer], RawServer]) -> None:
    """Every range request redirected to itself: obstore follows the redirects until its limit; retrying
    cannot end the loop, so it is a RemoteError at once that says so (the direct reader follows none)."""
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /b/blob\r\nContent-Length: 0\r\n\r\n")
        return True

    server = serve(answer)
    client = ObjectClient(f"{server.url}/b", {"timeout": 1, "connect_timeout": 1, "retry_timeout": 30,
                                             "max_retries": 2, "allow_http": "true"})
    with pytest.raises(RemoteError, match="redirect") as err:
        client.get_ranges([("blob", 100, 200, None)])
    assert err.value.attempts == 1 and f"{server.url}/b/blob" in str(err.value), err.value


def test_two_content_lengths_that_differ_are_refused(serve: Callable[[Answer], RawServer]) -> None:
    """A 206 with two Content-Length headers that differ (RFC 9112, 6.3: an error; a proxy that joined two
    answers): which one frames the body cannot be known, so the answer is refused, naming the URL,
    instead of the last one's count of bytes taken as the range."""
    def answer(conn: socket.socket, a: int, b: int) -> bool:
        half = (b - a) // 2
        conn.sendall((f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b - 1}/{len(DATA)}\r\n"
                      f"Content-Length: {half}\r\nContent-Length: {b - a}\r\n\r\n").encode()
                     + DATA[a : a + half] + bytes(b - a - half))
        return False

    server = serve(answer)
    client = ObjectClient(f"{server.url}/b", {"timeout": 1, "connect_timeout": 1, "retry_timeout": 2,
                                             "max_retries": 1})
    url = f"{server.url}/b/blob"
    with pytest.raises(RemoteError, match="Content-Length") as err:
        client.direct_reader.submit([(url, 100, 200, None, memoryview(bytearray(100)))]).result(30)
    assert url in str(err.value), err.value
