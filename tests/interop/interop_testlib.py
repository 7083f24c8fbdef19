"""Helpers of the interop tests: RETURNN HDF files written by RETURNN's own SimpleHDFWriter, small stores."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

import seqstore
from seqstore import Field


def write_returnn_hdf(
    path: Path, *, n: int, dim: int | None = 5, vocab: int = 30, seed: int = 0, prefix: str = "corpus/seq"
) -> dict[str, Any]:
    """Write ``n`` sequences with RETURNN's SimpleHDFWriter, one sequence per insert_batch (the
    writer does not cut extras by length). Dense float32 inputs of ``dim`` (or sparse int32 inputs
    over ``vocab`` when ``dim`` is None) plus targets: ``classes`` (int32, own length), ``align``
    (float32 rows of 3, own length) and ``spk`` (one int32 per sequence). Returns the expected data."""
    from returnn.datasets.hdf import SimpleHDFWriter

    rng = np.random.default_rng(seed)
    if path.exists():
        os.remove(path)
    w = SimpleHDFWriter(str(path), dim=vocab if dim is None else dim, ndim=1 if dim is None else 2)
    exp: dict[str, Any] = {"tags": [], "data": [], "classes": [], "align": [], "spk": []}
    for i in range(n):
        t = int(rng.integers(1, 12))
        if dim is None:
            x = rng.integers(0, vocab, (t,)).astype("int32")
        else:
            x = rng.standard_normal((t, dim)).astype("float32")
        c = rng.integers(0, 40, (int(rng.integers(0, 6)),)).astype("int32")
        a = rng.standard_normal((int(rng.integers(1, 4)), 3)).astype("float32")
        spk = np.array([i % 7], dtype="int32")
        tag = f"{prefix}-{seed}-{i}"
        w.insert_batch(x[None], [t], [tag], extra={"classes": c[None], "align": a[None], "spk": spk})
        for k, v in (("tags", tag), ("data", x), ("classes", c), ("align", a), ("spk", spk)):
            exp[k].append(v)
    w.close()
    return exp


def make_store(path: Path, *, n: int, seed: int = 0, ids: bool = True) -> dict[str, Any]:
    """A native store: ``data`` (None, 3) float32, ``classes`` (None,) int64, ``speaker`` int32 scalar."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, n)
    data = [rng.standard_normal((int(t), 3)).astype("float32") for t in lengths]
    classes = [rng.integers(0, 50, int(rng.integers(0, 9))) for _ in range(n)]
    speaker = rng.integers(0, 100, n).astype("int32")
    tags = [f"utt-{i:05d}" for i in range(n)]
    schema = {"data": Field("float32", (None, 3)), "classes": Field("int64", (None,)), "speaker": Field("int32")}
    with seqstore.create(path, schema) as w:
        w.append_batch({"data": data, "classes": classes, "speaker": speaker}, ids=tags if ids else None)
    return {"data": data, "classes": classes, "speaker": speaker, "tags": tags, "lengths": lengths}
