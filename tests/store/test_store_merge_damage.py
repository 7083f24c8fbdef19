"""A committed shard whose own id index is damaged (bit rot, a bad disk) must not stop the store from being
appended to: merged index runs are an accelerator only (docs/format.md, section 6)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
from seqstore.format.manifest import Manifest
from seqstore.store.verify import verify


def test_a_damaged_shard_index_skips_the_merge_instead_of_failing_every_commit(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The merge read the shard's index, found it unsorted and raised a ValueError naming no file; the shard
    had been renamed into the store already, so the writer was left failed, its records lost, and every later
    commit of any writer failed the same way. Now the merge is skipped with a warning naming the file and the
    commit goes through; verify() reports the damage."""
    root = tmp_path / "s"
    with ss.create(root, {"v": ss.Field("int64")}, max_shard_records=2) as w:
        for i in range(14):  # 7 shards: the 8th commit merges shards 0..7 into a run
            w.append({"v": i}, id=f"id{i}")
    path = root / "shard-000002" / "_ids.hash.npy"
    h = np.load(path)
    with open(path, "r+b") as f:  # reversed: no longer sorted
        f.seek(f.seek(0, 2) - h.nbytes)
        f.write(h[::-1].tobytes())
    with caplog.at_level(logging.WARNING, logger="seqstore"):
        with ss.append_to(root, max_shard_records=2) as w:
            for i in range(14, 18):
                w.append({"v": i}, id=f"id{i}")
    assert str(path) in caplog.text
    st = ss.open(root)
    assert len(st) == 18 and st.get_batch(np.arange(18), fields=["v"])["v"].tolist() == list(range(18))
    assert Manifest.load(root).index_runs == []
    assert st.index("id17") == 17 and st.index("id1") == 1
    assert any(str(path) in p for p in verify(root))
