"""Remote reads, CPU per GiB by stage: where seqstore's reader spends its CPU, against raw obstore.

Serves the data of ``bench/remote.py`` (``--data``, built by it) from nginx with 20 ms added to every
request (``bench/_remote_nginx.py``) and runs, each case in a fresh process, each round every case once
(interleaved: the machine's other load hits all cases alike):

- ``raw sequential``: as many bytes of the store's value files as the epoch delivers, in 8 MiB range
  GETs, ``max_requests`` in flight (``obstore.get_range_async``): what receiving the bytes costs.
- ``epoch``: ``iter_batches`` of the first 131,072 records of a ``random_block:1024:16`` epoch (fixed
  and ragged), a cold node cache.
- ``window`` (``--only epoch window``, fixed only): ``window gather, no cache``, a measurement of what a
  reader that skips the node cache could reach on the ``epoch`` case (not seqstore's reader): each
  ``random_block`` window's rows fetched into memory as merged runs, 4 windows in flight, batches
  gathered from the answers with NumPy (``_window_gather``); and ``window gather, sockets``: the order's
  windows fetched block by block by the minimal socket client of the ``floor`` case straight into window
  buffers allocated once and reused, each batch gathered with one ``np.take`` (``_window_sockets``: what
  seqstore's ``read_once`` reader was built after).
- ``floor`` (``--only epoch floor``): ``raw sockets``, the same 8 MiB range GETs as ``raw sequential`` by
  a minimal HTTP/1.1 client (``_raw_sockets``: ``max_requests`` keep-alive connections, one selector
  loop, each body received with ``recv_into`` into a buffer reused for every answer, no copy after
  the kernel's), and the same client receiving into one new file's shared mapping in ``--cache-parent``
  (as a node cache entry would be filled): what receiving the bytes costs this machine's kernel.
- ``random``: ``get_batch`` of 6,144 records of a random epoch in batches of 1024 (seqstore only: the
  raw ``get_range`` of the same byte ranges, at several depths, is in ``bench/remote.py``).
- ``loader`` (``--only loader``, fixed only): the first 262,144 records of the ``random_block`` epoch
  through ``SeqDataLoader`` with 0, 1 and 2 DataLoader workers sharing one node cache, ``IterableSeqDataset``'s
  ``prefetch`` the dataset's choice (the default: 16 to 64 batches on a remote store) and 2
  (``--loader-prefetch``), and with ``procs=1`` and ``procs=2`` (seqstore's worker processes); MB/s from
  the first batch a worker made on, and the whole machine's CPU per GiB and cores busy over that span
  (``/proc/stat``: the loader, its workers and nginx; the workers are the forkserver's children, so the
  process's own CPU would miss them; the raw reads get the same figure); every ``--mode``
  (e.g. ``read_once=read_once=true``) separately, with ``raw sequential`` reads of as many bytes (twice the
  ``--epoch-records``) unless ``epoch`` runs too.

``--mode warm=warm=1`` starts numba before the timed pass (its first compiled call costs a process
about 0.15 s of CPU once; measured without effect on these cases, as opening the store starts it).
``--mode sockets=client=sockets`` runs seqstore's reader with the node cache's range requests answered
by the minimal client of the ``floor`` case (``_SocketClient``, a measurement: plain HTTP to the bench's
nginx, no TLS, ``If-Match`` or retries) instead of obstore.

Each seqstore case runs against one or more source trees (``--src LABEL=PATH``, default this
checkout's ``src``; e.g. ``--src before=/work/main/src --src after=src``) and modes (``--mode``: a
storage option set, e.g. ``node_cache=none``), so before/after comparisons run in one interleaved run.

Stages (CPU seconds per GiB of values delivered; threads told apart by ``/proc/self/task``):

- **receive**: the HTTP client's threads (obstore's tokio runtime): sockets, parsing, copying the
  bodies into buffers;
- **cache write**: writing the answers into the node cache (``CachedObject.fill``, on the event
  loop's thread);
- **bookkeeping**: the rest of the event loop's thread (asyncio, one task per request, the retry
  wrapper, the in-flight lists);
- **planning**: on the reading thread, ``remote_fetch``'s search of the mappings, of the missing pages
  and of the requests to make, and submitting them (``Fetcher.submit``);
- **gather**: the rest of the reading thread (the order, the batch's lookup and copy, waits' overhead).

Usage: ``python bench/remote_cpu.py [--data DIR] [--repeats R] [--src LABEL=PATH ...]
[--mode LABEL=k=v,k=v ...] [--kinds fixed ragged] [--only epoch floor window random loader]``. Results: a table on
stdout and ``bench/results/remote_cpu.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

REPO = Path(__file__).resolve().parent.parent
BUCKET = "bench"
SIZES = {"fixed": 1_000_000, "ragged": 300_000}
QUICK = {"fixed": 50_000, "ragged": 20_000}
EPOCH, RANDOM, BATCH, SEED, CHUNK = 131_072, 6144, 1024, 3, 8 << 20
EPOCH_QUICK, RANDOM_QUICK = 16_384, 2048
LATENCY = 0.02
ORDER = "random_block:1024:16"
GIB = float(1 << 30)

# ------------------------------------------------------------------------------------------ child


def _threads() -> dict[int, tuple[str, float]]:
    """Each thread of this process: (name, CPU seconds so far). Read from the thread's own CPU clock
    (``clock_gettime`` of the clock id Linux derives from its thread id: nanoseconds), not from the
    10 ms ticks of ``/proc/self/task/*/stat``, whose rounding over two dozen threads came to 0.05-0.1 s
    of a 0.7 s epoch (it showed as "other threads")."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for t in os.listdir("/proc/self/task"):
        tid = int(t)
        try:
            name = Path(f"/proc/self/task/{t}/comm").read_text().strip()
            try:
                cpu = time.clock_gettime((~tid << 3) | 6)  # CPUCLOCK_SCHED of thread ``tid``
            except OSError:
                f = Path(f"/proc/self/task/{t}/stat").read_text().rsplit(")", 1)[1].split()
                cpu = (int(f[11]) + int(f[12])) / tick
        except OSError:  # the thread has ended
            continue
        out[tid] = (name, cpu)
    return out


def _system() -> float:
    """CPU seconds this process has spent in the kernel (all threads)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def _machine() -> float:
    """CPU seconds every process of the machine has spent so far (all cores: ``/proc/stat``, not idle or
    waiting for I/O): the client, its workers, nginx and the kernel's work for them alike."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _delta(a: dict[int, tuple[str, float]], b: dict[int, tuple[str, float]]) -> dict[int, tuple[str, float]]:
    return {t: (n, c - a.get(t, (n, 0.0))[1]) for t, (n, c) in b.items()}


class _Timer:
    """CPU seconds (thread time) spent inside a wrapped function, per thread id."""

    def __init__(self) -> None:
        self.by_thread: dict[int, float] = {}

    def wrap(self, fn: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                tid = threading.get_native_id()
                self.by_thread[tid] = self.by_thread.get(tid, 0.0) + time.thread_time() - t0

        return timed


def _s3(endpoint: str) -> Any:
    from obstore.store import S3Store

    return S3Store(
        BUCKET,
        endpoint=endpoint,
        skip_signature=True,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True, "timeout": "120s", "pool_max_idle_per_host": "1024"},
    )


def _options(endpoint: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "endpoint": endpoint,
        "allow_http": "true",
        "skip_signature": "true",
        "virtual_hosted_style_request": "false",
        **extra,
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    endpoint, case = spec["endpoint"], spec["case"]
    if case == "raw sequential":
        import obstore

        store = _s3(endpoint)
        reqs, budget = [], spec["bytes"]
        for key, size in spec["files"]:
            for a in range(0, size, CHUNK):
                if budget <= 0:
                    break
                b = min(a + CHUNK, size, a + budget)
                reqs.append((key, a, b))
                budget -= b - a
        depth = spec["depth"]

        async def run() -> int:
            sem = asyncio.Semaphore(depth)

            async def one(k: str, a: int, b: int) -> int:
                async with sem:
                    return len(await obstore.get_range_async(store, k, start=a, end=b))

            return sum(await asyncio.gather(*(one(*r) for r in reqs)))

        t_before = _threads()
        s0 = _system()
        m0, c0, t0 = _machine(), time.process_time(), time.perf_counter()
        nbytes = asyncio.run(run())
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        th = _delta(t_before, _threads())
        recv = sum(c for n, c in th.values() if n.startswith("tokio"))
        return {"bytes": nbytes, "wall_s": wall, "cpu_s": cpu, "system_s": _system() - s0,
                "machine_s": _machine() - m0, "stages": {"receive": recv, "other": cpu - recv}}

    if case == "raw sockets":
        return _raw_sockets(spec)
    if case == "loader":
        return _loader(spec)
    if case == "window gather":
        return _window_gather(spec)
    if case == "window sockets":
        return _window_sockets(spec)
    import seqstore
    from seqstore.io import nodecache, remote_fetch

    fill_t, plan_t = _Timer(), _Timer()
    nodecache.CachedObject.fill = fill_t.wrap(nodecache.CachedObject.fill)  # type: ignore[method-assign]
    # planning: which pages are missing and which requests bring them, and submitting them (the
    # module's own functions, called through its globals)
    for name in ("missing_requests", "exact_requests", "all_present"):
        setattr(remote_fetch, name, plan_t.wrap(getattr(remote_fetch, name)))
    remote_fetch.Fetcher.submit = plan_t.wrap(remote_fetch.Fetcher.submit)  # type: ignore[method-assign]
    options = dict(spec.get("options", {}))
    if options.pop("client", None) == "sockets":
        _use_socket_client(endpoint, int(options.get("max_requests", 64)))
    if options.pop("warm", None):
        _warm_numba()
    cache = Path(spec["cache_parent"]) / f"cache-{os.getpid()}-{time.time_ns()}"
    store = seqstore.open(spec["url"], storage_options=_options(endpoint, options), cache_dir=cache)
    kind = spec["kind"]
    try:
        if case == "epoch":
            import itertools

            order = seqstore.seq_order(spec["n"], ORDER, epoch=1, seed=SEED)
            batches: Any = itertools.islice(order.iter_chunks(BATCH), -(-spec["records"] // BATCH))

            def run() -> Any:
                yield from store.iter_batches(batches)
        else:
            order = seqstore.seq_order(spec["n"], "random", epoch=1, seed=SEED)
            idx = np.asarray(order[: spec["records"]], dtype=np.int64)
            batches = [idx[a : a + BATCH] for a in range(0, len(idx), BATCH)]

            def run() -> Any:
                for b in batches:
                    yield store.get_batch(b)

        main = threading.get_native_id()
        t_before = _threads()
        s0 = _system()
        c0, t0 = time.process_time(), time.perf_counter()
        nbytes = records = 0
        for got in run():
            x = got["x"]
            nbytes += x.nbytes if kind == "fixed" else x[0].nbytes
            records += len(x) if kind == "fixed" else len(x[1])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        system = _system() - s0
        th = _delta(t_before, _threads())
        with open("/proc/self/smaps_rollup") as f:
            anon = sum(int(ln.split()[1]) for ln in f if ln.startswith("Anonymous:")) / 1024
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    # the receiving threads: obstore's runtime, or the socket client's loop (less the cache writes it makes)
    sockets = {t for t in th if t in _SOCKET_THREADS}
    recv = sum(c for t, (n, c) in th.items() if n.startswith("tokio") or t in sockets)
    recv -= sum(fill_t.by_thread.get(t, 0.0) for t in sockets)
    loop_threads = set(fill_t.by_thread) - {main} - sockets
    loop_cpu = sum(c for t, (n, c) in th.items() if t in loop_threads)
    if not loop_threads and not sockets:  # nothing written (all cached already): the loop is the other thread
        loop_cpu = sum(c for t, (n, c) in th.items() if t != main and not n.startswith("tokio"))
    plan = plan_t.by_thread.get(main, 0.0)
    main_cpu = th.get(main, ("", 0.0))[1]
    stages = {
        "receive": recv,
        "cache write": sum(c for t, c in fill_t.by_thread.items() if t != main),
        "bookkeeping": loop_cpu - sum(c for t, c in fill_t.by_thread.items() if t in loop_threads),
        "planning": plan + sum(c for t, c in plan_t.by_thread.items() if t != main),
        "gather": main_cpu - plan - fill_t.by_thread.get(main, 0.0),
        "cache write on the reader": fill_t.by_thread.get(main, 0.0),
    }
    stages["other threads"] = cpu - sum(stages.values())
    by_name: dict[str, float] = {}
    for t, (n, c) in th.items():
        label = "reader" if t == main else "loop" if t in loop_threads else n
        by_name[label] = by_name.get(label, 0.0) + c
    return {
        "bytes": nbytes,
        "records": records,
        "wall_s": wall,
        "cpu_s": cpu,
        "system_s": system,
        "stages": stages,
        "threads": by_name,
        "anon_mib": anon,
    }


def _warm_numba() -> None:
    """Start numba before the timed pass (``--mode LABEL=warm=1``): the first call of a compiled function
    in a process costs about 0.15 s of CPU once (numba starts its code generator), whatever follows. A
    call of the order's kernel and of the page-run kernel, on a few records."""
    import numpy as np

    import seqstore
    from seqstore.io.advice import page_runs

    page_runs(np.zeros(1, np.int64), np.ones(1, np.int64))
    next(iter(seqstore.seq_order(4 * BATCH, ORDER, epoch=1, seed=SEED).iter_chunks(BATCH)))


def _prefetch(value: Any) -> int | None:
    """``--loader-prefetch`` value: ``default`` (the dataset's own choice) or a number of batches."""
    return None if value in (None, "default") else int(value)


def _loader(spec: dict[str, Any]) -> dict[str, Any]:
    """A ``random_block`` epoch through ``SeqDataLoader`` with ``spec["workers"]`` workers sharing one
    node cache (``IterableSeqDataset`` batches of 1024 gathered in the workers): MB/s from the first
    batch on (the workers' start apart), CPU seconds of this process and its workers."""
    import seqstore
    from seqstore.data import StoreDataset
    from seqstore.torch import IterableSeqDataset, SeqDataLoader

    cache = Path(spec["cache_parent"]) / f"cache-{os.getpid()}-{time.time_ns()}"
    store = seqstore.open(spec["url"], storage_options=_options(spec["endpoint"], spec["options"]), cache_dir=cache)
    ds = StoreDataset(store, ordering=ORDER, seed=SEED)
    workers = int(spec["workers"])
    data = IterableSeqDataset(ds, batch=BATCH, fields=["x"], prefetch=_prefetch(spec.get("prefetch")))
    if spec.get("procs"):  # seqstore's worker processes (a ring of shared buffers)
        loader = SeqDataLoader(data, batch_size=None, procs=workers)
    else:
        loader = SeqDataLoader(data, batch_size=None, num_workers=workers, prefetch_factor=4 if workers else None)
    c0 = time.process_time()
    nbytes = first = 0
    t1 = m1 = machine = 0.0
    # timed from the first batch a worker made (procs=: the loop makes the first one itself, before the
    # workers start)
    start_at = 1 if spec.get("procs") else 0
    it = iter(loader)
    try:
        for k, b in enumerate(it):
            x = b["x"]
            nbytes += x.numel() * x.element_size() if spec["kind"] == "fixed" else b["x_lengths"].sum().item() * 32
            if k == start_at:
                t1, first, m1 = time.perf_counter(), nbytes, _machine()
            if k + 1 >= -(-spec["records"] // BATCH):
                break
        wall, machine = time.perf_counter() - t1, _machine() - m1
    finally:
        del it  # the workers exit and are reaped: their CPU counts below
        shutil.rmtree(cache, ignore_errors=True)
    del c0  # the workers are the forkserver's children, not this process's: the machine's CPU instead
    return {"bytes": nbytes - first, "records": 0, "wall_s": wall, "cpu_s": float("nan"), "machine_s": machine,
            "stages": {}}


# ----------------------------------------------------------------------------------------- parent


def _window_gather(spec: dict[str, Any]) -> dict[str, Any]:
    """What a reader that skips the node cache could reach on the ``epoch`` case (fixed records only; a
    measurement, not seqstore's reader): the epoch's batches taken 16 at a time (one ``random_block``
    window), each window's records merged into runs of adjacent rows (cut at 8 MiB) and fetched with
    ``obstore.get_ranges_async`` into memory, 4 windows in flight on an event loop
    thread; each batch gathered from the answers with NumPy (one fancy index per answer it draws on)."""
    import itertools

    import numpy as np
    import obstore

    import seqstore

    store = _s3(spec["endpoint"])
    n, row = spec["n"], spec["row_bytes"]
    files = spec["shards"]  # (key, first record, records, header bytes), in record order
    firsts = np.array([f[1] for f in files], np.int64)
    order = seqstore.seq_order(n, ORDER, epoch=1, seed=SEED)
    batches = list(itertools.islice(order.iter_chunks(BATCH), -(-spec["records"] // BATCH)))
    windows = [batches[k : k + 16] for k in range(0, len(batches), 16)]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def plan(win: list[Any]) -> list[tuple[str, np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        recs = np.unique(np.concatenate(win))
        out = []
        shard = np.searchsorted(firsts, recs, side="right") - 1
        for k in np.unique(shard).tolist():
            key, first, _, header = files[k]
            local = recs[shard == k] - first
            cut = np.flatnonzero(np.diff(local) != 1) + 1
            a = np.concatenate(([local[0]], local[cut]))
            b = np.concatenate((local[cut - 1], [local[-1]])) + 1
            most = CHUNK // row
            pieces = -(-(b - a) // most)
            k = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # piece within its run
            starts = np.repeat(a, pieces) + k * most
            ends = np.minimum(starts + most, np.repeat(b, pieces))
            out.append((key, starts + first, ends + first, header + starts * row))
        return out

    async def get(runs: Any) -> list[Any]:
        return [await obstore.get_ranges_async(store, key, starts=(offs).tolist(),
                                               ends=(offs + (e - s) * row).tolist())
                for key, s, e, offs in runs]

    def submit(w: int) -> Any:
        runs = plan(windows[w])
        return runs, asyncio.run_coroutine_threadsafe(get(runs), loop)

    main = threading.get_native_id()
    t_before = _threads()
    c0, t0 = time.process_time(), time.perf_counter()
    ahead = 4  # windows in flight
    pending: list[Any] = [submit(w) for w in range(min(ahead, len(windows)))]
    nbytes = records = 0
    for w in range(len(windows)):
        runs, fut = pending.pop(0)
        if w + ahead < len(windows):
            pending.append(submit(w + ahead))
        answers = fut.result(timeout=600)
        rs = np.concatenate([r[1] for r in runs])
        views = [np.frombuffer(memoryview(buf), np.float32).reshape(-1, row // 4) for bufs in answers for buf in bufs]
        for batch in windows[w]:
            b = np.asarray(batch, np.int64)
            which = np.searchsorted(rs, b, side="right") - 1
            out = np.empty((len(b), row // 4), np.float32)
            for k in np.unique(which).tolist():
                m = which == k
                out[m] = views[k][b[m] - rs[k]]
            nbytes += out.nbytes
            records += len(out)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    th = _delta(t_before, _threads())
    loop.call_soon_threadsafe(loop.stop)
    recv = sum(c for nm, c in th.values() if nm.startswith("tokio"))
    reader = th.get(main, ("", 0.0))[1]
    return {"bytes": nbytes, "records": records, "wall_s": wall, "cpu_s": cpu,
            "stages": {"receive": recv, "gather": reader, "other threads": cpu - recv - reader}}


def _window_sockets(spec: dict[str, Any]) -> dict[str, Any]:
    """``window gather, sockets``: the order's windows (``RandomBlockOrder.window_bounds``: W whole blocks
    each) fetched block by block, every block received with ``recv_into`` straight into its place in one
    of ``ahead + 2`` window buffers allocated once and reused (the minimal client of the ``floor`` case:
    ``depth`` keep-alive connections, one selector loop on its own thread), ``ahead`` windows in flight,
    and each batch gathered from the buffers of the one or two windows it draws on with ``np.take``.
    No node cache and no new memory per answer: what a read-once epoch could cost (a measurement,
    fixed records only; plain HTTP, no retries)."""
    import itertools
    import selectors
    import socket as socketmod

    import numpy as np

    import seqstore

    host, port = spec["endpoint"].split("//", 1)[1].rsplit(":", 1)
    n, row = spec["n"], spec["row_bytes"]
    files = spec["shards"]  # (key, first record, records, header bytes), in record order
    order = seqstore.seq_order(n, ORDER, epoch=1, seed=SEED)
    rb = order.base
    B, W = rb.block, rb.window
    nb = -(-n // B)
    border = np.asarray(rb.block_order().to_numpy() if hasattr(rb.block_order(), "to_numpy")
                        else rb.block_order()[0:nb], np.int64)
    block_window = np.empty(nb, np.int64)
    block_window[border] = np.arange(nb) // W
    block_row = np.empty(nb, np.int64)  # a block's first row in its window's buffer
    nwin = -(-nb // W)
    need = spec["records"]
    last_window = int(block_window[np.asarray(order[need - 1 : need].to_numpy()) // B][0])
    ahead = int(spec.get("ahead", 4))
    wins: list[tuple[list[tuple[str, int, int, int]], int]] = []  # per window: requests, rows
    for w in range(min(nwin, last_window + 1)):
        blocks = np.sort(border[w * W : (w + 1) * W])
        reqs, at = [], 0
        for k in blocks.tolist():
            block_row[k] = at
            lo, hi = k * B, min((k + 1) * B, n)
            for key, first, count, header in files:
                a, e = max(lo, first), min(hi, first + count)
                if a < e:
                    reqs.append((f"/{BUCKET}/{key}", header + (a - first) * row, header + (e - first) * row,
                                 at * row))
                    at += e - a
        wins.append((reqs, at))

    sel = selectors.DefaultSelector()
    wake_r, wake_w = socketmod.socketpair()
    wake_r.setblocking(False)
    sel.register(wake_r, selectors.EVENT_READ, None)
    lock = threading.Lock()
    jobs: list[Any] = []  # (path, a, b, dest view, window state), taken from the end
    idle = [_connection(host, int(port)) for _ in range(spec["depth"])]
    threads: set[int] = set()

    def start() -> None:
        while idle:
            with lock:
                if not jobs:
                    return
                path, a, b, dest, state = jobs.pop()
            c = idle.pop()
            _ask(c, host, path, a, b)
            c.update(buf=dest, state=state)
            sel.register(c["sock"], selectors.EVENT_READ, c)

    def loop() -> None:
        threads.add(threading.get_native_id())
        while True:
            for key, _ in sel.select():
                c = key.data
                if c is None:
                    wake_r.recv(4096)
                    continue
                if _receive(c):
                    sel.unregister(c["sock"])
                    st = c["state"]
                    st["left"] -= 1
                    if not st["left"]:
                        st["done"].set()
                    idle.append(c)
            start()

    threading.Thread(target=loop, daemon=True).start()
    pool = [bytearray(W * B * row) for _ in range(ahead + 2)]
    free = list(range(len(pool)))
    live: dict[int, Any] = {}  # window -> (buffer, state)

    def submit(w: int) -> None:
        reqs, _ = wins[w]
        k = free.pop()
        view = memoryview(pool[k])
        state = {"left": len(reqs), "done": threading.Event()}
        mine = [(p, a, b, view[o : o + b - a], state) for p, a, b, o in reqs]
        with lock:
            jobs[:0] = reversed(mine)
        wake_w.send(b"x")
        live[w] = (k, state)

    main = threading.get_native_id()
    t_before = _threads()
    s0 = _system()
    c0, t0 = time.process_time(), time.perf_counter()
    nbytes = records = 0
    asked = 0
    tables: dict[int, Any] = {}
    sums: list[float] | None = [] if spec.get("check") else None
    for batch in itertools.islice(order.iter_chunks(BATCH), -(-need // BATCH)):
        b = np.asarray(batch, np.int64)
        blk = b // B
        win = block_window[blk]
        lo, hi = int(win.min()), int(win.max())
        for w in [w for w in live if w < lo]:  # windows behind the reader: their buffers are free again
            free.append(live.pop(w)[0])
            tables.pop(w, None)
        while asked < len(wins) and asked < lo + ahead:
            submit(asked)
            asked += 1
        rows = block_row[blk] + (b - blk * B)
        out = np.empty((len(b), row // 4), np.float32)
        for w in range(lo, hi + 1):
            if w not in tables:
                k, state = live[w]
                state["done"].wait(600)
                tables[w] = np.frombuffer(pool[k], np.float32).reshape(-1, row // 4)
            if lo == hi:
                np.take(tables[w], rows, axis=0, out=out)
            else:
                m = win == w
                out[m] = tables[w][rows[m]]
        if sums is not None:
            sums.append(float(out.sum(dtype=np.float64)))
        nbytes += out.nbytes
        records += len(out)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    system = _system() - s0
    th = _delta(t_before, _threads())
    recv = sum(c for t, (nm, c) in th.items() if t in threads)
    reader = th.get(main, ("", 0.0))[1]
    with open("/proc/self/smaps_rollup") as f:
        anon = sum(int(ln.split()[1]) for ln in f if ln.startswith("Anonymous:")) / 1024
    return {"bytes": nbytes, "records": records, "wall_s": wall, "cpu_s": cpu, "system_s": system,
            "stages": {"receive": recv, "gather": reader, "other threads": cpu - recv - reader},
            "anon_mib": anon, **({"sums": sums} if sums is not None else {})}

def _connection(host: str, port: int) -> dict[str, Any]:
    """A non-blocking keep-alive connection and its 8 MiB receive buffer (the raw-sockets clients)."""
    import socket

    sock = socket.create_connection((host, port))
    sock.setblocking(False)
    return {"sock": sock, "buf": memoryview(bytearray(CHUNK))}


def _ask(c: dict[str, Any], host: str, path: str, a: int, b: int) -> None:
    """Send connection ``c`` the GET of bytes ``[a, b)`` of ``path``; :func:`_receive` takes the answer."""
    c["sock"].sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nRange: bytes={a}-{b - 1}\r\n\r\n".encode())
    c.update(want=b - a, head=b"", pos=-1)


def _receive(c: dict[str, Any]) -> bool:
    """Take what connection ``c`` has ready of its answer: the status line and headers first (a 206 is
    expected), then the body with ``recv_into`` straight into ``c["buf"]``. True once the body is whole."""
    if c["pos"] < 0:
        c["head"] += c["sock"].recv(65536)
        end = c["head"].find(b"\r\n\r\n")
        if end < 0:
            return False
        if not c["head"].startswith(b"HTTP/1.1 206"):
            raise RuntimeError(f"unexpected answer: {c['head'][:80]!r}")
        rest = c["head"][end + 4 :]
        c["buf"][: len(rest)] = rest
        c["pos"] = len(rest)
    else:
        got = c["sock"].recv_into(c["buf"][c["pos"] : c["want"]])
        if not got:
            raise RuntimeError("connection closed in a body")
        c["pos"] += got
    return bool(c["pos"] >= c["want"])


_SOCKET_THREADS: set[int] = set()  # native ids of _SocketClient's loop threads


class _SocketClient:
    """A measurement, not seqstore's client: range GETs of ``ObjectClient.submit`` answered by a minimal
    HTTP/1.1 client (``depth`` keep-alive connections to the bench's nginx, one selector loop on its own
    thread, each body received with ``recv_into`` into its connection's 8 MiB buffer, reused, and handed
    to ``on_each`` as a view, which the node cache writes at once). No TLS, no ``If-Match``, no
    retries: what seqstore's reader would cost with answers received this way (``--mode
    sockets=client=sockets``)."""

    def __init__(self, endpoint: str, depth: int) -> None:
        import selectors
        import socket

        self.host, port = endpoint.split("//", 1)[1].rsplit(":", 1)
        self.port = int(port)
        self.sel = selectors.DefaultSelector()
        self.jobs: list[Any] = []  # (path, start, end, index, wave), taken from the end
        self.lock = threading.Lock()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.idle: list[dict[str, Any]] = [_connection(self.host, self.port) for _ in range(depth)]
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, url_of: Any, requests: Any, on_each: Any) -> Any:
        import concurrent.futures

        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        wave = {"left": len(requests), "future": fut, "on_each": on_each, "n": len(requests)}
        if not requests:
            fut.set_result([])
            return fut
        jobs = []
        for i, (key, a, b, _etag) in enumerate(requests):
            path = "/" + url_of(key).split("://", 1)[1]
            jobs.append((path, a, b, i, wave))
        with self.lock:
            self.jobs[:0] = reversed(jobs)  # first submitted, first sent
        self.wake_w.send(b"x")
        return fut

    def _start(self) -> None:
        import selectors

        while self.idle:
            with self.lock:
                if not self.jobs:
                    return
                path, a, b, i, wave = self.jobs.pop()
            c = self.idle.pop()
            _ask(c, self.host, path, a, b)
            c.update(i=i, wave=wave)
            self.sel.register(c["sock"], selectors.EVENT_READ, c)

    def _loop(self) -> None:
        _SOCKET_THREADS.add(threading.get_native_id())
        while True:
            for key, _ in self.sel.select():
                c = key.data
                if c is None:
                    self.wake_r.recv(4096)
                    continue
                if _receive(c):
                    self.sel.unregister(c["sock"])
                    wave = c["wave"]
                    wave["on_each"](c["i"], c["buf"][: c["want"]], None)
                    wave["left"] -= 1
                    if not wave["left"]:
                        wave["future"].set_result([(memoryview(b""), None)] * wave["n"])
                    self.idle.append(c)
            self._start()


def _use_socket_client(endpoint: str, depth: int) -> None:
    """Route ``ObjectClient.submit``'s plain range requests (the node cache's fetches) to :class:`_SocketClient`."""
    from seqstore.io import objects

    client = _SocketClient(endpoint, depth)
    original = objects.ObjectClient.submit

    def submit(self: Any, requests: Any, on_each: Any = None, *, missing_ok: bool = False,
               with_meta: bool = True) -> Any:
        if on_each is None or with_meta or any(a < 0 or b < 0 for _, a, b, _ in requests):
            return original(self, requests, on_each, missing_ok=missing_ok, with_meta=with_meta)
        return client.submit(self.key_url, requests, on_each)

    objects.ObjectClient.submit = submit  # type: ignore[method-assign]


def _raw_sockets(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``raw sequential`` requests by a minimal HTTP/1.1 client: ``depth`` keep-alive connections
    served by one selector loop; each connection's answer is received with ``recv_into`` into its own
    8 MiB buffer, reused for every answer (plain HTTP against the bench's nginx; no TLS, no retries)."""
    import selectors

    host, port = spec["endpoint"].split("//", 1)[1].rsplit(":", 1)
    reqs = [(key, a, min(a + CHUNK, size)) for key, size in spec["files"] for a in range(0, size, CHUNK)]
    todo, budget = [], spec["bytes"]
    for key, a, b in reqs:
        if budget <= 0:
            break
        b = min(b, a + budget)
        todo.append((key, a, b))
        budget -= b - a
    todo.reverse()
    sel = selectors.DefaultSelector()
    conns = [_connection(host, int(port)) for _ in range(min(spec["depth"], len(todo)))]
    mapping: Any = None
    if spec.get("into") == "mapping":  # every answer into its place in one new file's shared mapping
        import mmap
        import tempfile

        fd, path = tempfile.mkstemp(dir=spec["cache_parent"])
        os.unlink(path)
        os.ftruncate(fd, sum(b - a for _, a, b in todo))
        mapping = mmap.mmap(fd, sum(b - a for _, a, b in todo))
        os.close(fd)
    at = 0

    def send(c: dict[str, Any]) -> bool:
        nonlocal at
        if not todo:
            return False
        key, a, b = todo.pop()
        _ask(c, host, f"/{BUCKET}/{key}", a, b)
        if mapping is not None:
            c["buf"] = memoryview(mapping)[at : at + b - a]
            at += b - a
        sel.register(c["sock"], selectors.EVENT_READ, c)
        return True

    t_before = _threads()
    s0 = _system()
    c0, t0 = time.process_time(), time.perf_counter()
    nbytes = 0
    active = sum(send(c) for c in conns)
    while active:
        for key, _ in sel.select(timeout=60):
            c = key.data
            if _receive(c):
                nbytes += c["want"]
                sel.unregister(c["sock"])
                if not send(c):
                    active -= 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    system = _system() - s0
    for c in conns:
        c["sock"].close()
        c["buf"].release()
    if mapping is not None:
        mapping.close()
    th = _delta(t_before, _threads())
    main = threading.get_native_id()
    return {"bytes": nbytes, "wall_s": wall, "cpu_s": cpu, "system_s": system,
            "stages": {"receive": th.get(main, ("", 0.0))[1], "other": cpu - th.get(main, ("", 0.0))[1]}}


def _layout(data: Path, kind: str, n: int) -> tuple[str, list[tuple[str, int]]] | None:
    root = data / "bucket"
    store = root / f"{kind}-{n}.seqstore"
    if not (root / f"{kind}-{n}.seqstore.done").exists():
        return None
    files = [(q.relative_to(root).as_posix(), q.stat().st_size) for q in sorted(store.rglob("x.npy")) if q.is_file()]
    return f"s3://{BUCKET}/{store.relative_to(root).as_posix()}", files


def _shards(data: Path, kind: str, n: int) -> list[tuple[str, int, int, int]]:
    """(key of x.npy, first record, records, header bytes) of each shard, in record order."""
    import numpy as np

    root = data / "bucket"
    out, first = [], 0
    for q in sorted((root / f"{kind}-{n}.seqstore").glob("shard-*/x.npy")):
        a = np.load(q, mmap_mode="r")
        out.append((q.relative_to(root).as_posix(), first, len(a), int(a.offset)))
        first += len(a)
    return out


