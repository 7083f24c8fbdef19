"""Random reads of 1000 records from a ~1e6-record store: seqstore vs h5py/RETURNN vs LogIX-style.

The data set (generated once under bench/data/reads/): N records of 1-20 frames x 16 float16
(about 340 B per record) with string ids ``"seq-%09d"``, in the three layouts of
bench/gen_data.py. Every case opens its data set (not timed), draws the same 1000 random record
indices (seed 1), makes one pass over them (section ``first_pass``: first touch of the mapped pages
in this process, and for RETURNN's by-tag lookup the tag -> index dict it builds on first use),
then times a second pass (section ``warm``, the number the targets are about). Page cache warm.

Cases (``op``):
- ``getitem``: ``store[i]`` (dict of zero-copy views) per index; ``getitem_copy``: ``np.array`` of
  the record's field too; ``get_batch``: one ``store.get_batch(indices)`` (one copy of all rows);
  ``index``: ``store.index(id)`` per id; ``index_many``: one ``store.index_many(ids)``;
  ``index_getitem``: ``store[store.index(id)]``.
- RETURNN ``HDFDataset`` (``cache_byte_size=0``, direct reads): ``get_data(i, "data")``;
  ``get_data_by_seq_tag(tag, "data")``. h5py directly: ``inputs[start[i]:start[i+1]]`` with the
  int64 start array HDFDataset keeps.
- LogIX-style: metadata dict ``data_id -> (offset, shape)`` built from the JSON (not timed), one
  ``np.memmap`` of the chunk; by index (``ids[i]`` then the dict) and by id, reading a view.

``us/op`` is the warm pass time / 1000 (per record; batched calls included); p50/p99 are per
call, for the per-record cases.

Usage: ``python bench/reads.py [--quick] [--repeats R] [--skip-slow]`` (default N = 1e6; quick
1e5). ``--skip-slow`` leaves out RETURNN's by-tag case, whose first pass takes about 3 minutes at 1e6.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

# Run as ``python bench/x.py`` Python puts bench/ first on sys.path, where files like logging.py
# would shadow the standard library: put the repository root there instead.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.harness import Case, main_args, print_table, run_cases, section  # noqa: E402

READS = 1000
DIM, MAX_LEN, DTYPE = 16, 20, "float16"


def _sample(n: int) -> tuple[Any, list[str]]:
    import numpy as np

    idx = np.random.default_rng(1).integers(0, n, size=READS)
    return idx, [f"seq-{i:09d}" for i in idx.tolist()]


def _timed_pass(fn: Any, items: Any, per_call: bool) -> list[float]:
    """Call fn on every item (or once on all); return per-call latencies in seconds."""
    if not per_call:
        fn(items)
        return []
    lat = []
    clock = time.perf_counter
    for it in items:
        t0 = clock()
        fn(it)
        lat.append(clock() - t0)
    return lat


def _make_op(system: str, op: str, path: str, n: int) -> tuple[Any, Any, bool]:
    """Set up (untimed) and return (function, items, per_call)."""
    import numpy as np

    idx, tags = _sample(n)
    ints = idx.tolist()
    if system == "seqstore":
        import seqstore

        store = seqstore.open(path)
        ops = {
            "getitem": (lambda i: store[i], ints, True),
            "getitem_copy": (lambda i: np.array(store[i]["x"]), ints, True),
            "get_batch": (lambda items: store.get_batch(items), idx, False),
            "index": (store.index, tags, True),
            "index_many": (lambda items: store.index_many(items), tags, False),
            "index_getitem": (lambda t: store[store.index(t)], tags, True),
        }
        return ops[op]
    if system == "returnn":
        import h5py  # noqa: F401
        from returnn.datasets.hdf import HDFDataset

        ds = HDFDataset(files=[path], cache_byte_size=0)
        ds.init_seq_order(epoch=1)
        ops = {
            "get_data": (lambda i: ds.get_data(i, "data"), ints, True),
            "get_data_by_seq_tag": (lambda t: ds.get_data_by_seq_tag(t, "data"), tags, True),
        }
        return ops[op]
    if system == "h5py":
        import h5py

        f = h5py.File(path, "r")
        inputs = f["inputs"]
        lengths = f["seqLengths"][:, 0]
        start = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=start[1:])
        return (lambda i: inputs[start[i] : start[i + 1]], ints, True)
    if system == "logix":
        import json

        root = Path(path)
        with open(root / "log_rank_0_chunk_0_metadata.json") as fh:
            metadata = json.load(fh)
        index: dict[str, tuple[int, list[int]]] = {}
        order: list[str] = []
        for entry in metadata:
            if entry["data_id"] not in index:
                index[entry["data_id"]] = (entry["offset"], entry["shape"][0])
                order.append(entry["data_id"])
        del metadata
        mm = np.memmap(root / "log_rank_0_chunk_0.mmap", dtype=np.uint8, mode="r")
        itemsize = np.dtype(DTYPE).itemsize

        def by_id(data_id: str) -> Any:
            off, shape = index[data_id]
            return mm[off : off + shape[0] * shape[1] * itemsize].view(DTYPE).reshape(shape)

        ops = {"by_index": (lambda i: by_id(order[i]), ints, True), "by_id": (by_id, tags, True)}
        return ops[op]
    raise ValueError(system)


def case_reads(system: str, op: str, path: str, n: int) -> dict[str, object]:
    import numpy as np

    fn, items, per_call = _make_op(system, op, path, n)
    with section("first_pass"):
        _timed_pass(fn, items, per_call)
    with section("warm"):
        lat = _timed_pass(fn, items, per_call)
    from bench.harness import section_time

    out: dict[str, object] = {"us_per_op": section_time("warm") / READS * 1e6}
    if lat:
        a = np.array(lat) * 1e6
        out["p50_us"] = float(np.percentile(a, 50))
        out["p99_us"] = float(np.percentile(a, 99))
    return out


CASES = [
    ("seqstore", "getitem"),
    ("seqstore", "getitem_copy"),
    ("seqstore", "get_batch"),
    ("seqstore", "index"),
    ("seqstore", "index_many"),
    ("seqstore", "index_getitem"),
    ("h5py", "slice"),
    ("returnn", "get_data"),
    ("returnn", "get_data_by_seq_tag"),
    ("logix", "by_index"),
    ("logix", "by_id"),
]


def main() -> None:
    args = main_args(__doc__.splitlines()[0], extra_flags=["--skip-slow"])
    from bench.gen_data import ensure

    n = 100_000 if args.quick else 1_000_000
    print(f"preparing N={n:.0e} ...", file=sys.stderr, flush=True)
    paths = ensure("reads", n, ("seqstore", "hdf", "logix"), dim=DIM, max_len=MAX_LEN, dtype=DTYPE)
    where = {"seqstore": paths["seqstore"], "h5py": paths["hdf"], "returnn": paths["hdf"], "logix": paths["logix"]}
    cases = []
    for system, op in CASES:
        if args.skip_slow and op == "get_data_by_seq_tag":
            continue
        kw = {"system": system, "op": op, "path": str(where[system]), "n": n}
        # RETURNN's tag lookup reads every tag with one h5py call each on first use: slow; run it once.
        reps = 1 if op == "get_data_by_seq_tag" else None
        cases.append(Case(f"{system}:{op}", "bench.reads:case_reads", kw, repeats=reps))
    name = "reads_quick" if args.quick else "reads"
    results = run_cases(name, cases, baseline="seqstore:getitem", repeats=args.repeats, meta={"n": n})
    print("\nwarm pass (1000 random records, after one pass):\n")
    print_table(results, sections=("warm",), extras=["us_per_op", "p50_us", "p99_us"])
    print("first pass in a fresh process (after open):\n")
    print_table(results, sections=("first_pass",), extras=[])


if __name__ == "__main__":
    main()
