"""Hugging Face ``datasets`` import (seqstore.interop.hf) against the real ``datasets`` package: every
record of every import is compared, field by field, with what ``datasets`` itself reads."""

from __future__ import annotations

import io
import re
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore
from seqstore.cli import main as cli_main
from seqstore.errors import ColumnTypeError, SchemaError
from seqstore.interop.hf import SplitError, import_hf

datasets = pytest.importorskip("datasets")
Audio, ClassLabel, Features, List, Value = (datasets.Audio, datasets.ClassLabel, datasets.Features,
                                            datasets.List, datasets.Value)


def _rows(n: int, seed: int = 0) -> dict[str, list[Any]]:
    """``n`` records of every supported kind of column (strings with non-ASCII text, empty lists)."""
    rng = np.random.default_rng(seed)
    return {
        "id": [f"utt-{i:04d}" for i in range(n)],
        "num": [int(x) for x in rng.integers(-1000, 1000, n)],
        "score": [float(x) for x in rng.standard_normal(n).astype(np.float32)],
        "ok": [bool(x) for x in rng.integers(0, 2, n)],
        "label": [int(x) for x in rng.integers(0, 3, n)],
        "text": [("héllo " * int(k))[: int(k) * 3] for k in rng.integers(0, 6, n)],
        "tokens": [[int(t) for t in rng.integers(0, 50_000, int(k))] for k in rng.integers(0, 12, n)],
        "frames": [rng.standard_normal((int(k), 3)).astype(np.float32).tolist() for k in rng.integers(0, 5, n)],
    }


FEATURES = Features({
    "id": Value("string"),
    "num": Value("int32"),
    "score": Value("float32"),
    "ok": Value("bool"),
    "label": ClassLabel(names=["a", "b", "c"]),
    "text": Value("string"),
    "tokens": List(Value("uint16")),
    "frames": List(List(Value("float32"))),
})


def _dataset(n: int = 40, seed: int = 0) -> Any:
    return datasets.Dataset.from_dict(_rows(n, seed), features=FEATURES)


def _same(stored: Any, expected: Any, feature: Any, where: str) -> None:
    """One field of a record equals what ``datasets`` returned for that column (exactly)."""
    if isinstance(feature, Value) and feature.dtype in ("string", "large_string"):
        assert stored.dtype == np.uint8, where
        assert bytes(stored).decode("utf-8") == expected, where
    elif isinstance(feature, Audio):
        assert bytes(stored) == expected["bytes"], where
    else:
        want = np.asarray(expected, dtype=stored.dtype)
        assert stored.shape == want.reshape(stored.shape).shape, where
        np.testing.assert_array_equal(stored, want.reshape(stored.shape), err_msg=where)


def _check(store: Any, records: Iterator[dict[str, Any]] | Any, features: Any, *, ids: str | None = "id",
           columns: dict[str, str] | None = None) -> int:
    """Every record of ``store`` against the records ``datasets`` reads, in order; returns their number."""
    n = 0
    for i, rec in enumerate(records):
        got = store[i]
        mapping = columns or {c: c for c in features if c != ids}
        assert set(got) == set(mapping.values())
        for col, field in mapping.items():
            _same(got[field], rec[col], features[col], f"record {i}, column {col}")
        if ids is not None:
            assert store.id(i) == str(rec[ids])
        n += 1
    assert n == len(store)
    return n


def test_dataset_roundtrip_every_kind_of_column(tmp_path: Path) -> None:
    ds = _dataset(50)
    store = import_hf(ds, tmp_path / "out.seqstore", id_column="id", batch_size=7)  # batches cut mid-way
    s = store.schema
    dt = {k: np.dtype(f.dtype) for k, f in s.items()}
    assert dt["num"] == np.int32 and s["num"].shape == ()
    assert dt["score"] == np.float32 and dt["ok"] == np.bool_ and dt["label"] == np.int64
    assert dt["text"] == np.uint8 and s["text"].ragged
    assert dt["tokens"] == np.uint16 and s["tokens"].shape == (None,)
    assert s["frames"].shape == (None, 3)
    assert _check(store, (ds[i] for i in range(len(ds))), ds.features) == 50
    assert store.index("utt-0042") == 42
    assert store.manifest.metadata["hf"]["id_column"] == "id"


