"""A fault-injecting, request-counting HTTP/1.1 reverse proxy on loopback, in front of an S3 endpoint.

Point a client's endpoint at :attr:`FaultProxy.url` instead of the server's; the proxy forwards every
request byte for byte (request line, all headers including ``Host`` so SigV4 signatures stay valid,
``Range``, ``If-Match`` / ``If-None-Match``, ``Expect: 100-continue``, bodies with ``Content-Length``
or chunked) and streams every response back in chunks of at most :data:`CHUNK` bytes: nothing is ever
held whole, so a large ranged GET or PUT costs the proxy O(CHUNK) memory. Each client connection gets
its own upstream connection (opened on its first request, reopened when the server closed it while
idle), so keep-alive behaves as it would without the proxy.

It runs an asyncio loop in a daemon thread of the calling process, or stand-alone
(``python tests/support/proxy.py --upstream URL --latency 0.02``, which prints its URL on one line),
for a benchmark that must keep the proxy's work out of the measured process.

Faults, set at any time from any thread, each a :class:`Rule` matched in the order they were added:

- ``latency = s``: every request waits ``s`` seconds before it is forwarded (or answered by a fault).
- :meth:`FaultProxy.fail` (``status`` 500/503/...) and :meth:`FaultProxy.forbid` (403): the request is
  not forwarded; the proxy answers with an S3-style XML error body and closes the connection.
- :meth:`FaultProxy.reset`: the connection is reset (TCP RST) at once, or after ``after`` body bytes
  of the response were forwarded.
- :meth:`FaultProxy.truncate`: the response's head is forwarded unchanged (so ``Content-Length`` still
  promises the whole body), then ``after`` bytes of body, then the connection is closed (FIN).
- :meth:`FaultProxy.lose`: the request is forwarded and the server answers it (so it takes effect), then
  the connection is reset instead of passing the answer on: a write that happened, its answer lost.
- :meth:`FaultProxy.stall`: never answer (``after=None``), or forward the head and ``after`` body bytes
  and then send nothing more; the connection stays open until the client gives up or the proxy stops.

A rule fires on ``times`` matching requests (``None``: every one until :meth:`FaultProxy.clear_faults`)
and counts its firings in :attr:`Rule.hits`. Rules acting on the response body (truncate, and reset /
stall with ``after``) only consider responses that have a body of more than ``after`` bytes, so they are
never spent on a response they cannot damage; the others are decided when the request head arrives.

Every request is recorded as a :class:`Request` (method, path, range, start, end, status, fault, body
bytes sent). **Round trips** (:meth:`FaultProxy.round_trips`) are the length of the longest chain of
recorded requests in which each request started (its head reached the proxy) at or after the time the
previous one ended (set just before the last byte of its answer is handed to the socket, so a client
holding a complete answer always finds ``end`` set; or when a fault ended the request). Requests that
overlap in time are one round trip however many they are; a request issued only after another one
finished adds one, since it may have waited on the other's answer. With an added latency L, a client
that makes R round trips cannot finish in less than R * L. :meth:`FaultProxy.waves` groups the requests
by their place in such chains (wave k holds the requests whose longest chain ending in them has length
k), which shows what a client fetched in which round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

CHUNK = 256 * 1024
"""Largest piece of a body read and forwarded at once."""
_HEAD_LIMIT = 1 << 20  # longest request/response head accepted (and StreamReader buffer limit)
_WRITE_HIGH = 4 * CHUNK  # write buffer above which forwarding waits for the peer to read


@dataclass
class Request:
    """One request seen by the proxy. Times are ``time.monotonic()`` seconds in the proxy's process."""

    method: str
    target: str  # request target as sent (path and query)
    headers: dict[str, str]  # lower-case names (the last value when a name repeats)
    start: float
    end: float | None = None  # None while in flight
    status: int | None = None  # final status sent to the client (None: none was sent)
    fault: str | None = None  # "fail", "forbid", "reset", "truncate", "stall" when a rule fired
    body_bytes: int = 0  # response body bytes forwarded to the client
    connection: int = 0  # number of the client connection (1, 2, ...) it came on

    @property
    def path(self) -> str:
        """The target without its query string."""
        return self.target.split("?", 1)[0]

    @property
    def range(self) -> str | None:
        """The ``Range`` header as sent, e.g. ``"bytes=0-99"``."""
        return self.headers.get("range")

    @property
    def byte_range(self) -> tuple[int, int] | None:
        """``(first, last)`` inclusive of a single-range ``bytes=first-last`` header, else None."""
        r = self.range
        if not r or not r.startswith("bytes=") or "," in r:
            return None
        a, _, b = r[6:].partition("-")
        if not a or not b:
            return None
        return int(a), int(b)


