"""A message read from a ``multiprocessing`` pipe within a time limit (:mod:`seqstore.torch._ring`)."""

from __future__ import annotations

import math
import os
import select
import struct
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

__all__ = ["recv_bounded"]


def recv_bounded(conn: Connection, idle: float = math.inf, until: float = math.inf,
                 alive: Callable[[], bool] | None = None) -> Any:
    """``conn.recv()`` that raises TimeoutError once nothing came for ``idle`` seconds, or at ``until``
    (``time.monotonic()``), the message read in part then (the pipe is of no use after that); EOFError where
    the other end closed before a message began, OSError where it closed in the middle of one, or where
    ``alive()`` (asked each second nothing comes) says the process writing it has ended (its end of the pipe
    may be held open by a process it started). (The bytes are those ``Connection.send`` writes: a 4-byte
    size, -1 then an 8-byte one for a message over 2 GiB.)"""
    fd = conn.fileno()
    ready = select.poll()
    ready.register(fd, select.POLLIN)

    def read(n: int, first: bool) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        last = time.monotonic()
        while got < n:
            left = min(last + idle, until) - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if not ready.poll(math.ceil(min(left, 1.0) * 1000)):
                if alive is not None and not alive() and not ready.poll(0):  # (what it wrote before it ended)
                    raise OSError("the process writing the pipe ended in the middle of a message")
                continue
            k = os.readv(fd, [view[got:]])
            if not k:
                if first and not got:
                    raise EOFError
                raise OSError("got end of file during message")
            got += k
            last = time.monotonic()
        return buf

    size, = struct.unpack("!i", read(4, True))
    if size == -1:
        size, = struct.unpack("!Q", read(8, False))
    return ForkingPickler.loads(read(size, False))
