"""``seqstore.torch._convert.to_tensor`` with unsigned fields: torch < 2.3 has no uint16/uint32/uint64
tensors (``torch.from_numpy`` refuses such arrays), so there they become the next wider signed dtype."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from seqstore.torch import _convert  # noqa: E402
from seqstore.torch._convert import to_tensor, torch_dtype_for  # noqa: E402


def test_the_dtype_rule_widens_unsigned_arrays_only_where_torch_lacks_them() -> None:
    """A uint16 token field failed on torch 2.1/2.2 (pyproject allows torch>=2.1): from_numpy refused it."""
    assert torch_dtype_for(np.dtype(np.uint16), unsigned=False) == np.int32
    assert torch_dtype_for(np.dtype(">u2"), unsigned=False) == np.int32
    assert torch_dtype_for(np.dtype(np.uint32), unsigned=False) == np.int64
    assert torch_dtype_for(np.dtype(np.uint64), unsigned=False) == np.int64
    for dt in (np.uint8, np.int16, np.int32, np.int64, np.float32, np.bool_):
        assert torch_dtype_for(np.dtype(dt), unsigned=False) is None
    for dt in (np.uint16, np.uint32, np.uint64, np.uint8):
        assert torch_dtype_for(np.dtype(dt), unsigned=True) is None
    assert _convert.UNSIGNED == hasattr(torch, "uint16")  # (torch 2.3 on: both)


def test_without_unsigned_tensors_values_are_kept_in_the_wider_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_convert, "UNSIGNED", False)
    ro = np.array([0, 65535, 7], np.uint16)
    ro.flags.writeable = False  # (a store's mapping: the widening is its one copy)
    t = to_tensor(ro)
    assert t.dtype == torch.int32 and t.tolist() == [0, 65535, 7]
    assert to_tensor(np.array([2**32 - 1], ">u4")).tolist() == [2**32 - 1]
    assert to_tensor(np.array([2**63 - 1], np.uint64)).dtype == torch.int64
    with pytest.raises(ValueError, match=r"uint64 value 9223372036854775808 is above 2\*\*63 - 1"):
        to_tensor(np.array([2**63], np.uint64))
    bf = to_tensor(np.array([0x3FC0], np.uint16), bfloat16=True)  # bfloat16 bits stay bits
    assert bf.dtype == torch.bfloat16 and bf.tolist() == [1.5]
    assert to_tensor(np.array([3], np.uint8)).dtype == torch.uint8


def test_a_field_of_a_dtype_torch_lacks_is_an_error_naming_the_field(tmp_path: Any) -> None:
    """A float128 field (numpy's longdouble: a store takes it) failed in torch.from_numpy with a TypeError
    that named the dtype but not the field. Now the error names the field, through SeqDataset's records,
    its batches and collate_padded alike."""
    import seqstore
    from seqstore import Field
    from seqstore.torch import SeqDataset, collate_padded

    with seqstore.create(tmp_path / "s.seqstore", {"q": Field("float128"), "x": Field("float32")}) as wr:
        wr.append_batch({"q": np.ones(3, np.float128), "x": np.ones(3, np.float32)})
    ds = SeqDataset(tmp_path / "s.seqstore")
    for get in (lambda: ds[0], lambda: ds.__getitems__([0, 1])):
        with pytest.raises(TypeError, match=r"field 'q': torch has no tensors of float128 values"):
            get()
    with pytest.raises(TypeError, match=r"field 'q'"):
        collate_padded([{"q": np.ones(2, np.float128)}])
    assert SeqDataset(tmp_path / "s.seqstore", fields="x")[0]["x"].dtype == torch.float32


def test_arrays_with_negative_strides_become_tensors_of_their_values() -> None:
    """A record of reversed arrays (a time-reversal augmentation's ``x[::-1]``, or ``np.flip``) failed in
    ``collate_padded`` with torch's ValueError about negative strides, naming no field; such arrays are
    copied once, as read-only ones are, bfloat16 bits too."""
    from seqstore.torch import collate_padded

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = collate_padded([{"x": x[::-1]}, {"x": np.flip(x[:2], axis=1)}, {"x": x[:, ::-1][::2]}])
    assert out["x"].tolist() == [x[::-1].tolist(), [*np.flip(x[:2], axis=1).tolist(), [0, 0, 0], [0, 0, 0]],
                                 [*x[:, ::-1][::2].tolist(), [0, 0, 0], [0, 0, 0]]]
    assert out["x_lengths"].tolist() == [4, 2, 2]
    bits = np.array([0x3F80, 0x4000], np.uint16)[::-1]  # bfloat16 2.0, 1.0
    assert to_tensor(bits, bfloat16=True).float().tolist() == [2.0, 1.0]
