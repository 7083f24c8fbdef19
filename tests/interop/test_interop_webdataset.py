"""WebDataset tar shards: import_webdataset / export_webdataset against webdataset 1.0.2's own
TarWriter and WebDataset reader."""

from __future__ import annotations

import gc
import gzip
import io
import tarfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.cli import main as cli_main
from seqstore.errors import SchemaError
from seqstore.interop import SourceFormatError
from seqstore.interop.webdataset import UnknownMemberError, expand_shards, export_webdataset, import_webdataset

wds: Any = pytest.importorskip("webdataset")


def write_shards(root: Path, *, shards: int = 3, per: int = 15, seed: int = 0, extra: dict[int, str] | None = None,
                 compress: bool = False) -> list[str]:
    """Shards written by webdataset's TarWriter: a ragged float32 ``npy``, a scalar ``score.npy``, an integer
    ``cls``, ``json`` and ``txt``; ``extra`` adds a member with that extension to the sample of that number."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths, k = [], 0
    for s in range(shards):
        path = root / (f"{s:06d}.tar" + (".gz" if compress else ""))
        with wds.TarWriter(str(path), compress=compress) as w:
            for _ in range(per):
                sample = {"__key__": f"utt/{k:05d}", "npy": rng.standard_normal((int(rng.integers(0, 6)), 3))
                          .astype(np.float32), "score.npy": np.float64(rng.random()), "cls": int(rng.integers(0, 9)),
                          "json": {"k": k, "w": "é"}, "txt": f"sample {k}"}
                if extra and k in extra:
                    sample[extra[k]] = b"\x00\x01"
                w.write(sample)
                k += 1
        paths.append(str(path))
    return paths


def assert_same(store: seqstore.Store, urls: list[str]) -> None:
    """Every sample webdataset reads from ``urls`` equals the store's record of the same number."""
    n = 0
    for i, smp in enumerate(wds.WebDataset(urls, shardshuffle=False)):
        rec = store[i]
        assert store.id(i) == smp["__key__"]
        npy = np.load(io.BytesIO(smp["npy"]))
        assert rec["npy"].dtype == npy.dtype and np.array_equal(rec["npy"], npy)
        assert rec["score"] == np.load(io.BytesIO(smp["score.npy"]))
        assert int(rec["cls"]) == int(smp["cls"])
        assert bytes(rec["json"]) == smp["json"] and bytes(rec["txt"]) == smp["txt"]
        n += 1
    assert n == len(store)


def test_import_round_trips_against_webdataset(tmp_path: Path) -> None:
    urls = write_shards(tmp_path / "shards")
    st = import_webdataset(tmp_path / "shards", tmp_path / "w.seqstore", chunk_bytes=500)
    assert st.schema["npy"] == Field("float32", (None, 3)) and st.schema["score"] == Field("float64")
    assert st.schema["cls"] == Field("int64") and st.schema["json"] == Field("uint8", (None,))
    assert len(st) == 45 and st.metadata["webdataset"]["shards"] == ["000000.tar", "000001.tar", "000002.tar"]
    assert_same(st, urls)
    # a brace range and explicit fields
    st2 = import_webdataset(str(tmp_path / "shards" / "{000001..000002}.tar"), tmp_path / "w2.seqstore",
                            fields={"cls": "label", "txt": "text"}, strict=False)
    assert list(st2.schema) == ["label", "text"] and len(st2) == 30 and st2.id(0) == "utt/00015"
    assert bytes(st2[29]["text"]) == b"sample 44"


def test_gzip_shards(tmp_path: Path) -> None:
    urls = write_shards(tmp_path / "gz", shards=2, per=5, compress=True)
    st = import_webdataset(urls, tmp_path / "gz.seqstore")
    assert_same(st, urls)


def test_parallel_import_keeps_shard_order(tmp_path: Path) -> None:
    urls = write_shards(tmp_path / "shards", shards=5, per=7, seed=2)
    seq = import_webdataset(urls, tmp_path / "seq.seqstore")
    par = import_webdataset(urls, tmp_path / "par.seqstore", workers=2)
    assert par.num_shards > 1 and len(par) == len(seq)
    assert [par.id(i) for i in range(len(par))] == [seq.id(i) for i in range(len(seq))]
    assert_same(par, urls)


def test_strict_mapping_refuses_an_unknown_extension(tmp_path: Path) -> None:
    urls = write_shards(tmp_path / "shards", extra={20: "wav"})
    with pytest.raises(UnknownMemberError) as exc:
        import_webdataset(urls, tmp_path / "x.seqstore")
    msg = str(exc.value)
    assert "000001.tar" in msg and "utt/00020.wav" in msg and ".wav" in msg
    assert not (tmp_path / "x.seqstore").exists()
    st = import_webdataset(urls, tmp_path / "x.seqstore", strict=False)  # skipped
    assert "wav" not in st.schema and len(st) == 45
    with pytest.raises(UnknownMemberError):  # a mapping leaves out the other extensions
        import_webdataset(urls, tmp_path / "y.seqstore", fields={"cls": "label"})


