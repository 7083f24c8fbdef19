"""Per-example logging: a training-time writer, similarity scans, and import of LogIX logs.

- :class:`Logger`: ``log(ids, {"layer1": {"grad": g}})`` from a training loop; a background thread
  writes packed shards and commits them crash-safely (docs/logging.md).
- :func:`similarity`: scores of every logged record against query vectors, one GEMM per chunk, on
  CPU (numpy BLAS) or CUDA (torch); all scores, top-k per query, per-field scores.
- :func:`import_logix`: converts a LogIX / AnaLog log directory into a store, chunk by chunk.

A log is an ordinary store: read it with ``seqstore.open(path)`` (``store[i]``, ``store.nested(i)``,
``store.index(id)``, ``store.matrix(...)``).
"""

from .logger import DUPLICATE_POLICIES, DuplicateIdError, Logger, LoggerCommitError, LoggerError, default_packing
from .logix import import_logix
from .similarity import SimilarityResult, similarity

__all__ = ["DUPLICATE_POLICIES", "DuplicateIdError", "Logger", "LoggerCommitError", "LoggerError", "SimilarityResult",
           "default_packing", "import_logix", "similarity"]
