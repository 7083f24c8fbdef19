"""Megatron indexed datasets: import_megatron / export_megatron against Megatron-Core's own
IndexedDatasetBuilder and IndexedDataset (megatron-core 0.16.1)."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.tmpfs import run_on_small_tmpfs

import seqstore
from seqstore import Field
from seqstore.cli import main as cli_main
from seqstore.errors import SchemaError
from seqstore.interop import megatron as mg
from seqstore.interop.megatron import MegatronIndexError, export_megatron, import_megatron, read_index

with warnings.catch_warnings():  # megatron.core says once that Transformer Engine / Apex are not installed
    warnings.simplefilter("ignore")
    torch = pytest.importorskip("torch")
    idx_mod = pytest.importorskip("megatron.core.datasets.indexed_dataset")
IndexedDataset: Any = idx_mod.IndexedDataset
IndexedDatasetBuilder: Any = idx_mod.IndexedDatasetBuilder


def build(prefix: Path, *, dtype: Any = np.uint16, docs: int = 40, max_seqs: int = 3, seed: int = 0,
          multimodal: bool = False) -> None:
    """A dataset written by Megatron's own builder: ``docs`` documents of 1..max_seqs sequences (0..30 tokens)."""
    rng = np.random.default_rng(seed)
    hi = 200 if np.dtype(dtype).itemsize == 1 else 60_000
    b = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=dtype, multimodal=multimodal)
    for _ in range(docs):
        for _ in range(int(rng.integers(1, max_seqs + 1))):
            tokens = rng.integers(0, hi, int(rng.integers(0, 31)))
            b.add_item(torch.from_numpy(tokens.astype(np.int64)), mode=int(rng.integers(0, 3)))
        b.end_document()
    b.finalize(str(prefix) + ".idx")


def assert_same(store: seqstore.Store, ds: Any, *, first: int = 0, doc_offset: int = 0) -> None:
    """Every sequence of ``ds`` equals records ``first...`` of ``store`` (values and dtype)."""
    for i in range(len(ds)):
        got = store[first + i]["tokens"]
        want = ds[i][0] if ds.multimodal else ds[i]  # a multimodal dataset gives (tokens, mode)
        assert got.dtype == want.dtype and np.array_equal(got, want), i
    if "document" in store.schema:
        docs = np.asarray(ds.document_indices)
        want_doc = np.searchsorted(docs, np.arange(len(ds)), side="right") - 1 + doc_offset
        got_doc = store.get_batch(np.arange(first, first + len(ds)), fields=["document"])["document"]
        assert np.array_equal(got_doc, want_doc)


def test_import_round_trips_against_indexed_dataset(tmp_path: Path) -> None:
    build(tmp_path / "a", dtype=np.uint16, seed=1)
    build(tmp_path / "b", dtype=np.uint16, seed=2, docs=7)
    a, b = IndexedDataset(str(tmp_path / "a")), IndexedDataset(str(tmp_path / "b"))
    st = import_megatron([tmp_path / "a", str(tmp_path / "b") + ".idx"], tmp_path / "ab.seqstore", chunk_bytes=64)
    assert len(st) == len(a) + len(b)
    assert st.schema["tokens"] == Field("uint16", (None,))
    assert_same(st, a)
    assert_same(st, b, first=len(a), doc_offset=len(a.document_indices) - 1)
    meta = st.metadata["megatron"]
    assert meta["document_field"] == "document" and meta["documents"] == 47 and meta["dtype"] == "uint16"


def test_import_one_sequence_per_document_has_no_document_field(tmp_path: Path) -> None:
    build(tmp_path / "d", dtype=np.int32, max_seqs=1)
    ds = IndexedDataset(str(tmp_path / "d"))
    st = import_megatron(tmp_path / "d", tmp_path / "d.seqstore")
    assert list(st.schema) == ["tokens"] and st.schema["tokens"].dtype == "<i4"
    assert_same(st, ds)


