"""Megatron and WebDataset imports vs the packages' own sequential reads of the same data.

Every case in a fresh process (bench/harness.py), warm page cache, data written once under
bench/data/interop/. The ratio column compares throughput (``MB_per_s``, bytes of the source's
payload per second): above 1 the import is faster than the package reading the data.

1. **megatron** (N = 1e6 sequences, ``--quick`` 1e5; also N/4 for the memory check): a ``.bin``/``.idx``
   pair in Megatron's layout, uint16 tokens, 1..256 per sequence, two sequences per document.
   - ``seqstore import_megatron``: the whole pair into a new store;
   - ``IndexedDataset read``: Megatron-Core's ``IndexedDataset(prefix)``, then ``ds[i]`` for every i.
2. **webdataset** (S = 2e5 samples in 8 shards, ``--quick`` 2e4; also S/4): samples of a float32
   ``.npy`` (1..30 rows of 8), a ``.cls`` and a ``.txt``, written by ``webdataset.TarWriter``.
   - ``seqstore import_webdataset`` (1 worker and 2 workers);
   - ``WebDataset iteration (decoded)``: ``WebDataset(shards).decode()`` iterated, every sample's
     ``.npy`` decoded to an array (what the import does too); ``(raw)``: the members' bytes only.

The imports run with ``chunk_bytes`` = 8 MiB (CHUNK_MB; the default is 64 MiB), smaller than the
inputs, so that memory bounded by a chunk shows as flat. Each case also returns ``peak_private_MB``:
the highest ``RssAnon`` (private memory, not counting pages of mapped files) sampled every 5 ms
from another process (bench/memwatch.py) during the measured block, minus the value before it: flat in
the input size means memory independent of N.

``--memory-only`` runs the WebDataset import alone at S = 5e4 and 2e5 (inputs well past the 64 MiB
the store's writer buffers), without the slow peer.

Usage: ``python bench/_interop_megawds.py [--quick] [--repeats R] [--megatron-only | --webdataset-only |
--memory-only]`` (bench/interop.py runs the first two).
"""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.harness import DATA, Case, main_args, print_table, run_cases, section, section_time  # noqa: E402
from bench.memwatch import watch  # noqa: E402

MEGATRON_N = 1_000_000
QUICK_MEGATRON_N = 100_000
WDS_S = 200_000
QUICK_WDS_S = 20_000
WDS_SHARDS = 8
#: chunk_bytes of the imports here (MiB): below the inputs' sizes, so that the memory check means something
#: (the default, 64 MiB, would hold a whole --quick input)
CHUNK_MB = 8


# ------------------------------------------------------------------------------------------ data


def ensure_megatron(n: int, seed: int = 0) -> Path:
    """PREFIX of a Megatron pair (written in bulk, in the MMIDIDX layout)."""
    prefix = DATA / "interop" / f"megatron-{n}"
    if Path(str(prefix) + ".idx").exists():
        return prefix
    prefix.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 257, n).astype(np.int32)
    ptr = np.zeros(n, dtype=np.int64)
    np.cumsum(lens[:-1].astype(np.int64) * 2, out=ptr[1:])
    docs = np.concatenate([np.arange(0, n, 2, dtype=np.int64), [n]])
    with open(str(prefix) + ".bin.tmp", "wb") as f:
        for a in range(0, n, 100_000):
            f.write(rng.integers(0, 50_000, int(lens[a : a + 100_000].sum()), dtype=np.uint16).tobytes())
    with open(str(prefix) + ".idx.tmp", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, n, len(docs)))
        f.write(lens.tobytes() + ptr.tobytes() + docs.tobytes())
    Path(str(prefix) + ".bin.tmp").rename(str(prefix) + ".bin")
    Path(str(prefix) + ".idx.tmp").rename(str(prefix) + ".idx")
    return prefix


