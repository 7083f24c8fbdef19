"""The main-guard check for worker processes that start in a fresh interpreter (``spawn`` /
``forkserver``): :class:`~seqstore.torch.SeqDataLoader`'s workers and the processes of a parallel
conversion (``import_*(..., workers=N)``).

Such a worker imports the script that started it (as ``__mp_main__``), which runs the script's
module-level code again. When the loop that starts the workers is itself module-level code, outside
``if __name__ == "__main__":``, the re-import reaches it again and Python refuses to start processes
from a process still bootstrapping: the worker dies with "An attempt has been made to start a new
process before the current process has finished its bootstrapping phase" and the DataLoader reports
"worker exited unexpectedly" (a process pool: "terminated abruptly"). This module predicts that before
any worker starts, from the syntax tree of the script: whether the module-level line of ``__main__``
that the caller is executing would run again on import (:func:`_verdict`).
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

from .errors import MainGuardError

__all__ = ["MainGuardError", "check_main_guard", "start_method"]

_FRESH = ("spawn", "forkserver")


def start_method(context: Any) -> str:
    """The start method a DataLoader with ``multiprocessing_context=context`` uses for its workers."""
    if context is None:
        chosen = multiprocessing.get_start_method(allow_none=True)
        return chosen or multiprocessing.get_all_start_methods()[0]  # the first one is the default
    if isinstance(context, str):
        return context
    return str(context.get_start_method())


def _runs_as_main_only(test: ast.expr) -> bool | None:
    """For a test of ``__name__``: True when its true branch runs only as ``__main__`` (``== "__main__"``),
    False when only elsewhere (``!= "__main__"``), None when it cannot tell."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name) \
            and test.left.id == "__name__" and isinstance(test.comparators[0], ast.Constant) \
            and test.comparators[0].value == "__main__":
        if isinstance(test.ops[0], ast.Eq):
            return True
        if isinstance(test.ops[0], ast.NotEq):
            return False
    return None


def _within(node: ast.stmt, line: int) -> bool:
    return node.lineno <= line <= (node.end_lineno or node.lineno)


@functools.lru_cache(maxsize=8)
def _verdict(path: str, mtime_ns: int, line: int) -> bool | None:
    """Whether module-level line ``line`` of ``path`` also runs when the script is imported as
    ``__mp_main__``: True (it does: nothing around it can keep it from running), False (an ``if`` on
    ``__name__`` keeps it to ``__main__``), None (an ``if`` on something else surrounds it: it cannot tell).
    Loops, ``with`` and ``try`` blocks run on import like plain statements; only an ``if`` can guard."""
    with tokenize.open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    body: list[ast.stmt] = tree.body
    while True:
        node = next((n for n in body if _within(n, line)), None)
        if node is None or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return True  # a simple statement (or the header of a def) at this level runs
        if isinstance(node, ast.If):
            in_body = any(_within(n, line) for n in node.body)
            in_else = any(_within(n, line) for n in node.orelse)
            if not (in_body or in_else):
                return True  # the line of the test itself
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(node.test)):  # a test of __name__
                main_only = _runs_as_main_only(node.test)
                if main_only is None:
                    return None
                if main_only == in_body:
                    return False
                body = node.body if in_body else node.orelse  # the branch that runs on import
                continue
            if in_else and len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
                body = node.orelse  # an elif chain: the next test decides
                continue
            return None
        # a loop's, with's, try's or match's statements: its bodies, else, finally, handlers and cases
        blocks = [getattr(node, name, None) or [] for name in ("body", "orelse", "finalbody")]
        blocks += [h.body for h in [*(getattr(node, "handlers", None) or []), *(getattr(node, "cases", None) or [])]]
        inner = [n for block in blocks for n in block if isinstance(n, ast.stmt) and _within(n, line)]
        if not inner:
            return True  # the header line of a loop, with or try
        body = inner


def _module_frame(main: Any) -> FrameType | None:
    """The frame executing ``main``'s module-level code, if it is on this thread's stack."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            return frame
        frame = frame.f_back
    return None


def check_main_guard(
    method: str,
    num_workers: int,
    who: str = "SeqDataLoader",
    builds: str = "builds and iterates the loader",
    why: str = "seqstore uses forkserver for stores on object storage, whose client threads do not survive fork()",
) -> None:
    """Raise :class:`MainGuardError` if workers started with ``method`` would re-run the module-level
    line of the script that is starting them. Silent where it cannot tell (no script file, an
    interactive session, a notebook, a script it cannot parse). The message names ``who`` starts the
    workers, the code to move (``builds``) and ``why`` the start method is used."""
    if num_workers <= 0 or method not in _FRESH:
        return
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str) or not path.endswith(".py"):
        return
    frame = _module_frame(main)
    if frame is None:
        return
    line = frame.f_lineno
    try:
        reruns = _verdict(path, os.stat(path).st_mtime_ns, line)
    except (OSError, SyntaxError, ValueError):
        return
    if not reruns:
        return
    counted = f"its {num_workers} worker processes start" if num_workers != 1 else "its worker process starts"
    raise MainGuardError(
        f"{who}: {counted} with {method!r}, which imports {path} again in every worker; "
        f"line {line} starts them from module-level code outside "
        'if __name__ == "__main__":, so each worker would run it again and die ("bootstrapping phase"). '
        f'Move the code that {builds} under if __name__ == "__main__": ({why})'
    )