def test_import_gathers_sequences_that_are_not_back_to_back(tmp_path: Path) -> None:
    """An index whose pointers jump around in .bin (reversed order, one sequence read twice)."""
    build(tmp_path / "s", dtype=np.int16, max_seqs=1, docs=30)
    ix = read_index(tmp_path / "s")
    n = ix.num_sequences
    lens, ptr = np.array(ix.lengths), np.array(ix.pointers)
    order = np.concatenate([np.arange(n)[::-1], [3]])
    with open(tmp_path / "r.idx", "wb") as f:
        f.write(mg.MAGIC + struct.pack("<QBQQ", 1, 3, n + 1, n + 2))
        f.write(lens[order].astype("<i4").tobytes() + ptr[order].astype("<i8").tobytes())
        f.write(np.arange(n + 2, dtype="<i8").tobytes())
    (tmp_path / "r.bin").write_bytes((tmp_path / "s.bin").read_bytes())
    del ix
    ds = IndexedDataset(str(tmp_path / "r"))
    st = import_megatron(tmp_path / "r", tmp_path / "r.seqstore", chunk_bytes=40)
    assert len(st) == n + 1
    assert_same(st, ds)


def test_import_multimodal_modes(tmp_path: Path) -> None:
    build(tmp_path / "m", multimodal=True, docs=10)
    ds = IndexedDataset(str(tmp_path / "m"), multimodal=True)
    st = import_megatron(tmp_path / "m", tmp_path / "m.seqstore")
    assert np.array_equal(st.get_batch(np.arange(len(st)), fields=["mode"])["mode"], ds.index.sequence_modes)
    assert_same(st, ds)


def test_parallel_import_equals_sequential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build(tmp_path / "a", seed=3, docs=60)
    build(tmp_path / "b", seed=4, docs=30)
    seq = import_megatron([tmp_path / "a", tmp_path / "b"], tmp_path / "seq.seqstore")
    monkeypatch.setattr(mg, "MIN_UNIT_SEQUENCES", 17)
    par = import_megatron([tmp_path / "a", tmp_path / "b"], tmp_path / "par.seqstore", workers=2)
    assert par.num_shards > 1 and len(par) == len(seq)
    for name in seq.schema:
        x, y = seq.get_batch(np.arange(len(seq)), fields=[name])[name], par.get_batch(np.arange(len(par)),
                                                                                      fields=[name])[name]
        if isinstance(x, tuple):
            assert np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1])
        else:
            assert np.array_equal(x, y)


def _write_header(path: Path, magic: bytes = mg.MAGIC, version: int = 1, code: int = 8) -> None:
    data = bytearray(path.read_bytes())
    data[:9] = magic
    data[9:18] = struct.pack("<QB", version, code)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("magic", "version", "code", "words"), [
    (b"NOTANIDX\x00", 1, 8, "magic"),
    (mg.MAGIC, 2, 8, "version 2"),
    (mg.MAGIC, 1, 9, "dtype code 9"),
])
def test_bad_index_is_a_named_error(tmp_path: Path, magic: bytes, version: int, code: int, words: str) -> None:
    build(tmp_path / "x", docs=3)
    _write_header(tmp_path / "x.idx", magic, version, code)
    with pytest.raises(MegatronIndexError) as exc:
        import_megatron(tmp_path / "x", tmp_path / "x.seqstore")
    assert str(tmp_path / "x.idx") in str(exc.value) and words in str(exc.value)
    assert not (tmp_path / "x.seqstore").exists()


def test_truncated_index_and_short_bin_are_named_errors(tmp_path: Path) -> None:
    build(tmp_path / "x", docs=5)
    data = (tmp_path / "x.idx").read_bytes()
    (tmp_path / "x.idx").write_bytes(data[:-3])
    with pytest.raises(MegatronIndexError, match="bytes, expected"):
        read_index(tmp_path / "x")
    (tmp_path / "x.idx").write_bytes(data)
    (tmp_path / "x.bin").write_bytes((tmp_path / "x.bin").read_bytes()[:-4])
    with pytest.raises(MegatronIndexError, match=r"x\.bin.*not inside"):
        import_megatron(tmp_path / "x", tmp_path / "x.seqstore")
    with pytest.raises(FileNotFoundError, match="nope.idx"):
        read_index(tmp_path / "nope")


