"""Range answers received straight into the reader's memory: a small HTTP/1.1 client for large ranges.

obstore hands every answer over in a buffer of its own, and a reader that keeps the bytes copies them
once more. :class:`DirectReader` receives each body with ``recv_into`` into its place: the kernel's copy
is the only one. It serves a read-once epoch's runs (:mod:`seqstore.store.read.stream`) and the node
cache's waves of small ranges (:class:`~seqstore.io.remote_fetch.DirectWaves`), at about a quarter of
obstore's CPU a request. It speaks ``GET`` with ``Range`` (and ``If-Match`` where the store pins versions)
over keep-alive HTTP/1.1 connections, plain or TLS, driven by one selector loop on its own thread; an
answer must carry a ``Content-Length`` and be a 206 of the range asked for (or a 200 of exactly those
bytes), of the version asked for where it names its ``ETag``. URLs come from ``ObjectClient.direct``
(plain, or presigned by obstore); other stores are read through obstore. Each connection asks for a
4 MiB ``SO_RCVBUF`` where ``net.core.rmem_max`` allows at least 1 MiB, so a body of a few MiB arrives
in a read or two (docs/remote.md, "Read-once epochs").

Failures follow the object client's rules (:mod:`seqstore.io.objects`; docs/remote.md, "Failures"):
5xx, 408 and 429, a connection refused, reset or closed, a body cut short, no progress for ``timeout``
seconds (``connect_timeout`` while connecting) or an answer slower than 64 KiB/s on average after its
first ``timeout`` seconds are retried under the client's policy, then raised as a RemoteError naming the
URL and the attempts; other statuses as :meth:`.object_links.Job.status_error` says. A presigned URL that
is refused (400, 401, 403: the temporary credentials it was signed with may have expired since) is first
signed anew by the client and asked once more. Messages never show a presigned URL's query (its signature).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import heapq
import itertools
import os
import re
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from ..errors import RemoteError, StaleStoreError
from .object_common import encoding_refused, error_at
from .object_links import Conn, Job, Lookups, Wave, overdue, quiet, receive_buffer, reset_in_child
from .retry import Attempts, Transient

__all__ = ["DirectReader", "receive_buffer"]

_HEAD_MOST = 64 << 10  # bytes of status line and headers an answer may have
_HEAD_END = re.compile(rb"\r?\n\r?\n")  # the end of an answer's head
_TICK = 0.1  # seconds between checks of the requests' deadlines
_IDLE_END = 30.0  # seconds without a request after which the loop thread ends (and its connections)
_LEAST_RATE = 64 << 10  # bytes/s an answer must average (after its first ``timeout`` seconds): no trickle holds it


class DirectReader:
    """Range GETs of ``client``'s objects (an :class:`~seqstore.io.objects.ObjectClient`: its timeouts,
    retry budget and ``max_requests``, the connections this reader keeps at most) received into the
    caller's buffers. Thread-safe; its loop thread starts with the first request and is a daemon."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.most = int(client.max_requests)
        self._lock = threading.Lock()
        self._queue: deque[Job] = deque()  # jobs to start, in order
        self._active: set[Conn] = set()  # connections carrying a request
        self._later: list[tuple[float, int, Job]] = []  # (when, n, job): retries waiting out their backoff
        self._count = itertools.count()
        self._idle: dict[tuple[str, int, bool], list[Conn]] = {}
        self._open = 0
        self._addr: dict[tuple[str, int], list[Any]] = {}  # (host, port) -> addresses not yet found refusing
        self._parked: dict[tuple[str, int], list[tuple[float, Job]]] = {}  # (deadline, job)s awaiting a lookup
        self._lookups = Lookups(self._looked_up)
        self._ssl: ssl.SSLContext | None = None
        self._thread: threading.Thread | None = None
        self._pid = -1
        self._sel: selectors.BaseSelector  # these three made as the loop thread starts
        self._wake_r: socket.socket
        self._wake_w: socket.socket
        self._rcvbuf = receive_buffer()
        reset_in_child(self)

    def reset_after_fork(self) -> None:
        """In a forked child: a free lock (the loop thread may have held it) and none of the parent's jobs."""
        self._lock, self._queue = threading.Lock(), deque()

    # ----------------------------------------------------------------------------------- public

    def submit(
        self, requests: Sequence[tuple[str, int, int, str | None, memoryview]]
    ) -> concurrent.futures.Future[None]:
        """Start ``(url, start, end, if_match, dest)`` requests: bytes ``[start, end)`` of ``url`` into
        ``dest`` (``end - start`` bytes, writable). Returns a future that ends when every body is in,
        or with the first request's error (the others are then dropped)."""
        wave = Wave(len(requests))
        if not requests:
            wave.future.set_result(None)
            return wave.future
        jobs = []
        for url, a, b, etag, dest in requests:
            if len(dest) != b - a or b <= a:
                raise ValueError(f"{url}: a direct read of bytes [{a}, {b}) needs a buffer of {b - a} bytes, "
                                 f"got {len(dest)}")
            jobs.append(Job(url, a, b, etag, dest, wave))
        with self._lock:  # the loop cannot decide to end between these two steps
            self._queue.extend(jobs)
            self._start_thread()
        self._wake()
        return wave.future

    # ----------------------------------------------------------------------------------- loop

    def _start_thread(self) -> None:
        """Start the loop thread unless it runs in this process (called with ``_lock`` held)."""
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            return
        if self._pid not in (-1, os.getpid()):  # used in a forked child: the parent's connections are not its own
            self._later, self._idle, self._open, self._active = [], {}, 0, set()
            self._parked, self._lookups = {}, Lookups(self._looked_up)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._loop, name="seqstore-direct", daemon=True)
        self._thread.start()

    def _end_thread(self) -> bool:
        """The loop's end after ``_IDLE_END`` seconds without work: its connections closed, its thread
        gone until the next request (a client that is dropped leaves nothing running)."""
        with self._lock:
            if self._queue or self._later or self._active or self._parked:
                return False
            self._shut([c for conns in self._idle.values() for c in conns])
            return True

    def _shut(self, conns: list[Conn]) -> None:
        """Close ``conns`` (the idle ones among them forgotten), the selector and the wake sockets: the loop
        thread ends (called with ``_lock`` held)."""
        for c in conns:
            self._close(c, None)
        self._idle = {}
        for s in (self._sel, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()
        self._thread = None

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a wake is pending already (or the loop ended on an error: closed)
            self._wake_w.send(b"x")

    def _looked_up(self) -> None:
        """A lookup ended (called in its thread): the loop takes it (if the loop ended, its next start)."""
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                self._wake()

    def _loop(self) -> None:
        """The loop; where it ends on an unexpected error, each request it had fails with a RemoteError naming
        that error (none waits for ever), its connections are closed, and the next request starts it anew."""
        try:
            self._run()
            return
        except BaseException as exc:  # noqa: BLE001 - raised to the callers of the requests it carried
            what = f"the direct reader's loop ended on {type(exc).__name__}: {exc} (the next request starts it again)"
        with self._lock:
            jobs = [*self._queue, *(j for _, _, j in self._later), *(j for p in self._parked.values() for _, j in p),
                    *(c.job for c in self._active if c.job is not None)]
            self._shut([*self._active, *(c for conns in self._idle.values() for c in conns)])
            self._queue.clear()
            self._active.clear()
            self._later, self._parked = [], {}
        for job in jobs:
            if not job.wave.future.done():
                job.wave.future.set_exception(job.error(what))

    def _run(self) -> None:
        sel = self._sel
        active = self._active
        scanned = busy = time.monotonic()
        while True:
            # deadlines are checked every _TICK seconds, not on every wake (a wave keeps dozens of
            # connections busy and wakes this loop for every piece of every body)
            wait = _TICK
            if self._later:
                wait = min(wait, max(0.0, self._later[0][0] - time.monotonic()))
            for key, _ in sel.select(wait):
                c = key.data
                if c is None:
                    with contextlib.suppress(BlockingIOError):
                        self._wake_r.recv(4096)
                    continue
                try:
                    self._step(c, active)
                except Exception as exc:  # noqa: BLE001 - a bug here must not end the loop (every wait would stall)
                    self._give_up(c, active, _error(c, f"the direct reader failed: {type(exc).__name__}: {exc} "
                                                        "(a seqstore bug; please report it)"))
            now = time.monotonic()
            if now - scanned >= _TICK:
                scanned = now
                for c in [c for c in active if c.deadline <= now]:
                    self._fail(c, active, overdue(c, self.client.timeout, self.client.connect_timeout, _LEAST_RATE))
                self._overdue(now)
            for name, got in self._lookups.take().items():
                self._found(name, got)
            while self._later and self._later[0][0] <= now:
                job = heapq.heappop(self._later)[2]
                with self._lock:
                    self._queue.appendleft(job)
            if self._queue:
                self._start(active)
            if self._queue or self._later or active or self._parked:
                busy = now
            elif now - busy > _IDLE_END and self._end_thread():
                return

    def _start(self, active: set[Conn]) -> None:
        """Give queued jobs connections: an idle one to their origin, else a new one while fewer than
        ``most`` are open (an idle one to another origin is closed to make room)."""
        while True:
            with self._lock:
                if not self._queue:
                    return
                job = self._queue[0]
                if job.wave.future.done():  # its wave failed: dropped
                    self._queue.popleft()
                    continue
                idle = self._idle.get(job.origin)
                while idle and not quiet(idle[-1].sock):  # stray bytes, or closed: no answer to this job comes on it
                    self._close(idle.pop(), None)
                if not idle and self._open >= self.most:
                    other = next((v for v in self._idle.values() if v), None)
                    if other is None:
                        return  # every connection busy
                    self._close(other.pop(), None)
                self._queue.popleft()
            if idle:
                c = idle.pop()
                c.reused = True
                self._ask(c, job, active)
            elif not self._addr.get(job.origin[:2]):  # its host's name looked up first, in a thread
                deadline = time.monotonic() + self.client.connect_timeout
                self._parked.setdefault(job.origin[:2], []).append((deadline, job))
                self._lookups.start(job.origin[:2])
            else:
                try:
                    c = self._connect(job.origin)
                except OSError as exc:
                    self._retry(job, Transient(f"cannot connect: {exc}"))
                    continue
                c.job = job
                c.deadline = time.monotonic() + self.client.connect_timeout
                active.add(c)
                self._register(c, selectors.EVENT_WRITE)

    def _found(self, name: tuple[str, int], got: list[Any] | BaseException) -> None:
        """The lookup of ``name`` ended: the requests parked for it go first in the queue, or fail as it did."""
        jobs = [job for _, job in self._parked.pop(name, [])]
        if isinstance(got, list) and got:
            self._addr[name] = got
            with self._lock:
                self._queue.extendleft(reversed(jobs))
            return
        for job in jobs:
            if job.wave.future.done():  # its wave failed meanwhile: dropped
                continue
            if isinstance(got, ValueError):  # a host name the resolver refuses (UnicodeError): no retry helps
                self._end_wave(job.wave, job.error(f"cannot connect: not a host name: {got}"))
            else:
                self._retry(job, Transient(f"cannot connect: {got or 'the name has no address'}"))

    def _overdue(self, now: float) -> None:
        """Requests that waited ``connect_timeout`` for their host's lookup fail as a connection that timed
        out (retried; the lookup goes on, and a retry waits for it again)."""
        for name, parked in list(self._parked.items()):
            while parked and parked[0][0] <= now:
                self._retry(parked.pop(0)[1], Transient(f"cannot connect: no answer from the resolver for {name[0]} "
                                                        f"within {self.client.connect_timeout:g} s"))
            if not parked:
                self._parked.pop(name, None)  # (a failed wave's _end_wave may have taken it)

    def _connect(self, origin: tuple[str, int, bool]) -> Conn:
        addr = self._addr[origin[:2]][0]
        sock = socket.socket(addr[0], addr[1], addr[2])
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._rcvbuf:  # before connecting: the window scale is agreed on in the handshake
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._rcvbuf)
            err = sock.connect_ex(addr[3])
        except BaseException:
            sock.close()
            raise
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            self._refused(origin, addr)
            raise OSError(err, os.strerror(err))
        self._open += 1
        return Conn(sock, origin, addr)

    def _refused(self, origin: tuple[str, int, bool], addr: Any) -> None:
        """A connection to ``addr``, an address of ``origin``'s host, failed: the next one goes to the host's
        next address (a dual-stack name whose IPv6 address nothing listens on); after the last, the name
        is looked up again (it may name another address now)."""
        addrs = self._addr.get(origin[:2])
        if addrs is not None and addr in addrs:
            addrs.remove(addr)
            if not addrs:
                del self._addr[origin[:2]]

    def _register(self, c: Conn, events: int) -> None:
        try:
            self._sel.modify(c.sock, events, c)
        except (KeyError, ValueError):
            self._sel.register(c.sock, events, c)

    def _wait(self, c: Conn, exc: OSError) -> None:
        """Wait for ``c``'s socket to be readable (TLS wants to read: ``exc``) or else writable."""
        self._register(c, selectors.EVENT_READ if isinstance(exc, ssl.SSLWantReadError) else selectors.EVENT_WRITE)

    def _close(self, c: Conn, active: set[Conn] | None) -> None:
        """Close ``c`` (once: a connection its failed wave closed may still be met in the same round)."""
        if active is not None:
            active.discard(c)
        if c.state == "closed":
            return
        c.state = "closed"
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(c.sock)
        with contextlib.suppress(OSError):
            c.sock.close()
        self._open -= 1

    def _ask(self, c: Conn, job: Job, active: set[Conn]) -> None:
        host, port, tls = job.origin
        host = f"[{host}]" if ":" in host else host  # an IPv6 address
        hostport = host if port == (443 if tls else 80) else f"{host}:{port}"
        lines = [f"GET {job.target} HTTP/1.1", f"Host: {hostport}", f"Range: bytes={job.start}-{job.end - 1}",
                 "User-Agent: seqstore", "Accept-Encoding: identity"]
        if job.etag:
            lines.append(f"If-Match: {job.etag}")
        c.job, c.head, c.pos, c.want, c.heard = job, b"", -1, job.end - job.start, False
        c.out = ("\r\n".join(lines) + "\r\n\r\n").encode()
        c.state = "send"
        c.deadline = time.monotonic() + self.client.timeout
        c.cap = c.deadline + c.want / _LEAST_RATE
        active.add(c)
        self._send(c, active)

    # ----------------------------------------------------------------------------------- a step

    def _step(self, c: Conn, active: set[Conn]) -> None:
        if c.job is None:  # an event of a connection closed earlier in the same round (its wave failed)
            return
        try:
            if c.state == "connecting":
                if err := c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    raise Transient(f"cannot connect: {os.strerror(err)}")
                if not c.origin[2]:
                    self._ask(c, c.job, active)
                    return
                if self._ssl is None:
                    self._ssl = ssl.create_default_context()
                c.sock = self._ssl.wrap_socket(c.sock, server_hostname=c.origin[0], do_handshake_on_connect=False)
                c.state = "handshake"
            if c.state == "handshake":
                try:
                    c.sock.do_handshake()
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError) as exc:
                    self._wait(c, exc)
                    return
                self._ask(c, c.job, active)
            elif c.state == "send":
                self._send(c, active)
            else:
                self._receive(c, active)
        except ssl.SSLCertVerificationError as exc:  # not worth another attempt
            self._give_up(c, active, _error(c, f"the server's TLS certificate was refused: {exc}"))
        except (Transient, OSError, ssl.SSLError) as exc:
            self._fail(c, active, exc)
        except RemoteError as exc:
            self._give_up(c, active, exc)

    def _send(self, c: Conn, active: set[Conn]) -> None:
        try:
            while c.out:
                n = c.sock.send(c.out)
                c.out = c.out[n:]
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError) as exc:
            self._wait(c, exc)
            return
        except (OSError, ssl.SSLError) as exc:
            self._fail(c, active, exc)
            return
        c.state = "head"
        self._register(c, selectors.EVENT_READ)

    def _receive(self, c: Conn, active: set[Conn]) -> None:
        """Take what the socket has of the answer: one read per readiness event (a second would mostly
        find nothing: one more system call and exception per piece), more while TLS holds decrypted
        bytes the selector cannot see."""
        job = c.job
        assert job is not None
        while True:
            try:
                if c.pos < 0:
                    got = c.sock.recv(65536)
                    if not got:
                        raise Transient("the connection closed before the answer")
                    c.head, c.heard = c.head + got, True
                    if not self._parse_head(c, job):
                        if c.origin[2] and c.sock.pending():
                            continue
                        return
                else:
                    n = c.sock.recv_into(job.dest[c.pos :])
                    if not n:
                        raise Transient(f"the connection closed after {c.pos} of {c.want} bytes of the body")
                    c.pos += n
            except (BlockingIOError, ssl.SSLWantReadError):
                return
            c.deadline = min(time.monotonic() + self.client.timeout, c.cap)
            if c.pos >= c.want:
                self._done(c, active)
                return
            if not (c.origin[2] and c.sock.pending()):
                return

    def _parse_head(self, c: Conn, job: Job) -> bool:
        """The status line and headers, once all arrived (False before); the body bytes after them go
        into place. Raises for an answer other than the range asked for. Interim (1xx) answers before
        it are skipped."""
        while True:
            end = _HEAD_END.search(c.head)  # (a bare LF ends a line too: RFC 9112, 2.2)
            if end is None:
                if len(c.head) > _HEAD_MOST:
                    raise job.error(f"an answer's headers are longer than {_HEAD_MOST} bytes")
                return False
            lines = re.split(r"\r?\n", c.head[: end.start()].decode("latin-1"))
            parts = lines[0].split(" ", 2)
            try:
                if not parts[0].startswith("HTTP/"):  # (bytes before it: not the start of an answer)
                    raise ValueError(parts[0])
                status = int(parts[1])
            except (IndexError, ValueError):
                raise Transient(f"not an HTTP answer: {lines[0][:80]!r}", answered=True) from None
            if not 100 <= status < 200 or status == 101:  # (101: a protocol switch, never asked for)
                break
            c.head = c.head[end.end() :]  # 100 Continue, 103 Early Hints: the answer follows
        headers: dict[str, str] = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            k, v = k.strip().lower(), v.strip()
            if k == "content-length" and headers.get(k, v) != v:  # which one frames the body? (RFC 9112, 6.3)
                raise job.error(f"the answer has two Content-Lengths, {headers[k][:40]!r} and {v[:40]!r}")
            headers[k] = v
        rest = c.head[end.end() :]
        c.head = b""
        c.close_after = headers.get("connection", "").lower() == "close" or parts[0] == "HTTP/1.0"
        size = job.end - job.start
        if status not in (200, 206):
            raise job.status_error(status, headers.get("retry-after"))
        tag = headers.get("etag")
        if job.etag and tag is not None and tag != job.etag:  # a server that ignores If-Match
            raise job.error(f"the answer is of another version of the object (ETag {tag}, expected {job.etag}): it "
                            "changed while the store was open (reopen it)", StaleStoreError)
        coding = headers.get("transfer-encoding", "identity").lower()
        if coding != "identity":  # (it, not a Content-Length, says where the body ends: RFC 9112, 6.3)
            raise job.error(f"the answer to a range request is sent in Transfer-Encoding {coding[:40]!r}, not "
                            f"as {size} bytes with a Content-Length")
        if refused := encoding_refused(headers.get("content-encoding")):
            raise job.error(refused)
        if "content-length" not in headers:
            raise job.error(f"the answer to a range request has no Content-Length (expected {size} bytes)")
        shown = headers["content-length"]
        if not (shown.isascii() and shown.isdigit()):
            raise job.error(f"the answer's Content-Length {shown[:40]!r} is not a byte count (expected {size})")
        length = int(shown)
        if status == 206:
            want = f"bytes {job.start}-{job.end - 1}/"
            if not headers.get("content-range", "").startswith(want) or length != size:
                raise job.error(f"asked for bytes {job.start}-{job.end - 1}, the answer is Content-Range "
                                f"{headers.get('content-range')!r}, Content-Length {length}")
        elif job.start != 0 or length != size:  # 200: the whole object, right only if that was asked for
            raise job.error(f"asked for bytes {job.start}-{job.end - 1}, the server answered 200 with {length} "
                            "bytes (it does not serve ranges)")
        take = min(len(rest), size)
        job.dest[:take] = rest[:take]
        c.pos = take
        if len(rest) > size:  # bytes past its Content-Length: never read as the next request's answer
            c.close_after = True
        return True

    # ----------------------------------------------------------------------------------- endings

    def _done(self, c: Conn, active: set[Conn]) -> None:
        job = c.job
        assert job is not None
        c.job = None
        active.discard(c)
        if c.close_after:
            self._close(c, None)
        else:
            self._sel.unregister(c.sock)
            with self._lock:
                self._idle.setdefault(c.origin, []).append(c)
        self.client.retry.ok()
        wave = job.wave
        wave.left -= 1
        if not wave.left and not wave.future.done():
            wave.future.set_result(None)

    def _fail(self, c: Conn, active: set[Conn], exc: BaseException) -> None:
        job = c.job
        answered = getattr(exc, "answered", False)  # (an error status: the server did answer on it)
        reused = c.reused and c.state in ("send", "head") and c.pos < 0 and not c.head and not answered
        if c.state == "head" and (c.pos >= 0 or c.head) and not answered:
            exc = Transient(str(exc), answered=True)  # bytes of an answer came: the endpoint is there
        if c.state == "connecting":  # the host's next address next time (or the name looked up again)
            self._refused(c.origin, c.addr)
        self._close(c, active)
        if job is None:
            return
        if reused:  # a kept-alive connection the server had closed: asked again at once, not a failure
            with self._lock:  # (timed out: dropped unheard by a middlebox, as those kept beside it may be)
                for dead in self._idle.pop(c.origin, []) if c.deadline <= time.monotonic() else []:
                    self._close(dead, None)
                self._queue.appendleft(job)
            return
        self._retry(job, exc)

    def _retry(self, job: Job, exc: BaseException) -> None:
        job.tries = job.tries or Attempts(self.client.retry, job.shown)
        try:
            delay = job.tries.failed(exc)
        except RemoteError as err:
            self._end_wave(job.wave, err)
            return
        heapq.heappush(self._later, (time.monotonic() + delay, next(self._count), job))

    def _give_up(self, c: Conn, active: set[Conn], exc: RemoteError) -> None:
        job = c.job
        self._close(c, active)
        self.client.retry.ok()  # a definite answer: the service is up
        if job is not None and not (job.refused and self._resign(job)):
            self._end_wave(job.wave, exc)

    def _resign(self, job: Job) -> bool:
        """The service refused ``job``'s presigned URL, signed with temporary credentials that may have
        expired since (they rotate; a URL is kept for up to 50 minutes): ask again, once, at a URL the
        client signs anew. False where it signs none."""
        if job.resigned:
            return False
        job.resigned = True
        try:
            url = self.client.resign(job.url)
        except Exception:  # noqa: BLE001 - no URL signed anew: the refusal is what to report
            return False
        if url is None:
            return False
        job.aim(url)
        with self._lock:
            self._queue.appendleft(job)
        return True

    def _end_wave(self, wave: Wave, exc: BaseException) -> None:
        """``wave`` failed: its future raises ``exc``; its requests still in flight stop writing into
        the caller's buffers (their connections closed), queued ones and those waiting
        for a lookup or a backoff are dropped."""
        if not wave.future.done():
            wave.future.set_exception(exc)
        for name, parked in list(self._parked.items()):  # those waiting for their host's lookup, or a backoff
            parked[:] = [p for p in parked if p[1].wave is not wave]
            if not parked:
                del self._parked[name]
        if any(job.wave is wave for _, _, job in self._later):
            self._later = [x for x in self._later if x[2].wave is not wave]
            heapq.heapify(self._later)
        for key in list(self._sel.get_map().values()):
            c = key.data
            if c is not None and c.job is not None and c.job.wave is wave:
                c.job = None
                self._close(c, self._active)


def _error(c: Conn, what: str) -> RemoteError:
    """A :class:`RemoteError` of the request ``c`` carries (or of its host, between requests): ``what`` happened."""
    return c.job.error(what) if c.job is not None else error_at(RemoteError, c.origin[0], what)
