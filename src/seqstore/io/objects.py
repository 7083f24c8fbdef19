"""Object storage clients: one small interface over obstore (S3, GCS, Azure, HTTP) and fsspec.

A store at a URL is read through :class:`ObjectClient`: ``head``, ``get`` (a whole small object),
``get_ranges`` (many byte ranges of many objects, all in flight at once up to ``max_requests``),
``put`` (optionally conditional), ``put_file``, ``list`` and ``delete``; the store code above does not
know which back end (``object_obstore``, ``object_fsspec``) answers. What they share is ``object_common``.

Failures are classified by the back end (into the same errors for both) and retried under the client's
:class:`~seqstore.io.retry.RetryPolicy`: a missing object is :class:`~seqstore.errors.RemoteNotFound`,
refused or missing credentials :class:`~seqstore.errors.CredentialsError` (URL, never the secret), an
object that changed under a conditional read :class:`~seqstore.errors.StaleStoreError`, a conditional
write that lost a race :class:`~seqstore.errors.ConflictError`. Every request has a timeout, so no call
waits forever; obstore's own retries are off, so the attempt count in an error is exact.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from ..errors import RemoteError, RemoteNotFound
from .object_common import (
    REMOTE_SCHEMES,
    SEQSTORE_OPTIONS,
    WHOLE_OBJECT_MOST,
    Answer,
    ObjectBackend,
    ObjectMeta,
    Request,
    check_scheme,
    check_url,
    is_remote,
    redact,
)
from .object_fsspec import FsspecBackend
from .object_links import reset_in_child
from .object_obstore import ObstoreBackend, fork_unsafe
from .options import StoreOptions
from .retry import MAX_BACKOFF, RetryPolicy

__all__ = [
    "MAX_BACKOFF", "fork_unsafe", "ObjectClient", "ObjectMeta", "REMOTE_SCHEMES", "SEQSTORE_OPTIONS", "client_for",
    "is_remote", "redact",
]


def _proxied(url: str) -> bool:
    """Whether the environment sends requests for ``url`` through a proxy (``HTTPS_PROXY``, ``HTTP_PROXY``,
    ``ALL_PROXY``, minus ``NO_PROXY``)."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    if not (proxies.get(parts.scheme.lower()) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass_environment(parts.hostname or "", proxies)  # type: ignore[attr-defined]


