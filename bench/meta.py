"""MetaDataset id join: seqstore (first time and cached) vs RETURNN MetaDataset.

Two datasets of N small records describe the same sequences: ``a`` has ids ``seq-000000000`` ... in
order, ``b`` the same ids in a random permutation (different data). Both layouts are generated once
under bench/data/meta/ (seqstore stores and RETURNN HDF files, see bench/gen_data.py).

- ``seqstore_first``: ``MetaDataset({"a": ..., "b": ...})`` with an empty cache directory: the
  vectorised hash join over the raw id files, written as a ``.npy`` row map.
- ``seqstore_cached``: the same call when the row map exists (it is memory-mapped).
- ``returnn``: ``MetaDataset`` over two ``HDFDataset`` instances with ``seq_order_control_dataset="a"``;
  measured: construction + ``init_seq_order(epoch=1)`` (where it looks up every tag of ``a`` in ``b``).

RETURNN is run at N = 1e5 (the design notes measured 52 s at 1e6 on this kind of machine); seqstore
at 1e5 and 1e6. ``--quick``: N = 1e4 only.

Usage: ``python bench/meta.py [--quick] [--repeats R]``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Case, main_args, print_table, run_cases, section  # noqa: E402

RETURNN_MAX_N = 100_000


def _shuffled(n: int) -> Iterator[tuple[Any, Any, list[str]]]:
    import numpy as np

    from bench.gen_data import small_records

    perm = np.random.default_rng(12345).permutation(n)
    pos = 0
    for values, lengths, _ids in small_records(n, seed=1):
        k = len(lengths)
        yield values, lengths, [f"seq-{i:09d}" for i in perm[pos : pos + k].tolist()]
        pos += k


def ensure_pair(n: int, hdf: bool) -> dict[str, Path]:
    """Paths of the (a, b) stores and, with ``hdf``, HDF files; built once."""
    from bench.gen_data import _done, _fresh, build_hdf, build_seqstore, ensure, hdf_path, seqstore_path

    systems = ("seqstore", "hdf") if hdf else ("seqstore",)
    a = ensure("meta", n, systems)
    out = {"a": a["seqstore"], "b": seqstore_path("meta-shuffled", n)}
    if _fresh(out["b"]):
        build_seqstore(out["b"], _shuffled(n), 4, "float32")
    _done(out["b"]).touch()
    if hdf:
        out["a_hdf"] = a["hdf"]
        out["b_hdf"] = hdf_path("meta-shuffled", n)
        if _fresh(out["b_hdf"]):
            build_hdf(out["b_hdf"], _shuffled(n), n, 4, "float32")
        _done(out["b_hdf"]).touch()
    return out


def _warm_numba(tmp: Path) -> None:
    """Join two 3-record stores so numba's cached machine code is loaded before the timing."""
    import numpy as np

    import seqstore
    from seqstore.data import MetaDataset, StoreDataset

    for name in ("w1", "w2"):
        with seqstore.create(tmp / name, {"y": seqstore.Field("int8")}) as w:
            w.append_batch({"y": np.zeros(3, np.int8)}, ids=["a", "b", "c"])
    MetaDataset({"a": StoreDataset(tmp / "w1"), "b": StoreDataset(tmp / "w2", fields=[])}, cache_dir=tmp / "c")


def case_seqstore(a: str, b: str, cached: bool) -> dict[str, object]:
    import numpy as np

    from seqstore.data import MetaDataset, StoreDataset

    da, db = StoreDataset(a), StoreDataset(b)
    cache = Path(tempfile.mkdtemp(prefix="seqstore-meta-bench-"))
    fields = {"b": {"x": "b_x"}}
    try:
        _warm_numba(cache)
        if cached:
            MetaDataset({"a": da, "b": db}, fields=fields, cache_dir=cache)
        with section("join"):
            meta = MetaDataset({"a": da, "b": db}, fields=fields, cache_dir=cache)
        rows = meta.rows("b", np.array([0, len(da) - 1]))
        return {"n": meta.num_seqs, "check": int(rows.sum())}
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def case_returnn(a_hdf: str, b_hdf: str) -> dict[str, object]:
    import h5py  # noqa: F401
    from returnn.datasets.hdf import HDFDataset
    from returnn.datasets.meta import MetaDataset

    with section("join"):
        ds = MetaDataset(
            datasets={"a": HDFDataset(files=[a_hdf]), "b": HDFDataset(files=[b_hdf])},
            data_map={"data": ("a", "data"), "b_data": ("b", "data")},
            seq_order_control_dataset="a",
        )
        ds.init_seq_order(epoch=1)
    return {"n": ds.num_seqs, "check": 0}


def main() -> None:
    args = main_args(__doc__.splitlines()[0])
    ns = (10_000,) if args.quick else (100_000, 1_000_000)
    cases = []
    for n in ns:
        hdf = n <= RETURNN_MAX_N
        paths = ensure_pair(n, hdf)
        g = f"N={n:.0e}"
        cases.append(Case("seqstore_first", "bench.meta:case_seqstore",
                          {"a": str(paths["a"]), "b": str(paths["b"]), "cached": False}, group=g))
        cases.append(Case("seqstore_cached", "bench.meta:case_seqstore",
                          {"a": str(paths["a"]), "b": str(paths["b"]), "cached": True}, group=g))
        if hdf:
            cases.append(Case("returnn", "bench.meta:case_returnn",
                              {"a_hdf": str(paths["a_hdf"]), "b_hdf": str(paths["b_hdf"])}, group=g,
                              repeats=min(args.repeats, 3), timeout=1800))
    results = run_cases("meta_quick" if args.quick else "meta", cases, baseline="returnn", repeats=args.repeats)
    print_table(results)


if __name__ == "__main__":
    main()
