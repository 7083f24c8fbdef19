"""RETURNN interop: HDF import throughput vs RETURNN's own reading, and StoreDataset vs HDFDataset open.

Three parts, every case in a fresh process (bench/harness.py), warm page cache:

1. **import** (N = 1e6 sequences; ``--quick``: 1e5): a RETURNN HDF file in SimpleHDFWriter's layout,
   dense float32 ``inputs`` of dim 8 (1..30 frames) plus sparse int32 ``targets/data/classes``
   (0..10 labels), written once in bulk under bench/data/interop/.
   - ``seqstore import_hdf``: ``seqstore.interop.returnn.import_hdf(file, store)``, the whole file;
     extras ``MB_per_s`` (rows of all streams) and ``seq_per_s``.
   - ``returnn HDFDataset read``: RETURNN's own reader on the same file: ``HDFDataset(files=[f])``,
     ``init_seq_order(1)``, then ``load_seqs``/``get_data("data")``/``get_data("classes")``/``get_tag``
     for the first ``READ_SEQS`` sequences (a full pass over 1e6 takes minutes per run on this box;
     its rate is flat in the position, so the throughput of the first 2e5 stands for the whole).
2. **open** (N = 1e6 and 1e7; ``--quick``: 1e5): the small-record HDF files of bench/open.py (1-4
   frames of 4 float32, string tags) and stores imported from them. ``open`` = constructor +
   ``initialize()``; ``init_seq_order`` = ``init_seq_order(epoch=1)`` with ``seq_ordering`` default or
   ``laplace:.1000`` (StoreDataset's lengths cache is written in setup, as the first process of a job
   would); ``first_record`` = ``get_data(0, "data")``. The ratio column compares with HDFDataset.

3. **Grain** (bench/_interop_grain.py, also runnable alone): ``seqstore.grain.DataSource`` against a
   hand-written NumPy-memmap Grain data source, record by record and in a Grain ``DataLoader`` with 2
   workers.
4. **megatron / webdataset** imports vs ``IndexedDataset`` reads and ``WebDataset`` iteration: see
   bench/_interop_megawds.py (runnable by itself).
5. **lhotse** import (features) vs iterating the ``CutSet`` with ``load_features``: see
   bench/_interop_lhotse.py (runnable by itself).
6. **hf**: the Hugging Face ``datasets`` import vs ``datasets``' own iteration of the same saved dataset:
   see bench/_interop_hf.py (runnable by itself).

Usage: ``python bench/interop.py [--quick] [--repeats R] [--skip-1e7]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.harness import DATA, Case, main_args, print_table, run_cases, section, section_time  # noqa: E402

IMPORT_N = 1_000_000
QUICK_IMPORT_N = 100_000
READ_SEQS = 200_000
OPEN_NS = (1_000_000, 10_000_000)
QUICK_OPEN_NS = (100_000,)
ORDERINGS = ("default", "laplace:.1000")


# ------------------------------------------------------------------------------------------ data


def build_import_hdf(path: Path, n: int, dim: int = 8, seed: int = 0) -> None:
    """A RETURNN HDF file (SimpleHDFWriter's layout) written in bulk, in chunks of 1e5 sequences."""
    import h5py

    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 31, n).astype(np.int32)
    clens = rng.integers(0, 11, n).astype(np.int32)
    tmp = path.with_name(path.name + ".tmp")
    with h5py.File(tmp, "w") as f:
        f.attrs.update({"numTimesteps": int(lens.sum()), "inputPattSize": dim, "numDims": 1, "numLabels": dim,
                        "numSeqs": n})
        f.create_dataset("labels", (0,), dtype="S5")
        f.create_dataset("seqLengths", data=np.stack([lens, clens], axis=1))
        tags = f.create_dataset("seqTags", (n,), dtype=h5py.string_dtype())
        inputs = f.create_dataset("inputs", (int(lens.sum()), dim), dtype="float32")
        classes = f.create_group("targets/data").create_dataset("classes", (int(clens.sum()),), dtype="int32")
        f.create_group("targets/size").attrs["classes"] = [100, 1]
        f.create_group("targets/labels").create_dataset("classes", data=np.array([b"dummy-label"]))
        r = c = 0
        for a in range(0, n, 100_000):
            b = min(a + 100_000, n)
            rows, crow = int(lens[a:b].sum()), int(clens[a:b].sum())
            inputs[r : r + rows] = rng.standard_normal((rows, dim), dtype=np.float32)
            classes[c : c + crow] = rng.integers(0, 100, crow, dtype=np.int32)
            tags[a:b] = np.array([f"corpus/rec{i:09d}/1" for i in range(a, b)], dtype=object)
            r, c = r + rows, c + crow
    tmp.rename(path)


def ensure_import(n: int) -> Path:
    path = DATA / "interop" / f"returnn-import-{n}.hdf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        build_import_hdf(path, n)
    return path


