"""``SeqDataLoader(procs=K)`` / ``num_workers=K``: the loop's own process gathers the batches where that is
faster than waiting on the workers (:class:`seqstore.torch._ring.Chooser`), and the batches stay the same;
a loop left open until the interpreter exits leaves nothing in /dev/shm."""

from __future__ import annotations

import gc
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_testlib import make_store  # noqa: E402

import seqstore  # noqa: E402
from seqstore.data import StoreDataset  # noqa: E402
from seqstore.torch import IterableSeqDataset  # noqa: E402
from seqstore.torch._direct import Gatherer  # noqa: E402
from seqstore.torch._ring import Chooser, run_processes  # noqa: E402


def _windows(ch: Chooser, here: float, workers: float, waited: float, count: int, gathering: float = 0.0,
             idle: float = 0.0) -> list[bool]:
    """The side of each of ``count`` windows when a batch costs ``here`` / ``workers`` seconds (of which
    ``waited`` on the workers' side is waiting for them, and ``gathering`` on the loop's side is its
    gather, ``idle`` of that off the CPU)."""
    sides = []
    for _ in range(count):
        sides.append(ch.here)
        for _ in range(ch.window):
            ch.tick(here, gathering, idle) if ch.here else ch.tick(workers, waited)
    return sides


def test_the_faster_side_is_kept_and_the_other_tried_less_and_less_often() -> None:
    ch = Chooser(window=4, stay=2, longest=8, first=1)
    sides = _windows(ch, here=1.0, workers=2.0, waited=1.5, count=40)
    assert sides[0] is True and sides[1] is False  # it starts in place and tries the workers once
    trials = [k for k, s in enumerate(sides) if not s]
    assert len(trials) >= 3
    gaps = np.diff(trials)
    assert list(gaps[:3]) == [3, 5, 9]  # the loser is tried after 2, 4, then 8 windows (at most 8)
    assert all(g == 9 for g in gaps[3:])


def test_workers_that_keep_ahead_of_the_loop_keep_the_batches() -> None:
    ch = Chooser(window=4, stay=2, longest=8, first=1)
    sides = _windows(ch, here=2.0, workers=1.0, waited=0.0, count=40)
    assert sides[:2] == [True, False]
    assert not any(sides[2:])  # the loop never waited on them: nothing to try against


def test_the_first_windows_are_the_loops_own() -> None:
    ch = Chooser(window=4, stay=2, longest=8, first=4)
    assert _windows(ch, here=2.0, workers=1.0, waited=0.0, count=6) == [True] * 4 + [False] * 2


def test_workers_the_loop_waits_on_are_tried_against_again() -> None:
    ch = Chooser(window=4, stay=2, longest=8, first=1)
    sides = _windows(ch, here=2.0, workers=1.0, waited=0.5, count=20)
    assert sides[2:4] == [False, False] and sides[4] is True  # kept, then tried against the loop's process
    assert sides.count(True) < sides.count(False)


class _PidGatherer:
    """A gatherer that notes which process gathered each batch (picklable: the workers get a copy)."""

    def __init__(self, gather: Gatherer, log: Path) -> None:
        self.gather, self.log = gather, log

    def __call__(self, idx: Any) -> Any:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {int(idx[0])}\n")
        return self.gather(idx)


def test_batches_from_either_side_come_in_order_and_equal(tmp_path: Path) -> None:
    make_store(tmp_path / "s.seqstore", 400)
    ds = IterableSeqDataset(StoreDataset(seqstore.open(tmp_path / "s.seqstore")), batch=8)
    plain = Gatherer(ds)
    arrays = [np.arange(a, a + 8, dtype=np.int64) for a in range(0, 400, 8)]
    want = [plain(a) for a in arrays]
    log = tmp_path / "log"
    gather = _PidGatherer(plain, log)
    got = list(run_processes(want[0], iter(arrays[1:]), gather, 2,  # type: ignore[arg-type]
                             chooser=Chooser(window=2, stay=1, longest=1, first=1)))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys() and all(torch.equal(g[k], w[k]) for k in w)
    by = {}
    for line in log.read_text().split("\n")[:-1]:
        pid, first = line.split()
        by[int(first)] = int(pid)
    assert sorted(by) == [int(a[0]) for a in arrays[1:]]  # each batch gathered once
    here = [k for k, pid in by.items() if pid == os.getpid()]
    assert here and len(here) < len(by)  # some batches in this process, the others in the workers


