"""A server that answers badly on purpose, for the reader paths' tests (tests/test_remote_hostile.py).

:class:`HostileServer` serves the files of a directory as an S3 endpoint does (path style: ``GET`` with
``Range``, ``HEAD``; ``ETag`` and ``Last-Modified`` as obstore needs them) on 127.0.0.1 at a free port,
each connection on a thread of its own (at most :data:`MOST_CONNECTIONS`; every socket has a timeout, a
connection idle for a second is closed, and no thread outlives :meth:`HostileServer.stop` by more than a
second). Once :meth:`HostileServer.arm` names
a misbehaviour, range requests of paths that contain the given text get it instead of a right answer
(:data:`MODES`). ``tls``: a certificate and key file pair to serve HTTPS with.
"""

from __future__ import annotations

import email.utils
import hashlib
import re
import socket
import ssl
import threading
from pathlib import Path

__all__ = ["HostileServer", "MODES", "self_signed"]

MOST_CONNECTIONS = 256
#: the misbehaviours, each on range requests of armed paths
MODES = (
    "content_range",  # a 206 whose Content-Range is not the range asked for (its bytes: the range it names)
    "short",  # a 206 of fewer bytes than asked for (Content-Length says so)
    "long",  # a 206 of more bytes than asked for (Content-Length says so)
    "cut",  # the right head, then half the body and the connection closed
    "huge_headers",  # 1 MiB of header lines
    "garbage",  # a status line of garbage
    "chunked",  # the right bytes, chunked, without a Content-Length
    "redirect",  # 307 to another host (which serves other bytes at the same path)
    "silent",  # the request read, never an answer
    "trickle",  # the right head, then the body at four bytes a second (faster than the client's timeout of 1 s)
)


