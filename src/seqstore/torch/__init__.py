"""PyTorch adapters (needs torch): datasets, samplers, collation and exact, elastic resume.

* :class:`SeqDataset` -- map-style ``Dataset``: record -> dict of tensors; batched gathers.
* :class:`EpochSampler` -- this rank's indices of an epoch order, lazily (ranks interleave).
* :class:`EpochBatchSampler` -- length-based batches (greedy or bucketed), equal count per rank.
* :class:`IterableSeqDataset` -- records or batches sharded over ranks x DataLoader workers.
* :func:`collate_padded` / :class:`PaddedCollate` -- stack fixed fields, pad ragged ones + lengths/masks.
* :class:`SeqDataLoader` -- a DataLoader that counts consumed batches for an exact ``state_dict()``;
  builds seqstore's own batches in its process, or on ``threads=`` / in ``procs=`` (shared buffers).
* :class:`PackedIterableDataset` -- a ``seqstore.data.PackedDataset``'s packed batches, sharded, resumable.
* :class:`LengthBatching` -- the length-based batching options; :class:`StateError` -- bad states;
  :class:`LoaderWorkerError` -- a worker failed or timed out; :class:`MainGuardError` -- an unguarded script.

States are O(1) dicts (epoch, global position, ordering config, dataset fingerprint) that load into
any world size or worker count. Epochs are 1-based, as in :func:`seqstore.seq_order`. See docs/torch.md.
"""

from ..errors import LoaderWorkerError, MainGuardError
from . import _warm  # noqa: F401 - first: numba's start-up overlaps the torch import below
from ._plan import LengthBatching
from ._state import StateError
from .collate import GatheredRecords, PaddedCollate, collate_padded
from .dataset import SeqDataset
from .iterable import IterableSeqDataset
from .loader import SeqDataLoader
from .packed import PackedIterableDataset
from .sampler import EpochBatchSampler, EpochSampler

__all__ = [
    "EpochBatchSampler",
    "EpochSampler",
    "GatheredRecords",
    "IterableSeqDataset",
    "LengthBatching",
    "LoaderWorkerError",
    "MainGuardError",
    "PackedIterableDataset",
    "PaddedCollate",
    "SeqDataLoader",
    "SeqDataset",
    "StateError",
    "collate_padded",
]
