"""What the object-store client and its back ends share.

:class:`ObjectMeta` (an object's key, size and version tag), the ``ObjectBackend`` interface that
:class:`~seqstore.io.objects.ObjectClient` drives (``object_obstore`` for S3/GCS/Azure/HTTP,
``object_fsspec`` for any fsspec filesystem), ``ClientSettings`` (what a back end reads of its client),
and the URL and option helpers (:func:`check_url`, :func:`is_remote`; from :mod:`seqstore.io.options`:
:func:`redact`, :data:`SEQSTORE_OPTIONS`, :func:`check_options`).
"""

from __future__ import annotations

import abc
import concurrent.futures
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from ..errors import ConfigError, RemoteError
from .options import SEQSTORE_OPTIONS, check_options, option_flag, redact
from .retry import RetryPolicy

__all__ = [
    "Answer", "ClientSettings", "EMPTY_ANSWER", "ObjectBackend", "ObjectMeta", "REMOTE_SCHEMES", "Request",
    "SEQSTORE_OPTIONS", "check_not_chained", "check_options", "check_scheme", "check_url", "encoding_refused",
    "error_at", "is_remote", "option_flag", "redact",
]

#: URL schemes that name object storage (obstore); any other ``scheme://`` goes to fsspec.
REMOTE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "azure", "http", "https")
#: the bytes of an answer that went to an ``on_each`` callback instead of into the future's result
EMPTY_ANSWER = memoryview(b"")

E = TypeVar("E", bound=RemoteError)


#: bytes a whole-object read (:meth:`~seqstore.io.objects.ObjectClient.get`: a manifest; a range ``(0, -1)``: a
#: shard's descriptor) takes at most: far above any real manifest (a version-1/2 one lists every shard, a few
#: KiB each with many fields), so a server that answers gigabytes is refused before its body is read
WHOLE_OBJECT_MOST = 1 << 30


def too_large(url: str, size: int, limit: int) -> RemoteError:
    """The error of a whole-object read of ``url`` whose answer is of ``size`` bytes, past ``limit``."""
    return RemoteError(f"{url}: the object is {size} bytes, more than the {limit} bytes a whole-object read takes "
                       "(a manifest or a descriptor is far smaller); not read (a wrong URL, or a server that answers "
                       "something else)", url=url, attempts=1)


def encoding_refused(coding: Any) -> str | None:
    """Why an answer in ``Content-Encoding: coding`` (the header's value, a list; None: no header) is not the
    object's bytes as stored (every reader asks for identity), or None where it is."""
    if all(e in ("", "identity") for e in str(coding or "").lower().replace(" ", "").split(",")):
        return None
    return (f"the server answered in Content-Encoding {str(coding)[:40]!r}, not the object's bytes as they are "
            "(identity, the encoding asked for); serve it unencoded")


def error_at(kind: type[E], url: str, what: str) -> E:
    """Error ``kind`` of one request's answer for ``url`` (its first attempt): ``what`` happened."""
    return kind(f"{url}: {what}", url=url, attempts=1)


#: a URL's scheme, as ``urlsplit`` takes it (read without parsing the rest: a URL that does not parse is one)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def is_remote(path: Any) -> bool:
    """Whether ``path`` is a URL of a store that is not a local path (``file://`` is local)."""
    named = _SCHEME.match(path) if isinstance(path, str) else None
    return named is not None and named.group(1).lower() != "file"


