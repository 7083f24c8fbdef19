"""Peak private memory of a measured block, sampled from another process.

A sampling thread inside the measured process is not free: each wake-up takes the GIL from the code
being timed. On the 2-core benchmark VM a thread reading ``/proc/self/status`` every 5 ms made a
single-threaded Lhotse read 23% slower (1.61 s -> 1.98 s) and a seqstore import that runs two I/O
threads 20-25% slower. :func:`watch` samples from a small child process instead, which shares no
GIL with the measured code and sleeps between samples.

``watch(every=0.005, workers=False)`` yields a dict that holds, after the block:

- ``peak_private_MB``: the highest ``RssAnon`` of this process during the block, minus its value at
  the start (flat in N means memory independent of N);
- with ``workers=True``, ``peak_worker_MB``: the highest ``RssAnon`` of one grandchild process (the
  workers a forkserver forks; not the server, which only imports and forks), sampled every 4th time.

Run as a script it is that child: ``python bench/memwatch.py PID EVERY WORKERS``; it samples until its
stdin closes, then prints the peaks as JSON.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: bench.harness too

from bench.harness import rss_anon  # noqa: E402


def _anon_kib(pid: int) -> int:
    """``RssAnon`` of ``pid`` in KiB; 0 for a process that is gone (a worker may end between samples)."""
    try:
        return rss_anon(pid) // 1024
    except OSError:
        return 0


def _descendants(pid: int, depth: int = 8) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
        for k in kids:
            out += [k, *(_descendants(k, depth - 1) if depth > 1 else [])]
    return out


def _grandchildren(pid: int) -> list[int]:
    children = set(_descendants(pid, depth=1))
    return [p for p in _descendants(pid) if p not in children]


def _serve(pid: int, every: float, workers: bool) -> None:
    base = peak = _anon_kib(pid)
    worker_peaks: dict[int, int] = {}
    print("ready", flush=True)
    n = 0
    while True:
        done = bool(select.select([sys.stdin], [], [], every)[0])
        peak = max(peak, _anon_kib(pid))
        if workers and (n % 4 == 0 or done):
            for g in _grandchildren(pid):
                worker_peaks[g] = max(worker_peaks.get(g, 0), _anon_kib(g))
        n += 1
        if done:
            break
    out = {"peak_private_MB": (peak - base) / 1024}
    if workers:
        out["peak_worker_MB"] = max(worker_peaks.values(), default=0) / 1024
    print(json.dumps(out), flush=True)


@contextmanager
def watch(every: float = 0.005, workers: bool = False) -> Iterator[dict[str, float]]:
    """Sample this process's private memory (and its workers') from a child process (module docs)."""
    out: dict[str, float] = {}
    child = subprocess.Popen([sys.executable, __file__, str(os.getpid()), str(every), str(int(workers))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("bench/memwatch.py: the sampling process did not start")
        yield out
    finally:
        child.stdin.close()
        line = child.stdout.readline()
        child.wait()
        if line:
            out.update(json.loads(line))


if __name__ == "__main__":
    _serve(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1")