def test_missing_member_and_bad_data_are_named_errors(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    with wds.TarWriter(str(root / "a.tar")) as w:
        w.write({"__key__": "k0", "cls": 1, "txt": "a"})
        w.write({"__key__": "k1", "cls": 2})
    with pytest.raises(SourceFormatError, match=r"a\.tar.*'k1' has no \.txt member"):
        import_webdataset(root / "a.tar", tmp_path / "x.seqstore")
    with wds.TarWriter(str(root / "b.tar")) as w:
        w.write({"__key__": "k0", "cls": 1})
        w.write({"__key__": "k1", "cls": "seven"})
    with pytest.raises(SourceFormatError, match=r"b\.tar.*k1\.cls.*decimal integer"):
        import_webdataset(root / "b.tar", tmp_path / "x.seqstore")
    with wds.TarWriter(str(root / "e.tar")) as w:  # an integer member past int64 (a 64-bit unsigned hash)
        w.write({"__key__": "k0", "id": 5})
        w.write({"__key__": "k1", "id": 18446744073709551615})
    with pytest.raises(SourceFormatError, match=r"e\.tar.*k1\.id.*18446744073709551615.*int64"):
        import_webdataset(root / "e.tar", tmp_path / "x.seqstore")
    with wds.TarWriter(str(root / "f.tar")) as w:  # a later array of a dtype no field holds
        w.write({"__key__": "k0", "npy": np.arange(3.0)})
        w.write({"__key__": "k1", "npy": np.array(["abc"])})
    with pytest.raises(SourceFormatError, match=r"f\.tar.*k1\.npy.*<U3.*does not fit field 'npy'"):
        import_webdataset(root / "f.tar", tmp_path / "x.seqstore")
    (root / "c.tar").write_bytes(b"not a tar file" * 100)
    with pytest.raises(SourceFormatError, match=r"c\.tar.*tar shard"):
        import_webdataset(root / "c.tar", tmp_path / "x.seqstore")
    with pytest.raises(FileNotFoundError, match="d.tar"):
        import_webdataset(root / "d.tar", tmp_path / "x.seqstore")
    assert not (tmp_path / "x.seqstore").exists()


def test_a_shard_cut_inside_a_header_is_an_error(tmp_path: Path) -> None:
    """A shard whose last bytes are the start of a member's header (a download cut short) names the
    shard; its samples before the cut are not imported as if they were the whole shard."""
    with wds.TarWriter(str(tmp_path / "a.tar")) as w:
        for k in range(3):
            w.write({"__key__": f"k{k}", "cls": k, "txt": f"sample {k}"})
    whole = (tmp_path / "a.tar").read_bytes()
    heads = [i for i in range(0, len(whole), 512) if whole[i : i + 3] == b"k2."]
    (tmp_path / "cut.tar").write_bytes(whole[: heads[0] + 100])
    with pytest.raises(SourceFormatError, match=r"cut\.tar.*truncated"):
        import_webdataset(tmp_path / "cut.tar", tmp_path / "x.seqstore")
    assert not (tmp_path / "x.seqstore").exists()
    (tmp_path / "padded.tar").write_bytes(whole[: len(whole) - 100])  # cut in the zero padding: nothing lost
    assert len(import_webdataset(tmp_path / "padded.tar", tmp_path / "y.seqstore")) == 3


def _member(name: bytes, data: bytes, kind: bytes = b"0", size: int | None = None) -> bytes:
    """A ustar member (header with its checksum, data, padding) written by hand, so that it can lie."""
    h = bytearray(512)
    h[: len(name)] = name
    h[100:108] = b"0000644\0"
    h[124:136] = b"%011o\0" % (len(data) if size is None else size)
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h) + data + bytes(-len(data) % 512)


@pytest.mark.timeout(60)  # both looped forever before
@pytest.mark.parametrize(("pax", "words"), [(b"14 size=-1536\n", "size -1536"), (b"0 a=b\n", "pax record")])
def test_a_negative_member_size_or_empty_pax_record_is_an_error_not_a_hang(tmp_path: Path, pax: bytes,
                                                                           words: str) -> None:
    """A pax header giving a member a negative size sent the reader back to an earlier header (forever,
    for a member that is not a file); a pax record of length 0 never advanced. Both name the shard."""
    tar = (_member(b"pax", pax, b"x") + _member(b"dir", b"", b"5") + _member(b"k0.txt", b"a")
           + _member(b"k1.txt", b"b") + bytes(1024))
    for name, data in (("h.tar", tar), ("h.tar.gz", gzip.compress(tar))):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(SourceFormatError, match=rf"h\.tar.*{words}"):
            import_webdataset(tmp_path / name, tmp_path / "x.seqstore")
        assert not (tmp_path / "x.seqstore").exists()


