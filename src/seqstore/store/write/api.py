"""Opening a store for writing: :func:`open_target` (the one place a path or URL decides between a
local directory and object storage), and :func:`create`, :func:`open_or_create`, :func:`append_to`
and :func:`existing_manifest` on top of it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import SchemaError
from ...format.manifest import Manifest
from ...io.local_source import local_path
from ...io.object_common import check_not_chained
from ...io.objects import ObjectClient, is_remote
from ...schema import Schema, schema_difference
from .local import LocalTarget
from .objects import ObjectTarget
from .remote import writing_client
from .target import CommitTarget, checked_schema, new_manifest
from .writer import Writer, check_sizes

__all__ = ["append_to", "create", "existing_manifest", "open_or_create", "open_target"]


def open_target(
    path: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    filesystem: Any = None,
    staging_dir: str | os.PathLike[str] | None = None,
    upload_workers: int = 8,
    writing: bool = True,
    what: str = "",
) -> CommitTarget:
    """The commit target of the store at ``path``: :class:`~seqstore.store.write.objects.ObjectTarget`
    for a URL of object storage (``s3://``, ``gs://``, ``az://``; ``storage_options`` configure its
    client), else :class:`~seqstore.store.write.local.LocalTarget` (``file://`` stripped). ``writing``:
    the back end must have conditional writes (which committing relies on); without it, a plain client
    for reading, listing and deleting. ``what`` names the path in errors (``seqstore copy``'s ends)."""
    text = os.fspath(path)
    check_not_chained(text)
    if is_remote(text):
        if writing:
            client = writing_client(text, storage_options, filesystem)
        else:
            client = ObjectClient(text.rstrip("/"), storage_options)
        return ObjectTarget(client, staging_dir=staging_dir, upload_workers=upload_workers)
    if what and storage_options:
        raise ValueError(f"{what} {text}: storage options were given for a local path")
    if storage_options or staging_dir is not None:
        raise ValueError(f"{text}: storage_options and staging_dir are for URLs of object storage, not local paths")
    if filesystem is not None:
        writing_client(text, None, filesystem)  # refuses: fsspec has no conditional write
    return LocalTarget(local_path(text))


def create(
    path: str | os.PathLike[str],
    schema: Mapping[str, Any] | Schema,
    *,
    shard_bytes: int = 1 << 30,
    buffer_bytes: int = 64 << 20,
    max_shard_records: int = 1 << 24,
    overwrite: bool = False,
    metadata: Mapping[str, Any] | None = None,
    packed: Mapping[str, Sequence[str]] | None = None,
    id_lookup: str = "first",
    direct_io: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    staging_dir: str | os.PathLike[str] | None = None,
    filesystem: Any = None,
) -> Writer:
    """Create a new store at ``path`` and return a :class:`Writer` (a context manager).

    ``schema`` is a (nested) dict of name -> :class:`~seqstore.Field`. ``overwrite=True`` replaces an
    existing store (at a URL: its manifest first, then every object under the URL); otherwise an
    existing path is ``FileExistsError``. ``packed`` (``{group: [field, ...]}``) stores those fixed
    fields as one matrix per group (format version 2). ``id_lookup="last"`` makes ``index(id)`` return
    the last record written with an id instead of the first (version 2). ``direct_io``: see
    :class:`Writer`. A URL of object storage (``s3://``, ``gs://``, ``az://``) takes ``storage_options``
    (the client's, as :func:`seqstore.open` takes them) and ``staging_dir`` (where shards are built
    before upload; default a new temporary directory); a URL whose back end has no conditional write
    (``https://``, fsspec URLs, ``filesystem=``) is refused with an error that says to write locally
    and copy.
    """
    target = open_target(path, storage_options, filesystem=filesystem, staging_dir=staging_dir)
    sch = checked_schema(schema, packed, id_lookup)
    # before the store is made
    check_sizes(shard_bytes=shard_bytes, buffer_bytes=buffer_bytes, max_shard_records=max_shard_records)
    target.create(new_manifest(sch, metadata, id_lookup), overwrite=overwrite)
    return _first_writer(target, True, shard_bytes=shard_bytes, buffer_bytes=buffer_bytes,
                         max_shard_records=max_shard_records, direct_io=direct_io)


def _first_writer(target: CommitTarget, made: bool, **options: Any) -> Writer:
    """The writer on ``target``; where it fails to open (an interrupt, a full disk) on the local store this
    call has just ``made``, that store goes too (unless another writer took it meanwhile): the corrected
    call must not find it in its way, or append to it with the failed call's settings."""
    try:
        return Writer(target, **options)
    except BaseException:
        if made and isinstance(target, LocalTarget):
            with contextlib.suppress(Exception):  # (the open's error is the one to report)
                target.remove_if_empty()
        raise


def open_or_create(
    path: str | os.PathLike[str],
    schema: Mapping[str, Any] | Schema,
    *,
    shard_bytes: int = 1 << 30,
    buffer_bytes: int = 64 << 20,
    max_shard_records: int = 1 << 24,
    metadata: Mapping[str, Any] | None = None,
    packed: Mapping[str, Sequence[str]] | None = None,
    id_lookup: str = "first",
    direct_io: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    staging_dir: str | os.PathLike[str] | None = None,
    filesystem: Any = None,
) -> Writer:
    """A writer on the store at ``path`` (a local path or a URL), creating it when it does not exist;
    safe when several processes (ranks) call it at once: exactly one creates it (locally a store
    prepared in a sibling temporary directory and renamed into place; at a URL a create-only write of
    the manifest), the others (and later callers) append. An existing store must have the same schema
    (packed groups included) and ``id_lookup``, else :class:`SchemaError`."""
    target = open_target(path, storage_options, filesystem=filesystem, staging_dir=staging_dir)
    sch = checked_schema(schema, packed, id_lookup)
    # before the store is made
    check_sizes(shard_bytes=shard_bytes, buffer_bytes=buffer_bytes, max_shard_records=max_shard_records)
    made = target.install_for_writer(new_manifest(sch, metadata, id_lookup))
    writer = _first_writer(target, made, shard_bytes=shard_bytes, buffer_bytes=buffer_bytes,
                           max_shard_records=max_shard_records, direct_io=direct_io)
    have = writer._start
    if have.schema != sch or have.id_lookup != id_lookup:
        writer.abort()
        if have.schema != sch:
            raise SchemaError(f"{target.where}: existing store has schema other than the one given: "
                              f"{schema_difference(have.schema, sch)}")
        raise SchemaError(f"{target.where}: existing store has id_lookup {have.id_lookup!r}, expected {id_lookup!r}")
    return writer


def append_to(
    path: str | os.PathLike[str],
    *,
    shard_bytes: int = 1 << 30,
    buffer_bytes: int = 64 << 20,
    max_shard_records: int = 1 << 24,
    direct_io: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    staging_dir: str | os.PathLike[str] | None = None,
    filesystem: Any = None,
) -> Writer:
    """Open an existing store (a local path or a URL) to add shards. Many processes may do this at
    once, on any number of machines."""
    target = open_target(path, storage_options, filesystem=filesystem, staging_dir=staging_dir)
    return Writer(target, shard_bytes=shard_bytes, buffer_bytes=buffer_bytes, max_shard_records=max_shard_records,
                  direct_io=direct_io)


def existing_manifest(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> Manifest | None:
    """The manifest of the store at ``path`` (a local path or a URL), or None when there is none (for
    callers that decide between creating and appending, such as the Logger)."""
    return open_target(path, storage_options, writing=False).read_manifest()
