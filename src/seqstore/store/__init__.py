"""Stores: the writer (append, commit) and the reader (open, records, ids, lengths)."""

from .read.stream import Pool
from .reader import Lengths, Store, open_store
from .write.api import append_to, create
from .write.writer import Writer

__all__ = ["Lengths", "Pool", "Store", "Writer", "append_to", "create", "open_store"]
