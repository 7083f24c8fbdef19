"""seqstore.copy / ``seqstore copy`` against moto's S3 server: byte-identical round trips, resume after a
killed copy, readers during a copy, checksums checked on arrival, destinations that hold another store.

Stores are small (kilobytes per object: moto copies a whole object for each range request).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from support.stores import store_files

import seqstore as ss
from seqstore.errors import CorruptionError, FormatError, SeqstoreError
from seqstore.store.verify import verify

if TYPE_CHECKING:
    from support.proxy import FaultProxy
    from support.s3 import MotoS3

SRC_ROOT = Path(__file__).resolve().parents[1] / "src"


def _schema() -> dict[str, Any]:
    return {
        "x": ss.Field("float32", (None, 3)),  # ragged
        "spk": ss.Field("int64"),  # fixed
        "emb": ss.Field("bfloat16", (4,)),
        "g": {"a": ss.Field("float16", (2,)), "b": ss.Field("float16", (3,))},  # packed as "pk"
    }


def _append(w: Any, first: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 5, size=n)
    w.append_batch(
        {
            "x": [rng.standard_normal((int(k), 3)).astype(np.float32) for k in lens],
            "spk": np.arange(first, first + n, dtype=np.int64),
            "emb": rng.standard_normal((n, 4)).astype(np.float32),
            "g/a": rng.standard_normal((n, 2)).astype(np.float16),
            "g/b": rng.standard_normal((n, 3)).astype(np.float16),
        },
        ids=[f"r{i:05d}" for i in range(first, first + n)],
    )


def build(path: Path, n: int = 120, *, seed: int = 0, shard_records: int = 20) -> Path:
    """A local store of ``n`` records in shards of ``shard_records`` (ids, ragged, packed, bfloat16)."""
    with ss.create(path, _schema(), packed={"pk": ["g/a", "g/b"]}, max_shard_records=shard_records,
                   metadata={"seed": seed}) as w:
        for a in range(0, n, 40):
            _append(w, a, min(40, n - a), seed * 1000 + a)
    return path


def grow(path: Path, first: int, n: int, seed: int = 7, shard_records: int = 20) -> None:
    with ss.append_to(path, max_shard_records=shard_records) as w:
        _append(w, first, n, seed)


def digest(store: Any) -> str:
    """sha256 of every value and id of ``store``."""
    h = hashlib.sha256(str(len(store)).encode())
    if len(store):
        out = store.get_batch(np.arange(len(store)))
        for name in sorted(out):
            for arr in out[name] if isinstance(out[name], tuple) else (out[name],):
                h.update(name.encode() + np.ascontiguousarray(arr).tobytes())
        h.update("\0".join(store.id(i) for i in range(len(store))).encode())
    return h.hexdigest()


def objects(s3: MotoS3, bucket: str, prefix: str) -> dict[str, bytes]:
    return {k[len(prefix) + 1 :]: s3.get(bucket, k) for k in s3.keys(bucket, prefix + "/")}


# ---------------------------------------------------------------------------------- round trip


def test_round_trip_local_s3_local_is_byte_identical(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    src = build(tmp_path / "src.seqstore")
    grow(src, 120, 25)  # a second writer session: shards of several sizes
    url = f"s3://{s3_bucket}/corpora/a.seqstore"
    opts = moto_s3.storage_options()
    local = store_files(src)
    assert "_shards.tbl" in local and sum(k.endswith("/_shard.json") for k in local) == 8

    up = ss.copy(src, url, dst_options=opts, workers=3)
    assert (up.shards, up.copied, up.skipped) == (8, 8, 0)
    assert objects(moto_s3, s3_bucket, "corpora/a.seqstore") == local  # every object, byte for byte
    remote = ss.open(url, storage_options=opts, cache_dir=tmp_path / "cache")
    assert digest(remote) == digest(ss.open(src)) and remote.index("r00130") == 130

    back = ss.copy(url, tmp_path / "back.seqstore", src_options=opts)
    assert (back.copied, back.skipped, back.bytes) == (8, 0, up.bytes)
    assert store_files(tmp_path / "back.seqstore") == local
    assert verify(tmp_path / "back.seqstore") == []
    assert any(k.startswith("_index/run-") for k in local)  # merged id-index runs travel too

    again = ss.copy(src, url, dst_options=opts)  # nothing to do: every shard is there
    assert (again.copied, again.skipped) == (0, 8)


def test_remote_to_remote_and_growing_source(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    src = build(tmp_path / "src.seqstore", n=60)
    opts = moto_s3.storage_options()
    a, b = f"s3://{s3_bucket}/a.seqstore", f"s3://{s3_bucket}/b.seqstore"
    ss.copy(src, a, dst_options=opts)
    r = ss.copy(a, b, src_options=opts, dst_options=opts)
    assert (r.shards, r.copied) == (3, 3)
    assert objects(moto_s3, s3_bucket, "b.seqstore") == objects(moto_s3, s3_bucket, "a.seqstore")
    # the source grows; copying again transfers only the new shards (the old ones are a prefix)
    grow(src, 60, 45)
    r = ss.copy(src, a, dst_options=opts)
    assert (r.shards, r.copied, r.skipped) == (6, 3, 3)
    assert objects(moto_s3, s3_bucket, "a.seqstore") == store_files(src)


# -------------------------------------------------------------------------------------- resume


def test_killed_copy_resumes_and_skips_complete_shards(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                       s3_proxy: FaultProxy) -> None:
    src = build(tmp_path / "src.seqstore", n=160)  # 8 shards
    url = f"s3://{s3_bucket}/k.seqstore"
    # every upload into shard 3 or later never gets an answer: the child finishes shards 0-2 and hangs
    later = [f"shard-{k:06d}/" for k in range(3, 8)]
    s3_proxy.stall(None, method="PUT", where=lambda r: any(s in r.target for s in later))
    env = dict(os.environ, **moto_s3.env(s3_proxy.url), PYTHONPATH=str(SRC_ROOT))
    child = subprocess.Popen(
        [sys.executable, "-m", "seqstore.cli", "copy", str(src), url, "--workers", "2", "-q",
         "--dst-option", f"endpoint={s3_proxy.url}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        done: list[str] = []
        while time.monotonic() < deadline and child.poll() is None:
            keys = moto_s3.keys(s3_bucket, "k.seqstore/")
            done = sorted(k for k in keys if k.endswith("/_shard.json"))
            if len(done) >= 3 and s3_proxy.count(method="PUT", where=lambda r: any(s in r.target for s in later)):
                break
            time.sleep(0.05)
        assert child.poll() is None, child.communicate()
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    keys = moto_s3.keys(s3_bucket, "k.seqstore/")
    assert "k.seqstore/manifest.json" not in keys  # the manifest comes last: no store yet
    complete = sorted(k for k in keys if k.endswith("/_shard.json"))
    assert complete == [f"k.seqstore/shard-{k:06d}/_shard.json" for k in range(3)]
    with pytest.raises(FormatError):
        ss.open(url, storage_options=moto_s3.storage_options(), cache_dir=tmp_path / "cache")

    s3_proxy.clear_faults()
    r = ss.copy(src, url, dst_options=moto_s3.storage_options())
    assert (r.shards, r.skipped, r.copied) == (8, 3, 5)
    assert objects(moto_s3, s3_bucket, "k.seqstore") == store_files(src)


# ------------------------------------------------------------------------------ concurrent reader


def _observe(url: str, opts: dict[str, Any], cache: Path) -> str:
    try:
        store = ss.open(url, storage_options=opts, cache_dir=cache)
    except FormatError:
        return "none"
    return digest(store)


@pytest.mark.parametrize("before", ["nothing", "old store"])
def test_reader_during_copy_sees_old_store_or_nothing(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                      s3_proxy: FaultProxy, before: str) -> None:
    old = build(tmp_path / "old.seqstore", n=60)
    new = tmp_path / "new.seqstore"
    ss.copy(old, new)
    grow(new, 60, 50)  # the new store continues the old one (6 shards, the first 3 the old ones)
    url = f"s3://{s3_bucket}/r.seqstore"
    direct = moto_s3.storage_options()
    want = {"none": "none", "old": digest(ss.open(old)), "new": digest(ss.open(new))}
    if before == "old store":
        ss.copy(old, url, dst_options=direct)
    seen: list[tuple[str, str]] = []

    def look(req: Any) -> bool:  # before the proxy forwards each write of the copy, a reader opens the store
        if req.method == "PUT":
            got = _observe(url, direct, tmp_path / "cache")
            seen.append((req.path.rsplit("/", 2)[-2] + "/" + req.path.rsplit("/", 1)[-1], got))
        return False

    s3_proxy.fail(None, where=look)
    ss.copy(new, url, dst_options=moto_s3.storage_options(s3_proxy.url), workers=2)
    expect = want["old"] if before == "old store" else want["none"]
    assert len(seen) > 10 and seen[-1][0].endswith("manifest.json")
    assert all(got == expect for _, got in seen), [(k, [n for n, v in want.items() if v == got]) for k, got in seen]
    assert _observe(url, direct, tmp_path / "cache") == want["new"]


# --------------------------------------------------------------------------------- checksums


def _flip_data_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # the last data byte: size and header unchanged
    path.write_bytes(bytes(raw))


def test_damaged_local_source_is_caught_and_nothing_lands(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    src = build(tmp_path / "src.seqstore", n=60)
    _flip_data_byte(src / "shard-000001" / "spk.npy")
    url = f"s3://{s3_bucket}/bad.seqstore"
    with pytest.raises(CorruptionError) as exc:
        ss.copy(src, url, dst_options=moto_s3.storage_options(), workers=1)
    assert "shard-000001/spk.npy" in str(exc.value) and "CRC-32" in str(exc.value)
    keys = moto_s3.keys(s3_bucket, "bad.seqstore/")
    assert "bad.seqstore/shard-000001/spk.npy" not in keys and "bad.seqstore/manifest.json" not in keys
    assert "bad.seqstore/shard-000001/_shard.json" not in keys


@pytest.mark.parametrize(("rel", "old", "new"), [("spk.npy", b"(20,)", b"(30,)"),
                                                 ("spk.npy", b"'<i8'", b"'<f8'"),
                                                 ("x.offsets.npy", b"(21,)", b"(12,)")])
def test_damaged_npy_header_is_caught_and_nothing_lands(tmp_path: Path, rel: str, old: bytes, new: bytes) -> None:
    """The CRC-32 covers a file's data, not its .npy header: a header whose shape or dtype was damaged
    (same length, so the offset of the data is unchanged) was copied as it was, and the destination's
    reads then failed. The header is checked against what the store says the file holds."""
    src = build(tmp_path / "src.seqstore", n=60)
    path = src / "shard-000001" / rel
    raw = path.read_bytes()
    assert raw.count(old) == 1
    path.write_bytes(raw.replace(old, new))
    dst = tmp_path / "dst.seqstore"
    with pytest.raises(CorruptionError) as exc:
        ss.copy(src, dst, workers=1)
    assert f"shard-000001/{rel}: header" in str(exc.value)
    assert not (dst / "shard-000001" / rel).exists() and not (dst / "manifest.json").exists()


def test_damaged_remote_object_is_caught_on_arrival(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    src = build(tmp_path / "src.seqstore", n=60)
    url = moto_s3.upload_dir(src, s3_bucket, "up.seqstore")
    key = "up.seqstore/shard-000002/x.npy"
    raw = bytearray(moto_s3.get(s3_bucket, key))
    raw[-2] ^= 0x01
    moto_s3.put(s3_bucket, key, bytes(raw))
    dst = tmp_path / "down.seqstore"
    with pytest.raises(CorruptionError) as exc:
        ss.copy(url, dst, src_options=moto_s3.storage_options(), workers=1)
    assert "shard-000002/x.npy" in str(exc.value)
    assert not (dst / "shard-000002" / "x.npy").exists() and not (dst / "manifest.json").exists()


def _copied_then_grown(tmp_path: Path) -> tuple[Path, Path]:
    """A local store of 10 records in shards of 5 copied to another, then grown to 20 (the copy's source and
    destination: a copy again adds two shards)."""
    src, dst = tmp_path / "src.seqstore", tmp_path / "dst.seqstore"
    with ss.create(src, {"v": ss.Field("int64")}, max_shard_records=5) as w:
        w.append_batch({"v": np.arange(10)})
    ss.copy(src, dst)
    with ss.append_to(src, max_shard_records=5) as w:
        w.append_batch({"v": np.arange(10, 20)})
    return src, dst


@pytest.mark.parametrize("commits", [False, True])
def test_a_writer_of_a_local_destination_goes_on_while_a_copy_adds_shards(tmp_path: Path, commits: bool,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy adding shards to a local store held the store's commit lock for the whole transfer: every writer
    of it waited (a copy longer than SEQSTORE_LOCK_TIMEOUT made them fail). The copy now stages the shards in
    its own directory of _tmp/ and takes the lock only to commit them: a writer opens and commits meanwhile
    (here with no wait allowed), never removes the copy's shards (as it removes a dead writer's leftover of
    the next shard number), and a writer's commit makes the copy fail, leaving the writer's commit intact."""
    import threading

    from seqstore.store import copy as copy_mod

    src, dst = _copied_then_grown(tmp_path)
    staged, go = threading.Event(), threading.Event()
    shard_of = copy_mod._Copier.shard

    def paused(self: Any, k: int) -> None:
        shard_of(self, k)
        if k == 2:  # the copy's first new shard is complete (staged): the writer comes now
            staged.set()
            assert go.wait(60)

    monkeypatch.setattr(copy_mod._Copier, "shard", paused)
    done: list[BaseException | None] = []

    def run() -> None:
        try:
            ss.copy(src, dst, workers=1)
            done.append(None)
        except BaseException as exc:  # noqa: BLE001
            done.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        assert staged.wait(60)
        monkeypatch.setenv("SEQSTORE_LOCK_TIMEOUT", "0")  # the copy does not hold the lock now
        with ss.append_to(dst, max_shard_records=5) as w:
            if commits:
                w.append_batch({"v": np.arange(100, 105)})
    finally:
        go.set()
        t.join(60)
    monkeypatch.delenv("SEQSTORE_LOCK_TIMEOUT")
    if commits:
        assert isinstance(done[0], SeqstoreError) and "manifest changed while the copy ran" in str(done[0])
    else:
        assert done == [None]
    assert verify(dst) == []
    store = ss.open(dst)
    want = [*range(10), *range(100, 105)] if commits else list(range(20))
    assert store.get_batch(np.arange(len(store)), fields=["v"])["v"].tolist() == want
    assert not any((dst / "_tmp").iterdir())  # the copy's staging directory is gone


