"""Store records as Arrow arrays: the direction opposite to the imports of :mod:`seqstore.interop.arrow`,
shared by the readers of the engines (``seqstore.ray.read`` and the Spark data source; their own types
stay in the engines). Nothing is done per record: each array is built from a field's flat numpy values
and offsets computed from lengths: a field with a shape has one list level per axis
(:func:`field_lists`), bfloat16 is widened to float32 or kept as its bits (:func:`numbers`), ids are a
string column over :meth:`seqstore.Store.ids` (:func:`id_array`).

32-bit offsets (``list``, ``string``) allow at most 2^31 - 1 values (or bytes) in one array; more is a
ValueError that names the array and how many there were, so that the caller can cut smaller batches.
64-bit offsets (``large=True``: ``large_list``, ``large_string``) have no such limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SchemaError
from ..schema import BFLOAT16, Field, bfloat16_to_float32
from .arrow_columns import pyarrow as pyarrow_module

if TYPE_CHECKING:
    from ..store import Store

__all__ = [
    "INT32_MAX", "numbers", "offsets", "list_array", "fixed_lists", "field_lists", "leaf_type", "string_array",
    "id_array", "pyarrow_module",
]

#: The most values (or bytes) an array with 32-bit offsets can hold.
INT32_MAX = (1 << 31) - 1


def numbers(values: np.ndarray[Any, Any], dtype: str, *, bfloat16: str = "float32") -> np.ndarray[Any, Any]:
    """Stored values of a field of ``dtype`` as an Arrow column holds them: bfloat16 bits widened to
    float32 (``bfloat16="float32"``, a new array) or left as uint16 bits (``"bits"``); other dtypes as
    they are."""
    if dtype != BFLOAT16 or bfloat16 == "bits":
        return values
    if bfloat16 != "float32":
        raise ValueError(f"bfloat16 must be 'bits' or 'float32', got {bfloat16!r}")
    return bfloat16_to_float32(values)


def _sized(offs: np.ndarray[Any, Any], large: bool, what: str, hint: str, unit: str = "values") -> np.ndarray[Any, Any]:
    """int64 offsets as the offsets of an array: int64 when ``large``, else int32 after checking the last."""
    if large:
        return offs
    if len(offs) and int(offs[-1]) > INT32_MAX:
        raise ValueError(f"{what}: {int(offs[-1])} {unit} in one Arrow array (more than 2^31 - 1){hint}")
    return offs.astype(np.int32)


def offsets(lengths: np.ndarray[Any, Any], *, large: bool = False, what: str = "Arrow list",
            hint: str = "") -> np.ndarray[Any, Any]:
    """The ``len(lengths) + 1`` offsets of lists of ``lengths`` items (from 0): int64 when ``large``,
    else int32 (ValueError naming ``what``, with ``hint`` appended, past 2^31 - 1 items)."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return _sized(out, large, what, hint)


def list_array(offs: np.ndarray[Any, Any], values: Any, type: Any = None) -> Any:  # noqa: A002
    """A list array (``large_list`` for int64 offsets, else ``list``) over the Arrow array ``values``:
    list ``j`` holds ``values[offs[j]:offs[j + 1]]``; ``type`` (optional) is the list type."""
    pa = pyarrow_module()
    cls = pa.LargeListArray if offs.dtype == np.int64 else pa.ListArray
    return cls.from_arrays(pa.array(offs), values, type=type)


def fixed_lists(flat: Any, shape: Sequence[int | None], n: int, type: Any = None, *,  # noqa: A002
                large: bool = False, what: str = "Arrow list", hint: str = "") -> Any:
    """``n`` records of fixed ``shape`` whose values, row-major, are the Arrow array ``flat``, as one list
    level per axis (``n`` lists of ``shape[0]`` lists of ...); ``flat`` itself for shape ``()``.
    ``type``: the outermost list type (the inner levels' types are its value types); default ``list``
    (``large_list`` with ``large``) of the inner arrays' types."""
    counts = [int(s or 0) for s in shape]
    sizes = np.cumprod([int(n), *counts[:-1]], dtype=np.int64)  # number of lists at each level, outermost first
    arr = flat
    for level in range(len(counts) - 1, -1, -1):
        offs = np.arange(int(sizes[level]) + 1, dtype=np.int64) * counts[level]
        arr = list_array(_sized(offs, large, what, hint), arr, None if type is None else leaf_type(type, level))
    return arr


def field_lists(flat: Any, field: Field, records: int | np.ndarray[Any, Any], type: Any = None, *,  # noqa: A002
                large: bool = False, what: str = "Arrow list", hint: str = "") -> Any:
    """The values of ``field`` as one Arrow column with a list level per axis of the field: ``flat`` (an
    Arrow array) holds the leaf values, row-major; ``records`` is the number of records of a fixed
    field, or the records' lengths of a ragged one (whose first level then holds those lengths, and
    whose inner axes are fixed). A scalar field is ``flat`` itself. ``type``: the column's list type
    (optional, as for :func:`fixed_lists`)."""
    if not field.ragged:
        return fixed_lists(flat, field.shape, int(np.asarray(records)), type, large=large, what=what, hint=hint)
    lengths = np.asarray(records, dtype=np.int64)
    inner = field.inner_shape
    rows = fixed_lists(flat, inner, int(lengths.sum()), type.value_type if type is not None else None,
                       large=large, what=what, hint=hint)
    return list_array(offsets(lengths, large=large, what=what, hint=hint), rows, type)


def leaf_type(type: Any, depth: int) -> Any:  # noqa: A002
    """The value type ``depth`` list levels inside the Arrow list type ``type``."""
    for _ in range(depth):
        type = type.value_type
    return type


def string_array(data: np.ndarray[Any, Any], offs: np.ndarray[Any, Any], *, large: bool = False,
                 what: str = "Arrow strings", hint: str = "") -> Any:
    """A string array (``large_string`` with ``large``) whose string ``j`` is the utf-8 bytes
    ``data[offs[j]:offs[j + 1]]`` (``offs``: int64 from 0), over the buffers as they are."""
    pa = pyarrow_module()
    sized = _sized(np.asarray(offs, dtype=np.int64), large, what, hint, unit="bytes")
    t = pa.large_string() if large else pa.string()
    return pa.Array.from_buffers(t, len(sized) - 1, [None, pa.py_buffer(sized),
                                                     pa.py_buffer(np.ascontiguousarray(data))])


def id_array(store: Store, indices: Sequence[int] | np.ndarray[Any, Any], *, large: bool = False,
             what: str | None = None, hint: str = "") -> Any:
    """The ids of records ``indices`` of ``store`` as an Arrow string array (``large_string`` with
    ``large``), from :meth:`~seqstore.Store.ids` (no Python string per record). KeyError when the
    records have no ids; SchemaError naming the record for an id that is not valid UTF-8 (one imported from
    bytes that are not: an Arrow string holding it would fail whoever reads it)."""
    data, offs = store.ids(indices)
    arr = string_array(data, offs, large=large, what=what or f"{store.url}, ids", hint=hint)
    try:
        arr.validate(full=True)
    except pyarrow_module().ArrowInvalid:
        blob = bytes(data)
        j = next(j for j in range(len(offs) - 1) if not _utf8(blob[int(offs[j]) : int(offs[j + 1])]))
        raise SchemaError(f"{store.url}: record {int(np.asarray(indices)[j])}: id "
                          f"{blob[int(offs[j]) : int(offs[j + 1])].decode('utf-8', 'surrogatepass')!r} is not "
                          "valid UTF-8, which an Arrow string must be") from None
    return arr


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