@pytest.mark.parametrize("kind", [b"0", b"L", b"x"])
def test_a_compressed_shard_whose_header_declares_terabytes_is_a_named_error(tmp_path: Path, kind: bytes) -> None:
    """A member header in a compressed shard (or one at a URL, read as a stream too) declaring 10 TB made the
    reader ask for all of it in one read, which allocates the whole size first: a bare MemoryError."""
    h = bytearray(_member(b"k1.txt" if kind == b"0" else b"hdr", b"", kind)[:512])
    h[124:136] = b"\x80" + (10**13).to_bytes(11, "big")  # GNU base-256: the size 10 TB
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    huge = bytes(h) + b"b" + bytes(511)
    tar = _member(b"k0.txt", b"a") + huge + bytes(1024)
    (tmp_path / "h.tar.gz").write_bytes(gzip.compress(tar))
    with pytest.raises(SourceFormatError, match=r"h\.tar\.gz.*truncated \(a member of \d+ bytes .* runs past"):
        import_webdataset(tmp_path / "h.tar.gz", tmp_path / "x.seqstore")
    assert not (tmp_path / "x.seqstore").exists()


_WIDE_RANGE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))  # (the names of a billion shards need far more)
from seqstore.interop.webdataset import import_webdataset
try:
    import_webdataset(sys.argv[1] + "/x-{000000000..999999999}.tar", sys.argv[1] + "/out")
except BaseException as exc:
    print(type(exc).__name__, exc)
"""


def test_a_brace_range_mistyped_too_wide_fails_at_its_first_missing_shard(tmp_path: Path) -> None:
    """Every name of a brace range was listed before the first was checked: a range a billion shards wide
    built gigabytes of names (a MemoryError, or swapping) before saying that its first shard is missing."""
    import os
    import subprocess
    import sys

    src = Path(seqstore.__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", _WIDE_RANGE, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(src)})
    assert proc.stdout.startswith(f"FileNotFoundError {tmp_path}/x-000000000.tar: no such tar shard"), (
        proc.stdout + proc.stderr[-2000:])
    assert sorted(os.listdir(tmp_path)) == []


_WIDE_URL_RANGE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))  # (the names of a billion shards need far more)
from seqstore.interop.webdataset import import_webdataset
try:
    import_webdataset(sys.argv[1] + "/x-{000000000..999999999}.tar", sys.argv[2] + "/out",
                      source_options={"allow_http": "true"})
except BaseException as exc:
    print(type(exc).__name__, exc)
"""


def test_a_url_brace_range_mistyped_too_wide_fails_at_its_first_missing_shard(tmp_path: Path) -> None:
    """The names of a brace range of URLs were all listed before any was asked for: a range a billion
    shards wide built gigabytes of names (a MemoryError) where a local one fails at its first missing
    shard. Each URL is now asked for (HEAD) as its name is made."""
    import os
    import subprocess
    import sys

    from support.http import StaticServer

    write_shards(tmp_path / "shards", shards=1, per=2)
    (tmp_path / "shards" / "000000.tar").rename(tmp_path / "shards" / "x-000000000.tar")
    (tmp_path / "out").mkdir()
    src = Path(seqstore.__file__).resolve().parents[1]
    with StaticServer(tmp_path / "shards") as srv:
        proc = subprocess.run([sys.executable, "-c", _WIDE_URL_RANGE, srv.url, str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(src)})
    assert proc.stdout.startswith(f"RemoteNotFound {srv.url}/x-000000001.tar"), proc.stdout + proc.stderr[-2000:]
    assert os.listdir(tmp_path / "out") == []


def test_a_npy_member_with_a_lying_header_names_the_shard_and_member(tmp_path: Path) -> None:
    """A .npy header of an unknown dtype was a bare TypeError; one claiming far more values than follow
    made numpy.load allocate them all (a MemoryError for 36 TiB)."""
    buf = io.BytesIO()
    np.save(buf, np.arange(3, dtype=np.int32))
    good = buf.getvalue()
    for name, bad, words in (("descr", good.replace(b"'<i4'", b"'<q9'"), "data type '<q9' not understood"),
                             ("count", good.replace(b"(3,)", b"(9999999999999,)"), r"its header says shape "
                              r"\(9999999999999,\) of int32, 39999999999996 bytes, but \d+ bytes follow")):
        (tmp_path / f"{name}.tar").write_bytes(_member(b"k0.npy", good) + _member(b"k1.npy", bad) + bytes(1024))
        with pytest.raises(SourceFormatError, match=rf"{name}\.tar.*k1\.npy.*not a \.npy array: {words}"):
            import_webdataset(tmp_path / f"{name}.tar", tmp_path / "x.seqstore")
        assert not (tmp_path / "x.seqstore").exists()


