"""A data file re-uploaded (other bytes, same size) under an unchanged manifest: the store open when it
changed raises StaleStoreError, whose advice, reopening the store, then works on the same node cache (the
sizes and ETags the node saved for the object are not taken for the object as it now is)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.s3 import MotoS3

pytest.importorskip("seqstore.io.remote")

import seqstore as ss  # noqa: E402
from seqstore.errors import StaleStoreError  # noqa: E402
from seqstore.format.npy import read_header  # noqa: E402
from seqstore.store.verify import verify  # noqa: E402

pytestmark = pytest.mark.timeout(120)
ROWS = 2000


def _cached_copy(root: Path, name: str, cache: Path) -> tuple[str, bytes, Path]:
    """The file ``name`` of the local store ``root`` (its path in the store, its bytes) and the node cache's
    copy of it under ``cache`` (found by its bytes)."""
    (rel,) = [p.relative_to(root).as_posix() for p in root.rglob(name)]
    original = (root / rel).read_bytes()
    (copy,) = [p for p in (cache / "objects").glob("*/*.data") if p.read_bytes() == original]
    return rel, original, copy


def _local(path: Path, add: float) -> Path:
    with ss.create(path, {"v": ss.Field("float32", (256,))}) as w:
        w.append_batch({"v": np.arange(ROWS * 256, dtype=np.float32).reshape(ROWS, 256) + add})
    return path


@pytest.mark.parametrize("read_once", [False, True])
def test_reopen_after_a_data_file_was_replaced_reads_the_new_object(moto_s3: MotoS3, s3_bucket: str,
                                                                     tmp_path: Path, read_once: bool) -> None:
    a = _local(tmp_path / "a.seqstore", 0.0)
    b = _local(tmp_path / "b.seqstore", 0.5)  # the same files and sizes, other values
    url = moto_s3.upload_dir(a, s3_bucket, "re/main.seqstore")
    opts = moto_s3.storage_options(max_retries=1, read_once=read_once)
    cache = tmp_path / "cache"
    old = ss.open(url, storage_options=opts, cache_dir=cache)
    assert old.get_batch([0])["v"][0, 0] == 0.0  # the shard is prepared, its head pages in the cache
    (rel,) = [p.relative_to(b).as_posix() for p in b.rglob("v.npy")]
    moto_s3.put(s3_bucket, f"re/main.seqstore/{rel}", (b / rel).read_bytes())  # the manifest stays

    def tail(store: ss.Store) -> float:
        if read_once:
            return float(next(iter(store.iter_batches([np.arange(ROWS - 8, ROWS)])))["v"][-1, -1])
        return float(store.get_batch([ROWS - 1])["v"][0, -1])

    with pytest.raises(StaleStoreError, match="v.npy"):
        tail(old)
    for _ in range(2):  # the advice works, and keeps working
        new = ss.open(url, storage_options=opts, cache_dir=cache)
        assert tail(new) == ROWS * 256 - 1 + 0.5
        np.testing.assert_array_equal(new.get_batch([0])["v"][0], np.arange(256, dtype=np.float32) + 0.5)
    with pytest.raises(StaleStoreError):  # the store opened before the change still refuses
        tail(old)


@pytest.mark.parametrize("direct_reads", [True, False])
def test_http_server_without_etags_never_mixes_a_replaced_file(tmp_path: Path, direct_reads: bool) -> None:
    """A static web server that sends Last-Modified but no ETag: a file replaced (same size, other bytes,
    a later modification time) is told apart from the one cached by its Last-Modified, so the open store
    raises StaleStoreError and a reopened one reads only the new bytes, never old cached pages among them."""
    from support.http import StaticServer

    served = tmp_path / "www"
    served.mkdir()
    a = _local(served / "main.seqstore", 0.0)
    b = _local(tmp_path / "b.seqstore", 0.5)
    (rel,) = [p.relative_to(b).as_posix() for p in b.rglob("v.npy")]
    opts = {"allow_http": "true", "max_retries": 1, "direct_reads": direct_reads}
    with StaticServer(served, etags=False) as srv:
        url = f"{srv.url}/main.seqstore"
        old = ss.open(url, storage_options=opts, cache_dir=tmp_path / "cache")
        assert old.get_batch([0])["v"][0, 0] == 0.0  # the file's first pages are in the node cache
        target = a / rel
        before = target.stat().st_mtime
        target.write_bytes((b / rel).read_bytes())
        os.utime(target, (before + 10, before + 10))  # replaced: a later Last-Modified (whole seconds)
        with pytest.raises(StaleStoreError, match="v.npy"):
            old.get_batch(np.arange(ROWS - 64, ROWS))
        new = ss.open(url, storage_options=opts, cache_dir=tmp_path / "cache")
        got = new.get_batch(np.arange(ROWS))["v"]
        np.testing.assert_array_equal(got, np.arange(ROWS * 256, dtype=np.float32).reshape(ROWS, 256) + 0.5)


def test_first_reopen_after_a_reupload_with_new_etags_reads_the_store(moto_s3: MotoS3, s3_bucket: str,
                                                                      tmp_path: Path) -> None:
    """A store uploaded again (the manifest put again, the data files as multipart uploads: the same bytes
    under new ETags) is read by the first open after the upload, in the process that had it open and on
    its node cache: the node's saved ETags of the earlier upload are not pinned by that open."""
    import time

    import obstore

    a = _local(tmp_path / "a.seqstore", 0.0)
    url = moto_s3.upload_dir(a, s3_bucket, "up/main.seqstore")
    opts = moto_s3.storage_options(max_retries=1)
    cache = tmp_path / "cache"
    old = ss.open(url, storage_options=opts, cache_dir=cache)
    assert old.get_batch([0])["v"][0, 0] == 0.0  # the shard is prepared: its ETags saved in the node's mirror
    second = int(time.time())
    while int(time.time()) == second:  # the upload below is another second (Last-Modified has whole seconds)
        time.sleep(0.05)
    bucket = moto_s3.obstore(s3_bucket)
    for p in sorted(a.rglob("*.npy")):
        key = f"up/main.seqstore/{p.relative_to(a).as_posix()}"
        obstore.put(bucket, key, p.read_bytes(), use_multipart=True, chunk_size=5 << 20)
    moto_s3.put(s3_bucket, "up/main.seqstore/manifest.json", (a / "manifest.json").read_bytes())
    new = ss.open(url, storage_options=opts, cache_dir=cache)
    want = np.arange(ROWS * 256, dtype=np.float32).reshape(ROWS, 256)
    np.testing.assert_array_equal(new.get_batch(np.arange(ROWS))["v"], want)


