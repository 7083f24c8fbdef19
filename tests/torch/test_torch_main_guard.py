"""The forkserver trap (issue 25, item 1): a script without ``if __name__ == "__main__":`` that reads an
``s3://`` store (moto) through ``SeqDataLoader`` with 2 workers gets one seqstore error naming the guard
before any worker starts, not Python's "bootstrapping phase" error; the same script under the guard
runs the epoch. The scripts run in a subprocess with a time limit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.s3 import MotoS3
from support.stores import N, build_store

pytest.importorskip("torch")
pytest.importorskip("seqstore.io.remote")

REPO = Path(__file__).resolve().parents[2]

BODY = """\
store = ss.open(os.environ["T_URL"], storage_options=json.loads(os.environ["T_OPTS"]),
                cache_dir=os.environ["T_CACHE"])
store.get_batch([0, 1])  # this process has started the object-store client: workers use forkserver
sds = SeqDataset(ss.StoreDataset(store, ordering="random", seed=1, length_field="x",
                                 cache_dir=os.environ["T_CACHE"] + "/ds"))
loader = SeqDataLoader(sds, sampler=EpochSampler(sds, rank=0, world_size=1), batch_size=16,
                       num_workers=2, procs=0, collate_fn=collate_padded, timeout=50)
print("batches", sum(1 for _ in loader), flush=True)
"""

HEAD = """\
import json
import os

import seqstore as ss
from seqstore.torch import EpochSampler, SeqDataLoader, SeqDataset, collate_padded

"""


@pytest.fixture(scope="module")
def remote_url(moto_s3: MotoS3, tmp_path_factory: pytest.TempPathFactory) -> str:
    local = build_store(tmp_path_factory.mktemp("guard") / "g.seqstore")
    return moto_s3.upload_dir(local, moto_s3.new_bucket("guard"), "g.seqstore")


def _run(script: Path, moto_s3: MotoS3, url: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, T_URL=url, T_OPTS=json.dumps(moto_s3.storage_options()), T_CACHE=str(cache),
               OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen([sys.executable, str(script)], env=env, cwd=script.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and the workers it started
        out, err = proc.communicate()
        pytest.fail(f"{script.name} did not finish within 60 s\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_unguarded_script_gets_the_seqstore_error(moto_s3: MotoS3, remote_url: str, tmp_path: Path) -> None:
    script = tmp_path / "train_unguarded.py"
    script.write_text(HEAD + BODY)
    res = _run(script, moto_s3, remote_url, tmp_path / "cache")
    assert res.returncode != 0, res.stdout
    assert "batches" not in res.stdout
    err = res.stderr
    assert "seqstore.errors.MainGuardError" in err, err  # the public name, as docs/distributed.md gives it
    assert 'if __name__ == "__main__":' in err and "forkserver" in err and str(script) in err, err
    assert "line 14 starts them" in err, err  # the module-level line that starts the workers
    # one error, raised before any worker started: none of Python's or torch's own text
    assert "bootstrapping phase" not in err.split("MainGuardError")[0], err
    assert "exited unexpectedly" not in err and "DataLoader worker" not in err, err
    assert err.count("Traceback (most recent call last)") == 1, err


@pytest.mark.slow  # the in-process remote loader tests run forkserver workers too; this adds the script form
def test_guarded_script_runs_the_epoch(moto_s3: MotoS3, remote_url: str, tmp_path: Path) -> None:
    script = tmp_path / "train_guarded.py"
    script.write_text(HEAD + 'if __name__ == "__main__":\n' + textwrap.indent(BODY, "    "))
    res = _run(script, moto_s3, remote_url, tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    assert f"batches {-(-N // 16)}" in res.stdout, res.stdout


def test_loop_in_a_guarded_function_is_not_refused(tmp_path: Path) -> None:
    """The check reads the module-level line that is running: a call under the guard passes, the same
    call at module level does not (checked in this process, no workers)."""
    from seqstore._mainguard import MainGuardError, check_main_guard

    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent("""\
        import sys
        from seqstore._mainguard import check_main_guard

        def main():
            check_main_guard(sys.argv[1], 2)

        if __name__ == "__main__":
            main()
        main()
    """))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    res = subprocess.run([sys.executable, str(script), "spawn"], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "MainGuardError" in res.stderr and "line 9 starts" in res.stderr, res.stderr
    res = subprocess.run([sys.executable, str(script), "fork"], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr  # fork does not re-import the script
    check_main_guard("spawn", 2)  # under pytest: its entry point is guarded
    assert issubclass(MainGuardError, RuntimeError)


_SHAPES = {  # script, the line that starts the workers, whether it runs again on import (None: cannot tell)
    "module level": ("x = 1\nfor b in loader:\n    pass\n", 2, True),
    "loop in a loop": ("for e in range(2):\n    for b in loader:\n        pass\n", 2, True),
    "with block": ("with ctx() as c:\n    for b in loader:\n        pass\n", 2, True),
    "except branch": ("try:\n    x()\nexcept E:\n    main()\n", 4, True),
    "guarded": ("import x\nif __name__ == '__main__':\n    for b in loader:\n        pass\n", 3, False),
    "guard in a try": ("try:\n    if __name__ == '__main__':\n        main()\nexcept KeyboardInterrupt:\n    pass\n", 3,
                       False),
    "guard in a with": ("with ctx():\n    if __name__ == '__main__':\n        main()\n", 3, False),
    "guard as elif": ("import sys\nif sys.argv[0] == 'x':\n    pass\nelif __name__ == '__main__':\n    main()\n", 5,
                      False),
    "else of the guard": ("if __name__ == '__main__':\n    pass\nelse:\n    main()\n", 4, True),
    "not main": ("if __name__ != '__main__':\n    main()\n", 2, True),
    "else of not main": ("if __name__ != '__main__':\n    pass\nelse:\n    main()\n", 4, False),
    "another test": ("import multiprocessing as mp\nif mp.parent_process() is None:\n    main()\n", 3, None),
}


@pytest.mark.parametrize("shape", sorted(_SHAPES))
def test_which_lines_run_again_on_import(tmp_path: Path, shape: str) -> None:
    from seqstore._mainguard import _verdict

    text, line, expected = _SHAPES[shape]
    script = tmp_path / "train.py"
    script.write_text(text)
    assert _verdict(str(script), script.stat().st_mtime_ns, line) is expected


def test_the_loader_errors_are_public_names() -> None:
    """The errors docs/torch.md and docs/distributed.md name are importable from public modules."""
    import seqstore.errors
    import seqstore.torch

    assert seqstore.torch.MainGuardError is seqstore.errors.MainGuardError
    assert seqstore.torch.LoaderWorkerError is seqstore.errors.LoaderWorkerError
    for name in ("MainGuardError", "LoaderWorkerError"):
        assert name in seqstore.errors.__all__ and name in seqstore.torch.__all__
        cls = getattr(seqstore.errors, name)
        assert issubclass(cls, seqstore.errors.SeqstoreError) and issubclass(cls, RuntimeError)
