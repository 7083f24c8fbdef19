"""The epoch cursor shared by the samplers and the iterable dataset: epoch, resume point, state.

A consumer walks the global order of sub-epoch ``epoch`` (``dataset.epoch_order(epoch)``, 1-based
epochs as in RETURNN and :func:`seqstore.seq_order`) from a resume point ``(position, batches)``:
restart at record ``position`` and skip ``batches`` length-based batches (only bucketed batching
leaves ``batches > 0``; greedy batches and fixed-size items are resumed from a record position).
``state_dict(consumed=k)`` turns "this rank took ``k`` items" into the next resume point: the ranks
together took global items ``[0, k * world_size)`` of this run (see :mod:`seqstore.torch._plan`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.utils.data import get_worker_info

from ..order import Order
from ._convert import resolve_topology
from ._plan import GreedyCursor, LengthBatching, batch_stream, bucket_seed, fixed_total
from ._state import StateError, check_state, dataset_identity, make_state, ordering_config

__all__ = ["EpochCursor", "SharedInts", "check_epoch"]


def _in_worker() -> bool:
    """Whether this process is a DataLoader worker."""
    return get_worker_info() is not None


class SharedInts:
    """A few int64 in shared memory that the main process writes and its DataLoader workers read at each
    iteration: ``persistent_workers`` keep the copy of a dataset they started with, and ``set_epoch`` /
    ``load_state_dict`` in the main process reach them this way (fork: inherited; spawn / forkserver: the
    DataLoader's pickling shares it; a copy, by deepcopy or a plain pickle, gets memory of its own)."""

    def __init__(self, n: int) -> None:
        self._values = torch.zeros(n, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

    def publish(self, *values: int) -> None:
        """Set the values (in the main process; a worker's copy writes nothing)."""
        if not _in_worker():
            self._values.copy_(torch.tensor(values, dtype=torch.int64))

    def read(self) -> list[int]:
        return self._values.tolist()  # type: ignore[no-any-return]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if not self._values.is_shared():  # a copy: its own shared memory
            self._values.share_memory_()


def check_epoch(epoch: Any, owner: str) -> int:
    """``epoch`` as an int >= 1; a clear error for 0 (torch code often counts epochs from 0)."""
    if isinstance(epoch, bool):
        raise ValueError(f"{owner}: epoch must be an integer >= 1, got {epoch!r}")
    try:
        e = operator.index(epoch)
    except TypeError:
        raise ValueError(f"{owner}: epoch must be an integer >= 1, got {epoch!r}") from None
    if e < 1:
        raise ValueError(f"{owner}: epochs are 1-based as in seqstore.seq_order and RETURNN; got {e}: pass the "
                         "0-based epoch + 1, e.g. set_epoch(trainer.current_epoch + 1) (where a framework calls "
                         "set_epoch(current_epoch) by itself, as Lightning does on the DataLoader's sampler, "
                         "a subclass whose set_epoch adds 1)")
    return e


class EpochCursor:
    """Epoch, resume point and state handling (a base class; see the module docstring).

    Subclasses set ``dataset`` (a protocol dataset), ``rank``, ``world_size``, ``drop_last`` through
    :meth:`_init_cursor` and count what they yield in ``_yielded``. ``item`` is the number of records
    per item for fixed-size items; ``spec`` the length-based batching (then ``item`` is unused).
    """

    _kind = "EpochCursor"

    def _init_cursor(self, dataset: Any, rank: int | None, world_size: int | None, drop_last: bool, epoch: int,
                     spec: LengthBatching | None, item: int) -> None:
        self.dataset = dataset
        self.rank, self.world_size = resolve_topology(rank, world_size, self._kind)
        self.drop_last = bool(drop_last)
        self._epoch = check_epoch(epoch, self._kind)
        self._spec = spec
        self._item = int(item)
        self._order: tuple[int, Order] | None = None
        self._identity: dict[str, Any] | None = None
        self._ordering: dict[str, Any] | None = None
        self._by_loader = False  # an iteration runs under SeqDataLoader, which says when it ends
        self._shared: SharedInts | None = None  # (epoch, position, batches) of the main process, for its workers
        self._reset(0, 0)

    def _share_with_workers(self) -> None:
        """Keep (epoch, resume point) where DataLoader workers read them at each iteration (:class:`SharedInts`)."""
        self._shared = SharedInts(3)
        self._publish()

    def _publish(self) -> None:
        if self._shared is not None:
            self._shared.publish(self._epoch, self._start, self._start_batches)

    def _adopt(self) -> None:
        """In a DataLoader worker: take the main process's epoch and resume point (O(1))."""
        if self._shared is None or not _in_worker():
            return
        epoch, position, batches = self._shared.read()
        if (epoch, position, batches) != (self._epoch, self._start, self._start_batches):
            self._epoch = epoch
            self._reset(position, batches)

    def _reset(self, position: int, batches: int) -> None:
        # a new resume point: counts of batches taken before it (SeqDataLoader's) no longer apply; ``generation``
        # (public: SeqDataLoader compares it) counts the resume points
        self.generation = getattr(self, "generation", 0) + 1
        self._start = self._iter_start = position
        self._start_batches = self._iter_start_batches = batches
        self._yielded = 0
        self._handed: int | None = None  # items SeqDataLoader handed to the loop in this iteration, if it runs it
        self._cursor: GreedyCursor | None = None
        self._len_cache: tuple[tuple[int, int, int], int] | None = None
        self._publish()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cursor": None, "_order": None}  # (the cursor holds a generator; rebuilt on demand)

    # ------------------------------------------------------------------------------------ epochs

    @property
    def epoch(self) -> int:
        """The current (sub-)epoch, 1-based."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select (sub-)epoch ``epoch`` (>= 1). A new epoch starts at its beginning; setting the epoch
        a loaded state is in keeps the state's position (so ``load_state_dict`` then ``set_epoch`` in
        the usual loop resumes). O(1)."""
        e = check_epoch(epoch, self._kind)
        if e != self._epoch:
            self._epoch = e
            self._reset(0, 0)

    def epoch_order(self) -> Order:
        """The global order of the current epoch (all ranks together), lazy; cached per epoch."""
        if self._order is None or self._order[0] != self._epoch:
            self._order = (self._epoch, self.dataset.epoch_order(self._epoch))
        return self._order[1]

    def _begin(self) -> tuple[Order, int, int]:
        """Start an iteration: (order, start position, batches to skip)."""
        self._adopt()
        self._iter_start, self._iter_start_batches = self._start, self._start_batches
        self._yielded = 0
        self._handed = None
        self._cursor = None
        return self.epoch_order(), self._start, self._start_batches

    def begin(self) -> None:
        """Tell the main-process copy that a new iteration starts from the current resume point
        (``SeqDataLoader`` calls this, and :meth:`finish_epoch` or :meth:`broken_off` at its end: its
        read-ahead pulls the last items before the loop has them)."""
        self._begin()
        self._by_loader = True

    def handed_out(self, items: int) -> None:
        """``SeqDataLoader`` handed the loop ``items`` items of this iteration (what the default ``consumed``
        of a sampler's ``state_dict`` counts: its read-ahead takes items before the loop has them)."""
        self._handed = items

    def _finish(self) -> None:
        """The items of an iteration ran out: its end, unless ``SeqDataLoader`` says when that is."""
        if not self._by_loader:
            self.finish_epoch()

    def finish_epoch(self) -> None:
        """An iteration ran to its end: the next one walks the whole epoch again (``SeqDataLoader`` calls
        this; with a plain DataLoader and an ``IterableSeqDataset`` call ``set_epoch`` every epoch)."""
        self._by_loader = False
        self._start = self._start_batches = 0
        self._len_cache = None
        self._publish()

    def broken_off(self) -> None:
        """An iteration that began ended before its end: the next one starts at its resume point again."""
        self._by_loader = False
        self._start, self._start_batches = self._iter_start, self._iter_start_batches
        self._publish()

    def _batch_iter(self, order: Order, position: int, skip: int) -> Any:
        assert self._spec is not None
        return batch_stream(order, self.dataset.lengths(), self._spec, position=position, skip=skip,
                            seed=bucket_seed(int(getattr(self.dataset, "seed", 0)), self._epoch))

    def _items_per_rank(self) -> int:
        """Items each rank gets from the current resume point (a scan of the batch boundaries in
        length-based mode: O(N) time, O(chunk) memory; cached)."""
        key = (self._epoch, self._start, self._start_batches)
        if self._len_cache is not None and self._len_cache[0] == key:
            return self._len_cache[1]
        order = self.epoch_order()
        if self._spec is None:
            n = fixed_total(len(order) - self._start, self._item, self.world_size, self.drop_last)
            n //= self._item * self.world_size
        else:
            total = sum(1 for _ in self._batch_iter(order, self._start, self._start_batches))
            n = total // self.world_size if self.drop_last else -(-total // self.world_size)
        self._len_cache = (key, n)
        return n

    # ------------------------------------------------------------------------------------- state

    def _identities(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if self._identity is None or self._ordering is None:
            self._identity = dataset_identity(self.dataset)
            self._ordering = ordering_config(self.dataset)
        return self._identity, self._ordering

    def _state_after(self, global_items: int, num_workers: int | None = None) -> dict[str, Any]:
        """The resume state after the ranks together took ``global_items`` items of this run."""
        order = self.epoch_order()
        length = len(order)
        batches = 0
        if self._spec is None:
            position = min(self._iter_start + global_items * self._item, length)
        elif self._spec.greedy:
            cur = self._cursor
            if cur is None or cur.batches > global_items:
                cur = GreedyCursor(order, self.dataset.lengths(), self._spec, self._iter_start)
                if self._iter_start_batches:
                    cur.advance_to(self._iter_start_batches)
                    cur.batches = 0
                self._cursor = cur
            position = cur.advance_to(global_items)
        else:
            position = self._iter_start
            batches = self._iter_start_batches + global_items
        ident, ordering = self._identities()
        return make_state(self._kind, dataset=ident, ordering=ordering, epoch=self._epoch, position=position,
                          batches=batches, batching=None if self._spec is None else self._spec.config(),
                          num_positions=length, world_size=self.world_size, num_workers=num_workers)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from any consumer of the same dataset and ordering, saved under
        any world size or worker count): the next iteration yields exactly the items not consumed
        (plus the documented padding). Raises :class:`StateError` for a state of another dataset,
        ordering or batching. O(1) (a bucketed-batching state skips its batches on the next
        iteration: index arithmetic only)."""
        ident, ordering = self._identities()
        batching = None if self._spec is None else self._spec.config()
        epoch, position, batches = check_state(state, dataset=ident, ordering=ordering, batching=batching,
                                               owner=self._kind)
        if batches and self._spec is None:
            raise StateError(f"{self._kind}: state counts {batches} length-based batches; this consumer has none")
        order = self.dataset.epoch_order(epoch)  # (a refused state changes nothing)
        if len(order) != state["num_positions"]:
            raise StateError(f"{self._kind}: epoch {epoch} of this dataset has {len(order)} positions, the state says "
                             f"{state['num_positions']} (different partition or data)")
        self._epoch = epoch
        self._order = (epoch, order)
        self._reset(position, batches)
