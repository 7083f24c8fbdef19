"""IterableSeqDataset in records mode: records gathered in blocks and handed out as views, exact resume
in the middle of a block (also across a change of DataLoader workers)."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_testlib import as_worker, make_store  # noqa: E402

from seqstore.data import StoreDataset  # noqa: E402
from seqstore.torch import IterableSeqDataset, SeqDataLoader, collate_padded  # noqa: E402
from seqstore.torch._plan import fixed_item_blocks, fixed_item_positions  # noqa: E402
from seqstore.torch.iterable import RECORDS_BLOCK  # noqa: E402

N = 333  # more than two blocks


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> StoreDataset:
    p = tmp_path_factory.mktemp("rec") / "r.seqstore"
    make_store(p, N, seed=3, shard_records=50)
    return StoreDataset(p, ordering="random", seed=5)


@pytest.mark.parametrize("length,position,item,world,streams,drop_last,items", [
    (157, 0, 1, 1, 1, False, 128), (157, 10, 4, 2, 4, False, 3), (157, 10, 4, 2, 4, True, 3),
    (1000, 333, 7, 3, 6, False, 18), (5, 0, 2, 2, 2, False, 64), (0, 0, 1, 1, 1, False, 8),
    (200, 199, 1, 2, 2, False, 5),
])
def test_blocks_are_the_items_in_order(length: int, position: int, item: int, world: int, streams: int,
                                       drop_last: bool, items: int) -> None:
    for stream in range(streams):
        kw: dict[str, Any] = dict(item=item, world=world, streams=streams, stream=stream, drop_last=drop_last)
        single = list(fixed_item_positions(length, position, **kw))
        blocks = list(fixed_item_blocks(length, position, items=items, **kw))
        assert all(len(b) % item == 0 and 0 < len(b) <= items * item for b in blocks)
        want = np.concatenate(single) if single else np.zeros(0, np.int64)
        got = np.concatenate(blocks) if blocks else np.zeros(0, np.int64)
        np.testing.assert_array_equal(got, want)


def test_records_are_the_dataset_records(ds: StoreDataset) -> None:
    it = IterableSeqDataset(ds, with_index=True)
    recs = list(it)
    order = ds.epoch_order(1).to_numpy()
    np.testing.assert_array_equal([int(r["index"]) for r in recs], order)
    for r in recs[:: 7]:
        i = int(r["index"])
        want = ds.get(i)
        assert list(r) == ["x", "spk", "w", "index"]
        np.testing.assert_array_equal(r["x"].numpy(), want["x"])
        assert r["x"].shape == (len(want["x"]), 3) and r["spk"].shape == () and int(r["spk"]) == i % 7
        assert r["w"].dtype == torch.bfloat16 and r["w"].tolist() == [1.5, 1.5]
    # views into the block: the first two records share one storage
    assert recs[0]["x"].untyped_storage().data_ptr() == recs[1]["x"].untyped_storage().data_ptr()
    only = next(iter(IterableSeqDataset(ds, fields=["x"])))
    assert list(only) == ["x"]


@pytest.mark.parametrize("group,world", [(1, 1), (3, 2), (RECORDS_BLOCK + 5, 1)])
def test_worker_records_are_its_items(ds: StoreDataset, group: int, world: int) -> None:
    """A worker's records are exactly the records of the items its iter_indices names, in order."""
    for rank, w in itertools.product(range(world), range(2)):
        it = IterableSeqDataset(ds, group=group, rank=rank, world_size=world, with_index=True)
        copy = pickle.loads(pickle.dumps(it))
        with as_worker(w, 2):
            items = list(copy.iter_indices())
            got = [int(r["index"]) for r in pickle.loads(pickle.dumps(it))]
        np.testing.assert_array_equal(got, np.concatenate(items))


