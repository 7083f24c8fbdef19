"""Shared pieces of the importers and exporters: the error types, progress totals, byte-budget chunking,
and the all-or-nothing write of a new store (:func:`new_store`, over ``store/aside.py``): validated
first, built in a hidden sibling and renamed into place once complete, so a failure during the write (the
writer commits shards by itself) leaves nothing behind and an existing output, even with
``overwrite=True``, untouched.
"""

from __future__ import annotations

import functools
import numbers
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from ..errors import FormatError, SchemaError, SeqstoreError
from ..io.local_source import local_path
from ..io.object_common import check_not_chained
from ..io.objects import is_remote
from ..schema import BFLOAT16, Schema, field_list
from ..store import Store, Writer, create, open_store
from ..store.aside import built_aside
from ..store.write.outputs import (  # (re-exported: the importers take them from here)
    OutputExistsError,
    check_output,
    install_output,
    remove_path,
    replaced,
    temp_sibling,
)

__all__ = ["SourceFormatError", "OutputExistsError", "Progress", "announce_total", "split_by_budget", "runs_across",
           "name_map", "check_named_once", "replaced", "new_store", "DEFAULT_CHUNK_BYTES", "check_output",
           "install_output", "remove_path", "temp_sibling", "local_output", "check_apart", "parents_undone",
           "read_as_float32", "check_size", "check_not_chained",
           "check_sources_apart", "file_url_path"]

#: Default bytes of rows read from a source (or a store) per step of a conversion.
DEFAULT_CHUNK_BYTES = 64 << 20

#: A progress callback, called with the work just done (each importer and exporter documents its unit);
#: one with an ``add_total(n)`` method is told the total first (:func:`announce_total`), which the steps
#: add up to on success.
Progress = Callable[[int], None]


def announce_total(progress: Progress | None, total: int) -> None:
    """Tell ``progress`` (if it has an ``add_total`` method) that ``total`` more units of work are coming:
    after validation, so a bar built on it appears only for good inputs; may be called several times."""
    add = getattr(progress, "add_total", None)
    if add is not None:
        add(int(total))


class SourceFormatError(FormatError):
    """A file to import (RETURNN HDF, Parquet, Arrow) is missing data or contradicts itself.

    ``path`` is the file and ``dataset`` the HDF dataset or Arrow column at fault (None when the file
    as a whole is unreadable).
    """

    def __init__(self, path: str | Path, dataset: str | None, message: str) -> None:
        where = f"{path}" + (f", dataset {dataset!r}" if dataset else "")
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.dataset = dataset
        self._message = message

    def __reduce__(self) -> tuple[Any, ...]:  # raised in a worker process of a parallel convert
        return (type(self), (self.path, self.dataset, self._message))


def split_by_budget(cost: npt.NDArray[np.int64], budget: int) -> Iterator[tuple[int, int]]:
    """Cut ``len(cost)`` consecutive items into ``[a, b)`` runs whose summed cost stays within ``budget``.

    A run holds at least one item (an item dearer than ``budget`` is a run by itself). One cumulative
    sum and one ``searchsorted`` per run: O(len(cost)) time and memory.
    """
    n = len(cost)
    cum = np.cumsum(cost, dtype=np.int64)
    a = 0
    while a < n:
        base = int(cum[a - 1]) if a else 0
        b = int(np.searchsorted(cum, base + budget, side="right"))
        b = min(max(b, a + 1), n)
        yield a, b
        a = b


def runs_across(counts: Sequence[int], budget: int) -> list[list[tuple[int, int, int]]]:
    """The items of consecutive sources (``counts[k]`` items in source ``k``), in order, cut into runs of
    ``budget`` items (the last may be shorter), each a list of ``(source, first, end)`` pieces: a run may
    span several small sources, a large source several runs. O(runs + sources)."""
    units: list[list[tuple[int, int, int]]] = []
    run: list[tuple[int, int, int]] = []
    room = budget
    for k, n in enumerate(counts):
        a = 0
        while a < n:
            b = min(n, a + room)
            run.append((k, a, b))
            room -= b - a
            a = b
            if room == 0:
                units.append(run)
                run, room = [], budget
    if run:
        units.append(run)
    return units