Match = Callable[[Request], bool]


@dataclass
class Rule:
    """A fault: fires on ``times`` matching requests (None: unlimited); ``hits`` counts firings."""

    kind: str
    times: int | None
    status: int = 0
    after: int | None = None
    method: str | None = None
    path: str | None = None
    where: Match | None = None
    hits: int = 0

    def matches(self, req: Request) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method is not None and req.method != self.method.upper():
            return False
        if self.path is not None and self.path not in req.target:
            return False
        return self.where is None or bool(self.where(req))

    @property
    def on_body(self) -> bool:
        return self.kind == "truncate" or (self.kind in ("reset", "stall") and self.after is not None)

    @property
    def spent(self) -> bool:
        return self.times is not None and self.hits >= self.times


_REASONS = {403: "Forbidden", 500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}
_CODES = {403: "AccessDenied", 500: "InternalError", 503: "SlowDown"}


def _error_response(status: int, target: str, head_only: bool) -> bytes:
    code = _CODES.get(status, "InternalError")
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>injected by the test proxy</Message>"
        f"<Resource>{target.split('?', 1)[0]}</Resource><RequestId>proxy</RequestId></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {0 if head_only else len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head if head_only else head + body


class _Closed(Exception):
    """The connection ended (peer gone, or a fault ended it): stop serving it."""


