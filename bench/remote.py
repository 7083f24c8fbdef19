"""Remote reads: seqstore from an S3 server behind 20 ms of latency, vs raw obstore, Lance and MosaicML Streaming.

Set-up (all on loopback, started and stopped by this script):

- **Object reads** (GET/HEAD with ranges): by default (``--server nginx``) nginx with the echo
  module, 20 ms added to every request inside nginx (``echo_sleep``) and then the file served
  (``sendfile``): about 40 us of server CPU per small request, so the cases measure the clients
  (``bench/_remote_nginx.py``; installed with apt where possible, by ``make bench`` or this script,
  else a line says why and the run falls back to ``--server python``). Requests, round trips and
  body bytes are counted from nginx's access log. What nginx cannot answer (ListObjectsV2, which
  Lance lists its versions with; writes) it passes to the Python S3 server below.
- **Python S3 server**: ``bench/_remote_server.py``, a minimal S3-compatible server (GET/HEAD with
  ranges, ETag, Content-Range, conditional requests; PUT, multipart, DELETE, ListObjectsV2) serving
  DATA/bucket as bucket ``bench``: a range GET reads only its bytes (``sendfile``). Its module
  docstring says why not moto or s3rver (moto copies whole objects per range; s3rver answers suffix
  ranges wrongly, which seqstore uses). Every served file is read once before the cases and its pages
  locked in memory until the run ends (the server's page cache warm and kept so: the cases measure
  the clients and the latency, not this machine's disk), and a self-test checks the answers the
  readers rely on (of nginx too).
- ``--server python``: object reads from the Python server behind a **latency proxy** (20 ms added,
  requests, bytes and round trips counted; about 0.4 ms of CPU per request between the two): the
  threaded splice proxy of ``bench/_remote_proxy.py`` (``--proxy threads``, default) or
  ``tests/support/proxy.py``'s FaultProxy (``--proxy fault``). Group ``server`` measures the Python
  server directly, through both proxies, and nginx.

Data (built once under ``--data DIR``, default /work/bench-data/remote or $SEQSTORE_REMOTE_DATA, in
DIR/bucket/, never in the repository): ``fixed`` 1,000,000 records of float32 x 512 (2 KiB; 2.05 GB)
and ``ragged`` 300,000 records of 1-200 rows x 16 float16 (0.97 GB), the generator of
``bench/cold.py``, each as a seqstore store, a Lance dataset and MDS shards (Streaming).
``--quick``: 50,000 / 20,000 records.

Concurrency: seqstore's client defaults (``max_requests``, ``coalesce_gap``, read from
``seqstore.io.objects.ObjectClient``) are used by every case and by the raw peers (MAX_REQUESTS
requests in flight, ranges merged across gaps below GAP, at most 8 MiB per request).

Groups and cases (each run a fresh process; seqstore with a fresh ``cache_dir``, i.e. a cold node
cache):

- ``<kind>`` random reads: the first 6,144 positions of ``seq_order(n, "random", epoch=1, seed=3)``
  (quick 2,048) in batches of 1024, the store opened before the timer: ``seqstore get_batch``;
  ``seqstore iter_batches`` (its default prefetch: 16 batches on a remote store);
  ``seqstore get_batch, max_requests M`` (the other of 16 and 64, and twice and four times the default:
  what the limit is worth); ``obstore get_range xD`` at twice and four times the default too;
  ``obstore get_range xMAX_REQUESTS``: exactly the records' byte ranges
  (ragged: the two offsets of each record, then its value rows), merged per file across gaps below
  GAP (at most 8 MiB per request), MAX_REQUESTS in flight (``obstore.get_range_async`` under a
  semaphore); ``obstore get_ranges``: the same unmerged ranges through ``obstore.get_ranges_async``,
  one call per file and batch (obstore merges within ``coalesce=GAP`` and runs at most 10 requests
  per call; the calls of a batch at once); ``lance take`` (``dataset.take(batch, columns=["x"])``,
  Lance's own I/O scheduling); ``streaming dataset[i]`` (Streaming downloads each shard a sample
  lies in, whole, on first touch). All readers' values are checksummed and compared.
- ``<kind>-epoch``: the first 131,072 records of an epoch (quick 16,384; ``--epoch-records N``, or ``all``
  for whole epochs): ``server sequential``: as many bytes of the store's value files, in shard order, in 8
  MiB range GETs, MAX_REQUESTS in flight (the server's sequential throughput through the proxy: the
  baseline); ``seqstore random_block:1024:16`` (default prefetch, and 64; and with the ``read_once`` storage
  option: runs received into memory, not into the node cache; and ``default, store > node cache``: default
  options with a node cache of half the store's values, where seqstore reads once by itself) and ``seqstore
  default order``: ``iter_batches`` of the order in batches of 1024; ``obstore x64, seqstore's
  random_block:1024:16 requests``: the data requests the seqstore random_block case of the same round made,
  replayed raw in the same order (MAX_REQUESTS in flight, nothing done with the answers; MB/s of the
  records' bytes they brought seqstore): what that request pattern costs apart from seqstore's processing;
  ``streaming epoch (py1e)``: iterating Streaming's dataset with its shuffle, one process. MB/s of values
  delivered (``server sequential``: of file bytes).
- ``open``: ``seqstore.open`` then the first batch (1, 16 or 1024 records of the random order):
  times and the proxy's request and round-trip counts of each step.
- ``server``: 8 MiB range GETs (MB/s) and 2 KiB GETs (latency one at a time, rate with
  MAX_REQUESTS in flight), direct and through each proxy.

Per case: the median of ``--repeats`` runs (default 3, quick 1), the runs of all cases interleaved
(round r runs every case once, every other round in the reverse order); requests, round trips and
response body bytes counted by the proxy (``moved``); private memory (``Private_Clean +
Private_Dirty``) and anonymous memory at the end; CPU seconds of the reading process, and of the S3
server and the proxy while it read (on one machine they
share its cores: a reader that makes more requests or spends more CPU leaves them less). Ratios:
random reads vs the raw ``obstore get_range`` case and vs ``lance take``; epochs vs ``server
sequential``. Results: the tables on stdout and ``bench/results/remote[_quick].json``.

Usage: ``python bench/remote.py [--quick] [--repeats R] [--data DIR] [--server nginx|python]
[--proxy threads|fault] [--only server random epoch open] [--match TEXT ...] [--epoch-records N|all]``
(``--match``: only the
cases whose group/name contains one of the texts); ``--generate`` builds the data only; ``--no-streaming`` leaves
Streaming out (otherwise its venv is created on first use, see ``bench/_remote_streaming.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import numpy as np  # noqa: E402

from bench import _remote_nginx, _remote_proxy, _remote_server, _remote_streaming  # noqa: E402
from bench.harness import (  # noqa: E402
    RESULTS,
    Case,
    _run_once,
    _summarise,
    machine_info,
    machine_line,
    meminfo,
    section,
)

DEFAULT_DATA = Path(os.environ.get("SEQSTORE_REMOTE_DATA", "/work/bench-data/remote"))
BUCKET = "bench"
FULL = {"fixed": 1_000_000, "ragged": 300_000}
QUICK = {"fixed": 50_000, "ragged": 20_000}
N_READ, N_READ_QUICK, BATCH, ORDER_SEED = 6144, 2048, 1024, 3
EPOCH_RECORDS, EPOCH_RECORDS_QUICK = 131_072, 16_384
LATENCY, MOST = 0.02, 8 << 20


def _client_defaults() -> tuple[int, int]:
    """seqstore's client defaults (``max_requests``, ``coalesce_gap``): the peers use the same."""
    from seqstore.io.objects import ObjectClient

    c = ObjectClient(f"s3://{BUCKET}/x")
    return c.max_requests, c.coalesce_gap


