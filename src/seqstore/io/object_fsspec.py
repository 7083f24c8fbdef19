"""The fsspec back end of :class:`~seqstore.io.objects.ObjectClient`: any fsspec filesystem, the one given
or the one its URL names (``memory://``, ``hf://``...).

Range requests run on a pool of ``max_requests`` threads; a batch's ranges are read by one ``cat_ranges``
call, retried as a whole on a transient failure; a range asked of a version (the tag the file's info gave:
ETag, generation or time) raises :class:`~seqstore.errors.StaleStoreError` once the file is another. A
filesystem's own timeouts may be long or none: each call (and the filesystem's making) is waited for at most
``timeout + connect_timeout`` per request, plus the time the bytes it moves (up or down) take at 64 KiB/s, then
retried as a transient failure (a listing folder by folder where the filesystem's ``find`` walks; one of its
own, of an unknown number of requests, is not bounded). A call left running after its caller gave up keeps
its thread until it returns; at most :data:`CALLS_MOST` such threads run in a process. A
filesystem cannot replace a file only if it is unchanged (If-Match), so a conditional put is refused with
an error naming the URL.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..errors import ConflictError, CredentialsError, RemoteError, RemoteNotFound, StaleStoreError
from .object_common import (
    EMPTY_ANSWER,
    WHOLE_OBJECT_MOST,
    Answer,
    ClientSettings,
    ObjectBackend,
    ObjectMeta,
    Request,
    error_at,
    too_large,
)
from .retry import Transient, parse_retry_after

__all__ = ["FsspecBackend"]

_LEAST_RATE = 64 << 10  # bytes/s a transfer must average (as the direct reader's answers) before it is cut
#: fields of a filesystem's file info that name the file's version, in the order they are taken: ETags
#: (s3fs, gcsfs, adlfs, fsspec's HTTP), a generation (gcsfs), a content id (huggingface_hub's git blob id),
#: else a time (local files, memory, SFTP; an HTTP server's Last-Modified)
_VERSIONS = ("ETag", "etag", "generation", "blob_id", "mtime", "created", "Last-Modified", "LastModified")


class FsspecBackend(ObjectBackend):
    """Any fsspec filesystem: the one given, or the one its URL names (``memory://``, ``hf://``...)."""

    def __init__(self, client: ClientSettings) -> None:
        try:
            import fsspec
        except ImportError as exc:
            raise ImportError(f"{client.url}: this URL needs fsspec: pip install 'seqstore[remote]'") from exc
        self.c = client
        self.local = False  # (until the filesystem is known: making it is bounded)
        self.made = False  # the filesystem is made (making it may send no request: no answer to count)
        if client.filesystem is not None:
            self.fs = client.filesystem
            self.root = client.url.split("://", 1)[-1]
        else:
            try:
                self.fs, self.root = self._call("", lambda: fsspec.core.url_to_fs(client.url, **client.options))
            except ImportError as exc:  # (fsspec knows the scheme, its package is missing: words without the URL)
                raise ImportError(f"{client.url}: {exc}", name=exc.name) from exc
        self.root = self.root.rstrip("/")
        self.made = True
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()  # (two threads' first requests make one pool)
        named = getattr(self.fs, "protocol", ())
        protocols = {named} if isinstance(named, str) else set(named)
        self.local = bool(protocols) and protocols <= {"file", "local", "memory"}  # answers at once: no bound
        self.walks = type(self.fs).find is fsspec.AbstractFileSystem.find  # (a listing: one call a folder)

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def _call(self, key: str, fn: Any, calls: int = 1, moved: int = 0) -> Any:
        """``fn()``, ``calls`` requests of the filesystem (0: not bounded) that move ``moved`` bytes, in
        seqstore's words: its failures and a call that does not return in time are :class:`Transient`."""
        try:
            if not calls or self.local:
                return fn()
            out = _bounded(fn, calls * (self.c.timeout + self.c.connect_timeout) + moved / _LEAST_RATE)
            if self.made:  # a request answered (a lookup before a read that fails: the endpoint is there)
                self.c.retry.reached = True
            return out
        except FileNotFoundError:
            raise error_at(RemoteNotFound, self.c.key_url(key), "no such object") from None
        except PermissionError:
            raise error_at(CredentialsError, self.c.key_url(key), "access refused; check the credentials") from None
        except Exception as exc:
            if (status := _status(exc)) is not None:
                raise _refusal(self.c.key_url(key), status, exc) from None
            kind = _network(exc) or ("failed" if isinstance(exc, (OSError, TimeoutError)) else "")
            if not kind:
                raise
            raise Transient(f"{type(exc).__name__}: {exc}", answered=kind == "answered") from None

    def _meta(self, key: str, info: Mapping[str, Any]) -> ObjectMeta:
        """``key``'s size and version tag (:data:`_VERSIONS`; "": none, not told from a replaced file)."""
        tag = next((info[f] for f in _VERSIONS if info.get(f)), "")
        return ObjectMeta(key, int(info.get("size") or 0), str(tag))

    def head(self, key: str) -> ObjectMeta:
        return self._meta(key, self._call(key, lambda: self.fs.info(self._path(key))))

    def get(self, key: str, limit: int) -> tuple[memoryview, ObjectMeta]:
        meta = self.head(key)
        if meta.size > limit:
            raise too_large(self.c.key_url(key), meta.size, limit)
        data = self._call(key, lambda: self.fs.cat_file(self._path(key)), 1, meta.size)
        if len(data) > limit:  # (grown since the head)
            raise too_large(self.c.key_url(key), len(data), limit)
        return memoryview(data), ObjectMeta(key, len(data), meta.etag)

    def submit(
        self, requests: Sequence[Request], on_each: Any, missing_ok: bool = False, with_meta: bool = True
    ) -> concurrent.futures.Future[list[Answer]]:
        if self.pool is None:
            with self._pool_lock:
                if self.pool is None:
                    self.pool = concurrent.futures.ThreadPoolExecutor(self.c.max_requests,
                                                                      thread_name_prefix="seqstore-fsspec")

        def run() -> list[Answer]:
            if missing_ok:
                got: list[Answer] = []
                for r in requests:
                    try:
                        got.extend(self.get_ranges([r]))
                    except RemoteNotFound:
                        got.append((memoryview(b""), None))
            else:
                got = self.get_ranges(requests)
            if on_each is not None:
                for i, (d, m) in enumerate(got):
                    if m is not None:  # (None: missing; as the obstore back end, nothing arrived, no call)
                        on_each(i, d, m)
                return [(EMPTY_ANSWER, m) for _, m in got]
            return got

        return self.pool.submit(run)

    def get_ranges(self, requests: Sequence[Request]) -> list[Answer]:
        paths = [self._path(k) for k, _, _, _ in requests]

        def attempt() -> list[Answer]:  # (the lookups too: their failures are retried as the read's)
            # every answer carries the object's size and version, as obstore's do. A filesystem reads no
            # version it is asked for (no If-Match): a pinned read's version is looked up after its bytes
            # are read (a file replaced between a lookup and the read would pass its new bytes off as the
            # version pinned); before it where the read needs the size (a suffix, a whole file) or is unpinned
            keys = list(dict.fromkeys(k for k, _, _, _ in requests))
            before = {k for k, s, e, tag in requests if s < 0 or e < 0 or not tag}
            metas = {k: self.head(k) for k in keys if k in before}
            self._pinned(requests, metas)
            for k, s, e, _ in requests:
                if e < 0 <= s and metas[k].size > WHOLE_OBJECT_MOST:  # a whole object: none past the limit
                    raise too_large(self.c.key_url(k), metas[k].size, WHOLE_OBJECT_MOST)
            starts = [max(0, metas[k].size + s) if s < 0 else s for k, s, _, _ in requests]
            ends = [metas[k].size if e < 0 else e for k, _, e, _ in requests]
            got = self._call(requests[0][0], lambda: self.fs.cat_ranges(paths, starts, ends, on_error="return"),
                             len(paths), sum(max(0, e - s) for s, e in zip(starts, ends)))
            metas.update({k: self.head(k) for k in dict.fromkeys(k for k, _, _, tag in requests if tag)})
            self._pinned(requests, metas)
            out: list[Answer] = []
            for (k, _, _, _), s, e, d in zip(requests, starts, ends, got):
                if isinstance(d, BaseException):
                    self._call(k, lambda d=d: _raise(d), 0)  # (in seqstore's words; nothing to wait for)
                m = metas[k]
                want = max(0, min(e, m.size) - s)
                if len(d) != want:
                    raise Transient(f"{self.c.key_url(k)} range {s}-{e}: {len(d)} bytes, expected {want}")
                out.append((memoryview(d), m))
            return out

        return self.c.retry.run(self.c.key_url(requests[0][0]), attempt)

    def _pinned(self, requests: Sequence[Request], metas: Mapping[str, ObjectMeta]) -> None:
        """Raise :class:`StaleStoreError` where a request pinned to a version finds the file (``metas``: the
        versions looked up) another."""
        for k, _, _, tag in requests:
            m = metas.get(k)
            if tag and m is not None and m.etag != tag:
                raise error_at(StaleStoreError, self.c.key_url(k), "the object changed while the store was open "
                               f"(version {m.etag}, expected {tag}); reopen the store")

    def put(self, key: str, data: bytes | memoryview, mode: str | dict[str, Any]) -> str:
        if isinstance(mode, dict):
            url = self.c.key_url(key)
            raise RemoteError(
                f"{url}: this filesystem has no conditional write (If-Match), so two writers could lose each "
                "other's shards; write the store locally and copy it (seqstore copy)", url=url, attempts=0,
            )
        if mode == "create" and self._call(key, lambda: self.fs.exists(self._path(key))):
            raise error_at(ConflictError, self.c.key_url(key), "already exists")
        self._call(key, lambda: self.fs.pipe_file(self._path(key), bytes(data)), 1, len(data))
        return self.head(key).etag

    def put_file(self, key: str, path: str) -> str:
        self._call(key, lambda: self.fs.put_file(path, self._path(key)), 1, os.path.getsize(path))
        return self.head(key).etag

    def put_stream(self, key: str, chunks: Callable[[], Iterable[bytes]]) -> str:
        def write() -> None:
            f = self._call(key, lambda: self.fs.open(self._path(key), "wb"))
            sent = 0

            def held() -> int:  # bytes a write or the close may upload: what the file buffers (at most all)
                buffer: Any = getattr(f, "buffer", None)
                return int(buffer.tell()) if hasattr(buffer, "tell") else sent

            try:
                for c in chunks():
                    sent += len(c)
                    self._call(key, lambda c=c: f.write(c), 1, held() + len(c))
            except BaseException:
                with contextlib.suppress(Exception):  # leave no partial object (the iterator's error is reported)
                    if hasattr(f, "discard"):
                        f.discard()
                    else:
                        self._call(key, f.close, 1, held())
                    self._call(key, lambda: self.fs.rm_file(self._path(key)))
                raise
            self._call(key, f.close, 1, held())

        self._call(key, write, 0)
        return self.head(key).etag

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        base = self._path(prefix)
        if not self._call(prefix, lambda: self.fs.exists(base)):
            return
        if self.walks:  # fsspec's own find: its walk, a folder listed (a request) at a time, each bounded
            found: dict[str, Any] = {}
            walk = self.fs.walk(base, detail=True)
            while (step := self._call(prefix, lambda: next(walk, None))) is not None:
                found.update({info["name"]: info for info in step[2].values()})
        else:
            found = self._call(prefix, lambda: self.fs.find(base, detail=True), 0)
        for p, info in sorted(found.items()):
            rel = p[len(self.root) + 1 :] if p.startswith(self.root + "/") else p
            yield self._meta(rel, info)

    def delete(self, key: str) -> None:
        self._call(key, lambda: self.fs.rm_file(self._path(key)))

    def copy(self, src: str, dst: str) -> None:
        self._call(src, lambda: self.fs.copy(self._path(src), self._path(dst)), 1, self.head(src).size)


def _status(exc: BaseException) -> int | None:
    """The HTTP status an HTTP library's error carries (requests' and httpx's ``response.status_code``,
    aiohttp's ``status``; an ``OSError`` such as huggingface_hub's ``HfHubHTTPError`` too), else None."""
    code = getattr(getattr(exc, "response", None), "status_code", None)
    if code is None and type(exc).__module__.startswith("aiohttp"):
        code = getattr(exc, "status", None)
    return code if isinstance(code, int) and 100 <= code < 600 else None


def _refusal(url: str, status: int, exc: BaseException) -> BaseException:
    """The answer ``status`` to a request for ``url`` in seqstore's words: 401/403 a CredentialsError,
    404 a RemoteNotFound, another 4xx a RemoteError (all at once), 5xx, 408 and 429 a Transient to retry
    (after at least its ``Retry-After``, as the direct reader)."""
    if status in (401, 403):
        return error_at(CredentialsError, url, f"access refused (HTTP {status}); check the credentials")
    if status == 404:
        return error_at(RemoteNotFound, url, "no such object")
    what = " ".join(str(exc).split())[:300]
    if 400 <= status < 500 and status not in (408, 429):
        return error_at(RemoteError, url, f"HTTP {status}: {what}")
    response = getattr(exc, "response", None)  # (aiohttp's error carries the headers itself)
    headers = getattr(exc if response is None else response, "headers", None) or {}
    after = parse_retry_after(headers.get("Retry-After") or headers.get("retry-after"))  # (the next try waits)
    wait = f", Retry-After {after:.0f} s" if after is not None else ""
    return Transient(f"HTTP {status}{wait}: {type(exc).__name__}: {what}", answered=True, retry_after=after)


def _network(exc: BaseException) -> str:
    """Whether ``exc`` is an HTTP library's failure to get an answer that is not an ``OSError``: httpx's
    ``TransportError`` (``hf://``: a connection reset, a timeout, an answer that is not HTTP) or aiohttp's
    connection and payload errors (fsspec's ``http://``); not an answer with a status. ``"answered"``
    where the server sent an answer that was bad (not HTTP, a body cut short), ``"failed"`` for the others,
    ``""`` for other exceptions."""
    names = {(k.__module__.partition(".")[0], k.__name__) for k in type(exc).__mro__}
    httpx = {n for lib, n in names if lib.startswith("httpx")}
    aiohttp = {n for lib, n in names if lib == "aiohttp"}
    if "ProtocolError" in httpx or "DecodingError" in httpx or "ClientPayloadError" in aiohttp:
        return "answered"
    return "failed" if "TransportError" in httpx or "ClientConnectionError" in aiohttp else ""


def _raise(exc: BaseException) -> None:
    raise exc


#: the threads of filesystem calls a process runs at once, at most: those still running after their caller
#: gave up count (stuck on a silent server, they end with the filesystem's own timeout, or never)
CALLS_MOST = 128
_calls_freed = threading.Condition()
_calls_live = 0


def _forked() -> None:
    """In a forked child: none of the parent's calls (their threads are not here), and a free lock."""
    global _calls_freed, _calls_live
    _calls_freed, _calls_live = threading.Condition(), 0


if hasattr(os, "register_at_fork"):  # (not on Windows)
    os.register_at_fork(after_in_child=_forked)


def _bounded(fn: Callable[[], Any], limit: float) -> Any:
    """``fn()`` in a daemon thread of its own, waited for at most ``limit`` seconds: a call that has not
    returned by then is a :class:`Transient` failure (the thread is left to end with the filesystem's own
    timeout, if it has one; it keeps no process from exiting). At most :data:`CALLS_MOST` such threads
    run in a process: a call that finds none free within ``limit`` is a :class:`Transient` failure too,
    so retries on a silent server do not pile up threads."""
    global _calls_live
    deadline = time.monotonic() + limit
    with _calls_freed:
        while _calls_live >= CALLS_MOST:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Transient(f"no answer within {limit:g} s: {_calls_live} calls of the filesystem have not "
                                "returned yet (a silent server); no more are started until they do")
            _calls_freed.wait(left)
        _calls_live += 1
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        global _calls_live
        try:
            fut.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            fut.set_exception(exc)
        finally:
            with _calls_freed:
                _calls_live -= 1
                _calls_freed.notify()

    try:
        threading.Thread(target=run, name="seqstore-fsspec-call", daemon=True).start()
    except BaseException:
        with _calls_freed:
            _calls_live -= 1
            _calls_freed.notify()
        raise
    concurrent.futures.wait([fut], max(0.0, deadline - time.monotonic()))
    if not fut.done():
        raise Transient(f"no answer within {limit:g} s (timeout + connect_timeout a request, and 64 KiB/s moved)")
    return fut.result()
