"""The id hash: the numpy implementation (used for small batches before numba is loaded) gives the
numba kernel's hashes bit for bit, and ``hash_ids`` picks between them as documented. ``Store.ids``:
the ids of many records at once, as ``store.id`` gives them one by one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqstore as ss
from seqstore.store import ids as ids_mod
from seqstore.store.ids import _hash_numpy, encode_ids, hash_ids, hash_kernel, hash_one

MASK = (1 << 64) - 1


def reference_hash(key: bytes) -> int:
    """FNV-1a 64 then the splitmix64 finaliser (docs/format.md), in plain Python."""
    h = 0xCBF29CE484222325
    for byte in key:
        h = ((h ^ byte) * 0x100000001B3) & MASK
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & MASK
    return h ^ (h >> 31)


def both(data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(numpy hashes, kernel hashes) of the ids ``data[offsets[i]:offsets[i+1]]``."""
    out_np = np.empty(len(offsets) - 1, dtype=np.uint64)
    out_k = np.full(len(offsets) - 1, 7, dtype=np.uint64)
    _hash_numpy(data, offsets, out_np)
    hash_kernel(data, offsets, out_k)
    return out_np, out_k


def check_ids(id_list: list[str]) -> None:
    data, offsets = encode_ids(id_list)
    got, want = both(data, offsets)
    np.testing.assert_array_equal(got, want)
    assert [int(h) for h in got] == [reference_hash(s.encode("utf-8", "surrogatepass")) for s in id_list]


ids_text = st.text(st.characters(codec="utf-8"), max_size=40)  # ASCII, non-ASCII, empty


@given(st.lists(ids_text, min_size=1, max_size=60))
@settings(max_examples=150, deadline=None)
def test_numpy_hash_equals_kernel(id_list: list[str]) -> None:
    """Mixed lengths (empty ids included) and any unicode: the same hashes as the kernel."""
    check_ids(id_list)


# alphabets whose characters all have one utf-8 width (1, 2, 3 and 4 bytes), so that every id of a
# list has the same number of bytes: the loop never takes its ragged branch
SAME_WIDTH = [
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.characters(min_codepoint=0xC0, max_codepoint=0x24F),
    st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),
    st.characters(min_codepoint=0x1F300, max_codepoint=0x1F5FF),
]


@given(
    st.sampled_from(SAME_WIDTH).flatmap(
        lambda alphabet: st.integers(0, 12).flatmap(
            lambda n: st.lists(st.text(alphabet, min_size=n, max_size=n), min_size=1, max_size=40)
        )
    )
)
@settings(max_examples=100, deadline=None)
def test_numpy_hash_equals_kernel_same_lengths(id_list: list[str]) -> None:
    """All ids of one byte length (every position taken by every id)."""
    lengths = {len(s.encode()) for s in id_list}
    assert len(lengths) == 1
    check_ids(id_list)


@pytest.mark.parametrize(
    "id_list",
    [[""], [""] * 5, ["a"], ["", "a", ""], ["x" * 300, ""], ["é", "e", "\u00e9\u0301", "\U0001f600" * 3], ["\ud800"]],
)
def test_numpy_hash_examples(id_list: list[str]) -> None:
    """Edge cases: only empty ids, one long id among empty ones, a lone surrogate (surrogatepass)."""
    check_ids(id_list)
    data, offsets = encode_ids(id_list)
    assert [int(h) for h in hash_ids(data, offsets)] == [hash_one(s.encode("utf-8", "surrogatepass")) for s in id_list]


