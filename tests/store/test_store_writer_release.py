"""Releasing a writer (close/abort) that is interrupted part way: the writer must not claim to be closed
while it still holds its workspace and the lock on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from store_testlib import fds_under, workspaces

import seqstore as ss


def _interrupt_once(monkeypatch: pytest.MonkeyPatch, pool: Any) -> None:
    """``pool.shutdown`` raises KeyboardInterrupt once (Ctrl-C while close waits for the checksum thread)."""
    real = pool.shutdown

    def shutdown(*args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(pool, "shutdown", real)
        raise KeyboardInterrupt

    monkeypatch.setattr(pool, "shutdown", shutdown)


@pytest.mark.parametrize("how", ["close", "abort"])
def test_an_interrupted_release_can_be_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Ctrl-C while close()/abort() releases the writer used to leave it marked closed with its workspace
    and the flock on it still there (a second close/abort did nothing): now the writer is not closed
    until its release is done, and calling close/abort again finishes it."""
    root = tmp_path / "s"
    w = ss.create(root, {"x": ss.Field("int64", ())})
    w.append_batch({"x": np.arange(5)})
    if how == "abort":
        w.commit()
        w.append_batch({"x": np.arange(3)})
    _interrupt_once(monkeypatch, w._pool)
    with pytest.raises(KeyboardInterrupt):
        getattr(w, how)()
    getattr(w, how)()
    assert fds_under(root) == [] and workspaces(root) == []
    with pytest.raises(ss.SeqstoreError, match="closed"):
        w.append({"x": 1})
    assert len(ss.open(root)) == 5


def test_a_part_writers_interrupted_finish_is_released_by_finishing_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Ctrl-C while PartWriter.finish() released the writer (after part.json was written): calling finish()
    again returned the part but left the writer holding its task directory's lock, and close() then warned
    that the finished part's records were discarded. Now the second finish() completes the release."""
    from seqstore.store.parts import PartWriter, commit_parts, prepare_store

    root = tmp_path / "s"
    prepare_store(root, {"x": ss.Field("int64", ())})
    w = PartWriter(root, job="j", task="a")
    w.append_batch({"x": np.arange(4)})
    _interrupt_once(monkeypatch, w._pool)
    with pytest.raises(KeyboardInterrupt):
        w.finish()
    part = w.finish()
    w.close()
    assert "discarded" not in caplog.text
    assert fds_under(root) == []
    assert commit_parts(root, [part]) == 4 and len(ss.open(root)) == 4
