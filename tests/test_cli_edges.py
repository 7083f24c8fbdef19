"""The ``seqstore`` command on odd arguments: one line and exit status 2 for a user's mistake, no traceback."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
from seqstore.cli import main


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    path = tmp_path / "s.seqstore"
    with ss.create(path, {"x": ss.Field("float32", (None, 2))}) as w:
        for i in range(5):
            w.append({"x": np.ones((i, 2))}, id=f"r{i}")
    return path


def test_copy_from_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``seqstore copy FILE DST`` printed a NotADirectoryError traceback (exit 1)."""
    src = tmp_path / "notes.txt"
    src.write_text("hi")
    assert main(["copy", str(src), str(tmp_path / "dst"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error:") and "notes.txt" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("argv", [["info", "-q"], ["verify", "-q"]])
def test_a_reader_that_stops_early_is_no_traceback(store: Path, argv: list[str]) -> None:
    """``seqstore info STORE | head -1``: the reader closes the pipe; the command ended with a
    BrokenPipeError traceback (or Python's 'Exception ignored' at exit). It stops quietly."""
    for unbuffered in (False, True):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        if unbuffered:
            env["PYTHONUNBUFFERED"] = "1"
        proc = subprocess.Popen([sys.executable, "-m", "seqstore.cli", *argv, str(store)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # before the command writes anything
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141, err
        assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize("target", ["hf", "webdataset", "returnn-hdf", "megatron"])
def test_export_to_a_url_is_refused(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    """``export`` writes local files only; an OUT of s3://b/x wrote a local directory named 's3:'."""
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--to", target, str(store), "s3://bucket/out", "-q"]) == 2
    err = capsys.readouterr().err
    assert "s3://bucket/out" in err and "URL" in err, err
    assert not (tmp_path / "s3:").exists()


def test_demo_out_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``demo --out FILE`` ended in a FileExistsError traceback (exit 1)."""
    out = tmp_path / "notes.txt"
    out.write_text("hi")
    assert main(["demo", "--records", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error:") and "notes.txt" in err and len(err.splitlines()) == 1
    assert out.read_text() == "hi"


def test_a_write_that_fails_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An OSError that is not about the paths given (a full disk; here the file-size limit, EFBIG)
    during ``export`` ended in a Python traceback. It is one line naming OUT, exit status 1, and the
    export leaves nothing behind."""
    src = tmp_path / "t.seqstore"
    with ss.create(src, {"tokens": ss.Field("int32", (None,))}) as w:
        for _ in range(8):
            w.append({"tokens": np.arange(4096, dtype=np.int32)})
    out = tmp_path / "out"
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (the write fails instead of killing us)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 10, old_limit[1]))
    try:
        status = main(["export", "--to", "megatron", str(src), str(out), "-q"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    err = capsys.readouterr().err
    assert status == 1, err
    assert err.startswith("seqstore: error:") and len(err.splitlines()) == 1 and str(out) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.seqstore"]


def test_copy_options_for_a_local_end_name_the_option(store: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``seqstore copy DIR DST --src-option K=V``: the library's ValueError was printed as it was
    ('source DIR: storage options were given for a local path'), naming no option of the command."""
    for flag, argv in (("--src-option", [str(store), str(tmp_path / "dst")]),
                       ("--dst-option", [str(store), str(tmp_path / "dst")])):
        assert main(["copy", *argv, flag, "endpoint=http://127.0.0.1:9", "-q"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("seqstore: error:") and flag in err and len(err.splitlines()) == 1, err
        assert not (tmp_path / "dst").exists()


def test_export_refuses_storage_options_for_a_local_store(store: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``seqstore export STORE OUT -o KEY=VALUE`` with a local STORE ignored the option silently (a
    local store takes none), where ``info`` and ``verify`` refuse it; it is refused before anything is
    written."""
    out = tmp_path / "out"
    assert main(["export", "--to", "webdataset", str(store), str(out), "-o", "endpoint=http://127.0.0.1:9",
                 "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error:") and "-o options are for URLs" in err and str(store) in err, err
    assert not out.exists()


def test_copy_interrupted_into_an_existing_directory_says_what_stays(store: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A destination that existed keeps the shards copied before Ctrl-C (a rerun goes on from them), but
    the line said 'nothing was written'; it says what stays where."""
    import seqstore.cli as cli

    def copy_then_ctrl_c(*args: object, **kwargs: object) -> None:
        real_copy(*args, **kwargs)
        raise KeyboardInterrupt

    real_copy = cli.copy
    monkeypatch.setattr(cli, "copy", copy_then_ctrl_c)
    dst = tmp_path / "dst"
    dst.mkdir()
    assert main(["copy", str(store), str(dst), "-q"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (f"seqstore: interrupted; what was copied so far stays in {dst} "
                                                        "(a rerun copies the rest)")
    assert len(ss.open(dst)) == 5


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_main_called_as_a_function_gives_the_signal_handlers_back(store: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   signum: int) -> None:
    """A program that calls ``seqstore.cli.main([...])`` and whose command was interrupted by a signal could
    no longer be stopped: ``main`` left SIGINT and SIGTERM ignored (meant for the console command, which
    exits right after). ``main`` gives the caller's handlers back on every path."""
    import seqstore.cli as cli

    def signalled(*args: object, **kwargs: object) -> None:
        signal.raise_signal(signum)

    monkeypatch.setattr(cli, "copy", signalled)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert main(["copy", str(store), str(tmp_path / "dst"), "-q"]) == 130
        assert "interrupted" in capsys.readouterr().err
        assert {s: signal.getsignal(s) for s in before} == before
    finally:  # (the rest of the session keeps its handlers should this fail)
        for s, handler in before.items():
            signal.signal(s, handler)


def test_a_closed_pipe_leaves_no_descriptor_open(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a reader closed the pipe, ``main`` points stdout at /dev/null so that nothing more fails on
    it, but left the descriptor it opened for that open: one more per call in a program that calls it."""
    import io

    r, w = os.pipe()
    os.close(r)
    out = io.TextIOWrapper(io.FileIO(w, "w"), write_through=False)
    monkeypatch.setattr(sys, "stdout", out)
    before = len(os.listdir("/proc/self/fd"))
    try:
        assert main(["info", str(store), "-q"]) == 141
        # (not ==: an object of an earlier test collected meanwhile may close descriptors of its own)
        assert len(os.listdir("/proc/self/fd")) <= before
    finally:
        monkeypatch.undo()
        with contextlib.suppress(OSError):
            out.close()


@pytest.mark.parametrize("target, out", [("returnn-hdf", "manifest.json"), ("returnn-hdf", "new.hdf"),
                                         ("webdataset", "."), ("megatron", "shard-000000/x")])
def test_export_into_the_store_it_reads_is_refused(store: Path, capsys: pytest.CaptureFixture[str], target: str,
                                                    out: str) -> None:
    """``seqstore export --to returnn-hdf STORE STORE/manifest.json --overwrite`` replaced the store's
    manifest with the HDF file: the store was lost (a shard's file the same way). An OUT inside the
    store it exports (or the store itself) is refused before anything is written, as ``copy`` refuses
    a destination inside its source."""
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    assert main(["export", "--to", target, str(store), str(store / out), "-q", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error:") and "inside the store" in err and len(err.splitlines()) == 1, err
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before
    assert len(ss.open(store)) == 5


@pytest.mark.parametrize("argv", [["convert", "--from", "parquet", "{src}", "simplecache::s3://b/x"],
                                  ["export", "--to", "webdataset", "{store}", "simplecache::s3://b/w"],
                                  ["copy", "{store}", "filecache::s3://b/c"],
                                  ["info", "simplecache::s3://b/x"]])
def test_a_chained_url_is_refused(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """An fsspec chained URL (``simplecache::s3://b/x``) was taken as a local path: convert, export and copy
    wrote the data into a local directory ``simplecache::s3:/b/x`` and reported success. It is refused
    before anything is written, one line naming it."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"t": pa.array([[1, 2], [3]], pa.list_(pa.int64()))}), tmp_path / "t.parquet")
    before = sorted(os.listdir(tmp_path))
    assert main([a.format(src=tmp_path / "t.parquet", store=store) for a in argv] + ["-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error:") and len(err.splitlines()) == 1, err
    assert "::s3://b/" in err and "chained" in err, err
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("existed", [False, True])
def test_copy_interrupted_into_a_file_url(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str], existed: bool) -> None:
    """``seqstore copy SRC file:///abs/DST`` interrupted took DST as the relative path ``file:/abs/DST``:
    a new DST was left behind (while the line said nothing was written), an existing one was said to be
    removed. A ``file://`` DST is its path: a new one is removed, an existing one keeps what was copied."""
    import seqstore.cli as cli

    def copy_then_ctrl_c(*args: object, **kwargs: object) -> None:
        real_copy(*args, **kwargs)
        raise KeyboardInterrupt

    real_copy = cli.copy
    monkeypatch.setattr(cli, "copy", copy_then_ctrl_c)
    monkeypatch.chdir(tmp_path)
    dst = tmp_path / "dst"
    if existed:
        dst.mkdir()
    assert main(["copy", str(store), f"file://{dst}", "-q"]) == 130
    last = capsys.readouterr().err.splitlines()[-1]
    assert dst.exists() == existed and not (tmp_path / "file:").exists()
    assert ("what was copied so far stays" in last) == existed, last
