"""seqstore: columnar memory-mapped training data and lazy epoch orders at 1e8-1e10 examples.

A process's memory does not grow with the number of examples: stores open in constant time and
are memory-mapped; epoch orders are computed on demand.
"""

from .data import (
    CombinedDataset,
    ConcatDataset,
    Dataset,
    FilteredDataset,
    LengthsDataset,
    MetaDataset,
    MixtureStream,
    PackedDataset,
    SliceDataset,
    StoreDataset,
    batch_indices,
    bucket_batches,
    sample_with_replacement,
    shuffle_buffer,
)
from .errors import CorruptionError, FormatError, LockError, SchemaError, SeqstoreError
from .log import Logger, similarity
from .order import Order, seq_order, sort_index
from .schema import Field, PackedGroup, Schema, bfloat16_to_float32, float32_to_bfloat16
from .store import Lengths, Store, Writer
from .store import open_store as open  # noqa: A001 - the public name is seqstore.open
from .store.copy import copy
from .store.writer import append_to, create

__version__ = "0.1.0"

__all__ = ["CombinedDataset", "ConcatDataset", "Dataset", "FilteredDataset", "LengthsDataset", "MetaDataset",
           "MixtureStream", "PackedDataset", "SliceDataset", "StoreDataset", "batch_indices", "bucket_batches",
           "sample_with_replacement", "shuffle_buffer", "CorruptionError", "Field", "FormatError", "Lengths", "Logger",
           "PackedGroup", "Order", "LockError", "Schema", "SchemaError", "SeqstoreError", "Store", "Writer",
           "append_to", "bfloat16_to_float32", "copy", "create", "float32_to_bfloat16", "open", "seq_order",
           "similarity", "sort_index", "__version__"]
