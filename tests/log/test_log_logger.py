"""Logger: round trips (bfloat16, float16, ints), schema inference and errors, duplicates, failures."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import seqstore as ss
from seqstore.log import DuplicateIdError, Logger, LoggerError
from seqstore.store.verify import verify


def _batch(start: int, n: int, dtype: torch.dtype = torch.float32) -> tuple[list[str], dict[str, Any]]:
    g = torch.Generator().manual_seed(start)
    return [f"ex{i}" for i in range(start, start + n)], {
        "fc1": {"grad": torch.randn(n, 8, 8, generator=g).to(dtype)},
        "fc2": {"grad": torch.randn(n, 5, generator=g).to(dtype)},
        "loss": torch.rand(n, generator=g).to(dtype),
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_round_trip(scratch: Path, dtype: torch.dtype) -> None:
    sent = []
    with Logger(scratch / "log", flush_bytes=4096, commit_every_s=30) as lg:
        for b in range(0, 200, 25):
            ids, t = _batch(b, 25, dtype)
            lg.log(ids, t)
            sent.append(t)
    st = ss.open(scratch / "log")
    assert len(st) == 200 and st.num_shards >= 1 and verify(scratch / "log") == []
    assert list(st.groups) == ["packed"] and st.schema["fc1/grad"].shape == (8, 8)
    want_dtype = "bfloat16" if dtype == torch.bfloat16 else str(dtype).removeprefix("torch.")
    assert ss.Field(want_dtype).dtype == st.schema["loss"].dtype
    for name in ("fc1/grad", "fc2/grad", "loss"):
        a, b = name.split("/") if "/" in name else (name, None)
        ref = torch.cat([t[a][b] if b else t[a] for t in sent])
        if dtype == torch.bfloat16:  # stored bits == torch's own bfloat16 bits
            ref_np = ref.view(torch.int16).numpy().view(np.uint16)
        else:
            ref_np = ref.numpy()
        got = st.get_batch(np.arange(200), fields=[name])[name]
        np.testing.assert_array_equal(got, ref_np)
    assert st.index("ex137") == 137 and st.id(5) == "ex5"
    nested = st.nested(3)
    assert set(nested) == {"fc1", "fc2", "loss"} and nested["fc1"]["grad"].shape == (8, 8)
    if dtype == torch.bfloat16:
        f32 = ss.open(scratch / "log", bfloat16="float32")
        np.testing.assert_array_equal(f32[7]["fc2/grad"], sent[0]["fc2"]["grad"][7].float().numpy())


def test_numpy_int_and_explicit_schema(scratch: Path) -> None:
    schema = {"emb": ss.Field("float32", (4,)), "label": ss.Field("int64"), "mask": ss.Field("bool", (3,))}
    with Logger(scratch / "log", schema=schema, packed=False) as lg:
        lg.log(
            np.arange(5),
            {"emb": np.ones((5, 4), np.float64), "label": np.arange(5, dtype=np.int32), "mask": np.ones((5, 3), bool)},
        )
        lg.log(
            torch.arange(5, 7),
            {"emb": torch.zeros(2, 4), "label": torch.tensor([7, 8]), "mask": torch.zeros(2, 3, dtype=torch.bool)},
        )
    st = ss.open(scratch / "log")
    assert st.groups == {} and st.manifest.version == 3
    assert st.index("6") == 6 and st[6]["label"] == 8 and st[0]["emb"].dtype == np.float32


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "complex64", "complex128"])
def test_a_bfloat16_tensor_logged_into_a_wider_float_field_keeps_its_values(scratch: Path, dtype: str) -> None:
    """A bfloat16 tensor into a float32/float16/float64 field: its raw bits were stored as numbers (1.5 became
    16320.0); an integer field refuses it, naming the field. A complex field, which takes float32, refused it."""
    schema = {"g": ss.Field(dtype, (3,)), "n": ss.Field("int32", (3,))}
    n = torch.ones(1, 3, dtype=torch.int32)
    with Logger(scratch / "log", schema=schema) as lg:
        lg.log(["a"], {"g": torch.full((1, 3), 1.5, dtype=torch.bfloat16), "n": n})
        with pytest.raises(ss.SchemaError, match="field 'n' of id 'b': cannot store bfloat16 values in a int32"):
            lg.log(["b"], {"g": torch.ones(1, 3), "n": torch.ones(1, 3, dtype=torch.bfloat16)})
        if dtype == "float16":
            with pytest.raises(ss.SchemaError, match="field 'g' of id 'c': value 99840.0 .* overflows dtype float16"):
                lg.log(["c"], {"g": torch.full((1, 3), 1e5, dtype=torch.bfloat16), "n": n})
    assert ss.open(scratch / "log")[0]["g"].tolist() == [1.5, 1.5, 1.5]


def test_schema_errors_name_id_and_field(scratch: Path) -> None:
    with Logger(scratch / "log") as lg:
        ids, t = _batch(0, 4)
        lg.log(ids, t)
        ids, t = _batch(4, 4)
        del t["fc2"]
        with pytest.raises(ss.SchemaError, match=r"id 'ex4'.*missing field\(s\) \['fc2/grad'\]"):
            lg.log(ids, t)
        ids, t = _batch(4, 4)
        t["fc1"]["grad"] = torch.zeros(4, 8, 9)
        with pytest.raises(ss.SchemaError, match=r"field 'fc1/grad' of id 'ex4'.*\(8, 8\).*\(8, 9\)"):
            lg.log(ids, t)
        ids, t = _batch(4, 4)
        t["extra"] = torch.zeros(4)
        with pytest.raises(ss.SchemaError, match="unknown field"):
            lg.log(ids, t)
        ids, t = _batch(4, 4)
        t["loss"] = torch.zeros(3)
        with pytest.raises(ss.SchemaError, match="3 rows for 4 ids"):
            lg.log(ids, t)
        ids, t = _batch(4, 4)
        t["loss"] = torch.zeros(4, dtype=torch.complex64)
        with pytest.raises(ss.SchemaError, match="'loss'"):
            lg.log(ids, t)
        with pytest.raises(ss.SchemaError, match="str or an int"):
            lg.log([1.5, 2.5, 3.5, 4.5], _batch(4, 4)[1])
        lg.log(*_batch(4, 4))  # still usable; nothing of the bad batches was logged
    st = ss.open(scratch / "log")
    assert len(st) == 8 and [st.id(i) for i in range(8)] == [f"ex{i}" for i in range(8)]


def test_schema_mismatch_with_existing_log(scratch: Path) -> None:
    with Logger(scratch / "log") as lg:
        lg.log(*_batch(0, 2))
    with Logger(scratch / "log") as lg:  # reopens with the store's schema
        lg.log(*_batch(2, 2))
    assert len(ss.open(scratch / "log")) == 4
    with pytest.raises(ss.SchemaError, match="existing store"):
        Logger(scratch / "log", schema={"other": ss.Field("float32")})


def test_a_relative_path_stays_where_it_was_after_a_chdir(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Logger given a relative path, then os.chdir (as some launchers do): its next log() failed with "no
    such store", and a logger not started yet created its store in the new directory."""
    (scratch / "elsewhere").mkdir()
    monkeypatch.chdir(scratch)
    started = Logger("run.log", schema={"g": ss.Field("float32", (2,))})
    lazy = Logger("lazy.log")
    started.log(["a"], {"g": np.ones((1, 2), np.float32)})
    started.flush()
    monkeypatch.chdir(scratch / "elsewhere")
    started.log(["b", "a"], {"g": np.ones((2, 2), np.float32)})
    lazy.log(["c"], {"g": np.ones((1, 2), np.float32)})
    started.close()
    lazy.close()
    assert [ss.open(scratch / "run.log").id(i) for i in range(2)] == ["a", "b"]
    assert len(ss.open(scratch / "lazy.log")) == 1 and not any((scratch / "elsewhere").iterdir())


