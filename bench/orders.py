"""Epoch orders: seqstore's lazy orders vs numpy, RETURNN, torch DistributedSampler and Grain.

Every case runs in a fresh process (bench/harness.py); imports and warm-up are not timed. Groups:

- ``N=1e6`` .. ``N=1e8`` (and ``N=1e9``, ``N=1e10`` for the O(1) ones): a ``random`` epoch order.
  ``first_index`` = build the order and read its first index: seqstore ``seq_order(N, "random")[0]``;
  numpy ``default_rng().permutation(N)[0]``; RETURNN ``Dataset.get_seq_order_for_epoch(1, N)[0]``;
  torch ``next(iter(DistributedSampler(range(N), num_replicas=8, rank=0)))``; Grain
  ``index_shuffle(0, max_index=N-1, seed, rounds=4)``. ``walk`` (seqstore, Grain) = read the next
  1e7 (seqstore, in chunks of 65536) or 1e5 (Grain, one Python call per index) indices.
  ``indices_per_s`` = indices produced / time (for the materialising peers: N, or N/8 for the torch
  rank, divided by the ``first_index`` time). seqstore's numba kernels are loaded in the warm-up; the
  one-off cost of that in a fresh process is reported as ``jit_load_s``.
- ``take``: ``order.take(positions)`` for 1e7 positions of a ``random`` order over N = 1e10 vs
  ``numpy.random.default_rng().permutation(1e7)``.
- ``laplace``: one sub-epoch of ``laplace:.1000`` with ``partition_epoch=100`` over N = 1e7 and 1e8
  with memory-mapped int32 lengths (seqstore: construction + reading all 1e6 indices in chunks);
  RETURNN ``get_seq_order_for_epoch`` with the lengths as an in-memory array (its fast path).
  ``rss_anon_mib`` = growth of private (anonymous) RSS; the harness' RSS columns also count the pages
  of the shared, memory-mapped lengths file that the sub-epoch touched (page cache, shared by every
  process, reclaimable).

Usage: ``python bench/orders.py [--quick] [--repeats R] [--no-returnn-1e8]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (  # noqa: E402
    DATA,
    Case,
    lookup,
    machine_line,
    print_table,
    rss_anon,
    run_cases,
    section,
    section_time,
)

PEER_NS = (10**6, 10**7, 10**8)
O1_NS = (10**9, 10**10)
QUICK_PEER_NS = (10**6,)
QUICK_O1_NS = (10**10,)
WALK = 10**7
GRAIN_WALK = 10**5
TAKE = 10**7


# ------------------------------------------------------------------------------------------ cases


def case_seqstore_random(n: int, walk: int) -> dict[str, Any]:
    import time

    t0 = time.perf_counter()
    from seqstore.order import seq_order

    seq_order(10, "random", epoch=1)[0]  # load the numba kernels (cached machine code)
    for _ in seq_order(10, "random", epoch=1).iter_chunks(4):
        pass
    jit = time.perf_counter() - t0
    with section("first_index"):
        order = seq_order(n, "random", epoch=3, seed=1)
        first = order[0]
    count = min(walk, n)
    anon0 = rss_anon()
    with section("walk"):
        total = 0
        for chunk in order[:count].iter_chunks(1 << 16):
            total += int(chunk[-1])
    return {
        "indices_per_s": count / section_time("walk"),
        "walked": count,
        "rss_anon_mib": (rss_anon() - anon0) / 2**20,
        "jit_load_s": jit,
        "check": first + total % 7,
    }


def case_numpy_permutation(n: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(1)
    with section("first_index"):
        perm = rng.permutation(n)
        first = int(perm[0])
    return {"indices_per_s": n / section_time("first_index"), "check": first}


def case_returnn_random(n: int) -> dict[str, Any]:
    from returnn.datasets.basic import Dataset

    ds = Dataset(seq_ordering="random", random_seed_offset=0)
    with section("first_index"):
        order = ds.get_seq_order_for_epoch(1, n)
        first = int(order[0])
    return {"indices_per_s": n / section_time("first_index"), "check": first}


def case_torch_sampler(n: int) -> dict[str, Any]:
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(range(n), num_replicas=8, rank=0, shuffle=True, seed=1)  # type: ignore[arg-type]
    sampler.set_epoch(3)
    with section("first_index"):
        first = next(iter(sampler))
    return {"indices_per_s": (n // 8) / section_time("first_index"), "check": int(first)}


def case_grain_index_shuffle(n: int, walk: int) -> dict[str, Any]:
    from grain._src.python.experimental.index_shuffle.python import index_shuffle_module as grain_shuffle

    shuffle = grain_shuffle.index_shuffle
    shuffle(0, max_index=9, seed=0, rounds=4)
    with section("first_index"):
        first = shuffle(0, max_index=n - 1, seed=1, rounds=4)
    count = min(walk, n)
    with section("walk"):
        total = 0
        for i in range(count):
            total += shuffle(i, max_index=n - 1, seed=1, rounds=4)
    return {"indices_per_s": count / section_time("walk"), "walked": count, "check": first + total % 7}


def case_seqstore_take(n: int, count: int) -> dict[str, Any]:
    import numpy as np

    from seqstore.order import seq_order

    order = seq_order(n, "random", epoch=1)
    order.take(np.arange(10))
    positions = np.arange(count, dtype=np.int64)
    with section("take"):
        values = order.take(positions)
    return {"indices_per_s": count / section_time("take"), "check": int(values[-1])}


def case_numpy_take(count: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(2)
    with section("take"):
        values = rng.permutation(count)
    return {"indices_per_s": count / section_time("take"), "check": int(values[-1])}


def _lengths_file(n: int) -> Path:
    """int32 lengths in [1, 1000], generated once in chunks under bench/data/orders/."""
    import numpy as np

    path = DATA / "orders" / f"lengths_{n:.0e}.npy"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int32, shape=(n,))
    rng = np.random.default_rng(n)
    step = 1 << 22
    for s in range(0, n, step):
        out[s : s + step] = rng.integers(1, 1001, size=min(step, n - s), dtype=np.int32)
    out.flush()
    del out
    with open(tmp, "rb+") as f:  # write back now: pages under writeback would stall the timed reads
        os.fsync(f.fileno())
    tmp.rename(path)
    return path


def case_seqstore_laplace(path: str, epoch: int) -> dict[str, Any]:
    import numpy as np

    from seqstore.order import seq_order

    lengths = np.load(path, mmap_mode="r")
    n = int(lengths.shape[0])
    warm = seq_order(1000, "laplace:.10", epoch=1, lengths=np.asarray(lengths[:1000]))
    for _ in warm.iter_chunks(100):
        pass
    anon0 = rss_anon()
    with section("sub_epoch"):
        order = seq_order(n, "laplace:.1000", epoch=epoch, lengths=lengths, partition_epoch=100)
        count = 0
        check = 0
        for chunk in order.iter_chunks(1 << 16):
            count += chunk.shape[0]
            check ^= int(chunk[0])
    return {"seqs": count, "rss_anon_mib": (rss_anon() - anon0) / 2**20, "check": check}


def case_returnn_laplace(path: str, epoch: int) -> dict[str, Any]:
    import numpy as np
    from returnn.datasets.basic import Dataset

    lengths = np.array(np.load(path, mmap_mode="r"))  # in memory: RETURNN's fast path for arrays
    n = int(lengths.shape[0])
    ds = Dataset(seq_ordering="laplace:.1000", partition_epoch=100, random_seed_offset=0)
    anon0 = rss_anon()
    with section("sub_epoch"):
        order = ds.get_seq_order_for_epoch(epoch, n, get_seq_len=lengths.__getitem__)
        count = len(order)
        check = int(order[0])
    return {"seqs": count, "rss_anon_mib": (rss_anon() - anon0) / 2**20, "check": check}


# ------------------------------------------------------------------------------------------- main


def _have(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (smoke run)")
    p.add_argument("--repeats", type=int, default=None, help="runs per case (default 3, quick 1)")
    p.add_argument("--no-returnn-1e8", action="store_true", help="skip RETURNN laplace at N=1e8 (~30 s, GBs)")
    args = p.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    peer_ns = QUICK_PEER_NS if args.quick else PEER_NS
    o1_ns = QUICK_O1_NS if args.quick else O1_NS
    have_torch = _have("torch")
    have_grain = _have("grain")
    skipped = []
    if not have_torch:
        skipped.append("torch (not installed)")
    if not have_grain:
        skipped.append("grain (not installed: pip install grain)")

    cases: list[Case] = []
    for n in (*peer_ns, *o1_ns):
        group = f"N={n:.0e}"
        heavy = 2 if n >= 10**8 else None
        cases.append(Case("seqstore", "bench.orders:case_seqstore_random", {"n": n, "walk": WALK}, group))
        if n in peer_ns:
            cases.append(
                Case("numpy_permutation", "bench.orders:case_numpy_permutation", {"n": n}, group, repeats=heavy)
            )
            cases.append(Case("returnn_random", "bench.orders:case_returnn_random", {"n": n}, group, repeats=heavy))
            if have_torch:
                cases.append(Case("torch_sampler", "bench.orders:case_torch_sampler", {"n": n}, group, repeats=heavy))
        if have_grain:
            cases.append(
                Case(
                    "grain_index_shuffle", "bench.orders:case_grain_index_shuffle", {"n": n, "walk": GRAIN_WALK}, group
                )
            )
    take_n = 10**10
    cases.append(Case("seqstore", "bench.orders:case_seqstore_take", {"n": take_n, "count": TAKE}, "take"))
    cases.append(Case("numpy_permutation", "bench.orders:case_numpy_take", {"count": TAKE}, "take"))
    laplace_ns = (10**6,) if args.quick else (10**7, 10**8)
    for n in laplace_ns:
        group = f"laplace N={n:.0e}"
        path = str(_lengths_file(n))
        cases.append(Case("seqstore", "bench.orders:case_seqstore_laplace", {"path": path, "epoch": 1}, group))
        if n < 10**8 or not args.no_returnn_1e8:
            cases.append(
                Case(
                    "returnn",
                    "bench.orders:case_returnn_laplace",
                    {"path": path, "epoch": 1},
                    group,
                    repeats=1 if n >= 10**8 else None,
                )
            )

    name = "orders_quick" if args.quick else "orders"
    results = run_cases(
        name,
        cases,
        baseline="seqstore",
        repeats=repeats,
        meta={"peer_ns": list(peer_ns), "o1_ns": list(o1_ns), "skipped": skipped},
    )
    print_table(
        results,
        sections=("first_index", "walk", "take", "sub_epoch"),
        extras=["indices_per_s", "rss_anon_mib", "jit_load_s", "seqs"],
    )
    if skipped:
        print("skipped: " + ", ".join(skipped))
    # the acceptance figures
    big = f"N={o1_ns[-1]:.0e}"
    walk = lookup(results, "seqstore", big, "walk")
    print(
        f"walk {walk['walked']:.0e} indices of 'random' over {big}: {walk['time_s']:.2f} s, "
        f"RSS growth {walk['rss_growth'] / 2**20:+.2f} MiB, peak {walk['peak_growth'] / 2**20:+.2f} MiB "
        f"(target < 20 MiB)"
    )
    ours, theirs = lookup(results, "seqstore", "take"), lookup(results, "numpy_permutation", "take")
    print(
        f"take {TAKE:.0e} positions: {ours['indices_per_s'] / 1e6:.1f} M indices/s vs numpy permutation "
        f"{theirs['indices_per_s'] / 1e6:.1f} M/s ({ours['indices_per_s'] / theirs['indices_per_s']:.2f}x)"
    )
    for n in laplace_ns:
        lp = lookup(results, "seqstore", f"laplace N={n:.0e}")
        print(
            f"laplace:.1000 sub-epoch ({lp['seqs']} seqs) of N={n:.0e}, partition_epoch=100: "
            f"{lp['time_s']:.2f} s, anon RSS {lp['rss_anon_mib']:+.1f} MiB, total RSS "
            f"{lp['rss_growth'] / 2**20:+.1f} MiB (peak {lp['peak_growth'] / 2**20:+.1f} MiB, incl. mapped "
            f"lengths pages) (targets at 1e8: < 2 s, < 50 MiB)"
        )
    print(machine_line(results["machine"]))


if __name__ == "__main__":
    main()
