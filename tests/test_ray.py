"""seqstore.ray: Ray Data writes one store in parallel (exactly once, also with a killed and retried
write task; a failed job leaves nothing) and reads stores back (equal to the store; ordered reads
yield the epoch order). One local Ray instance (``num_cpus=2``) serves the whole test session."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'seqstore[ray]' (make test installs it)")
pytest.importorskip("ray.data", reason="Ray Data is not installed: pip install 'seqstore[ray]'")
pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (Ray Data needs it)")

import seqstore  # noqa: E402
import seqstore.ray as sray  # noqa: E402
from seqstore import Field  # noqa: E402
from seqstore.errors import SchemaError  # noqa: E402
from seqstore.store.parts import pending_jobs  # noqa: E402

N = 1200
BLOCKS = 6
DIM = 16


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """One local Ray for the session: 2 CPUs, no dashboard, a small object store. This module's
    functions travel to the workers by value (the workers cannot import the test module)."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 << 20, log_to_driver=False,
                 configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield
    if started:
        ray.shutdown()


# --------------------------------------------------------------------------------------- data


def _length(i: int) -> int:
    return 1 + (i * 7919) % 37


def _feat(i: int) -> np.ndarray:
    return ((np.arange(_length(i) * DIM) + i) % 251).astype(np.float16).reshape(_length(i), DIM)


def _labels(i: int) -> np.ndarray:
    return (np.arange(i % 5) + i).astype(np.int32)


