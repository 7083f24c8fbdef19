"""Ctrl-C held off while a loop cleans up after itself."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["InterruptsIgnored"]


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
