"""CombinedDataset epoch order: seqstore vs RETURNN CombinedDataset (``sampling_sizes`` + ``laplace:.1000``).

Ten children; per epoch ``K`` sequences are sampled from each (RETURNN's sampling windows), and the
union is ordered with ``laplace:.1000`` (lengths gathered from the children). Children are cheap
virtual datasets whose length is a hash of the index (``20 + (i * golden) >> 54``, 20..1043 frames), so
no data files are involved and both systems see the same lengths:

- seqstore: ``LengthsDataset(FuncLengths(N, f))`` children; ``build`` = ``CombinedDataset(...).epoch_order(2)``;
  ``walk`` = ``iter_chunks`` over the whole order (every index computed). Children are ``default``
  ordered in the groups RETURNN runs in (same semantics) and ``random`` ordered at N = 1e8.
- RETURNN: ``CombinedDataset`` of ``DummyDataset`` children whose ``get_estimated_seq_length`` returns the
  same lengths; ``build`` = ``init_seq_order(epoch=2)`` (it materialises the order as a Python list of
  (dataset, index) tuples); ``walk`` = a pass over that list.

Groups: ``union=1e5`` (children of 1e5, K = 1e4) and ``union=1e6`` (children of 1e6, K = 1e5) for both;
``union=1e7, N=1e8`` (children of 1e8, K = 1e6, the issue's target) for seqstore only: RETURNN needs
about 5 s per 5e5 union sequences (about 100 s and several GB for 1e7; see docs/datasets.md).
``total`` (build + walk) is the headline. Before the measured part each seqstore case runs a tiny
combined order so numba's cached machine code is loaded (as RETURNN's imports happen before its timing).

Usage: ``python bench/combined.py [--quick] [--repeats R]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Case, main_args, print_table, run_cases, section  # noqa: E402

CHILDREN = 10
GOLDEN = 0x9E3779B97F4A7C15


def _np_lengths(i):  # type: ignore[no-untyped-def]
    import numpy as np

    return ((i.astype(np.uint64) * np.uint64(GOLDEN)) >> np.uint64(54)).astype(np.int64) + 20


def case_seqstore(n: int, k: int, child_ordering: str = "default") -> dict[str, object]:
    from seqstore.data import CombinedDataset, FuncLengths, LengthsDataset

    def make(n_: int, k_: int) -> CombinedDataset:
        kids = {f"c{c}": LengthsDataset(FuncLengths(n_, _np_lengths), ordering=child_ordering, seed=c)
                for c in range(CHILDREN)}
        return CombinedDataset(kids, sampling_sizes={name: k_ for name in kids}, ordering="laplace:.1000")

    for _ in make(5000, 500).epoch_order(1).iter_chunks():  # load numba's cached code
        pass
    ds = make(n, k)
    with section("build"):
        order = ds.epoch_order(2)
    total = 0
    count = 0
    with section("walk"):
        for chunk in order.iter_chunks(1 << 18):
            total += int(chunk[:16].sum())
            count += len(chunk)
    return {"union": count, "check": total}


def case_returnn(n: int, k: int) -> dict[str, object]:
    from returnn.datasets.generating import DummyDataset
    from returnn.datasets.meta import CombinedDataset

    class LenDummy(DummyDataset):  # type: ignore[misc]
        def get_estimated_seq_length(self, seq_idx: int) -> int:
            return 20 + ((((int(seq_idx) * GOLDEN) & ((1 << 64) - 1))) >> 54)

    kids = {f"c{c}": LenDummy(input_dim=2, output_dim=3, num_seqs=n, seq_len=10) for c in range(CHILDREN)}
    ds = CombinedDataset(datasets=kids, data_map={(name, "data"): "data" for name in kids},
                         sampling_sizes={name: k for name in kids}, seq_ordering="laplace:.1000")
    with section("build"):
        ds.init_seq_order(epoch=2)
    count = 0
    with section("walk"):
        for _dataset_idx, _seq_idx in ds.dataset_sorted_seq_idx_list:
            count += 1
    return {"union": count, "check": 0}


def main() -> None:
    args = main_args(__doc__.splitlines()[0])
    cases = []
    groups = [(10**4, 10**3)] if args.quick else [(10**5, 10**4), (10**6, 10**5)]
    for n, k in groups:
        g = f"union={CHILDREN * k:.0e}"
        cases.append(Case("seqstore", "bench.combined:case_seqstore", {"n": n, "k": k}, group=g))
        cases.append(Case("returnn", "bench.combined:case_returnn", {"n": n, "k": k}, group=g,
                          repeats=min(args.repeats, 3), timeout=1200))
    big_n, big_k = (10**6, 10**5) if args.quick else (10**8, 10**6)
    cases.append(Case("seqstore", "bench.combined:case_seqstore",
                      {"n": big_n, "k": big_k, "child_ordering": "random"},
                      group=f"union={CHILDREN * big_k:.0e}, N={big_n:.0e}, random children"))
    results = run_cases("combined_quick" if args.quick else "combined", cases, baseline="returnn",
                        repeats=args.repeats)
    print_table(results, sections=["build", "walk", "total"])


if __name__ == "__main__":
    main()
