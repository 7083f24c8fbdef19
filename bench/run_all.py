"""Run every benchmark in sequence, then the plot. ``python bench/run_all.py [--quick] [--repeats R]``.

Each bench prints its Markdown table; the tables are also saved to ``bench/results/<bench>.md``
(``<bench>_quick.md`` with ``--quick``) and the JSON to ``bench/results/<bench>.json``. Benches
run one after another (one process at a time): open, write, reads, orders, then any other
``bench/*.py`` script (other than the harness and helpers) in name order. Without
``--full`` the reads bench skips RETURNN's by-tag lookup (its first pass takes ~3 min at 1e6).

Optional peers that cannot be used here (LogIX, which declares Python < 3.11 and is enabled with
``LOGIX_SRC=...``; grain; matplotlib for the plot) are skipped by the bench itself, which prints one
``skipped: ...`` line saying how to enable the peer and still runs seqstore's side. The runner lists
those lines at the end and exits 0 when every bench (and the plot) exited 0, skips or not; it exits
1 naming the benches that failed otherwise.
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
    """Every bench/<name>.py script (not the harness, helpers, ``_*.py`` modules of a bench or ``*_gen.py``
    data generators): the store benches first."""
    names = {p.stem for p in BENCH.glob("*.py") if not p.stem.endswith("_gen") and not p.stem.startswith("_")}
    names -= NOT_BENCHES  # *_gen: data; _*: helper modules of a bench (bench/_remote_server.py, ...)
    return [n for n in FIRST if n in names] + sorted(names - set(FIRST))


SKIP_PREFIX = "skipped: "


def skipped_lines(stdout: str) -> list[str]:
    """The ``skipped: ...`` lines a bench printed (optional peers it could not run)."""
    return [line[len(SKIP_PREFIX):].strip() for line in stdout.splitlines() if line.startswith(SKIP_PREFIX)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--only", nargs="*", default=None, help="bench names to run (default all; the plot always runs)")
    p.add_argument("--full", action="store_true", help="include slow peer cases (reads: RETURNN by-tag, ~3 min)")
    args = p.parse_args()
    flags = (["--quick"] if args.quick else []) + ([f"--repeats={args.repeats}"] if args.repeats else [])
    failed = []
    skipped: list[tuple[str, str]] = []
    t_all = time.perf_counter()
    (BENCH / "results").mkdir(exist_ok=True)
    names = [n for n in args.only or discover() if n != "plot"]  # the plot always runs last
    unknown = [n for n in names if not (BENCH / f"{n}.py").exists()]
    if unknown:
        p.error(f"no bench {unknown}; benches are {discover()}")
    for name in names:
        script = BENCH / f"{name}.py"
        print(f"== {name} ({' '.join(flags) or 'default sizes'})", flush=True)
        t0 = time.perf_counter()
        extra = ["--skip-slow"] if name == "reads" and not args.full else []
        proc = subprocess.run([sys.executable, str(script), *flags, *extra], stdout=subprocess.PIPE, text=True)
        print(proc.stdout, flush=True)
        (BENCH / "results" / f"{name}{'_quick' if args.quick else ''}.md").write_text(proc.stdout)
        print(f"== {name}: exit {proc.returncode}, {time.perf_counter() - t0:.0f} s", flush=True)
        skipped += [(name, line) for line in skipped_lines(proc.stdout)]
        if proc.returncode:
            failed.append(name)
    print("== plot", flush=True)
    proc = subprocess.run([sys.executable, str(BENCH / "plot.py")], stdout=subprocess.PIPE, text=True)
    print(proc.stdout, end="", flush=True)
    skipped += [("plot", line) for line in skipped_lines(proc.stdout)]
    if proc.returncode:
        failed.append("plot")
    print(f"== all done in {time.perf_counter() - t_all:.0f} s", flush=True)
    if skipped:
        print(f"== skipped optional peers ({len(skipped)}):")
        for name, line in skipped:
            print(f"  {name}: {line}")
    else:
        print("== no peer skipped")
    if failed:
        sys.exit(f"failed: {failed}")


if __name__ == "__main__":
    main()
