"""Packed groups (format version 2): layout on disk, zero-copy views, matrix(), verify, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
from seqstore.format.manifest import Manifest
from seqstore.format.npy import read_header
from seqstore.store.verify import verify

SPEC = {
    "layer1": {"grad": ss.Field("float32", (4, 4))},
    "layer2": {"grad": ss.Field("float32", (3,))},
    "loss": ss.Field("float32"),
    "label": ss.Field("int64"),
    "tokens": ss.Field("int32", (None,)),
}
PACK = {"g": ["layer1/grad", "layer2/grad", "loss"]}


def _records(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "layer1/grad": rng.standard_normal((4, 4)).astype(np.float32),
            "layer2/grad": rng.standard_normal(3).astype(np.float32),
            "loss": np.float32(rng.standard_normal()),
            "label": np.int64(i),
            "tokens": np.arange(i % 4, dtype=np.int32),
        }
        for i in range(n)
    ]


def _write(root: Path, n: int = 30, **kw: object) -> list[dict[str, np.ndarray]]:
    recs = _records(n)
    with ss.create(root, SPEC, packed=PACK, max_shard_records=7, **kw) as w:  # type: ignore[arg-type]
        for k, r in enumerate(recs):
            w.append(r, id=f"id{k}")
    return recs


def test_layout_and_manifest(scratch: Path) -> None:
    root = scratch / "s"
    _write(root)
    raw = json.loads((root / "manifest.json").read_text())
    assert raw["version"] == 3 and raw["id_lookup"] == "first"
    assert raw["schema"]["layer1/grad"] == {"dtype": "<f4", "shape": [4, 4], "group": "g", "columns": [0, 16]}
    assert raw["schema"]["layer2/grad"]["columns"] == [16, 19] and raw["schema"]["loss"]["columns"] == [19, 20]
    assert "group" not in raw["schema"]["label"]
    files = set(ss.open(root).manifest.shards[0].files)  # from the shard's descriptor
    assert "g.npy" in files and "layer1/grad.npy" not in files and "label.npy" in files
    mat = np.load(root / "shard-000000" / "g.npy")  # a plain .npy: (n, 20) row-major
    assert mat.shape == (7, 20) and mat.dtype == np.float32
    assert verify(root) == []


def _legacy(root: Path, **kw: object) -> ss.Writer:
    """A store in the JSON shard-list layout (version 1, or 2 with packed groups / last-id lookup), as
    seqstore wrote before version 3; appending keeps its version."""
    root.mkdir()
    Manifest(ss.Schema(SPEC, packed=kw.pop("packed", None)), id_lookup=str(kw.pop("id_lookup", "first"))).save(root)
    return ss.append_to(root, **kw)  # type: ignore[arg-type]


def test_legacy_stores_keep_their_version(scratch: Path) -> None:
    for name, kw, version in (("p", {}, 1), ("g", {"packed": PACK}, 2), ("l", {"id_lookup": "last"}, 2)):
        with _legacy(scratch / name, max_shard_records=7, **kw) as w:
            for k, r in enumerate(_records(10)):
                w.append(r, id=f"id{k % 6}")
        raw = json.loads((scratch / name / "manifest.json").read_text())
        assert raw["version"] == version and len(raw["shards"]) == 2, raw
        st = ss.open(scratch / name)
        assert len(st) == 10 and st.manifest.version == version and verify(scratch / name) == []
        assert st.index("id3") == (9 if name == "l" else 3)
        np.testing.assert_array_equal(st[8]["layer1/grad"], _records(10)[8]["layer1/grad"])


def test_round_trip_views_and_matrix(scratch: Path) -> None:
    root = scratch / "s"
    recs = _write(root)
    st = ss.open(root)
    assert st.num_shards == 5 and list(st.groups) == ["g"]
    for i, r in enumerate(recs):
        got = st[i]
        for name, v in r.items():
            np.testing.assert_array_equal(got[name], v)
        sh = st._shards.shard(st._shards.locate(i)[0])
        assert np.shares_memory(got["layer1/grad"], sh.groups["g"])  # zero-copy view of the row
    assert st.nested(3)["layer1"]["grad"].shape == (4, 4)
    full = np.stack([np.concatenate([r["layer1/grad"].ravel(), r["layer2/grad"], [r["loss"]]]) for r in recs])
    with pytest.raises(ValueError, match="one dtype"):
        st.matrix()  # all fixed fields: float32 and int64 do not mix
    np.testing.assert_array_equal(st.matrix("g"), full)
    assert st.matrix_columns("g") == {"layer1/grad": (0, 16), "layer2/grad": (16, 19), "loss": (19, 20)}
    view = st.matrix("g", rows=slice(7, 14))  # one shard: zero-copy
    assert not view.flags.owndata and not view.flags.writeable
    np.testing.assert_array_equal(view, full[7:14])
    np.testing.assert_array_equal(st.matrix("g", rows=slice(3, 29, 4)), full[3:29:4])
    np.testing.assert_array_equal(st.matrix("g", rows=slice(20, 2, -3)), full[20:2:-3])
    np.testing.assert_array_equal(st.matrix("g", rows=[29, 0, 8, 8]), full[[29, 0, 8, 8]])
    np.testing.assert_array_equal(st.matrix(["loss", "layer1/grad"]), np.concatenate([full[:, 19:], full[:, :16]], 1))
    np.testing.assert_array_equal(st.matrix("label")[:, 0], np.arange(30))
    blocks = list(st.iter_matrix("g", chunk_rows=4))
    assert all(b.shape[0] <= 4 for _, b in blocks)
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), full)
    assert [a for a, _ in blocks][:3] == [0, 4, 7]
    got = st.get_batch([0, 29], fields=["layer2/grad", "tokens"])
    np.testing.assert_array_equal(got["layer2/grad"], full[[0, 29], 16:19])
    with pytest.raises(ValueError, match="one dtype"):
        st.matrix(["loss", "label"])
    with pytest.raises(ValueError, match="ragged"):
        st.matrix("tokens")
    with pytest.raises(KeyError):
        st.matrix("nope")


def test_nested_copy_is_owned_with_one_copy_per_group(scratch: Path) -> None:
    root = scratch / "s"
    recs = _write(root)
    st = ss.open(root)
    for i in (0, 6, 7, 29):  # first and last rows of shards
        got = st.nested(i, copy=True)
        assert set(got) == {"layer1", "layer2", "loss", "label", "tokens"}
        np.testing.assert_array_equal(got["layer1"]["grad"], recs[i]["layer1/grad"])
        np.testing.assert_array_equal(got["layer2"]["grad"], recs[i]["layer2/grad"])
        np.testing.assert_array_equal(got["loss"], recs[i]["loss"])
        np.testing.assert_array_equal(got["label"], recs[i]["label"])
        np.testing.assert_array_equal(got["tokens"], recs[i]["tokens"])
        grad = got["layer1"]["grad"]
        assert grad.flags.writeable and got["tokens"].flags.writeable and got["label"].flags.writeable
        assert grad.base is got["layer2"]["grad"].base is got["loss"].base  # one copy of the packed row
        sh = st._shards.shard(st._shards.locate(i)[0])
        assert not any(np.shares_memory(a, sh.groups["g"]) for a in (grad, got["loss"]))
        grad[0, 0] = 1e9  # writing the copy leaves the store alone
        assert st[i]["layer1/grad"][0, 0] == recs[i]["layer1/grad"][0, 0]
    assert st.nested(-1, copy=True)["label"] == 29
    with pytest.raises(IndexError):
        st.nested(30, copy=True)
    with pytest.raises(TypeError):
        st.nested(1.5, copy=True)  # type: ignore[arg-type]


def test_nested_copy_of_bfloat16_follows_the_open_mode(scratch: Path) -> None:
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    with ss.create(scratch / "s", {"w": ss.Field("bfloat16", (6,)), "v": ss.Field("float32", ())}) as w:
        w.append_batch({"w": x, "v": x[:, 0]})
    wide = ss.open(scratch / "s", bfloat16="float32").nested(2, copy=True)
    np.testing.assert_array_equal(wide["w"], ss.bfloat16_to_float32(ss.float32_to_bfloat16(x[2])))
    bits = ss.open(scratch / "s").nested(2, copy=True)["w"]
    assert bits.dtype == np.uint16 and bits.flags.writeable
    np.testing.assert_array_equal(bits, ss.float32_to_bfloat16(x[2]))


def test_append_batch_takes_the_group_matrix(scratch: Path) -> None:
    schema = {"a": ss.Field("float16", (2, 2)), "b": ss.Field("float16", (3,))}
    mat = np.arange(35, dtype=np.float16).reshape(5, 7)
    with ss.create(scratch / "s", schema, packed={"grp": ["a", "b"]}) as w:
        w.append_batch({"grp": mat}, ids=[str(i) for i in range(5)])
        w.append_batch({"a": mat[:, :4].reshape(5, 2, 2), "b": mat[:, 4:]}, ids=[str(i) for i in range(5, 10)])
        w.append({"grp": mat[0]}, id="10")
        with pytest.raises(ss.SchemaError, match="matrix for packed group 'grp'"):
            w.append_batch({"grp": mat[:, :6]}, ids=[str(i) for i in range(5)])
        with pytest.raises(ss.SchemaError, match="unknown field"):
            w.append_batch({"grp": mat, "a": mat[:, :4].reshape(5, 2, 2)}, ids=[str(i) for i in range(5)])
    st = ss.open(scratch / "s")
    np.testing.assert_array_equal(st.matrix(), np.concatenate([mat, mat, mat[:1]]))
    np.testing.assert_array_equal(st[2]["b"], mat[2, 4:])


def test_bfloat16_group(scratch: Path) -> None:
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    with ss.create(
        scratch / "s", {"w": ss.Field("bfloat16", (6,)), "v": ss.Field("bfloat16", ())}, packed={"bf": ["w", "v"]}
    ) as w:
        w.append_batch({"w": x, "v": x[:, 0]})
    st = ss.open(scratch / "s", bfloat16="float32")
    bits = ss.open(scratch / "s").matrix()
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(st.matrix()[:, :6], ss.bfloat16_to_float32(ss.float32_to_bfloat16(x)))
    np.testing.assert_array_equal(st[1]["w"], ss.bfloat16_to_float32(ss.float32_to_bfloat16(x[1])))
    np.testing.assert_array_equal(ss.open(scratch / "s").matrix(dtype=np.float32), st.matrix())


@pytest.mark.parametrize(
    "packed, match",
    [
        ({"g": ["nope"]}, "no field"),
        ({"g": ["tokens"]}, "ragged"),
        ({"g": ["loss", "label"]}, "dtype"),
        ({"g": ["loss"], "h": ["loss"]}, "more than one"),
        ({"loss": ["layer2/grad"]}, "also a field name"),
        ({"a/b": ["loss"]}, "without '/'"),
        ({"g": []}, "non-empty"),
    ],
)
def test_bad_groups(packed: dict[str, list[str]], match: str) -> None:
    with pytest.raises(ss.SchemaError, match=match):
        ss.Schema(SPEC, packed=packed)


def test_schema_json_round_trip_and_checks() -> None:
    s = ss.Schema(SPEC, packed=PACK)
    assert ss.Schema.from_json(s.to_json()) == s
    assert s != ss.Schema(SPEC)
    bad = s.to_json()
    bad["loss"]["columns"] = [19, 21]
    with pytest.raises(ss.SchemaError, match="tile"):
        ss.Schema.from_json(bad)


def test_damaged_group_file_is_reported(scratch: Path) -> None:
    root = scratch / "s"
    _write(root)
    p = root / "shard-000001" / "g.npy"
    data = bytearray(p.read_bytes())
    data[read_header(p).data_offset + 72] ^= 0xFF  # a data byte (the header is one page)
    p.write_bytes(bytes(data))
    assert any("g.npy" in q and "CRC" in q for q in verify(root))
    p.write_bytes(bytes(data[:-4]))
    with pytest.raises(ss.CorruptionError, match="g.npy"):
        ss.open(root)[8]


def test_version_1_manifest_with_groups_is_rejected(scratch: Path) -> None:
    root = scratch / "s"
    with _legacy(root, packed=PACK) as w:
        w.append(_records(1)[0])
    raw = json.loads((root / "manifest.json").read_text())
    raw["version"] = 1
    (root / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ss.CorruptionError, match="version-2 features"):
        Manifest.load(root)


def test_id_lookup_last(scratch: Path) -> None:
    with ss.create(scratch / "s", {"x": ss.Field("int64")}, id_lookup="last", max_shard_records=3) as w:
        for k, i in enumerate(["a", "b", "a", "c", "a", "b", "d", "a"]):
            w.append({"x": k}, id=i)
    st = ss.open(scratch / "s")
    assert st.manifest.version == 3 and st.manifest.id_lookup == "last"
    assert [st.index(i) for i in "abcd"] == [7, 5, 3, 6]
    assert st.index_many(["a", "b", "zz", "d"], missing=-1).tolist() == [7, 5, -1, 6]
    with ss.create(scratch / "f", {"x": ss.Field("int64")}) as w:
        for k, i in enumerate("aba"):
            w.append({"x": k}, id=i)
    assert ss.open(scratch / "f").index("a") == 0
