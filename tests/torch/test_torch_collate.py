"""SeqDataset records and batches, collate_padded, pin_memory, and the map-style loader's exact state."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402
from torch_testlib import make_store  # noqa: E402

import seqstore  # noqa: E402
from seqstore.data import LengthsDataset, StoreDataset  # noqa: E402
from seqstore.torch import (  # noqa: E402
    EpochBatchSampler,
    EpochSampler,
    GatheredRecords,
    PaddedCollate,
    SeqDataLoader,
    SeqDataset,
    collate_padded,
)

N = 90


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("c") / "c.seqstore"
    make_store(p, N, seed=2, shard_records=32)
    return p


def test_records_are_tensors_without_warnings(store: Path) -> None:
    ds = SeqDataset(store, with_index=True)
    raw = seqstore.open(store)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on non-writable arrays; we copy instead
        rec = ds[40]
        last = ds[-1]
    assert rec["x"].shape == (raw[40]["x"].shape[0], 3) and rec["x"].dtype == torch.float32
    np.testing.assert_array_equal(rec["x"].numpy(), raw[40]["x"])
    rec["x"] += 1  # writable, and the store is untouched
    np.testing.assert_array_equal(ds[40]["x"].numpy(), raw[40]["x"])
    assert rec["spk"].dtype == torch.int16 and rec["spk"].dim() == 0
    assert rec["w"].dtype == torch.bfloat16 and rec["w"].tolist() == [1.5, 1.5]
    assert int(rec["index"]) == 40 and int(last["index"]) == N - 1
    assert ds.ragged_fields == ("x",) and len(ds) == N
    with pytest.raises(IndexError):
        ds[N]
    with pytest.raises(TypeError):
        ds[1.5]  # type: ignore[index]
    only = SeqDataset(store, fields=["spk"])
    assert set(only[3]) == {"spk"} and only.ragged_fields == ()


def test_collate_general_path_equals_gathered_path(store: Path) -> None:
    ds = SeqDataset(store)
    idx = [5, 17, 3, 88]
    gathered = ds.__getitems__(idx)
    plain = [ds[i] for i in idx]
    for masks in (False, True):
        a = collate_padded(gathered, masks=masks)
        b = collate_padded(plain, masks=masks)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    out = collate_padded(plain, masks=True)
    lens = out["x_lengths"]
    assert out["x"].shape == (4, int(lens.max()), 3)
    assert torch.equal(out["x_mask"].sum(1), lens)
    assert float(out["x"][~out["x_mask"]].abs().sum()) == 0.0
    assert torch.equal(out["spk"], torch.tensor([5 % 7, 17 % 7, 3, 88 % 7], dtype=torch.int16))
    filled = collate_padded(plain, pad_value=-1.0)
    assert bool((filled["x"][~out["x_mask"]] == -1.0).all())
    assert torch.equal(filled["x"][out["x_mask"]], out["x"][out["x_mask"]])


def test_gathered_records_are_views_of_one_unpadded_gather(store: Path) -> None:
    """``__getitems__`` gathers once, unpadded: each record's ragged rows are a view into the batch's
    values; the padded batch is made only when asked and equals the store's padded gather."""
    ds = SeqDataset(store, with_index=True)
    idx = [7, 0, 55, 31, 89]
    got = ds.__getitems__(idx)
    assert "_padded" not in got.__dict__
    raw = seqstore.open(store).get_batch(np.array(idx), pad=True)
    values, lens = raw["x"]
    assert got.values["x"].shape == (int(lens.sum()), 3)
    base = got.values["x"].untyped_storage().data_ptr()
    for b, rec in enumerate(got):
        assert rec["x"].untyped_storage().data_ptr() == base  # a view, not a copy
        np.testing.assert_array_equal(rec["x"].numpy(), values[b, : lens[b]])
        assert int(rec["index"]) == idx[b]
    padded = got.padded
    assert padded is got.padded  # made once
    np.testing.assert_array_equal(padded["x"].numpy(), values)
    np.testing.assert_array_equal(padded["spk"].numpy(), raw["spk"])
    assert padded["index"].tolist() == idx
    got.padded = {**padded, "x": padded["x"] + 1}  # still settable: collate_padded takes what was set
    assert torch.equal(collate_padded(got)["x"], padded["x"] + 1)


