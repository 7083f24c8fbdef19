"""Logger counts (num_skipped, the manifest's duplicate and record stats) when a log() call is stopped by
an interrupt (Ctrl-C) and the program logs the same batch again."""

from __future__ import annotations

import inspect
import linecache
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore as ss
from seqstore.log import Logger


def interrupt_before(func: Callable[..., Any], statement: str) -> Callable[[Any, str, Any], Any]:
    """A trace function that raises KeyboardInterrupt (as a Ctrl-C would), once, right before the first
    statement of ``func`` that starts with ``statement``."""
    func = inspect.unwrap(func)
    code = func.__code__
    lines, first = inspect.getsourcelines(func)
    line = first + next(k for k, text in enumerate(lines) if text.strip().startswith(statement))

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is not code:
            return None

        def at_line(f: Any, e: str, a: Any) -> Any:
            if e == "line" and f.f_lineno == line:
                sys.settrace(None)
                f.f_trace = None
                raise KeyboardInterrupt
            return at_line

        return at_line

    return trace


@pytest.mark.parametrize(("func", "statement"), [
    (Logger.log, "self._append("),
    (Logger._append, "pos = 0"),
])
def test_a_retried_batch_counts_its_duplicates_and_records_once(scratch: Path, func: Any, statement: str) -> None:
    """A batch with one duplicate, interrupted before any of its rows went in and logged again: the
    duplicate was counted by both calls (num_skipped 2, and with the later interrupt the manifest's
    duplicates_skipped 2 and rank-0/records 5 for 4 records). Each is counted once now."""
    x = np.ones((2, 4), np.float32)
    with Logger(scratch / "log", flush_bytes=1 << 16) as lg:
        lg.log(["a", "b"], {"x": x})
        sys.settrace(interrupt_before(func, statement))
        try:
            with pytest.raises(KeyboardInterrupt):
                lg.log(["a", "c"], {"x": x})
        finally:
            sys.settrace(None)
        lg.log(["a", "c"], {"x": x})
        lg.log(["d"], {"x": x[:1]})
        assert lg.num_skipped == 1 and lg.num_logged == 4
    st = ss.open(scratch / "log")
    assert sorted(st.id(i) for i in range(len(st))) == ["a", "b", "c", "d"]
    assert st.manifest.stats["duplicates_skipped"] == 1
    assert st.manifest.stats["rank-0/records"] == 4


def interrupt_at_line(k: int, files: tuple[str, ...]) -> tuple[Callable[[Any, str, Any], Any], list[int]]:
    """A trace function that raises KeyboardInterrupt at the ``k``-th line run in ``files`` (this thread),
    and a list that it appends to when it did."""
    seen = [0]
    fired: list[int] = []

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if not frame.f_code.co_filename.endswith(files):
            return None

        def at_line(f: Any, e: str, a: Any) -> Any:
            # not at a `with` line: the tracer also sees it when the block ends, where an exception raised
            # by the tracer (unlike a real Ctrl-C, which is checked after __exit__) skips the lock's release
            if e == "line" and not linecache.getline(f.f_code.co_filename, f.f_lineno).strip().startswith("with "):
                seen[0] += 1
                if seen[0] == k:
                    sys.settrace(None)
                    f.f_trace = None
                    fired.append(k)
                    raise KeyboardInterrupt
            return at_line

        return at_line

    return trace, fired


@pytest.mark.parametrize("call", ["flush", "log"])
def test_ctrl_c_anywhere_in_a_handoff_loses_no_record(scratch: Path, call: str) -> None:
    """Ctrl-C at any line of flush() (or of a log() that fills the buffer), caught by the program, which
    then closes the logger: an interrupt after the buffer was taken from the logger but before it was
    queued for the background writer lost the buffer's records (and the buffer). Every record is kept."""
    files = ("seqstore/log/logger.py", "seqstore/log/duplicates.py")
    x = np.ones((4, 4), np.float32)
    k = 0
    while True:
        k += 1
        path = scratch / f"log{k}"
        lg = Logger(path, flush_bytes=4 * 16, direct_io=False)  # 4 records of 16 bytes fill a buffer
        lg.log(["a", "b"], {"x": x[:2]})
        trace, fired = interrupt_at_line(k, files)
        sys.settrace(trace)
        try:
            if call == "flush":
                lg.flush()
            else:
                lg.log(["c", "d"], {"x": x[:2]})
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        if call == "log" and fired:
            lg.log(["c", "d"], {"x": x[:2]})  # logged again, as a program would
        lg.close()
        st = ss.open(path)
        want = ["a", "b"] if call == "flush" else ["a", "b", "c", "d"]
        assert sorted(set(st.id(i) for i in range(len(st)))) == want, (k, [st.id(i) for i in range(len(st))])
        if not fired:
            break
    assert k > 3


def test_ctrl_c_while_taking_a_buffer_does_not_make_log_hang(scratch: Path) -> None:
    """A buffer taken for log() but not yet made current when Ctrl-C came was lost: after two such
    interrupts no buffer was left and the next log() waited forever for one. log() goes on."""
    import threading

    x = np.ones((8, 4), np.float32)
    lg = Logger(scratch / "log", flush_bytes=4 * 16, direct_io=False)  # 4 records of 16 bytes fill a buffer
    lg.log(["a"], {"x": x[:1]})
    for b in range(2):
        lg.flush()  # the current buffer goes: the next log() takes one
        sys.settrace(interrupt_before(Logger._take_buffer, "buf.reset("))
        try:
            with pytest.raises(KeyboardInterrupt):
                lg.log([f"b{b}"], {"x": x[:1]})
        finally:
            sys.settrace(None)
    done = threading.Event()

    def more() -> None:
        for k in range(3):
            lg.log([f"c{k}{j}" for j in range(4)], {"x": x[:4]})
        done.set()

    threading.Thread(target=more, daemon=True).start()
    assert done.wait(120), "log() waits for a buffer that never comes"
    lg.close()
    st = ss.open(scratch / "log")
    assert len(st) == 13 and st.id(0) == "a"


@pytest.mark.parametrize("statement", ["buf.n += take", "self._ids.add("])
def test_a_batch_interrupted_as_its_rows_go_in_and_logged_again_keeps_ids_with_their_rows(
        scratch: Path, statement: str) -> None:
    """Ctrl-C in log() right after a batch's ids were put in the buffer: before its rows were counted, the
    stale ids stayed and the next batch's rows were stored under the retried batch's ids (b's ids lost, a's
    twice); after they were counted but before its ids were in flight, the retried batch was written again
    (keep_first stored a's ids twice). Each id is stored once, with its own row."""
    x = np.arange(4, dtype=np.float32)[:, None] * np.ones((1, 4), np.float32)
    with Logger(scratch / "log", flush_bytes=1 << 16, commit_every_s=60) as lg:
        sys.settrace(interrupt_before(Logger._append, statement))
        try:
            with pytest.raises(KeyboardInterrupt):
                lg.log(["a0", "a1"], {"x": x[:2]})
        finally:
            sys.settrace(None)
        lg.log(["a0", "a1"], {"x": x[:2]})  # logged again, as a program would
        lg.log(["b2", "b3"], {"x": x[2:]})
    st = ss.open(scratch / "log")
    got = {st.id(i): float(st[i]["x"][0]) for i in range(len(st))}
    assert len(st) == 4 and got == {"a0": 0.0, "a1": 1.0, "b2": 2.0, "b3": 3.0}, got