MAX_REQUESTS, GAP = _client_defaults()
OTHER_LIMIT = 16 if MAX_REQUESTS != 16 else 64
DEEPER = 2 * MAX_REQUESTS  # twice the default in flight: what more depth buys against Lance's own default
DEEPEST = 4 * MAX_REQUESTS
RAW = f"obstore get_range x{MAX_REQUESTS}"
SEQ_CHUNK = 8 << 20
BLOCK_ORDER = "random_block:1024:16"
REPLAY = f"obstore x{MAX_REQUESTS}, seqstore's {BLOCK_ORDER} requests"
DIM_FIXED, DIM_RAGGED = 512, 16

# ------------------------------------------------------------------------------------------ helpers


def seqstore_options(endpoint: str) -> dict[str, Any]:
    return {**_remote_server.storage_options(endpoint), "max_requests": MAX_REQUESTS, "coalesce_gap": GAP}


def _s3store(endpoint: str) -> Any:
    from obstore.store import S3Store

    return S3Store(
        BUCKET,
        endpoint=endpoint,
        region="us-east-1",
        access_key_id="bench",
        secret_access_key="bench-secret",
        virtual_hosted_style_request=False,
        client_options={"allow_http": True, "timeout": "120s"},
    )


def smaps_mib() -> tuple[float, float]:
    priv = anon = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                priv += int(line.split()[1])
            elif line.startswith("Anonymous:"):
                anon += int(line.split()[1])
    return priv / 1024, anon / 1024


def _fresh_dir(data: str, what: str) -> Path:
    """A new directory for one case; node caches go under ``--cache-parent`` when given."""
    parent = os.environ.get("SEQSTORE_BENCH_CACHE_PARENT") if what == "cache" else None
    d = Path(parent or data) / "scratch" / f"{what}-{os.getpid()}-{time.time_ns()}"
    d.mkdir(parents=True)
    return d


def _exit_quietly() -> None:
    """End this (child) process with os._exit(0) once the harness has written its result: obstore
    0.12 sometimes aborts in interpreter finalization after many large ``get_range_async`` answers
    under ``asyncio.run`` ("Fatal Python error: Aborted", then a bus error; exit -6 or -7, 2 of 4
    processes here), after the case finished and its result was printed. Registered only when a case
    succeeded, so a failing case still exits non-zero."""
    import atexit

    atexit.register(os._exit, 0)


def _stats(control: str, reset: bool = False) -> dict[str, Any]:
    """The request counts since the last reset of the server in front (nginx's access log, or the
    latency proxy's counters), reset with ``reset``."""
    if control.startswith(_remote_nginx.PREFIX):
        return _remote_nginx.stats(control, reset=reset)
    return _remote_proxy.stats(control, reset=reset)


def _proxy_extra(control: str) -> dict[str, Any]:
    s = _stats(control)
    return {"requests": s["requests"], "round_trips": s["round_trips"], "moved_mib": s["body_bytes"] / 2**20}


def _epoch_batches(n: int, count: int) -> list[np.ndarray[Any, Any]]:
    import seqstore

    order = seqstore.seq_order(n, "random", epoch=1, seed=ORDER_SEED)
    idx = np.asarray(order[: min(count, n)], dtype=np.int64)
    return [idx[a : a + BATCH] for a in range(0, len(idx), BATCH)]


