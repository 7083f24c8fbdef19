"""``PackedDataset``: documents packed into fixed-length sequences lazily, sharded and resumable exactly.

The documents come from a dataset's epoch orders (any ordering; epochs follow one another) or from a
:class:`~seqstore.data.MixtureStream`. The stream is endless: epoch ``e + 1`` follows epoch ``e``;
a training loop stops after as many steps as it wants. Every consumer (rank x DataLoader worker) is a
*share*: share ``s`` of ``S`` takes block ``s`` of ``S`` contiguous blocks of every epoch's order
(:func:`seqstore.order.block_bounds`) and packs it on its own, so nothing is built over the whole
epoch: no document index, no sample index. Two modes:

* ``concat`` (Megatron's semantics): the documents back to back (with ``eos`` appended to each when
  given), windows of ``seq_len + 1`` tokens every ``seq_len`` tokens; no padding;
* ``best_fit``: whole documents into sequences, the oldest of a window of ``window`` documents first,
  then the longest that fits, until none fits; the rest is padding. Longer than ``seq_len``: split
  (``split_long=True``, the rest packs next) or truncated (counted in the stats).

A batch of ``B`` sequences is a dict of NumPy arrays: ``tokens`` / ``labels`` / ``position_ids``
int64 (B, seq_len), ``loss_mask`` bool (B, seq_len), ``cu_seqlens`` int32 (boundaries of the documents
(and of each row's padding) over the flattened batch, for variable-length attention) and
``max_seqlen``. Labels are the next token; in ``best_fit`` a document's last token and padding get
label ``-100`` and loss mask False (in ``concat`` the last token's label is the next document's first,
as in Megatron); ``mask_eos=True`` also masks the loss where the input is an appended EOS. Position ids
restart at every document (and at the start of each row).

State: per share, its pending ranges ``[epoch, start, stop, offset]`` (the documents it pulled but
has not finished come first: best_fit's window, in order), the next epoch it takes a fresh block of,
and running counts (sequences, tokens, documents, padding, truncated, per source). O(share count x
(window + ranges)). States load into the same number of shares exactly, or into another number by
:func:`~seqstore.data._packplan.resplit` (no token repeated or skipped).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..order import Order
from ..store import Store
from ._lengths import IntArray
from ._packplan import Planner, fresh_shares, resplit
from .base import Dataset
from .schedule import MixtureStream
from .store_dataset import StoreDataset

__all__ = ["PackedDataset", "PackedStream", "OrderStream", "PACKED_FORMAT", "IGNORE_LABEL"]

PACKED_FORMAT = "seqstore.packed/v1"
IGNORE_LABEL = -100
_MODES = ("concat", "best_fit")
DEFAULT_WINDOW = 256


class OrderStream:
    """The documents of ``dataset`` in its epoch orders (epoch ``e``: ``dataset.epoch_order(e)``)."""

    names = ["data"]

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._orders: dict[int, Order] = {}
        self._lengths = dataset.lengths()

    def _order(self, epoch: int) -> Order:
        order = self._orders.get(epoch)
        if order is None:
            if len(self._orders) > 4:
                self._orders.clear()
            order = self._orders[epoch] = self.dataset.epoch_order(epoch)
        return order

    def epoch_len(self, epoch: int) -> int:
        return len(self._order(epoch))

    def docs(self, epoch: int, start: int, stop: int) -> tuple[IntArray, IntArray]:
        arr = self._order(epoch).take(np.arange(start, stop, dtype=np.int64))
        return arr, self._lengths.take(arr)

    def source_of(self, ids: IntArray) -> IntArray:
        return np.zeros(len(ids), dtype=np.int64)

    def identity(self) -> dict[str, Any]:
        d = self.dataset
        return {"type": f"{type(d).__module__}.{type(d).__qualname__}", "num_seqs": int(d.num_seqs),
                "key": d.cache_key(), "ordering": str(d.ordering), "seed": int(d.seed),
                "partition_epoch": int(d.partition_epoch)}


def _check_int(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"PackedDataset: {what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class PackedDataset:
    """Documents of ``source`` packed into sequences of ``seq_len`` tokens (see the module docstring).

    ``source``: a store (or its path), any ``seqstore.data`` dataset whose lengths are the token
    field's, or a :class:`MixtureStream`. ``tokens``: the ragged 1-D token field. ``ordering`` /
    ``seed``: the document order when ``source`` is a store (else the dataset's own). ``mode``:
    ``"concat"`` or ``"best_fit"``; ``eos``: a token id appended to every document (None: none);
    ``window``: best_fit's window in documents (default 256); ``split_long``: split documents longer
    than ``seq_len`` (default) or truncate them; ``pad_id``: the token of padding. O(1) memory.
    """

    def __init__(
        self,
        source: Any,
        *,
        tokens: str = "tokens",
        seq_len: int = 2048,
        mode: str = "concat",
        eos: int | None = None,
        window: int | None = None,
        split_long: bool = True,
        mask_eos: bool = False,
        pad_id: int = 0,
        ordering: Any = "default",
        seed: int = 0,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"PackedDataset: mode must be one of {_MODES}, got {mode!r}")
        self.mode = mode
        self.seq_len = _check_int(seq_len, "seq_len", 1)
        self.window = DEFAULT_WINDOW if window is None else _check_int(window, "window", 1)
        self.eos = None if eos is None else _check_int(eos, "eos", 0)
        self.split_long = bool(split_long)
        self.mask_eos = bool(mask_eos)
        self.pad_id = int(pad_id)
        self.tokens = tokens
        if isinstance(source, (Store, str, os.PathLike)):
            source = StoreDataset(source, ordering=ordering, seed=seed, length_field=tokens, fields=[tokens])
        self.stream: MixtureStream | OrderStream
        if isinstance(source, MixtureStream):
            self.stream = source
            datasets = source.combined.datasets
        elif isinstance(source, Dataset):
            self.stream = OrderStream(source)
            datasets = [source]
        else:
            raise TypeError(f"PackedDataset: source must be a store, a path, a seqstore.data Dataset or a "
                            f"MixtureStream, got {type(source).__name__}")
        for d in datasets:
            lf = getattr(d, "length_field", tokens)
            if lf != tokens:
                raise ValueError(f"PackedDataset: {d!r} measures lengths in field {lf!r}, not the token field "
                                 f"{tokens!r}; open it with length_field={tokens!r}")
        self.dataset: Dataset = self.stream.dataset
        self.names = list(self.stream.names)

    # -------------------------------------------------------------------------------- state

    def config(self) -> dict[str, Any]:
        return {"mode": self.mode, "seq_len": self.seq_len, "eos": self.eos,
                "window": self.window if self.mode == "best_fit" else None, "split_long": self.split_long}

    def fresh_state(self, epoch: int = 1, num_shares: int = 1) -> dict[str, Any]:
        """The state of a run that starts at the beginning of ``epoch`` over ``num_shares`` shares."""
        return self.state_dict(fresh_shares(num_shares, _check_int(epoch, "epoch", 1), len(self.names)))

    def state_dict(self, shares: list[dict[str, Any]]) -> dict[str, Any]:
        """The resume state of a run whose share ``s`` has state ``shares[s]`` (plain, JSON-safe)."""
        out: dict[str, Any] = {"format": PACKED_FORMAT, "config": self.config(), "source": self.stream.identity(),
                               "num_shares": len(shares), "shares": shares, "stats": self.totals(shares)}
        if isinstance(self.stream, MixtureStream):
            out["schedule"] = self.stream.state()
        return out

    def totals(self, shares: list[dict[str, Any]]) -> dict[str, Any]:
        """Counts summed over shares: sequences, tokens (non-padding inputs), documents finished,
        padding, truncated, and per source (``source_tokens`` / ``source_documents``: name -> count)."""
        tot: dict[str, Any] = {}
        for st in shares:
            for k, v in st["stats"].items():
                if isinstance(v, list):
                    prev = tot.get(k, [0] * len(v))
                    tot[k] = [a + b for a, b in zip(prev, v)]
                else:
                    tot[k] = tot.get(k, 0) + int(v)
        for k in ("source_tokens", "source_documents"):
            if k in tot:
                tot[k] = dict(zip(self.names, tot[k]))
        return tot

    def check_state(self, state: Any) -> None:
        """Raise ValueError naming what in ``state`` does not fit this dataset."""
        if not isinstance(state, dict) or state.get("format") != PACKED_FORMAT:
            raise ValueError(f"PackedDataset: not a packed-dataset state (format {PACKED_FORMAT!r} expected)")
        if state.get("config") != self.config():
            raise ValueError(f"PackedDataset: the state was made with {state.get('config')}, this dataset is "
                             f"{self.config()}")
        src = state.get("source")
        mine = self.stream.identity()
        if src != mine:
            raise ValueError(f"PackedDataset: the state is of another source ({src}), this one is {mine}")
        shares = state.get("shares")
        if not isinstance(shares, list) or len(shares) != state.get("num_shares") or not shares:
            raise ValueError("PackedDataset: malformed state (shares)")

    def shares(self, state: dict[str, Any] | None, num_shares: int, epoch: int = 1) -> list[dict[str, Any]]:
        """Share states for ``num_shares`` shares from ``state`` (None: a fresh start at ``epoch``):
        as saved when the count matches, else re-split (no token repeated or skipped). With a
        :class:`MixtureStream` whose schedule differs from the saved one, the new schedule applies from
        the first sample no share had started; every source continues from its position."""
        num_shares = _check_int(num_shares, "num_shares", 1)
        if state is None:
            return fresh_shares(num_shares, epoch, len(self.names))
        self.check_state(state)
        old = [dict(s) for s in state["shares"]]
        if isinstance(self.stream, MixtureStream):
            if "schedule" not in state:
                raise ValueError("PackedDataset: the state has no mixture schedule")
            frontier = (max(int(s["next_epoch"]) for s in old) - 1) * self.stream.chunk
            self.stream.load_state(state["schedule"], frontier)
        if len(old) == num_shares:
            return old
        return resplit(self.stream, old, num_shares, len(self.names))

    def open(self, share_state: dict[str, Any], share: int = 0, num_shares: int = 1) -> PackedStream:
        """A :class:`PackedStream` for share ``share`` of ``num_shares`` from its state."""
        return PackedStream(self, share_state, share, num_shares)

    def iter_batches(self, batch_size: int, *, state: dict[str, Any] | None = None, share: int = 0,
                     num_shares: int = 1, epoch: int = 1) -> Iterator[dict[str, Any]]:
        """Endless batches of share ``share`` of ``num_shares`` (from ``state`` or the start of ``epoch``)."""
        stream = self.open(self.shares(state, num_shares, epoch)[share], share, num_shares)
        while True:
            yield stream.batch(batch_size)

    def __repr__(self) -> str:
        return f"PackedDataset({self.stream!r}, {self.config()})"


class PackedStream:
    """One share's packed sequences: ``batch(B)`` gathers the next ``B`` (one ``get_batch`` of their
    documents), ``skip(n)`` plans ``n`` without reading tokens, ``state()`` is the share's state."""

    def __init__(self, packed: PackedDataset, state: dict[str, Any], share: int, num_shares: int) -> None:
        self.packed = packed
        self.planner = Planner(packed.stream, mode=packed.mode, seq_len=packed.seq_len, window=packed.window,
                               split=packed.split_long, eos=packed.eos is not None, share=share,
                               num_shares=num_shares, state=state)

    def state(self) -> dict[str, Any]:
        return self.planner.state()

    def skip(self, n: int) -> None:
        if n > 0:
            self.planner.plan(int(n))

    def batch(self, n: int) -> dict[str, Any]:
        p = self.packed
        seq, ids, off, cnt, pads = self.planner.plan(int(n))
        return build_batch(p.dataset, p.tokens, seq, ids, off, cnt, n, p.seq_len, concat=p.mode == "concat",
                           eos=p.eos, mask_eos=p.mask_eos, pad_id=p.pad_id)


