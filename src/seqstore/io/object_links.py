"""The direct reader's parts below its loop (:mod:`.object_direct`): the requests of a wave, the connections
that carry them, the receive buffer each asks for, and host names looked up off the loop thread.

``getaddrinfo`` blocks for as long as the resolver takes (seconds to minutes where a DNS server does not
answer); on the reader's loop thread it held up every request in flight, their deadlines too.
:class:`Lookups` runs each lookup in a daemon thread of its own, one a name at a time, and tells the loop
when one ends; the loop parks the requests that wait for it, each for ``connect_timeout`` at most (a
lookup that never ends leaves its thread, not the requests, waiting).
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import ssl
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..errors import CredentialsError, RemoteError, RemoteNotFound, StaleStoreError
from .retry import Attempts, Transient, parse_retry_after

__all__ = ["Conn", "Job", "Lookups", "Wave", "overdue", "quiet", "receive_buffer", "reset_in_child"]

_RCVBUF = 4 << 20  # socket receive buffer asked for (see :mod:`.object_direct`)
_RCVBUF_LEAST = 1 << 20  # below this ``rmem_max`` the kernel's tuning of the buffer is left alone
_RETRIED = frozenset((408, 429))  # and every 5xx (docs/remote.md, "Failures"), as the other back ends
_IN_CHILD: weakref.WeakKeyDictionary[Any, tuple[str, ...]] = weakref.WeakKeyDictionary()


def reset_in_child(obj: Any, *locks: str) -> None:
    """In every child forked from now on: ``obj``'s attributes ``locks`` made new locks, or (none named)
    ``obj.reset_after_fork()`` called. A lock that a thread of the parent held at the fork (the loop's,
    another thread's opening an entry) would stay held for ever: the child has no such thread."""
    _IN_CHILD[obj] = locks


def _forked() -> None:
    for obj, locks in list(_IN_CHILD.items()):
        for name in locks:
            setattr(obj, name, threading.Lock())
        if not locks:
            obj.reset_after_fork()


if hasattr(os, "register_at_fork"):  # (not on Windows)
    os.register_at_fork(after_in_child=_forked)


def receive_buffer(path: str = "/proc/sys/net/core/rmem_max") -> int:
    """The ``SO_RCVBUF`` a connection asks for: ``min(4 MiB, rmem_max)``, or 0 (the kernel's tuning) when
    ``rmem_max`` is under 1 MiB or cannot be read."""
    try:
        with open(path) as f:
            most = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return min(_RCVBUF, most) if most >= _RCVBUF_LEAST else 0


def quiet(sock: Any) -> bool:
    """Whether nothing waits to be read on the kept-alive (non-blocking) ``sock``: no byte, no end (TLS: no
    application data). Bytes a server sent after its answer are no answer to the next request asked on it."""
    try:
        sock.recv(1)  # (a byte or the end: the connection is closed, not read on)
    except (BlockingIOError, ssl.SSLWantReadError):
        return True
    except OSError:
        pass
    return False


class Job:
    """One range request: bytes ``[start, end)`` of ``url`` into ``dest`` (a writable buffer of that size)."""

    __slots__ = ("url", "origin", "target", "shown", "start", "end", "etag", "dest", "wave", "tries", "resigned",
                 "refused")

    def __init__(self, url: str, start: int, end: int, etag: str | None, dest: memoryview, wave: Wave) -> None:
        self.aim(url)
        self.start, self.end, self.etag, self.dest, self.wave = start, end, etag, dest, wave
        self.tries: Attempts | None = None  # its failures so far (None: none)
        self.resigned = False  # its URL was signed anew once already (see DirectReader._resign)
        self.refused = False  # its presigned URL was refused (400, 401, 403): it may be asked again signed anew

    def aim(self, url: str) -> None:
        """Ask ``url`` (from now on)."""
        p = urlsplit(url)
        tls = p.scheme.lower() == "https"
        self.url = url
        self.origin = (p.hostname or "", p.port or (443 if tls else 80), tls)
        self.target = (p.path or "/") + (f"?{p.query}" if p.query else "")
        self.shown = f"{p.scheme}://{p.netloc}{p.path}"  # no query: a presigned URL's signature stays out

    def error(self, what: str, kind: type[RemoteError] = RemoteError) -> RemoteError:
        """The error ``kind`` of this request (its URL and attempts): ``what`` happened."""
        return kind(f"{self.shown}: {what}", url=self.shown, attempts=self.tries.n + 1 if self.tries else 1)

    def status_error(self, status: int, wait: str | None) -> Exception:
        """The error of an answer with ``status`` (not 200 or 206; ``wait``: its Retry-After): a
        :class:`Transient` one where it is retried, else the RemoteError that names it."""
        if status in _RETRIED or 500 <= status < 600:  # (the next try waits for a Retry-After)
            after = parse_retry_after(wait)
            return Transient(f"HTTP {status}" + (f", Retry-After {after:.0f} s" if after is not None else ""),
                             answered=True, retry_after=after)
        if status == 404:
            return self.error(f"HTTP {status}: no such object", RemoteNotFound)
        if status == 412:
            return self.error(f"HTTP {status}: the object changed since the store was opened (If-Match {self.etag} "
                              "no longer matches); reopen the store", StaleStoreError)
        # a presigned URL refused (S3: 400 ExpiredToken, 403; GCS: 400; Azure: 403): the temporary credentials
        # it was signed with may have expired since; it is asked once more, signed anew (DirectReader._resign)
        self.refused = status in (400, 401, 403) and "?" in self.target and not self.resigned
        if status in (401, 403):
            again = ", also at a URL signed anew" if self.resigned else ""
            return self.error(f"HTTP {status}: access refused{again} (check the credentials or the presigned URL)",
                              CredentialsError)
        return self.error(f"HTTP {status}: unexpected answer to a range request")


@dataclass(slots=True, eq=False)
class Wave:
    """The requests of one :meth:`DirectReader.submit`: its future ends when all are in, or at the first failure."""

    left: int
    future: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)


