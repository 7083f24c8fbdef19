"""The fixed-size .npy header: readable by numpy, rewritable in place, parsed strictly."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqstore as ss
from seqstore.format.npy import (
    HEADER_BYTES,
    PAGE_HEADER_BYTES,
    encode_header,
    parse_header,
    read_header,
    write_header,
)

DTYPES = ["<i1", "<u2", "<i4", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16", "|b1", "|u1"]


@given(
    st.sampled_from(DTYPES),
    st.lists(st.integers(0, 5), max_size=4),
    st.integers(0, 10**12),
)
@settings(max_examples=50, deadline=None)
def test_header_is_standard_npy(dtype: str, inner: list[int], rows: int) -> None:
    dt = np.dtype(dtype)
    shape = (rows, *inner)
    raw = encode_header(dt, shape)
    assert len(raw) == HEADER_BYTES and raw.endswith(b"\n")
    h = parse_header(raw, "x.npy")
    assert h.dtype == dt and h.shape == shape and h.data_offset == HEADER_BYTES
    # numpy's own parser agrees
    f = io.BytesIO(raw)
    version = np.lib.format.read_magic(f)
    assert version == (1, 0)
    shp, fortran, dt2 = np.lib.format.read_array_header_1_0(f)
    assert shp == shape and not fortran and dt2 == dt


def test_np_load_of_a_file_written_in_two_steps(tmp_path: Path) -> None:
    """Provisional header, data appended, final header rewritten in place: np.load reads it."""
    p = tmp_path / "a.npy"
    data = np.arange(24, dtype=np.float32).reshape(8, 3)
    with open(p, "wb") as f:
        f.write(encode_header(data.dtype, (0, 3)))
        f.write(data[:5].tobytes())
        write_header(f, data.dtype, (5, 3))  # position restored after the rewrite
        f.write(data[5:].tobytes())
        write_header(f, data.dtype, (8, 3))
    np.testing.assert_array_equal(np.load(p), data)
    np.testing.assert_array_equal(np.load(p, mmap_mode="r"), data)
    h = read_header(p)
    assert h.shape == (8, 3) and h.data_bytes == data.nbytes


@given(
    st.sampled_from(DTYPES),
    st.lists(st.integers(0, 5), max_size=4),
    st.integers(0, 10**12),
)
@settings(max_examples=30, deadline=None)
def test_page_header_is_standard_npy(dtype: str, inner: list[int], rows: int) -> None:
    """A one-page header (direct I/O files): seqstore and numpy both put the data at byte 4096."""
    dt = np.dtype(dtype)
    shape = (rows, *inner)
    raw = encode_header(dt, shape, PAGE_HEADER_BYTES)
    assert len(raw) == PAGE_HEADER_BYTES == 4096 and raw.endswith(b"\n")
    h = parse_header(raw, "x.npy")
    assert h.dtype == dt and h.shape == shape and h.data_offset == PAGE_HEADER_BYTES
    f = io.BytesIO(raw)
    assert np.lib.format.read_magic(f) == (1, 0)
    shp, fortran, dt2 = np.lib.format.read_array_header_1_0(f)
    assert shp == shape and not fortran and dt2 == dt
    assert f.tell() == PAGE_HEADER_BYTES  # where numpy starts reading the data


def test_page_header_file_in_two_steps(tmp_path: Path) -> None:
    """A one-page header rewritten in place keeps its size, the file position and the data after it;
    np.load (also memory-mapped, at offset 4096) and read_header read the file."""
    p = tmp_path / "a.npy"
    data = np.arange(30, dtype=np.int64).reshape(10, 3)
    with open(p, "w+b") as f:
        write_header(f, data.dtype, (0, 3), PAGE_HEADER_BYTES)  # on an empty file: position after it
        assert f.tell() == PAGE_HEADER_BYTES
        f.write(data[:6].tobytes())
        write_header(f, data.dtype, (6, 3), PAGE_HEADER_BYTES)
        assert f.tell() == PAGE_HEADER_BYTES + data[:6].nbytes
        f.write(data[6:].tobytes())
        write_header(f, data.dtype, (10, 3), PAGE_HEADER_BYTES)
        assert f.tell() == PAGE_HEADER_BYTES + data.nbytes
    raw = p.read_bytes()
    assert len(raw) == PAGE_HEADER_BYTES + data.nbytes and raw[PAGE_HEADER_BYTES:] == data.tobytes()
    assert raw[:PAGE_HEADER_BYTES] == encode_header(data.dtype, (10, 3), PAGE_HEADER_BYTES)
    np.testing.assert_array_equal(np.load(p), data)
    mm = np.load(p, mmap_mode="r")
    assert mm.offset == PAGE_HEADER_BYTES
    np.testing.assert_array_equal(mm, data)
    h = read_header(p)
    assert h.shape == (10, 3) and h.data_offset == PAGE_HEADER_BYTES
    assert h.data_offset + h.data_bytes == p.stat().st_size


@pytest.mark.parametrize("size", [128, 192, PAGE_HEADER_BYTES, 65536])
def test_valid_header_sizes(size: int) -> None:
    raw = encode_header(np.dtype("<f4"), (7,), size)
    assert len(raw) == size
    h = parse_header(raw, "x.npy")
    assert h.shape == (7,) and h.data_offset == size


@pytest.mark.parametrize("size", [100, 32, 65600, 0, -64, 4095, 65536 + 64])
def test_invalid_header_sizes(tmp_path: Path, size: int) -> None:
    """Sizes that are not a multiple of 64 in [64, 65536] are refused."""
    with pytest.raises(ValueError, match="multiple of 64"):
        encode_header(np.dtype("<f4"), (3,), size)
    with open(tmp_path / "h.npy", "wb") as f, pytest.raises(ValueError):
        write_header(f, np.dtype("<f4"), (3,), size)


def test_header_that_does_not_fit_its_size() -> None:
    """A valid size still has to hold the header text: a page holds shapes that 128 bytes do not."""
    with pytest.raises(ValueError, match="does not fit in 64 bytes"):
        encode_header(np.dtype("|b1"), (), 64)  # the shortest header text is 55 bytes
    shape = (10**12, *([1] * 30))
    with pytest.raises(ValueError, match="does not fit in 128 bytes"):
        encode_header(np.dtype("<f4"), shape)
    assert parse_header(encode_header(np.dtype("<f4"), shape, PAGE_HEADER_BYTES), "x.npy").shape == shape


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_reads_headers_written_by_numpy(tmp_path: Path, version: tuple[int, int]) -> None:
    p = tmp_path / "b.npy"
    arr = np.ones((4, 2), dtype=np.int16)
    with open(p, "wb") as f:
        np.lib.format.write_array(f, arr, version=version)
    h = read_header(p)
    assert h.dtype == arr.dtype and h.shape == (4, 2)
    assert h.data_offset + h.data_bytes == p.stat().st_size


def test_too_many_dims_do_not_fit() -> None:
    with pytest.raises(ValueError):
        encode_header(np.dtype("<c16"), (10**12, *([1] * 40)))


@pytest.mark.parametrize(
    "raw, word",
    [
        (b"", "magic"),
        (b"\x93NUMPX\x01\x00", "magic"),
        (b"\x93NUMPY\x04\x00\x10\x00", "version"),
        (b"\x93NUMPY\x01\x00\x50\x00{'descr': '<f4'", "truncated"),
        (b"\x93NUMPY\x02\x00\x10\x00\x00", "truncated"),
        (b"\x93NUMPY\x01\x00\x10\x00{'descr': ???}  ", "unreadable"),
        (b"\x93NUMPY\x01\x00\x10\x00{'shape': ()}   ", "unreadable"),
        (b"\x93NUMPY\x01\x00\x32\x00{'descr':'<f4','fortran_order':True,'shape':(2,3)}", "Fortran"),
    ],
)
def test_bad_headers(tmp_path: Path, raw: bytes, word: str) -> None:
    with pytest.raises(ss.CorruptionError) as info:
        parse_header(raw, tmp_path / "bad.npy")
    assert "bad.npy" in str(info.value) and word in str(info.value)


@pytest.mark.parametrize("shape", ["(-2, -3)", "(-4,)", "(2.5,)", "(True, 2)"])
def test_a_header_shape_of_negative_or_not_integer_dims_is_corruption(tmp_path: Path, shape: str) -> None:
    """A header (in the form the ast path parses) with negative dims was taken, (-2, -3) as 6 items that
    a size check passes, and 2.5 or True as the ints 2 and 1: a CorruptionError naming the file."""
    text = f"{{'descr':'<i8','fortran_order':False,'shape':{shape}}}".encode()
    raw = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text
    with pytest.raises(ss.CorruptionError, match=r"bad\.npy.*shape") as info:
        parse_header(raw, tmp_path / "bad.npy")
    assert shape.split(",")[0].strip("(") in str(info.value)


def test_read_header_errors(tmp_path: Path) -> None:
    with pytest.raises(ss.CorruptionError, match="missing"):
        read_header(tmp_path / "nope.npy")
    (tmp_path / "dir.npy").mkdir()
    with pytest.raises(ss.CorruptionError, match="dir.npy"):
        read_header(tmp_path / "dir.npy")


def _saved(arr: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, arr)
    return f.getvalue()


def test_plain_headers_are_parsed_without_ast(monkeypatch: pytest.MonkeyPatch) -> None:
    # Python 3.11's ast.literal_eval can fail when threads call it at once ("AST constructor recursion
    # depth mismatch"): a reader opening shards on threads then called a sound file corrupt
    import ast

    def refuse(text: str) -> None:
        raise SystemError("AST constructor recursion depth mismatch (before=48, after=45)")

    monkeypatch.setattr(ast, "literal_eval", refuse)
    for arr in (np.zeros((3, 4), "<f4"), np.zeros(5, "|u1"), np.zeros((0,), ">f8"), np.zeros((), "<c16"),
                np.zeros(2, "<U5"), np.zeros(1, "M8[ns]")):
        h = parse_header(_saved(arr), "x.npy")
        assert (h.dtype, h.shape) == (arr.dtype, arr.shape)
    h = parse_header(encode_header(np.dtype("<f2"), (10**12, 7, 0)), "x.npy")
    assert (h.dtype, h.shape) == (np.dtype("<f2"), (10**12, 7, 0))
    with pytest.raises(ss.CorruptionError, match="x.npy: unreadable .npy header"):  # structured: ast's
        parse_header(_saved(np.zeros(2, [("a", "<i4")])), "x.npy")


def test_headers_parsed_on_many_threads_at_once_agree() -> None:
    from concurrent.futures import ThreadPoolExecutor

    structured = [("a", "<i4"), ("b", "|u1")]
    arrays = [np.zeros((k, 3), "<f4") for k in range(40)] + [np.zeros(k, structured) for k in range(40)]
    raws = [_saved(a) for a in arrays] * 25
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda raw: parse_header(raw, "x.npy"), raws))
    assert [(h.dtype, h.shape) for h in got] == [(a.dtype, a.shape) for a in arrays] * 25


def test_read_header_of_a_header_longer_than_a_page(tmp_path: Path) -> None:
    """Only the first 4096 bytes were read: a valid header longer than that was called truncated."""
    path, size = tmp_path / "a.npy", 8192
    with open(path, "wb") as f:
        f.write(encode_header(np.dtype("<i4"), (3,), size))
        f.write(np.arange(3, dtype="<i4").tobytes())
    assert np.load(path).tolist() == [0, 1, 2]
    assert read_header(path) == parse_header(path.read_bytes(), path)
    assert read_header(path).data_offset == size
    damaged = tmp_path / "b.npy"  # a 2.0 header claiming 4 GB: refused, not read into memory
    damaged.write_bytes(b"\x93NUMPY\x02\x00" + (0xFFFFFFF0).to_bytes(4, "little") + b" " * 8192)
    with pytest.raises(ss.CorruptionError, match="b.npy: truncated .npy header"):
        read_header(damaged)