def name_map(given: Mapping[str, str] | Sequence[str] | None, default: Iterable[str]) -> dict[str, str]:
    """``given`` as ``{name: new name}``: a mapping as it is, a list of names (a str: one name; None:
    ``default``) each kept under its own name."""
    if isinstance(given, Mapping):
        return dict(given)
    return {n: n for n in (default if given is None else field_list(given) or [])}


def file_url_path(source: Any) -> Any:
    """A source given as a ``file://`` URL as its path (as a store's URL is taken); anything else as it is."""
    return source[len("file://"):] if isinstance(source, str) and source.startswith("file://") else source


def local_output(out: str | os.PathLike[str], what: str) -> Path:
    """The local path ``out`` an exporter writes (a ``file://`` URL as its path); SeqstoreError naming
    ``what`` for a URL of object storage (it was made as a local directory named ``s3:``), ConfigError
    for a chained URL."""
    check_not_chained(os.fspath(out))
    if is_remote(os.fspath(out)):
        raise SeqstoreError(f"{what}: {os.fspath(out)} is a URL; {what} writes local files only")
    return local_path(out)


def _places(path: str | os.PathLike[str]) -> set[Path]:
    """Where the local ``path`` is: its absolute path with the directories above resolved (what a rename
    onto it replaces, a symbolic link itself) and, when it is a link, where the link leads."""
    p = local_path(path)
    named = Path(os.path.normpath(p))  # (``a/..`` as ``.``: a rename does not take a name of ``..``)
    return {named.parent.resolve() / named.name, p.resolve()}


def check_apart(store: str | os.PathLike[str] | Store, outs: Iterable[str | os.PathLike[str]], who: str) -> None:
    """Refuse an export to ``outs`` (the local paths it writes) from ``store`` (a path, URL or Store) when
    one of them is the local store's directory, inside it, or a directory holding it: written there (with
    ``overwrite``, replacing what is there), it would overwrite or delete the store it reads.
    SeqstoreError naming ``who``, the output and the store; nothing for a store or output at a URL.
    ConfigError for a store given as a chained URL (every exporter checks here first)."""
    src = store.source.reopen()[0] if isinstance(store, Store) else store
    check_not_chained(os.fspath(src))
    if is_remote(os.fspath(src)):
        return
    root = local_path(src).resolve()
    for out in outs:
        if is_remote(os.fspath(out)):
            continue
        for dest in _places(out):
            if dest == root or root in dest.parents:
                where = "is inside the store"  # (the store's directory itself too)
            elif dest in root.parents:
                where = "holds the store"
            else:
                continue
            raise SeqstoreError(f"{who}: the output {os.fspath(out)} {where} {os.fspath(src)} that it exports "
                                "(writing it would overwrite or delete the store's files); write it elsewhere")


def check_sources_apart(sources: Any, out: str | os.PathLike[str], who: str) -> None:
    """Refuse an import of ``sources`` (a path, or a list or tuple of them; anything else, such as a
    Dataset or CutSet, is not looked at) into ``out`` when a local source is ``out`` itself or lies
    inside it: replacing ``out`` (``overwrite``) would delete the source. SeqstoreError naming ``who``,
    the source and the output; nothing for an output or source at a URL."""
    if not isinstance(out, (str, os.PathLike)) or is_remote(os.fspath(out)):
        return
    given = [sources] if isinstance(sources, (str, os.PathLike)) else sources if isinstance(sources, (list, tuple)) \
        else []
    dests = _places(out)
    for src in given:
        if not isinstance(src, (str, os.PathLike)) or is_remote(os.fspath(src)):
            continue
        if any(place == d or d in place.parents for place in _places(src) for d in dests):
            raise SeqstoreError(f"{who}: the source {os.fspath(src)} is inside the output {os.fspath(out)} (replacing "
                                "the output would delete it); write the store elsewhere")


_Export = TypeVar("_Export", bound=Callable[..., Any])


