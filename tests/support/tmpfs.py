"""A script run on a small tmpfs of its own: a full disk, made in a user and mount namespace (no root
needed; the test is skipped where user namespaces are not allowed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_on_small_tmpfs(script: str, tmp_path: Path, size: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Run ``script`` (Python source) with the directory of a fresh tmpfs of ``size`` (e.g. ``"2m"``) as
    its argument; returns that directory and the finished process (its output as text)."""
    path = tmp_path / "full.py"
    path.write_text(script)
    disk = tmp_path / "disk"
    disk.mkdir()
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user namespaces here: {probe.stderr.decode().strip()}")
    shell = f'mount -t tmpfs -o size={size} tmpfs "{disk}" && exec "{sys.executable}" "{path}" "{disk}"'
    got = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", shell],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return disk, got
