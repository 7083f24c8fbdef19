"""Worker processes that gather into a ring of shared buffers (``SeqDataLoader(procs=K)``).

A DataLoader worker hands every batch over in a new shared-memory segment and a pickle; on a few cores that costs
more than the gather. Here the loop's process draws the index arrays (the sampler stays in one place, so resume
states are exact as without workers) and sends batch ``j`` to worker ``j mod K`` as (slot, index array). The worker
gathers it with the same :class:`~._direct.Gatherer` and copies the tensors into its slot of one shared-memory block
made once per iteration (``K x depth`` slots), and answers with the layout (name, dtype, shape, offset), a few
hundred bytes. The loop hands out tensors that are views of the slot and gives the slot back to its worker once no
tensor (or view of one) uses it any more; with ``pin_memory``, or when the loop holds so many batches that the
worker would have no free slot, it copies the batch out instead (page-locked with ``pin_memory``) and frees the slot
at once. A batch larger than a slot comes over the pipe instead (correct, slower); slots are sized at four times the
first batch, which the loop gathers itself.

Who gathers is measured (:class:`Chooser`): where the loop's process gathers a batch in less time than it waits for
a worker's (no training step, no spare core), it gathers the batches itself and the workers get none until they are
tried again; the batches and their order are the same either way.

On a remote store the index arrays of the next runs of batches also go to their workers early (``ahead``), so that
their reads are in flight while the workers gather (one ``Store.prefetch`` of a worker's batches of a run); there
the workers always gather.

On a read-once store the workers do not read the store: the loop fetches the runs of batches (``Store.fetch_runs``)
into files in ``/dev/shm`` (:class:`RunBuffers`, reused), and sends batch ``j`` as (slot, index array, where its
bytes lie in which of those files). The worker maps the files (once each) and gathers each field's values straight
into its slot (``Store.gather_fetched`` with the batch's exported parts, found in its own mappings of the store, and
an allocator in the slot). A run's buffer is reused once every worker that read it answered; a buffer the loop no
longer keeps is removed and the workers told to unmap it.

Memory: the block (``K x depth x slot`` bytes, flat in N) plus one batch per worker, and with a read-once store the
run buffers (bounded by ``max_inflight_bytes``, plus at most ``K x depth`` batches' runs held for the workers). The
block's name is unlinked when the iteration ends; its memory goes when the last batch handed out as views does.
"""

from __future__ import annotations

import contextlib
import functools
import math
import multiprocessing
import os
import pickle
import select
import signal
import struct
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np
import torch

from ..io import address
from ._chooser import Chooser, cores
from ._direct import Gatherer, ahead_in_runs, pinned
from ._pipe import recv_bounded
from ._runs import SHM_DIR, RunBuffers, attach_run
from ._signals import InterruptsIgnored, LoaderWorkerError, killed_by, with_context

__all__ = ["run_processes", "Chooser", "LoaderWorkerError", "RunBuffers", "SHM_NEEDED", "shared_runs_possible"]

_ALIGN = 64
Layout = list[tuple[str, str, tuple[int, ...], int]]