@pytest.mark.parametrize("policy", ["keep_first", "error"])  # (keep_last is refused at open: id_lookup "first")
def test_a_store_whose_records_have_no_ids_is_a_schema_error(scratch: Path, policy: str) -> None:
    """Logging into an existing store written without ids raised KeyError from the id lookup of every log()."""
    with ss.create(scratch / "log", {"g": ss.Field("float32", (2,))}) as w:
        w.append({"g": np.zeros(2, np.float32)})
    with Logger(scratch / "log", on_duplicate=policy) as lg:
        with pytest.raises(ss.SchemaError, match=r"log\(\): .*/log: its records have no ids; a Logger logs"):
            lg.log(["a"], {"g": np.ones((1, 2), np.float32)})
    assert len(ss.open(scratch / "log")) == 1 and verify(scratch / "log") == []


@pytest.mark.parametrize("policy", ["keep_first", "keep_last", "error"])
def test_duplicate_policies(scratch: Path, policy: str) -> None:
    lg = Logger(scratch / "log", on_duplicate=policy, flush_bytes=2048)
    ids, t = _batch(0, 6)
    lg.log(ids, t)
    lg.flush()  # ex0..ex5 committed
    ids2, t2 = _batch(100, 6)
    ids2 = ["ex1", "new1", "new1", "ex4", "new2", "new3"]  # committed dup, in-batch dup
    if policy == "error":
        with pytest.raises(DuplicateIdError, match="'ex1'"):
            lg.log(ids2, t2)
        lg.log(["new9"], {k: ({"grad": v["grad"][:1]} if isinstance(v, dict) else v[:1]) for k, v in t2.items()})
        with pytest.raises(DuplicateIdError, match="new9"):  # in flight, not committed yet
            lg.log(["new9"], {k: ({"grad": v["grad"][:1]} if isinstance(v, dict) else v[:1]) for k, v in t2.items()})
        lg.close()
        assert len(ss.open(scratch / "log")) == 7
        return
    lg.log(ids2, t2)
    lg.log(
        ["new2"], {k: ({"grad": v["grad"][5:6]} if isinstance(v, dict) else v[5:6]) for k, v in t2.items()}
    )  # in flight
    lg.close()
    st = ss.open(scratch / "log")
    loss = st.get_batch(np.arange(len(st)), fields=["loss"])["loss"]
    if policy == "keep_first":
        assert len(st) == 9 and lg.num_skipped == 4
        assert [st.id(i) for i in range(6, 9)] == ["new1", "new2", "new3"]
        assert st.manifest.stats["duplicates_skipped"] == 4
        assert loss[st.index("ex1")] == t["loss"][1].item() and loss[st.index("new2")] == t2["loss"][4].item()
    else:
        assert len(st) == 13 and st.manifest.version == 3 and st.manifest.id_lookup == "last"
        assert st.manifest.stats["duplicates_superseded"] == 4
        assert loss[st.index("ex1")] == t2["loss"][0].item()  # the last write wins
        assert loss[st.index("new1")] == t2["loss"][2].item()
        assert loss[st.index("new2")] == t2["loss"][5].item()
        assert st.index("ex0") == 0