def parents_undone(export: _Export) -> _Export:
    """``export(store, out, ...)`` that, when it raises, removes again the directories above a local ``out``
    that it made (the missing ones, made to hold the output), as long as they are empty: a failed export
    leaves nothing behind, not even them."""

    @functools.wraps(export)
    def run(store: Any, out: Any, *args: Any, **kwargs: Any) -> Any:
        made: list[Path] = []
        if isinstance(out, (str, os.PathLike)) and not is_remote(os.fspath(out)):
            for d in local_path(out).parents:  # (deepest first)
                if d.exists():
                    break
                made.append(d)
        try:
            return export(store, out, *args, **kwargs)
        except BaseException:
            for d in made:
                try:
                    d.rmdir()
                except OSError:  # (no longer empty: something else is in it now)
                    break
            raise

    return cast(_Export, run)


def read_as_float32(store: str | os.PathLike[str] | Store) -> Store:
    """``store`` (a path, URL or Store) opened with bfloat16 fields read as float32, as exporters whose
    formats know no bfloat16 write them. A Store given is kept where it reads no bfloat16 field as bits
    (already float32, or no such field); else it is reopened (O(1)) as it would be unpickled: with all
    its options (its client's, ``verify_reads``, ``readahead``, ``max_mapped_shards``) and the records
    it holds (not those committed since it was opened)."""
    if not isinstance(store, Store):
        return open_store(store, bfloat16="float32")
    if store.bfloat16 == "float32" or all(f.dtype != BFLOAT16 for f in store.schema.values()):
        return store
    rebuild, (path, _bits, *view) = store.__reduce__()  # (path, bfloat16, shards, records, options, crc)
    return cast(Store, rebuild(path, "float32", *view))


def check_size(who: str, name: str, value: Any) -> int:
    """``value`` of the keyword ``name`` of ``who`` (a chunk or shard size) as an int; ValueError naming
    both unless it is an integer >= 1 (a bool or float is not one)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{who}: {name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_named_once(where: str, names: Sequence[str], what: str = "field") -> None:
    """SchemaError naming ``where`` and the first of ``names`` (given in ``fields=``) that is there twice."""
    twice = [n for k, n in enumerate(names) if n in names[:k]]
    if twice:
        raise SchemaError(f"{where}: {what} {twice[0]!r} is named twice in fields; name each {what} once")


def new_store(out: str | os.PathLike[str], schema: Schema | Mapping[str, Any], fill: Callable[[Writer], None], *,
              overwrite: bool = False, shard_bytes: int = 1 << 30, metadata: Mapping[str, Any] | None = None,
              direct_io: bool = False, packed: Mapping[str, Sequence[str]] | None = None,
              storage_options: Mapping[str, Any] | None = None) -> None:
    """Create the store ``out``, call ``fill(writer)``, commit and close: all or nothing. ``direct_io``:
    the data files are written with ``O_DIRECT``; ``packed``: fields packed into one matrix per group
    (both as :func:`~seqstore.create` takes them).

    The store is built aside (:func:`~seqstore.store.aside.built_aside`): a local ``out`` in a hidden
    sibling ``<parent>/.<name>.tmp-<pid>-<random>``, renamed into place once the writer has closed; a
    URL of object storage (``storage_options``: its client's) in a local temporary directory, copied
    there once complete. If ``fill`` or the commit fails, the writer is aborted and only what was built
    aside deleted: ``out`` is exactly as before. A kill leaves at worst a hidden ``.<name>.tmp-*`` (or
    ``.<name>.old-*`` holding the previous store) next to a local ``out``, which the next conversion to
    ``out`` deletes (or puts back) once no process holds it. Before anything is written:
    :class:`OutputExistsError` (a FileExistsError) when ``out`` exists and ``overwrite`` is false,
    SeqstoreError when it is not a store (a file, or a non-empty directory without a manifest).
    """
    check_not_chained(os.fspath(out))
    with built_aside(out, overwrite, "seqstore-import-", storage_options) as tmp:
        writer = create(tmp, schema, shard_bytes=shard_bytes, metadata=metadata, direct_io=direct_io, packed=packed)
        try:
            fill(writer)
            writer.close()
        except BaseException:
            writer.abort()
            raise
