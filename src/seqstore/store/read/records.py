"""Single records: ``store[i]`` as zero-copy views and ``nested`` dicts, and how stored bfloat16 bits
are presented (the store's ``bfloat16`` mode; batches and matrices present them the same way).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...schema import bfloat16_to_float32
from .readahead import ReadAhead

__all__ = ["Records"]


class Records(ReadAhead):
    """Record access by global index."""

    _bf16_fields: list[str]
    _nest_paths: list[tuple[str, tuple[str, ...]]] | None

    def _decode_bf16(self, rec: dict[str, Any]) -> dict[str, Any]:
        for name in self._bf16_fields:
            if name in rec:
                rec[name] = self.bfloat16_view(rec[name])
        return rec

    def bfloat16_view(self, bits: Any) -> Any:
        """Present stored bfloat16 bits per the store's ``bfloat16`` mode (bits/float32/ml_dtypes)."""
        if self._bf16 == "bits":
            return bits
        if self._bf16 == "float32":
            return bfloat16_to_float32(bits)
        import ml_dtypes  # type: ignore[import-not-found,unused-ignore]

        return bits.view(ml_dtypes.bfloat16)

    def __getitem__(self, i: int) -> dict[str, np.ndarray[Any, Any]]:
        """Record ``i`` as a dict of field name -> read-only zero-copy view. O(log shards)."""
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"store[i] takes an int; use get_batch() for many records, got {type(i).__name__}")
        k, row = self._locate(self._norm(int(i)))
        sh = self._shard(k)
        if self._lazy:
            self._need_groups([(sh, slice(None), np.array([row], np.int64))], list(self.schema))
        rec = sh.record(row)
        return self._decode_bf16(rec) if self._bf16_fields and self._bf16 != "bits" else rec

    def nested(self, i: int, *, copy: bool = False) -> dict[str, Any]:
        """Record ``i`` as a nested dict (``"a/b"`` -> ``{"a": {"b": ...}}``) of zero-copy views.

        ``copy=True``: owned, writable arrays instead (valid after the store is closed), made with one
        copy per packed group (the record's row) and one per other field.
        """
        if copy:
            if not isinstance(i, (int, np.integer)):
                raise TypeError(f"nested(i) takes an int, got {type(i).__name__}")
            k, row = self._locate(self._norm(int(i)))
            sh = self._shard(k)
            if self._lazy:
                self._need_groups([(sh, slice(None), np.array([row], np.int64))], list(self.schema))
            flat = sh.record_copy(row)
            if self._bf16_fields and self._bf16 != "bits":
                flat = self._decode_bf16(flat)
        else:
            flat = self[i]
        paths = self._nest_paths
        if paths is None:
            paths = self._nest_paths = [(name, tuple(name.split("/"))) for name in self.schema]
        out: dict[str, Any] = {}
        for name, parts in paths:
            if len(parts) == 1:
                out[name] = flat[name]
                continue
            node = out
            for p in parts[:-1]:
                child = node.get(p)
                if child is None:
                    child = node[p] = {}
                node = child
            node[parts[-1]] = flat[name]
        return out