def test_duplicate_error_tells_in_batch_repeats_from_logged_ids(scratch: Path) -> None:
    lg = Logger(scratch / "log", on_duplicate="error", flush_bytes=2048)
    ids, t = _batch(0, 4)
    with pytest.raises(DuplicateIdError) as err:  # never logged: only repeated inside the batch
        lg.log(["a", "b", "a", "c"], t)
    msg = str(err.value)
    assert "1 id(s) repeated inside this batch: ['a']" in msg and "already logged" not in msg
    lg.log(ids, t)  # ex0..ex3, in flight
    with pytest.raises(DuplicateIdError) as err:
        lg.log(["ex2", "n1", "n1", "n2"], t)
    msg = str(err.value)
    assert "1 id(s) already logged to" in msg and "['ex2']" in msg
    assert "1 id(s) repeated inside this batch: ['n1']" in msg
    lg.close()
    assert [ss.open(scratch / "log").id(i) for i in range(4)] == ids


def test_background_failure_surfaces_and_committed_records_survive(scratch: Path) -> None:
    lg = Logger(scratch / "log", flush_bytes=8192, commit_every_s=60)
    lg.log(*_batch(0, 10))
    lg.flush()
    calls = {"n": 0}
    real = lg._write_buffer

    def failing(buf: Any) -> None:
        calls["n"] += 1
        raise OSError(28, "No space left on device (injected)")

    lg._write_buffer = failing  # type: ignore[method-assign]
    with pytest.raises(LoggerError, match="No space left") as info:
        for b in range(10, 2000, 10):  # fills buffers until the failure comes back
            lg.log(*_batch(b, 10))
    assert isinstance(info.value.__cause__, OSError) and calls["n"] >= 1
    with pytest.raises(LoggerError):
        lg.log(*_batch(5000, 1))
    with pytest.raises(LoggerError):
        lg.close()
    with pytest.raises(LoggerError, match="No space left"):  # and again by every later call
        lg.close()
    del real
    st = ss.open(scratch / "log")
    assert len(st) == 10 and verify(scratch / "log") == []
    assert [st.id(i) for i in range(10)] == [f"ex{i}" for i in range(10)]
    assert not any(p.name.startswith("_tmp-") for p in (scratch / "log").iterdir())
    assert not any((scratch / "log" / "_tmp").glob("*"))  # version 3 keeps workspaces in _tmp/