@dataclass(slots=True, eq=False)  # (eq=False: hashed by identity, kept in sets)
class Conn:
    """A connection and the request it carries (``job``); ``state``: connecting, handshake, send, head, body,
    closed."""

    sock: Any
    origin: tuple[str, int, bool]
    addr: Any = None  # the address of the origin's host it connects to
    state: str = "connecting"
    out: bytes = b""
    head: bytes = b""
    job: Job | None = None
    pos: int = 0
    want: int = 0
    deadline: float = 0.0
    cap: float = 0.0  # the latest the answer may end (a server that trickles it gets this long)
    reused: bool = False
    close_after: bool = False
    heard: bool = False  # bytes of an answer to the request it carries came


def overdue(c: Conn, timeout: float, connect_timeout: float, least_rate: int) -> Transient:
    """Why the request ``c`` carries ran past its deadline (``least_rate``: the bytes/s an answer must average)."""
    if c.state in ("connecting", "handshake"):
        return Transient(f"no progress for {connect_timeout:g} s connecting")
    if c.state == "head" and c.heard:  # (its bytes trickle, or interim answers come and never the answer)
        return Transient(f"the answer's status line and headers did not end within {timeout:g} s of the request "
                         "(bytes of them kept coming)", answered=True)
    if c.deadline >= c.cap:  # the cap, not a pause, ran out
        return Transient(f"the answer came slower than {least_rate >> 10} KiB/s")
    return Transient(f"no progress for {timeout:g} s waiting for its answer")


class Lookups:
    """Lookups of ``(host, port)`` names: :meth:`start` one (unless it runs), :meth:`take` those ended
    since (each its addresses, ``(family, type, proto, sockaddr)`` tuples, or the exception it raised);
    ``wake()`` is called from the lookup's thread when one ends."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._running: set[tuple[str, int]] = set()
        self._ended: dict[tuple[str, int], list[Any] | BaseException] = {}

    def start(self, name: tuple[str, int]) -> None:
        with self._lock:
            if name in self._running:
                return
            self._running.add(name)
        threading.Thread(target=self._run, args=(name,), name="seqstore-lookup", daemon=True).start()

    def take(self) -> dict[tuple[str, int], list[Any] | BaseException]:
        with self._lock:
            ended, self._ended = self._ended, {}
        return ended

    def _run(self, name: tuple[str, int]) -> None:
        got: list[Any] | BaseException
        try:
            found = socket.getaddrinfo(name[0], name[1], type=socket.SOCK_STREAM)
            got = [(family, kind, proto, sa) for family, kind, proto, _, sa in found]
        except Exception as exc:  # noqa: BLE001 - the loop fails or retries the requests that wait for it
            got = exc
        with self._lock:
            self._running.discard(name)
            self._ended[name] = got
        self._wake()
