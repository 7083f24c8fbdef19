"""Byte access below the store: mappings that hold no file descriptor, read-ahead of exactly the
pages a known access will touch, and the look-ahead loop that keeps the next batches' reads in flight.

Layering: ``format`` -> ``io`` -> ``store``. Nothing here knows about schemas or shards.
"""

from .advice import any_cold, page_runs, willneed, willneed_span
from .ahead import lookahead
from .mapping import PAGE, address, holds_descriptors, map_file

__all__ = [
    "PAGE",
    "address",
    "any_cold",
    "holds_descriptors",
    "lookahead",
    "map_file",
    "page_runs",
    "willneed",
    "willneed_span",
]
