"""``seqstore convert`` / ``seqstore export`` as registered by seqstore.interop.commands.add_subcommands."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from interop_testlib import write_returnn_hdf

import seqstore
from seqstore.errors import SeqstoreError
from seqstore.interop import commands


def _run(argv: list[str]) -> int:
    """What cli.main does once the lead wires add_subcommands in."""
    p = argparse.ArgumentParser(prog="seqstore")
    sub = p.add_subparsers(dest="command", required=True)
    commands.add_subcommands(sub)
    args = p.parse_args(argv)
    try:
        return int(args.func(args))
    except SeqstoreError:
        return 2


def test_interop_cli_convert_and_export_returnn_hdf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("returnn")
    from returnn.datasets.hdf import HDFDataset

    exp_a = write_returnn_hdf(tmp_path / "a.hdf", n=12, seed=1)
    write_returnn_hdf(tmp_path / "b.hdf", n=8, seed=2)
    out = tmp_path / "ab.seqstore"
    assert _run(["convert", "--from", "returnn-hdf", str(tmp_path / "a.hdf"), str(tmp_path / "b.hdf"), str(out),
                 "--chunk-mb", "1", "--rename", "spk=speaker"]) == 0
    captured = capsys.readouterr()
    assert "20 records" in captured.out and "convert returnn-hdf" in captured.err  # tqdm bar on stderr
    store = seqstore.open(out)
    assert len(store) == 20 and "speaker" in store.schema and store.id(0) == exp_a["tags"][0]
    assert _run(["convert", "--from", "returnn-hdf", str(tmp_path / "a.hdf"), str(out)]) == 2  # exists
    assert "already exists" in capsys.readouterr().err
    hdf = tmp_path / "out.hdf"
    assert _run(["export", "--to", "returnn-hdf", str(out), str(hdf), "-q"]) == 0
    ds = HDFDataset(files=[str(hdf)])
    ds.initialize()
    ds.init_seq_order(epoch=1)
    assert ds.num_seqs == 20 and ds.get_tag(0) == exp_a["tags"][0]
    np.testing.assert_array_equal(ds.get_data(3, "speaker"), exp_a["spk"][3])
    # a broken source: exit status 2 and no store
    (tmp_path / "bad.hdf").write_bytes(b"x" * 64)
    assert _run(["convert", "--from", "returnn-hdf", str(tmp_path / "bad.hdf"), str(tmp_path / "bad.seqstore"),
                 "-q"]) == 2
    assert not (tmp_path / "bad.seqstore").exists()


def test_interop_cli_convert_parquet_map(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    t = pa.table({"key": ["a", "b", "c"], "toks": pa.array([[1, 2], [], [3]], pa.list_(pa.int64())),
                  "junk": ["x", "y", "z"]})
    pq.write_table(t, tmp_path / "t.parquet")
    out = tmp_path / "t.seqstore"
    assert _run(["convert", "--from", "parquet", str(tmp_path / "t.parquet"), str(out), "--map", "toks=tokens",
                 "--id-column", "key", "-q"]) == 0
    store = seqstore.open(out)
    assert list(store.schema) == ["tokens"] and store.id(1) == "b"
    np.testing.assert_array_equal(store[0]["tokens"], [1, 2])
    assert _run(["convert", "--from", "parquet", str(tmp_path / "t.parquet"), str(tmp_path / "u.seqstore"),
                 "--map", "bad", "-q"]) == 2


@pytest.mark.parametrize("workers", ["1", "2"])
def test_interop_cli_convert_to_a_file_url(workers: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OUT given as a file:// URL (as ``create`` takes it) was made as a directory ``file:`` under the
    working directory, and the command then failed with 'no such store'."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"toks": pa.array([[1, 2], [], [3]], pa.list_(pa.int64()))}), tmp_path / "t.parquet")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "t.seqstore"
    assert _run(["convert", "--from", "parquet", str(tmp_path / "t.parquet"), f"file://{out}", "-q",
                 "--workers", workers]) == 0
    assert len(seqstore.open(out)) == 3 and not (tmp_path / "file:").exists()


def test_interop_cli_registry_accepts_new_sources(tmp_path: Path) -> None:
    seen = {}

    def run(args: argparse.Namespace, progress: commands.Progress) -> list[int]:
        seen["args"] = args
        progress(5)
        return [1, 2, 3]

    def add(group: object) -> None:
        group.add_argument("--dummy-level", type=int, default=0)  # type: ignore[attr-defined]

    commands.register_source("dummy", commands.Converter("a test source", run, add))
    try:
        assert _run(["convert", "--from", "dummy", "x", str(tmp_path / "o"), "--dummy-level", "3", "-q"]) == 0
        assert seen["args"].dummy_level == 3
    finally:
        commands.SOURCES.pop("dummy")
    with pytest.raises(SystemExit):
        _run(["convert", "--from", "dummy", "x", "y"])


def test_export_from_an_s3_store_with_storage_options(tmp_path: Path, moto_s3: Any, s3_bucket: str) -> None:
    """``seqstore export -o KEY=VALUE``: a store at a URL whose client needs options is exported like a
    local one (here to Megatron's .bin/.idx, read back); a malformed option is a named error."""
    from seqstore.interop.megatron import read_index

    url = f"s3://{s3_bucket}/tokens.seqstore"
    schema = seqstore.Schema({"tokens": seqstore.Field("int32", (None,))})
    rows = [np.arange(k + 1, dtype=np.int32) * 3 for k in range(7)]
    with seqstore.create(url, schema, storage_options=moto_s3.storage_options()) as w:
        for r in rows:
            w.append({"tokens": r})
    opts = [a for k, v in moto_s3.storage_options().items() for a in ("-o", f"{k}={v}")]
    prefix = tmp_path / "tok"
    assert _run(["export", "--to", "megatron", url, str(prefix), "-q", *opts]) == 0
    index = read_index(f"{prefix}.idx")
    assert index.lengths.tolist() == [len(r) for r in rows] and index.dtype == np.int32
    assert np.array_equal(np.fromfile(f"{prefix}.bin", np.int32), np.concatenate(rows))
    assert _run(["export", "--to", "megatron", url, str(tmp_path / "t2"), "-q", "-o", "endpoint"]) == 2


def test_export_returnn_hdf_from_an_s3_store_with_storage_options(tmp_path: Path, moto_s3: Any,
                                                                  s3_bucket: str) -> None:
    """``export --to returnn-hdf`` of a store at a URL whose client needs options: export_hdf reopens the
    store to read bfloat16 as float32, and must reopen it at its URL with its options (not its local
    cache directory, which holds no shard until read)."""
    h5py = pytest.importorskip("h5py")
    url = f"s3://{s3_bucket}/feat.seqstore"
    schema = seqstore.Schema({"data": seqstore.Field("float32", (None, 3)), "bf": seqstore.Field("bfloat16", (None,))})
    rows = [np.full((k + 1, 3), k, np.float32) for k in range(5)]
    with seqstore.create(url, schema, storage_options=moto_s3.storage_options()) as w:
        for r in rows:
            w.append({"data": r, "bf": np.arange(len(r), dtype=np.float32)})
    opts = [a for k, v in moto_s3.storage_options().items() for a in ("-o", f"{k}={v}")]
    out = tmp_path / "feat.hdf"
    assert _run(["export", "--to", "returnn-hdf", url, str(out), "-q", *opts]) == 0
    with h5py.File(out, "r") as f:
        assert np.array_equal(f["inputs"][:], np.concatenate(rows))
        assert f["targets/data/bf"].dtype == np.float32
        assert np.array_equal(f["targets/data/bf"][:], np.concatenate([np.arange(len(r)) for r in rows]))


@pytest.mark.parametrize("argv", [
    ["convert", "--from", "parquet", "--chunk-mb", "0"],
    ["convert", "--from", "parquet", "--shard-mb", "0"],
    ["convert", "--from", "parquet", "--chunk-mb", "-1"],
    ["convert", "--from", "logix", "--batch-records", "0"],
    ["export", "--to", "megatron", "--chunk-mb", "0"],
])
def test_cli_sizes_below_one_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              argv: list[str]) -> None:
    """A size option of 0 or less is refused by the parser (exit 2, naming the option), not a traceback
    from deep in the importer after the sources were read."""
    from seqstore.cli import main

    paths = [str(tmp_path / "src"), str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exc:
        main([*argv, *paths, "-q"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert argv[3] in err and "expected a positive integer" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("argv", "words"), [
    (["export", "--to", "megatron", "{store}", "{tmp}/m", "--dtype", "int33"], "dtype int33 is not one of Megatron's"),
    (["export", "--to", "hf", "{store}", "{tmp}/h"], "'id' is also a field's name; pass another --id-column"),
    (["convert", "--from", "parquet", "{tmp}/t.parquet", "{tmp}/o", "-o", "endpoint=http://127.0.0.1:9"],
     "-o options are for URLs of object storage"),
    # options a format would ignore are refused, naming the formats they are for
    (["export", "--to", "webdataset", "{store}", "{tmp}/w", "--chunk-mb", "1"],
     "export --to webdataset: --chunk-mb does not apply (it is for --to returnn-hdf, megatron)"),
    (["export", "--to", "hf", "{store}", "{tmp}/h", "--chunk-mb", "1", "--id-column", "none"],
     "export --to hf: --chunk-mb does not apply"),
    (["convert", "--from", "logix", "{tmp}/logs", "{tmp}/o", "--chunk-mb", "1"],
     "convert --from logix: --chunk-mb does not apply"),
    (["convert", "--from", "logix", "{tmp}/logs", "{tmp}/o", "-o", "endpoint=http://127.0.0.1:9"],
     "convert --from logix: -o does not apply (a local store; -o is for --from returnn-hdf"),
    (["convert", "--from", "logix", "{tmp}/logs", "{tmp}/o", "--workers", "2"],  # was accepted and unused
     "convert --from logix: --workers does not apply (a LogIX log is imported in one process)"),
    # a name given twice: the last won, or a field was written once, without a word
    (["export", "--to", "webdataset", "{store}", "{tmp}/w", "--ext", "id=cls", "--ext", "id=txt"],
     "--ext 'id=txt': expected each name once"),
    (["export", "--to", "returnn-hdf", "{store}", "{tmp}/r.hdf", "--field", "id", "--field", "id"],
     "--field 'id': expected each name once"),
    (["convert", "--from", "parquet", "{tmp}/t.parquet", "{tmp}/o", "--map", "x=a", "--map", "x=b"],
     "--map 'x=b': expected each name once"),
])
def test_cli_bad_option_values_are_named_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                argv: list[str], words: str) -> None:
    """An option value the library refuses is ``seqstore: error: ...`` with exit 2, not a traceback."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from seqstore.cli import main

    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "t.parquet")
    store = tmp_path / "s.seqstore"
    with seqstore.create(store, {"tokens": seqstore.Field("int32", (None,)), "id": seqstore.Field("int64")}) as w:
        w.append({"tokens": np.arange(3, dtype=np.int32), "id": 7}, id="r0")
    assert main([a.format(store=store, tmp=tmp_path) for a in argv] + ["-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error:") and words in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.seqstore", "t.parquet"]


def test_cli_unwritable_output_is_a_named_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An OUT under a regular file (NotADirectoryError) or in a directory the process may not write
    (PermissionError) is ``seqstore: error: ...`` naming the path, with exit 2, not a traceback."""
    pa = pytest.importorskip("pyarrow")
    import os

    import pyarrow.parquet as pq

    from seqstore.cli import main

    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "t.parquet")
    (tmp_path / "plain").write_text("not a directory")
    if os.geteuid() == 0:  # root may write anywhere but in /sys
        locked = Path("/sys")
        if not locked.is_dir():
            pytest.skip("no /sys to be refused in as root")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
    store = tmp_path / "s.seqstore"
    with seqstore.create(store, {"tokens": seqstore.Field("int32", (None,))}) as w:
        w.append({"tokens": np.arange(3, dtype=np.int32)})
    cases = [
        (["convert", "--from", "parquet", str(tmp_path / "t.parquet"), str(tmp_path / "plain/sub/o.seqstore")],
         f"Not a directory: '{tmp_path / 'plain/sub'}'"),
        (["convert", "--from", "parquet", str(tmp_path / "t.parquet"), str(locked / "o.seqstore")], f"{locked}/"),
        (["export", "--to", "megatron", str(store), str(locked / "m")], f"{locked}/"),
    ]
    for argv, words in cases:
        assert main([*argv, "-q", "--workers", "1"] if argv[0] == "convert" else [*argv, "-q"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("seqstore: error:") and words in err and "Traceback" not in err, err


@pytest.mark.parametrize(("out", "pair"), [("out.seqstore", False), ("data.bin", True)])
def test_an_interrupt_removes_a_new_output_given_as_a_file_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               out: str, pair: bool) -> None:
    """``seqstore convert ... file:///abs/OUT`` interrupted once OUT was written left OUT behind: the clean-up
    took the URL as the relative path ``file:/abs/OUT``. A ``file://`` OUT is cleaned up as its path is;
    an output that existed before is kept."""
    from seqstore.interop.commands import _undone_on_interrupt

    monkeypatch.chdir(tmp_path)
    kept = tmp_path / "data.idx"
    kept.write_text("there before")
    made = tmp_path / out
    with pytest.raises(KeyboardInterrupt), _undone_on_interrupt(f"file://{made}", pair=pair):
        made.mkdir() if not pair else made.write_text("new")
        raise KeyboardInterrupt
    assert not made.exists() and kept.read_text() == "there before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.idx"]


