"""Byte access below the store: where a store's bytes live (:class:`ByteSource`: a local directory,
or object storage through the node cache; :func:`open_source` picks one), mappings that hold no
file descriptor, read-ahead of exactly the pages a known access will touch, and the look-ahead loop
that keeps the next batches' reads in flight; :class:`StoreOptions`, how a store is opened, parsed once.

Layering: ``format`` -> ``io`` -> ``store``. Nothing here knows about records or batches.
"""

from .advice import any_cold, page_runs, willneed, willneed_span
from .ahead import lookahead
from .mapping import PAGE, address, holds_descriptors, map_file
from .options import StoreOptions
from .source import ByteSource, ReadPolicy
from .sources import open_source

__all__ = [
    "PAGE", "ByteSource", "ReadPolicy", "StoreOptions", "address", "any_cold", "holds_descriptors", "lookahead",
    "map_file", "open_source", "page_runs", "willneed", "willneed_span",
]
