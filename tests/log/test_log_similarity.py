"""similarity(): equals a dense numpy product; top-k equals argsort; per-field scores; out store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore as ss
from seqstore.log import Logger, similarity


def _store(root: Path, n: int, dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, 3, 5)).astype(np.float32)
    b = rng.standard_normal((n, 7)).astype(np.float32)
    with Logger(
        root,
        schema={"m1": {"grad": ss.Field(dtype, (3, 5))}, "m2": {"grad": ss.Field(dtype, (7,))}},
        flush_bytes=1500,
        shard_bytes=4000,
    ) as lg:
        for s in range(0, n, 37):
            lg.log(
                [f"x{i}" for i in range(s, min(n, s + 37))],
                {"m1": {"grad": a[s : s + 37]}, "m2": {"grad": b[s : s + 37]}},
            )
    st = ss.open(root, bfloat16="float32")
    return np.asarray(st.matrix(dtype=np.float32))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_scores_and_topk_match_dense(scratch: Path, dtype: str) -> None:
    x = _store(scratch / "s", 500, dtype)
    st = ss.open(scratch / "s")
    assert st.num_shards > 3 and x.shape == (500, 22)
    q = np.random.default_rng(1).standard_normal((9, 22)).astype(np.float32)
    ref = x @ q.T
    res = similarity(st, q, chunk_rows=64, topk=5, keep_scores=True)
    np.testing.assert_allclose(res.scores, ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(res.top_rows, np.argsort(-ref, axis=0, kind="stable")[:5].T)
    np.testing.assert_allclose(res.top_scores, np.take_along_axis(ref, res.top_rows.T, 0).T, rtol=1e-5, atol=1e-4)
    assert res.rows == 500 and res.rows_per_s > 0
    only_top = similarity(scratch / "s", q, topk=500)  # k = N: a full ranking
    assert only_top.scores is None
    np.testing.assert_array_equal(only_top.top_rows, np.argsort(-ref, axis=0, kind="stable").T)


def test_per_field_fields_ranges_and_out_store(scratch: Path) -> None:
    x = _store(scratch / "s", 300, "float32")
    st = ss.open(scratch / "s")
    q1 = np.random.default_rng(2).standard_normal((4, 3, 5)).astype(np.float32)
    q2 = np.random.default_rng(3).standard_normal((4, 7)).astype(np.float32)
    res = similarity(st, {"m1": {"grad": q1}, "m2": {"grad": q2}}, per_field=True, chunk_rows=50)
    assert res.columns == {"m1/grad": (0, 15), "m2/grad": (15, 22)}
    r1, r2 = x[:, :15] @ q1.reshape(4, -1).T, x[:, 15:] @ q2.T
    assert res.per_field is not None and res.scores is not None
    np.testing.assert_allclose(res.per_field["m1/grad"], r1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.per_field["m2/grad"], r2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.scores, r1 + r2, rtol=1e-5, atol=1e-5)
    only = similarity(st, q2, fields="m2/grad", start=10, stop=250, topk=3)  # one field: strided view
    np.testing.assert_array_equal(only.top_rows, np.argsort(-r2[10:250], axis=0, kind="stable")[:3].T + 10)
    out = similarity(
        st, np.concatenate([q1.reshape(4, -1), q2], 1), out=scratch / "scores", per_field=True, chunk_rows=64
    )
    assert out.out is not None and out.scores is None and len(out.out) == 300
    np.testing.assert_allclose(out.out.matrix("score"), r1 + r2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.out.matrix("by_field/m2/grad"), r2, rtol=1e-5, atol=1e-5)
    assert out.out.metadata["queries"] == 4
    with pytest.raises(ValueError, match=r"\(Q, 22\)"):
        similarity(st, np.zeros((2, 21), np.float32))
    with pytest.raises(ValueError, match="lack field"):
        similarity(st, {"m1": {"grad": q1}})
    with pytest.raises(ValueError, match="device"):
        similarity(st, np.zeros((2, 22), np.float32), device="tpu")


def test_topk_ties_keep_the_lowest_records(scratch: Path) -> None:
    """Records with equal scores: top-k takes the lowest record numbers, as documented, whatever the chunking."""
    x = np.zeros((600, 4), np.float32)
    x[100:400:3] = 1.0  # 100 records tie at the best score, the rest tie at 0
    with Logger(scratch / "t", schema={"g": ss.Field("float32", (4,))}) as lg:
        lg.log([f"r{i}" for i in range(600)], {"g": x})
    q = np.array([[1, 1, 1, 1], [-1, -1, -1, -1]], np.float32)
    ref = np.argsort(-(x @ q.T), axis=0, kind="stable")[:5].T
    for chunk_rows in (None, 64, 7):
        res = similarity(scratch / "t", q, topk=5, chunk_rows=chunk_rows)
        np.testing.assert_array_equal(res.top_rows, ref)
    assert ref.tolist() == [[100, 103, 106, 109, 112], [0, 1, 2, 3, 4]]


def test_topk_of_fewer_records_than_k_has_as_many_columns_as_records(scratch: Path) -> None:
    """The documented shape is ``(Q, min(k, records scanned))`` (the docs said ``(Q, k)``): no padding."""
    with Logger(scratch / "few", schema={"g": ss.Field("float32", (2,))}) as lg:
        lg.log(["a", "b", "c"], {"g": np.arange(6, dtype=np.float32).reshape(3, 2)})
    q = np.ones((2, 2), np.float32)
    for bounds, cols in (({}, 3), ({"start": 1}, 2), ({"start": 1, "stop": 1}, 0)):
        res = similarity(scratch / "few", q, topk=5, **bounds)
        assert res.top_rows.shape == res.top_scores.shape == (2, cols), bounds
        assert res.top_rows.dtype == np.int64 and res.top_scores.dtype == np.float32
    assert res.top_rows.shape == (2, 0) and similarity(scratch / "few", q, topk=5).top_rows.tolist() == [[2, 1, 0]] * 2


def test_dict_queries_for_a_scalar_field(scratch: Path) -> None:
    """A dict of queries gives each field as (Q, *shape): a scalar field (the loss) as (Q,), not one query."""
    rng = np.random.default_rng(4)
    g, loss = rng.standard_normal((20, 4)).astype(np.float32), rng.standard_normal(20).astype(np.float32)
    schema = {"layer1": {"grad": ss.Field("float32", (4,))}, "loss": ss.Field("float32")}
    with Logger(scratch / "l", schema=schema) as lg:
        lg.log([f"i{i}" for i in range(20)], {"layer1": {"grad": g}, "loss": loss})
    qg, ql = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    res = similarity(scratch / "l", {"layer1": {"grad": qg}, "loss": ql}, per_field=True)
    assert res.scores is not None and res.per_field is not None
    np.testing.assert_allclose(res.per_field["loss"], loss[:, None] * ql[None], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.scores, g @ qg.T + loss[:, None] * ql[None], rtol=1e-5, atol=1e-5)
    one = similarity(scratch / "l", {"layer1": {"grad": qg[0]}, "loss": ql[0]})  # one query, no Q axis
    np.testing.assert_allclose(one.scores, res.scores[:, :1], rtol=1e-5, atol=1e-5)


def test_topk_ranks_nan_scores_last_whatever_the_chunking(scratch: Path) -> None:
    """Records whose scores are NaN (a diverged step's gradients) rank below every number: they neither
    push better records of their chunk out of the top k nor appear before them."""
    x = np.arange(40, dtype=np.float32)[:, None].repeat(2, 1)
    x[[1, 4, 7, 30, 38]] = np.nan
    with Logger(scratch / "n", schema={"g": ss.Field("float32", (2,))}) as lg:
        lg.log([f"r{i}" for i in range(40)], {"g": x})
    q = np.array([[1, 0]], np.float32)
    for chunk_rows in (None, 5, 8):
        res = similarity(scratch / "n", q, topk=4, chunk_rows=chunk_rows)
        assert res.top_rows.tolist() == [[39, 37, 36, 35]], chunk_rows
    everything = similarity(scratch / "n", q, topk=40, chunk_rows=8)
    assert everything.top_rows[0, -5:].tolist() == [1, 4, 7, 30, 38]


def test_dict_queries_flattened_per_query(scratch: Path) -> None:
    """A field's queries may also come flattened, (Q, prod(shape)), as the matrix columns are."""
    x = _store(scratch / "s", 50, "float32")
    q1 = np.random.default_rng(5).standard_normal((4, 15)).astype(np.float32)
    q2 = np.random.default_rng(6).standard_normal((4, 7)).astype(np.float32)
    res = similarity(scratch / "s", {"m1": {"grad": q1}, "m2": {"grad": q2}})
    np.testing.assert_allclose(res.scores, x @ np.concatenate([q1, q2], 1).T, rtol=1e-5, atol=1e-4)
    one = similarity(scratch / "s", {"m1": {"grad": q1[0].reshape(3, 5)}, "m2": {"grad": q2[0]}})
    np.testing.assert_allclose(one.scores, res.scores[:, :1], rtol=1e-5, atol=1e-5)


def test_topk_ranks_nan_below_minus_infinity_whatever_the_chunking(scratch: Path) -> None:
    """NaN scores rank below every number, -inf included: a chunk whose k-th best score was -inf took its
    NaN rows in place of its -inf rows (the lowest rows among the ties), so the answer depended on the chunking."""
    x = np.array([[np.nan], [np.nan], [-np.inf], [-np.inf], [1.0]], np.float32)
    with Logger(scratch / "n", schema={"g": ss.Field("float32", (1,))}) as lg:
        lg.log([f"r{i}" for i in range(5)], {"g": x})
    for chunk_rows in (None, 2, 3):
        res = similarity(scratch / "n", np.ones((1, 1), np.float32), topk=3, chunk_rows=chunk_rows)
        assert res.top_rows.tolist() == [[4, 2, 3]], chunk_rows


def test_scores_of_a_remote_store_name_its_url(moto_s3: Any, s3_bucket: str, scratch: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The out store's metadata "similarity_of" named the node cache's mirror directory of a remote store."""
    monkeypatch.setenv("SEQSTORE_CACHE_DIR", str(scratch / "cache"))
    url = f"s3://{s3_bucket}/log.seqstore"
    opts = moto_s3.storage_options()
    with Logger(url, storage_options=opts) as lg:
        lg.log(["a", "b"], {"g": np.ones((2, 3), np.float32)})
    res = similarity(ss.open(url, storage_options=opts), np.ones((1, 3), np.float32), out=scratch / "scores")
    assert res.out is not None and res.out.metadata["similarity_of"] == url


def test_the_device_top_k_ranks_nan_scores_last() -> None:
    """The GPU scan's running top-k (run here on CPU tensors: the same torch calls): ``torch.topk`` takes
    NaN for the largest score, so a chunk with k NaN scores pushed out the best rows before the final
    sort put NaN last; NaN now ranks below every number, and the scores kept are the real ones."""
    torch = pytest.importorskip("torch")
    from seqstore.log.similarity import _device_topk

    nan = float("nan")
    scores = torch.tensor([[nan, 1.0], [5.0, nan], [nan, 3.0], [2.0, -float("inf")], [nan, nan]])
    v, ix = _device_topk(scores, 2)
    assert ix[:, 0].tolist() == [1, 3] and v[:, 0].tolist() == [5.0, 2.0]
    assert ix[:, 1].tolist() == [2, 0] and v[:, 1].tolist() == [3.0, 1.0]
    v, ix = _device_topk(scores, 9)  # more than the rows: every row, the NaN ones last with their NaN
    assert v.shape == (5, 2) and ix[:2, 0].tolist() == [1, 3] and bool(torch.isnan(v[2:, 0]).all())


def test_the_device_top_k_breaks_ties_as_the_cpu_scan_does() -> None:
    """The GPU scan's running top-k (run on CPU tensors: the same torch calls) kept whichever rows
    ``torch.topk`` returned among scores tied at the k-th place, and took NaN rows for -inf ones (both
    keyed -inf): the records differed from the CPU scan's (ties: the lowest record; NaN below -inf)."""
    torch = pytest.importorskip("torch")
    from seqstore.log.similarity import _device_running_topk, _TopK

    rng = np.random.default_rng(7)
    s = rng.integers(0, 3, size=(300, 5)).astype(np.float32)  # three values: ties everywhere
    s[rng.random(s.shape) < 0.2] = -np.inf
    s[rng.random(s.shape) < 0.2] = np.nan
    s[:, 4] = np.where(np.arange(300) % 2, np.nan, -np.inf)  # only -inf and NaN
    for k, chunk in ((4, 37), (50, 64), (7, 300), (400, 128)):
        cpu, dev = _TopK(k, 5), _TopK(k, 5)
        best: Any = None
        for a in range(0, 300, chunk):
            cpu.add(s[a : a + chunk], a)
            best = _device_running_topk(best, torch.from_numpy(s[a : a + chunk]), a, k)
        dev.merge(best[0].numpy(), best[1].numpy().astype(np.int64))
        (cpu_rows, cpu_scores), (dev_rows, dev_scores) = cpu.result(), dev.result()
        np.testing.assert_array_equal(dev_rows, cpu_rows, err_msg=f"k={k} chunk={chunk}")
        np.testing.assert_array_equal(dev_scores, cpu_scores)
        keyed = np.where(np.isnan(s), -np.inf, s)
        ref = np.lexsort((np.arange(300)[:, None].repeat(5, 1), np.isnan(s), -keyed), axis=0)[:k].T
        np.testing.assert_array_equal(cpu_rows, ref)


def test_complex_records_or_queries_are_refused_not_taken_as_their_real_part(scratch: Path) -> None:
    """A Logger stores complex64 tensors, but similarity() cast complex blocks and queries to float32:
    the imaginary parts were dropped (a ComplexWarning at most) and the scores were those of the real
    parts. Both are refused, naming the fields or the queries."""
    torch = pytest.importorskip("torch")
    z = (np.arange(6, dtype=np.float32).reshape(3, 2) * (1 + 1j)).astype(np.complex64)
    with Logger(scratch / "c", schema={"z": ss.Field("complex64", (2,)), "r": ss.Field("float32", (2,))}) as lg:
        lg.log(["a", "b", "c"], {"z": z, "r": z.real.copy()})
    with pytest.raises(ValueError, match=r"similarity\(\): .*field\(s\) \['z'\] .*complex64"):
        similarity(scratch / "c", np.ones((1, 2), np.float32), fields="z")
    for q in (np.ones((1, 2), np.complex64), torch.ones((1, 2), dtype=torch.complex64)):
        with pytest.raises(ValueError, match=r"similarity\(\): .*queries .*complex64"):
            similarity(scratch / "c", q, fields="r")
    with pytest.raises(ValueError, match=r"similarity\(\): .*queries .*complex64"):
        similarity(scratch / "c", {"r": np.ones((1, 2), np.complex64)}, fields="r")
    assert similarity(scratch / "c", np.ones((1, 2), np.float32), fields="r").scores[:, 0].tolist() == [1, 5, 9]


def test_queries_numpy_cannot_convert_are_named(scratch: Path) -> None:
    """Queries given as rows of different lengths or as strings raised numpy's bare ValueError ("inhomogeneous
    shape", "could not convert string to float"), without saying that the queries were at fault."""
    with Logger(scratch / "l", schema={"g": ss.Field("float32", (2,))}) as lg:
        lg.log(["a", "b"], {"g": np.ones((2, 2), np.float32)})
    for q in ([[1.0, 2.0], [1.0]], np.array([["a", "b"]]), {"g": [[1.0, 2.0], [3.0]]}):
        with pytest.raises(ValueError, match=r"similarity\(\): the queries .*(inhomogeneous|string)"):
            similarity(scratch / "l", q)


@pytest.mark.parametrize("topk", [2.5, "3", 0])
def test_topk_that_is_not_a_positive_int_is_named(scratch: Path, topk: Any) -> None:
    """topk=2.5 raised numpy's "Partition index must be integer" from inside the scan (and "3" a TypeError
    comparing str and int); a ValueError names topk and what it was."""
    with Logger(scratch / "l", schema={"g": ss.Field("float32", (2,))}) as lg:
        lg.log(["a", "b", "c"], {"g": np.ones((3, 2), np.float32)})
    with pytest.raises(ValueError, match=rf"topk must be a positive int, got {topk!r}"):
        similarity(scratch / "l", np.ones((1, 2), np.float32), topk=topk)


def test_a_scan_that_fails_leaves_nothing_at_out(scratch: Path) -> None:
    """A scan with ``out=`` that failed part way (here a damaged shard) left an empty store at ``out``, and
    the next call with the same ``out`` was refused as "already exists" (similarity has no overwrite):
    ``out`` is now built aside and put in place only when the scan ends."""
    import os

    with Logger(scratch / "l", flush_bytes=1024, shard_bytes=2048, direct_io=False) as lg:
        for b in range(8):
            lg.log([f"x{b}-{k}" for k in range(16)], {"g": np.ones((16, 8), np.float32)})
    assert ss.open(scratch / "l").num_shards == 2
    damaged = scratch / "l" / "shard-000001" / "packed.npy"
    good = damaged.read_bytes()
    os.truncate(damaged, 200)
    with pytest.raises(ss.SeqstoreError, match="packed.npy"):
        similarity(scratch / "l", np.ones((1, 8), np.float32), out=scratch / "o", chunk_rows=8)
    assert sorted(p.name for p in scratch.iterdir()) == ["l"]
    damaged.write_bytes(good)
    res = similarity(scratch / "l", np.ones((1, 8), np.float32), out=scratch / "o", chunk_rows=8)
    assert res.out is not None and len(res.out) == 128 and res.out.matrix("score")[:, 0].tolist() == [8.0] * 128
    with pytest.raises(FileExistsError):
        similarity(scratch / "l", np.ones((1, 8), np.float32), out=scratch / "o")


def test_dict_queries_naming_a_field_the_store_lacks_are_refused(scratch: Path) -> None:
    """A dict of queries with a name the store does not have (a typo, "grads" for "grad") was ignored
    silently; it is a ValueError naming it. Queries for fields the store has but ``fields`` leaves out
    are still ignored."""
    with Logger(scratch / "l", schema={"m": {"grad": ss.Field("float32", (2,))}, "loss": ss.Field("float32")}) as lg:
        lg.log(["a", "b"], {"m": {"grad": np.ones((2, 2), np.float32)}, "loss": np.ones(2, np.float32)})
    q = {"m": {"grad": np.ones((1, 2), np.float32), "grads": np.ones((1, 2), np.float32)},
         "loss": np.ones(1, np.float32)}
    with pytest.raises(ValueError, match=r"similarity\(\): queries name field\(s\) \['m/grads'\] that .*/l lacks"):
        similarity(scratch / "l", q)
    del q["m"]["grads"]
    assert similarity(scratch / "l", q, fields="m/grad").scores.tolist() == [[2.0], [2.0]]


def test_device_cuda_without_a_cuda_device_is_named(scratch: Path) -> None:
    """device="cuda" where torch has no CUDA raised torch's AssertionError ("Torch not compiled with CUDA
    enabled") from inside the scan, after ``out`` was made; a ValueError names the device, before anything is made."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available")
    with Logger(scratch / "l", schema={"g": ss.Field("float32", (2,))}) as lg:
        lg.log(["a"], {"g": np.ones((1, 2), np.float32)})
    with pytest.raises(ValueError, match=r"similarity\(\): device='cuda', but torch finds no CUDA device"):
        similarity(scratch / "l", np.ones((1, 2), np.float32), device="cuda", out=scratch / "o")
    assert not (scratch / "o").exists()


def test_a_scan_that_fails_leaves_nothing_at_an_out_url(moto_s3: Any, s3_bucket: str, scratch: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``out=<URL>``: the store was made at the URL before the scan, so a scan that failed part way (here a
    damaged shard) left an empty store there, and the next call with that URL was refused as "already
    exists". The scores are built in a local temporary directory and copied to the URL when the scan ends."""
    import os

    for k, v in {**moto_s3.env(), "SEQSTORE_CACHE_DIR": str(scratch / "cache")}.items():
        monkeypatch.setenv(k, v)
    with Logger(scratch / "l", flush_bytes=1024, shard_bytes=2048, direct_io=False) as lg:
        for b in range(8):
            lg.log([f"x{b}-{k}" for k in range(16)], {"g": np.ones((16, 8), np.float32)})
    damaged = scratch / "l" / "shard-000001" / "packed.npy"
    good = damaged.read_bytes()
    os.truncate(damaged, 200)
    url = f"s3://{s3_bucket}/scores.seqstore"
    with pytest.raises(ss.SeqstoreError, match="packed.npy"):
        similarity(scratch / "l", np.ones((1, 8), np.float32), out=url, chunk_rows=8)
    assert moto_s3.keys(s3_bucket) == {}
    damaged.write_bytes(good)
    res = similarity(scratch / "l", np.ones((1, 8), np.float32), out=url, chunk_rows=8)
    assert res.out is not None and len(res.out) == 128 and res.out.matrix("score")[:, 0].tolist() == [8.0] * 128
    with pytest.raises(FileExistsError):
        similarity(scratch / "l", np.ones((1, 8), np.float32), out=url)


@pytest.mark.parametrize("bounds, error", [(dict(start=-1), IndexError), (dict(start=4), IndexError),
                                           (dict(start=2, stop=1), IndexError), (dict(stop=-1), IndexError),
                                           (dict(start=1.5), TypeError), (dict(stop="2"), TypeError),
                                           (dict(start=True), TypeError)])
def test_a_start_or_stop_outside_the_store_names_the_store_and_the_call(scratch: Path, bounds: dict[str, Any],
                                                                        error: type[Exception]) -> None:
    """start=-1 or start past the end raised the reader's "row range [-1, 3) is not inside 0..3", a
    float start Python's "'float' object cannot be interpreted as an integer": neither named the store nor
    similarity(); they do, before ``out`` is made. A stop past the end is the end, as before."""
    with Logger(scratch / "l", schema={"g": ss.Field("float32", (2,))}) as lg:
        lg.log(["a", "b", "c"], {"g": np.ones((3, 2), np.float32)})
    with pytest.raises(error, match=r"similarity\(\): .*/l: .*(start|stop)=.* 3 records"):
        similarity(scratch / "l", np.ones((1, 2), np.float32), out=scratch / "o", **bounds)
    assert not (scratch / "o").exists()
    assert similarity(scratch / "l", np.ones((1, 2), np.float32), start=1, stop=9).scores.tolist() == [[2.0], [2.0]]
    assert similarity(scratch / "l", np.ones((1, 2), np.float32), start=3).rows == 0


@pytest.mark.parametrize("bad, error, named", [(dict(chunk_rows=0), ValueError, "chunk_rows must be a positive int"),
                                               (dict(chunk_rows=2.5), TypeError, "chunk_rows must be a positive int"),
                                               (dict(chunk_rows="4"), TypeError, "chunk_rows must be a positive int"),
                                               (dict(device="gpu"), ValueError, "device must be 'cpu' or")])
def test_a_bad_chunk_rows_or_device_names_the_call_and_the_store(scratch: Path, bad: dict[str, Any],
                                                                 error: type[Exception], named: str) -> None:
    """chunk_rows=0 raised the reader's "chunk_rows must be positive" from inside the scan, 2.5 Python's
    "slice indices must be integers", "4" a str/int comparison; device="gpu" a message without
    similarity() or the store. Each names both, before ``out`` is made."""
    with Logger(scratch / "l", schema={"g": ss.Field("float32", (2,))}) as lg:
        lg.log(["a", "b", "c"], {"g": np.ones((3, 2), np.float32)})
    with pytest.raises(error, match=rf"similarity\(\): .*/l: {named}"):
        similarity(scratch / "l", np.ones((1, 2), np.float32), out=scratch / "o", **bad)
    assert not (scratch / "o").exists()
    assert similarity(scratch / "l", np.ones((1, 2), np.float32), chunk_rows=np.int64(2)).rows == 3


def test_an_existing_out_is_refused_without_naming_an_option_similarity_lacks(scratch: Path) -> None:
    """``out=`` where a store exists was refused with "pass overwrite=True to replace it", but similarity()
    takes no overwrite: the message names the call and what to do instead; still a FileExistsError."""
    with Logger(scratch / "l", schema={"g": ss.Field("float32", (2,))}) as lg:
        lg.log(["a"], {"g": np.ones((1, 2), np.float32)})
    with pytest.raises(FileExistsError) as exc:
        similarity(scratch / "l", np.ones((1, 2), np.float32), out=scratch / "l")
    assert "overwrite" not in str(exc.value) and str(exc.value).startswith(f"similarity(): out={scratch / 'l'}")


def test_a_torch_device_is_taken_as_its_name(scratch: Path) -> None:
    """``device=torch.device("cpu")`` (how torch code names a device) raised AttributeError ("'torch.device'
    object has no attribute 'startswith'"); it is taken as its name, as ``"cpu"`` is."""
    torch = pytest.importorskip("torch")
    with Logger(scratch / "l", schema={"g": ss.Field("float32", (2,))}) as lg:
        lg.log(["a", "b"], {"g": np.ones((2, 2), np.float32)})
    res = similarity(scratch / "l", np.ones((1, 2), np.float32), device=torch.device("cpu"))
    assert res.scores.tolist() == [[2.0], [2.0]]


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "bool",
                                   "float16", "float32", "float64"])
