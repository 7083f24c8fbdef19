"""PackedDataset when the lengths of some documents cannot be read (a shard's offsets missing or refused):
the plans read lengths ahead of the batch they make, and the error comes at the batch that needs them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.data import ArrayLengths, LengthsDataset, MixtureStream, PackedDataset, StoreDataset
from seqstore.data._packplan import Planner, fresh_shares
from seqstore.errors import SchemaError

EOS = 1 << 30
L, B, WINDOW = 32, 2, 8
BAD = 300  # the first record of shard 3 (100 records a shard)


def _sharded(path: Path, n: int = 1000, seed: int = 0) -> np.ndarray:
    lens = np.random.default_rng(seed).integers(1, 40, n)
    with seqstore.create(path, {"tokens": Field("int32", (None,))}, max_shard_records=100) as w:
        w.append_batch({"tokens": (np.arange(int(lens.sum()), dtype=np.int32), lens)})
    return lens


def _packed(store: Any, mode: str) -> PackedDataset:
    return PackedDataset(store, seq_len=L, mode=mode, eos=EOS, window=WINDOW)


def _reference(store: Any, lens: np.ndarray, mode: str, count: int) -> tuple[list[np.ndarray], list[int]]:
    """The first ``count`` batches of the intact store and after each the last document (in the default
    order: its position) any batch so far drew on."""
    packed = _packed(store, mode)
    stream = packed.open(packed.shares(None, 1)[0])
    start = np.cumsum(lens) - lens
    toks, last = [], []
    top = 0
    for _ in range(count):
        b = stream.batch(B)
        toks.append(b["tokens"].copy())
        t = b["tokens"].reshape(-1)
        top = max(top, int(np.searchsorted(start, t[t != EOS], side="right").max()) - 1)
        last.append(top)
    return toks, last


def _resumed(store: Any, mode: str, state: dict[str, Any]) -> np.ndarray:
    """The first batch of a stream over ``store`` from share state ``state``."""
    packed = _packed(store, mode)
    return packed.open(state).batch(B)["tokens"]


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_a_shard_without_lengths_fails_the_batch_that_needs_it_not_the_first(tmp_path: Path, mode: str) -> None:
    """The planner pulled the lengths of the next 1024 (and read 2048) documents at the first batch: a shard
    among them whose offsets could not be read failed batch 0, though the batches before its documents
    need none of them. Now the documents read ahead stop before it and the error comes at the first batch
    that needs its documents; asked again it comes again; ``state()`` is still the state after the last
    batch handed out."""
    lens = _sharded(tmp_path / "t.seqstore")
    good = seqstore.open(tmp_path / "t.seqstore")
    want, last = _reference(good, lens, mode, 120)
    shutil.copytree(tmp_path / "t.seqstore", tmp_path / "bad.seqstore")
    (tmp_path / "bad.seqstore" / "shard-000003" / "tokens.offsets.npy").unlink()
    packed = _packed(seqstore.open(tmp_path / "bad.seqstore"), mode)
    stream = packed.open(packed.shares(None, 1)[0])
    got = []
    with pytest.raises(Exception, match="shard-000003") as first:
        while True:
            got.append(stream.batch(B)["tokens"].copy())
    assert got, f"batch 0 failed: {first.value!r}"
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"batch {k}")
    if mode == "concat":
        assert len(got) == int((lens[:BAD] + 1).sum() - 1) // (B * L)
    else:  # at least every batch whose documents and a window of documents after them lie before the shard
        assert len(got) >= sum(d + WINDOW < BAD for d in last) > 0
    assert len(got) < len(want)
    np.testing.assert_array_equal(_resumed(good, mode, stream.state()), want[len(got)])
    with pytest.raises(type(first.value), match="shard-000003"):
        stream.batch(B)
    np.testing.assert_array_equal(_resumed(good, mode, stream.state()), want[len(got)])


class _Refusing:
    """Documents of given lengths in order, one epoch after another; reading the length of a document at
    position ``bad`` or later of epoch 1 raises while ``refuse`` is set. Counts the reads."""

    names = ["data"]

    def __init__(self, lens: np.ndarray, bad: int) -> None:
        self.lens = np.asarray(lens, dtype=np.int64)
        self.bad = bad
        self.refuse = True
        self.reads = self.failed = 0

    def epoch_len(self, epoch: int) -> int:
        return len(self.lens)

    def docs(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        self.reads += 1
        if self.refuse and epoch == 1 and stop > self.bad:
            self.failed += 1
            raise OSError(f"document {self.bad} refused")
        pos = np.arange(start, stop, dtype=np.int64)
        return pos + (epoch - 1) * len(self.lens), self.lens[pos]

    def source_of(self, ids: np.ndarray) -> np.ndarray:
        return np.zeros(len(ids), dtype=np.int64)


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_a_plan_that_fails_changes_nothing_and_the_reads_ahead_are_few(mode: str) -> None:
    """A plan whose documents cannot be read raises and leaves the planner where it was: once they can be
    read, the plans go on as if nothing had failed (no sequence skipped, none made twice). Reading ahead
    finds where the readable documents end once (a bisection), not at every plan."""
    lens = np.random.default_rng(3).integers(1, 40, 5000)
    ref = Planner(_Refusing(lens, 10**9), mode=mode, seq_len=L, window=WINDOW, split=True, eos=True, share=0,
                  num_shares=1, state=fresh_shares(1, 1, 1)[0])
    want = [ref.plan(B) for _ in range(400)]
    stream = _Refusing(lens, 600)
    pl = Planner(stream, mode=mode, seq_len=L, window=WINDOW, split=True, eos=True, share=0, num_shares=1,
                 state=fresh_shares(1, 1, 1)[0])
    got = []
    with pytest.raises(OSError, match="refused"):
        while True:
            got.append(pl.plan(B))
    assert 0 < len(got) < len(want)
    assert stream.failed <= 16, stream.failed  # (a bisection of 2048 documents: 11 reads)
    before = pl.state()
    with pytest.raises(OSError, match="refused"):
        pl.plan(B)
    assert pl.state() == before
    stream.refuse = False
    got += [pl.plan(B) for _ in range(400 - len(got))]
    for k, (g, w) in enumerate(zip(got, want)):
        for a, b in zip(g, w):
            np.testing.assert_array_equal(a, b, err_msg=f"plan {k}")
    assert pl.state()["stats"] == ref.state()["stats"]


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_a_batch_whose_tokens_cannot_be_read_is_not_skipped(tmp_path: Path, mode: str) -> None:
    """``PackedStream.batch`` planned the batch, then read its documents: when the read failed (here a
    verified read of damaged tokens) the plan stayed made, so ``state()`` after the error was the state
    after the batch never handed out, and the next ``batch()`` went on after it: a training loop that
    retried, or saved ``state()`` and resumed, lost the batch. Now the failed batch is not counted: it
    is made again."""
    lens = _sharded(tmp_path / "t.seqstore")
    good = seqstore.open(tmp_path / "t.seqstore")
    want, _ = _reference(good, lens, mode, 150)
    shutil.copytree(tmp_path / "t.seqstore", tmp_path / "bad.seqstore")
    values = tmp_path / "bad.seqstore" / "shard-000003" / "tokens.npy"
    with open(values, "r+b") as f:  # the last tokens of record 399 (its checksum no longer matches)
        f.seek(-8, 2)
        kept = f.read()
        f.seek(-8, 2)
        f.write(b"\xff" * 8)
    packed = _packed(seqstore.open(tmp_path / "bad.seqstore", verify_reads=True), mode)
    stream = packed.open(packed.shares(None, 1)[0])
    got = []
    with pytest.raises(seqstore.errors.SeqstoreError, match="record 399"):
        while True:
            got.append(stream.batch(B)["tokens"].copy())
    assert 0 < len(got) < len(want)
    np.testing.assert_array_equal(_resumed(good, mode, stream.state()), want[len(got)])
    with pytest.raises(seqstore.errors.SeqstoreError, match="record 399"):
        stream.batch(B)
    np.testing.assert_array_equal(_resumed(good, mode, stream.state()), want[len(got)])
    with open(values, "r+b") as f:
        f.seek(-8, 2)
        f.write(kept)
    for k in range(len(got), len(got) + 3):
        np.testing.assert_array_equal(stream.batch(B)["tokens"], want[k], err_msg=f"batch {k}")


class _MisMeasured(StoreDataset):
    """A store dataset whose lengths of document 3 are ``delta`` off its records'."""

    delta = 0

    def lengths(self) -> ArrayLengths:
        lens = np.asarray(super().lengths().take(np.arange(self.num_seqs)))
        lens[3] += self.delta
        return ArrayLengths(lens)


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
@pytest.mark.parametrize("delta", [2, -2])
def test_lengths_that_disagree_with_the_records_are_an_error_naming_the_document(tmp_path: Path, mode: str,
                                                                                delta: int) -> None:
    """A plan is made from the lengths; ``_fill`` filled a record shorter than its length with the EOS
    (-1 without one) and cut a longer one, so wrong tokens and labels reached the trainer. The batch is a
    SchemaError naming the document, the field and both lengths."""
    with seqstore.create(tmp_path / "s", {"tokens": Field("int32", (None,))}) as w:
        w.append_batch({"tokens": (np.arange(60, dtype=np.int32), np.full(6, 10))})
    ds = _MisMeasured(tmp_path / "s", length_field="tokens")
    ds.delta = delta
    packed = PackedDataset(ds, seq_len=16, mode=mode)
    stream = packed.open(packed.fresh_state()["shares"][0])
    with pytest.raises(SchemaError, match=rf"document 3 has 10 tokens in field 'tokens'.* its length .* {10 + delta}"):
        for _ in range(4):
            stream.batch(1)


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_a_negative_token_id_is_an_error_naming_the_document(tmp_path: Path, mode: str) -> None:
    """A negative token id (ids past int16 stored in an int16 field wrap to negative ones) went into the
    batch: as a label -100 it was silently left out of the loss, as an input an embedding row that does not
    exist. The batch is a SchemaError naming the document, the position and the value."""
    toks = np.arange(60, dtype=np.int16)
    toks[34] = -100
    with seqstore.create(tmp_path / "s", {"tokens": Field("int16", (None,))}) as w:
        w.append_batch({"tokens": (toks, np.array([10, 0, 20, 10, 20]))})
    packed = PackedDataset(tmp_path / "s", seq_len=16, mode=mode)
    stream = packed.open(packed.fresh_state()["shares"][0])
    with pytest.raises(SchemaError, match=r"document 3 has token id -100 at position 4 of field 'tokens'"):
        for _ in range(5):
            stream.batch(1)


