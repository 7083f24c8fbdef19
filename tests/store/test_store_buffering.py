"""Buffering: batches staged by copy or written straight through, whatever the caller does with its arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import seqstore as ss
from seqstore.store import writer as writer_mod


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
