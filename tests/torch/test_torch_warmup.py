"""numba's start-up on a helper thread at ``import seqstore.torch`` (and its off switch)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

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


FIRST_BATCH = """
import sys, threading
import numpy as np
import seqstore
from numba.core.compiler_lock import global_compiler_lock
import seqstore._numba_start as start
from seqstore._numba_start import would_wait
from seqstore.order import _kernels as K
from seqstore.order import seq_order
from seqstore.store.read import copy as C

start.GRACE_S = 600  # this test's steps may take long on a busy machine: the grace is tested on its own
held, done, timed_out = threading.Event(), threading.Event(), []

def hold():  # stands in for the warm-up thread, busy loading numba
    with global_compiler_lock:
        held.set()
        timed_out.append(not done.wait(60))

holder = threading.Thread(target=hold)
holder.start()
held.wait()
waits = would_wait(K.perm_take), would_wait(C.gather_rows)
store = seqstore.open(sys.argv[1])
idx = seq_order(len(store), "random", epoch=3, seed=7).take(np.arange(40, dtype=np.int64))
first = store.get_batch(idx, pad=True)
done.set()  # the first batch came while the lock was held: nothing waited for it
holder.join()
again = seq_order(len(store), "random", epoch=3, seed=7).take(np.arange(40, dtype=np.int64))
second = store.get_batch(again, pad=True)
loaded = bool(K.perm_take.overloads), bool(C.gather_rows.overloads)
def eq(a, b):
    return all(map(eq, a, b)) if isinstance(a, tuple) else np.array_equal(a, b)
same = (again == idx).all() and all(eq(first[k], second[k]) for k in first)
print(waits, timed_out, loaded, bool(same))
"""


def test_a_first_batch_does_not_wait_for_numba_loading_on_another_thread(tmp_path: Any) -> None:
    """While another thread holds numba's compiler lock (the warm-up loading numba), a ``random`` order's
    take and a ragged gather are computed in NumPy instead of waiting; they equal the kernels' results."""
    import numpy as np

    import seqstore

    path = tmp_path / "s.seqstore"
    rng = np.random.default_rng(0)
    with seqstore.create(path, {"tokens": seqstore.Field("int32", (None,)),
                                "label": seqstore.Field("int64", ())}) as w:
        for i in range(500):
            w.append({"tokens": rng.integers(0, 1000, size=int(rng.integers(0, 50)), dtype=np.int32),
                      "label": np.int64(i)})
    env = dict(os.environ, SEQSTORE_WARMUP="0")
    out = subprocess.run([sys.executable, "-c", FIRST_BATCH, str(path)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(True, True) [False] (True, True) True"


GRACE = """
import threading, time
import numba
import seqstore._numba_start as start
from numba.core.compiler_lock import global_compiler_lock

@numba.njit
def never_loaded(x):
    return x

held, done = threading.Event(), threading.Event()

def hold():
    with global_compiler_lock:
        held.set()
        done.wait(60)

holder = threading.Thread(target=hold)
holder.start()
held.wait()
first = start.would_wait(never_loaded)
time.sleep(start.GRACE_S + 0.05)
later = start.would_wait(never_loaded)
done.set()
holder.join()
print(first, later)
"""


def test_callers_wait_for_numba_after_the_grace() -> None:
    """Past ``GRACE_S`` after the first call that did not wait, callers wait (a loop that went on in
    NumPy would keep the GIL from the thread loading numba)."""
    out = subprocess.run([sys.executable, "-c", GRACE], env=dict(os.environ, SEQSTORE_WARMUP="0"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True False"


def test_the_warm_up_thread_counts_as_starting_numba() -> None:
    """While the registered warm-up thread is alive, a kernel not loaded yet would wait for it, even
    before the thread takes numba's lock."""
    code = (
        "import threading\n"
        "import numba\n"
        "import seqstore._numba_start as start\n"
        "go = threading.Event()\n"
        "t = threading.Thread(target=go.wait)\n"
        "t.start()\n"
        "start.loading_on(t)\n"
        "f = numba.njit(lambda x: x)\n"
        "alive = start.would_wait(f)\n"
        "go.set()\n"
        "t.join()\n"
        "print(alive, start.would_wait(f))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, SEQSTORE_WARMUP="0"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True False"
