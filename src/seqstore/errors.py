"""The seqstore exception hierarchy.

Every error seqstore raises on bad input or damaged data derives from :class:`SeqstoreError`
and says which file, field, record or id is at fault and what was expected.
"""

from __future__ import annotations

import errno
import os

__all__ = ["SeqstoreError", "FormatError", "SchemaError", "ColumnTypeError", "CorruptionError", "LockError",
           "LockTimeout", "RemoteError", "RemoteNotFound", "BucketNotFound", "ConfigError", "CredentialsError",
           "StaleStoreError", "ConflictError", "AutoCommitError", "MainGuardError", "LoaderWorkerError",
           "auto_commit_error", "open_files_exhausted"]


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


class MainGuardError(SeqstoreError, RuntimeError):
    """Worker processes would re-run the unguarded script that starts them (no ``if __name__ ==
    "__main__":`` around the code that starts them)."""


class LoaderWorkerError(SeqstoreError, RuntimeError):
    """A loader worker (process or helper thread) failed without an exception that could come back, exited,
    or gave no batch within the loader's ``timeout``."""


class AutoCommitError(SeqstoreError):
    """``append``/``append_batch`` took records, and then the automatic commit of a full shard failed with
    the records intact (the lock, the network or a full disk): the writer holds them and its next commit
    retries. ``taken``: the records of the call that raised this which the writer holds (append them
    again and they are stored twice; a batch's records from ``taken`` on were not taken); ``pending``:
    every uncommitted record the writer holds; ``error``: what failed.

    Raised as a subclass of that error's own class too (a ``LockError``, ``RemoteError``, ``OSError``
    ...), so an ``except`` clause for it still catches it: build one with :func:`auto_commit_error`."""

    taken: int
    pending: int
    error: Exception

    _note = ""

    def __str__(self) -> str:
        return f"{self.error}{self._note}" if hasattr(self, "error") else super().__str__()

    def __reduce__(self) -> tuple[object, ...]:
        return (auto_commit_error, (self.error, self.taken, self.pending, self._note))


_AUTO_KINDS: dict[type[BaseException], type[AutoCommitError]] = {}


def _auto_kind(base: type[BaseException]) -> type[AutoCommitError]:
    kind = _AUTO_KINDS.get(base)
    if kind is None:
        try:
            kind = type("AutoCommitError", (AutoCommitError, base), {"__module__": __name__, "__doc__":
                                                                     AutoCommitError.__doc__})
        except TypeError:  # (a class that cannot be combined: the error's own class is left out)
            kind = AutoCommitError
        _AUTO_KINDS[base] = kind
    return kind


def auto_commit_error(error: Exception, taken: int, pending: int, note: str) -> AutoCommitError:
    """An :class:`AutoCommitError` that is also of ``error``'s class: ``error``'s message and attributes,
    with ``note`` (what was taken and what to do) appended to the message."""
    kind = _auto_kind(type(error)) if not isinstance(error, AutoCommitError) else AutoCommitError
    new: AutoCommitError
    if isinstance(error, OSError) and issubclass(kind, OSError):
        new = kind(*error.args)  # (errno and strerror parsed as OSError does)
        new.filename, new.filename2 = error.filename, error.filename2
    else:
        new = kind.__new__(kind, *error.args)
        new.__dict__.update(getattr(error, "__dict__", {}))
    new.taken, new.pending, new.error, new._note = taken, pending, error, note
    return new


def open_files_exhausted(path: str | os.PathLike[str], exc: OSError) -> OSError | None:
    """For ``exc`` raised opening ``path``: an ``OSError`` naming the open-files limit when the process
    (not the file) is at fault (``EMFILE``/``ENFILE``), else None (the caller reports the file)."""
    if exc.errno not in (errno.EMFILE, errno.ENFILE):
        return None
    return OSError(exc.errno, f"{path}: cannot open ({exc.strerror}): too many open files in this process (ulimit -n)")