def _parse_headers(lines: list[bytes]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(b":")
        out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return out


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """Bytes up to and including the blank line; None at a clean EOF before any byte."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise _Closed from exc
        return None
    except (asyncio.LimitOverrunError, ConnectionError) as exc:
        raise _Closed from exc


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0) instead of an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Body:
    """Forwards a response body to the client, applying a body fault rule once its byte budget is used."""

    def __init__(self, proxy: FaultProxy, cwriter: asyncio.StreamWriter, creader: asyncio.StreamReader,
                 rec: Request, rule: Rule | None) -> None:
        self.proxy, self.cwriter, self.creader, self.rec, self.rule = proxy, cwriter, creader, rec, rule
        self.budget = rule.after if rule is not None and rule.after is not None else None

    async def send(self, data: bytes, payload: int) -> None:
        """Forward ``data`` (of which ``payload`` bytes are body content, the rest chunk framing)."""
        if self.budget is not None and len(data) >= self.budget:
            cut, self.budget = self.budget, 0
            if cut:
                self.rec.body_bytes += min(cut, payload)  # counted first: a client that has the bytes sees them counted
                self.cwriter.write(data[:cut])
            await self._fire()
        self.rec.body_bytes += payload
        self.cwriter.write(data)
        if self.budget is not None:
            self.budget -= len(data)
        if self.cwriter.transport.get_write_buffer_size() > _WRITE_HIGH:
            await self.cwriter.drain()

    async def _fire(self) -> None:
        assert self.rule is not None
        kind = self.rule.kind
        if kind == "reset":
            with contextlib.suppress(ConnectionError):
                await self.cwriter.drain()  # the bytes before the cut leave; then the RST
            _reset(self.cwriter)
        elif kind == "truncate":
            with contextlib.suppress(ConnectionError):
                await self.cwriter.drain()
            self.cwriter.close()
        else:  # stall
            with contextlib.suppress(ConnectionError):
                await self.cwriter.drain()
            await self.proxy._hold(self.creader)
            _reset(self.cwriter)
        raise _Closed


class FaultProxy:
    """See the module documentation. ``upstream``: the server's base URL, e.g. ``http://127.0.0.1:5000``."""

    def __init__(self, upstream: str, *, host: str = "127.0.0.1", port: int = 0, latency: float = 0.0,
                 record: bool = True) -> None:
        u = urlsplit(upstream)
        if u.scheme != "http" or not u.hostname or not u.port:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = (u.hostname, u.port)
        self.host, self.port = host, port
        self.latency = latency
        self.record = record
        self._rules: list[Rule] = []
        self._log: list[Request] = []
        self._lock = threading.Lock()
        self._connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping: asyncio.Event | None = None
        self._gate: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # ------------------------------------------------------------------------------- life cycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, name=f"fault-proxy->{self.upstream[1]}", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError(f"proxy failed to start: {self._error!r}") from self._error
        if not self._ready.is_set():
            raise RuntimeError("proxy did not start within 30 s")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(30)
        thread.join(30)
        self._thread = None
        self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._listen())
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _listen(self) -> None:
        self._stopping = asyncio.Event()
        self._gate = asyncio.Event()
        self._gate.set()
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=_HEAD_LIMIT, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        assert self._stopping is not None and self._server is not None and self._loop is not None
        self._stopping.set()
        assert self._gate is not None
        self._gate.set()
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        self._loop.call_soon(self._loop.stop)

    def hold(self) -> None:
        """From now on, requests are recorded as they arrive but wait, unanswered, until :meth:`release`
        (so a test can make requests overlap for certain)."""
        self._call(lambda: self._gate.clear())  # type: ignore[union-attr]

    def release(self) -> None:
        """Let the held requests (and all later ones) go on."""
        self._call(lambda: self._gate.set())  # type: ignore[union-attr]

    def _call(self, fn: Callable[[], None]) -> None:
        if self._loop is None:
            raise RuntimeError("the proxy is not running")

        async def run() -> None:
            fn()

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)

    # ------------------------------------------------------------------------------------ faults

    def _add(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def fail(self, times: int | None = 1, status: int = 503, *, method: str | None = None, path: str | None = None,
             where: Match | None = None) -> Rule:
        """Answer ``times`` matching requests with ``status`` (an S3 XML error) without forwarding them."""
        return self._add(Rule("fail", times, status=status, method=method, path=path, where=where))

    def forbid(self, times: int | None = None, *, method: str | None = None, path: str | None = None,
               where: Match | None = None) -> Rule:
        """Answer matching requests with 403 AccessDenied (default: every one until cleared)."""
        return self._add(Rule("forbid", times, status=403, method=method, path=path, where=where))

    def reset(self, times: int | None = 1, *, after: int | None = None, method: str | None = None,
              path: str | None = None, where: Match | None = None) -> Rule:
        """Reset the connection (TCP RST) at the request, or after ``after`` response body bytes."""
        return self._add(Rule("reset", times, after=after, method=method, path=path, where=where))

    def lose(self, times: int | None = 1, *, method: str | None = None, path: str | None = None,
             where: Match | None = None) -> Rule:
        """Forward matching requests, then reset the connection instead of passing the server's answer on."""
        return self._add(Rule("lose", times, method=method, path=path, where=where))

    def truncate(self, times: int | None = 1, *, after: int = 0, method: str | None = None,
                 path: str | None = None, where: Match | None = None) -> Rule:
        """Forward the head and ``after`` body bytes of matching responses, then close the connection."""
        return self._add(Rule("truncate", times, after=after, method=method, path=path, where=where))

    def stall(self, times: int | None = 1, *, after: int | None = None, method: str | None = None,
              path: str | None = None, where: Match | None = None) -> Rule:
        """Never answer (or stop after the head and ``after`` body bytes) until the client gives up."""
        return self._add(Rule("stall", times, after=after, method=method, path=path, where=where))

    def clear_faults(self) -> None:
        """Remove every rule (latency stays)."""
        with self._lock:
            self._rules.clear()

    def _take(self, req: Request, on_body: bool, body_len: int | None = None) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.on_body != on_body or not rule.matches(req):
                    continue
                if on_body:
                    after = rule.after or 0
                    if body_len is not None and body_len <= after:
                        continue
                rule.hits += 1
                req.fault = rule.kind
                return rule
        return None

    # ----------------------------------------------------------------------------------- records

    @property
    def requests(self) -> list[Request]:
        """The requests recorded since the last :meth:`clear_log`, in arrival order (a copy)."""
        with self._lock:
            return list(self._log)

    @property
    def connections(self) -> int:
        """Client connections accepted so far."""
        return self._connections

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def count(self, method: str | None = None, path: str | None = None, status: int | None = None,
              where: Match | None = None) -> int:
        """Recorded requests with this method, ``path`` in their target, this final status, ``where`` true."""
        return len(self.select(method, path, status, where))

    def select(self, method: str | None = None, path: str | None = None, status: int | None = None,
               where: Match | None = None) -> list[Request]:
        return [
            r for r in self.requests
            if (method is None or r.method == method.upper()) and (path is None or path in r.target)
            and (status is None or r.status == status) and (where is None or where(r))
        ]

    def round_trips(self, requests: Iterable[Request] | None = None) -> int:
        """Longest chain of (recorded, or given) requests each starting after the previous one ended."""
        return len(self.waves(requests))

    def waves(self, requests: Iterable[Request] | None = None) -> list[list[Request]]:
        """Requests grouped by the length of the longest start-after-end chain ending in each (see above).

        A request still in flight counts as ending now."""
        reqs = list(self.requests if requests is None else requests)
        now = time.monotonic()
        events = []
        for k, r in enumerate(reqs):
            events.append((r.start, 1, k))
            events.append((r.end if r.end is not None else now, 0, k))  # ends sort before starts at a tie
        events.sort()
        depth = [0] * len(reqs)
        best = 0
        for _, is_start, k in events:
            if is_start:
                depth[k] = best + 1
            else:
                best = max(best, depth[k])
        out: list[list[Request]] = [[] for _ in range(max(depth, default=0))]
        for k, r in enumerate(reqs):
            out[depth[k] - 1].append(r)
        return out

    # ------------------------------------------------------------------------------- connections

    async def _hold(self, creader: asyncio.StreamReader) -> None:
        """Wait until the client closes its side or the proxy stops (what a stalled server does)."""
        assert self._stopping is not None
        stop = asyncio.ensure_future(self._stopping.wait())

        async def drain_client() -> None:
            with contextlib.suppress(ConnectionError):
                while await creader.read(CHUNK):
                    pass

        client = asyncio.ensure_future(drain_client())
        try:
            await asyncio.wait([stop, client], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            client.cancel()

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        cwriter.transport.set_write_buffer_limits(high=_WRITE_HIGH)
        self._connections += 1
        conn = self._connections
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                head = await _read_head(creader)
                if head is None:
                    break
                up = await self._one(head, creader, cwriter, up, conn)
        except (_Closed, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]
            # a connection still open when the proxy stopped is closed here by the garbage collector, after
            # its event loop was closed: aborting then raises "Event loop is closed", and there is nothing
            # left to abort
            with contextlib.suppress(RuntimeError):
                if up is not None:
                    up[1].transport.abort()
                if not cwriter.transport.is_closing():
                    cwriter.transport.abort()

    async def _one(self, head: bytes, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter,
                   up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
                   conn: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Serve one request whose head was read; returns the upstream connection to keep (None: closed)."""
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].decode("latin-1").split(" ")
        if len(parts) != 3:
            raise _Closed
        method, target, _version = parts
        headers = _parse_headers(lines[1:])
        rec = Request(method=method, target=target, headers=headers, start=time.monotonic(), connection=conn)
        if self.record:
            with self._lock:
                self._log.append(rec)
        try:
            return await self._answer(rec, head, creader, cwriter, up)
        finally:
            if rec.end is None:
                rec.end = time.monotonic()

    async def _answer(self, rec: Request, head: bytes, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter,
                      up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        headers = rec.headers
        expects = headers.get("expect", "").lower() == "100-continue"
        assert self._gate is not None
        if not self._gate.is_set():
            await self._gate.wait()
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        rule = self._take(rec, on_body=False)
        lose = rule is not None and rule.kind == "lose"
        if rule is not None and not lose:
            if rule.kind in ("fail", "forbid"):
                if not expects:  # read the body, else closing with unread data would reset the client
                    await _copy_request_body(creader, None, headers)
                rec.status = rule.status
                rec.end = time.monotonic()  # before the client can have the answer
                cwriter.write(_error_response(rule.status, rec.target, rec.method == "HEAD"))
                with contextlib.suppress(ConnectionError):
                    await cwriter.drain()
                cwriter.close()
                raise _Closed
            if rule.kind == "reset":
                _reset(cwriter)
                raise _Closed
            await self._hold(creader)  # stall
            raise _Closed

        bodiless = headers.get("content-length", "0").strip() == "0" and "transfer-encoding" not in headers
        for attempt in range(2):
            reused = up is not None
            if up is not None and up[0].at_eof():
                up[1].transport.abort()
                up, reused = None, False
            if up is None:
                try:
                    up = await asyncio.open_connection(*self.upstream, limit=_HEAD_LIMIT)
                except OSError:
                    return await self._bad_gateway(rec, cwriter)
                up[1].transport.set_write_buffer_limits(high=_WRITE_HIGH)
            ureader, uwriter = up
            uwriter.write(head)
            pump = None
            if not bodiless:
                pump = asyncio.ensure_future(_copy_request_body(creader, uwriter, headers))
                pump.add_done_callback(_abort_on_error(uwriter))  # a client gone mid-upload ends the request
            try:
                rhead = await _read_head(ureader)
            except _Closed:
                rhead = None
            if rhead is None:
                uwriter.transport.abort()
                up = None
                if pump is not None:
                    pump.cancel()
                if reused and bodiless and attempt == 0:
                    continue  # the server closed an idle connection as we reused it: one fresh try
                return await self._bad_gateway(rec, cwriter)
            break
        else:  # pragma: no cover - the loop always breaks or returns
            raise _Closed

        while True:
            status = int(rhead.split(b" ", 2)[1])
            if 100 <= status < 200 and status != 101:
                cwriter.write(rhead)
                await cwriter.drain()
                rhead = await _read_head(ureader)
                if rhead is None:
                    raise _Closed
                continue
            break
        rec.status = status
        if lose:
            uwriter.transport.abort()
            _reset(cwriter)
            raise _Closed
        rheaders = _parse_headers(rhead[:-4].split(b"\r\n")[1:])
        close_after = (
            rheaders.get("connection", "").lower() == "close" or rhead.startswith(b"HTTP/1.0")
            or "close" in headers.get("connection", "").lower()
        )
        if rec.method == "HEAD" or status in (204, 304):
            framing, length = "none", 0
        elif "chunked" in rheaders.get("transfer-encoding", "").lower():
            framing, length = "chunked", None
        elif "content-length" in rheaders:
            framing, length = "length", int(rheaders["content-length"])
        else:
            framing, length, close_after = "eof", None, True
        body_rule = None if framing == "none" else self._take(rec, on_body=True, body_len=length)
        if framing == "none" or length == 0:
            rec.end = time.monotonic()
        cwriter.write(rhead)
        body = _Body(self, cwriter, creader, rec, body_rule)
        try:
            if framing == "length":
                assert length is not None
                remaining = length
                while remaining:
                    data = await ureader.read(min(CHUNK, remaining))
                    if not data:
                        raise _Closed  # the server cut its body short: so does the proxy
                    remaining -= len(data)
                    if not remaining and body_rule is None:
                        rec.end = time.monotonic()
                    await body.send(data, len(data))
            elif framing == "chunked":
                await _copy_chunked(ureader, body, rec if body_rule is None else None)
            elif framing == "eof":
                while data := await ureader.read(CHUNK):
                    await body.send(data, len(data))
            await cwriter.drain()
        except BaseException:
            uwriter.transport.abort()
            if pump is not None:
                pump.cancel()
            raise
        if pump is not None:
            if not pump.done():  # the server answered before reading the whole body (e.g. an error)
                pump.cancel()
                close_after = True
            elif pump.exception() is not None:
                close_after = True
        if close_after:
            uwriter.transport.abort()
            cwriter.close()
            raise _Closed
        return up

    async def _bad_gateway(self, rec: Request, cwriter: asyncio.StreamWriter) -> None:
        rec.status = 502
        rec.end = time.monotonic()
        cwriter.write(_error_response(502, rec.target, rec.method == "HEAD"))
        with contextlib.suppress(ConnectionError):
            await cwriter.drain()
        cwriter.close()
        raise _Closed


def _abort_on_error(writer: asyncio.StreamWriter) -> Callable[[asyncio.Future[None]], None]:
    def done(fut: asyncio.Future[None]) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            writer.transport.abort()

    return done


async def _copy_request_body(creader: asyncio.StreamReader, uwriter: asyncio.StreamWriter | None,
                             headers: dict[str, str]) -> None:
    """Forward (or, with ``uwriter`` None, discard) a request body framed by ``headers``."""

    class _Sink:
        async def send(self, data: bytes, payload: int) -> None:
            if uwriter is not None:
                uwriter.write(data)
                if uwriter.transport.get_write_buffer_size() > _WRITE_HIGH:
                    await uwriter.drain()

    sink = _Sink()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        await _copy_chunked(creader, sink)
    else:
        remaining = int(headers.get("content-length", "0") or 0)
        while remaining:
            data = await creader.read(min(CHUNK, remaining))
            if not data:
                raise _Closed
            remaining -= len(data)
            await sink.send(data, len(data))
    if uwriter is not None:
        await uwriter.drain()


async def _copy_chunked(reader: asyncio.StreamReader, sink: _Body | object, rec: Request | None = None) -> None:
    """Forward a chunked body with its framing (chunk-size lines, data, trailers) unchanged; ``rec``'s
    end is set before the blank line that completes it."""
    send = sink.send  # type: ignore[attr-defined]
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise _Closed from exc
        size = int(line.split(b";", 1)[0].strip(), 16)
        await send(line, 0)
        if size == 0:
            while True:  # trailers, then the blank line
                try:
                    t = await reader.readuntil(b"\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                    raise _Closed from exc
                if t == b"\r\n" and rec is not None:
                    rec.end = time.monotonic()
                await send(t, 0)
                if t == b"\r\n":
                    return
        remaining = size + 2  # data and its CRLF
        while remaining:
            data = await reader.read(min(CHUNK, remaining))
            if not data:
                raise _Closed
            payload = max(0, min(len(data), remaining - 2))
            remaining -= len(data)
            await send(data, payload)


def main(argv: list[str] | None = None) -> int:
    """Run a proxy until interrupted; prints ``http://host:port`` on the first line of stdout."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--upstream", required=True, help="the server's base URL, http://host:port")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    args = ap.parse_args(argv)
    proxy = FaultProxy(args.upstream, host=args.host, port=args.port, latency=args.latency, record=False)
    proxy.start()
    print(proxy.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