def _gather(dataset: Dataset, field: str, ids: IntArray, off: IntArray, cnt: IntArray,
            eos: int | None) -> tuple[IntArray, np.ndarray[Any, np.dtype[np.bool_]]]:
    """Tokens of every piece (documents with ``eos`` appended): (values, is-EOS flags). One
    ``get_batch`` of the distinct documents; vectorised index arithmetic for the rest."""
    total = int(cnt.sum())
    uniq, inv = np.unique(ids, return_inverse=True)
    got = dataset.get_batch(uniq)[field]
    if not isinstance(got, tuple):
        raise ValueError(f"PackedDataset: field {field!r} is not ragged (a document's tokens)")
    vals, lens = got
    vals = np.asarray(vals).reshape(len(vals), -1)
    if vals.shape[1] != 1:
        raise ValueError(f"PackedDataset: field {field!r} has rows of shape {vals.shape[1:]}; tokens must be 1-D")
    vals = vals[:, 0]
    lens = np.asarray(lens, dtype=np.int64)
    vstart = np.cumsum(lens) - lens
    j = np.repeat(inv.reshape(-1), cnt)
    first = np.cumsum(cnt) - cnt
    t = np.repeat(off - first, cnt) + np.arange(total, dtype=np.int64)
    real = t < lens[j]
    out = np.full(total, eos if eos is not None else 0, dtype=np.int64)
    if vals.size:
        out[real] = vals[vstart[j[real]] + t[real]]
    return out, ~real


