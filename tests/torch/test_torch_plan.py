"""Position arithmetic of seqstore.torch: streams over ranks x workers, padding, prefixes."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch_testlib import round_robin  # noqa: E402

from seqstore.torch._plan import (  # noqa: E402
    LengthBatching,
    fixed_item_positions,
    fixed_stream_positions,
    fixed_total,
    select_items,
)


@settings(max_examples=60, deadline=None)
@given(length=st.integers(0, 60), start=st.integers(0, 60), item=st.integers(1, 5), world=st.integers(1, 4),
       workers=st.integers(1, 3), drop_last=st.booleans())
def test_fixed_items_cover_remaining_once(length: int, start: int, item: int, world: int, workers: int,
                                          drop_last: bool) -> None:
    start = min(start, length)
    rem = length - start
    streams = world * workers
    per_rank = []
    for r in range(world):
        per_worker = [list(fixed_item_positions(length, start, item=item, world=world, streams=streams,
                                                stream=w * world + r, drop_last=drop_last)) for w in range(workers)]
        per_rank.append(round_robin(per_worker))
    counts = {len(p) for p in per_rank}
    assert len(counts) == 1  # every rank the same number of items
    k = counts.pop()
    total = fixed_total(rem, item, world, drop_last)
    assert k * item * world == total
    assert all(len(it) == item for p in per_rank for it in p)  # items are always full
    # the rank's m-th item is global item m*W + r: lockstep consumption is a prefix
    for m in range(k):
        got = np.concatenate([per_rank[r][m] for r in range(world)])
        q = np.arange(m * world * item, (m + 1) * world * item)
        want = np.where(q < rem, start + q, (q - rem) % max(length, 1))
        np.testing.assert_array_equal(got, want)
    if not drop_last and rem:
        allpos = np.concatenate([np.concatenate(p) for p in per_rank])
        assert set(range(start, length)) <= set(allpos.tolist())
        assert total - rem < item * world


@settings(max_examples=50, deadline=None)
@given(length=st.integers(0, 80), start=st.integers(0, 80), world=st.integers(1, 4), chunk=st.integers(1, 7),
       drop_last=st.booleans())
def test_stream_positions_equal_item_positions(length: int, start: int, world: int, chunk: int,
                                                drop_last: bool) -> None:
    start = min(start, length)
    for r in range(world):
        a = list(fixed_stream_positions(length, start, world=world, streams=world, stream=r, drop_last=drop_last,
                                        chunk=chunk))
        b = list(fixed_item_positions(length, start, item=1, world=world, streams=world, stream=r,
                                      drop_last=drop_last))
        flat_a = np.concatenate(a) if a else np.empty(0, np.int64)
        flat_b = np.concatenate(b) if b else np.empty(0, np.int64)
        np.testing.assert_array_equal(flat_a, flat_b)
        assert all(len(c) <= chunk for c in a)


@settings(max_examples=60, deadline=None)
@given(count=st.integers(0, 40), world=st.integers(1, 4), workers=st.integers(1, 3), drop_last=st.booleans())
def test_select_items(count: int, world: int, workers: int, drop_last: bool) -> None:
    streams = world * workers
    per_rank = []
    for r in range(world):
        per_worker = [list(select_items(iter(range(count)), world=world, streams=streams, stream=w * world + r,
                                        drop_last=drop_last)) for w in range(workers)]
        per_rank.append(round_robin(per_worker))
    lens = {len(p) for p in per_rank}
    assert len(lens) == 1
    k = lens.pop()
    total = count // world * world if drop_last else -(-count // world) * world
    assert k * world == total
    for m in range(k):
        for r in range(world):
            j = m * world + r
            assert per_rank[r][m] == (j if j < count else (j - count) % count)


def test_length_batching_validation() -> None:
    with pytest.raises(ValueError, match="max_frames or max_seqs"):
        LengthBatching()
    with pytest.raises(ValueError, match="max_frames"):
        LengthBatching(max_frames=0)
    with pytest.raises(ValueError, match="buffer_size"):
        LengthBatching(max_seqs=3, buffer_size=0)
    assert LengthBatching(max_seqs=3, buckets=[1, 5]).config()["buckets"] == [1, 5]


def test_seeds_and_fingerprints_reuse_the_shared_helpers() -> None:
    """bucket_seed is the order layer's master key (stream "torch.bucket"); dataset fingerprints are the
    data layer's cache fingerprint. (Values changed with this reuse; states of older builds do not load.)"""
    from seqstore.data import LengthsDataset
    from seqstore.data._cache import fingerprint
    from seqstore.order._keys import master_key
    from seqstore.torch._plan import bucket_seed
    from seqstore.torch._state import dataset_identity

    for seed, epoch in ((0, 1), (7, 3), (-2, 10)):
        assert bucket_seed(seed, epoch) == master_key(seed, epoch, "torch.bucket") & ((1 << 63) - 1)
    assert bucket_seed(0, 1) != bucket_seed(0, 2) != bucket_seed(1, 1)
    ds = LengthsDataset(np.arange(5))
    ident = dataset_identity(ds)
    assert ident["fingerprint"] == fingerprint("torch.state", ident["type"], 5, None)
