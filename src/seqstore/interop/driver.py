"""The one importer driver: every ``import_*`` function reads and plans its source, then hands the driver
a :class:`Conversion` to write.

A format module knows its source: it checks the files, infers the schema (its own hooks: Arrow types,
HDF streams, tar members, cut fields), names its errors, and describes the work as a picklable job
(``job.write(writer, segments, progress)`` appends the records of ``segments`` in order) with the
segments of everything and, where the source can be split, a function cutting it into units for
worker processes. The driver does the rest, the same way for every format:

1. :func:`check_import` refuses bad common arguments before anything is read (storage options for a
   local path, a chunk size or worker count below 1); :func:`source_list` an empty list of sources.
2. :func:`write` chooses the path: units for workers (``workers > 1`` and a source that splits into
   more than one unit, or a URL for a format that writes URLs as parts) go to
   :func:`~._parallel.convert_in_parallel` (parts written by worker processes, one commit); anything
   else is written in this process by :func:`~._parallel.build_store` (a hidden sibling renamed into
   place, or one part committed at a URL).
3. Progress: the total (records, bytes or cuts: the format's unit) is announced once the output path
   is checked and before the first record; a total that costs a pass over the source (a lazy
   manifest's lines) is only counted when the progress callback asks for totals (``add_total``).
4. All or nothing: a failure anywhere leaves no store (an existing one, with ``overwrite``, intact).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..io.objects import is_remote
from ..schema import Schema
from ..store import Store, Writer
from ._common import Progress, announce_total
from ._parallel import Job, build_store, convert_in_parallel

__all__ = ["Conversion", "check_import", "source_list", "write"]


@dataclasses.dataclass(frozen=True)
class Conversion:
    """A source read and planned by its format module: what :func:`write` turns into a store.

    ``job.write(writer, segments, progress)`` appends the records of ``segments``; ``whole`` are the
    segments of every record (one process). ``units(workers)``: ``(job, segments)`` pairs, one part
    each, in record order (None: the source cannot be split). ``total``: the work in the progress
    unit, a function computing it (called only when it is wanted), or None when unknown.
    ``url_as_parts``: a URL is written by workers as parts even with ``workers=1`` (else in this
    process, as one part). ``preload``, ``in_driver``: as :func:`~._parallel.convert_in_parallel`;
    ``after_parallel`` runs once a parallel conversion ends (either way)."""

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


def check_import(out: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None, chunk_bytes: int,
                 workers: int) -> None:
    """ValueError for arguments every importer refuses, before its sources are read."""
    if storage_options and not is_remote(out):
        raise ValueError(f"{out}: storage_options are for URLs of object storage, not local paths")
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")


def source_list(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], who: str) -> list[Any]:
    """``sources`` as a list (one path, or several); ValueError naming ``who`` for none."""
    given = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    if not given:
        raise ValueError(f"{who}: no sources given")
    return given


def _total(conv: Conversion, progress: Progress | None, needed: bool) -> int | None:
    """The conversion's total, computed by its function only when ``needed`` or wanted by ``progress``."""
    if not callable(conv.total):
        return conv.total
    return conv.total() if needed or hasattr(progress, "add_total") else None


def write(conv: Conversion, out: str | os.PathLike[str], *, overwrite: bool, shard_bytes: int, workers: int,
          progress: Progress | None, storage_options: Mapping[str, Any] | None, direct_io: bool = False) -> Store:
    """Build the store ``out`` from ``conv`` (with ``workers`` processes where it splits), all or
    nothing, and open it (the module docs say how)."""
    remote = is_remote(out)
    metadata = dict(conv.metadata)
    parts_for_url = remote and conv.url_as_parts
    units = conv.units(workers) if conv.units is not None and (workers > 1 or parts_for_url) else []
    if len(units) > 1 or parts_for_url:
        try:
            return convert_in_parallel(out, conv.schema, units, _total(conv, progress, True) or 0,
                                       overwrite=overwrite, shard_bytes=shard_bytes, metadata=metadata,
                                       workers=workers, progress=progress, storage_options=storage_options,
                                       preload=conv.preload, in_driver=conv.in_driver, direct_io=direct_io)
        finally:
            if conv.after_parallel is not None:
                conv.after_parallel()

    def fill(writer: Writer) -> None:  # called once the output path is checked
        total = _total(conv, progress, False)
        if total is not None:
            announce_total(progress, total)
        conv.job.write(writer, conv.whole, progress)

    return build_store(out, conv.schema, fill, overwrite=overwrite, shard_bytes=shard_bytes, metadata=metadata,
                       storage_options=storage_options, direct_io=direct_io)