class HostileServer:
    def __init__(self, root: Path, bucket: str, *, host: str = "127.0.0.1", tls: tuple[str, str] | None = None,
                 flip: bool = False) -> None:
        self.root, self.bucket, self.host = Path(root), bucket, host
        self.flip = flip  # serve every byte inverted (the other host a redirect points to)
        self.mode: str | None = None
        self.match = ""
        self.other: str = ""  # base URL a redirect points to
        self.hits = 0  # range requests answered badly
        self._files: dict[Path, tuple[bytes, str]] = {}
        self._tls = None
        if tls is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(*tls)
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(MOST_CONNECTIONS)
        self._thread = threading.Thread(target=self._accept, name="hostile-accept", daemon=True)

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://{self.host}:{self.port}"

    def start(self) -> HostileServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def __enter__(self) -> HostileServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def arm(self, mode: str | None, match: str = ".npy") -> None:
        """Answer range requests of paths containing ``match`` with ``mode`` (None: answer them right)."""
        assert mode is None or mode in MODES, mode
        self.mode, self.match = mode, match
        if mode is not None:
            self.hits = 0

    # ------------------------------------------------------------------------------------ serving

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            if not self._slots.acquire(blocking=False):
                conn.close()  # bounded: a client past the limit is refused
                continue
            threading.Thread(target=self._serve, args=(conn,), name="hostile-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(1.0)
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
            buf = b""
            while not self._stop.is_set():
                while b"\r\n\r\n" not in buf:
                    try:
                        got = conn.recv(65536)
                    except TimeoutError:  # idle for a second: closed, as a server's keep-alive timeout does
                        return
                    if not got:
                        return
                    buf += got
                head, _, buf = buf.partition(b"\r\n\r\n")
                if not self._answer(conn, head.decode("latin-1")):
                    return
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()
            self._slots.release()

    def _answer(self, conn: socket.socket, head: str) -> bool:
        """Answer one request; False: the connection is to be closed."""
        lines = head.split("\r\n")
        method, target = lines[0].split(" ")[:2]
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        path = target.split("?")[0]
        prefix = f"/{self.bucket}/"
        file = self.root / path[len(prefix):] if path.startswith(prefix) else None
        if file is None or not file.is_file():
            body = b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>no such key</Message></Error>"
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/xml\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + (body if method != "HEAD" else b""))
            return True
        data, meta = self._file(file)
        ranged = re.fullmatch(r"bytes=(\d*)-(\d*)", headers.get("range", ""))
        if method == "HEAD" or ranged is None:
            out = data if method != "HEAD" else b""
            conn.sendall(f"HTTP/1.1 200 OK\r\n{meta}Content-Length: {len(data)}\r\n\r\n".encode() + out)
            return True
        a, b = ranged.groups()
        if a:
            start, end = int(a), min(len(data), int(b) + 1 if b else len(data))
        else:  # a suffix
            start, end = max(0, len(data) - int(b)), len(data)
        if self.mode is None or self.match not in path:
            self._send(conn, start, end, data, meta)
            return True
        self.hits += 1
        return self._misbehave(conn, target, start, end, data, meta)

    def _file(self, file: Path) -> tuple[bytes, str]:
        """The bytes of ``file`` as served (inverted with ``flip``) and its ETag and Last-Modified headers."""
        got = self._files.get(file)
        if got is None:
            data = file.read_bytes()
            if self.flip:
                data = data.translate(bytes(range(255, -1, -1)))
            modified = email.utils.formatdate(file.stat().st_mtime, usegmt=True)
            tag = hashlib.md5(data).hexdigest()
            got = self._files[file] = (data, f'ETag: "{tag}"\r\nLast-Modified: {modified}\r\n')
        return got

    def _send(self, conn: socket.socket, start: int, end: int, data: bytes, meta: str, *, length: int | None = None,
              body: bytes | None = None, shown: tuple[int, int] | None = None, extra: str = "") -> None:
        a, b = shown or (start, end)
        body = data[start:end] if body is None else body
        conn.sendall((f"HTTP/1.1 206 Partial Content\r\n{meta}{extra}Content-Range: bytes {a}-{b - 1}/{len(data)}\r\n"
                      f"Content-Length: {len(body) if length is None else length}\r\n\r\n").encode() + body)

    def _misbehave(self, conn: socket.socket, target: str, start: int, end: int, data: bytes, meta: str) -> bool:
        mode, n = self.mode, end - start
        if mode == "content_range":  # the next bytes, and a Content-Range that says so
            s = min(start + 8, len(data) - n)
            self._send(conn, s, s + n, data, meta)
        elif mode == "short":
            self._send(conn, start, end - max(1, n // 2), data, meta, shown=(start, end - max(1, n // 2)))
        elif mode == "long":
            self._send(conn, start, end, data, meta, body=data[start:end] + b"\0" * 16)
        elif mode == "cut":
            self._send(conn, start, end, data, meta, length=n, body=data[start : start + n // 2])
            return False
        elif mode == "huge_headers":
            filler = "".join(f"X-Filler-{i}: {'y' * 1000}\r\n" for i in range(1024))
            self._send(conn, start, end, data, meta, extra=filler)
        elif mode == "garbage":
            conn.sendall(b"\x16\x03garbage, not HTTP at all\r\n\r\n")
            return False
        elif mode == "chunked":
            body = data[start:end]
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:n // 2], body[n // 2 :]) if c)
            conn.sendall((f"HTTP/1.1 206 Partial Content\r\n{meta}Content-Range: bytes {start}-{end - 1}/"
                          f"{len(data)}\r\nTransfer-Encoding: chunked\r\n\r\n").encode() + chunks + b"0\r\n\r\n")
        elif mode == "redirect":
            conn.sendall(f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {self.other}{target}\r\n"
                         "Content-Length: 0\r\n\r\n".encode())
        elif mode == "silent":  # until the client gives up (it closes) or the server stops
            while not self._stop.is_set():
                try:
                    if not conn.recv(65536):
                        break
                except TimeoutError:
                    continue
            return False
        elif mode == "trickle":  # the head at once, then the body byte by byte
            conn.sendall((f"HTTP/1.1 206 Partial Content\r\n{meta}Content-Range: bytes {start}-{end - 1}/"
                          f"{len(data)}\r\nContent-Length: {n}\r\n\r\n").encode())
            for i in range(start, end):
                if self._stop.wait(0.25):
                    break
                conn.sendall(data[i : i + 1])  # OSError once the client gave up and closed
            return False
        return True


def self_signed(directory: Path, name: str) -> tuple[str, str] | None:
    """A certificate for host ``name`` (and its key) in ``directory``, self-signed, as files; None where
    the ``cryptography`` package is missing."""
    try:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        return None
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)
