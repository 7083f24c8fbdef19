"""Benchmark harness: every case in a fresh subprocess, repeated, medians, ratios, JSON results.

A *case* is a function ``module:function`` called with JSON keyword arguments in a new Python
process (``python -m bench.harness --child TARGET KWARGS_JSON``). Inside it, the function does its
own setup and wraps the part to measure in :func:`section`::

    from bench.harness import section

    def case_seqstore(path: str) -> dict:
        import seqstore                      # imports and setup are not measured
        with section():                      # wall time and RSS of this block are
            store = seqstore.open(path)
        return {"records": len(store)}       # optional extra numbers, reported per run

A case may call :func:`section` several times with different names (``section("first_record")``);
the first is the case's *primary* section (the table's default row), and when there are several,
back to back, the parent adds a derived ``total`` section (summed time, RSS growth and peak over the
whole span). Per section the child records:

- ``time_s``: ``time.perf_counter`` around the block; ``cpu_s``: CPU time of the process (all
  threads, user + system) in the block — far below ``time_s`` means waiting on I/O;
- ``rss_growth``: ``VmRSS`` after minus ``VmRSS`` right before the block (bytes) — what the block
  keeps;
- ``anon_growth``: the same for ``RssAnon`` only — private memory; RSS also counts pages of
  mapped files (shared page cache, e.g. a memory-mapped store's touched pages; the kernel maps
  up to 16 pages around each faulting one), which cost no private memory;
- ``peak_growth``: peak RSS during the block minus ``VmRSS`` right before it (bytes). The peak is
  ``VmHWM`` after the block; before the block the harness resets ``VmHWM`` to the current RSS by
  writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0). Where that is refused the figure is
  ``VmHWM_after - RSS_before``, an upper bound if the process peaked higher before the block, and
  ``peak_exact`` is false.

The parent (:func:`run_cases`) runs each case ``repeats`` times, case by case in the given order,
one process at a time, then reports medians, prints a table (:func:`print_table`) with a ratio
column against a named baseline case of the same group, and writes ``bench/results/<name>.json``
with machine info and every run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "Case",
    "section",
    "section_time",
    "run_cases",
    "print_table",
    "lookup",
    "main_args",
    "machine_info",
    "machine_line",
    "REPO",
    "RESULTS",
    "DATA",
]

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
#: Cached generated datasets (gitignored). Override with the SEQSTORE_BENCH_DATA environment variable.
DATA = Path(os.environ.get("SEQSTORE_BENCH_DATA", REPO / "bench" / "data"))


@dataclasses.dataclass
class Case:
    """One benchmark case: ``target`` is ``"module:function"``, called as ``function(**kwargs)``.

    ``group`` ties a case to the baseline of the same group (e.g. ``"N=1e7"``); ``name`` need only
    be unique within its group. ``metric`` is the number the ratio column compares (``"time_s"`` of
    each section, or a numeric key the case returns); ``timeout`` bounds one run in seconds;
    ``repeats`` overrides the run's repeat count for this case (e.g. 1 for a very slow peer);
    ``python`` runs the case under another interpreter (a peer's own venv; the case module must then
    import nothing of seqstore).
    """

    name: str
    target: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    group: str = ""
    metric: str = "time_s"
    timeout: float = 600.0
    repeats: int | None = None
    python: str | None = None

    @property
    def key(self) -> str:
        return f"{self.group}/{self.name}" if self.group else self.name


# ------------------------------------------------------------------------------------------ child


def _status_kib() -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of this process, in KiB, from /proc/self/status."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0])
    return out


def rss_anon(pid: int | str = "self") -> int:
    """``RssAnon`` of a process in bytes (resident anonymous memory: its heap, not mapped file pages; a
    forked child's count includes pages it still shares copy-on-write with its parent); 0 if unknown."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS. Returns False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


_SECTIONS: dict[str, dict[str, Any]] = {}


@contextlib.contextmanager
def section(name: str = "main") -> Iterator[None]:
    """Measure wall time, RSS growth and peak RSS growth of the block (in a case's child process).

    Runs ``gc.collect()`` before the baseline so garbage from setup does not count either way.
    """
    gc.collect()
    exact = _reset_peak()
    before = _status_kib()
    c0 = time.process_time()
    t0 = time.perf_counter()
    yield
    t1 = time.perf_counter()
    c1 = time.process_time()
    after = _status_kib()
    _SECTIONS[name] = {
        "time_s": t1 - t0,
        "cpu_s": c1 - c0,
        "rss_growth": (after["VmRSS"] - before["VmRSS"]) * 1024,
        "anon_growth": (after.get("RssAnon", 0) - before.get("RssAnon", 0)) * 1024,
        "peak_growth": (after["VmHWM"] - before["VmRSS"]) * 1024,
        "peak_exact": exact,
        "rss_before": before["VmRSS"] * 1024,
        "rss_after": after["VmRSS"] * 1024,
    }


def warm(*paths: Path) -> None:
    """Read every file under ``paths`` once (the page cache then holds them: a warm case)."""
    for root in paths:
        for p in sorted(Path(root).rglob("*")) if Path(root).is_dir() else [Path(root)]:
            if p.is_file():
                with open(p, "rb") as f:
                    while f.read(16 << 20):
                        pass


def section_time(name: str = "main") -> float:
    """Seconds the finished section ``name`` took (in the child), e.g. to return a throughput."""
    return float(_SECTIONS[name]["time_s"])


def _child(target: str, kwargs_json: str) -> None:
    """Run one case in this process; print its result as one JSON line on the real stdout."""
    real_stdout = os.dup(1)
    os.dup2(2, 1)  # whatever the case prints goes to stderr; stdout carries only the result
    sys.path.insert(0, str(REPO))
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    extra = func(**json.loads(kwargs_json)) or {}
    if not _SECTIONS:
        raise RuntimeError(f"{target} measured nothing: wrap the measured part in bench.harness.section()")
    sys.stdout.flush()
    result = {"sections": _SECTIONS, "extra": extra}
    os.write(real_stdout, (json.dumps(result) + "\n").encode())


# ----------------------------------------------------------------------------------------- parent


def _run_once(case: Case) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [case.python or sys.executable, "-m", "bench.harness", "--child", case.target, json.dumps(case.kwargs)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=case.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"case {case.key} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _with_total(sections: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Add a ``total`` section spanning consecutive sections (when there are several).

    time = sum of times; rss_growth = RSS after the last - RSS before the first; peak_growth = the
    highest peak of any section above RSS before the first (exact when sections are back to back).
    """
    if len(sections) < 2 or "total" in sections:
        return sections
    secs = list(sections.values())
    base = secs[0]["rss_before"]
    total = {
        "time_s": sum(x["time_s"] for x in secs),
        "cpu_s": sum(x["cpu_s"] for x in secs),
        "rss_growth": secs[-1]["rss_after"] - base,
        "anon_growth": sum(x["anon_growth"] for x in secs),
        "peak_growth": max(x["rss_before"] + x["peak_growth"] for x in secs) - base,
        "peak_exact": all(x["peak_exact"] for x in secs),
    }
    return {**sections, "total": total}


def _summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs of every section's numbers and of every numeric extra."""
    for r in runs:
        r["sections"] = _with_total(r["sections"])
    primary = next(iter(runs[0]["sections"]))
    sections = {}
    for sec in runs[0]["sections"]:
        sections[sec] = {
            k: _median([r["sections"][sec][k] for r in runs])
            for k in ("time_s", "cpu_s", "rss_growth", "anon_growth", "peak_growth")
        }
        sections[sec]["min_time_s"] = min(r["sections"][sec]["time_s"] for r in runs)
    extra = {}
    for k, v in runs[0]["extra"].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            extra[k] = _median([r["extra"].get(k) for r in runs])
        else:
            extra[k] = v
    return {"primary": primary, "sections": sections, "extra": extra}


def meminfo(field: str) -> int:
    """Field ``field`` of ``/proc/meminfo`` (``"MemTotal"``, ``"MemAvailable"``, ...) in bytes; 0 where it
    cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in open("/proc/meminfo"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, OS, Python and library versions, repo commit."""
    import numpy

    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = meminfo("MemTotal")
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        if dirty:
            commit += " + uncommitted src changes"
    except OSError:
        commit = ""
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gib": round(mem / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "commit": commit,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def machine_line(info: dict[str, Any] | None = None) -> str:
    i = info or machine_info()
    return (
        f"{i['cpu']}, {i['cores']} cores, {i['mem_gib']} GiB RAM, {i['os']}, "
        f"Python {i['python']}, numpy {i['numpy']}, commit {i['commit']}"
    )


def _metric(summary: dict[str, Any], section: str, metric: str) -> float | None:
    sec = summary["sections"].get(section)
    if sec is None:
        return None
    if metric in sec:
        return sec[metric]
    return summary["extra"].get(metric)


def lookup(results: dict[str, Any], name: str, group: str = "", section: str | None = None) -> dict[str, Any]:
    """The median numbers of one case's section (default: its primary one) plus its extras."""
    for c in results["cases"]:
        if c["name"] == name and c["group"] == group:
            s = c["summary"]
            return {**s["extra"], **s["sections"][section or s["primary"]]}
    raise KeyError(f"no case {group}/{name} in {results['name']}")


def run_cases(
    name: str,
    cases: Sequence[Case],
    *,
    baseline: str | Sequence[str] | None = None,
    repeats: int = 5,
    verbose: bool = True,
    meta: dict[str, Any] | None = None,
    interleave: bool = False,
) -> dict[str, Any]:
    """Run every case ``repeats`` times (each run a fresh process), summarise, write the JSON.

    ``baseline`` names the case (or several) every case of the same group is compared with: the
    ratio is ``case metric / baseline metric`` per section (for times > 1 means slower; for a
    throughput metric < 1 means slower). ``interleave``: round r runs every case once before round
    r + 1 (a drift of the machine then touches every case alike) instead of all runs of a case in a
    row. Returns the results dict that is also written to
    ``bench/results/<name>.json``.
    """
    keys = [c.key for c in cases]
    if len(set(keys)) != len(keys):
        raise ValueError(f"case names must be unique within a group: {keys}")
    baselines = [] if baseline is None else [baseline] if isinstance(baseline, str) else list(baseline)
    results: dict[str, Any] = {
        "name": name,
        "machine": machine_info(),
        "repeats": repeats,
        "baselines": baselines,
        "meta": meta or {},
        "cases": [],
    }
    t_start = time.perf_counter()
    counts = [case.repeats or repeats for case in cases]
    all_runs: list[list[dict[str, Any]]] = [[] for _ in cases]
    schedule = (
        [(r, i) for r in range(max(counts, default=0)) for i in range(len(cases)) if r < counts[i]]
        if interleave
        else [(r, i) for i in range(len(cases)) for r in range(counts[i])]
    )
    for r, i in schedule:
        case, t0 = cases[i], time.perf_counter()
        all_runs[i].append(_run_once(case))
        if verbose:
            sec = next(iter(all_runs[i][-1]["sections"].values()))
            print(
                f"  {case.key:40s} run {r + 1}/{counts[i]}: {_fmt_time(sec['time_s'])} "
                f"(process {time.perf_counter() - t0:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    for case, runs in zip(cases, all_runs):
        entry = {**dataclasses.asdict(case), "key": case.key, "runs": runs, "summary": _summarise(runs)}
        results["cases"].append(entry)
    results["wall_s"] = time.perf_counter() - t_start
    by_key = {c["key"]: c for c in results["cases"]}
    for c in results["cases"]:
        s = c["summary"]
        s["ratios"] = {}
        for b in baselines:
            base = by_key.get(f"{c['group']}/{b}" if c["group"] else b) or by_key.get(b)
            per_section = {}
            for sec in s["sections"]:
                mine = _metric(s, sec, c["metric"])
                theirs = _metric(base["summary"], sec, c["metric"]) if base else None
                per_section[sec] = mine / theirs if mine is not None and theirs else None
            s["ratios"][b] = per_section
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=1))
    return results


# ------------------------------------------------------------------------------------------ table


def _fmt_time(t: float | None) -> str:
    if t is None:
        return "-"
    if t < 1e-3:
        return f"{t * 1e6:.1f} us"
    if t < 1:
        return f"{t * 1e3:.2f} ms"
    return f"{t:.2f} s"


def _fmt_bytes(b: float | None) -> str:
    if b is None:
        return "-"
    return f"{b / 2**20:+.2f} MiB"


def _fmt_num(v: Any) -> str:
    if isinstance(v, float):
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-2):
            return f"{v:.3g}"
        return f"{v:.4g}"
    return str(v)