@given(st.lists(ids_text, min_size=2, max_size=40), st.data())
@settings(max_examples=100, deadline=None)
def test_numpy_hash_of_sliced_data(id_list: list[str], data_st: st.DataObject) -> None:
    """Offsets that do not start at 0 (a slice of a batch's offsets, and data behind other bytes)."""
    data, offsets = encode_ids(id_list)
    full = np.array([reference_hash(s.encode()) for s in id_list], dtype=np.uint64)
    a = data_st.draw(st.integers(0, len(id_list) - 1), label="first")
    b = data_st.draw(st.integers(a + 1, len(id_list)), label="end")
    got, want = both(data, offsets[a : b + 1])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, full[a:b])
    junk = np.frombuffer(b"\xff\x00junk", dtype=np.uint8)
    shifted = np.concatenate([junk, data])
    got, want = both(shifted, offsets + len(junk))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, full)
    got, want = both(shifted[1:], offsets[a : b + 1] + len(junk) - 1)  # a view not at its buffer's start
    np.testing.assert_array_equal(got, full[a:b])


class KernelSpy:
    """Stands in for ``hash_kernel``: counts calls; ``signatures`` says whether it counts as loaded."""

    def __init__(self, loaded: bool) -> None:
        self.signatures = (list(hash_kernel.signatures) or ["(stub)"]) if loaded else []
        self.calls = 0

    def __call__(self, data: Any, offsets: Any, out: Any) -> None:
        self.calls += 1
        hash_kernel(data, offsets, out)


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Count the calls of each implementation; the kernel counts as not yet loaded."""
    counts = {"numpy": 0}
    kernel = KernelSpy(loaded=False)

    def numpy_spy(data: Any, offsets: Any, out: Any) -> None:
        counts["numpy"] += 1
        _hash_numpy(data, offsets, out)

    monkeypatch.setattr(ids_mod, "hash_kernel", kernel)
    monkeypatch.setattr(ids_mod, "_hash_numpy", numpy_spy)
    return {"counts": counts, "kernel": kernel}


def _batch(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    id_list = [f"rank3/epoch{k % 7}/example-{k}" + "é" * (k % 4) for k in range(n)]
    data, offsets = encode_ids(id_list)
    want = np.empty(n, dtype=np.uint64)
    hash_kernel(data, offsets, want)
    return data, offsets, want


def _cost(offsets: np.ndarray) -> int:
    """What the numpy path costs: ids x longest id."""
    return (len(offsets) - 1) * int(np.diff(offsets).max())


def test_hash_ids_below_the_limit_uses_numpy(spies: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    data, offsets, want = _batch(500)
    monkeypatch.setattr(ids_mod, "NUMPY_HASH_BYTES", _cost(offsets))  # exactly at the limit: numpy
    np.testing.assert_array_equal(hash_ids(data, offsets), want)
    assert spies["counts"]["numpy"] == 1 and spies["kernel"].calls == 0
    # a slice of the batch: only its own ids count
    monkeypatch.setattr(ids_mod, "NUMPY_HASH_BYTES", _cost(offsets[100:301]))
    np.testing.assert_array_equal(hash_ids(data, offsets[100:301]), want[100:300])
    assert spies["counts"]["numpy"] == 2 and spies["kernel"].calls == 0


def test_hash_ids_above_the_limit_uses_the_kernel(spies: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    data, offsets, want = _batch(500)
    monkeypatch.setattr(ids_mod, "NUMPY_HASH_BYTES", _cost(offsets) - 1)
    np.testing.assert_array_equal(hash_ids(data, offsets), want)
    assert spies["counts"]["numpy"] == 0 and spies["kernel"].calls == 1
    monkeypatch.setattr(ids_mod, "NUMPY_HASH_BYTES", 16)
    np.testing.assert_array_equal(hash_ids(data, offsets[100:301]), want[100:300])
    assert spies["counts"]["numpy"] == 0 and spies["kernel"].calls == 2


def test_one_long_id_among_short_ones_uses_the_kernel(spies: dict[str, Any]) -> None:
    """Few total bytes but one very long id: the numpy path would loop over every byte position for
    every id (ids x longest id), so the kernel takes it."""
    id_list = [f"s{k}" for k in range(20_000)] + ["x" * 20_000]
    data, offsets = encode_ids(id_list)
    assert offsets[-1] < ids_mod.NUMPY_HASH_BYTES < _cost(offsets)
    want = np.empty(len(id_list), dtype=np.uint64)
    hash_kernel(data, offsets, want)
    np.testing.assert_array_equal(hash_ids(data, offsets), want)
    assert spies["counts"]["numpy"] == 0 and spies["kernel"].calls == 1


def test_hash_ids_uses_a_loaded_kernel(spies: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the kernel is compiled/loaded in the process, small batches go to it as well."""
    kernel = KernelSpy(loaded=True)
    monkeypatch.setattr(ids_mod, "hash_kernel", kernel)
    data, offsets, want = _batch(50)
    np.testing.assert_array_equal(hash_ids(data, offsets), want)
    assert spies["counts"]["numpy"] == 0 and kernel.calls == 1


