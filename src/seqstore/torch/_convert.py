"""NumPy -> torch conversion and topology lookup (rank, world size, DataLoader worker).

Arrays from a store are read-only memory-mapped views; ``torch.from_numpy`` on them warns and would
share the mapping. :func:`to_tensor` copies such arrays once (arrays gathered by ``get_batch`` are
fresh and writable: no copy). bfloat16 fields (stored as uint16 bits, or ``ml_dtypes.bfloat16``) become
``torch.bfloat16`` tensors without a copy. torch < 2.3 makes no tensors of uint16, uint32 or uint64 arrays
(``torch.from_numpy`` refuses them): there such arrays become int32, int64 and int64 tensors (one copy).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

from ..data._lengths import check_int

__all__ = ["to_tensor", "resolve_topology", "worker_topology", "torch_dtype_for"]


def _takes_unsigned() -> bool:
    """Whether this torch makes tensors of uint16/uint32/uint64 arrays (2.3 on)."""
    try:
        torch.from_numpy(np.zeros(1, np.uint16))
    except TypeError:
        return False
    return True


#: whether ``torch.from_numpy`` takes uint16, uint32 and uint64 arrays in this process
UNSIGNED = _takes_unsigned()
_WIDER: dict[np.dtype[Any], np.dtype[Any]] = {
    np.dtype(np.uint16): np.dtype(np.int32), np.dtype(np.uint32): np.dtype(np.int64),
    np.dtype(np.uint64): np.dtype(np.int64)}


def torch_dtype_for(dtype: np.dtype[Any], unsigned: bool) -> np.dtype[Any] | None:
    """The dtype an array of ``dtype`` is converted to before ``torch.from_numpy`` (None: taken as it is).
    ``unsigned``: whether torch has uint16/uint32/uint64 tensors; without them uint16 becomes int32 and
    uint32 int64 (every value kept), uint64 int64 (values up to 2**63 - 1)."""
    return None if unsigned else _WIDER.get(np.dtype(dtype).newbyteorder("="))


def to_tensor(value: Any, bfloat16: bool = False, *, name: str | None = None) -> torch.Tensor:
    """``value`` (array, view, NumPy scalar) as a tensor; copies only read-only or unaligned arrays, and
    views with a negative stride (``x[::-1]``, ``np.flip``: torch has no such tensors).

    ``bfloat16``: reinterpret uint16 bits as ``torch.bfloat16``. ``name``: the field's, for errors (a dtype
    torch has no tensors of, such as float128, is a TypeError naming it). O(size) for a copy, O(1) otherwise.
    """
    if isinstance(value, torch.Tensor):
        return value
    arr = np.asarray(value)
    if arr.dtype.type.__name__ == "bfloat16":  # ml_dtypes (``dtype.name`` builds a string each time)
        arr = arr.view(np.uint16)
        bfloat16 = True
    bits = bfloat16 and arr.dtype.kind == "u" and arr.dtype.itemsize == 2  # (bfloat16's, as int16 below)
    wider = None if bits else torch_dtype_for(arr.dtype, UNSIGNED)
    if wider is not None:  # (the one copy, also of a read-only or big-endian array)
        if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise ValueError(f"{_field(name)}a uint64 value {int(arr.max())} is above 2**63 - 1: torch"
                             f" {torch.__version__} has no uint64 tensors (torch >= 2.3 has), and int64 cannot hold it")
        return torch.from_numpy(arr.astype(wider))
    reversed_ = min(arr.strides, default=0) < 0
    if not arr.flags.writeable or not arr.flags.aligned or arr.dtype.byteorder == ">" or reversed_:
        arr = np.array(arr, dtype=arr.dtype.newbyteorder("=") if arr.dtype.byteorder == ">" else arr.dtype)
    if bfloat16 and arr.dtype == np.uint16:  # via int16: torch < 2.3 has no uint16 tensors
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    try:
        return torch.from_numpy(arr)
    except TypeError:  # (torch's own names every dtype it takes, but not the field)
        raise TypeError(f"{_field(name)}torch has no tensors of {arr.dtype} values (it takes bool, integers, float16/"
                        "32/64 and complex64/128): store the field as one of those") from None


def _field(name: str | None) -> str:
    return "" if name is None else f"field {name!r}: "


def resolve_topology(rank: int | None, world_size: int | None, owner: str) -> tuple[int, int]:
    """(rank, world size): the given values, else torch.distributed's when initialised, else (0, 1); a
    ValueError where a launcher started this process as one of several (``WORLD_SIZE`` > 1) and
    torch.distributed is not initialised yet (each process would take the whole epoch as rank 0 of 1)."""
    initialised = dist.is_available() and dist.is_initialized()
    launched = os.environ.get("WORLD_SIZE", "").strip()
    if not initialised and (rank is None or world_size is None) and launched.isdigit() and int(launched) > 1:
        raise ValueError(f"{owner}: this process is one of WORLD_SIZE={launched} (set by torchrun or another "
                         "launcher), but torch.distributed is not initialised: build it after "
                         "torch.distributed.init_process_group(), or pass rank= and world_size=")
    if world_size is None:
        world_size = dist.get_world_size() if initialised else 1
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    world_size = check_int(world_size, f"{owner}: world_size", 1)
    if not 0 <= check_int(rank, f"{owner}: rank") < world_size:
        raise ValueError(f"{owner}: rank must be in [0, {world_size}), got {rank}")
    return int(rank), world_size


def worker_topology() -> tuple[int, int]:
    """(worker id, number of workers) of the current DataLoader worker, (0, 1) in the main process."""
    info = get_worker_info()
    if info is None:
        return 0, 1
    return int(info.id), int(info.num_workers)
