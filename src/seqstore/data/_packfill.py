"""Filling packed batches: the tokens of a plan's pieces (:mod:`seqstore.data.packing`) read with one
``get_batch`` and laid out by one numba pass into tokens, labels, loss mask, positions and boundaries."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from ..errors import SchemaError
from ._lengths import IntArray
from .base import Dataset
from .combined import CombinedDataset

__all__ = ["build_batch"]


@numba.njit(cache=True, nogil=True)
def _fill(vals: Any, vstart: Any, vlen: Any, inv: Any, seq: Any, off: Any, cnt: Any, n: int, L: int, concat: bool,
          eos: int, has_eos: bool, mask_eos: bool, pad_id: int) -> Any:  # pragma: no cover - numba
    """Tokens, labels, loss mask, positions and segment starts of ``n`` sequences from their pieces, one
    pass over each piece's tokens. ``concat``: pieces tile ``L + 1`` tokens per row (the last is only a
    label); else ``L`` slots, the rest padding."""
    # concat: windows are consecutive in the stream, so row r's L + 1 tokens start at r * L and the
    # labels are the same array one token later
    tok = np.empty(n * L + (1 if concat else 0), dtype=np.int64)
    lab = np.empty(0 if concat else n * L, dtype=np.int64)
    mask = np.empty(n * L, dtype=np.bool_)
    pos = np.empty(n * L, dtype=np.int64)
    bounds = np.empty(seq.size + 2 * n + 1, dtype=np.int64)
    ramp = np.arange(L + 1, dtype=np.int64)
    nb = 0
    p = 0
    for row in range(n):
        base = row * L
        lbase = row * L
        bounds[nb] = lbase
        nb += 1
        c = 0
        while p < seq.size and seq[p] == row:
            j = inv[p]
            m = cnt[p]
            o = off[p]
            src = vstart[j] + o
            real = min(m, vlen[j] - o)
            if real < 0:
                real = 0
            if 0 < c < L:
                bounds[nb] = lbase + c
                nb += 1
            t0 = base + c
            # slices, not loops of elements: numba copies and fills them as vector operations
            tok[t0 : t0 + real] = vals[src : src + real]
            tok[t0 + real : t0 + m] = eos  # the appended EOS
            top = min(m, L - c)
            pos[t0 : t0 + top] = ramp[:top]
            if concat:
                mask[t0 : t0 + top] = True
            else:
                # label k: the document's next token (the input one place on), then its EOS, then -100
                rest = vlen[j] - o  # tokens of the document from this piece on, without EOS
                nv = max(0, min(top, rest - 1))
                lab[t0 : t0 + nv] = vals[src + 1 : src + 1 + nv]
                mask[t0 : t0 + nv] = True
                k = nv
                if has_eos and k < top and k + 1 < rest + 1:
                    lab[t0 + k] = eos
                    mask[t0 + k] = True
                    k += 1
                lab[t0 + k : t0 + top] = -100
                mask[t0 + k : t0 + top] = False
            if mask_eos and has_eos and real < top:
                mask[t0 + real] = False
            c += m
            p += 1
        if not concat and c < L:
            bounds[nb] = lbase + c  # the row's padding
            nb += 1
            tok[base + c : base + L] = pad_id
            lab[lbase + c : lbase + L] = -100
            mask[lbase + c : lbase + L] = False
            pos[lbase + c : lbase + L] = 0
    bounds[nb] = n * L
    nb += 1
    if concat:
        return tok[: n * L].reshape(n, L), tok[1:].reshape(n, L), mask.reshape(n, L), pos.reshape(n, L), bounds[:nb]
    return tok.reshape(n, L), lab.reshape(n, L), mask.reshape(n, L), pos.reshape(n, L), bounds[:nb]


def build_batch(dataset: Dataset, field: str, seq: IntArray, ids: IntArray, off: IntArray, cnt: IntArray,
                n: int, L: int, *, concat: bool, eos: int | None, mask_eos: bool, pad_id: int,
                planned: IntArray | None = None) -> dict[str, Any]:
    """The batch dict of ``n`` sequences from their pieces (see :mod:`seqstore.data.packing`): one ``get_batch``
    of the distinct documents, then one numba pass. ``planned``: each piece's document length as the plan
    took it; a record of another length is a :class:`~seqstore.errors.SchemaError` naming the document
    (its tokens would be padded or cut: wrong data)."""
    # a document split between consecutive pieces is read once (no sort: duplicates far apart are rare)
    first = np.ones(len(ids), dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    uniq = ids[first]
    inv = np.cumsum(first) - 1
    records = dataset.get_batch(uniq)
    if field not in records:
        raise ValueError(f"PackedDataset: {dataset!r} gave no field {field!r} (the token field) in its records; its "
                         f"fields: {sorted(records)}")
    got = records[field]
    if not isinstance(got, tuple):
        raise ValueError(f"PackedDataset: field {field!r} is not ragged (a document's tokens)")
    vals, lens = got
    vals = np.asarray(vals)
    if vals.ndim != 1:
        raise ValueError(f"PackedDataset: field {field!r} has rows of shape {vals.shape[1:]}; tokens must be 1-D")
    if vals.dtype.kind not in "iu":
        raise ValueError(f"PackedDataset: field {field!r} holds {vals.dtype} values; tokens must be integers")
    lens = np.asarray(lens, dtype=np.int64)
    if planned is not None and len(planned):
        bad = np.flatnonzero(lens[inv] != planned)
        if bad.size:
            p = int(bad[0])
            doc, of = _document(dataset, int(ids[p]))
            raise SchemaError(f"PackedDataset: {doc} has {int(lens[inv[p]])} tokens in field {field!r}{of}, but its "
                              f"length (what the packing plan was made from) is {int(planned[p])}: the dataset's "
                              "lengths() disagree with its records")
    vstart = np.cumsum(lens) - lens
    _check_token_ids(vals, vstart, uniq, field, dataset)
    tok, lab, mask, pos, bounds = _fill(vals, vstart, lens, inv, seq, off, cnt, n, L,
                                        concat, -1 if eos is None else eos, eos is not None, mask_eos, pad_id)
    cu = bounds.astype(np.int32)
    return {"tokens": tok, "labels": lab, "position_ids": pos, "loss_mask": mask, "cu_seqlens": cu,
            "max_seqlen": int(np.diff(cu).max()) if len(cu) > 1 else 0}


def _check_token_ids(vals: Any, vstart: IntArray, uniq: IntArray, field: str, dataset: Dataset) -> None:
    """SchemaError naming the first document of ``uniq`` (tokens ``vals``, starting at ``vstart``) with a
    negative token id, or a uint64 one past int64 (negative in the int64 batch): it would be a label that
    collides with -100 (ignored by the loss) or an embedding row that does not exist. One pass."""
    if not vals.size:
        return
    if vals.dtype.kind == "i":
        if int(vals.min()) >= 0:
            return
        bad = vals < 0
    elif vals.dtype.itemsize >= 8:
        if int(vals.max()) <= np.iinfo(np.int64).max:
            return
        bad = vals > np.uint64(np.iinfo(np.int64).max)
    else:
        return
    at = int(np.flatnonzero(bad)[0])
    d = int(np.searchsorted(vstart, at, side="right")) - 1  # (the document holding it: an empty one holds none)
    doc, of = _document(dataset, int(uniq[d]))
    raise SchemaError(f"PackedDataset: {doc} has token id {int(vals[at])} at position {at - int(vstart[d])} of field "
                      f"{field!r}{of}; token ids must be >= 0 (a {vals.dtype} field of ids "
                      "past its range? store them in a wider or unsigned type)")


def _document(dataset: Dataset, doc: int) -> tuple[str, str]:
    """Document ``doc`` of ``dataset`` in words, and " of <dataset>" where that is not in them: of a
    combination (a mixture's sources end to end), the source's name and its index there (a combined index
    is no index the user has)."""
    if isinstance(dataset, CombinedDataset):
        k = int(np.searchsorted(dataset.start_N, doc, side="right")) - 1
        if 0 <= k < len(dataset.names):
            return (f"document {doc - int(dataset.start_N[k])} of source {dataset.names[k]!r} "
                    f"({dataset.datasets[k]!r}; combined index {doc})", "")
    return f"document {doc}", f" of {dataset!r}"
