"""RETURNN HDF import and export against RETURNN's own SimpleHDFWriter and HDFDataset (PyPI returnn)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from interop_testlib import make_store, write_returnn_hdf

import seqstore
from seqstore.interop import SourceFormatError
from seqstore.interop import returnn as rt

pytest.importorskip("h5py")
pytest.importorskip("returnn")
import h5py  # noqa: E402
from returnn.datasets.hdf import HDFDataset  # noqa: E402


def _hdf_dataset(*files: Path) -> HDFDataset:
    ds = HDFDataset(files=[str(f) for f in files])
    ds.initialize()
    ds.init_seq_order(epoch=1)
    return ds


def _check_store(store: seqstore.Store, exp: dict, offset: int = 0) -> None:
    for i in range(len(exp["tags"])):
        rec = store[offset + i]
        assert store.id(offset + i) == exp["tags"][i]
        for k in ("data", "classes", "align", "spk"):
            np.testing.assert_array_equal(rec[k], exp[k][i], err_msg=f"seq {i} field {k}")
            assert rec[k].dtype == exp[k][i].dtype


@pytest.mark.parametrize("chunk_bytes", [300, 64 << 20])
def test_interop_import_dense_exact(tmp_path: Path, chunk_bytes: int) -> None:
    exp = write_returnn_hdf(tmp_path / "a.hdf", n=80, dim=5)
    calls: list[int] = []
    store = rt.import_hdf(tmp_path / "a.hdf", tmp_path / "a.seqstore", chunk_bytes=chunk_bytes, progress=calls.append)
    assert len(store) == 80
    assert store.schema["data"] == seqstore.Field("float32", (None, 5))
    assert store.schema["classes"] == seqstore.Field("int32", (None,))
    assert store.schema["align"] == seqstore.Field("float32", (None, 3))
    _check_store(store, exp)
    meta = store.metadata["returnn"]
    assert meta["inputs"] == "data" and meta["files"] == ["a.hdf"]
    assert meta["streams"]["data"] == {"hdf_key": "data", "dim": 5, "ndim": 2, "sparse": False}
    assert meta["streams"]["align"]["dim"] == 3 and meta["streams"]["classes"]["sparse"]
    # bounded chunks: every chunk within the budget unless it is a single sequence
    total = sum(x.nbytes for k in ("data", "classes", "align", "spk") for x in exp[k])
    assert sum(calls) == total
    if chunk_bytes == 300:
        assert len(calls) > 10 and max(calls) <= 300


def test_interop_import_sparse_inputs(tmp_path: Path) -> None:
    exp = write_returnn_hdf(tmp_path / "s.hdf", n=40, dim=None, vocab=30, seed=3)
    store = rt.import_hdf(tmp_path / "s.hdf", tmp_path / "s.seqstore")
    assert store.schema["data"] == seqstore.Field("int32", (None,))
    assert store.metadata["returnn"]["streams"]["data"] == {"hdf_key": "data", "dim": 30, "ndim": 1, "sparse": True}
    _check_store(store, exp)


def test_interop_import_several_files_one_store(tmp_path: Path) -> None:
    exps = [write_returnn_hdf(tmp_path / f"{k}.hdf", n=15 + k, dim=5, seed=k) for k in range(3)]
    store = rt.import_hdf([tmp_path / f"{k}.hdf" for k in range(3)], tmp_path / "all.seqstore", shard_bytes=4096)
    assert len(store) == 15 + 16 + 17 and store.num_shards > 1
    off = 0
    for exp in exps:
        _check_store(store, exp, off)
        off += len(exp["tags"])
    assert store.index(exps[2]["tags"][4]) == 15 + 16 + 4


def test_interop_import_rename(tmp_path: Path) -> None:
    write_returnn_hdf(tmp_path / "a.hdf", n=5)
    store = rt.import_hdf(tmp_path / "a.hdf", tmp_path / "r.seqstore", rename={"inputs": "feat", "spk": "speaker"})
    assert set(store.schema) == {"feat", "classes", "align", "speaker"}
    assert store.metadata["returnn"]["inputs"] == "feat"
    out = rt.export_hdf(store, tmp_path / "r.hdf")
    ds = _hdf_dataset(out)
    assert sorted(ds.get_data_keys()) == ["align", "classes", "data", "speaker"]


def test_interop_import_rename_by_the_listed_stream_names(tmp_path: Path) -> None:
    """The names the rename error lists are the ones it takes: ``data`` (the key of ``inputs``, and its
    field's default name) renames the inputs like ``inputs`` does; ``inputs`` in a file without inputs
    is an unknown stream, not silently ignored."""
    write_returnn_hdf(tmp_path / "a.hdf", n=5)
    with pytest.raises(seqstore.SchemaError, match=r"streams are \['align', 'classes', 'data', 'spk'\]"):
        rt.import_hdf(tmp_path / "a.hdf", tmp_path / "x.seqstore", rename={"nope": "x"})
    store = rt.import_hdf(tmp_path / "a.hdf", tmp_path / "r.seqstore", rename={"data": "feat"})
    assert set(store.schema) == {"feat", "classes", "align", "spk"}
    assert store.metadata["returnn"]["inputs"] == "feat"
    with h5py.File(tmp_path / "t.hdf", "w") as f:  # targets only
        f.create_dataset("seqLengths", data=np.array([[2], [1]], dtype=np.int32))
        f.create_dataset("seqTags", data=np.array(["s0", "s1"], dtype=object), dtype=h5py.string_dtype())
        f.create_dataset("targets/data/classes", data=np.arange(3, dtype=np.int32))
    with pytest.raises(seqstore.SchemaError, match=r"no stream\(s\) \['inputs'\]"):
        rt.import_hdf(tmp_path / "t.hdf", tmp_path / "t.seqstore", rename={"inputs": "feat"})
    assert not (tmp_path / "x.seqstore").exists() and not (tmp_path / "t.seqstore").exists()


def test_interop_export_overwrite_never_replaces_a_directory(tmp_path: Path) -> None:
    """``overwrite=True`` replaces an HDF file, never a directory: the store itself given as the output
    (``seqstore export --to returnn-hdf S S --overwrite``) or any other directory is refused and kept."""
    make_store(tmp_path / "s.seqstore", n=4)
    other = tmp_path / "keep"
    other.mkdir()
    (other / "a.txt").write_text("x")
    for target in (tmp_path / "s.seqstore", other):
        words = "is inside the store" if target.name == "s.seqstore" else "refusing to overwrite a directory"
        with pytest.raises(seqstore.SeqstoreError, match=words):
            rt.export_hdf(tmp_path / "s.seqstore", target, overwrite=True)
    assert len(seqstore.open(tmp_path / "s.seqstore")) == 4 and (other / "a.txt").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep", "s.seqstore"]


def _compare_hdf_datasets(a: HDFDataset, b: HDFDataset) -> None:
    assert a.num_seqs == b.num_seqs
    assert sorted(a.get_data_keys()) == sorted(b.get_data_keys())
    assert a.num_outputs == b.num_outputs
    for k in a.get_data_keys():
        assert a.get_data_dtype(k) == b.get_data_dtype(k)
        assert a.is_data_sparse(k) == b.is_data_sparse(k)
    assert a.get_all_tags() == b.get_all_tags()
    for i in range(a.num_seqs):
        assert a.get_tag(i) == b.get_tag(i)
        for k in a.get_data_keys():
            np.testing.assert_array_equal(a.get_data(i, k), b.get_data(i, k), err_msg=f"seq {i} key {k}")


@pytest.mark.parametrize("dim", [5, None])
def test_interop_export_loads_in_hdfdataset_identically(tmp_path: Path, dim: int | None) -> None:
    write_returnn_hdf(tmp_path / "a.hdf", n=50, dim=dim, seed=7)
    store = rt.import_hdf(tmp_path / "a.hdf", tmp_path / "a.seqstore", chunk_bytes=500)
    out = rt.export_hdf(store, tmp_path / "b.hdf", chunk_bytes=700)
    _compare_hdf_datasets(_hdf_dataset(tmp_path / "a.hdf"), _hdf_dataset(out))
    with h5py.File(out) as f:
        assert f.attrs["numSeqs"] == 50
        assert f["seqLengths"].dtype == np.int32 and f["seqLengths"].shape == (50, 4)
    with pytest.raises(FileExistsError):
        rt.export_hdf(store, out)
    rt.export_hdf(store, out, overwrite=True)


def test_interop_export_native_store(tmp_path: Path) -> None:
    exp = make_store(tmp_path / "n.seqstore", n=30)
    out = rt.export_hdf(tmp_path / "n.seqstore", tmp_path / "n.hdf")
    ds = _hdf_dataset(out)
    assert ds.num_outputs["data"] == [3, 2]
    top = max(int(c.max()) for c in exp["classes"] if len(c))
    assert ds.num_outputs["classes"][1] == 1 and ds.num_outputs["classes"][0] == top + 1
    for i in range(30):
        assert ds.get_tag(i) == exp["tags"][i]
        np.testing.assert_array_equal(ds.get_data(i, "data"), exp["data"][i])
        np.testing.assert_array_equal(ds.get_data(i, "classes"), exp["classes"][i])
        np.testing.assert_array_equal(ds.get_data(i, "speaker"), [exp["speaker"][i]])
    # and back again
    back = rt.import_hdf(out, tmp_path / "back.seqstore")
    for i in range(30):
        np.testing.assert_array_equal(back[i]["speaker"], [exp["speaker"][i]])
        assert back.id(i) == exp["tags"][i]


def test_interop_export_no_ids_targets_only_and_bfloat16(tmp_path: Path) -> None:
    schema = {"tok": seqstore.Field("int16", (None,)), "emb": seqstore.Field("bfloat16", (None, 2))}
    rng = np.random.default_rng(1)
    toks = [rng.integers(0, 9, int(rng.integers(1, 5))).astype("int16") for _ in range(12)]
    embs = [rng.standard_normal((len(t), 2)).astype("float32") for t in toks]
    with seqstore.create(tmp_path / "t.seqstore", schema) as w:
        w.append_batch({"tok": toks, "emb": embs})
    out = rt.export_hdf(tmp_path / "t.seqstore", tmp_path / "t.hdf", inputs=None)
    ds = _hdf_dataset(out)
    assert ds.get_tag(3) == "seq-3"
    np.testing.assert_array_equal(ds.get_data(3, "tok"), toks[3])
    rounded = seqstore.bfloat16_to_float32(seqstore.float32_to_bfloat16(embs[3]))
    np.testing.assert_array_equal(ds.get_data(3, "emb"), rounded)
    with pytest.raises(seqstore.SchemaError, match="target key"):
        rt.export_hdf(tmp_path / "t.seqstore", tmp_path / "x.hdf", inputs="tok", fields={"emb": "a/b"})


def test_interop_export_refuses_an_id_with_a_nul(tmp_path: Path) -> None:
    """An id holding a NUL failed part way through the export with h5py's bare 'VLEN strings do not
    support embedded NULLs', naming neither store nor record (RETURNN cuts a tag at its NUL anyway); it
    is a SchemaError naming the record, and no file is left."""
    with seqstore.create(tmp_path / "s", {"data": seqstore.Field("float32", (None, 2))}) as w:
        for key in ("a", "b\0c"):
            w.append({"data": np.ones((2, 2), np.float32)}, id=key)
    with pytest.raises(seqstore.errors.SchemaError, match=r"s: record 1: id 'b\\x00c' holds a NUL"):
        rt.export_hdf(tmp_path / "s", tmp_path / "o.hdf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_interop_export_refuses_a_field_or_key_named_twice(tmp_path: Path) -> None:
    """fields=["tok", "tok"] was written once without a word, two fields given one key failed in h5py
    ("name already exists", naming neither), and fields="emb" was taken as the fields 'e', 'm', 'b'."""
    schema = {"tok": seqstore.Field("int16", (None,)), "emb": seqstore.Field("float32", (None, 2))}
    with seqstore.create(tmp_path / "t.seqstore", schema) as w:
        w.append({"tok": np.arange(3, dtype=np.int16), "emb": np.zeros((3, 2), np.float32)})
    src = tmp_path / "t.seqstore"
    with pytest.raises(seqstore.SchemaError, match="'tok' is named twice in fields"):
        rt.export_hdf(src, tmp_path / "x.hdf", inputs=None, fields=["tok", "emb", "tok"])
    with pytest.raises(seqstore.SchemaError, match="'k' is named twice in fields"):
        rt.export_hdf(src, tmp_path / "x.hdf", inputs=None, fields={"tok": "k", "emb": "k"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.seqstore"]
    out = rt.export_hdf(src, tmp_path / "x.hdf", inputs="tok", fields="emb")
    np.testing.assert_array_equal(_hdf_dataset(out).get_data(0, "emb"), np.zeros((3, 2), np.float32))


# ---------------------------------------------------------------------------------- malformed


def _broken(tmp_path: Path, how: str) -> Path:
    p = tmp_path / f"{how.replace('/', '_')}.hdf"
    write_returnn_hdf(p, n=20, seed=5)
    with h5py.File(p, "r+") as f:
        if how == "no_tags":
            del f["seqTags"]
        elif how == "no_lengths":
            del f["seqLengths"]
        elif how == "no_streams":
            del f["inputs"]
            del f["targets"]
        elif how == "lengths_too_long":
            sl = f["seqLengths"][...]
            sl[4, 0] += 1
            f["seqLengths"][...] = sl
        elif how == "target_rows_short":
            data = f["targets/data/classes"][...]
            del f["targets/data/classes"]
            f["targets/data"].create_dataset("classes", data=data[:-1])
        elif how == "negative":
            sl = f["seqLengths"][...]
            sl[2, 1] = -1
            sl[3, 1] += 1
            f["seqLengths"][...] = sl
        elif how == "lengths_wrap":  # int64 lengths whose sum wraps around to the rows of the data
            sl = f["seqLengths"][...].astype(np.int64)
            sl[2, 0] += sl[0, 0] + sl[1, 0] + 2
            sl[0, 0] = sl[1, 0] = (1 << 63) - 1
            del f["seqLengths"]
            f.create_dataset("seqLengths", data=sl)
        elif how == "columns":
            sl = f["seqLengths"][...]
            del f["seqLengths"]
            f.create_dataset("seqLengths", data=sl[:, :2])
        elif how == "tags_short":
            tags = f["seqTags"][...]
            del f["seqTags"]
            f.create_dataset("seqTags", data=tags[:-1], dtype=h5py.string_dtype())
        elif how == "missing_target":
            del f["targets/data/align"]
        elif how == "size_text":  # a num_outputs entry that is not numbers (was a bare ValueError from int())
            f["targets/size"].attrs["align"] = "abc"
        elif how == "targets_dataset":  # each was a bare AttributeError (a group or dataset where the other is)
            del f["targets"]
            f.create_dataset("targets", data=np.zeros(3))
        elif how == "data_dataset":
            del f["targets/data"]
            f["targets"].create_dataset("data", data=np.zeros(3))
        elif how in ("inputs", "seqLengths", "seqTags", "labels", "targets/data/classes"):
            del f[how]
            f.create_group(how)
        elif how == "size_nan":
            f["targets/size"].attrs["align"] = np.array([np.nan, 2.0])
    return p


@pytest.mark.parametrize(
    ("how", "dataset", "words"),
    [
        ("no_tags", "seqTags", "missing"),
        ("no_lengths", "seqLengths", "missing"),
        ("no_streams", "inputs", "missing"),
        ("lengths_too_long", "inputs", "disagree"),
        ("target_rows_short", "targets/data/classes", "disagree"),
        ("negative", "seqLengths", "negative length -1 at sequence 2"),
        ("lengths_wrap", "seqLengths", f"length {(1 << 63) - 1} at sequence 0 is more than the"),
        ("columns", "seqLengths", "has 2 columns, expected 4"),
        ("tags_short", "seqTags", "does not match"),
        ("missing_target", "targets/data/align", "missing"),
        ("targets_dataset", "targets", "is a dataset; a RETURNN HDF file's 'targets' is a group"),
        ("data_dataset", "targets/data", "is a dataset; expected a group"),
        ("inputs", "inputs", "is a Group, expected an HDF dataset"),
        ("seqLengths", "seqLengths", "is a Group, expected an HDF dataset"),
        ("seqTags", "seqTags", "is a Group, expected an HDF dataset"),
        ("labels", "labels", "is a Group, expected an HDF dataset"),
        ("targets/data/classes", "targets/data/classes", "is a Group, expected an HDF dataset"),
        ("size_text", "targets/size", "attribute 'align' should be [dim, ndim] (whole numbers >= 0), got 'abc'"),
        ("size_nan", "targets/size", "attribute 'align' should be [dim, ndim] (whole numbers >= 0), got [nan, 2.0]"),
    ],
)
def test_interop_malformed_hdf_clear_error(tmp_path: Path, how: str, dataset: str, words: str) -> None:
    bad = _broken(tmp_path, how)
    with pytest.raises(seqstore.FormatError) as err:
        rt.import_hdf(bad, tmp_path / "out.seqstore")
    assert isinstance(err.value, SourceFormatError)
    msg = str(err.value)
    assert str(bad) in msg and repr(dataset) in msg and words in msg, msg
    assert err.value.dataset == dataset
    assert not (tmp_path / "out.seqstore").exists()


def test_interop_not_hdf_and_truncated(tmp_path: Path) -> None:
    junk = tmp_path / "junk.hdf"
    junk.write_bytes(b"not an hdf5 file at all" * 10)
    with pytest.raises(SourceFormatError, match="cannot open as an HDF5 file"):
        rt.import_hdf(junk, tmp_path / "o.seqstore")
    good = tmp_path / "g.hdf"
    write_returnn_hdf(good, n=30)
    cut = tmp_path / "cut.hdf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(SourceFormatError, match=str(cut)):
        rt.import_hdf(cut, tmp_path / "o.seqstore")
    assert not (tmp_path / "o.seqstore").exists()


def test_interop_string_target_is_schema_error(tmp_path: Path) -> None:
    p = tmp_path / "str.hdf"
    write_returnn_hdf(p, n=4)
    with h5py.File(p, "r+") as f:
        del f["targets/data/spk"]
        strings = np.array(["a", "b", "c", "d"], dtype=object)
        f["targets/data"].create_dataset("spk", data=strings, dtype=h5py.string_dtype())
    with pytest.raises(seqstore.SchemaError, match="targets/data/spk"):
        rt.import_hdf(p, tmp_path / "o.seqstore")


def test_interop_second_of_three_broken_writes_nothing(tmp_path: Path) -> None:
    files = [tmp_path / "f0.hdf", _broken(tmp_path, "lengths_too_long"), tmp_path / "f2.hdf"]
    write_returnn_hdf(files[0], n=10, seed=1)
    write_returnn_hdf(files[2], n=10, seed=2)
    out = tmp_path / "out.seqstore"
    with pytest.raises(SourceFormatError, match="lengths_too_long.hdf"):
        rt.import_hdf(files, out)
    assert not out.exists()
    # an existing store survives a failed overwrite: validation happens before anything is touched
    make_store(out, n=3)
    with pytest.raises(SourceFormatError):
        rt.import_hdf(files, out, overwrite=True)
    assert len(seqstore.open(out)) == 3


def test_interop_different_streams_across_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a.hdf", _broken(tmp_path, "missing_target")
    write_returnn_hdf(a, n=5)
    with h5py.File(b, "r+") as f:  # make it self-consistent: drop the align column too
        sl = f["seqLengths"][...]
        del f["seqLengths"]
        f.create_dataset("seqLengths", data=sl[:, [0, 2, 3]])
        del f["targets/size"].attrs["align"]
        del f["targets/labels/align"]
    with pytest.raises(seqstore.SchemaError, match="streams"):
        rt.import_hdf([a, b], tmp_path / "o.seqstore")


def _classes_hdf(path: Path, values: np.ndarray) -> None:
    """A targets-only file: one sequence of length 1 per value of ``classes``."""
    with h5py.File(path, "w") as f:
        f.create_dataset("seqLengths", data=np.ones((len(values), 1), dtype=np.int32))
        f.create_dataset("seqTags", data=np.array([f"{path.stem}-{i}" for i in range(len(values))], dtype=object),
                         dtype=h5py.string_dtype())
        f.create_dataset("targets/data/classes", data=values)


def test_interop_signed_and_unsigned_int64_across_files_is_refused(tmp_path: Path) -> None:
    """int64 in one file and uint64 in another have no common integer dtype: numpy promotes them to
    float64, which would round values past 2**53 silently. The import refuses, naming both files and
    dtypes; a pair that an integer dtype holds (int8 with uint16: int32) is still merged exactly."""
    a, b, c = tmp_path / "a.hdf", tmp_path / "b.hdf", tmp_path / "c.hdf"
    _classes_hdf(a, np.array([-1, 2], dtype=np.int64))
    _classes_hdf(b, np.array([2**63 + 1, 2**53 + 1], dtype=np.uint64))
    with pytest.raises(seqstore.SchemaError, match=r"b\.hdf.*targets/data/classes.*uint64 and int64 of .*a\.hdf") as e:
        rt.import_hdf([a, b], tmp_path / "o.seqstore")
    assert "float64" in str(e.value)
    assert not (tmp_path / "o.seqstore").exists()
    _classes_hdf(a, np.array([-1, 2], dtype=np.int8))
    _classes_hdf(c, np.array([65535, 7], dtype=np.uint16))
    store = rt.import_hdf([a, c], tmp_path / "ok.seqstore")
    assert np.dtype(store.schema["classes"].dtype) == np.int32
    assert [int(store[i]["classes"][0]) for i in range(4)] == [-1, 2, 65535, 7]


def test_interop_failure_while_streaming_deletes_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_returnn_hdf(tmp_path / "a.hdf", n=60)
    real = rt._read
    calls = {"n": 0}

    def flaky(ds, sl, path, name):  # type: ignore[no-untyped-def]
        if name == "inputs":
            calls["n"] += 1
            if calls["n"] == 20:
                raise SourceFormatError(path, name, "simulated damaged chunk")
        return real(ds, sl, path, name)

    monkeypatch.setattr(rt, "_read", flaky)
    out = tmp_path / "o.seqstore"
    with pytest.raises(SourceFormatError, match="simulated"):
        # tiny shards: several shards are committed before the failure, and must go too
        rt.import_hdf(tmp_path / "a.hdf", out, chunk_bytes=200, shard_bytes=1000)
    assert not out.exists()
    shutil.rmtree(out, ignore_errors=True)


def test_interop_failed_overwrite_keeps_the_existing_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """overwrite=True with a failure after shards were committed: the old store is untouched, no
    temporary directory is left; a successful overwrite replaces it."""
    write_returnn_hdf(tmp_path / "a.hdf", n=60)
    out = tmp_path / "o.seqstore"
    make_store(out, n=3)
    real = rt._read
    calls = {"n": 0}

    def flaky(ds, sl, path, name):  # type: ignore[no-untyped-def]
        if name == "inputs":
            calls["n"] += 1
            if calls["n"] == 20:
                raise SourceFormatError(path, name, "simulated damaged chunk")
        return real(ds, sl, path, name)

    monkeypatch.setattr(rt, "_read", flaky)
    with pytest.raises(SourceFormatError, match="simulated"):
        rt.import_hdf(tmp_path / "a.hdf", out, chunk_bytes=200, shard_bytes=1000, overwrite=True)
    assert calls["n"] == 20
    old = seqstore.open(out)
    assert len(old) == 3 and old.id(0) == "utt-00000"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.hdf", "o.seqstore"]
    monkeypatch.setattr(rt, "_read", real)
    store = rt.import_hdf(tmp_path / "a.hdf", out, chunk_bytes=200, shard_bytes=1000, overwrite=True)
    assert len(store) == 60 and len(seqstore.open(out)) == 60
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.hdf", "o.seqstore"]


@pytest.mark.parametrize("value", ["abc", b"xyz", np.array([3, 4]), np.nan, -2])
def test_interop_input_patt_size_that_is_not_a_count_is_a_named_error(tmp_path: Path, value: Any) -> None:
    """The dim of sparse inputs (the file attribute inputPattSize) that is text, several numbers, NaN or
    negative was a bare ValueError/TypeError from int() (or a negative dim in the store's metadata)."""
    p = tmp_path / "patt.hdf"
    write_returnn_hdf(p, n=6, dim=None)
    with h5py.File(p, "r+") as f:
        f.attrs["inputPattSize"] = value
    with pytest.raises(SourceFormatError, match="attribute 'inputPattSize'") as err:
        rt.import_hdf(p, tmp_path / "o.seqstore")
    assert str(p) in str(err.value) and err.value.dataset == "inputs"
    assert not (tmp_path / "o.seqstore").exists()


@pytest.mark.parametrize("streams", [{"x": {"dim": "abc"}}, {"x": {"dim": 3, "ndim": None}}, {"x": {"dim": 2.5}},
                                     ["x"], {"x": {"dim": -1}}])
def test_interop_export_with_malformed_returnn_metadata(tmp_path: Path, streams: Any) -> None:
    """The store's metadata["returnn"]["streams"] (written by import_hdf, but a store's metadata is the
    user's) with a dim that is not a whole number was a bare ValueError/TypeError (a list of streams an
    AttributeError); such an entry is now a SchemaError naming the store and field, a list is ignored."""
    with seqstore.create(tmp_path / "s", {"x": seqstore.Field("int32", (None,))},
                         metadata={"returnn": {"streams": streams}}) as w:
        w.append({"x": np.arange(3, dtype=np.int32)})
    if isinstance(streams, list):
        rt.export_hdf(tmp_path / "s", tmp_path / "o.hdf", inputs="x")
        with h5py.File(tmp_path / "o.hdf", "r") as f:
            assert f.attrs["inputPattSize"] == 3
        return
    with pytest.raises(seqstore.SchemaError, match=r"s: metadata\['returnn'\]\['streams'\]\['x'\] .* whole numbers"):
        rt.export_hdf(tmp_path / "s", tmp_path / "o.hdf", inputs="x")
    assert not (tmp_path / "o.hdf").exists()


def test_files_of_different_dims_are_a_named_error(tmp_path: Path) -> None:
    """Files whose streams have other dims (num_outputs; here a sparse vocabulary of 30 and one of 50)
    were imported with the first file's dims, so the store claimed dim 30 for values up to 49 (RETURNN's
    HDFDataset refuses such files); it is a SchemaError naming both files and the stream."""
    write_returnn_hdf(tmp_path / "a.hdf", n=4, dim=None, vocab=30)
    write_returnn_hdf(tmp_path / "b.hdf", n=4, dim=None, vocab=50, seed=1)
    with pytest.raises(seqstore.SchemaError, match=r"b\.hdf, dataset 'inputs': dim 50 .* but dim 30 .* in .*a\.hdf"):
        rt.import_hdf([tmp_path / "a.hdf", tmp_path / "b.hdf"], tmp_path / "s")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("recorded", [["data"], {"a": 1}, 5])
def test_a_recorded_inputs_that_is_not_a_name_is_a_named_error(tmp_path: Path, recorded: Any) -> None:
    """export_hdf(inputs="auto") with metadata["returnn"]["inputs"] that is not a field name (a list) was a
    bare TypeError (unhashable type); it is a SchemaError naming the store and the metadata key."""
    with seqstore.create(tmp_path / "s", {"data": seqstore.Field("int32", (None,))},
                         metadata={"returnn": {"inputs": recorded}}) as w:
        w.append({"data": np.arange(3, dtype=np.int32)})
    with pytest.raises(seqstore.SchemaError, match=r"s: metadata\['returnn'\]\['inputs'\] is .*expected a field name"):
        rt.export_hdf(tmp_path / "s", tmp_path / "r.hdf")
    assert not (tmp_path / "r.hdf").exists()
    rt.export_hdf(tmp_path / "s", tmp_path / "r.hdf", inputs="data")


def test_interop_tags_that_are_not_utf8_round_trip(tmp_path: Path) -> None:
    """A tag whose bytes are not UTF-8 imported (kept as surrogate escapes) but its export failed part way
    with a bare UnicodeEncodeError naming neither store nor record; the exported tag is the same bytes."""
    write_returnn_hdf(tmp_path / "a.hdf", n=3, dim=2)
    with h5py.File(tmp_path / "a.hdf", "r+") as f:
        tags = f["seqTags"][:]
        tags[1] = b"caf\xe9-1"
        del f["seqTags"]
        f.create_dataset("seqTags", data=tags)
    store = rt.import_hdf(tmp_path / "a.hdf", tmp_path / "a.seqstore")
    rt.export_hdf(store, tmp_path / "b.hdf")
    with h5py.File(tmp_path / "b.hdf", "r") as f:
        assert f["seqTags"][:].tolist() == tags.tolist()
    with seqstore.create(tmp_path / "s", {"data": seqstore.Field("float32", (None, 2))}) as w:
        w.append({"data": np.ones((2, 2), np.float32)}, id="a\ud800")  # (no bytes decode to this one)
    with pytest.raises(seqstore.errors.SchemaError, match=r"s: record 0: id 'a\\ud800' is not valid Unicode"):
        rt.export_hdf(tmp_path / "s", tmp_path / "o.hdf")
    assert not (tmp_path / "o.hdf").exists()