def test_a_share_state_opened_as_another_share_is_refused() -> None:
    """``open(shares[1])`` (share and count left out: share 0 of 1) packed share 1's ranges and then whole
    epochs: tokens every other share also packs. A share state now says which share of how many it is;
    ``open`` as another, and a whole state whose shares are out of place, are a ValueError naming both."""
    packed = PackedDataset(LengthsDataset(np.full(64, 5)), tokens="data", seq_len=8)
    streams = [packed.open(st, s, 2) for s, st in enumerate(packed.shares(None, 2))]
    for s in streams:
        s.skip(3)
    state = packed.state_dict([s.state() for s in streams])
    shares = packed.shares(state, 2)
    with pytest.raises(ValueError, match=r"PackedDataset.open: .*share 1 of 2.*opened as share 0 of 1"):
        packed.open(shares[1])
    with pytest.raises(ValueError, match=r"share 0 of 3"):
        packed.open(packed.shares(state, 3)[0], 0, 2)
    assert packed.open(shares[1], 1, 2).state() == shares[1]
    swapped = {**state, "shares": state["shares"][::-1]}
    with pytest.raises(ValueError, match=r"malformed state: share 0 is the state of share 1 of 2"):
        packed.shares(swapped, 2)
    fresh = packed.shares(None, 2)[0]  # (a fresh share is every share's)
    assert packed.open(fresh, 1, 2).plan(1)[0] == 1


