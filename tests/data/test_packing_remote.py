"""Packed batches on a remote store (moto behind the fault proxy, which counts round trips): the documents
of later batches are asked for ahead, and only the fields packing needs are read."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.proxy import FaultProxy
from support.s3 import MotoS3

pytest.importorskip("seqstore.io.remote")

import seqstore as ss  # noqa: E402
from seqstore.data import PackedDataset  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _own_cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQSTORE_CACHE_DIR", str(tmp_path / "env-cache"))


def _token_store(path: Path, n: int = 3000, seed: int = 0) -> Path:
    lens = np.random.default_rng(seed).integers(1, 300, n)
    with ss.create(path, {"tokens": ss.Field("int32", (None,))}, max_shard_records=500) as w:
        w.append_batch({"tokens": (np.arange(int(lens.sum()), dtype=np.int32), lens)})
    return path


def _open(moto_s3: MotoS3, url: str, cache: Path, proxy: FaultProxy) -> ss.Store:
    return ss.open(url, storage_options=moto_s3.storage_options(proxy.url), cache_dir=cache)


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_iter_batches_reads_ahead_on_a_remote_store(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                    s3_proxy: FaultProxy, mode: str) -> None:
    """``PackedDataset.iter_batches`` on a remote store built each batch from a read it waited for (one round
    trip or more per batch); now the documents of a run of batches are asked for together, a run ahead.
    The batches are those of the local store."""
    local = _token_store(tmp_path / "t.seqstore")
    url = moto_s3.upload_dir(local, s3_bucket, f"iter/{mode}.seqstore")
    s3_proxy.latency = 0.01

    def batches(store: Any, count: int = 32) -> list[np.ndarray[Any, Any]]:
        packed = PackedDataset(store, seq_len=256, mode=mode, eos=1 << 30, window=16, ordering="random", seed=3)
        it = packed.iter_batches(4)
        return [next(it)["tokens"].copy() for _ in range(count)]

    want = batches(ss.open(local))
    store = _open(moto_s3, url, tmp_path / "cache", s3_proxy)
    s3_proxy.clear_log()
    got = batches(store)
    trips = s3_proxy.round_trips()
    assert len(got) == len(want) == 32
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"batch {k}")
    assert trips <= 32 // 4, trips


def _meta_stores(moto_s3: MotoS3, bucket: str, tmp_path: Path, prefix: str) -> dict[str, str]:
    """Stores ``a`` (tokens, feat) and ``b`` (extra, the same ids in another order), local in ``tmp_path`` and
    uploaded; their URLs."""
    rng = np.random.default_rng(1)
    n = 1500
    ids = [f"doc-{i}" for i in range(n)]
    lens = rng.integers(1, 200, n)
    schema = {"tokens": ss.Field("int32", (None,)), "feat": ss.Field("float32", (None, 4))}
    with ss.create(tmp_path / "a.seqstore", schema, max_shard_records=500) as w:
        w.append_batch({"tokens": (np.arange(int(lens.sum()), dtype=np.int32), lens),
                        "feat": (rng.standard_normal((int(lens.sum()), 4)).astype(np.float32), lens)}, ids=ids)
    order = rng.permutation(n)
    with ss.create(tmp_path / "b.seqstore", {"extra": ss.Field("float32", (None,))}, max_shard_records=500) as w:
        w.append_batch({"extra": (rng.standard_normal(int(lens[order].sum())).astype(np.float32), lens[order])},
                       ids=[ids[i] for i in order])
    return {k: moto_s3.upload_dir(tmp_path / f"{k}.seqstore", bucket, f"{prefix}/{k}.seqstore") for k in "ab"}


def test_a_meta_dataset_over_remote_stores(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                           s3_proxy: FaultProxy) -> None:
    """A MetaDataset over remote stores raised CorruptionError (\"shard descriptor is missing\"): the id join
    read the control store's id files from its local directory, where a remote store has nothing until a
    shard is mapped. Now the join reads the ids through the store; the records equal the local join's."""
    urls = _meta_stores(moto_s3, s3_bucket, tmp_path, "join")

    def meta(stores: dict[str, Any], cache: Path) -> Any:
        return ss.MetaDataset({k: ss.StoreDataset(s) for k, s in stores.items()}, cache_dir=cache)

    want = meta({k: ss.open(tmp_path / f"{k}.seqstore") for k in "ab"}, tmp_path / "meta-local")
    got = meta({k: _open(moto_s3, u, tmp_path / f"cache-{k}", s3_proxy) for k, u in urls.items()},
               tmp_path / "meta-remote")
    idx = np.random.default_rng(0).permutation(len(want))[:300]
    g, w = got.get_batch(idx), want.get_batch(idx)
    assert g.keys() == w.keys() == {"tokens", "feat", "extra"}
    for k in w:
        for a, b in zip(g[k], w[k]):
            np.testing.assert_array_equal(a, b, err_msg=k)



def test_a_meta_dataset_under_packing_reads_the_token_field_alone(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                                 s3_proxy: FaultProxy) -> None:
    """A PackedDataset over a MetaDataset read every field of every child for the documents it packs (the
    other children's fields and the control's other fields too); now only the token field is read (of the
    others, the heads of the files that mapping a shard reads). The batches are those of the local stores."""
    urls = _meta_stores(moto_s3, s3_bucket, tmp_path, "pack")

    def batches(stores: dict[str, Any], cache: Path) -> list[np.ndarray[Any, Any]]:
        children = {"a": ss.StoreDataset(stores["a"], length_field="tokens"), "b": ss.StoreDataset(stores["b"])}
        meta = ss.MetaDataset(children, ordering="random", seed=2, cache_dir=cache)
        packed = PackedDataset(meta, seq_len=256, mode="best_fit", eos=1 << 30, window=16)
        stream = packed.open(packed.shares(None, 1)[0])
        return [stream.batch(4)["tokens"].copy() for _ in range(12)]

    want = batches({k: ss.open(tmp_path / f"{k}.seqstore") for k in "ab"}, tmp_path / "meta-local")
    stores = {k: _open(moto_s3, u, tmp_path / f"cache-{k}", s3_proxy) for k, u in urls.items()}
    s3_proxy.clear_log()
    got = batches(stores, tmp_path / "meta-remote")
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"batch {k}")
    values = [r.path for r in s3_proxy.requests
              if ("/feat" in r.path or "/extra" in r.path) and (r.byte_range or (0,))[0] > 0]
    assert not values, values


