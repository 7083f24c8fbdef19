"""Parallel conversion: the inputs' units written by worker processes as parts, one commit at the end.

``convert_in_parallel`` is what ``import_*(..., workers=N)`` runs: each unit of work (a run of the
inputs, in input order) is written by a worker process as one part (store/parts.py), and the parts are
committed in unit order with one commit, so the records are in input order whatever the number of
workers. A local ``out`` is prepared in a hidden sibling directory (as for a sequential conversion,
interop/_common.py) renamed into place at the end; a URL of object storage (``storage_options``) is
written in place, each part uploaded into the store's staging prefix and all committed with one
conditional manifest write. A failure anywhere (a worker's exception, a worker killed) leaves nothing:
the parts are discarded, a store the conversion created is deleted, an existing one is left as it was.

Workers start from a ``forkserver`` (``spawn`` where there is none), never as a fork of the driver,
whose threads and open files they would inherit; their progress goes through a pipe that one driver
thread feeds into the single progress callback.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

from .._mainguard import check_main_guard
from ..errors import RemoteError, SeqstoreError
from ..io.local_source import local_path
from ..io.objects import is_remote
from ..schema import Schema
from ..store import Store, open_store
from ..store.parts import PARTS_DIR, Part, PartWriter, commit_parts, discard_parts, prepare_store
from ._common import (
    OutputExistsError,
    Progress,
    announce_total,
    check_output,
    install_output,
    new_store,
    remove_path,
    temp_sibling,
)

__all__ = ["convert_in_parallel", "build_store", "Job"]

log = logging.getLogger(__name__)


class Job(Protocol):
    """A picklable description of a conversion whose ``write(writer, unit, progress)`` appends the
    records of one unit of work to ``writer`` (calling ``progress(n)`` as it goes). A job may also have
    ``describe(segments) -> str``, the inputs of a unit, which an error about the unit names."""

    def write(self, writer: Any, segments: Any, progress: Progress | None) -> None: ...


def _killed(exc: BaseException, units: Sequence[tuple[Job, Any]], futures: Mapping[int, Future[Part]]) -> BaseException:
    """``exc``, or for a pool that broke (a worker killed by the operating system, out of memory or by a
    signal: the bare BrokenProcessPool names nothing) an error naming the units that were not written."""
    if not isinstance(exc, BrokenProcessPool):
        return exc
    wait(list(futures.values()), timeout=5.0)  # (the pool's thread fails them all at once, one by one)
    lost = [k for k in sorted(futures) if futures[k].done() and not futures[k].cancelled()
            and isinstance(futures[k].exception(), BrokenProcessPool)]
    names = []
    for k in lost[:3]:
        describe = getattr(units[k][0], "describe", None)
        names.append(f"unit {k + 1} of {len(units)}" + (f" ({describe(units[k][1])})" if callable(describe) else ""))
    more = f" and {len(lost) - 3} more" if len(lost) > 3 else ""
    what = f" while writing one of the units not finished: {'; '.join(names)}{more}" if names else ""
    err = SeqstoreError(f"a conversion worker process ended abruptly (killed by the operating system, e.g. for "
                        f"lack of memory, or by a signal){what}; nothing was written")
    err.__cause__ = exc
    return err


_progress: Any = None  # the worker's end of the progress pipe (set by _init)


def _init(progress: Any) -> None:
    global _progress
    _progress = progress
    # Ctrl-C reaches the whole process group: the driver alone decides (it ends the workers), so a
    # worker neither stops part way on its own nor prints a traceback; its part is discarded anyway
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ..store.write import at_exit

    at_exit.disable()  # a worker ended by the driver commits nothing at exit


def _report(n: int) -> None:
    if n:
        _progress.send(n)


def _part(store: str, job_id: str, task: str, shard_bytes: int, storage_options: Mapping[str, Any] | None,
          direct_io: bool, fill: Callable[[PartWriter], None]) -> Part:
    """``fill(writer)`` as the part ``task`` of ``store``, finished (aborted when ``fill`` fails)."""
    w = PartWriter(store, job=job_id, task=task, shard_bytes=shard_bytes, storage_options=storage_options,
                   direct_io=direct_io)
    try:
        fill(w)
        return w.finish()
    except BaseException:
        w.abort()
        raise


def _write_unit(store: str, job_id: str, shard_bytes: int, storage_options: Mapping[str, Any] | None,
                direct_io: bool, k: int, job: Job, segments: Any, report: Progress | None = None) -> Part:
    """Worker (or the driver, with its own ``report``): unit ``k`` as one part. :func:`_run` takes it
    with the first five arguments bound (``functools.partial``, picklable)."""
    return _part(store, job_id, f"u{k:06d}", shard_bytes, storage_options, direct_io,
                 lambda w: job.write(w, segments, report or _report))


def _start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _pool_size(workers: int, units: int, in_driver: bool) -> int:
    return max(1, min(workers - 1 if in_driver else workers, units))


def _context(preload: Sequence[str] = ()) -> Any:
    """The start method of the workers. The forkserver imports the parallel module, the Arrow and HDF
    importers and ``preload`` before it forks workers; the list is the one of the process's first parallel
    conversion (the server then keeps running), so modules named by a later conversion's ``preload`` are
    imported by its workers themselves."""
    ctx = multiprocessing.get_context(_start_method())
    if ctx.get_start_method() == "forkserver":  # workers start from a server that has these imported already
        ctx.set_forkserver_preload(["seqstore.interop._parallel", "seqstore.interop.arrow", "seqstore.interop.returnn",
                                    *preload])
        from multiprocessing import forkserver

        # Ctrl-C reaches the whole process group. Started while SIGINT is ignored here, the server and the
        # resource tracker ignore it from their first instruction (an ignored signal stays ignored across
        # exec), and so does every worker the server forks; a Ctrl-C in these few milliseconds is lost
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not None:
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                forkserver.ensure_running()
            finally:
                signal.signal(signal.SIGINT, old)
    return ctx


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (cleaning up after an interrupt: a second Ctrl-C
    must not stop it part way), then arrive as they would have. In the main thread; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    sigs = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not None]  # None: not Python's
    old = {s: signal.signal(s, lambda signum, frame: arrived.append(signum)) for s in sigs}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for signum in dict.fromkeys(arrived):
            os.kill(os.getpid(), signum)


def _stop_pool(pool: ProcessPoolExecutor, grace_s: float = 3.0) -> None:
    """End ``pool`` now: queued units cancelled, running workers terminated (killed when they have not
    ended within ``grace_s``), the pool's manager thread given a bounded wait. Idempotent."""
    # the pool's own records (3.9-3.13 have no public way to end its workers); read before the shutdown
    # clears them, listed after it, when no submit can add a process any more
    table: dict[Any, Any] = getattr(pool, "_processes", None) or {}
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    processes = list(table.values())
    for p in processes:
        with contextlib.suppress(Exception):
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.exitcode is None:
            with contextlib.suppress(Exception):
                p.kill()
                p.join(1.0)
    if manager is not None:
        manager.join(grace_s)


