"""``seqstore info``: the length bars end at 100% and stay (they were cleared before they were drawn
complete)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
from seqstore import cli


def test_info_length_bars_reach_100_percent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.seqstore"
    with ss.create(path, {"a": ss.Field("int32", (None,)), "b": ss.Field("uint8", (None,))}, shard_bytes=4096) as w:
        for i in range(3000):
            w.append({"a": np.arange(i % 7, dtype=np.int32), "b": np.zeros(i % 3, np.uint8)})
    assert cli.main(["info", str(path)]) == 0
    err = capsys.readouterr().err
    for field in ("a", "b"):
        final = [m for m in re.findall(rf"lengths of {field}:[^\r\n]*", err)]
        assert final and "100%" in final[-1] and "3.00k/3.00k" in final[-1], err
