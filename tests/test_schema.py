"""Schemas: Field validation, dtype normalisation, nesting, JSON round trips, value conversion."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqstore as ss
from seqstore.schema import to_storage_array

NUMERIC = [
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128", "bool",
]  # fmt: skip


@pytest.mark.parametrize("dtype", NUMERIC)
def test_every_numeric_dtype(dtype: str) -> None:
    f = ss.Field(dtype, (None, 2))
    assert f.storage_dtype == np.dtype(dtype)
    assert f.ragged and f.inner_shape == (2,)
    assert f.row_bytes == 2 * np.dtype(dtype).itemsize
    assert ss.Field(np.dtype(dtype)) == ss.Field(dtype) == ss.Field(getattr(np, dtype))
    assert ss.Field.from_json(f.to_json()) == f


def test_dtype_normalisation() -> None:
    assert ss.Field(">i4").dtype == "<i4" == ss.Field("int32").dtype
    assert ss.Field(">f8").storage_dtype == np.dtype("<f8")
    assert ss.Field("bf16").dtype == ss.Field("BFloat16").dtype == "bfloat16"
    assert ss.Field("bfloat16").storage_dtype == np.dtype("<u2")
    assert ss.Field(int).storage_dtype == np.dtype(int)
    assert ss.Field(bool).storage_dtype == np.dtype(bool)


@pytest.mark.parametrize("dtype", ["U4", "S3", "O", "datetime64[s]", "timedelta64", "V8", [("a", "i4")], "nope"])
def test_unsupported_dtypes(dtype: object) -> None:
    with pytest.raises(ss.SchemaError, match="dtype"):
        ss.Field(dtype)


def test_shapes() -> None:
    assert ss.Field("int8").shape == () and not ss.Field("int8").ragged
    assert ss.Field("int8", 3).shape == (3,)
    assert ss.Field("int8", None).shape == (None,) and ss.Field("int8", None).inner_shape == ()
    assert ss.Field("int8", [None, 4, 5]).shape == (None, 4, 5)
    assert ss.Field("int8", (np.int64(2), 0)).shape == (2, 0)
    assert ss.Field("float32", (64, 64)).row_bytes == 64 * 64 * 4
    for bad in [(3, None), (-1,), (1.5,), ("a",), (True,), "ab", (None, None)]:
        with pytest.raises(ss.SchemaError):
            ss.Field("int8", bad)


def test_schema_nesting_and_names() -> None:
    s = ss.Schema({"a": ss.Field("int8"), "layer1": {"grad": ss.Field("float32", (4,)), "x": {"y": ss.Field("bool")}}})
    assert list(s) == ["a", "layer1/grad", "layer1/x/y"]
    assert s == ss.Schema({"a": ss.Field("int8"), "layer1/grad": ss.Field("f4", 4), "layer1/x/y": ss.Field(bool)})
    assert hash(s) == hash(ss.Schema(s))
    assert s.nest({"a": 1, "layer1/x/y": 2}) == {"a": 1, "layer1": {"x": {"y": 2}}}
    assert ss.Schema.from_json(s.to_json()) == s
    assert "layer1/grad" in repr(s)
    with pytest.raises(KeyError, match="nope"):
        s["nope"]


@pytest.mark.parametrize(
    "spec, word",
    [
        ({"a": {"b": ss.Field("int8")}, "a/b": ss.Field("int8")}, "a/b"),  # duplicate field name
        ({"a": ss.Field("int8"), "a/b": ss.Field("int8")}, "'a'"),  # field and group at once
        ({"": ss.Field("int8")}, "name"),
        ({"_ids": ss.Field("int8")}, "_ids"),
        ({"x.offsets": ss.Field("int8")}, "x.offsets"),
        ({"x.npy": ss.Field("int8")}, "x.npy"),
        ({"a//b": ss.Field("int8")}, "a//b"),
        ({"a/": ss.Field("int8")}, "a/"),
        ({"../up": ss.Field("int8")}, "../up"),
        ({"sp ace": ss.Field("int8")}, "sp ace"),
        ({1: ss.Field("int8")}, "1"),
        ({"a": "int8"}, "'a'"),
        ({}, "non-empty"),
    ],
)
def test_bad_schemas(spec: dict, word: str) -> None:
    with pytest.raises(ss.SchemaError) as info:
        ss.Schema(spec)
    assert word in str(info.value)


def test_schema_from_bad_json() -> None:
    for bad in [None, [], {}, {"a": {"dtype": "int8"}}, {"a": 5}, {"a": {"dtype": "U2", "shape": []}}]:
        with pytest.raises(ss.SchemaError):
            ss.Schema.from_json(bad)


@pytest.mark.parametrize("shape", [3, None, "ab", {"a": 1}])
def test_a_field_shape_that_is_not_a_list_is_named(shape: object) -> None:
    # 3 and None were a bare TypeError; a string or a dict was split into its characters or keys
    with pytest.raises(ss.SchemaError, match=r"schema field 'x': 'shape' must be a list"):
        ss.Schema.from_json({"x": {"dtype": "float32", "shape": shape}})


# ------------------------------------------------------------------------------- value conversion


def test_conversion_copies_only_when_needed() -> None:
    f = ss.Field("float32", (None, 2))
    a = np.zeros((3, 2), np.float32)
    assert to_storage_array(f, a, what="r") is a
    b = to_storage_array(f, np.zeros((3, 2), np.float64), what="r")
    assert b.dtype == np.float32
    c = to_storage_array(f, np.zeros((2, 3), np.float32).T, what="r")
    assert c.flags.c_contiguous
    assert to_storage_array(ss.Field(">i2"), np.array(3, ">i2"), what="r").dtype == np.dtype("<i2")


@pytest.mark.parametrize(
    "dtype, value",
    [
        ("int8", 1.0), ("int8", np.float16(1)), ("int64", np.array([1.5])), ("uint8", np.complex64(1)),
        ("float32", 1j), ("float64", np.array([1 + 0j])), ("bool", 1), ("bool", np.array([0.0])),
        ("int8", 128), ("int8", -129), ("uint16", -1), ("uint8", np.array([0, 256])),
        ("int64", np.array([2**63], dtype=np.uint64)), ("uint64", np.array([-1], dtype=np.int8)),
        ("int32", "3"), ("float32", [1, "a"]), ("float32", [[1.0], [1.0, 2.0]]), ("float32", None),
        ("bfloat16", 1j), ("bfloat16", "x"),
    ],
)  # fmt: skip
def test_unsafe_values_rejected(dtype: str, value: object) -> None:
    with pytest.raises(ss.SchemaError) as info:
        to_storage_array(ss.Field(dtype, (None,)), value, what="record 7 (id 'q'), field 'f'")
    assert "record 7 (id 'q'), field 'f'" in str(info.value)


@pytest.mark.parametrize(
    "dtype, value",
    [
        ("int8", 127), ("int8", np.array([-128, 127], np.int64)), ("uint8", 255), ("uint8", np.int64(0)),
        ("uint64", np.array([2**64 - 1], np.uint64)), ("int64", np.array([2**63 - 1], np.uint64)),
        ("int16", np.uint8(200)), ("int8", True), ("float16", 3), ("float32", np.float64(1e30)),
        ("complex64", 1.5), ("complex128", np.int32(3)), ("float64", np.array([], dtype=np.int8)),
        ("bfloat16", 1.5), ("bfloat16", np.int32(7)), ("bfloat16", True),
    ],
)  # fmt: skip
def test_safe_values_accepted(dtype: str, value: object) -> None:
    f = ss.Field(dtype)
    out = to_storage_array(f, value, what="r")
    assert out.dtype == f.storage_dtype
    if dtype != "bfloat16" and np.asarray(value).dtype.kind in "biu" and f.storage_dtype.kind in "iu":
        assert np.array_equal(out, np.asarray(value).astype(object).astype(out.dtype))


@given(st.integers(-(2**70), 2**70), st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint32", "uint64"]))
@settings(max_examples=50, deadline=None)
def test_integer_range_checks(value: int, dtype: str) -> None:
    info = np.iinfo(dtype)
    src = np.array([value], dtype=np.int64 if -(2**63) <= value < 2**63 else object)
    if src.dtype == object:
        with pytest.raises(ss.SchemaError):
            to_storage_array(ss.Field(dtype, (None,)), src, what="r")
        return
    if info.min <= value <= info.max:
        assert to_storage_array(ss.Field(dtype, (None,)), src, what="r").tolist() == [value]
    else:
        with pytest.raises(ss.SchemaError, match=str(value)):
            to_storage_array(ss.Field(dtype, (None,)), src, what="r")


def test_bfloat16_values() -> None:
    f = ss.Field("bfloat16", (None,))
    bits = to_storage_array(f, np.array([1.0, -2.0], np.float32), what="r")
    assert bits.dtype == np.uint16 and bits.tolist() == [0x3F80, 0xC000]
    # widening back and converting again is the identity
    again = to_storage_array(f, ss.bfloat16_to_float32(bits), what="r")
    assert again.tolist() == bits.tolist()
    scalar = ss.float32_to_bfloat16(np.float32(np.nan))
    assert isinstance(scalar, np.ndarray) and scalar.shape == () and int(scalar) == 0x7FC0
    assert ss.bfloat16_to_float32(np.uint16(0x4000)).item() == 2.0
    try:
        import ml_dtypes
    except ImportError:
        return
    ml = np.array([1.5, -3.0], dtype=ml_dtypes.bfloat16)
    assert to_storage_array(f, ml, what="r").tolist() == ml.view(np.uint16).tolist()


@pytest.mark.parametrize(
    "dtype, value, shown",
    [
        ("float32", 1e300, "1e+300"), ("float32", np.array([1.0, -1e39]), "-1e+39"),
        ("float16", 70000, "70000"), ("float16", np.array([1, 2, 65520], np.int32), "65520"),
        ("complex64", np.complex128(1e300 + 1j), "1e+300"), ("bfloat16", 1e300, "1e+300"),
        ("bfloat16", np.array([0.0, 3.4e38], np.float32), "3.39999"),
    ],
)  # fmt: skip
def test_float_narrowing_that_overflows_is_rejected(dtype: str, value: object, shown: str) -> None:
    """A finite value that would become inf in a narrower float field is an error naming the value."""
    f = ss.Field(dtype, (None,)) if np.ndim(value) else ss.Field(dtype)
    with pytest.raises(ss.SchemaError, match="overflows") as info:
        to_storage_array(f, value, what="record 7 (id 'q'), field 'f'")
    assert "record 7 (id 'q'), field 'f'" in str(info.value) and shown in str(info.value)


@pytest.mark.filterwarnings("error")
def test_infinities_nan_and_values_that_fit_still_narrow() -> None:
    got = to_storage_array(ss.Field("float16", (None,)), np.array([np.inf, -np.inf, np.nan, 65504.0, 1e-9]), what="r")
    assert np.isposinf(got[0]) and np.isneginf(got[1]) and np.isnan(got[2]) and got[3] == 65504 and got[4] == 0
    assert to_storage_array(ss.Field("float32"), np.float64(3.4e38), what="r") == np.float32(3.4e38)
    bits = to_storage_array(ss.Field("bfloat16", (None,)), np.array([np.inf, 3e38]), what="r")
    assert bits[0] == 0x7F80 and bits[1] != 0x7F80
    assert to_storage_array(ss.Field("float16"), np.int64(65504), what="r") == 65504


def test_torch_bfloat16_into_a_float16_field_is_checked_for_overflow() -> None:
    """A torch bfloat16 value too large for float16 became inf silently (numpy's cast warning only); like
    every other narrowing to a float field it is an error naming the value, and values that fit convert."""
    torch = pytest.importorskip("torch")
    f = ss.Field("float16", (None,))
    with pytest.raises(ss.SchemaError, match="overflows dtype float16") as info:
        to_storage_array(f, torch.tensor([1.0, 1e10], dtype=torch.bfloat16), what="record 3, field 'f'")
    assert "record 3, field 'f'" in str(info.value) and "element 1" in str(info.value)
    got = to_storage_array(f, torch.tensor([1.5, -np.inf, 60000.0], dtype=torch.bfloat16), what="r")
    assert got.dtype == np.float16 and got[0] == 1.5 and np.isneginf(got[1]) and got[2] == 59904  # (bfloat16's)
    assert to_storage_array(ss.Field("float64"), torch.tensor(2.5, dtype=torch.bfloat16), what="r") == 2.5


@pytest.mark.parametrize("spec", [{"a": {}}, {"a": {"b": {}}}])
def test_a_spec_of_only_empty_groups_is_no_schema(tmp_path: Path, spec: dict) -> None:
    """``{"a": {}}`` flattens to no field at all: it was taken as an empty schema, and ``create`` then wrote
    a store whose manifest no open can read ('malformed manifest'). It is refused as ``{}`` is, and
    nothing is written."""
    with pytest.raises(ss.SchemaError, match="non-empty"):
        ss.Schema(spec)
    with pytest.raises(ss.SchemaError, match="non-empty"):
        ss.create(tmp_path / "s.seqstore", spec)
    assert not (tmp_path / "s.seqstore").exists()


def test_a_dtype_of_none_is_refused() -> None:
    """``Field(None)`` became a float64 field (numpy reads dtype None as its default float); a dtype left
    unset is an error, as any other value that names no dtype."""
    with pytest.raises(ss.SchemaError, match="unsupported dtype None"):
        ss.Field(None, (None, 3))


@pytest.mark.parametrize("dtype", [",f4", "f4,(", "(2"])
def test_a_dtype_string_numpy_cannot_parse_is_a_schema_error(dtype: str) -> None:
    """numpy parses a dtype string with a comma as a Python expression: ``np.dtype(",f4")`` raises
    SyntaxError, which reached the caller bare (and from a manifest whose dtype had one flipped byte:
    "<f4" -> ",f4", instead of a CorruptionError naming manifest.json)."""
    with pytest.raises(ss.SchemaError, match="unsupported dtype"):
        ss.Field(dtype)


@pytest.mark.parametrize("shape", [(2**32, 2**32), (None, 2**31, 2**31, 4), (10**30,), (None, 2**61), (0, 2**70)])
def test_a_record_shape_past_int64_bytes_is_refused(shape: tuple) -> None:
    """np.prod in int64 wrapped: (2**32, 2**32) had row_bytes 0, (10**30,) an OverflowError on first use."""
    with pytest.raises(ss.SchemaError, match=r"field shape .*(bytes|entry of \d+), more than 2\*\*63 - 1"):
        ss.Field("float32", shape)
    from seqstore.format.manifest import Manifest

    schema = {"x": {"dtype": "<f4", "shape": list(shape)}}
    raw = json.dumps({"format": "seqstore", "version": 1, "shards": [], "schema": schema}).encode()
    with pytest.raises(ss.CorruptionError, match=r"m\.json: malformed manifest .*more than 2\*\*63 - 1"):
        Manifest.parse(raw, "m.json")
    assert ss.Field("float32", (2**30, 2**30)).row_bytes == 2**62  # (the largest that fit stay as they were)


@pytest.mark.parametrize("columns", [["0", 4], [0.0, 4.0], [0, 4.9], [False, 4], [0, True]])
def test_packed_columns_that_are_no_integers_are_refused(columns: list) -> None:
    """int() read "0" as 0, 4.9 as 4 and true as 1: docs/format.md says ints, a violation is corruption."""
    obj = {"a": {"dtype": "<f4", "shape": [2, 2], "group": "g", "columns": columns},
           "b": {"dtype": "<f4", "shape": [], "group": "g", "columns": [4, 5]}}
    with pytest.raises(ss.SchemaError, match=r"schema field 'a': .*\"columns\" \[a, b\] \(integers\)"):
        ss.Schema.from_json(obj)
    obj["a"]["columns"] = [0, 4]
    assert ss.Schema.from_json(obj).groups["g"].columns == {"a": (0, 4), "b": (4, 5)}


@pytest.mark.parametrize("fields", [5, b"x", ["x", 3], 2.5])
def test_a_fields_argument_that_is_no_names_is_named(tmp_path: Path, fields: object) -> None:
    """``fields=5`` (store reads, exports, loaders: every ``fields=`` goes through ``field_list``) was a bare
    ``TypeError: 'int' object is not iterable``, and ``fields=b"x"`` asked for field 120. A TypeError says
    what ``fields`` takes and what it got."""
    from seqstore.schema import field_list

    with pytest.raises(TypeError, match=r"fields: expected a field name \(str\) or a list of names, got "):
        field_list(fields)  # type: ignore[arg-type]
    with ss.create(tmp_path / "s.seqstore", {"x": ss.Field("int32", (None,))}) as w:
        w.append({"x": np.ones(2, np.int32)})
    with pytest.raises(TypeError, match=r"fields: expected a field name"):
        ss.open(tmp_path / "s.seqstore").get_batch([0], fields=fields)  # type: ignore[arg-type]
    assert field_list(("x", "y")) == ["x", "y"] and field_list("x") == ["x"] and field_list({"x": 1}) == ["x"]
