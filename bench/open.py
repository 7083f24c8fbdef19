"""Open cost vs N: seqstore vs RETURNN HDFDataset vs a LogIX-style JSON metadata log.

Records are small (1-4 frames of 4 float32, string ids) so that N = 1e7 fits on disk; the datasets
are generated once under bench/data/open/ and the timed part is only the open. Sections per case,
each measured in a fresh process (warm page cache: the files were read or written before):

- seqstore: ``open`` = ``seqstore.open(path)``; ``first_record`` = ``store[0]`` copied out.
- hdf (RETURNN): ``open`` = ``HDFDataset(files=[path])`` (reads all seqLengths, int64 cumsum);
  ``init_seq_order`` = ``init_seq_order(epoch=1)`` (default order); ``first_record`` =
  ``load_seqs(0, 1)`` + ``get_data(0, "data")``.
- logix: ``open`` = ``json.load`` of the metadata + a Python loop building
  ``data_id -> (offset, shape)`` (what LogIX's reader does); ``first_record`` = ``np.memmap`` of
  the chunk file and a copy of record 0.

``total`` is open through first record. LogIX is skipped at N = 1e7 (its metadata would take about
1.5 GB of JSON and several GiB of RAM per process; see the 1e6 row and the reference's numbers).

Usage: ``python bench/open.py [--quick] [--repeats R]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as ``python bench/x.py`` Python puts bench/ first on sys.path, where files like logging.py
# would shadow the standard library: put the repository root there instead.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.harness import Case, lookup, main_args, print_table, run_cases, section  # noqa: E402

NS = (1_000, 100_000, 1_000_000, 10_000_000)
QUICK_NS = (1_000, 100_000)
LOGIX_MAX_N = 1_000_000


def case_seqstore(path: str) -> dict[str, object]:
    import numpy as np

    import seqstore

    with section("open"):
        store = seqstore.open(path)
    with section("first_record"):
        x = np.array(store[0]["x"])
    return {"records": len(store), "check": float(x.sum())}


def case_hdf(path: str) -> dict[str, object]:
    import h5py  # noqa: F401 - HDFDataset imports it on first open; keep imports out of the timing
    import numpy as np
    from returnn.datasets.hdf import HDFDataset

    with section("open"):
        ds = HDFDataset(files=[path])
    with section("init_seq_order"):
        ds.init_seq_order(epoch=1)
    with section("first_record"):
        ds.load_seqs(0, 1)
        x = np.array(ds.get_data(0, "data"))
    return {"records": ds.num_seqs, "check": float(x.sum())}


def case_logix(path: str) -> dict[str, object]:
    import json

    import numpy as np

    root = Path(path)
    with section("open"):
        with open(root / "log_rank_0_chunk_0_metadata.json") as fh:
            metadata = json.load(fh)
        index: dict[str, tuple[int, int, list[list[int]]]] = {}
        for entry in metadata:
            data_id = entry["data_id"]
            if data_id not in index:  # the first occurrence wins, as in LogIX
                index[data_id] = (0, entry["offset"], entry["shape"])
        del metadata
    with section("first_record"):
        mm = np.memmap(root / "log_rank_0_chunk_0.mmap", dtype=np.float32, mode="r")
        _chunk, offset, shape = index["seq-000000000"]
        count = int(np.prod(shape[0]))
        x = np.array(mm[offset // 4 : offset // 4 + count]).reshape(shape[0])
    return {"records": len(index), "check": float(x.sum())}


def main() -> None:
    args = main_args(__doc__.splitlines()[0])
    from bench.gen_data import ensure

    ns = QUICK_NS if args.quick else NS
    cases = []
    for n in ns:
        systems = ("seqstore", "hdf", "logix") if n <= LOGIX_MAX_N else ("seqstore", "hdf")
        print(f"preparing N={n:.0e} ...", file=sys.stderr, flush=True)
        paths = ensure("open", n, systems)
        group = f"N={n:.0e}"
        cases.append(Case("seqstore", "bench.open:case_seqstore", {"path": str(paths["seqstore"])}, group))
        cases.append(Case("returnn_hdf", "bench.open:case_hdf", {"path": str(paths["hdf"])}, group))
        if "logix" in paths:
            reps = 2 if n >= 1_000_000 else None
            kw = {"path": str(paths["logix"])}
            cases.append(Case("logix_json", "bench.open:case_logix", kw, group, repeats=reps))
    name = "open_quick" if args.quick else "open"
    results = run_cases(name, cases, baseline="seqstore", repeats=args.repeats, meta={"ns": list(ns)})
    print_table(results, sections=("open", "total"), extras=[])
    small, big = f"N={ns[0]:.0e}", f"N={ns[-1]:.0e}"
    for sec in ("open", "total"):
        a, b = lookup(results, "seqstore", small, sec), lookup(results, "seqstore", big, sec)
        print(
            f"seqstore {sec}: {big} / {small} time ratio {b['time_s'] / a['time_s']:.2f}x; "
            f"{big}: {b['time_s'] * 1e3:.3f} ms, RSS {b['rss_growth'] / 2**20:+.2f} MiB, "
            f"peak {b['peak_growth'] / 2**20:+.2f} MiB"
        )


if __name__ == "__main__":
    main()