def test_failure_at_close_is_raised(scratch: Path) -> None:
    lg = Logger(scratch / "log")
    lg.log(*_batch(0, 3))

    def failing(buf: Any) -> None:
        raise RuntimeError("disk gone")

    lg._write_buffer = failing  # type: ignore[method-assign]
    with pytest.raises(LoggerError, match="disk gone"):
        lg.close()
    assert len(ss.open(scratch / "log")) == 0


def test_a_failure_is_raised_again_by_every_later_close(scratch: Path) -> None:
    """docs/logging.md: the failure is raised by the next call "and again by every later call"; a
    second close after a clean one does nothing."""
    lg = Logger(scratch / "log")
    lg.log(*_batch(0, 3))

    def failing(buf: Any) -> None:
        raise RuntimeError("disk gone")

    lg._write_buffer = failing  # type: ignore[method-assign]
    for _ in range(3):
        with pytest.raises(LoggerError, match="disk gone") as info:
            lg.close()
        assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(LoggerError, match="disk gone"):
        lg.log(*_batch(3, 1))
    ok = Logger(scratch / "ok")
    ok.log(*_batch(0, 3))
    ok.close()
    ok.close()
    assert len(ss.open(scratch / "ok")) == 3


def test_memory_is_bounded_and_log_blocks(scratch: Path) -> None:
    lg = Logger(scratch / "log", flush_bytes=4096)
    gate = threading.Event()
    lg.log(*_batch(0, 1))  # starts the logger
    real = lg._write_buffer

    def slow(buf: Any) -> None:
        gate.wait()
        real(buf)

    lg._write_buffer = slow  # type: ignore[method-assign]
    done = threading.Event()

    def producer() -> None:
        for b in range(1, 400, 8):
            lg.log(*_batch(b, 8))
        done.set()

    th = threading.Thread(target=producer)
    th.start()
    assert not done.wait(0.5)  # blocked: both buffers busy
    assert len(lg._buffers) == 2
    gate.set()
    th.join(30)
    assert done.is_set()
    lg.close()
    assert len(ss.open(scratch / "log")) == 401


def test_commit_every_s(scratch: Path) -> None:
    import time

    lg = Logger(scratch / "log", commit_every_s=0.1)
    lg.log(*_batch(0, 3))
    time.sleep(0.3)
    lg.log(*_batch(3, 3))  # older than commit_every_s: handed off and committed
    deadline = time.monotonic() + 10
    while len(ss.open(scratch / "log")) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(ss.open(scratch / "log")) == 6
    lg.close()


def test_records_logged_before_a_pause_are_committed_without_another_log(scratch: Path) -> None:
    """A pause with no log() call (evaluation): the partly filled buffer is committed after about
    commit_every_s, not left until the next log(); logging goes on normally after it."""
    lg = Logger(scratch / "log", commit_every_s=0.2)
    lg.log(*_batch(0, 3))
    lg.log(["ex1", "ex3"], _batch(3, 2)[1])  # keep_first: ex1 skipped (in flight), ex3 kept
    deadline = time.monotonic() + 10
    while lg.num_committed < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    st = ss.open(scratch / "log")
    assert lg.num_committed == 4 and len(st) == 4 and st.manifest.stats.get("duplicates_skipped") == 1
    lg.log(["ex0", "ex3", "ex9"], _batch(9, 3)[1])  # ex0, ex3 committed now: skipped
    lg.close()
    st = ss.open(scratch / "log")
    assert [st.id(i) for i in range(len(st))] == ["ex0", "ex1", "ex2", "ex3", "ex9"]
    assert st.manifest.stats["duplicates_skipped"] == 3 and verify(scratch / "log") == []


