"""The shared slots and pipes of a ``procs=`` loop (:mod:`seqstore.torch._ring`): a batch handed out as views of a
slot keeps it until the last tensor over it goes; a worker's answer is waited for within ``timeout`` to its end,
and not past the worker's own end; workers end quietly when the loop's process is killed, and are ended
whatever SIGTERM handler the script has."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import struct
import sys
import threading
import time
import types
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from seqstore.torch import _ring  # noqa: E402


class _Workers(_ring.Chooser):
    """The workers gather every batch after the first."""

    def __init__(self) -> None:
        super().__init__()
        self.here = False

    def tick(self, *args: float) -> None:
        pass


def _walk_in_a_thread(gather: Any, arrays: Any, wait: float, **options: Any) -> tuple[threading.Thread, list[Any]]:
    """``run_processes`` of one worker over ``gather``'s batch 0 then ``arrays``, walked in a thread joined for at
    most ``wait`` seconds: (the thread, each batch's first value and then the error that ended the walk)."""
    got: list[Any] = []

    def loop() -> None:
        try:
            for b in _ring.run_processes(gather(np.zeros(1, np.int64)), arrays, gather, 1, chooser=_Workers(),
                                         **options):
                got.append(float(b["x"][0]))
        except Exception as exc:  # noqa: BLE001 - looked at by the caller
            got.append(exc)

    runner = threading.Thread(target=loop, daemon=True)
    runner.start()
    runner.join(wait)
    return runner, got


class _Filled:
    """A batch of 1 KiB of float64 values ``idx[0]`` (picklable: the workers get a copy)."""

    def __call__(self, idx: np.ndarray) -> dict[str, Any]:
        return {"x": torch.full((128,), float(idx[0]), dtype=torch.float64)}


def test_views_held_keep_their_slot_whatever_the_reference_counts_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot lent as views was taken for free from an exact ``sys.getrefcount`` of its memoryview: an
    interpreter that counts one reference fewer (3.14 borrows references on its stack) gave the slot back
    while the batch was held, and the worker overwrote it. Held batches now keep their values."""
    # (-2: the lambda's own argument, and the one reference fewer)
    fewer = types.SimpleNamespace(getrefcount=lambda obj: __import__("sys").getrefcount(obj) - 2)
    monkeypatch.setattr(_ring, "sys", fewer, raising=False)
    gather = _Filled()
    held = list(_ring.run_processes(gather(np.array([0])), iter([np.array([k]) for k in range(1, 12)]), gather, 1,
                                    depth=4, chooser=_Workers()))
    assert [sorted(set(b["x"].tolist())) for b in held] == [[float(k)] for k in range(12)]


def _in_shared_memory(ptr: int) -> bool:
    """Whether address ``ptr`` of this process lies in a mapping of a file in ``/dev/shm``."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)  # address range, permissions, offset, device, inode[, path]
            lo, hi = (int(a, 16) for a in parts[0].split("-"))
            if lo <= ptr < hi:
                return len(parts) == 6 and parts[5].startswith("/dev/shm/")
    return False


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps")
def test_batches_let_go_as_they_come_are_views_of_their_slots() -> None:
    """Batches dropped before the next one is taken give their slot back: each is handed out as views of
    the shared block (no copy), with its own values."""
    gather = _Filled()
    seen = []
    for b in _ring.run_processes(gather(np.array([0])), iter([np.array([k]) for k in range(1, 12)]), gather, 1,
                                 depth=3, chooser=_Workers()):
        seen.append((float(b["x"][0]), float(b["x"][-1]), _in_shared_memory(b["x"].data_ptr())))
        del b
    assert seen[1:] == [(float(k), float(k), True) for k in range(1, 12)]


class _StallsInItsAnswer:
    """Batch 1's worker writes the start of an answer on its pipe and then sleeps (a worker stopped, or one
    that died while a process it started holds its pipe); picklable."""

    def __call__(self, idx: np.ndarray) -> dict[str, Any]:
        if int(idx[0]) == 1:
            frame = sys._getframe()
            while frame.f_code.co_name != "_worker":  # (the worker's end of its pipe)
                assert frame.f_back is not None
                frame = frame.f_back
            os.write(frame.f_locals["conn"].fileno(), struct.pack("!i", 1 << 20) + b"\x80\x05")
            time.sleep(120)
        return {"x": torch.full((128,), float(idx[0]), dtype=torch.float64)}


def test_an_answer_begun_and_not_ended_is_an_error_within_the_timeout() -> None:
    """``timeout=`` bounded the wait for a worker's answer to begin; once its first bytes were in, the rest was
    read without a limit, and a worker that stalled (or died, its pipe held open) in the middle of an answer
    hung the loop for ever. Now that too is a LoaderWorkerError naming the worker, and the worker is ended."""
    runner, got = _walk_in_a_thread(_StallsInItsAnswer(), iter([np.array([k]) for k in range(1, 6)]), 60, timeout=0.5)
    assert not runner.is_alive(), "the loop waited for the rest of the answer for ever"
    assert got[0] == 0.0 and isinstance(got[1], _ring.LoaderWorkerError), got
    assert "loader worker 0" in str(got[1]) and "0.5s" in str(got[1])
    assert not [p for p in multiprocessing.active_children() if p.name == "seqstore-loader"]


def _loop_killed_with_answers_unread(err: str, pids: str) -> None:
    """A loop whose process is killed (SIGKILL) while its workers' answers wait unread in its ends of the
    pipes; the workers' stderr goes to the file ``err``, their pids to ``pids``."""
    sys.stderr = open(err, "w", buffering=1)  # (the workers' too: they are forked from here)
    gather = _Filled()
    batches = _ring.run_processes(gather(np.array([0])), iter([np.array([k]) for k in range(1, 40)]), gather, 2,
                                  chooser=_Workers())
    next(batches), next(batches)
    workers = [p.pid for p in multiprocessing.active_children() if p.name == "seqstore-loader"]
    with open(pids, "w") as f:
        f.write(" ".join(map(str, workers)))
    time.sleep(0.3)  # (their answers meanwhile)
    os.kill(os.getpid(), 9)


def test_workers_end_quietly_when_the_loop_is_killed_with_answers_unread(tmp_path: Any) -> None:
    """The loop's process killed with answers unread in its end of a worker's pipe (a socket): the
    worker's next read failed with ConnectionResetError, not EOF or a broken pipe, and each worker printed
    its traceback. Now a worker ends quietly on that too."""
    err, pids = str(tmp_path / "err"), str(tmp_path / "pids")
    loop = multiprocessing.get_context("fork").Process(target=_loop_killed_with_answers_unread, args=(err, pids))
    loop.start()
    loop.join(60)
    assert loop.exitcode == -9
    workers = [int(p) for p in open(pids).read().split()]
    assert len(workers) == 2
    end = time.monotonic() + 60
    while time.monotonic() < end and any(_alive(p) for p in workers):
        time.sleep(0.05)
    text = open(err).read()
    assert "Traceback" not in text and "ConnectionResetError" not in text, text


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class _Stuck:
    """Batch 1 never comes (a read stuck for good); picklable."""

    def __call__(self, idx: np.ndarray) -> dict[str, Any]:
        if int(idx[0]) == 1:
            time.sleep(600)
        return {"x": torch.full((128,), float(idx[0]), dtype=torch.float64)}


def test_a_stuck_worker_is_ended_when_the_script_handles_sigterm() -> None:
    """A training script with a SIGTERM handler of its own (a framework's, for preemption: it notes the
    signal and goes on) passed it to its forked workers, so that the SIGTERM ending a stuck worker only ran
    that handler, and the loop waited for the worker for ever after its timeout. Now the workers take
    SIGTERM as a process does by default, and one that outlives it is killed."""
    import signal

    noted: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda sig, frame: noted.append(sig))
    try:
        runner, got = _walk_in_a_thread(_Stuck(), iter([np.array([k]) for k in range(1, 4)]), 60, timeout=0.5)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert not runner.is_alive(), "the loop waited for ever for a worker that took SIGTERM for its handler's"
    assert got[0] == 0.0 and isinstance(got[1], _ring.LoaderWorkerError), got
    assert not noted  # (the loop's process got no SIGTERM)


