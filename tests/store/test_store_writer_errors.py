"""Bad input is rejected with a SchemaError naming field, record and id; nothing is left behind."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from store_testlib import workspaces
from support.tmpfs import run_on_small_tmpfs

import seqstore as ss

SCHEMA = {
    "feat": ss.Field("float32", (None, 3)),
    "label": ss.Field("int16", ()),
    "flag": ss.Field("uint8", ()),
    "g": {"emb": ss.Field("float32", (2,))},
}


def good(i: int) -> dict[str, Any]:
    return {
        "feat": np.full((i % 4, 3), i, dtype=np.float32),
        "label": i,
        "flag": i % 256,
        "g": {"emb": np.array([i, -i], dtype=np.float32)},
    }


def good_batch(lo: int, hi: int, form: str = "list") -> dict[str, Any]:
    recs = [good(i) for i in range(lo, hi)]
    feats = [r["feat"] for r in recs]
    return {
        "feat": feats if form == "list" else (np.concatenate(feats), np.array([len(f) for f in feats])),
        "label": np.array([r["label"] for r in recs], dtype=np.int64),
        "flag": np.array([r["flag"] for r in recs]),
        "g/emb": np.stack([r["g"]["emb"] for r in recs]),
    }


def with_(i: int, **changes: Any) -> dict[str, Any]:
    rec = good(i)
    for k, v in changes.items():
        if k == "emb":
            rec["g"] = {"emb": v}
        elif v is _DROP:
            del rec[k]
        else:
            rec[k] = v
    return rec


_DROP = object()

# (case id, record maker (given the record index), the id to use, words the message must contain)
APPEND_CASES: list[tuple[str, Callable[[int], Any], Any, list[str]]] = [
    ("unknown field", lambda i: {**good(i), "extra": 1}, "bad-id", ["extra", "unknown"]),
    ("unknown nested", lambda i: {**good(i), "g": {"emb": np.zeros(2), "x": 1}}, "bad-id", ["g/x"]),
    ("missing field", lambda i: with_(i, label=_DROP), "bad-id", ["label", "missing"]),
    ("missing nested", lambda i: {k: v for k, v in good(i).items() if k != "g"}, "bad-id", ["g/emb"]),
    ("float to int", lambda i: with_(i, label=1.5), "bad-id", ["label", "float64", "int16"]),
    ("float array to int", lambda i: with_(i, flag=np.array(3.0)), "bad-id", ["flag"]),
    ("complex to float", lambda i: with_(i, feat=np.ones((2, 3), np.complex64)), "bad-id", ["feat", "complex"]),
    ("int overflow", lambda i: with_(i, label=40000), "bad-id", ["label", "40000"]),
    ("negative to uint", lambda i: with_(i, flag=-1), "bad-id", ["flag", "-1"]),
    ("uint overflow", lambda i: with_(i, flag=np.array(256, np.int32)), "bad-id", ["flag", "256"]),
    ("int64 to int16 overflow", lambda i: with_(i, label=np.int64(-(2**40))), "bad-id", ["label"]),
    ("float overflow", lambda i: with_(i, emb=np.array([1.0, 1e300])), "bad-id", ["g/emb", "1e+300", "overflows"]),
    ("bool ok, float not", lambda i: with_(i, label=np.array(True)) | {"flag": np.array(2.0)}, "bad-id", ["flag"]),
    ("wrong inner shape", lambda i: with_(i, feat=np.zeros((2, 4), np.float32)), "bad-id", ["feat", "(2, 4)"]),
    ("ragged given 1-d", lambda i: with_(i, feat=np.zeros(3, np.float32)), "bad-id", ["feat"]),
    ("fixed wrong shape", lambda i: with_(i, emb=np.zeros(3, np.float32)), "bad-id", ["g/emb", "(3,)"]),
    ("scalar given array", lambda i: with_(i, label=np.array([1, 2])), "bad-id", ["label"]),
    ("strings", lambda i: with_(i, feat=[["a", "b", "c"]]), "bad-id", ["feat"]),
    ("jagged list", lambda i: with_(i, feat=[[1.0, 2.0, 3.0], [1.0]]), "bad-id", ["feat"]),
    ("object", lambda i: with_(i, label=object()), "bad-id", ["label"]),
    ("not a dict", lambda i: [1, 2, 3], "bad-id", ["dict"]),
    ("non-str id", lambda i: good(i), 5, ["id", "5"]),
    ("bytes id", lambda i: good(i), b"x", ["id"]),
    ("no id in a store with ids", lambda i: good(i), None, ["ids"]),
    ("duplicate nested name", lambda i: {**good(i), "g/emb": np.zeros(2, np.float32)}, "bad-id", ["g/emb"]),
]


@pytest.mark.parametrize("case", APPEND_CASES, ids=[c[0] for c in APPEND_CASES])
def test_append_rejects(scratch: Path, case: tuple[str, Callable[[int], Any], Any, list[str]]) -> None:
    _, make, bad_id, words = case
    root = scratch / "s"
    w = ss.create(root, SCHEMA, buffer_bytes=64, max_shard_records=3)
    for i in range(4):
        w.append(good(i), id=f"r{i}")
    w.commit()
    w.append(good(4), id="r4")  # buffered, not yet committed
    with pytest.raises(ss.SchemaError) as info:
        w.append(make(5), id=bad_id)
    msg = str(info.value)
    assert "record 5" in msg, msg
    if isinstance(bad_id, str):
        assert repr(bad_id) in msg, msg
    for word in words:
        assert word in msg, (word, msg)
    # the writer is still usable and the rejected record left nothing behind
    for i in range(5, 9):
        w.append(good(i), id=f"r{i}")
    w.close()
    _check_good(root, 9)


def _check_good(root: Path, n: int) -> None:
    store = ss.open(root)
    assert len(store) == n
    for i in range(n):
        rec, want = store[i], good(i)
        np.testing.assert_array_equal(rec["feat"], want["feat"])
        assert int(rec["label"]) == want["label"] and int(rec["flag"]) == want["flag"]
        np.testing.assert_array_equal(rec["g/emb"], want["g"]["emb"])
        if store.has_ids:
            assert store.id(i) == f"r{i}" and store.index(f"r{i}") == i
    assert not workspaces(root)


def _bad_batch(**changes: Any) -> Callable[[int], dict[str, Any]]:
    def make(first: int) -> dict[str, Any]:
        cols = good_batch(first, first + 3)
        for k, v in changes.items():
            if v is _DROP:
                del cols[k]
            else:
                cols[k] = v(first) if callable(v) else v
        return cols

    return make


# (case id, batch maker (given the first record index), ids, words the message must contain)
BATCH_CASES: list[tuple[str, Callable[[int], Any], Any, list[str]]] = [
    ("columns disagree", _bad_batch(label=np.arange(4)), None, ["label", "4", "3"]),
    ("ragged count disagrees", _bad_batch(feat=lambda f: good_batch(f, f + 2)["feat"]), None, ["label", "2", "3"]),
    (
        "lengths do not sum",
        _bad_batch(feat=(np.zeros((5, 3), np.float32), np.array([1, 1, 1]))),
        None,
        ["feat", "sum"],
    ),
    ("negative lengths", _bad_batch(feat=(np.zeros((1, 3), np.float32), np.array([2, -1, 0]))), None, ["feat"]),
    ("float lengths", _bad_batch(feat=(np.zeros((3, 3), np.float32), np.array([1.0, 1.0, 1.0]))), None, ["feat"]),
    ("pair values wrong inner", _bad_batch(feat=(np.zeros((3, 2), np.float32), np.array([1, 1, 1]))), None, ["feat"]),
    ("ragged as one array", _bad_batch(feat=np.zeros((3, 2, 3), np.float32)), None, ["feat"]),
    (
        "ragged item wrong shape",
        _bad_batch(feat=[np.zeros((1, 3)), np.zeros((1, 4)), np.zeros((0, 3))]),
        ["r5", "r6", "r7"],
        ["feat", "record 6", "'r6'"],
    ),
    (
        "ragged item complex",
        _bad_batch(feat=[np.zeros((1, 3)), np.zeros((1, 3)), np.zeros((1, 3), np.complex128)]),
        ["r5", "r6", "r7"],
        ["feat", "record 7", "'r7'"],
    ),
    ("fixed column not stacked", _bad_batch(**{"g/emb": np.zeros(2, np.float32)}), None, ["g/emb"]),
    ("fixed column wrong shape", _bad_batch(**{"g/emb": np.zeros((3, 4), np.float32)}), None, ["g/emb"]),
    ("overflow in column", _bad_batch(label=np.array([1, 70000, 2])), None, ["label", "70000"]),
    ("float in int column", _bad_batch(flag=np.array([1.0, 2.0, 3.0])), None, ["flag"]),
    ("unknown column", _bad_batch(extra=np.zeros(3)), None, ["extra"]),
    ("missing column", _bad_batch(label=_DROP), None, ["label"]),
    ("too few ids", _bad_batch(), ["r5", "r6"], ["ids", "3"]),
    ("too many ids", _bad_batch(), ["r5", "r6", "r7", "r8"], ["ids"]),
    ("ids is a str", _bad_batch(), "abc", ["ids"]),
    ("non-str id", _bad_batch(), ["r5", 6, "r7"], ["record 6", "id", "6"]),
    ("no ids in a store with ids", _bad_batch(), None, ["ids"]),
]


@pytest.mark.parametrize("form", ["list", "pair"])
@pytest.mark.parametrize("case", BATCH_CASES, ids=[c[0] for c in BATCH_CASES])
def test_append_batch_rejects(scratch: Path, case: tuple[str, Callable[[int], Any], Any, list[str]], form: str) -> None:
    name, make, bad_ids, words = case
    root = scratch / "s"
    with_ids = bad_ids is not None or name == "no ids in a store with ids"
    w = ss.create(root, SCHEMA, buffer_bytes=64, max_shard_records=3)
    ids = (lambda a, b: [f"r{i}" for i in range(a, b)]) if with_ids else (lambda a, b: None)
    w.append_batch(good_batch(0, 3, form), ids=ids(0, 3))
    w.commit()
    w.append_batch(good_batch(3, 5, form), ids=ids(3, 5))  # buffered
    with pytest.raises(ss.SchemaError) as info:
        w.append_batch(make(5), ids=bad_ids)
    msg = str(info.value)
    assert "record 5" in msg or "record 6" in msg or "record 7" in msg, msg
    for word in words:
        assert word in msg, (word, msg)
    w.append_batch(good_batch(5, 8, form), ids=ids(5, 8))
    for i in range(8, 10):
        w.append(good(i), id=None if not with_ids else f"r{i}")
    w.close()
    _check_good(root, 10)


def test_mixing_ids_rejected(scratch: Path) -> None:
    root = scratch / "s"
    with ss.create(root, SCHEMA) as w:
        w.append(good(0))
        with pytest.raises(ss.SchemaError, match="record 1"):
            w.append(good(1), id="x")
        with pytest.raises(ss.SchemaError, match="record 1"):
            w.append_batch(good_batch(1, 3), ids=["a", "b"])
        w.append(good(1))
    # a later writer keeps the store's kind
    with ss.append_to(root) as w:
        with pytest.raises(ss.SchemaError, match="record 2"):
            w.append(good(2), id="late")
        w.append(good(2))
    store = ss.open(root)
    assert len(store) == 3 and not store.has_ids
    with pytest.raises(KeyError):
        store.index("late")
    with pytest.raises(KeyError):
        store.id(0)


def test_zero_record_batch_is_a_no_op(scratch: Path) -> None:
    root = scratch / "s"
    with ss.create(root, SCHEMA) as w:
        empty = {
            "feat": [],
            "label": np.zeros(0, np.int16),
            "flag": np.zeros(0, np.uint8),
            "g/emb": np.zeros((0, 2), np.float32),
        }
        w.append_batch(empty)
        w.append_batch({**empty, "feat": (np.zeros((0, 3), np.float32), np.zeros(0, np.int64))}, ids=[])
        w.append(good(0), id="r0")
    store = ss.open(root)
    assert len(store) == 1 and store.id(0) == "r0"


def test_safe_casts_accepted(scratch: Path) -> None:
    """Widening and in-range narrowing of ints, Python scalars and lists, bool -> int are fine."""
    schema = {
        "u8": ss.Field("uint8", ()),
        "i8": ss.Field("int8", (2,)),
        "f16": ss.Field("float16", (None,)),
        "c": ss.Field("complex64", ()),
        "b": ss.Field("bool", ()),
    }
    root = scratch / "s"
    with ss.create(root, schema) as w:
        w.append({"u8": 255, "i8": [-128, 127], "f16": [1.5, 2.0], "c": 1.0, "b": True})
        w.append({"u8": np.int64(7), "i8": np.array([True, False]), "f16": np.arange(3), "c": 2 + 3j, "b": np.bool_(0)})
        w.append_batch(
            {
                "u8": np.array([0, 255], np.int32),
                "i8": np.array([[1, 2], [3, 4]], np.uint64),
                "f16": [np.array([0.5], np.float64), np.array([], np.float32)],
                "c": np.array([1, 2], np.int8),
                "b": [True, False],
            }
        )
    store = ss.open(root)
    assert [int(store[i]["u8"]) for i in range(4)] == [255, 7, 0, 255]
    assert store[1]["i8"].tolist() == [1, 0] and store[3]["i8"].tolist() == [3, 4]
    assert store[1]["f16"].dtype == np.float16 and store[1]["f16"].tolist() == [0.0, 1.0, 2.0]
    assert complex(store[1]["c"]) == 2 + 3j and store[2]["c"].dtype == np.complex64
    assert [bool(store[i]["b"]) for i in range(4)] == [True, False, True, False]
    assert store.get_batch([0, 1, 2, 3])["f16"][1].tolist() == [2, 3, 1, 0]


def test_appended_arrays_are_copied(scratch: Path) -> None:
    """A caller may reuse its arrays after append returns (the writer buffers, it must not alias)."""
    root = scratch / "s"
    schema = {"x": ss.Field("float32", (None, 2)), "y": ss.Field("int64", (3,)), "z": ss.Field("int32", ())}
    with ss.create(root, schema) as w:
        x = np.zeros((2, 2), np.float32)
        y = np.zeros(3, np.int64)
        z = np.zeros((), np.int32)
        for i in range(3):
            x[:] = i
            y[:] = i
            z[...] = i
            w.append({"x": x, "y": y, "z": z})
        xs = np.zeros((4, 2), np.float32)
        ys = np.zeros((2, 3), np.int64)
        zs = np.zeros(2, np.int32)
        for i in (3, 5):
            xs[:] = i
            ys[:] = i
            zs[:] = i
            w.append_batch({"x": (xs, np.array([2, 2])), "y": ys, "z": zs})
            w.append_batch({"x": [xs[:2], xs[2:3]], "y": ys, "z": zs})
        w.append_batch({"x": [xs[:1]], "y": ys[:1], "z": zs[:1]})
        xs[:] = 99
        ys[:] = 99
        zs[:] = 99
    store = ss.open(root)
    want = [0, 1, 2, 3, 3, 3, 3, 5, 5, 5, 5, 5]
    assert len(store) == len(want)
    for i, v in enumerate(want):
        rec = store[i]
        assert (rec["x"] == v).all() and (rec["y"] == v).all() and int(rec["z"]) == v, (i, rec)


def test_writer_state_errors(scratch: Path) -> None:
    root = scratch / "s"
    w = ss.create(root, SCHEMA)
    w.append(good(0))
    w.close()
    with pytest.raises(ss.SeqstoreError, match="closed"):
        w.append(good(1))
    with pytest.raises(ss.SeqstoreError, match="closed"):
        w.commit()
    w.close()  # idempotent
    assert len(ss.open(root)) == 1
    with pytest.raises(ValueError):
        ss.append_to(root, buffer_bytes=0)
    with pytest.raises(ss.FormatError):
        ss.append_to(scratch / "nowhere")


def test_exception_in_with_block_discards_uncommitted(scratch: Path) -> None:
    root = scratch / "s"
    with ss.create(root, SCHEMA) as w:
        w.append(good(0))
    with pytest.raises(RuntimeError), ss.append_to(root, buffer_bytes=1) as w:
        w.append(good(1))
        w.commit()
        w.append(good(2))  # flushed to the workspace, never committed
        raise RuntimeError("boom")
    store = ss.open(root)
    assert len(store) == 2
    assert not workspaces(root)
    w2 = ss.append_to(root)
    w2.append(good(2))
    w2.abort()
    assert len(ss.open(root)) == 2


def test_schema_too_many_dims_rejected_at_create(scratch: Path) -> None:
    with pytest.raises(ss.SchemaError, match="'x'"):
        ss.create(scratch / "s", {"x": ss.Field("complex128", (None, *([1] * 40)))})
    assert not (scratch / "s").exists()


def test_concurrent_writers_of_the_other_id_kind(scratch: Path) -> None:
    """Two writers open an empty store; the first commit fixes the id kind; the loser stays usable."""
    root = scratch / "s"
    ss.create(root, SCHEMA).close()
    a = ss.append_to(root)
    b = ss.append_to(root)
    a.append(good(0), id="r0")
    a.commit()
    b.append(good(1))
    with pytest.raises(ss.SchemaError, match="ids"):
        b.commit()
    with pytest.raises(ss.SchemaError, match="ids"):
        b.append(good(1))
    b.append(good(1), id="r1")
    b.close()
    a.close()
    _check_good(root, 2)


def test_odd_but_valid_ids(scratch: Path) -> None:
    root = scratch / "s"
    odd = ["", "\ud800", "\U0001f600", "a\x00b", "x" * 1000, " ", "\u00e9", "e\u0301"]
    with ss.create(root, SCHEMA, max_shard_records=3) as w:
        for i, s in enumerate(odd):
            w.append(good(i), id=s)
    store = ss.open(root)
    assert [store.id(i) for i in range(len(odd))] == odd
    assert [store.index(s) for s in odd] == list(range(len(odd)))
    assert store.index_many(odd[::-1]).tolist() == list(range(len(odd)))[::-1]
    with pytest.raises(KeyError):
        store.index("\u00e9 ")  # no normalisation or trimming: ids are exact strings


def test_ids_as_array_or_tuple(scratch: Path) -> None:
    root = scratch / "s"
    with ss.create(root, SCHEMA) as w:
        w.append_batch(good_batch(0, 3), ids=np.array(["r0", "r1", "r2"]))
        w.append_batch(good_batch(3, 5), ids=("r3", "r4"))
        with pytest.raises(ss.SchemaError, match="record 6"):
            w.append_batch(good_batch(5, 8), ids=np.array(["r5", 6, "r7"], dtype=object))
        with pytest.raises(ss.SchemaError, match="ids"):
            w.append_batch(good_batch(5, 6), ids=iter(["r5"]))  # type: ignore[arg-type]
    store = ss.open(root)
    assert [store.id(i) for i in range(5)] == ["r0", "r1", "r2", "r3", "r4"]
    assert isinstance(store.id(0), str) and store.index("r2") == 2


def test_add_stats_takes_numpy_numbers_and_refuses_nan(scratch: Path) -> None:
    """A count summed with NumPy (np.int64) was refused as "not a number"; a NaN or inf was taken and then
    stuck in the manifest's stat for good. Now NumPy numbers are stored as JSON numbers and non-finite ones
    are refused, naming the key."""
    lengths = np.array([3, 4], dtype=np.int64)
    with ss.create(scratch / "s", {"x": ss.Field("int32", (None,))}) as w:
        w.append_batch({"x": [np.zeros(3, np.int32), np.zeros(4, np.int32)]})
        w.add_stats({"tokens": lengths.sum(), "loss": np.float32(0.5), "n": 1})
        for bad in (float("nan"), np.float64("inf"), True, "3"):
            with pytest.raises(TypeError, match="'bad' must be a finite int or float"):
                w.add_stats({"bad": bad})
        w.add_stats({"tokens": np.uint8(1)})
    stats = ss.open(scratch / "s").manifest.stats
    assert stats == {"tokens": 8, "loss": 0.5, "n": 1} and type(stats["tokens"]) is int


def test_open_or_create_on_a_path_that_is_not_a_store_names_it(scratch: Path) -> None:
    """open_or_create (and so a Logger) pointed at a directory of other files, or at a file: the error used
    to be the rename's own OSError naming a hidden temporary directory ("Directory not empty: '.x.tmp-...'")."""
    from seqstore.store.writer import open_or_create

    (scratch / "out").mkdir()
    (scratch / "out" / "ckpt.pt").write_bytes(b"x")
    for path in (scratch / "out", scratch / "out" / "ckpt.pt"):
        with pytest.raises(FileExistsError, match=rf"^{path}: exists and is not a seqstore store"):
            open_or_create(path, {"x": ss.Field("int32")})
    assert sorted(p.name for p in scratch.iterdir()) == ["out"]
    assert [p.name for p in (scratch / "out").iterdir()] == ["ckpt.pt"]


