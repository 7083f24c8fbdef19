"""Object storage clients: one small interface over obstore (S3, GCS, Azure, HTTP) and fsspec.

A store at a URL is read through :class:`ObjectClient`: ``head``, ``get`` (a whole small object),
``get_ranges`` (many byte ranges of many objects, all in flight at once up to ``max_requests``),
``put`` (optionally conditional), ``put_file``, ``list`` and ``delete``. Both back ends answer the same
calls; the store code above does not know which one it talks to.

Failures are classified by the back end that met them (into the same errors for both) and retried here:

- transient (HTTP 5xx, connection reset, timeout, a body shorter than the range asked for) are retried
  with exponential backoff (50 ms doubling, at most :data:`MAX_BACKOFF` seconds, jittered) for
  ``retry_timeout`` seconds (default 120) counted from the first failure, then raised as
  :class:`~seqstore.errors.RemoteError` naming the URL, the number of attempts and the seconds spent. The
  budget is time, not a count of attempts: with a link down every attempt fails at once, and a count
  would be spent in a second or two. The clock is the client's (one per process and store): while
  every request fails, the failure streak began when the first one failed, so requests queued behind
  it (or asked again by the caller) do not each get a budget of their own; a request that succeeds
  ends the streak. ``max_retries`` (default: no limit) bounds the number of retries as well;
- a missing object is :class:`~seqstore.errors.RemoteNotFound` (the store turns it into a
  ``CorruptionError`` naming the key where the object should exist);
- refused credentials are :class:`~seqstore.errors.CredentialsError` (URL, never the secret);
- an object that changed under a conditional read is :class:`~seqstore.errors.StaleStoreError`; a
  conditional write that lost a race is :class:`~seqstore.errors.ConflictError`.

Every request has a timeout (``timeout`` seconds, default 30), so no call waits forever: a request
whose failures go on gives up at most ``retry_timeout`` + ``timeout`` + ``connect_timeout`` seconds
after its first failure (the last attempt may have started just before the budget ran out).
obstore's own retries are switched off: the retry loops are seqstore's, so the attempt count in an
error is exact.

This module holds the client (its options, the choice of back end, the retry loop of single requests);
the back ends are ``object_obstore`` and ``object_fsspec``, what they share (:class:`ObjectMeta`, the
back-end interface, :func:`is_remote`, :func:`redact`) is ``object_common``; the public names are
importable from here.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from ..errors import RemoteError
from .object_common import (
    REMOTE_SCHEMES,
    SEQSTORE_OPTIONS,
    ObjectMeta,
    _Backend,
    _Transient,
    check_options,
    is_remote,
    option_flag,
    redact,
)
from .object_fsspec import _FsspecBackend
from .object_obstore import _ObstoreBackend, fork_unsafe

#: longest wait between two attempts of a request (seconds, before jitter)
MAX_BACKOFF = 5.0

__all__ = [
    "MAX_BACKOFF",
    "fork_unsafe",
    "ObjectClient",
    "ObjectMeta",
    "REMOTE_SCHEMES",
    "SEQSTORE_OPTIONS",
    "client_for",
    "is_remote",
    "redact",
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
    filesystem's) plus seqstore's own keys: ``max_requests`` (requests in flight per process, default
    64), ``max_inflight_bytes`` (bytes of answers in flight at most, default 256 MiB: a request that
    would pass it waits for earlier ones, one larger than it goes alone; obstore back end),
    ``coalesce_gap`` (byte ranges closer than this are fetched as one, default 64 KiB),
    ``timeout`` (seconds per request, default 30), ``connect_timeout`` (default 5),
    ``retry_timeout`` (seconds of retrying a transient failure, default 120), ``max_retries`` (retries
    at most, default None: only ``retry_timeout`` limits them), ``read_once`` (default false: the store's
    ``iter_batches`` fetches its runs of batches into memory instead of the node cache,
    :mod:`seqstore.store.read.stream`), ``direct_reads`` (default true: range reads go through
    :attr:`direct_reader` where the back end gives URLs for them, :meth:`direct`; false: always obstore).
    """

    def __init__(self, url: str, options: Mapping[str, Any] | None = None, filesystem: Any = None) -> None:
        opts = dict(options or {})
        self.url = url.rstrip("/")
        check_options(self.url, opts)  # a seqstore error naming the option, not int()'s ValueError
        self.max_requests = int(opts.pop("max_requests", 64))
        self.max_inflight_bytes = int(opts.pop("max_inflight_bytes", 256 << 20))
        self.coalesce_gap = int(opts.pop("coalesce_gap", 64 << 10))
        self.timeout = float(opts.pop("timeout", 30.0))
        self.connect_timeout = float(opts.pop("connect_timeout", 5.0))
        retries = opts.pop("max_retries", None)
        self.max_retries: int | None = None if retries is None or retries == "" else int(retries)
        self.retry_timeout = float(opts.pop("retry_timeout", 120.0))
        self.read_once = option_flag(opts.pop("read_once", False))
        self.direct_reads = option_flag(opts.pop("direct_reads", True))
        if (self.max_requests < 1 or self.max_inflight_bytes < 1 or (self.max_retries or 0) < 0 or self.timeout <= 0
                or not self.retry_timeout >= 0):
            raise ValueError(
                f"{self.url}: max_requests and max_inflight_bytes must be >= 1, max_retries >= 0, timeout > 0 and "
                f"retry_timeout >= 0 (got {self.max_requests}, {self.max_inflight_bytes}, {self.max_retries}, "
                f"{self.timeout}, {self.retry_timeout})"
            )
        # monotonic time of the first failure of the current streak (None: the last request succeeded)
        self._failing_since: float | None = None
        self._last_failure = 0.0  # monotonic time of the streak's latest failure
        self._options = opts
        self._filesystem = filesystem
        self._pid = -1
        self._backend: _Backend | None = None
        self._lock = threading.Lock()

    # the client is rebuilt in a forked or unpickled process (sockets and event loops do not survive a fork)
    @property
    def backend(self) -> _Backend:
        if self._backend is None or self._pid != os.getpid():
            with self._lock:
                if self._backend is None or self._pid != os.getpid():
                    if self._filesystem is not None or urlsplit(self.url).scheme.lower() not in REMOTE_SCHEMES:
                        self._backend = _FsspecBackend(self)
                    else:
                        self._backend = _ObstoreBackend(self)
                    self._pid = os.getpid()
        return self._backend

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_backend=None, _pid=-1, _lock=None, _failing_since=None, _last_failure=0.0)
        state.pop("_direct", None)
        state.pop("_direct_bytes", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._failing_since = None

    def __repr__(self) -> str:
        return f"ObjectClient({self.url!r}, options={redact(self._options)!r})"

    def key_url(self, key: str) -> str:
        return f"{self.url}/{key}"

    def direct(self, key: str, tag: str | None) -> tuple[str, str | None] | None:
        """A URL that answers range GETs of object ``key`` over plain HTTP(S), for
        :class:`~seqstore.io.object_direct.DirectReader`, with the If-Match value of version tag ``tag``;
        None where the back end has none, where ``direct_reads`` is off, or where the environment names a
        proxy for the URL's host (``HTTPS_PROXY`` and the others; obstore follows them, the direct reader
        does not): the reads then go through the back end."""
        if not self.direct_reads:
            return None
        got = self.backend.direct(key, tag)
        if got is not None and _proxied(got[0]):
            return None
        return got

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

            reader = self.__dict__["_direct"] = (os.getpid(), DirectReader(self))
        return reader[1]

    # ----------------------------------------------------------------------------------- requests

    def retry_delay(self, attempt: int, first_failure: float) -> float | None:
        """After the ``attempt``-th try of a request failed transiently (its first failure at monotonic
        time ``first_failure``): the seconds to wait before the next try, or None to give up (the time
        budget, counted from the earlier of the request's first failure and the client's failure
        streak, is spent, or ``max_retries`` retries were made)."""
        now = time.monotonic()
        since = self._failing_since
        if since is not None and now - self._last_failure > self.timeout + self.connect_timeout + 2 * MAX_BACKOFF:
            since = None  # that streak's failures stopped long ago (no request ran since): a new streak
        if since is None:
            self._failing_since = since = first_failure
        self._last_failure = now
        left = min(first_failure, since) + self.retry_timeout - now
        if left <= 0 or (self.max_retries is not None and attempt > self.max_retries):
            return None
        return min(left, min(MAX_BACKOFF, 0.05 * 2.0 ** min(attempt - 1, 16)) * (0.5 + random.random()))

    def retry_ok(self) -> None:
        """The service answered a request (it succeeded, or a definite answer such as a missing object or
        a failed precondition): the failure streak, if any, is over."""
        self._failing_since = None

    def gave_up(self, what: str, attempt: int, first_failure: float, last: BaseException) -> RemoteError:
        """The error of a request that failed ``attempt`` times since ``first_failure``."""
        spent = time.monotonic() - first_failure
        err = RemoteError(
            f"{what}: failed after {attempt} attempts in {spent:.1f} s ({last}); transient failures are retried "
            f"for retry_timeout={self.retry_timeout:g} s"
            + (f", max_retries={self.max_retries}" if self.max_retries is not None else ""),
            url=what, attempts=attempt,
        )
        err.exhausted = True  # type: ignore[attr-defined]  # the streak goes on (see _retrying)
        return err

    def _retrying(self, what: str, fn: Any) -> Any:
        """Call ``fn()``; retry transient failures with backoff within the time budget; raise named errors."""
        attempt = 0
        first = 0.0
        while True:
            attempt += 1
            try:
                out = fn()
            except RemoteError as exc:  # not retried; it counts this call's tries (a ConflictError on a
                exc.attempts = max(exc.attempts, attempt)  # later try may refuse our own earlier write)
                if self._failing_since is not None and not getattr(exc, "exhausted", False):
                    self.retry_ok()  # an answer, not a failure of the service: the streak is over
                raise
            except _Transient as exc:
                if attempt == 1:
                    first = time.monotonic()
                delay = self.retry_delay(attempt, first)
                if delay is None:
                    raise self.gave_up(what, attempt, first, exc) from None
                time.sleep(delay)
                continue
            if self._failing_since is not None:
                self._failing_since = None
            return out

    def head(self, key: str) -> ObjectMeta:
        meta: ObjectMeta = self._retrying(self.key_url(key), lambda: self.backend.head(key))
        return meta

    def get(self, key: str) -> tuple[memoryview, ObjectMeta]:
        """The whole object ``key`` and its meta."""
        return self._retrying(self.key_url(key), lambda: self.backend.get(key))  # type: ignore[no-any-return]

    def get_ranges(
        self, requests: Sequence[tuple[str, int, int, str | None]], *, missing_ok: bool = False
    ) -> list[tuple[memoryview, ObjectMeta | None]]:
        """``requests`` of ``(key, start, end, etag or None)``, all in flight at once (at most
        ``max_requests``); each answer is the bytes ``[start, end)`` and, where the back end reports
        it, the object's meta. With an etag the read is conditional: :class:`StaleStoreError` if the
        object changed. Each request is retried on its own."""
        if not requests:
            return []
        fut = self.submit(list(requests), missing_ok=missing_ok)
        try:
            return fut.result(timeout=self.patience())
        except concurrent.futures.TimeoutError:
            raise RemoteError(
                f"{self.url}: no answer within {self.patience():.0f} s (longer than every request's timeout and "
                "retries allow): the client's thread is stuck", url=self.url, attempts=0,
            ) from None

    def patience(self) -> float:
        """Seconds a request may take at most, all its attempts and backoffs counted (plus slack)."""
        attempt = self.timeout + self.connect_timeout
        most = self.retry_timeout + 2 * attempt + 30.0  # the first failure, the budget, a last attempt
        if self.max_retries is not None:
            most = min(most, (self.max_retries + 1) * (attempt + MAX_BACKOFF * 1.5) + 30.0)
        return most

    def submit(
        self,
        requests: Sequence[tuple[str, int, int, str | None]],
        on_each: Any = None,
        *,
        missing_ok: bool = False,
        with_meta: bool = True,
    ) -> concurrent.futures.Future[list[tuple[memoryview, ObjectMeta | None]]]:
        """:meth:`get_ranges` without waiting: a future of the answers. ``on_each(i, data, meta)`` is
        called for each answer as it arrives, before the future completes (in the client's thread).
        With ``on_each`` the future's answers carry empty bytes (the callback had them: a future held
        for waiting does not keep every body of its requests alive).
        ``missing_ok``: a missing object answers ``(empty, None)`` instead of raising. ``with_meta=False``:
        ranges ``[start, end)`` inside objects of known size need no meta (None; one conversion less per
        request on the data path)."""
        return self.backend.submit(requests, on_each, missing_ok, with_meta)

    def put(self, key: str, data: bytes | memoryview, *, mode: str | dict[str, Any] = "overwrite") -> str:
        """Write ``data`` as object ``key`` atomically; ``mode``: ``"overwrite"``, ``"create"`` (fails
        with ConflictError if it exists) or ``{"e_tag": ...}`` (only if unchanged). Returns the ETag."""
        return self._retrying(self.key_url(key), lambda: self.backend.put(key, data, mode))  # type: ignore[no-any-return]

    def put_file(self, key: str, path: str | os.PathLike[str]) -> str:
        """Upload a local file (multipart where large). Returns the ETag."""
        return self._retrying(self.key_url(key), lambda: self.backend.put_file(key, os.fspath(path)))  # type: ignore[no-any-return]

    def put_stream(self, key: str, chunks: Callable[[], Iterable[bytes]]) -> str:
        """Upload the bytes ``chunks()`` yields as object ``key`` (a multipart upload: O(chunk) memory
        whatever the size). The object appears only once the iterator is exhausted, so an exception the
        iterator raises (e.g. a checksum that does not match) leaves no object. ``chunks`` is called
        again for each retry. Returns the ETag."""
        return self._retrying(self.key_url(key), lambda: self.backend.put_stream(key, chunks))  # type: ignore[no-any-return]

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        """Objects under ``prefix`` (relative to the root), keys relative to the root."""
        items = self._retrying(self.key_url(prefix), lambda: list(self.backend.list(prefix)))
        yield from items

    def delete(self, key: str) -> None:
        self._retrying(self.key_url(key), lambda: self.backend.delete(key))

    def copy(self, src: str, dst: str) -> None:
        """Copy object ``src`` to ``dst`` (keys under this root) inside the service, without moving the
        bytes through this process (S3 CopyObject, GCS rewrite, Azure copy); replaces ``dst``. S3 copies
        objects up to 5 GiB this way (larger ones: :class:`~seqstore.errors.RemoteError`)."""
        self._retrying(self.key_url(dst), lambda: self.backend.copy(src, dst))

    def conditional_writes(self) -> bool:
        """Whether the back end can replace an object only if it is unchanged (If-Match)."""
        return self.backend.conditional


def client_for(url: str, storage_options: Mapping[str, Any] | None = None, filesystem: Any = None) -> ObjectClient:
    return ObjectClient(url, storage_options, filesystem)
