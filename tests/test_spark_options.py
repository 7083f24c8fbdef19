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
