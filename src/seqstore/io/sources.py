"""Which byte source a path or URL names: the one place that tells a local store from a remote one.

:func:`open_source` returns a :class:`~seqstore.io.local_source.LocalSource` for a path or a
``file://`` URL and a :class:`~seqstore.io.remote_source.RemoteSource` for any other URL (or when an
fsspec ``filesystem`` is given). The remote side, and with it the object-store client, is imported
only when a remote store is opened.
"""

from __future__ import annotations

import os
from typing import Any

from .local_source import LocalSource
from .objects import is_remote
from .source import ByteSource

__all__ = ["open_source"]


def open_source(
    path: str | os.PathLike[str],
    storage_options: dict[str, Any] | None = None,
    filesystem: Any = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_bytes: int | str | None = None,
) -> ByteSource:
    """The source of the store at ``path`` (arguments as for :func:`seqstore.open`). Reads nothing:
    :meth:`~seqstore.io.source.ByteSource.load` reads the store's root."""
    if is_remote(path) or filesystem is not None:
        from .remote_source import RemoteSource  # only remote stores load the object-store client

        return RemoteSource(
            os.fspath(path), storage_options, filesystem=filesystem, cache_dir=cache_dir, cache_bytes=cache_bytes
        )
    return LocalSource(path)
