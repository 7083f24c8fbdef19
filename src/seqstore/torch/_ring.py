"""Worker processes that gather into a ring of shared buffers (``SeqDataLoader(procs=K)``).

A DataLoader worker hands every batch over in a new shared-memory segment and a pickle; on a few cores
that costs more than the gather. Here the loop's process draws the index arrays (the sampler stays in
one place, so resume states are exact as without workers) and sends batch ``j`` to worker ``j mod K``
as (slot, index array). The worker gathers it with the same :class:`~._direct.Gatherer` and copies the
tensors into its slot of one shared-memory block made once per iteration (``K x depth`` slots), and
answers with the layout (name, dtype, shape, offset), a few hundred bytes. The loop hands out tensors
that are views of the slot and gives the slot back to its worker once no tensor (or view of one) uses
it any more; with ``pin_memory``, or when the loop holds so many batches that the worker would have no
free slot, it copies the batch out instead (page-locked with ``pin_memory``) and frees the slot at
once. A batch larger than a slot comes over the pipe instead (correct, slower); slots are sized at
four times the first batch, which the loop gathers itself.

On a remote store the index arrays of the next batches also go to their workers early (``ahead``), so
that their reads are in flight while the workers gather (``Store.prefetch``).

Memory: the block (``K x depth x slot`` bytes, flat in N) plus one batch per worker. The block's name
is unlinked when the iteration ends; its memory goes when the last batch handed out as views does.
"""

from __future__ import annotations

import multiprocessing
import sys
import traceback
from collections import deque
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np
import torch

from ..errors import SeqstoreError
from ._direct import Gatherer, IndexArray

__all__ = ["run_processes", "LoaderWorkerError"]

_ALIGN = 64
Layout = list[tuple[str, str, tuple[int, ...], int]]


