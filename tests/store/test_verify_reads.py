"""Verified reads: ``seqstore.open(path, verify_reads=True)`` checks every record a read returns against
the per-record checksums its shard was committed with (``_checks.npy``), and names the file, record
and field of a mismatch. A flipped bit in a value file, an offsets file or an id file is caught."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
from store_testlib import create_legacy, edit_shard_meta

import seqstore as ss
from seqstore.errors import ConfigError
from seqstore.format.checksums import CHECKS, SECRET_AT, span_checks
from seqstore.format.npy import read_header
from seqstore.store.read.verify import gather_rows_checked
from seqstore.store.verify import verify

SCHEMA = {
    "x": ss.Field("float32", (4,)),
    "t": ss.Field("int16", (None, 2)),
    "lab": ss.Field("int64"),
}
N = 300


def _record(i: int) -> dict[str, Any]:
    return {
        "x": np.full(4, i, np.float32),
        "t": np.arange(2 * (1 + i % 5), dtype=np.int16).reshape(-1, 2) + i,
        "lab": i,
    }


def _build(root: Path, *, packed: Any = None, ids: bool = True, shard_records: int = 128) -> Path:
    with ss.create(root, SCHEMA, packed=packed, max_shard_records=shard_records) as w:
        for i in range(N):
            w.append(_record(i), id=f"rec-{i}" if ids else None)
    return root


def _flip(path: Path, byte: int, bit: int = 0) -> None:
    """Flip one bit of byte ``byte`` of the data (after the ``.npy`` header) of ``path``."""
    at = read_header(path).data_offset + byte
    raw = bytearray(path.read_bytes())
    raw[at] ^= 1 << bit
    path.write_bytes(bytes(raw))


def _shard_of(root: Path, k: int) -> Path:
    return root / f"shard-{k:06d}"


def test_intact_reads_are_the_same_with_and_without_verification(scratch: Path) -> None:
    root = _build(scratch / "s")
    plain, checked = ss.open(root), ss.open(root, verify_reads=True)
    idx = np.array([5, 299, 0, 128, 77, 200, 5])
    for pad in (False, True):
        a, b = plain.get_batch(idx, pad=pad), checked.get_batch(idx, pad=pad)
        assert np.array_equal(a["x"], b["x"]) and np.array_equal(a["lab"], b["lab"])
        assert np.array_equal(a["t"][0], b["t"][0]) and np.array_equal(a["t"][1], b["t"][1])
    for i in (0, 131, 299):
        assert np.array_equal(plain[i]["t"], checked[i]["t"])
        assert np.array_equal(checked.nested(i, copy=True)["x"], plain[i]["x"])
        assert checked.id(i) == f"rec-{i}"
    data, off = checked.ids(idx)
    assert bytes(data[off[1] : off[2]]) == b"rec-299"
    assert checked.index("rec-250") == 250
    got = list(checked.iter_batches([np.arange(0, 150), np.arange(150, N)]))
    assert np.array_equal(np.concatenate([g["lab"] for g in got]), np.arange(N))


def test_the_checksums_are_xxh3_of_each_records_bytes(scratch: Path) -> None:
    xxhash = pytest.importorskip("xxhash")
    root = _build(scratch / "s")
    checks = np.load(_shard_of(root, 0) / CHECKS)
    assert checks.shape == (128, 4) and checks.dtype == np.dtype("<u4")  # x, t, lab, ids
    rec = _record(7)
    for c, value in enumerate([rec["x"].tobytes(), rec["t"].tobytes(), np.int64(7).tobytes(), b"rec-7"]):
        assert int(checks[7, c]) == xxhash.xxh3_64_intdigest(value) & 0xFFFFFFFF
    buf = np.random.default_rng(3).integers(0, 256, 5000, dtype=np.uint8)
    for n in (*range(0, 260), 1023, 1024, 1025, 4000):
        assert span_checks(buf, [1], [n])[0] == xxhash.xxh3_64_intdigest(buf[1 : 1 + n].tobytes()) & 0xFFFFFFFF


def test_copying_and_hashing_in_one_pass_gives_the_bytes_and_their_xxh3(scratch: Path) -> None:
    """Verified gathers copy and hash a record in one pass: the copy is exact (nothing written outside
    it) and its checksum is XXH3's at every length, across the 1 KiB blocks and a ragged last stripe."""
    xxhash = pytest.importorskip("xxhash")
    buf = np.random.default_rng(4).integers(0, 256, 70_000, dtype=np.uint8)
    lengths = (*range(0, 300), 1023, 1024, 1025, 2048, 4033, 65_536)
    for n in lengths:
        out = np.zeros(n + 9, np.uint8)
        rows = np.array([0], np.int64)
        sums = np.zeros(1, np.uint32)
        offsets = np.array([3, 3 + n], np.int64)  # one record of n one-byte rows, from byte 3
        gather_rows_checked(buf, offsets, rows, out, np.array([5], np.int64), 1, sums, rows, SECRET_AT)
        assert (out[5 : 5 + n] == buf[3 : 3 + n]).all() and not out[:5].any() and not out[5 + n :].any(), n
        assert int(sums[0]) == xxhash.xxh3_64_intdigest(buf[3 : 3 + n].tobytes()) & 0xFFFFFFFF, n
    # a long ragged record read verified is the same with and without verification
    big = {"t": ss.Field("int16", (None, 2))}
    with ss.create(scratch / "long", big) as w:
        for i in range(20):
            w.append({"t": np.arange(2 * (300 + 977 * i), dtype=np.int16).reshape(-1, 2)})
    plain, checked = ss.open(scratch / "long"), ss.open(scratch / "long", verify_reads=True)
    idx = np.array([19, 3, 0, 11, 11])
    for a, b in zip(plain.get_batch(idx)["t"], checked.get_batch(idx)["t"]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize(
    ("rel", "byte", "record", "field", "named"),
    [
        ("x.npy", 3 * 16 + 2, 3, "x", "x.npy"),  # record 3's third value
        ("lab.npy", 10 * 8, 10, "lab", "lab.npy"),
        ("t.npy", 0, 0, "t", "t.npy or t.offsets.npy"),  # record 0's first row
        ("t.offsets.npy", 2 * 8, 1, "t", "t.npy or t.offsets.npy"),  # off[2]: 3 -> 2 (records 1 and 2 move)
    ],
)
def test_a_flipped_bit_in_a_value_or_offsets_file_is_caught(
    scratch: Path, rel: str, byte: int, record: int, field: str, named: str
) -> None:
    root = _build(scratch / "s")
    _flip(_shard_of(root, 0) / rel, byte)
    plain = ss.open(root)
    plain.get_batch([record])  # unverified: the damaged bytes are read back without a word
    store = ss.open(root, verify_reads=True)
    with pytest.raises(ss.CorruptionError) as exc:
        store.get_batch([200, record, 50])
    msg = str(exc.value)
    assert f"shard-000000/{named}" in msg and f"record {record} " in msg and f"field {field!r}" in msg
    with pytest.raises(ss.CorruptionError, match=f"record {record} "):
        store[record]
    with pytest.raises(ss.CorruptionError, match=f"field {field!r}"):
        store.get_batch([record], pad=True)
    with pytest.raises(ss.CorruptionError, match=f"record {record} "):
        list(store.iter_batches([np.arange(0, 64)]))
    if field == "t":  # streamed blocks of a ragged field are checked too
        with pytest.raises(ss.CorruptionError, match=f"record {record} "):
            list(store.iter_ragged("t", chunk_records=50))
    store.get_batch([record + 100, 299])  # records elsewhere still read


def test_bfloat16_fields_are_checked_as_stored(scratch: Path) -> None:
    with ss.create(scratch / "b", {"w": ss.Field("bfloat16", (3,)), "v": ss.Field("bfloat16", (None,))}) as w:
        for i in range(20):
            w.append({"w": np.full(3, i, np.float32), "v": np.arange(i % 4, dtype=np.float32)})
    store = ss.open(scratch / "b", bfloat16="float32", verify_reads=True)
    got = store.get_batch(np.arange(20))
    assert got["w"].dtype == np.float32 and got["w"][7].tolist() == [7.0, 7.0, 7.0]
    assert store[3]["v"].tolist() == [0.0, 1.0, 2.0]
    _flip(_shard_of(scratch / "b", 0) / "w.npy", 5 * 6)  # record 5's first value (3 x 2 bytes a record)
    with pytest.raises(ss.CorruptionError, match="record 5 .*field 'w'"):
        store.get_batch([5])


def test_a_flipped_bit_in_a_packed_group_is_caught_naming_the_field(scratch: Path) -> None:
    root = _build(scratch / "s", packed={"g": ["x"]})
    _flip(_shard_of(root, 1) / "g.npy", 5 * 16 + 1)  # record 128 + 5 (rows of 4 float32)
    store = ss.open(root, verify_reads=True)
    with pytest.raises(ss.CorruptionError, match=r"shard-000001/g\.npy: record 133 \(row 5 of the shard\), field 'x'"):
        store.get_batch([133])
    assert store.get_batch([133], fields=["lab", "t"])["lab"][0] == 133


@pytest.mark.parametrize(("rel", "byte"), [("_ids.npy", 5 * 6 + 1), ("_ids.offsets.npy", 7 * 8)])
def test_a_flipped_bit_in_an_id_file_is_caught(scratch: Path, rel: str, byte: int) -> None:
    root = _build(scratch / "s")
    _flip(_shard_of(root, 0) / rel, byte)
    store = ss.open(root, verify_reads=True)
    rec = 6
    where = rf"shard-000000/_ids\.npy or _ids\.offsets\.npy: record {rec} .*its id"
    with pytest.raises(ss.CorruptionError, match=where):
        store.id(rec)
    with pytest.raises(ss.CorruptionError, match=f"record {rec} "):
        store.ids([1, rec, 250])
    with pytest.raises(ss.CorruptionError, match=f"record {rec} "):  # the candidate of a lookup is checked too
        store.index(f"rec-{rec}")
    assert store.get_batch([rec])["lab"][0] == rec  # the values are intact


def test_a_damaged_index_entry_of_a_last_id_store_is_named_not_answered_with_an_older_copy(scratch: Path) -> None:
    """id_lookup "last" (a keep_last log): a flipped bit in the shard index that holds an id's last copy
    made the lookup miss that copy and answer the older one; a candidate whose id does not have the hash it
    was found under is now a damaged index, named."""
    root = scratch / "s"
    with ss.create(root, SCHEMA, id_lookup="last", max_shard_records=4) as w:
        for i, name in enumerate(["a", "dup", "b", "c", "d", "dup", "e", "f"]):
            w.append(_record(i), id=name)
    path = _shard_of(root, 1) / "_ids.hash_rows.npy"
    rows = np.load(path)
    j = int(np.flatnonzero(rows == 1)[0])  # the entry of "dup" (row 1 of shard 1, record 5)
    _flip(path, 8 * j)  # now it names row 0 (record 4, id "d")
    for store in (ss.open(root, verify_reads=True), ss.open(root)):  # (a single local lookup has its own path)
        assert store.index("a") == 0 and store.index("e") == 6
        with pytest.raises(ss.CorruptionError, match="id index .* names record 4 for an id of another hash"):
            store.index("dup")
        with pytest.raises(ss.CorruptionError, match="id index"):
            store.index_many(["dup"])


def test_a_damaged_index_entry_of_a_first_id_store_is_named_on_every_lookup_path(scratch: Path) -> None:
    """id_lookup "first": an index entry that names the row of another id made the numba fast path (a
    local store's own shard index, index_many without verify_reads) answer KeyError, as if the id were
    not stored, where the other paths name the damage; and an index row out of range named the store, not
    the file. Both now name the shard's index files."""
    root = scratch / "s"
    with ss.create(root, SCHEMA, max_shard_records=4) as w:
        for i, name in enumerate(["a", "b", "c", "d", "e", "f"]):
            w.append(_record(i), id=name)
    path = _shard_of(root, 0) / "_ids.hash_rows.npy"
    rows = np.load(path)
    j = int(np.flatnonzero(rows == 1)[0])  # the entry of "b" (row 1 of shard 0)
    _flip(path, 8 * j + 1)  # now it names row 257 (out of range)
    for store in (ss.open(root), ss.open(root, verify_reads=True)):
        with pytest.raises(ss.CorruptionError, match="shard-000000/_ids.hash.npy or _ids.hash_rows.npy"):
            store.index_many(["b"])
    _flip(path, 8 * j + 1)
    _flip(path, 8 * j)  # now it names row 0 (id "a")
    for store in (ss.open(root), ss.open(root, verify_reads=True)):
        assert store.index_many(["a", "e"]).tolist() == [0, 4]
        for lookup in (store.index, lambda i, s=store: s.index_many([i])):
            with pytest.raises(ss.CorruptionError, match="shard-000000/_ids.hash.npy or _ids.hash_rows.npy"):
                lookup("b")


@pytest.mark.parametrize("lookup", ["first", "last"])
def test_an_index_entry_naming_the_other_copy_of_its_id_is_damage_not_an_answer(scratch: Path, lookup: str) -> None:
    """An id stored twice in one shard (a keep_last log): a damaged index entry that names the row of the
    other copy (both entries of that hash now name one row) made every lookup answer the wrong copy (the
    older one of a keep_last log), with or without verify_reads. The rows of one hash must ascend."""
    root = scratch / "s"
    with ss.create(root, SCHEMA, id_lookup=lookup) as w:
        for i, name in enumerate(["dup", "a", "b", "dup", "c"]):
            w.append(_record(i), id=name)
    path = _shard_of(root, 0) / "_ids.hash_rows.npy"
    rows = np.load(path)
    j = int(np.flatnonzero(rows == (3 if lookup == "last" else 0))[0])  # the entry of the copy looked up
    raw = bytearray(path.read_bytes())  # make it name the other copy of "dup"
    at = read_header(path).data_offset + 8 * j
    raw[at : at + 8] = np.int64(0 if lookup == "last" else 3).tobytes()
    path.write_bytes(bytes(raw))
    for store in (ss.open(root), ss.open(root, verify_reads=True)):
        assert store.index("a") == 1 and store.index_many(["c", "b"]).tolist() == [4, 2]
        for find in (store.index, lambda i, s=store: int(s.index_many([i])[0])):
            with pytest.raises(ss.CorruptionError, match="_ids.hash_rows.npy: .*one hash out of order"):
                find("dup")


def test_a_store_without_checksums_is_refused_by_name(scratch: Path) -> None:
    legacy = create_legacy(scratch / "v1", SCHEMA)
    with legacy as w:
        w.append(_record(0))
    ss.open(scratch / "v1")[0]  # opens and reads as before
    with pytest.raises(ss.SeqstoreError, match="version-1 store does not have"):
        ss.open(scratch / "v1", verify_reads=True)
    # a version-3 store whose first shard was written before verified reads (no "checks" in its descriptor)
    root = _build(scratch / "s")
    (_shard_of(root, 0) / CHECKS).unlink()
    edit_shard_meta(root, 0, lambda d: d.pop("checks"))
    assert ss.open(root)[5]["lab"] == 5
    assert verify(root) == []
    store = ss.open(root, verify_reads=True)
    assert store[200]["lab"] == 200  # shard 1 has its checksums
    with pytest.raises(ss.SeqstoreError, match="shard-000000: this shard was written without per-record checksums"):
        store.get_batch([5])


def test_verify_finds_a_damaged_checksum_file_and_copies_keep_it(scratch: Path) -> None:
    root = _build(scratch / "s")
    ss.copy(root, scratch / "c")
    assert (_shard_of(scratch / "c", 1) / CHECKS).exists()
    assert ss.open(scratch / "c", verify_reads=True).get_batch(np.arange(N))["lab"].sum() == N * (N - 1) // 2
    _flip(_shard_of(root, 1) / CHECKS, 2 * 16 + 9)  # record 130's checksum of lab
    problems = verify(root)
    assert len(problems) == 1 and CHECKS in problems[0] and "CRC-32" in problems[0]
    with pytest.raises(ss.CorruptionError, match=f"record 130 .*{CHECKS}"):
        ss.open(root, verify_reads=True).get_batch([130])


@pytest.mark.parametrize("old, new", [(b"'<u4'", b"'<i4'"), (b"(172, 4)", b"(172, 3)")])
def test_verify_finds_a_damaged_header_of_the_checksum_file(scratch: Path, old: bytes, new: bytes) -> None:
    """The CRC-32 covers the data after the header: a damaged header of _checks.npy (its dtype or shape)
    keeps size and CRC, and must be found by the structural check as in every other file, since
    verified reads refuse the file."""
    root = _build(scratch / "s")
    path = _shard_of(root, 2) / CHECKS  # shard 2: records 256..299, 44 of them
    raw = path.read_bytes()
    at = read_header(path).data_offset
    old, new = old.replace(b"172", b"44"), new.replace(b"172", b"44")
    assert old in raw[:at]
    path.write_bytes(raw[:at].replace(old, new, 1) + raw[at:])
    with pytest.raises(ss.CorruptionError, match=CHECKS):
        ss.open(root, verify_reads=True).get_batch([260])
    problems = verify(root)
    assert len(problems) == 1 and str(path) in problems[0], problems


def test_a_pickled_store_keeps_verifying(scratch: Path) -> None:
    root = _build(scratch / "s")
    store = pickle.loads(pickle.dumps(ss.open(root, verify_reads=True)))
    _flip(_shard_of(root, 2) / "lab.npy", 8 * 3)
    with pytest.raises(ss.CorruptionError, match="record 259 "):
        store.get_batch([259])


def test_verify_reads_on_a_url(moto_s3: Any, s3_bucket: str, scratch: Path, tmp_path: Path) -> None:
    root = _build(scratch / "s")
    _flip(_shard_of(root, 1) / "t.npy", 40)
    url = moto_s3.upload_dir(root, s3_bucket, "verified.seqstore")
    plain = ss.open(url, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "c1")
    assert len(plain.get_batch(np.arange(128, 140))["lab"]) == 12  # unverified: no error
    opts = moto_s3.storage_options(verify_reads="true")
    store = ss.open(url, storage_options=opts, cache_dir=tmp_path / "c2")
    assert np.array_equal(store.get_batch([0, 299, 5])["lab"], [0, 299, 5])
    with pytest.raises(ss.CorruptionError) as exc:
        store.get_batch(np.arange(120, 140))
    assert "verified.seqstore/shard-000001/t.npy or t.offsets.npy: record" in str(exc.value)
    assert "field 't'" in str(exc.value)
    # read-once runs (iter_batches into memory of the reader's own, not the node cache): the same check
    once = ss.open(url, storage_options=moto_s3.storage_options(verify_reads="true", read_once="true"),
                   cache_dir=tmp_path / "c3")
    assert once.read_once
    got = list(once.iter_batches([np.arange(0, 100), np.arange(200, 300)]))
    assert np.array_equal(np.concatenate([g["lab"] for g in got]), np.r_[0:100, 200:300])
    with pytest.raises(ss.CorruptionError, match="field 't'"):
        list(once.iter_batches([np.arange(100, 140)]))


def _cached_copy(cache: Path, original: Path) -> Path:
    """The node cache's data file holding the object whose bytes are ``original``'s."""
    want = original.read_bytes()
    (hit,) = [p for p in (cache / "objects").glob("*/*.data") if p.read_bytes() == want]
    return hit


def _damage_copy(copy: Path, original: Path, byte: int) -> None:
    raw = bytearray(copy.read_bytes())
    raw[read_header(original).data_offset + byte] ^= 1
    with open(copy, "r+b") as f:  # in place: the reader's mapping of the copy sees the damage
        f.write(bytes(raw))


def test_a_damaged_node_cache_copy_is_fetched_again_by_a_verified_read(moto_s3: Any, s3_bucket: str, scratch: Path,
                                                                      tmp_path: Path) -> None:
    """A verified read of a remote store whose node-cache copy of a shard's file is damaged (the store's
    object intact) raised CorruptionError blaming the remote object on every read, until the cache was
    deleted by hand. The shard's files are fetched again once and the read retried; the store's own
    damage still raises (test_verify_reads_on_a_url)."""
    root = _build(scratch / "s")
    url = moto_s3.upload_dir(root, s3_bucket, "recached.seqstore")
    cache = tmp_path / "c"
    store = ss.open(url, storage_options=moto_s3.storage_options(verify_reads="true"), cache_dir=cache)
    assert len(store.get_batch(np.arange(N))["lab"]) == N  # every object whole in the node cache
    plain = ss.open(root)
    t_file, checks = _shard_of(root, 1) / "t.npy", _shard_of(root, 1) / CHECKS
    t_copy, checks_copy = _cached_copy(cache, t_file), _cached_copy(cache, checks)

    def same(got: Any, idx: Any) -> bool:
        want = plain.get_batch(idx)
        return all(np.array_equal(np.asarray(got[k][0] if isinstance(got[k], tuple) else got[k]),
                                  np.asarray(want[k][0] if isinstance(want[k], tuple) else want[k])) for k in want)

    _damage_copy(t_copy, t_file, 40)
    assert same(store.get_batch(np.arange(120, 140)), np.arange(120, 140))
    _damage_copy(t_copy, t_file, 40)  # (row 10 of the shard's t: record 131's)
    assert np.array_equal(store[131]["t"], plain[131]["t"])
    _damage_copy(checks_copy, checks, 4 * 4 * 3)  # (record 131's checksum of x)
    got = list(store.iter_batches([np.arange(128, 160), np.arange(160, 200)]))
    assert same(got[0], np.arange(128, 160)) and same(got[1], np.arange(160, 200))
    # a new Store on the same node cache finds the copy damaged again: fetched again, read
    _damage_copy(t_copy, t_file, 40)
    again = ss.open(url, storage_options=moto_s3.storage_options(verify_reads="true"), cache_dir=cache)
    assert same(again.get_batch(np.arange(120, 140)), np.arange(120, 140))
    # read-once runs: the values come from the store, the checksums through the node cache
    once = ss.open(url, storage_options=moto_s3.storage_options(verify_reads="true", read_once="true"),
                   cache_dir=cache)
    assert once.read_once
    _damage_copy(checks_copy, checks, 4 * 4 * 3)
    (got1,) = list(once.iter_batches([np.arange(100, 140)]))
    assert same(got1, np.arange(100, 140))


def test_a_damaged_node_cache_copy_of_ids_or_ragged_values_is_fetched_again(moto_s3: Any, s3_bucket: str,
                                                                            scratch: Path, tmp_path: Path) -> None:
    """As above for the reads of ids (``id``, ``ids``, ``index``) and ``iter_ragged``: a damaged node-cache
    copy is fetched again once instead of failing every read."""
    root = _build(scratch / "s")
    url = moto_s3.upload_dir(root, s3_bucket, "recached-ids.seqstore")
    cache = tmp_path / "c"
    store = ss.open(url, storage_options=moto_s3.storage_options(verify_reads="true"), cache_dir=cache)
    assert len(store.ids(np.arange(N))[1]) == N + 1 and len(store.get_batch(np.arange(N))["lab"]) == N
    ids_file, t_file = _shard_of(root, 1) / "_ids.npy", _shard_of(root, 1) / "t.npy"
    ids_copy, t_copy = _cached_copy(cache, ids_file), _cached_copy(cache, t_file)
    _damage_copy(ids_copy, ids_file, 0)  # (record 128's id, "rec-128")
    assert store.id(128) == "rec-128"
    _damage_copy(ids_copy, ids_file, 0)
    data, off = store.ids([128, 129])
    assert bytes(data[off[0] : off[1]]) == b"rec-128"
    _damage_copy(ids_copy, ids_file, 0)
    assert store.index("rec-128") == 128
    _damage_copy(ids_copy, ids_file, 0)
    assert list(store.index_many(["rec-128", "rec-5"])) == [128, 5]
    _damage_copy(t_copy, t_file, 40)
    plain = ss.open(root)
    for (pos, values, lengths), (_, want, want_lengths) in zip(store.iter_ragged("t", chunk_records=64),
                                                             plain.iter_ragged("t", chunk_records=64)):
        assert np.array_equal(values, want) and np.array_equal(lengths, want_lengths), pos


def _same_batch(got: Any, want: Any) -> bool:
    def arr(v: Any) -> Any:
        return np.asarray(v[0] if isinstance(v, tuple) else v)

    return all(np.array_equal(arr(got[k]), arr(want[k])) for k in want)


def test_a_verified_read_fetches_again_every_damaged_node_cache_copy_it_meets(moto_s3: Any, s3_bucket: str,
                                                                             scratch: Path, tmp_path: Path) -> None:
    """A batch whose node-cache copies of several fields' files were damaged fetched again only the first
    failing field's files, then raised CorruptionError for the next field (blaming the remote object, which
    is intact); the next read fetched that one. Each damaged copy the retried read meets is fetched again."""
    root = _build(scratch / "s")
    url = moto_s3.upload_dir(root, s3_bucket, "recached-fields.seqstore")
    cache = tmp_path / "c"
    store = ss.open(url, storage_options=moto_s3.storage_options(verify_reads="true"), cache_dir=cache)
    assert len(store.get_batch(np.arange(N))["lab"]) == N  # every object whole in the node cache
    plain = ss.open(root)
    for rel, byte in (("x.npy", 16 * 3), ("t.npy", 40), ("lab.npy", 8 * 3)):  # (each record 131's)
        original = _shard_of(root, 1) / rel
        _damage_copy(_cached_copy(cache, original), original, byte)
    idx = np.arange(120, 140)
    assert _same_batch(store.get_batch(idx), plain.get_batch(idx))
    for rel, byte in (("x.npy", 16 * 3), ("lab.npy", 8 * 3)):
        original = _shard_of(root, 1) / rel
        _damage_copy(_cached_copy(cache, original), original, byte)
    assert all(np.array_equal(store[131][k], plain[131][k]) for k in ("x", "t", "lab"))


def test_a_damaged_copy_still_mapped_after_its_eviction_is_fetched_again_by_a_verified_read(
        moto_s3: Any, s3_bucket: str, scratch: Path, tmp_path: Path) -> None:
    """A store keeps reading its own copy of a node-cache entry that another process evicted. When that
    copy was damaged, the verified read fetched the object again into a new entry, read the old mapping
    again and raised CorruptionError, on every read of the record. The mapped copy is fetched again too."""
    from seqstore.io.nodecache import NodeCache

    root = _build(scratch / "s")
    url = moto_s3.upload_dir(root, s3_bucket, "recached-evicted.seqstore")
    cache = tmp_path / "c"
    store = ss.open(url, storage_options=moto_s3.storage_options(verify_reads="true"), cache_dir=cache)
    assert len(store.get_batch(np.arange(N))["lab"]) == N  # every object whole in the node cache
    t_file = _shard_of(root, 1) / "t.npy"
    t_copy = _cached_copy(cache, t_file)
    _damage_copy(t_copy, t_file, 40)  # (record 131's)
    NodeCache(cache, 1 << 20).reserve(1 << 20)  # another process's eviction: every entry goes
    assert not t_copy.exists()
    plain = ss.open(root)
    idx = np.arange(120, 140)
    assert _same_batch(store.get_batch(idx), plain.get_batch(idx))
    assert np.array_equal(store[131]["t"], plain[131]["t"])


@pytest.mark.parametrize("packed", [None, {"P": ["x"]}], ids=["plain", "packed"])
def test_verify_names_the_first_damaged_record_of_a_file(scratch: Path, packed: Any) -> None:
    """``verify`` found a flipped bit by a file's CRC-32 and named only the file; with per-record
    checksums it also names the first record that fails its own (global number and row of the shard)."""
    root = _build(scratch / "s", packed=packed)
    sh = _shard_of(root, 1)
    t_off = np.load(sh / "t.offsets.npy")
    id_off = np.load(sh / "_ids.offsets.npy")
    x_file = "P.npy" if packed else "x.npy"
    for rel, byte in [(x_file, 2 * 16 + 1), ("t.npy", int(t_off[2]) * 4 + 1), ("t.offsets.npy", 3 * 8),
                      ("_ids.npy", int(id_off[2]) + 1), ("_ids.offsets.npy", 3 * 8)]:
        _flip(sh / rel, byte)
        (problem,) = verify(root)
        assert f"{rel}: CRC-32" in problem and "record 130 (row 2 of the shard)" in problem, problem
        _flip(sh / rel, byte)
    assert verify(root) == []
    _flip(sh / "_checks.npy", 0)  # the checksums damaged too: they name no record
    _flip(sh / "t.npy", 1)
    assert all("first at record" not in p for p in verify(root))


def test_verify_reads_as_a_storage_option_is_checked_like_the_others(scratch: Path) -> None:
    root = _build(scratch / "o", shard_records=64)
    with pytest.raises(ConfigError, match=r"verify_reads='ture': expected true or false"):
        ss.open(root, storage_options={"verify_reads": "ture"})  # was: verification silently off
    assert ss.open(root, storage_options={"verify_reads": "yes"})._verify_reads
    assert not ss.open(root, storage_options={"verify_reads": "false"})._verify_reads
    # any mapping, not only a dict
    assert ss.open(root, storage_options=MappingProxyType({"verify_reads": "true"}))._verify_reads


def test_verify_reads_that_is_not_a_flag_is_a_value_error_naming_it(scratch: Path) -> None:
    """``open(path, verify_reads="false")`` turned verification on (any non-empty string is true), and a
    value such as ``2`` or ``None`` was taken as a flag silently; only True/False (or 0/1) are taken."""
    root = _build(scratch / "f", shard_records=64)
    for bad in ("false", "true", 2, None, 0.5):
        with pytest.raises(ValueError, match=rf"verify_reads must be True or False, got {bad!r}"):
            ss.open(root, verify_reads=bad)
    assert ss.open(root, verify_reads=np.True_)._verify_reads and not ss.open(root, verify_reads=0)._verify_reads


def test_a_verified_read_fetches_again_only_the_pages_of_the_records_that_failed(
        moto_s3: Any, s3_bucket: str, scratch: Path, tmp_path: Path) -> None:
    """A verified read finding one record damaged in the node cache's copy of a large object fetched the
    whole object again (up to half the cache's budget). Only the pages of the records that failed are
    fetched again now (their values, offsets and checksums), and the records read afterwards are right."""
    from support.proxy import FaultProxy

    schema = {"x": ss.Field("float32", (1024,)), "t": ss.Field("int16", (None, 1024))}
    root = scratch / "big"
    with ss.create(root, schema) as w:
        for i in range(100):
            w.append({"x": np.full(1024, i, np.float32), "t": np.full((1 + i % 3, 1024), i, np.int16)})
    url = moto_s3.upload_dir(root, s3_bucket, "spans.seqstore")
    cache = tmp_path / "c"
    plain = ss.open(root)
    with FaultProxy(moto_s3.endpoint) as proxy:
        store = ss.open(url, storage_options=moto_s3.storage_options(proxy.url, verify_reads="true"),
                        cache_dir=cache)
        assert len(store.get_batch(np.arange(100))["x"]) == 100  # every object whole in the node cache
        shard = _shard_of(root, 0)
        t60 = sum(1 + i % 3 for i in range(60)) * 2048  # (where record 60's t starts)
        for rel, byte in (("x.npy", 4096 * 80 + 8), ("t.npy", t60 + 8)):
            _damage_copy(_cached_copy(cache, shard / rel), shard / rel, byte)  # (record 80's x, 60's t)

        def moved() -> dict[str, int]:
            return {rel: sum(r.body_bytes for r in proxy.requests if r.path.endswith(f"/{rel}"))
                    for rel in ("x.npy", "t.npy", "t.offsets.npy", CHECKS)}

        before = moved()
        assert _same_batch(store.get_batch(np.arange(50, 100)), plain.get_batch(np.arange(50, 100)))
        after = moved()
    fetched = {rel: after[rel] - before[rel] for rel in after}
    assert 0 < fetched["x.npy"] <= 2 * 4096 and 0 < fetched["t.npy"] <= 2 * 4096, fetched
    assert fetched["t.offsets.npy"] <= 4096 and 0 < fetched[CHECKS] <= 2 * 4096, fetched
    assert np.array_equal(store[80]["x"], plain[80]["x"]) and np.array_equal(store[60]["t"], plain[60]["t"])


def test_iter_ragged_reads_a_block_anew_after_its_offsets_were_fetched_again(moto_s3: Any, s3_bucket: str,
                                                                            scratch: Path, tmp_path: Path) -> None:
    """A block's end offset damaged in the node cache's copy (decreasing, within range): the offsets were
    fetched again and the lengths read anew, but the values kept the range of the damaged offsets; the
    check hashed the bytes past that short view (the lengths' spans) and passed, and ``iter_ragged``
    yielded 1 row of values for 7 records' lengths. The block's range is read anew with the lengths."""
    root = scratch / "r"
    with ss.create(root, {"t": ss.Field("int16", (None, 2))}) as w:
        for i in range(20):
            w.append({"t": np.full((1 + i % 5, 2), i, np.int16)})
    url = moto_s3.upload_dir(root, s3_bucket, "ragged-range.seqstore")
    cache = tmp_path / "c"
    want = ss.open(root).get_batch(np.arange(7))["t"]
    offsets = _shard_of(root, 0) / "t.offsets.npy"
    for checked in ("true", "false"):
        store = ss.open(url, storage_options=moto_s3.storage_options(verify_reads=checked), cache_dir=cache)
        assert len(store.get_batch(np.arange(20))["t"][1]) == 20  # every object whole in the node cache
        with open(_cached_copy(cache, offsets), "r+b") as f:  # the end of record 6: 18 -> 1
            f.seek(read_header(offsets).data_offset + 8 * 7)
            f.write(np.array([1], "<i8").tobytes())
        first, values, lengths = next(iter(store.iter_ragged("t", chunk_records=7)))
        assert first == 0 and np.array_equal(lengths, want[1]) and np.array_equal(values, want[0]), checked


def test_a_ragged_check_fails_the_records_whose_lengths_run_past_the_values_read(scratch: Path) -> None:
    """A ragged field's values checked with lengths saying more rows than the values hold (offsets that
    changed between the two reads): the check hashed the bytes past the values' view (the mapping's next
    rows) and passed. Those records fail their check now, nothing past the values is read."""
    store = ss.open(_build(scratch / "g"), verify_reads=True)
    verifier, sh = store._ragged.verify, store._shards.shard(0)
    assert verifier is not None
    rows = np.arange(3, 6)
    off = sh.offsets["t"]
    values, lengths = sh.columns["t"][off[3] : off[3] + 1], np.diff(off[3:7])  # 1 row; the lengths say 12
    with pytest.raises(ss.CorruptionError, match=r"record 3 \(row 3 of the shard\), field 't'"):
        verifier.field("t", rows, [(sh, slice(None), rows)], (values, lengths), False)
    verifier.field("t", rows, [(sh, slice(None), rows)], (sh.columns["t"][off[3] : off[6]], lengths), False)


@pytest.mark.parametrize("bit", [0, 62])
def test_a_damaged_hash_in_an_id_index_is_named_by_a_verified_lookup_not_a_missing_id(scratch: Path,
                                                                                        bit: int) -> None:
    """A flipped bit in the hash of an id's entry in its shard's index (``_ids.hash.npy``): every lookup of
    that id missed it and answered KeyError, "not in the store", with verify_reads too. A verified lookup
    that misses checks the index entries where the id's hash would lie against their records' ids, and
    names the damage."""
    root = scratch / "s"
    with ss.create(root, SCHEMA, max_shard_records=64) as w:
        for i in range(40):
            w.append(_record(i), id=f"rec-{i}")
    rows = np.load(_shard_of(root, 0) / "_ids.hash_rows.npy")
    j = int(np.flatnonzero(rows == 7)[0])  # the entry of "rec-7"
    _flip(_shard_of(root, 0) / "_ids.hash.npy", 8 * j + bit // 8, bit % 8)
    store = ss.open(root, verify_reads=True)
    assert store.index("rec-8") == 8 and store.index_many(["rec-1", "nope"], missing=-1).tolist() == [1, -1]
    for find in (store.index, lambda i: store.index_many([i]), lambda i: store.index_many([i], missing=-1)):
        with pytest.raises(ss.CorruptionError, match="shard-000000/_ids.hash.npy or _ids.hash_rows.npy"):
            find("rec-7")