def test_shuffled_dataset_keeps_its_order_and_columns_rename(tmp_path: Path) -> None:
    ds = _dataset(30).shuffle(seed=3)  # an indices mapping over the table
    cols = {"tokens": "toks", "text": "transcript"}
    store = import_hf(ds, tmp_path / "out.seqstore", columns=cols, id_column="id")
    assert set(store.schema) == {"toks", "transcript"}
    _check(store, (ds[i] for i in range(len(ds))), ds.features, columns=cols)


def test_datasetdict_split_and_missing_split(tmp_path: Path) -> None:
    dd = datasets.DatasetDict({"train": _dataset(20, seed=1), "test": _dataset(9, seed=2)})
    store = import_hf(dd, tmp_path / "test.seqstore", split="test", id_column="id")
    _check(store, (dd["test"][i] for i in range(9)), dd["test"].features)
    assert store.manifest.metadata["hf"]["split"] == "test"
    with pytest.raises(SplitError, match=r"splits \['train', 'test'\]") as err:
        import_hf(dd, tmp_path / "none.seqstore")
    assert err.value.splits == ["train", "test"]
    with pytest.raises(SplitError, match="no split 'dev'"):
        import_hf(dd, tmp_path / "none.seqstore", split="dev")
    assert not (tmp_path / "none.seqstore").exists()