@pytest.mark.parametrize("damage", ["empty", "other"])
def test_a_damaged_descriptor_in_the_node_cache_is_fetched_again(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                                 damage: str) -> None:
    """The node cache's copy of a shard's descriptor left damaged (empty after a power cut, or overwritten):
    every later open read it and raised CorruptionError naming the store's descriptor, which is intact, until
    the cache was deleted by hand. Its CRC-32 is in the shard table: a copy that does not match is fetched
    again."""
    url = moto_s3.upload_dir(_local(tmp_path / "a.seqstore", 0.0), s3_bucket, "desc/main.seqstore")
    opts = moto_s3.storage_options(max_retries=1)
    cache = tmp_path / "cache"
    assert ss.open(url, storage_options=opts, cache_dir=cache).get_batch([7])["v"][0, 0] == 7 * 256
    (copy,) = (cache / "stores").glob("*/*/shard-*/_shard.json")
    copy.write_bytes(b"" if damage == "empty" else copy.read_bytes().replace(b'"records"', b'"Records"'))
    for _ in range(2):
        store = ss.open(url, storage_options=opts, cache_dir=cache)
        assert store.get_batch([7])["v"][0, 0] == 7 * 256
    copy.write_bytes(b"")
    assert verify(url, storage_options=opts, cache_dir=cache) == []  # (fetches every descriptor at once)