def test_create_overwrite_never_deletes_a_file_that_is_not_a_store(scratch: Path) -> None:
    """overwrite=True refused a directory that is not a store but deleted a file at the path (a typo'd path
    cost the user's file) and made a store in its place."""
    precious = scratch / "data.bin"
    precious.write_text("keep me")
    with pytest.raises(ss.SeqstoreError, match="refusing to overwrite a file that is not a store"):
        ss.create(precious, {"x": ss.Field("int8")}, overwrite=True)
    assert precious.read_text() == "keep me"


def test_create_overwrite_through_a_symbolic_link_is_refused_and_changes_nothing(scratch: Path) -> None:
    ss.create(scratch / "real", {"x": ss.Field("int8")}).close()
    (scratch / "link").symlink_to(scratch / "real")
    with pytest.raises(ss.SeqstoreError, match="refusing to overwrite a symbolic link"):
        ss.create(scratch / "link", {"x": ss.Field("int8")}, overwrite=True)
    assert sorted(p.name for p in scratch.iterdir()) == ["link", "real"] and ss.open(scratch / "link") is not None


def test_a_one_dimensional_ragged_fields_shape_is_written_as_a_tuple(scratch: Path) -> None:
    w = ss.create(scratch / "s", {"tokens": ss.Field("int32", (None,)), "feat": ss.Field("float32", (None, 3))})
    with pytest.raises(ss.SchemaError) as info:
        w.append({"tokens": np.zeros((2, 3), np.int32), "feat": np.zeros((2, 3), np.float32)})
    assert "field 'tokens': expected shape (n,), got (2, 3)" in str(info.value)
    with pytest.raises(ss.SchemaError) as info:
        w.append({"tokens": np.zeros(2, np.int32), "feat": np.zeros((2, 4), np.float32)})
    assert "field 'feat': expected shape (n, 3), got (2, 4)" in str(info.value)
    w.abort()


