"""Cold reads: random batches and sequential scans with the page cache dropped, seqstore vs pread, numpy, Lance, h5py.

Every figure elsewhere in docs/benchmarks.md was measured with the data in the page cache. Here every
case runs in a fresh process that first drops the page cache of the files it is about to read
(``os.sync()``, then ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every file of the store or peer file; a
page mapped by a live process cannot be dropped, hence one process per case and run).

Data (generated once into ``--data`` DIR, default /work/bench-data/cold or $SEQSTORE_COLD_DATA, reused
while present; never inside the repository): ``fixed``: 3,000,000 records of one fixed field float32 x
512 (2 KiB; 6.1 GB); ``ragged``: 1,000,000 records of 1-200 rows (uniform) x 16 float16 (3.2 GB). Each
set is written three times with the same values: a seqstore store (default writer settings), a Lance
dataset (one column: fixed_size_list<float32, 512>, or list<fixed_size_list<float16, 16>>) and an HDF5
file (contiguous datasets: ``x`` (n, 512); ``values`` (rows, 16) + ``offsets`` (n + 1)).

Random reads (group ``fixed`` / ``ragged``): the first 20,000 positions of
``seqstore.seq_order(n, "random", epoch=1, seed=3)`` in batches of 1024, by

- ``seqstore get_batch``: ``store.get_batch(batch)`` per batch;
- ``seqstore iter_batches``: ``store.iter_batches(batches, prefetch=2)`` (where the Store has it);
- ``pread x1`` / ``pread x16``: ``os.preadv`` of each record's bytes into the output (ragged: its two
  offsets first, then its values), files advised ``POSIX_FADV_RANDOM``; 1 thread, or 16 threads of a
  ThreadPoolExecutor each taking 1/16 of the batch -- the disk's limit for these byte ranges;
- ``numpy mmap``: ``np.load(<shard file>, mmap_mode="r")`` and fancy indexing (ragged: offsets by fancy
  index, then one slice per record, concatenated);
- ``lance take``: ``dataset.take(batch, columns=["x"])`` and conversion to numpy;
- ``h5py``: fancy read of the sorted batch (h5py needs increasing indices), reordered (ragged: offsets
  by fancy read, then one slice read per record);
- ``... warm``: seqstore get_batch and Lance take with the page cache not dropped, after one untimed
  pass over the same batches in the same process (everything in memory);
- ``SeqDataLoader 2 workers``: ``SeqDataLoader(IterableSeqDataset(StoreDataset(store, ordering="random",
  seed=3), batch=1024), batch_size=None, num_workers=2)``, the first 20 batches (20,480 records, the
  same positions first), timed from ``iter(loader)`` (worker start included).

Sequential scans (group ``fixed-scan`` / ``ragged-scan``) of the whole data set: ``cat`` (plain
``readinto`` of every file of the seqstore store in 4 MiB chunks), ``seqstore iter_matrix`` (fixed;
each block copied into a buffer), ``seqstore get_batch`` / ``iter_batches`` over consecutive ranges of
8192 records, ``lance scan`` (``to_batches``). MB/s counts the values' bytes (cat: the files' bytes).

The virtual disk of the machine this was written on caches below the guest: a page read once comes back
several times faster later, even with the guest's page cache dropped. So the run starts with a probe
(``disk`` group: the same fresh random pages of the fixed .h5 file read three times, 16 threads), and
every other case runs ``repeats + 1`` times: the report gives the median of the runs after the first
and the first run apart (first runs depend on which case touched the pages first).

Per case: records/s (scans: MB/s), disk MiB read (``/proc/self/io`` ``read_bytes``, whole process,
reaped DataLoader workers included) per MiB of values asked, private memory at the end (``Private_Clean
+ Private_Dirty`` of ``/proc/self/smaps_rollup``: this counts file pages mapped by this process only,
i.e. the store pages a mapping faulted in) and anonymous memory (``Anonymous``), page-cache residency of
the files right after the drop (``fincore``), CPU seconds. Ratios: vs ``pread x16`` and vs ``lance take``
(scans: vs ``cat``). The disk is shared: compare within one run.

Usage: ``python bench/cold.py [--quick] [--repeats R] [--data DIR] [--no-scan] [--scans-only] [--no-loader]``;
quick: 200,000 fixed and 100,000 ragged records, 1 + 1 runs. ``python bench/cold.py --generate [--quick]`` builds
the data only. One run per data directory at a time (a lock file; a second run prints ``skipped: ...``).
Results: the table on stdout and ``bench/results/cold[_quick].json`` (every run, the report, the data
sizes, the disk's settings).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import numpy as np  # noqa: E402

from bench.harness import Case, machine_line, run_cases, section  # noqa: E402

DEFAULT_DATA = Path(os.environ.get("SEQSTORE_COLD_DATA", "/work/bench-data/cold"))
N_READ, BATCH, SCAN_BATCH, CAT_CHUNK = 20_000, 1024, 8192, 4 << 20
ORDER_SEED, LOADER_BATCHES = 3, 20

# ------------------------------------------------------------------------------------------- data

GEN_CHUNK, GEN_SEED = 100_000, 11
DIM_FIXED, DIM_RAGGED, MAX_LEN = 512, 16, 200
FULL = {"fixed": 3_000_000, "ragged": 1_000_000}
QUICK = {"fixed": 200_000, "ragged": 100_000}
LAYOUTS = ("seqstore", "lance", "hdf5")


def path_of(data: Path, kind: str, n: int, layout: str) -> Path:
    ext = {"seqstore": "seqstore", "lance": "lance", "hdf5": "h5"}[layout]
    return data / f"{kind}-{n}.{ext}"


def gen_chunks(kind: str, n: int) -> Iterator[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]]:
    """``(values, lengths)`` per chunk of 100,000 records (lengths None for ``fixed``); deterministic:
    chunk ``c`` draws lengths from ``default_rng([11, c, 0])`` and values from ``default_rng([11, c, 1])``."""
    for c, start in enumerate(range(0, n, GEN_CHUNK)):
        k = min(GEN_CHUNK, n - start)
        vals = np.random.default_rng([GEN_SEED, c, 1])
        if kind == "fixed":
            yield vals.random((k, DIM_FIXED), dtype=np.float32), None
        else:
            lengths = np.random.default_rng([GEN_SEED, c, 0]).integers(1, MAX_LEN + 1, size=k).astype(np.int64)
            yield vals.random((int(lengths.sum()), DIM_RAGGED), dtype=np.float32).astype(np.float16), lengths


def _build_seqstore(path: Path, kind: str, n: int) -> None:
    import seqstore

    shape = (DIM_FIXED,) if kind == "fixed" else (None, DIM_RAGGED)
    with seqstore.create(path, {"x": seqstore.Field("float32" if kind == "fixed" else "float16", shape)}) as w:
        for values, lengths in gen_chunks(kind, n):
            w.append_batch({"x": values if lengths is None else (values, lengths)})


def _build_lance(path: Path, kind: str, n: int) -> None:
    import lance
    import pyarrow as pa

    def batch(values: np.ndarray[Any, Any], lengths: np.ndarray[Any, Any] | None) -> Any:
        if lengths is None:
            col = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), DIM_FIXED)
        else:
            inner = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), DIM_RAGGED)
            off = np.zeros(len(lengths) + 1, dtype=np.int32)
            np.cumsum(lengths, out=off[1:])
            col = pa.ListArray.from_arrays(pa.array(off), inner)
        return pa.RecordBatch.from_arrays([col], names=["x"])

    if kind == "fixed":
        schema = pa.schema([("x", pa.list_(pa.float32(), DIM_FIXED))])
    else:
        schema = pa.schema([("x", pa.list_(pa.list_(pa.float16(), DIM_RAGGED)))])
    reader = pa.RecordBatchReader.from_batches(schema, (batch(v, ln) for v, ln in gen_chunks(kind, n)))
    lance.write_dataset(reader, str(path), schema=schema, mode="create")


def _build_hdf5(path: Path, kind: str, n: int) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        if kind == "fixed":
            ds = f.create_dataset("x", (n, DIM_FIXED), dtype="f4")  # contiguous: no chunks, no filters
            pos = 0
            for values, _ in gen_chunks(kind, n):
                ds[pos : pos + len(values)] = values
                pos += len(values)
            return
        rows = sum(
            int(np.random.default_rng([GEN_SEED, c, 0]).integers(1, MAX_LEN + 1, size=min(GEN_CHUNK, n - s)).sum())
            for c, s in enumerate(range(0, n, GEN_CHUNK))
        )
        vals = f.create_dataset("values", (rows, DIM_RAGGED), dtype="f2")
        offs = f.create_dataset("offsets", (n + 1,), dtype="i8")
        offs[0] = 0
        row = rec = 0
        for values, lengths in gen_chunks(kind, n):
            assert lengths is not None
            vals[row : row + len(values)] = values
            offs[rec + 1 : rec + 1 + len(lengths)] = row + np.cumsum(lengths)
            row += len(values)
            rec += len(lengths)


def _usable(path: Path, layout: str, n: int) -> bool:
    """The built data set opens with the current code and has n records (a format change rebuilds it)."""
    if layout != "seqstore":
        return True
    try:
        import seqstore

        return len(seqstore.open(path)) == n
    except Exception:  # noqa: BLE001 - any failure to open means: rebuild
        return False


def ensure(data: Path, sizes: dict[str, int], layouts: tuple[str, ...] = LAYOUTS) -> dict[tuple[str, str], Path]:
    """Build what is missing; return (kind, layout) -> path. A finished layout has a ``.done`` marker."""
    builders = {"seqstore": _build_seqstore, "lance": _build_lance, "hdf5": _build_hdf5}
    data.mkdir(parents=True, exist_ok=True)
    out = {}
    for kind, n in sizes.items():
        for layout in layouts:
            p = path_of(data, kind, n, layout)
            out[(kind, layout)] = p
            done = p.with_name(p.name + ".done")
            if done.exists() and p.exists() and _usable(p, layout, n):
                continue
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
            done.unlink(missing_ok=True)
            t0 = time.perf_counter()
            print(f"building {p} ...", file=sys.stderr, flush=True)
            builders[layout](p, kind, n)
            os.sync()
            done.touch()
            print(f"  {du(p) / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return out


def files_of(path: Path | str) -> list[Path]:
    p = Path(path)
    return [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in files_of(path))


# ---------------------------------------------------------------------------- process measurements


def drop_cache(path: str) -> None:
    """Write back dirty pages, then drop the page cache of every file under ``path``."""
    os.sync()
    for p in files_of(path):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_mib(path: str) -> float | None:
    """Page-cache bytes of the files under ``path`` (util-linux ``fincore``), in MiB; None without it."""
    files = [str(p) for p in files_of(path)]
    if not shutil.which("fincore") or not files:
        return None
    out = subprocess.run(["fincore", "-b", "-n", "-o", "RES", *files], capture_output=True, text=True)
    if out.returncode:
        return None
    return sum(int(x) for x in out.stdout.split()) / 2**20


def io_read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def smaps_mib() -> tuple[float, float]:
    """(Private_Clean + Private_Dirty, Anonymous) of this process, MiB."""
    priv = anon = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                priv += int(line.split()[1])
            elif line.startswith("Anonymous:"):
                anon += int(line.split()[1])
    return priv / 1024, anon / 1024


def disk_facts(path: Path) -> dict[str, Any]:
    """read_ahead_kb, nr_requests and scheduler of the block device holding ``path``."""
    st = os.stat(path)
    base = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    q = base / "queue" if (base / "queue").exists() else base.resolve().parent / "queue"
    out: dict[str, Any] = {"device": base.resolve().name}
    for key in ("read_ahead_kb", "nr_requests", "scheduler", "rotational"):
        try:
            out[key] = (q / key).read_text().strip()
        except OSError:
            out[key] = None
    return out


# ------------------------------------------------------------------------------------ the readers


def _epoch_batches(n: int, start: int = 0) -> list[np.ndarray[Any, Any]]:
    import seqstore

    order = seqstore.seq_order(n, "random", epoch=1, seed=ORDER_SEED)
    idx = np.asarray(order[start : min(start + N_READ, n)], dtype=np.int64)
    return [idx[a : a + BATCH] for a in range(0, len(idx), BATCH)]


def _check(kind: str, out: Any) -> float:
    """Order-sensitive checksum of one batch's values (same for every reader that read the same)."""
    if kind == "fixed":
        return float(np.dot(np.arange(1, len(out) + 1), out.sum(axis=1, dtype=np.float64)))
    values, lengths = out
    return float(values.sum(dtype=np.float64)) + float(np.dot(np.arange(1, len(lengths) + 1), lengths))