def _child_holding_the_pipe(pids: str) -> None:
    """In a worker: fork a process that keeps its end of the pipe open for a minute (so that no end of file
    comes when the worker ends); the process's pid to the file ``pids``."""
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    with open(pids, "w") as f:
        f.write(str(child))


class _DiesInItsAnswer:
    """Batch 1's worker writes the start of an answer, starts a process that holds its pipe open (and
    writes its pid to ``pids``), and exits; picklable."""

    def __init__(self, pids: str) -> None:
        self.pids = pids

    def __call__(self, idx: np.ndarray) -> dict[str, Any]:
        if int(idx[0]) == 1:
            frame = sys._getframe()
            while frame.f_code.co_name != "_worker":
                assert frame.f_back is not None
                frame = frame.f_back
            os.write(frame.f_locals["conn"].fileno(), struct.pack("!i", 1 << 20) + b"\x80\x05")
            _child_holding_the_pipe(self.pids)
            os._exit(3)
        return {"x": torch.full((128,), float(idx[0]), dtype=torch.float64)}


def test_a_worker_that_ends_in_the_middle_of_an_answer_is_an_error_without_a_timeout(tmp_path: Any) -> None:
    """A worker that ended in the middle of an answer while a process it started held its pipe open (no
    end of file comes): without ``timeout=`` the loop waited for the rest for ever. Now it sees the worker
    gone, as it does while it waits for an answer to begin: a LoaderWorkerError naming the worker."""
    pids = str(tmp_path / "pids")
    runner, got = _walk_in_a_thread(_DiesInItsAnswer(pids), iter([np.array([k]) for k in range(1, 4)]), 30)
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(open(pids).read()), 9)  # (the process holding the pipe)
    assert not runner.is_alive(), "the loop waited for the rest of an answer for ever"
    assert got[0] == 0.0 and isinstance(got[1], _ring.LoaderWorkerError), got
    assert "loader worker 0" in str(got[1]) and "exit code 3" in str(got[1]), got[1]


