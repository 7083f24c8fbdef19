"""Generated benchmark datasets, built once and cached under ``bench/data/`` (gitignored).

Every generator is deterministic (seeded) and writes the same records in three layouts:

- a seqstore store (``seqstore.create`` + ``append_batch``);
- an HDF5 file in RETURNN's layout, as ``SimpleHDFWriter`` makes it: attributes ``numSeqs``,
  ``numTimesteps``, ``inputPattSize``, ``numDims``, ``numLabels``; ``inputs`` (frames, dim);
  ``seqLengths`` int32 (N, 2) (column 1 is the dummy "classes" stream HDFDataset expects when a file
  has no ``targets``; SimpleHDFWriter leaves it 0); ``seqTags`` variable-length str; ``labels``.
  ``seqLengths`` and ``seqTags`` are resizable with h5py's automatic chunks exactly as
  SimpleHDFWriter creates them. ``inputs`` is written contiguous (SimpleHDFWriter's resizable
  dataset gets chunks the shape of the first sequence, e.g. 48 bytes, which makes reads far slower;
  contiguous is the generous choice for the peer);
- a LogIX-style log: ``log_rank_0_chunk_0.mmap`` (records' raw bytes back to back) and
  ``log_rank_0_chunk_0_metadata.json`` (a JSON list, one object per record: ``data_id``, ``path``,
  ``offset``, ``shape``, ``block_size``, ``dtype``), see /work/shared/reference/logix-format.md.

A finished dataset has a ``.done`` marker next to it; an interrupted build is redone.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import DATA

CHUNK = 1_000_000


def _done(path: Path) -> Path:
    return path.with_name(path.name + ".done")


def _fresh(path: Path) -> bool:
    """True if ``path`` must be (re)built; clears a half-built one."""
    if _done(path).exists() and path.exists():
        return False
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    return True


def small_records(n: int, dim: int = 4, max_len: int = 4, seed: int = 0) -> Iterator[tuple[Any, Any, list[str]]]:
    """Yield chunks ``(values float32 (rows, dim), lengths int64 (k,), ids)`` of n small records.

    Lengths are uniform in 1..max_len; ids are ``"seq-%09d"``. Chunks of up to 1e6 records.
    """
    rng = np.random.default_rng(seed)
    for start in range(0, n, CHUNK):
        k = min(CHUNK, n - start)
        lengths = rng.integers(1, max_len + 1, size=k).astype(np.int64)
        values = rng.standard_normal((int(lengths.sum()), dim), dtype=np.float32)
        ids = [f"seq-{i:09d}" for i in range(start, start + k)]
        yield values, lengths, ids


def seqstore_path(kind: str, n: int) -> Path:
    return DATA / kind / f"seqstore-{n}.seqstore"


def hdf_path(kind: str, n: int) -> Path:
    return DATA / kind / f"returnn-{n}.hdf"


def logix_path(kind: str, n: int) -> Path:
    return DATA / kind / f"logix-{n}"


def build_seqstore(path: Path, chunks: Iterator[tuple[Any, Any, list[str]]], dim: int, dtype: str) -> None:
    import seqstore

    with seqstore.create(path, {"x": seqstore.Field(dtype, (None, dim))}, overwrite=True) as w:
        for values, lengths, ids in chunks:
            w.append_batch({"x": (values.astype(dtype, copy=False), lengths)}, ids=ids)


def build_hdf(path: Path, chunks: Iterator[tuple[Any, Any, list[str]]], n: int, dim: int, dtype: str) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs["numTimesteps"] = 0
        f.attrs["inputPattSize"] = dim
        f.attrs["numDims"] = 1
        f.attrs["numLabels"] = dim
        f.attrs["numSeqs"] = 0
        f.create_dataset("labels", (0,), dtype="S5")
        seq_lengths = f.create_dataset("seqLengths", (0, 2), dtype="i", maxshape=(None, None))
        seq_tags = f.create_dataset("seqTags", (0,), dtype=h5py.special_dtype(vlen=str), maxshape=(None,))
        seq_lengths.resize(n, axis=0)
        seq_tags.resize(n, axis=0)
        parts_v, done, frames = [], 0, 0
        for values, lengths, ids in chunks:
            k = len(lengths)
            seq_lengths[done : done + k, 0] = lengths.astype(np.int32)
            seq_tags[done : done + k] = np.array(ids, dtype=object)
            parts_v.append(values.astype(dtype, copy=False))
            done += k
            frames += values.shape[0]
        inputs = f.create_dataset("inputs", (frames, dim), dtype=dtype)
        pos = 0
        for v in parts_v:
            inputs[pos : pos + len(v)] = v
            pos += len(v)
        f.attrs["numSeqs"] = n
        f.attrs["numTimesteps"] = frames


def build_logix(path: Path, chunks: Iterator[tuple[Any, Any, list[str]]], dim: int, dtype: str) -> None:
    """One chunk file + its JSON metadata list (a single module named ``"x"``)."""
    path.mkdir(parents=True)
    meta: list[dict[str, Any]] = []
    offset = 0
    itemsize = np.dtype(dtype).itemsize
    with open(path / "log_rank_0_chunk_0.mmap", "wb") as fh:
        for values, lengths, ids in chunks:
            v = values.astype(dtype, copy=False)
            fh.write(memoryview(np.ascontiguousarray(v)).cast("B"))
            for ln, data_id in zip(lengths.tolist(), ids):
                meta.append(
                    {
                        "data_id": data_id,
                        "path": [["x", "grad"]],
                        "offset": offset,
                        "shape": [[ln, dim]],
                        "block_size": ln * dim,
                        "dtype": np.dtype(dtype).name,
                    }
                )
                offset += ln * dim * itemsize
    with open(path / "log_rank_0_chunk_0_metadata.json", "w") as fh:
        json.dump(meta, fh)


def ensure(kind: str, n: int, systems: tuple[str, ...] = ("seqstore", "hdf", "logix"), *, dim: int = 4,
           max_len: int = 4, dtype: str = "float32") -> dict[str, Path]:
    """Build (once) the small-record dataset of ``n`` records in the requested layouts; return paths."""
    out = {}
    for system in systems:
        if system == "seqstore":
            p = seqstore_path(kind, n)
            if _fresh(p):
                build_seqstore(p, small_records(n, dim, max_len), dim, dtype)
        elif system == "hdf":
            p = hdf_path(kind, n)
            if _fresh(p):
                build_hdf(p, small_records(n, dim, max_len), n, dim, dtype)
        elif system == "logix":
            p = logix_path(kind, n)
            if _fresh(p):
                build_logix(p, small_records(n, dim, max_len), dim, dtype)
        else:
            raise ValueError(system)
        _done(p).touch()
        out[system] = p
    return out


def du(path: Path) -> int:
    """Bytes on disk under ``path`` (file sizes)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
