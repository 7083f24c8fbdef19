"""DDP training over a seqstore store with exact, elastic checkpoint/resume.

Run (CPU, gloo; on GPUs nccl is picked automatically)::

    python -m torch.distributed.run --nproc_per_node 2 examples/ddp_train.py \\
        --store /tmp/demo.seqstore --ckpt /tmp/demo.ckpt --epochs 2 --stop-after 5
    # resume on a different number of processes: continues with exactly the unseen sequences
    python -m torch.distributed.run --nproc_per_node 1 examples/ddp_train.py \\
        --store /tmp/demo.seqstore --ckpt /tmp/demo.ckpt --epochs 2

Rank 0 generates a small store (ragged 8-dim float32 features, an int16 label) when ``--store`` does
not exist. The model mean-pools the frames under the padding mask and classifies the label. The data
come either from an :class:`~seqstore.torch.IterableSeqDataset` with length-based batches, sharded over
ranks (``--mode iterable``, default; ``--workers`` worker processes per rank gather them), or from a map-style
:class:`~seqstore.torch.SeqDataset` with an :class:`~seqstore.torch.EpochSampler` (``--mode sampler``).
Both go through :class:`~seqstore.torch.SeqDataLoader`, whose ``state_dict()`` is the global position
of the epoch: O(1), independent of the world size. ``--log-indices DIR`` writes the record indices
each rank trained on (for tests).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import seqstore
from seqstore.data import StoreDataset
from seqstore.torch import EpochSampler, IterableSeqDataset, LengthBatching, SeqDataLoader, SeqDataset

DIM = 8
CLASSES = 5


def generate(path: Path, n: int, seed: int = 0) -> None:
    """A store of ``n`` records: ``x`` float32 (T, DIM) with T in 1..20, ``label`` int16 in [0, CLASSES)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 21, n)
    labels = rng.integers(0, CLASSES, n).astype(np.int16)
    frames = rng.standard_normal((int(lengths.sum()), DIM)).astype(np.float32)
    frames += np.repeat(labels, lengths)[:, None].astype(np.float32)  # learnable signal
    with seqstore.create(path, {"x": seqstore.Field("float32", (None, DIM)), "label": seqstore.Field("int16")},
                         overwrite=True) as w:
        w.append_batch({"x": (frames, lengths), "label": labels})


class PoolClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(DIM, 32)
        self.out = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.proj(x)) * mask[..., None]
        pooled = h.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return self.out(pooled)  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--ckpt", type=Path, required=True)
    p.add_argument("--records", type=int, default=2000, help="records to generate if --store is missing")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--mode", choices=("iterable", "sampler"), default="iterable")
    p.add_argument("--workers", type=int, default=2, help="worker processes per rank (num_workers)")
    p.add_argument("--max-frames", type=int, default=200, help="frame budget per batch (iterable mode)")
    p.add_argument("--batch-size", type=int, default=16, help="records per batch (sampler mode)")
    p.add_argument("--stop-after", type=int, default=0, help="checkpoint and exit after this many steps")
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--log-indices", type=Path, default=None)
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if rank == 0 and not args.store.exists():
        generate(args.store, args.records)
    dist.barrier()

    ds = StoreDataset(args.store, ordering="laplace:.64", seed=7)
    loader: SeqDataLoader
    if args.mode == "iterable":
        it = IterableSeqDataset(ds, batch=LengthBatching(max_frames=args.max_frames), masks=True, with_index=True)
        loader = SeqDataLoader(it, batch_size=None, num_workers=args.workers, pin_memory=cuda)
    else:
        sd = SeqDataset(ds, with_index=True)
        loader = SeqDataLoader(sd, sampler=EpochSampler(ds), batch_size=args.batch_size, num_workers=args.workers,
                               collate_fn=sd.collate(masks=True), pin_memory=cuda)

    torch.manual_seed(0)
    model = DistributedDataParallel(PoolClassifier().to(device), device_ids=[device.index] if cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    start_epoch = 1
    if args.ckpt.exists():
        ck: dict[str, Any] = torch.load(args.ckpt, map_location=device, weights_only=False)
        model.module.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        loader.load_state_dict(ck["data"])  # any world size: continues at the same global position
        start_epoch = ck["data"]["epoch"]
        if rank == 0:
            print(f"resumed at epoch {start_epoch}, position {ck['data']['position']} "
                  f"(saved by {ck['data']['world_size']} ranks, now {world})", flush=True)

    def save() -> None:
        state = loader.state_dict()  # the same on every rank: a global position
        if rank == 0:
            tmp = args.ckpt.with_name(args.ckpt.name + ".tmp")
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "data": state}, tmp)
            os.replace(tmp, args.ckpt)
        dist.barrier()

    seen: list[np.ndarray[Any, Any]] = []
    step = 0
    stopped = False
    for epoch in range(start_epoch, args.epochs + 1):
        loader.set_epoch(epoch)  # keeps a loaded position when it is that state's epoch
        total, count = 0.0, 0
        for batch in loader:
            x, mask = batch["x"].to(device, non_blocking=True), batch["x_mask"].to(device, non_blocking=True)
            y = batch["label"].to(device, non_blocking=True).long()
            loss = nn.functional.cross_entropy(model(x, mask), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach())
            count += 1
            step += 1
            seen.append(np.stack([np.full(len(batch["index"]), epoch), batch["index"].numpy()], 1))
            if args.stop_after and step >= args.stop_after:
                stopped = True
                break
            if step % args.ckpt_every == 0:
                save()
        if rank == 0:
            print(f"epoch {epoch}: {count} steps on rank 0, mean loss {total / max(count, 1):.3f}", flush=True)
        if stopped:
            break
    save()
    if args.log_indices is not None:
        args.log_indices.mkdir(parents=True, exist_ok=True)
        arr = np.concatenate(seen) if seen else np.empty((0, 2), np.int64)
        np.save(args.log_indices / f"run{os.getpid()}-world{world}-rank{rank}.npy", arr)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
