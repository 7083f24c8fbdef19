"""Arrow IPC / Parquet import, incl. a Hugging Face ``datasets`` save_to_disk directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import seqstore
from seqstore.interop import SourceFormatError
from seqstore.interop.arrow import import_arrow, import_parquet

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402


def _data(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 7, n)
    return {
        "id": [f"rec-{seed}-{i}" for i in range(n)],
        "feats": [rng.standard_normal((int(t), 4)).astype("float32") for t in lens],
        "tokens": [rng.integers(0, 100, int(rng.integers(0, 5))).astype("int32") for _ in range(n)],
        "vec": rng.standard_normal((n, 3)).astype("float32"),
        "label": rng.integers(0, 10, n).astype("int64"),
        "flag": rng.integers(0, 2, n).astype(bool),
        "score": rng.standard_normal(n).astype("float16"),
    }


def _table(d: dict) -> pa.Table:
    n = len(d["id"])
    return pa.table({
        "id": pa.array(d["id"], pa.string()),
        "feats": pa.array([x.tolist() for x in d["feats"]], pa.list_(pa.list_(pa.float32()))),
        "tokens": pa.array([x.tolist() for x in d["tokens"]], pa.large_list(pa.int32())),
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(d["vec"].reshape(-1)), 3),
        "label": pa.array(d["label"]),
        "flag": pa.array(d["flag"]),
        "score": pa.array(d["score"]),
    }).slice(0, n)


def _check(store: seqstore.Store, d: dict, offset: int = 0) -> None:
    assert store.schema["feats"] == seqstore.Field("float32", (None, 4))
    assert store.schema["tokens"] == seqstore.Field("int32", (None,))
    assert store.schema["vec"] == seqstore.Field("float32", (3,))
    assert store.schema["label"] == seqstore.Field("int64")
    assert store.schema["flag"] == seqstore.Field("bool")
    assert store.schema["score"] == seqstore.Field("float16")
    for i in range(len(d["id"])):
        rec = store[offset + i]
        assert store.id(offset + i) == d["id"][i]
        np.testing.assert_array_equal(rec["feats"].reshape(-1, 4), d["feats"][i].reshape(-1, 4))
        for k in ("tokens", "vec", "label", "flag", "score"):
            np.testing.assert_array_equal(rec[k], d[k][i], err_msg=f"{i} {k}")


def test_interop_parquet_round_trip_several_files(tmp_path: Path) -> None:
    ds = [_data(150, seed=s) for s in range(2)]
    for s, d in enumerate(ds):
        pq.write_table(_table(d), tmp_path / f"part-{s}.parquet", row_group_size=40)
    calls: list[int] = []
    store = import_parquet(tmp_path, tmp_path / "p.seqstore", id_column="id", chunk_bytes=2000,
                           progress=calls.append)
    assert len(store) == 300 and len(calls) > 4
    _check(store, ds[0])
    _check(store, ds[1], offset=150)
    assert store.metadata["arrow"]["files"] == ["part-0.parquet", "part-1.parquet"]


@pytest.mark.parametrize("kind", ["file", "stream"])
def test_interop_arrow_ipc_round_trip(tmp_path: Path, kind: str) -> None:
    d = _data(120, seed=4)
    t = _table(d)
    path = tmp_path / "t.arrow"
    with pa.OSFile(str(path), "wb") as sink:
        writer = pa.ipc.new_file(sink, t.schema) if kind == "file" else pa.ipc.new_stream(sink, t.schema)
        with writer:
            for b in t.to_batches(max_chunksize=25):
                writer.write_batch(b)
    store = import_arrow(path, tmp_path / "a.seqstore", id_column="id", chunk_bytes=1500)
    _check(store, d)


def test_an_arrow_stream_cut_at_a_record_batch_is_an_error_not_fewer_records(tmp_path: Path) -> None:
    """An IPC stream file ends with an end-of-stream marker; one cut short at the end of a record batch
    (a copy or download that stopped) read as a whole, shorter stream, and its store silently lacked
    the rest."""
    t = pa.table({"x": pa.array(np.arange(30, dtype=np.int64))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as writer:
        for b in t.to_batches(max_chunksize=10):
            writer.write_batch(b)
    whole = sink.getvalue().to_pybytes()
    for name, data in (("eos.arrow", whole[:-8]), ("batch.arrow", whole[: whole.rfind(b"\xff\xff\xff\xff", 0, -8)])):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(SourceFormatError, match=rf"{name}.*end-of-stream marker"):
            import_arrow(tmp_path / name, tmp_path / "o.seqstore")
        assert not (tmp_path / "o.seqstore").exists()
    (tmp_path / "whole.arrow").write_bytes(whole)
    assert len(import_arrow(tmp_path / "whole.arrow", tmp_path / "o.seqstore")) == 30


def test_interop_column_map_and_int_ids(tmp_path: Path) -> None:
    d = _data(30)
    t = _table(d).append_column("num", pa.array(np.arange(30) * 7))
    pq.write_table(t, tmp_path / "t.parquet")
    store = import_parquet(tmp_path / "t.parquet", tmp_path / "m.seqstore", columns={"tokens": "text/tokens",
                           "label": "y"}, id_column="num")
    assert set(store.schema) == {"text/tokens", "y"}
    assert store.id(3) == "21" and store.index("14") == 2
    np.testing.assert_array_equal(store[5]["text/tokens"], d["tokens"][5])


def test_interop_hf_datasets_save_to_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    d = _data(200, seed=9)
    features = datasets.Features({
        "id": datasets.Value("string"),
        "feats": datasets.Sequence(datasets.Sequence(datasets.Value("float32"))),
        "tokens": datasets.Sequence(datasets.Value("int32")),
        "vec": datasets.Sequence(datasets.Value("float32"), length=3),
        "label": datasets.ClassLabel(num_classes=10),
        "flag": datasets.Value("bool"),
        "score": datasets.Value("float16"),
    })
    hf = datasets.Dataset.from_dict({k: (v.tolist() if isinstance(v, np.ndarray) else [x.tolist() for x in v]
                                         if k in ("feats", "tokens") else v) for k, v in d.items()}, features=features)
    hf.save_to_disk(str(tmp_path / "hf"), max_shard_size="20KB")
    assert len(list((tmp_path / "hf").glob("*.arrow"))) > 1  # several shards, read in state.json order
    store = import_arrow(tmp_path / "hf", tmp_path / "hf.seqstore", id_column="id")
    _check(store, d)
    # a DatasetDict directory names its splits
    datasets.DatasetDict({"train": hf}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(SourceFormatError, match="DatasetDict"):
        import_arrow(tmp_path / "dd", tmp_path / "dd.seqstore")
    import_arrow(tmp_path / "dd" / "train", tmp_path / "dd.seqstore", id_column="id")


@pytest.mark.parametrize(("name", "text", "words"), [
    ("state.json", "{not json", "not JSON"),
    ("state.json", "[1, 2]", "expected a JSON object"),
    ("state.json", '{"_data_files": "a.arrow"}', "_data_files should be a list of {\"filename\": NAME}"),
    ("state.json", '{"_data_files": ["a.arrow"]}', "_data_files should be a list of {\"filename\": NAME}"),
    ("state.json", '{"_data_files": [{"filename": "../x.arrow"}]}', "_data_files should be a list of"),
    ("state.json", '{"_data_files": [{"filename": "data-00000-of-00001.arrow"}, '
     '{"filename": "data-00000-of-00001.arrow"}]}', "_data_files lists 'data-00000-of-00001.arrow' twice"),
    ("dataset_dict.json", "{bad", "not JSON"),
    ("dataset_dict.json", '{"splits": 3}', "splits should be a list of names"),
])
def test_a_damaged_save_to_disk_json_is_a_named_error(tmp_path: Path, name: str, text: str, words: str) -> None:
    """A state.json or dataset_dict.json that is not JSON, or not of the layout datasets writes, was a bare
    JSONDecodeError, AttributeError or TypeError naming no file (and a file listed twice was imported twice)."""
    d = tmp_path / "hf"
    d.mkdir()
    table = pa.table({"x": [1, 2, 3]})
    with pa.OSFile(str(d / "data-00000-of-00001.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    (d / name).write_text(text)
    with pytest.raises(SourceFormatError) as err:
        import_arrow(d, tmp_path / "o.seqstore")
    assert str(d / name) in str(err.value) and words in str(err.value), str(err.value)
    assert not (tmp_path / "o.seqstore").exists()


def test_a_data_file_missing_from_a_save_to_disk_directory_names_state_json(tmp_path: Path) -> None:
    """A file listed in state.json's _data_files but missing from the directory was a bare OS error from
    deep in the reader ("[Errno 2] No such file or directory"); it names the file and state.json."""
    d = tmp_path / "hf"
    d.mkdir()
    table = pa.table({"x": [1, 2, 3]})
    with pa.OSFile(str(d / "a.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    (d / "state.json").write_text('{"_data_files": [{"filename": "a.arrow"}, {"filename": "b.arrow"}]}')
    with pytest.raises(FileNotFoundError, match=r"hf/b\.arrow: no such file, but .*hf/state\.json lists it"):
        import_arrow(d, tmp_path / "o.seqstore")
    assert not (tmp_path / "o.seqstore").exists()


def test_interop_arrow_errors(tmp_path: Path) -> None:
    d = _data(20)
    pq.write_table(_table(d), tmp_path / "t.parquet")
    with pytest.raises(seqstore.SchemaError, match=r"column 'id'.*string"):
        import_parquet(tmp_path / "t.parquet", tmp_path / "o.seqstore")  # a string column but no --id-column
    with pytest.raises(seqstore.SchemaError, match="no column 'nope'"):
        import_parquet(tmp_path / "t.parquet", tmp_path / "o.seqstore", columns={"nope": "x"})
    # nulls and ragged inner lists are found while streaming: the new store is removed
    t = pa.table({"x": pa.array([[1.0, 2.0], [3.0, 4.0], None] * 30, pa.list_(pa.float32()))})
    pq.write_table(t, tmp_path / "null.parquet")
    with pytest.raises(seqstore.SchemaError, match="null"):
        import_parquet(tmp_path / "null.parquet", tmp_path / "o.seqstore")
    assert not (tmp_path / "o.seqstore").exists()
    t = pa.table({"x": pa.array([[[1.0, 2.0]], [[3.0, 4.0], [5.0]]], pa.list_(pa.list_(pa.float32())))})
    pq.write_table(t, tmp_path / "inner.parquet")
    with pytest.raises(seqstore.SchemaError, match="inner lists have length 1 and 2"):
        import_parquet(tmp_path / "inner.parquet", tmp_path / "o.seqstore")
    assert not (tmp_path / "o.seqstore").exists()
    (tmp_path / "junk.arrow").write_bytes(b"junk" * 100)
    with pytest.raises(SourceFormatError, match="junk.arrow"):
        import_arrow(tmp_path / "junk.arrow", tmp_path / "o.seqstore")
    other = pa.table({"id": pa.array(["a"]), "label": pa.array([1.5])})
    pq.write_table(other, tmp_path / "z.parquet")
    with pytest.raises(seqstore.SchemaError, match="differs"):
        import_parquet([tmp_path / "t.parquet", tmp_path / "z.parquet"], tmp_path / "o.seqstore", id_column="id",
                       columns={"label": "label"})
    assert not (tmp_path / "o.seqstore").exists()


def test_a_column_name_twice_is_a_named_error(tmp_path: Path) -> None:
    """A file whose schema names a column twice (Arrow and Parquet allow it) failed with pyarrow's bare
    KeyError 'Column x does not exist in schema', naming neither file nor the repeat; it is a SchemaError
    naming both, also in a later file. Leaving the repeated column out imports the others."""
    twice = pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4]), pa.array([5, 6]), pa.array(["a", "b"])],
                                 names=["x", "x", "y", "id"])
    once = pa.table({"x": pa.array([7]), "y": pa.array([8]), "id": pa.array(["c"])})
    pq.write_table(twice, tmp_path / "b.parquet")
    pq.write_table(once, tmp_path / "a.parquet")
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    for sources, kw in (([b], {}), ([a, b], {"id_column": "id"}), ([b], {"id_column": "x"})):
        with pytest.raises(seqstore.SchemaError, match=r"b\.parquet: column 'x' is there 2 times"):
            import_parquet(sources, tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists()
    store = import_parquet(tmp_path / "b.parquet", tmp_path / "out", columns=["y"], id_column="id")
    assert int(store[1]["y"]) == 6 and store.id(1) == "b"


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "stream"])
def test_interop_more_files_than_open_file_limit(tmp_path: Path, fmt: str) -> None:
    """A directory of more files than the open-files limit (Hugging Face datasets ship thousands of
    Parquet shards; 1024 is a common soft limit): each file is opened only while it is read."""
    import os
    import resource

    d = tmp_path / "many"
    d.mkdir()
    n = 160
    for i in range(n):
        t = pa.table({"x": pa.array([i, i + 1], pa.int32())})
        if fmt == "parquet":
            pq.write_table(t, d / f"{i:04d}.parquet")
        else:
            with (pa.ipc.new_file if fmt == "arrow" else pa.ipc.new_stream)(str(d / f"{i:04d}.arrow"), t.schema) as w:
                w.write_table(t)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 96, hard))
    try:
        store = (import_parquet if fmt == "parquet" else import_arrow)(d, tmp_path / "s.seqstore")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(store) == 2 * n and int(store[2 * n - 1]["x"]) == n
