"""MosaicML Streaming as a peer of ``bench/remote.py``, run by the interpreter of ``bench/.venv-streaming``.

Streaming pins ``numpy<2.2`` and pulls torchvision, transformers and the cloud SDKs; installed into
the project's venv it would downgrade numpy under the bench. So ``bench/remote.py`` installs it into
a venv of its own (:func:`install`): ``mosaicml-streaming`` with ``--no-deps``, then only what
importing ``streaming.base`` and reading from S3 need (``numpy<2.2``, ``torch==2.13.0`` (the CPU
wheel, as the project pins it), ``boto3``, ``xxhash<4``, ``zstd<2``, ``brotli``,
``python-snappy<1``, ``tqdm``, ``catalogue<3``, ``transformers<5``, ``pillow``). Streaming's
top-level ``streaming/__init__.py`` imports ``streaming.vision``, which imports torchvision, whose
PyPI wheels are CUDA builds that fail to load next to the CPU torch ("operator torchvision::nms does
not exist"); torchvision is not installed and :func:`_import_streaming` imports the package
``streaming.base`` (``StreamingDataset``, ``MDSWriter``: the real code, nothing replaced) under an
empty parent package, so the vision, text and multimodal example datasets are never imported.

This file is run as a script by that venv's Python (no seqstore import: seqstore is not installed
there); it imports ``bench.cold`` for the generator of the same values as the other layouts.
Commands (JSON result on the last line of stdout):

- ``build --kind K --n N --out DIR``: write the data set as MDS shards (one column ``x``:
  ``ndarray:float32:512`` for ``fixed``, ``ndarray:float16`` with a per-sample shape for ``ragged``;
  Streaming's default shard size limit, no compression);
- ``random --remote s3://... --local DIR --indices FILE.npy --batch B --kind K``: ``dataset[i]`` of
  the given positions in batches (each batch's values concatenated as the other readers return them);
- ``epoch --remote ... --local DIR --kind K [--limit R]``: iterate the data set with its shuffle
  (``shuffle=True``, ``py1e``, seed 3) single-process, as a training loop would.

The S3 endpoint and keys come from the environment (``S3_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / "bench" / ".venv-streaming"
PYTHON = VENV / "bin" / "python"
PACKAGES = [
    "numpy<2.2",
    "torch==2.13.0",
    "boto3",
    "xxhash<4",
    "zstd<2",
    "brotli",
    "python-snappy<1",
    "tqdm",
    "catalogue<3",
    "transformers<5",
    "pillow",
]
STREAMING = "mosaicml-streaming==0.13.0"


def install(log: Any = sys.stderr) -> Path | None:
    """Create ``bench/.venv-streaming`` with Streaming if it is missing; its Python, or None (with the
    reason printed) where it cannot be installed."""
    return install_venv(VENV, [["--no-deps", STREAMING], PACKAGES],
                        "from bench._remote_streaming import _import_streaming; _import_streaming()", STREAMING, log)


def install_venv(venv: Path, steps: list[list[str]], check: str, what: str, log: Any = sys.stderr) -> Path | None:
    """A peer's own venv at ``venv``: created if missing, then ``pip install -q`` of each step in turn,
    unless the Python code ``check`` (run there with the repository on ``sys.path``) already succeeds.
    Its Python, or None with the reason printed."""
    python = venv / "bin" / "python"
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); {check}"

    def importable() -> bool:
        return subprocess.run([str(python), "-c", code], capture_output=True).returncode == 0

    if python.exists() and importable():
        return python
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        print(f"installing {what} into {venv} (once) ...", file=log, flush=True)
        for step in steps:
            subprocess.run([str(python), "-m", "pip", "install", "-q", *step], check=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"{what}: install failed: {exc}", file=log, flush=True)
        return None
    return python if importable() else None


def _import_streaming() -> Any:
    """``streaming.base`` without ``streaming/__init__.py`` (see the module docstring)."""
    if "streaming" not in sys.modules:
        spec = importlib.util.find_spec("streaming")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("mosaicml-streaming is not installed")
        pkg = types.ModuleType("streaming")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["streaming"] = pkg
    import streaming.base as base

    return base


def _smaps_mib() -> tuple[float, float]:
    priv = anon = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                priv += int(line.split()[1])
            elif line.startswith("Anonymous:"):
                anon += int(line.split()[1])
    return priv / 1024, anon / 1024


def build(kind: str, n: int, out: Path) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from bench.cold import gen_chunks

    base = _import_streaming()
    columns = {"x": "ndarray:float32:512" if kind == "fixed" else "ndarray:float16"}
    t0 = time.perf_counter()
    with base.MDSWriter(out=str(out), columns=columns) as w:
        for values, lengths in gen_chunks(kind, n):
            if lengths is None:
                for row in values:
                    w.write({"x": row})
            else:
                pos = 0
                for k in lengths.tolist():
                    w.write({"x": values[pos : pos + k]})
                    pos += k
    return {"seconds": time.perf_counter() - t0}


def _dataset(remote: str, local: str, shuffle: bool) -> Any:
    base = _import_streaming()
    return base.StreamingDataset(
        remote=remote, local=local, shuffle=shuffle, shuffle_seed=3, batch_size=1024, download_timeout=600
    )


def _check(kind: str, out: Any) -> float:
    import numpy as np

    if kind == "fixed":
        return float(np.dot(np.arange(1, len(out) + 1), out.sum(axis=1, dtype=np.float64)))
    values, lengths = out
    return float(values.sum(dtype=np.float64)) + float(np.dot(np.arange(1, len(lengths) + 1), lengths))


def read_random(remote: str, local: str, indices: str, batch: int, kind: str) -> dict[str, Any]:
    import numpy as np

    idx = np.load(indices)
    ds = _dataset(remote, local, shuffle=False)
    check = 0.0
    asked = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    t1 = 0.0
    for lo in range(0, len(idx), batch):
        part = idx[lo : lo + batch].tolist()
        samples = [ds[i]["x"] for i in part]
        if kind == "fixed":
            got: Any = np.stack(samples)
            asked += got.nbytes
        else:
            got = (np.concatenate(samples), np.array([len(s) for s in samples], dtype=np.int64))
            asked += got[0].nbytes
        check += _check(kind, got)
        if not t1:
            t1 = time.perf_counter()
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    priv, anon = _smaps_mib()
    return {
        "seconds": dt,
        "cpu_s": cpu,
        "records": len(idx),
        "asked_bytes": asked,
        "checksum": check,
        "first_seconds": t1 - t0,
        "first_records": min(batch, len(idx)),
        "private_mib": priv,
        "anon_mib": anon,
    }


def read_epoch(remote: str, local: str, kind: str, limit: int | None) -> dict[str, Any]:
    ds = _dataset(remote, local, shuffle=True)
    nbytes = 0
    records = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    t1, first = 0.0, 0
    for sample in ds:
        nbytes += sample["x"].nbytes
        records += 1
        if records == 1024:  # a first batch's worth
            t1, first = time.perf_counter(), nbytes
        if limit is not None and records >= limit:
            break
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    priv, anon = _smaps_mib()
    return {
        "seconds": dt,
        "cpu_s": cpu,
        "records": records,
        "asked_bytes": nbytes,
        "first_seconds": (t1 or t0) - t0,
        "first_bytes": first,
        "private_mib": priv,
        "anon_mib": anon,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--kind", required=True)
    b.add_argument("--n", type=int, required=True)
    b.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("random")
    r.add_argument("--remote", required=True)
    r.add_argument("--local", required=True)
    r.add_argument("--indices", required=True)
    r.add_argument("--batch", type=int, default=1024)
    r.add_argument("--kind", required=True)
    e = sub.add_parser("epoch")
    e.add_argument("--remote", required=True)
    e.add_argument("--local", required=True)
    e.add_argument("--kind", required=True)
    e.add_argument("--limit", type=int, default=None)
    args = p.parse_args()
    real = os.dup(1)
    os.dup2(2, 1)  # whatever the libraries print goes to stderr; stdout carries the result
    if args.cmd == "build":
        out = build(args.kind, args.n, args.out)
    elif args.cmd == "random":
        out = read_random(args.remote, args.local, args.indices, args.batch, args.kind)
    else:
        out = read_epoch(args.remote, args.local, args.kind, args.limit)
    os.write(real, (json.dumps(out) + "\n").encode())


if __name__ == "__main__":
    main()