def run_case(spec: dict[str, Any], src: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(src).resolve()), str(REPO)])}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"{spec['case']} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, default=Path(os.environ.get("SEQSTORE_REMOTE_DATA", "/work/bench-data/remote")))
    p.add_argument("--quick", action="store_true", help="the quick data (50,000 / 20,000 records), 1 run")
    p.add_argument("--repeats", type=int, default=None, help="runs per case (default 3, quick 1)")
    p.add_argument("--src", nargs="+", default=[f"this={REPO / 'src'}"], help="LABEL=PATH of seqstore sources")
    p.add_argument("--mode", nargs="+", default=["default="], help="LABEL=key=value,key=value storage options")
    p.add_argument("--kinds", nargs="+", default=["fixed", "ragged"])
    p.add_argument("--only", nargs="+", default=["epoch", "random"])
    p.add_argument(
        "--loader-prefetch", nargs="+", default=["default", 2],
        help="IterableSeqDataset prefetch (loader): 'default' (the dataset's choice) or a number of batches"
    )
    p.add_argument("--depth", type=int, default=64, help="requests in flight (raw and seqstore)")
    p.add_argument("--epoch-records", type=int, default=None,
                   help=f"records of the epoch cases (default {EPOCH:,}; the raw cases read as many bytes)")
    p.add_argument("--cache-parent", default="/dev/shm", help="where node caches go (default /dev/shm)")
    args = p.parse_args()
    if args.child is not None:
        out = child(json.loads(args.child))
        print(json.dumps(out), flush=True)
        os._exit(0)  # obstore can abort in interpreter finalization after large async answers
    from bench import _remote_nginx, _remote_server

    why = _remote_nginx.install()
    if why:
        print(f"skipped: remote_cpu: {why}")
        return
    srcs = [s.split("=", 1) for s in args.src]
    modes = []
    for m in args.mode:
        label, _, rest = m.partition("=")
        modes.append((label, dict(kv.split("=", 1) for kv in rest.split(",") if kv)))
    root = args.data / "bucket"
    sizes = QUICK if args.quick else SIZES
    epoch, n_random = (EPOCH_QUICK, RANDOM_QUICK) if args.quick else (EPOCH, RANDOM)
    if args.epoch_records:
        epoch = args.epoch_records
    repeats = args.repeats or (1 if args.quick else 3)
    depth = {"max_requests": args.depth}
    cases: list[tuple[str, str, dict[str, Any]]] = []  # (name, src, spec)
    for kind in args.kinds:
        got = _layout(args.data, kind, sizes[kind])
        if got is None:
            print(f"skipped: remote_cpu {kind}: no data under {root} (bench/remote.py --generate builds it)")
            continue
        url, files = got
        total = sum(s for _, s in files)
        ebytes = int(total * epoch / sizes[kind])
        base = {"kind": kind, "n": sizes[kind], "url": url, "cache_parent": args.cache_parent}
        if "epoch" in args.only:
            cases.append(
                (
                    f"{kind} epoch: raw sequential",
                    "",
                    {**base, "case": "raw sequential", "files": files, "bytes": ebytes, "depth": args.depth},
                )
            )
            if "floor" in args.only:
                for into in ("buffer", "mapping"):
                    cases.append((f"{kind} epoch: raw sockets (recv_into a {into})", "",
                                  {**base, "case": "raw sockets", "files": files, "bytes": ebytes,
                                   "depth": args.depth, "into": into}))
            if "window" in args.only and kind == "fixed":
                cases.append((f"{kind} epoch: window gather, no cache", "",
                              {**base, "case": "window gather", "records": epoch, "row_bytes": 2048,
                               "shards": _shards(args.data, kind, sizes[kind])}))
                cases.append((f"{kind} epoch: window gather, sockets", "",
                              {**base, "case": "window sockets", "records": epoch, "row_bytes": 2048,
                               "depth": args.depth, "shards": _shards(args.data, kind, sizes[kind])}))
            for sl, sp in srcs:
                for ml, opts in modes:
                    cases.append(
                        (
                            f"{kind} epoch: seqstore {sl} {ml}",
                            sp,
                            {**base, "case": "epoch", "records": epoch, "options": {**depth, **opts}},
                        )
                    )
        if "loader" in args.only and kind == "fixed":
            if "epoch" not in args.only:  # the raw reads of as many bytes, for the ratio
                cases.append((f"{kind} loader: raw sequential", "",
                              {**base, "case": "raw sequential", "files": files, "bytes": 2 * ebytes,
                               "depth": args.depth}))
            for sl, sp in srcs:
                for ml, opts in modes:
                    mode = f" {ml}" if len(modes) > 1 else ""
                    for w in (0, 1, 2):
                        for pf in args.loader_prefetch:
                            cases.append(
                                (
                                    f"{kind} loader, {w} worker{'' if w == 1 else 's'}, prefetch {pf}: "
                                    f"seqstore {sl}{mode}",
                                    sp,
                                    {**base, "case": "loader", "records": 2 * epoch, "workers": w, "prefetch": pf,
                                     "options": {**depth, **opts}},
                                )
                            )
                        if not w:
                            continue
                        cases.append(
                            (
                                f"{kind} loader, procs={w}: seqstore {sl}{mode}",
                                sp,
                                {**base, "case": "loader", "records": 2 * epoch, "workers": w, "procs": True,
                                 "options": {**depth, **opts}},
                            )
                        )
        if "random" in args.only:
            for sl, sp in srcs:
                for ml, opts in modes:
                    cases.append(
                        (
                            f"{kind} random: seqstore {sl} {ml}",
                            sp,
                            {**base, "case": "random", "records": n_random, "options": {**depth, **opts}},
                        )
                    )
    runs: dict[str, list[dict[str, Any]]] = {c[0]: [] for c in cases}
    load = [os.getloadavg()[0]]
    with (
        _remote_server.ServerProcess(root, BUCKET) as server,
        _remote_nginx.NginxServer(root, BUCKET, server.endpoint, LATENCY) as ng,
    ):
        for r in range(repeats):
            # every other round in the reverse order: a case that follows another reuses memory that one
            # has just freed, which on a VM that hands freed memory back to its host at once (free page
            # reporting) is several times cheaper to touch than memory the host must supply again
            for name, src, spec in cases if r % 2 == 0 else cases[::-1]:
                spec = {**spec, "endpoint": ng.endpoint}
                got = run_case(spec, src or str(REPO / "src"))
                runs[name].append(got)
                load.append(os.getloadavg()[0])
                print(
                    f"  {name:48s} run {r + 1}: {got['bytes'] / got['wall_s'] / 1e6:8.1f} MB/s, "
                    f"{got['cpu_s'] / (got['bytes'] / GIB):.2f} CPU s/GiB",
                    file=sys.stderr,
                    flush=True,
                )
    report(runs, load)
    out = REPO / "bench" / "results" / "remote_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": runs, "load": load}, indent=1))


