"""Lhotse import vs Lhotse's own sequential read of the same cuts.

Every case in a fresh process (bench/harness.py), warm page cache (each case reads the manifest and the
feature files once before its pass), data written once under
bench/data/interop/. The ratio column compares throughput (``MB_per_s``, bytes of float32 features per
second): above 1 the import is faster than Lhotse reading the data.

Data (N = 2e4 and 1e5 cuts, ``--quick`` 5e3 and 2e4; memory is checked across the two): a ``cuts.jsonl.gz`` of
feature-only cuts (no recordings), each 50..300 frames of 40 float32 features stored by Lhotse's
``NumpyFilesWriter`` (one ``.npy`` per cut, Lhotse's plain on-disk layout; ``LilcomChunkyWriter`` would
need ``lilcom``), and one supervision with a short text.

- ``seqstore import_lhotse``: ``import_lhotse(manifest, out, features=True)`` (the lazy manifest, every
  cut's ``load_features()``, durations, frames, texts), ``chunk_bytes`` = 8 MiB, in this process, into a
  new path (the previous repeat's store is deleted before the timed pass);
- ``seqstore import_lhotse workers=2``: the same with ``workers=2`` (the manifest's lines cut into runs
  written by a forkserver worker process and this one as parts, one commit); the time includes starting
  the worker; only for manifests of at least ``PARALLEL_MIN_CUTS`` cuts (smaller ones are imported in
  one process whatever ``workers`` is);
- ``Lhotse CutSet + load_features``: ``CutSet.from_jsonl_lazy(manifest)`` iterated, ``cut.load_features()``
  for every cut (what a Lhotse dataset does per cut, without batching or collation).

``peak_private_MB`` (bench/memwatch.py, sampled every 5 ms from another process, so that sampling takes
no time from the measured code): the peak of private memory above the start during the pass, in the
driver; flat in N means memory independent of the manifest's size. ``peak_worker_MB``: the largest peak
of private memory of one worker process (with ``workers``; all of it, its imports of Lhotse and torch
included, as a worker has nothing before the pass).

Usage: ``python bench/_interop_lhotse.py [--quick] [--repeats R]`` (bench/interop.py runs it).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bench.harness import (  # noqa: E402
    DATA,
    Case,
    main_args,
    print_table,
    run_cases,
    section,
    section_time,
)
from bench.memwatch import watch  # noqa: E402

SIZES = (20_000, 100_000)
QUICK_SIZES = (5_000, 20_000)
DIMS = 40
CHUNK_MB = 8


def ensure_lhotse(n: int, seed: int = 0) -> Path:
    """``cuts.jsonl.gz`` of ``n`` feature-only cuts (features in one .npy per cut, by NumpyFilesWriter)."""
    from lhotse import CutSet, MonoCut, NumpyFilesWriter, SupervisionSegment
    from lhotse.features.base import Features

    root = DATA / "interop" / f"lhotse-{n}"
    manifest = root / "cuts.jsonl.gz"
    if manifest.exists():
        return manifest
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def cuts() -> Iterator[Any]:
        with NumpyFilesWriter(root / "feats") as w:
            for i in range(n):
                frames = int(rng.integers(50, 301))
                cid = f"utt{i:08d}"
                key = w.write(cid, rng.standard_normal((frames, DIMS), dtype=np.float32))
                dur = round(frames * 0.01, 2)
                feats = Features(type="fbank", num_frames=frames, num_features=DIMS, frame_shift=0.01,
                                 sampling_rate=16000, start=0.0, duration=dur, storage_type=w.name,
                                 storage_path=str(w.storage_path), storage_key=key)
                sup = SupervisionSegment(f"{cid}-s", cid, 0.0, dur, text=f"transcript of utterance {i}")
                yield MonoCut(cid, start=0.0, duration=dur, channel=0, features=feats, supervisions=[sup])

    tmp = root / "cuts.tmp.jsonl.gz"
    CutSet.from_cuts(cuts()).to_file(tmp)
    tmp.rename(manifest)
    return manifest


def _feature_bytes(manifest: str) -> int:
    from lhotse import CutSet

    return sum(c.num_frames * c.num_features * 4 for c in CutSet.from_jsonl_lazy(manifest))


def _warm(manifest: str) -> None:
    """Read the manifest and every feature file once before the pass, so that every repeat, the first
    included, reads from the page cache (the other size's data may have pushed these out)."""
    buf = bytearray(1 << 20)
    for path in [Path(manifest), *sorted((Path(manifest).parent / "feats").rglob("*.npy"))]:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def case_import(manifest: str, out: str, nbytes: int, workers: int = 1) -> dict[str, object]:
    import lhotse  # noqa: F401 - imported before the pass, as in the Lhotse case (it loads torch)

    from seqstore.interop.lhotse import import_lhotse

    _warm(manifest)
    shutil.rmtree(out, ignore_errors=True)  # the last repeat's store: an import into a new path, not a replacement
    with watch(0.005, workers=workers > 1) as mem, section("pass"):
        store = import_lhotse(manifest, out, features=True, chunk_bytes=CHUNK_MB << 20, workers=workers)
    t = section_time("pass")
    return {"cuts": len(store), "MB_per_s": nbytes / 1e6 / t, "cut_per_s": len(store) / t, **mem}


def case_lhotse_read(manifest: str) -> dict[str, object]:
    from lhotse import CutSet

    _warm(manifest)
    with watch(0.005) as mem, section("pass"):
        n = nbytes = 0
        for cut in CutSet.from_jsonl_lazy(manifest):
            nbytes += cut.load_features().nbytes
            n += 1
    t = section_time("pass")
    return {"cuts": n, "MB_per_s": nbytes / 1e6 / t, "cut_per_s": n / t, **mem}


def run(quick: bool, repeats: int) -> None:
    """Both sizes in one table with ratios (bench/interop.py calls this)."""
    from seqstore.interop.lhotse import PARALLEL_MIN_CUTS

    cases = []
    for n in QUICK_SIZES if quick else SIZES:
        manifest = str(ensure_lhotse(n))
        g = f"lhotse N={n:.0e}"
        nbytes = _feature_bytes(manifest)
        for workers in (1, 2) if n >= PARALLEL_MIN_CUTS else (1,):  # below it workers=2 is one process too
            cases.append(Case("seqstore import_lhotse" + (f" workers={workers}" if workers > 1 else ""),
                              "bench._interop_lhotse:case_import",
                              {"manifest": manifest, "out": str(DATA / "interop" / f"lhotse-{n}.seqstore"),
                               "nbytes": nbytes, "workers": workers}, group=g, metric="MB_per_s"))
        cases.append(Case("Lhotse CutSet + load_features", "bench._interop_lhotse:case_lhotse_read",
                          {"manifest": manifest}, group=g, metric="MB_per_s"))
    res = run_cases("interop_lhotse", cases, repeats=repeats, baseline="Lhotse CutSet + load_features")
    print_table(res, extras=["cuts", "MB_per_s", "cut_per_s", "peak_private_MB", "peak_worker_MB"])


def main() -> None:
    args = main_args(__doc__.splitlines()[0], default_repeats=3)
    t0 = time.perf_counter()
    run(args.quick, args.repeats)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