def _npy(header: str, version: int = 1) -> bytes:
    """A .npy file of ``header`` (padded as numpy pads it) and 16 bytes of data."""
    h = header.encode("latin1")
    size = 2 if version == 1 else 4
    h += b" " * (-(6 + 2 + size + len(h) + 1) % 64) + b"\n"
    return b"\x93NUMPY" + bytes([version, 0]) + len(h).to_bytes(size, "little") + h + bytes(16)


@pytest.mark.parametrize(("header", "version"), [
    ("{'descr': '<f8', 'fortran_order': True, 'shape': (1000000000000, 3), }", 1),
    ("{'shape': (1000000000000,), 'fortran_order': False, 'descr': '<i4'}", 1),
    ("{'descr': [('a', '<i8')], 'fortran_order': False, 'shape': (1000000000000,), }", 2),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", 3),
])
def test_a_npy_member_of_another_header_layout_claiming_a_huge_shape_is_a_named_error(
        tmp_path: Path, header: str, version: int) -> None:
    """A .npy header numpy.save does not write itself (Fortran order, keys in another order, a structured
    dtype, a version 2 or 3 header) went to numpy.load, which allocated the whole declared shape first: a
    bare MemoryError (or gigabytes of address space) for a member of a few bytes."""
    buf = io.BytesIO()
    np.save(buf, np.arange(3, dtype=np.int32))
    (tmp_path / "h.tar").write_bytes(_member(b"k0.npy", buf.getvalue()) + _member(b"k1.npy", _npy(header, version))
                                     + bytes(1024))
    with pytest.raises(SourceFormatError, match=r"h\.tar.*k1\.npy.*not a \.npy array: its header says shape "
                       r"\(1000000000000.*but 16 bytes follow"):
        import_webdataset(tmp_path / "h.tar", tmp_path / "x.seqstore")
    assert not (tmp_path / "x.seqstore").exists()


def test_import_from_http_urls(tmp_path: Path) -> None:
    from support.http import StaticServer

    write_shards(tmp_path / "shards", shards=2, per=6)
    with StaticServer(tmp_path / "shards") as srv:
        urls = [f"{srv.url}/{i:06d}.tar" for i in range(2)]
        st = import_webdataset(urls, tmp_path / "u.seqstore", source_options={"allow_http": "true"})
    assert_same(st, [str(tmp_path / "shards" / f"{i:06d}.tar") for i in range(2)])


def test_export_is_read_by_webdataset(tmp_path: Path) -> None:
    write_shards(tmp_path / "shards", seed=4)
    st = import_webdataset(tmp_path / "shards", tmp_path / "w.seqstore")
    out = export_webdataset(st, tmp_path / "out", shard_records=20)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["000000.tar", "000001.tar", "000002.tar"]
    ds = wds.WebDataset([str(out / n) for n in names], shardshuffle=False).decode()
    count = 0
    for i, smp in enumerate(ds):
        rec = st[i]
        assert smp["__key__"] == st.id(i)
        assert np.array_equal(smp["npy"], rec["npy"]) and smp["npy"].dtype == rec["npy"].dtype
        assert smp["score.npy"] == rec["score"] and smp["cls"] == int(rec["cls"])
        assert smp["json"] == {"k": i, "w": "é"} and smp["txt"] == f"sample {i}"
        count += 1
    assert count == len(st)
    # and back in: the same records
    again = import_webdataset(out, tmp_path / "again.seqstore")
    assert_same(again, [str(out / n) for n in names])
    with pytest.raises(FileExistsError):
        export_webdataset(st, out)


