"""Store records as Arrow arrays (``seqstore.interop.to_arrow``, what the Ray and Spark readers build
their columns with): list levels per axis, ragged offsets, bfloat16, ids, the 32-bit offset limit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
from seqstore.interop import to_arrow
from seqstore.schema import float32_to_bfloat16

pa = pytest.importorskip("pyarrow")


def test_fixed_lists_nest_one_level_per_axis() -> None:
    values = np.arange(3 * 2 * 4, dtype=np.float32).reshape(3, 2, 4)
    arr = to_arrow.fixed_lists(pa.array(values.reshape(-1)), (2, 4), 3)
    assert arr.type == pa.list_(pa.list_(pa.float32()))
    assert arr.to_pylist() == values.tolist()
    assert to_arrow.fixed_lists(pa.array([1, 2]), (), 2).to_pylist() == [1, 2]  # a scalar: the flat array
    big = to_arrow.fixed_lists(pa.array(values.reshape(-1)), (2, 4), 3, large=True)
    assert big.type == pa.large_list(pa.large_list(pa.float32())) and big.to_pylist() == values.tolist()


def test_field_lists_of_a_ragged_field_with_a_given_type() -> None:
    """Records of 2, 0 and 3 rows of (2,) values: a list level of the lengths around fixed rows; the
    given type (non-null elements, as Spark's arrays) is kept at every level."""
    f = ss.Field("int16", (None, 2))
    lengths = np.array([2, 0, 3], dtype=np.int64)
    rows = np.arange(10, dtype=np.int16).reshape(5, 2)
    inner = pa.list_(pa.field("element", pa.int16(), nullable=False))
    t = pa.list_(pa.field("element", inner, nullable=False))
    arr = to_arrow.field_lists(pa.array(rows.reshape(-1)), f, lengths, t)
    assert arr.type == t
    assert arr.to_pylist() == [rows[:2].tolist(), [], rows[2:].tolist()]
    assert to_arrow.leaf_type(t, 2) == pa.int16()
    flat = to_arrow.field_lists(pa.array([7, 8, 9]), ss.Field("int64", (None,)), np.array([1, 2]), large=True)
    assert flat.type == pa.large_list(pa.int64()) and flat.to_pylist() == [[7], [8, 9]]


def test_offsets_past_int32_name_the_array() -> None:
    lengths = np.array([1 << 30, 1 << 30, 5], dtype=np.int64)
    assert to_arrow.offsets(lengths, large=True).tolist() == [0, 1 << 30, 1 << 31, (1 << 31) + 5]
    assert to_arrow.offsets(lengths[:1]).dtype == np.int32
    with pytest.raises(ValueError, match=r"^f.seqstore, field 'x': 2147483653 values in one Arrow array .*; smaller"):
        to_arrow.offsets(lengths, what="f.seqstore, field 'x'", hint="; smaller")
    with pytest.raises(ValueError, match="2147483648 values"):  # a fixed axis: 2^16 lists of 2^15
        to_arrow.fixed_lists(pa.array([0]), (1 << 15,), 1 << 16)
    with pytest.raises(ValueError, match="2147483648 bytes"):
        to_arrow.string_array(np.zeros(0, np.uint8), np.array([0, 1 << 31], dtype=np.int64))


def test_numbers_widen_or_keep_bfloat16() -> None:
    want = np.array([1.5, -2.0, 0.0], dtype=np.float32)
    bits = float32_to_bfloat16(want)
    np.testing.assert_array_equal(to_arrow.numbers(bits, "bfloat16"), want)
    assert to_arrow.numbers(bits, "bfloat16", bfloat16="bits") is bits
    ints = np.arange(3, dtype=np.uint16)
    assert to_arrow.numbers(ints, "<u2") is ints
    with pytest.raises(ValueError, match="bfloat16 must be"):
        to_arrow.numbers(bits, "bfloat16", bfloat16="float16")


def test_id_array_equals_the_store_ids(tmp_path: Path) -> None:
    names = [f"r{i}-" + "é" * (i % 3) for i in range(30)]
    with ss.create(tmp_path / "s", {"v": ss.Field("int8")}, max_shard_records=7) as w:
        w.append_batch({"v": np.zeros(30, np.int8)}, ids=names)
    store = ss.open(tmp_path / "s")
    idx = np.array([29, 0, 8, 8, 15, 3])
    small = to_arrow.id_array(store, idx)
    large = to_arrow.id_array(store, np.arange(7, 14), large=True)
    assert small.type == pa.string() and small.to_pylist() == [names[i] for i in idx]
    assert large.type == pa.large_string() and large.to_pylist() == names[7:14]
    assert to_arrow.id_array(store, []).to_pylist() == []
    with ss.create(tmp_path / "none", {"v": ss.Field("int8")}) as w:
        w.append({"v": np.int8(1)})
    with pytest.raises(KeyError, match="no ids"):
        to_arrow.id_array(ss.open(tmp_path / "none"), [0])
