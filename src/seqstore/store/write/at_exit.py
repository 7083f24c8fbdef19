"""Writers and loggers still open when the interpreter exits or receives SIGTERM: commit, say so.

Python's ``logging`` flushes its handlers at exit; a :class:`~seqstore.store.Writer` or a
:class:`~seqstore.log.Logger` that the program never closed is treated the same way. Each open one is
registered here (weakly); at interpreter exit, and on SIGTERM, every one still open commits what was
appended or logged, prints one line on stderr saying so, and removes its workspace. A writer whose
last write failed, or that an interrupt (Ctrl-C) stopped in the middle of an append, cannot commit
consistently: it is aborted instead (its uncommitted records are discarded, the line says so).

The exit hook runs before the interpreter joins its thread pools (``threading``'s exit hooks, like
``concurrent.futures``), so a logger's background thread and a writer's checksum thread still work.

SIGTERM: a handler is installed when the first writer or logger opens in the main thread, and only
if SIGTERM still has its default action (a handler the program installed itself is left alone; the
program then decides, and an exit it makes through ``sys.exit`` still commits). The handler commits
as above, restores the previous (default) action and sends the signal again, so the process ends as
SIGTERM would have ended it. A SIGTERM that arrives while the main thread is inside an append, log,
commit or close waits for that call to return. SIGKILL cannot be caught: it loses what was appended
since the last commit, nothing more (committed shards are durable).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["register", "unregister", "guarded", "finish_all", "disable"]

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.Lock()
_open: dict[int, tuple[int, int, weakref.ref[Any], int]] = {}  # id -> (tier, order, object, process id)
_order = itertools.count()
_hooked = False
_enabled = True
_depth = 0  # guarded calls of the main thread in progress
_pending: int | None = None  # a SIGTERM that arrived during one of them
_previous: Any = None  # the SIGTERM disposition before ours


def disable() -> None:
    """No exit commits in this process (conversion workers: the driver discards their parts)."""
    global _enabled
    _enabled = False


def register(obj: Any, tier: int) -> None:
    """Finish ``obj`` (``obj._commit_at_exit(why)``) at exit unless it is unregistered first. Lower
    tiers finish first (a logger before writers), the newest first within a tier."""
    global _hooked
    if not _enabled:
        return
    with _lock:
        _open[id(obj)] = (tier, next(_order), weakref.ref(obj), os.getpid())
        if not _hooked:
            _hooked = True
            _hook()


def unregister(obj: Any) -> None:
    with _lock:
        _open.pop(id(obj), None)


def _hook() -> None:
    import concurrent.futures.thread  # noqa: F401 - its exit hook is registered first, so runs after ours

    register_exit = getattr(threading, "_register_atexit", atexit.register)  # (no such hook in this Python: atexit)
    try:
        register_exit(finish_all)
    except RuntimeError:  # the interpreter is shutting down already
        atexit.register(finish_all)
    global _previous
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):  # no signals here (an embedded interpreter)
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                _previous = signal.signal(signal.SIGTERM, _on_sigterm)


def finish_all(why: str = "exit") -> None:
    """Finish every registered object still open (see the module docs). Never raises. A forked child
    (a DataLoader worker) inherits the list and the exit hook: it finishes only what it opened itself,
    never its parent's writers (whose files and threads are the parent's)."""
    pid = os.getpid()
    with _lock:
        entries = sorted((e for e in _open.values() if e[3] == pid), key=lambda e: (e[0], -e[1]))
        _open.clear()
    for _tier, _k, ref, _pid in entries:
        obj = ref()
        if obj is None:
            continue
        try:
            line = obj._commit_at_exit(why)
        except BaseException as exc:  # noqa: BLE001 - one failure must not keep the others from finishing
            line = f"seqstore: {obj!r} could not commit at {why}: {type(exc).__name__}: {exc}"
        if line:
            with contextlib.suppress(OSError, ValueError, RuntimeError):  # stderr closed, or busy in interrupted code
                print(line, file=sys.stderr, flush=True)


def _on_sigterm(signum: int, frame: Any) -> None:
    global _pending
    if _depth > 0:
        _pending = signum  # the main thread is inside a writer's call: finish when it returns
        return
    _terminate(signum)


def _terminate(signum: int) -> None:
    finish_all("SIGTERM")
    signal.signal(signum, signal.SIG_DFL if _previous is None else _previous)
    os.kill(os.getpid(), signum)


def guarded(method: F) -> F:
    """A writer's or logger's method: SIGTERM waits for it to return; an interrupt (an exception that
    is not an ``Exception``, such as KeyboardInterrupt) escaping it marks the object ``_exit_unsafe``."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _depth, _pending
        main = threading.current_thread() is threading.main_thread()
        if main:
            _depth += 1
        try:
            return method(self, *args, **kwargs)
        except Exception:
            raise
        except BaseException:
            self._exit_unsafe = True
            raise
        finally:
            if main:
                _depth -= 1
                if _depth == 0 and _pending is not None:
                    signum, _pending = _pending, None
                    _terminate(signum)

    return call  # type: ignore[return-value]