def test_saved_directory_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dd = datasets.DatasetDict({"train": _dataset(25, seed=4), "validation": _dataset(6, seed=5)})
    saved = tmp_path / "saved"
    dd.save_to_disk(str(saved))
    out = tmp_path / "train.seqstore"
    assert cli_main(["convert", "--from", "hf", str(saved), str(out), "--split", "train", "--id-column", "id",
                     "--batch-size", "4"]) == 0
    captured = capsys.readouterr()
    assert "25 records" in captured.out and "convert hf" in captured.err  # the bar, on stderr
    loaded = datasets.load_from_disk(str(saved))["train"]
    _check(seqstore.open(out), (loaded[i] for i in range(len(loaded))), loaded.features)

    # a DatasetDict directory without --split: exit 2, the splits listed, in the command line's words
    assert cli_main(["convert", "--from", "hf", str(saved), str(tmp_path / "x.seqstore"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "['train', 'validation']" in err and "--split NAME" in err
    assert not (tmp_path / "x.seqstore").exists()

    # one split's directory on its own, --map choosing columns; a missing directory is exit 2
    assert cli_main(["convert", "--from", "hf", str(saved / "validation"), str(tmp_path / "v.seqstore"), "-q",
                     "--map", "num=n", "--map", "text=text"]) == 0
    v = seqstore.open(tmp_path / "v.seqstore")
    assert set(v.schema) == {"n", "text"} and len(v) == 6 and not v.has_ids
    assert cli_main(["convert", "--from", "hf", str(tmp_path / "nope"), str(tmp_path / "y.seqstore"), "-q"]) == 2


@pytest.mark.parametrize(("name", "data"), [
    ("state.json", b"{bad"), ("state.json", b"[]"), ("dataset_info.json", b"{bad"),
    ("data-00000-of-00001.arrow", b"junk" * 10),
])
def test_a_damaged_saved_directory_is_a_named_error(tmp_path: Path, name: str, data: bytes) -> None:
    """datasets' own failure to load a damaged save_to_disk directory (a bare JSONDecodeError, TypeError or
    ArrowInvalid naming no file) is a SourceFormatError naming the directory."""
    from seqstore.interop import SourceFormatError

    datasets.Dataset.from_dict({"x": [1, 2, 3]}).save_to_disk(str(tmp_path / "hf"))
    (tmp_path / "hf" / name).write_bytes(data)
    where = re.escape(str(tmp_path / "hf"))
    with pytest.raises(SourceFormatError, match=rf"{where}: not a readable datasets save_to_disk") as err:
        import_hf(tmp_path / "hf", tmp_path / "o")
    assert type(err.value.__cause__).__name__ in str(err.value)
    assert not (tmp_path / "o").exists()


def test_iterable_dataset_streamed_in_batches(tmp_path: Path) -> None:
    rows = _rows(45, seed=6)
    produced: list[int] = []

    def gen() -> Iterator[dict[str, Any]]:
        for i in range(45):
            produced.append(i)
            yield {k: v[i] for k, v in rows.items()}

    it = datasets.IterableDataset.from_generator(gen, features=FEATURES)
    steps: list[int] = []
    store = import_hf(it, tmp_path / "out.seqstore", id_column="id", batch_size=8, progress=steps.append)
    assert steps == [8, 8, 8, 8, 8, 5]  # one append per batch of the stream
    _check(store, iter(it), it.features)  # the records datasets streams, in order

    # a stream without declared features: types from its first batch
    plain = datasets.IterableDataset.from_generator(lambda: ({"x": i, "s": str(i)} for i in range(10)))
    assert plain.features is None
    store = import_hf(plain, tmp_path / "plain.seqstore", batch_size=3)
    assert np.dtype(store.schema["x"].dtype) == np.int64
    assert [bytes(store[i]["s"]).decode() for i in range(10)] == [str(r["s"]) for r in plain]


def test_stream_without_features_later_batches_take_the_first_batchs_types(tmp_path: Path) -> None:
    """A stream of Python examples without declared features: pyarrow infers each batch's types from
    its examples, so a later batch of empty lists only (``list<null>``) or of whole numbers in a float
    column (``int64``) would not match; they are converted to the types of the first batch."""
    examples = [{"t": [1, 2], "x": 1.5}, {"t": [], "x": 2}, {"t": [3], "x": 0.25}, {"t": [], "x": 4}]
    plain = datasets.IterableDataset.from_generator(lambda: iter(examples))
    assert plain.features is None
    store = import_hf(plain, tmp_path / "s.seqstore", batch_size=1)
    assert np.dtype(store.schema["t"].dtype) == np.int64 and np.dtype(store.schema["x"].dtype) == np.float64
    assert [store[i]["t"].tolist() for i in range(4)] == [e["t"] for e in examples]
    assert [float(store[i]["x"]) for i in range(4)] == [e["x"] for e in examples]
    bad = datasets.IterableDataset.from_generator(lambda: iter([{"x": 1.5}, {"x": "many"}]))
    with pytest.raises(SchemaError, match="column 'x'.*double"):
        import_hf(bad, tmp_path / "b.seqstore", batch_size=1)
    assert not (tmp_path / "b.seqstore").exists()


def test_failed_stream_leaves_no_store(tmp_path: Path) -> None:
    def gen() -> Iterator[dict[str, Any]]:
        for i in range(30):
            if i == 20:
                raise RuntimeError("source broke at record 20")
            yield {"x": i}

    it = datasets.IterableDataset.from_generator(gen, features=Features({"x": Value("int64")}))
    with pytest.raises(RuntimeError, match="record 20"):
        import_hf(it, tmp_path / "out.seqstore", batch_size=4)
    assert list(tmp_path.iterdir()) == []


def _wav(samples: np.ndarray[Any, Any], rate: int = 16_000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())
    return buf.getvalue()


def test_audio_column_kept_as_encoded_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    clips = [_wav(rng.integers(-3000, 3000, int(k))) for k in rng.integers(10, 400, 5)]
    on_disk = tmp_path / "clip.wav"
    on_disk.write_bytes(_wav(np.arange(100)))
    audio = [{"bytes": b, "path": f"clip{i}.wav"} for i, b in enumerate(clips)]
    audio.append({"bytes": None, "path": str(on_disk)})  # a path only: the file's bytes are imported
    # an Audio column as a saved dataset has it (struct of bytes and path), decoding on as by default;
    # built by a cast of the stored struct (encoding examples would need torchcodec)
    ds = datasets.Dataset.from_dict({"audio": audio, "n": list(range(6))},
                                    features=Features({"audio": {"bytes": Value("binary"), "path": Value("string")},
                                                       "n": Value("int8")}))
    ds = ds.cast_column("audio", Audio(sampling_rate=16_000))
    assert ds.features["audio"].decode
    store = import_hf(ds, tmp_path / "out.seqstore", id_column="n")
    assert np.dtype(store.schema["audio"].dtype) == np.uint8 and store.schema["audio"].ragged
    raw = ds.cast_column("audio", Audio(sampling_rate=16_000, decode=False))
    for i in range(5):
        assert raw[i]["audio"]["bytes"] is not None
        _same(store[i]["audio"], raw[i]["audio"], raw.features["audio"], f"record {i}")
        assert store.id(i) == str(raw[i]["n"])
    assert raw[5]["audio"]["bytes"] is None and bytes(store[5]["audio"]) == on_disk.read_bytes()
    with wave.open(io.BytesIO(bytes(store[0]["audio"]))) as w:  # a WAV file still
        assert w.getframerate() == 16_000
    assert "Audio" in store.manifest.metadata["hf"]["features"]["audio"]


def test_integer_ids(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"key": [10, 11, 12], "v": [[1.0], [], [2.0, 3.0]]})
    store = import_hf(ds, tmp_path / "out.seqstore", id_column="key")
    assert [store.id(i) for i in range(3)] == ["10", "11", "12"] and store.index("12") == 2
    _check(store, (ds[i] for i in range(3)), ds.features, ids="key")


def test_unsupported_column_is_a_named_error(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"meta": [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}], "v": [1, 2]})
    with pytest.raises(ColumnTypeError, match=r"column 'meta'.*supported: numbers") as err:
        import_hf(ds, tmp_path / "out.seqstore")
    assert err.value.column == "meta" and "'a'" in err.value.type and isinstance(err.value, SchemaError)
    assert not (tmp_path / "out.seqstore").exists()
    store = import_hf(ds, tmp_path / "out.seqstore", columns=["v"])  # left out: imports
    assert set(store.schema) == {"v"} and [int(store[i]["v"]) for i in range(2)] == ds["v"]


