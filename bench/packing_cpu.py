"""CPU time of the packed stream against ``get_batch`` of the same tokens, in this process.

``python bench/packing_cpu.py MODE [--batches N] [--store PATH]`` (MODE: ``get_batch``, ``concat`` or
``best_fit``) prints the tokens per CPU second of ``N`` batches of 8 x 2048 after one warm-up batch.
Run each mode in a fresh process, alternating, several times (the store of ``bench/packing.py``,
1e6 documents by default): CPU time, not wall time, so that other jobs on the machine count less.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import seqstore  # noqa: E402
from bench.packing import BATCH, SEQ, store_path, token_reads  # noqa: E402
from seqstore.data import PackedDataset  # noqa: E402

DEFAULT = store_path(1_000_000)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["get_batch", "concat", "best_fit"])
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--store", type=Path, default=DEFAULT)
    args = p.parse_args()
    store = seqstore.open(args.store)
    if args.mode == "get_batch":  # the documents in the same order, ~8 x 2048 tokens per get_batch
        step = token_reads(store)
    else:
        packed = PackedDataset(store, seq_len=SEQ, mode=args.mode, eos=0, ordering="random", seed=1)
        stream = packed.open(packed.shares(None, 1)[0])

        def step() -> int:
            stream.batch(BATCH)
            return BATCH * SEQ

    step()
    t0 = time.process_time()
    tokens = sum(step() for _ in range(args.batches))
    cpu = time.process_time() - t0
    print(f"{args.mode}: {tokens / cpu / 1e6:.1f} M tokens per CPU second ({args.batches} batches, {cpu:.3f} s)")


if __name__ == "__main__":
    main()