# ---------------------------------------------------------------------------- other stores


def test_destination_with_another_store_needs_overwrite(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    a = build(tmp_path / "a.seqstore", n=60, seed=1)
    b = build(tmp_path / "b.seqstore", n=40, seed=2)
    url = f"s3://{s3_bucket}/o.seqstore"
    opts = moto_s3.storage_options()
    ss.copy(a, url, dst_options=opts)
    with pytest.raises(SeqstoreError, match="overwrite=True"):
        ss.copy(b, url, dst_options=opts)
    assert _observe(url, opts, tmp_path / "c") == digest(ss.open(a))  # untouched
    r = ss.copy(b, url, dst_options=opts, overwrite=True)
    assert r.copied == 2
    assert _observe(url, opts, tmp_path / "c") == digest(ss.open(b))
    # a local directory that is not a store is never written into
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep")
    with pytest.raises(SeqstoreError, match="not a store"):
        ss.copy(url, other, src_options=opts)
    assert sorted(p.name for p in other.iterdir()) == ["todo.txt"]
    with pytest.raises(ValueError, match="same store"):
        ss.copy(a, a)


def test_overwrite_replaces_index_runs_of_the_same_name_and_size(tmp_path: Path) -> None:
    """The replaced store's merged id-index run has the name and size of the new store's (same shard
    positions, same record counts) but other ids: it must be copied again, not kept, or lookups of the
    new store's ids miss."""

    def ids_store(path: Path, tag: str) -> Path:
        with ss.create(path, {"v": ss.Field("int64")}, max_shard_records=4) as w:
            w.append_batch({"v": np.arange(40)}, ids=[f"{tag}-{i}" for i in range(40)])
        return path

    a, b = ids_store(tmp_path / "a.seqstore", "a"), ids_store(tmp_path / "b.seqstore", "b")
    runs = ss.open(b).manifest.index_runs
    assert runs and runs == ss.open(a).manifest.index_runs
    dst = tmp_path / "dst.seqstore"
    ss.copy(a, dst)
    ss.copy(b, dst, overwrite=True)
    assert ss.open(dst).index_many(["b-5", "b-31", "b-39"]).tolist() == [5, 31, 39]
    assert verify(dst) == []


def test_overwrite_leaves_none_of_the_replaced_stores_files(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path) -> None:
    """copy(..., overwrite=True) over a bigger store of another schema left that store's other shards,
    its files the new schema has not (ids, other fields), its index runs: files no manifest names, kept
    forever. Once the new store is committed the destination holds what a fresh copy holds."""
    big = tmp_path / "big.seqstore"
    with ss.create(big, {"v": ss.Field("int64"), "w": ss.Field("int8", (None,))}, max_shard_records=4) as w:
        w.append_batch({"v": np.arange(40), "w": [np.zeros(i % 3, np.int8) for i in range(40)]},
                       ids=[f"a-{i}" for i in range(40)])
    assert ss.open(big).manifest.index_runs
    small = tmp_path / "small.seqstore"
    with ss.create(small, {"v": ss.Field("int64")}, max_shard_records=8) as w:
        w.append_batch({"v": np.arange(6)})
    fresh, dst = tmp_path / "fresh.seqstore", tmp_path / "dst.seqstore"
    ss.copy(small, fresh)
    ss.copy(big, dst)
    ss.copy(small, dst, overwrite=True)
    assert sorted(store_files(dst)) == sorted(store_files(fresh))
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_dir()) == ["_tmp", "shard-000000"]
    assert verify(dst) == [] and ss.open(dst)[5]["v"] == 5
    opts = moto_s3.storage_options()
    url = f"s3://{s3_bucket}/o.seqstore"
    ss.copy(big, url, dst_options=opts)
    ss.copy(small, url, dst_options=opts, overwrite=True)
    ss.copy(small, f"s3://{s3_bucket}/fresh.seqstore", dst_options=opts)
    assert sorted(objects(moto_s3, s3_bucket, "o.seqstore")) == sorted(objects(moto_s3, s3_bucket, "fresh.seqstore"))