def test_nulls_and_bad_arguments_are_errors(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"v": [1, None, 3]})
    with pytest.raises(SchemaError, match=r"records 0\.\.2, column 'v': has 1 null"):
        import_hf(ds, tmp_path / "out.seqstore")
    with pytest.raises(SchemaError, match="no id column 'nope'"):
        import_hf(ds, tmp_path / "out.seqstore", id_column="nope")
    with pytest.raises(TypeError, match="expected a datasets.Dataset"):
        import_hf([1, 2, 3], tmp_path / "out.seqstore")
    ok = datasets.Dataset.from_dict({"v": [1, 2, 3]})
    for bad in (2.5, True, 0):  # 2.5 failed deep in datasets ("'float' object cannot be interpreted ..."), True ran
        with pytest.raises(ValueError, match=f"batch_size must be a positive integer, got {bad!r}"):
            import_hf(ok, tmp_path / "out.seqstore", batch_size=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "out.seqstore").exists()


def test_iterable_over_arrow_data_and_an_s3_store(tmp_path: Path, moto_s3: Any, s3_bucket: str) -> None:
    """A stream over Arrow data (``to_iterable_dataset``, read as Arrow batches) into a store on S3
    (moto): one part, one commit; a failing stream leaves no store there."""
    ds = _dataset(33, seed=8)
    it = ds.to_iterable_dataset(num_shards=3)
    opts = moto_s3.storage_options()
    out = f"s3://{s3_bucket}/hf.seqstore"
    store = import_hf(it, out, id_column="id", batch_size=5, storage_options=opts)
    assert store.is_remote
    _check(store, (ds[i] for i in range(len(ds))), ds.features)

    def gen() -> Iterator[dict[str, Any]]:
        yield from ({"x": i} for i in range(12))
        raise RuntimeError("stream broke")

    broken = datasets.IterableDataset.from_generator(gen, features=Features({"x": Value("int64")}))
    with pytest.raises(RuntimeError, match="stream broke"):
        import_hf(broken, f"s3://{s3_bucket}/broken.seqstore", batch_size=4, storage_options=opts)
    with pytest.raises(Exception):  # noqa: B017 - whatever the reader says, there is no store
        seqstore.open(f"s3://{s3_bucket}/broken.seqstore", storage_options=opts)


