"""The main-guard check of :class:`~seqstore.torch.SeqDataLoader` for workers that start in a fresh
interpreter (``spawn`` / ``forkserver``).

Such a worker imports the script that started it (as ``__mp_main__``), which runs the script's
module-level code again. When the loop that starts the workers is itself module-level code, outside
``if __name__ == "__main__":``, the re-import reaches it again and Python refuses to start processes
from a process still bootstrapping: the worker dies with "An attempt has been made to start a new
process before the current process has finished its bootstrapping phase" and the DataLoader reports
"worker exited unexpectedly". This module predicts that before any worker starts: it finds the
module-level line of ``__main__`` that the caller is executing and checks, from the script's syntax
tree, whether that line sits under a test of ``__name__``.
"""

from __future__ import annotations

import ast
import functools
import multiprocessing
import os
import sys
import tokenize
from types import FrameType
from typing import Any

from ..errors import SeqstoreError

__all__ = ["MainGuardError", "check_main_guard", "start_method"]

_FRESH = ("spawn", "forkserver")


class MainGuardError(SeqstoreError, RuntimeError):
    """DataLoader workers would re-run the unguarded script that starts them."""


def start_method(context: Any) -> str:
    """The start method a DataLoader with ``multiprocessing_context=context`` uses for its workers."""
    if context is None:
        chosen = multiprocessing.get_start_method(allow_none=True)
        return chosen or multiprocessing.get_all_start_methods()[0]  # the first one is the default
    if isinstance(context, str):
        return context
    return str(context.get_start_method())


@functools.lru_cache(maxsize=8)
def _guarded_lines(path: str, mtime_ns: int) -> tuple[tuple[int, int], ...]:
    """Line ranges of the module-level ``if`` blocks of ``path`` whose test reads ``__name__``."""
    with tokenize.open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    ranges = []
    for node in tree.body:
        if not isinstance(node, ast.If):
            continue
        if any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(node.test)):
            ranges.append((node.lineno, node.end_lineno or node.lineno))
    return tuple(ranges)


def _module_frame(main: Any) -> FrameType | None:
    """The frame executing ``main``'s module-level code, if it is on this thread's stack."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            return frame
        frame = frame.f_back
    return None


def check_main_guard(method: str, num_workers: int) -> None:
    """Raise :class:`MainGuardError` if workers started with ``method`` would re-run the module-level
    line of the script that is starting them. Silent where it cannot tell (no script file, an
    interactive session, a notebook, a script it cannot parse)."""
    if num_workers <= 0 or method not in _FRESH:
        return
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str) or not path.endswith(".py"):
        return
    frame = _module_frame(main)
    if frame is None:
        return
    try:
        ranges = _guarded_lines(path, os.stat(path).st_mtime_ns)
    except (OSError, SyntaxError, ValueError):
        return
    line = frame.f_lineno
    if any(lo <= line <= hi for lo, hi in ranges):
        return
    raise MainGuardError(
        f"SeqDataLoader: its {num_workers} worker processes start with {method!r}, which imports {path} again "
        f"in every worker; line {line} starts them from module-level code outside "
        'if __name__ == "__main__":, so each worker would run it again and die ("bootstrapping phase"). '
        'Move the code that builds and iterates the loader under if __name__ == "__main__": '
        "(seqstore uses forkserver for stores on object storage, whose client threads do not survive fork())"
    )