def test_a_pointer_whose_end_overflows_is_a_named_error(tmp_path: Path) -> None:
    """A pointer near 2**63: pointer + length wrapped negative and passed the check "inside .bin"; the
    import then failed in NumPy with an IndexError naming neither file nor sequence."""
    build(tmp_path / "x", docs=5)
    n = read_index(tmp_path / "x").num_sequences
    data = bytearray((tmp_path / "x.idx").read_bytes())
    at = mg.HEADER_BYTES + 4 * n + 8 * (n - 1)  # the last sequence's pointer (and length: one uint16)
    data[at : at + 8] = struct.pack("<q", (1 << 63) - 2)
    data[mg.HEADER_BYTES + 4 * (n - 1) : mg.HEADER_BYTES + 4 * n] = struct.pack("<i", 1)
    (tmp_path / "x.idx").write_bytes(bytes(data))
    with pytest.raises(MegatronIndexError, match=rf"x\.bin.*sequence {n - 1} \(pointer {(1 << 63) - 2}.*not inside"):
        import_megatron(tmp_path / "x", tmp_path / "x.seqstore")
    assert not (tmp_path / "x.seqstore").exists()


def test_export_is_read_by_indexed_dataset(tmp_path: Path) -> None:
    build(tmp_path / "a", dtype=np.uint16, seed=5, docs=25)
    a = IndexedDataset(str(tmp_path / "a"))
    st = import_megatron(tmp_path / "a", tmp_path / "a.seqstore")
    prefix = export_megatron(st, tmp_path / "out" / "b", chunk_bytes=50)
    b = IndexedDataset(str(prefix))
    assert len(b) == len(a) and b.index.dtype == np.uint16
    assert np.array_equal(b.document_indices, a.document_indices)
    for i in range(len(a)):
        assert np.array_equal(b[i], a[i]) and b[i].dtype == a[i].dtype
    with pytest.raises(FileExistsError):
        export_megatron(st, tmp_path / "out" / "b")
    export_megatron(st, tmp_path / "out" / "b.idx", documents=None, overwrite=True)
    assert np.array_equal(IndexedDataset(str(prefix)).document_indices, np.arange(len(a) + 1))


