"""seqstore.spark: the "seqstore" Spark 4 data source, with a real SparkSession (local[2], task retries).

One SparkSession for the whole test run (tests/conftest.py's session-scoped fixture, which
docs/distributed.md's example also runs on); each test writes its own stores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("pyspark", minversion="4.0", reason="pyspark>=4.0 is not installed (pip install 'seqstore[spark]')")


def _java_problem() -> str | None:
    """Why Spark 4 cannot start here (it needs Java 17+), or None."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java:
        return "no java on PATH and no JAVA_HOME"
    if not os.path.exists(java):
        return f"JAVA_HOME={home} has no bin/java"
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{java} -version failed: {exc}"
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if m is None:
        return f"cannot read the version of {java}: {(out.stderr or out.stdout).strip()[:200]!r}"
    major = int(m.group(2)) if m.group(1) == "1" else int(m.group(1))  # "1.8.0" is Java 8
    return None if major >= 17 else f"{java} is Java {major}"


if (_problem := _java_problem()) is not None:
    pytest.skip(f"Spark 4 needs Java 17+ ({_problem}); install a JDK 17+ or set JAVA_HOME to run these tests",
                allow_module_level=True)

import seqstore  # noqa: E402
from seqstore import Field  # noqa: E402
from seqstore.store.parts import pending_jobs  # noqa: E402

N = 3000  # rows of the main DataFrame
PARTITIONS = 4


@pytest.fixture(scope="session")
def spark(spark_session: Any) -> Any:
    """The run's SparkSession (tests/conftest.py: local[2,2], a failed task retried once)."""
    from pyspark import cloudpickle

    # the UDFs below go to Spark's Python workers by value (this module is not importable there)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return spark_session


def _frame(spark: Any, n: int = N, partitions: int = PARTITIONS, width: int = 0) -> Any:
    """Rows i = 0..n-1: key 'r<i>', label i (int), feat: (i % 7 + 1) floats i + x, mat: (i % 5 + 1) rows
    [x, i], and with ``width`` a column pad of ``width`` floats (to make batches bigger)."""
    cols = [
        "concat('r', cast(id as string)) as key",
        "cast(id as int) as label",
        "transform(sequence(0, cast(id % 7 as int)), x -> cast(x + id as float)) as feat",
        "transform(sequence(0, cast(id % 5 as int)), x -> array(cast(x as float), cast(id as float))) as mat",
    ]
    if width:
        cols.append(f"transform(sequence(1, {width}), x -> cast(id as float)) as pad")
    return spark.range(0, n, 1, partitions).selectExpr(*cols)


MAT_SCHEMA = json.dumps({"mat": ["float16", [None, 2]]})


def _check_rows(path: Path, n: int, *, first: int = 0, width: int = 0) -> None:
    """The store holds exactly rows first..first+n-1 of _frame, once each, in order, by id and value."""
    store = seqstore.open(path)
    assert len(store) == n
    ids = [store.id(i) for i in range(n)]
    assert ids == [f"r{first + i}" for i in range(n)]
    assert len(set(ids)) == n
    idx = np.arange(n)
    batch = store.get_batch(idx, fields=["label", "feat", "mat"])
    labels = first + idx
    np.testing.assert_array_equal(batch["label"], labels)
    feat, flen = batch["feat"]
    np.testing.assert_array_equal(flen, labels % 7 + 1)
    want = np.concatenate([np.arange(k % 7 + 1, dtype=np.float32) + k for k in labels])
    np.testing.assert_array_equal(feat, want)
    mat, mlen = batch["mat"]
    np.testing.assert_array_equal(mlen, labels % 5 + 1)
    rows = np.concatenate([np.stack([np.arange(k % 5 + 1), np.full(k % 5 + 1, k)], axis=1) for k in labels])
    np.testing.assert_array_equal(mat, rows.astype(np.float16))
    if width:
        pad = store.get_batch(idx, fields=["pad"])["pad"]
        np.testing.assert_array_equal(pad[0], np.repeat(labels, width).astype(np.float32))


