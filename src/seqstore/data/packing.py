"""``PackedDataset``: documents packed into fixed-length sequences lazily, sharded and resumable exactly.

The documents come from a dataset's epoch orders or from a :class:`~seqstore.data.MixtureStream`; the
stream is endless (epoch ``e + 1`` follows epoch ``e``), a training loop stops when it wants. Every
consumer (rank x DataLoader worker) is a *share*: share ``s`` of ``S`` packs block ``s`` of ``S``
contiguous blocks of every epoch's order (:func:`seqstore.order.block_bounds`) on its own, so nothing
is built over the whole epoch. Modes: ``concat`` (Megatron's: the documents back to back, ``eos``
appended when given, windows of ``seq_len + 1`` tokens every ``seq_len``; no padding) and ``best_fit``
(whole documents, the oldest of a window of ``window`` first, then the longest that fits; longer than
``seq_len``: split or truncated; the rest is padding).

A batch of ``B`` sequences is a dict of NumPy arrays: ``tokens`` / ``labels`` / ``position_ids`` int64
(B, seq_len), ``loss_mask`` bool, ``cu_seqlens`` int32 (document and padding boundaries over the
flattened batch) and ``max_seqlen``. In ``best_fit`` a document's last token and padding get label
``-100`` and no loss (in ``concat`` the last label is the next document's first token, and ``tokens`` /
``labels`` are two views of one array); ``mask_eos=True`` also masks the loss where the input is an
appended EOS. Position ids restart at every document and row. Details: docs/datasets.md.

State: per share, its pending ranges ``[epoch, start, stop, offset]`` (best_fit's window first; after a
re-split also runs of blocks ``{"blocks": [first, stop], "share": s, "of": S}``), the next epoch it takes
a fresh block of, running counts, which share of how many it is (``share``, ``num_shares``: opening it as
another is refused) and, over a mixture, ``schedule_id`` (the digest of the segments it is packed by:
:meth:`PackedDataset.open` refuses a share of other segments). O(share count x (window + ranges)). States
load into the same number of shares exactly, or into another number by :func:`~seqstore.data._shares.resplit`
(no token repeated or skipped).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..order import Order
from ..store import Store
from ._lengths import IntArray, NonzeroCount, check_int
from ._packfill import build_batch
from ._packplan import Planner
from ._shares import fresh_shares, new_stats, resplit, sum_stats
from .base import Dataset, FilteredDataset
from .combined import CombinedDataset
from .concat import ConcatDataset, SliceDataset
from .meta import MetaDataset
from .schedule import MixtureStream
from .store_dataset import StoreDataset

__all__ = ["PackedDataset", "PackedStream", "OrderStream", "PACKED_FORMAT", "IGNORE_LABEL"]

PACKED_FORMAT = "seqstore.packed/v1"
IGNORE_LABEL = -100
_MODES = ("concat", "best_fit")
DEFAULT_WINDOW = 256
#: batches whose documents are asked for together on object storage (one run in flight while one is built)
_RUN = 16


class OrderStream:
    """The documents of ``dataset`` in its epoch orders (epoch ``e``: ``dataset.epoch_order(e)``)."""

    names = ["data"]

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._orders: dict[int, Order] = {}
        self._lengths = dataset.lengths()
        self._with_tokens = NonzeroCount(self._lengths)

    def _order(self, epoch: int) -> Order:
        order = self._orders.get(epoch)
        if order is None:
            if len(self._orders) > 4:
                self._orders.clear()
            order = self._orders[epoch] = self.dataset.epoch_order(epoch)
        return order

    def epoch_len(self, epoch: int) -> int:
        return len(self._order(epoch))

    def epoch_period(self) -> int:
        """Epoch lengths repeat every ``partition_epoch`` (sub-)epochs (the full epoch's size is fixed)."""
        return max(1, int(getattr(self.dataset, "partition_epoch", 1)))

    def no_documents(self, span: str, longest: int, num_shares: int) -> str:
        if longest == 0:
            return f"the dataset {self.dataset!r} has no documents ({span}): nothing to pack"
        return (f"no documents in its block of any epoch: an epoch has fewer documents than the {num_shares} "
                f"shares (ranks x DataLoader workers) that split it ({span}, a cycle of partition epochs: at most "
                f"{longest} documents each); read it with at most {longest} ranks x workers")

    def token_documents(self, at_least: int | None = None) -> tuple[int, int]:
        """(documents with a token, documents), counted until ``at_least`` are found (None: all; see
        :class:`~seqstore.data._lengths.NonzeroCount`): asked on a share's first block with no token,
        which reads the lengths up to the first document with one, not all of them."""
        return self._with_tokens.at_least(at_least), len(self._lengths)

    def docs(self, epoch: int, start: int, stop: int) -> tuple[IntArray, IntArray]:
        arr = self._order(epoch).take(np.arange(start, stop, dtype=np.int64))
        return arr, self._lengths.take(arr)

    def source_of(self, ids: IntArray) -> IntArray:
        return np.zeros(len(ids), dtype=np.int64)

    def identity(self) -> dict[str, Any]:
        return self.dataset.order_identity()


class PackedDataset:
    """Documents of ``source`` packed into sequences of ``seq_len`` tokens (see the module docstring).

    ``source``: a store (or its path), any ``seqstore.data`` dataset whose lengths are the token
    field's, or a :class:`MixtureStream`. ``tokens``: the ragged 1-D token field. ``ordering`` /
    ``seed``: the document order when ``source`` is a store (a dataset packs in its own: other values
    are a ValueError). ``mode``:
    ``"concat"`` or ``"best_fit"``; ``eos``: a token id appended to every document (None: none);
    ``window``: best_fit's window in documents (default 256); ``split_long``: split documents longer
    than ``seq_len`` (default) or truncate them; ``pad_id``: the token of padding. O(1) memory.
    """

    def __init__(self, source: Any, *, tokens: str = "tokens", seq_len: int = 2048, mode: str = "concat",
                 eos: int | None = None, window: int | None = None, split_long: bool = True, mask_eos: bool = False,
                 pad_id: int = 0, ordering: Any = "default", seed: int = 0) -> None:
        if mode not in _MODES:
            raise ValueError(f"PackedDataset: mode must be one of {_MODES}, got {mode!r}")
        self.mode = mode
        self.seq_len = check_int(seq_len, "PackedDataset: seq_len", 1)
        self.window = DEFAULT_WINDOW if window is None else check_int(window, "PackedDataset: window", 1)
        self.eos = None if eos is None else check_int(eos, "PackedDataset: eos", 0)
        self.split_long = bool(split_long)
        self.mask_eos = bool(mask_eos)
        self.pad_id = check_int(pad_id, "PackedDataset: pad_id")
        if not isinstance(tokens, str):
            raise ValueError(f"PackedDataset: tokens must be a field name (a str), got {tokens!r}")
        self.tokens = tokens
        if isinstance(source, (Store, str, os.PathLike)):
            source = StoreDataset(source, ordering=ordering, seed=seed, length_field=tokens, fields=[tokens])
        elif not (isinstance(ordering, str) and ordering == "default") or isinstance(seed, bool) or seed != 0:
            # (they were ignored: the documents came in the dataset's own order, unshuffled by default)
            raise ValueError(f"PackedDataset: ordering= and seed= are the document order of a store (given as a "
                             f"Store or a path); a {type(source).__name__} packs in its own order: make it with "
                             f"ordering=..., seed=... instead (got ordering={ordering!r:.60}, seed={seed!r})")
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
        self.remote = False  # whether the documents are read from object storage
        for top in datasets:
            for d, field in _length_sources(top, tokens):
                self.remote |= isinstance(d, StoreDataset) and d.store.is_remote
                lf = getattr(d, "length_field", field)
                inside = "" if d is top else f" (inside {top!r})"
                names = getattr(d, "field_names", None)
                if names is not None and field not in names:
                    raise ValueError(f"PackedDataset: {d!r}{inside} does not return the token field {field!r} "
                                     f"(its fields: {names})")
                if lf != field:
                    raise ValueError(f"PackedDataset: {d!r}{inside} measures lengths in field {lf!r}, not the token "
                                     f"field {field!r}; open it with length_field={field!r}")
        self.dataset: Dataset = self.stream.dataset
        self.reader = _reading_only(self.dataset, tokens)  # (what builds the batches and reads them ahead)
        if tokens in self.dataset.bfloat16_fields():
            raise ValueError(f"PackedDataset: field {tokens!r} holds bfloat16 values; tokens must be integers")
        self.names = list(self.stream.names)

    # -------------------------------------------------------------------------------- state

    def config(self) -> dict[str, Any]:
        return {"mode": self.mode, "seq_len": self.seq_len, "eos": self.eos,
                "window": self.window if self.mode == "best_fit" else None, "split_long": self.split_long}

    def fresh_state(self, epoch: int = 1, num_shares: int = 1) -> dict[str, Any]:
        """The state of a run that starts at the beginning of ``epoch`` over ``num_shares`` shares (as
        :meth:`shares` of None: a mixture follows its own schedule from sample 0, not a loaded state's)."""
        return self.state_dict(self.shares(None, num_shares, epoch))

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
        tot = sum_stats(shares, len(self.names))
        for k in ("source_tokens", "source_documents"):
            tot[k] = dict(zip(self.names, tot[k]))
        return tot

    def check_state(self, state: Any) -> None:
        """Raise ValueError naming what in ``state`` does not fit this dataset."""
        if not isinstance(state, dict) or state.get("format") != PACKED_FORMAT:
            raise ValueError(f"PackedDataset: not a packed-dataset state (format {PACKED_FORMAT!r} expected)")
        saved = state.get("config")
        if self.mode == "concat" and isinstance(saved, dict):  # split_long has no effect in concat
            saved = {**saved, "split_long": self.split_long}
        if saved != self.config():
            raise ValueError(f"PackedDataset: the state was made with {state.get('config')}, this dataset is "
                             f"{self.config()}")
        src = state.get("source")
        mine = self.stream.identity()
        for later in ("orders", "sizes", "child_epoch", "children"):  # recorded since: not in older states
            if isinstance(src, dict) and later not in src:
                mine.pop(later, None)
        if src != mine:
            raise ValueError(f"PackedDataset: the state is of another source ({src}), this one is {mine}")
        shares = state.get("shares")
        if not isinstance(shares, list) or len(shares) != state.get("num_shares") or not shares:
            raise ValueError("PackedDataset: malformed state (shares)")
        for k, share in enumerate(shares):
            _check_share(share, k, len(self.names))
            was = (share.get("share"), share.get("num_shares"))
            if was != (None, None) and was != (k, len(shares)):
                raise ValueError(f"PackedDataset: malformed state: share {k} is the state of share {was[0]} of "
                                 f"{was[1]} (a state lists its {len(shares)} shares in order)")
            self._check_ranges(share, k)

    def _check_ranges(self, share: dict[str, Any], k: int) -> None:
        """ValueError naming a range of share ``k`` that reaches past its epoch's documents (O(ranges))."""
        for i, r in enumerate(share["ranges"]):
            if isinstance(r, dict):  # (a run of blocks: bounds computed when taken)
                continue
            e, _, stop, _ = r
            n = self.stream.epoch_len(int(e))
            if stop > n:
                raise ValueError(f"PackedDataset: malformed state: share {k}: range {i} is {share['ranges'][i]!r}, "
                                 f"but epoch {e} has {n} documents (stop must be at most {n})")

    def shares(self, state: dict[str, Any] | None, num_shares: int, epoch: int = 1) -> list[dict[str, Any]]:
        """Share states for ``num_shares`` shares from ``state`` (None: a fresh start at ``epoch``):
        as saved when the count matches, else re-split (no token repeated or skipped). With a
        :class:`MixtureStream` whose schedule differs from the saved one, the new schedule applies from
        the first sample no share had started; every source continues from its position."""
        num_shares = check_int(num_shares, "PackedDataset: num_shares", 1)
        if state is None:
            if isinstance(self.stream, MixtureStream):
                self.stream.reset()  # (a state loaded before brought its segments)
            # (a fresh share is every share's, on this stream's own schedule: not stamped)
            return fresh_shares(num_shares, check_int(epoch, "PackedDataset: epoch", 1), len(self.names))
        self.check_state(state)
        old = [dict(s) for s in state["shares"]]
        if isinstance(self.stream, MixtureStream):
            if "schedule" not in state:
                raise ValueError("PackedDataset: the state has no mixture schedule")
            frontier = (max(int(s["next_epoch"]) for s in old) - 1) * self.stream.chunk
            self.stream.load_state(state["schedule"], frontier)
        if len(old) == num_shares:  # as saved (the segments' digest as loaded, where the share had one)
            return [self.stamp(s) if "schedule_id" in s else s for s in old]
        return [self.stamp(s, (k, num_shares)) for k, s in enumerate(resplit(self.stream, old, num_shares,
                                                                               len(self.names)))]

    def stamp(self, share_state: dict[str, Any], where: tuple[int, int] | None = None) -> dict[str, Any]:
        """``share_state`` with the share it is (``where``: share, shares) and the digest of the mixture
        segments it is packed by (a mixture only)."""
        if where is not None:
            share_state["share"], share_state["num_shares"] = int(where[0]), int(where[1])
        if isinstance(self.stream, MixtureStream):
            share_state["schedule_id"] = self.stream.schedule_id()
        return share_state

    def open(self, share_state: dict[str, Any], share: int = 0, num_shares: int = 1) -> PackedStream:
        """A :class:`PackedStream` for share ``share`` of ``num_shares`` from its state."""
        _check_share_number(share, num_shares)
        if isinstance(share_state, dict) and "shares" in share_state:
            raise ValueError("PackedDataset.open: expected one share's state (packed.shares(state, S)[share]), "
                             "got a whole packed state")
        _check_share(share_state, int(share), len(self.names))
        self._check_ranges(share_state, int(share))
        was = (share_state.get("share"), share_state.get("num_shares"))
        if was != (None, None) and was != (share, num_shares):
            # (its ranges are that share's, and its fresh blocks would be another's: tokens packed twice or never)
            raise ValueError(f"PackedDataset.open: the state of share {was[0]} of {was[1]} opened as share {share} "
                             f"of {num_shares}; open shares[s] as packed.open(shares[s], s, S) with the S it was "
                             "made for (packed.shares(state, S) re-splits a state for another count)")
        made = share_state.get("schedule_id")
        if isinstance(self.stream, MixtureStream) and made is not None and made != self.stream.schedule_id():
            # (the stream deals samples by its own segments: the share's run changed its schedule on a resume)
            raise ValueError(f"PackedDataset.open: share {share}'s state was packed by other mixture segments "
                             f"(schedule {made}) than this stream follows now ({self.stream.schedule_id()}): the "
                             "run changed its schedule on a resume; load the whole state with "
                             "packed.shares(state, S) and open the shares it returns")
        return PackedStream(self, share_state, share, num_shares)

    def iter_batches(self, batch_size: int, *, state: dict[str, Any] | None = None, share: int = 0,
                     num_shares: int = 1, epoch: int = 1) -> Iterator[dict[str, Any]]:
        """Endless batches of share ``share`` of ``num_shares`` (from ``state`` or the start of ``epoch``).
        On object storage the documents of the next run of batches are asked for while a run is built
        (see :meth:`PackedStream.batch`)."""
        _check_share_number(share, num_shares)
        stream = self.open(self.shares(state, num_shares, epoch)[share], share, num_shares)
        while True:
            yield stream.batch(batch_size)

    def prefetch(self, plans: list[IntArray]) -> None:
        """Start reading the documents of :meth:`PackedStream.plan` arrays ``plans`` (later batches)."""
        ids = [p[2 + int(p[1]) : 2 + 2 * int(p[1])] for p in plans]
        if ids:
            self.reader.prefetch(np.unique(np.concatenate(ids)))

    def build(self, plan: IntArray) -> dict[str, Any]:
        """The batch of a :meth:`PackedStream.plan` (one ``get_batch`` of its documents, then one fill)."""
        n, k = int(plan[0]), int(plan[1])
        seq, ids, off, cnt = plan[2 : 2 + 4 * k].reshape(4, k)
        lens = plan[2 + 4 * k : 2 + 5 * k] if len(plan) >= 2 + 5 * k else None  # (the lengths planned with)
        return build_batch(self.reader, self.tokens, seq, ids, off, cnt, n, self.seq_len, planned=lens,
                           concat=self.mode == "concat", eos=self.eos, mask_eos=self.mask_eos, pad_id=self.pad_id)

    def __repr__(self) -> str:
        return f"PackedDataset({self.stream!r}, {self.config()})"


def _check_share_number(share: Any, num_shares: Any) -> None:
    n = check_int(num_shares, "PackedDataset: num_shares", 1)
    if isinstance(share, bool) or not isinstance(share, (int, np.integer)) or not 0 <= share < n:
        raise ValueError(f"PackedDataset: share must be in [0, {n}), got {share!r}")


def _check_share(share: Any, k: int, sources: int) -> None:
    """ValueError naming what of share state ``share`` (share ``k``) is not as a planner writes it."""
    where = f"PackedDataset: malformed state: share {k}"

    def whole(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    if not isinstance(share, dict):
        raise ValueError(f"{where} is a {type(share).__name__}, not a dict")
    for key in ("ranges", "next_epoch", "stats"):
        if key not in share:
            raise ValueError(f"{where}: no {key!r}")
    nxt = check_int(share["next_epoch"], f"{where}: next_epoch", 1)
    ranges = share["ranges"]
    if not isinstance(ranges, list):
        raise ValueError(f"{where}: ranges must be a list, got {type(ranges).__name__}")
    docs = 0
    for i, r in enumerate(ranges):
        if isinstance(r, dict):  # blocks s of S of epochs [first, stop), from a re-split
            run = r.get("blocks")
            if (set(r) != {"blocks", "share", "of"} or not isinstance(run, list) or len(run) != 2
                    or not all(whole(v) for v in (*run, r["share"], r["of"]))
                    or not 1 <= run[0] < run[1] <= nxt or not 0 <= r["share"] < r["of"]):
                raise ValueError(f"{where}: range {i} is {r!r}, not {{'blocks': [first, stop], 'share': s, 'of': S}} "
                                 f"(integers, 1 <= first < stop <= next_epoch {nxt}, 0 <= s < S)")
            continue
        if not (isinstance(r, list) and len(r) == 4 and all(whole(v) for v in r)):
            raise ValueError(f"{where}: range {i} is {r!r}, not [epoch, start, stop, offset] (integers)")
        if r[0] < 1 or not 0 <= r[1] <= r[2] or r[3] < 0:
            raise ValueError(f"{where}: range {i} is {r!r}; expected epoch >= 1, 0 <= start <= stop, offset >= 0")
        if r[0] >= nxt:  # (its block of that epoch would be taken again: its documents packed twice)
            raise ValueError(f"{where}: range {i} is {r!r}, of an epoch not before next_epoch {nxt}; a share's "
                             "ranges are of the epochs it took blocks of")
        docs += r[2] - r[1]
    for key in ("share", "num_shares"):
        if key in share and not whole(share[key]):
            raise ValueError(f"{where}: {key} must be an integer, got {share[key]!r}")
    if not isinstance(share.get("schedule_id", ""), str):
        raise ValueError(f"{where}: schedule_id must be a str, got {share['schedule_id']!r}")
    buffered = share.get("buffered", 0)
    if not whole(buffered) or not 0 <= buffered <= docs:
        raise ValueError(f"{where}: buffered must be an integer >= 0 and at most the {docs} documents of its "
                         f"ranges, got {buffered!r}")
    stats, want = share["stats"], new_stats(sources)
    if not isinstance(stats, dict) or set(stats) != set(want):
        got = sorted(stats) if isinstance(stats, dict) else type(stats).__name__
        raise ValueError(f"{where}: stats must have the counts {sorted(want)}, got {got}")
    for key, v in stats.items():
        ok = (isinstance(v, list) and len(v) == sources and all(whole(x) for x in v)) if isinstance(want[key], list) \
            else whole(v)
        if not ok:
            expected = f"{sources} integers (one per source)" if isinstance(want[key], list) else "an integer"
            raise ValueError(f"{where}: stats {key!r} is {v!r}; expected {expected}")


def _reading_only(dataset: Dataset, field: str) -> Dataset:
    """``dataset`` whose ``get_batch`` and ``prefetch`` read ``field`` alone where a store dataset's fields
    can be chosen (also under a concatenation, combination, filter or slice, and a meta dataset's children):
    a copy, ``dataset`` is kept."""
    attrs: dict[str, Any] = {}
    if isinstance(dataset, StoreDataset) and dataset.field_names != [field]:
        attrs["fields"] = [field]
    elif isinstance(dataset, (ConcatDataset, CombinedDataset)):
        attrs["datasets"] = [_reading_only(d, field) for d in dataset.datasets]
    elif isinstance(dataset, (FilteredDataset, SliceDataset)):
        attrs["dataset"] = _reading_only(dataset.dataset, field)
    elif isinstance(dataset, MetaDataset):
        # the child that gives ``field`` reads that field alone, the others nothing (also in a pickled copy,
        # which is rebuilt from ``_fields_arg``)
        only = {name: {src: dst for src, dst in m.items() if dst == field} for name, m in dataset.field_map.items()}
        if only != dataset.field_map:
            attrs["field_map"] = only
            attrs["_fields_arg"] = only
    if not attrs:
        return dataset
    copy = object.__new__(type(dataset))  # (no __init__: nothing recomputed)
    copy.__dict__.update(vars(dataset), **attrs)
    return copy


def _length_sources(dataset: Dataset, field: str) -> Iterator[tuple[Dataset, str]]:
    """The datasets whose lengths ``dataset``'s are, with the name there of its token field ``field``:
    itself, or through a filter, a slice, a concatenation or a combination (lengths passed on unchanged)
    those of its children, or a meta dataset's ``length_from`` child (which must give ``field``).
    O(children)."""
    if isinstance(dataset, (FilteredDataset, SliceDataset)):
        yield from _length_sources(dataset.dataset, field)
    elif isinstance(dataset, (ConcatDataset, CombinedDataset)):
        for child in dataset.datasets:
            yield from _length_sources(child, field)
    elif isinstance(dataset, MetaDataset):
        name = dataset.length_from
        src = [s for s, out in dataset.field_map[name].items() if out == field]
        if not src:
            raise ValueError(f"PackedDataset: {dataset!r} takes its lengths from {name!r}, which does not give the "
                             f"token field {field!r}; pass length_from= the child that gives it")
        yield from _length_sources(dataset.datasets[name], src[0])
    else:
        yield dataset, field


class PackedStream:
    """One share's packed sequences: ``batch(B)`` gathers the next ``B`` (one ``get_batch`` of their
    documents), ``skip(n)`` plans ``n`` without reading tokens, ``state()`` is the share's state.

    On object storage ``batch(B)`` plans runs of batches ahead and asks for the documents of the next run
    while a run is handed out; ``state()``, ``skip`` and ``plan`` still answer for the batches handed out
    (the plans made ahead are dropped when anything but ``batch(B)`` of the same ``B`` follows). Lengths
    that cannot be read (a refused shard) are raised by the batch whose plan needs them, after the ones
    before it (the planner reads ahead only up to them)."""

    def __init__(self, packed: PackedDataset, state: dict[str, Any], share: int, num_shares: int) -> None:
        self.packed = packed
        self._where = (share, num_shares)
        self.planner = self._planner(state)
        # (object storage) plans made ahead and the share's state after each; the state after the last
        # batch handed out while there are any
        self._ahead: deque[tuple[IntArray, dict[str, Any]]] = deque()
        self._handed: dict[str, Any] | None = None
        self._stalled = False  # a plan made ahead failed: planned again (and raised) when its batch is due

    def _planner(self, state: dict[str, Any]) -> Planner:
        p = self.packed
        return Planner(p.stream, mode=p.mode, seq_len=p.seq_len, window=p.window, split=p.split_long,
                       eos=p.eos is not None, share=self._where[0], num_shares=self._where[1], state=state)

    def _drop_ahead(self) -> None:
        """Forget the plans made ahead: the planner goes back to after the last batch handed out."""
        if self._handed is not None:
            self.planner = self._planner(self._handed)
        self._ahead.clear()
        self._handed = None
        self._stalled = False

    def state(self) -> dict[str, Any]:
        if self._handed is not None:
            return self.packed.stamp(copy.deepcopy(self._handed), self._where)
        return self.packed.stamp(self.planner.state(), self._where)

    def skip(self, n: int) -> None:
        n = check_int(n, "PackedStream: number of sequences to skip", 0)
        if n > 0:
            self._drop_ahead()
            self.planner.skip(n)

    def batch(self, n: int) -> dict[str, Any]:
        """The next ``n`` sequences. A batch whose documents cannot be read raises and is not handed out:
        ``state()`` stays before it and the next call makes it again."""
        n = check_int(n, "PackedStream: number of sequences", 0)
        if not self.packed.remote:
            self._drop_ahead()
            before = self.planner.mark()
            plan = self._plan(n)
            try:
                return self.packed.build(plan)
            except BaseException:
                self.planner.restore(before)
                raise
        if self._ahead and int(self._ahead[0][0][0]) != n:
            self._drop_ahead()
        if not self._ahead:
            self._stalled = False
        if self._handed is None:  # the state before the batches planned ahead, until one is handed out
            self._handed = self.planner.state()
        while len(self._ahead) <= _RUN and not self._stalled:  # the run handed out next, and the one after it
            run = []
            for _ in range(_RUN):
                try:
                    plan = self._plan(n)
                except Exception:
                    if not self._ahead:
                        raise  # the batch due now
                    # a later batch's documents (their lengths) cannot be read: the batches planned before it
                    # are handed out first (the planner is back after the last of them)
                    self._stalled = True
                    break
                self._ahead.append((plan, self.planner.state()))
                run.append(plan)
            if run:
                with contextlib.suppress(Exception):  # advice: a read that fails is asked for again by build
                    self.packed.prefetch(run)
        plan, after = self._ahead[0]
        batch = self.packed.build(plan)  # (raises with the batch still ahead: made again by the next call)
        self._ahead.popleft()
        self._handed = after
        return batch

    def plan(self, n: int) -> IntArray:
        """The next ``n`` sequences as one int64 array (``[n, pieces, seq..., ids..., offsets...,
        counts..., lengths...]``) that :meth:`PackedDataset.build` turns into the batch: planning here, reading and
        filling elsewhere (another thread or process) give the same batches."""
        self._drop_ahead()
        return self._plan(n)

    def _plan(self, n: int) -> IntArray:
        seq, ids, off, cnt, _, lens = self.planner.plan(check_int(n, "PackedStream: number of sequences", 0))
        head = np.array([int(n), len(seq)], dtype=np.int64)
        return np.concatenate([head, seq, ids, off, cnt, lens]).astype(np.int64, copy=False)
