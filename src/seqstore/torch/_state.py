"""Resume states: small JSON-able dicts, the dataset fingerprint, and their validation.

A state is O(1): the epoch, the global record position (a prefix of the epoch order is consumed),
batches consumed after that position (only for bucketed batching), the epoch order's length, the
ordering config (ordering, seed, partition epoch), a fingerprint of the dataset and, when batches
count, the batching config. It does not depend on the world size or the number of DataLoader workers
(those are recorded for information only), so it loads into any topology (elastic resume).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..data._cache import fingerprint
from ..data._orders import ordering_key
from ..data.base import Dataset
from ..errors import SeqstoreError

__all__ = ["StateError", "FORMAT", "dataset_identity", "ordering_config", "make_state", "check_state"]

FORMAT = "seqstore.torch.state/v1"


class StateError(SeqstoreError, ValueError):
    """A resume state does not fit this sampler or dataset (other data, ordering, batching or format)."""


_ORDERING_KEYS = ("ordering", "seed", "partition_epoch")


def ordering_config(dataset: Any) -> dict[str, Any]:
    """{"ordering", "seed", "partition_epoch"} of a protocol dataset, plus what its ``order_identity()``
    adds to a plain dataset's (a combination's sampling sizes, child_epoch and children's orders)."""
    config = {"ordering": ordering_key(getattr(dataset, "ordering", "default")),
              "seed": int(getattr(dataset, "seed", 0)), "partition_epoch": int(getattr(dataset, "partition_epoch", 1))}
    if isinstance(dataset, Dataset):
        plain = Dataset.order_identity(dataset)
        config.update((k, v) for k, v in dataset.order_identity().items() if k not in plain)
    return config


def dataset_identity(dataset: Any) -> dict[str, Any]:
    """{"type", "num_seqs", "fingerprint"}: the dataset class, its size and the data layer's cache
    fingerprint (:func:`seqstore.data._cache.fingerprint`) of (class, size, ``cache_key()``) (for stores:
    every shard's name, record count and the CRC of the length field's offsets). Datasets without a
    cache key are identified by type and size only. O(shards)."""
    key_fn = getattr(dataset, "cache_key", None)
    key = key_fn() if callable(key_fn) else None
    kind = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    n = int(dataset.num_seqs)
    return {"type": kind, "num_seqs": n, "fingerprint": fingerprint("torch.state", kind, n, key)}


def make_state(kind: str, *, dataset: dict[str, Any], ordering: dict[str, Any], epoch: int, position: int,
               batches: int, batching: dict[str, Any] | None, num_positions: int, world_size: int,
               num_workers: int | None = None) -> dict[str, Any]:
    """Assemble a state dict (plain ints, strings and dicts: ``torch.save``/JSON safe)."""
    return {"format": FORMAT, "kind": kind, "epoch": int(epoch), "position": int(position), "batches": int(batches),
            "batching": batching, "num_positions": int(num_positions), "ordering": dict(ordering),
            "dataset": dict(dataset), "world_size": int(world_size), "num_workers": num_workers}


def _int(state: dict[str, Any], key: str, minimum: int) -> int:
    v = state.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < minimum:
        raise StateError(f"state[{key!r}] must be an integer >= {minimum}, got {v!r}")
    return int(v)


def check_state(state: Any, *, dataset: dict[str, Any], ordering: dict[str, Any], batching: dict[str, Any] | None,
                owner: str) -> tuple[int, int, int]:
    """Validate ``state`` against this consumer; return (epoch, position, batches).

    Raises :class:`StateError` naming what differs: format, dataset (type, size or fingerprint),
    ordering config, or -- when the state counts batches after its position -- the batching config.
    The epoch order's length is checked by the caller once the epoch's order is built.
    """
    if not isinstance(state, dict):
        raise StateError(f"{owner}: a state is a dict from state_dict(), got {type(state).__name__}")
    if state.get("format") != FORMAT:
        raise StateError(f"{owner}: state format {state.get('format')!r} is not {FORMAT!r}")
    theirs = state.get("dataset")
    if not isinstance(theirs, dict):
        raise StateError(f"{owner}: state has no dataset identity")
    if any(theirs.get(k) != dataset[k] for k in ("num_seqs", "fingerprint", "type")):
        raise StateError(f"{owner}: state was saved for a different dataset ({theirs.get('type')}, "
                         f"{theirs.get('num_seqs')} sequences, fingerprint {theirs.get('fingerprint')}); this is "
                         f"{dataset['type']} with {dataset['num_seqs']} sequences, "
                         f"fingerprint {dataset['fingerprint']}")
    saved = state.get("ordering")
    if isinstance(saved, dict):  # keys added to the config since (a combination's): not in older states
        ordering = {k: v for k, v in ordering.items() if k in _ORDERING_KEYS or k in saved}
    if saved != ordering:
        differ = sorted(k for k in {*ordering, *(saved if isinstance(saved, dict) else ())}
                        if not isinstance(saved, dict) or saved.get(k) != ordering.get(k))
        raise StateError(f"{owner}: state was saved with ordering config {saved}; this dataset has {ordering} "
                         f"(differs: {differ})")
    epoch = _int(state, "epoch", 1)
    position = _int(state, "position", 0)
    batches = _int(state, "batches", 0)
    _int(state, "num_positions", 0)
    if position > state["num_positions"]:
        raise StateError(f"{owner}: state position {position} is past the epoch's {state['num_positions']} positions")
    if batches and state.get("batching") != batching:
        raise StateError(f"{owner}: state counts {batches} batches of batching {state.get('batching')}; "
                         f"this consumer batches with {batching}")
    return epoch, position, batches
