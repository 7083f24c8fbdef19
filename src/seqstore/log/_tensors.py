"""Per-example tensors from a training loop to host numpy arrays: torch (any device) or numpy.

CUDA tensors are copied device -> host through one reusable *pinned* staging buffer: every tensor of a
``log()`` call is enqueued with ``copy_(non_blocking=True)`` into its own aligned slice, then the
streams are synchronised once, and the host views are consumed (copied into the logging buffer)
before the next call reuses the staging memory. Other devices fall back to ``tensor.cpu()``.

bfloat16 tensors come back as their uint16 bits, marked so that :func:`seqstore.schema.to_storage_array`
treats them as bfloat16 (not as integers).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SchemaError
from ..schema import BFLOAT16, BF16Bits, Field, Schema, torch_to_numpy

__all__ = ["is_torch", "HostStager", "as_array", "infer_field", "ids_to_str", "default_rank", "default_packing"]

_ALIGN = 256


def is_torch(value: Any) -> bool:
    """True for a torch tensor (checked without importing torch)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


class HostStager:
    """Converts a dict of tensors to host numpy arrays, staging CUDA tensors through pinned memory.

    The arrays returned by :meth:`to_host` may alias the staging buffer: consume them before the
    next call. Memory: one pinned buffer as large as the largest call's device tensors (grown by
    doubling, never shrunk).
    """

    def __init__(self) -> None:
        self._staging: Any = None  # torch.uint8 pinned tensor

    def _ensure(self, nbytes: int) -> Any:
        import torch

        if self._staging is None or self._staging.numel() < nbytes:
            size = max(nbytes, 2 * (0 if self._staging is None else self._staging.numel()), 1 << 20)
            self._staging = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        return self._staging

    def to_host(self, values: Mapping[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
        """``{name: host array}`` for ``{name: torch tensor | numpy array | array-like}``."""
        out: dict[str, np.ndarray[Any, Any]] = {}
        cuda: list[tuple[str, Any]] = []
        for name, v in values.items():
            if is_torch(v) and v.dtype.is_floating_point and v.element_size() == 1:
                v = v.float()  # float8, which numpy lacks: float32 holds each value exactly
            if is_torch(v) and v.device.type == "cuda":
                cuda.append((name, v.detach()))
            elif is_torch(v):  # cpu, or mps, xla, ...: no pinned path
                out[name] = torch_to_numpy(v)
            else:
                out[name] = v if isinstance(v, np.ndarray) else np.asarray(v)
        if cuda:
            out.update(self._stage_cuda(cuda))
        return out

    def _stage_cuda(self, tensors: list[tuple[str, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        import torch

        sizes = [t.numel() * t.element_size() for _, t in tensors]
        starts = []
        total = 0
        for nb in sizes:
            starts.append(total)
            total += -(-nb // _ALIGN) * _ALIGN
        staging = self._ensure(total)
        devices = set()
        views = []
        for (name, t), start, nb in zip(tensors, starts, sizes):
            dtype = torch.int16 if t.dtype == torch.bfloat16 else t.dtype
            src = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
            dst = staging[start : start + nb].view(dtype).view(t.shape)
            dst.copy_(src, non_blocking=True)  # device -> pinned host, asynchronous on t's current stream
            devices.add(t.device)
            views.append((name, dst, t.dtype == torch.bfloat16))
        for dev in devices:  # one wait per device for all copies of this call
            torch.cuda.current_stream(dev).synchronize()
        out: dict[str, np.ndarray[Any, Any]] = {}
        for name, dst, bf16 in views:
            arr = dst.numpy()
            out[name] = BF16Bits(arr.view(np.uint16)) if bf16 else arr
        return out


def infer_field(name: str, value: Any, batch: int, first_id: str) -> Field:
    """The per-example Field of a batch-first tensor/array: dtype and ``shape[1:]``."""
    if is_torch(value):
        dtype: Any = str(value.dtype).removeprefix("torch.")  # (Field reads "bfloat16" as BFLOAT16)
        shape = tuple(int(s) for s in value.shape)
    else:
        arr = as_array(name, value, first_id)
        dtype, shape = arr.dtype, arr.shape
    if len(shape) == 0 or shape[0] != batch:
        raise SchemaError(
            f"log(): field {name!r} (batch starting at id {first_id!r}): expected a batch-first tensor with "
            f"{batch} rows, got shape {shape}"
        )
    try:
        return Field(dtype, shape[1:])
    except SchemaError as exc:
        raise SchemaError(f"log(): field {name!r} (id {first_id!r}): {exc}") from None


def as_array(name: str, value: Any, first_id: str) -> np.ndarray[Any, Any]:
    """``np.asarray(value)``; a value numpy cannot make an array of (rows of different lengths) is a
    :class:`SchemaError` naming the field and the batch."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise SchemaError(f"log(): field {name!r} (batch starting at id {first_id!r}): not an array ({exc})") from None


def ids_to_str(ids: Any) -> list[str]:
    """Ids as a list of str: a sequence of str/int, a 1-D numpy int array or a torch tensor."""
    if isinstance(ids, str):
        raise SchemaError(f"log(): ids must be a sequence (one per example), got the str {ids!r}")
    if is_torch(ids):
        ids = ids.detach().cpu().numpy()
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise SchemaError(f"log(): ids must be 1-D, got shape {ids.shape}")
        if ids.dtype.kind in "iuU":
            return [str(x) for x in ids.tolist()]
        ids = ids.tolist()  # bytes, floats, bools, objects: each checked below
    if not hasattr(ids, "__iter__"):
        raise SchemaError(f"log(): ids must be a sequence (one per example), got {type(ids).__name__} {ids!r}")
    out = []
    for x in ids:
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            out.append(str(int(x)))
        else:
            raise SchemaError(f"log(): an id must be a str or an int, got {type(x).__name__} {x!r}")
    return out


def default_rank() -> int:
    """``torch.distributed.get_rank()`` when a process group is initialised, else 0.

    torch is not imported for this: a process that uses torch.distributed has imported it already.
    """
    if "torch" not in sys.modules:
        return 0
    import torch.distributed as dist

    return int(dist.get_rank()) if dist.is_available() and dist.is_initialized() else 0


def default_packing(schema: Schema) -> dict[str, list[str]]:
    """Pack every fixed field, one group per dtype: ``"packed"`` when there is one dtype, else
    ``"packed-<dtype>"`` (``packed-float32``, ``packed-bfloat16``, ...), fields in schema order."""
    by_dtype: dict[str, list[str]] = {}
    for name, f in schema.items():
        if not f.ragged:
            by_dtype.setdefault(f.dtype, []).append(name)
    out: dict[str, list[str]] = {}
    for dtype, names in by_dtype.items():
        gname = "packed" if len(by_dtype) == 1 else f"packed-{dtype if dtype == BFLOAT16 else np.dtype(dtype).name}"
        while gname in schema:
            gname += "_"
        out[gname] = names
    return out


def check_fields(schema: Schema, flat: Mapping[str, Any], ids: list[str]) -> None:
    """The checks of a ``log()`` batch against the log's schema: the fields given, and each one's batch
    size and per-example shape (a :class:`~seqstore.SchemaError` naming the field and the first id)."""
    batch = len(ids)
    given, names = set(flat), set(schema)
    if given != names:
        missing, unknown = sorted(names - given), sorted(given - names)
        msg = [f"{what} field(s) {v}" for what, v in (("missing", missing), ("unknown", unknown)) if v]
        who = (f"id {ids[0]!r}" if ids else "an empty batch") + (
            f" (and the {batch - 1} other ids of the batch)" if batch > 1 else "")
        raise SchemaError(f"log(): {who}: {'; '.join(msg)}; the log's fields are {sorted(names)}")
    for name, f in schema.items():
        v = flat[name] if hasattr(flat[name], "shape") else as_array(name, flat[name], ids[0] if ids else "<none>")
        shape = tuple(int(s) for s in v.shape)
        if len(shape) == 0 or shape[0] != batch:
            raise SchemaError(
                f"log(): field {name!r}: got {shape[0] if shape else 'a scalar'} rows for {batch} ids "
                f"(first id {ids[0] if ids else None!r}); tensors are batch-first"
            )
        if shape[1:] != f.inner_shape:
            raise SchemaError(
                f"log(): field {name!r} of id {ids[0] if ids else None!r}: expected per-example shape "
                f"{f.inner_shape}, got {shape[1:]} (batch shape {shape})"
            )
