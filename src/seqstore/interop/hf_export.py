"""A store as a Hugging Face ``datasets`` dataset: :func:`export_hf`.

``export_hf(store, out)`` writes a ``save_to_disk`` directory that ``datasets.load_from_disk(out)``
opens memory-mapped (and :func:`~seqstore.interop.hf.import_hf` reads back into the same fields), one
column per field and one for the ids:

==========================  ====================================================================
field                       column (Arrow type; ``datasets`` feature)
==========================  ====================================================================
scalar                      its number type (``Value``); bfloat16 widened to float32
fixed ``(d, e, ...)``       fixed-size lists, one level per axis (``Sequence(..., length=d)``)
ragged ``(None, d, ...)``   per record, a list of its rows as fixed-size lists (``Sequence`` of those)
ids                         a string column named ``id_column`` (default ``"id"``), when the store has ids
==========================  ====================================================================

Nothing is built per record: each batch of ``chunk_records`` records (fewer where a ragged field's rows
would pass the 2^31 - 1 of a list column; read ahead) becomes columns from
its flat values and lengths (:mod:`seqstore.interop.to_arrow`), written to one Arrow stream file next
to ``out`` that ``datasets`` then lays out with its own ``save_to_disk``. Memory O(``chunk_records``);
the bytes are written twice. All or nothing: ``out`` appears complete or not at all, and an existing
``out`` is replaced only with ``overwrite`` and only if it is a ``save_to_disk`` directory.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SchemaError
from ..schema import Field, field_list
from ..store import Store, open_store
from . import to_arrow
from ._common import (
    Progress,
    announce_total,
    check_apart,
    check_named_once,
    check_output,
    check_size,
    local_output,
    parents_undone,
    remove_path,
    replaced,
    temp_sibling,
)
from .hf import datasets_module
from .to_arrow import pyarrow_module

__all__ = ["export_hf", "CHUNK_RECORDS"]

#: Records converted per step by default.
CHUNK_RECORDS = 8192
_HINT = "; a datasets list column holds at most that many in one record"


def _fixed(flat: Any, shape: Sequence[int], n: int) -> Any:
    """``flat`` (leaf values, row-major) as ``n`` fixed-size lists, one level per axis of ``shape``; with an
    axis of size 0 (which Arrow's fixed-size lists cannot have), lists of as many empty lists instead."""
    if 0 in shape:
        return to_arrow.fixed_lists(flat, shape, n, what="export_hf", hint=_HINT)
    pa = pyarrow_module()
    arr = flat
    for d in reversed(shape):
        arr = pa.FixedSizeListArray.from_arrays(arr, int(d))
    return arr


def _column(name: str, f: Field, got: Any) -> Any:
    """One field of a batch (``get_batch``'s value) as an Arrow array of the batch's records."""
    pa = pyarrow_module()
    values, lengths = got if f.ragged else (got, None)
    got_values = np.ascontiguousarray(to_arrow.numbers(values, f.dtype))
    flat = pa.array(got_values.reshape(-1))
    rows = _fixed(flat, f.inner_shape, len(got_values))  # a fixed field's records, or a ragged field's rows
    if lengths is None:
        return rows
    offs = to_arrow.offsets(np.asarray(lengths, np.int64), what=f"field {name!r}", hint=_HINT)
    return to_arrow.list_array(offs, rows)


def _steps(st: Store, names: list[str], chunk: int) -> Iterator[tuple[int, int]]:
    """The records ``[a, b)`` of each step: at most ``chunk``, and of each ragged field at most the rows a
    list column's 32-bit offsets hold (``INT32_MAX``; a record with more alone, and refused); one empty
    step for an empty store. O(chunk) per step (the lengths of its records)."""
    n = len(st)
    ragged = [name for name in names if st.schema[name].ragged]
    a = 0
    while True:
        b = min(a + chunk, n)
        for name in ragged if b > a else ():
            rows = np.cumsum(st.lengths(name)[a:b])
            b = a + max(1, int(np.searchsorted(rows, to_arrow.INT32_MAX, side="right")))
        yield a, b
        a = b
        if a >= n:
            return


def _batches(st: Store, names: list[str], id_column: str | None, chunk: int) -> Iterator[tuple[int, Any]]:
    """(records, Arrow record batch) per step of :func:`_steps` (one empty batch for an empty store:
    ``datasets`` reads no table from a stream without a batch)."""
    pa = pyarrow_module()
    steps, ahead = itertools.tee(_steps(st, names, chunk))  # the reads run ahead of the batches built
    batches = st.iter_batches((np.arange(a, b, dtype=np.int64) for a, b in ahead), fields=names)
    for (a, b), got in zip(steps, batches):
        arrays = [_column(name, st.schema[name], got[name]) for name in names]
        cols = list(names)
        if id_column is not None:
            arrays.insert(0, to_arrow.id_array(st, np.arange(a, b, dtype=np.int64), hint=_HINT))
            cols.insert(0, id_column)
        yield b - a, pa.RecordBatch.from_arrays(arrays, names=cols)


@parents_undone
def export_hf(
    store: str | os.PathLike[str] | Store,
    out: str | os.PathLike[str],
    *,
    fields: Sequence[str] | None = None,
    id_column: str | None = "id",
    chunk_records: int = CHUNK_RECORDS,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write ``store`` as a ``datasets`` ``save_to_disk`` directory ``out`` (the columns are in the module
    docs); returns ``out``. ``fields``: the fields to write (default all, in schema order). ``id_column``:
    the name of the ids' column (written when the store has ids; None: never). ``progress`` gets records.
    Open the result with ``datasets.load_from_disk(out)``."""
    hf = datasets_module()
    root = local_output(out, "export_hf")
    check_apart(store, [root], "export_hf")
    st = store if isinstance(store, Store) else open_store(store)
    names = list(st.schema) if fields is None else field_list(fields) or []
    unknown = [n for n in names if n not in st.schema]
    if unknown:
        raise KeyError(f"{st.url}: no field {unknown[0]!r} (fields: {', '.join(st.schema)})")
    check_named_once(st.url, names)
    for name in names:
        if (dt := np.dtype(st.schema[name].storage_dtype)).kind == "c":
            raise SchemaError(f"{st.url}: field {name!r} is {dt.name}, and Arrow (so datasets) has no complex "
                              "numbers; leave it out with fields=")
    if id_column is not None and not isinstance(id_column, str):
        raise ValueError(f"id_column must be a str or None, got {id_column!r}")
    if id_column is not None and not st.has_ids:
        id_column = None
    if id_column is None and not names:
        raise SchemaError(f"{st.url}: nothing to export (no fields and no id column)")
    if id_column is not None and id_column in names:
        raise SchemaError(f"id_column {id_column!r} is also a field's name; pass another id_column (or None)")
    chunk_records = check_size("export_hf", "chunk_records", chunk_records)
    check_output(root, overwrite,
                 lambda r: not (r / "state.json").exists() and not (r.is_dir() and not any(r.iterdir())),
                 "what is not a datasets save_to_disk directory (no state.json)")
    stream = temp_sibling(root, "arrow")
    announce_total(progress, len(st))
    pa = pyarrow_module()
    try:
        writer = None
        try:
            for n, batch in _batches(st, names, id_column, chunk_records):
                if writer is None:
                    writer = pa.ipc.new_stream(str(stream), batch.schema)
                writer.write_batch(batch)
                if progress is not None and n:
                    progress(n)
        finally:
            if writer is not None:
                writer.close()
        quiet = hf.utils.are_progress_bars_disabled()
        hf.utils.disable_progress_bars()  # the caller's progress counted the records already
        try:
            ds = hf.Dataset.from_file(str(stream))
            with replaced(root) as tmp:
                # one shard at least: datasets lays out an empty dataset as no shard, which it cannot load
                ds.save_to_disk(str(tmp), num_shards=None if len(ds) else 1)
        finally:
            if not quiet:
                hf.utils.enable_progress_bars()
    finally:
        remove_path(stream)
    return root