def convert_in_parallel(out: str | os.PathLike[str], schema: Schema, units: Sequence[tuple[Job, Any]], total: int, *,
                        overwrite: bool, shard_bytes: int, metadata: Mapping[str, Any] | None, workers: int,
                        progress: Progress | None, storage_options: Mapping[str, Any] | None = None,
                        preload: Sequence[str] = (), in_driver: bool = False, direct_io: bool = False) -> Store:
    """Build the store ``out`` from ``units`` (``(job, segments)`` pairs, in record order) with
    ``workers`` processes, all or nothing (see the module docs), and open it. ``total`` is announced to
    ``progress`` once the output path is checked. ``preload``: modules the workers need (imported
    once in the forkserver when it starts with this conversion, see :func:`_context`). ``in_driver``: this
    process writes units too (one of the ``workers``; see :func:`_run`). ``direct_io``: the parts' data
    files are written with ``O_DIRECT`` (:class:`~seqstore.store.Writer`), not through the page cache.

    Called from the module-level code of a script outside ``if __name__ == "__main__":``, it raises
    :class:`~seqstore._mainguard.MainGuardError` before anything is written: every worker would run the
    script again and die."""
    check_main_guard(_start_method(), _pool_size(workers, len(units), in_driver),
                     who=f"a conversion with workers={workers}", builds="runs the conversion",
                     why="conversion workers start from a forkserver, never as a fork of this process, whose "
                     "threads and open files they would inherit")
    if is_remote(out):
        url = os.fspath(out)

        def produce(job_id: str) -> list[Part]:
            unit = functools.partial(_write_unit, url, job_id, shard_bytes, storage_options, direct_io)
            return _run(unit, units, workers, progress, preload, in_driver)

        _build_at_url(url, schema, produce, total, overwrite=overwrite, metadata=metadata, progress=progress,
                      storage_options=storage_options)
        return open_store(out, storage_options=dict(storage_options) if storage_options else None)
    root = local_path(out)
    check_output(root, overwrite)
    tmp = temp_sibling(root, "tmp")
    job_id = f"convert-{uuid.uuid4().hex[:12]}"
    try:
        prepare_store(tmp, schema, metadata=metadata, mode="create")
        announce_total(progress, total)
        unit = functools.partial(_write_unit, str(tmp), job_id, shard_bytes, None, direct_io)
        parts = _run(unit, units, workers, progress, preload, in_driver)
        commit_parts(tmp, parts)
        discard_parts(tmp, job_id)  # the parts' committed.json records
        with contextlib.suppress(OSError):
            (tmp / PARTS_DIR).rmdir()
        install_output(tmp, root, replace=overwrite)  # (without overwrite: not what appeared meanwhile)
    except BaseException:
        with _signals_held():
            remove_path(tmp)
        raise
    return open_store(root)


