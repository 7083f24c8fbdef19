"""Property tests: whatever is written over random schemas comes back bit-exactly on every read path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_testlib import (
    ALL_DTYPES,
    check_store,
    iter_chunks,
    new_scratch,
    random_record,
    storage_of,
    workspaces,
)

import seqstore as ss

# names without field/group clashes; nested ones exercise "a/b" files and store.nested()
NAMES = ["a", "b1", "g/c", "g/d", "h/i/j", "k.x"]

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def fields(draw: Any) -> ss.Field:
    dtype = draw(st.sampled_from(ALL_DTYPES))
    inner = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    return ss.Field(dtype, ((None, *inner) if draw(st.booleans()) else inner))


@st.composite
def schemas(draw: Any) -> ss.Schema:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
    return ss.Schema({n: draw(fields()) for n in names})


ID_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=4) | st.sampled_from(
    ["", "\U0001f600", "\U0010ffff", "a\x00b", "caf\u00e9", "/", " "]
)


def _column(schema: ss.Schema, name: str, values: list[Any], form: str) -> Any:
    f = schema[name]
    if not f.ragged:
        return np.stack([np.asarray(v) for v in values]) if values else np.empty((0, *f.inner_shape))
    if form == "pair":
        lengths = np.array([len(v) for v in values], dtype=np.int64)
        return (np.concatenate(values), lengths)
    return list(values)


@given(
    schema=schemas(),
    n=st.integers(0, 14),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
@SETTINGS
def test_round_trip(schema: ss.Schema, n: int, seed: int, data: Any) -> None:
    rng = np.random.default_rng(seed)
    with_ids = data.draw(st.booleans(), label="with_ids")
    ids = data.draw(st.lists(ID_TEXT, min_size=n, max_size=n, unique=True), label="ids") if with_ids else None
    mode = data.draw(st.sampled_from(["append", "list", "pair", "mixed"]), label="mode")
    sizes = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=4), label="batch sizes")
    nested_input = data.draw(st.booleans(), label="nested records")
    nested_schema = data.draw(st.booleans(), label="nested schema")
    opts = {
        "max_shard_records": data.draw(st.sampled_from([1, 2, 3, 5, 1 << 24]), label="max_shard_records"),
        "buffer_bytes": data.draw(st.sampled_from([1, 100, 1 << 20]), label="buffer_bytes"),
        "shard_bytes": data.draw(st.sampled_from([50, 1 << 30]), label="shard_bytes"),
    }
    split = data.draw(st.integers(0, n), label="records by the first writer")
    records = [random_record(rng, schema) for _ in range(n)]
    expected = [{k: storage_of(schema[k], v) for k, v in r.items()} for r in records]

    def write(w: ss.Writer, lo: int, hi: int) -> None:
        for a, b in iter_chunks(records[lo:hi], sizes):
            a, b = a + lo, b + lo
            how = mode if mode != "mixed" else ["append", "list", "pair"][int(rng.integers(0, 3))]
            if how == "append":
                for i in range(a, b):
                    rec = schema.nest(records[i]) if nested_input else records[i]
                    w.append(rec, id=None if ids is None else ids[i])
            else:
                cols = {k: _column(schema, k, [r[k] for r in records[a:b]], how) for k in schema}
                w.append_batch(schema.nest(cols) if nested_input else cols, ids=None if ids is None else ids[a:b])
            if rng.random() < 0.3:
                w.commit()

    with new_scratch() as tmp:
        root = Path(tmp) / "s"
        spec: Any = schema.nest(dict(schema)) if nested_schema else dict(schema)
        with ss.create(root, spec, metadata={"seed": seed}, **opts) as w:
            write(w, 0, split)
        with ss.append_to(root, **opts) as w:
            write(w, split, n)
        store = ss.open(root)
        assert store.schema == schema
        assert store.metadata == {"seed": seed}
        if opts["max_shard_records"] < 1 << 24 and mode == "append":
            assert all(s.records <= opts["max_shard_records"] for s in store.manifest.shards)
        check_store(store, expected, ids, rng)
        _check_bfloat16_modes(root, schema, expected)
        assert not workspaces(root)


def _check_bfloat16_modes(root: Path, schema: ss.Schema, expected: list[dict[str, Any]]) -> None:
    bf = [k for k, f in schema.items() if f.dtype == "bfloat16"]
    if not bf or not expected:
        return
    store = ss.open(root, bfloat16="float32")
    for i, want in enumerate(expected):
        rec = store[i]
        for k in bf:
            assert rec[k].dtype == np.float32
            np.testing.assert_array_equal(rec[k], ss.bfloat16_to_float32(want[k]))
    batch = store.get_batch(np.arange(len(expected)))
    for k in bf:
        got = batch[k][0] if schema[k].ragged else batch[k]
        assert got.dtype == np.float32


# ------------------------------------------------------------------------------- bfloat16 values


@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), max_size=50))
@settings(max_examples=50, deadline=None)
def test_bfloat16_conversion_round_to_nearest_even(values: list[float]) -> None:
    x = np.array(values, dtype=np.float32)
    bits = ss.float32_to_bfloat16(x)
    assert bits.dtype == np.uint16 and bits.shape == x.shape
    back = ss.bfloat16_to_float32(bits)
    assert back.dtype == np.float32
    nan = np.isnan(x)
    assert np.isnan(back[nan]).all()
    # widening then narrowing again is exact
    assert_bits = ss.float32_to_bfloat16(back)
    np.testing.assert_array_equal(assert_bits[~nan], bits[~nan])
    # round to nearest: no bfloat16 value is closer to x than the one chosen
    fin = np.isfinite(x) & np.isfinite(back)
    up = ss.bfloat16_to_float32(bits[fin] + np.uint16(1)).astype(np.float64)
    down = ss.bfloat16_to_float32(bits[fin] - np.uint16(1)).astype(np.float64)
    err = np.abs(back[fin].astype(np.float64) - x[fin])
    ok_up = ~np.isfinite(up) | (err <= np.abs(up - x[fin]))
    ok_down = ~np.isfinite(down) | (err <= np.abs(down - x[fin]))
    assert ok_up.all() and ok_down.all()


def test_bfloat16_known_bits() -> None:
    x = np.array([1.0, -2.0, 0.0, -0.0, np.inf, -np.inf, 1.00390625, 1.01171875, 3.0e38], dtype=np.float32)
    bits = ss.float32_to_bfloat16(x)
    # 1.00390625 is halfway between 1.0 and 1.0078125 -> even (1.0); 1.01171875 halfway -> 1.015625
    assert bits.tolist() == [0x3F80, 0xC000, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x3F80, 0x3F82, 0x7F62]
    assert ss.float32_to_bfloat16(np.float32(np.nan)).item() == 0x7FC0
    assert ss.bfloat16_to_float32(np.array([0x3F80, 0xC000], dtype=np.uint16)).tolist() == [1.0, -2.0]


def test_bfloat16_store_modes(scratch: Path) -> None:
    x = np.array([[1.5, -2.25], [3.0e-3, 7.0]], dtype=np.float32)
    with ss.create(scratch / "s", {"w": ss.Field("bfloat16", (None, 2)), "s": ss.Field("bf16", ())}) as w:
        w.append({"w": x, "s": 0.5})
        w.append({"w": x[:0], "s": np.float64(-1.0)})
    bits = ss.open(scratch / "s")
    assert bits.schema["w"].dtype == "bfloat16" and bits.schema["s"].dtype == "bfloat16"
    rec = bits[0]
    assert rec["w"].dtype == np.uint16
    np.testing.assert_array_equal(rec["w"], ss.float32_to_bfloat16(x))
    assert rec["s"].dtype == np.uint16 and int(rec["s"]) == 0x3F00
    f32 = ss.open(scratch / "s", bfloat16="float32")
    np.testing.assert_array_equal(f32[0]["w"], ss.bfloat16_to_float32(ss.float32_to_bfloat16(x)))
    assert f32[1]["s"].dtype == np.float32 and float(f32[1]["s"]) == -1.0
    vals, lengths = f32.get_batch([0, 1], pad=True)["w"]
    assert vals.dtype == np.float32 and vals.shape == (2, 2, 2) and lengths.tolist() == [2, 0]
    with pytest.raises(ValueError, match="bfloat16"):
        ss.open(scratch / "s", bfloat16="float16")
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return
    ml = ss.open(scratch / "s", bfloat16="ml_dtypes")
    assert ml[0]["w"].dtype.name == "bfloat16"
    np.testing.assert_array_equal(ml[0]["w"].astype(np.float32), f32[0]["w"])


def test_bfloat16_from_torch(scratch: Path) -> None:
    torch = pytest.importorskip("torch")
    t = torch.tensor([[1.0, 2.5], [-3.0, 1e-3]], dtype=torch.bfloat16)
    with ss.create(scratch / "s", {"w": ss.Field("bfloat16", (2, 2)), "f": ss.Field("float32", (2,))}) as w:
        w.append({"w": t, "f": t[0]})
    rec = ss.open(scratch / "s")[0]
    np.testing.assert_array_equal(rec["w"], t.view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(rec["f"], np.array([1.0, 2.5], dtype=np.float32))


# --------------------------------------------------------------------------- multi-shard id index


def test_many_shards_merged_index(scratch: Path) -> None:
    """70 shards: level-1 runs are merged into a level-2 run under _index/; lookups stay correct."""
    rng = np.random.default_rng(3)
    schema = ss.Schema({"x": ss.Field("int32", (None,)), "y": ss.Field("float64", ())})
    n = 140
    records = [random_record(rng, schema, max_rows=3) for _ in range(n)]
    # two different ids that look alike; empty and astral ids are in there too
    ids = [f"id-{i}" for i in range(n - 3)] + ["", "\U0001f600", "\U0001f600\U0001f600"]
    with ss.create(scratch / "s", schema, max_shard_records=2) as w:
        for i in range(n):
            w.append(records[i], id=ids[i])
    store = ss.open(scratch / "s")
    assert store.num_shards == 70
    runs = store.manifest.index_runs
    assert runs and runs[0].level == 2 and runs[0].first_shard == 0 and runs[0].end_shard == 64
    assert (scratch / "s" / "_index").is_dir()
    # only live runs stay on disk
    on_disk = sorted(p.name for p in (scratch / "s" / "_index").iterdir())
    assert on_disk == sorted(f"{r.name.split('/')[1]}{s}" for r in runs for s in (".hash.npy", ".rows.npy"))
    expected = [{k: storage_of(schema[k], v) for k, v in r.items()} for r in records]
    check_store(store, expected, ids, rng)
    perm = rng.permutation(n)
    assert store.index_many([ids[i] for i in perm]).tolist() == perm.tolist()
    # a superseded or lost run falls back to the shards' own indexes
    for r in runs:
        (scratch / "s" / f"{r.name}.hash.npy").unlink()
    fresh = ss.open(scratch / "s")
    assert fresh.index_many(ids).tolist() == list(range(n))
    assert fresh.index(ids[77]) == 77
    # the next writer drops index files the manifest does not list; appending keeps ids working
    with ss.append_to(scratch / "s", max_shard_records=2) as w:
        w.append(records[0], id="late")
    final = ss.open(scratch / "s")
    assert final.index("late") == n and final.index(ids[5]) == 5


def test_duplicate_ids_resolve_to_first(scratch: Path) -> None:
    with ss.create(scratch / "s", {"v": ss.Field("int8", ())}, max_shard_records=2) as w:
        for i, s in enumerate(["a", "b", "a", "c", "b", "a"]):
            w.append({"v": i}, id=s)
    store = ss.open(scratch / "s")
    assert store.index("a") == 0 and store.index("b") == 1 and store.index("c") == 3
    assert store.index_many(["b", "a", "c", "a"]).tolist() == [1, 0, 3, 0]
    assert [store.id(i) for i in range(6)] == ["a", "b", "a", "c", "b", "a"]
