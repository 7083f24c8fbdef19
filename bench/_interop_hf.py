"""Hugging Face ``datasets`` import vs ``datasets``' own sequential iteration of the same data.

Every case in a fresh process (bench/harness.py), warm page cache. The data is a ``save_to_disk``
directory written once under bench/data/interop/: N records (N = 1e6, ``--quick`` 1e5; also N/4
for the memory check) of ``tokens`` (``List(Value("uint16"))``, 1..256 per record), ``label``
(``ClassLabel`` of 10) and ``text`` (a short string). Each case opens it with ``load_from_disk``
(memory-mapped) and passes over every record:

- ``seqstore import_hf``: ``import_hf(ds, out)``, the whole split into a new store
  (``chunk_bytes`` = 8 MiB: batches smaller than the input, so that the memory check means something);
- ``datasets iter (numpy)``: ``ds.with_format("numpy").iter(batch_size=1024)``, every batch's columns
  as numpy (the ragged ``tokens`` as an object array of arrays);
- ``datasets iter (arrow)``: ``ds.with_format("arrow").iter(batch_size=1024)``: slices of the mapped
  table, nothing converted (a floor: it reads no values).

``MB_per_s`` is the size of the dataset's Arrow files over the pass; the ratio column compares with
the numpy iteration. ``peak_private_MB`` is the peak of private memory (RssAnon) above its value
before the pass, sampled every 5 ms from another process (bench/memwatch.py).

Usage: ``python bench/_interop_hf.py [--quick] [--repeats R]`` (bench/interop.py runs it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.harness import DATA, Case, main_args, print_table, run_cases, section, section_time  # noqa: E402
from bench.memwatch import watch  # noqa: E402

HF_N = 1_000_000
QUICK_HF_N = 100_000
CHUNK_MB = 8
BATCH = 1024


def ensure_hf(n: int, seed: int = 0) -> Path:
    """A ``save_to_disk`` directory of ``n`` records, built from Arrow arrays in blocks of 1e5 records."""
    import datasets
    import pyarrow as pa

    root = DATA / "interop" / f"hf-{n}"
    if (root / "state.json").exists():
        return root
    rng = np.random.default_rng(seed)
    features = datasets.Features({"tokens": datasets.List(datasets.Value("uint16")),
                                  "label": datasets.ClassLabel(num_classes=10), "text": datasets.Value("string")})
    tables = []
    for a in range(0, n, 100_000):
        m = min(100_000, n - a)
        lens = rng.integers(1, 257, m)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 50_000, int(lens.sum()),
                                                                                   dtype=np.uint16)))
        text = pa.array([f"transcript of record {i}" for i in range(a, a + m)])
        label = pa.array(rng.integers(0, 10, m).astype(np.int64))
        tables.append(pa.table({"tokens": tokens, "label": label, "text": text}))
    ds = datasets.Dataset(pa.concat_tables(tables)).cast(features)
    tmp = root.with_name(root.name + ".tmp")
    ds.save_to_disk(str(tmp), max_shard_size="256MB")
    tmp.rename(root)
    return root


def _arrow_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).glob("*.arrow"))


def case_import_hf(path: str, out: str) -> dict[str, object]:
    import datasets

    from seqstore.interop.hf import import_hf

    with watch(0.005) as mem, section("pass"):
        ds = datasets.load_from_disk(path)
        store = import_hf(ds, out, overwrite=True, chunk_bytes=CHUNK_MB << 20)
    t = section_time("pass")
    return {"records": len(store), "MB_per_s": _arrow_bytes(path) / 1e6 / t, "rec_per_s": len(store) / t, **mem}


def case_hf_iter(path: str, fmt: str) -> dict[str, object]:
    import datasets

    with watch(0.005) as mem, section("pass"):
        ds = datasets.load_from_disk(path)
        n = 0
        for batch in ds.with_format(fmt).iter(batch_size=BATCH):
            n += len(batch["label"])
    t = section_time("pass")
    return {"records": n, "MB_per_s": _arrow_bytes(path) / 1e6 / t, "rec_per_s": n / t, **mem}


def run(quick: bool, repeats: int) -> None:
    """One table, both sizes (bench/interop.py calls this)."""
    n_full = QUICK_HF_N if quick else HF_N
    cases = []
    for n in (n_full // 4, n_full):
        path = str(ensure_hf(n))
        g = f"hf N={n:.0e}"
        cases.append(Case("seqstore import_hf", "bench._interop_hf:case_import_hf",
                          {"path": path, "out": str(DATA / "interop" / f"hf-{n}.seqstore")}, group=g,
                          metric="MB_per_s"))
        for fmt in ("numpy", "arrow"):
            cases.append(Case(f"datasets iter ({fmt})", "bench._interop_hf:case_hf_iter", {"path": path, "fmt": fmt},
                              group=g, metric="MB_per_s"))
    res = run_cases("interop_hf", cases, repeats=repeats, baseline="datasets iter (numpy)")
    print_table(res, extras=["records", "MB_per_s", "rec_per_s", "peak_private_MB"])


def main() -> None:
    args = main_args(__doc__.splitlines()[0], default_repeats=3)
    t0 = time.perf_counter()
    run(args.quick, args.repeats)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
