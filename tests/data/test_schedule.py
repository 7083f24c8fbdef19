"""Mixture schedules: proportions over any 10**6 consecutive samples, counts and assignment agree,
a schedule changed on resume continues every source with no repeat, packing over a mixture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.data import LengthsDataset, MixtureSchedule, MixtureStream, PackedDataset, StoreDataset
from seqstore.data._lengths import FuncLengths

STAGES = [(0, {"web": 0.8, "code": 0.2}), (800_000, {"web": 0.4, "curated": 0.6}),
          (3_000_000, {"web": 1, "code": 1, "curated": 1})]
NAMES = ["web", "code", "curated"]


def _expected(sched: MixtureSchedule, a: int, b: int) -> np.ndarray:
    """Samples per source in [a, b) the schedule asks for (weights x samples, stage by stage)."""
    out = np.zeros(len(NAMES))
    bounds = list(sched.starts) + [1 << 62]
    for i in range(len(sched.starts)):
        lo, hi = max(a, bounds[i]), min(b, bounds[i + 1])
        if hi > lo:
            w = sched.weights(int(bounds[i]))
            out += (hi - lo) * np.array([w[n] for n in NAMES])
    return out


def test_proportions_within_0_1_percent_over_any_million_samples() -> None:
    sched = MixtureSchedule(STAGES, NAMES)
    rng = np.random.default_rng(0)
    starts = np.concatenate([rng.integers(0, 5_000_000, 200), [0, 799_999, 800_000, 2_500_000]])
    n = 1_000_000
    got = sched.counts(starts + n) - sched.counts(starts)
    for a, g in zip(starts.tolist(), got):
        exp = _expected(sched, a, a + n)
        assert g.sum() == n
        assert np.abs(g - exp).max() <= 0.001 * n  # within 0.1% of the window
        assert np.abs(g - exp).max() <= 8  # in fact a few samples


def test_assign_agrees_with_counts() -> None:
    sched = MixtureSchedule(STAGES, NAMES)
    g = np.arange(790_000, 810_000)
    src, idx = sched.assign(g)
    before = sched.counts(790_000)
    for k in range(3):
        mine = idx[src == k]
        np.testing.assert_array_equal(mine, np.arange(before[k], before[k] + len(mine)))
    np.testing.assert_array_equal(sched.counts(810_000) - before, np.bincount(src, minlength=3))
    assert (src[g >= 800_000] != 1).all()  # "code" has weight 0 in stage 2


def test_sample_numbers_that_are_not_integers_are_refused() -> None:
    sched = MixtureSchedule(STAGES, NAMES)
    for bad in (2.7, np.array([1.7, 3.0]), np.array([True, False])):
        with pytest.raises(TypeError, match="sample numbers must be integers"):
            sched.counts(bad)
        with pytest.raises(TypeError, match="sample numbers must be integers"):
            sched.assign(bad)
    assert sched.counts(np.array([], dtype=np.float64)).shape == (0, 3)
    np.testing.assert_array_equal(sched.assign(np.array([5], dtype=np.uint32))[0], sched.assign([5])[0])


def test_bad_schedules() -> None:
    with pytest.raises(ValueError, match="start at sample 0"):
        MixtureSchedule([(5, {"web": 1})], NAMES)
    with pytest.raises(ValueError, match="unknown source"):
        MixtureSchedule([(0, {"wbe": 1})], NAMES)
    with pytest.raises(ValueError, match="increase"):
        MixtureSchedule([(0, {"web": 1}), (0, {"code": 1})], NAMES)
    with pytest.raises(ValueError, match="not all be zero"):
        MixtureSchedule([(0, {"web": 0})], NAMES)
    with pytest.raises(ValueError, match="units must be in"):  # a saved state holds units of 2**-24
        MixtureSchedule.from_json([[0, {"web": 1 << 40}]], NAMES)


def _sources(sizes: dict[str, int]) -> dict[str, LengthsDataset]:
    return {n: LengthsDataset(np.full(s, 3 + i), ordering="random", seed=i) for i, (n, s) in enumerate(sizes.items())}


def test_schedule_change_on_resume_continues_every_source() -> None:
    sizes = {"web": 5000, "code": 800, "curated": 1200}
    mix = MixtureStream(_sources(sizes), [(0, {"web": 0.8, "code": 0.2})], chunk=1000)
    packed = PackedDataset(mix, tokens="data", seq_len=32, mode="best_fit", window=8)
    shares = packed.shares(None, 3)
    streams = [packed.open(st, s, 3) for s, st in enumerate(shares)]
    for k, s in enumerate(streams):
        s.skip(40 + 17 * k)
    state = json.loads(json.dumps(packed.state_dict([s.state() for s in streams])))  # JSON-safe
    # resume on 2 shares with another schedule
    mix2 = MixtureStream(_sources(sizes), [(0, {"web": 0.5, "curated": 0.5})], chunk=1000)
    packed2 = PackedDataset(mix2, tokens="data", seq_len=32, mode="best_fit", window=8)
    shares2 = packed2.shares(state, 2)
    frontier = (max(st["next_epoch"] for st in state["shares"]) - 1) * 1000
    assert len(mix2.segments) == 2 and mix2.segments[1][0] == frontier
    # every sample the old run dealt (below the frontier) keeps its document; from the frontier on every
    # source continues after its last old position, in the new proportions
    g_old = np.arange(frontier)
    np.testing.assert_array_equal(mix2.docs_at(g_old)[0], mix.docs_at(g_old)[0])
    pos_old = mix.positions(frontier)
    src, pos = mix2.assign(np.arange(frontier, frontier + 4000))
    for k in range(3):
        mine = pos[src == k]
        np.testing.assert_array_equal(mine, np.arange(pos_old[k], pos_old[k] + len(mine)))
    assert (src != 1).all()
    assert abs((src == 0).mean() - 0.5) < 0.01
    # the packed run goes on: per source, no document twice within its epoch
    streams2 = [packed2.open(st, s, 2) for s, st in enumerate(shares2)]
    for s in streams2:
        s.skip(300)
    tot = packed2.totals([s.state() for s in streams2])
    assert set(tot["source_tokens"]) == set(NAMES)
    assert tot["source_tokens"]["curated"] > 0 and sum(tot["source_tokens"].values()) == tot["tokens"]
    assert tot["padding"] + tot["tokens"] == tot["sequences"] * 32
    assert state["stats"]["source_tokens"]["curated"] == 0


def test_resume_with_the_same_schedule_is_exact_for_any_weights() -> None:
    """A schedule read back from a state keeps its units exactly (here weights whose units, quantised
    again, would move by one), so the same schedule resumes as it was, not as a change."""
    weights = {"web": 0.7579544029403025, "code": 0.420571580830845, "curated": 0.25891675029296335}
    sched = MixtureSchedule(weights, NAMES)
    assert MixtureSchedule.from_json(json.loads(json.dumps(sched.to_json())), NAMES) == sched
    sizes = {"web": 5000, "code": 800, "curated": 1200}
    packed = PackedDataset(MixtureStream(_sources(sizes), weights, chunk=1000), tokens="data", seq_len=32,
                           mode="best_fit", window=8)
    streams = [packed.open(st, s, 2) for s, st in enumerate(packed.shares(None, 2))]
    for k, s in enumerate(streams):
        s.skip(3000 + 17 * k)
    state = json.loads(json.dumps(packed.state_dict([s.state() for s in streams])))
    want = [s.planner.plan(400) for s in streams]
    mix2 = MixtureStream(_sources(sizes), weights, chunk=1000)
    packed2 = PackedDataset(mix2, tokens="data", seq_len=32, mode="best_fit", window=8)
    got = [packed2.open(st, s, 2).planner.plan(400) for s, st in enumerate(packed2.shares(state, 2))]
    assert len(mix2.segments) == 1  # not taken for a change of schedule
    for a, b in zip(want, got):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_positions_per_source_never_repeat_within_an_epoch() -> None:
    sizes = {"web": 3000, "code": 700, "curated": 900}
    mix = MixtureStream(_sources(sizes), STAGES, chunk=4096)
    ids, _ = mix.docs_at(np.arange(0, 20_000))
    src = mix.source_of(ids)
    for k, (name, n) in enumerate(sizes.items()):
        mine = ids[src == k]
        for e in range(0, len(mine), n):  # each epoch of the source: every document once
            block = mine[e : e + n]
            assert len(np.unique(block)) == len(block), name


def test_packing_over_a_mixture_reads_tokens(tmp_path: Path) -> None:
    datasets = {}
    for i, name in enumerate(["a", "b"]):
        lens = np.full(300, 5)
        path = tmp_path / f"{name}.seqstore"
        with seqstore.create(path, {"tokens": Field("int32", (None,))}) as w:
            w.append_batch({"tokens": (np.full(1500, i + 1, dtype=np.int32), lens)})
        datasets[name] = StoreDataset(path, length_field="tokens", ordering="random", seed=i)
    mix = MixtureStream(datasets, {"a": 0.25, "b": 0.75}, chunk=128)
    packed = PackedDataset(mix, seq_len=40)
    b = packed.open(packed.shares(None, 1)[0]).batch(30)
    share_b = (b["tokens"] == 2).mean()
    assert abs(share_b - 0.75) < 0.02


def test_callable_schedule_sampled_into_stages() -> None:
    def anneal(g: int) -> dict[str, float]:  # web fades out linearly over 1e6 samples
        f = min(g / 1_000_000, 1.0)
        return {"web": 1 - f, "curated": f}

    sched = MixtureSchedule.sampled(anneal, NAMES, every=100_000, until=2_000_000)
    assert len(sched.starts) == 11  # 0, 1e5, ..., 1e6 (then constant)
    assert sched.weights(550_000)["curated"] == pytest.approx(0.5, abs=1e-6)
    got = sched.counts(1_000_000) - sched.counts(0)
    assert abs(got[0] - 550_000) <= 30 and got[1] == 0  # sum of 1 - g/1e6 over the 10 stages
    mix = MixtureStream(_sources({"web": 500, "code": 50, "curated": 500}), sched, chunk=1000)
    assert mix.schedule is sched
    with pytest.raises(ValueError, match="not a mapping"):
        MixtureSchedule.sampled(lambda g: 0.5, NAMES, every=10, until=20)  # type: ignore[arg-type, return-value]


TOKEN_STAGES = [(0, {"web": 0.8, "code": 0.2}), (100_000, {"web": 0.4, "curated": 0.6}), (250_000, {"code": 1})]


def _ragged_sources() -> dict[str, LengthsDataset]:
    sizes = {"web": 5000, "code": 800, "curated": 1200}
    return {n: LengthsDataset(np.random.default_rng(i).integers(1, 50 * (i + 1), s), ordering="random", seed=i)
            for i, (n, s) in enumerate(sizes.items())}


def test_stages_in_tokens_start_where_the_documents_reach_the_token_count() -> None:
    mix = MixtureStream(_ragged_sources(), TOKEN_STAGES, unit="tokens", chunk=1000)
    ids, lens = mix.docs_at(np.arange(20_000))
    cum = np.concatenate([[0], np.cumsum(lens)])  # cum[g]: tokens of samples [0, g)
    starts = [int(np.searchsorted(cum, t, side="left")) for t, _ in TOKEN_STAGES]  # first g with cum[g] >= t
    assert starts[0] == 0 and 0 < starts[1] < starts[2] < 20_000
    assert mix.segments[-1][1].starts.tolist() == starts
    src = mix.source_of(ids)
    bounds = starts + [20_000]
    for i, (t0, w) in enumerate(TOKEN_STAGES):
        a, b = bounds[i], bounds[i + 1]
        s = src[a:b]
        for k, name in enumerate(NAMES):  # the stage's samples in its proportions
            assert abs((s == k).sum() - w.get(name, 0) * (b - a)) <= 3, (i, name)
        if i + 1 < len(TOKEN_STAGES):  # and its tokens: up to the next stage's token start, within a document
            want = TOKEN_STAGES[i + 1][0] - t0
            assert abs(int(cum[b] - cum[a]) - want) < int(lens.max())
            assert cum[b - 1] < TOKEN_STAGES[i + 1][0] <= cum[b]
    assert mix.tokens_before(starts[2]) == int(cum[starts[2]])
    assert mix.tokens_before(12_345) == int(cum[12_345])
    with pytest.raises(ValueError, match="through a MixtureStream"):
        MixtureSchedule(TOKEN_STAGES, NAMES, unit="tokens").counts(5)
    # the same schedule from a callable of the token count
    def at(t: int) -> dict[str, float]:
        return dict([w for s, w in TOKEN_STAGES if s <= t][-1])

    sampled = MixtureSchedule.sampled(at, NAMES, every=50_000, until=300_000, unit="tokens")
    mix2 = MixtureStream(_ragged_sources(), sampled, chunk=1000)
    np.testing.assert_array_equal(mix2.docs_at(np.arange(20_000))[0], ids)


def _packed(mix: MixtureStream) -> PackedDataset:
    return PackedDataset(mix, tokens="data", seq_len=64, mode="best_fit", window=8)


def test_stages_in_tokens_resume_exactly_and_change_on_resume() -> None:
    packed = _packed(MixtureStream(_ragged_sources(), TOKEN_STAGES, unit="tokens", chunk=1000))
    shares = packed.shares(None, 2)
    streams = [packed.open(st, s, 2) for s, st in enumerate(shares)]
    for k, s in enumerate(streams):
        s.skip(1500 + 37 * k)  # past the first stage boundary (100_000 tokens)
    state = json.loads(json.dumps(packed.state_dict([s.state() for s in streams])))
    # the second stage's start is known (later ones may be too: planners pull documents ahead)
    assert len(state["schedule"][-1][3]["stage_samples"]) >= 2
    want = [s.planner.plan(600) for s in streams]  # into the third stage (250_000 tokens)
    # resume with the same schedule in a fresh object: the next sequences are the same
    packed2 = _packed(MixtureStream(_ragged_sources(), TOKEN_STAGES, unit="tokens", chunk=1000))
    got = [packed2.open(st, s, 2).planner.plan(600) for s, st in enumerate(packed2.shares(state, 2))]
    for a, b in zip(want, got):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    # resume with another schedule in tokens: the old samples keep their documents, every source goes on
    old = MixtureStream(_ragged_sources(), TOKEN_STAGES, unit="tokens", chunk=1000)
    new_stages = [(0, {"web": 1}), (400_000, {"curated": 0.5, "code": 0.5})]
    mix3 = MixtureStream(_ragged_sources(), new_stages, unit="tokens", chunk=1000)
    _packed(mix3).shares(state, 3)
    frontier = (max(st["next_epoch"] for st in state["shares"]) - 1) * 1000
    assert len(mix3.segments) == 2 and mix3.segments[1][0] == frontier
    np.testing.assert_array_equal(mix3.docs_at(np.arange(frontier))[0], old.docs_at(np.arange(frontier))[0])
    pos_old = old.positions(frontier)
    ids, lens = mix3.docs_at(np.arange(frontier, frontier + 30_000))
    src, pos = mix3.assign(np.arange(frontier, frontier + 30_000))
    for k in range(3):  # each source continues after its last old position: no repeat within its epoch
        mine = pos[src == k]
        np.testing.assert_array_equal(mine, np.arange(pos_old[k], pos_old[k] + len(mine)))
    # the new stage starts where the run's documents (old and new) reach 400_000 tokens
    t_front = mix3.tokens_before(frontier)
    assert t_front == int(old.docs_at(np.arange(frontier))[1].sum()) < 400_000
    cut = frontier + int(np.searchsorted(t_front + np.cumsum(lens), 400_000, side="left")) + 1
    assert (src[: cut - frontier] == 0).all() and (src[cut - frontier :] != 0).all()
    # and from a schedule in samples to one in tokens (the tokens before the change are walked once)
    mix4 = MixtureStream(_ragged_sources(), new_stages, unit="tokens", chunk=1000)
    s_state = dict(state, schedule=[[0, MixtureSchedule([(0, {"web": 1})], NAMES).to_json(), [0, 0, 0]]])
    mix4.load_state(s_state["schedule"], 3000)
    assert mix4.tokens_before(3000) == int(mix4.docs_at(np.arange(3000))[1].sum())


def test_packed_mixture_state_is_refused_by_sources_in_another_order(tmp_path: Path) -> None:
    """A packed mixture's state records its sources' epoch orders: resuming with a source in another
    order (here another seed) is refused, as for a single dataset (it resumed silently, repeating and
    skipping documents); the same sources resume, and a state saved without the orders still loads."""
    for name, base in (("a", 1000), ("b", 5000)):
        with seqstore.create(tmp_path / f"{name}.seqstore", {"tokens": Field("int32", (None,))}) as w:
            w.append_batch({"tokens": (np.arange(base, base + 400, dtype=np.int32), np.full(100, 4))})

    def packed(seed: int) -> PackedDataset:
        src = {n: StoreDataset(tmp_path / f"{n}.seqstore", ordering="random", seed=seed) for n in ("a", "b")}
        return PackedDataset(MixtureStream(src, {"a": 0.5, "b": 0.5}, chunk=64), seq_len=8)

    p = packed(1)
    s = p.open(p.shares(None, 1)[0])
    s.batch(2)
    state = p.state_dict([s.state()])
    with pytest.raises(ValueError, match="the state is of another source"):
        packed(2).shares(state, 1)
    want = p.open(p.shares(state, 1)[0]).batch(1)["tokens"]
    again = packed(1)
    np.testing.assert_array_equal(again.open(again.shares(state, 1)[0]).batch(1)["tokens"], want)
    del state["source"]["orders"]
    np.testing.assert_array_equal(again.open(again.shares(state, 1)[0]).batch(1)["tokens"], want)


def test_an_empty_source_is_accepted_while_its_weight_is_zero(tmp_path: Path) -> None:
    """A source with no documents (a store to be filled later) may be in a mixture that gives it no
    weight; a schedule that weights it is refused when made, naming the source."""
    for name, n in (("web", 100), ("later", 0)):
        with seqstore.create(tmp_path / f"{name}.seqstore", {"tokens": Field("int32", (None,))}) as w:
            if n:
                w.append_batch({"tokens": (np.full(4 * n, 7, dtype=np.int32), np.full(n, 4))})
    src = {n: StoreDataset(tmp_path / f"{n}.seqstore", ordering="random", seed=1) for n in ("web", "later")}
    packed = PackedDataset(MixtureStream(src, {"web": 1.0}, chunk=64), seq_len=8)
    s = packed.open(packed.shares(None, 1)[0])
    assert (s.batch(3)["tokens"] == 7).all()
    state = packed.state_dict([s.state()])
    assert state["stats"]["source_documents"] == {"web": 6, "later": 0}
    with pytest.raises(ValueError, match=r"\['later'\] have no documents but a weight > 0"):
        MixtureStream(src, [(0, {"web": 1.0}), (1000, {"web": 1, "later": 1})])


def test_a_source_with_a_partition_epoch_is_refused_naming_the_mixture() -> None:
    """A source's sub-epochs hold part of its documents; the error named a CombinedDataset the user never
    made and said to set partition_epoch on it."""
    src = {"web": LengthsDataset(np.full(10, 3), partition_epoch=2), "code": LengthsDataset(np.full(10, 3))}
    with pytest.raises(ValueError, match=r"MixtureStream: source\(s\) with partition_epoch \{'web': 2\}"):
        MixtureStream(src, {"web": 1, "code": 1})


def test_a_fresh_start_after_a_resume_with_another_schedule_follows_its_own_schedule() -> None:
    """``shares(state)`` with a changed schedule put the old run's segments into the stream; a fresh start
    afterwards (``shares(None)``, as a new run or a loader without a loaded state asks) still dealt the
    old run's samples below the frontier by the old schedule, and its state carried the old segments.
    Now a fresh start is the stream's own schedule from sample 0, as on a new stream."""
    sizes = {"web": 5000, "code": 800, "curated": 1200}
    old = PackedDataset(MixtureStream(_sources(sizes), [(0, {"web": 0.8, "code": 0.2})], chunk=1000),
                        tokens="data", seq_len=32, mode="concat")
    stream = old.open(old.shares(None, 1)[0])
    stream.skip(200)
    state = json.loads(json.dumps(old.state_dict([stream.state()])))

    def fresh(packed: PackedDataset) -> tuple[np.ndarray, Any]:
        s = packed.open(packed.shares(None, 1)[0])
        return s.plan(400), packed.state_dict([s.state()])

    new_stages = [(0, {"web": 0.5, "curated": 0.5})]
    packed = PackedDataset(MixtureStream(_sources(sizes), new_stages, chunk=1000), tokens="data", seq_len=32)
    packed.shares(state, 1)  # a resume with the change
    want = fresh(PackedDataset(MixtureStream(_sources(sizes), new_stages, chunk=1000), tokens="data", seq_len=32))
    got = fresh(packed)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1]


