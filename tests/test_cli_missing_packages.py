"""The ``seqstore`` command when an optional package it needs is missing: one line naming the package and the
extra to install, exit status 2, no traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from seqstore.cli import EXIT_STATUSES, main


@pytest.mark.parametrize(("module", "source", "extra"), [("lhotse", "lhotse", "lhotse"),
                                                         ("h5py", "returnn-hdf", "hdf5"),
                                                         ("pyarrow", "parquet", "arrow")])
def test_a_missing_optional_package_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str], module: str, source: str,
                                                extra: str) -> None:
    """``seqstore convert --from lhotse`` without Lhotse installed (h5py, pyarrow alike) ended in an
    ImportError traceback: it is one line naming the package and ``pip install 'seqstore[EXTRA]'``."""
    monkeypatch.setitem(sys.modules, module, None)  # (``import lhotse`` raises ImportError, as when not installed)
    src = tmp_path / "input.file"
    src.write_bytes(b"")
    assert main(["convert", "--from", source, str(src), str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error:") and len(err.splitlines()) == 1, err
    assert module in err and f"pip install 'seqstore[{extra}]'" in err, err
    assert 2 in EXIT_STATUSES and not (tmp_path / "out").exists()
