"""A read-only HTTP/1.1 file server on loopback with byte ranges, for ``https://``-style store URLs.

``StaticServer(root)`` serves the files under ``root`` at ``http://127.0.0.1:PORT/<relative path>``:
``GET`` and ``HEAD``, single ``Range: bytes=a-b`` / ``a-`` / ``-n`` requests (206 with
``Content-Range``; 416 past the end), ``ETag`` (size and mtime in nanoseconds) and ``Last-Modified``,
``If-Match`` / ``If-None-Match`` (412 / 304), keep-alive (``etags=False``: no ``ETag`` header). Bodies
are sent from the file in chunks, never read whole. Nothing else (no listing, no writes): what a static
web server offers.
"""

from __future__ import annotations

import email.utils
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

_CHUNK = 256 * 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root: Path
    etags = True  # False: no ETag header (a server that sends Last-Modified only)

    def log_message(self, *args: Any) -> None:
        pass

    def _fail(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        rel = unquote(urlsplit(self.path).path).lstrip("/")
        path = (self.root / rel).resolve()
        if self.root not in path.parents or not path.is_file():
            self._fail(404)
            return
        st = path.stat()
        etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
        common = {"ETag": etag, "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
                  "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if not self.etags:
            del common["ETag"]
        if "If-Match" in self.headers and self.headers["If-Match"] not in (etag, "*"):
            self._fail(412, common)
            return
        if self.headers.get("If-None-Match") in (etag, "*"):
            self._fail(304, common)
            return
        size = st.st_size
        first, last, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and "," not in rng:
            a, _, b = rng[6:].strip().partition("-")
            if not a:  # suffix: the last b bytes
                first, last = max(0, size - int(b)), size - 1
            else:
                first, last = int(a), min(size - 1, int(b)) if b else size - 1
            if first >= size or first > last:
                self._fail(416, {**common, "Content-Range": f"bytes */{size}"})
                return
            status = 206
            common["Content-Range"] = f"bytes {first}-{last}/{size}"
        length = last - first + 1 if size else 0
        self.send_response(status)
        for k, v in common.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if not body or not length:
            return
        with open(path, "rb") as f:
            f.seek(first)
            left = length
            while left:
                data = f.read(min(_CHUNK, left))
                if not data:
                    break
                self.wfile.write(data)
                left -= len(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # many clients connect at once (the default 5 drops SYNs: 1 s retries)


class StaticServer:
    """Serve ``root`` read-only on 127.0.0.1 (a free port). ``with StaticServer(root) as s: s.url``."""

    def __init__(self, root: str | os.PathLike[str], *, etags: bool = True) -> None:
        handler = type("Handler", (_Handler,), {"root": Path(root).resolve(), "etags": etags})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> StaticServer:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> StaticServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