def test_append_batch_names_a_fixed_fields_stacked_shape_plainly(scratch: Path) -> None:
    w = ss.create(scratch / "s", {"emb": ss.Field("float32", (2,)), "y": ss.Field("int8")})
    with pytest.raises(ss.SchemaError) as info:
        w.append_batch({"emb": np.zeros((3, 4), np.float32), "y": np.zeros(3, np.int8)})
    assert "field 'emb': expected shape (B, 2) stacked, got (3, 4)" in str(info.value)
    with pytest.raises(ss.SchemaError) as info:
        w.append_batch({"emb": np.zeros((3, 2), np.float32), "y": np.zeros((3, 1), np.int8)})
    assert "field 'y': expected shape (B,) stacked, got (3, 1)" in str(info.value)
    w.abort()


_FULL_DISK = """
import errno, sys
import numpy as np
import seqstore as ss
root = sys.argv[1] + "/s.seqstore"
w = ss.create(root, {"v": ss.Field("int64", (None,))})
try:
    for _ in range(100):
        w.append({"v": np.arange(20000)})
        w.commit()
except OSError as exc:
    assert exc.errno == errno.ENOSPC, exc
    print(exc)
    w.abort()
else:
    raise AssertionError("100 commits of 160 kB fit a 2 MiB disk")
"""