def test_without_a_spare_core_a_loop_that_only_gathers_does_not_try_the_workers() -> None:
    # no step: the whole time between batches is the gather, on the CPU
    ch = Chooser(window=4, stay=2, longest=8, first=1, spare=False)
    assert not any(not side for side in _windows(ch, here=1.0, workers=0.5, waited=0.4, count=30, gathering=1.0))
    # a step outside the loader (half the time), a gather waiting on the disk, or a spare core: tried
    for kw in ({"gathering": 0.5}, {"gathering": 1.0, "idle": 0.5}):
        ch = Chooser(window=4, stay=2, longest=8, first=1, spare=False)
        assert _windows(ch, here=1.0, workers=0.5, waited=0.4, count=4, **kw)[1:3] == [False, False]
    ch = Chooser(window=4, stay=2, longest=8, first=1, spare=True)
    assert _windows(ch, here=1.0, workers=0.5, waited=0.4, count=4, gathering=1.0)[1] is False


# put before a script's own lines: the names of the shared-memory blocks its process (and those it forks)
# makes, one a line in the file $SEQSTORE_TEST_BLOCKS (other processes on the machine make and keep theirs)
_RECORD_BLOCKS = """\
import os as _os
from multiprocessing import shared_memory as _shared_memory
_make = _shared_memory.SharedMemory.__init__
def _make_recorded(self, *args, **kwargs):
    _make(self, *args, **kwargs)
    if kwargs.get("create", len(args) > 1 and args[1]):
        with open(_os.environ["SEQSTORE_TEST_BLOCKS"], "a") as f:
            f.write(self.name + "\\n")
_shared_memory.SharedMemory.__init__ = _make_recorded
"""


def _run_script(script: Path, *args: str) -> tuple[Any, list[str]]:
    """Run ``script`` in a fresh interpreter with this one's path; check that it succeeded, made blocks
    in /dev/shm and left none of them behind. Returns the completed process and the names of its blocks."""
    import subprocess
    import sys

    script.write_text(_RECORD_BLOCKS + script.read_text())
    made = script.with_suffix(".blocks")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "SEQSTORE_TEST_BLOCKS": str(made)}
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr
    names = made.read_text().split() if made.exists() else []
    assert names, "the script made no block in /dev/shm"
    assert [n for n in names if os.path.exists(os.path.join("/dev/shm", n))] == []
    return done, names


def test_a_loop_left_open_at_exit_leaves_no_shared_memory_behind(tmp_path: Path) -> None:
    """A script that ends while holding a ``procs=2`` loader's iterator: the ring's block is unlinked at
    exit, so nothing is left in /dev/shm and the resource tracker reports no leak."""
    path = tmp_path / "s.seqstore"
    make_store(path, 400, seed=3)
    script = tmp_path / "open_at_exit.py"
    script.write_text(
        "import sys\n"
        "from seqstore.data import StoreDataset\n"
        "from seqstore.torch import EpochSampler, SeqDataLoader, SeqDataset, collate_padded\n"
        "if __name__ == '__main__':\n"
        "    ds = StoreDataset(sys.argv[1], ordering='random', seed=1)\n"
        "    import seqstore.torch.loader\n"
        "    seqstore.torch.loader.PARALLEL_FROM_BYTES = 0  # these batches are small: workers anyway\n"
        "    it = iter(SeqDataLoader(SeqDataset(ds), sampler=EpochSampler(ds), batch_size=4, procs=2,\n"
        "                            collate_fn=collate_padded))\n"
        "    for _ in range(30):\n"
        "        next(it)\n"
        "    print('blocks', sorted(n for n in __import__('os').listdir('/dev/shm') if n.startswith('psm_')))\n"
    )
    done, names = _run_script(script, str(path))
    seen = done.stdout.split("blocks", 1)[1]
    assert all(n in seen for n in names), done.stdout  # the loop had its block while it ran
    assert "leaked" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_second_ctrl_c_while_the_workers_end_is_ignored_quietly(tmp_path: Path) -> None:
    """Ctrl-C in the training step ends the loop; a second one while it waits for its workers to end
    (here: stopped, as busy ones would be) neither cuts the clean-up short nor prints "Exception ignored"."""
    path = tmp_path / "s.seqstore"
    make_store(path, 400, seed=3)
    script = tmp_path / "second_ctrl_c.py"
    script.write_text(
        "import multiprocessing, os, signal, sys, threading\n"
        "from seqstore.data import StoreDataset\n"
        "from seqstore.torch import IterableSeqDataset, SeqDataLoader\n"
        "if __name__ == '__main__':\n"
        "    import seqstore.torch.loader\n"
        "    seqstore.torch.loader.PARALLEL_FROM_BYTES = 0  # these batches are small: workers anyway\n"
        "    loader = SeqDataLoader(IterableSeqDataset(StoreDataset(sys.argv[1]), batch=4), batch_size=None, procs=2)\n"
        "    try:\n"
        "        for i, _ in enumerate(loader):\n"
        "            if i == 5:\n"
        "                kids = multiprocessing.active_children()\n"
        "                assert len(kids) == 2, kids\n"
        "                for k in kids:\n"
        "                    os.kill(k.pid, signal.SIGSTOP)\n"
        "                threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
        "                threading.Timer(3.0, lambda: [os.kill(k.pid, signal.SIGCONT) for k in kids]).start()\n"
        "                raise KeyboardInterrupt  # the first Ctrl-C\n"
        "    except KeyboardInterrupt:\n"
        "        print('interrupted', len(multiprocessing.active_children()))\n"
    )
    done, names = _run_script(script, str(path))
    assert "interrupted 0" in done.stdout, done.stdout  # the workers were ended before the loop let go
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert names  # the loop had its block (and _run_script checked that none is left)