def _peer_cpu() -> float:
    """CPU seconds so far of the S3 server and the latency proxy (pids in $SEQSTORE_BENCH_PEERS): on
    one machine the readers share the cores with them, so what they spend per case is part of its cost."""
    total = 0.0
    for pid in filter(None, os.environ.get("SEQSTORE_BENCH_PEERS", "").split(",")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@contextlib.contextmanager
def _read() -> Iterator[dict[str, float]]:
    """The timed ``read`` section of a case; the dict it gives has, once the section is over, the
    server's and proxy's CPU seconds in it (``"peer_cpu_s"``)."""
    peers = {"peer_cpu_s": 0.0}
    p0 = _peer_cpu()
    with section("read"):
        yield peers
    peers["peer_cpu_s"] = _peer_cpu() - p0


def _check(kind: str, out: Any) -> float:
    """Order-sensitive checksum of one batch (the same for every reader that read the same values)."""
    if kind == "fixed":
        return float(np.dot(np.arange(1, len(out) + 1), out.sum(axis=1, dtype=np.float64)))
    values, lengths = out
    return float(values.sum(dtype=np.float64)) + float(np.dot(np.arange(1, len(lengths) + 1), lengths))


def _asked(kind: str, out: Any) -> int:
    return int(out.nbytes if kind == "fixed" else out[0].nbytes)


def layout_of(store_path: Path, bucket_root: Path, kind: str) -> list[list[Any]]:
    """Per shard of the local store: [records, values key, data offset, offsets key or None, offset]."""
    from bench.cold import _shard_files

    out = []
    for recs, v, voff, o, ooff in _shard_files(str(store_path), kind):
        okey = o.relative_to(bucket_root).as_posix() if o is not None else None
        out.append([recs, v.relative_to(bucket_root).as_posix(), voff, okey, ooff])
    return out


# ------------------------------------------------------------------------------------ raw obstore


def merge_runs(
    files: np.ndarray[Any, Any], starts: np.ndarray[Any, Any], ends: np.ndarray[Any, Any]
) -> tuple[list[tuple[int, int, int]], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Ranges merged per file where closer than GAP (at most MOST bytes per run): the runs
    ``(file, start, end)`` and, per input range, its run and its offset inside the run."""
    order = np.lexsort((starts, files))
    runs: list[tuple[int, int, int]] = []
    run_of = np.empty(len(starts), dtype=np.int64)
    off = np.empty(len(starts), dtype=np.int64)
    cf = cs = ce = -1
    for i in order.tolist():
        f, s, e = int(files[i]), int(starts[i]), int(ends[i])
        if f == cf and s - ce < GAP and max(e, ce) - cs <= MOST:
            ce = max(ce, e)
            runs[-1] = (cf, cs, ce)
        else:
            cf, cs, ce = f, s, e
            runs.append((f, s, e))
        run_of[i] = len(runs) - 1
        off[i] = s - cs
    return runs, run_of, off


class RawReader:
    """The byte ranges a random batch needs, straight through obstore (``mode``: ``limit`` or ``ranges``)."""

    def __init__(self, endpoint: str, layout: list[list[Any]], kind: str, mode: str, depth: int = 0) -> None:
        self.store = _s3store(endpoint)
        self.depth = depth or MAX_REQUESTS
        self.kind, self.mode = kind, mode
        self.layout = layout
        self.starts = np.zeros(len(layout) + 1, dtype=np.int64)
        np.cumsum([s[0] for s in layout], out=self.starts[1:])
        self.vkeys = [s[1] for s in layout]
        self.voff = np.array([s[2] for s in layout], dtype=np.int64)
        self.okeys = [s[3] for s in layout]
        self.ooff = np.array([s[4] for s in layout], dtype=np.int64)
        self.sem: asyncio.Semaphore | None = None

    async def _fetch(self, keys: list[str], files: Any, s: Any, e: Any) -> list[memoryview]:
        """The bytes of every range ``[s[i], e[i])`` of object ``keys[files[i]]``."""
        import obstore

        if self.mode == "limit":
            if self.sem is None:
                self.sem = asyncio.Semaphore(self.depth)
            sem = self.sem
            runs, run_of, off = merge_runs(files, s, e)

            async def one(f: int, a: int, b: int) -> memoryview:
                async with sem:
                    return memoryview(await obstore.get_range_async(self.store, keys[f], start=a, end=b))

            got = await asyncio.gather(*(one(*r) for r in runs))
            sizes = (e - s).tolist()
            return [got[r][o : o + z] for r, o, z in zip(run_of.tolist(), off.tolist(), sizes)]
        out: list[memoryview] = [memoryview(b"")] * len(s)
        calls = []
        for f in np.unique(files).tolist():
            pos = np.flatnonzero(files == f)
            calls.append(
                (
                    pos,
                    obstore.get_ranges_async(
                        self.store, keys[f], starts=s[pos].tolist(), ends=e[pos].tolist(), coalesce=GAP
                    ),
                )
            )
        results = await asyncio.gather(*(c for _, c in calls))
        for (pos, _), res in zip(calls, results):
            for p, b in zip(pos.tolist(), res):
                out[p] = memoryview(b)
        return out

    async def get(self, batch: np.ndarray[Any, Any]) -> Any:
        k = np.searchsorted(self.starts, batch, side="right") - 1
        rows = batch - self.starts[k]
        if self.kind == "fixed":
            rec = DIM_FIXED * 4
            s = self.voff[k] + rows * rec
            got = await self._fetch(self.vkeys, k, s, s + rec)
            out = np.empty((len(batch), DIM_FIXED), dtype=np.float32)
            flat = out.reshape(-1).view(np.uint8)
            for j, b in enumerate(got):
                flat[j * rec : (j + 1) * rec] = np.frombuffer(b, dtype=np.uint8)
            return out
        s = self.ooff[k] + rows * 8
        pairs = await self._fetch(self.okeys, k, s, s + 16)  # type: ignore[arg-type]
        bounds = np.frombuffer(b"".join(pairs), dtype=np.int64).reshape(-1, 2)
        lengths = bounds[:, 1] - bounds[:, 0]
        row = DIM_RAGGED * 2
        vs = self.voff[k] + bounds[:, 0] * row
        vals = await self._fetch(self.vkeys, k, vs, vs + lengths * row)
        values = np.frombuffer(b"".join(vals), dtype=np.float16).reshape(-1, DIM_RAGGED)
        return values, lengths


# --------------------------------------------------------------------------------------- cases


def case_random(
    kind: str,
    system: str,
    n: int,
    n_read: int,
    endpoint: str,
    control: str,
    url: str,
    data: str,
    layout: list[list[Any]] | None = None,
    max_requests: int = MAX_REQUESTS,
) -> dict[str, Any]:
    """Random batches of the epoch order through one reader (child process)."""
    batches = _epoch_batches(n, n_read)
    scratch = _fresh_dir(data, "cache")
    try:
        if system in ("get_batch", "iter_batches"):
            import seqstore

            opts = {**seqstore_options(endpoint), "max_requests": max_requests}
            store = seqstore.open(url, storage_options=opts, cache_dir=scratch)

            def read_all() -> Any:
                if system == "iter_batches":
                    for got in store.iter_batches(batches):
                        yield got["x"]
                else:
                    for b in batches:
                        yield store.get_batch(b)["x"]

        elif system in ("limit", "ranges"):
            assert layout is not None
            raw = RawReader(endpoint, layout, kind, system, max_requests)
            loop = asyncio.new_event_loop()

            def read_all() -> Any:
                for b in batches:
                    yield loop.run_until_complete(raw.get(b))

        elif system == "lance":
            import lance

            ds = lance.dataset(url, storage_options=_remote_server.storage_options(endpoint))

            def read_all() -> Any:
                for b in batches:
                    col = ds.take(b, columns=["x"]).column("x").combine_chunks()
                    if kind == "fixed":
                        yield col.flatten().to_numpy().reshape(-1, DIM_FIXED)
                    else:
                        yield (
                            col.flatten().flatten().to_numpy().reshape(-1, DIM_RAGGED),
                            col.value_lengths().to_numpy().astype(np.int64),
                        )

        else:
            raise ValueError(system)
        _stats(control, reset=True)
        check = 0.0
        asked = 0
        with _read() as peers:
            t0 = time.perf_counter()
            t1 = 0.0
            for got in read_all():
                check += _check(kind, got)
                asked += _asked(kind, got)
                if not t1:
                    t1 = time.perf_counter()
            dt = time.perf_counter() - t0
            rest = time.perf_counter() - t1
        extra = _proxy_extra(control)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if system in ("limit", "ranges"):
        _exit_quietly()
    priv, anon = smaps_mib()
    records = sum(len(b) for b in batches)
    return {
        "records_per_s": records / dt,
        # from the first batch's end on: the process's one-time costs (imports, numba's cache, the
        # first shard's preparation) apart
        "steady_per_s": (records - len(batches[0])) / rest if len(batches) > 1 else None,
        "first_batch_s": t1 - t0,
        "asked_mib": asked / 2**20,
        "private_mib": priv,
        "anon_mib": anon,
        "checksum": check,
        "peer_cpu_s": peers["peer_cpu_s"],
        **extra,
    }


def _streaming_env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(
        S3_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


def case_streaming(
    kind: str,
    what: str,
    n: int,
    n_read: int,
    endpoint: str,
    control: str,
    url: str,
    data: str,
    python: str,
) -> dict[str, Any]:
    """MosaicML Streaming in its own venv (``bench/_remote_streaming.py``); ``what``: random or epoch.
    The rate is the Streaming process's own timing (its interpreter start and imports not counted)."""
    scratch = _fresh_dir(data, "streaming")
    try:
        cmd = [
            python,
            str(Path(__file__).with_name("_remote_streaming.py")),
            what,
            "--remote",
            url,
            "--local",
            str(scratch / "local"),
            "--kind",
            kind,
        ]
        if what == "random":
            idx = np.concatenate(_epoch_batches(n, n_read))
            np.save(scratch / "idx.npy", idx)
            cmd += ["--indices", str(scratch / "idx.npy"), "--batch", str(BATCH)]
        else:
            cmd += ["--limit", str(n_read)]
        _stats(control, reset=True)
        with _read():
            proc = subprocess.run(cmd, env=_streaming_env(endpoint), capture_output=True, text=True, timeout=1800)
        if proc.returncode:
            raise RuntimeError(f"streaming {what} failed:\n{proc.stderr[-3000:]}")
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        extra = _proxy_extra(control)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = {
        "asked_mib": got["asked_bytes"] / 2**20,
        "private_mib": got["private_mib"],
        "anon_mib": got["anon_mib"],
        "cpu_s": got["cpu_s"],
        **extra,
    }
    rest = got["seconds"] - got["first_seconds"]
    if what == "random":
        out.update(
            records_per_s=got["records"] / got["seconds"],
            first_batch_s=got["first_seconds"],
            steady_per_s=(got["records"] - got["first_records"]) / rest,
            checksum=got["checksum"],
        )
    else:
        out.update(
            mb_per_s=got["asked_bytes"] / got["seconds"] / 1e6,
            first_batch_s=got["first_seconds"],
            steady_per_s=(got["asked_bytes"] - got["first_bytes"]) / rest / 1e6,
            records=got["records"],
        )
    return out


async def _read_files(store: Any, files: list[tuple[str, int]], chunk: int, conc: int) -> int:
    """Whole files in ``chunk``-byte range GETs, ``conc`` in flight; bytes read."""
    reqs = [[k, a, min(a + chunk, size)] for k, size in files for a in range(0, size, chunk)]
    return await _replay(store, reqs, conc)


def _requests_file(data: str, kind: str) -> Path:
    """Where the seqstore random_block case of ``kind`` leaves the data requests it made (for the replay)."""
    return Path(data) / "scratch" / f"requests-{kind}.json"


def _record_requests(path: Path, asked: list[int]) -> None:
    """Record, in this child process, every data request seqstore submits (object key in the bucket, start,
    end), written to ``path`` with the asked bytes at exit (the seqstore cases exit normally)."""
    from seqstore.io import remote_fetch

    made: list[tuple[str, int, int]] = []
    submit = remote_fetch.Fetcher.submit

    def recording(self: Any, reqs: Any, fills: Any, chunks: Any = ()) -> Any:
        bucket = f"s3://{BUCKET}/"
        made.extend((self.client.key_url(k).removeprefix(bucket), a, b) for k, a, b, _ in reqs)
        return submit(self, reqs, fills, chunks)

    remote_fetch.Fetcher.submit = recording  # type: ignore[method-assign]
    import atexit

    atexit.register(lambda: path.write_text(json.dumps({"requests": made, "asked": asked[0]})))


async def _replay(store: Any, reqs: list[list[Any]], conc: int) -> int:
    import obstore

    sem = asyncio.Semaphore(conc)

    async def one(key: str, a: int, b: int) -> int:
        async with sem:
            return len(await obstore.get_range_async(store, key, start=a, end=b))

    return sum(await asyncio.gather(*(one(*r) for r in reqs)))


def case_epoch(
    kind: str,
    system: str,
    n: int,
    records: int,
    endpoint: str,
    control: str,
    url: str,
    data: str,
    files: list[list[Any]],
    prefetch: int | None = None,
    read_once: bool = False,
    small_cache: bool = False,
) -> dict[str, Any]:
    """The first ``records`` of an epoch (child process): seqstore ``iter_batches`` of the order (``read_once``:
    the storage option of that name; ``small_cache``: default options with a node cache of half the
    store's values, as a store larger than its node's cache: seqstore then reads once by itself), or
    (``sequential``) as many bytes of the store's files, in shard order, read in 8 MiB GETs, MAX_REQUESTS
    in flight."""
    scratch = _fresh_dir(data, "cache")
    try:
        if system == "replay":  # the data requests the seqstore random_block case made, raw
            made = json.loads(_requests_file(data, kind).read_text())
            store = _s3store(endpoint)
            _stats(control, reset=True)
            with _read() as peers:
                t0 = time.perf_counter()
                asyncio.run(_replay(store, made["requests"], MAX_REQUESTS))
                dt = time.perf_counter() - t0
            nbytes = made["asked"]  # the records' bytes those requests brought to seqstore
            steady = nbytes / dt / 1e6
            _exit_quietly()
            first_s = None
        elif system == "sequential":
            store = _s3store(endpoint)
            total = sum(size for key, size in files if not key.endswith(".offsets.npy"))
            budget = int(total * records / n)  # the values' share of the files these records cover
            parts = []
            for key, size in files:
                if budget <= 0:
                    break
                parts.append((key, min(size, budget)))
                budget -= size
            _stats(control, reset=True)
            with _read() as peers:
                t0 = time.perf_counter()
                nbytes = asyncio.run(_read_files(store, parts, SEQ_CHUNK, MAX_REQUESTS))
                dt = time.perf_counter() - t0
            steady = nbytes / dt / 1e6
            _exit_quietly()
            first_s = None
        else:
            import itertools

            import seqstore

            opts = {**seqstore_options(endpoint), **({"read_once": "true"} if read_once else {})}
            budget = {"cache_bytes": sum(size for _, size in files) // 2} if small_cache else {}
            store = seqstore.open(url, storage_options=opts, cache_dir=scratch, **budget)
            assert store.read_once == (read_once or small_cache), "the read path is not the one this case names"
            order = seqstore.seq_order(
                n, BLOCK_ORDER if system == "random_block" else "default", epoch=1, seed=ORDER_SEED
            )
            chunks = itertools.islice(order.iter_chunks(BATCH), -(-records // BATCH))
            asked = [0]
            if system == "random_block" and prefetch is None and not read_once and not small_cache:
                _record_requests(_requests_file(data, kind), asked)
            _stats(control, reset=True)
            nbytes = 0
            with _read() as peers:
                t0 = time.perf_counter()
                t1, first = 0.0, 0
                for got in store.iter_batches(chunks, prefetch=prefetch):
                    nbytes += _asked(kind, got["x"])
                    if not t1:
                        t1, first = time.perf_counter(), nbytes
                dt = time.perf_counter() - t0
                steady = (nbytes - first) / (time.perf_counter() - t1) / 1e6
                first_s = t1 - t0
            asked[0] = nbytes
        extra = _proxy_extra(control)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    priv, anon = smaps_mib()
    return {
        "mb_per_s": nbytes / dt / 1e6,
        "steady_per_s": steady,
        "first_batch_s": first_s,
        "asked_mib": nbytes / 2**20,
        "private_mib": priv,
        "anon_mib": anon,
        "peer_cpu_s": peers["peer_cpu_s"],
        **extra,
    }


def case_open(kind: str, n: int, first: int, endpoint: str, control: str, url: str, data: str) -> dict[str, Any]:
    """``seqstore.open`` and the first batch after it (``first`` records of the random order)."""
    import seqstore

    idx = _epoch_batches(n, first)[0][:first]
    scratch = _fresh_dir(data, "cache")
    try:
        _stats(control, reset=True)
        with section("open"):
            t0 = time.perf_counter()
            store = seqstore.open(url, storage_options=seqstore_options(endpoint), cache_dir=scratch)
            t1 = time.perf_counter()
        s_open = _stats(control, reset=True)
        with section("first_batch"):
            t2 = time.perf_counter()
            store.get_batch(idx)
            t3 = time.perf_counter()
        s_batch = _stats(control, reset=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    priv, anon = smaps_mib()
    return {
        "open_ms": (t1 - t0) * 1e3,
        "open_requests": s_open["requests"],
        "open_round_trips": s_open["round_trips"],
        "batch_ms": (t3 - t2) * 1e3,
        "batch_requests": s_batch["requests"],
        "batch_round_trips": s_batch["round_trips"],
        "total_ms": (t1 - t0 + t3 - t2) * 1e3,
        "private_mib": priv,
        "anon_mib": anon,
    }


def case_server(what: str, endpoint: str, files: list[list[Any]]) -> dict[str, Any]:
    """The server alone (direct or through a proxy): 8 MiB GETs, or 2 KiB GETs (MAX_REQUESTS in flight)."""
    import obstore

    store = _s3store(endpoint)
    if what == "sequential":
        with _read():
            t0 = time.perf_counter()
            nbytes = asyncio.run(_read_files(store, [(k, s) for k, s in files], SEQ_CHUNK, MAX_REQUESTS))
            dt = time.perf_counter() - t0
        _exit_quietly()
        return {"mb_per_s": nbytes / dt / 1e6}
    key, size = files[0]
    rng = np.random.default_rng(5)
    offsets = rng.integers(0, size - 2048, 2000).tolist()
    lat = []
    obstore.get_range(store, key, start=0, length=2048)  # the connection
    with _read():
        for o in offsets[:100]:
            t = time.perf_counter()
            obstore.get_range(store, key, start=o, length=2048)
            lat.append(time.perf_counter() - t)

        async def many() -> float:
            sem = asyncio.Semaphore(MAX_REQUESTS)

            async def one(o: int) -> None:
                async with sem:
                    await obstore.get_range_async(store, key, start=o, length=2048)

            t = time.perf_counter()
            await asyncio.gather(*(one(o) for o in offsets))
            return len(offsets) / (time.perf_counter() - t)

        rate = asyncio.run(many())
    _exit_quietly()
    return {"req_per_s": rate, "p50_ms": float(np.median(lat)) * 1e3, "p90_ms": float(np.percentile(lat, 90)) * 1e3}


# ------------------------------------------------------------------------------------------ parent


def ensure_data(data: Path, sizes: dict[str, int], streaming_python: Path | None) -> dict[tuple[str, str], Path]:
    from bench.cold import ensure

    root = data / "bucket"
    paths = ensure(root, sizes, ("seqstore", "lance"))
    if streaming_python is not None:
        for kind, n in sizes.items():
            p = root / f"{kind}-{n}.mds"
            done = p.with_name(p.name + ".done")
            if not (done.exists() and p.exists()):
                shutil.rmtree(p, ignore_errors=True)
                print(f"building {p} ...", file=sys.stderr, flush=True)
                subprocess.run(
                    [
                        str(streaming_python),
                        str(Path(__file__).with_name("_remote_streaming.py")),
                        "build",
                        "--kind",
                        kind,
                        "--n",
                        str(n),
                        "--out",
                        str(p),
                    ],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                done.touch()
            paths[(kind, "mds")] = p
    return paths


def _files(path: Path, root: Path) -> list[list[Any]]:
    return [[q.relative_to(root).as_posix(), q.stat().st_size] for q in sorted(path.rglob("*")) if q.is_file()]


def _warm(paths: list[Path], pinned: list[Any]) -> tuple[float, int]:
    """Read every file of the data sets of this run once (the server's page cache warm) and lock its
    pages in memory (``mlock`` of a read-only mapping kept in ``pinned`` until the run ends): this VM
    reclaims page cache it deems cold (kdamond), which made the server read from disk now and then (a
    sequential rate of 81-1,016 MB/s between runs of the same case). Returns seconds and the bytes
    locked (0 where locking is refused, or the files would take more than half the available memory:
    then they are only read)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    t0 = time.perf_counter()
    buf = bytearray(8 << 20)
    total = sum(q.stat().st_size for p in paths for q in p.rglob("*") if q.is_file())
    locked = 0 if total < meminfo("MemAvailable") // 2 else -1  # never lock more than half the free memory
    for p in paths:
        for q in sorted(p.rglob("*")):
            if not q.is_file():
                continue
            size = q.stat().st_size
            if size and locked >= 0:
                with open(q, "rb") as f:
                    m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
                addr = np.frombuffer(m, np.uint8).ctypes.data
                if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(size)) == 0:
                    pinned.append(m)
                    locked += size
                    continue
                m.close()
                locked = -1  # refused (no CAP_IPC_LOCK, RLIMIT_MEMLOCK): read the rest only
            with open(q, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
    return time.perf_counter() - t0, max(locked, 0)


def _epoch_records(args: Any) -> int:
    """Records per epoch case (``--epoch-records``; ``all``: every record of the store)."""
    if args.epoch_records is None:
        return EPOCH_RECORDS_QUICK if args.quick else EPOCH_RECORDS
    if args.epoch_records == "all":
        return 1 << 62
    return int(args.epoch_records)


def build_cases(
    args: Any, sizes: dict[str, int], paths: dict[tuple[str, str], Path], ends: dict[str, str], streaming: Path | None
) -> list[Case]:
    root = args.data / "bucket"
    data = str(args.data)
    n_read = N_READ_QUICK if args.quick else N_READ
    epoch_records = _epoch_records(args)
    via, control = ends["proxy"], ends["control"]
    cases: list[Case] = []
    want = set(args.only or ["server", "random", "epoch", "open"])
    if "server" in want:
        probe = _files(paths[("fixed", "seqstore")], root)
        probe = [f for f in probe if f[0].endswith("/x.npy")]
        servers = [
            ("direct (Python server)", ends["direct"]),
            ("FaultProxy (tests/support)", ends["fault"]),
            ("threads proxy (bench)", ends["threads"]),
        ]
        if "nginx" in ends:
            servers.append(("nginx, echo_sleep", ends["nginx"]))
        for label, ep in servers:
            for what, metric in (("sequential", "mb_per_s"), ("small", "req_per_s")):
                name = f"{label}: {f'8 MiB GETs x{MAX_REQUESTS}' if what == 'sequential' else '2 KiB GETs'}"
                cases.append(
                    Case(
                        name,
                        "bench.remote:case_server",
                        {"what": what, "endpoint": ep, "files": probe},
                        group="server",
                        metric=metric,
                    )
                )
    for kind, n in sizes.items():
        store_url = f"s3://{BUCKET}/{paths[(kind, 'seqstore')].relative_to(root).as_posix()}"
        lance_url = f"s3://{BUCKET}/{paths[(kind, 'lance')].relative_to(root).as_posix()}"
        common = {"kind": kind, "n": n, "endpoint": via, "control": control, "data": data}
        layout = layout_of(paths[(kind, "seqstore")], root, kind)
        if "random" in want:
            rows: list[tuple[str, str, dict[str, Any]]] = [
                ("seqstore get_batch", "bench.remote:case_random", {"system": "get_batch", "url": store_url}),
                ("seqstore iter_batches", "bench.remote:case_random", {"system": "iter_batches", "url": store_url}),
                (
                    f"seqstore get_batch, max_requests {OTHER_LIMIT}",
                    "bench.remote:case_random",
                    {"system": "get_batch", "url": store_url, "max_requests": OTHER_LIMIT},
                ),
                (
                    f"seqstore get_batch, max_requests {DEEPER}",
                    "bench.remote:case_random",
                    {"system": "get_batch", "url": store_url, "max_requests": DEEPER},
                ),
                (
                    f"seqstore get_batch, max_requests {DEEPEST}",
                    "bench.remote:case_random",
                    {"system": "get_batch", "url": store_url, "max_requests": DEEPEST},
                ),
                (
                    RAW,
                    "bench.remote:case_random",
                    {"system": "limit", "url": store_url, "layout": layout},
                ),
                *[
                    (
                        f"obstore get_range x{d}",
                        "bench.remote:case_random",
                        {"system": "limit", "url": store_url, "layout": layout, "max_requests": d},
                    )
                    for d in (DEEPER, DEEPEST)
                ],
                (
                    "obstore get_ranges",
                    "bench.remote:case_random",
                    {"system": "ranges", "url": store_url, "layout": layout},
                ),
                ("lance take", "bench.remote:case_random", {"system": "lance", "url": lance_url}),
            ]
            if streaming is not None:
                mds_url = f"s3://{BUCKET}/{paths[(kind, 'mds')].relative_to(root).as_posix()}"
                rows.append(
                    (
                        "streaming dataset[i]",
                        "bench.remote:case_streaming",
                        {"what": "random", "url": mds_url, "python": str(streaming)},
                    )
                )
            for name, target, kw in rows:
                cases.append(
                    Case(
                        name,
                        target,
                        {**common, "n_read": n_read, **kw},
                        group=kind,
                        metric="records_per_s",
                        timeout=1800,
                    )
                )
        if "epoch" in want:
            files = _files(paths[(kind, "seqstore")], root)
            files = [f for f in files if f[0].endswith("/x.npy")]  # the values, in shard order
            rows = [
                ("server sequential", "bench.remote:case_epoch", {"system": "sequential", "files": files}),
                (f"seqstore {BLOCK_ORDER}", "bench.remote:case_epoch", {"system": "random_block", "files": files}),
                (f"seqstore {BLOCK_ORDER}, read_once", "bench.remote:case_epoch",
                 {"system": "random_block", "files": files, "read_once": True}),
                (f"seqstore {BLOCK_ORDER}, default, store > node cache", "bench.remote:case_epoch",
                 {"system": "random_block", "files": files, "small_cache": True}),
                (REPLAY, "bench.remote:case_epoch", {"system": "replay", "files": files}),
                (
                    f"seqstore {BLOCK_ORDER}, prefetch 64",
                    "bench.remote:case_epoch",
                    {"system": "random_block", "files": files, "prefetch": 64},
                ),
                ("seqstore default order", "bench.remote:case_epoch", {"system": "default", "files": files}),
            ]
            for name, target, kw in rows:
                cases.append(
                    Case(
                        name,
                        target,
                        {**common, "url": store_url, "records": min(epoch_records, n), **kw},
                        group=f"{kind}-epoch",
                        metric="mb_per_s",
                        timeout=1800,
                    )
                )
            if streaming is not None:
                mds_url = f"s3://{BUCKET}/{paths[(kind, 'mds')].relative_to(root).as_posix()}"
                cases.append(
                    Case(
                        "streaming epoch (py1e)",
                        "bench.remote:case_streaming",
                        {**common, "n_read": min(epoch_records, n), "what": "epoch", "url": mds_url,
                         "python": str(streaming)},
                        group=f"{kind}-epoch",
                        metric="mb_per_s",
                        timeout=1800,
                    )
                )
        if "open" in want:
            for first in (1, 16, BATCH):
                cases.append(
                    Case(
                        f"{kind}: open + first batch of {first}",
                        "bench.remote:case_open",
                        {**common, "first": first, "url": store_url},
                        group="open",
                        metric="total_ms",
                    )
                )
    if args.match:
        cases = [c for c in cases if any(m in c.key for m in args.match)]
    return cases


def run_interleaved(cases: list[Case], repeats: int, meta: dict[str, Any]) -> dict[str, Any]:
    import dataclasses

    runs: dict[str, list[dict[str, Any]]] = {c.key: [] for c in cases}
    t_start = time.perf_counter()
    for r in range(repeats):
        # every other round in the reverse order: a case that follows another reuses the memory that one
        # has just freed, which on a VM that hands freed memory back to its host at once (free page
        # reporting; docs/benchmarks.md) is several times cheaper to touch than memory the host supplies again
        for c in cases if r % 2 == 0 else cases[::-1]:
            t0 = time.perf_counter()
            try:
                runs[c.key].append(_run_once(c))
            except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others' runs
                print(f"  {c.key}: run {r + 1} FAILED: {str(exc)[-2000:]}", file=sys.stderr, flush=True)
                continue
            ex = runs[c.key][-1]["extra"]
            shown = ex.get(c.metric)
            print(
                f"  {c.key:60s} run {r + 1}/{repeats}: {c.metric}={shown:,.1f} "
                f"(requests {ex.get('requests', ex.get('batch_requests', '-'))}, "
                f"process {time.perf_counter() - t0:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    results: dict[str, Any] = {
        "name": "remote",
        "machine": machine_info(),
        "repeats": repeats,
        "meta": meta,
        "cases": [],
    }
    for c in cases:
        if runs[c.key]:
            results["cases"].append(
                {**dataclasses.asdict(c), "key": c.key, "runs": runs[c.key], "summary": _summarise(runs[c.key])}
            )
    results["wall_s"] = time.perf_counter() - t_start
    return results


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def report(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines: list[str] = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in results["cases"]:
        groups.setdefault(c["group"], []).append(c)

    def med(c: dict[str, Any], key: str) -> float | None:
        vals = [r["extra"].get(key) for r in c["runs"]]
        vals = [v for v in vals if isinstance(v, (int, float))]
        return statistics.median(vals) if vals else None

    def table(cols: list[str], rows: list[list[str]]) -> None:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(cols)]
        lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(cols, widths)) + " |")
        lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        lines.extend("| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |" for r in rows)

    summary: dict[str, Any] = {}
    for group, cases in groups.items():
        metric = cases[0]["metric"]
        base = {c["name"]: med(c, metric) for c in cases}
        if group == "server":
            lines.append("\nserver: the S3 server alone, direct and through each proxy (20 ms added)\n")
            rows = []
            for c in cases:
                m = c["metric"]
                v = med(c, m)
                rows.append(
                    [
                        c["name"],
                        f"{v:,.0f} {'MB/s' if m == 'mb_per_s' else 'req/s'}",
                        "/".join(f"{r['extra'][m]:,.0f}" for r in c["runs"]),
                        f"{med(c, 'p50_ms'):.2f} / {med(c, 'p90_ms'):.2f}" if med(c, "p50_ms") else "-",
                    ]
                )
            table(["case", "median", "runs", "2 KiB GET p50 / p90 ms (one at a time)"], rows)
            continue
        if group == "open":
            lines.append(
                "\nopen: seqstore.open, then get_batch of the first records of the random order; "
                "requests and round trips counted by the proxy\n"
            )
            rows = []
            for c in cases:
                rows.append(
                    [
                        c["name"],
                        f"{med(c, 'open_ms'):.1f}",
                        f"{med(c, 'open_requests'):.0f}",
                        f"{med(c, 'open_round_trips'):.0f}",
                        f"{med(c, 'batch_ms'):.1f}",
                        f"{med(c, 'batch_requests'):.0f}",
                        f"{med(c, 'batch_round_trips'):.0f}",
                        f"{med(c, 'total_ms'):.1f}",
                    ]
                )
                summary.setdefault("open", {})[c["name"]] = {
                    k: med(c, k) for k in ("open_round_trips", "batch_round_trips", "total_ms")
                }
            table(
                [
                    "case",
                    "open ms",
                    "open requests",
                    "open round trips",
                    "batch ms",
                    "batch requests",
                    "batch round trips",
                    "total ms",
                ],
                rows,
            )
            continue
        epoch = group.endswith("-epoch")
        kind = group.split("-")[0]
        n = meta["sizes"][kind]
        if epoch:
            lines.append(
                f"\n{kind}: the first {min(meta['epoch_records'], n):,} records of an epoch of {n:,} through the proxy "
                f"(batches of {BATCH})\n"
            )
            refs = ["server sequential", REPLAY]
        else:
            lines.append(
                f"\n{kind}: {min(meta['n_read'], n):,} records of a random epoch of {n:,}, batches of "
                f"{BATCH}, through the proxy\n"
            )
            refs = [RAW, "lance take"]
        unit = "MB/s" if epoch else "records/s"
        steady_base = {c["name"]: med(c, "steady_per_s") for c in cases}
        cols = [
            "case",
            unit,
            "runs",
            *[f"vs {r}" for r in refs],
            f"{unit} from the 2nd batch",
            *[f"vs {r}" for r in refs],
            "1st batch s",
            "requests",
            "round trips",
            "moved MiB / asked MiB",
            "private MiB",
            "anon MiB",
            "CPU s",
            "server + proxy CPU s",
        ]
        rows = []
        sums = set()
        for c in cases:
            v = med(c, metric)
            cpu = med(c, "cpu_s")
            if cpu is None:
                cpu = statistics.median(r["sections"]["read"]["cpu_s"] for r in c["runs"])
            mv, ak = med(c, "moved_mib"), med(c, "asked_mib")
            rows.append(
                [
                    c["name"],
                    f"{v:,.0f}" if v else "-",
                    "/".join(f"{r['extra'][metric]:,.0f}" for r in c["runs"]),
                    *[_ratio(v, base.get(r)) for r in refs],
                    f"{st:,.0f}" if (st := med(c, "steady_per_s")) else "-",
                    *[_ratio(st, steady_base.get(r)) for r in refs],
                    f"{fb:.2f}" if (fb := med(c, "first_batch_s")) is not None else "-",
                    f"{med(c, 'requests'):,.0f}",
                    f"{med(c, 'round_trips'):,.0f}",
                    f"{mv:,.1f} / {ak:,.1f}" if mv is not None and ak else "-",
                    f"{med(c, 'private_mib'):,.0f}",
                    f"{med(c, 'anon_mib'):,.0f}",
                    f"{cpu:.2f}",
                    f"{pc:.2f}" if (pc := med(c, "peer_cpu_s")) is not None else "-",
                ]
            )
            if c["runs"][0]["extra"].get("checksum") is not None:
                sums.add(round(c["runs"][0]["extra"]["checksum"], 0))
            summary.setdefault(group, {})[c["name"]] = v
            summary.setdefault(group + "/steady", {})[c["name"]] = med(c, "steady_per_s")
            if epoch and ak:
                summary.setdefault(group + "/cpu_per_gib", {})[c["name"]] = cpu / (ak / 1024)
        table(cols, rows)
        if len(sums) > 1:
            lines.append(f"\nWARNING: readers disagree on the values read (checksums {sorted(sums)})")
    lines.append("")
    for kind in meta["sizes"]:
        for suffix, what in (("", "whole runs"), ("/steady", "from the 2nd batch")):
            g = summary.get(kind + suffix, {})
            e = summary.get(f"{kind}-epoch{suffix}", {})
            parts = []
            if g:
                sq = g.get("seqstore get_batch")
                parts.append(f"get_batch / {RAW} {_ratio(sq, g.get(RAW))} (target >= 0.9x)")
                for d in (DEEPER, DEEPEST):
                    deep = g.get(f"seqstore get_batch, max_requests {d}")
                    parts.append(f"at {d} in flight {_ratio(deep, g.get(f'obstore get_range x{d}'))} (>= 0.9x)")
                parts.append(f"get_batch / Lance {_ratio(sq, g.get('lance take'))}")
                parts.append(f"iter_batches / {RAW} {_ratio(g.get('seqstore iter_batches'), g.get(RAW))}")
            if e:
                seq = e.get("server sequential")
                parts.append(
                    f"{BLOCK_ORDER} / sequential {_ratio(e.get(f'seqstore {BLOCK_ORDER}'), seq)} (target >= 0.8x)"
                )
                cpu = summary.get(f"{kind}-epoch/cpu_per_gib", {})
                parts.append(
                    f"CPU s per GiB {BLOCK_ORDER} / sequential "
                    f"{_ratio(cpu.get(f'seqstore {BLOCK_ORDER}'), cpu.get('server sequential'))} (target <= 1.5x)"
                )
                once = f"seqstore {BLOCK_ORDER}, read_once"
                parts.append(f"read_once / sequential {_ratio(e.get(once), seq)} (target >= 0.8x), CPU s per GiB "
                             f"{_ratio(cpu.get(once), cpu.get('server sequential'))} (target <= 1.5x)")
                big = f"seqstore {BLOCK_ORDER}, default, store > node cache"
                parts.append(f"default options, store > node cache / sequential {_ratio(e.get(big), seq)} (target "
                             f">= 0.8x), CPU s per GiB {_ratio(cpu.get(big), cpu.get('server sequential'))} "
                             "(target <= 1.5x)")
                parts.append(f"with prefetch 64 {_ratio(e.get(f'seqstore {BLOCK_ORDER}, prefetch 64'), seq)}")
                own = _ratio(e.get(f"seqstore {BLOCK_ORDER}"), e.get(REPLAY))
                parts.append(f"{BLOCK_ORDER} / its own requests replayed raw {own}")
            if parts:
                lines.append(f"{kind} ({what}): " + "; ".join(parts))
    for name, v in summary.get("open", {}).items():
        lines.append(
            f"{name}: {v['open_round_trips']:.0f} + {v['batch_round_trips']:.0f} round trips "
            f"(target: first batch <= 3), {v['total_ms']:.0f} ms"
        )
    lines.append(
        f"\nmedians of {results['repeats']} runs per case (interleaved), each a fresh process (seqstore: fresh "
        f"cache_dir); proxy {meta['proxy']} adding {LATENCY * 1e3:.0f} ms per request; "
        f"{machine_line(results['machine'])}"
    )
    lines.append(
        f"obstore {meta.get('obstore')}, lance {meta.get('lance')}, streaming {meta.get('streaming')}; "
        f"load average before/after {meta.get('load_before'):.1f} / {meta.get('load_after'):.1f}; "
        f"seqstore imported from {meta.get('seqstore_from')}"
    )
    lines += meta.get("notes", [])
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="50,000 fixed / 20,000 ragged records, 1 run per case")
    p.add_argument("--repeats", type=int, default=None, help="runs per case (default 3, quick 1)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"data directory (default {DEFAULT_DATA})")
    p.add_argument("--proxy", choices=("fault", "threads"), default="threads", help="the latency proxy of the cases")
    p.add_argument("--only", nargs="+", choices=("server", "random", "epoch", "open"), help="only these groups")
    p.add_argument("--generate", action="store_true", help="build the data only")
    p.add_argument("--no-streaming", action="store_true", help="leave MosaicML Streaming out")
    p.add_argument(
        "--cache-parent",
        default=None,
        help="where seqstore's node caches go (default: under --data; e.g. /dev/shm for a cache in "
        "memory, as fast as a node's NVMe, where this VM's disk is slow to write)",
    )
    p.add_argument(
        "--server",
        choices=("nginx", "python"),
        default="nginx",
        help="what serves object reads: nginx with the latency inside it (default; installed with apt where "
        "possible) or the bench's Python S3 server behind the Python latency proxy (--proxy)",
    )
    p.add_argument("--match", nargs="+", default=None, help="only the cases whose name contains one of these")
    p.add_argument(
        "--epoch-records",
        default=None,
        help=f"records of each epoch case: a number, or 'all' for whole epochs (default {EPOCH_RECORDS:,}, "
        f"quick {EPOCH_RECORDS_QUICK:,}): a short epoch is dominated by what a process pays once (importing, "
        "the first window's round trips)",
    )
    args = p.parse_args()
    if args.server == "nginx":
        why = _remote_nginx.install()
        if why:
            print(f"skipped: nginx ({why}); serving with --server python instead", file=sys.stderr, flush=True)
            args.server = "python"
    if args.cache_parent:
        os.environ["SEQSTORE_BENCH_CACHE_PARENT"] = args.cache_parent
    repeats = args.repeats or (1 if args.quick else 3)
    sizes = dict(QUICK if args.quick else FULL)
    args.data.mkdir(parents=True, exist_ok=True)
    lock = open(args.data / ".remote-bench.lock", "w")  # noqa: SIM115 - held until the process exits
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"skipped: remote: another bench/remote.py run is using {args.data}")
        return
    notes: list[str] = []
    if args.server == "python":
        notes.append(f"object reads served by the Python S3 server behind the {args.proxy} latency proxy")
    streaming = None if args.no_streaming else _remote_streaming.install()
    if streaming is None and not args.no_streaming:
        notes.append("skipped: MosaicML Streaming (its venv could not be installed; see stderr)")
    paths = ensure_data(args.data, sizes, streaming)
    if args.generate:
        return
    shutil.rmtree(args.data / "scratch", ignore_errors=True)
    root = args.data / "bucket"
    pinned: list[Any] = []  # the served files' pages, locked in memory until the run ends
    secs, locked = _warm(list(paths.values()), pinned)
    print(f"warming the server's page cache: {secs:.1f} s, {locked / 1e9:.1f} GB locked", file=sys.stderr, flush=True)
    if not locked:
        notes.append(
            "the served files were not locked in memory (mlock refused, or more than half the available "
            "memory): the machine may reclaim their pages during the run"
        )
    import lance
    import obstore

    import seqstore

    meta: dict[str, Any] = {
        "seqstore_from": str(Path(seqstore.__file__).parent),
        "sizes": sizes,
        "n_read": N_READ_QUICK if args.quick else N_READ,
        "epoch_records": _epoch_records(args),
        "proxy": "nginx (echo_sleep)" if args.server == "nginx" else args.proxy,
        "data": str(args.data),
        "obstore": obstore.__version__,
        "lance": lance.__version__,
        "streaming": _remote_streaming.STREAMING if streaming else None,
        "load_before": os.getloadavg()[0],
        "notes": notes,
    }
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(_remote_server.ServerProcess(root, BUCKET))
        want_proxies = args.server == "python" or "server" in (args.only or ["server"])
        fault = threads = None
        if want_proxies:
            fault = stack.enter_context(_remote_proxy.ProxyProcess(server.endpoint, LATENCY, "fault"))
            threads = stack.enter_context(_remote_proxy.ProxyProcess(server.endpoint, LATENCY, "threads"))
        assert server.proc is not None
        ends = {"direct": server.endpoint}
        if fault is not None and threads is not None:
            ends.update(fault=fault.endpoint, threads=threads.endpoint)
        if args.server == "nginx":
            ng = stack.enter_context(_remote_nginx.NginxServer(root, BUCKET, server.endpoint, LATENCY))
            ends.update(nginx=ng.endpoint, proxy=ng.endpoint, control=ng.control)
            peers = [*ng.pids(), server.proc.pid]
        else:
            chosen = fault if args.proxy == "fault" else threads
            assert chosen is not None and chosen.proc is not None
            ends.update(proxy=chosen.endpoint, control=chosen.control)
            peers = [server.proc.pid, chosen.proc.pid]
        os.environ["SEQSTORE_BENCH_PEERS"] = ",".join(map(str, peers))  # children inherit it
        _selftest(server.endpoint)
        if args.server == "nginx":
            _selftest_reads(ends["nginx"])
        cases = build_cases(args, sizes, paths, ends, streaming)
        results = run_interleaved(cases, repeats, meta)
    meta["load_after"] = os.getloadavg()[0]
    text = report(results, meta)
    results["report"] = text
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"remote{'_quick' if args.quick else ''}.json").write_text(json.dumps(results, indent=1))
    shutil.rmtree(args.data / "scratch", ignore_errors=True)


def _selftest_reads(endpoint: str) -> None:
    """nginx answers the reads the readers rely on (bounded, suffix and open ranges, 416, ETag on HEAD)
    and passes a listing through to the Python server."""
    import obstore

    store = _s3store(endpoint)
    key = next(k["path"] for batch in obstore.list(store, chunk_size=100) for k in batch if k["size"] > 100)
    body = bytes(obstore.get(store, key).bytes())
    assert bytes(obstore.get_range(store, key, start=10, end=20)) == body[10:20]
    assert bytes(obstore.get(store, key, options={"range": {"suffix": 100}}).bytes()) == body[-100:]
    assert bytes(obstore.get(store, key, options={"range": {"offset": len(body) - 10}}).bytes()) == body[-10:]
    assert obstore.head(store, key)["e_tag"]
    try:
        obstore.get_range(store, key, start=len(body) + 100, end=len(body) + 110)
    except Exception:  # noqa: BLE001 - 416, as S3 answers
        pass
    else:
        raise AssertionError("nginx served a range past the end")


def _selftest(endpoint: str) -> None:
    """The server answers what the readers rely on (suffix, open and bounded ranges, 416, ETag)."""
    import obstore

    store = _s3store(endpoint)
    key = "_selftest.bin"
    body = np.random.default_rng(0).bytes(100_000)
    tag = obstore.put(store, key, body)["e_tag"]
    assert bytes(obstore.get_range(store, key, start=10, end=20)) == body[10:20]
    assert bytes(obstore.get(store, key, options={"range": {"suffix": 100}}).bytes()) == body[-100:]
    assert bytes(obstore.get(store, key, options={"range": {"offset": 99_990}}).bytes()) == body[-10:]
    assert obstore.head(store, key)["e_tag"] == tag
    try:
        obstore.get_range(store, key, start=200_000, end=200_010)
    except Exception:  # noqa: BLE001 - 416, as S3 answers
        pass
    else:
        raise AssertionError("the bench S3 server served a range past the end")
    obstore.delete(store, key)


if __name__ == "__main__":
    main()
