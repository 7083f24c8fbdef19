"""A plain ``DataLoader(SeqDataset(...))`` with torch's default collate: ragged fields give a seqstore
error naming ``collate_padded`` (not torch's "Trying to resize storage that is not resizable");
fixed fields collate as stacking would. ``SeqDataset(path, length_field=...)`` is accepted, and a
store with several ragged fields opens without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import seqstore as ss  # noqa: E402
from seqstore.errors import SeqstoreError  # noqa: E402
from seqstore.torch import SeqDataset, collate_padded  # noqa: E402


def _store(path: Path, ragged: int) -> Path:
    schema = {"label": ss.Field("int64", ()), "emb": ss.Field("float32", (3,))}
    for k in range(ragged):
        schema[f"feat{k}"] = ss.Field("float32", (None, 2))
    with ss.create(path, schema) as w:
        for i in range(12):
            rec = {"label": i, "emb": np.full(3, i, np.float32)}
            for k in range(ragged):
                rec[f"feat{k}"] = np.full((1 + (i + k) % 5, 2), i, np.float32)
            w.append(rec)
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_default_collate_of_ragged_fields_names_collate_padded(tmp_path: Path, workers: int) -> None:
    ds = SeqDataset(_store(tmp_path / "s.seqstore", 1))
    with pytest.raises(SeqstoreError, match=r"collate_padded.*") as e:
        next(iter(DataLoader(ds, batch_size=4, num_workers=workers)))
    assert "feat0" in str(e.value)
    batch = next(iter(DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=collate_padded)))
    assert batch["feat0"].shape == (4, 4, 2) and batch["feat0_lengths"].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("workers", [0, 2])
def test_default_collate_of_fixed_fields_stacks(tmp_path: Path, workers: int) -> None:
    ds = SeqDataset(_store(tmp_path / "s.seqstore", 0))
    batches = list(DataLoader(ds, batch_size=5, num_workers=workers))
    assert [b["label"].tolist() for b in batches] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    assert batches[1]["emb"].shape == (5, 3) and float(batches[1]["emb"][2, 0]) == 7.0


def test_seqdataset_length_field_and_several_ragged_fields(tmp_path: Path) -> None:
    path = _store(tmp_path / "s.seqstore", 2)
    ds = SeqDataset(str(path))  # map-style: no length field needed
    assert len(ds) == 12 and ds[3]["feat1"].shape == (5, 2)
    with pytest.raises(ValueError, match="name the one that measures length with length_field="):
        ds.dataset.lengths()  # asked for lengths: now the field must be named
    ds = SeqDataset(path, length_field="feat1")
    assert np.asarray(ds.dataset.lengths()[np.arange(3)]).tolist() == [2, 3, 4]
    with pytest.raises(ValueError, match="not a ragged field"):
        SeqDataset(path, length_field="label")


def test_collate_of_a_store_dataset_with_fields_pads_only_the_fields_it_returns(tmp_path: Path) -> None:
    """``SeqDataset(StoreDataset(path, fields=[...]))``: ``ragged_fields`` named every ragged field of the store,
    so ``collate()`` asked for one the records lack and every batch was a KeyError; it names the dataset's own."""
    from torch.utils.data import DataLoader

    from seqstore.data import StoreDataset
    from seqstore.torch import EpochSampler, SeqDataLoader

    path = _store(tmp_path / "s.seqstore", 2)
    sds = SeqDataset(StoreDataset(path, fields=["label", "feat1"]))
    assert sds.ragged_fields == ("feat1",)
    want = {"label", "feat1", "feat1_lengths"}
    for loader in (DataLoader(sds, batch_size=4, collate_fn=sds.collate()),
                   SeqDataLoader(sds, sampler=EpochSampler(sds), batch_size=4, collate_fn=sds.collate())):
        batch = next(iter(loader))
        assert set(batch) == want and batch["feat1_lengths"].tolist() == [2, 3, 4, 5]


def test_fields_a_store_dataset_does_not_return_are_a_key_error(tmp_path: Path) -> None:
    """``SeqDataset`` / ``IterableSeqDataset(StoreDataset(path, fields=[...]), fields=[...])`` asking for a field
    the store dataset does not return gave records without it (every record ``{}`` here), silently; it is a
    KeyError naming the field, as for a field the store lacks."""
    from seqstore.data import StoreDataset
    from seqstore.torch import IterableSeqDataset

    path = _store(tmp_path / "s.seqstore", 1)
    narrow = StoreDataset(path, fields=["feat0"])
    for make in (SeqDataset, IterableSeqDataset):
        with pytest.raises(KeyError, match=r"'label'.*feat0"):
            make(narrow, fields=["label"])
        with pytest.raises(KeyError, match="nope"):
            make(StoreDataset(path), fields=["nope"])
    assert list(SeqDataset(narrow, fields=["feat0"])[3]) == ["feat0"]
    assert list(SeqDataset(StoreDataset(path), fields=["label"])[3]) == ["label"]


def test_records_one_by_one_of_equal_lengths_still_get_their_lengths(tmp_path: Path) -> None:
    """A SeqDataset read record by record (``ds[i]``: under a ConcatDataset, which has no ``__getitems__``):
    a batch whose records share a length has ``feat0_lengths`` as the others have (it had none)."""
    from torch.utils.data import ConcatDataset

    ds = SeqDataset(_store(tmp_path / "s.seqstore", 1))
    batches = list(DataLoader(ConcatDataset([ds]), batch_sampler=[[0, 5, 10], [1, 2]], collate_fn=collate_padded))
    assert [b["feat0_lengths"].tolist() for b in batches] == [[1, 1, 1], [2, 3]]
