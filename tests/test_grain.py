"""``seqstore.grain`` against the real Grain (grain==0.2.18, in the dev extra): the data source in a Grain
``DataLoader`` with 2 worker processes yields exactly the seqstore epoch order, Grain's own checkpoint
(``get_state`` / ``set_state`` of the iterator) resumes exactly, two shards cover an epoch exactly once,
and a missing Grain or a bad store fails clearly.

Grain starts its workers with ``spawn`` (seconds each under load), so only the first test starts workers;
the sharding tests use ``worker_count=0`` (sharding is the sampler's and the DataLoader's index arithmetic,
the same in the main process).
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

import seqstore
import seqstore.grain as sg
from seqstore.errors import FormatError


def _store(path: Path, n: int) -> seqstore.Store:
    rng = np.random.default_rng(n)
    schema = {"x": seqstore.Field("float32", (None, 3)), "tag": seqstore.Field("int64")}
    with seqstore.create(path, schema) as w:
        for i in range(n):
            w.append({"x": rng.standard_normal((int(rng.integers(1, 9)), 3)), "tag": 1000 + i}, id=f"r{i}")
    return seqstore.open(path)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> seqstore.Store:
    return _store(tmp_path_factory.mktemp("grain") / "s.seqstore", 60)


def _dataset(store: seqstore.Store, partition_epoch: int = 2) -> seqstore.StoreDataset:
    return seqstore.StoreDataset(store, ordering="laplace:.8", seed=5, partition_epoch=partition_epoch)


def _tags(records: list[dict[str, np.ndarray]]) -> list[int]:
    return [int(r["tag"]) - 1000 for r in records]


def test_dataloader_two_workers_yields_the_order_and_resumes_from_a_grain_checkpoint(store: seqstore.Store) -> None:
    grain = pytest.importorskip("grain")
    ds = _dataset(store)
    source = sg.DataSource(ds)
    sampler = sg.EpochSampler(source, num_epochs=2)  # sub-epochs 1 and 2: the two halves of the partition
    expected = np.concatenate([ds.epoch_order(1).to_numpy(), ds.epoch_order(2).to_numpy()]).tolist()
    assert sorted(expected) == list(range(len(store)))  # a partition epoch: each record once in 2 sub-epochs
    assert expected != list(range(len(store)))

    loader = grain.DataLoader(data_source=source, sampler=sampler, worker_count=2)
    it = iter(loader)
    head = [next(it) for _ in range(23)]
    state = it.get_state()  # Grain's own checkpoint: JSON bytes with per-worker positions and our reprs
    tail = list(it)
    records = head + tail
    assert _tags(records) == expected
    for r, i in zip(records[:5], expected[:5], strict=True):  # values exactly as the store has them
        np.testing.assert_array_equal(r["x"], store[i]["x"])

    resumed = iter(loader)
    resumed.set_state(state)
    assert _tags(list(resumed)) == expected[23:]  # the rest of the run, as if never interrupted

    # a checkpoint of another order is refused by Grain, by the sampler's repr
    other = sg.EpochSampler(sg.DataSource(seqstore.StoreDataset(store, ordering="laplace:.8", seed=6,
                                                                partition_epoch=2)), num_epochs=2)
    with pytest.raises(ValueError, match="Sampler in checkpoint does not match"):
        iter(grain.DataLoader(data_source=source, sampler=other, worker_count=2)).set_state(state)


@pytest.mark.parametrize("n, drop", [(60, False), (59, False), (59, True)])
def test_two_shards_cover_each_epoch_exactly_once(tmp_path: Path, store: seqstore.Store, n: int, drop: bool) -> None:
    grain = pytest.importorskip("grain")
    st = store if n == len(store) else _store(tmp_path / "odd.seqstore", n)
    ds = _dataset(st, partition_epoch=1)
    order = ds.epoch_order(1).to_numpy().tolist()
    per_rank = []
    for rank in range(2):
        opts = grain.sharding.ShardOptions(shard_index=rank, shard_count=2, drop_remainder=drop)
        sampler = sg.EpochSampler(ds, shard_options=opts)
        loader = grain.DataLoader(data_source=sg.DataSource(ds), sampler=sampler, worker_count=0)
        assert loader._shard_options is opts  # noqa: SLF001 - the DataLoader took the sampler's shard options
        per_rank.append(_tags(list(loader)))
    a, b = per_rank
    assert len(a) == len(b)
    if n % 2 == 0:
        assert not set(a) & set(b) and sorted(a + b) == list(range(n))
        assert a == order[0::2] and b == order[1::2]
    elif drop:  # the last record of the order is left out, the rest once
        assert not set(a) & set(b) and sorted(a + b) == sorted(order[:-1])
    else:  # padded by repeating the order's start, like DistributedSampler
        assert sorted(a + b) == sorted(order + order[:1])
        assert b[-1] == order[0]


def test_sampler_positions_epochs_and_resume_arithmetic(store: seqstore.Store) -> None:
    pytest.importorskip("grain")
    ds = _dataset(store, partition_epoch=3)
    sampler = sg.EpochSampler(ds, epoch=2, num_epochs=None, rng_seed=7, chunk_size=4)
    run = np.concatenate([ds.epoch_order(e).to_numpy() for e in range(2, 9)])
    assert [sampler[g].record_key for g in range(len(run))] == run.tolist()  # epochs 2..8, lazily found
    assert len(sampler) == sys.maxsize
    lens = [len(ds.epoch_order(e)) for e in (2, 3)]
    assert sampler.locate(lens[0]) == (3, 0)
    meta = sampler[5]
    assert meta.index == 5 and meta.rng.integers(1 << 30) == sampler[5].rng.integers(1 << 30)
    # pickled: small, and the dataset opens only when the copy is first used
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy._lazy._dataset is None  # noqa: SLF001
    assert repr(copy) == repr(sampler) and copy[len(run) - 1].record_key == run[-1]


def test_data_source_reads_through_get_batch_and_pickles_small(tmp_path: Path, store: seqstore.Store) -> None:
    source = sg.DataSource(store, fields=["x", "tag"], with_index=True)
    assert len(source) == len(store) and source.ragged_fields == ("x",)
    r = source[-1]
    assert int(r["index"]) == len(store) - 1 and r["x"].flags.writeable  # a copy, not the read-only mapping
    np.testing.assert_array_equal(r["x"], store[len(store) - 1]["x"])
    many = source._getitems([3, 0, 3, -2])  # noqa: SLF001 - Grain's batched-read protocol
    for got, i in zip(many, [3, 0, 3, len(store) - 2], strict=True):
        np.testing.assert_array_equal(got["x"], store[i]["x"])
        assert int(got["tag"]) == 1000 + i and int(got["index"]) == i
    batch = source.batch_fn(pad_multiple=4)(many)
    assert batch["x"].shape[1] % 4 == 0 and batch["x_lengths"].tolist() == [len(m["x"]) for m in many]
    with pytest.raises(IndexError, match="out of range for 60"):
        source[60]
    blob = pickle.dumps(source)
    big = sg.DataSource(_store(tmp_path / "big.seqstore", 3000))
    assert len(blob) < 4096 and abs(len(pickle.dumps(big)) - len(pickle.dumps(sg.DataSource(store)))) < 64
    copy = pickle.loads(blob)
    assert copy._lazy._dataset is None  # noqa: SLF001 - nothing opened before the first read
    assert int(copy[7]["tag"]) == 1007 and repr(copy) == repr(source)


def test_float_indices_are_refused_not_truncated(store: seqstore.Store) -> None:
    """A float index is a TypeError in the batched read as in ``source[i]`` (``_getitems([1.7])`` read
    record 1: the indices were cast to int64)."""
    source = sg.DataSource(store)
    with pytest.raises(TypeError, match="must be an int"):
        source[1.7]  # type: ignore[index]
    for bad in ([1.7], np.array([0.0, 2.0]), [True]):
        with pytest.raises(TypeError, match="must be ints"):
            source._getitems(bad)  # noqa: SLF001 - Grain's batched-read protocol
    assert source._getitems([]) == [] and int(source._getitems(np.array([2], np.uint8))[0]["tag"]) == 1002  # noqa: SLF001


def test_bad_store_and_bad_arguments_fail_clearly(tmp_path: Path, store: seqstore.Store) -> None:
    pytest.importorskip("grain")
    with pytest.raises(FormatError, match="no such store"):
        sg.DataSource(tmp_path / "missing.seqstore")
    (tmp_path / "empty.seqstore").mkdir()
    with pytest.raises(FormatError, match="manifest.json: missing"):
        sg.DataSource(tmp_path / "empty.seqstore")
    with pytest.raises(KeyError, match=r"no field\(s\) \['nope'\]"):
        sg.DataSource(store, fields=["nope"])
    with pytest.raises(TypeError, match="lacks"):
        sg.DataSource([1, 2, 3])
    with pytest.raises(ValueError, match="1-based"):
        sg.EpochSampler(store, epoch=0)
    with pytest.raises(TypeError, match="ShardOptions"):
        sg.EpochSampler(store, shard_options=(0, 2))


def test_missing_grain_is_named(monkeypatch: pytest.MonkeyPatch, store: seqstore.Store) -> None:
    monkeypatch.setitem(sys.modules, "grain", None)  # what an environment without Grain sees on import
    source = sg.DataSource(store)  # the protocol itself needs nothing of Grain
    assert int(source[1]["tag"]) == 1001
    with pytest.raises(sg.GrainMissingError, match=r"pip install 'seqstore\[grain\]'"):
        sg.EpochSampler(source)


def test_data_source_over_a_store_dataset_of_some_fields(store: seqstore.Store) -> None:
    """A StoreDataset of some fields returns only those: the source says so, and refuses another field at once."""
    ds = seqstore.StoreDataset(store, fields=["tag"])
    source = sg.DataSource(ds)
    assert source.ragged_fields == () and set(source[0]) == {"tag"}
    assert source.batch_fn()(source._getitems([0, 1]))["tag"].tolist() == [1000, 1001]  # noqa: SLF001
    with pytest.raises(KeyError, match=r"no field\(s\) \['x'\]; fields are \['tag'\]"):
        sg.DataSource(ds, fields=["x"])


def test_with_index_and_a_field_named_index_fails_at_construction(tmp_path: Path) -> None:
    """A dataset field named "index" with with_index=True: the KeyError comes from DataSource() (before:
    only when a record was read, inside Grain's workers); a choice of fields without it is fine."""
    with seqstore.create(tmp_path / "s", {"index": seqstore.Field("int64"), "x": seqstore.Field("float32")}) as w:
        for i in range(3):
            w.append({"index": i, "x": float(i)})
    store = seqstore.open(tmp_path / "s")
    concat = seqstore.data.ConcatDataset([seqstore.StoreDataset(store)] * 2)
    for source in (store, seqstore.StoreDataset(store), concat):
        with pytest.raises(KeyError, match="with_index.*'index'"):
            sg.DataSource(source, with_index=True)
    assert int(sg.DataSource(store, fields=["x"], with_index=True)[2]["index"]) == 2
    assert int(sg.DataSource(store)[2]["index"]) == 2  # without with_index the field is returned


@pytest.mark.parametrize("seed", [-1, -5])
def test_a_negative_rng_seed_fails_at_construction(store: seqstore.Store, seed: int) -> None:
    """A negative rng_seed was taken, and sampler[g] failed in the workers for g < -seed ("key must be
    positive", from numpy's Philox) while later positions worked; it is refused up front, as Grain's own
    samplers refuse a negative seed."""
    pytest.importorskip("grain")
    with pytest.raises(ValueError, match="rng_seed"):
        sg.EpochSampler(store, rng_seed=seed)


def test_an_unknown_field_of_any_dataset_fails_at_construction(store: seqstore.Store) -> None:
    """``fields=`` naming a field a (non-store) dataset does not return was taken: each read then failed
    with a bare KeyError inside Grain's workers. It is refused by DataSource(), naming the fields there are."""
    concat = seqstore.data.ConcatDataset([seqstore.StoreDataset(store)] * 2)
    with pytest.raises(KeyError, match=r"no field\(s\) \['nope'\]; fields are \['tag', 'x'\]"):
        sg.DataSource(concat, fields=["tag", "nope"])
    assert set(sg.DataSource(concat, fields=["tag"])[0]) == {"tag"}


def test_pad_batch_of_one_ragged_field_named_as_a_string() -> None:
    """``PadBatch("feats")`` took the name letter by letter: ``feats`` counted as a fixed field and every batch
    of records of different lengths failed with NumPy's bare "all input arrays must have the same shape". A
    string is the one field's name, as ``collate_padded(ragged="feats")`` takes it."""
    records = [{"feats": np.full((n, 2), n, np.float32), "y": np.array(n)} for n in (3, 5, 2)]
    want = sg.PadBatch(["feats"], pad_multiple=4)(records)
    got = sg.PadBatch("feats", pad_multiple=4)(records)
    assert got.keys() == want.keys() == {"feats", "feats_lengths", "y"} and got["feats"].shape == (3, 8, 2)
    assert all(np.array_equal(got[k], want[k]) for k in want) and got["feats_lengths"].tolist() == [3, 5, 2]
    assert repr(sg.PadBatch("feats")) == "seqstore.grain.PadBatch(ragged=['feats'], pad_multiple=1)"


def test_pad_batch_takes_a_numpy_integer_pad_multiple() -> None:
    """``pad_multiple=np.int64(4)`` (a multiple computed with NumPy) was refused as "must be an integer >= 1",
    where every other count of seqstore.grain takes NumPy integers; it is taken, as a plain int."""
    batch_fn = sg.PadBatch(["feats"], pad_multiple=np.int64(4))
    assert type(batch_fn.pad_multiple) is int and repr(batch_fn).endswith("pad_multiple=4)")
    out = batch_fn([{"feats": np.zeros((n, 2), np.float32)} for n in (3, 5)])
    assert out["feats"].shape == (2, 8, 2)
    for bad in (0, True, 2.0, np.float64(2)):
        with pytest.raises(ValueError, match="PadBatch: pad_multiple must be an integer >= 1"):
            sg.PadBatch(["feats"], pad_multiple=bad)  # type: ignore[arg-type]


def test_a_data_source_over_an_empty_dataset_takes_its_fields(store: seqstore.Store) -> None:
    """With no record to look at, every field asked for was "unknown": a KeyError for a valid dataset that
    happened to be empty (a filter that kept nothing on this rank)."""
    empty = seqstore.StoreDataset(store).filter(min_length=100)
    assert empty.num_seqs == 0
    source = sg.DataSource(empty, fields=["x"], with_index=True)
    assert len(source) == 0 and source._getitems([]) == []
    with pytest.raises(IndexError, match="out of range for 0 records"):
        source[0]


@pytest.mark.parametrize("num_epochs", [1, None])
def test_an_rng_seed_past_philox_keys_fails_at_construction(store: seqstore.Store, num_epochs: int | None) -> None:
    """rng_seed + position is a Philox key (below 2**128): rng_seed=2**128 was taken and every sampler[g]
    failed in the workers with numpy's "key must be positive and less than 2**128", naming no argument."""
    pytest.importorskip("grain")
    with pytest.raises(ValueError, match=r"EpochSampler: rng_seed .* below 2\*\*128"):
        sg.EpochSampler(store, rng_seed=2**128, num_epochs=num_epochs)
    last = sg.EpochSampler(store, rng_seed=2**128 - 60, num_epochs=1)  # (60 positions: keys up to 2**128 - 1)
    assert last[59].rng is not None


def test_a_sampler_over_a_seed_of_more_digits_than_python_prints(store: seqstore.Store) -> None:
    """Its repr (what Grain compares on restore) raised Python's bare int -> str digit-limit ValueError."""
    pytest.importorskip("grain")
    seeds = (10**5000, 10**5000 + 1)
    samplers = [sg.EpochSampler(seqstore.StoreDataset(store, ordering="random", seed=s)) for s in seeds]
    assert repr(samplers[0]) != repr(samplers[1]) and "seed=1000" in repr(samplers[0])
    assert sorted(samplers[0].record(g) for g in range(60)) == list(range(60))
