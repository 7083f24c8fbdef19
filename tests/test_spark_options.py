"""The Spark data source's option parsing (seqstore.engines.spark_options): no SparkSession needed."""

from __future__ import annotations

import pytest

import seqstore as ss
from seqstore.engines.spark_options import given_schema


@pytest.mark.parametrize("raw", ['{"c": []}', '{"c": ["float16", 3]}', '{"c": {"dtype": "float16", "shape": 3}}',
                                 '{"c": ["float16", [null], 1]}'])
def test_a_malformed_schema_option_is_a_schema_error_naming_the_option(raw: str) -> None:
    with pytest.raises(ss.SchemaError, match=r"W: option schema: .*'c'"):
        given_schema({"schema": raw}, "W")
    with pytest.raises(ss.SchemaError, match="W: option schema: "):  # a packed field's columns of the wrong kind
        given_schema({"schema": '{"c": {"dtype": "f2", "shape": [4], "group": "g", "columns": ["a", 4]}}'}, "W")
    assert given_schema({"schema": '{"c": ["float16", [null, 4]]}'}, "W") == ss.Schema(
        {"c": ss.Field("float16", (None, 4))})


def test_a_column_whose_seqstore_metadata_is_malformed_gets_the_field_its_type_gives() -> None:
    pytest.importorskip("pyspark", minversion="4.0")
    from pyspark.sql import types as T

    from seqstore.engines.spark_types import FIELD_METADATA_KEY, write_plan

    meta = {FIELD_METADATA_KEY: '{"dtype": "float32", "shape": 3}'}  # a shape that is not a list
    df_schema = T.StructType([T.StructField("c", T.ArrayType(T.FloatType()), False, metadata=meta)])
    schema, _, _ = write_plan("/nowhere", df_schema, {}, None)
    assert schema["c"] == ss.Field("float32", (None,))