def test_the_cuda_scan_buffers_are_of_a_dtype_every_torch_has(dtype: str) -> None:
    """The CUDA scan made its buffers in the stored dtype (torch.from_numpy(np.empty(0, dtype))): torch < 2.3
    has no uint16/uint32/uint64 tensors, so a log of such a field was refused with torch's bare TypeError
    ("can't convert np.ndarray of type numpy.uint16") before any score. Their buffers are float32 now (the
    rows widened as they are copied; integers are multiplied in float32 anyway)."""
    from seqstore.log.similarity import _cuda_buffer_dtype

    torch_2_0 = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}
    assert _cuda_buffer_dtype(np.dtype(dtype), False).name in torch_2_0
    assert _cuda_buffer_dtype(np.dtype("uint16"), True) == np.int16  # bfloat16's bits


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
def test_unsigned_fields_score_on_cuda_as_on_cpu(scratch: Path, dtype: str) -> None:
    """Unsigned integer fields (widened to float32 buffers on the way to the GPU) score as on the CPU."""
    x = np.array([[1, 2, 65535], [3, 4, 5], [0, 0, 7]], dtype=dtype)
    with Logger(scratch / "l", commit_every_s=60) as lg:
        lg.log(["a", "b", "c"], {"x": x})
    q = np.array([[1.0, 1.0, 1.0], [0.0, 2.0, 0.0]], np.float32)
    cpu = similarity(scratch / "l", q)
    gpu = similarity(scratch / "l", q, device="cuda")
    assert cpu.scores is not None and gpu.scores is not None
    np.testing.assert_allclose(gpu.scores, cpu.scores, rtol=1e-6)
    assert similarity(scratch / "l", q, device="cuda", topk=2).top_rows.tolist() == [[0, 1], [1, 0]]


def test_a_query_vector_of_the_wrong_width_is_named_by_its_own_shape(scratch: Path) -> None:
    """A single (D,) query of the wrong width was refused as "got (1, D)", a shape the caller never gave."""
    with Logger(scratch / "l", commit_every_s=60) as lg:
        lg.log(["a"], {"g": np.ones((1, 2), np.float32)})
    with pytest.raises(ValueError, match=r"queries must be \(Q, 2\) or \(2,\) for fields \['g'\], got \(3,\)"):
        similarity(scratch / "l", np.ones(3, np.float32))
    assert similarity(scratch / "l", np.ones(2, np.float32)).scores.tolist() == [[2.0]]
