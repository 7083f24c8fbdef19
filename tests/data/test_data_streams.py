"""Streams: shuffle buffer and sampling with replacement are deterministic and resume exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

from seqstore.data import LengthsDataset, sample_with_replacement, shuffle_buffer
from seqstore.order import seq_order


class _Resumable:
    """A resumable source: 0..n-1, state = position."""

    def __init__(self, n: int) -> None:
        self.n, self.pos = n, 0

    def __iter__(self) -> Iterator[int]:
        while self.pos < self.n:
            self.pos += 1
            yield self.pos - 1

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, s: dict[str, int]) -> None:
        self.pos = s["pos"]


def _sources(n: int) -> dict[str, object]:
    return {
        "order": lambda: seq_order(n, "random", epoch=1, seed=1),
        "generator": lambda: (i for i in range(n)),
        "resumable": lambda: _Resumable(n),
        "list": lambda: list(range(n)),
        "array": lambda: np.arange(n),
    }


@pytest.mark.parametrize("kind", ["order", "generator", "resumable", "list", "array"])
def test_shuffle_buffer_resumes_exactly(kind: str) -> None:
    rng = np.random.default_rng(3)
    for n, size in ((0, 3), (1, 1), (57, 1), (200, 16), (500, 1000)):
        make = _sources(n)[kind]
        full = list(shuffle_buffer(make(), size, seed=9))  # type: ignore[operator]
        base = list(make())  # type: ignore[operator]
        assert sorted(full) == sorted(base)
        if n > 20 and size > 1:
            assert full != base
        for cut in sorted(set(rng.integers(0, n + 1, 4).tolist())):
            sb = shuffle_buffer(make(), size, seed=9)  # type: ignore[operator]
            head = [next(sb) for _ in range(cut)]
            state = json.loads(json.dumps(sb.state_dict()))  # survives a JSON round trip
            resumed = shuffle_buffer(make(), size, seed=9)  # type: ignore[operator]
            resumed.load_state_dict(state)
            assert resumed.state_dict() == state  # saved again before the next item: the same state
            assert head + list(resumed) == full
    assert list(shuffle_buffer(range(50), 10, seed=1)) != list(shuffle_buffer(range(50), 10, seed=2))


def test_sample_with_replacement_resumes_exactly() -> None:
    ds = LengthsDataset(np.ones(37, np.int64))
    s = sample_with_replacement(ds, seed=4)
    first = [next(s) for _ in range(5000)]
    assert all(0 <= x < 37 for x in first) and len(set(first)) == 37
    s2 = sample_with_replacement(37, seed=4)
    np.testing.assert_array_equal(s2.take(5000), first)
    for cut in (0, 1, 36, 37, 4095, 4096, 4100):
        a = sample_with_replacement(ds, seed=4)
        for _ in range(cut):
            next(a)
        b = sample_with_replacement(ds, seed=4)
        b.load_state_dict(json.loads(json.dumps(a.state_dict())))
        assert [next(b) for _ in range(200)] == first[cut : cut + 200]
    counts = np.bincount(sample_with_replacement(10, seed=0).take(100000), minlength=10)
    assert counts.min() > 9000 and counts.max() < 11000
    with pytest.raises(ValueError, match="at least one sequence"):
        sample_with_replacement(0)


def test_shuffle_draws_use_the_order_layers_mix64() -> None:
    """Draw k of the shuffle buffer is the order layer's splitmix64 finaliser of (seed, k) (values unchanged)."""
    from seqstore.data.streams import _mix
    from seqstore.order._keys import mix64

    mask = (1 << 64) - 1
    for seed in (0, 1, -5, 2**70):
        for k in (0, 1, 12345):
            assert _mix(seed, k) == mix64((seed * 0xD1B54A32D192ED03 + (k + 1) * 0x9E3779B97F4A7C15) & mask)
    assert _mix(0, 0) == 0xE220A8397B1DCDAF  # golden: the value before the refactor


def test_a_state_that_is_not_one_is_a_value_error_naming_what_is_expected() -> None:
    for bad in ({}, {"format": "seqstore.torch.state/v1", "position": 3}, [1, 2]):
        with pytest.raises(ValueError, match="not a sampler state: a dict with \\['seed', 'num_seqs', 'position'\\]"):
            sample_with_replacement(10, seed=1).load_state_dict(bad)  # type: ignore[arg-type]
    for pos in (-3, 2.5, "4"):
        with pytest.raises(ValueError, match="sampler state\\['position'\\] must be an integer >= 0"):
            sample_with_replacement(10, seed=1).load_state_dict({"seed": 1, "num_seqs": 10, "position": pos})
    state = shuffle_buffer(range(20), 4, seed=1).state_dict()
    with pytest.raises(ValueError, match="buffer state\\['consumed'\\] must be an integer >= 0, got -2"):
        shuffle_buffer(range(20), 4, seed=1).load_state_dict({**state, "consumed": -2})  # read range[-2:] before
    with pytest.raises(ValueError, match="not a buffer state"):
        shuffle_buffer(range(20), 4, seed=1).load_state_dict({"seed": 1, "size": 4})
    # its buffer and end flag: a string was taken for a buffer of its letters, a missing flag a KeyError
    bad = (("buffer", "abc"), ("buffer", 5), ("buffer", [1, 2, 3, 4, 5]), ("exhausted", "no"), ("exhausted", None))
    for key, value in bad:
        with pytest.raises(ValueError, match=f"buffer state\\[{key!r}\\] must be"):
            shuffle_buffer(range(20), 4, seed=1).load_state_dict({**state, key: value})
    without = {k: v for k, v in state.items() if k != "exhausted"}
    with pytest.raises(ValueError, match="buffer state\\['exhausted'\\] must be"):
        shuffle_buffer(range(20), 4, seed=1).load_state_dict(without)


@pytest.mark.parametrize("count", [2.5, -1, "3", True])
def test_take_with_a_count_that_is_not_an_integer_ge_0_is_a_value_error_and_does_not_move(count: object) -> None:
    sampler = sample_with_replacement(10, seed=3)
    with pytest.raises(ValueError, match="take count must be an integer >= 0"):
        sampler.take(count)  # type: ignore[arg-type]
    assert sampler.position == 0
    assert sampler.take(np.int64(2)).tolist() == sample_with_replacement(10, seed=3).take(2).tolist()


@pytest.mark.parametrize("dataset", [True, 2.5, "10", None])
def test_sample_with_replacement_of_what_has_no_size_is_a_value_error(dataset: object) -> None:
    """A bool was taken as N = 1 (int(True)), and a float or string was a bare TypeError from len()."""
    with pytest.raises(ValueError, match="sampling with replacement needs"):
        sample_with_replacement(dataset)


def test_a_buffer_state_whose_counts_do_not_add_up_is_refused() -> None:
    """Every item taken from the source was emitted or is in the buffer; a state where that does not hold
    (hand-edited, or its buffer cut) was taken as it was, and the stream resumed at a wrong place (items
    skipped or given twice) without a word. Now it is a ValueError naming the counts."""
    buf = shuffle_buffer(range(20), 4, seed=1)
    [next(buf) for _ in range(5)]
    state = buf.state_dict()
    assert state["consumed"] == state["emitted"] + len(state["buffer"])
    for change in ({"emitted": 9}, {"consumed": 3}, {"buffer": state["buffer"][:1]}):
        with pytest.raises(ValueError, match="consumed .* emitted"):
            shuffle_buffer(range(20), 4, seed=1).load_state_dict({**state, **change})
    again = shuffle_buffer(range(20), 4, seed=1)
    again.load_state_dict(state)
    assert list(again) == list(buf)