def _ones(idx: np.ndarray) -> dict[str, Any]:
    return {"x": torch.full((1024,), float(idx[0]))}


def test_ctrl_c_just_after_the_block_is_made_leaves_nothing_in_dev_shm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C right after the ring's block was made, before its unlink at exit was arranged, left the block's
    name in /dev/shm for as long as the process ran (then the resource tracker's warning about a leak)."""
    import signal

    from seqstore.torch import _ring

    made: list[str] = []

    class Interrupted(_ring._Block):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self.name)
            signal.raise_signal(signal.SIGINT)  # Ctrl-C now

    monkeypatch.setattr(_ring, "_Block", Interrupted)
    batches = run_processes(_ones(np.array([0])), iter([np.array([k]) for k in range(1, 5)]), _ones, 2)  # type: ignore[arg-type]
    try:
        assert [int(b["x"][0]) for b in batches] == [0, 1, 2, 3, 4]
    except KeyboardInterrupt:
        pass
    del batches
    assert made and not os.path.exists(os.path.join("/dev/shm", made[0].lstrip("/")))


@pytest.mark.parametrize("where", ["posix_fallocate", "mmap"])
def test_a_run_buffer_interrupted_while_it_is_made_leaves_nothing_in_dev_shm(monkeypatch: pytest.MonkeyPatch,
                                                                            where: str) -> None:
    """A Ctrl-C (or a failed mapping) while a read-once loop's run buffer was made -- its pages reserved, then
    mapped -- left the new file in /dev/shm, known to no clean-up, until reboot; it is removed now."""
    from seqstore.torch import _runs

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt if where == "posix_fallocate" else OSError(12, "Cannot allocate memory")

    runs = _runs.RunBuffers()
    target = _runs.os if where == "posix_fallocate" else _runs.mmap
    monkeypatch.setattr(target, where, interrupted)
    with pytest.raises(KeyboardInterrupt if where == "posix_fallocate" else OSError):
        runs.make(1 << 16)
    monkeypatch.undo()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(runs._tag)]
    runs.close()


