"""Ray Data integration: ``seqstore.ray.write(ds, path)`` and ``seqstore.ray.read(path)``.

Needs the ``ray`` extra (``pip install 'seqstore[ray]'``); ``import seqstore`` does not import Ray.
The implementation is :mod:`seqstore.engines.ray`; see docs/distributed.md.
"""

from .engines.ray import BFLOAT16_METADATA, block_columns, infer_schema, read, write

__all__ = ["BFLOAT16_METADATA", "block_columns", "infer_schema", "read", "write"]