@pytest.mark.parametrize("group", [1, 3])
def test_resume_in_the_middle_of_a_block(ds: StoreDataset, group: int) -> None:
    k = (RECORDS_BLOCK + 40) // group  # items consumed: inside the second block
    it = IterableSeqDataset(ds, group=group, epoch=2, with_index=True)
    head = [int(r["index"]) for r in itertools.islice(iter(it), k * group)]
    state = it.state_dict(consumed=k)
    again = IterableSeqDataset(ds, group=group, with_index=True)
    again.load_state_dict(state)
    rest = [int(r["index"]) for r in again]
    order = ds.epoch_order(2).to_numpy()
    np.testing.assert_array_equal(head, order[: k * group])
    np.testing.assert_array_equal(rest[: N - k * group], order[k * group:])
    assert len(rest) == -(-(N - k * group) // group) * group  # the tail padded to whole items


def test_loader_workers_resume_with_other_workers(ds: StoreDataset) -> None:
    """Records through real DataLoader workers (batches of 5 = items), a checkpoint after 30 batches,
    resumed without workers and then with 1: exactly the remaining records."""
    steps = 30
    it = IterableSeqDataset(ds, with_index=True)
    loader = SeqDataLoader(it, batch_size=5, num_workers=2, collate_fn=collate_padded)
    seen = []
    for b in itertools.islice(loader, steps):
        assert b["x"].shape[:2] == (5, int(b["x_lengths"].max()))
        np.testing.assert_array_equal(b["x"][:, 0, 0].numpy(), b["index"].numpy())  # x[t, 0] = index
        seen.append(b["index"].numpy())
    state = loader.state_dict()
    order = ds.epoch_order(1).to_numpy()
    np.testing.assert_array_equal(np.concatenate(seen), order[: steps * 5])
    for workers in (0, 1):
        it2 = IterableSeqDataset(ds, with_index=True)
        loader2 = SeqDataLoader(it2, batch_size=5, num_workers=workers, collate_fn=collate_padded)
        loader2.load_state_dict(state)
        rest = np.concatenate([b["index"].numpy() for b in loader2])
        np.testing.assert_array_equal(rest[: N - steps * 5], order[steps * 5:])


def test_prefetch_zero_and_a_dataset_without_iter_batches(ds: StoreDataset, tmp_path: Path) -> None:
    class GetBatchOnly:
        """A protocol dataset that can only get_batch (no iter_batches, no prefetch)."""

        def __init__(self, inner: StoreDataset) -> None:
            self.inner = inner
            self.num_seqs = inner.num_seqs

        def epoch_order(self, epoch: int) -> Any:
            return self.inner.epoch_order(epoch)

        def get(self, i: int) -> Any:
            return self.inner.get(i)

        def get_batch(self, idx: Any, pad: bool = False) -> Any:
            return self.inner.get_batch(idx, pad=pad)

        def lengths(self) -> Any:
            return self.inner.lengths()

    want = [int(r["index"]) for r in IterableSeqDataset(ds, with_index=True)]
    assert [int(r["index"]) for r in IterableSeqDataset(ds, with_index=True, prefetch=0)] == want
    plain = [int(r["index"]) for r in IterableSeqDataset(GetBatchOnly(ds), with_index=True)]
    assert plain == want


def test_two_loaders_sharing_a_records_dataset_keep_their_own_group(ds: StoreDataset) -> None:
    """A second SeqDataLoader with another batch_size over the same records-mode dataset does not change
    the first one's items: its state after 5 batches of 4 is position 20, not 5 items of the other's 6."""
    it = IterableSeqDataset(ds, with_index=True)
    first = SeqDataLoader(it, batch_size=4, collate_fn=collate_padded)
    SeqDataLoader(it, batch_size=6, collate_fn=collate_padded)
    seen = np.concatenate([b["index"].numpy() for b in itertools.islice(first, 5)])
    np.testing.assert_array_equal(seen, ds.epoch_order(1).to_numpy()[:20])
    state = first.state_dict()
    assert state["position"] == 20
    again = SeqDataLoader(IterableSeqDataset(ds, with_index=True), batch_size=4, collate_fn=collate_padded)
    again.load_state_dict(state)
    rest = np.concatenate([b["index"].numpy() for b in again])
    np.testing.assert_array_equal(rest[: N - 20], ds.epoch_order(1).to_numpy()[20:])


def test_records_of_equal_lengths_still_get_their_lengths(tmp_path: Path) -> None:
    """Records mode + collate_padded: a batch whose records happen to share a length has ``x_lengths`` as
    every other batch (the records know their ragged fields, as SeqDataset's do); it had none."""
    make_store(tmp_path / "one.seqstore", 8, max_len=1)
    one = StoreDataset(tmp_path / "one.seqstore")
    for loader in (SeqDataLoader(IterableSeqDataset(one), batch_size=4, collate_fn=collate_padded),
                   torch.utils.data.DataLoader(IterableSeqDataset(one), batch_size=4, collate_fn=collate_padded)):
        batches = list(loader)
        assert len(batches) == 2
        for b in batches:
            assert b["x"].shape == (4, 1, 3) and b["x_lengths"].tolist() == [1] * 4



def test_records_changed_in_place_collate_as_their_values_say(tmp_path: Path) -> None:
    """The ragged fields records name are padded besides those inferred: a field made fixed-size or scalar
    by the user's transform stacks (torch's default collate too), a ragged field added is padded."""
    from torch.utils.data import default_collate

    make_store(tmp_path / "s.seqstore", 4, max_len=6)
    records = list(IterableSeqDataset(StoreDataset(tmp_path / "s.seqstore")))
    for i, r in enumerate(records):
        r["x"] = r["x"][:1]  # cropped to one frame
        r["y"] = torch.zeros(i + 1)
    assert default_collate([{"x": r["x"]} for r in records])["x"].shape == (4, 1, 3)
    assert default_collate([r for r in records if r.pop("y") is not None])["x"].shape == (4, 1, 3)
    for i, r in enumerate(records):
        r["x"] = r["x"].mean()  # a scalar now
        r["y"] = torch.zeros(i + 1)
    out = collate_padded(records)
    assert out["x"].shape == (4,) and out["y"].shape == (4, 4) and out["y_lengths"].tolist() == [1, 2, 3, 4]
