"""The `seqstore` command: info, verify (clean and damaged), demo at a small size."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
from seqstore.cli import main


@pytest.fixture()
def small_store(tmp_path: Path) -> Path:
    path = tmp_path / "s.seqstore"
    schema = {"x": ss.Field("float32", (None, 3)), "y": ss.Field("int16")}
    with ss.create(path, schema, max_shard_records=40) as w:
        for i in range(100):
            w.append({"x": np.full((i % 9, 3), i), "y": i}, id=f"r{i}")
    return path


def test_info_prints_schema_counts_and_histogram(small_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(small_store), "-q"]) == 0
    out = capsys.readouterr().out
    assert "records   100" in out
    assert "shards    3" in out
    assert "ragged" in out and "fixed" in out
    assert "rows per record: min 0, mean 4.0, max 8; total 396" in out
    hist = [line for line in out.splitlines() if line.strip().startswith("[")]
    assert len(hist) == 9  # one bin per length 0..8
    assert [int(line.split()[-1]) for line in hist] == [12] + [11] * 8


def test_verify_ok_and_damaged(small_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(small_store), "-q"]) == 0
    assert "OK" in capsys.readouterr().out
    data = small_store / "shard-000001" / "x.npy"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF  # flip one data bit: same size, so only the checksum can tell
    data.write_bytes(bytes(raw))
    assert main(["verify", str(small_store), "-q"]) == 1
    err = capsys.readouterr().err
    assert "x.npy" in err and "CRC-32" in err


def test_verify_reports_decreasing_offsets(small_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    off_path = small_store / "shard-000000" / "x.offsets.npy"
    off = np.load(off_path).copy()
    off[5], off[6] = off[6], off[5] - 1 if off[5] > 0 else 0
    header = off_path.read_bytes()[:128]
    off_path.write_bytes(header + off.tobytes())
    assert main(["verify", str(small_store), "-q"]) == 1
    assert "x.offsets.npy" in capsys.readouterr().err


def test_info_on_a_non_store_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tmp_path)]) == 2
    assert "not a seqstore store" in capsys.readouterr().err


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "seqstore.cli", "demo", "--records", "3000", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for needle in ("write throughput", "open + first record", "store[i]", "one epoch", "laplace:.1000: read"):
        assert needle in proc.stdout
    store = ss.open(tmp_path / "corpus.seqstore")
    assert len(store) == 3000
    lengths = np.load(tmp_path / "features.lengths.npy")
    assert lengths.tolist() == np.asarray(store.lengths("features")).tolist()
    assert 10 <= lengths.min() and lengths.max() <= 200


def test_demo_keep_writes_a_corpus_of_another_dim_anew(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``demo --keep --dim 3`` over a corpus of dim 2 reused it (the same --records) while printing
    '3 float16 features', so every figure was about another corpus. A corpus of another schema is
    written anew."""
    from seqstore.demo import generate_batch

    corpus = tmp_path / "corpus.seqstore"  # the corpus of ``demo --records 3 --dim 2``
    schema = {"features": ss.Field("float16", (None, 2)), "labels": ss.Field("int32", (None,)),
              "speaker": ss.Field("int32")}
    with ss.create(corpus, schema) as w:
        columns, ids = generate_batch(np.random.default_rng(0), 0, 3, 2)
        w.append_batch(columns, ids=ids)
    assert main(["demo", "--records", "3", "--dim", "3", "--out", str(tmp_path), "--keep"]) == 0
    assert "reusing the existing corpus" not in capsys.readouterr().out
    assert ss.open(corpus).schema["features"].shape == (None, 3)


@pytest.mark.parametrize("records", ["0", "-3"])
def test_demo_needs_at_least_one_record(tmp_path: Path, capsys: pytest.CaptureFixture[str], records: str) -> None:
    """``demo --records 0`` is a usage error before anything is written, not an IndexError after the
    empty corpus was written."""
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--records", records, "--out", str(tmp_path / "d")])
    assert exc.value.code == 2
    assert "--records" in capsys.readouterr().err and not (tmp_path / "d").exists()


@pytest.mark.parametrize("records", ["1", "2"])
def test_demo_of_fewer_than_three_records_is_refused_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              records: str) -> None:
    """``demo --records 1`` wrote the corpus, printed its figures and ended in a traceback (an IndexError
    from an empty sub-epoch order; with 2 records, a ValueError of the combined dataset, which splits the
    corpus into three parts). It is one line, exit 2, before anything is written."""
    assert main(["demo", "--records", records, "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "at least 3 records" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "d").exists()


def test_demo_interrupted_while_writing_leaves_no_partial_corpus(tmp_path: Path) -> None:
    """Ctrl-C while the demo writes its corpus: the command said 'nothing was written' but left the
    committed part of the corpus (and the --out directory it made) behind."""
    out = tmp_path / "d"
    proc = subprocess.Popen([sys.executable, "-m", "seqstore.cli", "demo", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    seen = b""
    while b"write:" not in seen and proc.poll() is None:
        seen += os.read(proc.stderr.fileno(), 1 << 16)
    time.sleep(1.0)  # some of the 1,000,000 records are written (seconds more to go)
    proc.send_signal(signal.SIGINT)
    err = (seen + proc.stderr.read()).decode(errors="replace")
    assert proc.wait(timeout=120) == 130, err
    assert "seqstore: interrupted; nothing was written" in err and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("option, value", [("--seed", "-1"), ("--dim", "-2"), ("--dim", "0")])
def test_demo_negative_seed_or_dim_is_refused_naming_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                option: str, value: str) -> None:
    """``demo --seed -1`` ended in numpy's traceback ('expected non-negative integer'); ``--dim -2`` in an
    error about a 'field shape' the user never gave. Each is one line naming the option, nothing written."""
    try:
        status = main(["demo", "--records", "3", option, value, "--out", str(tmp_path / "d")])
    except SystemExit as exc:  # argparse's usage error
        status = int(exc.code or 0)
    assert status == 2
    err = capsys.readouterr().err
    assert option in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def test_demo_interrupted_after_its_write_says_the_corpus_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C once the corpus is written (while it is read back) keeps the corpus, complete, and the
    line says so instead of "nothing was written"."""
    import seqstore.demo as demo

    def ctrl_c(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "open_store", ctrl_c)  # (the first step after the write)
    assert main(["demo", "--records", "3", "--dim", "2", "--out", str(tmp_path)]) == 130
    corpus = tmp_path / "corpus.seqstore"
    assert capsys.readouterr().err.splitlines()[-1] == f"seqstore: interrupted; the corpus stays in {corpus}"
    assert len(ss.open(corpus)) == 3


def test_demo_out_as_a_file_url_is_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``demo --out file:///x`` wrote under a directory named ``file:`` in the working directory (the URL taken
    as a relative path), as no other command takes a file:// URL; a URL of object storage is refused (one
    line, exit 2) before anything is written, rather than made a local directory named ``s3:``."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--records", "3", "--out", f"file://{tmp_path}/d"]) == 0
    assert len(ss.open(tmp_path / "d" / "corpus.seqstore")) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    capsys.readouterr()
    assert main(["demo", "--records", "3", "--out", "s3://bucket/demo"]) == 2
    assert "is a URL" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
