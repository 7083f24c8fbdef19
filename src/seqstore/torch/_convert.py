"""NumPy -> torch conversion and topology lookup (rank, world size, DataLoader worker).

Arrays from a store are read-only memory-mapped views; ``torch.from_numpy`` on them warns and would
share the mapping. :func:`to_tensor` copies such arrays once (arrays gathered by ``get_batch`` are
fresh and writable: no copy). bfloat16 fields (stored as uint16 bits, or ``ml_dtypes.bfloat16``) become
``torch.bfloat16`` tensors without a copy.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

from ..data._lengths import check_int

__all__ = ["to_tensor", "resolve_topology", "worker_topology"]


def to_tensor(value: Any, bfloat16: bool = False) -> torch.Tensor:
    """``value`` (array, view, NumPy scalar) as a tensor; copies only read-only or unaligned arrays.

    ``bfloat16``: reinterpret uint16 bits as ``torch.bfloat16``. O(size) for a copy, O(1) otherwise.
    """
    if isinstance(value, torch.Tensor):
        return value
    arr = np.asarray(value)
    if arr.dtype.type.__name__ == "bfloat16":  # ml_dtypes (``dtype.name`` builds a string each time)
        arr = arr.view(np.uint16)
        bfloat16 = True
    if not arr.flags.writeable or not arr.flags.aligned or arr.dtype.byteorder == ">":
        arr = np.array(arr, dtype=arr.dtype.newbyteorder("=") if arr.dtype.byteorder == ">" else arr.dtype)
    if bfloat16 and arr.dtype == np.uint16:  # via int16: torch < 2.3 has no uint16 tensors
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


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
