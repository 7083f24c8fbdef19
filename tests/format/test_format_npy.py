"""The fixed-size .npy header: readable by numpy, rewritable in place, parsed strictly."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqstore as ss
from seqstore.format.npy import HEADER_BYTES, encode_header, parse_header, read_header, write_header

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


def test_read_header_errors(tmp_path: Path) -> None:
    with pytest.raises(ss.CorruptionError, match="missing"):
        read_header(tmp_path / "nope.npy")
    (tmp_path / "dir.npy").mkdir()
    with pytest.raises(ss.CorruptionError, match="dir.npy"):
        read_header(tmp_path / "dir.npy")
