"""A latency-adding, request-counting HTTP/1.1 proxy on loopback for ``bench/remote.py`` (threads, no asyncio).

``tests/support/proxy.py`` (the tests' fault proxy) adds latency and counts round trips too, but
forwards bodies through asyncio streams in 256 KiB pieces. This one forwards response bodies of 64 KiB
and more with ``splice(2)`` through a pipe (no copy into Python, the GIL released), smaller ones with
``recv_into`` / ``sendall``, from a thread per direction and connection, and parses only the heads.
``bench/remote.py`` measures both in front of its S3 server (group ``server``).

Per request: its head (and body) are read from the client, the request is recorded, and it is
forwarded to the server ``latency`` seconds after its head arrived (every request pays the latency
once, as a round trip to a distant server would; a new connection costs nothing extra, a response
is not delayed). Clients must not pipeline (obstore, boto3 and Lance's client do not).

Counting: every request is recorded (start = its head arrived, end = its response was forwarded
whole, bytes of the response body). **Round trips** are the length of the longest chain of requests
each of which started at or after the end of the one before: requests that overlap are one round
trip, a request sent only after another finished adds one (the definition ``tests/support/proxy.py``
uses). A request to ``/_proxy/stats`` returns the counts since the last ``/_proxy/reset`` as JSON
(``/_proxy/stats?log=1`` adds every request), answered by the proxy itself, not forwarded or counted.

Run: ``python -m bench._remote_proxy --upstream http://127.0.0.1:PORT --latency 0.02`` (prints its port).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

PIPE_BYTES = 1 << 20  # pipe size asked for splice (Linux's default pipe-max-size)
SPLICE_MIN = 64 << 10  # bodies from this size on are spliced, smaller ones copied
F_SETPIPE_SZ = 1031


class _Rec:
    __slots__ = ("method", "target", "range", "start", "end", "status", "body")

    def __init__(self, method: str, target: str, rng: str | None, start: float) -> None:
        self.method, self.target, self.range, self.start = method, target, rng, start
        self.end: float | None = None
        self.status = 0
        self.body = 0


def round_trips(recs: list[tuple[float, float]]) -> int:
    """Longest chain of (start, end) intervals, each starting at or after the previous one's end."""
    events = []
    for k, (s, e) in enumerate(recs):
        events.append((s, 1, k))
        events.append((e, 0, k))
    events.sort()
    depth = [0] * len(recs)
    best = 0
    for _, is_start, k in events:
        if is_start:
            depth[k] = best + 1
        else:
            best = max(best, depth[k])
    return max(depth, default=0)


class _Reader:
    """Buffered reads of a socket: heads by delimiter, bodies by count."""

    def __init__(self, sock: socket.socket, pipe: bool = False) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.pipe: tuple[int, int] | None = None
        if pipe and hasattr(os, "splice"):
            r, w = os.pipe()
            with contextlib.suppress(OSError):
                fcntl.fcntl(w, F_SETPIPE_SZ, PIPE_BYTES)
            self.pipe = (r, w)

    def close(self) -> None:
        if self.pipe is not None:
            for fd in self.pipe:
                os.close(fd)
            self.pipe = None

    def head(self) -> bytes | None:
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i >= 0:
                out = bytes(self.buf[: i + 4])
                del self.buf[: i + 4]
                return out
            got = self.sock.recv(65536)
            if not got:
                if self.buf.strip():
                    raise ConnectionError("connection closed inside a head")
                return None
            self.buf += got

    def line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                out = bytes(self.buf[: i + 2])
                del self.buf[: i + 2]
                return out
            got = self.sock.recv(65536)
            if not got:
                raise ConnectionError("connection closed inside a chunk line")
            self.buf += got

    def copy(self, n: int, dst: socket.socket, mv: memoryview) -> None:
        """Forward exactly ``n`` bytes to ``dst`` (buffered bytes first)."""
        if self.buf:
            k = min(n, len(self.buf))
            dst.sendall(self.buf[:k])
            del self.buf[:k]
            n -= k
        if n >= SPLICE_MIN and self.pipe is not None:
            self._splice(n, dst)
            return
        while n > 0:
            got = self.sock.recv_into(mv, min(n, len(mv)))
            if not got:
                raise ConnectionError("connection closed inside a body")
            dst.sendall(mv[:got])
            n -= got

    def _splice(self, n: int, dst: socket.socket) -> None:
        """Move ``n`` bytes from this socket to ``dst`` through a pipe with splice(2): no copy into
        Python, the GIL released during each call."""
        assert self.pipe is not None
        r, w = self.pipe
        src, out = self.sock.fileno(), dst.fileno()
        while n > 0:
            got = os.splice(src, w, min(n, PIPE_BYTES))
            if not got:
                raise ConnectionError("connection closed inside a body")
            n -= got
            while got:
                got -= os.splice(r, out, got)

    def copy_to_eof(self, dst: socket.socket, mv: memoryview) -> int:
        total = len(self.buf)
        if self.buf:
            dst.sendall(self.buf)
            self.buf.clear()
        while got := self.sock.recv_into(mv):
            dst.sendall(mv[:got])
            total += got
        return total


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head[:-4].decode("latin-1").split("\r\n")
    out: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        out[name.strip().lower()] = value.strip()
    return lines[0], out


