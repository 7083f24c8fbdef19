"""Buffering: batches staged by copy or written straight through, whatever the caller does with its arrays."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
import seqstore.store.verify
from seqstore.store.write import columns as writer_mod


def test_reused_caller_arrays_never_change_stored_records(tmp_path: Path, monkeypatch: object) -> None:
    # small thresholds so one run mixes staged pieces, staging-array rollover and direct writes
    monkeypatch.setattr(writer_mod, "DIRECT_BYTES", 4096)  # type: ignore[attr-defined]
    schema = {"x": ss.Field("float32", (None, 4)), "y": ss.Field("int64", (2,))}
    rng = np.random.default_rng(5)
    values = np.empty((400, 4), dtype=np.float32)  # one buffer the caller keeps overwriting
    ys = np.empty((64, 2), dtype=np.int64)
    expected_x, expected_y = [], []
    with ss.create(tmp_path / "s", schema, buffer_bytes=20_000) as w:
        for step in range(60):
            b = int(rng.integers(1, 64))
            lengths = rng.integers(0, 7, b)
            total = int(lengths.sum())
            values[:total] = rng.standard_normal((total, 4))
            ys[:b] = rng.integers(0, 1000, (b, 2))
            w.append_batch({"x": (values[:total], lengths), "y": ys[:b]})
            starts = np.concatenate([[0], np.cumsum(lengths)])
            expected_x += [values[starts[i] : starts[i + 1]].copy() for i in range(b)]
            expected_y += [ys[i].copy() for i in range(b)]
            values[:] = np.nan  # the caller scribbles over its buffers right after each call
            ys[:] = -1
            if step % 17 == 16:
                w.commit()
    store = ss.open(tmp_path / "s")
    assert len(store) == len(expected_x)
    for i in range(len(store)):
        rec = store[i]
        np.testing.assert_array_equal(rec["x"], expected_x[i])
        np.testing.assert_array_equal(rec["y"], expected_y[i])


def test_a_failed_write_stops_the_writer_and_committed_data_stays_intact(tmp_path: Path, monkeypatch: object) -> None:
    schema = {"a": ss.Field("int64"), "b": ss.Field("int64")}
    w = ss.create(tmp_path / "s", schema)
    w.append_batch({"a": np.arange(3), "b": np.arange(3)})
    w.commit()
    w.append_batch({"a": np.arange(4), "b": np.arange(4)})
    real_write = writer_mod.ColumnFile.write
    calls = {"n": 0}

    def failing(self: object, arr: np.ndarray) -> object:
        calls["n"] += 1
        if calls["n"] == 2:  # the second column of the flush: the first already holds the batch
            raise OSError(28, "No space left on device")
        return real_write(self, arr)  # type: ignore[arg-type]

    monkeypatch.setattr(writer_mod.ColumnFile, "write", failing)  # type: ignore[attr-defined]
    with pytest.raises(OSError):
        w.commit()
    monkeypatch.setattr(writer_mod.ColumnFile, "write", real_write)  # type: ignore[attr-defined]
    with pytest.raises(ss.SeqstoreError, match="abort"):
        w.commit()  # a retry must not commit columns of different lengths
    w.abort()
    store = ss.open(tmp_path / "s")
    assert len(store) == 3 and store[2]["b"] == 2
    assert ss.store.verify.verify(tmp_path / "s") == []


def test_zero_row_pieces_are_not_staged(tmp_path: Path) -> None:
    with ss.create(tmp_path / "s", {"x": ss.Field("float32", (None, 8192))}) as w:
        w.append_batch({"x": (np.zeros((0, 8192), np.float32), np.array([0, 0]))})
        w.append_batch({"x": (np.ones((3, 8192), np.float32), np.array([1, 2]))})
    store = ss.open(tmp_path / "s")
    assert [len(store[i]["x"]) for i in range(4)] == [0, 0, 1, 2]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_leaves_the_parents_workspace_alone(tmp_path: Path) -> None:
    w = ss.create(tmp_path / "s", {"x": ss.Field("int32")}, buffer_bytes=1)
    w.append_batch({"x": np.arange(10)})  # flushed to the workspace, not committed
    pid = os.fork()
    if pid == 0:  # the child drops its copy of the writer: its finaliser runs here
        del w
        gc.collect()
        os._exit(0)
    os.waitpid(pid, 0)
    w.append_batch({"x": np.arange(5)})
    w.close()
    assert len(ss.open(tmp_path / "s")) == 15