# ------------------------------------------------------------------------------------------ workers


def _same_store(a: Any, b: Any) -> None:
    """Same schema, ids, order and values, field by field."""
    assert a.schema == b.schema and len(a) == len(b) > 0
    for i in range(len(a)):
        assert (a.id(i) if a.has_ids else None) == (b.id(i) if b.has_ids else None)
        ra, rb = a[i], b[i]
        for name in a.schema:
            assert ra[name].dtype == rb[name].dtype and np.array_equal(ra[name], rb[name]), (i, name)


@pytest.fixture
def saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A save_to_disk directory of 60 rows in three Arrow files; units of 8 rows at least."""
    import seqstore.interop.hf as mod

    monkeypatch.setattr(mod, "MIN_UNIT_ROWS", 8)
    path = tmp_path / "saved"
    _dataset(60, seed=11).save_to_disk(str(path), num_shards=3)
    assert len(list(path.glob("*.arrow"))) == 3
    return path


def test_workers_saved_dataset_same_store(saved: Path, tmp_path: Path) -> None:
    one = import_hf(saved, tmp_path / "one", id_column="id", batch_size=7)
    two = import_hf(saved, tmp_path / "two", id_column="id", batch_size=7, workers=2)
    _same_store(one, two)
    assert two.num_shards > one.num_shards  # written as parts (four runs of 15 rows)
    loaded = datasets.load_from_disk(str(saved))
    assert len(loaded.cache_files) == 3
    _check(two, (loaded[i] for i in range(len(loaded))), loaded.features)
    # an indices mapping over the files (shuffle): the rows in the mapping's order, whatever the workers
    mixed = loaded.shuffle(seed=5)
    _same_store(import_hf(mixed, tmp_path / "m1", id_column="id"), import_hf(mixed, tmp_path / "m2", id_column="id",
                                                                              workers=3))
    assert seqstore.open(tmp_path / "m2").id(0) == mixed[0]["id"] != loaded[0]["id"]
    # through the CLI (its --workers default is the number of cores)
    assert cli_main(["convert", "--from", "hf", str(saved), str(tmp_path / "cli"), "-q", "--id-column", "id",
                     "--workers", "2", "--batch-size", "7"]) == 0
    _same_store(one, seqstore.open(tmp_path / "cli"))


def test_workers_in_memory_and_streams_stay_in_one_process(saved: Path, tmp_path: Path) -> None:
    ds = _dataset(60, seed=11)  # from_dict: held in memory, not handed to workers
    one = import_hf(ds, tmp_path / "one", id_column="id")
    two = import_hf(ds, tmp_path / "two", id_column="id", workers=2)
    _same_store(one, two)
    assert two.num_shards == one.num_shards == 1
    it = import_hf(ds.to_iterable_dataset(num_shards=3), tmp_path / "it", id_column="id", workers=2)
    _same_store(one, it)
    assert it.num_shards == 1


def test_worker_error_leaves_no_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import seqstore.interop.hf as mod

    monkeypatch.setattr(mod, "MIN_UNIT_ROWS", 4)
    path = tmp_path / "nulls"
    datasets.Dataset.from_dict({"v": [1] * 30 + [None] + [2] * 9}).save_to_disk(str(path), num_shards=2)
    with pytest.raises(SchemaError, match=r"records 30\.\.3\d, column 'v': has 1 null"):
        import_hf(path, tmp_path / "out.seqstore", workers=2, batch_size=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nulls"]


def test_workers_into_an_s3_store(saved: Path, tmp_path: Path, moto_s3: Any, s3_bucket: str) -> None:
    opts = moto_s3.storage_options()
    out = f"s3://{s3_bucket}/hf.seqstore"
    one = import_hf(saved, tmp_path / "one", id_column="id")
    two = import_hf(saved, out, id_column="id", workers=2, storage_options=opts)
    assert two.is_remote and two.num_shards > 1
    _same_store(one, two)


# ------------------------------------------------------------------------------------------ export


def _export_source(root: Path, ids: bool = True) -> seqstore.Store:
    """50 records of every kind of field (ragged with rows, fixed 2-d, scalar, bytes, bfloat16, empty rows)."""
    from seqstore import Field, Schema

    rng = np.random.default_rng(3)
    schema = Schema({"x": Field("float32", (None, 3)), "y": Field("int64"), "z": Field("float16", (2, 2)),
                     "t": Field("uint8", (None,)), "b": Field("bfloat16", (None,))})
    with seqstore.create(root, schema) as w:
        for i in range(50):
            n = int(rng.integers(0, 5))
            rec = {"x": rng.standard_normal((n, 3)).astype(np.float32), "y": i - 25,
                   "z": rng.standard_normal((2, 2)).astype(np.float16),
                   "t": np.frombuffer(f"héllo {i}".encode(), np.uint8), "b": rng.standard_normal(n).astype(np.float32)}
            w.append(rec, id=f"utt-{i:03d}" if ids else None)
        w.commit()
    return seqstore.open(root)


def test_export_hf_loads_in_datasets_and_imports_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from seqstore.interop.hf_export import export_hf
    from seqstore.schema import bfloat16_to_float32

    st = _export_source(tmp_path / "s.seqstore")
    seen: list[int] = []
    out = export_hf(st, tmp_path / "hf", chunk_records=7, progress=seen.append)  # batches across records
    assert sum(seen) == 50
    ds = datasets.load_from_disk(str(out))
    assert ds.column_names == ["id", "x", "y", "z", "t", "b"] and len(ds) == 50
    assert ds.features["y"] == Value("int64") and ds.features["x"] == List(List(Value("float32"), length=3))
    assert ds.features["z"] == List(List(Value("float16"), length=2), length=2)
    assert ds.features["b"] == List(Value("float32"))  # bfloat16 widened
    np_ds = ds.with_format("numpy")
    for i in (0, 7, 13, 49):
        rec, row = st[i], np_ds[i]
        assert row["id"] == st.id(i)
        for k in ("x", "y", "z", "t"):
            np.testing.assert_array_equal(np.asarray(row[k]).reshape(np.shape(rec[k])), rec[k])
        np.testing.assert_array_equal(np.asarray(row["b"], np.float32), bfloat16_to_float32(rec["b"]))
    back = import_hf(out, tmp_path / "back.seqstore", id_column="id")
    assert list(back.schema) == ["x", "y", "z", "t", "b"]
    assert back.schema["z"].shape == (2, 2) and back.schema["x"].shape == (None, 3)
    for i in range(50):
        assert back.id(i) == st.id(i)
        for k in ("x", "y", "z", "t"):
            np.testing.assert_array_equal(back[i][k], st[i][k])
    # the command line: chosen fields, no id column; an existing directory only with --overwrite, and only
    # a save_to_disk directory
    assert cli_main(["export", "--to", "hf", "-q", str(st.root), str(tmp_path / "cli"), "--fields", "y,t",
                     "--id-column", "none"]) == 0
    assert datasets.load_from_disk(str(tmp_path / "cli")).column_names == ["y", "t"]
    assert cli_main(["export", "--to", "hf", "-q", str(st.root), str(tmp_path / "cli")]) == 2
    assert "already exists" in capsys.readouterr().err
    assert cli_main(["export", "--to", "hf", "-q", str(st.root), str(tmp_path / "cli"), "--overwrite"]) == 0
    assert datasets.load_from_disk(str(tmp_path / "cli")).column_names[0] == "id"
    assert cli_main(["export", "--to", "hf", "-q", str(st.root), str(st.root), "--overwrite"]) == 2
    assert "is inside the store" in capsys.readouterr().err
    assert len(seqstore.open(st.root)) == 50
    with pytest.raises(KeyError, match="no field 'nope'"):
        export_hf(st, tmp_path / "bad", fields=["nope"])
    assert not (tmp_path / "bad").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back.seqstore", "cli", "hf", "s.seqstore"]


def test_export_hf_refuses_a_field_named_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """fields=["y", "y"] (or --fields y,y) is refused naming the field, before anything is written (it failed
    in pyarrow, with no word of the store or of which argument)."""
    from seqstore.interop.hf_export import export_hf

    st = _export_source(tmp_path / "s.seqstore")
    with pytest.raises(SchemaError, match="'y' is named twice in fields"):
        export_hf(st, tmp_path / "hf", fields=["y", "t", "y"])
    assert cli_main(["export", "--to", "hf", "-q", str(st.root), str(tmp_path / "cli"), "--fields", "y,y"]) == 2
    assert "'y' is named twice in fields" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.seqstore"]


def test_export_hf_of_no_column_is_refused(tmp_path: Path) -> None:
    """fields=[] with no id column (a store without ids, or id_column=None) has nothing to write: refused
    naming the store (it failed in datasets: "Please pass `features` or at least one example")."""
    from seqstore.interop.hf_export import export_hf

    st = _export_source(tmp_path / "s.seqstore", ids=False)
    for kw in ({}, {"id_column": None}):
        with pytest.raises(SchemaError, match="s.seqstore: nothing to export"):
            export_hf(st, tmp_path / "hf", fields=[], **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.seqstore"]


def test_export_hf_of_a_complex_field_is_refused_naming_it(tmp_path: Path) -> None:
    """Arrow has no complex numbers: a complex field is refused naming it, before anything is written
    (pyarrow's "Unsupported numpy type 14" named neither); the other fields export."""
    from seqstore.interop.hf_export import export_hf

    with seqstore.create(tmp_path / "c.seqstore", {"z": seqstore.Field("complex64", (None,)),
                                                   "y": seqstore.Field("int32")}) as w:
        w.append_batch({"z": (np.arange(4).astype(np.complex64), np.array([1, 3])), "y": np.array([5, 6])})
    with pytest.raises(SchemaError, match="c.seqstore: field 'z' is complex64"):
        export_hf(tmp_path / "c.seqstore", tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.seqstore"]
    out = export_hf(tmp_path / "c.seqstore", tmp_path / "hf", fields=["y"])
    assert datasets.load_from_disk(str(out))["y"] == [5, 6]


def test_export_hf_of_a_field_with_an_axis_of_size_0(tmp_path: Path) -> None:
    """A field with an axis of size 0 ((0,), (None, 0), (2, 0)) crashed export_hf with pyarrow's bare
    "list_size needs to be a strict positive integer" (Arrow's fixed-size lists hold at least one item): its
    records are written as lists of empty lists, which datasets loads, beside the other fields."""
    from seqstore.interop.hf_export import export_hf

    schema = {"z": seqstore.Field("float32", (0,)), "r": seqstore.Field("int16", (None, 0)),
              "m": seqstore.Field("float32", (2, 0)), "k": seqstore.Field("int32")}
    with seqstore.create(tmp_path / "s.seqstore", schema) as w:
        for i in range(3):
            w.append({"z": np.zeros(0, np.float32), "r": np.zeros((i, 0), np.int16),
                      "m": np.zeros((2, 0), np.float32), "k": i}, id=f"r{i}")
    ds = datasets.load_from_disk(str(export_hf(tmp_path / "s.seqstore", tmp_path / "hf")))
    assert ds.column_names == ["id", "z", "r", "m", "k"] and ds["k"] == [0, 1, 2]
    assert ds["z"] == [[]] * 3 and ds["r"] == [[], [[]], [[], []]] and ds["m"] == [[[], []]] * 3


def test_export_hf_store_without_ids_and_empty_store(tmp_path: Path) -> None:
    from seqstore.interop.hf_export import export_hf

    st = _export_source(tmp_path / "s.seqstore", ids=False)
    ds = datasets.load_from_disk(str(export_hf(st, tmp_path / "hf", fields=["y"])))
    assert ds.column_names == ["y"] and ds["y"] == list(range(-25, 25))
    empty = seqstore.create(tmp_path / "e.seqstore", st.schema)
    empty.commit()
    empty.close()
    ds = datasets.load_from_disk(str(export_hf(tmp_path / "e.seqstore", tmp_path / "ehf")))
    assert len(ds) == 0 and ds.column_names == ["x", "y", "z", "t", "b"]


def test_export_hf_cuts_steps_at_the_list_column_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step of chunk_records records whose ragged field has more rows than an Arrow list column holds
    (2^31 - 1, here lowered to 10) is cut into smaller steps (the export failed, asking for a smaller
    chunk_records that the CLI cannot pass); one record over the limit is refused naming its field."""
    from seqstore import Field
    from seqstore.interop import to_arrow
    from seqstore.interop.hf_export import export_hf

    monkeypatch.setattr(to_arrow, "INT32_MAX", 10)
    lens = np.array([3, 0, 6, 5, 5, 1, 4, 4, 2, 6] * 5)
    vals = np.arange(int(lens.sum()) * 2, dtype=np.int32).reshape(-1, 2)
    with seqstore.create(tmp_path / "s.seqstore", {"x": Field("int32", (None, 2)), "y": Field("int64")}) as w:
        w.append_batch({"x": (vals, lens), "y": np.arange(50)}, ids=[f"u{i}" for i in range(50)])
    st = seqstore.open(tmp_path / "s.seqstore")
    ds = datasets.load_from_disk(str(export_hf(st, tmp_path / "hf"))).with_format("numpy")
    assert len(ds) == 50 and list(ds["y"]) == list(range(50)) and ds[49]["id"] == "u49"
    for i in range(50):
        np.testing.assert_array_equal(np.array(ds[i]["x"].tolist(), dtype=np.int32).reshape(-1, 2), st[i]["x"])
    with seqstore.create(tmp_path / "big.seqstore", {"x": Field("int32", (None,))}) as w:
        w.append_batch({"x": (np.arange(14, dtype=np.int32), np.array([2, 12]))})
    with pytest.raises(ValueError, match=r"field 'x': 12 values in one Arrow array \(more than 2\^31 - 1\); a "
                       "datasets list column holds at most that many in one record"):
        export_hf(tmp_path / "big.seqstore", tmp_path / "hf2")


def test_export_refuses_an_id_that_is_not_utf8(tmp_path: Path) -> None:
    """An id that is no valid Unicode (a tag imported from bytes that are not UTF-8) was written into the
    Arrow ids as it is: the export looked complete, and reading that row failed with UnicodeDecodeError.
    It is a SchemaError naming the store and the record, and nothing is written."""
    from seqstore.interop.hf_export import export_hf

    with seqstore.create(tmp_path / "s", {"x": seqstore.Field("float32", (None, 2))}) as w:
        for key in ("a", "caf\udce9", "c"):
            w.append({"x": np.ones((2, 2), np.float32)}, id=key)
    with pytest.raises(SchemaError, match=r"s: record 1: id 'caf\\udce9' is not valid UTF-8"):
        export_hf(tmp_path / "s", tmp_path / "h")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