def test_unit_tokens_with_a_schedule_in_samples_is_refused() -> None:
    """``MixtureStream(d, MixtureSchedule(stages, names), unit="tokens")`` silently ran the schedule in
    samples (the unit was ignored when a schedule was given); now the contradiction is a ValueError."""
    src = _sources({"web": 100, "code": 50})
    stages = [(0, {"web": 1.0}), (10_000, {"code": 1.0})]
    with pytest.raises(ValueError, match=r"MixtureStream: unit='tokens', but the schedule given counts samples"):
        MixtureStream(src, MixtureSchedule(stages, ["web", "code"]), unit="tokens")
    tok = MixtureSchedule(stages, ["web", "code"], unit="tokens")
    assert MixtureStream(src, tok).schedule.unit == "tokens"  # (the default unit takes the schedule's)
    assert MixtureStream(src, tok, unit="tokens").schedule.unit == "tokens"


def test_a_chunk_smaller_than_the_shares_names_chunk() -> None:
    """A mixture's "epochs" are its chunks: with ``chunk`` under the number of shares, a share whose block
    of every chunk is empty has nothing to pack. Its error names ``chunk`` and the share count at once
    (it walked 1000 chunks, then spoke of epochs and an empty dataset)."""
    mix = MixtureStream(_sources({"web": 50, "code": 20}), {"web": 0.5, "code": 0.5}, chunk=3)
    packed = PackedDataset(mix, tokens="data", seq_len=8, mode="concat")
    shares = packed.shares(None, 4)
    assert packed.open(shares[2], 2, 4).skip(2) is None  # a share with one document per chunk packs
    with pytest.raises(ValueError, match=r"share 3 of 4: .*MixtureStream chunk=3.*at least the 4 shares"):
        packed.open(shares[3], 3, 4).skip(1)


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_a_schedule_changed_on_resume_applies_after_the_chunk_in_progress(mode: str) -> None:
    """Every plan read at least 1024 documents ahead, taking as many chunks as that needed (here 40 chunks
    of 50 samples at the first sequence), and the first chunk no share had taken, where a schedule changed
    on resume applies, went with them: the change came about 2000 samples after those handed out. Now
    reading ahead stays in the chunks a share has taken: the change applies from the chunk after the one
    in progress."""
    sizes = {"web": 5000, "code": 800, "curated": 1200}
    mix = MixtureStream(_sources(sizes), [(0, {"web": 0.8, "code": 0.2})], chunk=50)
    packed = PackedDataset(mix, tokens="data", seq_len=32, mode=mode, window=8)
    streams = [packed.open(st, s, 2) for s, st in enumerate(packed.shares(None, 2))]
    for s in streams:
        s.skip(1)  # ~10 documents of the 25 of its block of chunk 1 (a window of 8 more in best_fit)
    state = json.loads(json.dumps(packed.state_dict([s.state() for s in streams])))
    assert [st["next_epoch"] for st in state["shares"]] == [2, 2]
    mix2 = MixtureStream(_sources(sizes), [(0, {"web": 0.5, "curated": 0.5})], chunk=50)
    packed2 = PackedDataset(mix2, tokens="data", seq_len=32, mode=mode, window=8)
    streams2 = [packed2.open(st, s, 2) for s, st in enumerate(packed2.shares(state, 2))]
    assert [g0 for g0, _, _ in mix2.segments] == [0, 50]
    for s in streams2:
        s.skip(20)
    assert packed2.totals([s.state() for s in streams2])["source_documents"]["curated"] > 0