def test_a_full_disk_during_a_commit_names_the_store_and_its_workspace(tmp_path: Path) -> None:
    """A commit on a full disk raised a bare ``[Errno 28] No space left on device``, naming neither the
    store nor where it was writing. Runs in a mount namespace of its own with a 2 MiB tmpfs (skipped where
    user namespaces are not allowed)."""
    disk, got = run_on_small_tmpfs(_FULL_DISK, tmp_path, "2m")
    assert got.returncode == 0, (got.stdout, got.stderr[-2000:])
    assert f"{disk}/s.seqstore" in got.stdout and "/_tmp/" in got.stdout, got.stdout


_FULL_DISK_AT_CREATE = """
import errno, os, sys
import seqstore as ss
with open(sys.argv[1] + "/filler", "wb") as f:  # the disk full before the store is made
    try:
        while True:
            f.write(bytes(1 << 16))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
try:
    ss.create(sys.argv[1] + "/s.seqstore", {"v": ss.Field("int64")})
except OSError as exc:
    assert exc.errno == errno.ENOSPC, exc
    print(exc)
else:
    raise AssertionError("a store was made on a full disk")
print(sorted(os.listdir(sys.argv[1])))
"""


def test_a_full_disk_at_create_names_the_store(tmp_path: Path) -> None:
    """``create`` on a full disk raised a bare ``[Errno 28]`` (its manifest is written before any writer
    exists) and leaves nothing beside the filler."""
    disk, got = run_on_small_tmpfs(_FULL_DISK_AT_CREATE, tmp_path, "1m")
    assert got.returncode == 0, (got.stdout, got.stderr[-2000:])
    assert f"cannot write the store {disk}/s.seqstore" in got.stdout, got.stdout
    assert got.stdout.splitlines()[-1] == "['filler']", got.stdout