def test_a_manifest_that_cannot_be_read_is_a_format_error(tmp_path: Path) -> None:
    """A source path that is a file, or a manifest.json that is a directory (at either end), raised a bare
    NotADirectoryError / IsADirectoryError out of copy: a FormatError naming the manifest, as open() says."""
    good = tmp_path / "good.seqstore"
    with ss.create(good, {"v": ss.Field("int64")}) as w:
        w.append({"v": np.int64(1)})
    (tmp_path / "file").write_text("x")
    (tmp_path / "mdir" / "manifest.json").mkdir(parents=True)
    for src, dst in ((tmp_path / "file", tmp_path / "o1"), (tmp_path / "mdir", tmp_path / "o2"),
                     (good, tmp_path / "mdir")):
        for overwrite in (False, True):
            with pytest.raises(FormatError, match=r"manifest\.json: cannot read"):
                ss.copy(src, dst, overwrite=overwrite)
    assert (tmp_path / "mdir" / "manifest.json").is_dir() and not (tmp_path / "o1").exists()


def test_an_interrupted_overwrite_of_a_store_with_a_parts_area_can_be_run_again(tmp_path: Path) -> None:
    """A store may hold a parts area (``_parts/``) and, at version 1/2, dead writers' workspaces
    (``_tmp-*``, ``.manifest.json.tmp-*``). An overwrite that failed after removing the manifest left
    them in a directory the copy then refused as "not a store": the documented rerun of the copy failed."""
    from seqstore.store.parts import PartWriter

    src, bad, dst = tmp_path / "src.seqstore", tmp_path / "bad.seqstore", tmp_path / "dst.seqstore"
    for root in (src, bad):
        with ss.create(root, {"v": ss.Field("int64")}, max_shard_records=4) as w:
            w.append_batch({"v": np.arange(8)})
    data = bad / "shard-000001" / "v.npy"
    data.write_bytes(data.read_bytes()[:-1] + b"\x07")  # the copy fails at this shard
    with ss.create(dst, {"v": ss.Field("int64")}) as w:
        w.append({"v": np.int64(5)})
    pw = PartWriter(dst, job="j", task="t")
    pw.append({"v": np.int64(1)})
    pw.finish()
    (dst / "_tmp-host-1-abc").mkdir()  # (as a dead version-1/2 writer leaves them)
    (dst / ".manifest.json.tmp-1").write_text("{")
    with pytest.raises(CorruptionError, match="CRC-32"):
        ss.copy(bad, dst, overwrite=True)
    assert not (dst / "manifest.json").exists()
    r = ss.copy(src, dst, overwrite=True)
    assert r.shards == 2 and verify(dst) == [] and ss.open(dst).get_batch(np.arange(8))["v"].tolist() == list(range(8))


