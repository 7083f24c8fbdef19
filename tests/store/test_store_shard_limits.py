"""Shard limits: a shard never holds more than max_shard_records, whatever the batch sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import seqstore as ss


def test_large_batches_are_split_at_the_record_limit(tmp_path: Path) -> None:
    path = tmp_path / "s.seqstore"
    schema = {"x": ss.Field("int32", (None, 2)), "y": ss.Field("float32", (3,))}
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 5, 250)
    values = np.arange(int(lengths.sum()) * 2, dtype=np.int32).reshape(-1, 2)
    y = rng.standard_normal((250, 3)).astype(np.float32)
    ids = [f"id{i}" for i in range(250)]
    with ss.create(path, schema, max_shard_records=64) as w:
        w.append({"x": np.zeros((1, 2), dtype=np.int32), "y": np.zeros(3)}, id="first")
        w.append_batch({"x": (values, lengths), "y": y}, ids=ids)
    store = ss.open(path)
    counts = [s.records for s in store.manifest.shards]
    assert counts == [64, 64, 64, 59]
    assert len(store) == 251
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for i in (0, 62, 63, 64, 127, 128, 249):
        rec = store[i + 1]
        np.testing.assert_array_equal(rec["x"], values[starts[i] : starts[i + 1]])
        np.testing.assert_array_equal(rec["y"], y[i])
        assert store.id(i + 1) == ids[i]
        assert store.index(ids[i]) == i + 1


def test_large_batches_are_split_at_shard_bytes(tmp_path: Path) -> None:
    """append_batch cut a batch only at max_shard_records: one batch of 3x shard_bytes became one shard
    of 3x shard_bytes. A shard now ends with the record that reaches shard_bytes, as with append()."""
    fixed, ragged = tmp_path / "f.seqstore", tmp_path / "r.seqstore"
    with ss.create(fixed, {"x": ss.Field("int64", ())}, shard_bytes=8000) as w:
        w.append_batch({"x": np.arange(3000)})
        w.append_batch({"x": np.arange(3000, 3500)})
    store = ss.open(fixed)
    assert [s.records for s in store.manifest.shards] == [1000] * 3 + [500]
    assert [int(store[i]["x"]) for i in (0, 999, 1000, 3499)] == [0, 999, 1000, 3499]
    lengths = np.tile([1, 5], 500)  # 8 and 40 bytes a record, 24_000 bytes in all
    values = np.arange(int(lengths.sum()), dtype=np.int64)
    with ss.create(ragged, {"x": ss.Field("int64", (None,))}, shard_bytes=4000) as w:
        w.append({"x": np.arange(3)})  # 24 bytes in the shard before the batch
        w.append_batch({"x": (values, lengths)})
    store = ss.open(ragged)
    # 24 + 82 x 48 + 8 + 40 = 4008 bytes: the record that reaches 4000 ends the shard
    assert [s.records for s in store.manifest.shards] == [167] + [168] * 4 + [162]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for i in (0, 165, 166, 167, 999):
        np.testing.assert_array_equal(store[i + 1]["x"], values[starts[i] : starts[i + 1]])
