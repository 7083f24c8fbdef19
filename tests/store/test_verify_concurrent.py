"""verify() of a store that a writer appends to meanwhile: what a commit since verify read the manifest
changed legitimately is no problem of the store."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import seqstore as ss
from seqstore.format.manifest import Manifest
from seqstore.store import verify as verify_mod
from seqstore.store.verify import verify


@pytest.mark.timeout(300)
def test_verify_during_a_merge_that_supersedes_runs_reports_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit between verify's reading of the manifest and its check of the index runs merged the runs
    into a bigger one and deleted their files (as docs/format.md section 6 says a commit may): verify
    reported the intact store's runs as missing files."""
    root = tmp_path / "s"
    with ss.create(root, {"v": ss.Field("int32")}, max_shard_records=1) as w:
        for i in range(63):  # seven level-1 runs; the 64th shard merges them into one level-2 run
            w.append({"v": i}, id=f"id{i}")
    assert len(Manifest.load(root).index_runs) == 7
    real = verify_mod._check_index_run
    appended: list[int] = []

    def commit_first(*args: Any) -> list[str]:
        if not appended:
            appended.append(1)
            with ss.append_to(root) as w2:
                w2.append({"v": 63}, id="id63")
        return real(*args)

    monkeypatch.setattr(verify_mod, "_check_index_run", commit_first)
    assert verify(root) == []
    assert appended and [r.level for r in Manifest.load(root).index_runs] == [2]
    monkeypatch.undo()
    assert verify(root) == []
    shutil.rmtree(root)
