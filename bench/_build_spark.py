"""Spark -> seqstore vs Spark's own Parquet writer, and reading back (bench/build.py's Spark part).

One DataFrame of ``rows`` records, as issue 13 describes them: ``features`` a ragged (L, 16) matrix with
L uniform in 10..200 (``array<array<float>>``: Spark has no float16, so the store gets float16 through
the ``schema`` option and Parquet gets float32), ``labels`` a ragged int32 sequence of 1..20 tokens,
``id`` a string. It is generated with vectorised numpy in ``mapInArrow`` and cached (materialised in
Spark's memory, spilling to disk if needed) first, so every writer starts from the same cached data
and no generation is timed. Cases, one after another in one SparkSession (``local[2]``):

- ``format("seqstore")`` (one part per write task, one commit; fsyncs every shard before the commit),
  features float16 (the dataset) and, for the same bytes as Parquet, float32;
- ``df.write.parquet`` uncompressed (``compression="none"``) and with Spark's default (snappy);
- with ``--row-peer``: two do-nothing Python data sources that only iterate what Spark hands them,
  Rows (``DataSourceWriter``) or Arrow batches (``DataSourceArrowWriter``): the floor of each path;
- reading back: ``spark.read.format("seqstore")`` and ``spark.read.parquet`` of the uncompressed files,
  each consumed whole by Spark's ``noop`` sink (every column of every row materialised, nothing kept).

Per case: seconds, rows/s, MB/s of the payload (float16 feature, label and id bytes: the same figure
for every case, as in bench/_build_ray.py), the peak RSS of the JVM (driver and executor in one
process in local mode; it holds the cached DataFrame) and of the Python processes (this driver, the
workers Spark starts: writers, readers and the commit), sampled every 0.1 s. Ratios are against the
uncompressed Parquet write (writes) and read (reads), of the medians and per round; > 1 is faster.

``run(args, data)`` returns one dict per case; ``args`` may carry ``rows`` (default 200k; above
``spark_rows`` — default 300k, about 2 GB cached as float32 — it is capped, the cap printed),
``repeats`` (median; the cases alternate within each round), ``spark_partitions`` and ``row_peer``;
``data`` is a scratch directory. Standalone: ``python bench/_build_spark.py --rows 100000``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

DIM = 16
MIN_FRAMES, MAX_FRAMES = 10, 200
MAX_LABELS = 20
MAX_ROWS = 300_000


def _generate(batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow: records of the ``i`` column -> id, features (L x 16 float32), labels (vectorised)."""
    import numpy as np
    import pyarrow as pa

    for batch in batches:
        ids = np.asarray(batch.column(0).to_numpy(), dtype=np.int64)
        n = len(ids)
        if n == 0:
            continue
        rng = np.random.default_rng(int(ids[0]))
        frames = rng.integers(MIN_FRAMES, MAX_FRAMES + 1, n)
        tokens = rng.integers(1, MAX_LABELS + 1, n)
        rows = int(frames.sum())
        # values exact in float16, so both formats hold the same numbers
        feats = rng.standard_normal(rows * DIM, dtype=np.float32).astype(np.float16).astype(np.float32)
        labels = rng.integers(0, 30000, int(tokens.sum()), dtype=np.int32)
        inner = pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * DIM),
                                         pa.array(feats), type=pa.list_(pa.field("element", pa.float32(), False)))
        off_f = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(frames, out=off_f[1:])
        features = pa.ListArray.from_arrays(pa.array(off_f), inner, type=pa.list_(pa.field("element", inner.type,
                                                                                           False)))
        off_l = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(tokens, out=off_l[1:])
        lab = pa.ListArray.from_arrays(pa.array(off_l), pa.array(labels),
                                       type=pa.list_(pa.field("element", pa.int32(), False)))
        names = pa.array(np.char.add("utt-", np.char.zfill(ids.astype(str), 10)).astype(object), type=pa.string())
        yield pa.RecordBatch.from_arrays([names, features, lab], names=["id", "features", "labels"])


