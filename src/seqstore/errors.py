"""The seqstore exception hierarchy.

Every error seqstore raises on bad input or damaged data derives from :class:`SeqstoreError`
and says which file, field, record or id is at fault and what was expected.
"""

from __future__ import annotations

import errno
import os

__all__ = ["SeqstoreError", "FormatError", "SchemaError", "CorruptionError", "LockError", "open_files_exhausted"]


class SeqstoreError(Exception):
    """Base class of every seqstore error."""


class FormatError(SeqstoreError):
    """A store is not a seqstore store, or uses a format version this library does not read."""


class SchemaError(SeqstoreError, ValueError):
    """A schema, record or batch does not match what the store expects."""


class CorruptionError(SeqstoreError):
    """A file of a committed shard is missing, truncated or disagrees with the manifest."""


class LockError(SeqstoreError):
    """The store's commit lock could not be taken."""


def open_files_exhausted(path: str | os.PathLike[str], exc: OSError) -> OSError | None:
    """For ``exc`` raised opening ``path``: an ``OSError`` naming the open-files limit when the process
    (not the file) is at fault (``EMFILE``/``ENFILE``), else None (the caller reports the file)."""
    if exc.errno not in (errno.EMFILE, errno.ENFILE):
        return None
    return OSError(exc.errno, f"{path}: cannot open ({exc.strerror}): too many open files in this process (ulimit -n)")
