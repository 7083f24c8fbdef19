"""Ctrl-C held off while a loop cleans up after itself; what a worker's exit by a signal says; which worker and
batch a worker's error came from."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from ..errors import LoaderWorkerError

__all__ = ["InterruptsIgnored", "LoaderWorkerError", "killed_by", "with_context"]


class InterruptsIgnored:
    """``with`` it, SIGINT is ignored, in the main thread where Python's handler is set (elsewhere a no-op).
    For a loop ending its workers (bounded waits): a second Ctrl-C neither cuts that short nor, in a
    generator closed by the garbage collector, prints "Exception ignored in generator"; the loop ends
    anyway, most often on the first one (as in the CLI, the later ones are ignored). Made before it is
    needed: the functions it calls are its own, so it works at interpreter shutdown too."""

    def __init__(self) -> None:
        self._signal, self._getsignal = signal.signal, signal.getsignal
        self._current, self._main = threading.current_thread, threading.main_thread
        self._sigint, self._ignore = signal.SIGINT, signal.SIG_IGN
        self._old: Any = None

    def __enter__(self) -> None:
        try:
            if self._current() is self._main():
                self._old = self._getsignal(self._sigint)  # None: not Python's handler, left as it is
                if self._old is not None:
                    self._signal(self._sigint, self._ignore)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing to hold off
            self._old = None

    def __exit__(self, *exc: object) -> None:
        old, self._old = self._old, None
        if old is not None:
            try:
                self._signal(self._sigint, old)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass


def killed_by(exitcode: int | None, shared: int) -> str:
    """The words a worker's exit code adds to its error: the signal that ended it (a negative code), and for
    SIGBUS -- what a process gets that writes to shared memory ``/dev/shm`` has no room for (a container's
    64 MiB) -- ``/dev/shm``'s free space, the ``shared`` bytes of the loop's shared block and what to do;
    "" for a process that exited by itself."""
    if exitcode is None or exitcode >= 0:
        return ""
    try:
        sig = signal.Signals(-exitcode)
    except ValueError:
        return ""
    if sig.name != "SIGBUS":
        return f": killed by {sig.name}"
    try:
        st = os.statvfs("/dev/shm")
        free = f"{st.f_bavail * st.f_frsize} bytes free"
    except OSError:
        free = "not there"
    return (f": killed by SIGBUS, as a process is that writes to shared memory /dev/shm has no room for (/dev/shm: "
            f"{free}; the loop's shared block of {shared} bytes); give /dev/shm more room (e.g. docker run "
            "--shm-size=2g), or use fewer procs= or threads=")


def with_context(exc: BaseException, where: str) -> BaseException:
    """A worker's error ``exc`` with ``where`` (the worker, the batch) before its message: a new exception of
    its class, ``exc`` its cause; where the class cannot be made from a message alone, ``exc`` itself with
    ``where`` as a note (Python >= 3.11)."""
    try:  # (an OSError keeps its errno and file name; other attributes, a RemoteError's url, are copied)
        again = type(exc)(exc.errno, f"{where}: {exc.strerror}", exc.filename) \
            if isinstance(exc, OSError) and exc.errno is not None else type(exc)(f"{where}: {exc}")
        again.__dict__.update(exc.__dict__)
    except Exception:  # noqa: BLE001 - a class whose constructor wants more than a message
        again = None
    if again is None or where not in str(again):
        if hasattr(exc, "add_note"):
            exc.add_note(where)
        return exc
    again.__cause__ = exc
    return again
