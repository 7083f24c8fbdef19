"""``convert --workers N``: worker processes write parts, one commit; same records in the same order
as one process (only shard boundaries differ); a failing worker leaves nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore
from seqstore import cli
from seqstore.errors import SchemaError
from seqstore.interop import arrow as arrow_mod
from seqstore.interop import returnn as returnn_mod
from seqstore.interop.arrow import import_arrow, import_parquet

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402


def _table(first: int, n: int, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 9, n)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    values = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(int(lens.sum()) * 4).astype(np.float16)), 4)
    labels = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(lens % 3)]).astype(np.int32)),
                                      pa.array(rng.integers(0, 99, int((lens % 3).sum())).astype(np.int32)))
    return pa.table({"feat": pa.ListArray.from_arrays(offsets, values), "labels": labels,
                     "score": pa.array(rng.random(n).astype(np.float32)),
                     "id": pa.array([f"utt-{first + i}" for i in range(n)])})


def _same(a: seqstore.Store, b: seqstore.Store) -> None:
    assert len(a) == len(b) and a.schema == b.schema and a.metadata == b.metadata
    assert [a.id(i) for i in range(len(a))] == [b.id(i) for i in range(len(b))]
    for name in a.schema:
        for i in range(len(a)):
            np.testing.assert_array_equal(a[i][name], b[i][name])


@pytest.fixture
def small_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split even these small inputs into several units (the defaults keep small inputs in one process)."""
    monkeypatch.setattr(arrow_mod, "MIN_UNIT_RECORDS", 50)
    monkeypatch.setattr(returnn_mod, "MIN_UNIT_BYTES", 2000)


def test_parallel_parquet_equals_one_process_in_order(tmp_path: Path, small_units: None) -> None:
    src = tmp_path / "in"
    src.mkdir()
    first = 0
    for k, n in enumerate([400, 130, 333]):
        pq.write_table(_table(first, n, k), src / f"part-{k}.parquet", row_group_size=60)
        first += n
    one = import_parquet(src, tmp_path / "one.seqstore", id_column="id", workers=1)
    steps: list[int] = []

    class Bar:
        total = 0

        def __call__(self, n: int) -> None:
            steps.append(n)

        def add_total(self, n: int) -> None:
            Bar.total += n

    two = import_parquet(src, tmp_path / "two.seqstore", id_column="id", workers=2, progress=Bar())
    _same(one, two)
    assert [two.id(i) for i in (0, 400, 862)] == ["utt-0", "utt-400", "utt-862"]  # input order
    assert two.num_shards > one.num_shards  # one part (and shard) per unit of work
    assert sum(steps) == Bar.total == 863 and len(steps) > 3  # one bar over every worker
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "one.seqstore", "two.seqstore"]
    assert not (tmp_path / "two.seqstore" / "_parts").exists()
    assert seqstore.store.verify.verify(tmp_path / "two.seqstore") == []


def test_parallel_arrow_and_the_command_line(tmp_path: Path, small_units: None) -> None:
    path = tmp_path / "data.arrow"
    tables = [_table(0, 120, 0), _table(120, 90, 1), _table(210, 200, 2)]
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, tables[0].schema) as w:
        for t in tables:
            w.write_table(t, max_chunksize=40)
    one = import_arrow(path, tmp_path / "one.seqstore", id_column="id", workers=1)
    assert cli.main(["convert", "--from", "arrow", "--id-column", "id", "--workers", "3", "-q", str(path),
                     str(tmp_path / "three.seqstore")]) == 0
    three = seqstore.open(tmp_path / "three.seqstore")
    _same(one, three)
    assert three.num_shards > 1