def test_stream_sample_numbers_that_are_not_integers_are_refused() -> None:
    """``MixtureStream.assign`` / ``docs_at`` cast the sample numbers to int64, so 1.5 read sample 1 (and
    1e12, a float, a sample out of range) without a word, where ``MixtureSchedule.assign`` refuses them; now
    they are refused alike, naming the dtype."""
    mix = MixtureStream(_sources({"web": 100, "code": 50}), {"web": 0.5, "code": 0.5})
    for bad in (np.array([1.5]), [0.0, 2.0], np.array([True])):
        with pytest.raises(TypeError, match="must be integers"):
            mix.docs_at(bad)
        with pytest.raises(TypeError, match="must be integers"):
            mix.assign(bad)
    for bad in (1.5, True, -1):
        with pytest.raises(ValueError, match="must be an integer >= 0"):
            mix.positions(bad)  # type: ignore[arg-type]
    np.testing.assert_array_equal(mix.positions(np.int64(10)), mix.positions(10))
    np.testing.assert_array_equal(mix.docs_at([0, 1])[0], mix.docs_at(np.array([0, 1], dtype=np.uint8))[0])
    assert len(mix.docs_at([])[0]) == 0


@pytest.mark.parametrize("stages", [None, 3, 0.5, "web", object()])
def test_stages_that_are_not_a_list_or_weights_are_a_value_error_naming_them(stages: Any) -> None:
    """``MixtureSchedule`` / ``MixtureStream`` with stages that are neither ``{source: weight}`` nor a
    list of ``(start, {source: weight})`` raised a bare TypeError ("'NoneType' object is not iterable");
    now a ValueError saying what is expected."""
    with pytest.raises(ValueError, match=r"stages must be"):
        MixtureSchedule(stages, NAMES)
    with pytest.raises(ValueError, match=r"stages must be"):
        MixtureStream(_sources({"web": 10, "code": 10, "curated": 10}), stages)


