"""A real ``torchrun --nproc_per_node 2`` (gloo, ``num_workers=2`` per rank: seqstore's own worker
processes, as ``SeqDataLoader`` takes them for its own batches) of examples/ddp_train.py: checkpoint
mid-epoch; the checkpoint resumes on 1 rank with every index of the epoch exactly once overall; the ranks'
records are in the simulated (deterministic) order: each rank's stream, as without workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from torch_testlib import simulate  # noqa: E402

from seqstore.data import StoreDataset  # noqa: E402
from seqstore.torch import IterableSeqDataset, LengthBatching  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "ddp_train.py"


def _torchrun(nproc: int, *args: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(EXAMPLE), *args]
    # its own session, so a hang can be ended with the ranks and workers it started
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun timed out:\n{out[-3000:]}\n{err[-6000:]}")
    assert proc.returncode == 0, out[-3000:] + err[-6000:]


def test_torchrun_two_ranks_resume_on_one(tmp_path: Path) -> None:
    store, ckpt, log = tmp_path / "s.seqstore", tmp_path / "ck.pt", tmp_path / "log"
    common = ["--store", str(store), "--ckpt", str(ckpt), "--records", "300", "--epochs", "1",
              "--max-frames", "120", "--log-indices", str(log)]
    _torchrun(2, *common, "--workers", "2", "--stop-after", "3")
    first = {int(p.name.split("rank")[1][0]): np.load(p) for p in log.glob("*-world2-*.npy")}
    assert sorted(first) == [0, 1]
    assert len(first[0]) and all((v[:, 0] == 1).all() for v in first.values())
    ds = StoreDataset(store, ordering="laplace:.64", seed=7)

    def make(rank: int, world: int) -> IterableSeqDataset:
        return IterableSeqDataset(ds, batch=LengthBatching(max_frames=120), rank=rank, world_size=world)

    # resume 2 -> 1 rank from the checkpoint the run wrote (the example's own resume path does the same
    # with a second torchrun; one launch keeps this test short on a 2-core machine)
    state = torch.load(ckpt, weights_only=False)["data"]
    assert state["world_size"] == 2 and state["num_workers"] == 0  # seqstore's workers: the rank's own stream
    rest = simulate(make, 1, 1, state=state)[0]
    second = np.concatenate(rest)
    seen = np.concatenate([first[0][:, 1], first[1][:, 1], second])
    np.testing.assert_array_equal(np.sort(seen), np.arange(300))  # each index exactly once overall

    # deterministic: the ranks' records are what the simulated 2 ranks produce (one stream each)
    sim = simulate(make, 2, 1)
    for r in (0, 1):
        np.testing.assert_array_equal(first[r][:, 1], np.concatenate(sim[r][:3]))
