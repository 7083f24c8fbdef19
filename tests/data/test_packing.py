"""PackedDataset: concat equals a NumPy concatenation, best_fit places every token once, exact and
elastic resume from random cut points, padding on lognormal lengths."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.data import LengthsDataset, MixtureStream, PackedDataset, StoreDataset
from seqstore.data._packplan import Planner, fresh_shares, resplit

EOS = 1 << 30


def _store(path: Path, lens: np.ndarray) -> Path:
    """Token ``t`` of document ``i`` is ``start[i] + t``: every token of the store is distinct."""
    total = int(lens.sum())
    with seqstore.create(path, {"tokens": Field("int32", (None,))}, max_shard_records=40_000) as w:
        w.append_batch({"tokens": (np.arange(total, dtype=np.int32), lens)})
    return path


class LenStream:
    """Documents of given lengths in a seeded permutation per epoch; ids encode (epoch, document)."""

    names = ["data"]

    def __init__(self, lens: np.ndarray, seed: int = 0) -> None:
        self.lens = np.asarray(lens, dtype=np.int64)
        self.seed = seed

    def epoch_len(self, epoch: int) -> int:
        return len(self.lens)

    def docs(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.lens))[start:stop]
        return perm + (epoch - 1) * len(self.lens), self.lens[perm]

    def source_of(self, ids: np.ndarray) -> np.ndarray:
        return np.zeros(len(ids), dtype=np.int64)


def _planner(stream: Any, state: dict[str, Any], share: int, shares: int, mode: str, L: int, window: int = 16,
             split: bool = True) -> Planner:
    return Planner(stream, mode=mode, seq_len=L, window=window, split=split, eos=False, share=share,
                   num_shares=shares, state=state)


def _inputs(pieces: tuple[np.ndarray, ...], mode: str, L: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(document id, offset) of every input token of the plan's sequences."""
    seq, ids, off, cnt = pieces[:4]
    first = np.cumsum(cnt) - cnt
    k = np.arange(int(cnt.sum())) - np.repeat(first, cnt)
    doc = np.repeat(ids, cnt)
    t = np.repeat(off, cnt) + k
    if mode == "concat":  # the last token of every window is only a label
        s = np.repeat(seq, cnt)
        slot = np.arange(len(s)) - np.searchsorted(s, s)
        keep = slot < L
        doc, t = doc[keep], t[keep]
    return [(doc, t)]


def _past(pl: Planner, epoch: int) -> bool:
    st = pl.state()
    return st["next_epoch"] > epoch and all((r["blocks"][0] if isinstance(r, dict) else r[0]) > epoch
                                            for r in st["ranges"])


def _check_epoch_once(lens: np.ndarray, got: list[tuple[np.ndarray, np.ndarray]], truncated: int = 0) -> None:
    n = len(lens)
    doc = np.concatenate([d for d, _ in got])
    t = np.concatenate([x for _, x in got])
    sel = doc < n  # epoch 1
    key = doc[sel] * (int(lens.max()) + 1) + t[sel]
    assert len(np.unique(key)) == len(key), "a token of epoch 1 was placed twice"
    assert (t[sel] < lens[doc[sel]]).all()
    assert len(key) + truncated == int(lens.sum()), "a token of epoch 1 is missing"
    sel2 = (doc >= n) & (doc < 2 * n)
    key2 = doc[sel2] * (int(lens.max()) + 1) + t[sel2]
    assert len(np.unique(key2)) == len(key2)


