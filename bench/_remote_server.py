"""A minimal S3-compatible HTTP server over a local directory, for ``bench/remote.py``.

Why not an existing one: moto copies the whole object for every range request (about 85 ms per range
GET of a 100 MB object); ``s3rver`` (npm) reads ranges from disk but answers a suffix range
``bytes=-N`` with the first N + 1 bytes instead of the last N (it parses ``-N`` as ``0-N``), which
S3, obstore and seqstore rely on, and it reads two metadata files per request. No S3 server is
packaged in Debian, and the Go and Rust ones (MinIO, versitygw, ...) are not on the registries this
project may use. So this module serves one bucket straight from a directory, with only what S3
readers need:

- ``GET`` / ``HEAD`` of an object, with ``Range: bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` (206 and
  ``Content-Range: bytes a-b/size``; 416 with ``Content-Range: bytes */size`` when unsatisfiable; a
  multi-range header is ignored and the whole object sent with 200, as RFC 9110 allows),
  ``If-Match`` (412) and ``If-None-Match`` (304); the body is sent with ``sendfile(2)`` from the file
  (nothing is copied through Python, nothing but the range is read);
- ``PUT`` of an object (``Content-Length`` bodies; written to a temporary file, then renamed, so a
  reader sees the old object or the new one), conditional with ``If-None-Match: *`` or
  ``If-Match: <etag>`` (412 when it does not hold); ``DELETE`` of one object and ``DeleteObjects``;
- multipart uploads (initiate, upload part, complete, abort; the parts are concatenated at completion);
- ``ListObjectsV2`` (``GET /bucket?list-type=2`` with ``prefix``, ``delimiter``, ``max-keys``,
  ``start-after``, ``continuation-token``), sorted by key as S3 does.

Every object response carries ``ETag``, ``Last-Modified``, ``Content-Length`` and ``Accept-Ranges``.
The ETag is a hash of the file's inode, size and modification time (nanoseconds): it changes whenever
a file is rewritten or replaced, which is all a reader may assume of an ETag (S3's own are MD5 only
for single-part uploads). Keys map to paths under the root (path-style URLs ``/bucket/key``; ``..``
and absolute parts are refused). Signatures are not checked. Temporary files of a PUT in progress
(``.put-*``) are not listed. One asyncio loop in one thread: run it as its own process
(:class:`ServerProcess`, or ``python -m bench._remote_server --root DIR``, which prints the port).
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import email.utils
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit
from xml.sax.saxutils import escape, unescape

SMALL = 64 << 10  # bodies up to this size are read with pread and written; larger ones go by sendfile
_TMP = ".put-"


def etag_of(st: os.stat_result) -> str:
    h = hashlib.blake2b(f"{st.st_ino}-{st.st_size}-{st.st_mtime_ns}".encode(), digest_size=16).hexdigest()
    return f'"{h}"'


def _http_date(t: float) -> str:
    return email.utils.formatdate(t, usegmt=True)


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


def parse_range(value: str, size: int) -> tuple[int, int] | None | str:
    """``(first, last)`` inclusive for a single ``bytes=`` range, None to send the whole object (no or
    an unusable header), ``"unsatisfiable"`` for a range that starts past the end."""
    if not value.startswith("bytes=") or "," in value:
        return None
    a, sep, b = value[6:].strip().partition("-")
    if not sep:
        return None
    try:
        if not a:  # suffix: the last n bytes
            n = int(b)
            if n <= 0:
                return "unsatisfiable"
            return (max(0, size - n), size - 1) if size else "unsatisfiable"
        first = int(a)
        last = int(b) if b else size - 1
    except ValueError:
        return None
    if first >= size or last < first:
        return "unsatisfiable"
    return first, min(last, size - 1)


class S3Directory:
    """Serves bucket ``bucket`` from directory ``root`` (see the module docstring)."""

    def __init__(self, root: Path, bucket: str) -> None:
        self.root = root.resolve()
        self.bucket = bucket
        self.requests = 0
        self.bytes_out = 0

    # --------------------------------------------------------------------------------- helpers

    def path_of(self, key: str) -> Path | None:
        parts = [p for p in key.split("/") if p]
        if not parts or any(p in (".", "..") or p.startswith(_TMP) for p in parts):
            return None
        return self.root.joinpath(*parts)

    @staticmethod
    def _error(status: int, code: str, message: str, resource: str) -> tuple[int, dict[str, str], bytes]:
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>"
            f"<Resource>{escape(resource)}</Resource><RequestId>{uuid.uuid4().hex}</RequestId></Error>"
        ).encode()
        return status, {"Content-Type": "application/xml"}, body

    def _walk(self, base: Path, rel: str) -> Iterator[tuple[str, os.stat_result]]:
        try:
            entries = sorted(os.scandir(base), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for e in entries:
            if e.name.startswith(_TMP):
                continue
            key = f"{rel}{e.name}"
            if e.is_dir(follow_symlinks=False):
                yield from self._walk(Path(e.path), key + "/")
            elif e.is_file():
                yield key, e.stat()

    def list_v2(self, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        prefix = query.get("prefix", "")
        delimiter = query.get("delimiter", "")
        max_keys = max(0, min(1000, int(query.get("max-keys", "1000") or 1000)))
        after = query.get("continuation-token") or query.get("start-after") or ""
        # walk only the directory the prefix names; S3 lists keys in byte order: sort them
        head, _, _ = prefix.rpartition("/")
        base = self.root.joinpath(*[p for p in head.split("/") if p]) if head else self.root
        start_rel = f"{head}/" if head else ""
        contents: list[tuple[str, os.stat_result]] = []
        prefixes: list[str] = []
        truncated = False
        last = ""
        items = sorted(self._walk(base, start_rel), key=lambda kv: kv[0])
        for key, st in items:
            if not key.startswith(prefix) or key <= after:
                continue
            if delimiter:
                i = key.find(delimiter, len(prefix))
                if i >= 0:
                    cp = key[: i + len(delimiter)]
                    if prefixes and prefixes[-1] == cp:
                        continue
                    if cp <= after:
                        continue
                    if len(contents) + len(prefixes) >= max_keys:
                        truncated = True
                        break
                    prefixes.append(cp)
                    last = cp
                    continue
            if len(contents) + len(prefixes) >= max_keys:
                truncated = True
                break
            contents.append((key, st))
            last = key
        parts = [
            '<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
            f"<Name>{escape(self.bucket)}</Name><Prefix>{escape(prefix)}</Prefix>",
            f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>",
        ]
        if delimiter:
            parts.append(f"<Delimiter>{escape(delimiter)}</Delimiter>")
        parts.append(f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>")
        if truncated:
            parts.append(f"<NextContinuationToken>{escape(last)}</NextContinuationToken>")
        for key, st in contents:
            parts.append(
                f"<Contents><Key>{escape(key)}</Key><LastModified>{_iso(st.st_mtime)}</LastModified>"
                f"<ETag>{escape(etag_of(st))}</ETag><Size>{st.st_size}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
        for cp in prefixes:
            parts.append(f"<CommonPrefixes><Prefix>{escape(cp)}</Prefix></CommonPrefixes>")
        parts.append("</ListBucketResult>")
        return 200, {"Content-Type": "application/xml"}, "".join(parts).encode()

    # ------------------------------------------------------------------------------- connection

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            import socket

            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    break
                keep = await self.one(head, reader, writer)
                if not keep:
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def one(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        lines = head[:-4].decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ")
        except ValueError:
            return False
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.requests += 1
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        u = urlsplit(target)
        query = dict(parse_qsl(u.query, keep_blank_values=True))
        path = unquote(u.path)
        bucket, _, key = path.lstrip("/").partition("/")
        clen = int(headers.get("content-length", "0") or 0)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            status, hdrs, body = self._error(501, "NotImplemented", "chunked request bodies", path)
            await self._send(writer, method, status, hdrs, body, close=True)
            return False
        if bucket != self.bucket:
            await self._drain_body(reader, clen)
            status, hdrs, body = self._error(404, "NoSuchBucket", f"no bucket {bucket!r}", path)
            return await self._send(writer, method, status, hdrs, body, close=not keep)
        if method == "POST" and not key and "delete" in query:
            xml = (await reader.readexactly(clen) if clen else b"").decode()
            done = []
            for k in re.findall(r"<Key>(.*?)</Key>", xml, flags=re.S):
                k = unescape(k)
                q = self.path_of(k)
                if q is not None:
                    with contextlib.suppress(FileNotFoundError):
                        q.unlink()
                done.append(f"<Deleted><Key>{escape(k)}</Key></Deleted>")
            body = (
                '<?xml version="1.0" encoding="UTF-8"?>\n<DeleteResult>' + "".join(done) + "</DeleteResult>"
            ).encode()
            return await self._send(writer, method, 200, {"Content-Type": "application/xml"}, body, close=not keep)
        if method in ("GET", "HEAD") and not key:
            if query.get("list-type") == "2":
                status, hdrs, body = self.list_v2(query)
            else:
                status, hdrs, body = 200, {"Content-Type": "application/xml"}, b""
            return await self._send(writer, method, status, hdrs, body, close=not keep)
        p = self.path_of(key)
        if p is None:
            await self._drain_body(reader, clen)
            status, hdrs, body = self._error(400, "InvalidArgument", "invalid key", path)
            return await self._send(writer, method, status, hdrs, body, close=not keep)
        if "uploads" in query or "uploadId" in query:
            return await self._multipart(reader, writer, method, query, p, key, path, clen, keep)
        if method in ("GET", "HEAD"):
            return await self._get(writer, method, headers, p, path, keep)
        if method == "PUT":
            if "x-amz-copy-source" in headers:
                await self._drain_body(reader, clen)
                status, hdrs, body = self._error(501, "NotImplemented", "CopyObject", path)
                return await self._send(writer, method, status, hdrs, body, close=not keep)
            return await self._put(reader, writer, headers, p, path, clen, keep)
        if method == "DELETE":
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            return await self._send(writer, method, 204, {}, b"", close=not keep)
        await self._drain_body(reader, clen)
        status, hdrs, body = self._error(405, "MethodNotAllowed", method, path)
        return await self._send(writer, method, status, hdrs, body, close=not keep)

    async def _drain_body(self, reader: asyncio.StreamReader, n: int) -> None:
        while n > 0:
            got = await reader.read(min(n, 1 << 20))
            if not got:
                raise ConnectionError
            n -= len(got)

    async def _send(
        self, writer: asyncio.StreamWriter, method: str, status: int, hdrs: dict[str, str], body: bytes, close: bool
    ) -> bool:
        reason = {200: "OK", 204: "No Content", 206: "Partial Content", 304: "Not Modified"}.get(status, "Error")
        out = [f"HTTP/1.1 {status} {reason}", f"Date: {_http_date(time.time())}", "Server: seqstore-bench-s3"]
        out += [f"{k}: {v}" for k, v in hdrs.items()]
        if status not in (204, 304):
            out.append(f"Content-Length: {len(body)}")
        if close:
            out.append("Connection: close")
        writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
        if method != "HEAD" and body and status not in (204, 304):
            writer.write(body)
            self.bytes_out += len(body)
        await writer.drain()
        return not close

    async def _get(
        self, writer: asyncio.StreamWriter, method: str, headers: dict[str, str], p: Path, path: str, keep: bool
    ) -> bool:
        try:
            fd = os.open(p, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            status, hdrs, body = self._error(404, "NoSuchKey", "The specified key does not exist.", path)
            return await self._send(writer, method, status, hdrs, body, close=not keep)
        try:
            st = os.fstat(fd)
            if not os.path.isfile(p):
                status, hdrs, body = self._error(404, "NoSuchKey", "The specified key does not exist.", path)
                return await self._send(writer, method, status, hdrs, body, close=not keep)
            size = st.st_size
            tag = etag_of(st)
            base = {"ETag": tag, "Last-Modified": _http_date(st.st_mtime), "Accept-Ranges": "bytes"}
            im = headers.get("if-match")
            if im is not None and im.strip() not in ("*", tag) and tag not in [x.strip() for x in im.split(",")]:
                status, hdrs, body = self._error(412, "PreconditionFailed", "If-Match does not hold", path)
                return await self._send(writer, method, status, hdrs, body, close=not keep)
            inm = headers.get("if-none-match")
            if inm is not None and (inm.strip() == "*" or tag in [x.strip() for x in inm.split(",")]):
                return await self._send(writer, method, 304, base, b"", close=not keep)
            rng = parse_range(headers["range"], size) if "range" in headers else None
            if rng == "unsatisfiable":
                status, hdrs, body = self._error(416, "InvalidRange", "The requested range is not satisfiable", path)
                hdrs["Content-Range"] = f"bytes */{size}"
                return await self._send(writer, method, status, hdrs, body, close=not keep)
            if rng is None:
                first, count, status = 0, size, 200
            else:
                assert isinstance(rng, tuple)
                first, count, status = rng[0], rng[1] - rng[0] + 1, 206
                base["Content-Range"] = f"bytes {rng[0]}-{rng[1]}/{size}"
            base["Content-Type"] = "application/octet-stream"
            reason = "OK" if status == 200 else "Partial Content"
            out = [f"HTTP/1.1 {status} {reason}", f"Date: {_http_date(time.time())}", "Server: seqstore-bench-s3"]
            out += [f"{k}: {v}" for k, v in base.items()]
            out.append(f"Content-Length: {count}")
            if not keep:
                out.append("Connection: close")
            writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
            if method == "HEAD" or count == 0:
                await writer.drain()
                return keep
            if count <= SMALL:
                writer.write(os.pread(fd, count, first))
                await writer.drain()
            else:
                await writer.drain()
                with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
                    loop = asyncio.get_running_loop()
                    await loop.sendfile(writer.transport, f, first, count)
            self.bytes_out += count
            return keep
        finally:
            os.close(fd)

    async def _multipart(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        method: str,
        query: dict[str, str],
        p: Path,
        key: str,
        path: str,
        clen: int,
        keep: bool,
    ) -> bool:
        """Multipart upload: parts are files in ``<root>/.put-mp-<id>/``; completing concatenates the
        parts the request lists into a temporary file and renames it over the object."""
        uploads = self.root / f"{_TMP}mp"
        if method == "POST" and "uploads" in query:
            await self._drain_body(reader, clen)
            upload = uuid.uuid4().hex
            (uploads / upload).mkdir(parents=True)
            body = (
                '<?xml version="1.0" encoding="UTF-8"?>\n<InitiateMultipartUploadResult>'
                f"<Bucket>{escape(self.bucket)}</Bucket><Key>{escape(key)}</Key><UploadId>{upload}</UploadId>"
                "</InitiateMultipartUploadResult>"
            ).encode()
            return await self._send(writer, method, 200, {"Content-Type": "application/xml"}, body, close=not keep)
        upload = query.get("uploadId", "")
        d = uploads / upload
        if not upload.isalnum() or not d.is_dir():
            await self._drain_body(reader, clen)
            status, hdrs, body = self._error(404, "NoSuchUpload", "The specified upload does not exist.", path)
            return await self._send(writer, method, status, hdrs, body, close=not keep)
        if method == "PUT":
            part = d / str(int(query.get("partNumber", "0")))
            with open(part, "wb") as f:
                n = clen
                while n > 0:
                    got = await reader.read(min(n, 1 << 20))
                    if not got:
                        raise ConnectionError
                    f.write(got)
                    n -= len(got)
            return await self._send(writer, method, 200, {"ETag": etag_of(os.stat(part))}, b"", close=not keep)
        if method == "DELETE":
            await self._drain_body(reader, clen)
            shutil.rmtree(d, ignore_errors=True)
            return await self._send(writer, method, 204, {}, b"", close=not keep)
        if method == "POST":
            xml = await reader.readexactly(clen) if clen else b""
            numbers = [int(x) for x in re.findall(rb"<PartNumber>\s*(\d+)\s*</PartNumber>", xml)]
            p.parent.mkdir(parents=True, exist_ok=True)
            missing = [n for n in numbers if not (d / str(n)).is_file()]
            if missing or not numbers:
                status, hdrs, body = self._error(400, "InvalidPart", f"parts {missing} were not uploaded", path)
                return await self._send(writer, method, status, hdrs, body, close=not keep)
            tmp = p.with_name(f"{_TMP}{uuid.uuid4().hex}")
            try:
                with open(tmp, "wb") as out:
                    for n in numbers:
                        with open(d / str(n), "rb") as f:
                            shutil.copyfileobj(f, out, 1 << 20)
                os.replace(tmp, p)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
            shutil.rmtree(d, ignore_errors=True)
            tag = etag_of(os.stat(p))
            body = (
                '<?xml version="1.0" encoding="UTF-8"?>\n<CompleteMultipartUploadResult>'
                f"<Bucket>{escape(self.bucket)}</Bucket><Key>{escape(key)}</Key><ETag>{escape(tag)}</ETag>"
                "</CompleteMultipartUploadResult>"
            ).encode()
            return await self._send(
                writer, method, 200, {"Content-Type": "application/xml", "ETag": tag}, body, close=not keep
            )
        await self._drain_body(reader, clen)
        status, hdrs, body = self._error(405, "MethodNotAllowed", method, path)
        return await self._send(writer, method, status, hdrs, body, close=not keep)

    async def _put(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        headers: dict[str, str],
        p: Path,
        path: str,
        clen: int,
        keep: bool,
    ) -> bool:
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f"{_TMP}{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as f:
                n = clen
                while n > 0:
                    got = await reader.read(min(n, 1 << 20))
                    if not got:
                        raise ConnectionError
                    f.write(got)
                    n -= len(got)
            # check and rename with no await in between: atomic within this single-threaded server
            try:
                cur: str | None = etag_of(os.stat(p))
            except FileNotFoundError:
                cur = None
            inm = headers.get("if-none-match")
            im = headers.get("if-match")
            if (
                (inm is not None and inm.strip() == "*" and cur is not None)
                or (im is not None and im.strip() != "*" and im.strip() != cur)
                or (im is not None and im.strip() == "*" and cur is None)
            ):
                status, hdrs, body = self._error(412, "PreconditionFailed", "At least one precondition failed", path)
                return await self._send(writer, "PUT", status, hdrs, body, close=not keep)
            os.replace(tmp, p)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return await self._send(writer, "PUT", 200, {"ETag": etag_of(os.stat(p))}, b"", close=not keep)


async def _main_async(root: Path, bucket: str, host: str, port: int) -> None:
    server_obj = S3Directory(root, bucket)
    server = await asyncio.start_server(server_obj.serve, host, port, limit=1 << 20, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


class ChildProcess(abc.ABC):
    """A bench service in a child process that prints its port: ``start()`` (in the subclass), ``stop()``,
    and ``with`` support; ``endpoint`` is ``http://127.0.0.1:<port>``."""

    proc: subprocess.Popen[str] | None = None
    port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @abc.abstractmethod
    def start(self) -> Any:
        """Start the child and wait for it to print its port; returns ``self``."""

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerProcess(ChildProcess):
    """This server as a child process: ``with ServerProcess(root, "bench") as s: s.endpoint``."""

    def __init__(self, root: Path, bucket: str, python: str | None = None) -> None:
        self.root, self.bucket = Path(root), bucket
        self.python = python or sys.executable

    def start(self) -> ServerProcess:
        repo = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen(
            [self.python, "-m", "bench._remote_server", "--root", str(self.root), "--bucket", self.bucket],
            cwd=repo,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            self.stop()
            raise RuntimeError(f"bench S3 server did not start (printed {line!r})")
        self.port = int(line)
        return self



def storage_options(endpoint: str) -> dict[str, Any]:
    """obstore / Lance S3 options for this server at ``endpoint`` (any keys: signatures are not checked)."""
    return {
        "endpoint": endpoint,
        "region": "us-east-1",
        "access_key_id": "bench",
        "secret_access_key": "bench-secret",
        "allow_http": "true",
        "virtual_hosted_style_request": "false",
    }


def key_url(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{quote(key)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, required=True, help="directory served as the bucket")
    p.add_argument("--bucket", default="bench")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main_async(args.root, args.bucket, args.host, args.port))


if __name__ == "__main__":
    main()
