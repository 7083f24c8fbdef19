"""A script that logs with ``seqstore.Logger`` in a ``with`` block and exits prints nothing at
interpreter exit (issue 25, item 9: ``Writer.__del__`` ran after ``os`` was torn down and printed
``'NoneType' object has no attribute 'getpid'``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import seqstore as ss
from seqstore.store.write import writer as writer_module

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""\
    import sys

    import numpy as np
    import seqstore

    with seqstore.Logger("run.log", commit_every_s=60) as lg:
        for b in range(3):
            lg.log([f"ex-{sys.argv[1]}-{b}-{k}" for k in range(4)],
                   {"grad": np.ones((4, 8, 8), np.float32), "loss": np.arange(4, dtype=np.float32)})
    keep = lg  # the logger and its writer stay referenced until the interpreter exits
    print(len(seqstore.open("run.log")))
""")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_logger_script_exits_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "log_script.py").write_text(SCRIPT)
    for run in range(2):  # creating the log, then appending to it
        res = subprocess.run([sys.executable, "log_script.py", str(run)], cwd=tmp_path, env=_env(), capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == str(12 * (run + 1))
        assert res.stderr == "", res.stderr


def test_writer_finaliser_survives_a_torn_down_os_module(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """What interpreter exit does to a live writer, simulated: the module's ``os`` is gone."""
    w = ss.create(tmp_path / "s.seqstore", {"x": ss.Field("float32", ())})
    w.append({"x": np.float32(1)}, id="a")
    w.close()
    monkeypatch.setattr(writer_module, "os", None)
    w.__del__()  # closed: nothing to do, and no os needed to find that out