def test_a_background_start_failure_is_raised_not_hung(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import seqstore.log.logger as logger_mod

    def broken() -> None:
        raise RuntimeError("kernel cache unreadable")

    monkeypatch.setattr(logger_mod, "_warm_up_kernels", broken)
    lg = Logger(tmp_path / "log")
    with pytest.raises(LoggerError, match="kernel cache unreadable"):
        for k in range(5):  # the failure surfaces at a later call; nothing may block
            lg.log([f"id{k}"], {"g": np.ones((1, 4), np.float32)})
            lg.flush()
    with pytest.raises(LoggerError):
        lg.close()


def test_ids_held_in_python_are_bounded_by_count(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny records: a buffer holds at most MAX_BUFFER_RECORDS records, and more than MAX_INFLIGHT_IDS
    uncommitted ids make the logger commit early, long before commit_every_s."""
    import seqstore.log.logger as logger_mod

    monkeypatch.setattr(logger_mod, "MAX_BUFFER_RECORDS", 64)
    monkeypatch.setattr(logger_mod, "MAX_INFLIGHT_IDS", 200)
    lg = Logger(scratch / "log", commit_every_s=1e9)  # default flush_bytes would hold 16 Mi losses
    peak = 0
    for b in range(40):
        lg.log([f"id{b}-{k}" for k in range(32)], {"loss": np.full(32, b, np.float32)})
        peak = max(peak, len(lg._ids))
        if b == 20:  # let the early commit land
            deadline = time.monotonic() + 10
            while lg.num_committed == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
    assert lg._cap == 64
    assert lg.num_committed > 0 and len(ss.open(scratch / "log")) > 0  # committed without flush/close
    assert peak <= 200 + 3 * 64
    lg.close()
    st = ss.open(scratch / "log")
    assert len(st) == 1280 and st.index("id39-31") == 1279 and verify(scratch / "log") == []


def test_ids_array_of_bytes_or_floats_is_refused_not_stringified(scratch: Path) -> None:
    """A numpy array of bytes ids (as h5py or Arrow give them) or a float tensor used to be stored as
    "b'ex0'" and "0.0"; a list of the same values was refused. Both are now a SchemaError naming the id."""
    _, t = _batch(0, 2)
    with Logger(scratch / "log", flush_bytes=4096) as lg:
        with pytest.raises(ss.SchemaError, match="bytes b'ex0'"):
            lg.log(np.array([b"ex0", b"ex1"]), t)
        with pytest.raises(ss.SchemaError, match="float 0.0"):
            lg.log(torch.tensor([0.0, 1.0]), t)
        lg.log(np.array(["ex0", "ex1"]), t)
        lg.log(np.array([7, 8]), t)
    st = ss.open(scratch / "log")
    assert [st.id(i) for i in range(len(st))] == ["ex0", "ex1", "7", "8"]


@pytest.mark.parametrize("statement", ["buf.n += take", "self._ids.add(buf)"])
def test_a_batch_interrupted_while_buffered_can_be_logged_again(scratch: Path, statement: str) -> None:
    """Ctrl-C inside log(), caught by the program, which logs the batch again (keep_first): its ids used to
    stay marked as logged though their rows were never counted, so the second log() skipped them and the
    records were lost. Now no record is lost, and none is stored twice."""
    import inspect
    import sys


    code = Logger._append.__code__
    lines, first = inspect.getsourcelines(Logger._append)
    line = first + next(k for k, text in enumerate(lines) if text.strip() == statement)

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is not code:
            return None

        def at_line(f: Any, e: str, a: Any) -> Any:
            if e == "line" and f.f_lineno == line:
                sys.settrace(None)
                f.f_trace = None
                raise KeyboardInterrupt  # as a Ctrl-C arriving right before that statement
            return at_line

        return at_line

    x = np.ones((2, 4), np.float32)
    with Logger(scratch / "log", flush_bytes=1 << 16) as lg:
        lg.log(["a", "b"], {"x": x})
        sys.settrace(trace)
        try:
            with pytest.raises(KeyboardInterrupt):
                lg.log(["c", "d"], {"x": x})
        finally:
            sys.settrace(None)
        lg.log(["c", "d"], {"x": x})
        lg.flush()
        lg.log(["e"], {"x": x[:1]})
    st = ss.open(scratch / "log")
    ids = [st.id(i) for i in range(len(st))]
    assert sorted(ids) == ["a", "b", "c", "d", "e"], ids
    assert verify(scratch / "log") == []


def test_an_empty_batch_is_a_no_op_and_its_errors_are_schema_errors(scratch: Path) -> None:
    """log([], ...) once the schema is known (a batch whose examples were all filtered out) used to fail with
    numpy's "cannot reshape array of size 0" for packed fields, and with IndexError for a wrong field."""
    with Logger(scratch / "log", flush_bytes=4096) as lg:
        ids, t = _batch(0, 3)
        lg.log(ids, t)
        empty = {"fc1": {"grad": torch.zeros(0, 8, 8)}, "fc2": {"grad": torch.zeros(0, 5)}, "loss": torch.zeros(0)}
        lg.log([], empty)
        with pytest.raises(ss.SchemaError, match=r"an empty batch: missing field\(s\) \['loss'\]"):
            lg.log([], {"fc1": empty["fc1"], "fc2": empty["fc2"]})
        with pytest.raises(ss.SchemaError, match=r"field 'fc2/grad' of id None: expected per-example shape \(5,\)"):
            lg.log([], {**empty, "fc2": {"grad": torch.zeros(0, 6)}})
        lg.log(*_batch(3, 2))
    assert len(ss.open(scratch / "log")) == 5 and lg.num_logged == 5


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_tensor_into_a_float_field(scratch: Path, dtype: torch.dtype) -> None:
    """A float8 tensor (numpy has no float8 dtype) logged into a float32, float16 or bfloat16 field is stored
    exactly (it was a bare TypeError from torch's .numpy()); into an int field it is a SchemaError naming
    the field; with no schema the inference names the field and the dtype."""
    x = torch.tensor([[0.5, -2.0], [448.0 if dtype == torch.float8_e4m3fn else 57344.0, 0.0]]).to(dtype)
    for k, fdtype in enumerate(("float32", "float16", "bfloat16")):
        with Logger(scratch / f"log{k}", schema={"x": ss.Field(fdtype, (2,))}) as lg:
            lg.log(["a", "b"], {"x": x})
        got = ss.open(scratch / f"log{k}", bfloat16="float32").get_batch([0, 1])["x"]
        np.testing.assert_array_equal(got.astype(np.float32), x.float().numpy())
    with Logger(scratch / "int", schema={"x": ss.Field("int32", (2,))}) as lg:
        with pytest.raises(ss.SchemaError, match="field 'x'"):
            lg.log(["a", "b"], {"x": x})
    with Logger(scratch / "inferred") as lg:
        with pytest.raises(ss.SchemaError, match="field 'x'.*float8"):
            lg.log(["a", "b"], {"x": x})


@pytest.mark.parametrize(("first", "then"), [("keep_first", "keep_last"), ("keep_last", "keep_first"),
                                             ("keep_last", "error")])
def test_reopening_a_log_with_another_on_duplicate_names_the_policies(scratch: Path, first: str, then: str) -> None:
    """The refusal said "existing store has id_lookup 'first', expected 'last'": an argument the Logger
    does not have; it names on_duplicate, the log's and the one given, and nothing is changed."""
    with Logger(scratch / "log", on_duplicate=first) as lg:
        lg.log(["a"], {"g": np.ones((1, 2), np.float32)})
    with pytest.raises(ss.SchemaError) as err:
        Logger(scratch / "log", on_duplicate=then)
    msg = str(err.value)
    assert "id_lookup" not in msg and f"on_duplicate={then!r}" in msg, msg
    assert ("on_duplicate='keep_last'" if first == "keep_last" else "'keep_first' or 'error'") in msg, msg
    assert len(ss.open(scratch / "log")) == 1 and verify(scratch / "log") == []


def test_complex_tensors_round_trip(scratch: Path) -> None:
    """complex64/complex128 (numpy or torch) are logged as they are and read back exactly (docs/logging.md)."""
    z = (np.arange(12, dtype=np.float32).reshape(3, 4) * (1 - 2j)).astype(np.complex64)
    with Logger(scratch / "log") as lg:
        lg.log(["a", "b", "c"], {"z": z, "t": torch.from_numpy(z.astype(np.complex128)), "r": z.real.copy()})
    st = ss.open(scratch / "log")
    assert st.schema["z"].dtype == "<c8" and st.schema["t"].dtype == "<c16" and len(st.groups) == 3
    np.testing.assert_array_equal(st.matrix("z"), z)
    np.testing.assert_array_equal(st.nested(1, copy=True)["t"], z[1])
    assert st[2]["z"].dtype == np.complex64 and st.index("c") == 2


def test_a_value_of_rows_of_different_lengths_is_a_schema_error_naming_the_field(scratch: Path) -> None:
    """A field given as a list of rows of different lengths raised numpy's bare ValueError ("inhomogeneous
    shape"), naming neither the field nor the batch, both when it inferred the schema and after."""
    with Logger(scratch / "log") as lg:
        with pytest.raises(ss.SchemaError, match=r"log\(\): field 'g' .*id 'a'.*inhomogeneous"):
            lg.log(["a", "b"], {"g": [[1.0, 2.0], [3.0]]})
        lg.log(["a", "b"], {"g": [[1.0, 2.0], [3.0, 4.0]]})
        with pytest.raises(ss.SchemaError, match=r"log\(\): field 'g' .*id 'c'.*inhomogeneous"):
            lg.log(["c", "d"], {"g": [[1.0, 2.0], [3.0]]})
    assert len(ss.open(scratch / "log")) == 2


@pytest.mark.parametrize("ids", [None, 7, 2.5])
def test_ids_that_are_not_a_sequence_are_a_schema_error(scratch: Path, ids: Any) -> None:
    """ids=None or one int/float instead of a list raised a bare TypeError ("'NoneType' object is not iterable")."""
    with Logger(scratch / "log") as lg:
        with pytest.raises(ss.SchemaError, match=r"log\(\): ids must be a sequence .*got "):
            lg.log(ids, {"g": np.zeros((1, 2), np.float32)})
        lg.log([7], {"g": np.zeros((1, 2), np.float32)})
    assert ss.open(scratch / "log").id(0) == "7"


@pytest.mark.parametrize("option, value", [("commit_every_s", float("nan")), ("flush_bytes", "64M"),
                                           ("shard_bytes", None), ("commit_every_s", 0), ("flush_bytes", True)])
def test_a_size_or_interval_that_is_no_positive_number_is_named(scratch: Path, option: str, value: Any) -> None:
    """commit_every_s=nan was taken (no timed commit ever came: every comparison with nan is false);
    flush_bytes="64M" or shard_bytes=None raised a bare TypeError ("'<=' not supported"), and 0 said only
    "flush_bytes, commit_every_s and shard_bytes must be positive". Each names the option, the value and
    the log, and nothing is made."""
    with pytest.raises(ValueError, match=rf"Logger .*/log: {option} must be a positive number, got {value!r}"):
        Logger(scratch / "log", schema={"g": ss.Field("float32", (2,))}, **{option: value})
    assert not (scratch / "log").exists()


@pytest.mark.parametrize("option, value", [("packed", "yes"), ("rank", "a"), ("metadata", [1])])
def test_an_option_of_the_wrong_kind_is_named(scratch: Path, option: str, value: Any) -> None:
    """packed="yes" raised AttributeError ("'str' object has no attribute 'items'") from inside the
    store's creation, rank="a" int()'s bare ValueError, metadata=[1] dict()'s TypeError: each a TypeError
    naming the log, the option and what it takes, before anything is made."""
    with pytest.raises(TypeError, match=rf"Logger .*/log: {re.escape(f'{option}={value!r}')}: expected "):
        Logger(scratch / "log", schema={"g": ss.Field("float32", (2,))}, **{option: value})
    assert not (scratch / "log").exists()


def _manifest_blocker(root: Path) -> Path:
    """A directory in the way of this process's next manifest save into ``root`` (a full disk at the
    staging directory, as far as a commit can tell): the commit fails with the records intact."""
    import os

    blocker = root / "_tmp" / f".manifest.json.tmp-{os.getpid()}"
    blocker.mkdir()
    return blocker


def test_a_failed_automatic_commit_loses_and_repeats_no_record(scratch: Path) -> None:
    """The writer's automatic commit of a full shard failed (AutoCommitError, the records intact): the
    Logger treated it as a broken writer, and close() discarded every uncommitted record although the
    writer held them. It now raises LoggerCommitError (a LoggerError), keeps what the writer took and the
    rest of its buffers, and flush()/close() retry: once the commit succeeds every record is stored once."""
    from seqstore.log import LoggerCommitError

    root = scratch / "log"
    lg = Logger(root, flush_bytes=4096, shard_bytes=8192, commit_every_s=60)

    def batch(start: int, n: int) -> tuple[list[str], dict[str, Any]]:
        return [f"ex{i}" for i in range(start, start + n)], {"g": np.arange(start, start + n, dtype=np.float32)[:, None]
                                                             * np.ones((1, 64), np.float32)}

    lg.log(*batch(0, 8))
    lg.flush()
    blocker = _manifest_blocker(root)
    logged = 8
    with pytest.raises(LoggerCommitError, match="Is a directory") as info:
        for start in range(8, 400, 8):
            lg.log(*batch(start, 8))
            logged = start + 8
    assert isinstance(info.value, LoggerError) and "nothing logged is lost" in str(info.value)
    with pytest.raises(LoggerCommitError):  # no new records until a commit succeeds
        lg.log(*batch(1000, 1))
    with pytest.raises(LoggerCommitError):  # the retry fails again: still nothing lost
        lg.flush()
    blocker.rmdir()
    lg.flush()  # the retry succeeds: the logger is usable again
    lg.log(*batch(logged, 8))
    _manifest_blocker(root)
    with pytest.raises(LoggerCommitError):
        lg.close()
    (root / "_tmp" / blocker.name).rmdir()
    lg.close()  # a second close retries
    lg.close()
    st = ss.open(root)
    want = list(range(logged + 8))
    assert len(st) == len(want) and lg.num_committed == len(want) and verify(root) == []
    assert [st.id(i) for i in range(len(st))] == [f"ex{i}" for i in want]
    assert st.get_batch(np.arange(len(st)), fields=["g"])["g"][:, 0].tolist() == want
    assert st.manifest.stats["rank-0/records"] == len(want)


def test_byte_sizes_given_as_floats_are_taken_and_infinity_is_named(scratch: Path) -> None:
    """The Logger took any positive number for its byte sizes: shard_bytes=1e9 passed, then the first log()
    raised the writer's bare TypeError (naming neither the log nor the option) and nothing was logged;
    flush_bytes=inf raised int()'s bare OverflowError. A whole number of bytes given as a float is taken;
    infinity is a ValueError naming the log and the option."""
    with Logger(scratch / "log", shard_bytes=1e9, flush_bytes=4096.0) as lg:
        lg.log(["a"], {"g": np.ones((1, 4), np.float32)})
    assert ss.open(scratch / "log").id(0) == "a"
    for option in ("flush_bytes", "shard_bytes"):
        with pytest.raises(ValueError, match=rf"Logger .*/other: {option} must be a positive number, got inf"):
            Logger(scratch / "other", **{option: float("inf")})
    assert not (scratch / "other").exists()


def test_a_commit_still_failing_at_exit_is_said_and_leaves_no_workspace(scratch: Path) -> None:
    """At interpreter exit (the hook store/write/at_exit.py calls) a Logger whose commit still fails says
    how many records it discards and removes its workspace; committed records stay."""
    from seqstore.log import LoggerCommitError

    root = scratch / "log"
    lg = Logger(root, flush_bytes=4096, commit_every_s=60)
    lg.log(["a", "b"], {"g": np.ones((2, 4), np.float32)})
    lg.flush()
    blocker = _manifest_blocker(root)
    lg.log(["c"], {"g": np.ones((1, 4), np.float32)})
    with pytest.raises(LoggerCommitError):
        lg.flush()
    line = lg._commit_at_exit("exit")
    assert line is not None and "logger not closed at exit; its commit failed" in line
    assert "1 uncommitted record(s) discarded" in line
    blocker.rmdir()
    assert list((root / "_tmp").iterdir()) == [] and len(ss.open(root)) == 2
    with pytest.raises(LoggerError):  # and every later call says so
        lg.close()


@pytest.mark.parametrize("rank, error", [(-1, ValueError), (True, TypeError)])
def test_a_rank_that_is_no_process_rank_is_named(scratch: Path, rank: Any, error: type[Exception]) -> None:
    """rank=-1 was taken (its counts went to stats["rank--1/records"]) and rank=True was taken as rank 1:
    each is now refused, naming the log and the option, before anything is made."""
    with pytest.raises(error, match=rf"Logger .*/log: rank={rank!r}: expected an int >= 0"):
        Logger(scratch / "log", schema={"g": ss.Field("float32", (2,))}, rank=rank)
    assert not (scratch / "log").exists()


def test_a_packing_that_does_not_fit_the_logged_fields_names_the_log(scratch: Path) -> None:
    """packed={"grp": ["nope"]} was refused at the first log() by the schema's SchemaError, which named
    neither the log nor the option: it now names both; nothing is made and the logger takes nothing."""
    lg = Logger(scratch / "log", packed={"grp": ["nope"]})
    want = r"Logger .*/log: packed=\{'grp': \['nope'\]\}: packed group 'grp': no field"
    with pytest.raises(ss.SchemaError, match=want):
        lg.log(["a"], {"g": np.ones((1, 3), np.float32)})
    assert not (scratch / "log").exists()
    lg.close()
    with Logger(scratch / "log") as lg:
        lg.log(["a"], {"g": np.ones((1, 3), np.float32)})
    with Logger(scratch / "log", packed={"grp": ["nope"]}) as lg:  # ignored: the store exists
        lg.log(["b"], {"g": np.ones((1, 3), np.float32)})
    assert len(ss.open(scratch / "log")) == 2


def test_an_unknown_duplicate_policy_names_the_log(scratch: Path) -> None:
    """on_duplicate="skip" was refused with a ValueError that named the option but not the log, unlike every
    other option of the Logger. It names both now; nothing is made."""
    with pytest.raises(ValueError, match=r"Logger .*/log: on_duplicate must be one of .*, got 'skip'"):
        Logger(scratch / "log", on_duplicate="skip")
    assert not (scratch / "log").exists()
