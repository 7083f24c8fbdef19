"""A message read from a ``multiprocessing`` pipe within a time limit (:mod:`seqstore.torch._ring`)."""

from __future__ import annotations

import math
import os
import select
import struct
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

__all__ = ["recv_bounded"]


def recv_bounded(conn: Connection, idle: float, until: float = math.inf) -> Any:
    """``conn.recv()`` that raises TimeoutError once nothing came for ``idle`` seconds, or at ``until``
    (``time.monotonic()``), the message read in part then (the pipe is of no use after that); EOFError where
    the other end closed before a message began, OSError where it closed in the middle of one. (The bytes
    are those ``Connection.send`` writes: a 4-byte size, -1 then an 8-byte one for a message over 2 GiB.)"""
    fd = conn.fileno()
    ready = select.poll()
    ready.register(fd, select.POLLIN)

    def read(n: int, first: bool) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            now = time.monotonic()
            if not ready.poll(max(0, math.ceil(min(idle, until - now) * 1000))):
                raise TimeoutError
            k = os.readv(fd, [view[got:]])
            if not k:
                if first and not got:
                    raise EOFError
                raise OSError("got end of file during message")
            got += k
        return buf

    size, = struct.unpack("!i", read(4, True))
    if size == -1:
        size, = struct.unpack("!Q", read(8, False))
    return ForkingPickler.loads(read(size, False))
