"""Appending: field errors are reported before the missing-id error; text (str, UTF-8) and bytes are
accepted for a ragged uint8 field (as text is imported)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
from seqstore.errors import SchemaError
from seqstore.store.verify import verify


def test_field_errors_come_before_the_missing_id(tmp_path: Path) -> None:
    with ss.create(tmp_path / "s.seqstore", {"x": ss.Field("float32", (2,))}) as w:
        w.append({"x": np.zeros(2, np.float32)}, id="a")
        with pytest.raises(SchemaError, match=r"unknown field\(s\) \['y'\]; missing field\(s\) \['x'\]") as e:
            w.append({"y": np.zeros(2, np.float32)})
        assert "id" not in str(e.value).split(";")[0]
        with pytest.raises(SchemaError, match="expected shape"):
            w.append({"x": np.zeros(3, np.float32)})  # a wrong shape, and no id: the shape is named
        with pytest.raises(SchemaError, match="has no id"):
            w.append({"x": np.zeros(2, np.float32)})  # only the id is wrong: that is named
    assert len(ss.open(tmp_path / "s.seqstore")) == 1


def test_text_and_bytes_into_a_ragged_uint8_field(tmp_path: Path) -> None:
    path = tmp_path / "t.seqstore"
    with ss.create(path, {"text": ss.Field("uint8", (None,)), "n": ss.Field("int32", ())}) as w:
        w.append({"text": "héllo wörld", "n": 1}, id="a")
        w.append({"text": b"raw \xff bytes", "n": 2}, id="b")
        w.append({"text": np.frombuffer(b"array", np.uint8), "n": 3}, id="c")
        w.append_batch({"text": ["zwei", b"drei", bytearray(b"vier"), ""], "n": np.arange(4, dtype=np.int32)},
                       ids=["d", "e", "f", "g"])
    s = ss.open(path)
    got = [bytes(s[i]["text"]) for i in range(len(s))]
    assert got == ["héllo wörld".encode(), b"raw \xff bytes", b"array", b"zwei", b"drei", b"vier", b""]


def test_text_is_refused_for_other_fields(tmp_path: Path) -> None:
    schema = {"f": ss.Field("float32", (None,)), "u": ss.Field("uint8", (None, 2))}
    with ss.create(tmp_path / "s.seqstore", schema) as w:
        with pytest.raises(SchemaError, match="'f'"):
            w.append({"f": "text", "u": np.zeros((1, 2), np.uint8)})
        with pytest.raises(SchemaError, match="'u'"):
            w.append({"f": np.zeros(1, np.float32), "u": "text"})
        with pytest.raises(SchemaError, match="a ragged column is a list"):
            w.append_batch({"f": [np.zeros(1, np.float32)], "u": "ab"})


@pytest.mark.parametrize("lengths", [np.array([2**63 - 1, 2**63 - 1, 7]), np.array([2**64 - 1, 6, 0], np.uint64)])
def test_lengths_that_sum_to_the_rows_only_by_overflow_are_refused(tmp_path: Path, lengths: np.ndarray) -> None:
    path = tmp_path / "o.seqstore"
    with ss.create(path, {"x": ss.Field("int32", (None,))}) as w:
        w.append_batch({"x": ([1, 2], np.array([2]))})
        with pytest.raises(SchemaError, match="more rows than the values' 5"):
            w.append_batch({"x": (np.arange(5, dtype=np.int32), lengths)})
    s = ss.open(path)
    assert len(s) == 1 and s[0]["x"].tolist() == [1, 2]
    assert verify(path) == []


def test_an_empty_list_is_a_record_with_no_rows_in_any_ragged_field(tmp_path: Path) -> None:
    # NumPy makes [] a float64 array: it was refused as an unsafe cast into an integer field
    schema = {"l": ss.Field("int32", (None,)), "m": ss.Field("int8", (None, 3)), "b": ss.Field("bfloat16", (None,))}
    w = ss.create(tmp_path / "s", schema)
    w.append({"l": [], "m": [], "b": []})
    w.append_batch({"l": [[1, 2], []], "m": [[[1, 2, 3]], ()], "b": [[1.0], []]})
    w.close()
    s = ss.open(tmp_path / "s")
    assert len(s) == 3
    for i in (0, 2):
        rec = s[i]
        assert rec["l"].dtype == np.int32 and rec["l"].shape == (0,)
        assert rec["m"].dtype == np.int8 and rec["m"].shape == (0, 3)
        assert rec["b"].shape == (0,)
    assert s[1]["l"].tolist() == [1, 2] and s[1]["m"].tolist() == [[1, 2, 3]]
    w = ss.create(tmp_path / "f", {"x": ss.Field("int32", (2,))})
    with pytest.raises(SchemaError, match="expected shape"):  # a fixed field still wants its shape
        w.append({"x": []})
    w.close()
