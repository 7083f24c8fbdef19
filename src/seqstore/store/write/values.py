"""Values of appended records in storage form: one record's value, a batch's ragged column.

A ragged ``uint8`` field of one dimension (``Field("uint8", (None,))``, as text is imported) also takes
``str`` (stored as UTF-8) and bytes-like values (``bytes``, ``bytearray``, ``memoryview``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import SchemaError
from ...schema import Field, to_storage_array

__all__ = ["storage_value", "ragged_column", "shape_text"]

_TEXT = (str, bytes, bytearray, memoryview)


def storage_value(f: Field, value: Any, what: str) -> np.ndarray[Any, Any]:
    """:func:`~seqstore.schema.to_storage_array`, and text or bytes for a ragged 1-D uint8 field."""
    if isinstance(value, _TEXT) and f.ragged and len(f.shape) == 1 and f.storage_dtype == np.uint8:
        raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return np.frombuffer(raw, dtype=np.uint8)
    return to_storage_array(f, value, what=what)


def ragged_column(
    f: Field, value: Any, what: str, item: Callable[[int], str]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A batch's ragged column (a list of per-record values, or a ``(values, lengths)`` pair) as
    (all rows concatenated, rows per record)."""
    if isinstance(value, tuple) and len(value) == 2:
        values = to_storage_array(f, value[0], what=what)
        lengths = np.asarray(value[1])
        if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or (lengths.size and lengths.min() < 0):
            raise SchemaError(f"{what}: lengths must be a 1-D array of non-negative ints")
        if values.ndim != len(f.shape) or values.shape[1:] != f.inner_shape:
            raise SchemaError(f"{what}: values must have shape (total_rows, {f.inner_shape}), got {values.shape}")
        if lengths.size and int(lengths.max()) > values.shape[0]:  # (else the int64 sum below could wrap)
            raise SchemaError(f"{what}: a length of {int(lengths.max())} is more rows than the values' "
                              f"{values.shape[0]}")
        lengths = lengths.astype(np.int64)
        if int(lengths.sum()) != values.shape[0]:
            raise SchemaError(f"{what}: lengths sum to {int(lengths.sum())} but values have {values.shape[0]} rows")
        return values, lengths
    if isinstance(value, (np.ndarray, *_TEXT)) or not isinstance(value, Sequence):
        raise SchemaError(f"{what}: a ragged column is a list of arrays or a (values, lengths) pair")
    dtype, nd, inner = f.storage_dtype, len(f.shape), f.inner_shape
    arrays = value  # the common case: arrays already in storage form; one concatenation, no per-item conversion
    if not value or not all(
        type(x) is np.ndarray and x.dtype == dtype and x.ndim == nd and x.shape[1:] == inner for x in value
    ):
        arrays = []
        for k, x in enumerate(value):
            arr = storage_value(f, x, f"{what}, batch item {k} = {item(k)}")
            if arr.ndim != nd or arr.shape[1:] != inner:
                raise SchemaError(
                    f"{what}, batch item {k} = {item(k)}: expected rows of shape {inner}, got {arr.shape}")
            arrays.append(arr)
    lengths = np.fromiter((a.shape[0] for a in arrays), dtype=np.int64, count=len(arrays))
    if not arrays:
        return np.empty((0, *inner), dtype=dtype), lengths
    return (np.concatenate(arrays) if len(arrays) > 1 else arrays[0]), lengths


def shape_text(lead: str, inner: tuple[int, ...]) -> str:
    """A shape for messages, its first axis named ``lead``: ``(n,)``, ``(B, 2)``."""
    return "(" + ", ".join([lead, *map(str, inner)]) + ("" if inner else ",") + ")"
