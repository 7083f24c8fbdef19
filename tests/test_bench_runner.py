"""bench/run_all.py's skip and exit logic and bench/logs.py's LogIX check, on stub benches (fast: the
real benches run under `make bench`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _runner(tmp_path: Path, benches: dict[str, str]) -> Path:
    """A copy of run_all.py next to stub bench scripts (and a stub plot.py unless given)."""
    bench = tmp_path / "bench"
    bench.mkdir()
    shutil.copy(REPO / "bench" / "run_all.py", bench / "run_all.py")
    benches = {"plot": "print('wrote plot')", **benches}
    for name, body in benches.items():
        (bench / f"{name}.py").write_text(f"import sys\n{body}\n")
    return bench / "run_all.py"


def _run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), "--quick", *args], capture_output=True, text=True,
                          timeout=120)


def test_run_all_exits_0_when_only_optional_peers_are_skipped(tmp_path: Path) -> None:
    script = _runner(tmp_path, {
        "alpha": "print('| table |')\nprint('skipped: peerx in alpha (not installed; set PEERX_SRC=... to enable)')",
        "beta": "assert '--quick' in sys.argv\nprint('done')",
        "data_gen": "sys.exit('a data generator is not a bench')",
    })
    proc = _run(script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "== skipped optional peers (1):" in proc.stdout
    assert "  alpha: peerx in alpha (not installed; set PEERX_SRC=... to enable)" in proc.stdout
    assert "== alpha (--quick)" in proc.stdout and "== beta (--quick)" in proc.stdout
    assert "data_gen" not in proc.stdout and "wrote plot" in proc.stdout
    assert (script.parent / "results" / "alpha_quick.md").read_text().startswith("| table |")


def test_run_all_fails_on_a_failing_bench_or_plot_and_unknown_names(tmp_path: Path) -> None:
    script = _runner(tmp_path, {"good": "print('ok')", "bad": "sys.exit(3)", "plot": "sys.exit(1)"})
    proc = _run(script)
    assert proc.returncode == 1
    assert "failed: ['bad', 'plot']" in proc.stderr and "== no peer skipped" in proc.stdout
    proc = _run(script, "--only", "good", "nosuch")
    assert proc.returncode == 2 and "no bench ['nosuch']" in proc.stderr


def test_logs_bench_names_how_to_enable_logix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(REPO))
    try:
        from bench import logs
    finally:
        sys.path.remove(str(REPO))
    monkeypatch.setenv("LOGIX_SRC", str(tmp_path))  # an empty directory: no LogIX there
    monkeypatch.setattr(sys, "path", list(sys.path))
    if "logix" in sys.modules or logs.logix_missing() is None:
        pytest.skip("LogIX is importable here")
    assert "logix" in str(logs.logix_missing())
    assert "LOGIX_SRC=" in logs.LOGIX_HOW