def ensure_open(n: int) -> tuple[Path, Path]:
    """bench/open.py's small-record HDF of n sequences, and a store imported from it (plus its lengths cache)."""
    from bench.gen_data import ensure
    from seqstore.interop.returnn import StoreDataset, import_hdf

    hdf = ensure("open", n, systems=("hdf",))["hdf"]
    store = DATA / "interop" / f"open-{n}.seqstore"
    done = store.with_name(store.name + ".done")
    if not done.exists():
        store.parent.mkdir(parents=True, exist_ok=True)
        import_hdf(hdf, store, overwrite=True)
        ds = StoreDataset(path=str(store), seq_ordering="laplace:.1000")
        ds.init_seq_order(epoch=1)  # warms numba and the store; laplace keeps no lengths cache
        done.touch()
    return hdf, store


# ----------------------------------------------------------------------------------------- cases


def case_import(hdf: str, out: str) -> dict[str, object]:
    from seqstore.interop.returnn import import_hdf, inspect_hdf

    info = inspect_hdf(hdf, check_lengths=False)
    with section("import"):
        store = import_hdf(hdf, out, overwrite=True)
    t = section_time("import")
    return {"seqs": len(store), "MB_per_s": info.total_bytes / 1e6 / t, "seq_per_s": len(store) / t}


def case_returnn_read(hdf: str, seqs: int) -> dict[str, object]:
    import h5py  # noqa: F401
    from returnn.datasets.hdf import HDFDataset

    with section("read"):
        ds = HDFDataset(files=[hdf])
        ds.init_seq_order(epoch=1)
        nbytes = 0
        for i in range(min(seqs, ds.num_seqs)):
            ds.load_seqs(i, i + 1)
            nbytes += ds.get_data(i, "data").nbytes + ds.get_data(i, "classes").nbytes
            ds.get_tag(i)
    t = section_time("read")
    return {"seqs": seqs, "MB_per_s": nbytes / 1e6 / t, "seq_per_s": seqs / t}


def case_hdfdataset(path: str, ordering: str) -> dict[str, object]:
    import h5py  # noqa: F401
    from returnn.datasets.hdf import HDFDataset

    with section("open"):
        ds = HDFDataset(files=[path], seq_ordering=ordering)
        ds.initialize()
    with section("init_seq_order"):
        ds.init_seq_order(epoch=1)
    with section("first_record"):
        ds.load_seqs(0, 1)
        x = np.array(ds.get_data(0, "data"))
    return {"records": ds.num_seqs, "check": float(x.sum())}


def case_storedataset(path: str, ordering: str) -> dict[str, object]:
    from seqstore.interop.returnn import StoreDataset

    with section("open"):
        ds = StoreDataset(path=path, seq_ordering=ordering)
        ds.initialize()
    with section("init_seq_order"):
        ds.init_seq_order(epoch=1)
    with section("first_record"):
        ds.load_seqs(0, 1)
        x = np.array(ds.get_data(0, "data"))
    return {"records": ds.num_seqs, "check": float(x.sum())}


def main() -> None:
    args = main_args(__doc__.splitlines()[0], default_repeats=3, extra_flags=("--skip-1e7",))
    n_imp = QUICK_IMPORT_N if args.quick else IMPORT_N
    hdf = ensure_import(n_imp)
    out = DATA / "interop" / f"imported-{n_imp}.seqstore"
    group = f"N={n_imp:.0e}"
    cases = [
        Case("seqstore import_hdf", "bench.interop:case_import", {"hdf": str(hdf), "out": str(out)}, group=group),
        Case("returnn HDFDataset read", "bench.interop:case_returnn_read",
             {"hdf": str(hdf), "seqs": min(READ_SEQS, n_imp)}, group=group, repeats=min(args.repeats, 2)),
    ]
    res = run_cases("interop_import", cases, repeats=args.repeats, baseline="returnn HDFDataset read")
    print_table(res, extras=["seqs", "MB_per_s", "seq_per_s"])

    ns = QUICK_OPEN_NS if args.quick else tuple(n for n in OPEN_NS if not (args.skip_1e7 and n >= 10**7))
    cases = []
    for n in ns:
        h, s = ensure_open(n)
        for ordering in ORDERINGS:
            g = f"N={n:.0e} {ordering}"
            reps = 1 if n >= 10**7 and ordering != "default" else None
            cases.append(Case("HDFDataset", "bench.interop:case_hdfdataset", {"path": str(h), "ordering": ordering},
                              group=g, repeats=reps))
            cases.append(Case("StoreDataset", "bench.interop:case_storedataset",
                              {"path": str(s), "ordering": ordering}, group=g))
    res = run_cases("interop_open", cases, repeats=args.repeats, baseline="HDFDataset")
    print_table(res, sections=["open", "init_seq_order", "first_record", "total"], extras=["records"])

    # Grain (JAX): random access through seqstore.grain.DataSource vs a NumPy-memmap source (bench/_interop_grain.py)
    from bench._interop_grain import run_grain

    run_grain(args.quick, args.repeats)

    from bench import _interop_megawds  # Megatron and WebDataset imports vs their packages' reads

    _interop_megawds.run(args.quick, args.repeats)

    from bench import _interop_lhotse  # Lhotse import vs iterating the CutSet with load_features

    _interop_lhotse.run(args.quick, args.repeats)
    from bench import _interop_hf  # Hugging Face datasets import vs datasets' own iteration

    _interop_hf.run(args.quick, args.repeats)


if __name__ == "__main__":
    main()