def _shard_files(store_path: str, kind: str) -> list[tuple[int, Path, int, Path | None, int]]:
    """Per shard: (records, values .npy, its data offset, offsets .npy or None, its data offset)."""
    import seqstore

    out = []
    store = seqstore.open(store_path)
    for sh in store.manifest.shards:
        d = Path(store_path) / sh.name
        v = d / "x.npy"
        o = d / "x.offsets.npy" if kind == "ragged" else None
        out.append((sh.records, v, _npy_data_offset(v), o, _npy_data_offset(o) if o else 0))
    return out


def _npy_data_offset(path: Path) -> int:
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            np.lib.format.read_array_header_1_0(f)
        else:
            np.lib.format.read_array_header_2_0(f)
        return f.tell()


class _Pread:
    """Record byte ranges of the seqstore files read with ``os.preadv`` by ``threads`` threads."""

    def __init__(self, store_path: str, kind: str, threads: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.kind = kind
        self.shards = []
        for recs, v, voff, o, ooff in _shard_files(store_path, kind):
            vfd = os.open(v, os.O_RDONLY)
            os.posix_fadvise(vfd, 0, 0, os.POSIX_FADV_RANDOM)
            ofd = -1
            if o is not None:
                ofd = os.open(o, os.O_RDONLY)
                os.posix_fadvise(ofd, 0, 0, os.POSIX_FADV_RANDOM)
            self.shards.append((recs, vfd, voff, ofd, ooff))
        self.starts = np.zeros(len(self.shards) + 1, dtype=np.int64)
        np.cumsum([s[0] for s in self.shards], out=self.starts[1:])
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads) if threads > 1 else None

    def _run(self, fn: Any, count: int) -> None:
        if self.pool is None:
            fn(0, count)
            return
        step = -(-count // self.threads)
        list(self.pool.map(lambda lo: fn(lo, min(lo + step, count)), range(0, count, step)))

    def get(self, batch: np.ndarray[Any, Any]) -> Any:
        k = np.searchsorted(self.starts, batch, side="right") - 1
        rows = (batch - self.starts[k]).tolist()
        k = k.tolist()
        sh = self.shards
        preadv = os.preadv
        if self.kind == "fixed":
            rec = DIM_FIXED * 4
            out = np.empty((len(batch), DIM_FIXED), dtype=np.float32)
            view = memoryview(out).cast("B")

            def fixed(lo: int, hi: int) -> None:
                for j in range(lo, hi):
                    s = sh[k[j]]
                    preadv(s[1], [view[j * rec : (j + 1) * rec]], s[2] + rows[j] * rec)

            self._run(fixed, len(batch))
            return out
        bounds = np.empty((len(batch), 2), dtype=np.int64)
        bview = memoryview(bounds).cast("B")

        def offsets(lo: int, hi: int) -> None:
            for j in range(lo, hi):
                s = sh[k[j]]
                preadv(s[3], [bview[j * 16 : (j + 1) * 16]], s[4] + rows[j] * 8)

        self._run(offsets, len(batch))
        lengths = bounds[:, 1] - bounds[:, 0]
        row = DIM_RAGGED * 2
        ends = np.cumsum(lengths) * row
        out = np.empty(int(lengths.sum()) * DIM_RAGGED, dtype=np.float16)
        view = memoryview(out).cast("B")
        src = (bounds[:, 0] * row).tolist()
        dst_end = ends.tolist()
        size = (lengths * row).tolist()

        def values(lo: int, hi: int) -> None:
            for j in range(lo, hi):
                s = sh[k[j]]
                preadv(s[1], [view[dst_end[j] - size[j] : dst_end[j]]], s[2] + src[j])

        self._run(values, len(batch))
        return out.reshape(-1, DIM_RAGGED), lengths


class _NumpyMmap:
    def __init__(self, store_path: str, kind: str) -> None:
        self.kind = kind
        self.parts = []
        for _recs, v, _, o, _ in _shard_files(store_path, kind):
            self.parts.append((np.load(v, mmap_mode="r"), np.load(o, mmap_mode="r") if o else None))
        self.starts = np.zeros(len(self.parts) + 1, dtype=np.int64)
        np.cumsum([len(o) - 1 if o is not None else len(v) for v, o in self.parts], out=self.starts[1:])

    def get(self, batch: np.ndarray[Any, Any]) -> Any:
        k = np.searchsorted(self.starts, batch, side="right") - 1
        if self.kind == "fixed":
            out = np.empty((len(batch), DIM_FIXED), dtype=np.float32)
            for s in np.unique(k):
                pos = np.flatnonzero(k == s)
                out[pos] = self.parts[s][0][batch[pos] - self.starts[s]]
            return out
        a = np.empty(len(batch), dtype=np.int64)
        b = np.empty(len(batch), dtype=np.int64)
        for s in np.unique(k):
            pos = np.flatnonzero(k == s)
            rows = batch[pos] - self.starts[s]
            off = self.parts[s][1]
            a[pos], b[pos] = off[rows], off[rows + 1]
        pieces = [self.parts[s][0][x:y] for s, x, y in zip(k.tolist(), a.tolist(), b.tolist())]
        return np.concatenate(pieces), b - a


class _Lance:
    def __init__(self, path: str, kind: str) -> None:
        import lance

        self.kind = kind
        self.ds = lance.dataset(path)

    def get(self, batch: np.ndarray[Any, Any]) -> Any:
        col = self.ds.take(batch, columns=["x"]).column("x").combine_chunks()
        if self.kind == "fixed":
            return col.flatten().to_numpy().reshape(-1, DIM_FIXED)
        values = col.flatten().flatten().to_numpy().reshape(-1, DIM_RAGGED)
        return values, col.value_lengths().to_numpy().astype(np.int64)


class _H5:
    def __init__(self, path: str, kind: str) -> None:
        import h5py

        self.kind = kind
        self.f = h5py.File(path, "r")

    def get(self, batch: np.ndarray[Any, Any]) -> Any:
        order = np.argsort(batch)
        srt = batch[order]
        if self.kind == "fixed":
            out = np.empty((len(batch), DIM_FIXED), dtype=np.float32)
            out[order] = self.f["x"][srt]
            return out
        offs = self.f["offsets"]
        a = np.empty(len(batch), dtype=np.int64)
        b = np.empty(len(batch), dtype=np.int64)
        a[order] = offs[srt]
        b[order] = offs[srt + 1]
        vals = self.f["values"]
        return np.concatenate([vals[x:y] for x, y in zip(a.tolist(), b.tolist())]), b - a


def _asked_bytes(kind: str, got: Any) -> int:
    return got.nbytes if kind == "fixed" else got[0].nbytes


def case_read(kind: str, system: str, path: str, n: int, warm: bool = False, start: int = 0) -> dict[str, Any]:
    """Random batches of the epoch order (positions ``start ...``), one reader (child process)."""
    batches = _epoch_batches(n, start)
    if not warm:
        drop_cache(path)
    cached = resident_mib(path)
    if system in ("get_batch", "iter_batches"):
        import seqstore

        store = seqstore.open(path)

        def read_all() -> Iterator[Any]:
            if system == "iter_batches":
                for got in store.iter_batches(batches, prefetch=2):
                    yield got["x"]
            else:
                for b in batches:
                    yield store.get_batch(b)["x"]
    else:
        if system.startswith("pread"):
            reader: Any = _Pread(path, kind, int(system[len("pread") :]))
        elif system == "numpy":
            reader = _NumpyMmap(path, kind)
        elif system == "lance":
            reader = _Lance(path, kind)
        elif system == "h5py":
            reader = _H5(path, kind)
        else:
            raise ValueError(system)

        def read_all() -> Iterator[Any]:
            for b in batches:
                yield reader.get(b)

    if warm:
        for _ in read_all():
            pass
        cached = resident_mib(path)
    rb0 = io_read_bytes()
    check = 0.0
    asked = 0
    with section("read"):
        t0 = time.perf_counter()
        for got in read_all():
            check += _check(kind, got)
            asked += _asked_bytes(kind, got)
        dt = time.perf_counter() - t0
    disk = io_read_bytes() - rb0
    priv, anon = smaps_mib()
    records = sum(len(b) for b in batches)
    return {
        "records_per_s": records / dt,
        "disk_mib": disk / 2**20,
        "asked_mib": asked / 2**20,
        "private_mib": priv,
        "anon_mib": anon,
        "cached_before_mib": cached,
        "checksum": check,
    }


def case_loader(kind: str, path: str, n: int, workers: int = 2) -> dict[str, Any]:
    """The first LOADER_BATCHES batches of an epoch through SeqDataLoader with ``workers`` workers."""
    import seqstore
    from seqstore.torch import IterableSeqDataset, SeqDataLoader

    ds = IterableSeqDataset(seqstore.StoreDataset(path, ordering="random", seed=ORDER_SEED), batch=BATCH)
    loader = SeqDataLoader(ds, batch_size=None, num_workers=workers)
    drop_cache(path)
    cached = resident_mib(path)
    rb0 = io_read_bytes()
    records = asked = 0
    first_records, t_first = 0, 0.0
    with section("read"):
        t0 = time.perf_counter()
        it = iter(loader)
        for j in range(LOADER_BATCHES):
            got = next(it)
            x = got["x"]
            records += x.shape[0]
            asked += (x.numel() if kind == "fixed" else int(got["x_lengths"].sum()) * DIM_RAGGED) * x.element_size()
            if j == 0:  # the workers' start (fork, imports, the first batch's reads)
                first_records, t_first = records, time.perf_counter()
        t_end = time.perf_counter()
        dt = t_end - t0
        del it  # shuts the workers down; their I/O is added to this process once they are reaped
    time.sleep(0.2)
    disk = io_read_bytes() - rb0
    priv, anon = smaps_mib()
    return {
        "records_per_s": records / dt,
        # an epoch is thousands of batches: the rate once the workers run, their start apart
        "steady_records_per_s": (records - first_records) / max(t_end - t_first, 1e-9),
        "first_batch_s": t_first - t0,
        "disk_mib": disk / 2**20,
        "asked_mib": asked / 2**20,
        "private_mib": priv,
        "anon_mib": anon,
        "cached_before_mib": cached,
    }


def case_scan(kind: str, system: str, path: str, n: int) -> dict[str, Any]:
    """A whole data set read front to back (child process); MB/s of values (cat: of file bytes)."""
    drop_cache(path)
    cached = resident_mib(path)
    rb0 = io_read_bytes()
    nbytes = 0
    if system == "cat":
        files = files_of(path)
        buf = bytearray(CAT_CHUNK)
        with section("read"):
            t0 = time.perf_counter()
            for p in files:
                with open(p, "rb", buffering=0) as f:
                    while True:
                        got = f.readinto(buf)
                        if not got:
                            break
                        nbytes += got
            dt = time.perf_counter() - t0
    elif system == "lance":
        import lance

        ds = lance.dataset(path)
        with section("read"):
            t0 = time.perf_counter()
            for rb in ds.to_batches(columns=["x"]):
                col = rb.column(0)
                vals = col.flatten() if kind == "fixed" else col.flatten().flatten()
                nbytes += vals.to_numpy().nbytes
            dt = time.perf_counter() - t0
    else:
        import seqstore

        store = seqstore.open(path)
        ranges = (np.arange(a, min(a + SCAN_BATCH, n), dtype=np.int64) for a in range(0, n, SCAN_BATCH))
        with section("read"):
            t0 = time.perf_counter()
            if system == "iter_matrix":
                buf = np.empty((1 << 16, DIM_FIXED), dtype=np.float32)
                for _, block in store.iter_matrix(chunk_rows=1 << 16):
                    np.copyto(buf[: len(block)], block)
                    nbytes += block.nbytes
            elif system == "iter_ragged":  # zero-copy blocks of 65,536 records, each copied into one buffer
                rbuf = np.empty(1 << 28, dtype=np.uint8)
                for _, values, _ in store.iter_ragged("x", chunk_records=1 << 16):
                    v = values.reshape(-1).view(np.uint8)
                    np.copyto(rbuf[: len(v)], v)
                    nbytes += len(v)
            elif system == "iter":  # records as zero-copy views, each copied into one reused buffer
                rbuf = np.empty(1 << 20, dtype=np.uint8)
                for rec in store:
                    v = rec["x"].reshape(-1).view(np.uint8)
                    np.copyto(rbuf[: len(v)], v)
                    nbytes += len(v)
            else:
                got_iter = (
                    (store.get_batch(r) for r in ranges)
                    if system == "get_batch"
                    else store.iter_batches(ranges, prefetch=2)
                )
                for got in got_iter:
                    nbytes += _asked_bytes(kind, got["x"])
            dt = time.perf_counter() - t0
    disk = io_read_bytes() - rb0
    priv, anon = smaps_mib()
    return {
        "mb_per_s": nbytes / dt / 1e6,
        "disk_mib": disk / 2**20,
        "asked_mib": nbytes / 2**20,
        "private_mib": priv,
        "anon_mib": anon,
        "cached_before_mib": cached,
    }


def case_fresh_pages(path: str, seed: int, pages: int = N_READ, threads: int = 16) -> dict[str, Any]:
    """``pages`` random 4 KiB pages of ``path`` (drawn with ``seed``) read by ``threads`` threads with
    ``os.pread``, page cache dropped first: the same pages in every process given the same seed."""
    from concurrent.futures import ThreadPoolExecutor

    size = os.path.getsize(path)
    offsets = (np.random.default_rng(seed).choice(size // 4096, pages, replace=False) * 4096).tolist()
    drop_cache(path)
    cached = resident_mib(path)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    step = -(-pages // threads)

    def work(lo: int) -> None:
        for o in offsets[lo : lo + step]:
            os.pread(fd, 4096, o)

    pool = ThreadPoolExecutor(threads)
    rb0 = io_read_bytes()
    with section("read"):
        t0 = time.perf_counter()
        list(pool.map(work, range(0, pages, step)))
        dt = time.perf_counter() - t0
    disk = io_read_bytes() - rb0
    priv, anon = smaps_mib()
    return {
        "records_per_s": pages / dt,
        "disk_mib": disk / 2**20,
        "asked_mib": pages * 4096 / 2**20,
        "private_mib": priv,
        "anon_mib": anon,
        "cached_before_mib": cached,
    }


# ------------------------------------------------------------------------------------------ parent


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def build_cases(
    paths: dict[tuple[str, str], Path], sizes: dict[str, int], args: Any, repeats: int
) -> tuple[list[Case], list[str]]:
    """The cases in run order; every case but the disk probe runs ``repeats + 1`` times (the first
    run is reported apart: it may be the first read of its pages from the virtual disk)."""
    import seqstore

    reps = repeats + 1
    notes = []
    has_iter = hasattr(seqstore.Store, "iter_batches")
    if not has_iter:
        notes.append("seqstore iter_batches: not available at this commit (Store.iter_batches missing); rerun later")
    peers = {"lance": _have("lance"), "h5py": _have("h5py"), "torch": _have("torch")}
    for peer, ok in peers.items():
        if not ok:
            notes.append(f"skipped: {peer} (not installed; `make bench` installs the bench extra)")
    cases = []
    if ("fixed", "hdf5") in paths and not args.scans_only:
        # The virtual disk caches below the guest: a page read once comes back much faster later, even with the
        # guest's page cache dropped. Three reads of the same fresh random pages of a file no other case scans.
        seed = int(time.time())
        for what in ("1st", "2nd", "3rd"):
            kw = {"path": str(paths[("fixed", "hdf5")]), "seed": seed}
            cases.append(
                Case(
                    f"same fresh pages, {what} read",
                    "bench.cold:case_fresh_pages",
                    kw,
                    group="disk",
                    metric="records_per_s",
                    repeats=1,
                )
            )
    for kind, n in ({} if args.scans_only else sizes).items():
        store = str(paths[(kind, "seqstore")])
        where = {peer: str(paths.get((kind, layout), "")) for peer, layout in (("lance", "lance"), ("h5py", "hdf5"))}
        rows = [
            ("seqstore get_batch", "get_batch", store, False),
            ("seqstore iter_batches", "iter_batches", store, False),
            ("pread x1", "pread1", store, False),
            ("pread x16", "pread16", store, False),
            ("numpy mmap", "numpy", store, False),
            ("lance take", "lance", where["lance"], False),
            ("h5py", "h5py", where["h5py"], False),
            ("seqstore get_batch warm", "get_batch", store, True),
            ("lance take warm", "lance", where["lance"], True),
        ]
        for name, system, path, warm in rows:
            if (system == "iter_batches" and not has_iter) or (system in peers and not peers[system]):
                continue
            kw = {"kind": kind, "system": system, "path": path, "n": n, "warm": warm}
            cases.append(Case(name, "bench.cold:case_read", kw, group=kind, metric="records_per_s", repeats=reps))
        if not args.no_loader and peers["torch"]:
            cases.append(
                Case(
                    "SeqDataLoader 2 workers",
                    "bench.cold:case_loader",
                    {"kind": kind, "path": store, "n": n},
                    group=kind,
                    metric="records_per_s",
                    repeats=reps,
                )
            )
    if not args.no_scan:
        for kind, n in sizes.items():
            store = str(paths[(kind, "seqstore")])
            rows = [("cat", "cat", store)]
            if kind == "fixed":
                rows.append(("seqstore iter_matrix", "iter_matrix", store))
            else:
                rows.append(("seqstore iter_ragged", "iter_ragged", store))
                rows.append(("seqstore iter(store)", "iter", store))
            rows.append(("seqstore get_batch (ranges)", "get_batch", store))
            if has_iter:
                rows.append(("seqstore iter_batches (ranges)", "iter_batches", store))
            if peers["lance"]:
                rows.append(("lance scan", "lance", str(paths[(kind, "lance")])))
            for name, system, path in rows:
                kw = {"kind": kind, "system": system, "path": path, "n": n}
                cases.append(
                    Case(name, "bench.cold:case_scan", kw, group=f"{kind}-scan", metric="mb_per_s", repeats=reps)
                )
    return cases, notes


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def report(results: dict[str, Any], sizes: dict[str, int], facts: dict[str, Any], notes: list[str]) -> str:
    lines = []
    by_group: dict[str, list[dict[str, Any]]] = {}
    for c in results["cases"]:
        by_group.setdefault(c["group"], []).append(c)

    def later(c: dict[str, Any]) -> list[dict[str, Any]]:
        return c["runs"][1:] if len(c["runs"]) > 1 else c["runs"]

    def med(c: dict[str, Any], key: str) -> float | None:
        vals = [r["extra"].get(key) for r in later(c)]
        vals = [v for v in vals if isinstance(v, (int, float))]
        return statistics.median(vals) if vals else None

    for group, cases in by_group.items():
        scan = group.endswith("-scan")
        metric = "mb_per_s" if scan else "records_per_s"
        base = {c["name"]: med(c, metric) for c in cases}
        kind = group.split("-")[0]
        if group == "disk":
            what = f"disk: {N_READ:,} random 4 KiB pages of one file (fixed .h5), pread x16, the same pages three times"
        elif scan:
            what = f"{kind}: sequential scan of all {sizes[kind]:,} records"
        else:
            what = f"{kind}: {min(N_READ, sizes[kind]):,} records of a random epoch, batches of {BATCH}"
        lines.append(f"\n{what}\n")
        unit = "MB/s" if scan else "pages/s" if group == "disk" else "records/s"
        cols = ["case", unit, "later runs", "first run"]
        cols += ["vs cat"] if scan else ["vs pread x16", "vs lance take"]
        cols += ["disk MiB / asked MiB", "private MiB", "anon MiB", "cached before MiB", "CPU s"]
        rows = []
        sums = set()
        for c in cases:
            v = med(c, metric)
            runs = "/".join(f"{r['extra'][metric]:,.0f}" for r in later(c)) if len(c["runs"]) > 1 else "-"
            first = f"{c['runs'][0]['extra'][metric]:,.0f}"
            if scan:
                ratios = [_ratio(v, base.get("cat"))]
            else:
                ratios = [_ratio(v, base.get("pread x16")), _ratio(v, base.get("lance take"))]
            d, a = med(c, "disk_mib"), med(c, "asked_mib")
            cached = med(c, "cached_before_mib")
            rows.append(
                [
                    c["name"],
                    f"{v:,.0f}" if v else "-",
                    runs,
                    first,
                    *ratios,
                    f"{d:,.1f} / {a:,.1f}" if d is not None and a else "-",
                    f"{med(c, 'private_mib'):,.0f}",
                    f"{med(c, 'anon_mib'):,.0f}",
                    "-" if cached is None else f"{cached:,.1f}",
                    f"{statistics.median(r['sections']['read']['cpu_s'] for r in later(c)):.2f}",
                ]
            )
            if c["summary"]["extra"].get("checksum") is not None:
                sums.add(round(c["runs"][0]["extra"]["checksum"], 0))
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(cols)]
        lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(cols, widths)) + " |")
        lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        lines += ["| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |" for r in rows]
        for c in cases:
            steady = med(c, "steady_records_per_s")
            if steady is not None:
                lines.append(
                    f"\n{c['name']} from its first batch on (what an epoch of thousands of batches runs at): "
                    f"{steady:,.0f} records/s, {_ratio(steady, base.get('pread x16'))} of pread x16; first batch "
                    f"after {med(c, 'first_batch_s'):.2f} s (workers' start included)"
                )
        if len(sums) > 1:
            lines.append(f"\nWARNING: readers disagree on the values read (checksums {sorted(sums)})")
    reps = sorted({len(c["runs"]) - 1 for c in results["cases"] if len(c["runs"]) > 1})
    lines.append(
        f"\nmedians of the {'/'.join(map(str, reps))} runs after the first of each case (first run apart), every run "
        "a fresh process with the page cache of its files dropped (warm rows: not dropped, one untimed pass first); "
        f"{machine_line(results['machine'])}"
    )
    lines.append(
        f"disk {facts['device']}: read_ahead_kb={facts['read_ahead_kb']}, nr_requests={facts['nr_requests']}, "
        f"scheduler {facts['scheduler']}; lance {results['meta'].get('lance')}, h5py {results['meta'].get('h5py')}; "
        f"seqstore x.npy data offset {results['meta'].get('npy_data_offset')}; seqstore imported from "
        f"{results['meta'].get('seqstore_from')}"
    )
    lines += notes
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="200,000 fixed / 100,000 ragged records, 1 run per case")
    p.add_argument("--repeats", type=int, default=None, help="runs per case (default 3, quick 1)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"data directory (default {DEFAULT_DATA})")
    p.add_argument("--generate", action="store_true", help="build the data only")
    p.add_argument("--no-scan", action="store_true", help="leave out the sequential scans")
    p.add_argument("--scans-only", action="store_true", help="only the sequential scans")
    p.add_argument("--no-loader", action="store_true", help="leave out the SeqDataLoader cases")
    args = p.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    sizes = dict(QUICK if args.quick else FULL)
    layouts = tuple(x for x in LAYOUTS if x == "seqstore" or _have({"lance": "lance", "hdf5": "h5py"}[x]))
    args.data.mkdir(parents=True, exist_ok=True)
    lock = open(args.data / ".cold-bench.lock", "w")  # noqa: SIM115 - held until the process exits
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        # Two runs on one data directory would drop and read each other's pages (and one might rebuild).
        print(f"skipped: cold: another bench/cold.py run is using {args.data} (wait for it, or pass --data DIR)")
        return
    paths = ensure(args.data, sizes, layouts)
    if args.generate:
        return
    cases, notes = build_cases(paths, sizes, args, repeats)
    facts = disk_facts(args.data)
    import seqstore

    meta: dict[str, Any] = {"sizes": sizes, "data": str(args.data), "disk": facts}
    meta["seqstore_from"] = str(Path(seqstore.__file__).parent)
    for mod in ("lance", "h5py"):
        if _have(mod):
            meta[mod] = __import__(mod).__version__
    meta["bytes"] = {f"{k}/{lay}": du(p) for (k, lay), p in paths.items()}
    meta["npy_data_offset"] = {k: _shard_files(str(paths[(k, "seqstore")]), k)[0][2] for k in sizes}
    print("data: " + ", ".join(f"{k} {b / 1e9:.2f} GB" for k, b in meta["bytes"].items()), file=sys.stderr, flush=True)
    name = "cold_quick" if args.quick else "cold"
    results = run_cases(name, cases, repeats=repeats, meta=meta)
    text = report(results, sizes, facts, notes)
    results["report"] = text
    from bench.harness import RESULTS

    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
