"""Logger counts (num_skipped, the manifest's duplicate and record stats) when a log() call is stopped by
an interrupt (Ctrl-C) and the program logs the same batch again."""

from __future__ import annotations

import inspect
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