def test_records_changed_by_a_collate_function_are_what_is_collated(store: Path) -> None:
    """A collate function of the user's own that changes the gathered records before it calls
    collate_padded (or torch's default collate) gets the records as changed: a field replaced, records
    dropped, reordered or added, a field added; not the batch as it was gathered."""
    ds = SeqDataset(store, with_index=True)
    idx = [7, 0, 55, 31, 89, 12]

    def collated(change: object) -> dict[str, torch.Tensor]:
        records = ds.__getitems__(idx)
        change(records)  # type: ignore[operator]
        return collate_padded(records, ragged=["x"], masks=True)

    def plain(records: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return collate_padded([dict(r) for r in records], ragged=["x"], masks=True)

    def negate(records: list[dict[str, torch.Tensor]]) -> None:
        for r in records:
            r["x"] = -r["x"]

    def short_only(records: list[dict[str, torch.Tensor]]) -> None:
        records[:] = [r for r in records if len(r["x"]) <= 6]

    def add_a_field(records: list[dict[str, torch.Tensor]]) -> None:
        for r in records:
            r["y"] = r["x"].sum(0)

    changes = [negate, short_only, add_a_field, lambda rs: rs.pop(), lambda rs: rs.reverse(),
               lambda rs: rs.append(dict(rs[0]))]
    for change in changes:
        records = ds.__getitems__(idx)
        change(records)
        want = plain(records)
        got = collated(change)
        assert got.keys() == want.keys(), change
        assert all(torch.equal(got[k], want[k]) for k in want), change
    unchanged = collated(lambda rs: None)
    assert torch.equal(unchanged["index"], torch.tensor(idx))
    by_hand = GatheredRecords([{"a": torch.zeros(2)}, {"a": torch.zeros(3)}])  # no views: taken as it is
    by_hand.values, by_hand.lengths = {"a": torch.ones(5)}, {"a": torch.tensor([2, 3])}
    assert collate_padded(by_hand)["a"].tolist() == [[1, 1, 0], [1, 1, 1]]

    fixed = SeqDataset(store, fields=["spk"])  # no ragged field: torch's default collate takes the batch
    records = fixed.__getitems__(idx)
    for r in records:
        r["spk"] = r["spk"] + 100
    from torch.utils.data import default_collate

    assert default_collate(records)["spk"].tolist() == [i % 7 + 100 for i in idx]


def test_pad_rows() -> None:
    from seqstore.torch.collate import pad_rows

    lengths = torch.tensor([2, 0, 3])
    values = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    out = pad_rows(values, lengths, pad_value=-1)
    assert out.shape == (3, 3, 2)
    assert out[0, :2].tolist() == values[:2].tolist() and out[2].tolist() == values[2:].tolist()
    assert bool((out[1] == -1).all()) and bool((out[0, 2] == -1).all())
    assert pad_rows(values.to(torch.bfloat16), lengths).dtype == torch.bfloat16
    assert pad_rows(torch.zeros(0, 4), torch.tensor([0, 0])).shape == (2, 0, 4)
    assert pad_rows(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64)).shape == (0, 0, 4)


def test_collate_errors_and_options() -> None:
    with pytest.raises(ValueError, match="empty"):
        collate_padded([])
    with pytest.raises(ValueError, match="inner shapes"):
        collate_padded([{"a": np.zeros((2, 3))}, {"a": np.zeros((2, 4))}], ragged=["a"])
    with pytest.raises(ValueError, match="shapes"):
        collate_padded([{"a": np.zeros((2, 3))}, {"a": np.zeros((3, 4))}], ragged=[])
    with pytest.raises(KeyError, match="lack"):
        collate_padded([{"a": np.zeros(2)}, {"b": np.zeros(2)}])
    with pytest.raises(KeyError, match="clashes"):
        collate_padded([{"a": np.zeros(2), "a_lengths": np.zeros(1)}, {"a": np.zeros(3), "a_lengths": np.zeros(1)}])
    # equal lengths: named ragged fields still get lengths
    out = PaddedCollate(["a"], masks=True)([{"a": np.ones(2, np.float32)}, {"a": np.ones(2, np.float32)}])
    assert out["a_lengths"].tolist() == [2, 2] and out["a_mask"].all()
    # numpy scalars and read-only arrays
    ro = np.arange(3)
    ro.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = collate_padded([{"s": np.float32(1), "v": ro}, {"s": np.float32(2), "v": ro}])
    assert out["s"].tolist() == [1.0, 2.0] and out["v"].shape == (2, 3)


