"""Run every benchmark in sequence, then the plot. ``python bench/run_all.py [--quick] [--repeats R]``.

Each bench prints its Markdown table; the tables are also saved to ``bench/results/<bench>.md``
(``<bench>_quick.md`` with ``--quick``) and the JSON to ``bench/results/<bench>.json``. Benches
run one after another (one process at a time): open, write, reads, orders, then any other
``bench/*.py`` script (other than the harness and helpers) in name order. Without
``--full`` the reads bench skips RETURNN's by-tag lookup (its first pass takes ~3 min at 1e6).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
FIRST = ["open", "write", "reads", "orders"]
NOT_BENCHES = {"__init__", "harness", "gen_data", "plot", "run_all", "gpu_feed", "gpu_similarity"}


def discover() -> list[str]:
    """Every bench/<name>.py script (not the harness or helpers): the store benches first."""
    names = {p.stem for p in BENCH.glob("*.py")} - NOT_BENCHES
    return [n for n in FIRST if n in names] + sorted(names - set(FIRST))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--only", nargs="*", default=None, help="bench names to run (default all)")
    p.add_argument("--full", action="store_true", help="include slow peer cases (reads: RETURNN by-tag, ~3 min)")
    args = p.parse_args()
    flags = (["--quick"] if args.quick else []) + ([f"--repeats={args.repeats}"] if args.repeats else [])
    failed = []
    (BENCH / "results").mkdir(exist_ok=True)
    for name in args.only or discover():
        script = BENCH / f"{name}.py"
        if not script.exists():
            print(f"== {name}: {script} not present, skipped", flush=True)
            continue
        print(f"== {name} ({' '.join(flags) or 'default sizes'})", flush=True)
        t0 = time.perf_counter()
        extra = ["--skip-slow"] if name == "reads" and not args.full else []
        proc = subprocess.run([sys.executable, str(script), *flags, *extra], stdout=subprocess.PIPE, text=True)
        print(proc.stdout, flush=True)
        (BENCH / "results" / f"{name}{'_quick' if args.quick else ''}.md").write_text(proc.stdout)
        print(f"== {name}: exit {proc.returncode}, {time.perf_counter() - t0:.0f} s", flush=True)
        if proc.returncode:
            failed.append(name)
    subprocess.run([sys.executable, str(BENCH / "plot.py")], check=False)
    if failed:
        sys.exit(f"failed: {failed}")


if __name__ == "__main__":
    main()
