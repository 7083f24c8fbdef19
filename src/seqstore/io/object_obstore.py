"""The obstore back end of :class:`~seqstore.io.objects.ObjectClient`: S3, GCS, Azure Blob Storage, HTTP.

Requests run on one event loop per process (a daemon thread, ``_Loop``), at most ``max_requests`` and
``max_inflight_bytes`` of answers at once (:mod:`.object_wave`). Each range request retries its own
transient failures (``ObstoreBackend.fetch_range``; see :mod:`seqstore.io.objects` on obstore's own
retries); obstore's exceptions and HTTP statuses become seqstore's errors in :mod:`.object_errors`.
A process forked after obstore started its runtime refuses to use it with an error (:func:`fork_unsafe`
tells a parent when to avoid fork).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from ..errors import RemoteError, StaleStoreError
from .object_common import (
    WHOLE_OBJECT_MOST,
    Answer,
    ClientSettings,
    ObjectBackend,
    ObjectMeta,
    Request,
    encoding_refused,
    error_at,
    option_flag,
    too_large,
)
from .object_errors import config_error, failure, unknown_key
from .object_links import reset_in_child
from .object_wave import SMALL_BODY, Budget, Wave
from .retry import Attempts, Transient

__all__ = ["ObstoreBackend", "UNSENT", "fork_unsafe"]

#: the start of a version tag made of an object's Last-Modified and size, where it has no ETag (a plain HTTP
#: server's file): it keys the object's cache entry and is checked on answers, never sent as If-Match
UNSENT = "last-modified:"

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


reset_in_child(_Loop, "_lock")  # (a thread of a process forked meanwhile may hold it)


#: objects whose presigned URLs a back end keeps at most (the direct reader's; about 1 KiB each, two kept)
SIGNED_MOST = 4096

#: seconds the exit-time quiesce (:func:`_quiesce_at_exit`) waits for cancelled requests at most
QUIESCE_S = 2.0


def _quiesce_at_exit() -> None:
    """Cancel this process's requests still in flight before the interpreter finalizes (an ``atexit``
    handler). A tokio thread that ends a request needs the GIL to hand over the answer; during
    finalization (Python < 3.14) asking for it ends the thread with ``pthread_exit``, which Rust turns
    into an abort: a process that raised while requests were in flight could die by SIGABRT instead of
    exiting with its status. Waits at most :data:`QUIESCE_S`."""
    inst = _Loop._instance
    if inst is None or _Loop._pid != os.getpid() or not inst.thread.is_alive():
        return

    async def cancel_all() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=QUIESCE_S)
        await asyncio.sleep(0.05)  # obstore's threads settle the cancelled futures (they take the GIL)

    with contextlib.suppress(BaseException):  # at exit: nothing left to report to
        asyncio.run_coroutine_threadsafe(cancel_all(), inst.loop).result(timeout=QUIESCE_S + 1.0)


atexit.register(_quiesce_at_exit)


class ObstoreBackend(ObjectBackend):
    conditional = True

    def __init__(self, client: ClientSettings) -> None:
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
        self.obs: Any = obstore
        self.oex = oex
        self.c = client
        parts = urlsplit(client.url)
        scheme = parts.scheme.lower()
        opts = dict(client.options)
        client_options: dict[str, Any] = {
            "timeout": timedelta(seconds=client.timeout),
            "connect_timeout": timedelta(seconds=client.connect_timeout),
            "default_headers": {"accept-encoding": "identity"},  # (none: any encoding is acceptable, RFC 9110)
        }
        for k in ("allow_http", "allow_invalid_certificates", "http1_only", "proxy_url", "user_agent"):
            if k in opts:
                client_options[k] = str(opts.pop(k)) if k in ("proxy_url", "user_agent") else option_flag(opts.pop(k))
        if "allow_http" not in client_options:
            # client options given here replace those the client reads from the environment: keep this one
            env = {"s3": "AWS", "s3a": "AWS", "gs": "GOOGLE", "gcs": "GOOGLE"}.get(scheme, "AZURE")
            if option_flag(os.environ.get(f"{env}_ALLOW_HTTP", "")):
                client_options["allow_http"] = True
        # whether the service answers a suffix range (``bytes=-n``); Azure Blob Storage does not, so there a
        # suffix request costs a HEAD (for the size) and then a plain range request: two round trips
        self.suffix_ranges = scheme not in ("az", "abfs", "abfss", "azure")
        # Google Cloud Storage: a conditional replace names the object's generation, not its ETag (which the
        # XML API derives from the content), so the version tags seqstore keeps are ``"<ETag>#<generation>"``
        self.generations = scheme in ("gs", "gcs")
        if scheme in ("http", "https"):
            self.conditional = False
            if opts:  # the HTTP store takes client options only
                raise unknown_key(client.url, "HTTP", next(iter(opts)))
        client_url = urlunsplit(("s3", *parts[1:])) if scheme == "s3a" else client.url
        try:
            self.store = from_url(
                client_url, config=opts or None, client_options=client_options, retry_config={"max_retries": 0}
            )
        except oex.BaseError as exc:
            raise config_error(client.url, scheme, exc, opts) from None
        self._plain: str | None = None  # the plain URL objects' keys follow ("": none, direct reads off)
        # key -> (presigned URL, monotonic expiry, the URL it replaced or "": requests in flight may hold it)
        self._signed: dict[str, tuple[str, float, str]] = {}
        self._signed_keys: dict[str, str] = {}  # presigned URL -> key (the URLs in _signed, both kinds)
        self._sign_lock = threading.Lock()
        self.slots = Budget(client.max_requests)  # requests in flight
        self.budget = Budget(client.max_inflight_bytes)  # bytes of answers in flight

    # version tags -------------------------------------------------------------------------------
    def _tag(self, m: Any) -> str:
        """The version tag of an object from obstore's meta (or a put's result). An object with neither
        ETag nor version (an HTTP server that sends no ETag) is told by its Last-Modified and size: a tag
        (:data:`UNSENT`...) that keys its cache entry and is checked on every answer, never sent."""
        etag, version = m.get("e_tag"), m.get("version")
        if self.generations and etag and version:
            return f"{etag}#{version}"
        if etag or version:
            return str(etag or version)
        modified = m.get("last_modified")
        stamp = modified.timestamp() if modified is not None else 0.0
        return f"{UNSENT}{stamp:.6f}/{int(m['size'])}" if stamp and "size" in m else ""

    def _mode(self, mode: str | dict[str, Any]) -> Any:
        """obstore's put mode for seqstore's (``{"e_tag": tag}``: replace only that version)."""
        if isinstance(mode, dict) and self.generations:
            etag, _, version = str(mode["e_tag"]).partition("#")
            return {"e_tag": etag, "version": version or None}
        return mode

    def if_match(self, tag: str) -> str:
        """The ETag to send as If-Match for version tag ``tag`` ("": none, a tag of Last-Modified)."""
        if tag.startswith(UNSENT):
            return ""
        return tag.partition("#")[0] if self.generations else tag

    def check_tag(self, result: Any, key: str, tag: str) -> None:
        """Raise :class:`StaleStoreError` if ``result`` (of a read asked If-Match ``tag``) is of another version
        of ``key``: a server that ignores If-Match, or a redirect obstore followed to another host."""
        if tag.startswith(UNSENT):  # no ETag: the answer's Last-Modified and size must be those pinned
            if self._tag(result.meta) != tag:
                raise error_at(StaleStoreError, self.c.key_url(key), "the object changed while the store was open "
                               f"(Last-Modified and size {self._tag(result.meta)[len(UNSENT):]}, expected "
                               f"{tag[len(UNSENT):]}); reopen the store")
            return
        got = result.meta.get("e_tag")
        if got is not None and got != self.if_match(tag):
            raise error_at(StaleStoreError, self.c.key_url(key), "the answer is of another version of the object "
                           f"(ETag {got}, expected {self.if_match(tag)}): it changed while the store was open (reopen "
                           "it), or the server sent the request elsewhere")

    def check_coding(self, result: Any, key: str) -> None:
        """Raise a RemoteError where the answer ``result`` to a read of ``key`` is in a Content-Encoding other
        than identity (asked for): its bytes are not the object's as stored."""
        if refused := encoding_refused(result.attributes.get("Content-Encoding")):
            raise error_at(RemoteError, self.c.key_url(key), refused)

    # direct reads ---------------------------------------------------------------------------------
    def direct(self, key: str, tag: str | None) -> tuple[str, str | None] | None:
        """The object's plain URL (an HTTP store; S3 with ``skip_signature`` and an ``endpoint``), or one
        presigned by obstore for an hour (signed again with 10 minutes left); None with a proxy, with
        invalid certificates allowed, or where obstore cannot sign (its reads then go through obstore)."""
        if tag and tag.startswith(UNSENT):
            return None  # the direct reader checks ETags only: these reads go through obstore (checked)
        etag = self.if_match(tag) if tag else None
        if self._plain is None:
            self._plain = _plain_base(self.c.url, self.c.options)
        if self._plain == "":
            return None
        if self._plain:
            return f"{self._plain}/{quote(key, safe='/~')}", etag
        got = self._signed.get(key)
        if got is None or got[1] - time.monotonic() < 600:
            try:
                return self._sign(key), etag
            except Exception:  # noqa: BLE001  # no credentials to sign with (anonymous, environment-less): not direct
                self._plain = ""
                return None
        return got[0], etag

    def _sign(self, key: str) -> str:
        """A URL of ``key`` presigned now for an hour (kept for reuse until 10 minutes are left)."""
        now = time.monotonic()
        url = str(self.obs.sign(self.store, "GET", key, expires_in=timedelta(hours=1)))
        with self._sign_lock:
            old = self._signed.get(key, ("", 0.0, ""))
            replaced = old[2] if old[0] == url else old[0]
            if replaced != old[2]:  # the URL two signings back is forgotten (one kept: memory stays bounded)
                self._signed_keys.pop(old[2], None)
            self._signed.pop(key, None)  # (put back last: the longest signed go first)
            self._signed[key] = (url, now + 3600, replaced)
            self._signed_keys[url] = key
            while len(self._signed) > SIGNED_MOST:  # (not by the number of objects read: signed again if read)
                gone = next(iter(self._signed))
                last, _, before = self._signed.pop(gone)
                self._signed_keys.pop(last, None)
                self._signed_keys.pop(before, None)
        return url

    def resign(self, url: str) -> str | None:
        """As :meth:`ObjectClient.resign` (obstore's credentials are fresh); the URL already signed anew where
        another refused request asked first."""
        with self._sign_lock:
            key = self._signed_keys.get(url)
            got = self._signed.get(key) if key is not None else None
        if key is None:
            return None
        if got is not None and got[0] != url:
            return got[0]
        try:
            return self._sign(key)
        except Exception:  # noqa: BLE001 - cannot sign now (no credentials): the refusal stands
            return None

    # requests -----------------------------------------------------------------------------------
    def _sync(self, key: str, fn: Any, conditional: bool = False) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - in seqstore's words (the client's policy retries Transient)
            err = failure(self.oex, exc, self.c.url, self.c.key_url(key), self.c.options, conditional)
            if err is exc:
                raise
            raise err from err.__cause__  # None but for a cause worth showing (no credentials found)

    def head(self, key: str) -> ObjectMeta:
        m = self._sync(key, lambda: self.obs.head(self.store, key))
        return ObjectMeta(key, int(m["size"]), self._tag(m))

    def get(self, key: str, limit: int) -> tuple[memoryview, ObjectMeta]:
        def fetch() -> tuple[memoryview, ObjectMeta]:
            r = self.obs.get(self.store, key)
            self.check_coding(r, key)
            m = r.meta  # (the answer's head: its body is not read yet)
            if int(m["size"]) > limit:
                raise too_large(self.c.key_url(key), int(m["size"]), limit)
            data = memoryview(r.bytes())
            if len(data) != int(m["size"]):
                raise Transient(f"body of {len(data)} bytes, expected {m['size']} (truncated)", answered=True)
            modified = m.get("last_modified")  # (the manifest's version: a new upload, a new mirror)
            return data, ObjectMeta(key, int(m["size"]), self._tag(m), modified.timestamp() if modified else 0.0)

        return self._sync(key, fetch)  # type: ignore[no-any-return]

    async def fetch_range(
        self, key: str, start: int, end: int, etag: str | None, with_meta: bool = True,
        prior: BaseException | None = None,
    ) -> Answer:
        """One request with its retries. ``prior``: how its first attempt failed (made by a wave's fast
        path, :mod:`.object_wave`): this goes on from its second."""
        slots, budget = self.slots, self.budget
        tries: Attempts | None = None
        # what the answer takes of the byte budget: its size where the range says it (a whole object or a
        # suffix: at most a small one here)
        want = end - start if 0 <= start < end else -start if start < 0 else SMALL_BODY
        while True:
            try:
                if prior is not None:  # the first attempt's failure, classified as any other below
                    failed, prior = prior, None
                    raise failed
                # the request slot and the byte budget taken and given back by hand: two context managers
                # cost more than the rest of the Python work of a small request
                if not slots.try_take(1):
                    await slots.take(1)
                try:
                    if not budget.try_take(want):
                        await budget.take(want)
                except BaseException:
                    slots.release(1)
                    raise
                try:
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
                    if etag and (sent := self.if_match(etag)):
                        opts["if_match"] = sent
                    r = await self.obs.get_async(self.store, key, options=opts)
                    self.check_coding(r, key)
                    if end < 0 <= start and int(r.meta["size"]) > WHOLE_OBJECT_MOST:  # (its body not read yet)
                        raise too_large(self.c.key_url(key), int(r.meta["size"]), WHOLE_OBJECT_MOST)
                    if 0 <= start < end <= start + SMALL_BODY:
                        # a small body has (nearly always) arrived with the headers: taking it without a
                        # second await costs ~90 us less CPU per request (obstore releases the GIL while
                        # it waits; a body that is late holds up this loop at most the client's timeout)
                        data = memoryview(r.bytes())
                    else:
                        data = memoryview(await r.bytes_async())
                finally:
                    budget.release(want)
                    slots.release(1)
                if etag:
                    self.check_tag(r, key, etag)
                meta = None
                if with_meta or start < 0 or end < 0:  # a range inside a known object needs no meta
                    meta = ObjectMeta(key, int(r.meta["size"]), self._tag(r.meta))
                expected = end - start if meta is None else _expected(start, end, meta.size)
                if len(data) != expected:
                    raise Transient(f"range {start}-{end}: body of {len(data)} bytes, expected {expected}",
                                    answered=True)
                self.c.retry.ok()
                return data, meta
            except Exception as exc:  # noqa: BLE001 - classified: retried, raised in seqstore's words, or as is
                err = failure(self.oex, exc, self.c.url, self.c.key_url(key), self.c.options, etag is not None)
                if not isinstance(err, Transient):
                    if isinstance(err, RemoteError):
                        err.attempts = (tries.n if tries else 0) + 1
                        self.c.retry.ok()  # a definite answer (or a refusal): the streak is over
                    raise err from err.__cause__
            tries = tries or Attempts(self.c.retry, f"{self.c.key_url(key)}: range {start}-{end}")
            await asyncio.sleep(tries.failed(err))

    async def _all(self, requests: Sequence[Request], on_each: Any, missing_ok: bool, with_meta: bool) -> list[Answer]:
        return await Wave(self, requests, on_each, missing_ok, with_meta).run()

    def submit(
        self, requests: Sequence[Request], on_each: Any, missing_ok: bool = False, with_meta: bool = True
    ) -> concurrent.futures.Future[list[Answer]]:
        return asyncio.run_coroutine_threadsafe(self._all(requests, on_each, missing_ok, with_meta), _Loop.get().loop)

    def put(self, key: str, data: bytes | memoryview, mode: str | dict[str, Any]) -> str:
        r = self._sync(key, lambda: self.obs.put(self.store, key, bytes(data), mode=self._mode(mode)))
        if isinstance(mode, dict) and r.get("e_tag") is None:
            raise error_at(RemoteError, self.c.key_url(key), "the service returned no ETag")
        return self._tag(r)

    def put_file(self, key: str, path: str) -> str:
        return self._tag(self._sync(key, lambda: self.obs.put(self.store, key, Path(path), chunk_size=16 << 20)))

    def put_stream(self, key: str, chunks: Callable[[], Iterable[bytes]]) -> str:
        return self._tag(self._sync(key, lambda: self.obs.put(self.store, key, iter(chunks()), chunk_size=8 << 20,
                                                              max_concurrency=4)))

    def list(self, prefix: str) -> Iterator[ObjectMeta]:
        def collect() -> list[ObjectMeta]:
            return [ObjectMeta(str(m["path"]), int(m["size"]), self._tag(m),
                               m["last_modified"].timestamp() if m.get("last_modified") is not None else 0.0)
                    for chunk in self.obs.list(self.store, prefix=prefix or None) for m in chunk]

        yield from self._sync(prefix, collect)

    def delete(self, key: str) -> None:
        self._sync(key, lambda: self.obs.delete(self.store, key))

    def copy(self, src: str, dst: str) -> None:
        self._sync(src, lambda: self.obs.copy(self.store, src, dst, overwrite=True))


