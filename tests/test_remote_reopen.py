"""A data file re-uploaded (other bytes, same size) under an unchanged manifest: the store open when it
changed raises StaleStoreError, whose advice, reopening the store, then works on the same node cache (the
sizes and ETags the node saved for the object are not taken for the object as it now is)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.s3 import MotoS3

pytest.importorskip("seqstore.io.remote")

import seqstore as ss  # noqa: E402
from seqstore.errors import StaleStoreError  # noqa: E402

pytestmark = pytest.mark.timeout(120)
ROWS = 2000


def _local(path: Path, add: float) -> Path:
    with ss.create(path, {"v": ss.Field("float32", (256,))}) as w:
        w.append_batch({"v": np.arange(ROWS * 256, dtype=np.float32).reshape(ROWS, 256) + add})
    return path


@pytest.mark.parametrize("read_once", [False, True])
def test_reopen_after_a_data_file_was_replaced_reads_the_new_object(moto_s3: MotoS3, s3_bucket: str,
                                                                     tmp_path: Path, read_once: bool) -> None:
    a = _local(tmp_path / "a.seqstore", 0.0)
    b = _local(tmp_path / "b.seqstore", 0.5)  # the same files and sizes, other values
    url = moto_s3.upload_dir(a, s3_bucket, "re/main.seqstore")
    opts = moto_s3.storage_options(max_retries=1, read_once=read_once)
    cache = tmp_path / "cache"
    old = ss.open(url, storage_options=opts, cache_dir=cache)
    assert old.get_batch([0])["v"][0, 0] == 0.0  # the shard is prepared, its head pages in the cache
    (rel,) = [p.relative_to(b).as_posix() for p in b.rglob("v.npy")]
    moto_s3.put(s3_bucket, f"re/main.seqstore/{rel}", (b / rel).read_bytes())  # the manifest stays

    def tail(store: ss.Store) -> float:
        if read_once:
            return float(next(iter(store.iter_batches([np.arange(ROWS - 8, ROWS)])))["v"][-1, -1])
        return float(store.get_batch([ROWS - 1])["v"][0, -1])

    with pytest.raises(StaleStoreError, match="v.npy"):
        tail(old)
    for _ in range(2):  # the advice works, and keeps working
        new = ss.open(url, storage_options=opts, cache_dir=cache)
        assert tail(new) == ROWS * 256 - 1 + 0.5
        np.testing.assert_array_equal(new.get_batch([0])["v"][0], np.arange(256, dtype=np.float32) + 0.5)
    with pytest.raises(StaleStoreError):  # the store opened before the change still refuses
        tail(old)