def print_table(
    results: dict[str, Any],
    *,
    sections: Sequence[str] | None = None,
    extras: Sequence[str] | None = None,
    file: Any = None,
) -> str:
    """Print (and return) a Markdown table of medians.

    One row per case and section (``sections``; default: each case's primary section; ``"total"``
    is the sum of a case's back-to-back sections): group, case, section, median time, median RSS
    growth, median peak RSS growth, one ratio column per baseline, then the numeric extras the
    cases returned (``extras``; default all).
    """
    cases = results["cases"]
    if extras is None:
        seen: dict[str, None] = {}
        for c in cases:
            for k, v in c["summary"]["extra"].items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    seen[k] = None
        extras = list(seen)
    baselines = results.get("baselines", [])
    show_group = any(c["group"] for c in cases)
    head = [*(["group"] if show_group else []), "case", "section", "median time", "CPU"]
    head += ["RSS growth", "private (anon)", "peak RSS growth"]
    head += [f"ratio vs {b}" for b in baselines] + list(extras)
    rows = []
    for c in cases:
        s = c["summary"]
        wanted = [s["primary"]] if sections is None else [x for x in sections if x in s["sections"]]
        for sec in wanted:
            m = s["sections"][sec]
            unit = "" if c["metric"] == "time_s" else f" ({c['metric']})"
            ratios = []
            for b in baselines:
                r = s["ratios"].get(b, {}).get(sec)
                ratios.append("-" if r is None else f"{r:.3g}x{unit}")
            rows.append(
                [
                    *([c["group"]] if show_group else []),
                    c["name"],
                    sec,
                    _fmt_time(m["time_s"]),
                    _fmt_time(m["cpu_s"]),
                    _fmt_bytes(m["rss_growth"]),
                    _fmt_bytes(m["anon_growth"]),
                    _fmt_bytes(m["peak_growth"]),
                    *ratios,
                    *[_fmt_num(s["extra"].get(k, "-")) for k in extras],
                ]
            )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
        *("| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |" for r in rows),
    ]
    reps = sorted({len(c["runs"]) for c in cases})
    text = "\n".join(lines)
    text += (
        f"\n\nmedians of {'/'.join(map(str, reps))} runs, each in a fresh process; "
        f"{machine_line(results['machine'])}\n"
    )
    print(text, file=file or sys.stdout, flush=True)
    return text


def main_args(
    description: str,
    argv: Sequence[str] | None = None,
    *,
    default_repeats: int = 5,
    extra_flags: Sequence[str] = (),
) -> argparse.Namespace:
    """Common command line of the bench scripts: ``--quick``, ``--repeats`` and boolean ``extra_flags``."""
    p = argparse.ArgumentParser(description=description)
    for flag in extra_flags:
        p.add_argument(flag, action="store_true")
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (smoke run)")
    p.add_argument("--repeats", type=int, default=None, help=f"runs per case (default {default_repeats}, quick 2)")
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else default_repeats
    return args


def _main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", nargs=2, metavar=("TARGET", "KWARGS_JSON"), required=True)
    args = p.parse_args()
    # Run as ``python -m bench.harness`` this module is ``__main__``; the case imports
    # ``bench.harness``, a second module object, so record sections in that one.
    sys.path.insert(0, str(REPO))
    importlib.import_module("bench.harness")._child(*args.child)


if __name__ == "__main__":
    _main()
