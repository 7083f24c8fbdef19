"""Per-example logging side by side with LogIX 0.1.1's own writer and loader; CPU similarity vs np.dot.

Records: 3 modules x float32 (64, 64) gradients (48 KiB per record), string ids ``ex-000000000``.
A pool of 16 batches of 64 records is generated once per process (outside the timed part) and
cycled; every batch gets new ids. Cases, each run in a fresh process (bench/harness.py):

- ``write``: seqstore ``Logger`` (defaults: two 64 MiB page-aligned buffers written with direct I/O
  by a background thread, packed layout) logging batches of 64 torch CPU tensors, then ``close()``
  (commit: fsync + atomic manifest). LogIX: ``LogSaver.buffer_write`` per batch + ``flush()``
  (flush_threshold = 16 Mi elements = the same 64 MiB, one worker as LogIX's default) +
  ``finalize()``; each flush writes a ``np.memmap`` and calls its ``flush()`` (msync, so LogIX's data
  is on disk too; its JSON metadata is not fsynced). Imports and the batch pool are made before the
  timed part, for both. A second seqstore row (``write_nofsync``) shows the time without fsyncs.
- ``metadata``: bytes per record that are not tensor data. seqstore: ``manifest.json`` + the id files
  (``_ids*.npy``: id bytes, offsets, sorted hashes and rows) + ``.npy`` headers. LogIX: the
  ``*_metadata.json`` files.
- ``reopen``: ``seqstore.open(path)`` + ``store[0]``, vs LogIX ``LogDataset(logdir, flatten=False)`` +
  ``ds[0]``; time and RSS growth (page cache warm for both).
- ``reads``: 1,000 random records by position, warm (the second pass over the same rows; the first
  pass, which maps the pages into the process, is ``reads_first``; both logs are read into the page
  cache once before the read cases, since seqstore's direct I/O leaves nothing cached). A read gives the record's
  tensors as owned arrays: seqstore ``store.nested(i, copy=True)`` (one copy of the record's packed
  row, fields are views of it), LogIX ``ds[i]`` (one clone of the record, fields are views of it).
  Also shown: ``reads_views``, seqstore's zero-copy ``store.nested(i)`` (LogIX has no such read: its
  ``ds[i]`` again), and ``reads_touch``, each system's read followed by a numpy sum of every value.
- ``lookups``: 1,000 random ids -> record: seqstore ``store.index(id)`` per id and ``index_many``
  for all; LogIX: its in-memory dict built at load (``ds.data_id_to_chunk[id]``). Not a goal, shown
  for completeness: LogIX pays for its dict in ``reopen``.
- ``similarity`` (N = 1e4, Q = 128 queries over the whole 12,288-dim rows): ``seqstore.log.similarity``
  on the log (zero-copy mapped chunks) vs one ``np.dot`` of the same matrix already in RAM; the
  metric is GFLOP/s.

LogIX's source must be importable: ``LOGIX_SRC=/path/to/unpacked/logix_ai-0.1.1 python bench/logs.py``
(or put it on PYTHONPATH); it needs ``einops`` and ``pyyaml``. Without it the LogIX cases are skipped
(one ``skipped:`` line says how to enable them) and the seqstore cases and the similarity run alone.
Logs are generated once under ``bench/data/logging/`` (about 5 GB per system at N = 1e5). Usage:
``python bench/logs.py [--quick] [--repeats R]``; quick: N = 1e4 only, 2 repeats.
"""

from __future__ import annotations

import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys
import tempfile  # noqa: E402
from pathlib import Path
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import DATA, Case, lookup, main_args, print_table, run_cases, section, section_time  # noqa: E402

MODULES = ["fc1", "fc2", "fc3"]
SHAPE = (64, 64)
BATCH = 64
POOL = 16
NS = (10_000, 100_000)
# LogIX flushes its buffer when it holds more than this many elements: 16 Mi float32 = 64 MiB, the
# size of one seqstore Logger buffer (LogIX's own default, 1e9 elements, would hold 1e5 records in RAM)
LOGIX_FLUSH_ELEMENTS = 16 << 20
QUICK_NS = (10_000,)


def _logix_on_path() -> None:
    src = os.environ.get("LOGIX_SRC")
    if src and src not in sys.path:
        sys.path.insert(0, src)


#: One line saying how to compare with LogIX when it cannot be imported.
LOGIX_HOW = (
    "LogIX 0.1.1 declares Python < 3.11, so it is not pip-installed; to compare with it set "
    "LOGIX_SRC=/path/to/unpacked/logix_ai-0.1.1 (it needs einops and pyyaml)"
)