def check_url(url: str) -> None:
    """Raise :class:`ConfigError` naming ``url`` if it is an object-store URL without a bucket
    (``s3:///x``, ``gs://``) or with a '?' or '#', or an http(s) URL without a host or with credentials
    (``user:password@``, named without them)."""
    named = _SCHEME.match(url)
    if named is None or named.group(1).lower() not in REMOTE_SCHEMES:
        return
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - (a ValueError where it is not a number from 0 to 65535)
    except ValueError as exc:  # a '[' without its ']', a port that is not one: Python's words name no URL
        raise ConfigError(f"{url}: not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise ConfigError(f"{url}: not a valid URL: no host (expected {scheme}://HOST/PATH)")
        if parts.username is not None or parts.password is not None:  # shown without the password
            shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
            raise ConfigError(f"{shown}: credentials in the URL (user:password@) are not sent by the client, and "
                              "every error would show them; give the URL without them (a server that wants a "
                              "password is not supported: use a presigned or public URL)")
        return
    if "?" in url or "#" in url:  # urlsplit would cut the key there: two names, one store
        raise ConfigError(f"{url}: a {scheme}:// store's URL may not hold '?' or '#' (a query or fragment)")
    if not parts.netloc or parts.netloc.startswith("@"):
        holder = "container" if scheme in ("az", "abfs", "abfss", "azure") else "bucket"
        slashes = f"; {scheme}:/// has one slash too many" if url.lower().startswith(f"{scheme}:///") else ""
        raise ConfigError(
            f"{url}: not a valid {scheme}:// URL: it names no {holder} (expected {scheme}://{holder.upper()}/PATH"
            f"{slashes})"
        )


def check_scheme(url: str) -> None:
    """Raise :class:`ConfigError` naming ``url`` (without a ``user:password@``) and the schemes seqstore
    opens when its scheme is neither object storage's (:data:`REMOTE_SCHEMES`) nor the protocol of an
    installed fsspec filesystem (fsspec's own error, a bare ``ValueError: Protocol not known``, named
    neither). Without fsspec nothing is checked: its back end names the URL and the package to install."""
    named = _SCHEME.match(url)
    if named is None or named.group(1).lower() in REMOTE_SCHEMES:
        return
    known = _fsspec_protocols()
    if not known or named.group(1) in known:  # (no fsspec: nothing checked)
        return
    shown = re.sub(r"^([^:]+://)[^/@]*@", r"\1", url)
    others = ", ".join(f"{s}://" for s in sorted(known - {*REMOTE_SCHEMES, "file", "local"}))
    raise ConfigError(f"{shown}: unknown URL scheme {named.group(1)!r}; seqstore opens local paths (or file://), "
                      f"object storage at {', '.join(f'{s}://' for s in REMOTE_SCHEMES)}, and the filesystems of "
                      f"fsspec: {others}")


#: an fsspec chained URL: ``PROTOCOL::`` in front of another URL (``simplecache::s3://b/x``)
_CHAINED = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)::(.*)", re.DOTALL)
_URL_OR_CHAINED = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*(://|::)")


def check_not_chained(path: Any) -> None:
    """ConfigError naming ``path`` when it is an fsspec chained URL (``simplecache::s3://b/x``,
    ``blockcache::file:///x``), which is no local path and no URL seqstore opens: taken as a local path,
    it was written as a directory named ``simplecache::s3:``. A local name with ``::`` in it that is no
    chained URL (``run::1``: neither a URL after the ``::`` nor an fsspec protocol before it) stays one."""
    chained = _CHAINED.match(path) if isinstance(path, str) else None
    if chained is None:
        return
    layer, inner = chained.groups()
    if not _URL_OR_CHAINED.match(inner) and layer not in _fsspec_protocols():
        return
    raise ConfigError(f"{path}: a chained URL ({layer}::...) is not supported; give the store's own URL or "
                      "path (a URL of object storage has seqstore's own cache, docs/remote.md)")


def _fsspec_protocols() -> frozenset[str]:
    try:
        import fsspec
    except ImportError:
        return frozenset()
    return frozenset(fsspec.available_protocols())


@dataclass(frozen=True)
class ObjectMeta:
    """What a store needs to know about an object: its size and version tag (ETag / generation)."""

    key: str
    size: int
    etag: str
    #: last modification, seconds since the epoch (0.0 where the back end does not say; set by ``list``)
    mtime: float = 0.0


Request = tuple[str, int, int, str | None]  # (object key, start, end, ETag or None)
Answer = tuple[memoryview, ObjectMeta | None]  # (the bytes, the object's meta where known)


class ClientSettings(Protocol):
    """What a back end reads of the :class:`~seqstore.io.objects.ObjectClient` it serves."""

    url: str
    max_requests: int
    max_inflight_bytes: int
    timeout: float
    connect_timeout: float
    retry: RetryPolicy
    options: dict[str, Any]
    filesystem: Any

    def key_url(self, key: str) -> str: ...


class ObjectBackend(abc.ABC):
    """What an object-store client answers (see ObjectClient, which adds the retry policy); each method as
    the ObjectClient method of the same name."""

    conditional = False

    def direct(self, key: str, tag: str | None) -> tuple[str, str | None] | None:
        return None

    def resign(self, url: str) -> str | None:
        return None

    @abc.abstractmethod
    def head(self, key: str) -> ObjectMeta: ...

    @abc.abstractmethod
    def get(self, key: str, limit: int) -> tuple[memoryview, ObjectMeta]:
        """The whole object ``key`` and its meta; one of more than ``limit`` bytes is refused unread
        (:func:`too_large`)."""

    @abc.abstractmethod
    def submit(
        self, requests: Sequence[Request], on_each: Any, missing_ok: bool = False, with_meta: bool = True
    ) -> concurrent.futures.Future[list[Answer]]: ...

    @abc.abstractmethod
    def put(self, key: str, data: bytes | memoryview, mode: str | dict[str, Any]) -> str: ...

    @abc.abstractmethod
    def put_file(self, key: str, path: str) -> str: ...

    @abc.abstractmethod
    def put_stream(self, key: str, chunks: Callable[[], Iterable[bytes]]) -> str: ...

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectMeta]: ...

    @abc.abstractmethod
    def delete(self, key: str) -> None: ...

    @abc.abstractmethod
    def copy(self, src: str, dst: str) -> None: ...
