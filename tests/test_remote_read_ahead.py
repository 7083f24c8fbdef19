"""A remote store's read-ahead is advice: ``Store.iter_batches`` asks for the reads of later batches (and
of runs of batches) before they are due, and a read that fails then is raised where its own batch is
due, after every batch before it was handed out, naming the shard as always."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.proxy import FaultProxy
from support.s3 import MotoS3

import seqstore as ss
from seqstore.schema import Field

pytestmark = pytest.mark.timeout(300)

N, SHARD, BATCH = 2400, 100, 50  # 24 shards, 48 batches in order


def _store(path: Path) -> Path:
    lens = np.arange(N) % 5 + 1
    x = np.repeat(np.arange(N), lens).astype(np.float32)[:, None]
    with ss.create(path, {"x": Field("float32", (None, 1)), "k": Field("int64")}, max_shard_records=SHARD) as w:
        w.append_batch({"x": (x, lens), "k": np.arange(N, dtype=np.int64)})
    return path


def _batches() -> Any:
    return (np.arange(a, a + BATCH, dtype=np.int64) for a in range(0, N, BATCH))


@pytest.mark.parametrize("options", [{}, {"read_once": "true"}], ids=["cached", "read_once"])
@pytest.mark.parametrize("fields", [None, "k", "x"], ids=["all", "fixed", "ragged"])
def test_a_refused_shard_raises_at_its_first_batch_after_the_batches_before_it(
        moto_s3: MotoS3, s3_bucket: str, s3_proxy: FaultProxy, tmp_path: Path, options: dict[str, Any],
        fields: str | None) -> None:
    url = moto_s3.upload_dir(_store(tmp_path / "s.seqstore"), s3_bucket, "a/s.seqstore")
    opts = moto_s3.storage_options(s3_proxy.url, timeout=5, connect_timeout=2, **options)
    store = ss.open(url, storage_options=opts, cache_dir=tmp_path / "c")
    s3_proxy.forbid(path="shard-000012")
    got = []
    with pytest.raises(ss.errors.SeqstoreError, match="shard-000012"):
        for batch in store.iter_batches(_batches(), fields=fields):
            got.append(int(batch["k"][0]) if "k" in batch else int(batch["x"][0][0, 0]))
    assert got == list(range(0, 1200, BATCH))


@pytest.mark.parametrize("fields", [None, "k", "x"], ids=["all", "fixed", "ragged"])
def test_read_once_a_run_with_a_refused_range_hands_out_its_batches_before_it(
        moto_s3: MotoS3, s3_bucket: str, s3_proxy: FaultProxy, tmp_path: Path, fields: str | None) -> None:
    """Every shard mapped first, so only the data ranges of shard 12 are refused: the run of 16 batches
    that holds its first batch (batches 16-31, records 800-1599) fails as one fetch, and its batches before
    shard 12 are still handed out, each read by itself, and the first that needs shard 12 raises."""
    url = moto_s3.upload_dir(_store(tmp_path / "s.seqstore"), s3_bucket, "a/s.seqstore")
    opts = moto_s3.storage_options(s3_proxy.url, timeout=5, connect_timeout=2, read_once="true")
    store = ss.open(url, storage_options=opts, cache_dir=tmp_path / "c")
    store.get_batch(np.arange(0, N, SHARD), fields=fields)
    s3_proxy.forbid(path="shard-000012")
    got = []
    with pytest.raises(ss.errors.SeqstoreError, match="shard-000012"):
        for batch in store.iter_batches(_batches(), fields=fields):
            got.append(int(batch["k"][0]) if "k" in batch else int(batch["x"][0][0, 0]))
    assert got == list(range(0, 1200, BATCH))


def test_a_dataset_without_iter_batches_of_its_own_raises_at_the_refused_shards_batch(
        moto_s3: MotoS3, s3_bucket: str, s3_proxy: FaultProxy, tmp_path: Path) -> None:
    """Dataset.iter_batches (a slice of a store's dataset here) asks for the next 2 batches' reads ahead
    (``prefetch``): that advice failing is not the error of the batch handed out before them."""
    from seqstore.data import SliceDataset, StoreDataset

    url = moto_s3.upload_dir(_store(tmp_path / "s.seqstore"), s3_bucket, "a/s.seqstore")
    opts = moto_s3.storage_options(s3_proxy.url, timeout=5, connect_timeout=2)
    ds = SliceDataset(StoreDataset(ss.open(url, storage_options=opts, cache_dir=tmp_path / "c")), 0, N)
    s3_proxy.forbid(path="shard-000012")
    got = []
    with pytest.raises(ss.errors.SeqstoreError, match="shard-000012"):
        for batch in ds.iter_batches(_batches()):
            got.append(int(batch["k"][0]))
    assert got == list(range(0, 1200, BATCH))
