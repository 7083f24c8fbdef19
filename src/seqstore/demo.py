"""``seqstore demo``: generate a speech-like corpus, write it, reopen it and read it, printing figures.

The corpus: ``records`` sequences with log-normal lengths clipped to [10, 200] frames (mean about 50)
of ``dim`` float16 features, int32 label sequences about a tenth as long, and string ids. With the
defaults (1,000,000 x 16) that is about 1.6 GB.

The timed figures are those of the operations: each kernel is run once first, untimed for the figure
(numba compiles a kernel on its first use in a fresh install, seconds, then loads it from its cache);
that warm-up is printed on a line of its own.
"""

from __future__ import annotations

import gc
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ._sysinfo import rss_bytes
from .data.demo import run_combined_demo
from .errors import SeqstoreError
from .format.manifest import Manifest
from .interop._common import local_output
from .order import seq_order
from .schema import Field, Schema
from .store import create, open_store
from .store.verify import total_bytes

__all__ = ["run_demo", "generate_batch"]

BATCH = 10_000


def generate_batch(rng: np.random.Generator, first: int, count: int, dim: int) -> tuple[dict[str, Any], list[str]]:
    """One batch of the demo corpus as ``append_batch`` columns plus ids."""
    lengths = np.clip(np.round(rng.lognormal(np.log(44.0), 0.5, count)), 10, 200).astype(np.int64)
    feats = rng.standard_normal((int(lengths.sum()), dim), dtype=np.float32).astype(np.float16)
    label_lengths = np.maximum(lengths // 10, 1)
    labels = rng.integers(0, 1000, int(label_lengths.sum()), dtype=np.int32)
    ids = [f"utt-{i:010d}" for i in range(first, first + count)]
    columns = {"features": (feats, lengths), "labels": (labels, label_lengths), "speaker": rng.integers(0, 2000, count)}
    return columns, ids


def _reusable(root: Path, records: int, schema: Schema) -> bool:
    """Whether the corpus at ``root`` is one of ``records`` records of ``schema`` (``--keep`` reuses it)."""
    if not (root / "manifest.json").exists():
        return False
    m = Manifest.load(root)
    return m.num_records == records and m.schema == schema


def _line(label: str, value: str) -> None:
    print(f"  {label:<34} {value}")


def run_demo(out: str = "demo-out", records: int = 1_000_000, dim: int = 16, seed: int = 0, keep: bool = False) -> None:
    """Write (or reuse with ``keep``) the demo corpus under ``out`` (a local path, or a ``file://`` URL of
    one) and print what reading it costs."""
    if records < 3:  # (its combined dataset splits the corpus into three parts)
        raise SeqstoreError(f"demo: the corpus needs at least 3 records (--records), got {records}")
    if seed < 0:  # (numpy's generators take none)
        raise SeqstoreError(f"demo: --seed must be a non-negative integer, got {seed}")
    outdir = local_output(out, "demo")  # (a file:// URL as its path; a URL of object storage refused)
    root = outdir / "corpus.seqstore"
    schema = {"features": Field("float16", (None, dim)), "labels": Field("int32", (None,)), "speaker": Field("int32")}
    print(f"seqstore demo: {records:,} sequences of {dim} float16 features -> {root}")
    reuse = keep and _reusable(root, records, Schema(schema))
    if not reuse:
        if root.exists():
            shutil.rmtree(root)
        rng = np.random.default_rng(seed)
        t0 = time.perf_counter()
        gen_s = 0.0
        new_out = not outdir.exists()
        try:
            with create(root, schema) as w, tqdm(total=records, unit="seq", unit_scale=True, desc="write") as bar:
                for first in range(0, records, BATCH):
                    g = time.perf_counter()
                    cols, ids = generate_batch(rng, first, min(BATCH, records - first), dim)
                    gen_s += time.perf_counter() - g
                    w.append_batch(cols, ids=ids)
                    bar.update(len(ids))
        except BaseException:  # an interrupted (Ctrl-C) or failed write leaves no partial corpus behind
            shutil.rmtree(outdir if new_out else root, ignore_errors=True)
            raise
        write_s = time.perf_counter() - t0 - gen_s
        nbytes = total_bytes(Manifest.load(root))
        print("write")
        _line("bytes on disk", f"{nbytes / 1e9:.2f} GB")
        rate = f"{nbytes / write_s / 1e6:,.0f} MB/s, {records / write_s:,.0f} seq/s"
        _line("write throughput (excl. generation)", rate)
    else:
        print("write: reusing the existing corpus (--keep)")

    gc.collect()
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    store = open_store(root)
    first_record = store[0]
    open_s = time.perf_counter() - t0
    rss1 = rss_bytes()
    print("open")
    _line("open + first record", f"{open_s * 1e3:.2f} ms")
    _line("RSS growth after open", f"{(sum(rss1) - sum(rss0)) / 2**20:.2f} MiB")
    _line("first record", ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in first_record.items()))

    rng = np.random.default_rng(seed + 1)
    picks = rng.integers(0, len(store), 20_000)
    for i in picks[:10_000]:  # warm the pages we will touch
        store[int(i)]
    t0 = time.perf_counter()
    for i in picks[:10_000]:
        store[int(i)]
    get_us = (time.perf_counter() - t0) / 10_000 * 1e6
    # the first call of each batch path compiles its numba kernels (a fresh install): not the operation
    t0 = time.perf_counter()
    store.get_batch(picks[1000:1016], pad=True)
    store.get_batch(picks[1000:1016])
    warm_ms = (time.perf_counter() - t0) * 1e3
    ids = [store.id(int(i)) for i in picks[:2000]]
    for s in ids:  # warm the index pages these lookups touch
        store.index(s)
    t0 = time.perf_counter()
    for s in ids:
        store.index(s)
    index_us = (time.perf_counter() - t0) / len(ids) * 1e6
    t0 = time.perf_counter()
    batch = store.get_batch(picks[:1000], pad=True)
    batch_ms = (time.perf_counter() - t0) * 1e3
    print("random access (warm)")
    _line("first get_batch calls (warm-up)", f"{warm_ms:.0f} ms (numba compile on first use; not counted below)")
    _line("store[i]", f"{get_us:.1f} us")
    _line("store.index(id)", f"{index_us:.1f} us")
    _line("get_batch(1000 random, pad=True)", f"{batch_ms:.2f} ms -> features {batch['features'][0].shape}")

    _epoch(store)
    rss2 = rss_bytes()
    print("memory growth since open (after reading every record once)")
    _line("private (anonymous) RSS", f"{(rss2[0] - rss0[0]) / 2**20:.1f} MiB")
    _line("mapped store pages (shared page cache)", f"{(rss2[1] - rss0[1]) / 2**20:.1f} MiB")
    _sub_epochs(store, outdir, seed)
    print("combined dataset: the corpus as three parts sampled per epoch (weights 0.5/0.3/0.2), laplace:.1000")
    run_combined_demo(root, epochs=2, seed=seed, length_field="features")
    print(f"done; the corpus stays in {root} (seqstore info {root})")


