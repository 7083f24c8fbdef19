"""The seqstore exception hierarchy.

Every error seqstore raises on bad input or damaged data derives from :class:`SeqstoreError`
and says which file, field, record or id is at fault and what was expected.
"""

from __future__ import annotations

import errno
import os

__all__ = ["SeqstoreError", "FormatError", "SchemaError", "ColumnTypeError", "CorruptionError", "LockError",
           "LockTimeout", "RemoteError", "RemoteNotFound", "BucketNotFound", "ConfigError", "CredentialsError",
           "StaleStoreError", "ConflictError", "open_files_exhausted"]


class SeqstoreError(Exception):
    """Base class of every seqstore error."""


class FormatError(SeqstoreError):
    """A store is not a seqstore store, or uses a format version this library does not read."""


class SchemaError(SeqstoreError, ValueError):
    """A schema, record or batch does not match what the store expects."""


class ColumnTypeError(SchemaError):
    """A column of a source to import has a type that no seqstore field holds. ``column`` names the
    column and ``type`` its type as the source spells it; the message also says what is supported."""

    def __init__(self, message: str, column: str, type_name: str) -> None:
        super().__init__(message)
        self.column = column
        self.type = type_name

    def __reduce__(self) -> tuple[object, ...]:  # raised in a worker process of a parallel convert
        return (type(self), (str(self), self.column, self.type))


class CorruptionError(SeqstoreError):
    """A file of a committed shard is missing, truncated or disagrees with the manifest."""


class LockError(SeqstoreError):
    """The store's commit lock could not be taken."""


class LockTimeout(LockError):
    """The store's commit lock stayed held by another process for longer than the wait allowed (a hung
    or stopped process holding it). ``path``: the lock file; ``holder``: the process id holding it
    where this machine's kernel knows it (another machine's over a network filesystem: None)."""

    def __init__(self, message: str, *, path: str = "", holder: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.holder = holder

    def __reduce__(self) -> tuple[object, ...]:
        return (_lock_timeout, (str(self), self.path, self.holder))


def _lock_timeout(message: str, path: str, holder: int | None) -> LockTimeout:
    return LockTimeout(message, path=path, holder=holder)


class RemoteError(SeqstoreError):
    """A request to object storage failed: after ``attempts`` tries for transient failures (5xx,
    connection resets, timeouts, truncated bodies), or at once for errors that retrying cannot fix.
    ``url`` names the object; the message never contains a credential."""

    def __init__(self, message: str, *, url: str = "", attempts: int = 0) -> None:
        super().__init__(message)
        self.url = url
        self.attempts = attempts


class RemoteNotFound(RemoteError):
    """The object at ``url`` does not exist."""


class BucketNotFound(RemoteError):
    """The bucket (Azure: container) that ``url`` names does not exist. Not a :class:`RemoteNotFound`:
    a missing bucket is a wrong URL or endpoint, not an object that has yet to be written."""


class ConfigError(SeqstoreError, ValueError):
    """A storage option or an object-store URL that seqstore or the storage client does not accept;
    the message names the option or URL and what is expected (for an unknown key: the valid ones)."""


class CredentialsError(RemoteError):
    """The service refused the credentials (HTTP 401/403) for ``url``."""


class StaleStoreError(RemoteError):
    """An object changed while a store that read it was open (ETag mismatch): reopen the store."""


class ConflictError(RemoteError):
    """A conditional write lost a race (another writer changed the object first)."""


def open_files_exhausted(path: str | os.PathLike[str], exc: OSError) -> OSError | None:
    """For ``exc`` raised opening ``path``: an ``OSError`` naming the open-files limit when the process
    (not the file) is at fault (``EMFILE``/``ENFILE``), else None (the caller reports the file)."""
    if exc.errno not in (errno.EMFILE, errno.ENFILE):
        return None
    return OSError(exc.errno, f"{path}: cannot open ({exc.strerror}): too many open files in this process (ulimit -n)")