class LoaderWorkerError(SeqstoreError, RuntimeError):
    """A loader worker process failed without an exception that could come back, or exited."""


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise LoaderWorkerError(f"loader worker sent an unknown dtype {name!r}")
    return dt


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` as a flat uint8 tensor (a view when contiguous)."""
    flat = t.contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def _worker(conn: Connection, gather: Gatherer, shm_name: str, slot_bytes: int) -> None:
    """Loop of one worker: (slot, indices) in, ("ok", layout) / ("big", layout, bytes) / ("error", exc) out;
    ("ahead", indices): a later batch, whose reads start at once. Every message waiting is taken before
    a batch is gathered, so the reads of the batches sent ahead are in flight while it waits for its own."""
    torch.set_num_threads(1)
    shm = SharedMemory(name=shm_name)
    jobs: deque[tuple[int, IndexArray]] = deque()
    try:
        while True:
            while not jobs or conn.poll():
                msg = conn.recv()
                if msg is None:
                    return
                if msg[0] == "ahead":  # (a remote store's answers take tens of milliseconds)
                    try:
                        gather.prefetch(msg[1])
                    except Exception:  # noqa: BLE001 - advice only: the batch's own gather reports the error
                        pass
                else:
                    jobs.append(msg)
            slot, idx = jobs.popleft()
            try:
                batch = gather(idx)
                layout: Layout = []
                pos = 0
                for name, t in batch.items():
                    layout.append((name, str(t.dtype), tuple(t.shape), pos))
                    pos += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
                if pos <= slot_bytes:
                    base = slot * slot_bytes
                    for (_, _, _, off), t in zip(layout, batch.values()):
                        raw = _bytes_of(t)
                        if raw.numel():
                            dst = torch.frombuffer(shm.buf, dtype=torch.uint8, count=raw.numel(), offset=base + off)
                            dst.copy_(raw)
                    conn.send(("ok", layout))
                else:
                    conn.send(("big", layout, [_bytes_of(t).numpy().tobytes() for t in batch.values()]))
            except Exception as exc:  # noqa: BLE001 - sent to the loop, raised there
                try:
                    conn.send(("error", exc))
                except Exception:  # noqa: BLE001 - not picklable: its text then
                    conn.send(("error", LoaderWorkerError(
                        f"loader worker failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")))
    except (EOFError, KeyboardInterrupt):
        return
    finally:
        shm.close()


def _batch_from(layout: Layout, buf: Any, base: int, pin: bool) -> dict[str, torch.Tensor]:
    """The batch at ``base`` of ``buf``: tensors over ``buf`` itself (``pin``: copies, page-locked)."""
    out: dict[str, torch.Tensor] = {}
    for name, dtype, shape, off in layout:
        dt = _dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dt).element_size()
        if n == 0:
            out[name] = torch.empty(shape, dtype=dt)
            continue
        t = torch.frombuffer(buf, dtype=torch.uint8, count=n, offset=base + off).view(dt).view(shape)
        out[name] = t.clone().pin_memory() if pin else t
    return out


class _Lent:
    """A slot whose batch the loop handed out as views: free again once no tensor uses its buffer.

    The tensors keep a reference to ``holder[0]`` (a memoryview of the slot, made for this batch) for
    as long as their storage lives, views and NumPy arrays of them included; the slot is free when
    the reference count is back to what this object alone holds."""

    __slots__ = ("slot", "holder")

    def __init__(self, slot: int, view: memoryview) -> None:
        self.slot = slot
        self.holder = [view]

    def free(self) -> bool:
        # references: ``holder`` and getrefcount's own argument; every live storage adds one
        return sys.getrefcount(self.holder[0]) <= 2


#: blocks of finished iterations whose batches the training loop still holds (closed once it lets go)
_LINGERING: list[SharedMemory] = []


def _close_lingering() -> None:
    still = []
    for shm in _LINGERING:
        try:
            shm.close()
        except BufferError:  # batches of it still alive
            still.append(shm)
    _LINGERING[:] = still


def run_processes(first: dict[str, torch.Tensor], arrays: Iterator[IndexArray], gather: Gatherer, procs: int, *,
                  depth: int = 3, context: Any = None, pin: bool = False,
                  ahead: int = 0) -> Iterator[dict[str, torch.Tensor]]:
    """``first`` (the first batch, gathered by the caller), then the batches of ``arrays`` in order,
    gathered by ``procs`` worker processes into shared slots (see the module docstring). ``context``: a
    multiprocessing context or start method name. ``ahead``: batches past those given to the workers whose
    index arrays they get early, to start reading them (a remote store: without it every batch waits for
    its answers, about 90 MB/s for a block-shuffled epoch in the benchmark)."""
    source = iter(arrays)
    early: deque[IndexArray] = deque()  # drawn from ``source`` and sent ahead, not yet given to a worker

    def drawn() -> Iterator[IndexArray]:
        while True:
            if early:
                yield early.popleft()
                continue
            idx = next(source, None)
            if idx is None:
                return
            yield idx

    it = drawn()
    ctx: Any = multiprocessing.get_context(context) if context is None or isinstance(context, str) else context
    size = sum(-(-t.numel() * t.element_size() // _ALIGN) * _ALIGN for t in first.values())
    slot_bytes = max(4 * size, 1 << 16)
    nslots = procs * depth
    shm = SharedMemory(create=True, size=slot_bytes * nslots)
    block = shm.buf
    assert block is not None
    conns: list[Connection] = []
    workers: list[Any] = []
    try:
        for _ in range(procs):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(theirs, gather, shm.name, slot_bytes), daemon=True,
                            name="seqstore-loader")
            p.start()
            theirs.close()
            conns.append(mine)
            workers.append(p)
        # batch j (counted after the first) goes to worker j % procs, into a slot of that worker
        pending: deque[tuple[int, int]] = deque()  # (worker, slot), in batch order
        free = [list(range(w * depth, (w + 1) * depth)) for w in range(procs)]
        lent: list[list[_Lent]] = [[] for _ in range(procs)]
        j = 0

        def reclaim(w: int) -> None:
            still = []
            for entry in lent[w]:
                if entry.free():
                    free[w].append(entry.slot)
                else:
                    still.append(entry)
            lent[w] = still

        def send_next() -> bool:
            nonlocal j
            w = j % procs
            if not free[w]:
                reclaim(w)
                if not free[w]:
                    return False
            idx = next(it, None)
            if idx is None:
                return False
            slot = free[w].pop()
            conns[w].send((slot, np.ascontiguousarray(idx, dtype=np.int64)))
            pending.append((w, slot))
            j += 1
            while len(early) < ahead:  # the next ``ahead`` batches' index arrays go to their workers early
                nxt = next(source, None)
                if nxt is None:
                    break
                nxt = np.ascontiguousarray(nxt, dtype=np.int64)
                conns[(j + len(early)) % procs].send(("ahead", nxt))
                early.append(nxt)
            return True

        while send_next():
            pass
        yield {k: v.pin_memory() for k, v in first.items()} if pin else first
        del first
        while pending:
            w, slot = pending.popleft()
            try:
                while not conns[w].poll(1.0):  # a worker that died without its pipe closing is noticed too
                    if not workers[w].is_alive():
                        raise EOFError
                msg = conns[w].recv()
            except (EOFError, OSError):
                workers[w].join(timeout=1)
                code = workers[w].exitcode
                raise LoaderWorkerError(f"loader worker {w} (pid {workers[w].pid}) exited unexpectedly "
                                        f"(exit code {code})") from None
            if msg[0] == "error":
                raise msg[1]
            if msg[0] == "ok":
                reclaim(w)
                # hand out views of the slot unless the loop holds so many batches that the worker would
                # be left without a slot to gather into: then a copy, and the slot is free at once
                if pin or len(lent[w]) >= depth - 1:
                    batch = _batch_from(msg[1], block, slot * slot_bytes, pin=True) if pin else {
                        k: v.clone() for k, v in _batch_from(msg[1], block, slot * slot_bytes, False).items()}
                    free[w].append(slot)
                else:
                    entry = _Lent(slot, block[slot * slot_bytes:(slot + 1) * slot_bytes])
                    batch = _batch_from(msg[1], entry.holder[0], 0, False)
                    lent[w].append(entry)
            else:
                batch = {}
                for (name, dtype, shape, _), raw in zip(msg[1], msg[2]):
                    dt = _dtype(dtype)
                    t = torch.frombuffer(bytearray(raw), dtype=dt) if raw else torch.empty(0, dtype=dt)
                    batch[name] = t.reshape(shape)
                free[w].append(slot)
            while send_next():
                pass
            yield batch
    finally:
        for c in conns:
            try:
                c.send(None)
            except Exception:  # noqa: BLE001 - a worker gone, or interpreter shutdown
                pass
        for p in workers:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join()
        for c in conns:
            c.close()
        shm.unlink()  # the name goes now; the memory when the last batch handed out as views does
        _LINGERING.append(shm)
        _close_lingering()