def _plain_base(url: str, options: dict[str, Any]) -> str | None:
    """The URL prefix of a store's objects that needs no signature: an HTTP store's own URL; for S3 with
    ``skip_signature``, its endpoint and bucket (path style, or the bucket in the host name with
    ``virtual_hosted_style_request``) and prefix. ``""``: direct reads are off (a proxy, certificates
    not checked, or the service's own endpoint). None: the store signs its requests (presign them)."""
    opts = {k.lower().removeprefix("aws_").removeprefix("google_").removeprefix("azure_"): v
            for k, v in options.items()}
    if opts.get("proxy_url") or option_flag(opts.get("allow_invalid_certificates", False)):
        return ""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):  # its path escaped where a URL may not hold a character (as obstore sends it)
        return urlunsplit(parts._replace(path=quote(parts.path, safe="/%:@!$&'()*+,;=~"))).rstrip("/")
    if scheme not in ("s3", "s3a"):
        return None
    if not option_flag(opts.get("skip_signature", False)):
        return None
    endpoint = str(opts.get("endpoint") or opts.get("endpoint_url") or "").rstrip("/")
    if not endpoint:
        return ""  # AWS's own endpoints (region-dependent names): left to obstore
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if option_flag(opts.get("virtual_hosted_style_request", False)):
        e = urlsplit(endpoint)
        base = f"{e.scheme}://{bucket}.{e.netloc}{e.path}"
    else:
        base = f"{endpoint}/{bucket}"
    return f"{base}/{quote(unquote(prefix), safe='/~')}" if prefix else base  # (obstore decodes the URL's path)


def _expected(start: int, end: int, size: int) -> int:
    """Bytes a request answers: ``(0, -1)`` the whole object, ``(-n, -1)`` its last n bytes, else the
    range ``[start, end)`` clipped to the object."""
    if start < 0:
        return min(-start, size)
    if end < 0:
        return size
    return max(0, min(end, size) - start)
