"""A Logger (or Writer) the script never closes: what was logged is committed at interpreter exit and
on SIGTERM, with one line on stderr, and the workspace is removed (store/write/at_exit.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import seqstore as ss

REPO = Path(__file__).resolve().parents[2]

LOGGER = textwrap.dedent("""\
    import sys, time
    import numpy as np
    import seqstore

    lg = seqstore.Logger("run.log", commit_every_s=60)
    for b in range(10):
        lg.log([f"ex-{b}-{k}" for k in range(10)], {"grad": np.full((10, 4), b, np.float32)})
    if sys.argv[1] == "wait":
        print("logged", flush=True)
        time.sleep(60)
""")

WRITER = textwrap.dedent("""\
    import sys, time
    import numpy as np
    import seqstore

    w = seqstore.create("w.seqstore", {"x": seqstore.Field("int64", ())})
    for k in range(100):
        w.append({"x": k}, id=f"r{k}")
    if sys.argv[1] == "wait":
        print("written", flush=True)
        time.sleep(60)
""")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _run(tmp_path: Path, script: str, mode: str) -> tuple[int, str]:
    (tmp_path / "script.py").write_text(script)
    if mode == "exit":
        res = subprocess.run([sys.executable, "script.py", mode], cwd=tmp_path, env=_env(), capture_output=True,
                             text=True, timeout=120)
        return res.returncode, res.stderr
    proc = subprocess.Popen([sys.executable, "script.py", mode], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() in ("logged", "written")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def _no_workspace(store: Path) -> None:
    left = [p.name for p in store.iterdir() if p.name.startswith("_tmp")]
    assert not left or not any(any((store / n).iterdir()) for n in left), left  # an empty _tmp/ may stay


@pytest.mark.parametrize("mode", ["exit", "sigterm"])
def test_unclosed_logger_commits_everything(tmp_path: Path, mode: str) -> None:
    code, err = _run(tmp_path, LOGGER, "exit" if mode == "exit" else "wait")
    assert code == (0 if mode == "exit" else -signal.SIGTERM), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "logger not closed at" in lines[0] and "committed 100" in lines[0], err
    store = ss.open(tmp_path / "run.log")
    assert len(store) == 100
    assert store.index("ex-9-9") == 99
    assert float(store[99]["grad"][0]) == 9.0
    _no_workspace(tmp_path / "run.log")


@pytest.mark.parametrize("mode", ["exit", "sigterm"])
def test_unclosed_writer_commits_everything(tmp_path: Path, mode: str) -> None:
    code, err = _run(tmp_path, WRITER, "exit" if mode == "exit" else "wait")
    assert code == (0 if mode == "exit" else -signal.SIGTERM), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "writer not closed at" in lines[0] and "committed 100" in lines[0], err
    store = ss.open(tmp_path / "w.seqstore")
    assert len(store) == 100 and int(store[42]["x"]) == 42
    _no_workspace(tmp_path / "w.seqstore")


def test_users_sigterm_handler_is_left_alone(tmp_path: Path) -> None:
    """A program with its own SIGTERM handler keeps it; its sys.exit still commits at exit."""
    script = "import signal, sys\nsignal.signal(signal.SIGTERM, lambda s, f: sys.exit(3))\n" + LOGGER
    code, err = _run(tmp_path, script, "wait")
    assert code == 3, err
    assert "committed 100" in err
    assert len(ss.open(tmp_path / "run.log")) == 100


def test_interrupted_append_is_not_committed(tmp_path: Path) -> None:
    """An append stopped part way by an interrupt: the writer cannot tell what is consistent, so at exit it
    discards (and says so) rather than commit a half record."""
    from seqstore.store.write import at_exit

    w = ss.create(tmp_path / "s.seqstore", {"x": ss.Field("int64", ())})
    w.append({"x": 1})
    w.commit()
    w.append({"x": 2})

    class Boom(dict):  # a record whose reading is interrupted (as Ctrl-C would)
        def keys(self):  # type: ignore[no-untyped-def]
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        w.append(Boom(x=3))
    line = w._commit_at_exit("exit")
    assert line is not None and "discarded" in line
    assert len(ss.open(tmp_path / "s.seqstore")) == 1
    at_exit.unregister(w)


def test_writer_left_open_in_process_is_committed_by_finish_all(tmp_path: Path) -> None:
    from seqstore.store.write import at_exit

    w = ss.create(tmp_path / "s.seqstore", {"x": ss.Field("int64", ())})
    w.append({"x": np.int64(5)})
    assert w._commit_at_exit("exit") is not None
    assert len(ss.open(tmp_path / "s.seqstore")) == 1
    at_exit.unregister(w)
    time.sleep(0)


FORKED = textwrap.dedent("""\
    import os, sys
    import numpy as np
    import seqstore

    lg = seqstore.Logger("run.log", commit_every_s=60)
    lg.log([f"p-{k}" for k in range(10)], {"grad": np.zeros((10, 4), np.float32)})
    import multiprocessing as mp

    def child():
        print("child done", flush=True)

    p = mp.get_context("fork").Process(target=child)
    p.start()
    p.join(60)
    print("child exit", p.exitcode, flush=True)
