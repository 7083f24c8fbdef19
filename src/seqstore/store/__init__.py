"""Stores: the writer (append, commit) and the reader (open, records, ids, lengths)."""

from .reader import Lengths, Store, open_store
from .writer import Writer, append_to, create

__all__ = ["Lengths", "Store", "Writer", "append_to", "create", "open_store"]