@functools.cache
def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise LoaderWorkerError(f"loader worker sent an unknown dtype {name!r}")
    return dt


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` as a flat uint8 tensor (a view when contiguous)."""
    flat = t.contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def _worker(conn: Connection, gather: Gatherer, shm_name: str, slot_bytes: int, inherited: list[int]) -> None:
    """Loop of one worker: (slot, indices) in, ("ok", layout) / ("big", layout, bytes) / ("error", exc) out;
    ("ahead", run): later batches' index arrays, whose reads start at once. Every message waiting is taken
    before a batch is gathered, so the reads of the batches sent ahead are in flight while it waits for its own.
    (slot, indices, run parts): a read-once loop's batch, gathered from its run buffers (``attach_run``);
    ("forget", name): a run buffer no longer used. ``inherited``: the loop's ends of the pipes, which a
    forked worker holds copies of; closed first, so that the loop's process ending, even by SIGKILL,
    ends the pipe for the worker (else it would wait for a message for ever). SIGTERM ends it as it ends a
    process by default: a forked worker would otherwise run the script's own handler (a framework's, which
    notes it for a graceful stop), and a stuck worker ended by the loop would go on."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for fd in inherited:
        with contextlib.suppress(OSError):
            os.close(fd)
    torch.set_num_threads(1)
    shm = SharedMemory(name=shm_name)
    jobs: deque[tuple[Any, ...]] = deque()
    runs: dict[str, Any] = {}  # a read-once loop's run buffers mapped here, by name
    stop = False

    def take(msg: Any) -> None:
        nonlocal stop
        if msg is None:
            stop = True
        elif msg[0] == "ahead":  # (a remote store's answers take tens of milliseconds)
            with contextlib.suppress(Exception):  # advice only: the batch's own gather reports the error
                gather.prefetch(msg[1])
        elif msg[0] == "forget":
            runs.pop(msg[1], None)
        else:
            jobs.append(msg)

    try:
        while True:
            while not jobs or conn.poll():
                take(conn.recv())
                if stop:
                    return
            try:
                answer = _serve(jobs.popleft(), gather, shm, slot_bytes, runs)
            except Exception as exc:  # noqa: BLE001 - sent to the loop, raised there
                answer = ("error", exc)
                try:
                    pickle.loads(pickle.dumps(exc))  # (the loop's recv would fail on one that cannot be made again)
                except Exception:  # noqa: BLE001 - not picklable, or not unpicklable: its text then
                    answer = ("error", LoaderWorkerError(
                        f"loader worker failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
            if answer[0] != "ok":  # a batch or an error that may be larger than the pipe holds: the loop may
                # itself be blocked sending us a message larger than the pipe holds (a large index array), and
                # each would wait for the other to read; the messages it sends meanwhile go to ``take``
                _send_bounded(conn, answer, take=take)
            else:
                conn.send(answer)
            del answer  # (an error's traceback holds the slot's memory, which shm.close() below needs free)
            if stop:
                return
    except (EOFError, ConnectionError, KeyboardInterrupt):  # the loop's process is gone: a broken pipe, or a
        return  # reset one (a socket: the loop's end closed with answers unread in it)
    finally:  # an error still referenced after it was sent (a remote read's, seen) holds a slot's array in
        with contextlib.suppress(BufferError):  # its traceback: the block's mapping then goes with the process
            shm.close()


def _send_bounded(conn: Connection, msg: Any, *, take: Callable[[Any], None] | None = None,
                  until: float | None = None, alive: Callable[[], bool] | None = None) -> bool:
    """``conn.send(msg)`` written without blocking: while the pipe is full, messages coming the other way go
    to ``take`` (where given), and at ``until`` (``time.monotonic()``) the send gives up: False, the message
    written in part (the pipe is of no use after that); where ``alive()`` (asked each second the pipe stays
    full) says the reader has ended, BrokenPipeError (its end may be held open by a process it started).
    (The bytes on the pipe are those of ``Connection.send``; the loop sends each message whole, so one that
    has begun is read at once.)"""
    data = ForkingPickler.dumps(msg, 5)  # (protocol 5: a bytearray comes back as one, not bytes to copy)
    n = len(data)
    head = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    fd = conn.fileno()
    ready = select.poll()
    ready.register(fd, (select.POLLIN if take is not None else 0) | select.POLLOUT)
    os.set_blocking(fd, False)
    try:
        for buf in (memoryview(head), memoryview(data).cast("B")):
            while len(buf):
                try:
                    buf = buf[os.write(fd, buf):]
                except BlockingIOError:
                    wait = -1 if until is None else max(0, math.ceil((until - time.monotonic()) * 1000))
                    if alive is not None:
                        wait = 1000 if wait < 0 else min(wait, 1000)
                    events = ready.poll(wait)
                    if take is not None and any(ev & select.POLLIN for _, ev in events):  # its message in whole
                        os.set_blocking(fd, True)
                        take(conn.recv())
                        os.set_blocking(fd, False)
                    elif not events and until is not None and time.monotonic() >= until:
                        return False
                    elif not events and alive is not None and not alive():
                        raise BrokenPipeError("the process reading the pipe has ended") from None
    finally:
        os.set_blocking(fd, True)
    return True


def _serve(job: tuple[Any, ...], gather: Gatherer, shm: SharedMemory, slot_bytes: int,
           runs: dict[str, Any]) -> tuple[Any, ...]:
    """One batch of a worker into its slot of ``shm``: the answer for the loop. A read-once batch's
    values are gathered straight into the slot; other tensors (and a batch gathered by ``gather``) are
    copied in after them, or sent whole when they do not fit."""
    slot, idx, *fetched = job
    if isinstance(idx, bytes):
        idx = np.frombuffer(idx, np.int64)
    base = slot * slot_bytes
    assert shm.buf is not None
    block = np.frombuffer(shm.buf, np.uint8)[base : base + slot_bytes]
    used = 0
    if fetched:

        def alloc(n: int) -> np.ndarray[Any, Any]:
            nonlocal used
            end = -(-(used + n) // _ALIGN) * _ALIGN
            if end > slot_bytes:  # does not fit: a new array, copied below (or sent whole)
                return np.empty(n, np.uint8)
            view: np.ndarray[Any, Any] = block[used : used + n]
            used = end
            return view

        parts = [(exported, attach_run(runs, name)) for exported, name in fetched[0]]
        batch = gather.gather_fetched(idx, parts, alloc)
    else:
        batch = gather(idx)
    start = address(block)
    layout: Layout = []
    placed = []  # whether the tensor lies in the slot already
    pos = used
    for name, t in batch.items():
        n = t.numel() * t.element_size()
        at = t.data_ptr() - start
        inside = bool(n) and t.is_contiguous() and 0 <= at and at + n <= used
        layout.append((name, str(t.dtype), tuple(t.shape), at if inside else pos))
        placed.append(inside)
        if not inside:
            pos += -(-n // _ALIGN) * _ALIGN
    if pos > slot_bytes:
        return ("big", layout, [bytearray(_bytes_of(t).numpy()) for t in batch.values()])
    for (_, _, _, off), t, inside in zip(layout, batch.values(), placed):
        raw = _bytes_of(t)
        if raw.numel() and not inside:
            torch.from_numpy(block[off : off + raw.numel()]).copy_(raw)
    return ("ok", layout)


#: free space ``/dev/shm`` must have for a read-once loop to put its run buffers there (a container's
#: default of 64 MiB does not: its workers then read through the node cache)
SHM_NEEDED = 1 << 30


def shared_runs_possible() -> bool:
    """Whether run buffers can be shared with the workers by name: a writable ``/dev/shm`` with
    ``SHM_NEEDED`` bytes free."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return False
    return os.access(SHM_DIR, os.W_OK) and st.f_bavail * st.f_frsize >= SHM_NEEDED


def _batch_from(layout: Layout, buf: Any, base: int, pin: bool) -> dict[str, torch.Tensor]:
    """The batch at ``base`` of ``buf``: tensors over ``buf`` itself (``pin``: page-locked copies, one each)."""
    out: dict[str, torch.Tensor] = {}
    for name, dtype, shape, off in layout:
        dt = _dtype(dtype)
        n = math.prod(shape)
        t = torch.frombuffer(buf, dtype=dt, count=n, offset=base + off) if n else torch.empty(shape, dtype=dt)
        if len(shape) != 1:
            t = t.view(shape)
        out[name] = t.pin_memory() if pin else t
    return out


class _Lent:
    """A slot whose batch the loop handed out as views: free again once no tensor uses its memory.

    The batch's tensors are made over a NumPy array of the slot made for this batch alone, which each
    tensor's storage holds for as long as it lives (views and NumPy arrays of them included); the loop
    holds only a weak reference to it, and the slot is free once the array is gone (no reference count
    read: their values differ between Python versions)."""

    __slots__ = ("slot", "_array")

    def __init__(self, slot: int, array: np.ndarray[Any, Any]) -> None:
        self.slot = slot
        self._array = weakref.ref(array)

    def free(self) -> bool:
        return self._array() is None


def _lend(layout: Layout, block: memoryview, slot: int, slot_bytes: int) -> tuple[dict[str, torch.Tensor], _Lent]:
    """The batch of ``layout`` in slot ``slot`` as views of it, and its :class:`_Lent` (the array the views hold
    is made here, so that no frame of the loop keeps it)."""
    array = np.frombuffer(block[slot * slot_bytes:(slot + 1) * slot_bytes], np.uint8)
    return _batch_from(layout, array, 0, False), _Lent(slot, array)


class _Block(SharedMemory):
    """The ring's block in the loop's process. Batches handed out as views may outlive it (a script ending
    holding one): ``SharedMemory.__del__`` would then report an ignored ``BufferError``; the mapping goes with them."""

    def __del__(self) -> None:
        try:  # (no module globals here: at shutdown they may be gone)
            super().__del__()
        except BufferError:
            pass


class _Open:
    """The referent of a running loop's at-exit finalizer (held by the loop's frame until it ends)."""


def _unlink_block(shm: SharedMemory) -> None:
    with contextlib.suppress(FileNotFoundError):
        shm.unlink()


def run_processes(first: dict[str, torch.Tensor], arrays: Iterator[Any], gather: Gatherer, procs: int, *,
                  depth: int = 3, context: Any = None, pin: bool = False, ahead: int = 0, timeout: float = 0,
                  runs: RunBuffers | None = None, chooser: Chooser | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """``first`` (the first batch, gathered by the caller), then the batches of ``arrays`` in order,
    gathered by ``procs`` worker processes into shared slots (see the module docstring). ``context``: a
    multiprocessing context or start method name. ``ahead``: batches in a run whose index arrays a worker gets
    early (a run before its first batch is given out), to start reading them (a remote store: without it
    every batch waits for its answers, about 90 MB/s for a block-shuffled epoch in the benchmark). ``runs``:
    ``arrays`` yields ``(idx, parts)`` of a read-once store's ``fetch_runs`` into buffers of ``runs``; each
    worker gathers its batch from them, and the parts are released once its answer is in. ``chooser``: who gathers the
    batches (a :class:`Chooser` by default; None with ``ahead``, where the loop's process would wait out each
    batch's round trips itself). ``timeout``: seconds a worker may take to answer (0: no limit)."""
    sent = 0  # batches sent ahead: batch j (counted after the first) is worker j % procs's

    def send_ahead(run: list[Any]) -> None:  # each worker gets its own batches of the run, as one
        nonlocal sent
        for w in range(procs):
            if mine := run[(w - sent) % procs :: procs]:
                post(w, ("ahead", mine))
        sent += len(run)

    it = ahead_in_runs(arrays, send_ahead, ahead) if ahead else iter(arrays)
    ctx: Any = multiprocessing.get_context(context) if context is None or isinstance(context, str) else context
    size = sum(-(-t.numel() * t.element_size() // _ALIGN) * _ALIGN for t in first.values())
    slot_bytes = max(4 * size, 1 << 16)
    nslots = procs * depth
    # a loop left open until the interpreter exits: the name goes at exit, before the resource tracker
    # reports it as leaked (the daemon workers are ended by multiprocessing's own exit handler)
    opened, quiet = _Open(), InterruptsIgnored()  # live as long as this frame
    # (the clean-up may run at shutdown, globals gone)
    monotonic, send_bounded, recv = time.monotonic, _send_bounded, recv_bounded
    with quiet:  # (a Ctrl-C between the two would leave the name in /dev/shm)
        shm = _Block(create=True, size=slot_bytes * nslots)
        at_exit = weakref.finalize(opened, _unlink_block, shm)
    block = shm.buf
    assert block is not None
    conns: list[Connection] = []
    workers: list[Any] = []
    pending: deque[tuple[int, int, Any]] = deque()  # (worker, slot, parts held for it), in batch order: batch j
    # (counted after the first) goes to worker j % procs, into a slot of that worker
    pollers: list[Any] = []  # one a worker: Connection.poll builds a selector a call

    def exited(w: int) -> LoaderWorkerError:
        workers[w].join(timeout=1)
        return LoaderWorkerError(f"loader worker {w} (pid {workers[w].pid}) exited unexpectedly "
                                 f"(exit code {workers[w].exitcode}{killed_by(workers[w].exitcode, shm.size)})")

    # the workers that gave no batch (or took no message) within ``timeout``: ended at once at the end. One
    # that took no message has it written in part on its pipe: nothing more is written there (it would read
    # the rest of it as that message's), even where the timeout was not raised (a run's reads sent ahead)
    stuck: set[int] = set()

    def refused(w: int) -> LoaderWorkerError:  # (nor is its answer waited for: it may be waiting for the rest)
        return LoaderWorkerError(f"loader worker {w} (pid {workers[w].pid}) timed out earlier: it took nothing "
                                 f"sent to it in {timeout}s (busy with a batch, its pipe full); nothing more is "
                                 "sent to it or taken from it")

    def post(w: int, msg: Any) -> None:  # a worker gone (its pipe broken: one that died resting) is named
        if w in stuck:
            raise refused(w)
        try:
            if timeout <= 0:  # (a worker gone is seen while its pipe is full: a process it started may hold it)
                _send_bounded(conns[w], msg, alive=workers[w].is_alive)
            elif not _send_bounded(conns[w], msg, until=time.monotonic() + timeout,
                                   alive=workers[w].is_alive):  # its pipe stayed full
                stuck.add(w)
                raise LoaderWorkerError(f"loader worker {w} (pid {workers[w].pid}) took nothing sent to it in "
                                        f"{timeout}s (busy with a batch, its pipe full)")
        except OSError:
            stuck.add(w)  # (gone: nothing more is sent to it or waited for at the end)
            raise exited(w) from None

    def start_workers() -> None:
        forked = ctx.get_start_method() == "fork"  # (spawned and forkserver workers hold only their own end)
        for _ in range(procs):
            mine, theirs = ctx.Pipe()
            inherited = [c.fileno() for c in (*conns, mine)] if forked else []
            p = ctx.Process(target=_worker, args=(theirs, gather, shm.name, slot_bytes, inherited), daemon=True,
                            name="seqstore-loader")
            try:
                p.start()
            except BaseException:  # (a start refused, a gather that does not pickle): its pipe is nobody's
                mine.close()
                raise
            finally:
                theirs.close()
            conns.append(mine)
            workers.append(p)
            pollers.append(select.poll())
            pollers[-1].register(mine.fileno(), select.POLLIN)
        if runs is not None:

            def tell(msg: Any) -> None:
                for w in range(procs):
                    post(w, msg)

            runs.tell = tell

    try:
        free = [list(range(w * depth, (w + 1) * depth)) for w in range(procs)]
        lent: list[list[_Lent]] = [[] for _ in range(procs)]
        j = 0
        failed: list[Exception] = []  # the error that ended the drawing of the batches ahead (a fetch's)

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
            try:
                item = None if failed else next(it, None)
            except Exception as exc:  # noqa: BLE001 - raised where its batch is due, after those drawn before it
                failed.append(exc)
                return False
            if item is None:
                return False
            slot = free[w].pop()
            if runs is not None:  # the batch's bytes are in run buffers: their names and where it lies in them
                idx, parts = item
                post(w, (slot, np.ascontiguousarray(idx, dtype=np.int64),
                         [(p.export(), runs.name(p.buffer)) for p in parts]))
            else:
                idx, parts = item, ()  # (raw bytes: a pickled array costs more than the gather's hand-over)
                post(w, (slot, np.ascontiguousarray(idx, dtype=np.int64).tobytes()))
            pending.append((w, slot, parts))
            j += 1
            return True

        if chooser is None and not ahead:
            chooser = Chooser(spare=cores() > procs)
        here = chooser is not None and chooser.here
        if not here:  # the workers gather the next batches while the loop takes the first
            start_workers()
            while send_next():
                pass
        given = 1  # batches handed to the loop (the next one's number in this iteration)
        yield {k: v.pin_memory() for k, v in first.items()} if pin else first
        del first
        if here:  # (started once the first batch is out: a fork waits for numba's start-up, see _warm)
            start_workers()
        handed = time.perf_counter()  # when the last batch went to the loop (the time between includes its step)
        rested = 0  # batches gathered here
        while True:
            waited = 0.0
            if not pending:
                if failed:
                    raise failed[0]
                if not here:
                    break  # (the workers are given batches as long as there are any)
                item = next(it, None)
                rested += 1
                if item is None or rested % 32 == 0:  # a worker that died resting is an error all the same
                    for w, p in enumerate(workers):
                        if not p.is_alive():
                            raise exited(w)
                if item is None:
                    break
                start, cpu = time.perf_counter(), time.thread_time()
                batch = gather.gather_released(*item) if runs is not None else gather(item)
                if pin:
                    batch = pinned(batch)
                now = time.perf_counter()
                assert chooser is not None
                chooser.tick(now - handed, now - start, now - start - (time.thread_time() - cpu))
                if not chooser.here:  # to the workers: their first batches, the pipeline filling, not counted
                    here = False
                    while send_next():
                        pass
                    chooser.restart(skip=len(pending))
                handed, given = time.perf_counter(), given + 1
                yield batch
                continue
            w, slot, parts = pending[0]
            if w in stuck:  # (a message to it written in part: it would wait for the rest, and we for its batch)
                raise refused(w)
            try:
                start = time.perf_counter()
                # a worker that died without its pipe closing is noticed too (each second, or at the timeout)
                while not pollers[w].poll(1000 if timeout <= 0 else
                                          min(1000, max(0, math.ceil((start + timeout - time.perf_counter()) * 1000)))):
                    if not workers[w].is_alive():
                        raise EOFError
                    if 0 < timeout <= time.perf_counter() - start:
                        stuck.add(w)
                        raise LoaderWorkerError(f"loader worker {w} (pid {workers[w].pid}) gave no batch in {timeout}s")
                waited = time.perf_counter() - start
                try:  # (an answer begun is read within the timeout too: a worker may stall or die in the middle,
                    # its end of the pipe held open by a process it started)
                    msg = recv_bounded(conns[w], timeout if timeout > 0 else math.inf, alive=workers[w].is_alive)
                except TimeoutError:
                    stuck.add(w)
                    raise LoaderWorkerError(f"loader worker {w} (pid {workers[w].pid}) began an answer and sent "
                                            f"nothing more of it in {timeout}s") from None
                pending.popleft()
                for p in parts:  # the worker is done with the run buffers
                    p.release()
            except (EOFError, OSError):
                stuck.add(w)  # (gone: nothing is sent to it or waited for at the end)
                raise exited(w) from None
            if msg[0] == "error":
                raise with_context(msg[1], f"loader worker {w} (pid {workers[w].pid}), batch {given} of this iteration")
            if msg[0] == "ok":
                reclaim(w)
                if pin or len(lent[w]) >= depth - 1:  # views of the slot unless the loop holds so many batches
                    # that the worker would be left without a slot to gather into: a copy, the slot free at once
                    batch = _batch_from(msg[1], block, slot * slot_bytes, pin=True) if pin else {
                        k: v.clone() for k, v in _batch_from(msg[1], block, slot * slot_bytes, False).items()}
                    free[w].append(slot)
                else:
                    batch, entry = _lend(msg[1], block, slot, slot_bytes)
                    lent[w].append(entry)
            else:
                batch = {}
                for (name, dtype, shape, _), raw in zip(msg[1], msg[2]):
                    dt = _dtype(dtype)
                    t = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
                    batch[name] = t.reshape(shape).pin_memory() if pin else t.reshape(shape)
                free[w].append(slot)
            if chooser is not None and not here:
                chooser.tick(time.perf_counter() - handed, waited)
                if chooser.here:  # the loop's process gathers the batches after those the workers hold
                    here = True
            if not here:
                while send_next():
                    pass
            handed, given = time.perf_counter(), given + 1
            yield batch
    finally:  # a second Ctrl-C while the workers end is ignored (see _signals)
        with quiet:
            if runs is not None:
                runs.tell = None
            for _, _, parts in pending:  # batches not answered: their run buffers are not read any more
                for p in parts:
                    p.release()
            end = monotonic() + 5  # (a worker stuck in a batch with its pipe full would not take the end)
            told = [False] * len(conns)
            for w, c in enumerate(conns):
                try:
                    told[w] = w not in stuck and send_bounded(c, None, until=end)
                except Exception:  # noqa: BLE001 - a worker gone, or interpreter shutdown
                    pass
            # the answers nobody will use, read until each worker ends (one larger than the pipe holds would
            for w, p in enumerate(workers):  # block it); those silent for 5 s in all, or not told, are ended
                try:
                    while told[w] and pollers[w].poll(max(0, int((end - monotonic()) * 1000))):
                        recv(conns[w], 5.0, until=end)
                except TimeoutError:  # silent in the middle of an answer: ended below
                    pass
                except Exception:  # noqa: BLE001 - the end of its pipe: it has ended (or interpreter shutdown)
                    p.join(timeout=5)
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
                if p.is_alive():  # (SIGTERM blocked or handled: by a library the gather uses)
                    p.kill()
                    p.join()
            for c in conns:
                c.close()
            if at_exit.detach() is not None:  # not unlinked at exit already
                shm.unlink()  # the name goes now; the memory when the last batch handed out as views does
            try:  # unmapped now, or else by the last batch handed out as views of it (their memoryviews hold it)
                shm.close()
            except BufferError:
                pass
