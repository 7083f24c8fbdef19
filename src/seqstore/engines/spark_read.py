"""The read side of the ``"seqstore"`` Spark data source: input partitions (one per shard, or record
ranges of a large shard) and the reader that turns each into Arrow record batches built from zero-copy
views of the mapped files (the ids as a string column when asked for).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import SchemaError
from ..interop import to_arrow
from ..schema import Field
from ..store import Store
from .spark_types import import_pyarrow

try:
    from pyspark.sql.datasource import DataSourceReader, InputPartition
    from pyspark.sql.pandas.types import to_arrow_schema
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("seqstore.spark needs pyspark>=4.0 (and Java 17+): pip install 'seqstore[spark]'") from exc

__all__: list[str] = []

#: what an error about too many values (or id bytes) in one Arrow array of a read suggests
_BATCH_HINT = "; lower the batchRecords option"


class _Range(InputPartition):
    """Records ``[start, stop)`` of one shard."""

    def __init__(self, start: int, stop: int) -> None:
        super().__init__((start, stop))
        self.start = start
        self.stop = stop


def _field_array(values: np.ndarray[Any, Any], f: Field, records: int | np.ndarray[Any, Any], arrow_type: Any,
                 what: str) -> Any:
    """A field's values (fixed: ``(r, D)`` rows of ``records`` records; ragged: the rows of records of
    lengths ``records``) as an Arrow column of ``arrow_type``, one array level per axis, its leaves of
    Spark's leaf type."""
    leaf_type = to_arrow.leaf_type(arrow_type, len(f.shape))
    flat = to_arrow.numbers(values.reshape(-1), f.dtype)  # bfloat16 as float32
    if flat.dtype == np.uint64 and flat.size and int(flat.max()) > np.iinfo(np.int64).max:
        bad = int(np.flatnonzero(flat > np.iinfo(np.int64).max)[0])
        raise ValueError(f"{what}: value {int(flat[bad])} does not fit Spark's long (field is uint64)")
    flat = flat.astype(np.dtype(leaf_type.to_pandas_dtype()), copy=False)
    leaves = import_pyarrow().array(np.ascontiguousarray(flat), type=leaf_type)
    return to_arrow.field_lists(leaves, f, records, arrow_type, what=what, hint=_BATCH_HINT)


class SparkReader(DataSourceReader):
    """Pickled to every read task with the store (which reopens there, pinned to the records seen here)."""

    def __init__(self, store: Store, schema: Any, id_column: str | None, partition_records: int,
                 batch_records: int) -> None:
        self.store = store
        self.schema = schema
        self.id_column = id_column
        self.partition_records = partition_records
        self.batch_records = batch_records
        where = f"{store.root}"
        for sf in schema.fields:
            if sf.name != id_column and sf.name not in store.schema:
                ids = f", ids: {id_column!r}" if id_column else ""
                raise SchemaError(f"{where}: the read schema has column {sf.name!r}, which is no field of the "
                                  f"store (fields: {list(store.schema)}{ids})")
        if id_column is not None and id_column in schema.fieldNames() and not store.has_ids:
            raise SchemaError(f"{where}: the read schema has the id column {id_column!r} but the records have no ids")

    def partitions(self) -> list[_Range]:
        table = self.store.manifest.shard_table()
        n = len(self.store)
        starts = np.asarray(table.starts[: self.store.num_shards], dtype=np.int64)
        ends = np.append(starts[1:], n)
        out: list[_Range] = []
        step = self.partition_records
        for s, e in zip(starts.tolist(), ends.tolist()):  # O(shards): Spark keeps a partition per shard anyway
            for a in range(s, e, step):
                out.append(_Range(a, min(e, a + step)))
        return out or [_Range(0, 0)]  # (no shard: Spark would read an empty list as one partition of None)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Range)
        pa = import_pyarrow()
        store = self.store
        arrow_schema = to_arrow_schema(self.schema)
        names = arrow_schema.names
        for a in range(partition.start, partition.stop, self.batch_records):
            b = min(partition.stop, a + self.batch_records)
            arrays = []
            for name in names:
                t = arrow_schema.field(name).type
                what = f"{store.root}, records {a}..{b - 1}, field {name!r}"
                if name == self.id_column:
                    ids_what = f"{store.root}, ids of records {a}..{b - 1}"
                    arrays.append(to_arrow.id_array(store, np.arange(a, b, dtype=np.int64),
                                                    large=pa.types.is_large_string(t), what=ids_what, hint=_BATCH_HINT))
                    continue
                f = store.schema[name]
                if f.ragged:
                    _, values, lengths = next(store.iter_ragged(name, chunk_records=b - a, start=a, stop=b))
                    arrays.append(_field_array(values, f, lengths, t, what))
                else:
                    _, block = next(store.iter_matrix([name], chunk_rows=b - a, start=a, stop=b))
                    arrays.append(_field_array(block, f, b - a, t, what))
            yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