def _epoch(store: Any) -> None:
    """Read every record once in storage order, in batches of 1024, and print the throughput."""
    n = len(store)
    t0 = time.perf_counter()
    nbytes = 0
    with tqdm(total=n, unit="seq", unit_scale=True, desc="epoch") as bar:
        for a in range(0, n, 1024):
            b = store.get_batch(np.arange(a, min(a + 1024, n)))
            nbytes += sum(v[0].nbytes if isinstance(v, tuple) else v.nbytes for v in b.values())
            bar.update(min(1024, n - a))
    s = time.perf_counter() - t0
    print("one epoch, storage order, get_batch(1024)")
    _line("throughput", f"{n / s:,.0f} seq/s, {nbytes / s / 1e6:,.0f} MB/s")


PARTITION_EPOCH = 10


def _sub_epochs(store: Any, out: Path, seed: int) -> None:
    """Read sub-epoch 1 of ``partition_epoch=10`` in ``random`` and ``laplace:.1000`` order."""
    lengths_path = out / "features.lengths.npy"
    t0 = time.perf_counter()
    store.lengths("features").save(lengths_path)
    print(f"epoch orders (partition_epoch={PARTITION_EPOCH}, sub-epoch 1)")
    _line("lengths cache (once per store)", f"{(time.perf_counter() - t0) * 1e3:.0f} ms -> {lengths_path.name}")
    t0 = time.perf_counter()
    for ordering in ("random", "laplace:.1000"):  # compiles the order kernels on first use: not the operation
        seq_order(len(store), ordering, epoch=2, seed=seed, lengths=lengths_path, partition_epoch=PARTITION_EPOCH)[0]
    _line("order kernels (warm-up)", f"{(time.perf_counter() - t0) * 1e3:.0f} ms (numba compile on first use; "
          "not counted below)")
    for ordering in ("random", "laplace:.1000"):
        gc.collect()
        before = rss_bytes()
        t0 = time.perf_counter()
        order = seq_order(len(store), ordering, epoch=1, seed=seed, lengths=lengths_path,
                          partition_epoch=PARTITION_EPOCH)
        first = order[0]
        build_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        frames = 0
        for chunk in order.iter_chunks(1024):
            batch = store.get_batch(chunk, fields=["features"])
            frames += len(batch["features"][0])
        read_s = time.perf_counter() - t0
        after = rss_bytes()
        _line(f"{ordering}: order + first index", f"{build_ms:.2f} ms (first index {first})")
        _line(f"{ordering}: read {len(order):,} seqs",
              f"{read_s:.2f} s, {len(order) / read_s:,.0f} seq/s, {frames / read_s / 1e6:.1f} M frames/s")
        _line(f"{ordering}: private RSS growth", f"{(after[0] - before[0]) / 2**20:.1f} MiB")