""")


def test_forked_child_leaves_the_parents_logger_alone(tmp_path: Path) -> None:
    """A fork (a DataLoader worker) inherits the exit hook: it must neither hang on the parent's logger (its
    background thread is not in the child) nor commit it; the parent commits once, at its own exit."""
    (tmp_path / "script.py").write_text(FORKED)
    res = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "child exit 0" in res.stdout
    assert res.stderr.count("logger not closed at exit") == 1, res.stderr
    assert len(ss.open(tmp_path / "run.log")) == 10


FORKED_USES = textwrap.dedent("""\
    import os, signal
    import numpy as np
    import seqstore

    lg = seqstore.Logger("run.log", flush_bytes=4096, commit_every_s=60)
    lg.log([f"p-{k}" for k in range(10)], {"grad": np.zeros((10, 4), np.float32)})
    import multiprocessing as mp

    def child():
        signal.alarm(20)  # a hang is the failure
        for call in (lambda: lg.log([f"c-{k}" for k in range(500)], {"grad": np.zeros((500, 4), np.float32)}),
                     lg.flush):
            try:
                call()
                print("child: no error", flush=True)
            except seqstore.SeqstoreError as exc:
                print("child:", exc, flush=True)
        lg.close()
        print("child closed", flush=True)

    p = mp.get_context("fork").Process(target=child)
    p.start()
    p.join(60)
    print("child exit", p.exitcode, flush=True)
    lg.close()
""")


def test_forked_child_using_the_parents_logger_gets_an_error_not_a_hang(tmp_path: Path) -> None:
    """A forked child that calls log/flush/close on the parent's logger: there is no background thread in the
    child, so these used to block forever; now log and flush raise naming the owner process, close returns,
    and the parent's log is untouched."""
    (tmp_path / "script.py").write_text(FORKED_USES)
    res = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("a forked child cannot use it") == 2, res.stdout
    assert "child closed" in res.stdout and "child exit 0" in res.stdout, res.stdout
    assert len(ss.open(tmp_path / "run.log")) == 10


def test_logger_that_never_logged_says_nothing(tmp_path: Path) -> None:
    script = "import seqstore\nlg = seqstore.Logger('run.log')\n"
    (tmp_path / "script.py").write_text(script)
    res = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stderr == "", res.stderr


INTERRUPTED_CLOSE = textwrap.dedent("""\
    import os, signal, sys, threading, time
    import numpy as np
    import seqstore

    lg = seqstore.Logger("run.log", flush_bytes=1 << 25, commit_every_s=60, direct_io=False)
    for b in range(80):
        lg.log([f"ex-{b}-{k}" for k in range(100)], {"grad": np.full((100, 1024), b, np.float32)})
    main = threading.main_thread().ident

    def where():
        f, names = sys._current_frames().get(main), []
        while f is not None:
            names.append((f.f_code.co_name, os.path.basename(f.f_code.co_filename)))
            f = f.f_back
        return names

    def waits_in_logger_close():  # in a wait of threading called from Logger.close (or its _handoff)
        frames = where()
        own = [f for f in frames if f[1] != "threading.py"]
        return frames and frames[0][1] == "threading.py" and own and own[0] in (("close", "logger.py"),
                                                                                ("_handoff", "logger.py"))

    def interrupter():  # a real SIGINT while the main thread waits inside Logger.close(), twice
        for _ in range(2):
            while not waits_in_logger_close():
                time.sleep(0.0001)
            seen = where()
            os.kill(os.getpid(), signal.SIGINT)
            while where() == seen:
                time.sleep(0.0001)

    armed = False  # Python's own SIGINT handler, but only while a seqstore call runs (never in this script)

    def on_sigint(signum, frame):
        if armed:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    threading.Thread(target=interrupter, daemon=True).start()
    interrupts = 0
    for _ in range(10):
        try:
            armed = True
            lg.close()
            armed = False
            break
        except KeyboardInterrupt:
            armed = False
            interrupts += 1
    left = os.listdir(os.path.join("run.log", "_tmp"))
    with seqstore.Logger("run.log") as again:
        again.log(["one-more"], {"grad": np.zeros((1, 1024), np.float32)})
    print(interrupts, len(left), len(seqstore.open("run.log")), flush=True)
""")