def test_open_or_create_with_another_schema_names_the_fields_that_differ(scratch: Path) -> None:
    """open_or_create on a store whose schema differs in one field of many: the error printed both schemas
    whole and left the reader to find the difference; it now names each field that differs and how."""
    from seqstore.store.writer import open_or_create

    root = scratch / "s"
    fields = {f"f{k:02d}": ss.Field("float32", (4,)) for k in range(30)}
    open_or_create(root, fields).close()
    other = dict(fields, f17=ss.Field("float16", (4,)), extra=ss.Field("int8"))
    del other["f03"]
    with pytest.raises(ss.SchemaError) as exc:
        open_or_create(root, other)
    text = str(exc.value)
    assert str(root) in text and "existing store has schema" in text
    assert f"field 'f17': {fields['f17']!r} in the store, {other['f17']!r} in the schema given" in text
    assert "field 'f03' only in the store" in text and "field 'extra' only in the schema given" in text
    assert workspaces(root) == []


def test_add_stats_on_a_closed_writer_is_an_error(scratch: Path) -> None:
    """add_stats after close() (or abort()) was accepted and the deltas silently never reached the manifest;
    it now says the writer is closed, as append and commit do."""
    root = scratch / "s"
    w = ss.create(root, {"x": ss.Field("int32")})
    w.add_stats({"n": 1})
    w.close()
    with pytest.raises(ss.SeqstoreError, match="writer is closed"):
        w.add_stats({"n": 2})
    assert ss.open(root).manifest.stats == {"n": 1}