class LatencyProxy:
    def __init__(self, upstream: str, latency: float, host: str = "127.0.0.1", port: int = 0) -> None:
        u = urlsplit(upstream)
        assert u.hostname and u.port
        self.upstream = (u.hostname, u.port)
        self.latency = latency
        self.lock = threading.Lock()
        self.log: list[_Rec] = []
        self.connections = 0
        self.listener = socket.create_server((host, port), backlog=1024)
        self.port = self.listener.getsockname()[1]

    def serve_forever(self) -> None:
        while True:
            c, _ = self.listener.accept()
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._client, args=(c,), daemon=True).start()

    # ------------------------------------------------------------------------------- control

    def _control(self, c: socket.socket, target: str) -> None:
        with self.lock:
            recs = list(self.log)
            if target.startswith("/_proxy/reset"):
                self.log.clear()
        done = [r for r in recs if r.end is not None]
        body: dict[str, Any] = {
            "requests": len(recs),
            "unfinished": len(recs) - len(done),
            "round_trips": round_trips([(r.start, r.end if r.end is not None else r.start) for r in recs]),
            "body_bytes": sum(r.body for r in recs),
            "by_method": dict(collections.Counter(r.method for r in recs)),
            "connections": self.connections,
            "span_s": (max(r.end for r in done) - min(r.start for r in recs)) if done else 0.0,
        }
        if "log=1" in target:
            t0 = min((r.start for r in recs), default=0.0)
            body["log"] = [
                [
                    r.method,
                    r.target,
                    r.range,
                    round(r.start - t0, 6),
                    None if r.end is None else round(r.end - t0, 6),
                    r.status,
                    r.body,
                ]
                for r in recs
            ]
        data = json.dumps(body).encode()
        c.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )

    # --------------------------------------------------------------------------- connections

    def _client(self, c: socket.socket) -> None:
        with self.lock:
            self.connections += 1
        up: socket.socket | None = None
        pending: collections.deque[_Rec] = collections.deque()
        creader = _Reader(c)
        mv = memoryview(bytearray(1 << 20))
        down: threading.Thread | None = None
        try:
            while True:
                head = creader.head()
                if head is None:
                    break
                t = time.monotonic()
                first, hdrs = _headers(head)
                method, target, _ = (first.split(" ") + ["", "", ""])[:3]
                if target.startswith("/_proxy/"):
                    self._control(c, target)
                    break
                rec = _Rec(method, target, hdrs.get("range"), t)
                with self.lock:
                    self.log.append(rec)
                if up is None:
                    up = socket.create_connection(self.upstream)
                    up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    down = threading.Thread(target=self._down, args=(up, c, pending), daemon=True)
                    down.start()
                pending.append(rec)
                wait = t + self.latency - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                up.sendall(head)
                if "chunked" in hdrs.get("transfer-encoding", "").lower():
                    while True:
                        line = creader.line()
                        up.sendall(line)
                        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                        if size == 0:
                            while (trailer := creader.line()) != b"\r\n":
                                up.sendall(trailer)
                            up.sendall(b"\r\n")
                            break
                        creader.copy(size + 2, up, mv)
                else:
                    creader.copy(int(hdrs.get("content-length", "0") or 0), up, mv)
        except (OSError, ConnectionError, ValueError):
            pass
        finally:
            if up is not None:
                with contextlib.suppress(OSError):
                    up.shutdown(socket.SHUT_WR)
            if down is not None:
                down.join(60)
            for s in (c, up):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.close()

    def _down(self, up: socket.socket, c: socket.socket, pending: collections.deque[_Rec]) -> None:
        ureader = _Reader(up, pipe=True)
        mv = memoryview(bytearray(1 << 20))
        try:
            while True:
                head = ureader.head()
                if head is None:
                    break
                first, hdrs = _headers(head)
                status = int(first.split(" ", 2)[1])
                c.sendall(head)
                if 100 <= status < 200:
                    continue
                rec = pending.popleft() if pending else None
                if rec is not None and rec.method == "HEAD" or status in (204, 304):
                    n = 0
                elif "chunked" in hdrs.get("transfer-encoding", "").lower():
                    n = 0
                    while True:
                        line = ureader.line()
                        c.sendall(line)
                        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                        if size == 0:
                            while (trailer := ureader.line()) != b"\r\n":
                                c.sendall(trailer)
                            c.sendall(b"\r\n")
                            break
                        ureader.copy(size + 2, c, mv)
                        n += size
                elif "content-length" in hdrs:
                    n = int(hdrs["content-length"])
                    ureader.copy(n, c, mv)
                else:
                    n = ureader.copy_to_eof(c, mv)
                if rec is not None:
                    rec.status, rec.body, rec.end = status, n, time.monotonic()
                if "close" in hdrs.get("connection", "").lower():
                    break
        except (OSError, ConnectionError, ValueError):
            pass
        finally:
            ureader.close()
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)


