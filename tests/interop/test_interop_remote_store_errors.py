"""Errors of the exporters about a remote store name its URL, not the local cache directory its bytes
are read through (which the user never named)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from interop_testlib import make_store

import seqstore
from seqstore.interop.megatron import export_megatron
from seqstore.interop.webdataset import export_webdataset


def _hf(st: seqstore.Store, out: Path) -> Any:
    pytest.importorskip("datasets")
    from seqstore.interop.hf_export import export_hf

    return export_hf(st, out, fields=["nope"])


def _hdf(st: seqstore.Store, out: Path) -> Any:
    pytest.importorskip("h5py")
    from seqstore.interop.returnn import export_hdf

    return export_hdf(st, out, fields=["nope"])


EXPORTS: dict[str, Callable[[seqstore.Store, Path], Any]] = {
    "megatron": lambda st, out: export_megatron(st, out, field="nope"),
    "megatron-documents": lambda st, out: export_megatron(st, out, documents="nope"),
    "webdataset": lambda st, out: export_webdataset(st, out, fields=["nope"]),
    "webdataset-keys": lambda st, out: export_webdataset(st, out, keys="ids"),
    "hf": _hf,
    "hdf": _hdf,
}


@pytest.mark.parametrize("how", list(EXPORTS))
def test_export_error_names_the_remote_url(tmp_path: Path, moto_s3: Any, s3_bucket: str, how: str) -> None:
    make_store(tmp_path / "local.seqstore", n=6, ids=how != "webdataset-keys")
    url = moto_s3.upload_dir(tmp_path / "local.seqstore", s3_bucket, "s.seqstore")
    cache = tmp_path / "node-cache"
    st = seqstore.open(url, storage_options=moto_s3.storage_options(), cache_dir=cache)
    with pytest.raises((KeyError, seqstore.SchemaError)) as e:
        EXPORTS[how](st, tmp_path / "out")
    assert url in str(e.value) and str(cache) not in str(e.value)