def test_hash_ids_of_no_ids(spies: dict[str, Any]) -> None:
    out = hash_ids(np.zeros(0, np.uint8), np.zeros(1, np.int64))
    assert out.dtype == np.uint64 and out.shape == (0,)
    assert spies["counts"]["numpy"] == 0 and spies["kernel"].calls == 0


def test_default_limit_batch_goes_to_numpy(spies: dict[str, Any]) -> None:
    """With the real NUMPY_HASH_BYTES, a logger-sized batch (thousands of ids) is hashed with numpy."""
    data, offsets, want = _batch(5000)
    assert _cost(offsets) <= ids_mod.NUMPY_HASH_BYTES
    np.testing.assert_array_equal(hash_ids(data, offsets), want)
    assert spies["counts"]["numpy"] == 1 and spies["kernel"].calls == 0


def test_a_long_id_uses_the_kernel(spies: dict[str, Any]) -> None:
    """The numpy path takes one Python step per byte of the longest id: a few long ids go to the kernel."""
    id_list = ["a", "x" * (ids_mod.NUMPY_HASH_LONGEST + 1)]
    data, offsets = encode_ids(id_list)
    want = np.empty(2, dtype=np.uint64)
    hash_kernel(data, offsets, want)
    np.testing.assert_array_equal(hash_ids(data, offsets), want)
    assert spies["counts"]["numpy"] == 0 and spies["kernel"].calls == 1


def test_the_logger_warm_up_loads_the_hash_kernel() -> None:
    """The warm-up must load the numba kernel itself (hash_ids would take the numpy path for its id)."""
    import seqstore.log.logger as logger_mod

    logger_mod._warm_up_kernels()
    assert ids_mod.hash_kernel.signatures


# ------------------------------------------------------------------------------ Store.ids


def _ids_store(root: Path, n: int, *, shard: int, ids: bool = True) -> list[str]:
    """A store of ``n`` records in shards of ``shard`` records; its ids (ASCII, non-ASCII, empty)."""
    names = [("" if i % 7 == 3 else f"record-{i}-" + "ü€😀"[: i % 4] + "x" * (i % 5)) for i in range(n)]
    lengths = np.arange(n, dtype=np.int64) % 3
    with ss.create(root, {"v": ss.Field("int32", (None,))}, max_shard_records=shard) as w:
        w.append_batch({"v": (np.ones(int(lengths.sum()), np.int32), lengths)}, ids=names if ids else None)
    return names


def _decoded(data: np.ndarray, offsets: np.ndarray) -> list[str]:
    return [bytes(data[offsets[j] : offsets[j + 1]]).decode("utf-8") for j in range(len(offsets) - 1)]


def test_store_ids_equal_id_of_each_record(tmp_path: Path) -> None:
    """Random indices over several shards (repeats, any order, negative ones): the same ids as
    ``store.id(i)``, as uint8 bytes and int64 offsets from 0."""
    names = _ids_store(tmp_path / "s", 103, shard=10)
    store = ss.open(tmp_path / "s")
    assert store.num_shards == 11
    rng = np.random.default_rng(5)
    for size in (1, 2, 17, 103, 400):
        idx = rng.integers(-103, 103, size=size)
        data, offsets = store.ids(idx)
        assert data.dtype == np.uint8 and offsets.dtype == np.int64 and offsets.shape == (size + 1,)
        assert offsets[0] == 0 and offsets[-1] == len(data)
        assert _decoded(data, offsets) == [store.id(int(i)) for i in idx] == [names[int(i)] for i in idx]
    # a list, consecutive records of one shard (a view of the mapped ids) and across shards
    for idx in ([12, 13, 14, 15], list(range(20, 30)), list(range(5, 35)), [9, 8, 7]):
        data, offsets = store.ids(idx)
        assert _decoded(data, offsets) == [names[i] for i in idx]
    assert store.ids(np.arange(20, 30))[0].flags.writeable is False  # one shard's run: the mapped bytes