class ObjectClient:
    """Requests against one store root URL (``s3://bucket/prefix/corpus.seqstore``). Keys are paths
    relative to that root (``manifest.json``, ``shard-000001/x.npy``).

    ``options``: the back end's configuration (obstore's S3/GCS/Azure/HTTP keys, or the fsspec
    filesystem's) plus seqstore's own keys (``max_requests``, ``max_inflight_bytes``, ``timeout``... with
    their defaults in :class:`~seqstore.io.options.StoreOptions`), or a ``StoreOptions`` parsed from them.
    """

    def __init__(self, url: str, options: StoreOptions | Mapping[str, Any] | None = None,
                 filesystem: Any = None) -> None:
        self.url = url.rstrip("/")
        check_url(self.url)
        if filesystem is None:  # (a filesystem given takes any URL)
            check_scheme(self.url)
        o = StoreOptions.of(self.url, options, filesystem=filesystem)  # checked: a ConfigError names the option
        self.max_requests, self.max_inflight_bytes = o.max_requests, o.max_inflight_bytes
        self.coalesce_gap, self.timeout, self.connect_timeout = o.coalesce_gap, o.timeout, o.connect_timeout
        self.direct_reads = o.direct_reads
        self.retry = RetryPolicy(_endpoint(self.url, o.backend), retry_timeout=o.retry_timeout,
                                 max_retries=o.max_retries, timeout=o.timeout, connect_timeout=o.connect_timeout)
        self.options = dict(o.backend)  # the back end's own options
        self.filesystem = o.filesystem
        self._pid = -1
        self._backend: ObjectBackend | None = None
        self._lock = threading.Lock()
        reset_in_child(self, "_lock")  # (a thread of the parent may have held it at the fork)

    # the client is rebuilt in a forked or unpickled process (sockets and event loops do not survive a fork)
    @property
    def backend(self) -> ObjectBackend:
        if self._backend is None or self._pid != os.getpid():
            with self._lock:
                if self._backend is None or self._pid != os.getpid():
                    fsspec = self.filesystem is not None or urlsplit(self.url).scheme.lower() not in REMOTE_SCHEMES
                    self._backend = (FsspecBackend if fsspec else ObstoreBackend)(self)
                    self._pid = os.getpid()
        return self._backend

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_direct", "_direct_bytes")}
        return {**state, "_backend": None, "_pid": -1, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        reset_in_child(self, "_lock")

    def __repr__(self) -> str:
        return f"ObjectClient({self.url!r}, options={redact(self.options)!r})"

    def key_url(self, key: str) -> str:
        return f"{self.url}/{key}"

    def direct(self, key: str, tag: str | None) -> tuple[str, str | None] | None:
        """A URL that answers range GETs of object ``key`` over plain HTTP(S), for
        :class:`~seqstore.io.object_direct.DirectReader`, with the If-Match value of version tag ``tag``;
        None where the back end has none, where ``direct_reads`` is off, or where the environment names a
        proxy for the URL's host (``HTTPS_PROXY`` and the others; obstore follows them, the direct reader
        does not): the reads then go through the back end."""
        got = self.backend.direct(key, tag) if self.direct_reads else None
        return None if got is None or _proxied(got[0]) else got

    def resign(self, url: str) -> str | None:
        """A URL in place of ``url`` (one :meth:`direct` gave) that the service refused: signed anew, as the
        credentials it was signed with may have expired since (temporary credentials rotate, and a
        presigned URL is kept for up to 50 minutes); None where ``url`` is not a URL the back end signed."""
        return self.backend.resign(url)

    def direct_budget(self, n: int) -> bool:
        """Count ``n`` more bytes (negative: fewer) in flight through :attr:`direct_reader` for the node
        cache; False (and nothing counted) when that would pass ``max_inflight_bytes``."""
        with self._lock:
            pid, held = self.__dict__.get("_direct_bytes", (os.getpid(), 0))
            if pid != os.getpid():  # a forked child: the parent's requests are not its own
                held = 0
            if n > 0 and held and held + n > self.max_inflight_bytes:
                return False
            self.__dict__["_direct_bytes"] = (os.getpid(), held + n)
            return True

    @property
    def direct_reader(self) -> Any:
        """This client's :class:`~seqstore.io.object_direct.DirectReader` (one per client and process)."""
        reader = self.__dict__.get("_direct")
        if reader is None or reader[0] != os.getpid():
            from .object_direct import DirectReader

            with self._lock:  # (two threads' first reads make one reader: one set of connections)
                reader = self.__dict__.get("_direct")
                if reader is None or reader[0] != os.getpid():
                    reader = self.__dict__["_direct"] = (os.getpid(), DirectReader(self))
        return reader[1]

    # ----------------------------------------------------------------------------------- requests

    def head(self, key: str) -> ObjectMeta:
        return self.retry.run(self.key_url(key), lambda: self.backend.head(key))

    def get(self, key: str, limit: int = WHOLE_OBJECT_MOST) -> tuple[memoryview, ObjectMeta]:
        """The whole object ``key`` and its meta; one of more than ``limit`` bytes is refused before its
        body is read (a RemoteError naming its URL, its size and the limit)."""
        return self.retry.run(self.key_url(key), lambda: self.backend.get(key, limit))

    def get_ranges(self, requests: Sequence[Request], *, missing_ok: bool = False) -> list[Answer]:
        """``requests`` of ``(key, start, end, etag or None)``, all in flight at once (at most
        ``max_requests``); each answer is the bytes ``[start, end)`` and, where the back end reports
        it, the object's meta. With an etag the read is conditional: :class:`StaleStoreError` if the
        object changed. Each request is retried on its own."""
        if not requests:
            return []
        answers: list[Answer] = self.answer(self.submit(list(requests), missing_ok=missing_ok), self.url, len(requests))
        return answers

    def patience(self) -> float:
        """Seconds a request may take at most, all its attempts and backoffs counted (plus slack)."""
        return self.retry.patience()

    def answer(self, fut: concurrent.futures.Future[Any], url: str, requests: int = 1) -> Any:
        """The result of ``fut`` (``requests`` requests submitted), waited for at most as long as they may
        take, ``max_requests`` at a time, every attempt counted: else the client's thread is stuck, a
        RemoteError naming ``url``."""
        limit = self.patience() * -(-max(requests, 1) // self.max_requests)
        try:
            return fut.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            raise RemoteError(f"{url}: no answer within {limit:.0f} s (longer than every request's timeout and "
                              "retries allow): the client's thread is stuck", url=url, attempts=0) from None

    def submit(
        self, requests: Sequence[Request], on_each: Any = None, *, missing_ok: bool = False, with_meta: bool = True
    ) -> concurrent.futures.Future[list[Answer]]:
        """:meth:`get_ranges` without waiting: a future of the answers. ``on_each(i, data, meta)`` is
        called for each answer as it arrives, before the future completes (in the client's thread); the
        future's answers then carry empty bytes (a future held for waiting keeps no bodies alive).
        ``missing_ok``: a missing object answers ``(empty, None)`` instead of raising. ``with_meta=False``:
        ranges inside objects of known size answer no meta (None; one conversion less per request)."""
        return self.backend.submit(requests, on_each, missing_ok, with_meta)

    def put(self, key: str, data: bytes | memoryview, *, mode: str | dict[str, Any] = "overwrite") -> str:
        """Write ``data`` as object ``key`` atomically; ``mode``: ``"overwrite"``, ``"create"`` (fails
        with ConflictError if it exists) or ``{"e_tag": ...}`` (only if unchanged). Returns the ETag."""
        return self.retry.run(self.key_url(key), lambda: self.backend.put(key, data, mode))

    def put_file(self, key: str, path: str | os.PathLike[str]) -> str:
        """Upload a local file (multipart where large). Returns the ETag."""
        return self.retry.run(self.key_url(key), lambda: self.backend.put_file(key, os.fspath(path)))

    def put_stream(self, key: str, chunks: Callable[[], Iterable[bytes]]) -> str:
        """Upload the bytes ``chunks()`` yields as object ``key`` (a multipart upload: O(chunk) memory
        whatever the size). The object appears only once the iterator is exhausted, so an exception the
        iterator raises (e.g. a checksum that does not match) leaves no object. ``chunks`` is called
        again for each retry. Returns the ETag."""
        return self.retry.run(self.key_url(key), lambda: self.backend.put_stream(key, chunks))

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        """Objects under ``prefix`` (relative to the root), keys relative to the root."""
        yield from self.retry.run(self.key_url(prefix), lambda: list(self.backend.list(prefix)))

    def delete(self, key: str) -> None:
        """Delete object ``key``; RemoteNotFound where the service says it is not there, but not on a retry:
        the try before (its answer lost) deleted it."""
        try:
            self.retry.run(self.key_url(key), lambda: self.backend.delete(key))
        except RemoteNotFound as exc:
            if exc.attempts <= 1:
                raise

    def copy(self, src: str, dst: str) -> None:
        """Copy object ``src`` to ``dst`` (keys under this root) inside the service, without moving the
        bytes through this process (S3 CopyObject, GCS rewrite, Azure copy); replaces ``dst``. S3 copies
        objects up to 5 GiB this way (larger ones: :class:`~seqstore.errors.RemoteError`)."""
        self.retry.run(self.key_url(dst), lambda: self.backend.copy(src, dst))

    def conditional_writes(self) -> bool:
        """Whether the back end can replace an object only if it is unchanged (If-Match)."""
        return self.backend.conditional


def _endpoint(url: str, options: Mapping[str, Any]) -> str:
    """The server a client at ``url`` talks to, as the unreachable error names it: the ``endpoint``
    option (or ``AWS_ENDPOINT_URL`` for S3), else the URL's scheme and host."""
    opts = {k.lower().removeprefix("aws_"): v for k, v in options.items()}
    parts = urlsplit(url)
    named = opts.get("endpoint") or opts.get("endpoint_url") or (parts.scheme.lower() in ("s3", "s3a") and (
        os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")))
    return str(named) if named else f"{parts.scheme}://{parts.netloc}"


def client_for(url: str, storage_options: Mapping[str, Any] | None = None, filesystem: Any = None) -> ObjectClient:
    return ObjectClient(url, storage_options, filesystem)
