"""Plot open time and memory vs N (seqstore vs peers) from bench/results/open.json.

Writes docs/img/open_vs_n.png (matplotlib, Agg) from full results; from quick results (open_quick.json)
it writes bench/results/open_vs_n_quick.png instead, so a quick run leaves the docs' figure alone.
Usage: ``python bench/plot.py [results.json]``; without an argument it uses open.json, or
open_quick.json if that is all there is. Without matplotlib (``make bench`` installs it with the bench
extra) or without open results it prints one ``skipped:`` line and exits 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Run as ``python bench/x.py`` Python puts bench/ first on sys.path, where files like logging.py
# would shadow the standard library: put the repository root there instead.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.harness import REPO, RESULTS  # noqa: E402

OUT = REPO / "docs" / "img" / "open_vs_n.png"
LABELS = {
    "seqstore": "seqstore (open + first record)",
    "returnn_hdf": "RETURNN HDFDataset (+ init_seq_order + first record)",
    "logix_json": "LogIX-style JSON metadata (+ first record)",
}


def main() -> None:
    try:
        import matplotlib
    except ImportError:
        print("skipped: plot (matplotlib is not installed: `make bench` installs it, or pip install -e '.[bench]')")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    src = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "open.json"
    if not src.exists() and len(sys.argv) <= 1:
        src = RESULTS / "open_quick.json"
    if not src.exists():
        print(f"skipped: plot (no open results at {src}: run bench/open.py first)")
        return
    out = RESULTS / "open_vs_n_quick.png" if src.name.endswith("_quick.json") else OUT
    results = json.loads(src.read_text())
    series: dict[str, list[tuple[int, float, float]]] = {}
    for c in results["cases"]:
        n = int(float(c["group"].split("=")[1]))
        tot = c["summary"]["sections"]["total"]
        series.setdefault(c["name"], []).append((n, tot["time_s"], max(tot["peak_growth"], 0) / 2**20))
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=100)
    for name, pts in series.items():
        pts.sort()
        ns = [p[0] for p in pts]
        ax_t.loglog(ns, [p[1] * 1e3 for p in pts], "o-", label=LABELS.get(name, name))
        # symlog keeps seqstore's ~0 MiB visible next to peers' hundreds of MiB
        ax_m.plot(ns, [p[2] for p in pts], "o-", label=LABELS.get(name, name))
    ax_t.set(xlabel="records N", ylabel="time to open (ms, median)", title="Open time")
    ax_m.set_xscale("log")
    ax_m.set_yscale("symlog", linthresh=1)
    ax_m.set_ylim(bottom=0)
    ax_m.set(xlabel="records N", ylabel="peak RSS growth (MiB, median)", title="Open memory per process")
    for ax in (ax_t, ax_m):
        ax.grid(True, which="major", alpha=0.3)
    ax_t.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"fresh process per run, warm page cache; {results['machine']['cpu']}, "
                 f"{results['machine']['cores']} cores", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB) from {src}")


if __name__ == "__main__":
    main()
