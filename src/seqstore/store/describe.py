"""Text descriptions of a store's layout for ``seqstore info``: packed groups and their column ranges."""

from __future__ import annotations

from ..schema import Schema

__all__ = ["describe_groups"]


def describe_groups(schema: Schema) -> list[str]:
    """Lines describing each packed group: file, dtype, width, and each field's column range ``[a, b)``.

    Empty when the schema packs nothing. O(fields).
    """
    lines: list[str] = []
    groups = schema.groups
    if not groups:
        return lines
    lines.append("packed groups")
    for g in groups.values():
        lines.append(f"  {g.name}.npy  {g.dtype:<9} (n, {g.width})  {len(g.fields)} field(s)")
        width = max(len(n) for n in g.fields)
        for name in g.fields:
            a, b = g.columns[name]
            shape = schema[name].shape
            lines.append(f"    {name:<{width}}  columns [{a}, {b})  shape {tuple(shape)}")
    return lines