def test_concat_equals_numpy_concatenation_at_1e5_documents(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n, L = 100_000, 256
    lens = rng.integers(0, 12, n)
    path = _store(tmp_path / "c.seqstore", lens)
    ds = StoreDataset(path, ordering="random", seed=5, length_field="tokens")
    order = ds.epoch_order(1).to_numpy().astype(np.int64)
    start = np.cumsum(lens) - lens
    # reference: the documents of the epoch order back to back, EOS after each
    ref = np.full(int(lens.sum()) + n, EOS, dtype=np.int64)
    lo = np.cumsum(lens[order] + 1) - (lens[order] + 1)
    k = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens[order]) - lens[order], lens[order])
    ref[np.repeat(lo, lens[order]) + k] = np.repeat(start[order], lens[order]) + k
    packed = PackedDataset(ds, seq_len=L, eos=EOS)
    nwin = (len(ref) - 1) // L
    stream = packed.open(packed.shares(None, 1)[0])
    toks, labels, pos = [], [], []
    done = 0
    while done < nwin:
        b = stream.batch(min(97, nwin - done))
        done += len(b["tokens"])
        toks.append(b["tokens"].reshape(-1))
        labels.append(b["labels"].reshape(-1))
        pos.append(b["position_ids"])
        cu = b["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == b["tokens"].size and (np.diff(cu) > 0).all()
        assert b["loss_mask"].all()
    got = np.concatenate(toks)
    np.testing.assert_array_equal(got, ref[: nwin * L])
    np.testing.assert_array_equal(np.concatenate(labels), ref[1 : nwin * L + 1])
    # positions restart at every window and after every EOS
    flat = got.reshape(nwin, L)
    p = np.concatenate(pos)
    for r in rng.integers(0, nwin, 20):
        expect = np.zeros(L, dtype=np.int64)
        for i in range(1, L):
            expect[i] = 0 if flat[r, i - 1] == EOS else expect[i - 1] + 1
        np.testing.assert_array_equal(p[r], expect)


def test_best_fit_batches_hold_whole_documents(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    lens = rng.integers(1, 90, 3000)
    path = _store(tmp_path / "b.seqstore", lens)
    start = np.cumsum(lens) - lens
    packed = PackedDataset(path, seq_len=64, mode="best_fit", eos=EOS, window=32, ordering="random", seed=2,
                           mask_eos=True)
    b = packed.open(packed.shares(None, 1)[0]).batch(50)
    toks, labels, mask, pos, cu = (b[k] for k in ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens"))
    flat_t, flat_l, flat_m = toks.reshape(-1), labels.reshape(-1), mask.reshape(-1)
    segs = np.diff(cu)
    assert segs.sum() == toks.size
    for a, n in zip(cu[:-1], segs):
        seg = flat_t[a : a + n]
        if (seg == 0).all() and not flat_m[a : a + n].any():
            continue  # padding
        np.testing.assert_array_equal(pos.reshape(-1)[a : a + n], np.arange(n))
        real = seg[seg != EOS]
        if len(real) == 0:  # the EOS of a split document, alone
            assert n == 1 and not flat_m[a]
            continue
        doc = int(np.searchsorted(start, real[0], side="right") - 1)
        # a piece is consecutive tokens of one document, then maybe its EOS
        np.testing.assert_array_equal(real, np.arange(real[0], real[0] + len(real)))
        assert real[-1] < start[doc] + lens[doc]
        lab = flat_l[a : a + n]
        ok = flat_m[a : a + n]
        # the label of a piece's last token is the document's next token (a split document goes on)
        nxt = seg[-1] + 1 if seg[-1] + 1 < start[doc] + lens[doc] else EOS
        np.testing.assert_array_equal(lab[ok], np.append(seg[1:], nxt)[ok])
        assert not ok[seg == EOS].any()


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
@pytest.mark.parametrize("trial", range(4))
def test_exact_and_elastic_resume_from_random_cuts(mode: str, trial: int) -> None:
    rng = np.random.default_rng(100 + trial)
    lens = np.maximum(0, rng.lognormal(3, 1.0, int(rng.integers(300, 1500)))).astype(np.int64)
    lens[rng.integers(0, len(lens), 5)] = 0
    lens[rng.integers(0, len(lens), 3)] = 400  # longer than a sequence: split
    stream = LenStream(lens, seed=trial)
    L = int(rng.choice([32, 64, 128]))
    old = int(rng.integers(1, 5))
    new = int(rng.integers(1, 6))
    planners = [_planner(stream, st, s, old, mode, L) for s, st in enumerate(fresh_shares(old, 1, 1))]
    got: list[tuple[np.ndarray, np.ndarray]] = []
    for s, pl in enumerate(planners):
        k = int(rng.integers(0, 2 * lens.sum() // (L * old) + 2))
        if k:
            before = pl.state()
            plan = pl.plan(k)
            got += _inputs(plan, mode, L)
            # exact resume: a planner from a mid-way state continues with the same pieces
            cut = int(rng.integers(0, k + 1))
            again = _planner(stream, before, s, old, mode, L)
            if cut:
                again.plan(cut)
            again2 = _planner(stream, again.state(), s, old, mode, L)
            rest = again2.plan(k - cut) if k > cut else None
            if rest is not None:
                sel = plan[0] >= cut
                for a, b in zip(rest[:4], (plan[0][sel] - cut, plan[1][sel], plan[2][sel], plan[3][sel])):
                    np.testing.assert_array_equal(a, b)
            if rest is not None:
                assert again2.state()["stats"] == pl.state()["stats"]
    states = resplit(stream, [pl.state() for pl in planners], new, 1)
    planners = [_planner(stream, st, s, new, mode, L) for s, st in enumerate(states)]
    for pl in planners:
        while not _past(pl, 1):
            got += _inputs(pl.plan(1), mode, L)
    _check_epoch_once(lens, got)


def test_best_fit_truncates_and_counts() -> None:
    lens = np.array([10, 300, 5, 70, 64, 1, 200] * 20, dtype=np.int64)
    stream = LenStream(lens)
    pl = _planner(stream, fresh_shares(1, 1, 1)[0], 0, 1, "best_fit", 64, window=8, split=False)
    got = []
    while not _past(pl, 1):
        got += _inputs(pl.plan(1), "best_fit", 64)
    sel = np.concatenate([d for d, _ in got]) < len(lens)
    truncated = int((np.maximum(lens - 64, 0)).sum())
    doc = np.concatenate([d for d, _ in got])[sel]
    assert int(sel.sum()) == int(lens.sum()) - truncated
    assert pl.state()["stats"]["truncated"] >= truncated
    assert len(np.unique(doc)) == len(lens)


def test_best_fit_padding_on_lognormal_lengths() -> None:
    """Default window, seq_len 2048, lognormal lengths with median 350 (sigma 1): padding <= 1.5%,
    no token lost (long documents split). Lengths only (the plan never reads tokens)."""
    rng = np.random.default_rng(7)
    lens = np.clip(rng.lognormal(np.log(350), 1.0, 200_000), 1, 200_000).astype(np.int64)
    from seqstore.data.packing import DEFAULT_WINDOW

    pl = _planner(LenStream(lens), fresh_shares(1, 1, 1)[0], 0, 1, "best_fit", 2048, window=DEFAULT_WINDOW)
    pl.plan(20_000)
    st = pl.state()["stats"]
    assert st["truncated"] == 0
    assert st["tokens"] + st["padding"] == 20_000 * 2048
    assert st["padding"] / (20_000 * 2048) <= 0.015


def test_bad_state_is_refused(tmp_path: Path) -> None:
    path = _store(tmp_path / "s.seqstore", np.full(100, 5))
    a = PackedDataset(path, seq_len=16)
    b = PackedDataset(path, seq_len=32)
    st = a.fresh_state()
    with pytest.raises(ValueError, match="made with"):
        b.shares(st, 1)
    with pytest.raises(ValueError, match="format"):
        a.shares({"format": "x"}, 1)
    with pytest.raises(ValueError, match="mode"):
        PackedDataset(path, mode="greedy")
    # a first epoch below 1 (0-based counting) or not an integer: refused here, not taken (1.5 as 1) or met
    # at the first batch as "sample numbers must be in [0, 2**38)" (over a mixture)
    for epoch in (0, -3, 1.5):
        with pytest.raises(ValueError, match="PackedDataset: epoch must be an integer >= 1"):
            a.shares(None, 2, epoch=epoch)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="PackedDataset: epoch must be an integer >= 1"):
            next(a.iter_batches(2, epoch=epoch))  # type: ignore[arg-type]


def test_split_long_is_free_to_change_on_resume_in_concat_mode(tmp_path: Path) -> None:
    """split_long has no effect in concat mode (documents run back to back), so a resume with it changed
    is the same run; in best_fit it changes the packing and is refused."""
    path = _store(tmp_path / "s.seqstore", np.arange(1, 60) % 40 + 1)
    a = PackedDataset(path, seq_len=16, split_long=True)
    s = a.open(a.shares(None, 1)[0])
    s.batch(3)
    state = a.state_dict([s.state()])
    want = a.open(a.shares(state, 1)[0]).batch(3)["tokens"]
    b = PackedDataset(path, seq_len=16, split_long=False)
    np.testing.assert_array_equal(b.open(b.shares(state, 1)[0]).batch(3)["tokens"], want)
    fit = PackedDataset(path, seq_len=16, mode="best_fit", split_long=True).fresh_state()
    with pytest.raises(ValueError, match="made with"):
        PackedDataset(path, seq_len=16, mode="best_fit", split_long=False).shares(fit, 1)


@pytest.mark.timeout(30)  # it planned forever (and its memory grew) before
@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_documents_without_tokens_are_an_error_not_a_hang(tmp_path: Path, mode: str) -> None:
    """Every document empty and no EOS: nothing to pack, a ValueError naming the share (as for a share
    with no documents), not an endless pull. Empty documents among others still pack."""
    path = _store(tmp_path / "s.seqstore", np.zeros(50, dtype=np.int64))
    packed = PackedDataset(path, seq_len=16, mode=mode, window=4)
    with pytest.raises(ValueError, match="share 0 of 1: none of the 50 documents it draws from has a token"):
        packed.open(packed.shares(None, 1)[0]).batch(2)
    batch = PackedDataset(path, seq_len=16, mode=mode, window=4, eos=7).open(packed.shares(None, 1)[0]).batch(2)
    # documents of only their EOS (best_fit: the window's 4 in a row, then padding)
    assert (batch["tokens"] == 7).sum() == (2 * 16 if mode == "concat" else 2 * 4)
    # a share whose block holds only empty documents, epoch after epoch (default order)
    lens = np.array([3] * 20 + [0] * 20, dtype=np.int64)
    planners = [_planner(_FixedStream(lens), st, s, 2, mode, 8, window=4) for s, st in enumerate(fresh_shares(2, 1, 1))]
    assert planners[0].plan(3)[3].sum() == (3 * 9 if mode == "concat" else 3 * 6)  # 2 documents a row
    with pytest.raises(ValueError, match="share 1 of 2: no token"):
        planners[1].plan(1)
    # sparse documents (one in 200 has tokens) still pack: a few epochs, no error
    lens = np.zeros(200, dtype=np.int64)
    lens[17] = 5
    pl = _planner(LenStream(lens), fresh_shares(1, 1, 1)[0], 0, 1, mode, 16, window=2)
    assert pl.plan(2)[3].sum() == (2 * 17 if mode == "concat" else 2 * 10)  # window 2: 2 documents a row


class _FixedStream(LenStream):
    """``LenStream`` in the same (stored) order every epoch."""

    def docs(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(start, stop) + (epoch - 1) * len(self.lens), self.lens[start:stop]


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_packing_does_not_hold_every_empty_document_it_passes(mode: str) -> None:
    """Fewer documents with tokens per epoch than a plan needs (best_fit: than its window): the plan
    passes every empty document of an epoch and more; the planner held all of them (its memory grew with
    the dataset), now it holds the documents with tokens and one pull."""
    from seqstore.data._packplan import _PULL_MAX

    class Watched(_FixedStream):
        held = 0  # the most documents the planner held when it read more

        def docs(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
            self.held = max(self.held, len(pl.ids))
            return super().docs(epoch, start, stop)

    lens = np.zeros(1_000_000, dtype=np.int64)
    lens[np.linspace(0, len(lens) - 1, 50).astype(np.int64)] = 5
    stream = Watched(lens)
    pl = _planner(stream, fresh_shares(1, 1, 1)[0], 0, 1, mode, 16, window=64)
    seq, ids, off, cnt, pads = pl.plan(6)[:5]
    if mode == "best_fit":
        np.testing.assert_array_equal(cnt, 5)  # 3 whole documents a sequence
        assert len(ids) == 18 and (pads == 1).all()
    else:
        assert cnt.sum() == 6 * 17 and len(np.unique(ids)) == 20  # 97 tokens: 20 documents
    assert max(stream.held, len(pl.ids)) <= 64 + 2 * _PULL_MAX
    st = pl.state()["stats"]
    assert st["documents"] >= (len(lens) if mode == "best_fit" else len(lens) // 3)  # the empty ones counted



def test_length_field_is_checked_through_wrappers(tmp_path: Path) -> None:
    """A filter, slice, concatenation or mixture over a store measuring lengths in another field is refused
    like the store itself (it packed silently wrong: token id -1 filled the gaps)."""
    from seqstore.data import CombinedDataset, ConcatDataset, MixtureStream, SliceDataset

    path = tmp_path / "s.seqstore"
    with seqstore.create(path, {"tokens": Field("int32", (None,)), "other": Field("int32", (None,))}) as w:
        w.append_batch({"tokens": (np.arange(1, 15, dtype=np.int32), np.array([3, 5, 2, 4])),
                        "other": (np.zeros(40, dtype=np.int32), np.full(4, 10))})
    good = StoreDataset(path, length_field="tokens")
    wrong = StoreDataset(path, length_field="other")
    for src in (wrong, wrong.filter(min_length=1), SliceDataset(wrong, 0, 4), ConcatDataset([good, wrong]),
                CombinedDataset({"a": good, "b": SliceDataset(wrong, 1, 3)}),
                MixtureStream({"a": good, "b": wrong.filter(max_length=20)}, [(0, {"a": 0.5, "b": 0.5})])):
        with pytest.raises(ValueError, match="measures lengths in field 'other', not the token field 'tokens'"):
            PackedDataset(src, seq_len=8)
    # a store dataset that does not return the token field (a KeyError at the first batch before)
    for src in (StoreDataset(path, length_field="tokens", fields=["other"]),
                ConcatDataset([good, StoreDataset(path, length_field="tokens", fields=["other"])])):
        with pytest.raises(ValueError, match=r"does not return the token field 'tokens' \(its fields: \['other'\]\)"):
            PackedDataset(src, seq_len=8)
    p = PackedDataset(ConcatDataset([good.filter(min_length=3), SliceDataset(good, 0, 2)]), seq_len=8)
    assert (p.open(p.shares(None, 1)[0]).batch(2)["tokens"] > 0).all()


def test_meta_dataset_packs_the_tokens_its_lengths_measure(tmp_path: Path) -> None:
    """A meta dataset whose lengths come from another child than the token field's is refused (it packed
    audio frame counts of token documents: token id -1 filled the gaps); renamed token fields work."""
    from seqstore.data import MetaDataset

    ids = [f"u{i}" for i in range(4)]
    with seqstore.create(tmp_path / "text.seqstore", {"tokens": Field("int32", (None,))}) as w:
        w.append_batch({"tokens": (np.arange(1, 15, dtype=np.int32), np.array([3, 5, 2, 4]))}, ids=ids)
    with seqstore.create(tmp_path / "audio.seqstore", {"frames": Field("float32", (None,))}) as w:
        w.append_batch({"frames": (np.zeros(40, dtype=np.float32), np.full(4, 10))}, ids=ids)
    kids = {"audio": StoreDataset(tmp_path / "audio.seqstore"), "text": StoreDataset(tmp_path / "text.seqstore")}
    with pytest.raises(ValueError, match="takes its lengths from 'audio', which does not give the token field"):
        PackedDataset(MetaDataset(kids), seq_len=8)
    meta = MetaDataset(kids, length_from="text", fields={"text": {"tokens": "tok"}})
    p = PackedDataset(meta, tokens="tok", seq_len=8, mode="best_fit", window=1)
    got = p.open(p.shares(None, 1)[0]).batch(2)["tokens"]
    np.testing.assert_array_equal(got[got != 0], np.arange(1, 15)[: int((got != 0).sum())])


def test_packed_combination_state_is_refused_with_other_windows(tmp_path: Path) -> None:
    """A packed CombinedDataset's state records what its windows are cut from: resuming with another
    child order (seed) or other weights is refused (both resumed silently, drawing other documents);
    the same combination resumes, and a state saved before these were recorded still loads."""
    from seqstore.data import CombinedDataset

    for name, base in (("a", 1000), ("b", 5000)):
        with seqstore.create(tmp_path / f"{name}.seqstore", {"tokens": Field("int32", (None,))}) as w:
            w.append_batch({"tokens": (np.arange(base, base + 400, dtype=np.int32), np.full(100, 4))})

    def packed(seed: int, wa: float = 0.5) -> PackedDataset:
        kids = {n: StoreDataset(tmp_path / f"{n}.seqstore", ordering="random", seed=seed) for n in ("a", "b")}
        return PackedDataset(CombinedDataset(kids, weights={"a": wa, "b": 1 - wa}, epoch_size=100,
                                             ordering="random", seed=3), seq_len=8)

    p = packed(1)
    s = p.open(p.shares(None, 1)[0])
    s.batch(2)
    state = p.state_dict([s.state()])
    for other in (packed(2), packed(1, 0.9)):
        with pytest.raises(ValueError, match="the state is of another source"):
            other.shares(state, 1)
    want = p.open(p.shares(state, 1)[0]).batch(3)["tokens"]
    again = packed(1)
    np.testing.assert_array_equal(again.open(again.shares(state, 1)[0]).batch(3)["tokens"], want)
    for k in ("sizes", "child_epoch", "children"):
        del state["source"][k]
    np.testing.assert_array_equal(again.open(again.shares(state, 1)[0]).batch(3)["tokens"], want)


def test_a_token_field_of_floats_is_refused(tmp_path: Path) -> None:
    """A float or bfloat16 field given as the token field is a ValueError naming it (floats were cut to
    integers and bfloat16 packed as its bits, silently)."""
    for dt in ("float32", "bfloat16"):
        with seqstore.create(tmp_path / f"{dt}.seqstore", {"audio": Field(dt, (None,))}) as w:
            w.append_batch({"audio": (np.linspace(-1, 1, 40).astype(np.float32), np.full(4, 10))})
        with pytest.raises(ValueError, match=f"field 'audio' holds {dt} values; tokens must be integers"):
            p = PackedDataset(tmp_path / f"{dt}.seqstore", tokens="audio", seq_len=8)
            p.open(p.shares(None, 1)[0]).batch(1)


def test_an_explicit_order_is_digested_once_not_at_every_state_dict(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A state records a digest of an explicit ordering's values, which was computed again at every
    state_dict and every resume check (seconds for a 1e8-long order): now once per array, and per
    version of a .npy file (a rewritten file is digested again and tells its states apart)."""
    import hashlib
    import types

    import seqstore.data._orders as orders

    digested: list[int] = []

    def blake2b(**kw: Any) -> Any:
        digested.append(1)
        return hashlib.blake2b(**kw)

    monkeypatch.setattr(orders, "hashlib", types.SimpleNamespace(blake2b=blake2b))
    path = _store(tmp_path / "s.seqstore", np.full(20, 3))
    order = np.arange(20)[::-1].copy()
    packed = PackedDataset(StoreDataset(path, ordering=order), seq_len=8)
    shares = packed.shares(None, 2)
    first = packed.state_dict(shares)
    assert packed.state_dict(shares) == first
    packed.shares(first, 2)
    assert len(digested) == 1
    again = PackedDataset(StoreDataset(path, ordering=order.copy()), seq_len=8)  # equal values: the same state
    assert again.state_dict(again.shares(first, 2)) == first and len(digested) == 2
    np.save(tmp_path / "o.npy", order)
    on_file = PackedDataset(StoreDataset(path, ordering=tmp_path / "o.npy"), seq_len=8)
    saved = on_file.state_dict(shares)
    assert on_file.state_dict(shares) == saved and len(digested) == 3
    np.save(tmp_path / "o.npy", np.arange(19))
    with pytest.raises(ValueError, match="the state is of another source"):
        on_file.shares(saved, 2)


def test_an_order_file_rewritten_with_its_old_mtime_is_digested_again(tmp_path: Path) -> None:
    """A .npy order replaced in place by one of the same size whose mtime is the old one (``cp -p``,
    ``touch -r``, ``rsync --inplace``) is another order: a state of the old one is
    refused, not resumed over the new one."""
    path = _store(tmp_path / "s.seqstore", np.full(20, 3))
    order = tmp_path / "o.npy"
    np.save(order, np.arange(20))
    packed = PackedDataset(StoreDataset(path, ordering=order), seq_len=8)
    saved = packed.state_dict(packed.shares(None, 2))
    before = os.stat(order)
    np.save(order, np.arange(20)[::-1].copy())
    os.utime(order, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(order).st_size == before.st_size
    with pytest.raises(ValueError, match="the state is of another source"):
        PackedDataset(StoreDataset(path, ordering=order), seq_len=8).shares(saved, 2)


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_a_batch_of_no_sequence_is_empty_and_a_negative_one_is_refused(tmp_path: Path, mode: str) -> None:
    """batch(0) is an empty batch in both modes (best_fit failed with "not enough values to unpack"); a
    negative count is a ValueError naming it, before the share's counts change (concat counted -1
    sequences, then failed in NumPy)."""
    packed = PackedDataset(_store(tmp_path / "s.seqstore", np.full(10, 10)), seq_len=8, mode=mode)
    stream = packed.open(packed.shares(None, 1)[0])
    before = stream.state()
    batch = stream.batch(0)
    assert batch["tokens"].shape == (0, 8) and stream.state() == before
    with pytest.raises(ValueError, match="PackedStream: number of sequences must be an integer >= 0, got -1"):
        stream.batch(-1)
    assert stream.state() == before
    np.testing.assert_array_equal(stream.batch(2)["tokens"], packed.open(before).batch(2)["tokens"])


def test_a_share_with_no_document_says_why(tmp_path: Path) -> None:
    """More shares than an epoch has documents: a share whose block is empty in every epoch has nothing to
    pack; its error names that cause (it asked "empty dataset?" of a dataset that was not empty)."""
    packed = PackedDataset(_store(tmp_path / "s.seqstore", np.full(2, 5)), seq_len=4)
    shares = packed.shares(None, 3)
    assert packed.open(shares[0], 0, 3).batch(1)["tokens"].shape == (1, 4)
    with pytest.raises(ValueError, match=r"share 2 of 3: .*an epoch has fewer documents than the 3 shares"):
        packed.open(shares[2], 2, 3).batch(1)


def test_a_batch_of_a_source_without_the_token_field_names_it() -> None:
    """A source whose records do not hold the token field (a LengthsDataset: lengths only, which packing
    plans from) plans and skips, but its batch raised a bare KeyError 'tokens'; now a ValueError names
    the field, the source and the fields it has."""

    packed = PackedDataset(LengthsDataset(np.array([5, 7, 3])), seq_len=4)
    stream = packed.open(packed.shares(None, 1)[0])
    stream.skip(2)
    assert stream.state()["stats"]["tokens"] == 8
    with pytest.raises(ValueError, match=r"PackedDataset: LengthsDataset\(n=3.*gave no field 'tokens' .*\['length'\]"):
        stream.batch(1)


@pytest.mark.parametrize("damage, what", [
    (lambda s: s.pop("ranges"), r"share 1: no 'ranges'"),
    (lambda s: s.__setitem__("ranges", [[1, 2]]), r"share 1: range 0 .* \[epoch, start, stop, offset\]"),
    (lambda s: s.__setitem__("ranges", [[1, 9, 3, 0]]), r"share 1: range 0 .* start <= stop"),
    (lambda s: s.__setitem__("next_epoch", "a"), r"share 1: next_epoch must be an integer >= 1, got 'a'"),
    (lambda s: s.__setitem__("ranges", [[s["next_epoch"], 0, 60, 0]]), r"share 1: range 0 .* not before next_epoch"),
    (lambda s: s["stats"].pop("tokens"), r"share 1: stats .*'tokens'"),
    (lambda s: s.__setitem__("buffered", 10**6), r"share 1: buffered must be an integer >= 0 and at most"),
    (lambda s: s.__setitem__("stats", {**s["stats"], "source_tokens": [1, 2]}), r"share 1: stats .*source_tokens"),
])
def test_a_damaged_share_state_is_refused_naming_what(damage: Any, what: str) -> None:
    """A state whose share entries are damaged (a key missing, a range of 2 numbers, a word for a number)
    failed later with a bare KeyError / TypeError / 'not enough values to unpack'; now ``shares`` (and so
    a loader's load_state_dict) refuses it with a ValueError naming the share and what is wrong."""

    packed = PackedDataset(LengthsDataset(np.arange(1, 100)), seq_len=8, mode="best_fit", window=4)
    streams = [packed.open(st, s, 2) for s, st in enumerate(packed.shares(None, 2))]
    for s in streams:
        s.skip(5)
    state = packed.state_dict([s.state() for s in streams])
    packed.shares(state, 2)  # (as saved: fine)
    damage(state["shares"][1])
    with pytest.raises(ValueError, match="PackedDataset: malformed state: " + what):
        packed.shares(state, 2)


def test_a_share_outside_the_shares_is_refused_naming_it() -> None:
    """``iter_batches(share=3, num_shares=2)`` raised a bare IndexError ("list index out of range") and
    ``open`` a ValueError about a "block index"; both now name the share and the shares there are."""

    packed = PackedDataset(LengthsDataset(np.full(100, 3)), seq_len=8)
    for share in (2, 3, -1):
        with pytest.raises(ValueError, match=rf"PackedDataset: share must be in \[0, 2\), got {share}"):
            next(packed.iter_batches(2, share=share, num_shares=2))
        with pytest.raises(ValueError, match=rf"PackedDataset: share must be in \[0, 2\), got {share}"):
            packed.open(packed.fresh_state()["shares"][0], share, 2)
    with pytest.raises(ValueError, match="PackedDataset: num_shares must be an integer >= 1, got 0"):
        packed.open(packed.fresh_state()["shares"][0], 0, 0)


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_an_empty_dataset_fails_at_its_first_batch_naming_it(tmp_path: Path, mode: str) -> None:
    """A PackedDataset over no documents builds (lengths-only planning uses need no document) but its first
    batch is a ValueError naming the dataset and saying it is empty, after one epoch order (it built 1000
    and spoke of shares)."""

    built = []

    class Counted(LengthsDataset):
        def epoch_order(self, epoch: int, shard_index: int = 0, num_shards: int = 1) -> Any:
            built.append(epoch)
            return super().epoch_order(epoch, shard_index, num_shards)

    packed = PackedDataset(Counted(np.zeros(0, dtype=np.int64)), tokens="data", seq_len=4, mode=mode)
    stream = packed.open(packed.shares(None, 1)[0])
    with pytest.raises(ValueError, match=r"share 0 of 1: the dataset LengthsDataset\(n=0, .*\) has no documents "
                                         r"\(epoch 1\)"):
        stream.plan(1)
    assert len(built) <= 2


def test_skip_refuses_what_batch_refuses() -> None:
    """``PackedStream.skip`` took 2.5 as 2 and True as 1 sequences, ignored -1 and raised a bare TypeError on
    "3"; now each is a ValueError naming the argument (as ``batch`` / ``plan`` do) and the state is kept."""

    packed = PackedDataset(LengthsDataset(np.full(100, 7)), tokens="data", seq_len=8)
    stream = packed.open(packed.shares(None, 1)[0])
    before = stream.state()
    for bad in (-1, "3", 2.5, True):
        with pytest.raises(ValueError, match=r"PackedStream: number of sequences to skip must be an integer >= 0"):
            stream.skip(bad)  # type: ignore[arg-type]
        assert stream.state() == before
    stream.skip(np.int64(3))
    assert stream.state()["stats"]["sequences"] == 3


def test_pad_id_and_tokens_are_checked() -> None:
    """``pad_id`` went through ``int()``: 2.5 padded with 2, True with 1, "x" and None were bare errors; a
    ``tokens`` that is not a name was accepted. Now each is a ValueError naming the argument."""

    ds = LengthsDataset(np.full(10, 7))
    for bad in (2.5, True, "x", None):
        with pytest.raises(ValueError, match=r"PackedDataset: pad_id must be an integer, got"):
            PackedDataset(ds, tokens="data", pad_id=bad)
    with pytest.raises(ValueError, match=r"PackedDataset: tokens must be a field name \(a str\), got 5"):
        PackedDataset(ds, tokens=5)  # type: ignore[arg-type]
    assert PackedDataset(ds, tokens="data", pad_id=np.int32(-1)).pad_id == -1


def test_fresh_state_checks_its_share_count() -> None:
    """``fresh_state(num_shares=0)`` (or -1) returned a state of no share that loading then called malformed,
    and 2.5 was a bare TypeError; now each is a ValueError naming num_shares."""

    packed = PackedDataset(LengthsDataset(np.full(10, 7)), tokens="data", seq_len=4)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=r"PackedDataset: num_shares must be an integer >= 1, got"):
            packed.fresh_state(num_shares=bad)  # type: ignore[arg-type]
    state = packed.fresh_state(2, num_shares=np.int64(3))
    assert state["num_shares"] == 3 and len(packed.shares(state, 3, 2)) == 3


def test_open_names_what_is_wrong_with_a_share_state() -> None:
    """``open`` of a whole packed state (not one share's), of None or of a share state with a short range
    raised a bare KeyError / TypeError / unpacking error; now a ValueError says what it expected."""

    packed = PackedDataset(LengthsDataset(np.full(16, 30)), tokens="data", seq_len=8)
    with pytest.raises(ValueError, match=r"PackedDataset.open: .*one share's state.*a whole packed state"):
        packed.open(packed.fresh_state())
    with pytest.raises(ValueError, match=r"malformed state: share 0 is a NoneType, not a dict"):
        packed.open(None)  # type: ignore[arg-type]
    short = {"ranges": [[1, 0, 3]], "next_epoch": 1, "stats": packed.fresh_state()["shares"][0]["stats"]}
    with pytest.raises(ValueError, match=r"share 1: range 0 is \[1, 0, 3\], not \[epoch, start, stop, offset\]"):
        packed.open(short, 1, 2)
    assert packed.open(packed.fresh_state()["shares"][0]).plan(1)[0] == 1


def test_an_order_given_with_a_dataset_source_is_refused_not_ignored(tmp_path: Path) -> None:
    """``ordering=`` / ``seed=`` pick the document order of a store; with a dataset (or a mixture) as the
    source they were ignored without a word, so ``ordering="random"`` packed the documents unshuffled.
    Now they are a ValueError that says where the order goes; a store still takes them."""
    path = _store(tmp_path / "s.seqstore", np.arange(1, 50))
    ds = StoreDataset(path, length_field="tokens")
    for kw in ({"ordering": "random"}, {"seed": 3}, {"ordering": np.arange(49)}):
        with pytest.raises(ValueError, match="its own order"):
            PackedDataset(ds, seq_len=8, **kw)
    PackedDataset(ds, seq_len=8, ordering="default", seed=0)
    shuffled = PackedDataset(path, seq_len=8, ordering="random", seed=3)
    assert shuffled.dataset.ordering == "random" and shuffled.dataset.seed == 3


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_a_share_state_with_an_empty_range_packs_the_others(mode: str) -> None:
    """A share state may hold a range ``[epoch, a, a, offset]`` (``open`` accepts start == stop); its plan
    raised a bare IndexError. An empty range has no document: the plan goes on with the ranges after it."""

    packed = PackedDataset(LengthsDataset(np.full(16, 30)), tokens="data", seq_len=8, mode=mode, window=4)
    stats = packed.fresh_state()["shares"][0]["stats"]
    want = packed.open({"ranges": [[1, 2, 9, 0]], "next_epoch": 2, "stats": stats}).plan(6)
    got = packed.open({"ranges": [[1, 2, 2, 5], [1, 2, 9, 0], [1, 9, 9, 0]], "next_epoch": 2, "stats": stats}).plan(6)
    np.testing.assert_array_equal(got, want)


def test_a_share_range_past_its_epoch_is_refused_naming_it() -> None:
    """A (hand-made or damaged) share state whose range reaches past its epoch's documents was accepted,
    and the first plan failed with a bare IndexError from inside the order; ``shares`` and ``open`` now
    refuse it with a ValueError naming the share, the range and the epoch's size."""

    packed = PackedDataset(LengthsDataset(np.arange(1, 100)), seq_len=8)
    state = packed.fresh_state(num_shares=2)
    state["shares"][1]["ranges"] = [[1, 40, 500, 0]]
    state["shares"][1]["next_epoch"] = 2
    what = r"malformed state: share 1: range 0 is \[1, 40, 500, 0\], but epoch 1 has 99 documents"
    with pytest.raises(ValueError, match=what):
        packed.shares(state, 2)
    with pytest.raises(ValueError, match=what):
        packed.open(state["shares"][1], 1, 2)


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_sub_epochs_of_empty_documents_before_the_tokens_pack(mode: str) -> None:
    """A length-sorted dataset cut into 20 sub-epochs whose first 18 hold only empty documents has tokens:
    it packs (16 sub-epochs without a token were taken for a dataset with none). One with no token at all
    raises once a block held no token."""
    lens = np.array([0] * 90 + [50] * 10, dtype=np.int64)
    packed = PackedDataset(LengthsDataset(lens, ordering="sorted", partition_epoch=20), seq_len=16, mode=mode)
    stream = packed.open(packed.fresh_state()["shares"][0])
    stream.skip(4)
    stats = stream.state()["stats"]
    assert stats["sequences"] == 4 and stats["tokens"] == (4 * 16 if mode == "concat" else 50)  # best_fit: padded
    empty = PackedDataset(LengthsDataset(np.zeros(100, dtype=np.int64), partition_epoch=20), seq_len=16, mode=mode)
    with pytest.raises(ValueError, match="share 0 of 1: none of the 100 documents it draws from has a token"):
        empty.open(empty.fresh_state()["shares"][0]).skip(1)


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_no_token_anywhere_is_said_after_one_dry_block_and_sparse_tokens_are_named(mode: str) -> None:
    """Every document empty and no eos: the error comes once one block held no token and the lengths show
    that no document has one (it pulled 16 epochs of empty documents first: a hang on a large dataset),
    and says so. A share kept dry by too few documents with tokens for the shares says how many have
    them, instead of guessing that every document is empty."""
    n = 4000
    empty = PackedDataset(LengthsDataset(np.zeros(n, dtype=np.int64), ordering="random"), seq_len=16, mode=mode)
    stream = empty.open(empty.fresh_state()["shares"][0])
    with pytest.raises(ValueError, match=f"share 0 of 1: none of the {n} documents .* has a token"):
        stream.skip(1)
    lens = np.zeros(n, dtype=np.int64)
    lens[7] = 5
    sparse = PackedDataset(LengthsDataset(lens, ordering="sorted"), seq_len=16, mode=mode)
    with pytest.raises(ValueError, match=f"share 0 of 2: no token in its documents of [0-9]+ epochs.*1 of the {n} "):
        sparse.open(sparse.fresh_state(num_shares=2)["shares"][0], 0, 2).skip(1)


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_resplit_of_shares_far_apart_keeps_a_state_of_a_few_entries(mode: str) -> None:
    """Re-splitting shares that drifted apart (share 0 sixty epochs ahead of share 1) gave the new shares
    one range per epoch the lagging share had not started (a state growing with the drift, saved in every
    checkpoint); the lagging blocks are now one entry per run of epochs. No token repeated or skipped."""
    lens = np.random.default_rng(5).integers(1, 10, 40)
    n, L = len(lens), 16
    stream = LenStream(lens)
    planners = [_planner(stream, st, s, 2, mode, L, window=4) for s, st in enumerate(fresh_shares(2, 1, 1))]
    got = _inputs(planners[0].plan(600), mode, L) + _inputs(planners[1].plan(3), mode, L)
    top = planners[0].state()["next_epoch"]
    assert top > 50
    for new in (3, 1):
        states = resplit(stream, [pl.state() for pl in planners], new, 1)
        assert sum(len(st["ranges"]) for st in states) <= 4 * (2 + new), states
        again = [_planner(stream, st, s, new, mode, L, window=4) for s, st in enumerate(states)]
        mine = list(got)
        for pl in again:
            while not _past(pl, top - 1):
                mine += _inputs(pl.plan(1), mode, L)
        doc = np.concatenate([d for d, _ in mine])
        t = np.concatenate([x for _, x in mine])
        sel = doc < (top - 1) * n  # the epochs every old share had started
        key = doc[sel] * 16 + t[sel]
        assert len(np.unique(key)) == len(key), "a token was placed twice"
        assert len(key) == (top - 1) * int(lens.sum()), "a token is missing"


def test_a_resplit_state_with_runs_of_blocks_resumes_and_resplits_again() -> None:
    """The runs of blocks a re-split writes pass the state checks, resume, re-split again, and a malformed
    run is refused naming the share and the range."""
    lens = np.random.default_rng(6).integers(1, 10, 30)
    packed = PackedDataset(LengthsDataset(lens, ordering="random"), tokens="length", seq_len=16)
    streams = [packed.open(st, s, 2) for s, st in enumerate(packed.shares(None, 2))]
    streams[0].skip(300)
    streams[1].skip(2)
    state = packed.state_dict([s.state() for s in streams])
    three = packed.shares(state, 3)
    assert any(isinstance(r, dict) for st in three for r in st["ranges"])
    state3 = packed.state_dict(three)
    assert packed.shares(state3, 3) == three
    two = packed.shares(state3, 2)
    assert sum(len(st["ranges"]) for st in two) <= 12
    stats = packed.totals(two)
    for s, st in enumerate(two):
        packed.open(st, s, 2).skip(5)
    bad = copy.deepcopy(state3)
    run = next(i for i, r in enumerate(bad["shares"][1]["ranges"]) if isinstance(r, dict))
    bad["shares"][1]["ranges"][run]["blocks"] = [5, 10 ** 6]
    with pytest.raises(ValueError, match=f"share 1: range {run} is .*blocks.*next_epoch"):
        packed.shares(bad, 3)
    assert stats["sequences"] == 302


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_skip_holds_a_bounded_plan_however_many_sequences_it_skips(mode: str) -> None:
    """skip(n) (what a resume state replays: consumed batches x batch size) built the whole plan of the n
    sequences and dropped it (tens of MB at 200_000 sequences, growing with n); it plans in bounded steps
    now, with the same state after it, and a skip that fails is undone as a whole."""
    import tracemalloc

    lens = np.random.default_rng(0).integers(1, 64, 10_000)
    packed = PackedDataset(LengthsDataset(lens, ordering="random"), tokens="length", seq_len=16, mode=mode, window=8)
    stream = packed.open(packed.fresh_state()["shares"][0])
    stream.skip(10)
    tracemalloc.start()
    try:
        stream.skip(200_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8_000_000
    again = packed.open(packed.fresh_state()["shares"][0])
    again.planner.plan(200_010)
    assert again.state() == stream.state()


def test_sixteen_dry_blocks_of_one_document_are_not_an_error_while_tokens_come() -> None:
    """A mixture cut into chunks of one sample (a block of one document per share and chunk) over documents
    of which one in 41 has tokens: 16 empty documents in a row were '16 epochs without a token', an error,
    though every 41st document has tokens. The streak that is an error is now also at least 16 x the
    documents per document with a token (by chance about e**-16 for a shuffled order)."""
    lens = np.zeros(41, dtype=np.int64)
    lens[40] = 5
    mix = MixtureStream({"a": LengthsDataset(lens)}, {"a": 1}, chunk=1)
    packed = PackedDataset(mix, tokens="length", seq_len=4)
    stream = packed.open(packed.fresh_state()["shares"][0])
    stream.skip(3)
    assert stream.state()["stats"]["tokens"] == 12


@pytest.mark.parametrize("mixture", [False, True])
def test_a_dry_share_reads_the_lengths_only_as_far_as_its_question_needs(mixture: bool) -> None:
    """A share whose blocks hold only empty documents asked how many documents have a token: every length
    of the dataset was read (in every worker's copy) to learn that one has. It reads up to the first ones
    it needs, and the error after 16 dry blocks still comes."""
    from seqstore.data import FuncLengths

    n, shares = 4_000_000, 1000  # a block of 4000 documents; share 0's are empty in every epoch
    read = [0]

    def lengths(i: np.ndarray) -> np.ndarray:
        read[0] += len(i)
        return np.where(i < n // shares, 0, 5)

    data = LengthsDataset(FuncLengths(n, lengths))
    source: Any = MixtureStream({"a": data}, {"a": 1}, chunk=n) if mixture else data
    packed = PackedDataset(source, tokens="length", seq_len=16)
    stream = packed.open(packed.fresh_state(num_shares=shares)["shares"][0], 0, shares)
    with pytest.raises(ValueError, match="share 0 of 1000: no token in its documents of 16 epochs in a row"):
        stream.skip(1)
    assert read[0] < n // 4, read[0]