def _sinks() -> list[Any]:
    """Two do-nothing Python data sources: one takes Rows, one Arrow batches (the cost of each path)."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceWriter, WriterCommitMessage

    class RowWriter(DataSourceWriter):
        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

    class ArrowWriter(DataSourceArrowWriter):
        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

    class RowSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_row_sink"

        def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
            return RowWriter()

    class ArrowSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_arrow_sink"

        def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
            return ArrowWriter()

    return [RowSink, ArrowSink]


class _Peak:
    """Peak RSS of the JVM (a child of this process) and of all Python processes of the session
    (this one and the JVM's Python workers), sampled every 0.1 s while a case runs."""

    def __init__(self, jvm_pid: int | None) -> None:
        self.jvm_pid = jvm_pid
        self.jvm = 0
        self.python = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        py = me.memory_info().rss
        jvm = 0
        if self.jvm_pid is not None:
            try:
                j = psutil.Process(self.jvm_pid)
                jvm = j.memory_info().rss
                for c in j.children(recursive=True):
                    try:
                        py += c.memory_info().rss
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
        self.jvm, self.python = max(self.jvm, jvm), max(self.python, py)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.1)

    def __enter__(self) -> _Peak:
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()
        self._sample()


def _jvm_pid() -> int | None:
    import psutil

    for c in psutil.Process().children(recursive=True):
        try:
            if "java" in c.name():
                return int(c.pid)
        except psutil.Error:
            pass
    return None