def logix_missing() -> str | None:
    """None when LogIX's writer and loader import (from LOGIX_SRC or the path), else why not."""
    _logix_on_path()
    try:
        import logix.logging.log_loader  # noqa: F401
        import logix.logging.log_saver  # noqa: F401
    except Exception as exc:  # ImportError, or a failure inside LogIX's own imports
        return f"{type(exc).__name__}: {exc}"
    return None


def _pool() -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    return [{m: torch.randn(BATCH, *SHAPE, generator=g) for m in MODULES} for _ in range(POOL)]


def _ids(b: int) -> list[str]:
    return [f"ex-{b * BATCH + k:09d}" for k in range(BATCH)]


def _workdir() -> Path:
    base = DATA / "logging" / "tmp"
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=base))


def _du(path: Path, pred: Any) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and pred(p))


# ------------------------------------------------------------------------------------------ writers


def _setup(system: str) -> list[Any]:
    """Import the system's writer and build the batch pool: done before the timed part."""
    if system == "seqstore":
        import seqstore.log  # noqa: F401
    else:
        _logix_on_path()
        import logix.logging.log_saver  # noqa: F401
    return _pool()


def write_seqstore(path: str, n: int, fsync: bool = True, pool: list[Any] | None = None) -> None:
    import seqstore.store.writer as writer_mod
    from seqstore.log import Logger

    pool = pool if pool is not None else _setup("seqstore")
    if not fsync:  # measurement aid only: what the commit's fsyncs cost on this disk
        os.fsync = lambda fd: None  # type: ignore[assignment]
        writer_mod.fsync_dir = lambda p: None  # type: ignore[assignment]
    with Logger(path) as lg:  # defaults: 64 MiB buffers, direct I/O, background thread, packed layout
        for b in range(n // BATCH):
            t = pool[b % POOL]
            lg.log(_ids(b), {m: {"grad": t[m]} for m in MODULES})


def write_logix(path: str, n: int, pool: list[Any] | None = None) -> None:
    from types import SimpleNamespace

    pool = pool if pool is not None else _setup("logix")
    from logix.batch_info import BatchInfo
    from logix.logging.log_saver import LogSaver

    os.makedirs(path, exist_ok=True)
    paths = [(m, "grad") for m in MODULES]
    config = SimpleNamespace(log_dir=path, num_workers=1, flush_threshold=LOGIX_FLUSH_ELEMENTS)
    saver = LogSaver(config, SimpleNamespace(get_state=lambda name: {"path": paths}))
    for b in range(n // BATCH):
        info = BatchInfo()
        info.data_id = _ids(b)
        t = pool[b % POOL]
        for m in MODULES:
            info.log[m]["grad"] = t[m]
        saver.buffer_write(info)
        saver.flush()
    saver.finalize()


def _prepared(system: str, n: int) -> Path:
    """The log of ``system`` with ``n`` records under bench/data/logging/ (written once, in a child)."""
    path = DATA / "logging" / f"{system}-{n}"
    done = path / ".complete"
    if not done.exists():
        shutil.rmtree(path, ignore_errors=True)
        code = f"import bench.logs as b; b.write_{system}({str(path)!r}, {n})"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")])
        subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=Path(__file__).resolve().parent.parent)
        done.touch()
    _into_page_cache(path)
    return path


def _into_page_cache(path: Path) -> None:
    """Read every file of a log once, so that both systems' logs are in the page cache when the read
    cases start (seqstore writes with direct I/O, which leaves nothing cached; LogIX's writes do)."""
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb", buffering=0) as f:
                while f.read(16 << 20):
                    pass


# -------------------------------------------------------------------------------------------- cases


def case_write_seqstore(n: int, fsync: bool = True) -> dict[str, object]:
    work = _workdir()
    pool = _setup("seqstore")
    try:
        os.sync()
        with section():
            write_seqstore(str(work / "log"), n, fsync=fsync, pool=pool)
        meta = _du(work / "log", lambda p: p.name == "manifest.json" or p.name.startswith("_ids"))
        headers = 128 * sum(1 for p in (work / "log").rglob("*.npy") if not p.name.startswith("_ids"))
    finally:
        shutil.rmtree(work)
    t = section_time()
    return {"rec_per_s": n / t, "meta_B_per_rec": (meta + headers) / n}


def case_write_logix(n: int) -> dict[str, object]:
    work = _workdir()
    pool = _setup("logix")
    try:
        os.sync()
        with section():
            write_logix(str(work / "log"), n, pool=pool)
        meta = _du(work / "log", lambda p: p.name.endswith("_metadata.json"))
    finally:
        shutil.rmtree(work)
    t = section_time()
    return {"rec_per_s": n / t, "meta_B_per_rec": meta / n}


def case_reopen_seqstore(path: str) -> dict[str, object]:
    import numpy as np

    import seqstore

    with section("reopen"):
        st = seqstore.open(path)
        first = {k: np.array(v) for k, v in st[0].items()}
    return {"records": len(st), "check": float(sum(v.sum() for v in first.values()))}


def case_reopen_logix(path: str) -> dict[str, object]:
    _logix_on_path()
    from logix.logging.log_loader import LogDataset

    with section("reopen"):
        ds = LogDataset(path, flatten=False)
        _, first = ds[0]
    return {"records": len(ds), "check": float(sum(v["grad"].sum() for v in first.values()))}


def _random_rows(n: int) -> list[int]:
    import numpy as np

    return np.random.default_rng(1).integers(0, n, 1000).tolist()


def _touch(rec: dict[str, Any]) -> float:
    """Read every value of a record (the same numpy reduction for both systems)."""
    import numpy as np

    return sum(float(np.asarray(rec[m]["grad"]).sum()) for m in MODULES)


def case_reads_seqstore(path: str) -> dict[str, object]:
    import seqstore

    st = seqstore.open(path)
    rows = _random_rows(len(st))
    total = 0.0
    for name in ("reads_first", "reads"):  # first pass: maps and faults pages in; second: warm
        with section(name):
            for i in rows:
                rec = st.nested(i, copy=True)  # owned arrays: one copy of the record's packed row
                total += float(rec["fc1"]["grad"][0, 0])
    with section("reads_views"):
        for i in rows:
            rec = st.nested(i)  # zero-copy views into the mapped file
            total += float(rec["fc1"]["grad"][0, 0])
    with section("reads_touch"):
        for i in rows:
            total += _touch(st.nested(i))
    return {"us_per_read": section_time("reads") / len(rows) * 1e6, "check": total}


def case_reads_logix(path: str) -> dict[str, object]:
    _logix_on_path()
    from logix.logging.log_loader import LogDataset

    ds = LogDataset(path, flatten=False)
    rows = _random_rows(len(ds))
    total = 0.0
    for name in ("reads_first", "reads", "reads_views"):  # LogIX has one read: a clone of the record
        with section(name):
            for i in rows:
                _, rec = ds[i]
                total += float(rec["fc1"]["grad"][0, 0])
    with section("reads_touch"):
        for i in rows:
            total += _touch(ds[i][1])
    return {"us_per_read": section_time("reads") / len(rows) * 1e6, "check": total}


def case_lookups_seqstore(path: str) -> dict[str, object]:
    import seqstore

    st = seqstore.open(path)
    ids = [f"ex-{i:09d}" for i in _random_rows(len(st))]
    st.index(ids[0])  # loads the numba kernels from their cache (one-time, per process)
    st.index_many(ids[:2])
    with section("lookups"):
        rows = [st.index(i) for i in ids]
    with section("index_many"):
        many = st.index_many(ids)
    assert rows == many.tolist()
    return {"us_per_lookup": section_time("lookups") / len(ids) * 1e6}


def case_lookups_logix(path: str) -> dict[str, object]:
    _logix_on_path()
    from logix.logging.log_loader import LogDataset

    ds = LogDataset(path, flatten=False)
    ids = [f"ex-{i:09d}" for i in _random_rows(len(ds))]
    with section("lookups"):
        found = [ds.data_id_to_chunk[i][1]["offset"] for i in ids]
    return {"us_per_lookup": section_time("lookups") / len(ids) * 1e6, "check": len(found)}


def _queries(d: int) -> Any:
    import numpy as np

    return np.random.default_rng(2).standard_normal((128, d)).astype(np.float32)


def case_similarity_seqstore(path: str) -> dict[str, object]:
    import seqstore
    from seqstore.log import similarity

    st = seqstore.open(path)
    q = _queries(st.matrix_columns()["fc3/grad"][1])
    similarity(st, q[:2], chunk_rows=4096)  # touch the pages once: the page cache is warm, as for np.dot
    with section("similarity"):
        res = similarity(st, q)
    t = section_time("similarity")
    n, d = len(st), q.shape[1]
    return {"GFLOP_per_s": 2 * n * d * q.shape[0] / t / 1e9, "check": float(res.scores[0, 0])}  # type: ignore[index]


def case_similarity_dot(path: str) -> dict[str, object]:
    import numpy as np

    import seqstore

    st = seqstore.open(path)
    m = np.array(st.matrix())  # the same matrix, in RAM
    q = _queries(m.shape[1])
    np.dot(m[:64], q.T)
    with section("similarity"):
        s = np.dot(m, q.T)
    t = section_time("similarity")
    return {"GFLOP_per_s": 2 * m.shape[0] * m.shape[1] * q.shape[0] / t / 1e9, "check": float(s[0, 0])}


def main() -> None:
    args = main_args(__doc__.splitlines()[0])
    ns = QUICK_NS if args.quick else NS
    missing = logix_missing()
    peers = ("seqstore",) if missing else ("seqstore", "logix")
    if missing:
        print(f"skipped: logix in bench/logs.py ({missing}). {LOGIX_HOW}", flush=True)
    cases: list[Case] = []
    for n in ns:
        g = f"N={n:.0e}".replace("+0", "")
        slow = n >= 100_000
        reps = 2 if slow else None
        cases += [
            Case("seqstore", "bench.logs:case_write_seqstore", {"n": n}, group=f"write {g}", repeats=reps),
            Case("seqstore_nofsync", "bench.logs:case_write_seqstore", {"n": n, "fsync": False},
                 group=f"write {g}", repeats=reps),
        ]
        if not missing:
            cases.append(Case("logix", "bench.logs:case_write_logix", {"n": n}, group=f"write {g}", repeats=reps))
        paths = {s: str(_prepared(s, n)) for s in peers}
        for what in ("reopen", "reads", "lookups"):
            for s in peers:
                cases.append(Case(s, f"bench.logs:case_{what}_{s}", {"path": paths[s]}, group=f"{what} {g}"))
        if n == ns[0]:
            for s in ("seqstore", "dot"):
                cases.append(Case(s, f"bench.logs:case_similarity_{s}", {"path": paths["seqstore"]},
                                  group=f"similarity {g}", metric="GFLOP_per_s"))
    res = run_cases("logging" + ("_quick" if args.quick else ""), cases,
                    baseline=["dot"] if missing else ["logix", "dot"], repeats=args.repeats)
    print_table(res, sections=["main", "reopen", "reads_first", "reads", "reads_views", "reads_touch", "lookups",
                               "index_many", "similarity"],
                extras=["rec_per_s", "meta_B_per_rec", "records", "us_per_read", "us_per_lookup", "GFLOP_per_s"])
    summary: dict[str, Any] = {}
    for n in ns if not missing else ():
        g = f"N={n:.0e}".replace("+0", "")
        w_s, w_l = lookup(res, "seqstore", f"write {g}"), lookup(res, "logix", f"write {g}")
        o_s, o_l = lookup(res, "seqstore", f"reopen {g}"), lookup(res, "logix", f"reopen {g}")
        w_n = lookup(res, "seqstore_nofsync", f"write {g}")
        r_s, r_l = lookup(res, "seqstore", f"reads {g}", "reads"), lookup(res, "logix", f"reads {g}", "reads")
        c_s = lookup(res, "seqstore", f"reads {g}", "reads_first")
        c_l = lookup(res, "logix", f"reads {g}", "reads_first")
        summary[g] = {
            "metadata_ratio (logix/seqstore, goal >= 5)": w_l["meta_B_per_rec"] / w_s["meta_B_per_rec"],
            "write_speedup (goal >= 3)": w_l["time_s"] / w_s["time_s"],
            "write_speedup without fsync": w_l["time_s"] / w_n["time_s"],
            "reopen_speedup (goal >= 100 at 1e5)": o_l["time_s"] / o_s["time_s"],
            "reopen_rss_growth_MiB seqstore/logix": (o_s["rss_growth"] / 2**20, o_l["rss_growth"] / 2**20),
            "reads_speedup warm, owned copies (goal >= 5)": r_l["time_s"] / r_s["time_s"],
            "reads_speedup first pass": c_l["time_s"] / c_s["time_s"],
            # LogIX has one read (a clone): its warm ``reads`` pass is the baseline for the view read too
            "reads_speedup zero-copy views": r_l["time_s"]
            / lookup(res, "seqstore", f"reads {g}", "reads_views")["time_s"],
            "reads_speedup every value summed": lookup(res, "logix", f"reads {g}", "reads_touch")["time_s"]
            / lookup(res, "seqstore", f"reads {g}", "reads_touch")["time_s"],
        }
    g0 = f"N={ns[0]:.0e}".replace("+0", "")
    sim = lookup(res, "seqstore", f"similarity {g0}")["GFLOP_per_s"] / lookup(res, "dot", f"similarity {g0}")[
        "GFLOP_per_s"
    ]
    summary["similarity_vs_np_dot (goal >= 0.7)"] = sim
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
