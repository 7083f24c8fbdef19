"""Test LogIX logs: deterministic per-example values, written by LogIX's own code or the older AnaLog layout.

Not a test module. ``write_with_logix`` drives LogIX 0.1.1's ``LogSaver`` (LogIX source must be
importable, e.g. ``PYTHONPATH=<unpacked logix-ai wheel>``; it declares Python < 3.11 so it is not
pip-installed). ``write_analog`` writes the older per-(data_id, module) metadata layout by following
that format (AnaLog's writer needs msgpack/lz4 at import, so it is not run). The vendored logs under
``tests/log/data/`` were made with ``python tests/log/logix_gen.py`` (LogIX source on PYTHONPATH).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

MODULES: list[tuple[str, tuple[int, ...]]] = [("fc1", (4, 6)), ("block.0.attn", (8,)), ("head", (3, 3))]

#: (rank, chunk) -> list of (data_id, version); version 1 marks a later duplicate with other values
PLAN: dict[tuple[int, int], list[tuple[str, int]]] = {
    (0, 0): [(f"ex{i}", 0) for i in range(0, 20)],
    (0, 1): [(f"ex{i}", 0) for i in range(20, 35)] + [("ex5", 1)],
    (1, 0): [(f"ex{i}", 0) for i in range(35, 50)] + [("ex21", 1), ("ex0", 1)],
}
EXPECTED_IDS = [f"ex{i}" for i in range(50)]  # first occurrences, in LogIX's (rank, chunk) order
DATA = Path(__file__).resolve().parent / "data"


def values_for(data_id: str, version: int = 0) -> dict[str, np.ndarray[Any, Any]]:
    """The per-module float32 arrays of one record (deterministic in id and version)."""
    seed = int(data_id[2:]) * 10 + version
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in MODULES}


def have_logix() -> bool:
    try:
        import logix.logging.log_saver  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    return True


def write_with_logix(logdir: Path, plan: dict[tuple[int, int], list[tuple[str, int]]] = PLAN) -> None:
    """Write ``plan`` with LogIX's LogSaver: one flush (chunk file) per (rank, chunk), batches of 4."""
    import torch
    from logix.batch_info import BatchInfo
    from logix.logging.log_saver import LogSaver

    logdir.mkdir(parents=True, exist_ok=True)
    paths = [(name, "grad") for name, _ in MODULES]
    state = SimpleNamespace(get_state=lambda name: {"path": paths})
    for rank in sorted({r for r, _ in plan}):
        config = SimpleNamespace(log_dir=str(logdir), num_workers=1, flush_threshold=-1)
        saver = LogSaver(config, state)
        saver.file_prefix = f"log_rank_{rank}_chunk_"  # what get_rank() gives on rank `rank`
        for chunk in sorted(c for r, c in plan if r == rank):
            assert saver.flush_count == chunk
            items = plan[(rank, chunk)]
            for a in range(0, len(items), 4):
                batch = items[a : a + 4]
                info = BatchInfo()
                info.data_id = [d for d, _ in batch]
                vals = [values_for(d, v) for d, v in batch]
                for name, _ in MODULES:
                    info.log[name]["grad"] = torch.from_numpy(np.stack([x[name] for x in vals]))
                saver.buffer_write(info)
            saver._flush_serialized(str(logdir))


def write_analog(logdir: Path, plan: dict[tuple[int, int], list[tuple[str, int]]] = PLAN) -> None:
    """The older AnaLog layout: metadata has one object per (data_id, module) with size/path/offset/shape/dtype."""
    logdir.mkdir(parents=True, exist_ok=True)
    for (rank, chunk), items in plan.items():
        stem = f"log_rank_{rank}_chunk_{chunk}"
        meta = []
        blobs = []
        offset = 0
        for data_id, version in items:
            vals = values_for(data_id, version)
            for name, _ in MODULES:
                arr = vals[name]
                meta.append(
                    {
                        "data_id": data_id,
                        "size": arr.nbytes,
                        "path": [name, "grad"],
                        "offset": offset,
                        "shape": list(arr.shape),
                        "dtype": str(arr.dtype),
                    }
                )
                blobs.append(arr.ravel().view(np.uint8))
                offset += arr.nbytes
        np.concatenate(blobs).tofile(logdir / f"{stem}.mmap")
        (logdir / f"{stem}_metadata.json").write_text(json.dumps(meta, indent=2))


if __name__ == "__main__":
    if not have_logix():
        sys.exit("LogIX source is not importable: put the unpacked logix-ai 0.1.1 wheel on PYTHONPATH")
    import shutil

    for sub in ("logix_0.1.1", "analog"):
        shutil.rmtree(DATA / sub, ignore_errors=True)
    write_with_logix(DATA / "logix_0.1.1")
    write_analog(DATA / "analog")
    print("wrote", sorted(p.name for p in (DATA / "logix_0.1.1").iterdir()))
