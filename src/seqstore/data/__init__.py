"""Datasets over stores: one protocol, composition by index arithmetic, streams and batching.

Modules: ``base`` (the :class:`Dataset` protocol, :class:`FilteredDataset` (what ``Dataset.filter``
returns), batch merging), ``store_dataset`` (:class:`StoreDataset`), ``lengths_dataset``
(:class:`LengthsDataset`, virtual records), ``concat`` (:class:`ConcatDataset`, :class:`SliceDataset`),
``combined`` (:class:`CombinedDataset`: per-epoch sampling windows and one ordering over their union),
``meta`` (:class:`MetaDataset`: zip by id through cached row maps), ``filter`` (length filtering: the
kept indices, cached), ``streams`` (shuffle buffer, sampling with replacement), ``batching``
(:func:`batch_indices`, :func:`bucket_batches`), ``records`` (:func:`iter_records`: record by record
from gathered blocks), ``packing`` (:class:`PackedDataset`: documents packed
into fixed-length sequences, lazily; plans in ``_packplan``), ``schedule`` (:class:`MixtureSchedule`,
:class:`MixtureStream`: mixtures whose weights change by stage), ``demo`` (the combined demo run); private helpers
``_lengths`` (lazy lengths views), ``_orders`` (orders with lazily gathered lengths), ``_cache``
(on-disk caches), ``_join`` (the id hash join).
"""

from ._cache import CacheError
from ._lengths import ArrayLengths, ConstantLengths, FuncLengths, LengthsView, as_lengths
from .base import Dataset, FilteredDataset
from .batching import BatchIterator, batch_indices, bucket_batches
from .combined import CombinedDataset, CombinedOrder, weighted_sizes
from .concat import ConcatDataset, SliceDataset
from .lengths_dataset import LengthsDataset
from .meta import MetaDataset
from .packing import PackedDataset, PackedStream
from .records import iter_records
from .schedule import MixtureSchedule, MixtureStream
from .store_dataset import StoreDataset
from .streams import ReplacementSampler, ShuffleBuffer, sample_with_replacement, shuffle_buffer

__all__ = [
    "ArrayLengths", "BatchIterator", "CacheError", "CombinedDataset", "CombinedOrder", "ConcatDataset",
    "ConstantLengths", "Dataset", "FilteredDataset", "FuncLengths", "LengthsDataset", "LengthsView", "MetaDataset",
    "MixtureSchedule", "MixtureStream", "PackedDataset", "PackedStream", "ReplacementSampler", "ShuffleBuffer",
    "SliceDataset", "StoreDataset", "as_lengths", "batch_indices", "bucket_batches", "iter_records",
    "sample_with_replacement", "shuffle_buffer", "weighted_sizes",
]
