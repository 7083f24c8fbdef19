"""A ``procs=`` loader's workers after a batch's read failed: the error reaches the training loop, and
the workers end quietly (the script runs in a subprocess, whose workers' stderr is its own)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("seqstore.io.remote")

from torch_testlib import make_store  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""\
    import json, os
    import seqstore
    from seqstore.data import StoreDataset
    from seqstore.torch import EpochSampler, SeqDataLoader, SeqDataset, collate_padded

    if __name__ == "__main__":
        store = seqstore.open(os.environ["T_URL"], storage_options=json.loads(os.environ["T_OPTS"]),
                              cache_dir=os.environ["T_CACHE"])
        ds = StoreDataset(store, ordering="default")
        loader = SeqDataLoader(SeqDataset(ds), sampler=EpochSampler(ds), batch_size=50,
                               collate_fn=collate_padded, procs=2, timeout=50)
        got = 0
        try:
            for batch in loader:
                got += 1
        except seqstore.errors.SeqstoreError as exc:
            print("batches", got, "then", type(exc).__name__, flush=True)
""")


def test_workers_end_quietly_after_a_refused_read(moto_s3: Any, s3_bucket: str, s3_proxy: Any,
                                                  tmp_path: Path) -> None:
    make_store(tmp_path / "s.seqstore", 2000, shard_records=200, max_len=400)
    url = moto_s3.upload_dir(tmp_path / "s.seqstore", s3_bucket, "w/s.seqstore")
    s3_proxy.forbid(path="shard-000006")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, T_URL=url, T_OPTS=json.dumps(moto_s3.storage_options(s3_proxy.url)),
               T_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the script did not finish within 120 s\nstdout:\n{out}\nstderr:\n{err}")
    assert proc.returncode == 0, err
    assert "batches 24 then CredentialsError" in out, (out, err)
    assert "Traceback" not in err and "BufferError" not in err, err