def test_store_ids_of_no_records(tmp_path: Path) -> None:
    _ids_store(tmp_path / "s", 12, shard=5)
    store = ss.open(tmp_path / "s")
    for empty in ([], np.array([], dtype=np.int64), np.array([], dtype=np.float64)):
        data, offsets = store.ids(empty)
        assert data.dtype == np.uint8 and len(data) == 0
        assert offsets.dtype == np.int64 and offsets.tolist() == [0]


def test_store_ids_errors(tmp_path: Path) -> None:
    """No ids: KeyError naming the store; an index out of range: IndexError naming it."""
    _ids_store(tmp_path / "none", 6, shard=4, ids=False)
    store = ss.open(tmp_path / "none")
    with pytest.raises(KeyError, match="none.*no ids"):
        store.ids([0, 1])
    _ids_store(tmp_path / "s", 6, shard=4)
    with pytest.raises(IndexError, match="record index 6 out of range"):
        ss.open(tmp_path / "s").ids([0, 6])


def test_store_ids_of_a_remote_store(moto_s3: Any, s3_bucket: str, tmp_path: Path) -> None:
    """A store on s3:// (moto; uploaded, not written by seqstore): the ids are fetched into the node
    cache before they are read (shards of 3000 ids, far more than the first and last 4 KiB of each id
    file that opening a shard fetches), equal to the local store's."""
    names = _ids_store(tmp_path / "s", 9000, shard=3000)
    url = moto_s3.upload_dir(tmp_path / "s", s3_bucket, "ids/s.seqstore")
    store = ss.open(url, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "cache")
    idx = np.random.default_rng(2).integers(0, 9000, size=300)
    data, offsets = store.ids(idx)
    assert _decoded(data, offsets) == [names[i] for i in idx]
    fresh = ss.open(url, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "cache2")
    data, offsets = fresh.ids(np.arange(4000, 5000))  # one shard's records in a row: a view of the cache
    assert _decoded(data, offsets) == names[4000:5000]


def test_store_ids_and_index_many_of_an_empty_store(tmp_path: Path) -> None:
    """A store of 0 records: ids([]) is empty (as index_many([]) is); an index is out of range."""
    with ss.create(tmp_path / "s", {"v": ss.Field("int32", (None,))}):
        pass
    store = ss.open(tmp_path / "s")
    data, offsets = store.ids([])
    assert len(data) == 0 and offsets.tolist() == [0]
    with pytest.raises(IndexError, match="out of range"):
        store.ids([0])
    with pytest.raises(IndexError, match="out of range"):
        store.id(0)
    assert store.index_many([]).tolist() == []
    assert store.index_many(["a"], missing=np.int64(-7)).tolist() == [-7]


def test_index_many_checks_missing_up_front(tmp_path: Path) -> None:
    """missing= other than "error" or an int: a ValueError naming the allowed values, whether or not an
    id is missing (before: int()'s ValueError, and only when one was)."""
    names = _ids_store(tmp_path / "s", 6, shard=4)
    store = ss.open(tmp_path / "s")
    for bad in ("skip", None, 1.5, True):
        for query in (names[:2], ["absent"], []):
            with pytest.raises(ValueError, match="missing.*'error' or an int"):
                store.index_many(query, missing=bad)  # type: ignore[arg-type]
    assert store.index_many(["absent", names[1]], missing=np.int32(-2)).tolist() == [-2, 1]