try:  # run as ``python -m bench._remote_proxy`` from the repository, or imported as ``bench._remote_proxy``
    from bench._remote_server import ChildProcess
except ImportError:  # pragma: no cover - run as a script from bench/
    from _remote_server import ChildProcess  # type: ignore[no-redef]


class ProxyProcess(ChildProcess):
    """A proxy in a child process. ``kind``: ``"threads"`` (this module) or ``"fault"``
    (``tests/support/proxy.py``'s FaultProxy, run through :func:`_fault_main` so it records requests)."""

    def __init__(self, upstream: str, latency: float, kind: str = "threads", python: str | None = None) -> None:
        self.upstream, self.latency, self.kind = upstream, latency, kind
        self.python = python or sys.executable
        self.control = ""  # where /_proxy/stats is answered

    def start(self) -> ProxyProcess:
        repo = Path(__file__).resolve().parent.parent
        cmd = [self.python, "-m", "bench._remote_proxy", "--upstream", self.upstream, "--latency", str(self.latency)]
        if self.kind == "fault":
            cmd.append("--fault")
        self.proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        lines = [self.proc.stdout.readline().strip() for _ in range(2 if self.kind == "fault" else 1)]
        if not all(x.isdigit() for x in lines):
            self.stop()
            raise RuntimeError(f"proxy did not start (printed {lines!r})")
        self.port = int(lines[0])
        self.control = f"http://127.0.0.1:{lines[-1]}"
        return self



def stats(control: str, reset: bool = False, log: bool = False) -> dict[str, Any]:
    """The proxy's counts since the last reset (and reset them, with ``reset``); ``control``: the
    proxy's :attr:`ProxyProcess.control` URL."""
    path = "/_proxy/reset" if reset else "/_proxy/stats"
    with urllib.request.urlopen(f"{control}{path}{'?log=1' if log else ''}", timeout=30) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _fault_main(upstream: str, latency: float) -> None:
    """tests/support/proxy.py's FaultProxy (recording) plus a control listener answering the same
    ``/_proxy/stats`` and ``/_proxy/reset`` requests on its own port (printed on the second line)."""
    repo = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(repo))
    from tests.support.proxy import FaultProxy

    proxy = FaultProxy(upstream, latency=latency, record=True).start()
    print(proxy.port, flush=True)
    ctl = socket.create_server(("127.0.0.1", 0))
    print(ctl.getsockname()[1], flush=True)
    while True:
        c, _ = ctl.accept()
        with c:
            head = _Reader(c).head() or b"GET / HTTP/1.1\r\n\r\n"
            target = head.split(b" ")[1].decode()
            recs = proxy.requests
            if target.startswith("/_proxy/reset"):
                proxy.clear_log()
            body = {
                "requests": len(recs),
                "unfinished": sum(r.end is None for r in recs),
                "round_trips": proxy.round_trips(recs),
                "body_bytes": sum(r.body_bytes for r in recs),
                "by_method": dict(collections.Counter(r.method for r in recs)),
                "connections": proxy.connections,
            }
            data = json.dumps(body).encode()
            c.sendall(
                b"HTTP/1.1 200 OK\r\nConnection: close\r\n" + f"Content-Length: {len(data)}\r\n\r\n".encode() + data
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True)
    p.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    p.add_argument("--fault", action="store_true", help="run tests/support/proxy.py's FaultProxy instead")
    args = p.parse_args()
    if args.fault:
        _fault_main(args.upstream, args.latency)
        return
    proxy = LatencyProxy(args.upstream, args.latency)
    print(proxy.port, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        proxy.serve_forever()


if __name__ == "__main__":
    main()