def test_map_loader_with_workers_pin_memory_and_exact_state(store: Path) -> None:
    sds = SeqDataset(StoreDataset(store, ordering="random", seed=4), with_index=True)
    k, bs = 3, 4
    states, seen = [], []
    for r in range(2):
        sampler = EpochSampler(sds, rank=r, world_size=2)
        loader = SeqDataLoader(sds, sampler=sampler, batch_size=bs, num_workers=2, collate_fn=sds.collate(masks=True),
                               pin_memory=True, prefetch_factor=3)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*pin_memory.*")  # CPU-only: no accelerator to pin for
            for step, b in enumerate(loader):
                assert set(b) == {"x", "x_lengths", "x_mask", "spk", "w", "index"}
                np.testing.assert_array_equal(b["x"][:, 0, 0].numpy(), b["index"].numpy())
                seen.append(b["index"].numpy())
                if step + 1 == k:
                    break
        states.append(loader.state_dict())  # 3 batches consumed, more were prefetched
    assert states[0] == states[1] and states[0]["position"] == k * bs * 2
    sampler = EpochSampler(sds, rank=0, world_size=1)
    loader = SeqDataLoader(sds, sampler=sampler, batch_size=bs, collate_fn=collate_padded)
    loader.load_state_dict(states[0])
    rest = [b["index"].numpy() for b in loader]
    np.testing.assert_array_equal(np.sort(np.concatenate(seen + rest)), np.arange(N))


def test_batch_sampler_loader_state(store: Path) -> None:
    sds = SeqDataset(StoreDataset(store, ordering="random", seed=4), with_index=True)
    bsamp = EpochBatchSampler(sds, max_frames=30, rank=0, world_size=1)
    loader = SeqDataLoader(sds, batch_sampler=bsamp, collate_fn=collate_padded)
    first = []
    for b in loader:
        first.append(b["index"].numpy())
        assert int(b["x_lengths"].max()) * len(b["index"]) <= 30 or len(b["index"]) == 1
        if len(first) == 4:
            break
    state = loader.state_dict()
    assert state["position"] == sum(len(f) for f in first)
    b2 = EpochBatchSampler(sds, max_frames=30, rank=0, world_size=1)
    b2.load_state_dict(state)
    rest = [np.asarray(x) for x in b2]
    np.testing.assert_array_equal(np.sort(np.concatenate(first + rest)), np.arange(N))


def test_plain_dataloader_and_generic_dataset() -> None:
    ld = LengthsDataset(np.arange(1, 11), ordering="random", seed=1)
    sds = SeqDataset(ld)
    assert sds.ragged_fields == () and int(sds[3]["length"]) == 4
    loader = DataLoader(sds, sampler=EpochSampler(ld, rank=0, world_size=1), batch_size=3, collate_fn=collate_padded)
    got = torch.cat([b["length"] for b in loader])
    assert sorted(got.tolist()) == list(range(1, 11))


def test_getitems_refuses_indices_that_are_not_integers(store: Path) -> None:
    ds = SeqDataset(store, with_index=True)
    for bad in ([1.7, 2.2], np.array([True, False]), [0, 1.5]):
        with pytest.raises(TypeError, match="SeqDataset indices must be integers"):
            ds.__getitems__(bad)
    assert [int(r["index"]) for r in ds.__getitems__(np.array([1, -1], dtype=np.int32))] == [1, N - 1]


def test_gathered_fast_path_raises_for_missing_ragged_names(store: Path) -> None:
    """The fast path (a SeqDataset batch) and the general path agree: an unknown ragged name is a KeyError."""
    ds = SeqDataset(store)
    batch = ds.__getitems__([0, 1, 2])
    with pytest.raises(KeyError, match=r"ragged field\(s\) \['nope'\] not in the records"):
        collate_padded(batch, ragged=["x", "nope"])
    with pytest.raises(KeyError, match=r"ragged field\(s\) \['nope'\] not in the records"):
        collate_padded(list(batch), ragged=["x", "nope"])
    with pytest.raises(KeyError, match="nope"):
        PaddedCollate(["nope"])(batch)
    assert collate_padded(batch, ragged=["x"])["x_lengths"].shape == (3,)


def test_gathered_fast_path_refuses_a_ragged_field_left_out_of_ragged(store: Path) -> None:
    """A ragged field not named in ``ragged=`` whose records differ in length: the general path refuses it,
    the fast path (a SeqDataset batch; the loaders without workers) padded it and left out its lengths,
    so the padding read as data. Now both refuse it; records of one length are stacked by both."""
    ds = SeqDataset(store, fields=["x", "spk"])
    lens = np.asarray(seqstore.open(store).lengths("x"))
    uneven = [int(i) for i in np.flatnonzero(lens != lens[0])[:2]] + [0]
    even = [int(i) for i in np.flatnonzero(lens == lens[0])[:2]]
    for records in (ds.__getitems__(uneven), list(ds.__getitems__(uneven))):
        with pytest.raises(ValueError, match="field 'x' has records of shapes"):
            collate_padded(records, ragged=())
    with pytest.raises(ValueError, match="field 'x' has records of shapes"):
        next(iter(SeqDataLoader(ds, sampler=EpochSampler(ds), batch_size=N, collate_fn=PaddedCollate(()))))
    fast = collate_padded(ds.__getitems__(even), ragged=())
    general = collate_padded(list(ds.__getitems__(even)), ragged=())
    assert fast.keys() == general.keys() == {"x", "spk"} and torch.equal(fast["x"], general["x"])


