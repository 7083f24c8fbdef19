"""Object storage clients: one small interface over obstore (S3, GCS, Azure, HTTP) and fsspec.

A store at a URL is read through :class:`ObjectClient`: ``head``, ``get`` (a whole small object),
``get_ranges`` (many byte ranges of many objects, all in flight at once up to ``max_requests``),
``put`` (optionally conditional), ``put_file``, ``list`` and ``delete``. Both back ends answer the same
calls; the store code above does not know which one it talks to.

Failures are classified once, here:

- transient (HTTP 5xx, connection reset, timeout, a body shorter than the range asked for) are retried
  with exponential backoff up to ``max_retries`` times, then raised as :class:`~seqstore.errors.RemoteError`
  naming the URL and the number of attempts;
- a missing object is :class:`~seqstore.errors.RemoteNotFound` (the store turns it into a
  ``CorruptionError`` naming the key where the object should exist);
- refused credentials are :class:`~seqstore.errors.CredentialsError` (URL, never the secret);
- an object that changed under a conditional read is :class:`~seqstore.errors.StaleStoreError`; a
  conditional write that lost a race is :class:`~seqstore.errors.ConflictError`.

Every request has a timeout (``timeout`` seconds, default 30), so no call waits forever.
obstore's own retries are switched off: the retry loop is this module's, so the attempt count in an
error is exact.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConflictError, CredentialsError, RemoteError, RemoteNotFound, StaleStoreError

__all__ = [
    "fork_unsafe",
    "ObjectClient",
    "ObjectMeta",
    "REMOTE_SCHEMES",
    "SEQSTORE_OPTIONS",
    "client_for",
    "is_remote",
    "redact",
]

#: URL schemes that name object storage (obstore); any other ``scheme://`` goes to fsspec.
REMOTE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "azure", "http", "https")
#: storage_options keys that are seqstore's own (popped before the client sees the options)
SEQSTORE_OPTIONS = ("max_requests", "max_inflight_bytes", "coalesce_gap", "timeout", "max_retries", "connect_timeout")
_SECRET_WORDS = ("secret", "token", "key", "password", "credential", "sas", "signature")
#: answers up to this size are taken synchronously once their headers are in (see ``_ObstoreBackend._one``)
_SMALL_BODY = 64 << 10
_EMPTY = memoryview(b"")


# obstore runs its requests on a tokio runtime whose threads do not survive fork(): a child forked after
# the parent used obstore would wait forever on its first request. The pid that started obstore's runtime
# is kept, and a forked child refuses to use obstore with an error instead of hanging.
_obstore_pid: int | None = None
_forked_from: int | None = None


def _after_fork_in_child() -> None:
    global _forked_from
    if _obstore_pid is not None:
        _forked_from = _obstore_pid


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_unsafe() -> bool:
    """Whether a process forked from this one now could not read object storage (obstore has started
    its runtime here): start worker processes with ``forkserver`` or ``spawn`` then."""
    return _obstore_pid is not None and _obstore_pid == os.getpid()


def is_remote(path: Any) -> bool:
    """Whether ``path`` is a URL of a store that is not a local path (``file://`` is local)."""
    if not isinstance(path, str) or "://" not in path:
        return False
    return urlsplit(path).scheme.lower() not in ("", "file")


def redact(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` with every value whose key looks secret replaced by ``"***"`` (for reprs and logs)."""
    out: dict[str, Any] = {}
    for k, v in (options or {}).items():
        out[k] = "***" if any(w in k.lower() for w in _SECRET_WORDS) and "id" not in k.lower() else v
    return out


@dataclass(frozen=True)
class ObjectMeta:
    """What a store needs to know about an object: its size and version tag (ETag / generation)."""

    key: str
    size: int
    etag: str
    #: last modification, seconds since the epoch (0.0 where the back end does not say; set by ``list``)
    mtime: float = 0.0


class _ByteBudget:
    """At most ``limit`` bytes of answers in flight (in the client's event loop): a request waits, in
    arrival order, until what it may receive fits; one larger than the limit goes when nothing else is
    in flight. ``peak``: the most bytes ever held at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []

    def _fits(self, n: int) -> bool:
        return self.used == 0 or self.used + n <= self.limit

    def _take(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def _release(self, n: int) -> None:
        self.used -= n
        while self._waiting and self._fits(self._waiting[0][0]):
            m, fut = self._waiting.pop(0)
            if not fut.done():
                self._take(m)
                fut.set_result(None)

    @contextlib.asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        """``n`` bytes of the budget while the block runs, given back on exit (also on cancellation, without
        an await that a second cancellation could interrupt)."""
        if self._waiting or not self._fits(n):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append((n, fut))
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():  # granted just before the cancellation: give it back
                    self._release(n)
                else:
                    self._waiting = [w for w in self._waiting if w[1] is not fut]
                    self._release(0)  # those behind it may fit now
                raise
        else:
            self._take(n)
        try:
            yield
        finally:
            self._release(n)


class _Transient(Exception):
    """A failure worth retrying."""


class ObjectClient:
    """Requests against one store root URL (``s3://bucket/prefix/corpus.seqstore``). Keys are paths
    relative to that root (``manifest.json``, ``shard-000001/x.npy``).

    ``options``: the back end's configuration (obstore's S3/GCS/Azure/HTTP keys, or the fsspec
    filesystem's) plus seqstore's own keys: ``max_requests`` (requests in flight per process, default
    64), ``max_inflight_bytes`` (bytes of answers in flight at most, default 256 MiB: a request that
    would pass it waits for earlier ones, one larger than it goes alone; obstore back end),
    ``coalesce_gap`` (byte ranges closer than this are fetched as one, default 64 KiB),
    ``timeout`` (seconds per request, default 30), ``connect_timeout`` (default 5),
    ``max_retries`` (default 5).
    """

    def __init__(self, url: str, options: Mapping[str, Any] | None = None, filesystem: Any = None) -> None:
        opts = dict(options or {})
        self.url = url.rstrip("/")
        self.max_requests = int(opts.pop("max_requests", 64))
        self.max_inflight_bytes = int(opts.pop("max_inflight_bytes", 256 << 20))
        self.coalesce_gap = int(opts.pop("coalesce_gap", 64 << 10))
        self.timeout = float(opts.pop("timeout", 30.0))
        self.connect_timeout = float(opts.pop("connect_timeout", 5.0))
        self.max_retries = int(opts.pop("max_retries", 5))
        if self.max_requests < 1 or self.max_inflight_bytes < 1 or self.max_retries < 0 or self.timeout <= 0:
            raise ValueError(
                f"{self.url}: max_requests and max_inflight_bytes must be >= 1, max_retries >= 0 and timeout > 0 "
                f"(got {self.max_requests}, {self.max_inflight_bytes}, {self.max_retries}, {self.timeout})"
            )
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
        state.update(_backend=None, _pid=-1, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ObjectClient({self.url!r}, options={redact(self._options)!r})"

    def key_url(self, key: str) -> str:
        return f"{self.url}/{key}"

    # ----------------------------------------------------------------------------------- requests

    def _retrying(self, what: str, fn: Any) -> Any:
        """Call ``fn()``; retry transient failures with backoff up to ``max_retries``; raise named errors."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except RemoteError as exc:  # not retried; it counts this call's tries (a ConflictError on a
                exc.attempts = max(exc.attempts, attempt)  # later try may refuse our own earlier write)
                raise
            except _Transient as exc:
                if attempt > self.max_retries:
                    raise RemoteError(
                        f"{what}: failed after {attempt} attempts ({exc})", url=what, attempts=attempt
                    ) from None
                time.sleep(min(2.0, 0.05 * 2 ** (attempt - 1)) * (0.5 + random.random()))

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
        return (self.max_retries + 1) * (self.timeout + self.connect_timeout + 2.0) + 30.0

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


class _Backend(abc.ABC):
    """What an object-store client answers (see ObjectClient, which adds the retry loop)."""

    conditional = False

    @abc.abstractmethod
    def head(self, key: str) -> ObjectMeta:
        """See the ObjectClient method of the same name."""

    @abc.abstractmethod
    def get(self, key: str) -> tuple[memoryview, ObjectMeta]:
        """See the ObjectClient method of the same name."""

    @abc.abstractmethod
    def submit(
        self,
        requests: Sequence[tuple[str, int, int, str | None]],
        on_each: Any,
        missing_ok: bool = False,
        with_meta: bool = True,
    ) -> concurrent.futures.Future[list[tuple[memoryview, ObjectMeta | None]]]:
        """See the ObjectClient method of the same name."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes | memoryview, mode: str | dict[str, Any]) -> str:
        """See the ObjectClient method of the same name."""

    @abc.abstractmethod
    def put_file(self, key: str, path: str) -> str:
        """See the ObjectClient method of the same name."""

    @abc.abstractmethod
    def put_stream(self, key: str, chunks: Callable[[], Iterable[bytes]]) -> str:
        """See the ObjectClient method of the same name."""

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        """See the ObjectClient method of the same name."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """See the ObjectClient method of the same name."""

    @abc.abstractmethod
    def copy(self, src: str, dst: str) -> None:
        """See the ObjectClient method of the same name."""


# --------------------------------------------------------------------------------------- obstore


def _status_of(exc: BaseException) -> int | None:
    text = str(exc)
    for marker in ("status: ", "Status: ", "status code ", "HTTP status "):
        i = text.find(marker)
        if i >= 0:
            digits = text[i + len(marker) : i + len(marker) + 3]
            if digits.isdigit():
                return int(digits)
    return None


class _Loop:
    """One asyncio event loop in a daemon thread per process, running the clients' requests."""

    _instance: _Loop | None = None
    _pid = -1
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="seqstore-remote", daemon=True)
        self.thread.start()

    @classmethod
    def get(cls) -> _Loop:
        if cls._instance is None or cls._pid != os.getpid():
            with cls._lock:
                if cls._instance is None or cls._pid != os.getpid():
                    cls._instance = _Loop()
                    cls._pid = os.getpid()
        return cls._instance



class _ObstoreBackend(_Backend):
    conditional = True
    #: whether the service answers a suffix range (``bytes=-n``); Azure Blob Storage does not, so there a
    #: suffix request costs a HEAD (for the size) and then a plain range request: two round trips
    suffix_ranges = True
    #: Google Cloud Storage: a conditional replace names the object's generation, not its ETag (which the
    #: XML API derives from the content), so the version tags seqstore keeps are ``"<ETag>#<generation>"``
    generations = False

    def __init__(self, client: ObjectClient) -> None:
        try:
            import obstore
            import obstore.exceptions as oex
            from obstore.store import from_url as _from_url
        except ImportError as exc:
            raise ImportError(
                f"{client.url}: reading object storage needs obstore: pip install 'seqstore[remote]'"
            ) from exc
        global _obstore_pid
        if _forked_from is not None and _forked_from != os.getpid():
            raise RemoteError(
                f"{client.url}: this process was forked from process {_forked_from} after that process had "
                "started obstore, whose threads do not survive fork(); start worker processes with "
                "multiprocessing_context='forkserver' or 'spawn' (SeqDataLoader does this itself for remote "
                "stores)", url=client.url, attempts=0,
            )
        _obstore_pid = os.getpid()
        from_url: Any = _from_url  # its overloads are typed per service; the options are the user's
        self.obs = obstore
        self.oex = oex
        self.c = client
        parts = urlsplit(client.url)
        scheme = parts.scheme.lower()
        opts = dict(client._options)
        client_options: dict[str, Any] = {
            "timeout": timedelta(seconds=client.timeout),
            "connect_timeout": timedelta(seconds=client.connect_timeout),
        }
        for k in ("allow_http", "allow_invalid_certificates", "http1_only"):
            if k in opts:
                v = opts.pop(k)
                client_options[k] = v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")
        for k in ("proxy_url", "user_agent"):
            if k in opts:
                client_options[k] = str(opts.pop(k))
        if "allow_http" not in client_options:
            # client options given here replace those the client reads from the environment: keep this one
            env = {"s3": "AWS", "s3a": "AWS", "gs": "GOOGLE", "gcs": "GOOGLE"}.get(scheme, "AZURE")
            if os.environ.get(f"{env}_ALLOW_HTTP", "").lower() in ("1", "true", "yes"):
                client_options["allow_http"] = True
        if scheme in ("az", "abfs", "abfss", "azure"):
            self.suffix_ranges = False
        self.generations = scheme in ("gs", "gcs")
        if scheme in ("http", "https"):
            self.conditional = False
            self.store = from_url(client.url, client_options=client_options, retry_config={"max_retries": 0})
        else:
            if scheme == "s3a":
                client_url = urlunsplit(("s3", *parts[1:]))
            else:
                client_url = client.url
            self.store = from_url(
                client_url, config=opts or None, client_options=client_options, retry_config={"max_retries": 0}
            )
        self.sem: asyncio.Semaphore | None = None
        self.budget: _ByteBudget | None = None

    # version tags -------------------------------------------------------------------------------
    def _tag(self, m: Any) -> str:
        """The version tag of an object from obstore's meta (or a put's result)."""
        etag, version = m.get("e_tag"), m.get("version")
        if self.generations and etag and version:
            return f"{etag}#{version}"
        return str(etag or version or "")

    def _mode(self, mode: str | dict[str, Any]) -> Any:
        """obstore's put mode for seqstore's (``{"e_tag": tag}``: replace only that version)."""
        if isinstance(mode, dict) and self.generations:
            etag, _, version = str(mode["e_tag"]).partition("#")
            return {"e_tag": etag, "version": version or None}
        return mode

    def _if_match(self, tag: str) -> str:
        """The ETag to send as If-Match for version tag ``tag``."""
        return tag.partition("#")[0] if self.generations else tag

    # errors -------------------------------------------------------------------------------------
    def _classify(self, exc: BaseException, key: str, conditional: bool = False) -> BaseException:
        oex = self.oex
        url = self.c.key_url(key)
        if isinstance(exc, oex.NotFoundError):
            return RemoteNotFound(f"{url}: no such object", url=url, attempts=1)
        if isinstance(exc, (oex.PermissionDeniedError, oex.UnauthenticatedError)):
            return CredentialsError(
                f"{url}: access refused ({type(exc).__name__}); check the credentials for this bucket "
                "(environment, storage_options or the cloud SDK's configuration)",
                url=url, attempts=1,
            )
        if isinstance(exc, oex.PreconditionError):
            if conditional:
                return StaleStoreError(
                    f"{url}: the object changed while the store was open (its ETag no longer matches); "
                    "reopen the store", url=url, attempts=1,
                )
            return ConflictError(f"{url}: conditional write refused: the object changed", url=url, attempts=1)
        if isinstance(exc, oex.AlreadyExistsError):
            return ConflictError(f"{url}: already exists", url=url, attempts=1)
        if "builder error" in str(exc) or "URL scheme is not allowed" in str(exc):
            return RemoteError(
                f"{url}: the client refused the request before sending it ({_short(exc, 160)}); for an http:// "
                "endpoint set storage_options allow_http=true (or AWS_ALLOW_HTTP=true)", url=url, attempts=1,
            )
        if isinstance(exc, (oex.NotSupportedError, oex.InvalidPathError, oex.UnknownConfigurationKeyError)):
            return RemoteError(f"{url}: {type(exc).__name__}: {_short(exc)}", url=url, attempts=1)
        status = _status_of(exc)
        if status in (401, 403):
            return CredentialsError(
                f"{url}: access refused (HTTP {status}); check the credentials", url=url, attempts=1
            )
        if status == 404:
            return RemoteNotFound(f"{url}: no such object", url=url, attempts=1)
        if status == 412:
            cls = StaleStoreError if conditional else ConflictError
            return cls(f"{url}: precondition failed (the object changed)", url=url, attempts=1)
        if status is not None and 400 <= status < 500 and status not in (408, 429):
            return RemoteError(f"{url}: HTTP {status}: {_short(exc)}", url=url, attempts=1)
        return _Transient(f"{type(exc).__name__}: {_short(exc)}")

    # requests -----------------------------------------------------------------------------------
    def _sync(self, key: str, fn: Any, conditional: bool = False) -> Any:
        try:
            return fn()
        except self.oex.BaseError as exc:
            raise self._classify(exc, key, conditional) from None
        except FileNotFoundError:  # obstore raises the builtin for a missing object
            url = self.c.key_url(key)
            raise RemoteNotFound(f"{url}: no such object", url=url, attempts=1) from None
        except (OSError, TimeoutError, ConnectionError) as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from None

    def head(self, key: str) -> ObjectMeta:
        m = self._sync(key, lambda: self.obs.head(self.store, key))
        return ObjectMeta(key, int(m["size"]), self._tag(m))

    def get(self, key: str) -> tuple[memoryview, ObjectMeta]:
        def fetch() -> tuple[memoryview, ObjectMeta]:
            r = self.obs.get(self.store, key)
            data = memoryview(r.bytes())
            m = r.meta
            if len(data) != int(m["size"]):
                raise _Transient(f"body of {len(data)} bytes, expected {m['size']} (truncated)")
            return data, ObjectMeta(key, int(m["size"]), self._tag(m))

        return self._sync(key, fetch)  # type: ignore[no-any-return]

    async def _one(
        self, key: str, start: int, end: int, etag: str | None, with_meta: bool = True
    ) -> tuple[memoryview, ObjectMeta | None]:
        assert self.sem is not None and self.budget is not None
        attempt = 0
        url = self.c.key_url(key)
        # what the answer takes of the byte budget: its size where the range says it (a whole object or a
        # suffix: at most a small one here)
        want = end - start if 0 <= start < end else -start if start < 0 else _SMALL_BODY
        while True:
            attempt += 1
            try:
                async with self.sem, self.budget.hold(want):
                    opts: dict[str, Any] = {}
                    if start < 0 and not self.suffix_ranges:
                        head = await self.obs.head_async(self.store, key)
                        size = int(head["size"])
                        if size:
                            opts["range"] = (max(0, size + start), size)
                        etag = etag or self._tag(head) or None  # the range must come from the object sized
                    elif start < 0:
                        opts["range"] = {"suffix": -start}
                    elif end >= 0:
                        opts["range"] = (start, end)
                    if etag:
                        opts["if_match"] = self._if_match(etag)
                    r = await self.obs.get_async(self.store, key, options=opts)  # type: ignore[arg-type]
                    if 0 <= start < end <= start + _SMALL_BODY:
                        # a small body has (nearly always) arrived with the headers: taking it without a
                        # second await costs ~90 us less CPU per request (obstore releases the GIL while
                        # it waits; a body that is late holds up this loop at most the client's timeout)
                        data = memoryview(r.bytes())
                    else:
                        data = memoryview(await r.bytes_async())
                if not with_meta and start >= 0 and end >= 0:  # a range inside a known object: no meta needed
                    if len(data) != end - start:
                        raise _Transient(f"range {start}-{end}: body of {len(data)} bytes, expected {end - start}")
                    return data, None
                m = r.meta
                size = int(m["size"])
                expected = _expected(start, end, size)
                if len(data) != expected:
                    raise _Transient(f"range {start}-{end}: body of {len(data)} bytes, expected {expected}")
                return data, ObjectMeta(key, size, self._tag(m))
            except self.oex.BaseError as exc:
                err = self._classify(exc, key, conditional=etag is not None)
                if not isinstance(err, _Transient):
                    err.attempts = attempt  # type: ignore[attr-defined]
                    raise err from None
                last: BaseException = err
            except _Transient as exc:
                last = exc
            except FileNotFoundError:  # obstore raises the builtin for a missing object
                raise RemoteNotFound(f"{url}: no such object", url=url, attempts=attempt) from None
            except (OSError, TimeoutError, ConnectionError) as exc:
                last = _Transient(f"{type(exc).__name__}: {exc}")
            if attempt > self.c.max_retries:
                raise RemoteError(
                    f"{url}: range {start}-{end} failed after {attempt} attempts ({last})", url=url, attempts=attempt
                )
            await asyncio.sleep(min(2.0, 0.05 * 2 ** (attempt - 1)) * (0.5 + random.random()))

    async def _all(
        self,
        requests: Sequence[tuple[str, int, int, str | None]],
        on_each: Any,
        missing_ok: bool = False,
        with_meta: bool = True,
    ) -> list[tuple[memoryview, ObjectMeta | None]]:
        if self.sem is None:
            self.sem = asyncio.Semaphore(self.c.max_requests)
            self.budget = _ByteBudget(self.c.max_inflight_bytes)

        async def each(i: int, r: tuple[str, int, int, str | None]) -> tuple[memoryview, ObjectMeta | None]:
            try:
                got = await self._one(*r, with_meta)
            except RemoteNotFound:
                if not missing_ok:
                    raise
                return memoryview(b""), None
            if on_each is not None:
                on_each(i, got[0], got[1])
                return _EMPTY, got[1]  # the bytes go with the callback, not with the future's result
            return got

        tasks = [asyncio.ensure_future(each(i, r)) for i, r in enumerate(requests)]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def submit(
        self,
        requests: Sequence[tuple[str, int, int, str | None]],
        on_each: Any,
        missing_ok: bool = False,
        with_meta: bool = True,
    ) -> concurrent.futures.Future[list[tuple[memoryview, ObjectMeta | None]]]:
        return asyncio.run_coroutine_threadsafe(
            self._all(requests, on_each, missing_ok, with_meta), _Loop.get().loop
        )

    def put(self, key: str, data: bytes | memoryview, mode: str | dict[str, Any]) -> str:
        cond = isinstance(mode, dict)
        r = self._sync(key, lambda: self.obs.put(self.store, key, bytes(data), mode=self._mode(mode)),
                       conditional=False)
        if cond and r.get("e_tag") is None:
            url = self.c.key_url(key)
            raise RemoteError(f"{url}: the service returned no ETag", url=url, attempts=1)
        return self._tag(r)

    def put_file(self, key: str, path: str) -> str:
        from pathlib import Path

        r = self._sync(key, lambda: self.obs.put(self.store, key, Path(path), chunk_size=16 << 20))
        return self._tag(r)

    def put_stream(self, key: str, chunks: Callable[[], Iterable[bytes]]) -> str:
        r = self._sync(
            key, lambda: self.obs.put(self.store, key, iter(chunks()), chunk_size=8 << 20, max_concurrency=4)
        )
        return self._tag(r)

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        def collect() -> list[ObjectMeta]:
            out = []
            for chunk in self.obs.list(self.store, prefix=prefix or None):
                for m in chunk:
                    modified = m.get("last_modified")
                    out.append(ObjectMeta(str(m["path"]), int(m["size"]), self._tag(m),
                                          modified.timestamp() if modified is not None else 0.0))
            return out

        yield from self._sync(prefix, collect)

    def delete(self, key: str) -> None:
        self._sync(key, lambda: self.obs.delete(self.store, key))

    def copy(self, src: str, dst: str) -> None:
        self._sync(src, lambda: self.obs.copy(self.store, src, dst, overwrite=True))


def _expected(start: int, end: int, size: int) -> int:
    """Bytes a request answers: ``(0, -1)`` the whole object, ``(-n, -1)`` its last n bytes, else the
    range ``[start, end)`` clipped to the object."""
    if start < 0:
        return min(-start, size)
    if end < 0:
        return size
    return max(0, min(end, size) - start)


def _short(exc: BaseException, most: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= most else text[:most] + "..."


# ---------------------------------------------------------------------------------------- fsspec


class _FsspecBackend(_Backend):
    """Any fsspec filesystem: the one given, or the one its URL names (``memory://``, ``hf://``...)."""

    def __init__(self, client: ObjectClient) -> None:
        try:
            import fsspec
        except ImportError as exc:
            raise ImportError(f"{client.url}: this URL needs fsspec: pip install 'seqstore[remote]'") from exc
        self.c = client
        if client._filesystem is not None:
            self.fs = client._filesystem
            self.root = client.url.split("://", 1)[-1] if "://" in client.url else client.url
        else:
            self.fs, self.root = fsspec.core.url_to_fs(client.url, **client._options)
        self.root = self.root.rstrip("/")
        self.conditional = False
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def _call(self, key: str, fn: Any) -> Any:
        try:
            return fn()
        except FileNotFoundError:
            url = self.c.key_url(key)
            raise RemoteNotFound(f"{url}: no such object", url=url, attempts=1) from None
        except PermissionError:
            url = self.c.key_url(key)
            raise CredentialsError(f"{url}: access refused; check the credentials", url=url, attempts=1) from None
        except (OSError, TimeoutError, ConnectionError) as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from None

    def _meta(self, key: str, info: Mapping[str, Any]) -> ObjectMeta:
        tag = info.get("ETag") or info.get("etag") or info.get("generation") or info.get("mtime") or info.get("created")
        return ObjectMeta(key, int(info.get("size") or 0), str(tag or ""))

    def head(self, key: str) -> ObjectMeta:
        return self._meta(key, self._call(key, lambda: self.fs.info(self._path(key))))

    def get(self, key: str) -> tuple[memoryview, ObjectMeta]:
        meta = self.head(key)
        data = self._call(key, lambda: self.fs.cat_file(self._path(key)))
        return memoryview(data), ObjectMeta(key, len(data), meta.etag)

    def submit(
        self,
        requests: Sequence[tuple[str, int, int, str | None]],
        on_each: Any,
        missing_ok: bool = False,
        with_meta: bool = True,
    ) -> concurrent.futures.Future[list[tuple[memoryview, ObjectMeta | None]]]:
        if self.pool is None:
            self.pool = concurrent.futures.ThreadPoolExecutor(self.c.max_requests, thread_name_prefix="seqstore-fsspec")

        def run() -> list[tuple[memoryview, ObjectMeta | None]]:
            missing: set[int] = set()
            if missing_ok:
                got: list[tuple[memoryview, ObjectMeta | None]] = []
                for r in requests:
                    try:
                        got.extend(self.get_ranges([r]))
                    except RemoteNotFound:
                        missing.add(len(got))
                        got.append((memoryview(b""), None))
            else:
                got = self.get_ranges(requests)
            if on_each is not None:
                for i, (d, m) in enumerate(got):
                    if i not in missing:  # as the obstore back end: nothing arrived, no call
                        on_each(i, d, m)
                return [(_EMPTY, m) for _, m in got]
            return got

        return self.pool.submit(run)

    def get_ranges(
        self, requests: Sequence[tuple[str, int, int, str | None]]
    ) -> list[tuple[memoryview, ObjectMeta | None]]:
        metas: dict[str, ObjectMeta] = {}
        for k, _s, _e, _ in requests:  # every answer carries the object's size and version, as obstore's do
            if k not in metas:
                metas[k] = self.head(k)
        paths = [self._path(k) for k, _, _, _ in requests]
        starts = [max(0, metas[k].size + s) if s < 0 else s for k, s, _, _ in requests]
        ends = [metas[k].size if e < 0 else e for k, _, e, _ in requests]
        attempt = 0
        while True:
            attempt += 1
            try:
                got = self._call(requests[0][0], lambda: self.fs.cat_ranges(paths, starts, ends, on_error="return"))
                out: list[tuple[memoryview, ObjectMeta | None]] = []
                for (k, _, _, _), s, e, d in zip(requests, starts, ends, got):
                    if isinstance(d, BaseException):
                        self._call(k, lambda d=d: _raise(d))
                    m = metas[k]
                    want = max(0, min(e, m.size) - s)
                    if len(d) != want:
                        raise _Transient(f"{self.c.key_url(k)} range {s}-{e}: {len(d)} bytes, expected {want}")
                    out.append((memoryview(d), m))
                return out
            except _Transient as exc:
                if attempt > self.c.max_retries:
                    url = self.c.key_url(requests[0][0])
                    raise RemoteError(
                        f"{url}: failed after {attempt} attempts ({exc})", url=url, attempts=attempt
                    ) from None
                time.sleep(min(2.0, 0.05 * 2 ** (attempt - 1)))

    def put(self, key: str, data: bytes | memoryview, mode: str | dict[str, Any]) -> str:
        if isinstance(mode, dict):
            url = self.c.key_url(key)
            raise RemoteError(
                f"{url}: this filesystem has no conditional write (If-Match), so two writers could lose each "
                "other's shards; write the store locally and copy it (seqstore copy)", url=url, attempts=0,
            )
        if mode == "create" and self._call(key, lambda: self.fs.exists(self._path(key))):
            url = self.c.key_url(key)
            raise ConflictError(f"{url}: already exists", url=url, attempts=1)
        self._call(key, lambda: self.fs.pipe_file(self._path(key), bytes(data)))
        return self.head(key).etag

    def put_file(self, key: str, path: str) -> str:
        self._call(key, lambda: self.fs.put_file(path, self._path(key)))
        return self.head(key).etag

    def put_stream(self, key: str, chunks: Callable[[], Iterable[bytes]]) -> str:
        def write() -> None:
            f = self.fs.open(self._path(key), "wb")
            try:
                for c in chunks():
                    f.write(c)
            except BaseException:
                try:  # leave no partial object
                    if hasattr(f, "discard"):
                        f.discard()
                    else:
                        f.close()
                    self.fs.rm_file(self._path(key))
                except Exception:  # noqa: BLE001 - the iterator's error is the one to report
                    pass
                raise
            f.close()

        self._call(key, write)
        return self.head(key).etag

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        base = self._path(prefix)
        found = self._call(prefix, lambda: self.fs.find(base, detail=True) if self.fs.exists(base) else {})
        for p, info in sorted(found.items()):
            rel = p[len(self.root) + 1 :] if p.startswith(self.root + "/") else p
            yield self._meta(rel, info)

    def delete(self, key: str) -> None:
        self._call(key, lambda: self.fs.rm_file(self._path(key)))

    def copy(self, src: str, dst: str) -> None:
        self._call(src, lambda: self.fs.copy(self._path(src), self._path(dst)))


def _raise(exc: BaseException) -> None:
    raise exc


def client_for(url: str, storage_options: Mapping[str, Any] | None = None, filesystem: Any = None) -> ObjectClient:
    return ObjectClient(url, storage_options, filesystem)
