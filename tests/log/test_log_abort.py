"""Logger.abort(): a user who gives up on a commit that keeps failing (close() raised LoggerCommitError)
releases the logger cleanly: the held records are dropped, the background thread stops, the writer's
workspace goes, committed records stay."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
from seqstore.errors import SeqstoreError
from seqstore.log import Logger, LoggerCommitError
from seqstore.store.verify import verify


def _manifest_blocker(root: Path) -> Path:
    """A directory in the way of this process's next manifest save (the commit fails, records intact)."""
    blocker = root / "_tmp" / f".manifest.json.tmp-{os.getpid()}"
    blocker.mkdir()
    return blocker


def _threads(lg: Logger) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t is lg._thread]


def test_abort_after_a_failed_close_drops_the_held_records_and_releases_everything(scratch: Path) -> None:
    """After close() raised LoggerCommitError there was no way to give up: no abort(), the background
    thread ran on and the writer's workspace stayed until the interpreter exited. abort() now drops the
    held records, stops the thread and removes the workspace; the logger is closed without error."""
    root = scratch / "log"
    g = np.ones((2, 4), np.float32)
    lg = Logger(root, flush_bytes=4096, commit_every_s=60)
    lg.log(["a", "b"], {"g": g})
    lg.flush()
    blocker = _manifest_blocker(root)
    lg.log(["c", "d"], {"g": g})
    with pytest.raises(LoggerCommitError):
        lg.close()
    lg.abort()
    assert _threads(lg) == []
    assert [p.name for p in (root / "_tmp").iterdir()] == [blocker.name]  # the writer's workspace is gone
    lg.close()  # closed: nothing more to do, no error
    lg.abort()
    assert lg._commit_at_exit("exit") is None
    with pytest.raises(SeqstoreError, match="logger is closed"):
        lg.log(["e"], {"g": g[:1]})
    blocker.rmdir()
    st = ss.open(root)
    assert [st.id(i) for i in range(len(st))] == ["a", "b"] and verify(root) == []
    with Logger(root, commit_every_s=60) as again:  # the store takes a new logger
        again.log(["c"], {"g": g[:1]})
    assert len(ss.open(root)) == 3


def test_abort_of_a_working_logger_commits_nothing_more(scratch: Path) -> None:
    """abort() on a logger with records in its buffers (nothing failed): they are discarded, not committed."""
    root = scratch / "log"
    g = np.ones((2, 4), np.float32)
    lg = Logger(root, flush_bytes=4096, commit_every_s=60)
    lg.log(["a", "b"], {"g": g})
    lg.flush()
    lg.log(["c", "d"], {"g": g})
    lg.abort()
    assert _threads(lg) == [] and list((root / "_tmp").iterdir()) == []
    assert len(ss.open(root)) == 2 and lg.num_committed == 2