def test_read_once_run_buffers_left_open_are_removed_at_exit(tmp_path: Path) -> None:
    """A read-once loop's run buffers are files in /dev/shm that no resource tracker knows: a script that
    ends without closing them still leaves none behind."""
    import subprocess
    import sys

    script = tmp_path / "runs_at_exit.py"
    script.write_text(
        "from seqstore.torch._ring import RunBuffers\n"
        "runs = RunBuffers()\n"
        "kept, dropped = runs.make(1 << 16), runs.make(1 << 16)\n"
        "runs.drop(dropped)\n"
        "print(runs.name(kept))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    name = done.stdout.strip()
    assert name.startswith("seqstore-run-")
    assert not os.path.exists(os.path.join("/dev/shm", name))


def test_a_script_that_ends_holding_a_batch_lent_from_a_slot_exits_quietly(tmp_path: Path) -> None:
    """The batches a worker gathered are views of the ring's block; a script that ends while it still
    holds one (and the loop) exits with nothing on stderr and nothing left in /dev/shm."""
    path = tmp_path / "s.seqstore"
    make_store(path, 400, seed=3)
    script = tmp_path / "hold_at_exit.py"
    script.write_text(
        "import sys\n"
        "import seqstore.torch._ring as ring\n"
        "from seqstore.data import StoreDataset\n"
        "from seqstore.torch import EpochSampler, SeqDataLoader, SeqDataset, collate_padded\n"
        "plain = ring.Chooser.__init__\n"
        "def workers_only(self, *a, **k):  # the workers gather every batch: each comes as views of a slot\n"
        "    plain(self, *a, **k)\n"
        "    self.here, self.left = False, 10**9\n"
        "ring.Chooser.__init__ = workers_only\n"
        "import seqstore.torch.loader\n"
        "seqstore.torch.loader.PARALLEL_FROM_BYTES = 0  # these batches are small: workers anyway\n"
        "ds = StoreDataset(sys.argv[1], ordering='random', seed=1)\n"
        "it = iter(SeqDataLoader(SeqDataset(ds), sampler=EpochSampler(ds), batch_size=4, num_workers=2,\n"
        "                        collate_fn=collate_padded))\n"
        "for _ in range(10):\n"
        "    held = next(it)\n"
        "ptr = held['x'].data_ptr()\n"
        "maps = [line.split()[0].split('-') for line in open('/proc/self/maps') if '/dev/shm/psm_' in line]\n"
        "print('lent', any(int(lo, 16) <= ptr < int(hi, 16) for lo, hi in maps))\n"
    )
    done, _ = _run_script(script, str(path))
    assert "lent True" in done.stdout, done.stdout
    assert done.stderr.strip() == "", done.stderr


def test_workers_of_a_loop_killed_by_sigkill_end(tmp_path: Path) -> None:
    """A loop's process killed with SIGKILL (the OOM killer) runs no clean-up: its forked workers, which hold
    copies of the loop's end of their pipes and so never see it close, still end on their own."""
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "s.seqstore"
    make_store(path, 400, seed=3)
    script = tmp_path / "killed.py"
    script.write_text(
        "import os, signal, sys\n"
        "import multiprocessing\n"
        "from seqstore.data import StoreDataset\n"
        "from seqstore.torch import EpochSampler, SeqDataLoader, SeqDataset, collate_padded\n"
        "if __name__ == '__main__':\n"
        "    ds = StoreDataset(sys.argv[1], ordering='random', seed=1)\n"
        "    import seqstore.torch.loader\n"
        "    seqstore.torch.loader.PARALLEL_FROM_BYTES = 0\n"
        "    it = iter(SeqDataLoader(SeqDataset(ds), sampler=EpochSampler(ds), batch_size=4, procs=2,\n"
        "                            collate_fn=collate_padded, multiprocessing_context='fork'))\n"
        "    for _ in range(40):\n"
        "        next(it)\n"
        "    print(' '.join(str(p.pid) for p in multiprocessing.active_children()), flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "w") as o, open(err, "w") as e:  # (files: the workers hold them too, a pipe would not end)
        done = subprocess.run([sys.executable, str(script), str(path)], stdout=o, stderr=e, timeout=120, env=env)
    assert done.returncode == -signal.SIGKILL, err.read_text()
    pids = [int(p) for p in out.read_text().split()]
    assert pids, out.read_text()
    deadline = time.monotonic() + 30
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if os.path.exists(f"/proc/{p}") and "Z" not in _state(p)]
    for p in alive:  # (not left behind by a failing test)
        os.kill(p, signal.SIGKILL)
    assert alive == [], "workers outlived their loop's process"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_an_answer_sent_without_blocking_is_what_connection_send_sends() -> None:
    """A worker's answer larger than the pipe holds goes out with the ring's own non-blocking writes: the
    bytes must be those ``Connection.send`` writes (the loop reads them with ``recv``; the pickle is protocol
    5's), so a Python whose framing differs fails here rather than in a training loop."""
    import multiprocessing
    import threading
    from multiprocessing.reduction import ForkingPickler

    from seqstore.torch._ring import _send_bounded

    small = ("big", [("x", "float32", (3,), 0)], b"\1\2\3")
    raw = []
    for send in (lambda c: c.send_bytes(ForkingPickler.dumps(small, 5)),
                 lambda c: _send_bounded(c, small, take=lambda m: None)):
        a, b = multiprocessing.Pipe()
        send(a)
        raw.append(os.read(b.fileno(), 1 << 16))
        a.close()
        b.close()
    assert raw[0] == raw[1]

    large = ("big", [("x", "uint8", (1 << 21,), 0)], bytes(range(256)) * (1 << 13))  # past a pipe's 64 KiB
    a, b = multiprocessing.Pipe()
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(b.recv()))
    reader.start()
    _send_bounded(a, large, take=lambda m: None)
    reader.join(timeout=60)
    assert got == [large]


def test_a_worker_that_fails_to_start_leaves_no_pipe_open() -> None:
    """A worker whose start failed (here: a gather that does not pickle, for spawned workers) left both ends
    of its pipe open for as long as the error was referenced (a logger, a notebook's last exception)."""
    def gather(idx: np.ndarray) -> dict[str, Any]:  # (a local function: spawned workers cannot get it)
        return {"x": torch.full((1024,), float(idx[0]))}

    def failed_start() -> Exception:
        batches = run_processes(gather(np.array([0])), iter([np.array([k]) for k in range(1, 5)]), gather, 2,  # type: ignore[arg-type]
                                context="spawn", ahead=1)
        with pytest.raises((AttributeError, pickle.PicklingError)) as failed:
            list(batches)
        return failed.value

    failed_start()  # (the resource tracker's pipe, opened once)
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    kept = failed_start()
    gc.collect()
    # (not ==: another test's object collected meanwhile may close descriptors of its own)
    assert len(os.listdir("/proc/self/fd")) <= before, kept