def test_meta_renamed_bfloat16_fields_are_bfloat16(tmp_path: Path) -> None:
    """bfloat16 is decided by the dataset's output names: a renamed bfloat16 field stays bfloat16, and
    another child's uint16 field with the child-level name of the bfloat16 field stays uint16."""
    from seqstore.data import ConcatDataset, MetaDataset

    ids = [f"u-{i}" for i in range(6)]
    with seqstore.create(tmp_path / "a.seqstore", {"w": seqstore.Field("bfloat16", (2,)),
                                                  "x": seqstore.Field("float32", (None,))}) as wr:
        wr.append_batch({"w": np.full((6, 2), 1.5, np.float32),
                         "x": (np.ones(12, np.float32), np.full(6, 2, np.int64))}, ids=ids)
    with seqstore.create(tmp_path / "b.seqstore", {"w": seqstore.Field("uint16", (2,))}) as wr:
        wr.append_batch({"w": np.full((6, 2), 7, np.uint16)}, ids=ids)
    meta = MetaDataset({"a": StoreDataset(tmp_path / "a.seqstore"), "b": StoreDataset(tmp_path / "b.seqstore")},
                       fields={"a": {"w": "a_w", "x": "x"}}, cache_dir=tmp_path / "c")
    for ds in (SeqDataset(meta), SeqDataset(ConcatDataset([meta, meta]))):
        rec = ds[2]
        assert rec["a_w"].dtype == torch.bfloat16 and rec["a_w"].tolist() == [1.5, 1.5]
        assert rec["w"].dtype != torch.bfloat16 and rec["w"].tolist() == [7, 7]
        out = collate_padded(ds.__getitems__([0, 3]))
        assert out["a_w"].dtype == torch.bfloat16 and out["a_w"].tolist() == [[1.5, 1.5]] * 2
        assert out["w"].dtype != torch.bfloat16 and out["w"].tolist() == [[7, 7]] * 2


def test_with_index_refuses_a_field_named_index_record_by_record(tmp_path: Path) -> None:
    """``SeqDataset(with_index=True)[i]`` over a store with a field named ``index`` is the KeyError its
    batches raise, not the field's value silently replaced by ``i``."""
    from seqstore import Field

    path = tmp_path / "i.seqstore"
    with seqstore.create(path, {"x": Field("float32", (None,)), "index": Field("int32")}) as w:
        w.append_batch({"x": (np.arange(10, dtype=np.float32), np.full(5, 2)),
                        "index": np.arange(100, 105, dtype=np.int32)})
    with pytest.raises(KeyError, match="already has a field named 'index'"):  # when made, not in a worker
        SeqDataset(path, with_index=True)

    from seqstore.data import ConcatDataset, StoreDataset

    unknown = ConcatDataset([StoreDataset(path)])  # its field names are known from its records only
    assert not hasattr(unknown, "field_names") and not hasattr(unknown, "store")
    for get in (lambda ds: ds[3], lambda ds: ds.__getitems__([3])):
        with pytest.raises(KeyError, match="already has a field named 'index'"):
            get(SeqDataset(unknown, with_index=True))
    assert int(SeqDataset(path)[3]["index"]) == 103


def test_ragged_as_a_string_is_one_field(tmp_path: Path) -> None:
    """``ragged="feats"`` (as ``fields="x"`` is the one field ``x``) was taken letter by letter: the records'
    ``feats`` counted as not ragged ("has records of shapes ..."), a gathered batch was a KeyError naming the
    letters, and ``PaddedCollate("feats")`` in a loader the same. A string is the one field's name now."""
    p = tmp_path / "f.seqstore"
    with seqstore.create(p, {"feats": seqstore.Field("float32", (None, 2)), "y": seqstore.Field("int64")}) as wr:
        for n in (3, 5, 2):
            wr.append({"feats": np.full((n, 2), n, np.float32), "y": n})
    sds = SeqDataset(p)
    plain = [sds[i] for i in range(3)]
    gathered = sds.__getitems__([0, 1, 2])
    want = collate_padded(plain, ragged=["feats"])
    assert set(want) == {"feats", "feats_lengths", "y"} and want["feats_lengths"].tolist() == [3, 5, 2]
    for got in (collate_padded(plain, ragged="feats"), collate_padded(gathered, ragged="feats"),
                PaddedCollate("feats")(plain), PaddedCollate("feats")(sds.__getitems__([0, 1, 2]))):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    loader = SeqDataLoader(sds, sampler=EpochSampler(sds), batch_size=3, collate_fn=PaddedCollate("feats", masks=True))
    (batch,) = list(loader)
    assert batch["feats_lengths"].tolist() == [3, 5, 2] and batch["feats_mask"].sum() == 10