@pytest.mark.parametrize("segments, what", [
    ([[0, {"web": 1}, [-5, 0, 0]]], r"segment 0 starts at sample 0 with positions \[-5, 0, 0\]"),
    ([[3, {"web": 1}, [0, 0, 0]]], r"segment 0 starts at sample 3"),
    ([[0, {"code": 1}, [0, 0, 0]], [0, {"web": 1}, [0, 0, 0]]], r"segment 1 starts at sample 0, not after"),
    ([[0, {"code": 1}, [0, 0, 0]], [9, {"web": 1}, [-1, 0, 0]]], r"segment 1 has positions \[-1, 0, 0\]"),
])
def test_a_hand_made_schedule_state_with_impossible_positions_is_refused(segments: Any, what: str) -> None:
    """A schedule state whose segments no stream writes (a negative position, a first segment not at sample
    0, starts out of order) was taken, and the stream then dealt from negative positions (documents of
    epoch 0 or a wrong segment); ``load_state`` now refuses it naming the segment."""
    mix = MixtureStream(_ragged_sources(), [(0, {"web": 1})], chunk=100)
    state = [[g0, MixtureSchedule([(0, w)], NAMES).to_json(), base] for g0, w, base in segments]
    with pytest.raises(ValueError, match="MixtureStream: malformed schedule state: " + what):
        mix.load_state(state, 0)