def test_convert_refuses_a_logix_log_inside_its_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``seqstore convert --from logix STORE/log STORE --overwrite`` imported the log, then replaced the
    store directory holding it: the log was deleted. It is refused, one line, before anything is read."""
    out = tmp_path / "s.seqstore"
    with seqstore.create(out, {"x": seqstore.Field("int32", (None,))}) as w:
        w.append({"x": np.zeros(2, np.int32)})
    log = out / "log"
    shutil.copytree(Path(__file__).resolve().parents[1] / "log" / "data" / "logix_0.1.1", log)
    from seqstore.cli import main

    assert main(["convert", "--from", "logix", str(log), str(out), "--overwrite", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error: convert: the source") and "is inside the output" in err, err
    assert log.is_dir() and len(seqstore.open(out)) == 1


@pytest.mark.parametrize(("source", "made"), [("parquet", "t.parquet"), ("webdataset", "wds"),
                                              ("webdataset", "wds/{000000..000000}.tar"), ("megatron", "meg"),
                                              ("returnn-hdf", "r.hdf")])
def test_convert_takes_sources_given_as_file_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str], source: str,
                                                  made: str) -> None:
    """OUT (and ``export``'s STORE) may be a ``file://`` URL, but a source given as one was looked for at a
    relative path ``file:/...``: 'no such tar shard', 'no such file or directory'. A ``file://`` source is
    its path."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from seqstore.interop.megatron import export_megatron
    from seqstore.interop.returnn import export_hdf
    from seqstore.interop.webdataset import export_webdataset

    monkeypatch.chdir(tmp_path)
    store = tmp_path / "s.seqstore"
    with seqstore.create(store, {"tokens": seqstore.Field("int32", (None,))}) as w:
        for i in range(3):
            w.append({"tokens": np.arange(i + 1, dtype=np.int32)}, id=f"k{i}")
    {"parquet": lambda: pq.write_table(pa.table({"tokens": pa.array([[1, 2], [3]], pa.list_(pa.int32()))}),
                                       tmp_path / made),
     "webdataset": lambda: export_webdataset(store, tmp_path / "wds"),
     "megatron": lambda: export_megatron(store, tmp_path / made),
     "returnn-hdf": lambda: export_hdf(store, tmp_path / made)}[source]()
    from seqstore.cli import main

    assert main(["convert", "--from", source, f"file://{tmp_path / made}", str(tmp_path / "out"), "-q"]) == 0, \
        capsys.readouterr().err
    assert len(seqstore.open(tmp_path / "out")) in (2, 3)


@pytest.mark.parametrize("source", ["hf", "lhotse"])
def test_convert_takes_hf_and_lhotse_sources_given_as_file_urls(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                source: str) -> None:
    """As for the other formats: a ``datasets`` directory or a Lhotse manifest given as a ``file://`` URL
    was 'no such directory' / 'no such Lhotse manifest'. It is its path."""
    if source == "hf":
        datasets = pytest.importorskip("datasets")
        made = tmp_path / "hfd"
        datasets.Dataset.from_dict({"x": [[1, 2], [3]]}).save_to_disk(str(made))
    else:
        lhotse = pytest.importorskip("lhotse")
        made = tmp_path / "cuts.jsonl.gz"
        lhotse.CutSet.from_cuts([lhotse.MonoCut(id=f"c{i}", start=0, duration=1.0, channel=0, supervisions=[
            lhotse.SupervisionSegment(id=f"s{i}", recording_id="r", start=0, duration=1, text="hi")])
            for i in range(2)]).to_file(made)
    from seqstore.cli import main

    assert main(["convert", "--from", source, f"file://{made}", str(tmp_path / "out"), "-q"]) == 0, \
        capsys.readouterr().err
    assert len(seqstore.open(tmp_path / "out")) == 2


def test_an_interrupt_once_an_existing_out_is_replaced_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``convert --overwrite`` interrupted once the new store had replaced OUT said 'nothing was written',
    while the old store was gone and the new one in its place. The line says OUT holds the new store;
    interrupted before, the old store is kept and the line is as it was."""
    from seqstore.cli import main
    from seqstore.interop._common import new_store

    out = tmp_path / "s.seqstore"
    schema = {"x": seqstore.Field("int32", (None,))}
    with seqstore.create(out, schema) as w:
        w.append({"x": np.zeros(2, np.int32)})

    def run(args: argparse.Namespace, progress: commands.Progress) -> None:
        if args.paths[0] == "after":
            new_store(out, schema, lambda w: [w.append({"x": np.ones(3, np.int32)}) for _ in range(3)],
                      overwrite=True)
        raise KeyboardInterrupt

    monkeypatch.setitem(commands.SOURCES, "ctrl-c", commands.Converter("interrupted", run))
    assert main(["convert", "--from", "ctrl-c", "before", str(out), "--overwrite", "-q"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "seqstore: interrupted; nothing was written"
    assert len(seqstore.open(out)) == 1
    assert main(["convert", "--from", "ctrl-c", "after", str(out), "--overwrite", "-q"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (f"seqstore: interrupted; {out} holds the new output (it "
                                                        "replaced what was there)")
    assert len(seqstore.open(out)) == 3
