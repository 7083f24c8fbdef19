"""Ctrl-C (one SIGINT to the process group, or two: a terminal's and ``timeout``'s) and SIGTERM during
``seqstore convert --workers``, ``copy`` and ``export``, at random points: the command ends within
seconds, exit code 130, one line ``seqstore: interrupted; nothing was written`` and no traceback, no
target and no temporary directory left, no process of its group left (workers, forkserver).

The default run tries a few random points per signal; the full 20 trials per signal are marked slow."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

import seqstore

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LINE = "seqstore: interrupted; nothing was written"

# the CLI as the console script runs it; small inputs still cut into several units of work. It starts
# the command once the test says "go" on its stdin (anything else, or the pipe closed: it exits), so the
# next trial's interpreter starts up while the test waits for the previous one to end
RUNNER = textwrap.dedent("""\
    import sys

    if __name__ == "__main__":
        import seqstore.interop.arrow as arrow
        arrow.MIN_UNIT_RECORDS = 200
        from seqstore.cli import console_main
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            sys.exit(0)
        sys.exit(console_main())
""")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("interrupts")
    (root / "run.py").write_text(RUNNER)
    src = root / "in"
    src.mkdir()
    rng = np.random.default_rng(0)
    first = 0
    for k in range(4):
        n = 1000
        lens = rng.integers(10, 40, n)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
        values = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(int(lens.sum()) * 16,
                                                                                dtype=np.float32)), 16)
        table = pa.table({"feat": pa.ListArray.from_arrays(offsets, values),
                          "id": pa.array([f"utt-{first + i}" for i in range(n)])})
        pq.write_table(table, src / f"part-{k}.parquet", row_group_size=100)
        first += n
    with seqstore.create(root / "store.seqstore", {"feat": seqstore.Field("float32", (None, 16))},
                         shard_bytes=16 << 10) as w:
        for k in range(600):
            w.append({"feat": rng.standard_normal((20 + k % 30, 16), dtype=np.float32)}, id=f"r{k}")
    return root


COMMANDS = {
    "convert": ["convert", "--from", "parquet", "in", "out.seqstore", "--id-column", "id", "--workers", "2", "-q"],
    "copy": ["copy", "store.seqstore", "out.seqstore", "--workers", "4", "-q"],
    "export": ["export", "--to", "webdataset", "store.seqstore", "out.seqstore", "-q"],
}


def _group(pgid: int) -> list[str]:
    """Command lines of the processes of group ``pgid``."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[2]) == pgid:
                    found.append(Path(f"/proc/{d}/cmdline").read_text().replace("\0", " ")[:120])
            except (OSError, IndexError, ValueError):
                pass
    return found


def _spawn(work: Path, command: str) -> subprocess.Popen[str]:
    """The command's interpreter, started (it imports, says "ready", then waits for :func:`_go`)."""
    return subprocess.Popen([sys.executable, "run.py", *COMMANDS[command]], cwd=work, env=_env(), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def _go(p: subprocess.Popen[str]) -> subprocess.Popen[str]:
    """Once ``p``'s interpreter is up (it said "ready"), start its command."""
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline().strip() == "ready"
    p.stdin.write("go\n")
    p.stdin.flush()  # (communicate() closes it)
    return p


def _start(work: Path, command: str) -> subprocess.Popen[str]:
    return _go(_spawn(work, command))


def _clean(work: Path, p: subprocess.Popen[str]) -> None:
    """Nothing of the command is left: no target, no hidden temporary sibling, no process of its group."""
    for _ in range(100):  # the forkserver and the resource tracker end when they see the driver gone
        if not _group(p.pid):
            break
        time.sleep(0.1)
    assert not _group(p.pid), _group(p.pid)
    assert sorted(os.listdir(work)) == ["in", "run.py", "store.seqstore"], sorted(os.listdir(work))


_TOOK: dict[str, float] = {}


def _take_complete(work: Path, command: str) -> None:
    """The output of a run that completed is whole; removed for the next run."""
    out = work / "out.seqstore"
    if command == "export":  # a directory of WebDataset shards
        assert sorted(p.suffix for p in out.iterdir()) and all(p.suffix == ".tar" for p in out.iterdir())
    else:
        assert len(seqstore.open(out)) in (4000, 600)
    shutil.rmtree(out)


def _duration(work: Path, command: str) -> float:
    """Seconds the command takes uninterrupted (once per command; its output is checked and removed)."""
    if command not in _TOOK:
        p = _start(work, command)
        t0 = time.monotonic()  # from the command's start (the interpreter is up)
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        _TOOK[command] = time.monotonic() - t0
        _take_complete(work, command)
    return _TOOK[command]


def _trials(work: Path, command: str, how: str, trials: int) -> None:
    took = _duration(work, command)
    rng = random.Random(zlib.crc32(f"{command} {how} {trials}".encode()))
    interrupted = 0
    nxt: subprocess.Popen[str] | None = _spawn(work, command)
    try:
        for trial in range(trials):
            assert nxt is not None
            p = _go(nxt)
            nxt = None
            time.sleep(rng.uniform(0.0, 0.6 * took))  # took includes the interpreter's exit
            sent = time.monotonic()
            if how == "sigterm":
                os.kill(p.pid, signal.SIGTERM)
            else:
                os.killpg(p.pid, signal.SIGINT)  # a terminal's Ctrl-C: every process of the group
                if how == "double-sigint":
                    time.sleep(rng.uniform(0.0, 0.2))
                    os.kill(p.pid, signal.SIGINT)  # and the one `timeout` passes on
            if trial + 1 < trials:  # the next trial's interpreter (its own session) starts up meanwhile
                nxt = _spawn(work, command)
            try:
                _, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
                pytest.fail(f"{command}: still running 10 s after {how}; group {_group(p.pid)}")
            assert time.monotonic() - sent < 10
            if (work / "out.seqstore").exists():  # the signal came after the work was done: a whole output
                left = sorted(os.listdir(work / "out.seqstore"))[:8]
                assert p.returncode in (0, -signal.SIGINT, -signal.SIGTERM) and LINE not in err, (err, left)
                _take_complete(work, command)
                continue
            interrupted += 1
            assert p.returncode == 130, err
            assert err.strip().splitlines() == [LINE], err
            _clean(work, p)
    finally:
        if nxt is not None:  # a failed trial: the next one's interpreter, which never got its "go"
            nxt.kill()
            nxt.communicate()
    assert interrupted >= max(1, trials // 2), f"only {interrupted} of {trials} runs were interrupted"


@pytest.mark.parametrize("how", ["sigint", "double-sigint", "sigterm"])
@pytest.mark.parametrize("command", ["convert", "copy", "export"])
def test_interrupt_leaves_nothing(work: Path, command: str, how: str) -> None:
    _trials(work, command, how, 2)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigint", "double-sigint", "sigterm"])
@pytest.mark.parametrize("command", ["convert", "copy", "export"])
def test_interrupt_leaves_nothing_20_trials(work: Path, command: str, how: str) -> None:
    _trials(work, command, how, 20)
