"""The parts of :class:`seqstore.Store`, one idea per module; ``store/reader.py`` puts them together.

- :mod:`.shards`: where a record is (shard, row) and the shards' mapped files (``Shard``, the LRU of
  mapped shards); the base every other part builds on.
- :mod:`.readahead`: the byte ranges an access will touch, asked for ahead and waited for through
  the store's :class:`~seqstore.io.source.ByteSource`.
- :mod:`.records`: single records (``store[i]``, ``nested``, iteration) and bfloat16 presentation.
- :mod:`.batches`: many records at once (``get_batch``, ``prefetch``, ``iter_batches``).
- :mod:`.lookup`: ids (``id``, ``ids``, ``index``, ``index_many``, ``index_encoded``).
- :mod:`.matrix`: fixed fields as ``(rows, D)`` matrices (``matrix``, ``iter_matrix``, ``matrix_columns``).
- :mod:`.ragged`: ragged fields as a whole (``Lengths``, ``lengths``, ``iter_ragged``).

The parts are mixins of one class rather than objects the Store calls: ``store[i]`` and
``get_batch`` run with no call layer more than a single class would have.
"""