def test_a_bad_document_of_a_mixture_is_named_by_its_source(tmp_path: Path) -> None:
    """Over a mixture the error named "document 39 of CombinedDataset(...)": an index into the sources put
    end to end, which the user never made. Now it names the source, the document's index there and the
    combined index."""
    for name, bad in (("web", None), ("code", 3)):
        toks = np.tile(np.arange(1, 6, dtype=np.int32), 8)
        if bad is not None:
            toks[bad * 5 + 1] = -3
        with seqstore.create(tmp_path / name, {"tokens": Field("int32", (None,))}) as w:
            w.append_batch({"tokens": (toks, np.full(8, 5))})
    srcs = {n: StoreDataset(tmp_path / n, length_field="tokens") for n in ("web", "code")}
    packed = PackedDataset(MixtureStream(srcs, {"web": 0.5, "code": 0.5}, chunk=16), seq_len=8)
    stream = packed.open(packed.shares(None, 1)[0])
    with pytest.raises(SchemaError, match=r"document 3 of source 'code' \(StoreDataset.*combined index 11\) has "
                                          r"token id -3 at position 1"):
        for _ in range(10):
            stream.batch(2)


@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_a_share_state_offset_past_its_document_is_refused(mode: str) -> None:
    """A share state whose range starts more tokens into its first document than it has (a state edited or
    made for other data) silently skipped the document as finished; now the plan that reaches it raises
    a ValueError naming the share, the range, the document and its length."""
    packed = PackedDataset(LengthsDataset(np.full(10, 5)), tokens="data", seq_len=4, mode=mode)
    stats = packed.fresh_state()["shares"][0]["stats"]
    ok = packed.open({"ranges": [[1, 0, 3, 5]], "next_epoch": 2, "stats": stats}).plan(2)  # (finished: fine)
    assert ok[0] == 2
    with pytest.raises(ValueError, match=r"share 0 of 1: malformed state: range \[1, 0, 3, 6\] starts 6 tokens into "
                                         r"document 0 \(position 0 of epoch 1\), which has 5"):
        packed.open({"ranges": [[1, 0, 3, 6]], "next_epoch": 2, "stats": stats}).plan(2)
