"""Child processes of the logging tests (not a test module): run as ``python log_children.py MODE ...``."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def batch(start: int, n: int, dim: int = 16) -> tuple[list[str], dict[str, Any]]:
    """Deterministic batch: ids ``r<i>``, values derived from i (checkable after a crash)."""
    idx = np.arange(start, start + n)
    a = (idx[:, None, None] * 1000 + np.arange(dim * 4).reshape(1, 4, dim)).astype(np.float32)
    b = (idx[:, None] * 0.5 + np.arange(3)).astype(np.float32)
    return [f"r{i}" for i in idx], {"layer1": {"grad": a}, "layer2": {"grad": b}}


def crash_writer(path: str) -> None:
    """Log forever, printing the committed count after every call, until killed."""
    from seqstore.log import Logger

    lg = Logger(path, flush_bytes=64 << 10, commit_every_s=0.05)
    pos = 0
    while True:
        ids, t = batch(pos, 32)
        lg.log(ids, t)
        pos += 32
        print(lg.num_committed, pos, flush=True)


def rank_writer(path: str, rank: int, world: int, init: str) -> None:
    """A torch.distributed rank: log its own ids, plus one id rank 0 committed before (keep_first)."""
    import torch
    import torch.distributed as dist

    from seqstore.log import Logger

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    lg = Logger(path, flush_bytes=32 << 10, commit_every_s=0.5)  # rank from torch.distributed
    assert lg.rank == rank
    ids, t = batch(rank * 1000, 200)
    for a in range(0, 200, 20):
        lg.log(ids[a : a + 20], {k: {"grad": torch.from_numpy(v["grad"][a : a + 20])} for k, v in t.items()})
    lg.flush()
    dist.barrier()
    ids, t = batch(0, 1)  # id "r0": rank 0 committed it before the barrier
    lg.log(ids, t)
    lg.close()
    dist.barrier()
    dist.destroy_process_group()
    print(lg.num_logged, lg.num_skipped, flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "crash":
        crash_writer(sys.argv[2])
    elif mode == "rank":
        rank_writer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        raise SystemExit(f"unknown mode {mode}")