class _DiesWhileSentTo:
    """A batch larger than its slot each (sent whole: its slot is free at once, and the next batch's index array
    goes out at once); batch 2's worker starts a process that holds its pipe open (its pid to ``pids``) and
    exits while the loop sends it a later index array larger than the pipe holds; picklable."""

    def __init__(self, pids: str) -> None:
        self.pids = pids

    def __call__(self, idx: np.ndarray) -> dict[str, Any]:
        if int(idx[0]) == 2:
            _child_holding_the_pipe(self.pids)
            time.sleep(0.3)  # (the loop sends batch 3 meanwhile)
            os._exit(3)
        return {"x": torch.full((128 if int(idx[0]) == 0 else 20_000,), float(idx[0]), dtype=torch.float64)}


def test_a_worker_gone_while_its_pipe_is_full_is_an_error_without_a_timeout(tmp_path: Any) -> None:
    """Without ``timeout=``, an index array larger than the pipe holds, sent to a worker that ended while a
    process it started held its pipe open, waited for ever. Now the loop asks each second whether the worker
    lives while its pipe is full: a LoaderWorkerError naming the worker."""
    pids = str(tmp_path / "pids")
    arrays = iter([np.full(100_000, k) for k in range(1, 6)])  # (800 kB each: more than the pipe holds)
    runner, got = _walk_in_a_thread(_DiesWhileSentTo(pids), arrays, 30, depth=2)
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(open(pids).read()), 9)  # (the process holding the pipe)
    assert not runner.is_alive(), "the loop waited for ever to send to a worker gone"
    assert got[0] == 0.0 and isinstance(got[-1], _ring.LoaderWorkerError), got
    assert "loader worker 0" in str(got[-1]) and "exit code 3" in str(got[-1]), got[-1]


class _FailsAt(_Filled):
    """``_Filled``, but the batch of index ``bad`` raises a KeyError (a class of its own is kept)."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __call__(self, idx: np.ndarray) -> dict[str, Any]:
        if int(idx[0]) == self.bad:
            raise KeyError(f"record {self.bad} not here")
        return super().__call__(idx)


def test_a_workers_error_names_the_worker_and_the_batch() -> None:
    """An error raised in a ``procs=`` worker reaches the loop as its own class, its message saying which worker
    (and its pid) and which batch of the iteration failed; the worker's error is its cause."""
    gather = _FailsAt(5)
    got = []
    with pytest.raises(KeyError) as info:
        for b in _ring.run_processes(gather(np.zeros(1, np.int64)), iter([np.array([k]) for k in range(1, 9)]),
                                     gather, 2, chooser=_Workers()):
            got.append(int(b["x"][0]))
    assert got == [0, 1, 2, 3, 4]
    text = str(info.value)
    assert "loader worker 0 (pid " in text and "batch 5 of this iteration" in text and "record 5 not here" in text
    assert isinstance(info.value.__cause__, KeyError) and "record 5 not here" in str(info.value.__cause__)


def test_a_workers_error_in_context_keeps_its_attributes() -> None:
    """The worker's error with its worker and batch keeps what handlers look at: a RemoteError's url and attempts,
    an OSError's errno and file name; a class that takes more than a message is the error itself."""
    from seqstore.errors import ColumnTypeError, RemoteError
    from seqstore.torch._signals import with_context

    remote = with_context(RemoteError("refused", url="s3://b/k", attempts=3), "loader worker 1, batch 7")
    assert isinstance(remote, RemoteError) and (remote.url, remote.attempts) == ("s3://b/k", 3)
    assert "loader worker 1, batch 7" in str(remote) and "refused" in str(remote)
    gone = with_context(FileNotFoundError(2, "No such file", "/x/shard-1"), "loader worker 0, batch 2")
    assert isinstance(gone, FileNotFoundError) and (gone.errno, gone.filename) == (2, "/x/shard-1")
    assert "loader worker 0, batch 2" in str(gone)
    column = ColumnTypeError("bad", "c", "list")
    assert with_context(column, "loader worker 0, batch 2") is column
