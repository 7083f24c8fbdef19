"""Distributed engines that write one store in parallel and read stores back.

* :mod:`seqstore.engines.ray` (public as :mod:`seqstore.ray`, extra ``seqstore[ray]``): a Ray Data
  ``Datasink`` (``seqstore.ray.write``) and ``Datasource`` (``seqstore.ray.read``); ``ray_types``
  infers fields from Arrow/Ray types and converts blocks.
* :mod:`seqstore.engines.spark` (public as :mod:`seqstore.spark`, extra ``seqstore[spark]``): a
  Spark 4 Python data source (``format("seqstore")``); ``spark_options`` parses its options,
  ``spark_types`` maps types both ways, ``spark_read`` holds the read tasks.

Each write task writes its own uncommitted shards (:mod:`seqstore.store.parts`); the driver commits
the parts the engine reports with one manifest commit, so rows appear all at once or not at all.
This package imports no engine: ``import seqstore`` never imports Ray or PySpark.
"""
