"""Mistakes a newcomer makes, refused at once in seqstore's words (issue 25, item 5): an unknown
ordering at dataset construction, a malformed ordering argument named as such, a record without an id
in a store with ids (and the reverse)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
from seqstore.errors import SchemaError
from seqstore.order import seq_order


@pytest.fixture()
def store(tmp_path: Path) -> ss.Store:
    with ss.create(tmp_path / "s.seqstore", {"x": ss.Field("float32", (None,))}) as w:
        for i in range(5):
            w.append({"x": np.ones(i + 1, np.float32)}, id=f"r{i}")
    return ss.open(tmp_path / "s.seqstore")


def test_unknown_ordering_refused_at_construction(store: ss.Store) -> None:
    with pytest.raises(ValueError) as exc:
        ss.StoreDataset(store, ordering="shuffle")
    msg = str(exc.value)
    assert "unknown ordering 'shuffle'" in msg and "random[:nth]" in msg and "laplace" in msg, msg


@pytest.mark.parametrize(("ordering", "words"), [
    ("laplace:abc", ["'laplace:abc'", "number of bins", "'abc'"]),
    ("laplace:.x", ["sequences per bin (.K)", "'x'"]),
    ("sort_bin_shuffle:2:0", ["nth", ">= 1"]),
    ("random_block:4", ["random_block:B:W[:nth]"]),
    ("sorted:3", ["takes no arguments"]),
])
def test_bad_ordering_argument_is_named(store: ss.Store, ordering: str, words: list[str]) -> None:
    for call in (lambda: seq_order(10, ordering, epoch=1), lambda: ss.StoreDataset(store, ordering=ordering)):
        with pytest.raises(ValueError) as exc:
            call()
        msg = str(exc.value)
        assert all(w in msg for w in words), msg
        assert "needs lengths" not in msg and "invalid literal" not in msg, msg


def test_good_orderings_still_accepted(store: ss.Store) -> None:
    for ordering in ("laplace:.2", "sort_bin_shuffle:3:2", "random_block:2:2", "random:2", "sorted_reverse"):
        ds = ss.StoreDataset(store, ordering=ordering)
        assert sorted(int(i) for i in ds.epoch_order(1)) == list(range(5)), ordering
    assert len(seq_order(10, "default_every_n:2", epoch=1)) == 10


def test_record_without_id_in_a_store_with_ids(tmp_path: Path) -> None:
    with ss.create(tmp_path / "a.seqstore", {"x": ss.Field("float32", ())}) as w:
        w.append({"x": np.float32(0)}, id="first")
        with pytest.raises(SchemaError) as exc:
            w.append({"x": np.float32(1)})
        msg = str(exc.value)
        assert "a.seqstore" in msg and "record 1 has no id" in msg and "append(record, id=...)" in msg, msg
        with pytest.raises(SchemaError) as exc:
            w.append_batch({"x": np.ones(2, np.float32)})
        assert "ids=" in str(exc.value) and "other kind" not in str(exc.value)
    with ss.append_to(tmp_path / "a.seqstore") as w:  # the store's committed records decide
        with pytest.raises(SchemaError) as exc:
            w.append({"x": np.float32(1)})
        assert "has no id" in str(exc.value) and "have ids" in str(exc.value), exc.value


def test_record_with_id_in_a_store_without_ids(tmp_path: Path) -> None:
    with ss.create(tmp_path / "b.seqstore", {"x": ss.Field("float32", ())}) as w:
        w.append({"x": np.float32(0)})
        with pytest.raises(SchemaError) as exc:
            w.append({"x": np.float32(1)}, id="x1")
        msg = str(exc.value)
        assert "record 1 has an id" in msg and "have none" in msg and "without id=" in msg, msg