def _merged(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its ranges that continue one another as one (how far a planner pulled ahead splits
    them in different places: the same documents)."""
    out: list[list[int]] = []
    for e, a, b, o in state["ranges"]:
        if out and out[-1][0] == e and out[-1][2] == a and o == 0:
            out[-1][2] = b
        else:
            out.append([e, a, b, o])
    return {**state, "ranges": out}


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_stream_batches_read_ahead_and_keep_exact_states(moto_s3: MotoS3, s3_bucket: str, tmp_path: Path,
                                                         s3_proxy: FaultProxy, mode: str) -> None:
    """``PackedStream.batch`` on a remote store waited out each batch's reads (one round trip or more per
    batch); now it plans a run of batches ahead and asks for their documents together. What it hands out
    is unchanged: the batches and, after each, ``state()`` are the local store's; ``skip`` and ``plan``
    after batches continue from the last batch handed out, not from the plans made ahead."""
    local = _token_store(tmp_path / "t.seqstore", seed=4)
    url = moto_s3.upload_dir(local, s3_bucket, f"stream/{mode}.seqstore")
    s3_proxy.latency = 0.01

    def run(store: Any) -> tuple[list[np.ndarray[Any, Any]], list[dict[str, Any]], list[np.ndarray[Any, Any]]]:
        packed = PackedDataset(store, seq_len=256, mode=mode, eos=1 << 30, window=16, ordering="random", seed=3)
        stream = packed.open(packed.shares(None, 1)[0])
        got, states = [], []
        for _ in range(32):
            got.append(stream.batch(4)["tokens"].copy())
            states.append(stream.state())
        got.append(stream.batch(3)["tokens"].copy())  # another size
        states.append(stream.state())
        stream.skip(5)
        states.append(stream.state())
        plans = [stream.plan(2), stream.plan(4)]
        states.append(stream.state())
        got.append(stream.batch(4)["tokens"].copy())
        states.append(stream.state())
        return got, states, plans

    want = run(ss.open(local))
    store = _open(moto_s3, url, tmp_path / "cache", s3_proxy)
    s3_proxy.clear_log()
    got = run(store)
    trips = s3_proxy.round_trips()
    assert len(got[0]) == len(want[0]) == 34
    for k, (g, w) in enumerate(zip(got[0], want[0])):
        np.testing.assert_array_equal(g, w, err_msg=f"batch {k}")
    assert [_merged(st) for st in got[1]] == [_merged(st) for st in want[1]]
    for g, w in zip(got[2], want[2]):
        np.testing.assert_array_equal(g, w)
    assert trips <= 34 // 4, trips


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_a_refused_shard_fails_the_batch_that_needs_it_after_the_runs_planned_ahead(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, s3_proxy: FaultProxy, mode: str) -> None:
    """``PackedStream.batch`` on a remote store plans two runs of 16 batches ahead, and the planner read the
    lengths of 2048 documents at once: a refused shard (its offsets too) among them failed batch 0. Now
    the batches before the first one that needs the shard's documents are handed out (those of the
    local store, as many as a local store without that shard's offsets gives), then the error names it."""
    lens = np.random.default_rng(0).integers(1, 40, 1000)
    local = tmp_path / "t.seqstore"
    with ss.create(local, {"tokens": ss.Field("int32", (None,))}, max_shard_records=100) as w:
        w.append_batch({"tokens": (np.arange(int(lens.sum()), dtype=np.int32), lens)})
    url = moto_s3.upload_dir(local, s3_bucket, f"refused/{mode}.seqstore")
    shutil.copytree(local, tmp_path / "bad.seqstore")
    (tmp_path / "bad.seqstore" / "shard-000003" / "tokens.offsets.npy").unlink()

    def until_error(store: Any) -> list[np.ndarray[Any, Any]]:
        packed = PackedDataset(store, seq_len=32, mode=mode, eos=1 << 30, window=8)
        stream = packed.open(packed.shares(None, 1)[0])
        got = []
        with pytest.raises(ss.errors.SeqstoreError, match="shard-000003"):
            while True:
                got.append(stream.batch(2)["tokens"].copy())
        return got

    want = until_error(ss.open(tmp_path / "bad.seqstore"))
    s3_proxy.forbid(path="shard-000003")
    got = until_error(_open(moto_s3, url, tmp_path / "cache", s3_proxy))
    assert len(got) == len(want) > 32
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"batch {k}")


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_a_batch_whose_tokens_are_refused_is_made_again_not_skipped(
        moto_s3: MotoS3, s3_bucket: str, tmp_path: Path, s3_proxy: FaultProxy, mode: str) -> None:
    """A remote stream's batch whose documents' tokens could not be read (a shard's values refused) was
    taken from the plans made ahead before it was read: ``state()`` after the error was after it and the
    next ``batch()`` handed out the one after it. Now it stays the next batch: ``state()`` is before it,
    and once the reads are answered again the stream goes on with it (the local store's batches)."""
    lens = np.random.default_rng(0).integers(1, 40, 1000)
    local = tmp_path / "t.seqstore"
    with ss.create(local, {"tokens": ss.Field("int32", (None,))}, max_shard_records=100) as w:
        w.append_batch({"tokens": (np.arange(int(lens.sum()), dtype=np.int32), lens)})
    url = moto_s3.upload_dir(local, s3_bucket, f"values/{mode}.seqstore")

    def open_stream(store: Any, state: Any = None) -> Any:
        packed = PackedDataset(store, seq_len=32, mode=mode, eos=1 << 30, window=8)
        return packed.open(state if state is not None else packed.shares(None, 1)[0])

    ref = open_stream(ss.open(local))
    want = [ref.batch(2)["tokens"].copy() for _ in range(150)]
    store = _open(moto_s3, url, tmp_path / "cache", s3_proxy)
    s3_proxy.forbid(path="shard-000003/tokens.npy", where=lambda r: (r.byte_range or (0,))[0] > 0)
    stream = open_stream(store)
    got = []
    with pytest.raises(ss.errors.SeqstoreError, match="shard-000003"):
        while True:
            got.append(stream.batch(2)["tokens"].copy())
    assert 0 < len(got) < len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"batch {k}")
    state = stream.state()
    np.testing.assert_array_equal(open_stream(ss.open(local), state).batch(2)["tokens"], want[len(got)])
    s3_proxy.clear_faults()
    for k in range(len(got), len(got) + 3):
        np.testing.assert_array_equal(stream.batch(2)["tokens"], want[k], err_msg=f"batch {k}")