def _rows(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """Rows of record numbers ``batch["id"]``: ragged (L, 16) float16 features (Ray variable-shaped
    tensors), ragged int32 labels (some empty), a fixed (3,) vector, a scalar and a string id."""
    ids = batch["id"].astype(np.int64)
    feat = np.empty(len(ids), dtype=object)
    labels = np.empty(len(ids), dtype=object)
    for k, i in enumerate(ids):
        feat[k] = _feat(int(i))
        labels[k] = _labels(int(i))
    return {
        "key": np.array([f"rec-{i}" for i in ids]),
        "feat": feat,
        "labels": labels,
        "vec": np.stack([ids, ids * 2, ids * 3], axis=1).astype(np.float32),
        "num": ids,
    }


def _dataset(n: int = N, blocks: int = BLOCKS, fn: Any = _rows, **kw: Any) -> Any:
    return ray.data.range(n, override_num_blocks=blocks).map_batches(fn, **kw)


def _check_exactly_once(path: Path | str, expected: range, order: bool = True, opts: Any = None,
                        cache: Path | None = None) -> None:
    """Every number in ``expected`` is in the store exactly once, with its id and values (``opts``,
    ``cache``: a store at a URL, its storage_options and node cache)."""
    st = seqstore.open(path, storage_options=opts, cache_dir=cache) if opts else seqstore.open(path)
    assert len(st) == len(expected)
    nums = st.get_batch(np.arange(len(st)), fields=["num"])["num"]
    if order:
        assert nums.tolist() == list(expected)
    assert sorted(nums.tolist()) == list(expected)
    for r in range(len(st)):
        i = int(nums[r])
        rec = st[r]
        assert st.id(r) == f"rec-{i}"
        np.testing.assert_array_equal(rec["feat"], _feat(i))
        np.testing.assert_array_equal(rec["labels"], _labels(i))
        np.testing.assert_array_equal(rec["vec"], np.array([i, 2 * i, 3 * i], np.float32))
    assert pending_jobs(path, storage_options=opts) == []  # no part of the job is left in the store


# ------------------------------------------------------------------------------------- writing


def test_import_seqstore_does_not_import_ray() -> None:
    code = "import sys, seqstore, seqstore.engines; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_write_every_row_once_in_dataset_order(ray_local: None, tmp_path: Path) -> None:
    path = tmp_path / "s.seqstore"
    ds = _dataset()
    assert not ds.context.execution_options.preserve_order
    n = sray.write(ds, path, id_column="key", max_shard_records=64)
    assert n == N
    assert not ds.context.execution_options.preserve_order  # set for the write only
    st = seqstore.open(path)
    assert dict(st.schema.items()) == {
        "feat": Field("float16", (None, DIM)), "labels": Field("int32", (None,)),
        "vec": Field("float32", (3,)), "num": Field("int64"),
    }
    assert st.num_shards > BLOCKS  # several shards per task (max_shard_records), all committed at once
    _check_exactly_once(path, range(N))
    assert st.index("rec-777") == 777


def _die_once(batch: dict[str, np.ndarray], marker: str, at: int) -> dict[str, Any]:
    """``_rows``; but the first attempt of the task whose batch starts at record ``at`` exits hard
    (``os._exit``) after checking that the write task already wrote shard files of its part."""
    if int(batch["id"][0]) == at:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # the retried attempt
            return _rows(batch)
        store = Path(marker).parent / "s.seqstore"
        written = sorted(p.name for p in store.glob("_parts/*/*/p*"))
        os.write(fd, ",".join(written).encode())
        os.close(fd)
        os._exit(3)
    return _rows(batch)


def test_write_task_killed_mid_write_is_retried_exactly_once(ray_local: None, tmp_path: Path) -> None:
    marker = tmp_path / "killed"
    # blocks of 200 records, batches of 50: the task of records 200..399 writes three batches (shards
    # of at most 40 records are finished on disk), then dies on its fourth; Ray runs it again
    current = ray.data.DataContext.get_current()
    saved = current.target_max_block_size
    current.target_max_block_size = 4096  # each batch of the map reaches the write as a block of its own
    try:
        ds = _dataset(fn=_die_once, batch_size=50, fn_kwargs={"marker": str(marker), "at": 350})
        n = sray.write(ds, tmp_path / "s.seqstore", id_column="key", max_shard_records=40)  # Ray retries it
    finally:
        current.target_max_block_size = saved
    assert n == N
    assert marker.read_text()  # the killed attempt had finished shards of its own part on disk
    _check_exactly_once(tmp_path / "s.seqstore", range(N))


def _fail_at(batch: dict[str, np.ndarray], at: int) -> dict[str, Any]:
    if int(batch["id"][0]) == at:
        raise ValueError(f"injected failure at record {at}")
    return _rows(batch)


def test_failed_job_leaves_nothing(ray_local: None, tmp_path: Path) -> None:
    path = tmp_path / "s.seqstore"
    sray.write(_dataset(400, 2), path, id_column="key")
    ds = _dataset(fn=_fail_at, batch_size=50, fn_kwargs={"at": 850}).map_batches(
        lambda b: {**b, "num": b["num"] + 400})
    with pytest.raises(Exception, match="injected failure at record 850"):
        sray.write(ds, path, id_column="key", mode="append", max_shard_records=40)
    _check_exactly_once(path, range(400))  # the store as before, no part left
    # a job that creates the store and fails leaves no store behind
    fresh = tmp_path / "fresh.seqstore"
    with pytest.raises(Exception, match="injected failure"):
        sray.write(_dataset(fn=_fail_at, fn_kwargs={"at": 0}), fresh, id_column="key")
    assert not fresh.exists()


def test_write_to_s3(ray_local: None, moto_s3: Any, s3_bucket: str, tmp_path: Path) -> None:
    """Write tasks upload their parts into an s3:// store (moto), one commit; a failed append job
    leaves the store as it was and no staging object; a failed job that creates a store leaves none."""
    url = f"s3://{s3_bucket}/ray.seqstore"
    opts = moto_s3.storage_options()
    assert sray.write(_dataset(300, 3), url, id_column="key", max_shard_records=64, storage_options=opts) == 300
    _check_exactly_once(url, range(300), opts=opts, cache=tmp_path / "c")
    # read back from the URL by Ray's read tasks, in record order
    rows = sray.read(url, fields=["num"], id_column="rid", storage_options=opts).take_all()
    assert [int(r["num"]) for r in rows] == list(range(300)) and rows[7]["rid"] == "rec-7"
    ds = _dataset(300, 3, fn=_fail_at, batch_size=50, fn_kwargs={"at": 150})
    with pytest.raises(Exception, match="injected failure at record 150"):
        sray.write(ds, url, id_column="key", mode="append", max_shard_records=40, storage_options=opts)
    _check_exactly_once(url, range(300), opts=opts, cache=tmp_path / "c2")
    assert not [k for k in moto_s3.keys(s3_bucket, "ray.seqstore/_parts/") if "/_parts/.ended/" not in k]
    with pytest.raises(Exception, match="injected failure"):
        sray.write(_dataset(fn=_fail_at, fn_kwargs={"at": 0}), f"s3://{s3_bucket}/fresh.seqstore", id_column="key",
                   storage_options=opts)
    assert moto_s3.keys(s3_bucket, "fresh.seqstore/") == {}


def test_append_and_overwrite(ray_local: None, tmp_path: Path) -> None:
    path = tmp_path / "s.seqstore"
    sray.write(_dataset(300, 2), path, id_column="key")
    with pytest.raises(FileExistsError):
        sray.write(_dataset(10, 1), path, id_column="key")
    later = _dataset(300, 2).map_batches(lambda b: _rows({"id": b["num"] + 300}))
    assert sray.write(later, path, id_column="key", mode="append") == 300
    _check_exactly_once(path, range(600))
    again = _dataset(200, 2).map_batches(lambda b: _rows({"id": b["num"] + 1000}))
    assert sray.write(again, path, id_column="key", mode="overwrite") == 200
    _check_exactly_once(path, range(1000, 1200))


def test_given_schema_and_conversions(ray_local: None, tmp_path: Path) -> None:
    """A given schema: float32 values into a bfloat16 field, Python lists of equal length into a
    fixed field; a store written with a schema from an empty Dataset has no records."""
    items = [{"x": [float(i), i + 0.5], "t": list(range(i % 4))} for i in range(40)]
    path = tmp_path / "s.seqstore"
    schema = {"x": Field("bfloat16", (2,)), "t": Field("int16", (None,))}
    assert sray.write(ray.data.from_items(items), path, schema=schema) == 40
    st = seqstore.open(path, bfloat16="float32")
    np.testing.assert_array_equal(st[7]["x"], [7.0, 7.5])
    np.testing.assert_array_equal(st[7]["t"], [0, 1, 2])
    assert st[8]["t"].shape == (0,)
    empty = ray.data.from_items(items).filter(lambda r: False)
    assert sray.write(empty, tmp_path / "e.seqstore", schema=schema) == 0
    assert len(seqstore.open(tmp_path / "e.seqstore")) == 0


def test_wrong_column_type_names_the_column(ray_local: None, tmp_path: Path) -> None:
    ds = ray.data.from_items([{"name": f"n{i}", "x": i} for i in range(10)])
    with pytest.raises(SchemaError, match="column 'name'"):
        sray.write(ds, tmp_path / "s.seqstore")
    with pytest.raises(SchemaError, match="is empty"):
        sray.write(ds.filter(lambda r: False), tmp_path / "s.seqstore", id_column="name")
    assert not (tmp_path / "s.seqstore").exists()


# ------------------------------------------------------------------------------- schema inference


def test_infer_schema_from_arrow_and_ray_types() -> None:
    from ray.data.extensions import ArrowTensorArray, ArrowVariableShapedTensorArray

    var = np.empty(3, dtype=object)
    for k in range(3):
        var[k] = np.full((k + 1, 4, 2), k, dtype=np.float32)
    table = pa.table({
        "lst": pa.array([[1, 2], [], [3]], type=pa.list_(pa.int32())),
        "large": pa.array([[1.0], [2.0, 3.0], []], type=pa.large_list(pa.float64())),
        "fsl": pa.array([[1, 2, 3]] * 3, type=pa.list_(pa.uint8(), 3)),
        "lol": pa.array([[[1, 2]], [[3, 4], [5, 6]], []], type=pa.list_(pa.list_(pa.int64()))),
        "tensor": ArrowTensorArray.from_numpy(np.zeros((3, 2, 5), np.int16)),
        "vtensor": ArrowVariableShapedTensorArray.from_numpy(var),
        "bits": pa.array(np.array([1, 2, 3], np.uint16)),
        "id": pa.array(["a", "b", "c"]),
    })
    table = table.replace_schema_metadata(None)
    schema = table.schema.set(table.schema.get_field_index("bits"),
                              table.schema.field("bits").with_metadata(sray.BFLOAT16_METADATA))
    table = table.cast(schema)
    sch = sray.infer_schema(table.schema, table, id_column="id")
    assert dict(sch.items()) == {
        "lst": Field("int32", (None,)), "large": Field("float64", (None,)), "fsl": Field("uint8", (3,)),
        "lol": Field("int64", (None, 2)), "tensor": Field("int16", (2, 5)),
        "vtensor": Field("float32", (None, 4, 2)), "bits": Field("bfloat16"),
    }
    cols, ids = sray.block_columns(table, sch, "id")
    assert ids == ["a", "b", "c"]
    values, lengths = cols["vtensor"]
    assert values.shape == (6, 4, 2) and lengths.tolist() == [1, 2, 3]
    np.testing.assert_array_equal(values[3:], 2)
    assert cols["lol"][0].tolist() == [[1, 2], [3, 4], [5, 6]] and cols["lol"][1].tolist() == [1, 2, 0]
    assert cols["tensor"].shape == (3, 2, 5)
    # equal-length rows given as a fixed-shape tensor fit a ragged field
    fixed_rows = pa.table({"vtensor": ArrowTensorArray.from_numpy(np.ones((2, 3, 4, 2), np.float32))})
    values, lengths = sray.block_columns(fixed_rows, seqstore.Schema({"vtensor": sch["vtensor"]}), None)[0]["vtensor"]
    assert values.shape == (6, 4, 2) and lengths.tolist() == [3, 3]
    # a variable-shaped tensor whose rows differ beyond the first dim is no ragged field
    bad = np.empty(2, dtype=object)
    bad[0], bad[1] = np.zeros((1, 2)), np.zeros((1, 3))
    t = pa.table({"v": ArrowVariableShapedTensorArray.from_numpy(bad)})
    with pytest.raises(SchemaError, match=r"column 'v'.*first dim only"):
        sray.infer_schema(t.schema, t)
    with pytest.raises(SchemaError, match="column 'id'"):
        sray.infer_schema(table.schema, table)  # a string column that is not the id column


# ------------------------------------------------------------------------------------- reading


@pytest.fixture(scope="module")
def written(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store written by Ray once per module; the tests only read it."""
    path = tmp_path_factory.mktemp("ray-written") / "s.seqstore"
    sray.write(_dataset(600, 3), path, id_column="key", max_shard_records=128)
    return path


def _equal_to_store(st: Any, rows: list[dict[str, Any]], indices: np.ndarray) -> None:
    assert len(rows) == len(indices)
    for row, i in zip(rows, indices):
        rec = st[int(i)]
        assert row["id"] == st.id(int(i))
        for name in ("feat", "labels", "vec", "num"):
            np.testing.assert_array_equal(np.asarray(row[name]), rec[name])


def test_read_equals_store(written: Path) -> None:
    st = seqstore.open(written)
    ds = sray.read(written, id_column="id", block_records=50)
    assert ds.count() == len(st)
    _equal_to_store(st, list(ds.iter_rows()), np.arange(len(st)))
    part = sray.read(written, fields=["num"], block_records=64).take_batch(1000, batch_format="numpy")
    assert list(part) == ["num"] and part["num"].tolist() == list(range(600))


def test_ordered_read_yields_the_epoch_order(written: Path) -> None:
    st = seqstore.open(written)
    for ordering, epoch, kw in (("random", 2, {}), ("laplace:.50", 3, {"length_field": "feat"}),
                                ("random", 3, {"partition_epoch": 2})):
        ds = sray.read(written, ordering=ordering, epoch=epoch, seed=11, id_column="id", block_records=37,
                       override_num_blocks=4, **kw)
        expected = seqstore.StoreDataset(st, ordering=ordering, seed=11, length_field="feat",
                                         partition_epoch=kw.get("partition_epoch", 1)).epoch_order(epoch).to_numpy()
        rows = list(ds.iter_rows())
        assert [r["num"] for r in rows] == expected.tolist(), ordering
        _equal_to_store(st, rows[:50], expected[:50])
    assert len(expected) == 300  # the partition epoch's half


def test_read_then_write_keeps_bfloat16(ray_local: None, tmp_path: Path) -> None:
    src = tmp_path / "src.seqstore"
    with seqstore.create(src, {"h": Field("bfloat16", (None, 2)), "s": Field("bfloat16")}) as w:
        w.append_batch({"h": [np.full((k % 3, 2), k / 4, np.float32) for k in range(30)],
                        "s": np.arange(30, dtype=np.float32)})
    out = tmp_path / "out.seqstore"
    assert sray.write(sray.read(src).map_batches(lambda b: b, batch_format="pyarrow"), out) == 30
    a, b = seqstore.open(src), seqstore.open(out)
    assert b.schema == a.schema
    for i in range(30):
        np.testing.assert_array_equal(a[i]["h"], b[i]["h"])
        np.testing.assert_array_equal(a[i]["s"], b[i]["s"])
    f32 = sray.read(src, bfloat16="float32").take_batch(30, batch_format="numpy")
    np.testing.assert_array_equal(f32["s"], np.arange(30, dtype=np.float32))


# ------------------------------------------------------------------------- errors before Ray runs

REPO = Path(__file__).resolve().parents[1]


def test_create_onto_an_existing_store_prints_only_the_seqstore_error(tmp_path: Path) -> None:
    """``write(ds, existing, mode="create")`` in a script: the FileExistsError is raised on the driver
    before Ray runs anything, so it is the first and only error the script prints (no Ray internal
    error report, no second traceback)."""
    path = tmp_path / "s.seqstore"
    with seqstore.create(path, {"x": Field("int64")}) as w:
        w.append({"x": np.int64(1)})
    script = tmp_path / "ray_create.py"
    script.write_text(
        "import sys\n"
        "import ray\n"
        "import seqstore.ray\n"
        "ray.init(num_cpus=1, include_dashboard=False, object_store_memory=128 << 20)\n"
        "ds = ray.data.range(20).map(lambda r: {'x': r['id']})\n"
        "seqstore.ray.write(ds, sys.argv[1])\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    res = subprocess.run([sys.executable, str(script), str(path)], env=env, capture_output=True, text=True,
                         timeout=240)
    err = res.stderr
    assert res.returncode == 1, err
    assert err.count("Traceback (most recent call last)") == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("FileExistsError: ") and str(path) in last and "mode='append'" in last, err
    assert "Ray Data or Ray Core internal" not in err and "Exception occurred" not in err, err
    assert "Error" not in err.split("Traceback (most recent call last)")[0], err  # nothing before it
    assert len(seqstore.open(path)) == 1


def test_append_with_another_schema_fails_on_the_driver(ray_local: None, tmp_path: Path,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.seqstore"
    sray.write(_dataset(100, 2), path, id_column="key")
    capfd.readouterr()
    other = ray.data.from_items([{"key": f"k{i}", "y": float(i)} for i in range(10)])
    with pytest.raises(SchemaError) as exc:
        sray.write(other, path, id_column="key", mode="append")
    assert str(path) in str(exc.value) and "existing store has schema" in str(exc.value)
    err = capfd.readouterr().err
    assert "Ray Data or Ray Core internal" not in err and "Traceback" not in err, err
    _check_exactly_once(path, range(100))


def _fail_on_row(row: dict[str, Any]) -> dict[str, Any]:
    if int(row["x"]) == 7:
        raise ValueError("injected failure at row 7")
    return row


def test_failed_overwrite_with_another_schema_leaves_the_store_writable(ray_local: None, tmp_path: Path) -> None:
    """An overwrite job with a new schema that fails leaves the store as it was, its schema included:
    a later append of the store's own schema works and so does a plain writer."""
    path = tmp_path / "s.seqstore"
    assert sray.write(ray.data.from_items([{"x": i} for i in range(5)]), path) == 5
    failing = ray.data.from_items([{"x": i} for i in range(10)]).map(_fail_on_row)
    with pytest.raises(Exception, match="injected failure at row 7"):
        sray.write(failing, path, schema={"x": Field("float32")}, mode="overwrite")
    assert seqstore.open(path).schema["x"].dtype == "<i8"
    assert sray.write(ray.data.from_items([{"x": i} for i in range(5, 8)]), path, mode="append") == 3
    st = seqstore.open(path)
    assert st.get_batch(np.arange(len(st)), fields=["x"])["x"].tolist() == list(range(8))
    # an append or overwrite job that created the store and failed leaves none behind, as a create does
    for mode in ("append", "overwrite"):
        with pytest.raises(Exception, match="injected failure at row 7"):
            sray.write(failing, tmp_path / f"{mode}.seqstore", schema={"x": Field("int64")}, mode=mode)
        assert not (tmp_path / f"{mode}.seqstore").exists()


def test_a_dataset_without_blocks_creates_and_overwrites(ray_local: None, tmp_path: Path) -> None:
    """``ray.data.range(0)`` starts no write task, so no part reaches the commit: the commit of nothing
    failed with a FileNotFoundError (the store's _parts directory had never been made), for a new store
    and for an overwrite, which must leave the store empty."""
    schema = {"id": Field("int64")}
    path = tmp_path / "s.seqstore"
    assert sray.write(ray.data.range(0), path, schema=schema) == 0
    assert len(seqstore.open(path)) == 0
    assert sray.write(ray.data.range(5), path, schema=schema, mode="append") == 5
    assert sray.write(ray.data.range(0), path, schema=schema, mode="append") == 0
    assert len(seqstore.open(path)) == 5
    assert sray.write(ray.data.range(0), path, schema=schema, mode="overwrite") == 0
    assert len(seqstore.open(path)) == 0 and pending_jobs(path) == []


def _extra_from_400(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    i = batch["id"]
    return {"a": i} if i[0] < 400 else {"a": i, "extra": i * 10}


def test_a_column_that_appears_after_the_first_rows_is_an_error(ray_local: None, tmp_path: Path) -> None:
    """Fields are inferred from the first 256 rows, every column becoming a field; a column that only
    blocks after those have was dropped without a word (600 records written, 'extra' lost). It fails
    the job naming the column (nothing written); with schema= the columns not named are left out."""
    ds = ray.data.range(600, override_num_blocks=3).map_batches(_extra_from_400)
    path = tmp_path / "s.seqstore"
    with pytest.raises(Exception, match="extra") as info:
        sray.write(ds, path)
    assert "schema=" in str(info.value)
    assert not path.exists()
    assert sray.write(ds, path, schema={"a": Field("int64")}) == 600


def test_read_a_field_named_twice_fails_on_the_driver(tmp_path: Path) -> None:
    """``read(path, fields=["a", "a"])`` returned a Dataset whose every read task then failed with
    pyarrow's 'Field "a" exists 2 times in schema'; it is a ValueError at once, naming the field."""
    path = tmp_path / "s.seqstore"
    with seqstore.create(path, {"a": Field("int32"), "b": Field("int32")}) as w:
        w.append({"a": 1, "b": 2})
    with pytest.raises(ValueError, match=r"\['a'\] named twice"):
        sray.read(path, fields=["a", "b", "a"])


def test_read_of_no_column_is_refused(ray_local: None, tmp_path: Path) -> None:
    """``read(path, fields=[])`` (no id column) has no column, and a Ray Dataset has no rows without one:
    ``count()`` (from the tasks' metadata) said 5 while the rows read were 0. It is refused, naming the
    store; the ids alone read one row per record."""
    path = tmp_path / "s.seqstore"
    with seqstore.create(path, {"a": Field("int32")}) as w:
        w.append_batch({"a": np.arange(5, dtype=np.int32)}, ids=[f"r{i}" for i in range(5)])
    with pytest.raises(ValueError, match=r"s\.seqstore: nothing to read"):
        sray.read(path, fields=[])
    assert len(sray.read(path, fields=[], id_column="id").take_all()) == 5


def test_read_of_a_complex_field_is_refused_naming_it(tmp_path: Path) -> None:
    """Arrow has no complex numbers: a complex field is a ValueError on the driver naming it (every read
    task failed with pyarrow's "Unsupported numpy type 14", naming neither field nor store)."""
    path = tmp_path / "s.seqstore"
    with seqstore.create(path, {"z": Field("complex64"), "y": Field("int32")}) as w:
        w.append_batch({"z": np.arange(3).astype(np.complex64), "y": np.arange(3, dtype=np.int32)})
    with pytest.raises(ValueError, match=r"s\.seqstore: field 'z' is complex64"):
        sray.read(path)


@pytest.mark.parametrize(("sizes", "message"), [
    ({"shard_bytes": 0}, "shard_bytes must be positive, got 0"),
    ({"max_shard_records": -3}, "max_shard_records must be positive, got -3"),
])
def test_a_size_that_is_not_positive_is_named_with_its_value(tmp_path: Path, sizes: dict[str, int],
                                                             message: str) -> None:
    """write() checked its sizes on its own, with a message that named neither the size at fault nor its
    value; it now uses the writer's check (as create() does), before Ray runs anything."""
    with pytest.raises(ValueError, match=message):
        sray.write(None, tmp_path / "s.seqstore", **sizes)
    assert not (tmp_path / "s.seqstore").exists()


@pytest.mark.parametrize("when", ["before", "after"])
def test_ctrl_c_in_the_commit_leaves_no_part(ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             when: str) -> None:
    """A KeyboardInterrupt in ``on_write_complete`` (Ctrl-C on the driver while it commits) is no
    Exception, so Ray does not call ``on_write_failed``, and ``write`` skipped its own clean-up because the
    sink already counted as ended: the job's parts stayed under ``_parts/`` (and a store the job created,
    empty). Before the commit the job leaves nothing; after it the records stay, without the parts."""
    import seqstore.engines.ray as engine

    real = engine.commit_parts

    def interrupted(*args: Any, **kwargs: Any) -> int:
        if when == "after":
            real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "commit_parts", interrupted)
    path = tmp_path / "s.seqstore"
    with pytest.raises(KeyboardInterrupt):
        sray.write(ray.data.from_items([{"x": i} for i in range(5)]), path)
    if when == "before":
        assert not path.exists()
    else:
        assert seqstore.open(path).get_batch(np.arange(5), fields=["x"])["x"].tolist() == list(range(5))
        assert pending_jobs(path) == []


@pytest.mark.parametrize("block_records", [2.5, "8", True, 0])
def test_read_block_records_that_is_no_positive_int_fails_on_the_driver(tmp_path: Path, block_records: Any) -> None:
    """``read(path, block_records=2.5)`` returned a Dataset whose read tasks then failed inside Ray with
    "'float' object cannot be interpreted as an integer" ("8": a str/int comparison at once, True: one
    record per block); each is refused on the driver, naming the option and the store."""
    path = tmp_path / "s.seqstore"
    with seqstore.create(path, {"a": Field("int32")}) as w:
        w.append({"a": 1})
    with pytest.raises((TypeError, ValueError), match=rf"s\.seqstore: block_records must be a positive int, got "
                                                      rf"{block_records!r}"):
        sray.read(path, block_records=block_records)


def test_write_to_a_relative_path_after_a_chdir(ray_local: None, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``write(ds, "rel.seqstore")`` prepared the store relative to the driver's directory, but the write
    tasks resolved the same relative path against their own (the directory Ray started in), so the job
    failed with "no such store" once the driver had changed directory. The path is the driver's."""
    monkeypatch.chdir(tmp_path)
    assert sray.write(ray.data.from_items([{"x": i} for i in range(6)]), "rel.seqstore") == 6
    st = seqstore.open(tmp_path / "rel.seqstore")
    assert st.get_batch(np.arange(6), fields=["x"])["x"].tolist() == list(range(6))
    assert pending_jobs(tmp_path / "rel.seqstore") == []


def test_write_to_a_file_url(ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``write(ds, "file:///abs/s.seqstore")`` (a URL ``seqstore.open`` and ``create`` take) wrote the store
    under the working directory, in ``file:/abs/s.seqstore``. It writes the path the URL names; a chained
    URL (``simplecache::s3://...``, no local path either) is refused before Ray runs anything."""
    from seqstore.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "s.seqstore"
    assert sray.write(ray.data.from_items([{"x": i} for i in range(4)]), f"file://{out}") == 4
    assert seqstore.open(out).get_batch(np.arange(4), fields=["x"])["x"].tolist() == list(range(4))
    with pytest.raises(ConfigError, match="simplecache::s3://b/x: a chained URL"):
        sray.write(ray.data.from_items([{"x": 1}]), "simplecache::s3://b/x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.seqstore"]
