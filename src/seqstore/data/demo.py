"""The combined-dataset demo (``seqstore demo``'s combined run): one corpus split into three datasets,
sampled per epoch with one ``laplace`` ordering over the union, batched by frames, read in batches.

Printing is this module's job (it is the CLI's demo); the datasets, orders and batching it drives
print nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._sysinfo import rss_bytes
from .batching import batch_indices
from .combined import CombinedDataset
from .concat import SliceDataset
from .store_dataset import StoreDataset

__all__ = ["run_combined_demo"]


def run_combined_demo(store_path: str | os.PathLike[str], *, epochs: int = 2, ordering: str = "laplace:.1000",
                      weights: tuple[float, float, float] = (0.5, 0.3, 0.2), epoch_fraction: float = 0.5,
                      max_frames: int = 20_000, max_seqs: int | None = None, partition_epoch: int = 1, seed: int = 0,
                      length_field: str | None = None, max_batches: int | None = None,
                      out: Callable[[str], None] = print) -> dict[str, Any]:
    """Split the store at ``store_path`` into three contiguous parts (``weights`` of its records), sample
    ``epoch_fraction`` of the corpus per epoch from them in proportion to ``weights`` (each part in its own
    random order, windows advancing per epoch), order the union with ``ordering``, cut it into batches of at
    most ``max_frames`` padded frames of ``length_field`` and read every batch with ``get_batch``. Prints
    per-epoch figures (order build time, batches/s, sequences/s, frames/s, private RSS growth) and returns them.
    """
    store_ds = StoreDataset(store_path, length_field=length_field)
    n = store_ds.num_seqs
    if n < 3:
        raise ValueError(f"{store_path}: the combined demo needs at least 3 records, got {n}")
    w = np.asarray(weights, dtype=np.float64)
    cuts = np.concatenate([[0], np.round(np.cumsum(w / w.sum()) * n).astype(np.int64)])
    cuts[-1] = n
    parts = {f"part{k}": SliceDataset(store_ds, int(cuts[k]), int(cuts[k + 1]), ordering="random", seed=seed + k)
             for k in range(len(w))}
    combined = CombinedDataset(parts, weights=list(w), epoch_size=int(n * epoch_fraction), ordering=ordering,
                               seed=seed, partition_epoch=partition_epoch)
    out(f"seqstore combined demo: {n:,} records of {store_path} split into "
        + ", ".join(f"{k} ({d.num_seqs:,})" for k, d in parts.items()))
    out(f"  per epoch: {combined.sampling_sizes} = {combined.epoch_size:,} sequences, ordering {ordering!r}, "
        f"batches of <= {max_frames:,} padded frames")
    lengths = combined.lengths()
    # one batch first: numba compiles the order, batching and gather kernels on their first use in a fresh
    # install (seconds); the epochs' figures are then those of the operations
    t0 = time.perf_counter()
    for idx in batch_indices(combined.epoch_order(epochs + 1), lengths, max_frames=max_frames, max_seqs=max_seqs):
        combined.get_batch(idx)
        break
    warmup_s = time.perf_counter() - t0
    out(f"  warm-up (one batch): {warmup_s * 1e3:.0f} ms (numba compile on first use; not in the epochs' figures)")
    rss0 = rss_bytes()[0]
    results: list[dict[str, Any]] = []
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        order = combined.epoch_order(epoch)
        build_s = time.perf_counter() - t0
        nb = seqs = frames = 0
        t1 = time.perf_counter()
        batches = batch_indices(order, lengths, max_frames=max_frames, max_seqs=max_seqs)
        for idx in batches:
            batch = combined.get_batch(idx)
            field = batch.get(store_ds.length_field) if store_ds.length_field is not None else None
            lens = field[1] if isinstance(field, tuple) else np.ones(len(idx), dtype=np.int64)
            nb += 1
            seqs += len(idx)
            frames += int(lens.sum())
            if max_batches is not None and nb >= max_batches:
                break
        secs = max(time.perf_counter() - t1, 1e-9)
        r = {"epoch": epoch, "order_build_s": build_s, "batches": nb, "sequences": seqs, "frames": frames,
             "seconds": secs, "batches_per_s": nb / secs, "seqs_per_s": seqs / secs, "frames_per_s": frames / secs,
             "overlong": batches.overlong, "rss_anon_growth": rss_bytes()[0] - rss0}
        results.append(r)
        out(f"  epoch {epoch}: order built in {build_s * 1e3:.2f} ms; {nb:,} batches, {seqs:,} sequences, "
            f"{frames:,} frames in {secs:.2f} s -> {r['batches_per_s']:,.0f} batches/s, "
            f"{r['seqs_per_s']:,.0f} seq/s, {r['frames_per_s'] / 1e6:,.1f} M frames/s; "
            f"private RSS growth {r['rss_anon_growth'] / 2**20:.1f} MiB")
    return {"sampling_sizes": combined.sampling_sizes, "warmup_s": warmup_s, "epochs": results}