def _leftovers(path: Path) -> list[str]:
    """Anything of a write left besides the committed store: pending jobs, and directories in _parts."""
    parts = path / "_parts"
    left = [f"job {j}" for j in pending_jobs(path)]
    if parts.is_dir():
        left += [f"_parts/{e.name}" for e in os.scandir(parts) if not e.name.startswith(".")]
    return left


def _write(df: Any, path: Path | str, mode: str = "append", **options: str) -> None:
    w = df.write.format("seqstore").mode(mode)
    for k, v in options.items():
        w = w.option(k, v)
    w.save(str(path))


# ------------------------------------------------------------------------------------------- writing


def test_every_row_exactly_once_in_partition_order(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "s"
    _write(_frame(spark), out, idColumn="key", schema=MAT_SCHEMA, maxShardRecords="250")
    _check_rows(out, N)
    store = seqstore.open(out)
    assert store.schema["mat"] == Field("float16", (None, 2))
    assert store.schema["feat"] == Field("float32", (None,))
    assert store.schema["label"] == Field("int32")
    assert store.num_shards >= PARTITIONS * 2  # several shards per task, committed in one commit
    assert store.manifest.generation == 1
    assert store.metadata["spark"] == {"id_column": "key"}
    assert _leftovers(out) == []


def test_helper_write_and_empty_partitions(spark: Any, tmp_path: Path) -> None:
    import seqstore.spark

    out = tmp_path / "s"
    df = _frame(spark, n=40, partitions=1).repartition(6)  # some of 6 partitions may be empty
    seqstore.spark.write(df.orderBy("label").coalesce(3), out, id_column="key",
                         schema={"mat": Field("float16", (None, 2))})
    _check_rows(out, 40)


def _kill_writer_mid_part(store: str, partition: int) -> Any:
    """A mapInArrow function that passes batches through; in attempt 0 of ``partition`` it waits (after
    handing over a few batches) until the seqstore writer of that attempt has finished a shard of its
    part, SIGKILLs the process that writes it (found by its open owner.lock), notes what it saw in
    ``<store>.kill.json`` and fails the task. Spark retries the task."""

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        victim = ctx.partitionId() == partition and ctx.attemptNumber() == 0
        for k, batch in enumerate(batches):
            yield batch
            if victim and k == 30:
                parts = Path(store) / "_parts"
                shard = None
                deadline = time.monotonic() + 120
                while shard is None and time.monotonic() < deadline:
                    found = sorted(parts.glob(f"*/p{partition}-a0-*/p000000/_shard.json"))
                    shard = found[0].parent if found else None
                    time.sleep(0.05)
                killed = []
                if shard is not None:
                    lock = str(shard.parent / "owner.lock")
                    for pid in os.listdir("/proc"):
                        if not pid.isdigit():
                            continue
                        try:
                            fds = os.listdir(f"/proc/{pid}/fd")
                        except OSError:
                            continue
                        for fd in fds:
                            try:
                                if os.readlink(f"/proc/{pid}/fd/{fd}") == lock:
                                    killed.append(int(pid))
                            except OSError:
                                pass
                    for pid in set(killed):
                        os.kill(pid, signal.SIGKILL)
                Path(store + ".kill.json").write_text(json.dumps(
                    {"shard": str(shard) if shard else None, "killed": sorted(set(killed))}))
                raise RuntimeError("injected failure after killing the seqstore writer")

    return fn


def test_task_killed_mid_write_is_retried_exactly_once(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "s"
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        df = _frame(spark, n=8000, partitions=2, width=64)
        df = df.mapInArrow(_kill_writer_mid_part(str(out), 1), df.schema)
        _write(df, out, idColumn="key", schema=MAT_SCHEMA, maxShardRecords="100")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    seen = json.loads(Path(str(out) + ".kill.json").read_text())
    assert seen["shard"] is not None, "the writer of partition 1 attempt 0 never finished a shard"
    assert len(seen["killed"]) == 1, seen  # the writer's process died holding a finished shard of its part
    _check_rows(out, 8000, width=64)
    assert _leftovers(out) == []  # the killed attempt's part is gone


def _fail_partition(partition: int, attempts: int) -> Any:
    """A mapInArrow function that raises in ``partition`` after 5 batches, in the first ``attempts``
    attempts of that task."""

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for k, batch in enumerate(batches):
            if ctx.partitionId() == partition and ctx.attemptNumber() < attempts and k == 5:
                raise RuntimeError(f"injected failure in partition {partition}")
            yield batch

    return fn


def test_task_failure_retried_exactly_once(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "s"
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        df = _frame(spark)
        df = df.mapInArrow(_fail_partition(2, attempts=1), df.schema)  # attempt 0 fails, attempt 1 succeeds
        _write(df, out, idColumn="key", schema=MAT_SCHEMA, maxShardRecords="60")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    _check_rows(out, N)
    assert _leftovers(out) == []


def test_failed_job_leaves_nothing(spark: Any, tmp_path: Path) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        new = tmp_path / "new"
        df = _frame(spark, n=1200)  # partition 1 (of 300 rows) fails after 5 batches of 50
        failing = df.mapInArrow(_fail_partition(1, attempts=99), df.schema)
        with pytest.raises((Py4JJavaError, PySparkException)) as err:
            _write(failing, new, idColumn="key", schema=MAT_SCHEMA, maxShardRecords="60")
        assert "injected failure in partition 1" in str(err.value)
        assert not new.exists()  # the store this job created is gone again

        old = tmp_path / "old"
        _write(_frame(spark, n=100), old, idColumn="key", schema=MAT_SCHEMA)
        with pytest.raises((Py4JJavaError, PySparkException)):
            _write(failing, old, idColumn="key", maxShardRecords="60")
        _check_rows(old, 100)  # unchanged: nothing of the failed job is visible
        assert seqstore.open(old).manifest.generation == 1
        assert _leftovers(old) == []
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def test_write_to_s3(spark: Any, moto_s3: Any, s3_bucket: str, tmp_path: Path) -> None:
    """Write tasks upload their parts into an s3:// store (moto); the client options come as
    storage.<key> options and the storageOptions JSON; a failed append leaves the store as it was and
    no staging object."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    url = f"s3://{s3_bucket}/spark.seqstore"
    opts = moto_s3.storage_options()
    secret = {"secret_access_key": opts.pop("secret_access_key")}
    client = {f"storage.{k}": v for k, v in opts.items()}
    _write(_frame(spark, n=500), url, idColumn="key", schema=MAT_SCHEMA, maxShardRecords="100",
           storageOptions=json.dumps(secret), **client)
    cache = tmp_path / "cache"
    store = seqstore.open(url, storage_options=moto_s3.storage_options(), cache_dir=cache)
    local = tmp_path / "local"
    _write(_frame(spark, n=500), local, idColumn="key", schema=MAT_SCHEMA)
    _check_rows(local, 500)
    want = seqstore.open(local)
    assert len(store) == 500 and [store.id(i) for i in range(500)] == [want.id(i) for i in range(500)]
    got, ref = store.get_batch(np.arange(500)), want.get_batch(np.arange(500))
    for name in ref:
        for x, y in zip(got[name] if isinstance(got[name], tuple) else (got[name],),
                        ref[name] if isinstance(ref[name], tuple) else (ref[name],)):
            np.testing.assert_array_equal(x, y)
    assert store.num_shards >= PARTITIONS
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        failing = _frame(spark, n=1200)  # partition 1 (of 300 rows) fails after 5 batches of 50, in every attempt
        failing = failing.mapInArrow(_fail_partition(1, attempts=99), failing.schema)
        with pytest.raises((Py4JJavaError, PySparkException), match="injected failure in partition 1"):
            _write(failing, url, idColumn="key", maxShardRecords="60", storageOptions=json.dumps(secret), **client)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert len(seqstore.open(url, storage_options=moto_s3.storage_options(), cache_dir=cache)) == 500
    assert not [k for k in moto_s3.keys(s3_bucket, "spark.seqstore/_parts/") if "/_parts/.ended/" not in k]
    # and read back from the URL by the executors (options as for writing), record order kept
    back = spark.read.format("seqstore").option("storageOptions", json.dumps(secret)).options(**client).load(url)
    rows = back.collect()
    assert [r["key"] for r in rows] == [want.id(i) for i in range(500)]
    for i in (0, 123, 499):
        np.testing.assert_array_equal(np.asarray(rows[i]["mat"], np.float32).reshape(want[i]["mat"].shape),
                                      want[i]["mat"].astype(np.float32))


def test_append_overwrite_errorifexists(spark: Any, tmp_path: Path) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    import seqstore.spark

    out = tmp_path / "s"
    df = _frame(spark, n=200)
    seqstore.spark.write(df, out, mode="errorifexists", id_column="key", schema={"mat": Field("float16", (None, 2))})
    _check_rows(out, 200)
    # append: after the store's records; the store's fields are used for columns the schema option omits
    later = spark.range(200, 300, 1, 2).selectExpr(
        "concat('r', cast(id as string)) as key", "cast(id as int) as label",
        "transform(sequence(0, cast(id % 7 as int)), x -> cast(x + id as float)) as feat",
        "transform(sequence(0, cast(id % 5 as int)), x -> array(cast(x as float), cast(id as float))) as mat")
    _write(later, out, "append", idColumn="key")
    _check_rows(out, 300)
    # errorifexists on an existing store: an error, nothing written
    with pytest.raises((Py4JJavaError, PySparkException, FileExistsError)) as err:
        seqstore.spark.write(later, out, id_column="key")
    assert "already exists" in str(err.value)
    _check_rows(out, 300)
    # Spark itself refuses its default mode for every Python data source; the option above stands in for it
    with pytest.raises(PySparkException, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        later.write.format("seqstore").save(str(out))
    # overwrite: the records (and here the schema) are replaced
    small = spark.range(0, 50, 1, 2).selectExpr("cast(id * 2 as long) as twice")
    _write(small, out, "overwrite")
    store = seqstore.open(out)
    assert dict(store.schema) == {"twice": Field("int64")}
    np.testing.assert_array_equal(store.get_batch(np.arange(50))["twice"], np.arange(50) * 2)
    assert not store.has_ids
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("shard-")) == \
        sorted(f"shard-{int(n):06d}" for n in store.manifest.shard_table().data["number"])
    assert _leftovers(out) == []


def test_write_errors_name_the_column(spark: Any, tmp_path: Path) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    df = _frame(spark, n=20)
    with pytest.raises((Py4JJavaError, PySparkException)) as err:
        _write(df, tmp_path / "a", idColumn="key")  # mat is array<array<float>>: its row length is unknown
    assert "column 'mat'" in str(err.value) and "schema option" in str(err.value)
    assert not (tmp_path / "a").exists()
    nulls = spark.range(0, 20, 1, 2).selectExpr("if(id = 13, null, cast(id as int)) as v")
    with pytest.raises((Py4JJavaError, PySparkException)) as err:
        _write(nulls, tmp_path / "b")
    assert "column 'v'" in str(err.value) and "null" in str(err.value)
    assert not (tmp_path / "b").exists()
    wrong = spark.range(0, 20, 1, 2).selectExpr("array(cast(id as float), cast(2 as float)) as v")
    with pytest.raises((Py4JJavaError, PySparkException)) as err:
        _write(wrong, tmp_path / "c", schema=json.dumps({"v": ["float32", [3]]}))
    assert "column 'v'" in str(err.value) and "needs 3" in str(err.value)
    big = spark.range(0, 20, 1, 2).selectExpr("array(cast(id as float), cast(1e6 as float)) as v")
    with pytest.raises((Py4JJavaError, PySparkException)) as err:
        _write(big, tmp_path / "d", schema=json.dumps({"v": ["float16", [None]]}))
    assert "1000000.0" in str(err.value) and "overflows dtype float16" in str(err.value)
    assert not (tmp_path / "d").exists()


def test_float_narrowing_matches_the_writer(tmp_path: Path) -> None:
    """The fast cast of Spark's floats into a float16 field gives the writer's values, and leaves
    values that round or overflow (and NaN, infinities) to the writer's checked cast."""
    from seqstore.engines.spark_types import _narrowed

    f = Field("float16", (None,))
    edge = np.array([0.0, -1.5, 1e-8, 6e-8, 65504.0, 65519.0, -65519.0, np.nan, np.inf, -np.inf], dtype=np.float32)
    for values in (np.linspace(-60000, 60000, 1001, dtype=np.float32), edge, edge.astype(np.float64)):
        got = _narrowed(values, f)
        in_range = bool(np.isfinite(values).all() and np.abs(values).max() <= 65504)
        assert got.dtype == (np.float16 if in_range else values.dtype)
        with seqstore.create(tmp_path / f"s{len(values)}{values.dtype}", {"v": f}) as w:
            w.append_batch({"v": (got, np.array([len(values)]))})
        stored = seqstore.open(tmp_path / f"s{len(values)}{values.dtype}")[0]["v"]
        np.testing.assert_array_equal(stored.view(np.uint16), values.astype(np.float16).view(np.uint16))
    assert _narrowed(np.array([1e6], dtype=np.float32), f).dtype == np.float32  # the writer names the value
    assert _narrowed(np.array([1.0], dtype=np.float32), Field("bfloat16", (None,))).dtype == np.float32


def test_fixed_shape_from_arrays(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "s"
    df = spark.range(0, 64, 1, 3).selectExpr(
        "cast(id as string) as k", "array(array(id, id + 1, id + 2), array(0, 1, 2)) as m", "cast(id as short) as s")
    _write(df, out, idColumn="k", schema=json.dumps({"m": ["int16", [2, 3]]}))
    store = seqstore.open(out)
    assert store.schema["m"] == Field("int16", (2, 3))
    m = store.get_batch(np.arange(64))["m"]
    np.testing.assert_array_equal(m[:, 0], np.arange(64)[:, None] + np.arange(3))
    np.testing.assert_array_equal(m[:, 1], np.broadcast_to(np.arange(3), (64, 3)))
    assert store.index("17") == 17


# ------------------------------------------------------------------------------------------- reading


@pytest.fixture(scope="module")
def typed_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of every kind of field, in several shards."""
    path = tmp_path_factory.mktemp("spark-read") / "typed"
    rng = np.random.default_rng(5)
    schema = {
        "f16": Field("float16", (None, 3)),
        "bf": Field("bfloat16", (4,)),
        "u8": Field("uint8"),
        "u64": Field("uint64"),
        "flag": Field("bool"),
        "tok": Field("int8", (None,)),
        "m": Field("float64", (2, 3)),
        "cube": Field("int32", (None, 2, 2)),
    }
    with seqstore.create(path, schema, max_shard_records=37) as w:
        for i in range(150):
            t = int(rng.integers(0, 6))
            w.append({
                "f16": rng.standard_normal((t, 3)).astype(np.float16),
                "bf": rng.standard_normal(4).astype(np.float32),
                "u8": i % 256, "u64": (1 << 62) + i, "flag": i % 3 == 0,
                "tok": rng.integers(-100, 100, size=(t + 1) % 4),
                "m": rng.standard_normal((2, 3)),
                "cube": rng.integers(0, 1000, size=(t, 2, 2)),
            }, id=f"utt-{i:04d}-é")
    return path


def _to_py(v: Any) -> Any:
    return np.asarray(v).tolist()


def test_read_equals_store(spark: Any, typed_store: Path) -> None:
    from pyspark.sql import types as T

    store = seqstore.open(typed_store, bfloat16="float32")
    df = spark.read.format("seqstore").option("partitionRecords", "16").option("batchRecords", "5").load(
        str(typed_store))
    s = df.schema
    assert s.fieldNames() == ["id", *store.schema]
    assert s["id"].dataType == T.StringType()
    assert s["f16"].dataType == T.ArrayType(T.ArrayType(T.FloatType(), False), False)
    assert s["bf"].dataType == T.ArrayType(T.FloatType(), False)
    assert s["u8"].dataType == T.ShortType() and s["u64"].dataType == T.LongType()
    assert s["flag"].dataType == T.BooleanType() and s["tok"].dataType == T.ArrayType(T.ByteType(), False)
    assert s["cube"].dataType == T.ArrayType(T.ArrayType(T.ArrayType(T.IntegerType(), False), False), False)
    assert df.rdd.getNumPartitions() == sum(-(-37 // 16) for _ in range(4)) + 1  # 4 shards of 37, one of 2
    rows = df.collect()
    assert len(rows) == len(store)
    for i, row in enumerate(rows):  # partitions come back in record order
        rec = store[i]
        assert row["id"] == store.id(i)
        for name in store.schema:
            want = rec[name].astype(np.float32) if name == "f16" else rec[name]
            assert _to_py(row[name]) == _to_py(want), (i, name)


def test_read_fields_and_id_column_options(spark: Any, typed_store: Path, tmp_path: Path) -> None:
    store = seqstore.open(typed_store)
    df = spark.read.format("seqstore").option("fields", "u8,tok").option("idColumn", "key").load(str(typed_store))
    assert df.columns == ["key", "u8", "tok"]
    got = df.where("u8 = 77").collect()
    assert len(got) == 1 and got[0]["key"] == store.id(77) and got[0]["tok"] == store[77]["tok"].tolist()
    assert spark.read.format("seqstore").option("idColumn", "").load(str(typed_store)).columns == list(store.schema)
    # a store written by Spark reads back with the id column it was written from
    out = tmp_path / "s"
    _write(_frame(spark, n=30, partitions=2), out, idColumn="key", schema=MAT_SCHEMA)
    back = spark.read.format("seqstore").load(str(out))
    assert back.columns == ["key", "label", "feat", "mat"]
    assert [r["key"] for r in back.select("key").collect()] == [f"r{i}" for i in range(30)]
    # and a round trip gives the same rows
    again = tmp_path / "again"
    _write(back, again, idColumn="key")
    _check_rows(again, 30)


def test_read_missing_store_names_path(spark: Any, tmp_path: Path) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    with pytest.raises((Py4JJavaError, PySparkException)) as err:
        spark.read.format("seqstore").load(str(tmp_path / "nothing")).collect()
    assert str(tmp_path / "nothing") in str(err.value)


def test_read_then_write_keeps_fields(spark: Any, typed_store: Path, tmp_path: Path) -> None:
    """A store read into Spark and written back (no schema option) has the same fields and records:
    the Spark columns carry their seqstore fields (float16, bfloat16, shapes) in their metadata."""
    out = tmp_path / "copy"
    df = spark.read.format("seqstore").option("partitionRecords", "50").load(str(typed_store))
    _write(df.where("u8 % 2 = 0"), out, idColumn="id")
    src, dst = seqstore.open(typed_store), seqstore.open(out)
    assert dst.schema == src.schema
    keep = np.arange(0, len(src), 2)
    assert len(dst) == len(keep)
    for j, i in enumerate(keep):
        assert dst.id(j) == src.id(int(i))
        for name in src.schema:
            assert _to_py(dst[j][name]) == _to_py(src[int(i)][name]), (j, name)


# ------------------------------------------------------------------------------------ option errors


def test_unknown_options_are_refused_with_the_known_ones(spark: Any, tmp_path: Path) -> None:
    """A misspelled option (``id_column`` for ``idColumn``) is refused, on write and on read, with the
    list of the options the data source takes; nothing is written."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    df = _frame(spark, n=20, partitions=1)
    with pytest.raises((Py4JJavaError, PySparkException)) as err:
        _write(df, tmp_path / "w", id_column="key", schema=MAT_SCHEMA)
    msg = str(err.value)
    assert "unknown option(s) ['id_column']" in msg and "'id_column' -> 'idColumn'" in msg, msg
    assert "maxShardRecords" in msg and "errorIfExists" in msg and "storage.<key>" in msg, msg
    assert not (tmp_path / "w").exists()
    _write(df, tmp_path / "ok", idColumn="key", schema=MAT_SCHEMA)
    with pytest.raises((Py4JJavaError, PySparkException)) as err:
        spark.read.format("seqstore").option("field", "label").load(str(tmp_path / "ok")).collect()
    msg = str(err.value)
    assert "unknown option(s) ['field']" in msg and "'field' -> 'fields'" in msg and "partitionRecords" in msg, msg


def test_string_column_error_names_spark_options(spark: Any, tmp_path: Path) -> None:
    """A string column that is not the id column: the error names Spark's idColumn option and drop(),
    not the Python importers' columns= argument."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    df = spark.range(0, 10, 1, 1).selectExpr("cast(id as string) as name", "cast(id as int) as label")
    with pytest.raises((Py4JJavaError, PySparkException)) as err:
        _write(df, tmp_path / "s")
    msg = str(err.value)
    assert "column 'name'" in msg and '.option("idColumn", "name")' in msg and 'df.drop("name")' in msg, msg
    assert "schema option" in msg and "columns={" not in msg, msg
    assert not (tmp_path / "s").exists()


def test_failed_overwrite_with_another_schema_leaves_the_store_writable(spark: Any, tmp_path: Path) -> None:
    """An overwrite with a new schema that fails leaves the store as it was, its schema included: a later
    append of the store's own schema commits."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        old = tmp_path / "old"
        _write(_frame(spark, n=100), old, idColumn="key", schema=MAT_SCHEMA)
        df = _frame(spark)
        failing = df.mapInArrow(_fail_partition(1, attempts=99), df.schema)
        with pytest.raises((Py4JJavaError, PySparkException)):
            _write(failing, old, mode="overwrite", idColumn="key", schema=json.dumps({"mat": ["float32", [None, 2]]}))
        _check_rows(old, 100)
        _write(_frame(spark, n=100), old, idColumn="key", schema=MAT_SCHEMA)
        assert len(seqstore.open(old)) == 200 and _leftovers(old) == []
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def test_read_an_empty_store(spark: Any, tmp_path: Path) -> None:
    """A store without records has no shard, so no input partition: Spark then reads one partition of its
    own (``InputPartition(None)``), which failed the reader's assertion in every task."""
    path = tmp_path / "empty.seqstore"
    with seqstore.create(path, {"feat": seqstore.Field("float32", (None, 2)), "label": seqstore.Field("int32")}):
        pass
    df = spark.read.format("seqstore").load(str(path))
    assert df.columns == ["feat", "label"] and df.count() == 0 and df.collect() == []


def test_read_a_field_named_twice_names_it(spark: Any, typed_store: Path) -> None:
    """``fields=u8,u8`` failed in every read task with "KeyError: 'Column u8 does not exist in schema'"; it
    is refused when the DataFrame is defined, naming the field."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    with pytest.raises((Py4JJavaError, PySparkException)) as err:
        spark.read.format("seqstore").option("fields", "u8,tok,u8").load(str(typed_store)).collect()
    assert "['u8'] named twice" in str(err.value)


def test_helpers_take_a_relative_path_after_a_chdir(spark: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``seqstore.spark.write(df, "rel")`` handed the relative path to Spark, whose Python workers
    resolve it against their own directory (where Spark started), not the caller's after a chdir: the
    store went elsewhere and ``read(spark, "rel")`` did not find it. The helpers resolve it first."""
    import seqstore.spark

    monkeypatch.chdir(tmp_path)
    seqstore.spark.write(_frame(spark, n=12, partitions=2), "rel", id_column="key",
                         schema={"mat": Field("float16", (None, 2))})
    _check_rows(tmp_path / "rel", 12)
    assert seqstore.spark.read(spark, "rel").count() == 12


def test_a_file_url_is_its_path(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``seqstore.spark.write(df, "file:///abs/s")`` (a URL ``seqstore.open`` and ``create`` take) wrote the
    store under the working directory, in ``file:/abs/s``, and ``read`` looked for it there; the data
    source given ``.save("file:///abs/s")`` did not see a store at the path. Each takes the URL as its
    path; a chained URL (``simplecache::s3://...``) is refused naming it."""
    import seqstore.spark

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "s"
    seqstore.spark.write(_frame(spark, n=12, partitions=2), f"file://{out}", id_column="key",
                         schema={"mat": Field("float16", (None, 2))})
    _check_rows(out, 12)
    assert seqstore.spark.read(spark, f"file://{out}").count() == 12
    with pytest.raises(Exception, match="errorifexists"):  # the data source sees the store at the URL's path
        (_frame(spark, n=2, partitions=1).write.format("seqstore").mode("append").option("errorIfExists", "true")
         .save(f"file://{out}"))
    with pytest.raises(Exception, match=r"simplecache::s3://b/x: a chained URL"):
        seqstore.spark.write(_frame(spark, n=2, partitions=1), "simplecache::s3://b/x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
