"""``seq_order``: RETURNN ordering names, epochs, partition epoch and shards -> a lazy :class:`Order`.

This module owns the parsing of ordering names and the epoch arithmetic. Semantics follow RETURNN's
``Dataset.get_seq_order_for_epoch`` (see docs/orders.md for the table and every difference):

* key epoch: full epoch ``(epoch-1)//partition_epoch + 1``, grouped by ``:nth`` as ``(full-1)//nth + 1``;
  random orderings take their key from a blake2b hash of (seed, key epoch, stream), so all sub-epochs of
  a full epoch (and all shards) share one full order.
* the full order is cut into ``partition_epoch * num_shards`` contiguous blocks (the first
  ``len % blocks`` one longer); sub-epoch ``epoch`` on shard ``s`` is block
  ``((epoch-1) % partition_epoch) * num_shards + s``. O(1): the block is a lazy view.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ._arrays import ArrayRef, PathLike
from ._keys import int_text, key_epoch, master_key
from .base import Order, SliceOrder, block_bounds
from .binned import LaplaceOrder, SortBinShuffleOrder
from .kinds import (
    EveryNOrder,
    ExplicitOrder,
    PermutationOrder,
    RangeOrder,
    SampleOrder,
    SortedOrder,
    check_count,
)
from .random_block import RandomBlockOrder

__all__ = ["seq_order", "ORDERINGS", "ORDER_KINDS", "OrderKind", "ordering_name", "ordering_needs_lengths",
           "check_ordering"]

_DIGITS = re.compile(r"[0-9]+")


def _int_arg(text: str, what: str, ordering: str) -> int:
    if not _DIGITS.fullmatch(text):
        raise ValueError(f"ordering {ordering!r}: {what} must be a positive integer, got {text!r}")
    try:
        value = int(text)
    except ValueError:  # (past Python's limit on digits in a str -> int conversion: it named neither)
        raise ValueError(f"ordering {ordering!r}: {what} has {len(text)} digits, more than Python converts "
                         f"(sys.get_int_max_str_digits() = {sys.get_int_max_str_digits()})") from None
    if value < 1:
        raise ValueError(f"ordering {ordering!r}: {what} must be >= 1, got {value}")
    return value


def _check_int(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {v}")
    return v


def _parse_bins(args: list[str], num_seqs: int, ordering: str) -> tuple[int, int]:
    """``[B|.K][:nth]`` -> (bins, nth) with RETURNN's rules: bins 2 by default, ``.K`` -> max(N // K, 2)."""
    if len(args) > 2:
        raise ValueError(f"ordering {ordering!r}: expected at most two arguments (bins, nth)")
    bins = 2
    if args:
        if args[0].startswith("."):
            per_bin = _int_arg(args[0][1:], "sequences per bin (.K)", ordering)
            bins = max(num_seqs // per_bin, 2)
        else:
            bins = _int_arg(args[0], "number of bins", ordering)
            if bins > (1 << 63) - 1:  # (else refused later, by the order, without the ordering's name)
                raise ValueError(f"ordering {ordering!r}: number of bins must be <= 2**63 - 1, got {bins}")
    nth = _int_arg(args[1], "nth", ordering) if len(args) == 2 else 1
    return bins, nth


def _parse_nth(args: list[str], ordering: str) -> int:
    if len(args) > 1:
        raise ValueError(f"ordering {ordering!r}: expected at most one argument (nth)")
    return _int_arg(args[0], "nth", ordering) if args else 1


def _parse_random_block(args: list[str], ordering: str) -> tuple[int, int, int]:
    """``B:W[:nth]`` -> (block size B, window W in blocks, nth), each an integer >= 1."""
    if len(args) not in (2, 3):
        raise ValueError(f"ordering {ordering!r}: expected 'random_block:B:W[:nth]' (B = records per block, "
                         f"W = blocks per window, nth = epochs per order; integers >= 1)")
    block = _int_arg(args[0], "block size B", ordering)
    window = _int_arg(args[1], "window W (blocks)", ordering)
    for value, what in ((block, "block size B"), (window, "window W")):
        if value > (1 << 63) - 1:
            raise ValueError(f"ordering {ordering!r}: {what} must be <= 2**63 - 1, got {value}")
    nth = _int_arg(args[2], "nth", ordering) if len(args) == 3 else 1
    return block, window, nth


def _shown(value: int) -> str:
    """An int for a label: its digits, or past Python's int -> str digit limit their count."""
    try:
        return str(value)
    except ValueError:
        return f"<{len(int_text(value))}-character int>"


def _is_explicit(ordering: Any) -> bool:
    if isinstance(ordering, (np.ndarray, ArrayRef, os.PathLike, list, tuple, range)):
        return True
    return isinstance(ordering, str) and ordering.endswith(".npy")


class _Build:
    """What an order kind's ``make`` gets: the record count, the inputs of :func:`seq_order`, and the
    random key of (seed, key epoch, stream); ``label`` collects what the order's label adds."""

    def __init__(self, n: int, epoch: int, partition_epoch: int, seed: int, lengths: ArrayRef | None,
                 sort_cache: PathLike | None, values: Any, num_values: int | None) -> None:
        self.n, self.epoch, self.partition_epoch, self.seed = n, epoch, partition_epoch, seed
        self.lengths, self.sort_cache, self.values, self.num_values = lengths, sort_cache, values, num_values
        self.label = ""

    def key(self, stream: str, nth: int) -> int:
        ke = key_epoch(self.epoch, self.partition_epoch, nth)
        self.label = f" key_epoch={_shown(ke)}"
        return master_key(self.seed, ke, stream)

    def binned(self, bins: int) -> int:
        self.label += f" bins={bins}"
        return bins


@dataclasses.dataclass(frozen=True)
class OrderKind:
    """One ordering name: its ``syntax`` (as :data:`ORDERINGS` lists it), ``parse(args, ordering, n)``
    checking its ``:``-separated arguments (ValueError naming ``ordering``), ``make(build, parsed)`` the
    full order of all records, and whether it needs the records' lengths."""

    syntax: str
    parse: Callable[[list[str], str, int], tuple[Any, ...]]
    make: Callable[[_Build, tuple[Any, ...]], Order]
    needs_lengths: bool = False


def _no_args(name: str) -> Callable[[list[str], str, int], tuple[Any, ...]]:
    def parse(args: list[str], ordering: str, n: int) -> tuple[Any, ...]:
        if args:
            raise ValueError(f"ordering {ordering!r}: {name!r} takes no arguments")
        return ()

    return parse


def _every_n(args: list[str], ordering: str, n: int) -> tuple[int]:
    if len(args) != 1:
        raise ValueError(f"ordering {ordering!r}: expected 'default_every_n:K'")
    return (_int_arg(args[0], "K", ordering),)


def _sorted(descending: bool) -> OrderKind:
    def make(b: _Build, _: tuple[Any, ...]) -> Order:
        assert b.lengths is not None
        return SortedOrder(b.lengths, descending=descending, cache=b.sort_cache)

    name = "sorted_reverse" if descending else "sorted"
    return OrderKind(name, _no_args(name), make, needs_lengths=True)


def _sort_bin_shuffle(within: bool) -> OrderKind:
    def make(b: _Build, p: tuple[Any, ...]) -> Order:
        assert b.lengths is not None
        return SortBinShuffleOrder(b.n, b.key("sort_bin_shuffle", p[1]), b.binned(p[0]), b.lengths,
                                   shuffle_within=within, sort_cache=b.sort_cache)

    return OrderKind(f"sort_bin_shuffle{'_x2' if within else ''}[:B|:.K][:nth]",
                     lambda args, o, n: _parse_bins(args, n, o), make, needs_lengths=True)


def _laplace(b: _Build, p: tuple[Any, ...]) -> Order:
    assert b.lengths is not None or b.values is not None
    return LaplaceOrder(b.n, b.key("perm", p[1]), b.binned(p[0]), b.lengths, values=b.values, num_values=b.num_values)


ORDER_KINDS: dict[str, OrderKind] = {
    "default": OrderKind("default", _no_args("default"), lambda b, p: RangeOrder(b.n)),
    "reverse": OrderKind("reverse", _no_args("reverse"), lambda b, p: RangeOrder(b.n, reverse=True)),
    "default_every_n": OrderKind("default_every_n:K", _every_n, lambda b, p: EveryNOrder(b.n, p[0])),
    "sorted": _sorted(False),
    "sorted_reverse": _sorted(True),
    "random": OrderKind("random[:nth]", lambda args, o, n: (_parse_nth(args, o),),
                        lambda b, p: PermutationOrder(b.n, b.key("perm", p[0]))),
    "random_sample": OrderKind("random_sample[:nth]", lambda args, o, n: (_parse_nth(args, o),),
                               lambda b, p: SampleOrder(b.n, b.key("random_sample", p[0]))),
    "random_block": OrderKind("random_block:B:W[:nth]", lambda args, o, n: _parse_random_block(args, o),
                              lambda b, p: RandomBlockOrder(b.n, b.key("random_block", p[2]), p[0], p[1])),
    "laplace": OrderKind("laplace[:B|:.K][:nth]", lambda args, o, n: _parse_bins(args, n, o), _laplace,
                         needs_lengths=True),
    "sort_bin_shuffle": _sort_bin_shuffle(False),
    "sort_bin_shuffle_x2": _sort_bin_shuffle(True),
}
"""The orderings by name: the one place that maps a name to its order (:func:`seq_order`,
:func:`check_ordering` and :data:`ORDERINGS` read it)."""

ORDERINGS = tuple(kind.syntax for kind in ORDER_KINDS.values())
"""The ordering names :func:`seq_order` understands (plus an explicit array or ``.npy`` path)."""


def ordering_name(ordering: Any) -> str:
    """The base name of ``ordering``: ``"laplace"`` for ``"laplace:.1000"``, ``"sorted"`` for ``"sorted"``,
    ``"explicit"`` for an explicit order (an int array, list, range or ``.npy`` path). O(1); only splits
    the name (:func:`seq_order` validates the arguments). Raises ValueError for anything else."""
    if _is_explicit(ordering):
        return "explicit"
    if not isinstance(ordering, str):
        raise ValueError(f"ordering must be a name or an explicit order, got {type(ordering).__name__}")
    return ordering.split(":", 1)[0]


def ordering_needs_lengths(ordering: Any) -> bool:
    """Whether :func:`seq_order` needs ``lengths`` for ``ordering`` (``sorted*``, ``laplace*``,
    ``sort_bin_shuffle*``). O(1); raises ValueError like :func:`ordering_name`."""
    kind = ORDER_KINDS.get(ordering_name(ordering))
    return kind is not None and kind.needs_lengths


def check_ordering(ordering: Any) -> None:
    """Check ``ordering``'s name and arguments as :func:`seq_order` will parse them (not the lengths,
    which only a dataset has): ValueError naming the unknown name or the bad argument. O(1)."""
    if _is_explicit(ordering):
        return
    if not isinstance(ordering, str):
        raise ValueError(f"ordering must be a name or an explicit order, got {type(ordering).__name__}")
    name, *args = ordering.split(":")
    kind = ORDER_KINDS.get(name)
    if kind is None:
        raise ValueError(f"unknown ordering {ordering!r}; known: {', '.join(ORDERINGS)} or an explicit order")
    kind.parse(args, ordering, 2)  # the syntax only: bins from .K need N


def seq_order(num_seqs: int, ordering: str | PathLike | Any, *, epoch: int, seed: int = 0, lengths: Any = None,
              partition_epoch: int = 1, shard_index: int = 0, num_shards: int = 1, sort_cache: PathLike | None = None,
              values: Callable[[Any], tuple[Any, Any]] | None = None, num_values: int | None = None) -> Order:
    """The order of sub-epoch ``epoch`` on shard ``shard_index`` of ``num_shards``, as a lazy :class:`Order`.

    ``num_seqs``: N, 0 <= N < 2**63. ``ordering``: a name from :data:`ORDERINGS`, or an explicit order
    (an int array or a path to a ``.npy`` file, memory-mapped). ``epoch`` >= 1 (1-based, sub-epochs
    when ``partition_epoch`` > 1). ``seed``: any int; random orders are keyed by a stable hash of
    (seed, key epoch). ``lengths``: (N,) integer or float array-like (a memmap or ``.npy`` path keeps it
    on disk), needed by ``sorted*``, ``laplace``, ``sort_bin_shuffle*``. ``sort_cache``: ``.npy`` path for
    the global sort index of ``lengths`` (``sorted*``, ``sort_bin_shuffle*``), computed once and mapped.
    ``values`` (``laplace`` only, instead of ``lengths``): a picklable vectorised callable mapping
    positions (int64 array) to ``(values, lengths)``; the order yields those values, binned and sorted
    as laplace sorts positions, with ``num_values`` (default N) as its value range. A caller that
    addresses items differently (a combined dataset: union position -> combined index) gets both in
    one lookup per item.

    Construction is O(1) (no order is materialised); the result's values are computed on access. Raises
    ValueError naming the problem for unknown orderings, malformed arguments, missing or mis-sized
    lengths, ``epoch < 1``, ``partition_epoch < 1``, ``num_shards < 1`` or ``shard_index`` out of range.
    """
    n = check_count(num_seqs, "num_seqs")
    epoch = _check_int(epoch, "epoch", 1)
    partition_epoch = _check_int(partition_epoch, "partition_epoch", 1)
    num_shards = _check_int(num_shards, "num_shards", 1)
    shard_index = _check_int(shard_index, "shard_index", 0)
    if shard_index >= num_shards:
        raise ValueError(f"shard_index must be < num_shards = {num_shards}, got {shard_index}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    seed = int(seed)

    lengths_ref: ArrayRef | None = None
    if lengths is not None:
        lengths_ref = lengths if isinstance(lengths, ArrayRef) else ArrayRef(lengths, "lengths")
        if len(lengths_ref) != n:
            raise ValueError(f"lengths has {len(lengths_ref)} entries, expected num_seqs = {n}")

    if num_values is not None and values is None:
        raise ValueError("num_values= goes with values= (the range of what a laplace values callable returns)")
    build = _Build(n, epoch, partition_epoch, seed, lengths_ref, sort_cache, values, num_values)
    full: Order
    if _is_explicit(ordering):
        if values is not None:
            raise ValueError("values= is for 'laplace' orderings only, got an explicit order")
        full = ExplicitOrder(n, ordering)
        name = "explicit"
    else:
        if not isinstance(ordering, str):
            raise ValueError(f"ordering must be a name or an explicit order, got {type(ordering).__name__}")
        name, *args = ordering.split(":")
        if values is not None and name != "laplace":
            raise ValueError(f"values= is for 'laplace' orderings only, got ordering {ordering!r}")
        check_ordering(ordering)  # a bad name or argument is named before what the ordering needs
        kind = ORDER_KINDS[name]
        if kind.needs_lengths and lengths_ref is None and values is None:
            raise ValueError(f"ordering {ordering!r} needs lengths")
        full = kind.make(build, kind.parse(args, ordering, n))
        name = ordering

    blocks = partition_epoch * num_shards
    block = ((epoch - 1) % partition_epoch) * num_shards + shard_index
    start, stop = block_bounds(len(full), block, blocks)
    label = f"{name!r} epoch={_shown(epoch)} seed={_shown(seed)}{build.label}"
    if partition_epoch > 1:
        label += f" partition={(epoch - 1) % partition_epoch + 1}/{partition_epoch}"
    if num_shards > 1:
        label += f" shard={shard_index}/{num_shards}"
    return SliceOrder(full, range(start, stop), label=label)
