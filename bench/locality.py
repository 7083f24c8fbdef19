"""Locality-aware shuffles: ``random_block:B:W`` vs ``random`` (and ``default``) at N = 1e6.

How many distinct storage blocks a reader touches, against how random the order is, and how fast it
is generated. One group per storage block size B (64 and 1024 records); in each, ``default``,
``random`` and ``random_block:B:W`` for several W. Every case runs in a fresh process
(bench/harness.py); numba's cached kernels are loaded before the timed part.

- ``walk`` (timed): the whole epoch order through ``iter_chunks(65536)``; ``indices_per_s`` = N / time.
  The 2-core box is shared, so timings drift with the load; each case therefore also times its
  ordering and ``random`` alternately, 7 rounds, and reports the best of each: ``best_indices_per_s``
  and ``speed_vs_random`` (best random time / best time of this ordering, same process, same load).
- ``blocks_per_1000``: distinct blocks of B consecutive records (``record // B``) among 1,000
  consecutive positions of the order, averaged over the N / 1000 aligned spans. 1000 / B + 1 for
  ``default``, about 1000 (for N / B >> 1000) for ``random``.
- ``rank0_of_8_rr``: the same for rank 0 of 8 taking positions 0, 8, 16, ... (what ``EpochSampler`` and
  ``IterableSeqDataset`` do), per 1,000 of its own records. A contiguous share (``seq_order(...,
  shard_index=, num_shards=)``, ``Order.shard``) keeps ``blocks_per_1000``. ``rank0_of_8_items``: the
  same when items of 256 consecutive positions are dealt round-robin (``IterableSeqDataset(batch=256)``).
- ``same_block_next``: fraction of consecutive positions whose records share a block (1 for
  ``default`` up to the block ends, about 1 / W for ``random_block``, B / N for ``random``).
- ``mean_step``: mean ``|order[i+1] - order[i]| / N`` (1/3 for a uniform random permutation, 1/N for
  ``default``). ``spearman``: rank correlation of position and record (the order is a permutation,
  so Pearson of (i, order[i])): 1 for ``default``, about 0 for both shuffles.

Usage: ``python bench/locality.py [--quick] [--repeats R]`` (quick: N = 1e5, fewer cases).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Case, lookup, machine_line, main_args, print_table, run_cases, section, section_time  # noqa: E402

N = 10**6
QUICK_N = 10**5
SPAN = 1000
ROUNDS = 7
ITEM = 256
WORLD = 8
GROUPS = {64: (1, 4, 16, 64), 1024: (1, 4, 16)}
QUICK_GROUPS = {64: (1, 16)}


def _distinct_per_span(blocks: Any, span: int) -> float:
    """Mean number of distinct values in each aligned run of ``span`` entries of ``blocks``."""
    import numpy as np

    rows = blocks[: len(blocks) // span * span].reshape(-1, span)
    s = np.sort(rows, axis=1)
    return float(((s[:, 1:] != s[:, :-1]).sum(axis=1) + 1).mean())


def _rank0_items(values: Any, item: int, world: int) -> Any:
    """Rank 0's share when items of ``item`` consecutive positions are dealt round-robin to ``world`` ranks."""
    usable = len(values) // (item * world) * (item * world)
    return values[:usable].reshape(-1, world, item)[:, 0, :].reshape(-1)


def _walk_time(order: Any) -> float:
    t0 = time.perf_counter()
    for _ in order.iter_chunks(1 << 16):
        pass
    return time.perf_counter() - t0


def case_order(n: int, ordering: str, block: int) -> dict[str, Any]:
    import numpy as np

    from seqstore.order import seq_order

    for _ in seq_order(1000, ordering, epoch=1).iter_chunks(100):  # load numba's cached code
        pass
    order = seq_order(n, ordering, epoch=1, seed=1)
    check = 0
    with section("walk"):
        for chunk in order.iter_chunks(1 << 16):
            check ^= int(chunk[-1])
    # the box is shared: time this ordering and ``random`` alternately, best of ROUNDS each
    best, best_random = math.inf, math.inf
    rnd = seq_order(n, "random", epoch=1, seed=1)
    for _ in rnd[:1000].iter_chunks(100):
        pass
    for _ in range(ROUNDS):
        best = min(best, _walk_time(order))
        best_random = min(best_random, _walk_time(rnd))
    vals = order.to_numpy(np.int64)
    blocks = vals // block
    pos = np.arange(n, dtype=np.float64)
    return {
        "indices_per_s": n / section_time("walk"),
        "best_indices_per_s": n / best,
        "speed_vs_random": best_random / best,
        "blocks_per_1000": _distinct_per_span(blocks, SPAN),
        "rank0_of_8_rr": _distinct_per_span(blocks[::WORLD], SPAN),
        "rank0_of_8_items": _distinct_per_span(_rank0_items(blocks, ITEM, WORLD), SPAN),
        "same_block_next": float(np.mean(blocks[1:] == blocks[:-1])),
        "mean_step": float(np.abs(np.diff(vals)).mean() / n),
        "spearman": float(np.corrcoef(pos, vals.astype(np.float64))[0, 1]),
        "check": check,
    }


def main() -> None:
    args = main_args(__doc__.splitlines()[0], default_repeats=5)
    n = QUICK_N if args.quick else N
    groups = QUICK_GROUPS if args.quick else GROUPS
    cases: list[Case] = []
    for block, windows in groups.items():
        group = f"B={block}"
        specs = ["default", "random", *(f"random_block:{block}:{w}" for w in windows)]
        for spec in specs:
            kw = {"n": n, "ordering": spec, "block": block}
            cases.append(Case(spec, "bench.locality:case_order", kw, group, metric="indices_per_s"))
    name = "locality_quick" if args.quick else "locality"
    results = run_cases(name, cases, baseline="random", repeats=args.repeats, meta={"n": n, "span": SPAN})
    print_table(
        results,
        extras=[
            "indices_per_s",
            "best_indices_per_s",
            "speed_vs_random",
            "blocks_per_1000",
            "rank0_of_8_rr",
            "rank0_of_8_items",
            "same_block_next",
            "mean_step",
            "spearman",
        ],
    )
    # the compact trade-off table of docs/orders.md
    print(f"N = {n:.0e}; blocks = distinct blocks of B records per {SPAN} consecutive records of the order\n")
    print(
        "| B | ordering | window (records) | blocks / 1000 | rank 0 of 8, records round-robin "
        f"| rank 0 of 8, items of {ITEM} | same-block neighbours "
        "| mean \\|step\\| / N | Spearman | M indices/s (best of 7) | speed vs random (same process) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in results["cases"]:
        r = lookup(results, c["name"], c["group"])
        block = c["kwargs"]["block"]
        spec = c["name"]
        window = str(block * int(spec.split(":")[2])) if spec.startswith("random_block") else "-"
        print(
            f"| {block} | `{spec}` | {window} | {r['blocks_per_1000']:.1f} | {r['rank0_of_8_rr']:.1f} "
            f"| {r['rank0_of_8_items']:.1f} "
            f"| {r['same_block_next']:.3f} | {r['mean_step']:.4f} | {r['spearman']:+.4f} "
            f"| {r['best_indices_per_s'] / 1e6:.1f} | {r['speed_vs_random']:.2f}x |"
        )
    print(f"\n{machine_line(results['machine'])}")


if __name__ == "__main__":
    main()
