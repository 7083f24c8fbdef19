"""Feeding a GPU from a store: DataLoader (8 workers, pinned memory) vs a TensorDataset held in RAM.

Self-contained (needs numpy, numba, torch and ``PYTHONPATH=src``)::

    PYTHONPATH=src python bench/gpu_feed.py                 # CUDA, about 2-3 minutes
    PYTHONPATH=src python bench/gpu_feed.py --cpu --quick   # CPU smoke run, seconds

1. Generates a store of ``--records`` sequences of 80-dim float16 features with ragged lengths
   uniform in ``[--min-len, --max-len]`` (int16 label per sequence), under ``--dir``.
2. ``seqstore``, one loop per ``--modes`` entry (default ``dataloader``): ``dataloader``:
   ``IterableSeqDataset(StoreDataset(ordering="random"), batch=B)`` -- each batch gathered and
   zero-padded to its longest sequence in one vectorised read inside a worker -- through
   ``DataLoader(batch_size=None, num_workers=W, pin_memory=True)``; ``inline``: ``SeqDataLoader(SeqDataset,
   sampler=EpochSampler, batch_size=B, collate_fn=collate_padded, pin_memory=True)`` (batches built in
   the loop's thread); ``threads:T`` / ``procs:K``: the same with ``T`` helper threads / ``K`` worker
   processes.
3. ``ram``: the same records zero-padded to ``--max-len`` in one ``TensorDataset`` (features,
   lengths, labels) in RAM, through ``DataLoader(batch_size=B, shuffle=True, num_workers=W,
   pin_memory=True)``.

Both feed the same training step (masked 2-layer MLP + mean-pool + classifier, AdamW) on the device
with ``non_blocking`` copies. After ``--warmup`` batches each loop runs for ``--seconds`` (or
``--max-batches``). Reported per loop: batches/s, frames/s, host time blocked in ``next(loader)``
(``wait_frac``) and the GPU idle fraction ``1 - (sum of per-step GPU time from CUDA events) / wall``
(on CPU the step's wall time stands in for GPU time). Prints a table; writes JSON to ``--json``
(default ``$OUT/gpu_feed.json`` when ``$OUT`` is set).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as ``python bench/gpu_feed.py`` Python puts bench/ first on sys.path, where bench files (e.g.
# any bench script) would shadow the standard library: put src/ there instead.
sys.path[0] = str(Path(__file__).resolve().parent.parent / "src")

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import seqstore  # noqa: E402
from seqstore.data import StoreDataset  # noqa: E402
from seqstore.torch import (  # noqa: E402
    EpochSampler,
    IterableSeqDataset,
    SeqDataLoader,
    SeqDataset,
    collate_padded,
)

DIM = 80
CLASSES = 32


def generate(path: Path, n: int, min_len: int, max_len: int, seed: int = 0) -> np.ndarray[Any, Any]:
    """Write the store in chunks (O(chunk) memory); return the lengths."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, n)
    labels = rng.integers(0, CLASSES, n).astype(np.int16)
    if path.exists():
        shutil.rmtree(path)
    with seqstore.create(path, {"feat": seqstore.Field("float16", (None, DIM)), "label": seqstore.Field("int16")},
                         buffer_bytes=256 << 20) as w:
        step = 4096
        for a in range(0, n, step):
            lens = lengths[a : a + step]
            feat = rng.standard_normal((int(lens.sum()), DIM), dtype=np.float32).astype(np.float16)
            feat += np.repeat(labels[a : a + step] / CLASSES, lens)[:, None].astype(np.float16)
            w.append_batch({"feat": (feat, lens), "label": labels[a : a + step]})
    return lengths