@pytest.mark.parametrize("damage", ["manifest.json", "table"])
def test_a_damaged_manifest_or_shard_table_in_the_node_cache_is_written_again(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, damage: str) -> None:
    """The node cache's copy of the manifest or of the shard table left empty (as a power cut can leave a
    file written without fsync): every later open raised, naming the store's intact objects, until the
    cache was deleted by hand."""
    url = moto_s3.upload_dir(_local(tmp_path / "a.seqstore", 0.0), s3_bucket, "mirror/main.seqstore")
    opts = moto_s3.storage_options(max_retries=1)
    cache = tmp_path / "cache"
    assert ss.open(url, storage_options=opts, cache_dir=cache).get_batch([7])["v"][0, 0] == 7 * 256
    (mirror,) = (cache / "stores").glob("*/*")
    (copy,) = mirror.glob("*.tbl" if damage == "table" else damage)
    copy.write_bytes(b"")
    for _ in range(2):
        store = ss.open(url, storage_options=opts, cache_dir=cache)
        assert store.get_batch([7])["v"][0, 0] == 7 * 256


def test_verify_fetches_again_a_node_cache_copy_that_fails_its_crc(moto_s3: MotoS3, s3_bucket: str,
                                                                   tmp_path: Path) -> None:
    """``seqstore verify URL`` checks the objects through the node cache: a damaged copy there (a flipped
    bit, pages a power cut left as zeros) was reported as the store's object being damaged, though it is
    intact, and stayed so. A file whose copy fails its CRC-32 is fetched again and checked once more; the
    store's own damage is still reported."""
    root = _local(tmp_path / "a.seqstore", 0.0)
    url = moto_s3.upload_dir(root, s3_bucket, "verify/main.seqstore")
    opts = moto_s3.storage_options(max_retries=1)
    cache = tmp_path / "cache"
    assert verify(url, storage_options=opts, cache_dir=cache) == []
    data = max((cache / "objects").glob("*/*.data"), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[8192 + 100] ^= 1
    data.write_bytes(bytes(raw))
    assert verify(url, storage_options=opts, cache_dir=cache) == []
    data.write_bytes(b"X" * 6 + data.read_bytes()[6:])  # its .npy header's magic
    assert verify(url, storage_options=opts, cache_dir=cache) == []
    assert ss.open(url, storage_options=opts, cache_dir=cache).get_batch([7])["v"][0, 0] == 7 * 256
    (rel,) = [p.relative_to(root).as_posix() for p in root.rglob("v.npy")]
    flipped = bytearray((root / rel).read_bytes())
    flipped[-1] ^= 1
    moto_s3.put(s3_bucket, f"verify/main.seqstore/{rel}", bytes(flipped))  # the store's own damage
    (problem,) = verify(url, storage_options=opts, cache_dir=tmp_path / "other")
    assert "v.npy: CRC-32" in problem


def test_a_damaged_npy_header_in_the_node_cache_is_fetched_again(moto_s3: MotoS3, s3_bucket: str,
                                                                 tmp_path: Path) -> None:
    """A remote data file's ``.npy`` header is read from the node cache's copy once there: a copy whose
    header was damaged (a flipped bit on the node's disk) made every open of the shard raise
    CorruptionError naming the intact object, until the cache was deleted by hand. The header is fetched
    again once and checked anew; the store's own damage still raises."""
    root = _local(tmp_path / "a.seqstore", 0.0)
    url = moto_s3.upload_dir(root, s3_bucket, "head/main.seqstore")
    opts = moto_s3.storage_options(max_retries=1)
    cache = tmp_path / "cache"
    assert ss.open(url, storage_options=opts, cache_dir=cache).get_batch([7])["v"][0, 0] == 7 * 256
    (rel,) = [p.relative_to(root).as_posix() for p in root.rglob("v.npy")]
    original = (root / rel).read_bytes()
    (copy,) = [p for p in (cache / "objects").glob("*/*.data") if p.read_bytes()[:128] == original[:128]]
    at = original.index(b"256")  # the shape's inner dimension
    with open(copy, "r+b") as f:
        f.seek(at)
        f.write(b"257")
    for _ in range(2):
        assert ss.open(url, storage_options=opts, cache_dir=cache).get_batch([7])["v"][0, 0] == 7 * 256
    damaged = bytearray(original)
    damaged[at : at + 3] = b"257"
    moto_s3.put(s3_bucket, f"head/main.seqstore/{rel}", bytes(damaged))  # the store's own damage
    with pytest.raises(ss.CorruptionError, match="header shape"):
        ss.open(url, storage_options=opts, cache_dir=tmp_path / "other").get_batch([7])


def test_damaged_offsets_ends_in_the_node_cache_are_fetched_again(moto_s3: MotoS3, s3_bucket: str,
                                                                  tmp_path: Path) -> None:
    """Mapping a shard checks that a ragged field's offsets run from 0 to its row count; on a remote store
    those are read from the node cache's copy, and a damaged copy made every read of the shard raise
    CorruptionError naming the intact object, for ever. The offsets are fetched again once and checked
    anew; the store's own damage still raises."""
    root = tmp_path / "r.seqstore"
    with ss.create(root, {"t": ss.Field("int32", (None,))}) as w:
        for i in range(100):
            w.append({"t": np.arange(i % 7, dtype=np.int32) + i}, id=f"r{i}")
    url = moto_s3.upload_dir(root, s3_bucket, "offs/main.seqstore")
    opts = moto_s3.storage_options(max_retries=1)
    cache = tmp_path / "cache"
    assert ss.open(url, storage_options=opts, cache_dir=cache).get_batch([8])["t"][0].tolist() == [8]
    (rel,) = [p.relative_to(root).as_posix() for p in root.rglob("t.offsets.npy")]
    original = (root / rel).read_bytes()
    (copy,) = [p for p in (cache / "objects").glob("*/*.data")
               if p.stat().st_size == len(original) and p.read_bytes()[-8:] == original[-8:]]
    with open(copy, "r+b") as f:
        f.seek(len(original) - 8)
        f.write(np.array([12345], "<i8").tobytes())
    for _ in range(2):
        assert ss.open(url, storage_options=opts, cache_dir=cache).get_batch([8])["t"][0].tolist() == [8]
    assert ss.open(url, storage_options=opts, cache_dir=cache).id(8) == "r8"
    (ids_rel,) = [p.relative_to(root).as_posix() for p in root.rglob("_ids.offsets.npy")]
    ids_original = (root / ids_rel).read_bytes()
    at = read_header(root / ids_rel).data_offset  # the first id offset, 0
    (ids_copy,) = [p for p in (cache / "objects").glob("*/*.data") if p.read_bytes()[:at + 16] == ids_original[:at + 16]
                   and p.stat().st_size == len(ids_original)]
    with open(ids_copy, "r+b") as f:
        f.seek(at)
        f.write(np.array([3], "<i8").tobytes())
    assert ss.open(url, storage_options=opts, cache_dir=cache).id(8) == "r8"
    damaged = original[:-8] + np.array([12345], "<i8").tobytes()
    moto_s3.put(s3_bucket, f"offs/main.seqstore/{rel}", damaged)  # the store's own damage
    with pytest.raises(ss.CorruptionError, match="offsets run from"):
        ss.open(url, storage_options=opts, cache_dir=tmp_path / "other").get_batch([8])


def test_offsets_out_of_range_in_the_node_cache_are_fetched_again(moto_s3: MotoS3, s3_bucket: str,
                                                                  tmp_path: Path) -> None:
    """A ragged field's offsets entry damaged in the node cache's copy (out of range) made every read of
    that record raise CorruptionError naming the intact object, for ever; the copy is fetched again once
    and the offsets checked anew."""
    root = tmp_path / "r.seqstore"
    with ss.create(root, {"t": ss.Field("int32", (None,))}) as w:
        for i in range(100):
            w.append({"t": np.arange(1 + i % 7, dtype=np.int32) + i})
    url = moto_s3.upload_dir(root, s3_bucket, "mid/main.seqstore")
    opts = moto_s3.storage_options(max_retries=1)
    cache = tmp_path / "cache"
    assert ss.open(url, storage_options=opts, cache_dir=cache).get_batch(np.arange(100))["t"][1].sum() > 0
    rel, original, copy = _cached_copy(root, "t.offsets.npy", cache)
    at = read_header(root / rel).data_offset + 8 * 51  # the end of record 50

    def damage() -> None:
        with open(copy, "r+b") as f:
            f.seek(at)
            f.write(np.array([1 << 40], "<i8").tobytes())

    def fresh() -> ss.Store:
        damage()
        return ss.open(url, storage_options=opts, cache_dir=cache)

    assert fresh().get_batch([50])["t"][0].tolist() == list(range(50, 52))
    assert fresh()[50]["t"].tolist() == list(range(50, 52))
    (got,) = list(fresh().iter_batches([np.arange(40, 60)]))
    assert got["t"][1].tolist() == [1 + i % 7 for i in range(40, 60)]
    blocks = list(fresh().iter_ragged("t", chunk_records=30))
    assert np.concatenate([b[2] for b in blocks]).tolist() == [1 + i % 7 for i in range(100)]


def test_offsets_out_of_range_in_the_node_cache_are_fetched_again_by_their_pages(moto_s3: MotoS3, s3_bucket: str,
                                                                                 tmp_path: Path) -> None:
    """The damaged offsets entry of one record fetched the whole offsets object again; only its page is
    fetched again now, and the record is read right."""
    from support.proxy import FaultProxy

    root = tmp_path / "r.seqstore"
    n = 4000
    with ss.create(root, {"t": ss.Field("int32", (None,))}) as w:
        for i in range(n):
            w.append({"t": np.full(1 + i % 3, i, np.int32)})
    url = moto_s3.upload_dir(root, s3_bucket, "pages/main.seqstore")
    cache = tmp_path / "cache"
    with FaultProxy(moto_s3.endpoint) as proxy:
        store = ss.open(url, storage_options=moto_s3.storage_options(proxy.url, max_retries=1), cache_dir=cache)
        assert len(store.get_batch(np.arange(n))["t"][1]) == n
        rel, original, copy = _cached_copy(root, "t.offsets.npy", cache)
        with open(copy, "r+b") as f:  # the end of record 3000, out of range
            f.seek(read_header(root / rel).data_offset + 8 * 3001)
            f.write(np.array([1 << 40], "<i8").tobytes())
        before = sum(r.body_bytes for r in proxy.requests if r.path.endswith("t.offsets.npy"))
        assert store.get_batch([3000])["t"][0].tolist() == [3000]
        moved = sum(r.body_bytes for r in proxy.requests if r.path.endswith("t.offsets.npy")) - before
    assert 0 < moved <= 4096 < len(original)


def _uploaded_with_ids(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, n: int, prefix: str,
                       name: str) -> tuple[Path, str, dict[str, Any], Path]:
    """A local store of ``n`` int32 records with ids ``prefix0``, ``prefix1``, ... uploaded to
    ``NAME/main.seqstore``: (its local root, its URL, storage options of one retry, a node cache directory)."""
    root = tmp_path / "i.seqstore"
    with ss.create(root, {"v": ss.Field("int32")}) as w:
        for i in range(n):
            w.append({"v": i}, id=f"{prefix}{i}")
    url = moto_s3.upload_dir(root, s3_bucket, f"{name}/main.seqstore")
    return root, url, moto_s3.storage_options(max_retries=1), tmp_path / "cache"


def test_id_offsets_out_of_range_in_the_node_cache_are_fetched_again(moto_s3: MotoS3, s3_bucket: str,
                                                                     tmp_path: Path) -> None:
    """As for a field's offsets: an id offset damaged out of range in the node cache's copy made every
    ``id``/``ids`` of that record raise CorruptionError blaming the intact object; fetched again once."""
    root, url, opts, cache = _uploaded_with_ids(moto_s3, s3_bucket, tmp_path, 100, "rec-", "ids")
    assert len(ss.open(url, storage_options=opts, cache_dir=cache).ids(np.arange(100))[0]) > 0
    rel, original, copy = _cached_copy(root, "_ids.offsets.npy", cache)
    at = read_header(root / rel).data_offset + 8 * 51  # the end of record 50's id

    def fresh() -> ss.Store:
        with open(copy, "r+b") as f:
            f.seek(at)
            f.write(np.array([1 << 40], "<i8").tobytes())
        return ss.open(url, storage_options=opts, cache_dir=cache)

    assert fresh().id(50) == "rec-50"
    data, off = fresh().ids([49, 50])
    assert bytes(data[off[1] : off[2]]) == b"rec-50"


def test_the_last_id_offset_damaged_within_range_in_the_node_cache_is_fetched_again(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    """The last entry of ``_ids.offsets.npy`` sizes the mapping of ``_ids.npy``: damaged in the node cache's
    copy to a value still within that file's bytes, every id read of the shard raised CorruptionError
    ('_ids.npy: header shape ...') blaming the intact object, in every process, for ever (the copy was
    never fetched again). It is fetched again, and the ids are read."""
    root, url, opts, cache = _uploaded_with_ids(moto_s3, s3_bucket, tmp_path, 10, "r", "idsend")
    assert len(ss.open(url, storage_options=opts, cache_dir=cache).ids(np.arange(10))[0]) == 20
    rel, original, copy = _cached_copy(root, "_ids.offsets.npy", cache)
    with open(copy, "r+b") as f:  # the end of the last id: 20 -> 4 (within _ids.npy's bytes)
        f.seek(read_header(root / rel).data_offset + 8 * 10)
        f.write(np.array([4], "<i8").tobytes())
    assert ss.open(url, storage_options=opts, cache_dir=cache).id(9) == "r9"
    assert copy.read_bytes() == original
    # a local store's own damage names both files
    with open(root / rel, "r+b") as f:
        f.seek(read_header(root / rel).data_offset + 8 * 10)
        f.write(np.array([4], "<i8").tobytes())
    with pytest.raises(ss.CorruptionError, match=r"_ids.npy: header shape \(20,\), expected \(4,\).*_ids.offsets.npy"):
        ss.open(root).id(9)


def test_a_damaged_id_index_in_the_node_cache_is_fetched_again(moto_s3: MotoS3, s3_bucket: str,
                                                               tmp_path: Path) -> None:
    """A shard's id index (``_ids.hash_rows.npy``) damaged in the node cache's copy (a row out of range):
    every lookup raised CorruptionError blaming the intact object, in every process, for ever. The index's
    files are fetched again once and the lookup made anew."""
    root = tmp_path / "h.seqstore"
    with ss.create(root, {"v": ss.Field("int32")}) as w:
        for i in range(50):
            w.append({"v": i}, id=f"r{i}")
    url = moto_s3.upload_dir(root, s3_bucket, "hash/main.seqstore")
    opts = moto_s3.storage_options(max_retries=1)
    cache = tmp_path / "cache"
    ids = [f"r{i}" for i in range(50)]
    assert ss.open(url, storage_options=opts, cache_dir=cache).index_many(ids).tolist() == list(range(50))
    rel, original, copy = _cached_copy(root, "_ids.hash_rows.npy", cache)
    with open(copy, "r+b") as f:  # every row of the index out of range
        f.seek(read_header(root / rel).data_offset)
        f.write(np.full(50, 1 << 40, "<i8").tobytes())
    store = ss.open(url, storage_options=opts, cache_dir=cache)
    assert store.index_many(ids).tolist() == list(range(50)) and store.index("r7") == 7
    assert copy.read_bytes() == original


def test_threads_materializing_one_object_at_once_each_link_it(moto_s3: MotoS3, s3_bucket: str,
                                                               tmp_path: Path) -> None:
    """``materialize`` (what ``verify`` and a read that refetches a damaged copy call) links an object into
    the mirror through a temporary link named by the process only: threads of one process doing so for the
    same object at once removed or moved each other's link and raised a bare FileNotFoundError or
    FileExistsError."""
    with ss.create(tmp_path / "a.seqstore", {"v": ss.Field("float32", (4,))}) as w:
        w.append_batch({"v": np.zeros((10, 4), np.float32)})
    url = moto_s3.upload_dir(tmp_path / "a.seqstore", s3_bucket, "links/a.seqstore")
    remote = ss.open(url, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "cache")._source.remote
    keys = ["shard-000000/v.npy"]
    remote.materialize(keys)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def link() -> None:
        start.wait()
        try:
            for _ in range(60):
                remote.materialize(keys)
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=link) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    link = remote.mirror / keys[0]
    assert link.read_bytes() == (tmp_path / "a.seqstore" / keys[0]).read_bytes()
    assert [p.name for p in link.parent.iterdir() if ".tmp-" in p.name] == []


def test_fetching_a_copy_again_does_not_count_its_bytes_twice(moto_s3: MotoS3, s3_bucket: str,
                                                              tmp_path: Path) -> None:
    """``refetch`` (a copy in the node cache found damaged) writes the object's bytes again over pages the
    cache had counted already: each one counted the object's size once more in the cache's byte count, so
    a node whose reads refetched damaged copies evicted entries it had room for."""
    root = _local(tmp_path / "a.seqstore", 0.0)
    url = moto_s3.upload_dir(root, s3_bucket, "count/a.seqstore")
    remote = ss.open(url, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "cache")._source.remote
    keys = ["shard-000000/v.npy"]
    remote.materialize(keys)
    before = remote.cache._read_usage()
    for _ in range(3):
        remote.refetch(keys)
    assert remote.cache._read_usage() == before
    assert (remote.mirror / keys[0]).read_bytes() == (root / keys[0]).read_bytes()


def test_mapping_a_file_whose_head_is_not_in_the_cache_counts_the_page_it_fetches(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    """``map_npy`` of a file whose cache entry lacks its first page (evicted since the shard was prepared)
    fetches that page into the entry: it was written without being counted in the cache's byte count, which
    then fell short of the disk the cache takes until the next eviction recounted it."""
    root = _local(tmp_path / "a.seqstore", 0.0)
    url = moto_s3.upload_dir(root, s3_bucket, "head/a.seqstore")
    remote = ss.open(url, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "cache")._source.remote
    key = "shard-000000/v.npy"
    meta = remote._meta(key)
    with remote.cache.locked():  # the entry goes (the store's mirror is pinned, it stays)
        remote.cache._write_usage(remote.cache._evict(0))
    entry = remote.cache.object(remote.client.key_url(key), meta.etag, meta.size)  # made again, empty
    assert not entry.present(0, 1)
    before = remote.cache._read_usage()
    arr = remote.map_npy(remote.mirror / key, None, np.dtype("<f4"), (ROWS, 256))
    assert entry.present(0, 4096) and arr.shape == (ROWS, 256)
    assert remote.cache._read_usage() - before == 4096


def test_refetching_the_damaged_spans_of_a_copy_fetches_only_their_pages(moto_s3: MotoS3, s3_bucket: str,
                                                                         tmp_path: Path) -> None:
    """A reader that knows which bytes of a node cache copy are damaged (records that failed their checksums)
    names them: only their pages are fetched again, not the whole object (up to half the cache's budget)."""
    from support.proxy import FaultProxy

    root = _local(tmp_path / "a.seqstore", 0.0)
    url = moto_s3.upload_dir(root, s3_bucket, "spans/a.seqstore")
    key = "shard-000000/v.npy"
    with FaultProxy(moto_s3.endpoint) as proxy:
        remote = ss.open(url, storage_options=moto_s3.storage_options(proxy.url),
                         cache_dir=tmp_path / "cache")._source.remote
        remote.materialize([key])
        link = remote.mirror / key
        with open(link, "r+b") as f:  # the node's copy damaged, in its sixth page
            f.seek(5 * 4096 + 100)
            f.write(b"\xff" * 64)
        before = sum(r.body_bytes for r in proxy.requests if r.path.endswith("v.npy"))
        remote.refetch([key], {key: (np.array([5 * 4096 + 90]), np.array([5 * 4096 + 200]))})
        moved = sum(r.body_bytes for r in proxy.requests if r.path.endswith("v.npy")) - before
    assert link.read_bytes() == (root / key).read_bytes()
    assert moved == 4096


def test_heads_another_process_fetched_first_are_not_counted_twice(moto_s3: MotoS3, s3_bucket: str,
                                                                   tmp_path: Path) -> None:
    """Processes opening one store at once each fetch its files' heads (none has saved their sizes yet) into
    the same cache entries: each counted the pages again in the cache's byte count, which grew past the disk
    the cache takes with every rank and worker that opened the store."""
    root = _local(tmp_path / "a.seqstore", 0.0)
    url = moto_s3.upload_dir(root, s3_bucket, "twice/a.seqstore")
    remote = ss.open(url, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "cache")._source.remote
    remote._meta("shard-000000/v.npy")
    before = remote.cache._read_usage()
    (remote.mirror / "shard-000000" / "_remote.json").write_text("{}")  # as another process saw it, opening at once
    remote._metas.clear()
    remote._meta("shard-000000/v.npy")  # the head fetched again, into the entry that holds it
    assert remote.cache._read_usage() == before  # (the sizes saved again, over the copy counted)


def test_the_size_and_etag_of_an_object_two_directories_deep_are_kept_for_the_next_open(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    """A key looked up alone (``a/b/c.npy``) was prepared as shard ``a/b`` but its size and ETag saved for
    shard ``a`` (the key cut at its first '/', then looked up at its last): every later open of the store
    asked object storage for them again."""
    root = _local(tmp_path / "a.seqstore", 0.0)
    url = moto_s3.upload_dir(root, s3_bucket, "deep/a.seqstore")
    key = "extra/deep/x.npy"
    moto_s3.put(s3_bucket, f"deep/a.seqstore/{key}", (root / "shard-000000" / "v.npy").read_bytes())
    opts, cache = moto_s3.storage_options(), tmp_path / "cache"
    first = ss.open(url, storage_options=opts, cache_dir=cache)._source.remote._meta(key)
    moto_s3.delete(s3_bucket, f"deep/a.seqstore/{key}")  # asking again would find it missing
    again = ss.open(url, storage_options=opts, cache_dir=cache)._source.remote._meta(key)
    assert (again.size, again.etag) == (first.size, first.etag)


def test_two_threads_finding_one_damaged_offset_both_read_the_record(moto_s3: MotoS3, s3_bucket: str,
                                                                     tmp_path: Path) -> None:
    """Two threads (a loader's) reading one record whose offsets are damaged in the node cache's copy: the
    first fetched the page again; the second, finding it being fetched again already, raised CorruptionError
    blaming the intact object before the first's fetch had brought the page."""
    root = tmp_path / "t.seqstore"
    with ss.create(root, {"t": ss.Field("int32", (None,))}) as w:
        w.append_batch({"t": [np.arange(i, i + 2, dtype=np.int32) for i in range(100)]})
    url = moto_s3.upload_dir(root, s3_bucket, "race/main.seqstore")
    opts = moto_s3.storage_options(max_retries=1)
    cache = tmp_path / "cache"
    assert len(ss.open(url, storage_options=opts, cache_dir=cache).get_batch(np.arange(100))["t"][1]) == 100
    rel, _original, copy = _cached_copy(root, "t.offsets.npy", cache)
    with open(copy, "r+b") as f:  # the end of record 50, out of range
        f.seek(read_header(root / rel).data_offset + 8 * 51)
        f.write(np.array([1 << 40], "<i8").tobytes())
    store = ss.open(url, storage_options=opts, cache_dir=cache)
    remote = store._source.remote
    real, inside, go = remote.refetch, threading.Event(), threading.Event()

    def held_refetch(*args: object, **kwargs: object) -> None:  # the first thread's fetch, under way
        inside.set()
        go.wait(10)
        real(*args, **kwargs)

    remote.refetch = held_refetch
    got: dict[str, object] = {}

    def read(who: str) -> None:
        try:
            got[who] = store[50]["t"].tolist()
        except Exception as exc:  # noqa: BLE001
            got[who] = exc

    first = threading.Thread(target=read, args=("first",))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=read, args=("second",))
    second.start()
    second.join(0.3)  # (blocked until the first's fetch ends, or failed at once)
    go.set()
    first.join(10)
    second.join(10)
    assert got == {"first": [50, 51], "second": [50, 51]}, got