def test_close_interrupted_by_ctrl_c_is_finished_by_the_next_close(tmp_path: Path) -> None:
    """Ctrl-C during Logger.close(): the first interrupt ended close() part way (a second one, while it
    stopped the background thread, left the store's writer open) and a second close() did nothing: the
    writer's workspace stayed, and when the interrupt came before the last buffer was handed off, its
    records were lost without a word. Now close() can be called again and finishes the job."""
    (tmp_path / "script.py").write_text(INTERRUPTED_CLOSE)
    res = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    interrupts, workspaces, records = (int(x) for x in res.stdout.split())
    assert interrupts >= 1 and workspaces == 0 and records == 8001, res.stdout
    _no_workspace(tmp_path / "run.log")


INTERRUPTED_LOGS = textwrap.dedent("""\
    import os, random, signal, threading, time
    import numpy as np
    import seqstore

    random.seed(0)
    # the schema given: the store is created here, before the interrupts start (its creation is not what
    # this counts, and one interrupted every 2 ms may never finish on a busy machine)
    lg = seqstore.Logger("run.log", schema={"grad": seqstore.Field("float32", (4,))}, flush_bytes=4096,
                         commit_every_s=60, direct_io=False)
    stop = False

    def interrupter():  # a real SIGINT now and then while the main thread logs
        while not stop:
            time.sleep(random.uniform(0.0002, 0.002))
            os.kill(os.getpid(), signal.SIGINT)

    armed = False  # Python's own SIGINT handler, but only while a seqstore call runs (never in this script)

    def on_sigint(signum, frame):
        if armed:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    th = threading.Thread(target=interrupter)
    th.start()
    b = interrupts = 0
    while b < 300:
        try:
            armed = True
            lg.log([f"ex-{b}-{k}" for k in range(8)], {"grad": np.full((8, 4), b, np.float32)})
            armed = False
            b += 1  # an interrupted batch is logged again: what went in of it is skipped as logged
        except KeyboardInterrupt:
            armed = False
            interrupts += 1
    stop = True
    th.join()
    lg.close()
    print(interrupts, lg.num_logged, lg.num_committed, len(seqstore.open("run.log")), flush=True)
""")


def test_num_logged_counts_what_went_in_when_log_calls_are_interrupted(tmp_path: Path) -> None:
    """log() counted a batch's records as logged before copying them: a Ctrl-C during the copy left
    num_logged (and the exit line's count of pending records) above what was logged. Records are counted
    as they go into the buffer."""
    (tmp_path / "script.py").write_text(INTERRUPTED_LOGS)
    res = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    interrupts, logged, committed, records = (int(x) for x in res.stdout.split())
    assert interrupts > 0 and logged == committed == records == 2400, res.stdout


INTERRUPTED_FIRST_LOG = textwrap.dedent("""\
    import os, signal, sys, threading, time
    import numpy as np
    import seqstore

    armed = False  # Python's own SIGINT handler, but only while a seqstore call runs (never in this script)

    def on_sigint(signum, frame):
        if armed:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    main = threading.main_thread().ident
    starting = True
    budget = 0  # interrupts left for this trial

    def opening():  # inside Logger._start, where it opens its reader of the store
        f, names = sys._current_frames().get(main), set()
        while f is not None:
            names.add((f.f_code.co_name, os.path.basename(f.f_code.co_filename)))
            f = f.f_back
        return ("_start", "logger.py") in names and any(file == "reader.py" for _, file in names)

    def interrupter():  # a real SIGINT when the main thread is seen opening the store, a few per trial
        global budget
        while starting:
            if budget > 0 and opening():
                budget -= 1
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.001)
            time.sleep(0.0001)

    th = threading.Thread(target=interrupter, daemon=True)
    th.start()
    interrupts = 0
    for trial in range(5):
        lg = seqstore.Logger(f"run{trial}.log", commit_every_s=60, direct_io=False)
        budget = 3
        while True:
            try:
                armed = True
                lg.log([f"ex-0-{k}" for k in range(10)], {"grad": np.zeros((10, 4), np.float32)})
                armed = False
                break
            except KeyboardInterrupt:
                armed = False
                interrupts += 1
        if trial == 4:
            starting = False
            th.join()
        for b in range(1, 10):
            lg.log([f"ex-{b}-{k}" for k in range(10)], {"grad": np.full((10, 4), b, np.float32)})
        lg.close()
    print(interrupts, *(len(seqstore.open(f"run{t}.log")) for t in range(5)), flush=True)
""")


def test_first_log_interrupted_while_it_opens_the_store_is_finished_by_the_next(tmp_path: Path) -> None:
    """The first log() opens the store (schema inferred) and starts the background thread: a Ctrl-C in
    there left the logger with a schema but no reader or thread, and every later log() failed with a bare
    AssertionError. Now the next log() finishes the start and logs."""
    (tmp_path / "script.py").write_text(INTERRUPTED_FIRST_LOG)
    res = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    interrupts, *records = (int(x) for x in res.stdout.split())
    assert interrupts > 0 and records == [100] * 5, res.stdout
