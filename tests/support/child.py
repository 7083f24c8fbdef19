"""Child processes of the test fixtures (emulators): stopping one without leaving it behind."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_child(proc: subprocess.Popen[Any]) -> None:
    """Terminate ``proc``, kill it if it has not exited after 10 s, and reap it."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