def report(runs: dict[str, list[dict[str, Any]]], load: list[float]) -> None:
    """Medians per case: MB/s (epochs) or records/s (random reads), CPU seconds per GiB and by stage."""
    med = statistics.median
    names = ["receive", "cache write", "bookkeeping", "planning", "gather", "other threads"]
    print("| case | rate (runs) | CPU s/GiB | of it kernel | " + " | ".join(names)
          + " | anon MiB | machine CPU s/GiB (cores busy) |")
    print("|---|---|---|---|" + "---|" * len(names) + "---|---|")
    for name, rs in runs.items():
        if not rs:
            continue
        gib = [r["bytes"] / GIB for r in rs]
        if "random" in name:
            rates = [r["records"] / r["wall_s"] for r in rs]
            unit = "records/s"
        else:
            rates = [r["bytes"] / r["wall_s"] / 1e6 for r in rs]
            unit = "MB/s"
        per = [r["cpu_s"] / g for r, g in zip(rs, gib) if r["cpu_s"] == r["cpu_s"]] or [float("nan")]
        kern = [r["system_s"] / g for r, g in zip(rs, gib) if "system_s" in r]
        st = [med([r["stages"].get(k, 0.0) / g for r, g in zip(rs, gib)]) for k in names]
        if "raw" in name:
            st[-1] = med([r["stages"].get("other", 0.0) / g for r, g in zip(rs, gib)])
        anon = [r["anon_mib"] for r in rs if r.get("anon_mib") is not None]
        mach = [(r["machine_s"] / g, r["machine_s"] / r["wall_s"]) for r, g in zip(rs, gib) if "machine_s" in r]
        print(
            f"| {name} | {med(rates):,.0f} {unit} ({'/'.join(f'{x:,.0f}' for x in rates)}) | {med(per):.2f} | "
            + (f"{med(kern):.2f} | " if kern else "- | ")
            + " | ".join(f"{v:.2f}" if v else "-" for v in st)
            + (f" | {med(anon):.0f} |" if anon else " | - |")
            + (f" {med(m for m, _ in mach):.2f} ({med(b for _, b in mach):.2f}) |" if mach else " - |")
        )
    print(f"\nload average (1 min) during the run: {min(load):.1f}-{max(load):.1f}; 2 cores")


if __name__ == "__main__":
    main()