@pytest.mark.timeout(45)  # it took minutes: each epoch of a source scanned every sample of the call
def test_a_small_source_walked_thousands_of_epochs_in_one_call() -> None:
    """Samples that walk a small source thousands of epochs in one ``docs_at`` map to each epoch's order
    (the samples grouped by epoch with one sort, not scanned once per epoch)."""
    small = LengthsDataset(np.arange(1, 151), ordering="random", seed=5)
    stream = MixtureStream({"a": small, "b": LengthsDataset(np.array([4, 5]))}, {"a": 1.0})
    ids, lens = stream.docs_at(np.arange(3_000_000 - 1, -1, -1, dtype=np.int64))
    for p in (0, 1, 9999, 19999):
        want = small.epoch_order(p + 1).to_numpy()
        np.testing.assert_array_equal(ids[::-1][p * 150 : (p + 1) * 150], want)
        np.testing.assert_array_equal(lens[::-1][p * 150 : (p + 1) * 150], want + 1)


def test_tokens_before_a_resume_far_into_the_run_reads_each_source_at_most_twice_over() -> None:
    """A resume that changes to a schedule in tokens needs the documents' tokens before the change: they
    are each source's whole epochs (its total tokens) plus a part of one epoch, not a walk over every
    sample of the run (60_000 lengths read for 500 documents before). Exact: the sum over the samples."""
    reads = [0]

    def counted(lens: np.ndarray) -> Any:
        def take(idx: np.ndarray) -> np.ndarray:
            reads[0] += len(idx)
            return lens[idx]
        return FuncLengths(len(lens), take)

    def sources() -> dict[str, LengthsDataset]:
        rng = np.random.default_rng(3)
        return {"web": LengthsDataset(counted(rng.integers(1, 90, 300)), ordering="random", seed=1),
                "code": LengthsDataset(counted(rng.integers(1, 40, 200)), ordering="random", seed=2)}

    old = MixtureSchedule({"web": 0.7, "code": 0.3}, ["web", "code"])
    frontier = 60_037
    want = int(MixtureStream(sources(), old, chunk=1000).docs_at(np.arange(frontier))[1].sum())
    mix = MixtureStream(sources(), [(0, {"web": 1}), (10 ** 12, {"code": 1})], unit="tokens", chunk=1000)
    reads[0] = 0
    mix.load_state([[0, old.to_json(), [0, 0]]], frontier)
    assert mix.segments[-1][0] == frontier and mix._walk is not None and mix._walk.t == want
    assert reads[0] <= 2 * 500
    assert mix.tokens_before(frontier) == want and mix.tokens_before(frontier - 999) == int(
        MixtureStream(sources(), old, chunk=1000).docs_at(np.arange(frontier - 999))[1].sum())


