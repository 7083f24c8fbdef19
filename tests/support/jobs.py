"""Conversion jobs for tests of ``interop._parallel`` (importable by its worker processes)."""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class KillingJob:
    """Unit ``k`` is one record ``{"x": k}``; the worker writing unit ``victim`` kills itself (SIGKILL), as
    the operating system ends a process that ran out of memory."""

    victim: int

    def write(self, writer: Any, k: int, progress: Any) -> None:
        if k == self.victim:
            os.kill(os.getpid(), signal.SIGKILL)
        writer.append({"x": np.int64(k)})

    def describe(self, k: int) -> str:
        return f"input-{k}"