def build_store(out: str | os.PathLike[str], schema: Schema, fill: Callable[[Any], None], *, overwrite: bool,
                shard_bytes: int, metadata: Mapping[str, Any] | None, storage_options: Mapping[str, Any] | None,
                direct_io: bool = False, packed: Mapping[str, Sequence[str]] | None = None,
                aside: bool = False) -> Store:
    """A new store at ``out`` from ``fill(writer)`` run in this process, all or nothing, and opened: a
    local path is built in a hidden sibling and renamed into place (:func:`~._common.new_store`); a URL
    of object storage gets the records as one part, committed once ``fill`` returns (for sources that
    cannot be handed to worker processes: a stream, a dataset object in memory), or with ``aside`` (or
    ``packed``, which parts do not take) is built in a local temporary directory and copied there (for
    a ``fill`` that opens what it has committed, at ``writer.root``, as a store). ``direct_io``: as for
    :func:`convert_in_parallel`; ``packed``: as :func:`~seqstore.create` takes it."""
    options = dict(storage_options) if storage_options else None
    if not is_remote(out) or aside or packed is not None:
        new_store(out, schema, fill, overwrite=overwrite, shard_bytes=shard_bytes, metadata=metadata,
                  direct_io=direct_io, packed=packed, storage_options=options)
        return open_store(out, storage_options=options)
    url = os.fspath(out)

    def produce(job_id: str) -> list[Part]:
        return [_part(url, job_id, "u000000", shard_bytes, options, direct_io, fill)]

    _build_at_url(url, schema, produce, None, overwrite=overwrite, metadata=metadata, progress=None,
                  storage_options=options)
    return open_store(out, storage_options=options)


def _build_at_url(url: str, schema: Schema, produce: Callable[[str], list[Part]], total: int | None, *, overwrite: bool,
                  metadata: Mapping[str, Any] | None, progress: Progress | None,
                  storage_options: Mapping[str, Any] | None) -> None:
    """Prepare the store at ``url``, ``produce(job_id)`` its parts, commit them in order (module docs)."""
    from ..store.parts import remove_if_empty, unstage
    from ..store.writer import existing_manifest

    existed = existing_manifest(url, storage_options) is not None
    if existed and not overwrite:
        raise OutputExistsError(url)
    try:
        prepare_store(url, schema, metadata=metadata, mode="overwrite" if overwrite else "create",
                      storage_options=storage_options)
    except FileExistsError:  # another process created it since
        raise OutputExistsError(url) from None
    job_id = f"convert-{uuid.uuid4().hex[:12]}"
    try:
        if total is not None:
            announce_total(progress, total)
        parts = produce(job_id)
        commit_parts(url, parts, mode="overwrite" if overwrite else "append", storage_options=storage_options)
    except BaseException:
        try:
            discard_parts(url, job_id, storage_options=storage_options)
            if not existed:
                remove_if_empty(url, storage_options=storage_options)
            elif overwrite:
                unstage(url, storage_options=storage_options)
        except (SeqstoreError, RemoteError) as exc:  # the conversion's own error is the one to report
            log.warning("%s: could not remove what the failed conversion left (%s)", url, exc)
        raise
    discard_parts(url, job_id, storage_options=storage_options)  # the parts' committed.json records