def test_export_a_plain_store(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    with seqstore.create(tmp_path / "p.seqstore", {"feat": Field("float16", (None, 4)), "label": Field("int32")}) as w:
        for _ in range(9):
            w.append({"feat": rng.standard_normal((int(rng.integers(1, 5)), 4)), "label": int(rng.integers(0, 5))})
    out = export_webdataset(tmp_path / "p.seqstore", tmp_path / "o", fields={"feat": "feat.npy", "label": "cls"})
    samples = list(wds.WebDataset(str(out / "000000.tar"), shardshuffle=False).decode())
    st = seqstore.open(tmp_path / "p.seqstore")
    assert [s["__key__"] for s in samples] == [f"{i:09d}" for i in range(9)]
    for i, s in enumerate(samples):
        assert np.array_equal(s["feat.npy"], st[i]["feat"]) and s["cls"] == int(st[i]["label"])
    with pytest.raises(SchemaError, match="ragged uint8"):
        export_webdataset(st, tmp_path / "o2", fields={"feat": "jpg"})
    with pytest.raises(seqstore.errors.SeqstoreError, match="is inside the store"):
        export_webdataset(st, tmp_path / "p.seqstore", overwrite=True, fields={"label": "cls"})


def test_export_writes_bfloat16_as_float32(tmp_path: Path) -> None:
    """bfloat16 fields become float32 arrays in the members (they were their uint16 bits, which every
    reader took for integers); a bfloat16 scalar cannot be an integer member."""
    vals = np.array([1.5, -2, 0.25, 3], np.float32)
    with seqstore.create(tmp_path / "b.seqstore", {"emb": Field("bfloat16", (4,)), "x": Field("bfloat16", (None,)),
                                                   "s": Field("bfloat16")}) as w:
        w.append({"emb": vals, "x": vals[:2], "s": 0.5}, id="a")
    st = seqstore.open(tmp_path / "b.seqstore")  # bfloat16 as its bits
    out = export_webdataset(st, tmp_path / "o")
    [smp] = list(wds.WebDataset(str(out / "000000.tar"), shardshuffle=False).decode())
    assert smp["emb.npy"].dtype == np.float32 and np.array_equal(smp["emb.npy"], vals)
    assert np.array_equal(smp["x.npy"], vals[:2]) and smp["s.npy"] == np.float32(0.5)
    with pytest.raises(SchemaError, match=".cls members hold one integer"):
        export_webdataset(st, tmp_path / "o2", fields={"s": "cls"})


def test_export_of_more_shards_than_the_digits_hold_keeps_the_order(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """More shards than their numbers' digits hold (10**6, here lowered to 10): every name gets as many
    digits as the last, so a directory read in name order (as import_webdataset reads one) keeps the
    records' order ("10.tar" sorted before "2.tar" before)."""
    import seqstore.interop.webdataset as mod

    monkeypatch.setattr(mod, "SHARD_DIGITS", 1)
    with seqstore.create(tmp_path / "s.seqstore", {"label": Field("int32")}) as w:
        w.append_batch({"label": np.arange(25, dtype=np.int32)})
    out = export_webdataset(tmp_path / "s.seqstore", tmp_path / "o", fields={"label": "cls"}, shard_records=2)
    assert sorted(p.name for p in out.iterdir()) == [f"{k:02d}.tar" for k in range(13)]
    back = import_webdataset(out, tmp_path / "back.seqstore")
    assert [int(back[i]["cls"]) for i in range(len(back))] == list(range(25))
    few = export_webdataset(tmp_path / "s.seqstore", tmp_path / "o2", fields={"label": "cls"}, shard_records=5)
    assert sorted(p.name for p in few.iterdir()) == [f"{k}.tar" for k in range(5)]


def test_export_refuses_an_id_with_a_dot(tmp_path: Path) -> None:
    with seqstore.create(tmp_path / "d.seqstore", {"label": Field("int32")}) as w:
        w.append({"label": 1}, id="a")
        w.append({"label": 2}, id="b.c")
    with pytest.raises(SchemaError, match=r"record 1: id 'b\.c'"):
        export_webdataset(tmp_path / "d.seqstore", tmp_path / "o", fields={"label": "cls"})
    assert not (tmp_path / "o").exists()
    out = export_webdataset(tmp_path / "d.seqstore", tmp_path / "o", fields={"label": "cls"}, keys="index")
    assert [s["__key__"] for s in wds.WebDataset(str(out / "000000.tar"), shardshuffle=False)] == ["000000000",
                                                                                                    "000000001"]


def test_export_refuses_an_id_with_a_nul(tmp_path: Path) -> None:
    """A tar header's name ends at its first NUL: an id 'b\\0c' was written as a member that every reader
    names 'b' (no extension), so webdataset and import_webdataset skipped it and the record was silently
    lost. Such an id is refused naming the record."""
    with seqstore.create(tmp_path / "d.seqstore", {"txt": Field("uint8", (None,))}) as w:
        for key in ("a", "b\0c", "d"):
            w.append({"txt": np.frombuffer(key.encode(), np.uint8)}, id=key)
    with pytest.raises(SchemaError, match=r"record 1: id 'b\\x00c' cannot be a WebDataset key.*keys='index'"):
        export_webdataset(tmp_path / "d.seqstore", tmp_path / "o")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.seqstore"]
    out = export_webdataset(tmp_path / "d.seqstore", tmp_path / "o", keys="index")
    assert len(list(wds.WebDataset(str(out / "000000.tar"), shardshuffle=False))) == 3


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/abs/x"])
def test_export_refuses_an_id_that_climbs_out_of_the_directory(tmp_path: Path, key: str) -> None:
    """An id '../x' or '/abs/x' was written as a tar member of that name, which a tar extraction puts
    outside the directory it extracts in. Such an id is refused naming the record."""
    with seqstore.create(tmp_path / "d.seqstore", {"label": Field("int32")}) as w:
        w.append({"label": 1}, id="a/b")
        w.append({"label": 2}, id=key)
    with pytest.raises(SchemaError, match=r"record 1: id .* cannot be a WebDataset key.*'\.\.'"):
        export_webdataset(tmp_path / "d.seqstore", tmp_path / "o", fields={"label": "cls"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.seqstore"]


def test_export_refuses_an_id_repeated_in_a_row(tmp_path: Path) -> None:
    """A store may hold an id twice; two records of one id in a row were written as members of one key
    next to each other, which webdataset reads as one sample with a duplicate member (a ValueError) and
    the import refuses: the export wrote shards that cannot be read back. It is refused naming the
    records and the id; the same id apart, or with keys='index', exports."""
    with seqstore.create(tmp_path / "s", {"txt": Field("uint8", (None,))}) as w:
        for i, key in enumerate(["a", "b", "b", "c"]):
            w.append({"txt": np.frombuffer(f"t{i}".encode(), np.uint8)}, id=key)
    with pytest.raises(SchemaError, match=r"records 1 and 2: id 'b' twice in a row.*keys='index'"):
        export_webdataset(tmp_path / "s", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
    out = export_webdataset(tmp_path / "s", tmp_path / "out", keys="index")
    assert len(list(wds.WebDataset(str(out / "000000.tar"), shardshuffle=False))) == 4
    with seqstore.create(tmp_path / "apart", {"txt": Field("uint8", (None,))}) as w:
        for i, key in enumerate(["a", "b", "a"]):
            w.append({"txt": np.frombuffer(f"t{i}".encode(), np.uint8)}, id=key)
    out = export_webdataset(tmp_path / "apart", tmp_path / "out2")
    assert [s["__key__"] for s in wds.WebDataset(str(out / "000000.tar"), shardshuffle=False)] == ["a", "b", "a"]


def test_export_that_fails_on_a_record_leaves_no_shard_open(tmp_path: Path) -> None:
    """The shard being written when a record is refused is closed (it was left to the garbage
    collector, open while the error was held: a ResourceWarning)."""
    with seqstore.create(tmp_path / "d.seqstore", {"label": Field("int32")}) as w:
        w.append({"label": 1}, id="a")
        w.append({"label": 2}, id="b.c")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(SchemaError, match=r"record 1: id 'b\.c'"):
            export_webdataset(tmp_path / "d.seqstore", tmp_path / "o", fields={"label": "cls"})
        gc.collect()
    assert [str(c.message) for c in caught if issubclass(c.category, ResourceWarning)] == []


def test_export_refuses_a_field_named_twice(tmp_path: Path) -> None:
    """fields=["label", "label"] wrote the field once without a word; it is refused naming the field."""
    with seqstore.create(tmp_path / "d.seqstore", {"label": Field("int32")}) as w:
        w.append({"label": 1})
    with pytest.raises(SchemaError, match="'label' is named twice in fields"):
        export_webdataset(tmp_path / "d.seqstore", tmp_path / "o", fields=["label", "label"])
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("fields", [[], {}])
def test_export_of_no_field_is_refused(tmp_path: Path, fields: Any) -> None:
    """fields=[] wrote a tar with no sample for the store's records (a sample is its members)."""
    with seqstore.create(tmp_path / "d.seqstore", {"label": Field("int32")}) as w:
        w.append({"label": 1})
    with pytest.raises(SchemaError, match="no fields to export"):
        export_webdataset(tmp_path / "d.seqstore", tmp_path / "o", fields=fields)
    assert not (tmp_path / "o").exists()


def test_expand_shards() -> None:
    assert expand_shards("a-{08..10}.tar") == ["a-08.tar", "a-09.tar", "a-10.tar"]
    assert expand_shards("a-{1..2}-{0..1}.tar") == ["a-1-0.tar", "a-1-1.tar", "a-2-0.tar", "a-2-1.tar"]
    assert expand_shards("plain.tar") == ["plain.tar"]


def test_a_damaged_gzip_shard_is_an_error_not_a_shorter_shard(tmp_path: Path) -> None:
    """A compressed shard is read as a stream: one cut short (a truncated download) or with a damaged
    member header names the shard, wherever the damage is, instead of ending the shard early."""
    import gzip

    with wds.TarWriter(str(tmp_path / "a.tar")) as w:
        for k in range(200):
            w.write({"__key__": f"k{k:04d}", "cls": k, "txt": f"sample {k} " * 50})
    whole = (tmp_path / "a.tar").read_bytes()
    packed = gzip.compress(whole)
    for end in [int(len(packed) * f) for f in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)] + [len(packed) - 3]:
        (tmp_path / "cut.tar.gz").write_bytes(packed[:end])
        with pytest.raises(SourceFormatError, match=r"cut\.tar\.gz"):
            import_webdataset(tmp_path / "cut.tar.gz", tmp_path / "x.seqstore")
    crc = bytearray(packed)
    crc[-6] ^= 0xFF  # the gzip trailer's CRC-32: the tar itself reads fine, the stream is damaged
    (tmp_path / "crc.tar.gz").write_bytes(bytes(crc))
    with pytest.raises(SourceFormatError, match=r"crc\.tar\.gz.*CRC"):
        import_webdataset(tmp_path / "crc.tar.gz", tmp_path / "x.seqstore")
    damaged = bytearray(whole)
    damaged[whole.index(b"k0100.txt") + 200] ^= 1  # inside the header of sample 100's first member
    (tmp_path / "bad.tar.gz").write_bytes(gzip.compress(bytes(damaged)))
    with pytest.raises(SourceFormatError, match=r"bad\.tar\.gz.*header checksum"):
        import_webdataset(tmp_path / "bad.tar.gz", tmp_path / "x.seqstore")
    assert not (tmp_path / "x.seqstore").exists()
    (tmp_path / "ok.tar.gz").write_bytes(packed)
    assert len(import_webdataset(tmp_path / "ok.tar.gz", tmp_path / "ok.seqstore")) == 200


def test_empty_shards_before_the_first_sample(tmp_path: Path) -> None:
    """The fields come from the first sample of the first shard that has one: an empty shard at the
    front (a writer that opened a shard and wrote nothing) is not mistaken for an empty input."""
    root = tmp_path / "s"
    root.mkdir()
    with wds.TarWriter(str(root / "000000.tar")):
        pass
    with wds.TarWriter(str(root / "000001.tar")) as w:
        w.write({"__key__": "k0", "cls": 1, "txt": "a"})
        w.write({"__key__": "k1", "cls": 2, "txt": "b"})
    store = import_webdataset(root, tmp_path / "x.seqstore")
    assert len(store) == 2 and set(store.schema) == {"cls", "txt"} and store.id(1) == "k1"
    with pytest.raises(SourceFormatError, match=r"000000\.tar.*holds no samples"):
        import_webdataset(root / "000000.tar", tmp_path / "y.seqstore")
    assert not (tmp_path / "y.seqstore").exists()


def test_a_brace_range_that_names_no_shard_is_a_named_error(tmp_path: Path) -> None:
    """``a-{5..1}.tar`` (the bounds swapped) expands to nothing: an error naming it, not an IndexError."""
    with pytest.raises(SourceFormatError, match=r"a-\{5\.\.1\}\.tar.*names no shards"):
        import_webdataset(str(tmp_path / "a-{5..1}.tar"), tmp_path / "x.seqstore")
    assert not (tmp_path / "x.seqstore").exists()


def test_cli_convert_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    urls = write_shards(tmp_path / "shards", shards=2, per=4, extra={5: "wav"})
    out = tmp_path / "c.seqstore"
    assert cli_main(["convert", "--from", "webdataset", *urls, str(out), "--workers", "1"]) == 2
    assert "utt/00005.wav" in capsys.readouterr().err and not out.exists()
    assert cli_main(["convert", "--from", "webdataset", *urls, str(out), "--skip-unknown", "--ext", "cls=label",
                     "--ext", "txt=text"]) == 0
    assert "8 records" in capsys.readouterr().out
    st = seqstore.open(out)
    assert list(st.schema) == ["label", "text"]
    assert cli_main(["export", "--to", "webdataset", str(out), str(tmp_path / "e"), "--ext", "label=cls",
                     "--ext", "text=txt", "--shard-records", "3", "-q"]) == 0
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == ["000000.tar", "000001.tar", "000002.tar"]
    got = list(wds.WebDataset(sorted(str(p) for p in (tmp_path / "e").iterdir()), shardshuffle=False).decode())
    assert [g["txt"] for g in got] == [f"sample {i}" for i in range(8)]
    assert [g["cls"] for g in got] == [int(st[i]["label"]) for i in range(8)]


def test_cli_messages_name_the_options_of_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The webdataset errors told a command-line user to pass keys='index', strict=False and
    fields={ext: field}, Python arguments the commands do not have; they name --keys index,
    --skip-unknown and --ext EXT=FIELD."""
    urls = write_shards(tmp_path / "shards", shards=1, per=4, extra={2: "wav"})
    assert cli_main(["convert", "--from", "webdataset", *urls, str(tmp_path / "c"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "map it with --ext EXT=FIELD or pass --skip-unknown to skip such members" in err, err
    with seqstore.create(tmp_path / "d", {"txt": Field("uint8", (None,))}) as w:
        w.append({"txt": np.frombuffer(b"x", np.uint8)}, id="b.c")
    assert cli_main(["export", "--to", "webdataset", str(tmp_path / "d"), str(tmp_path / "o"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "pass --keys index" in err and "keys='index'" not in err, err


def test_tar_members_not_samples_are_skipped(tmp_path: Path) -> None:
    """``__meta__`` members and directories are not samples (as webdataset skips them)."""
    path = tmp_path / "m.tar"
    with tarfile.open(path, "w") as tf:
        for name, data in [("__meta__", b"x"), ("k0.cls", b"3"), ("k1.cls", b"4")]:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
        d = tarfile.TarInfo("dir")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
    st = import_webdataset(path, tmp_path / "m.seqstore")
    assert [st.id(i) for i in range(2)] == ["k0", "k1"] and [int(st[i]["cls"]) for i in range(2)] == [3, 4]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_long_and_unicode_member_names(tmp_path: Path, fmt: int) -> None:
    """Names past 100 bytes (GNU long names, pax paths, ustar prefixes) and non-ASCII keys, as webdataset reads them."""
    path = tmp_path / "n.tar"
    keys = ["d" * 60 + "/" + "k" * 70, "dir/ключ-1", "plain"]
    with tarfile.open(path, "w", format=fmt) as tf:
        for i, k in enumerate(keys):
            data = str(i).encode()
            ti = tarfile.TarInfo(f"{k}.cls")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    st = import_webdataset(path, tmp_path / "n.seqstore")
    want = [(s["__key__"], int(s["cls"])) for s in wds.WebDataset(str(path), shardshuffle=False)]
    assert [(st.id(i), int(st[i]["cls"])) for i in range(len(st))] == want
    assert [k for k, _ in want] == keys


def test_s3_shards_into_an_s3_store(tmp_path: Path, moto_s3: Any, s3_bucket: str) -> None:
    """Shards read from object storage and the store written there (parts uploaded, one commit)."""
    write_shards(tmp_path / "shards", shards=2, per=5, seed=6)
    url = moto_s3.upload_dir(tmp_path / "shards", s3_bucket, "wds")
    opts = moto_s3.storage_options()
    out = f"s3://{s3_bucket}/imported.seqstore"
    st = import_webdataset([f"{url}/000000.tar", f"{url}/000001.tar"], out, source_options=opts,
                           storage_options=opts)
    assert st.is_remote and len(st) == 10
    assert_same(st, [str(tmp_path / "shards" / f"{i:06d}.tar") for i in range(2)])


def test_a_header_with_the_signed_checksum_is_read_as_tarfile_reads_it(tmp_path: Path) -> None:
    """Some old tar writers sum a header's bytes as signed chars; Python's tarfile accepts that sum, the
    shard reader called it a bad header checksum. A header with bytes >= 128 (a UTF-8 owner name) is
    given the signed sum; both tarfile and the import read the shard."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for k in range(3):
            data = f"sample {k}".encode()
            info = tarfile.TarInfo(f"k{k}.txt")
            info.size, info.uname = len(data), "j\u00f6rg"
            tf.addfile(info, io.BytesIO(data))
    whole = bytearray(buf.getvalue())
    for pos in (i for i in range(0, len(whole), 512) if whole[i + 257 : i + 262] == b"ustar"):
        h = whole[pos : pos + 512]
        h[148:156] = b" " * 8
        signed = sum(b - 256 if b >= 128 else b for b in h)
        assert signed != sum(h)
        whole[pos + 148 : pos + 156] = b"%06o\0 " % signed
    (tmp_path / "signed.tar").write_bytes(bytes(whole))
    with tarfile.open(tmp_path / "signed.tar") as tf:
        assert [m.name for m in tf.getmembers()] == ["k0.txt", "k1.txt", "k2.txt"]
    store = import_webdataset(tmp_path / "signed.tar", tmp_path / "s.seqstore")
    assert [bytes(store[i]["txt"]).decode() for i in range(3)] == [f"sample {k}" for k in range(3)]


@pytest.mark.parametrize("recorded", [["txt"], {"a": 1}, 5])
def test_a_recorded_field_that_is_not_a_name_is_a_named_error(tmp_path: Path, recorded: Any) -> None:
    """export_webdataset with metadata["webdataset"]["fields"][ext]["field"] that is not a field name (a
    list) was a bare TypeError (unhashable type); it is a SchemaError naming the store and the entry."""
    with seqstore.create(tmp_path / "s", {"txt": Field("uint8", (None,))},
                         metadata={"webdataset": {"fields": {"txt": {"field": recorded}}}}) as w:
        w.append({"txt": np.frombuffer(b"abc", np.uint8)})
    with pytest.raises(SchemaError, match=r"s: metadata\['webdataset'\]\['fields'\]\['txt'\]\['field'\] is .*"
                       "expected a field name"):
        export_webdataset(tmp_path / "s", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
    export_webdataset(tmp_path / "s", tmp_path / "out", fields={"txt": "txt"})


def test_export_refusing_an_id_names_the_store(tmp_path: Path) -> None:
    """The refusal of an id that cannot be a key named the record but not the store it is in."""
    with seqstore.create(tmp_path / "d.seqstore", {"label": Field("int32")}) as w:
        w.append({"label": 1}, id="a.b")
    with pytest.raises(SchemaError, match=r"d\.seqstore: record 0: id 'a\.b' cannot be a WebDataset key"):
        export_webdataset(tmp_path / "d.seqstore", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.seqstore"]
