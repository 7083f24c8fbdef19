"""Write throughput: fixed 48 KiB records vs raw sequential writes; small ragged records per second.

Fixed group: records of one Field float32 (3, 64, 64) = 48 KiB, written as ``append_batch`` of 256
records (12 MiB) until ``total`` bytes, then ``close()`` (which commits: flush, fsync of every
file, atomic manifest replace, directory fsyncs). The peers write the same bytes with buffered
``file.write`` of the same 12 MiB batches into one file, once ending with ``flush`` + ``os.fsync``
(the fair comparison: seqstore's commit fsyncs) and once without (data left in the page cache).
The batch array is generated once outside the timed part and reused (nothing compresses). Every
process calls ``os.sync()`` before its timed part so earlier runs' dirty pages do not land in it.

Ragged group: records of Field float16 (None, 80) with 10 rows (1.6 KB), via per-record ``append``
and via ``append_batch`` of 1024 records (as a list of arrays, and as a ``(values, lengths)`` pair,
also with string ids); ``close()`` included. Reports records/s; the baseline is the same bytes as
raw batched ``file.write`` + fsync, the disk's ceiling for that many records.

Usage: ``python bench/write.py [--quick] [--repeats R]``. Default: 2 GiB per fixed run, 512,000
batched / 100,000 per-record ragged records (0.8 GB / 0.16 GB), 3 repeats (each run writes and
fsyncs up to 2 GiB; 5 repeats take about 8 minutes here). Quick: 200 MiB, 102,400 / 20,000, 2.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

# Run as ``python bench/x.py`` Python puts bench/ first on sys.path, where files like logging.py
# would shadow the standard library: put the repository root there instead.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.harness import DATA, Case, main_args, print_table, run_cases, section, section_time  # noqa: E402

RECORD_SHAPE = (3, 64, 64)  # float32: 48 KiB
BATCH = 256


def _workdir() -> Path:
    base = DATA / "write"
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=base))


def _fixed_batch():  # type: ignore[no-untyped-def]
    import numpy as np

    return np.random.default_rng(0).standard_normal((BATCH, *RECORD_SHAPE), dtype=np.float32)


def case_fixed_seqstore(total: int) -> dict[str, object]:
    import seqstore

    batch = _fixed_batch()
    n_batches = total // batch.nbytes
    work = _workdir()
    try:
        os.sync()
        with section():
            with seqstore.create(work / "s.seqstore", {"grad": seqstore.Field("float32", RECORD_SHAPE)}) as w:
                for _ in range(n_batches):
                    w.append_batch({"grad": batch})
        nbytes = n_batches * batch.nbytes
    finally:
        shutil.rmtree(work)
    t = section_time()
    return {"MiB_per_s": nbytes / 2**20 / t, "rec_per_s": n_batches * BATCH / t, "MiB": nbytes / 2**20}


def case_fixed_raw(total: int, fsync: bool) -> dict[str, object]:
    batch = _fixed_batch()
    n_batches = total // batch.nbytes
    buf = memoryview(batch).cast("B")
    work = _workdir()
    try:
        os.sync()
        with section():
            with open(work / "raw.bin", "wb") as fh:
                for _ in range(n_batches):
                    fh.write(buf)
                if fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
        nbytes = n_batches * batch.nbytes
    finally:
        shutil.rmtree(work)
    t = section_time()
    return {"MiB_per_s": nbytes / 2**20 / t, "rec_per_s": n_batches * BATCH / t, "MiB": nbytes / 2**20}


def case_ragged(n: int, mode: str, batch: int = 1024) -> dict[str, object]:
    """``mode``: "append" (one call per record), "batch_list" (list of arrays), "batch_pair"
    ((values, lengths)), "batch_pair_ids" (same, with str ids)."""
    import numpy as np

    import seqstore

    rng = np.random.default_rng(0)
    pool = rng.standard_normal((batch, 10, 80)).astype(np.float16)  # reused: records are written, not compared
    records = list(pool)
    values = pool.reshape(-1, 80)
    lengths = np.full(batch, 10, dtype=np.int64)
    ids = [[f"utt-{b * batch + k:09d}" for k in range(batch)] for b in range(n // batch)] if "ids" in mode else None
    schema = {"feat": seqstore.Field("float16", (None, 80))}
    work = _workdir()
    try:
        os.sync()
        with section():
            with seqstore.create(work / "r.seqstore", schema) as w:
                if mode == "append":
                    for i in range(n):
                        w.append({"feat": records[i % batch]})
                else:
                    for b in range(n // batch):
                        if mode == "batch_list":
                            w.append_batch({"feat": records})
                        elif mode == "batch_pair":
                            w.append_batch({"feat": (values, lengths)})
                        else:
                            assert ids is not None
                            w.append_batch({"feat": (values, lengths)}, ids=ids[b])
        written = n if mode == "append" else (n // batch) * batch
    finally:
        shutil.rmtree(work)
    t = section_time()
    return {"rec_per_s": written / t, "MiB_per_s": written * 1600 / 2**20 / t, "records": written}


def case_ragged_raw(n: int, batch: int = 1024) -> dict[str, object]:
    """The ragged records' bytes (n x 1600 B) as raw batched writes + fsync: the disk's ceiling."""
    import numpy as np

    pool = np.random.default_rng(0).standard_normal((batch, 10, 80)).astype(np.float16)
    buf = memoryview(pool).cast("B")
    work = _workdir()
    try:
        os.sync()
        with section():
            with open(work / "raw.bin", "wb") as fh:
                for _ in range(n // batch):
                    fh.write(buf)
                fh.flush()
                os.fsync(fh.fileno())
        written = (n // batch) * batch
    finally:
        shutil.rmtree(work)
    t = section_time()
    return {"rec_per_s": written / t, "MiB_per_s": written * 1600 / 2**20 / t, "records": written}


def main() -> None:
    args = main_args(__doc__.splitlines()[0], default_repeats=3)
    total = (200 << 20) if args.quick else (2 << 30)
    n_append = 20_000 if args.quick else 100_000
    n_batch = 102_400 if args.quick else 512_000
    fixed = "fixed 48 KiB"
    cases = [
        Case("raw_write+fsync", "bench.write:case_fixed_raw", {"total": total, "fsync": True}, fixed, "MiB_per_s"),
        Case("raw_write", "bench.write:case_fixed_raw", {"total": total, "fsync": False}, fixed, "MiB_per_s"),
        Case("seqstore_append_batch", "bench.write:case_fixed_seqstore", {"total": total}, fixed, "MiB_per_s"),
    ]
    rg = "ragged 10x80 f16"
    cases.append(Case("raw_write+fsync", "bench.write:case_ragged_raw", {"n": n_batch}, rg, "rec_per_s"))
    for mode in ("append", "batch_list", "batch_pair", "batch_pair_ids"):
        n = n_append if mode == "append" else n_batch
        cases.append(Case(mode, "bench.write:case_ragged", {"n": n, "mode": mode}, rg, "rec_per_s"))
    name = "write_quick" if args.quick else "write"
    results = run_cases(name, cases, baseline=["raw_write+fsync", "raw_write"], repeats=args.repeats)
    print_table(results, extras=["MiB_per_s", "rec_per_s", "records"])


if __name__ == "__main__":
    main()
