"""The parts :class:`seqstore.Store` owns, each with its own state (``store/reader.py`` builds them):
:mod:`.shards` (``ShardMap``: index -> shard, row; the mapped shards), :mod:`.readahead` (``ReadPlanner``:
the source's read policy, the byte ranges an access touches, asked for and waited for), :mod:`.runs` and
:mod:`.stream` (``iter_batches`` planned ahead, in runs, or fetched into memory), :mod:`.gather`
(``Gatherer``: records and batches out of the mappings), :mod:`.lookup` (``IdLookup``), :mod:`.matrix`
(``Matrices``), :mod:`.ragged` (``RaggedFields``, ``Lengths``); :mod:`.copy`: the numba copies.
"""
