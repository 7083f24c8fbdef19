"""Scripts that fork while a thread of theirs holds a lock (as a DataLoader worker is forked while a thread
of the training process reads): whether the child gets past that lock, run in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: the end of such a script, after its ``os.fork()`` (``pid``, see :func:`fork_holding`) and the child's own
#: branch: the thread holding the lock is let go (``forked``), and the child's exit status is printed
#: ("child 0"), or "child hung"
AWAIT_CHILD = """
forked.set()
deadline = time.monotonic() + 15
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    print("child hung")
"""


def fork_holding(locks: str, like: str) -> str:
    """Script lines that start a thread holding ``locks`` (a ``with`` statement's items) as ``like`` (what
    thread of a real process holds them) until the child is forked, then fork (``pid``); the thread lets go
    once :data:`AWAIT_CHILD` sets ``forked``."""
    return f"""
held, forked = threading.Event(), threading.Event()

def hold() -> None:  # as {like}
    with {locks}:
        held.set()
        forked.wait()

threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
"""


def run_forking(path: Path, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Write ``text`` (which ends with :data:`AWAIT_CHILD`) to ``path`` and run it with ``args``, on this
    process's ``sys.path``."""
    path.write_text(text)
    return subprocess.run([sys.executable, "-W", "ignore", str(path), *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
