"""Which byte source a path or URL names: the one place that tells a local store from a remote one.

:func:`open_source` returns a :class:`~seqstore.io.local_source.LocalSource` for a path or a
``file://`` URL and a :class:`~seqstore.io.remote_source.RemoteSource` for any other URL (or when an
fsspec ``filesystem`` is given), carrying its :class:`~seqstore.io.options.StoreOptions`. The remote
side, and with it the object-store client, is imported only when a remote store is opened.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .local_source import LocalSource
from .object_common import check_not_chained
from .object_errors import client_takes, unknown_local_key
from .objects import is_remote
from .options import StoreOptions
from .source import ByteSource

__all__ = ["open_source"]


def open_source(
    path: str | os.PathLike[str], storage_options: StoreOptions | Mapping[str, Any] | None = None, **remote: Any
) -> ByteSource:
    """The source of the store at ``path``; ``storage_options`` and ``remote`` (``filesystem``,
    ``cache_dir``, ``cache_bytes``) as for :func:`seqstore.open`, or a
    :class:`~seqstore.io.options.StoreOptions`. Reads nothing: :meth:`~seqstore.io.source.ByteSource.load`
    reads the store's root. A local store checks its options, as a URL does (ConfigError: a value out of
    range, a key that neither seqstore nor any service's client knows), and otherwise ignores them
    (:class:`~seqstore.Store` itself takes ``verify_reads``)."""
    check_not_chained(os.fspath(path))
    filesystem = remote.get("filesystem")
    if isinstance(storage_options, StoreOptions) and filesystem is None:
        filesystem = storage_options.filesystem
    if is_remote(path) or filesystem is not None:
        from .remote_source import RemoteSource  # only remote stores load the object-store client

        url = os.fspath(path)
        return RemoteSource(url, StoreOptions.of(url, storage_options, **remote))
    options = StoreOptions.of(os.fspath(path), storage_options, **remote)  # (checks seqstore's keys and values)
    for key in options.backend:
        if not client_takes(key):
            raise unknown_local_key(os.fspath(path), key)
    return LocalSource(path)
