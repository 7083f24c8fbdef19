"""Shards at scale: open cost vs shard count, and the cost of many single-shard commits into one store.

(a) ``open``: ``seqstore.open`` of a store with S tiny shards (one record each), S = 10, 1e3, 1e4,
1e5, in format version 3 (binary shard table + per-shard descriptors) and in the version-1 JSON
layout (every shard listed in ``manifest.json``, what seqstore wrote before version 3);
``first_record`` = one record of the middle shard copied out (its first touch: table row and
descriptor checks, file mapping); ``writer_open`` = ``seqstore.append_to(path)`` (the store lock,
the manifest, the clean-up of what dead writers left). The stores are built once under bench/data/shards/ by a bulk
helper: one shard is written by seqstore, the others are hard links to its files with their own
table row (or JSON entry), so a 1e5-shard store takes seconds. Version 1 stops at 1e4 in
``--quick``.

(b) ``commits``: one writer appends one record and commits, C times, into a new store (version 3:
C = 1e4; version 1: C = 1e3, whose per-commit cost grows with the shards listed). Reported: total
time, mean commit time of the first and of the last 100 commits and their ratio. The store is on
tmpfs (/dev/shm) when there is one, so the figure is seqstore's own work: on a disk every commit
adds its fsyncs (about 14 of them, independent of the shard count); ``--disk`` puts it under
bench/data/ instead.

Usage: ``python bench/shards.py [--quick] [--repeats R] [--disk]``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# Run as ``python bench/x.py`` Python puts bench/ first on sys.path: put the repository root there instead.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.harness import DATA, Case, lookup, main_args, print_table, run_cases, section  # noqa: E402

SHARDS = (10, 1_000, 10_000, 100_000)
QUICK_SHARDS = (10, 1_000, 10_000)
LEGACY_MAX = {True: 10_000, False: 100_000}  # version-1 stores built (quick, full)
COMMITS = {3: 10_000, 1: 1_000}
QUICK_COMMITS = {3: 1_000, 1: 300}


def _schema() -> dict[str, Any]:
    import seqstore as ss

    return {"x": ss.Field("float32", (4,)), "tokens": ss.Field("int32", (None,))}


def _record(i: int) -> dict[str, Any]:
    import numpy as np

    return {"x": np.full(4, i, np.float32), "tokens": np.arange(i % 3, dtype=np.int32)}


def build(path: Path, shards: int, version: int) -> None:
    """A store of ``shards`` one-record shards (format ``version`` 3 or 1) at ``path``, built in bulk:
    shard 0 is written by seqstore, shards 1.. are hard links to its files (or, every 50,000, copies:
    same bytes, so the same descriptor and CRCs) with their own table row or manifest entry."""
    import zlib

    import seqstore as ss
    from seqstore.format.descriptor import DESCRIPTOR
    from seqstore.format.manifest import Manifest
    from seqstore.format.shard_table import TABLE, TABLE_HEADER_BYTES, TableState, encode_row, shard_dir_name

    if (path / ".complete").exists():
        return
    shutil.rmtree(path, ignore_errors=True)
    if version == 3:
        w = ss.create(path, _schema())
    else:
        path.mkdir(parents=True)
        Manifest(ss.Schema(_schema())).save(path)
        w = ss.append_to(path)
    with w:
        w.append(_record(0))
    first = path / shard_dir_name(0)
    files = [p.relative_to(first) for p in first.rglob("*") if p.is_file()]
    source = first
    for k in range(1, shards):
        d = path / shard_dir_name(k)
        d.mkdir()
        fresh = k % 50_000 == 0  # a file has at most 65,000 links on ext4: start from a copy now and then
        for rel in files:
            if fresh:
                shutil.copyfile(first / rel, d / rel)
            else:
                os.link(source / rel, d / rel)
        source = d if fresh else source
    raw = json.loads((path / "manifest.json").read_text())
    if version == 3:
        desc_crc = zlib.crc32((first / DESCRIPTOR).read_bytes())
        state = TableState(0, 0, 0)
        with open(path / TABLE, "r+b") as f:
            f.seek(TABLE_HEADER_BYTES)
            for k in range(shards):
                row = encode_row(k, k, 1, False, [0], desc_crc)
                f.write(row)
                state = state.after(row, 1)
        raw["shard_table"] = state.to_json()
    else:
        entry = raw["shards"][0]
        raw["shards"] = [{**entry, "name": shard_dir_name(k)} for k in range(shards)]
    (path / "manifest.json").write_text(json.dumps(raw, separators=(",", ":")))
    (path / ".complete").touch()


def case_open(path: str) -> dict[str, object]:
    import numpy as np

    import seqstore

    with section("open"):
        store = seqstore.open(path)
    with section("first_record"):
        x = np.array(store[len(store) // 2]["x"])
    with section("writer_open"):
        writer = seqstore.append_to(path)  # takes the lock and removes what dead writers left
    writer.abort()
    return {"shards": store.num_shards, "manifest_bytes": os.path.getsize(Path(path) / "manifest.json"),
            "check": float(x.sum())}


def case_commits(commits: int, version: int, disk: bool = False) -> dict[str, object]:
    import time

    import numpy as np

    import seqstore as ss
    from seqstore.format.manifest import Manifest

    parent = "/dev/shm" if os.access("/dev/shm", os.W_OK) and not disk else None
    if disk:
        DATA.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="seqstore-bench-shards-", dir=str(DATA) if disk else parent) as tmp:
        root = Path(tmp) / "s"
        if version == 3:
            w = ss.create(root, _schema())
        else:
            root.mkdir()
            Manifest(ss.Schema(_schema())).save(root)
            w = ss.append_to(root)
        times = np.empty(commits)
        with section("commits"):
            for i in range(commits):
                t0 = time.perf_counter()
                w.append(_record(i), id=f"r{i}")
                w.commit()
                times[i] = time.perf_counter() - t0
            w.close()
        store = ss.open(root)
        assert store.num_shards == commits and store.index(f"r{commits - 1}") == commits - 1
        head, tail = float(times[:100].mean()), float(times[-100:].mean())
        return {
            "commits": commits,
            "first100_ms": head * 1e3,
            "last100_ms": tail * 1e3,
            "last_over_first": tail / head,
            "tmpfs": parent is not None,
        }


def main() -> None:
    args = main_args(__doc__.splitlines()[0], extra_flags=["--disk"])
    counts = QUICK_SHARDS if args.quick else SHARDS
    root = DATA / "shards"
    cases = []
    for s in counts:
        group = f"S={s:.0e}"
        for version in (3, 1):
            if version == 1 and s > LEGACY_MAX[args.quick]:
                continue
            path = root / f"v{version}-{s}"
            print(f"preparing {path} ...", file=sys.stderr, flush=True)
            build(path, s, version)
            name = "v3_table" if version == 3 else "v1_json"
            cases.append(Case(name, "bench.shards:case_open", {"path": str(path)}, group))
    name = "shards_quick" if args.quick else "shards"
    opened = run_cases(f"{name}_open", cases, baseline="v3_table", repeats=args.repeats, meta={"shards": counts})
    print("### (a) open vs shard count\n")
    print_table(opened, sections=("open", "first_record", "writer_open"), extras=["shards", "manifest_bytes"])
    small, big = f"S={counts[0]:.0e}", f"S={counts[-1]:.0e}"
    for case in ("v3_table", "v1_json"):
        try:
            a, b = lookup(opened, case, small, "open"), lookup(opened, case, big, "open")
        except KeyError:
            b = lookup(opened, case, f"S={LEGACY_MAX[args.quick]:.0e}", "open")
            big_c = f"S={LEGACY_MAX[args.quick]:.0e}"
        else:
            big_c = big
        print(
            f"{case} open: {big_c} / {small} time ratio {b['time_s'] / a['time_s']:.2f}x; {big_c}: "
            f"{b['time_s'] * 1e3:.3f} ms, private (anon) {b['anon_growth'] / 2**20:+.2f} MiB, "
            f"RSS {b['rss_growth'] / 2**20:+.2f} MiB"
        )
    plan = QUICK_COMMITS if args.quick else COMMITS
    commit_cases = [
        Case(f"v{v}", "bench.shards:case_commits", {"commits": plan[v], "version": v, "disk": args.disk},
             f"C={plan[v]:.0e}", repeats=1, timeout=1800)
        for v in (3, 1)
    ]
    committed = run_cases(f"{name}_commits", commit_cases, repeats=1, meta={"commits": plan})
    print("\n### (b) single-shard commits into one store\n")
    print_table(committed, sections=("commits",), extras=["commits", "first100_ms", "last100_ms", "last_over_first"])
    for v in (3, 1):
        r = lookup(committed, f"v{v}", f"C={plan[v]:.0e}", "commits")
        print(
            f"v{v}: {r['commits']} commits in {r['time_s']:.1f} s; mean commit, first 100: {r['first100_ms']:.2f} ms, "
            f"last 100: {r['last100_ms']:.2f} ms (ratio {r['last_over_first']:.2f}x)"
            + (" on tmpfs" if r.get("tmpfs") else " on disk")
        )


if __name__ == "__main__":
    main()