def _du(p: Path) -> int | None:
    if not p.exists():
        return None
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def run(args: Any, data: Any) -> list[dict[str, Any]]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    import seqstore
    import seqstore.spark

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _generate runs in Spark's Python workers
    want = int(getattr(args, "rows", None) or 200_000)
    cap = int(getattr(args, "spark_rows", None) or MAX_ROWS)
    rows = min(want, cap)
    if rows < want:
        print(f"  spark: {rows} rows (of {want}: the cached DataFrame must fit this machine; --spark-rows raises it)",
              flush=True)
    repeats = int(getattr(args, "repeats", None) or 1)
    partitions = int(getattr(args, "spark_partitions", None) or max(4, rows // 25_000))
    work = Path(data) / "spark"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spark = (
        SparkSession.builder.master("local[2]").appName("seqstore-bench-build")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", str(getattr(args, "spark_memory", None) or "6g"))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(work / "spark-tmp"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(seqstore.spark.DataSource)
    jvm = _jvm_pid()
    try:
        schema = "id string, features array<array<float>>, labels array<int>"
        df = spark.range(0, rows, 1, partitions).mapInArrow(_generate, schema).cache()
        assert df.count() == rows
        sizes = df.selectExpr("sum(size(flatten(features))) as f", "sum(size(labels)) as l",
                              "sum(octet_length(id)) as i").collect()[0]
        payload = int(sizes["f"]) * 2 + int(sizes["l"]) * 4 + int(sizes["i"])

        def out(name: str) -> str:
            p = work / name
            shutil.rmtree(p, ignore_errors=True)
            return str(p)

        f16 = json.dumps({"features": ["float16", [None, DIM]]})
        f32 = json.dumps({"features": ["float32", [None, DIM]]})

        def seqstore_write(name: str, fields: str) -> Callable[[], Any]:
            return lambda: (df.write.format("seqstore").mode("overwrite").option("idColumn", "id")
                            .option("schema", fields).save(out(name)))

        writes: dict[str, tuple[str, Callable[[], Any]]] = {
            "seqstore (features float16)": ("store16", seqstore_write("store16", f16)),
            "seqstore (features float32)": ("store32", seqstore_write("store32", f32)),
            "parquet (uncompressed)": ("pq-none", lambda: df.write.mode("overwrite").option("compression", "none")
                                       .parquet(out("pq-none"))),
            "parquet (default, snappy)": ("pq-default", lambda: df.write.mode("overwrite").parquet(out("pq-default"))),
        }
        if getattr(args, "row_peer", False):  # what a Python writer pays for Rows instead of Arrow batches
            for sink in _sinks():
                spark.dataSource.register(sink)
            writes["Python writer taking Rows, iterating only"] = (
                "none", lambda: df.write.format("bench_row_sink").mode("append").save(out("none")))
            writes["Python writer taking Arrow batches, iterating only"] = (
                "none", lambda: df.write.format("bench_arrow_sink").mode("append").save(out("none")))
        small = df.limit(1000)  # warm-up: Python workers start, imports, numba compiles
        small.write.format("seqstore").mode("overwrite").option("idColumn", "id").option("schema", f16).save(
            out("warm"))
        small.write.mode("overwrite").parquet(out("warm-pq"))
        results: list[dict[str, Any]] = []
        runs: dict[str, list[tuple[float, int, int]]] = {name: [] for name in writes}
        disk: dict[str, int | None] = {}
        for _ in range(repeats):  # the cases alternate, so a change in the machine's load hits all of them
            for name, (target, fn) in writes.items():
                os.sync()
                runs[name].append(_timed(fn, jvm))
                disk[name] = _du(work / target)
                print(f"  spark {name}: {runs[name][-1][0]:.2f} s (load {os.getloadavg()[0]:.1f})", flush=True)
        for name in writes:
            r = _row("write", name, rows, payload, runs[name])
            r["bytes_on_disk"] = disk[name]
            r["partitions"] = partitions
            results.append(r)
        store = seqstore.open(work / "store16")
        assert len(store) == rows, f"store has {len(store)} records, expected {rows}"

        def drain(reader: Callable[[], Any]) -> Callable[[], Any]:
            return lambda: reader().write.format("noop").mode("overwrite").save()

        reads: dict[str, Callable[[], Any]] = {
            "spark.read seqstore": drain(lambda: spark.read.format("seqstore").load(str(work / "store16"))),
            "spark.read parquet (uncompressed)": drain(lambda: spark.read.parquet(str(work / "pq-none"))),
        }
        assert spark.read.format("seqstore").load(str(work / "store16")).count() == rows
        read_runs: dict[str, list[tuple[float, int, int]]] = {name: [] for name in reads}
        for _ in range(repeats):
            for name, fn in reads.items():
                read_runs[name].append(_timed(fn, jvm))
                print(f"  spark {name}: {read_runs[name][-1][0]:.2f} s (load {os.getloadavg()[0]:.1f})", flush=True)
        results += [_row("read", name, rows, payload, read_runs[name]) for name in reads]
        every = {**runs, **read_runs}
        for kind, base in (("write", "parquet (uncompressed)"), ("read", "spark.read parquet (uncompressed)")):
            ref = next(r for r in results if r["case"] == base)["seconds"]
            for r in results:
                if r["kind"] == kind:
                    r["speed_vs_parquet_uncompressed"] = round(ref / r["seconds"], 3)
                    # the same ratio within each round (the cases of a round ran back to back)
                    r["speed_per_round"] = [round(a[0] / b[0], 3) for a, b in zip(every[base], every[r["case"]])]
        return results
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


def _timed(fn: Callable[[], Any], jvm: int | None) -> tuple[float, int, int]:
    """(seconds, peak JVM RSS, peak RSS of all Python processes) of ``fn()``."""
    import gc

    gc.collect()
    with _Peak(jvm) as peak:
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
    return dt, peak.jvm, peak.python


def _row(kind: str, name: str, rows: int, payload: int, runs: list[tuple[float, int, int]]) -> dict[str, Any]:
    secs = statistics.median(r[0] for r in runs)
    return {
        "engine": "spark", "kind": kind, "case": name, "rows": rows, "payload_bytes": payload,
        "seconds": round(secs, 3), "rows_per_s": round(rows / secs), "mb_per_s": round(payload / secs / 1e6, 1),
        "jvm_peak_mib": round(statistics.median(r[1] for r in runs) / 2**20, 1),
        "python_peak_mib": round(statistics.median(r[2] for r in runs) / 2**20, 1),
        "driver_peak_mib": round(statistics.median(r[1] for r in runs) / 2**20, 1),
        "runs": len(runs), "seconds_all": [round(r[0], 3) for r in runs],
        "load_avg_1min": round(os.getloadavg()[0], 2),
    }


def _print(results: list[dict[str, Any]]) -> None:
    print("| kind | case | rows | s | rows/s | MB/s | x parquet uncompressed | JVM peak MiB | Python peak MiB | "
          "on disk MB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        disk = "" if r.get("bytes_on_disk") is None else f"{r['bytes_on_disk'] / 1e6:.0f}"
        print(f"| {r['kind']} | {r['case']} | {r['rows']} | {r['seconds']:.2f} | {r['rows_per_s']} | "
              f"{r['mb_per_s']} | {r.get('speed_vs_parquet_uncompressed', '')} | {r['jvm_peak_mib']} | "
              f"{r['python_peak_mib']} | {disk} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--spark-rows", type=int, default=MAX_ROWS, help="cap on the rows (memory)")
    ap.add_argument("--spark-partitions", type=int, default=None)
    ap.add_argument("--spark-memory", default="6g", help="spark.driver.memory")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--row-peer", action="store_true",
                    help="also time do-nothing Python writers taking Rows and taking Arrow batches")
    ap.add_argument("--data", default=None, help="scratch directory (default: a temporary one)")
    a = ap.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(dir=a.data) as tmp:
        _print(run(a, tmp))
