"""numba's start-up on a helper thread at ``import seqstore.torch`` (and its off switch)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

PROBE = (
    "import seqstore.torch\n"
    "from seqstore.torch import _warm\n"
    "_warm.wait_warmup()\n"
    "print(_warm._thread is not None, _warm._thread is not None and _warm._thread.is_alive())\n"
)


def _probe(env_value: str | None) -> str:
    env = dict(os.environ)
    env.pop("SEQSTORE_WARMUP", None)
    if env_value is not None:
        env["SEQSTORE_WARMUP"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_warm_up_runs_its_kernels() -> None:
    from seqstore.torch._warm import warm_up

    warm_up()  # raises if the order API it calls drifted (the thread would swallow that)


def test_import_starts_the_thread_and_the_switch_stops_it() -> None:
    assert _probe(None) == "True False"  # started, finished after wait_warmup
    assert _probe("0") == "False False"


def test_fork_waits_for_the_thread() -> None:
    code = (
        "import os, seqstore.torch\n"
        "from seqstore.torch import _warm\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print(_warm._thread.is_alive())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # the fork hook joined it first