def test_a_pad_value_that_is_not_a_number_is_refused_when_made() -> None:
    """``PaddedCollate(pad_value="x")`` (or None) was taken, and every batch with a ragged field failed later,
    in the DataLoader's worker, with torch's "full(): argument 'fill_value' ... must be Number"; it is a
    ValueError naming pad_value when the collate function is made (and when collate_padded is called)."""
    records = [{"a": np.zeros(2, np.float32)}, {"a": np.zeros(3, np.float32)}]
    for bad in ("x", None, [0], b"0"):
        with pytest.raises(ValueError, match="pad_value must be a number"):
            PaddedCollate(pad_value=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="pad_value must be a number"):
            collate_padded(records, pad_value=bad)  # type: ignore[arg-type]
    for good in (-1, 0.5, np.float32(2), float("nan"), torch.tensor(3.0)):
        out = PaddedCollate(pad_value=good)(records)  # type: ignore[arg-type]
        assert out["a"].shape == (2, 3) and out["a_lengths"].tolist() == [2, 3]


def test_a_pad_value_an_integer_field_cannot_hold_is_refused() -> None:
    """``pad_value=-100`` (an ignore index) for a uint16 token field padded with 65436, and 0.5 for an
    int32 field with 0, without a word: a loss then took the padding for tokens. Now a ValueError names the
    field, its dtype and the values it holds; values it holds pad as before."""
    ragged = [{"x": np.array([1, 2], np.uint8)}, {"x": np.array([3], np.uint8)}]
    with pytest.raises(ValueError, match=r"pad_value -1 .*'x' \(torch.uint8\).*\[0, 255\]"):
        collate_padded(ragged, pad_value=-1)
    ints = [{"x": np.array([1, 2], np.int32)}, {"x": np.array([3], np.int32)}]
    with pytest.raises(ValueError, match=r"pad_value 0.5 .*'x'"):
        collate_padded(ints, pad_value=0.5)
    with pytest.raises(ValueError, match=r"0 or 1"):
        collate_padded([{"m": np.ones(2, bool)}, {"m": np.ones(1, bool)}], pad_value=2)
    assert collate_padded(ints, pad_value=-1.0)["x"].tolist() == [[1, 2], [3, -1]]
    assert collate_padded(ragged, pad_value=torch.tensor(255))["x"].tolist() == [[1, 2], [3, 255]]
    floats = [{"x": np.ones(2, np.float32)}, {"x": np.ones(1, np.float32)}]
    assert collate_padded(floats, pad_value=-0.5)["x"][1, 1] == -0.5


@pytest.mark.skipif(not hasattr(torch, "uint16"), reason="torch < 2.3 has no uint16 tensors (these pad as int32)")
@pytest.mark.parametrize("pad", [0, 3])
@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
def test_unsigned_ragged_fields_pad_from_gathered_records(tmp_path: Path, dtype: str, pad: int) -> None:
    """torch has no masked copy into uint16/32/64 tensors: the gathered (fast) path padded them with one and
    raised its NotImplementedError; values past the signed range keep their bits."""
    p = tmp_path / "u.seqstore"
    top = int(np.iinfo(dtype).max)
    rows = [np.array([top, top - 1, 1], dtype), np.array([top - 2, 0, 5, top, 7], dtype)]
    with seqstore.create(p, {"tokens": seqstore.Field(dtype, (None,))}) as w:
        w.append_batch({"tokens": rows})
    ds = SeqDataset(p)
    out = collate_padded(ds.__getitems__([0, 1]), pad_value=pad)
    assert out["tokens"].dtype == getattr(torch, dtype) and out["tokens_lengths"].tolist() == [3, 5]
    want = np.full((2, 5), pad, dtype)
    want[0, :3], want[1] = rows
    np.testing.assert_array_equal(out["tokens"].numpy(), want)
    plain = collate_padded([ds[0], ds[1]], pad_value=pad)
    assert torch.equal(plain["tokens"], out["tokens"])