def ensure_wds(s: int, seed: int = 0) -> list[str]:
    """WDS_SHARDS tar shards of ``s`` samples in all, written by webdataset's TarWriter."""
    import webdataset as wds

    root = DATA / "interop" / f"wds-{s}"
    paths = [str(root / f"{k:06d}.tar") for k in range(WDS_SHARDS)]
    if (root / "done").exists():
        return paths
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per = -(-s // WDS_SHARDS)
    i = 0
    for path in paths:
        with wds.TarWriter(path) as w:
            for _ in range(min(per, s - i)):
                w.write({"__key__": f"sample{i:09d}",
                         "npy": rng.standard_normal((int(rng.integers(1, 31)), 8)).astype(np.float32),
                         "cls": int(rng.integers(0, 1000)), "txt": f"transcript of sample {i}"})
                i += 1
    (root / "done").touch()
    return paths


# ----------------------------------------------------------------------------------------- cases


def case_import_megatron(prefix: str, out: str, chunk_mb: int = CHUNK_MB) -> dict[str, object]:
    from seqstore.interop.megatron import import_megatron

    nbytes = Path(prefix + ".bin").stat().st_size
    with watch(0.005) as mem, section("pass"):
        store = import_megatron(prefix, out, overwrite=True, chunk_bytes=chunk_mb << 20)
    t = section_time("pass")
    return {"seqs": len(store), "MB_per_s": nbytes / 1e6 / t, "seq_per_s": len(store) / t, **mem}


def case_indexed_dataset(prefix: str) -> dict[str, object]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset

    with watch(0.005) as mem, section("pass"):
        ds = IndexedDataset(prefix)
        nbytes = 0
        for i in range(len(ds)):
            nbytes += ds[i].nbytes
    t = section_time("pass")
    return {"seqs": len(ds), "MB_per_s": nbytes / 1e6 / t, "seq_per_s": len(ds) / t, **mem}


def case_import_wds(shards: list[str], out: str, workers: int, chunk_mb: int = CHUNK_MB) -> dict[str, object]:
    from seqstore.interop.webdataset import import_webdataset

    nbytes = sum(Path(p).stat().st_size for p in shards)
    with watch(0.005) as mem, section("pass"):
        store = import_webdataset(shards, out, overwrite=True, workers=workers, chunk_bytes=chunk_mb << 20)
    t = section_time("pass")
    return {"samples": len(store), "MB_per_s": nbytes / 1e6 / t, "sample_per_s": len(store) / t, **mem}


def case_wds_iter(shards: list[str], decode: bool) -> dict[str, object]:
    import webdataset as wds

    nbytes = sum(Path(p).stat().st_size for p in shards)
    with watch(0.005) as mem, section("pass"):
        ds = wds.WebDataset(shards, shardshuffle=False)
        if decode:
            ds = ds.decode()
        n = 0
        for _ in ds:
            n += 1
    t = section_time("pass")
    return {"samples": n, "MB_per_s": nbytes / 1e6 / t, "sample_per_s": n / t, **mem}


def run(quick: bool, repeats: int, parts: tuple[str, ...] = ("megatron", "webdataset")) -> None:
    """Both parts (or those of ``parts``), each a table with ratios (bench/interop.py calls this)."""
    if "megatron" in parts:
        _run_megatron(quick, repeats)
    if "webdataset" in parts:
        _run_webdataset(quick, repeats)


def _run_megatron(quick: bool, repeats: int) -> None:
    n_full = QUICK_MEGATRON_N if quick else MEGATRON_N
    cases = []
    for n in (n_full // 4, n_full):
        prefix = str(ensure_megatron(n))
        g = f"megatron N={n:.0e}"
        cases.append(Case("seqstore import_megatron", "bench._interop_megawds:case_import_megatron",
                          {"prefix": prefix, "out": str(DATA / "interop" / f"megatron-{n}.seqstore")}, group=g,
                          metric="MB_per_s"))
        cases.append(Case("IndexedDataset read", "bench._interop_megawds:case_indexed_dataset", {"prefix": prefix},
                          group=g, metric="MB_per_s"))
    res = run_cases("interop_megatron", cases, repeats=repeats, baseline="IndexedDataset read")
    print_table(res, extras=["seqs", "MB_per_s", "seq_per_s", "peak_private_MB"])


def _run_webdataset(quick: bool, repeats: int) -> None:
    s_full = QUICK_WDS_S if quick else WDS_S
    cases = []
    for s in (s_full // 4, s_full):
        shards = ensure_wds(s)
        g = f"webdataset S={s:.0e}"
        out = str(DATA / "interop" / f"wds-{s}.seqstore")
        for w in (1, 2):
            cases.append(Case(f"seqstore import_webdataset w={w}", "bench._interop_megawds:case_import_wds",
                              {"shards": shards, "out": out, "workers": w}, group=g, metric="MB_per_s"))
        for decode in (True, False):
            cases.append(Case(f"WebDataset iteration ({'decoded' if decode else 'raw'})",
                              "bench._interop_megawds:case_wds_iter", {"shards": shards, "decode": decode}, group=g,
                              metric="MB_per_s"))
    res = run_cases("interop_webdataset", cases, repeats=repeats,
                    baseline=["WebDataset iteration (decoded)", "WebDataset iteration (raw)"])
    print_table(res, extras=["samples", "MB_per_s", "sample_per_s", "peak_private_MB"])


def _run_memory(repeats: int) -> None:
    """The WebDataset import alone at S = 5e4 and 2e5 (inputs well past the writer's 64 MiB buffer)."""
    cases = []
    for s in (WDS_S // 4, WDS_S):
        shards = ensure_wds(s)
        cases.append(Case("seqstore import_webdataset w=1", "bench._interop_megawds:case_import_wds",
                          {"shards": shards, "out": str(DATA / "interop" / f"wds-{s}.seqstore"), "workers": 1},
                          group=f"webdataset S={s:.0e}", metric="MB_per_s"))
    res = run_cases("interop_webdataset_memory", cases, repeats=repeats)
    print_table(res, extras=["samples", "MB_per_s", "sample_per_s", "peak_private_MB"])


def main() -> None:
    args = main_args(__doc__.splitlines()[0], default_repeats=3, extra_flags=("--megatron-only", "--webdataset-only",
                                                                           "--memory-only"))
    t0 = time.perf_counter()
    if args.memory_only:
        _run_memory(args.repeats)
        return
    parts = ("megatron",) if args.megatron_only else ("webdataset",) if args.webdataset_only else (
        "megatron", "webdataset")
    run(args.quick, args.repeats, parts)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