def test_export_any_ragged_integer_field_with_a_cast(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    rows = [rng.integers(0, 50_000, int(rng.integers(0, 12))).astype(np.int64) for _ in range(33)]
    with seqstore.create(tmp_path / "t.seqstore", {"ids": Field("int64", (None,)), "doc": Field("int32")}) as w:
        for i, r in enumerate(rows):
            w.append({"ids": r, "doc": i // 4})
    prefix = export_megatron(tmp_path / "t.seqstore", tmp_path / "t", dtype="uint16", documents="doc")
    ds = IndexedDataset(str(prefix))
    assert ds.index.dtype == np.uint16 and len(ds) == 33
    assert np.array_equal(ds.document_indices, [*range(0, 33, 4), 33])
    for i, r in enumerate(rows):
        assert np.array_equal(ds[i], r)
    with pytest.raises(SchemaError, match="cannot represent"):
        export_megatron(tmp_path / "t.seqstore", tmp_path / "u", dtype="int8")
    assert not (tmp_path / "u.bin").exists() and not (tmp_path / "u.idx").exists()
    with pytest.raises(SchemaError, match="not one of Megatron's"):
        export_megatron(tmp_path / "t.seqstore", tmp_path / "u", dtype="uint32")
    with pytest.raises(SchemaError, match="not ragged"):
        export_megatron(tmp_path / "t.seqstore", tmp_path / "u", field="doc")


@pytest.mark.parametrize(("src", "dst", "value"), [("uint32", "int32", 3_000_000_000), ("uint16", "int16", 40_000),
                                                   ("int16", "uint16", -1), ("uint64", "int64", 1 << 63)])
def test_export_cast_that_changes_the_sign_is_refused(tmp_path: Path, src: str, dst: str, value: int) -> None:
    """A cast between signed and unsigned integers of one size wraps values past the target's range
    (3e9 as int32 is -1294967296), which casts back to the same bits: it is refused like any lossy cast."""
    with seqstore.create(tmp_path / "t.seqstore", {"ids": Field(src, (None,))}) as w:
        w.append({"ids": np.array([1, 2], dtype=src)})
        w.append({"ids": np.array([5, value], dtype=src)})
    with pytest.raises(SchemaError, match=r"records 0\.\.1 hold values that .* cannot represent"):
        export_megatron(tmp_path / "t.seqstore", tmp_path / "u", dtype=dst)
    assert not (tmp_path / "u.bin").exists() and not (tmp_path / "u.idx").exists()


def test_export_cast_keeps_nan_which_the_narrower_float_holds(tmp_path: Path) -> None:
    """float64 tokens with a NaN exported as float32 were refused ("values that float32 cannot represent"):
    NaN never equals itself, so the cast-back check failed although float32 holds it; it is kept, and a NaN
    cast to an integer dtype is still refused."""
    with seqstore.create(tmp_path / "f.seqstore", {"x": Field("float64", (None,))}) as w:
        w.append({"x": np.array([1.0, np.nan, 2.5])})
        w.append({"x": np.array([-np.inf, 0.5])})
    prefix = export_megatron(tmp_path / "f.seqstore", tmp_path / "f", dtype="float32")
    got = np.fromfile(f"{prefix}.bin", dtype=np.float32)
    np.testing.assert_array_equal(got, np.array([1.0, np.nan, 2.5, -np.inf, 0.5], np.float32))
    with pytest.raises(SchemaError, match=r"records 0\.\.1 hold values that int64 cannot represent"):
        export_megatron(tmp_path / "f.seqstore", tmp_path / "i", dtype="int64")


@pytest.mark.parametrize("dtype", [None, "float32"])
def test_export_of_bfloat16_values_is_a_named_error(tmp_path: Path, dtype: str | None) -> None:
    with seqstore.create(tmp_path / "b.seqstore", {"x": Field("bfloat16", (None,))}) as w:
        w.append({"x": np.ones(3, dtype=np.float32)})
    with pytest.raises(SchemaError, match="field 'x': bfloat16 values"):
        export_megatron(tmp_path / "b.seqstore", tmp_path / "b", dtype=dtype)
    assert not (tmp_path / "b.bin").exists() and not (tmp_path / "b.idx").exists()


def test_cli_convert_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path / "a", seed=8, docs=12)
    a = IndexedDataset(str(tmp_path / "a"))
    out = tmp_path / "a.seqstore"
    assert cli_main(["convert", "--from", "megatron", str(tmp_path / "a"), str(out), "--tokens-field", "text",
                     "--workers", "1"]) == 0
    assert f"{len(a)} records" in capsys.readouterr().out
    assert seqstore.open(out).schema["text"].dtype == "<u2"
    assert cli_main(["export", "--to", "megatron", str(out), str(tmp_path / "b"), "-q"]) == 0
    b = IndexedDataset(str(tmp_path / "b"))
    assert np.array_equal(b.document_indices, a.document_indices)
    assert all(np.array_equal(a[i], b[i]) for i in range(len(a)))
    _write_header(tmp_path / "a.idx", version=3)
    assert cli_main(["convert", "--from", "megatron", str(tmp_path / "a"), str(tmp_path / "c.seqstore")]) == 2
    assert "version 3" in capsys.readouterr().err


_KILLED_EXPORT = """
import os, signal, sys
import numpy as np
import seqstore
from seqstore.interop.megatron import export_megatron

prefix = sys.argv[1]
real = os.replace

def replace(src, dst, *a, **k):  # killed at the first rename of (or onto) PREFIX.idx: .bin is installed
    if prefix + ".idx" in (os.fspath(src), os.fspath(dst)):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst, *a, **k)

os.replace = replace
with seqstore.create(prefix + ".store", {"tokens": seqstore.Field("int32", (None,))}) as w:
    for k in range(200):
        w.append({"tokens": np.arange(k % 7 + 1, dtype=np.int32)})
export_megatron(prefix + ".store", prefix, overwrite=True)
"""


def test_a_kill_between_the_renames_never_leaves_an_old_idx_beside_a_new_bin(tmp_path: Path) -> None:
    """export_megatron renamed .bin into place, then .idx: killed between the two with overwrite, the new
    .bin lay beside the old .idx, which read_index took for a dataset (the old sequences read from the new
    tokens). The old .idx is now removed before the new .bin is installed: a half-installed pair is not
    readable as a pair, and the next export with overwrite installs both."""
    import os
    import subprocess
    import sys

    prefix = tmp_path / "ds"
    with seqstore.create(tmp_path / "old.store", {"tokens": Field("int32", (None,))}) as w:
        for k in range(5):
            w.append({"tokens": np.full(3, k, np.int32)})
    export_megatron(tmp_path / "old.store", prefix)
    src = Path(seqstore.__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", _KILLED_EXPORT, str(prefix)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(src)})
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert os.path.getsize(f"{prefix}.bin") > 5 * 3 * 4  # the new tokens are in place
    with pytest.raises((FileNotFoundError, MegatronIndexError)):
        read_index(prefix)
    export_megatron(tmp_path / "ds.store", prefix, overwrite=True)
    assert read_index(prefix).num_sequences == 200
    assert sorted(os.listdir(tmp_path)) == ["ds.bin", "ds.idx", "ds.store", "old.store"]


@pytest.mark.parametrize("given", ["b", "b.bin", "b.idx"])
def test_cli_export_interrupted_after_the_install_leaves_no_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  given: str) -> None:
    """An interrupt that comes after export --to megatron installed its pair (while it reports) removes
    the new files; for OUT given as PREFIX.bin or PREFIX.idx the paths were made from OUT as typed
    (b.bin.idx, ...), so the new b.idx (or b.bin) was left."""
    import seqstore.interop.commands as commands

    with seqstore.create(tmp_path / "s", {"tokens": Field("int32", (None,))}) as w:
        w.append({"tokens": np.arange(4, dtype=np.int32)})

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "print", interrupted, raising=False)
    assert cli_main(["export", "--to", "megatron", str(tmp_path / "s"), str(tmp_path / given)]) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


@pytest.mark.parametrize("recorded", [["doc"], {"a": 1}, 5])
def test_a_recorded_document_field_that_is_not_a_name_is_a_named_error(tmp_path: Path, recorded: Any) -> None:
    """export_megatron(documents="auto") with metadata["megatron"]["document_field"] that is not a field
    name (a list) was a bare TypeError (unhashable type); it is a SchemaError naming the store and key."""
    with seqstore.create(tmp_path / "s", {"tokens": Field("int32", (None,))},
                         metadata={"megatron": {"document_field": recorded}}) as w:
        w.append({"tokens": np.arange(3, dtype=np.int32)})
    with pytest.raises(SchemaError, match=r"s: metadata\['megatron'\]\['document_field'\] is .*expected a field name"):
        export_megatron(tmp_path / "s", tmp_path / "m")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
    export_megatron(tmp_path / "s", tmp_path / "m", documents=None)


_FULL_DISK_EXPORT = """
import errno, os, sys
import numpy as np
import seqstore as ss
from seqstore.interop.megatron import export_megatron
for name, lengths in (("idx", np.ones(300_000, np.int64)), ("bin", np.full(4, 250_000, np.int64))):
    store = STORE + name
    with ss.create(store, {"tokens": ss.Field("int32", (None,))}) as w:
        w.append_batch({"tokens": (np.ones(int(lengths.sum()), np.int32), lengths)})
    try:  # .idx: 12 bytes a record, 3.6 MB; .bin: 4 MB; on a 2 MB disk
        export_megatron(store, sys.argv[1] + "/" + name, chunk_bytes=1 << 20)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
        print(exc)
    else:
        raise AssertionError("exported onto a full disk")
print(sorted(os.listdir(sys.argv[1])))
"""


def test_an_export_onto_a_full_disk_is_an_error_naming_the_file_not_a_crash(tmp_path: Path) -> None:
    """The .idx is written through a mapping of a file truncated to its size: on a full disk the first
    write into its hole was a SIGBUS that killed the process; it is an ENOSPC naming the file, and the
    temporaries are gone. A few long sequences (the .idx fits, the .bin does not): the .bin's write
    failed with the bare '[Errno 28] No space left on device', naming no file; it names PREFIX.bin and
    the bytes it needs."""
    script = _FULL_DISK_EXPORT.replace("STORE", repr(str(tmp_path / "s-")))
    disk, got = run_on_small_tmpfs(script, tmp_path, "2m")
    assert got.returncode == 0, (got.returncode, got.stdout, got.stderr[-2000:])
    idx, bin_, listed = got.stdout.splitlines()
    assert f"{disk}/idx.idx" in idx, got.stdout
    assert f"cannot write {disk}/bin.bin (4000000 bytes)" in bin_, got.stdout
    assert listed == "[]", got.stdout
