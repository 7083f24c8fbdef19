"""Shared pieces of the importers: the error type for malformed source files, byte-budget chunking,
and the all-or-nothing write of a new store.

Every importer validates all of its sources first (cheap: headers, shapes, length sums) and only then
creates the output store; data-dependent failures during the write abort the writer *and* delete the
new store, so a failed conversion never leaves a committed store behind (the writer commits a shard
by itself when it reaches ``shard_bytes``, so aborting alone would not be enough).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import FormatError
from ..schema import Schema
from ..store import Writer, create

__all__ = ["SourceFormatError", "Progress", "split_by_budget", "new_store", "DEFAULT_CHUNK_BYTES"]

#: Default bytes of rows read from a source (or a store) per step of a conversion.
DEFAULT_CHUNK_BYTES = 64 << 20

#: A progress callback: called with the number of source bytes (or records) just processed.
Progress = Callable[[int], None]


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


def new_store(
    out: str | os.PathLike[str],
    schema: Schema | Mapping[str, Any],
    fill: Callable[[Writer], None],
    *,
    overwrite: bool = False,
    shard_bytes: int = 1 << 30,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Create the store ``out``, call ``fill(writer)``, commit and close.

    If ``fill`` raises (or the final commit fails), the writer is aborted and the new store directory
    is deleted, shards it already committed included, then the exception propagates: either the
    whole conversion is there or nothing is. Validate sources before calling this so that a bad input
    never replaces an existing store with ``overwrite=True``.
    """
    root = Path(out)
    writer = create(root, schema, overwrite=overwrite, shard_bytes=shard_bytes, metadata=metadata)
    try:
        fill(writer)
        writer.close()
    except BaseException:
        writer.abort()
        shutil.rmtree(root, ignore_errors=True)
        raise