def test_a_rejected_stats_delta_adds_none_of_its_keys(scratch: Path) -> None:
    """add_stats with a bad value (NaN) after good ones raised TypeError but kept the keys before it, which
    the next commit then added: a rejected call must leave nothing behind, as a rejected append does."""
    root = scratch / "s"
    with ss.create(root, {"x": ss.Field("int32")}) as w:
        with pytest.raises(TypeError, match="'bad'"):
            w.add_stats({"good": 1, "bad": float("nan")})
        w.add_stats({"other": 2})
    assert ss.open(root).manifest.stats == {"other": 2}


def test_a_value_out_of_range_in_a_batch_names_its_record(scratch: Path) -> None:
    """A value that does not fit the field's dtype in the middle of a large batch: the error named only the
    batch's first record (and a flat element number), leaving the caller to search the batch. It now names
    the record (and its id) that holds the first such value."""
    root = scratch / "s"
    with ss.create(root, {"i": ss.Field("int16", (2,)), "f": ss.Field("float16")}) as w:
        w.append_batch({"i": np.zeros((3, 2), np.int64), "f": np.zeros(3)}, ids=["a", "b", "c"])
        ints = np.zeros((1000, 2), np.int64)
        ints[700, 1] = 40000
        with pytest.raises(ss.SchemaError, match=r"record 703 \(id 'r700'\)"):
            w.append_batch({"i": ints, "f": np.zeros(1000)}, ids=[f"r{k}" for k in range(1000)])
        floats = np.zeros(1000)
        floats[12] = 1e6
        with pytest.raises(ss.SchemaError, match=r"record 15 \(id 'r12'\)"):
            w.append_batch({"i": np.zeros((1000, 2), np.int64), "f": floats}, ids=[f"r{k}" for k in range(1000)])


