"""Grain (JAX): random access through ``seqstore.grain.DataSource`` vs a plain NumPy-memmap data source.

The data: N records (1e6; ``--quick``: 1e5) of a ragged float32 field ``x`` (1..32 rows of 16) and a
scalar int64 ``y``, written once under bench/data/interop/ both as a store and as three plain ``.npy``
files (``x`` values, ``x`` offsets, ``y``) that the peer maps with ``np.load(mmap_mode="r")``. The peer
(:class:`MemmapSource`) is the data source a Grain user writes by hand: ``__getitem__`` slices the
offsets and copies the record's rows and scalar out of the maps. Warm page cache, every case a fresh
process (bench/harness.py).

Groups:

- ``direct``: ``source[i]`` in a loop over ``READS`` random indices in the main process (no Grain
  machinery): the cost of one random access. Extra ``rec_per_s``.
- ``DataLoader w=2``: a Grain ``DataLoader`` with 2 worker processes reading ``LOADER_READS`` records in a
  random order: seqstore's :class:`~seqstore.grain.EpochSampler` (ordering ``random``) for the store,
  Grain's ``IndexSampler(shuffle=True)`` for the peer. Extras ``rec_per_s`` (after the first record,
  i.e. without worker start-up), ``worker_anon_MiB`` (the largest private memory, ``RssAnon``, of the
  worker processes at the end) and ``startup_s``. Grain moves each record from a worker to the trainer
  through a queue, which bounds this rate for both sources alike.
- ``DataLoader w=2 batch 64``: the same with ``grain.transforms.Batch(64, batch_fn=...)`` in the
  workers (seqstore's ``PadBatch(["x"])``; for the peer the same padding written out, :func:`pad_x`),
  ``4 * LOADER_READS`` records: one transfer per batch, so reading counts for more.

The ratio column compares with the peer of the same group (records/s: > 1 means seqstore is faster).

Usage: ``python bench/_interop_grain.py [--quick] [--repeats R]`` (``bench/interop.py`` runs it last).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.harness import DATA, Case, main_args, print_table, run_cases, section  # noqa: E402

N = 1_000_000
QUICK_N = 100_000
READS = 100_000
QUICK_READS = 20_000
LOADER_READS = 20_000  # Grain's DataLoader moves each record between processes: far fewer per second
QUICK_LOADER_READS = 5_000
DIM = 16


def ensure_data(n: int) -> tuple[Path, Path]:
    """(store, folder of the peer's .npy files) for ``n`` records, built once."""
    import seqstore

    root = DATA / "interop" / f"grain-{n}"
    store, plain = root / "s.seqstore", root / "npy"
    if (plain / "y.npy").exists() and (store / "manifest.json").exists():
        return store, plain
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 33, n).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    values = rng.standard_normal((int(offsets[-1]), DIM), dtype=np.float32)
    y = np.arange(n, dtype=np.int64)
    plain.mkdir(parents=True, exist_ok=True)
    np.save(plain / "x_offsets.npy", offsets)
    np.save(plain / "x_values.npy", values)
    schema = {"x": seqstore.Field("float32", (None, DIM)), "y": seqstore.Field("int64")}
    with seqstore.create(store, schema, overwrite=True) as w:
        for a in range(0, n, 50_000):
            b = min(a + 50_000, n)
            w.append_batch({"x": (values[offsets[a] : offsets[b]], lens[a:b]), "y": y[a:b]})
    np.save(plain / "y.npy", y)  # last: marks the folder complete
    return store, plain


class MemmapSource:
    """The peer: a hand-written Grain data source over plain memory-mapped ``.npy`` files."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._maps: tuple[Any, Any, Any] | None = None
        self._n = len(np.load(f"{folder}/y.npy", mmap_mode="r"))

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "_maps": None, "_n": self._n}

    def _open(self) -> tuple[Any, Any, Any]:
        if self._maps is None:
            f = self.folder
            self._maps = (np.load(f"{f}/x_values.npy", mmap_mode="r"), np.load(f"{f}/x_offsets.npy", mmap_mode="r"),
                          np.load(f"{f}/y.npy", mmap_mode="r"))
        return self._maps

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> dict[str, Any]:
        values, offsets, y = self._open()
        a, b = int(offsets[i]), int(offsets[i + 1])
        return {"x": np.array(values[a:b]), "y": np.array(y[i])}

    def __repr__(self) -> str:
        return f"MemmapSource({self.folder!r})"


def pad_x(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The peer's batch function: ``x`` zero-padded plus ``x_lengths``, ``y`` stacked (what PadBatch does)."""
    lengths = np.array([len(r["x"]) for r in records], dtype=np.int64)
    x = np.zeros((len(records), int(lengths.max()), DIM), dtype=np.float32)
    for b, r in enumerate(records):
        x[b, : len(r["x"])] = r["x"]
    return {"x": x, "x_lengths": lengths, "y": np.stack([r["y"] for r in records])}