def _run(unit: Callable[..., Part], units: Sequence[tuple[Job, Any]], workers: int, progress: Progress | None,
         preload: Sequence[str] = (), in_driver: bool = False) -> list[Part]:
    """Write every unit as a part (``unit(k, job, segments[, report])``: :func:`_write_unit` bound to the
    store) with ``workers`` processes; the parts in unit order. ``in_driver``: this process is one of the
    ``workers`` (the pool has one process fewer) and writes units from the last one backwards while the
    pool starts and takes them from the front (:func:`_share`); for jobs whose modules the driver has
    imported already."""
    ctx = _context(preload)
    # the workers' progress: each message is one write of a few bytes to a pipe, whole even when its writer
    # is killed (a queue's lock could be left held), and nothing that needs cleaning up at exit (a queue's
    # named semaphores, released by whichever thread drops it last: the one below, maybe as the
    # interpreter exits, cutting the cleanup off)
    reader, writer = ctx.Pipe(duplex=False)
    broken: list[BaseException] = []  # the progress callback's error: the conversion fails with it

    def pump() -> None:  # the workers' progress into the one callback, until None (or every writing end closed)
        with contextlib.suppress(EOFError):  # read to the end even after the callback failed: a full pipe
            while (n := reader.recv()) is not None:  # blocks the workers
                if progress is not None and not broken:
                    try:
                        progress(n)
                    except BaseException as exc:  # noqa: BLE001 - raised by the driver below
                        broken.append(exc)

    def report(n: int) -> None:
        if n:
            writer.send(n)

    feeder = threading.Thread(target=pump, name="seqstore-convert-progress", daemon=True)
    feeder.start()
    procs = _pool_size(workers, len(units), in_driver)
    ended = False  # the pool was ended by an error or interrupt
    try:
        pool = ProcessPoolExecutor(max_workers=procs, mp_context=ctx, initializer=_init, initargs=(writer,))
        try:
            if in_driver:
                parts = _share(pool, procs, unit, units, report)
            else:
                futures: list[Future[Part]] = []
                for k, (job, segs) in enumerate(units):
                    with _signals_held():  # a worker this starts is in the pool's table before an interrupt
                        futures.append(pool.submit(unit, k, job, segs))
                try:
                    parts = [f.result() for f in futures]  # in unit order; the first failure raises
                except BrokenProcessPool as exc:
                    raise _killed(exc, units, dict(enumerate(futures)))  # noqa: B904 - its cause is set
        except BaseException:
            # an interrupt (Ctrl-C, SIGTERM) or a failure: never wait for the units still running
            ended = True
            with _signals_held():
                _stop_pool(pool)
            raise
        pool.shutdown(wait=True)
    finally:
        with _signals_held():  # (after the pool's shutdown: every worker's progress is in the pipe)
            if ended:  # the callback may be stuck with the pipe full: no waiting for it beyond a second
                os.set_blocking(writer.fileno(), False)
            with contextlib.suppress(BlockingIOError):
                writer.send(None)
            feeder.join(1.0 if ended else None)
    if broken:
        raise broken[0]
    return parts


def _share(pool: ProcessPoolExecutor, procs: int, unit: Callable[..., Part], units: Sequence[tuple[Job, Any]],
           report: Progress) -> list[Part]:
    """The units written by ``pool`` from the front and by this process from the back (see :func:`_run`).

    A thread hands the pool one unit per idle process (never more, so no unit waits in the pool's queue
    while this process could take it); its first ``submit`` waits until the pool's first process runs,
    which for a forkserver with heavy imports takes a second or more. This thread meanwhile takes units
    from the last one backwards, until the two meet. The parts in unit order."""
    lock = threading.Lock()
    bounds = [0, len(units)]  # units [front, back) are still to be taken
    stop = threading.Event()
    futures: dict[int, Future[Part]] = {}
    mine: dict[int, Part] = {}
    failed: list[BaseException] = []

    def take(front: bool) -> int | None:
        with lock:
            if stop.is_set() or bounds[0] >= bounds[1]:
                return None
            if front:
                bounds[0] += 1
                return bounds[0] - 1
            bounds[1] -= 1
            return bounds[1]

    def feed() -> None:
        running: set[Future[Part]] = set()
        try:
            while True:
                while len(running) < procs and (k := take(True)) is not None:
                    futures[k] = pool.submit(unit, k, *units[k])
                    running.add(futures[k])
                if not running:
                    return
                done, running = wait(running, return_when=FIRST_COMPLETED)
                if any(f.exception() is not None for f in done):
                    stop.set()  # the driver raises it when it collects the parts
        except BaseException as exc:  # noqa: BLE001 - raised by the driver below
            failed.append(exc)
            stop.set()

    feeder = threading.Thread(target=feed, name="seqstore-convert-submit", daemon=True)
    feeder.start()
    try:
        while (k := take(False)) is not None:
            mine[k] = unit(k, *units[k], report)
    except BaseException:
        stop.set()
        with _signals_held():
            _stop_pool(pool)  # the feeder thread may be waiting for a running unit: end it now
        raise
    finally:
        feeder.join(5.0 if stop.is_set() else None)  # after _stop_pool its waits end at once
    errors = [e for k in sorted(futures) if (e := futures[k].exception()) is not None]  # all done: joined
    if errors or failed:
        first = (errors or failed)[0]  # a worker's failure, the first in unit order
        raise _killed(first, units, futures)
    return [mine[k] if k in mine else futures[k].result() for k in range(len(units))]
