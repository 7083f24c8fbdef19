"""The one importer driver: the keywords every importer shares are read and checked in one place, the
same way for every format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from seqstore.interop import driver
from seqstore.interop.megatron import import_megatron
from seqstore.interop.returnn import import_hdf
from seqstore.interop.webdataset import import_webdataset


@pytest.mark.parametrize("importer", [import_hdf, import_megatron, import_webdataset])
def test_common_keywords_are_checked_before_the_sources_are_read(importer: Any, tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"  # never read: the keywords are refused first
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument 'chunk_byte'"):
        importer(missing, tmp_path / "o", chunk_byte=1)
    with pytest.raises(ValueError, match="storage_options are for URLs"):
        importer(missing, tmp_path / "o", storage_options={"a": "b"})
    with pytest.raises(ValueError, match="chunk_bytes must be positive"):
        importer(missing, tmp_path / "o", chunk_bytes=0)
    with pytest.raises(ValueError, match="workers must be at least 1"):
        importer(missing, tmp_path / "o", workers=0)
    with pytest.raises(ValueError, match="no sources given"):
        importer([], tmp_path / "o")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["chunk_bytes", "shard_bytes", "workers"])
def test_size_and_worker_keywords_must_be_integers(name: str) -> None:
    for bad in (True, 2.5, "4"):
        with pytest.raises(ValueError, match=f"import_x: {name} must be an integer, got {bad!r}"):
            driver.options("import_x", "out", {name: bad})
    with pytest.raises(ValueError, match=f"{name} must be (positive|at least 1), got 0"):
        driver.options("import_x", "out", {name: 0})
    assert getattr(driver.options("import_x", "out", {name: np.int64(3)}), name) == 3


def test_options_defaults() -> None:
    opts = driver.options("import_x", "out", {})
    assert (opts.chunk_bytes, opts.shard_bytes, opts.overwrite, opts.workers) == (64 << 20, 1 << 30, False, 1)
    assert opts.progress is None and opts.storage_options is None
    assert driver.options("import_x", "s3://b/o", {"storage_options": {"k": "v"}, "workers": 3}).workers == 3
