"""The on-disk contract: ``.npy`` headers, the manifest, checksums and id hashing (see docs/format.md)."""

from .manifest import FORMAT_NAME, FORMAT_VERSION, MANIFEST, Manifest, ShardInfo
from .npy import HEADER_BYTES, NpyHeader, read_header, write_header

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "MANIFEST", "Manifest", "ShardInfo", "HEADER_BYTES", "NpyHeader",
           "read_header", "write_header"]
