"""Text descriptions of a store for people (``seqstore info``, ``copy``'s progress): sizes, packed groups
and their column ranges."""

from __future__ import annotations

import numpy as np

from ..schema import Schema

__all__ = ["describe_groups", "dtype_name", "human_bytes"]


def human_bytes(n: float) -> str:
    """``n`` bytes in binary units: ``512 B``, ``1.5 KiB``, ... ``3.0 TiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 if unit == "B" else round(abs(n), 1) < 1024:  # (1023.96 KiB is 1.0 MiB, not 1024.0 KiB)
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def dtype_name(dtype: str) -> str:
    """A field's dtype as the docs write it (``float16``, ``int32``, ``bfloat16``), not numpy's code."""
    try:
        return np.dtype(dtype).name
    except TypeError:  # bfloat16: not a numpy dtype
        return dtype


def describe_groups(schema: Schema) -> list[str]:
    """Lines describing each packed group: file, dtype, width, and each field's column range ``[a, b)``.

    Empty when the schema packs nothing. O(fields).
    """
    if not schema.groups:
        return []
    lines = ["packed groups"]
    for g in schema.groups.values():
        lines.append(f"  {g.name}.npy  {dtype_name(g.dtype):<9} (n, {g.width})  {len(g.fields)} field(s)")
        width = max(len(n) for n in g.fields)
        for name in g.fields:
            a, b = g.columns[name]
            shape = schema[name].shape
            lines.append(f"    {name:<{width}}  columns [{a}, {b})  shape {tuple(shape)}")
    return lines
