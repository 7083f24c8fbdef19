"""The combined demo runs end to end on a small corpus and reads every sampled sequence."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import seqstore
from seqstore import Field
from seqstore.data.demo import run_combined_demo


def test_run_combined_demo(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 3000
    lens = rng.integers(10, 200, n)
    with seqstore.create(tmp_path / "c.seqstore", {"features": Field("float16", (None, 4))}) as w:
        w.append_batch({"features": (rng.standard_normal((int(lens.sum()), 4)).astype(np.float16), lens)},
                       ids=[f"utt-{i}" for i in range(n)])
    lines: list[str] = []
    res = run_combined_demo(tmp_path / "c.seqstore", epochs=2, max_frames=4000, out=lines.append)
    assert sum(res["sampling_sizes"].values()) == n // 2
    for ep in res["epochs"]:
        assert ep["sequences"] == n // 2 and ep["batches"] > 0 and ep["batches_per_s"] > 0
    assert any("batches/s" in line for line in lines)


def test_demo_counts_frames_of_the_length_field(tmp_path: Path) -> None:
    """Frames are the rows of the length field, whatever field comes first in the schema."""
    n = 300
    schema = {"spk": Field("int16"), "features": Field("float32", (None, 2))}
    with seqstore.create(tmp_path / "s.seqstore", schema) as w:
        w.append_batch({"spk": np.zeros(n, np.int16), "features": (np.zeros((7 * n, 2), np.float32), np.full(n, 7))})
    res = run_combined_demo(tmp_path / "s.seqstore", epochs=1, max_frames=100, out=lambda line: None)
    ep = res["epochs"][0]
    assert ep["sequences"] == n // 2 and ep["frames"] == 7 * ep["sequences"]
