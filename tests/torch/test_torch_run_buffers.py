"""A read-once ``procs=`` loop's run buffers (files in ``/dev/shm``, seqstore.torch._ring.RunBuffers) are
removed when the loop's process is killed (SIGKILL: no exit handler runs), as the ring's block is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("seqstore.io.remote")

from torch_testlib import make_store  # noqa: E402

from seqstore.torch._ring import shared_runs_possible  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""\
    import json, os, signal
    import seqstore
    from seqstore.data import StoreDataset
    from seqstore.torch import EpochSampler, SeqDataLoader, SeqDataset, collate_padded

    if __name__ == "__main__":
        store = seqstore.open(os.environ["T_URL"], storage_options=json.loads(os.environ["T_OPTS"]),
                              cache_dir=os.environ["T_CACHE"])
        assert store.read_once
        ds = StoreDataset(store, ordering="default")
        loader = SeqDataLoader(SeqDataset(ds), sampler=EpochSampler(ds), batch_size=50,
                               collate_fn=collate_padded, procs=2, timeout=50)
        for k, batch in enumerate(loader):
            if k == 3:
                mine = [n for n in os.listdir("/dev/shm") if n.startswith(f"seqstore-run-{os.getpid()}-")]
                print("buffers", " ".join(mine), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.skipif(not shared_runs_possible(), reason="needs 1 GiB free in /dev/shm")
def test_run_buffers_go_when_the_loop_is_killed(moto_s3: Any, s3_bucket: str, tmp_path: Path) -> None:
    make_store(tmp_path / "s.seqstore", 2000, shard_records=200, max_len=400)
    url = moto_s3.upload_dir(tmp_path / "s.seqstore", s3_bucket, "k/s.seqstore")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, T_URL=url, T_OPTS=json.dumps(moto_s3.storage_options(read_once="true")),
               T_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    res = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == -9, res.stderr
    names = res.stdout.split("buffers", 1)[1].split()
    assert names, res.stdout
    left = names
    for _ in range(100):  # the clean-up after the process is gone runs in another process: waited for
        left = [n for n in names if os.path.exists(os.path.join("/dev/shm", n))]
        if not left:
            break
        time.sleep(0.1)
    try:
        assert not left, f"{left} left in /dev/shm"
    finally:
        for n in left:
            os.unlink(os.path.join("/dev/shm", n))