def _source(kind: str, store: str, plain: str) -> Any:
    if kind == "seqstore":
        import seqstore.grain

        return seqstore.grain.DataSource(store)
    return MemmapSource(plain)


def _warm(store: str, plain: str) -> None:
    """Read every file once, so both sides start from a warm page cache."""
    for p in [*Path(store).rglob("*.npy"), *Path(plain).glob("*.npy")]:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def case_direct(kind: str, store: str, plain: str, reads: int) -> dict[str, object]:
    _warm(store, plain)
    src = _source(kind, store, plain)
    idx = np.random.default_rng(1).integers(0, len(src), reads).tolist()
    src[0]
    total = 0
    with section("read"):
        t = time.perf_counter()
        for i in idx:
            total += len(src[i]["x"])
        dt = time.perf_counter() - t
    return {"rec_per_s": reads / dt, "rows": total}


def _worker_anon() -> float:
    import psutil

    most = 0
    for child in psutil.Process().children(recursive=True):
        try:
            with open(f"/proc/{child.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        most = max(most, int(line.split()[1]) * 1024)
        except OSError:
            continue
    return most / 2**20


def case_loader(kind: str, store: str, plain: str, reads: int, batch: int = 0) -> dict[str, object]:
    import grain

    _warm(store, plain)
    src = _source(kind, store, plain)
    if kind == "seqstore":
        import seqstore
        import seqstore.grain

        src = seqstore.grain.DataSource(seqstore.StoreDataset(store, ordering="random", seed=1))
        sampler: Any = seqstore.grain.EpochSampler(src, num_epochs=1)
        batch_fn: Any = seqstore.grain.PadBatch(["x"])
    else:
        batch_fn = pad_x  # the peer's workers import no seqstore
        sampler = grain.samplers.IndexSampler(len(src), shuffle=True, seed=1, num_epochs=1,
                                              shard_options=grain.sharding.NoSharding())
    ops = [grain.transforms.Batch(batch, batch_fn=batch_fn)] if batch else []
    loader = grain.DataLoader(data_source=src, sampler=sampler, worker_count=2, operations=ops)
    with section("read"):
        t0 = time.perf_counter()
        it = iter(loader)
        first = next(it)
        t1 = time.perf_counter()
        done = len(first["y"]) if batch else 1
        while done < reads:
            item = next(it)
            done += len(item["y"]) if batch else 1
        t2 = time.perf_counter()
    anon = _worker_anon()
    del it
    first_n = len(first["y"]) if batch else 1
    return {"rec_per_s": (done - first_n) / (t2 - t1), "startup_s": t1 - t0, "worker_anon_MiB": anon}


def run_grain(quick: bool, repeats: int) -> None:
    try:
        import grain  # noqa: F401
    except ImportError:
        print("skipped: grain in interop (not installed; pip install 'seqstore[grain]' to enable)", flush=True)
        return
    n, reads, loader_reads = (QUICK_N, QUICK_READS, QUICK_LOADER_READS) if quick else (N, READS, LOADER_READS)
    store, plain = ensure_data(n)
    cases = []
    for group, target, r, extra in (
        ("direct", "bench._interop_grain:case_direct", reads, {}),
        ("DataLoader w=2", "bench._interop_grain:case_loader", loader_reads, {}),
        ("DataLoader w=2 batch 64", "bench._interop_grain:case_loader", 4 * loader_reads, {"batch": 64}),
    ):
        g = f"{group} N={n:.0e}"
        kw = {"store": str(store), "plain": str(plain), "reads": r, **extra}
        cases.append(Case("numpy memmap source", target, {"kind": "memmap", **kw}, group=g, metric="rec_per_s"))
        cases.append(Case("seqstore.grain.DataSource", target, {"kind": "seqstore", **kw}, group=g,
                          metric="rec_per_s"))
    res = run_cases("interop_grain", cases, repeats=repeats, baseline="numpy memmap source")
    print_table(res, extras=["rec_per_s", "startup_s", "worker_anon_MiB"])


if __name__ == "__main__":
    args = main_args(__doc__.splitlines()[0], default_repeats=3)
    run_grain(args.quick, args.repeats)