@pytest.mark.parametrize("make", ["create", "open_or_create"])
def test_a_writer_size_refused_at_create_leaves_no_store(scratch: Path, make: str) -> None:
    """create() (and open_or_create()) made the store and only then refused a size that is not positive:
    the empty store stayed at the path, and the corrected call found it there (FileExistsError). The
    sizes are now checked first; the error names the one refused and its value."""
    root = scratch / "s"
    with pytest.raises(ValueError, match="buffer_bytes must be positive, got 0"):
        getattr(ss.store.writer, make)(root, {"x": ss.Field("int64", ())}, buffer_bytes=0)
    assert not root.exists()
    ss.create(root, {"x": ss.Field("int64", ())}).close()


def test_a_stats_key_that_is_not_a_str_is_refused_at_add_stats(scratch: Path) -> None:
    """add_stats of something other than a dict was a bare AttributeError; and it took any key: a tuple made
    every later commit (and close) fail with JSON's TypeError, so the writer's records could only be given
    up; an int was saved as the string "1" and the next delta for 1 wrote the key a second time into
    manifest.json, where reading kept only the last count. Both are refused when added, naming the key; the
    writer stays usable."""
    root = scratch / "s"
    with ss.create(root, {"x": ss.Field("int32")}) as w:
        w.append({"x": 1})
        for key in (("a", "b"), 1):
            with pytest.raises(TypeError, match=re.escape(f"stats key {key!r} ({type(key).__name__}) must be a str")):
                w.add_stats({"ok": 1, key: 2})
        for not_a_dict in (None, [("a", 1)]):
            with pytest.raises(TypeError, match="add_stats takes a dict of str -> number"):
                w.add_stats(not_a_dict)  # type: ignore[arg-type]
        w.add_stats({"1": 2})
    st = ss.open(root)
    assert st.manifest.stats == {"1": 2} and len(st) == 1


@pytest.mark.parametrize("make", ["create", "open_or_create"])
def test_metadata_that_json_cannot_hold_is_refused_naming_its_key(scratch: Path, make: str) -> None:
    """metadata with a value JSON cannot hold (a NumPy number, a set) failed with json's bare TypeError,
    naming neither the metadata nor the key; a key that is not a str was saved as its string. Both are
    refused naming the key, and no store is made."""
    root = scratch / "s"
    for metadata, message in (({"ok": 1, "n": np.int64(3)}, "metadata 'n': JSON cannot hold its value"),
                              ({"tags": {"a"}}, "metadata 'tags'"), ({1: "x"}, "metadata key 1 .int. must be a str")):
        with pytest.raises(TypeError, match=message):
            getattr(ss.store.writer, make)(root, {"x": ss.Field("int64", ())}, metadata=metadata)
        assert not root.exists()
    ss.create(root, {"x": ss.Field("int64", ())}, metadata={"n": 3, "tags": ["a"]}).close()
    assert ss.open(root).metadata == {"n": 3, "tags": ["a"]}


