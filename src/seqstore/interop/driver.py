"""The one importer driver: every ``import_*`` function reads and plans its source, then hands the driver
a :class:`Conversion` to write (docs/interop.md, "One importer driver").

A format module checks its files, infers the schema, names its errors and describes the work as a
picklable job (``job.write(writer, segments, progress)`` appends the records of ``segments`` in order)
with, where the source splits, a function cutting it into units for worker processes. The driver does
the rest, the same way for every format: :func:`options` reads the common keywords and refuses bad ones
before anything is read; :func:`write` sends more than one unit (or a URL, for a format that writes URLs
as parts) to worker processes (:func:`~._parallel.convert_in_parallel`: parts, one commit) and anything
else to :func:`~._parallel.build_store` in this process (a job that reads back what it committed, as
the LogIX import's duplicate check does, is one writer in a local directory, copied to a URL once
complete). The progress total is announced once the
output path is checked (a total that costs a pass over the source only when the callback has
``add_total``). All or nothing: a failure leaves no store (an existing one, with ``overwrite``, intact).
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from ..errors import ConfigError
from ..io.objects import is_remote
from ..schema import Schema
from ..store import Store, Writer
from ._common import (
    DEFAULT_CHUNK_BYTES,
    Progress,
    announce_total,
    check_not_chained,
    check_sources_apart,
    file_url_path,
    parents_undone,
)
from ._parallel import Job, build_store, convert_in_parallel

__all__ = ["Conversion", "ImportOptions", "Options", "options", "source_list", "write"]


class ImportOptions(TypedDict, total=False):
    """The keywords every ``import_*`` function takes, each optional (:class:`Options` has the defaults)."""

    chunk_bytes: int
    shard_bytes: int
    overwrite: bool
    progress: Progress | None
    workers: int
    storage_options: Mapping[str, Any] | None


@dataclasses.dataclass(frozen=True)
class Options:
    """:class:`ImportOptions` read, with their defaults. ``chunk_bytes``: bytes of rows read per step;
    ``shard_bytes``: bytes per store shard; ``overwrite``: replace an existing ``out`` (a failure keeps
    it as it was; without it an existing ``out`` is a FileExistsError); ``progress``: called with the
    work of each step in the importer's unit (an ``add_total(n)`` method is told the total once the
    inputs are checked); ``workers``: processes, this one included where the format says so (the
    records keep the input order whatever the number); ``storage_options``: the client options of an
    ``out`` at a URL of object storage."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    shard_bytes: int = 1 << 30
    overwrite: bool = False
    progress: Progress | None = None
    workers: int = 1
    storage_options: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Conversion:
    """A source read and planned by its format module: what :func:`write` turns into a store.

    ``job.write(writer, segments, progress)`` appends the records of ``segments``; ``whole`` are the
    segments of every record (one process). ``units(workers)``: ``(job, segments)`` pairs, one part
    each, in record order (None: the source cannot be split). ``total``: the work in the progress
    unit, a function computing it (called only when it is wanted), or None when unknown.
    ``url_as_parts``: a URL is written by workers as parts even with ``workers=1`` (else in this
    process, as one part). ``preload``, ``in_driver``: as :func:`~._parallel.convert_in_parallel`;
    ``after_parallel`` runs once a parallel conversion ends (either way). ``packed``: fields packed
    into one matrix per group (:func:`~seqstore.create`'s ``packed``); ``reads_back``: the job opens
    what it has committed (``writer.root``) as a store while it writes. Either makes the store built
    in this process in a local directory (a URL: copied there once complete), as one writer."""

    schema: Schema
    metadata: Mapping[str, Any]
    job: Job
    whole: Any
    total: int | Callable[[], int | None] | None
    units: Callable[[int], Sequence[tuple[Job, Any]]] | None = None
    url_as_parts: bool = True
    preload: Sequence[str] = ()
    in_driver: bool = False
    after_parallel: Callable[[], None] | None = None
    packed: Mapping[str, Sequence[str]] | None = None
    reads_back: bool = False


def options(who: str, out: str | os.PathLike[str], given: Mapping[str, Any], sources: Any = ()) -> Options:
    """The common keywords of ``who`` read (TypeError for an unknown one, as for any function) and checked
    (ValueError), before its sources are read; SeqstoreError for a local source in ``out``, which an
    ``overwrite`` would delete (:func:`~._common.check_sources_apart`)."""
    known = {f.name for f in dataclasses.fields(Options)}
    for name in given:
        if name not in known:
            raise TypeError(f"{who}() got an unexpected keyword argument {name!r}")
    opts = Options(**given)
    check_not_chained(os.fspath(out))
    check_sources_apart(sources, out, who)
    if opts.storage_options and not is_remote(out):
        raise ConfigError(f"{out}: storage_options are for URLs of object storage, not local paths")
    for name in ("chunk_bytes", "shard_bytes", "workers"):
        value = getattr(opts, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{who}: {name} must be an integer, got {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be {'at least 1' if name == 'workers' else 'positive'}, got {value}")
    return opts


def source_list(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], who: str) -> list[Any]:
    """``sources`` as a list (one path, or several; a ``file://`` URL as its path, as a store's is taken);
    ValueError naming ``who`` for none."""
    given = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    if not given:
        raise ValueError(f"{who}: no sources given")
    return [file_url_path(s) for s in given]


def _total(conv: Conversion, progress: Progress | None, needed: bool) -> int | None:
    """The conversion's total, computed by its function only when ``needed`` or wanted by ``progress``."""
    if not callable(conv.total):
        return conv.total
    return conv.total() if needed or hasattr(progress, "add_total") else None


@parents_undone
def write(conv: Conversion, out: str | os.PathLike[str], opts: Options, *, direct_io: bool = False) -> Store:
    """Build the store ``out`` from ``conv`` (with ``opts.workers`` processes where it splits), all or
    nothing, and open it (the module docs say how); a failure also removes the directories above a local
    ``out`` that were made to hold it."""
    remote, workers, progress = is_remote(out), opts.workers, opts.progress
    metadata = dict(conv.metadata)
    one_writer = conv.reads_back or conv.packed is not None
    parts_for_url = remote and conv.url_as_parts and not one_writer
    units = conv.units(workers) if conv.units is not None and not one_writer and (workers > 1 or parts_for_url) else []
    if len(units) > 1 or parts_for_url:
        try:
            return convert_in_parallel(out, conv.schema, units, _total(conv, progress, True) or 0,
                                       overwrite=opts.overwrite, shard_bytes=opts.shard_bytes, metadata=metadata,
                                       workers=workers, progress=progress, storage_options=opts.storage_options,
                                       preload=conv.preload, in_driver=conv.in_driver, direct_io=direct_io)
        finally:
            if conv.after_parallel is not None:
                conv.after_parallel()

    def fill(writer: Writer) -> None:  # called once the output path is checked
        if (total := _total(conv, progress, False)) is not None:
            announce_total(progress, total)
        conv.job.write(writer, conv.whole, progress)

    return build_store(out, conv.schema, fill, overwrite=opts.overwrite, shard_bytes=opts.shard_bytes,
                       metadata=metadata, storage_options=opts.storage_options, direct_io=direct_io,
                       packed=conv.packed, aside=conv.reads_back)
