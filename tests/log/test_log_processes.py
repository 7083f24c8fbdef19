"""Logging across processes: SIGKILL mid-run loses only the uncommitted tail; two torch.distributed
ranks log into one store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

import seqstore as ss
from seqstore.store.verify import verify

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from log_children import batch  # noqa: E402


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(HERE.parent.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_sigkill_loses_at_most_the_uncommitted_tail(scratch: Path) -> None:
    path = scratch / "log"
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "log_children.py"), "crash", str(path)],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None
    committed = logged = 0
    try:
        for line in proc.stdout:
            committed, logged = map(int, line.split())
            if committed >= 600:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert committed >= 600, "child died early"
    st = ss.open(path)
    n = len(st)
    assert committed <= n <= logged + 32  # nothing committed is lost; at most what was logged exists
    ids, t = batch(0, n)
    assert [st.id(i) for i in (0, n // 2, n - 1)] == [ids[0], ids[n // 2], ids[n - 1]]
    np.testing.assert_array_equal(
        st.get_batch(np.arange(n), fields=["layer1/grad"])["layer1/grad"], t["layer1"]["grad"]
    )
    np.testing.assert_array_equal(st.matrix("layer2/grad"), t["layer2"]["grad"])
    assert verify(path) == []
    # a new logger on the same store cleans the dead writer's workspace and continues
    from seqstore.log import Logger

    with Logger(path) as lg:
        lg.log(*batch(n, 5))
        lg.log(*batch(0, 5))  # already committed: skipped
    assert len(ss.open(path)) == n + 5 and lg.num_skipped == 5
    assert not any(p.name.startswith("_tmp-") for p in path.iterdir())
    assert not any((path / "_tmp").glob("*"))  # version 3 keeps workspaces in _tmp/


def test_two_ranks_log_into_one_store(scratch: Path) -> None:
    path = scratch / "log"
    init = f"file://{scratch / 'pg-init'}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "log_children.py"), "rank", str(path), str(r), "2", init],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert [o.split() for o, _ in outs] == [["200", "1"], ["200", "1"]]  # "r0" skipped on both ranks
    st = ss.open(path)
    assert len(st) == 400 and st.num_shards >= 2 and verify(path) == []
    ids0, t0 = batch(0, 200)
    ids1, t1 = batch(1000, 200)
    rows = st.index_many(ids0 + ids1)
    assert len(set(rows.tolist())) == 400
    np.testing.assert_array_equal(
        st.get_batch(rows, fields=["layer2/grad"])["layer2/grad"],
        np.concatenate([t0["layer2"]["grad"], t1["layer2"]["grad"]]),
    )
    assert st.manifest.stats["rank-0/records"] == 200 and st.manifest.stats["rank-1/records"] == 200
    assert st.manifest.stats["duplicates_skipped"] == 2