def build_batch(dataset: Dataset, field: str, seq: IntArray, ids: IntArray, off: IntArray, cnt: IntArray,
                n: int, L: int, *, concat: bool, eos: int | None, mask_eos: bool, pad_id: int) -> dict[str, Any]:
    """The batch dict of ``n`` sequences from their pieces (see the module docstring)."""
    if concat:
        vals, is_eos = _gather(dataset, field, ids, off, cnt, eos)
        w = vals.reshape(n, L + 1)
        tokens = np.ascontiguousarray(w[:, :-1])
        labels = np.ascontiguousarray(w[:, 1:])
        loss_mask = np.ones((n, L), dtype=bool)
        if mask_eos:
            loss_mask &= ~is_eos.reshape(n, L + 1)[:, :-1]
        # pieces start at seq * (L + 1) + their offset in the window
        pstart = np.cumsum(cnt) - cnt - seq * (L + 1)
        in_row = pstart < L
        starts = seq[in_row] * L + pstart[in_row]
        slot = (np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        pos = slot.reshape(n, L + 1)[:, :-1]
        # a piece that starts at row offset 0 is the row's first: positions restart there anyway
        bounds = np.concatenate([starts, np.arange(n, dtype=np.int64) * L])
    else:
        # best_fit: n + 1 tokens per piece (the labels need the next one)
        vals, is_eos = _gather(dataset, field, ids, off, cnt + 1, eos)
        ext_first = np.cumsum(cnt + 1) - (cnt + 1)
        lens = np.asarray(dataset.lengths().take(ids), dtype=np.int64) + (0 if eos is None else 1)
        row_first = np.zeros(len(seq), dtype=np.int64)
        if len(seq):
            csum = np.cumsum(cnt) - cnt
            seq_start = np.searchsorted(seq, np.arange(n), side="left")
            row_first = csum - csum[np.minimum(seq_start[seq], len(seq) - 1)]
        tot = int(cnt.sum())
        k = np.arange(tot, dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)  # slot in piece
        src_in = np.repeat(ext_first, cnt) + k
        dest = np.repeat(seq * L + row_first, cnt) + k
        tok_flat = np.full(n * L, pad_id, dtype=np.int64)
        lab_flat = np.full(n * L, IGNORE_LABEL, dtype=np.int64)
        mask_flat = np.zeros(n * L, dtype=bool)
        pos_flat = np.zeros(n * L, dtype=np.int64)
        tok_flat[dest] = vals[src_in]
        valid = (np.repeat(off, cnt) + k + 1) < np.repeat(lens, cnt)
        lab_flat[dest[valid]] = vals[src_in[valid] + 1]
        mask_flat[dest] = valid
        if mask_eos:
            mask_flat[dest[is_eos[src_in]]] = False
        pos_flat[dest] = k
        tokens, labels, loss_mask = tok_flat.reshape(n, L), lab_flat.reshape(n, L), mask_flat.reshape(n, L)
        pos = pos_flat.reshape(n, L)
        used = np.bincount(seq, weights=cnt, minlength=n).astype(np.int64)
        pad_rows = np.flatnonzero(used < L)
        bounds = np.concatenate([seq * L + row_first, pad_rows * L + used[pad_rows], np.arange(n) * L])
    cu = np.unique(np.append(bounds, n * L)).astype(np.int32)
    return {"tokens": tokens, "labels": labels, "position_ids": np.ascontiguousarray(pos, dtype=np.int64),
            "loss_mask": loss_mask, "cu_seqlens": cu, "max_seqlen": int(np.diff(cu).max()) if len(cu) > 1 else 0}