def test_a_writer_size_that_is_not_an_int_is_refused_before_the_store_is_made(scratch: Path) -> None:
    """max_shard_records=2.5 made the store and then failed the first append_batch with a bare TypeError
    (slice indices must be integers); a str or None failed with Python's comparison error. Each is a
    TypeError naming the size, before anything is made. A NumPy int was taken, and then every commit of a
    shard that a batch filled failed (its record count a NumPy int JSON cannot save): it works now."""
    root = scratch / "s"
    for sizes, message in (({"max_shard_records": 2.5}, "max_shard_records must be a positive int, got float 2.5"),
                           ({"shard_bytes": "1GB"}, "shard_bytes must be a positive int, got str '1GB'"),
                           ({"buffer_bytes": None}, "buffer_bytes must be a positive int, got NoneType None"),
                           ({"max_shard_records": True}, "max_shard_records must be a positive int, got bool")):
        with pytest.raises(TypeError, match=re.escape(message)):
            ss.create(root, {"x": ss.Field("int64", ())}, **sizes)
        assert not root.exists()
    with ss.create(root, {"x": ss.Field("int64", ())}, max_shard_records=np.int64(4)) as w:
        w.append_batch({"x": np.arange(10)})
    assert ss.open(root).num_shards == 3


@pytest.mark.parametrize("make", ["create", "open_or_create"])
def test_a_store_path_under_a_file_names_the_file(scratch: Path, make: str) -> None:
    """create(path) where a directory above ``path`` is a file: the error was the parent mkdir's own
    "[Errno 17] File exists: '<that file>'" (or "[Errno 20] Not a directory"), naming neither the store
    nor what was wrong with the file. It now names both, and nothing is made."""
    from seqstore.store.writer import open_or_create

    (scratch / "f").write_bytes(b"x")
    fn = ss.create if make == "create" else open_or_create
    for path in (scratch / "f" / "s", scratch / "f" / "a" / "s"):
        with pytest.raises(NotADirectoryError, match=rf"{path}: cannot make the store: {scratch / 'f'} is a file, "
                                                     "not a directory"):
            fn(path, {"x": ss.Field("int32")})
    assert sorted(p.name for p in scratch.iterdir()) == ["f"] and (scratch / "f").read_bytes() == b"x"


@pytest.mark.parametrize("how", ["create", "open_or_create"])
def test_failed_first_open_leaves_no_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Ctrl-C while the writer of a store this call just made opens: no empty store is left in the way of
    the corrected call (create would find it exists; open_or_create would append with its settings)."""
    from seqstore.store import writer as api
    from seqstore.store.write import local

    def interrupted(root: Path, manifest: Any) -> None:
        raise KeyboardInterrupt("while the writer opened")

    root = tmp_path / "s"
    with monkeypatch.context() as m:
        m.setattr(local, "clean_orphans", interrupted)
        with pytest.raises(KeyboardInterrupt):
            getattr(api, how)(root, SCHEMA, metadata={"wrong": 1})
    assert not root.exists()
    assert not list(tmp_path.iterdir())
    with getattr(api, how)(root, SCHEMA, metadata={"right": 1}) as w:
        w.append(good(0))
    assert ss.open(root).metadata == {"right": 1}


def test_a_writer_interrupted_after_its_workspace_was_made_releases_it(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in Writer() after the target had made its workspace (and locked it) left the workspace held for
    the life of the process: create's new store could not be removed (a live writer's, as it looked) and an
    existing store kept a workspace no one would release."""
    from seqstore.store import writer as api
    from seqstore.store.write import writer as writer_mod

    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt("after the workspace was made")

    root = tmp_path / "s"
    with monkeypatch.context() as m:
        m.setattr(writer_mod, "RecordChecks", interrupted)
        with pytest.raises(KeyboardInterrupt):
            api.create(root, SCHEMA)
        assert not root.exists()
    with api.create(root, SCHEMA):
        pass
    with monkeypatch.context() as m:
        m.setattr(writer_mod, "RecordChecks", interrupted)
        with pytest.raises(KeyboardInterrupt):
            api.append_to(root)
    assert workspaces(root) == []