def ram_tensors(path: Path, max_len: int) -> TensorDataset:
    """All records zero-padded to ``max_len`` in RAM: (N, max_len, 80) float16, lengths, labels."""
    store = seqstore.open(path)
    n = len(store)
    feats = torch.zeros((n, max_len, DIM), dtype=torch.float16)
    lens = torch.zeros(n, dtype=torch.int64)
    labels = torch.zeros(n, dtype=torch.int16)
    step = 4096
    for a in range(0, n, step):
        idx = np.arange(a, min(a + step, n))
        b = store.get_batch(idx, pad=True)
        v, ln = b["feat"]
        feats[a : a + len(idx), : v.shape[1]] = torch.from_numpy(v)
        lens[a : a + len(idx)] = torch.from_numpy(ln)
        labels[a : a + len(idx)] = torch.from_numpy(b["label"])
    return TensorDataset(feats, lens, labels)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.out = nn.Linear(256, CLASSES)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        mask = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
        h = self.net(x.float()) * mask[..., None]
        return self.out(h.sum(1) / lengths[:, None].clamp(min=1))  # type: ignore[no-any-return]


def run_loop(name: str, loader: Any, unpack: Any, device: torch.device, warmup: int, seconds: float,
             max_batches: int) -> dict[str, Any]:
    """Train on batches from ``loader``; return throughput, wait and idle fractions."""
    torch.manual_seed(0)
    model = Model().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cuda = device.type == "cuda"
    it = iter(loader)
    t_start = time.perf_counter()

    def step(batch: Any) -> tuple[Any, Any, int]:
        x, ln, y = unpack(batch)
        x = x.to(device, non_blocking=True)
        ln = ln.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True).long()
        ev0 = ev1 = None
        if cuda:
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
        loss = nn.functional.cross_entropy(model(x, ln), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            assert ev1 is not None
            ev1.record()
        return ev0, ev1, int(ln.sum())

    for _ in range(warmup):
        batch = next(it, None)
        if batch is None:
            raise RuntimeError(f"{name}: the epoch is shorter than the warm-up; use more --records")
        step(batch)
    if cuda:
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t_start
    events: list[tuple[Any, Any]] = []
    busy_cpu = 0.0
    wait = 0.0
    frames = 0
    n = 0
    t0 = time.perf_counter()
    while n < max_batches and time.perf_counter() - t0 < seconds:
        w0 = time.perf_counter()
        batch = next(it, None)
        w1 = time.perf_counter()
        if batch is None:
            break
        wait += w1 - w0
        ev0, ev1, nf = step(batch)
        if cuda:
            events.append((ev0, ev1))
        else:
            busy_cpu += time.perf_counter() - w1
        frames += nf
        n += 1
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    busy = sum(a.elapsed_time(b) for a, b in events) / 1000.0 if cuda else busy_cpu
    del it
    return {
        "loop": name,
        "batches": n,
        "wall_s": wall,
        "batches_per_s": n / wall if wall else 0.0,
        "frames_per_s": frames / wall if wall else 0.0,
        "wait_frac": wait / wall if wall else 0.0,
        "gpu_idle_frac": max(0.0, 1.0 - busy / wall) if wall else 0.0,
        "startup_s": first_s,
    }


def seq_loader(ds: StoreDataset, mode: str, args: argparse.Namespace, pin: bool) -> Any:
    """The seqstore loader of one mode: ``dataloader`` (``IterableSeqDataset`` through a plain
    ``DataLoader`` with ``--workers`` processes), ``inline`` (``SeqDataLoader`` over ``SeqDataset`` +
    ``EpochSampler``, padded batches built in the loop's thread), ``threads:T`` / ``procs:K`` (the same
    with ``T`` helper threads / ``K`` worker processes writing into shared slots)."""
    name, _, count = mode.partition(":")
    if name == "dataloader":
        it_ds = IterableSeqDataset(ds, batch=args.batch, rank=0, world_size=1)
        return DataLoader(it_ds, batch_size=None, num_workers=args.workers, pin_memory=pin,
                          prefetch_factor=4 if args.workers else None)
    sds = SeqDataset(ds)
    extra = {name: int(count or args.workers)} if name in ("threads", "procs") else {}
    if name not in ("inline", "threads", "procs"):
        raise SystemExit(f"--modes: unknown mode {mode!r} (dataloader, inline, threads:T, procs:K)")
    return SeqDataLoader(sds, sampler=EpochSampler(ds, rank=0, world_size=1), batch_size=args.batch,
                         collate_fn=collate_padded, pin_memory=pin, **extra)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="run on the CPU (no pinning)")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    p.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "seqstore-gpu-feed")
    p.add_argument("--records", type=int, default=60_000)
    p.add_argument("--min-len", type=int, default=50)
    p.add_argument("--max-len", type=int, default=400)
    p.add_argument("--batch", type=int, default=64, help="sequences per batch")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--seconds", type=float, default=30.0, help="measured time per loop")
    p.add_argument("--max-batches", type=int, default=1_000_000)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--modes", default="dataloader",
                   help="seqstore loaders to run, comma-separated: dataloader, inline, threads:T, procs:K")
    args = p.parse_args()
    if args.quick:
        args.records, args.min_len, args.max_len = 3000, 20, 100
        args.workers, args.warmup, args.seconds = min(args.workers, 2), 5, 3.0
    device = torch.device("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    pin = device.type == "cuda"
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    args.dir.mkdir(parents=True, exist_ok=True)
    store_path = args.dir / "feat.seqstore"

    t = time.perf_counter()
    lengths = generate(store_path, args.records, args.min_len, args.max_len)
    gen_s = time.perf_counter() - t
    gib = float(lengths.sum()) * DIM * 2 / 2**30
    print(f"store: {args.records} records, {int(lengths.sum())} frames, {gib:.2f} GiB float16, "
          f"written in {gen_s:.1f} s; device {device}", flush=True)

    ds = StoreDataset(store_path, ordering="random", seed=0)
    unpack = lambda b: (b["feat"], b["feat_lengths"], b["label"])  # noqa: E731
    results = []
    for mode in args.modes.split(","):
        try:
            results.append(run_loop(f"seqstore {mode}", seq_loader(ds, mode, args, pin), unpack, device,
                                    args.warmup, args.seconds, args.max_batches))
        except Exception as exc:  # one failing mode must not hide the others' figures
            print(f"seqstore {mode}: FAILED: {exc!r}", flush=True)
            results.append({"loop": f"seqstore {mode}", "error": repr(exc), "batches_per_s": 0.0, "frames_per_s": 0.0,
                            "wait_frac": 0.0, "gpu_idle_frac": 0.0, "batches": 0, "startup_s": 0.0})
        print(results[-1], flush=True)

    t = time.perf_counter()
    ram = ram_tensors(store_path, args.max_len)
    ram_s = time.perf_counter() - t
    ram_loader = DataLoader(ram, batch_size=args.batch, shuffle=True, num_workers=args.workers, pin_memory=pin,
                            prefetch_factor=4 if args.workers else None, drop_last=True)
    results.append(run_loop("ram", ram_loader, lambda b: (b[0], b[1], b[2]), device, args.warmup, args.seconds,
                            args.max_batches))
    print(results[-1], flush=True)

    head = ["loop", "batches/s", "frames/s", "wait frac", "GPU idle frac", "batches", "start s"]
    rows = [[r["loop"], f"{r['batches_per_s']:.1f}", f"{r['frames_per_s']:.3g}", f"{r['wait_frac']:.3f}",
             f"{r['gpu_idle_frac']:.3f}", str(r["batches"]), f"{r['startup_s']:.1f}"] for r in results]
    print("| " + " | ".join(head) + " |\n|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    info = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "store_gib": gib,
        "generate_s": gen_s,
        "ram_build_s": ram_s,
        "ram_gib": ram.tensors[0].numel() * 2 / 2**30,
        "results": results,
    }
    out = args.json or (Path(os.environ["OUT"]) / "gpu_feed.json" if os.environ.get("OUT") else None)
    if out is not None:
        out.write_text(json.dumps(info, indent=1))
        print(f"wrote {out}")
    shutil.rmtree(store_path, ignore_errors=True)


if __name__ == "__main__":
    main()
