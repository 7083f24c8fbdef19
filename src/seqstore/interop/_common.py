"""Shared pieces of the importers and exporters: the error types, progress totals, byte-budget chunking,
and the all-or-nothing write of a new output: validated first, built in a hidden sibling and renamed
into place once complete, so a failure during the write (the writer commits shards by itself) leaves
nothing behind and an existing output, even with ``overwrite=True``, untouched.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import FormatError, SeqstoreError
from ..format.manifest import MANIFEST, fsync_dir
from ..schema import Schema
from ..store import Writer, create

__all__ = ["SourceFormatError", "OutputExistsError", "Progress", "announce_total", "split_by_budget", "runs_across",
           "name_map", "replaced", "new_store", "DEFAULT_CHUNK_BYTES"]

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


class OutputExistsError(FileExistsError):
    """The output of a conversion already exists and ``overwrite`` was not given; ``path`` names it.

    The message speaks Python (``overwrite=True``); the command line says ``--overwrite`` instead.
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__(f"{path}: already exists (pass overwrite=True to replace it)")
        self.path = str(path)


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
    if n == 0:
        return
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
    """``given`` as ``{name: new name}``: a mapping as it is, a list of names (or None: ``default``) each
    kept under its own name."""
    if isinstance(given, Mapping):
        return dict(given)
    return {n: n for n in (default if given is None else given)}


def temp_sibling(root: Path, tag: str) -> Path:
    """``<parent>/.<name>.<tag>-<pid>-<random>``: a hidden sibling of ``root`` (same file system, so a
    rename onto ``root`` is atomic)."""
    return root.with_name(f".{root.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _not_a_store(root: Path) -> bool:
    """A file (a source named as the output by mistake), or a non-empty directory without a manifest."""
    return not root.is_dir() or (not (root / MANIFEST).exists() and any(root.iterdir()))


def check_output(root: Path, overwrite: bool, refuse: Callable[[Path], bool] = _not_a_store,
                 what: str = "what is not a store (a file, or a non-empty directory without a manifest)",
                 error: type[Exception] = SeqstoreError) -> None:
    """Refuse an existing ``root`` unless ``overwrite`` (OutputExistsError), and even then one that
    ``refuse(root)`` says may not be replaced (``error``: "refusing to overwrite ``what``"); make the
    parent directory."""
    if root.exists() or root.is_symlink():
        if not overwrite:
            raise OutputExistsError(root)
        if refuse(root):
            raise error(f"{root}: refusing to overwrite {what}")
    root.parent.mkdir(parents=True, exist_ok=True)


def install_output(tmp: Path, root: Path) -> None:
    """Move the finished store ``tmp`` to ``root``: an existing ``root`` is renamed aside, ``tmp`` renamed
    into place, then the old one deleted (put back if the second rename fails)."""
    if root.exists() or root.is_symlink():
        old = temp_sibling(root, "old")
        os.replace(root, old)
        try:
            os.replace(tmp, root)
        except BaseException:
            os.replace(old, root)  # put the previous store back
            raise
        fsync_dir(root.parent)
        remove_path(old)
    else:
        os.replace(tmp, root)
        fsync_dir(root.parent)


@contextlib.contextmanager
def replaced(root: Path, tag: str = "tmp") -> Iterator[Path]:
    """A hidden sibling of ``root`` (:func:`temp_sibling`) to build an output in: installed at ``root``
    (:func:`install_output`) when the block ends, deleted when it raises (``root`` then as before)."""
    tmp = temp_sibling(root, tag)
    try:
        yield tmp
        install_output(tmp, root)
    except BaseException:
        remove_path(tmp)
        raise


def new_store(out: str | os.PathLike[str], schema: Schema | Mapping[str, Any], fill: Callable[[Writer], None], *,
              overwrite: bool = False, shard_bytes: int = 1 << 30, metadata: Mapping[str, Any] | None = None,
              direct_io: bool = False) -> None:
    """Create the store ``out``, call ``fill(writer)``, commit and close: all or nothing. ``direct_io``:
    the data files are written with ``O_DIRECT`` (:class:`~seqstore.store.Writer`).

    The store is built in a hidden sibling ``<parent>/.<name>.tmp-<pid>-<random>`` and renamed into
    place once the writer has closed (:func:`replaced`); if ``fill`` or the commit fails, the writer is
    aborted and only the sibling deleted: ``out`` is exactly as before. A crash leaves at worst a hidden
    ``.<name>.tmp-*`` (or ``.<name>.old-*`` holding the previous store) next to ``out``. Before anything
    is written: :class:`OutputExistsError` (a FileExistsError) when ``out`` exists and ``overwrite`` is
    false, SeqstoreError when it is not a store (a file, or a non-empty directory without a manifest).
    """
    root = Path(out)
    check_output(root, overwrite)
    with replaced(root) as tmp:
        writer = create(tmp, schema, shard_bytes=shard_bytes, metadata=metadata, direct_io=direct_io)
        try:
            fill(writer)
            writer.close()
        except BaseException:
            writer.abort()
            raise