def test_a_failing_worker_leaves_nothing(tmp_path: Path, small_units: None) -> None:
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(_table(0, 300, 0), src / "a.parquet", row_group_size=50)
    bad = _table(300, 300, 1)
    score = pa.array([None if i == 250 else 0.5 for i in range(300)], type=pa.float32())
    bad = bad.set_column(bad.schema.get_field_index("score"), "score", score)  # a null deep in file 2
    pq.write_table(bad, src / "b.parquet", row_group_size=50)
    out = tmp_path / "out.seqstore"
    with pytest.raises(SchemaError, match=r"b\.parquet, column 'score': has 1 null"):
        import_parquet(src, out, id_column="id", workers=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # no store, no temporary directory
    # an existing store is left as it was
    import_parquet(src / "a.parquet", out, id_column="id", workers=2)
    with pytest.raises(SchemaError, match="null"):
        import_parquet(src, out, id_column="id", workers=2, overwrite=True)
    assert len(seqstore.open(out)) == 300
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out.seqstore"]


def test_parallel_returnn_hdf_equals_one_process(tmp_path: Path, small_units: None) -> None:
    pytest.importorskip("h5py")
    pytest.importorskip("returnn")
    from interop_testlib import write_returnn_hdf

    files = [tmp_path / f"f{k}.hdf" for k in range(2)]
    for k, f in enumerate(files):
        write_returnn_hdf(f, n=120 + 40 * k, seed=k)
    one = returnn_mod.import_hdf(files, tmp_path / "one.seqstore", workers=1)
    two = returnn_mod.import_hdf(files, tmp_path / "two.seqstore", workers=2)
    _same(one, two)
    assert two.num_shards > 2
    assert two.id(120) == "corpus/seq-1-0"


_SCRIPT = """\
import os, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from seqstore.interop import arrow as arrow_mod
arrow_mod.MIN_UNIT_RECORDS = 50; path = sys.argv[1] + "/in.parquet"
if not os.path.exists(path): pq.write_table(pa.table({"x": pa.array(np.arange(400))}), path, row_group_size=50)
"""  # (the workers import the script again: the input is not rewritten under them)
_CALL = 'arrow_mod.import_parquet(sys.argv[1] + "/in.parquet", sys.argv[1] + "/out.seqstore", workers=2)\n'


@pytest.mark.parametrize("guarded", [False, True])
def test_parallel_conversion_from_an_unguarded_script_is_refused_first(tmp_path: Path, guarded: bool) -> None:
    """Workers start from a forkserver and re-import the script: a conversion started by its module-level
    code gets seqstore's MainGuardError before anything is written (not a dead pool); under the guard it runs."""
    script = tmp_path / "convert.py"
    script.write_text(_SCRIPT + ('if __name__ == "__main__":\n    ' + _CALL if guarded else _CALL))
    env = dict(os.environ)
    src = str(Path(seqstore.__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    res = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=120)
    if guarded:
        assert res.returncode == 0, res.stderr
        out = seqstore.open(tmp_path / "out.seqstore")
        assert len(out) == 400 and out.num_shards > 1  # written as parts by the workers
        return
    assert res.returncode == 1, res.stderr
    err = res.stderr
    assert "MainGuardError: a conversion with workers=2" in err and "line 6 starts them" in err, err
    assert str(script) in err and 'if __name__ == "__main__":' in err, err
    assert "An attempt has been made" not in err and "terminated abruptly" not in err, err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convert.py", "in.parquet"]  # nothing written


_BROKEN_BAR = """\
import sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from seqstore.interop import arrow as arrow_mod

def bar(n):
    raise RuntimeError("the progress bar broke")

if __name__ == "__main__":
    arrow_mod.MIN_UNIT_RECORDS = 50
    d = sys.argv[1]
    pq.write_table(pa.table({"x": pa.array(np.arange(20000))}), d + "/in.parquet", row_group_size=2000)
    try:  # chunk_bytes=8: one progress message per record, far more than the queue's pipe holds
        arrow_mod.import_parquet(d + "/in.parquet", d + "/out.seqstore", workers=2, chunk_bytes=8, progress=bar)
    except RuntimeError as exc:
        print("raised:", exc)
        sys.exit(3)
"""


def test_a_failing_progress_callback_fails_the_conversion_instead_of_hanging(tmp_path: Path) -> None:
    """The callback raised in the thread that reads the workers' progress, which then stopped reading: the
    queue's pipe filled, the workers could not exit and the conversion waited for them for ever. Now the
    queue is read to the end and the conversion fails with the callback's error, leaving nothing."""
    script = tmp_path / "convert.py"
    script.write_text(_BROKEN_BAR)
    env = dict(os.environ)
    src = str(Path(seqstore.__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    res = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 3, res.stderr
    assert "raised: the progress bar broke" in res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convert.py", "in.parquet"]  # nothing written


def test_a_failed_conversion_leaves_no_semaphore_to_a_progress_thread(tmp_path: Path, small_units: None) -> None:
    """The workers' progress went through a multiprocessing queue (named semaphores) read by a daemon
    thread; a conversion ended by an error or Ctrl-C waits for that thread one second only, and when it
    ended later (a slow progress callback, a loaded machine) it dropped the queue while the interpreter was
    exiting: the semaphores' cleanup was cut off, and the resource tracker warned of leaked semaphores.
    The conversion now leaves no semaphore of its own behind once it raised, whatever that thread does."""
    import gc
    import threading
    from multiprocessing.synchronize import SemLock

    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(_table(0, 300, 0), src / "a.parquet", row_group_size=50)
    bad = _table(300, 300, 1)
    score = pa.array([None if i == 250 else 0.5 for i in range(300)], type=pa.float32())
    pq.write_table(bad.set_column(bad.schema.get_field_index("score"), "score", score), src / "b.parquet",
                   row_group_size=50)
    release = threading.Event()

    def slow_bar(n: int) -> None:  # the progress thread is busy until the test is done
        release.wait(60)

    try:
        gc.collect()
        before = {id(o) for o in gc.get_objects() if isinstance(o, SemLock)}
        failed = False
        try:
            import_parquet(src, tmp_path / "out.seqstore", id_column="id", workers=2, progress=slow_bar)
        except SchemaError:
            failed = True
        assert failed
        gc.collect()
        left = [o for o in gc.get_objects() if isinstance(o, SemLock) and id(o) not in before]
        assert not left, left
    finally:
        release.set()


def test_a_store_made_at_the_path_during_a_parallel_conversion_is_never_replaced(tmp_path: Path,
                                                                                 small_units: None) -> None:
    """Without overwrite, the output path was checked only before the workers ran: a store another process
    made there meanwhile was renamed aside and deleted when the conversion installed its own. It is kept;
    the conversion raises OutputExistsError and leaves nothing of its own."""
    from seqstore.interop._common import OutputExistsError

    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(_table(0, 300, 0), src / "a.parquet", row_group_size=50)
    out = tmp_path / "out.seqstore"

    def theirs(n: int) -> None:  # someone else's store appears at out while the workers write
        if not out.exists():
            with seqstore.create(out, {"x": seqstore.Field("int32")}) as w:
                w.append({"x": 7}, id="theirs")

    with pytest.raises(OutputExistsError, match=str(out)):
        import_parquet(src, out, id_column="id", workers=2, progress=theirs)
    store = seqstore.open(out)
    assert len(store) == 1 and store.id(0) == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out.seqstore"]


def test_a_worker_killed_by_the_os_is_an_error_naming_its_unit(tmp_path: Path) -> None:
    """A worker ended by the operating system (out of memory: SIGKILL) surfaced as a bare
    BrokenProcessPool ('A process in the process pool was terminated abruptly...'), naming no unit
    and no input. It is a SeqstoreError naming the units not written and their inputs; nothing is left."""
    from support.jobs import KillingJob

    from seqstore.errors import SeqstoreError
    from seqstore.interop._parallel import convert_in_parallel

    job = KillingJob(victim=1)
    with pytest.raises(SeqstoreError, match=r"worker process ended abruptly.*unit 2 of 3 \(input-1\)"):
        convert_in_parallel(tmp_path / "out.seqstore", seqstore.Schema({"x": seqstore.Field("int64")}),
                            [(job, k) for k in range(3)], 3, overwrite=False, shard_bytes=1 << 20, metadata=None,
                            workers=2, progress=None)
    assert list(tmp_path.iterdir()) == []