def test_weights_at_a_negative_or_fractional_sample_are_refused() -> None:
    """weights(-5) gave the last stage's weights (a negative index from the end), weights(2.7) those of
    sample 2; both are a ValueError naming the sample number, as counts and assign refuse them."""
    sched = MixtureSchedule(STAGES, NAMES)
    assert sched.weights(0) == {"web": pytest.approx(0.8), "code": pytest.approx(0.2), "curated": 0.0}
    for bad in (-5, 2.7, True):
        with pytest.raises(ValueError, match="MixtureSchedule.weights: the sample number must be an integer >= 0"):
            sched.weights(bad)
    assert sched.weights(np.int64(800_000))["curated"] == pytest.approx(0.6)


def test_fresh_state_after_a_resume_with_another_schedule_is_that_of_a_new_run() -> None:
    """fresh_state() after shares(state) with a changed schedule recorded the loaded run's segments (the old
    schedule below the frontier), unlike shares(None); it is now the state of a new run of this stream."""
    sizes = {"web": 5000, "code": 800, "curated": 1200}
    old = PackedDataset(MixtureStream(_sources(sizes), [(0, {"web": 0.8, "code": 0.2})], chunk=1000),
                        tokens="data", seq_len=32)
    stream = old.open(old.shares(None, 1)[0])
    stream.skip(200)
    state = json.loads(json.dumps(old.state_dict([stream.state()])))
    new_stages = [(0, {"web": 0.5, "curated": 0.5})]
    packed = PackedDataset(MixtureStream(_sources(sizes), new_stages, chunk=1000), tokens="data", seq_len=32)
    packed.shares(state, 1)
    want = PackedDataset(MixtureStream(_sources(sizes), new_stages, chunk=1000), tokens="data", seq_len=32)
    assert packed.fresh_state(num_shares=2) == want.fresh_state(num_shares=2)
    np.testing.assert_array_equal(packed.open(packed.fresh_state()["shares"][0]).plan(50),
                                  want.open(want.fresh_state()["shares"][0]).plan(50))