def test_cli_copy(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from seqstore.cli import main

    src = build(tmp_path / "src.seqstore", n=40)
    url = f"s3://{s3_bucket}/cli.seqstore"
    opts = [f"{k}={v}" for k, v in moto_s3.storage_options().items()]
    args = ["copy", str(src), url, "--workers", "2", "-q"] + [a for o in opts for a in ("--dst-option", o)]
    assert main(args) == 0
    assert "2 shard(s): 2 copied, 0 already there" in capsys.readouterr().out
    back = tmp_path / "back.seqstore"
    args = ["copy", url, str(back), "-q"] + [a for o in opts for a in ("--src-option", o)]
    assert main(args) == 0
    assert store_files(back) == store_files(src)
    assert main(["copy", str(src), str(back)]) == 0  # the progress bar: shards done of all, on stderr
    captured = capsys.readouterr()
    assert "0 copied, 2 already there" in captured.out and "copy: 100%" in captured.err and "2/2" in captured.err
    assert main(["copy", str(src), str(back), "-q", "--dst-option", "region=x"]) == 2  # options for a path
    assert main(["copy", str(tmp_path / "missing"), str(tmp_path / "x"), "-q"]) == 2
    assert "no seqstore store here" in capsys.readouterr().err


def test_version2_store_round_trip_resume_and_no_remote_writer(moto_s3: MotoS3, s3_bucket: str,
                                                               tmp_path: Path) -> None:
    """A store in the JSON shard-list layout (format version 2: no descriptors) copies byte for byte; a
    rerun checks the CRCs of the shards already there instead of sending them again."""
    from seqstore.format.manifest import Manifest

    src = tmp_path / "v2.seqstore"
    src.mkdir()
    Manifest(ss.Schema(_schema(), packed={"pk": ["g/a", "g/b"]})).save(src)  # no shard table: version 2
    with ss.append_to(src, max_shard_records=20) as w:
        _append(w, 0, 50, 3)
    assert Manifest.load(src).version == 2
    url = f"s3://{s3_bucket}/v2.seqstore"
    opts = moto_s3.storage_options()
    assert ss.copy(src, url, dst_options=opts).copied == 3
    assert objects(moto_s3, s3_bucket, "v2.seqstore") == store_files(src)
    back = tmp_path / "back.seqstore"
    ss.copy(url, back, src_options=opts)
    assert store_files(back) == store_files(src)
    (back / "manifest.json").unlink()  # as if the copy had been interrupted before its manifest
    raw = bytearray((back / "shard-000001" / "spk.npy").read_bytes())
    raw[-1] ^= 0x10  # and a file of shard 1 were damaged since
    (back / "shard-000001" / "spk.npy").write_bytes(bytes(raw))
    r = ss.copy(url, back, src_options=opts)
    assert (r.skipped, r.copied) == (2, 1) and store_files(back) == store_files(src)
    with pytest.raises(SeqstoreError, match="version-3 stores only"):
        ss.append_to(url, storage_options=opts)


def test_copy_gives_up_when_the_client_thread_is_stuck(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A file read from object storage in several chunks waits for each chunk no longer than the client's
    patience: a RemoteError naming the object, never a hang, when the thread that runs the requests is stuck
    (each chunk after an object's first waited for its request with no bound)."""
    import threading

    from seqstore.errors import RemoteError
    from seqstore.io.object_obstore import _Loop
    from seqstore.io.objects import ObjectClient
    from seqstore.store import copy as copy_mod

    src = build(tmp_path / "src.seqstore")
    url = f"s3://{s3_bucket}/stuck/a.seqstore"
    opts = moto_s3.storage_options()
    ss.copy(src, url, dst_options=opts)
    monkeypatch.setattr(copy_mod, "CHUNK", 256)  # the shards' files are read in several chunks
    monkeypatch.setattr(ObjectClient, "patience", lambda self: 1.0)
    stuck, blocked = threading.Event(), threading.Event()
    submit = ObjectClient.submit

    def stick_after_the_first_chunk(self: ObjectClient, requests: Any, *args: Any, **kwargs: Any) -> Any:
        if requests and requests[0][1] > 0 and not stuck.is_set():  # a chunk after an object's first
            stuck.set()
            blocked.clear()
            _Loop.get().loop.call_soon_threadsafe(blocked.wait, 30)  # the requests' thread blocks
        return submit(self, requests, *args, **kwargs)

    monkeypatch.setattr(ObjectClient, "submit", stick_after_the_first_chunk)
    try:
        with pytest.raises(RemoteError, match="no answer within") as exc:
            ss.copy(url, tmp_path / "back.seqstore", src_options=opts, workers=1)
    finally:
        blocked.set()
    assert exc.value.url.startswith(url + "/shard-")


@pytest.mark.parametrize("update", [False, True])
def test_a_manifest_write_that_went_through_unanswered_completes_the_copy(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, s3_proxy: FaultProxy, update: bool) -> None:
    """The copy's conditional write of manifest.json took effect but its answer was lost; the retry was
    refused (the manifest there was the copy's own by then) and the copy reported that another writer had
    committed meanwhile and that it had to be run again, though the store was complete."""
    src = build(tmp_path / "src.seqstore", n=60)
    url = f"s3://{s3_bucket}/lost.seqstore"
    opts = moto_s3.storage_options()
    if update:
        ss.copy(src, url, dst_options=opts)
        grow(src, 60, 30)
    rule = s3_proxy.lose(1, method="PUT", path="lost.seqstore/manifest.json")
    r = ss.copy(src, url, dst_options=moto_s3.storage_options(s3_proxy.url))
    assert rule.hits == 1 and r.shards == (5 if update else 3)
    assert objects(moto_s3, s3_bucket, "lost.seqstore") == store_files(src)


def test_a_copy_into_the_source_store_itself_is_refused(tmp_path: Path) -> None:
    """Copying a local store into a directory inside it (``copy(a, a / "backup")``) wrote a second store
    among the first one's files, which any overwrite of the first deletes with it; refused like a copy
    onto itself, and nothing is written."""
    a = tmp_path / "a"
    with ss.create(a, {"v": ss.Field("int64")}) as w:
        w.append_batch({"v": np.arange(3)})
    before = sorted(p.relative_to(a) for p in a.rglob("*"))
    for inside in (a / "backup", a / "shard-000000" / "x"):
        with pytest.raises(ValueError, match="inside the source store"):
            ss.copy(a, inside)
    assert sorted(p.relative_to(a) for p in a.rglob("*")) == before


def test_a_writer_waiting_for_a_local_copy_is_told_a_copy_holds_the_lock(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A local copy replacing a store holds its commit lock until it is committed; a writer that waited longer
    than SEQSTORE_LOCK_TIMEOUT got a LockTimeout blaming "a hung or stopped process". It now says that the
    holder is copying a store into it (the copy is known by its directory in _tmp/)."""
    import threading

    from seqstore.errors import LockTimeout
    from seqstore.store import copy as copy_mod

    src, dst = tmp_path / "src.seqstore", tmp_path / "dst.seqstore"
    with ss.create(src, {"v": ss.Field("int64")}, max_shard_records=5) as w:
        w.append_batch({"v": np.arange(10)})
    ss.create(dst, {"w": ss.Field("int64")}).close()  # another store: replaced under the lock (overwrite)
    inside, go = threading.Event(), threading.Event()
    shard_of = copy_mod._Copier.shard

    def paused(self: Any, k: int) -> None:
        inside.set()
        assert go.wait(60)
        shard_of(self, k)

    monkeypatch.setattr(copy_mod._Copier, "shard", paused)
    done: list[BaseException | None] = []

    def run() -> None:
        try:
            ss.copy(src, dst, workers=1, overwrite=True)
            done.append(None)
        except BaseException as exc:  # noqa: BLE001
            done.append(exc)

    writer = ss.append_to(dst)  # (opened before: the copy removes the manifest of the store it replaces)
    writer.append({"w": 1})
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        assert inside.wait(60)
        monkeypatch.setenv("SEQSTORE_LOCK_TIMEOUT", "0")
        with pytest.raises(LockTimeout, match=f"held by process {os.getpid()}.*, which is copying a store into "
                                              "it") as err:
            writer.commit()
        assert "hung or stopped" not in str(err.value)
    finally:
        go.set()
        t.join(60)
        writer.abort()
    assert done == [None]
    monkeypatch.delenv("SEQSTORE_LOCK_TIMEOUT")
    assert ss.open(dst).get_batch(np.arange(10), fields=["v"])["v"].tolist() == list(range(10))


def _copy_fails_on_a_flipped_byte(src: Path, dst: Path) -> tuple[Path, bytes]:
    """Flip the last byte of the source's shard 3, see the copy into ``dst`` (10 records) fail naming it and
    add nothing; returns the file and its bytes, to put back."""
    path = src / "shard-000003" / "v.npy"
    raw = path.read_bytes()
    path.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(CorruptionError, match="shard-000003"):
        ss.copy(src, dst, workers=1)
    assert len(ss.open(dst)) == 10 and not (dst / "shard-000002").exists()
    return path, raw


def test_a_failed_copy_into_a_local_store_resumes_from_its_staged_shards(tmp_path: Path) -> None:
    """The shards a copy adding to a local store had staged when it failed are kept (out of the store) and
    taken over by the next copy: the rerun sends only the others, and nothing is left in _tmp/."""
    src, dst = _copied_then_grown(tmp_path)
    path, raw = _copy_fails_on_a_flipped_byte(src, dst)
    path.write_bytes(raw)
    r = ss.copy(src, dst, workers=1)
    assert (r.skipped, r.copied) == (3, 1)
    assert ss.open(dst).get_batch(np.arange(20), fields=["v"])["v"].tolist() == list(range(20))
    assert verify(dst) == [] and not any((dst / "_tmp").iterdir())


def test_a_failed_copy_into_a_local_version_1_store_leaves_no_staging_directory(tmp_path: Path) -> None:
    """A version-1/2 store's writers never look in _tmp/ (their workspaces are _tmp-* at the top): the staging
    directory of a copy that failed adding shards to it stayed until the next copy. It goes with the failure."""
    from seqstore.format.manifest import Manifest

    src, dst = tmp_path / "src.seqstore", tmp_path / "dst.seqstore"
    src.mkdir()
    Manifest(ss.Schema({"v": ss.Field("int64")})).save(src)  # (the JSON shard list of version 1)
    with ss.append_to(src, max_shard_records=5) as w:
        w.append_batch({"v": np.arange(10)})
    ss.copy(src, dst)
    with ss.append_to(src, max_shard_records=5) as w:
        w.append_batch({"v": np.arange(10, 20)})
    path, raw = _copy_fails_on_a_flipped_byte(src, dst)
    assert not (dst / "_tmp").is_dir() or not any((dst / "_tmp").iterdir())
    path.write_bytes(raw)
    ss.copy(src, dst, workers=1)
    assert ss.open(dst).get_batch(np.arange(20), fields=["v"])["v"].tolist() == list(range(20))
