"""``seqstore.spark``: the Spark 4 data source ``"seqstore"`` (needs ``pip install 'seqstore[spark]'``).

See :mod:`seqstore.engines.spark` and docs/distributed.md.
"""

from .engines.spark import METADATA_KEY, NAME, DataSource, read, schema_option, spark_schema, write

__all__ = ["DataSource", "write", "read", "spark_schema", "schema_option", "NAME", "METADATA_KEY"]