def test_lookups_of_non_str_ids_name_the_query_position_and_type(tmp_path: Path) -> None:
    """index_many with an int among the ids: a TypeError naming its position in the query and its type
    (not "record 0", which is a writer's word); index(5) says that an int id is stored as its decimal
    string (docs/logging.md), so the lookup is index("5")."""
    names = _ids_store(tmp_path / "s", 6, shard=4)
    store = ss.open(tmp_path / "s")
    with pytest.raises(TypeError, match=r"id 1 of the query.*int 5.*decimal string.*index\('5'\)"):
        store.index_many([names[0], 5])
    with pytest.raises(TypeError, match=r"id 0 of the query.*bytes b'x'") as info:
        store.index_many([b"x"])  # type: ignore[list-item]
    assert "decimal" not in str(info.value)
    with pytest.raises(TypeError, match=r"s: ids are str, got int 5.*decimal string.*index\('5'\)"):
        store.index(5)  # type: ignore[arg-type]


def test_uint64_indices_past_int64_are_out_of_range(tmp_path: Path) -> None:
    """A uint64 index of 2**63 or more wrapped to a negative int64 and was read counted from the end
    (2**64 - 1 gave the last record); it is an IndexError naming the index, in every batch read."""
    _ids_store(tmp_path / "s", 6, shard=4)
    store = ss.open(tmp_path / "s")
    big = np.array([1, 2**64 - 1], dtype=np.uint64)
    for read in (store.get_batch, store.ids):
        with pytest.raises(IndexError, match=f"record index {2**64 - 1} out of range"):
            read(big)
    assert _decoded(*store.ids(np.array([5], dtype=np.uint64))) == [store.id(5)]  # (in range: as before)


def test_index_many_of_one_str_is_a_type_error(tmp_path: Path) -> None:
    """index_many("r1") looked up each character as an id: a KeyError for ids 'r' and '1' nobody asked
    for, or with missing=-1 one -1 per character, silently. One str (or bytes) is a TypeError that says
    to pass a list, or to use index(); an empty store says the same."""
    names = _ids_store(tmp_path / "s", 6, shard=4)
    store = ss.open(tmp_path / "s")
    for query in (names[1], names[1].encode()):
        for missing in ("error", -1):
            with pytest.raises(TypeError, match=r"index_many takes a sequence of ids.*index\(\)"):
                store.index_many(query, missing=missing)  # type: ignore[arg-type]
    assert store.index_many([names[1]]).tolist() == [1]
    with ss.create(tmp_path / "e", {"v": ss.Field("int32", ())}):
        pass
    with pytest.raises(TypeError, match="index_many takes a sequence of ids"):
        ss.open(tmp_path / "e").index_many("abc", missing=-1)


def test_index_encoded_checks_the_query_it_is_given(tmp_path: Path) -> None:
    """index_encoded(qdata, qoff) handed its arguments to numba kernels unchecked: offsets past the bytes
    read memory past the array (a bus error killed the process), a list of offsets was an IndexError
    about 0-d arrays. Bytes and any integer offsets are taken; offsets that do not run from 0, decrease
    or pass the bytes are a ValueError naming the offset, other arrays a TypeError."""
    names = _ids_store(tmp_path / "s", 6, shard=4)
    store = ss.open(tmp_path / "s")
    data, off = encode_ids([names[1], "absent", names[4]])
    assert store.index_encoded(data, off).tolist() == [1, -1, 4]
    assert store.index_encoded(data.tobytes(), off.astype(np.uint32).tolist()).tolist() == [1, -1, 4]
    for bad in (off[1:], off[::-1], np.array([0, 2, 1]), np.array([0, -1]), np.array([0, 2**63], np.uint64),
                np.array([], np.int64), off + np.array([0, 0, 0, 10**9])):
        with pytest.raises(ValueError, match="index_encoded"):
            store.index_encoded(data, bad)
    for bad_data, bad_off in ((data.reshape(1, -1), off), (data.astype(np.int64), off), (data, off.astype(float))):
        with pytest.raises(TypeError, match="index_encoded takes"):
            store.index_encoded(bad_data, bad_off)