def test_many_stages_in_tokens_are_found_without_reading_a_chunk_or_rebuilding_the_schedule_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule in tokens of 300 stages ten samples apart: finding each stage read the lengths again up to
    the samples asked for (or a whole chunk: 3200 samples here, 500k lengths) and rebuilt the schedule found
    so far (O(stages) each: quadratic). The windows now reach about the next stage and a found stage is
    added to the schedule in O(1); the stages start where they did."""
    import seqstore.data._stages as stages_mod

    read = [0]

    def lens(i: np.ndarray) -> np.ndarray:
        read[0] += len(i)
        return i % 7 + 7  # ten tokens a sample, about

    calls = [0]
    chain_counts = stages_mod._chain_counts

    def counted(n: np.ndarray, units: np.ndarray) -> np.ndarray:
        calls[0] += 1
        return chain_counts(n, units)

    monkeypatch.setattr(stages_mod, "_chain_counts", counted)
    sched = MixtureSchedule.sampled(lambda t: {"a": 1 + (t // 100) % 5, "b": 1}, ["a", "b"], every=100,
                                    until=30_000, unit="tokens")
    assert len(sched.starts) == 300
    data = {"a": LengthsDataset(FuncLengths(100_000, lens)), "b": LengthsDataset(FuncLengths(50_000, lens))}
    mix = MixtureStream(data, sched)
    ids, got = mix.docs_at(np.arange(3200))
    assert len(mix.state()[-1][3]["stage_samples"]) == 300  # every stage found
    assert read[0] < 100_000 and calls[0] < 3000, (read[0], calls[0])  # (were 514123 and 45150)
    # the stages start where the documents drawn reach their token counts
    cum = np.cumsum(got)
    found = mix.state()[-1][3]["stage_samples"]
    assert found[1:] == (np.searchsorted(cum, sched.starts[1:], side="left") + 1).tolist()


@pytest.mark.parametrize("damage, what", [
    (lambda w: w["stage_samples"].extend(w["stage_samples"][-1:] * 2), "found stages at samples"),
    (lambda w: w["stage_samples"].__setitem__(0, 1), "found stages at samples"),
    (lambda w: w["stage_samples"].reverse(), "found stages at samples"),
    (lambda w: w["walk"].__setitem__(0, 0), "reached sample 0"),
    (lambda w: w["stage_samples"].__setitem__(1, w["stage_samples"][1] + 1), "not those its walk found"),
])
def test_a_damaged_walk_of_stages_in_tokens_is_refused_at_load(damage: Any, what: str) -> None:
    """The walk of a schedule in tokens in a saved state (the samples where stages were found, how far it
    went) was taken as it was: more found samples than stages failed later with an IndexError, samples out
    of order or at odds with the segment's stages dealt from a schedule no stream had. ``load_state``
    refuses them naming the walk."""
    sources = {"a": LengthsDataset(np.arange(1, 200)), "b": LengthsDataset(np.arange(1, 50))}
    stages = [(0, {"a": 1}), (500, {"a": 1, "b": 1}), (2000, {"b": 1}), (10**9, {"a": 1})]
    mix = MixtureStream(sources, stages, unit="tokens", chunk=64)
    mix.docs_at(np.arange(300))
    state = mix.state()
    assert len(state[-1][3]["stage_samples"]) == 3
    MixtureStream(sources, stages, unit="tokens", chunk=64).load_state(json.loads(json.dumps(state)), 300)
    damage(state[-1][3])
    with pytest.raises(ValueError, match="MixtureStream: malformed schedule state: .*" + what):
        MixtureStream(sources, stages, unit="tokens", chunk=64).load_state(state, 300)


def test_samples_across_thousands_of_stages_are_assigned_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sampled schedule whose weights change every 10 samples: ``assign`` / ``counts`` of a batch took one
    pass per stage it spans (2000 Python steps for these 20000 samples; seconds per pull of documents in a
    long run). One vectorised pass now, the same answers (assign agrees with the counts)."""
    import seqstore.data._stages as stages_mod

    calls = [0]

    def counting(rule: Any) -> Any:
        def counted(n: np.ndarray, units: np.ndarray) -> Any:
            calls[0] += 1
            return rule(n, units)
        return counted

    for name in ("_chain_counts", "_chain_assign"):
        monkeypatch.setattr(stages_mod, name, counting(getattr(stages_mod, name)))
    sched = MixtureSchedule.sampled(lambda g: {"a": 1 + (g // 10) % 13, "b": 1 + (g // 10) % 7, "c": (g // 10) % 2},
                                    ["a", "b", "c"], every=10, until=20_000)
    assert len(sched.starts) == 2000
    calls[0] = 0
    g = np.arange(20_000)
    src, idx = sched.assign(g)
    before, after = sched.counts(g), sched.counts(g + 1)
    assert calls[0] <= 3, calls[0]
    step = after - before
    assert (step.sum(axis=1) == 1).all()
    np.testing.assert_array_equal(src, step.argmax(axis=1))
    np.testing.assert_array_equal(idx, before[np.arange(len(g)), src])
    mix = MixtureStream({n: LengthsDataset(np.arange(1, 300)) for n in "abc"}, sched)
    calls[0] = 0
    ids, _ = mix.docs_at(g)
    assert calls[0] <= 6, calls[0]
    np.testing.assert_array_equal(mix.source_of(ids), src)


def test_the_repr_of_a_schedule_of_thousands_of_stages_is_short() -> None:
    """``repr`` listed every stage with its weights: a sampled schedule of 5000 stages made every message that
    names the mixture (``MixtureStream``, ``PackedDataset``) about half a megabyte. It lists the first and
    the last and says how many."""
    sched = MixtureSchedule.sampled(lambda g: {"a": 1 + g % 2, "b": 1}, ["a", "b"], every=1, until=5000)
    text = repr(MixtureStream({"a": LengthsDataset(np.arange(1, 9)), "b": LengthsDataset(np.arange(1, 9))}, sched))
    assert len(text) < 1000 and "5000 stages" in text and "(4999, {'a'" in text, text[:2000]
    assert repr(MixtureSchedule([(0, {"a": 1}), (5, {"b": 1})], ["a", "b"])) == (
        "MixtureSchedule([(0, {'a': 1.0, 'b': 0.0}), (5, {'a': 0.0, 'b': 1.0})])")


def test_open_of_a_share_saved_after_a_schedule_change_needs_the_saved_segments() -> None:
    """``open(share_state)`` alone on a stream that never loaded the run's state followed the stream's own
    schedule from sample 0: a run resumed after a schedule change drew other documents than the run it
    resumes. Now a share state names the segments it was packed with: ``open`` refuses another stream's
    segments and says to go through ``shares(state, S)``, which loads them (and then opens it)."""
    sizes = {"web": 500, "code": 80, "curated": 120}

    def packed_of(stages: Any) -> PackedDataset:
        return PackedDataset(MixtureStream(_sources(sizes), stages, chunk=100), tokens="data", seq_len=16)

    a = packed_of({"web": 0.8, "code": 0.2})
    s = a.open(a.shares(None, 1)[0])
    s.skip(30)
    state0 = json.loads(json.dumps(a.state_dict([s.state()])))
    b = packed_of({"web": 0.5, "curated": 0.5})  # the run resumed with a new schedule
    s = b.open(b.shares(state0, 1)[0])
    s.skip(30)
    state = json.loads(json.dumps(b.state_dict([s.state()])))
    want = s.plan(20)
    c = packed_of({"web": 0.5, "curated": 0.5})  # a new process resuming that run
    with pytest.raises(ValueError, match=r"PackedDataset.open: .*shares\(state, S\)"):
        c.open(state["shares"][0])
    np.testing.assert_array_equal(c.open(c.shares(state, 1)[0]).plan(20), want)
    np.testing.assert_array_equal(c.open(state["shares"][0]).plan(20), want)  # (the stream holds them now)
    # a run that never changed its schedule opens its shares directly, as before
    d = packed_of({"web": 0.8, "code": 0.2})
    np.testing.assert_array_equal(d.open(state0["shares"][0]).plan(5), a.open(state0["shares"][0]).plan(5))


def test_bad_mixture_sources_are_named_as_the_mixtures() -> None:
    """A list of sources, no source, or a source that is not a dataset were refused in the words of a
    CombinedDataset the user never made; now the MixtureStream says what it expects and names the source."""
    ds = LengthsDataset(np.full(4, 3))
    with pytest.raises(ValueError, match=r"MixtureStream: datasets must be a non-empty mapping name -> dataset, "
                                         r"got a list"):
        MixtureStream([ds], {"a": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"MixtureStream: datasets must be a non-empty mapping .*got an empty"):
        MixtureStream({}, {"a": 1})
    with pytest.raises(TypeError, match=r"MixtureStream: source 'b' is a ndarray, not a seqstore.data Dataset"):
        MixtureStream({"a": ds, "b": np.arange(3)}, {"a": 1})  # type: ignore[dict-item]


def test_a_schedule_state_refused_leaves_the_stream_as_it_was() -> None:
    """A state refused by ``load_state`` (a change of schedule before its last segment) had already put its
    segments into the stream: a fresh share opened afterwards drew the refused run's samples."""
    sizes = {"web": 500, "code": 80, "curated": 120}
    mix = MixtureStream(_sources(sizes), {"web": 0.5, "curated": 0.5}, chunk=100)
    want = mix.docs_at(np.arange(600))[0]
    segments = [[0, [[0, {"code": 1 << 24}]], [0, 0, 0]], [300, [[0, {"web": 1 << 24}]], [0, 300, 0]]]
    with pytest.raises(ValueError, match="schedule change at sample 100 before the last segment"):
        mix.load_state(segments, 100)
    assert not mix._loaded and len(mix.segments) == 1
    np.testing.assert_array_equal(mix.docs_at(np.arange(600))[0], want)


def test_an_order_that_drops_documents_is_refused_on_every_read() -> None:
    """The stream cached a source's epoch order before checking its length: the first read raised, a second
    read (the packer reads again after a failure) took the short order and walked documents that are not
    in it."""
    src = {"web": LengthsDataset(np.full(10, 3), ordering="default_every_n:3"),
           "code": LengthsDataset(np.full(10, 3))}
    stream = MixtureStream(src, {"web": 1, "code": 1})
    for _ in range(2):
        with pytest.raises(ValueError, match="source 'web': its epoch order drops documents"):
            stream.docs(1, 0, 20)
