"""Packed language-model sequences: seqstore's PackedDataset vs Megatron-Core's GPTDataset / BlendedDataset
and Grain's packing, on the same documents.

Documents: lognormal lengths, median 400 tokens, sigma 1.0 (clipped to 1..65,536), uint16 tokens, in a
seqstore store (``bench/data/packing/``); Megatron reads the same tokens exported with
``seqstore.interop.megatron.export_megatron`` (``.bin`` + ``.idx``). Sequence length 2048, batches of 8
sequences, one epoch, ``random`` document order (seqstore), Megatron's own shuffles. Every case runs
in a fresh process (``bench.harness``); per case:

- ``first``: from nothing opened to the first packed batch in hand (seqstore: open the store, build the
  dataset and its order, pack and gather batch 1; Megatron: build GPTDataset's document / sample /
  shuffle indices (cache in a fresh temporary directory, so they are built) and read sample 0..7;
  Grain: build the pipeline and take batch 1);
- ``stream``: the next ``batches`` batches; ``tokens_per_s`` = packed tokens (B x 2048 per batch)
  over that time; ``padding`` = padding tokens / packed tokens;
- ``get_batch``: the baseline for throughput: ``Store.get_batch`` of the same documents in the same
  random order, blocks of documents holding about B x 2048 tokens, tokens/s.

``plan-1e9``: seqstore only, 1e9 virtual documents (``LengthsDataset`` over a hash of the index with the
same lognormal lengths, no token file: a 1e9-document store holds ~6.6e11 tokens, more than this disk):
the first packed batch's *plan* (which tokens of which documents), i.e. everything but the token reads,
and its private memory.

``index-1e7`` / ``index-1e8`` (``--index``): Megatron's ``GPTDataset`` at sizes whose tokens do not fit
on this disk: a ``.idx`` of the same lognormal lengths (written once, in chunks) and a *sparse* ``.bin``
of the right size (``truncate``: it reads as zeros and takes no disk), so what is measured is Megatron's
index build (document, sample and shuffle indices, cache in a fresh temporary directory) and its first
batch; beside it, seqstore's plan of the first batch over virtual documents of the same sizes. Run with
``--virtual 1e9`` these give the 1e9 figures and Megatron's at 1e7/1e8 in one run.

``real-1e9`` (``--real 1e9``): a real store of 1e9 *short* documents (1-8 tokens, uniform: 4.5e9 tokens,
about 21 GB with offsets and checksums, written once) so that a store of that many documents fits on
this disk; from nothing opened to the first packed batch in hand, token reads included.

Usage: ``python bench/packing.py [--quick] [--repeats R] [--sizes 1e5,1e6] [--batches 200] [--virtual 1e9]
[--index 1e7,1e8] [--real 1e9]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import DATA, Case, print_table, run_cases, section, section_time  # noqa: E402

SEQ = 2048
BATCH = 8
MEDIAN = 400.0
SIGMA = 1.0
EOS = 0


def _lengths(n: int, seed: int = 0) -> Any:
    import numpy as np

    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(MEDIAN), SIGMA, n), 1, 65_536).astype(np.int64)


def store_path(n: int) -> Path:
    return DATA / "packing" / f"docs-{n}.seqstore"


def _write_store(path: Path, n: int, chunk: int, lengths: Any, shard_records: int) -> None:
    """Write ``n`` documents of uint16 tokens to ``path`` once (a ``.done`` marker says it is complete):
    ``lengths(k, m)``: the lengths of chunk ``k`` (``m`` documents)."""
    import shutil

    import numpy as np

    import seqstore
    from seqstore import Field

    done = path.with_name(path.name + ".done")
    if done.exists():
        return
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with seqstore.create(path, {"tokens": Field("uint16", (None,))}, max_shard_records=shard_records) as w:
        for k, a in enumerate(range(0, n, chunk)):
            ln = lengths(k, min(chunk, n - a))
            vals = (np.arange(int(ln.sum()), dtype=np.int64) % 50_000 + 1).astype(np.uint16)
            w.append_batch({"tokens": (vals, ln)})
    done.write_text("ok")


def ensure_data(n: int, megatron: bool = True) -> None:
    """Build the store (and its Megatron export) once."""
    lens = _lengths(n)
    path = store_path(n)
    _write_store(path, n, 100_000, lambda k, m: lens[k * 100_000 : k * 100_000 + m], 1 << 20)
    mdone = path.with_name(path.name + ".megatron.done")
    if megatron and not mdone.exists():
        from seqstore.interop.megatron import export_megatron

        export_megatron(path, path.with_name(f"megatron-{n}"), field="tokens", overwrite=True)
        mdone.write_text("ok")


# ------------------------------------------------------------------------------------------- seqstore


def case_seqstore(n: int, mode: str, batches: int, short: bool = False) -> dict[str, Any]:
    """seqstore's packed batches (``short``: of the real store of short documents)."""
    import seqstore
    from seqstore.data import PackedDataset

    with section("first"):
        store = seqstore.open(short_store_path(n) if short else store_path(n))
        packed = PackedDataset(store, seq_len=SEQ, mode=mode, eos=EOS, ordering="random", seed=1)
        stream = packed.open(packed.shares(None, 1)[0])
        b = stream.batch(BATCH)
    with section("stream"):
        for _ in range(batches):
            b = stream.batch(BATCH)
    st = stream.state()["stats"]
    t = _stream_time()
    return {"tokens_per_s": batches * BATCH * SEQ / t, "padding": st["padding"] / (st["sequences"] * SEQ),
            "documents": len(store), "check": int(b["tokens"][0, 0])}


def _stream_time() -> float:
    return section_time("stream")


def token_reads(store: Any) -> Any:
    """The throughput baseline: a step that reads the next documents of the ``random`` order (seed 1)
    holding about BATCH x SEQ tokens with one ``get_batch`` and returns the tokens read."""
    import numpy as np

    from seqstore.data import StoreDataset

    order = StoreDataset(store, ordering="random", seed=1, length_field="tokens").epoch_order(1)
    lengths = store.lengths("tokens")
    pos = 0

    def step() -> int:
        nonlocal pos
        ids = order.take(np.arange(pos, min(pos + 64, len(order))))
        k = int(np.searchsorted(np.cumsum(lengths.take(ids)), BATCH * SEQ)) + 1
        pos += k
        return len(store.get_batch(ids[:k], fields=["tokens"])["tokens"][0])

    return step


def case_get_batch(n: int, batches: int) -> dict[str, Any]:
    import seqstore

    with section("first"):
        block = token_reads(seqstore.open(store_path(n)))
        block()
    toks = 0
    with section("stream"):
        for _ in range(batches):
            toks += block()
    return {"tokens_per_s": toks / _stream_time()}


def short_store_path(n: int) -> Path:
    return DATA / "packing" / f"short-{n}.seqstore"


def ensure_short_store(n: int) -> None:
    """A store of ``n`` documents of 1-8 tokens (made once, 10^7 documents per append)."""
    import numpy as np

    _write_store(short_store_path(n), n, 10_000_000,
                 lambda k, m: np.random.default_rng(k).integers(1, 9, m), 1 << 25)


def case_plan_virtual(n: int, mode: str) -> dict[str, Any]:
    import numpy as np

    from seqstore.data import FuncLengths, LengthsDataset, PackedDataset

    def lens(i: Any) -> Any:  # lognormal lengths from a hash of the index: no array of size n
        h = (np.asarray(i, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(11)
        u = (h.astype(np.float64) + 0.5) / float(1 << 53)
        z = np.sqrt(2.0) * _erfinv(2 * u - 1)
        return np.clip(np.exp(np.log(MEDIAN) + SIGMA * z), 1, 65_536).astype(np.int64)

    with section("first"):
        ds = LengthsDataset(FuncLengths(n, lens), ordering="random", seed=1)
        packed = PackedDataset(ds, tokens="data", seq_len=SEQ, mode=mode, eos=EOS)
        stream = packed.open(packed.shares(None, 1)[0])
        stream.skip(BATCH)
    with section("stream"):
        stream.skip(BATCH * 200)
    st = stream.state()["stats"]
    return {"tokens_per_s": 200 * BATCH * SEQ / _stream_time(), "padding": st["padding"] / (st["sequences"] * SEQ)}


def _erfinv(y: Any) -> Any:
    import numpy as np

    a = 0.147  # Winitzki's approximation, plenty for a length distribution
    ln = np.log(1 - y * y)
    t = 2 / (np.pi * a) + ln / 2
    return np.sign(y) * np.sqrt(np.sqrt(t * t - ln / a) - t)


# ------------------------------------------------------------------------------------------- megatron


def _megatron_config(cache: str | None) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
        from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    class Tok(NullTokenizer):  # type: ignore[misc]
        @property
        def eod(self) -> int:
            return EOS

        @property
        def pad(self) -> int:
            return EOS

    return GPTDatasetConfig(random_seed=1, sequence_length=SEQ, tokenizer=Tok(65_535), reset_position_ids=True,
                            reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
                            path_to_cache=cache, split="100,0,0")


def index_prefix(n: int) -> Path:
    return DATA / "packing" / f"megatron-lengths-{n}"


def ensure_index(n: int) -> str:
    """A Megatron ``.idx`` of ``n`` lognormal document lengths and a sparse ``.bin`` (made once)."""
    import struct

    import numpy as np

    from seqstore.interop.megatron import CODES, HEADER_BYTES, MAGIC, VERSION

    prefix = index_prefix(n)
    done = prefix.with_name(prefix.name + ".done")
    if done.exists():
        return str(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    idx, binp = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    with open(idx, "wb") as f:
        f.write(MAGIC + struct.pack("<QBQQ", VERSION, CODES["uint16"], n, n + 1))
    assert idx.stat().st_size == HEADER_BYTES
    chunk = 10_000_000
    total = 0
    with open(idx, "ab") as f:  # lengths, then pointers (byte offsets), then document indices
        for k, a in enumerate(range(0, n, chunk)):
            f.write(_lengths(min(chunk, n - a), seed=k).astype("<i4").tobytes())
        lens = np.memmap(idx, dtype="<i4", mode="r", offset=HEADER_BYTES, shape=(n,))
        for a in range(0, n, chunk):
            ln = np.asarray(lens[a : a + chunk], dtype=np.int64)
            f.write(((np.cumsum(ln) - ln + total) * 2).astype("<i8").tobytes())
            total += int(ln.sum())
        del lens
        for a in range(0, n + 1, chunk):
            f.write(np.arange(a, min(a + chunk, n + 1), dtype="<i8").tobytes())
    with open(binp, "wb") as f:
        f.truncate(total * 2)  # sparse: no blocks on disk, zeros when read
    done.write_text("ok")
    return str(prefix)


def case_megatron_index(n: int) -> dict[str, Any]:
    """Megatron's GPTDataset over a lengths-only index (sparse tokens): index build + first batch."""
    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.gpt_dataset import GPTDataset
        from megatron.core.datasets.indexed_dataset import IndexedDataset
        from megatron.core.datasets.utils import Split
    prefix = str(index_prefix(n))
    with tempfile.TemporaryDirectory() as cache:
        with section("first"):
            idx = IndexedDataset(prefix)
            docs = np.arange(len(idx.document_indices) - 1, dtype=np.int32)
            ds = GPTDataset(idx, prefix, docs, None, Split.train, _megatron_config(cache))
            first = [ds[i] for i in range(BATCH)]
        cached = sum(f.stat().st_size for f in Path(cache).rglob("*") if f.is_file())
    return {"samples": len(ds), "index_bytes": cached, "check": int(first[0]["tokens"][0])}


def case_megatron(n: int, batches: int, blended: bool = False) -> dict[str, Any]:
    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_dataset import BlendedDataset
        from megatron.core.datasets.gpt_dataset import GPTDataset
        from megatron.core.datasets.indexed_dataset import IndexedDataset
        from megatron.core.datasets.utils import Split
    prefix = str(store_path(n).with_name(f"megatron-{n}"))
    with tempfile.TemporaryDirectory() as cache:
        config = _megatron_config(cache)
        with section("first"):
            idx = IndexedDataset(prefix)
            docs = np.arange(len(idx.document_indices) - 1, dtype=np.int32)
            if blended:
                parts = [GPTDataset(idx, prefix, docs, None, Split.train, _megatron_config(f"{cache}/{k}"))
                         for k in range(3)]
                size = int(len(parts[0]) / 0.5 * 0.99)  # the largest weight takes one epoch of its part
                # no cache: BlendedDataset asks torch.distributed for the rank when it writes one
                ds: Any = BlendedDataset(parts, [0.5, 0.3, 0.2], size, _megatron_config(None))
            else:
                ds = GPTDataset(idx, prefix, docs, None, Split.train, config)
            first = [ds[i] for i in range(BATCH)]
        j = BATCH
        with section("stream"):
            for _ in range(batches):
                first = [ds[j + i] for i in range(BATCH)]
                j += BATCH
        return {"tokens_per_s": batches * BATCH * SEQ / _stream_time(), "padding": 0.0, "samples": len(ds),
                "check": int(first[0]["tokens"][0])}


# ------------------------------------------------------------------------------------------- grain


def case_grain(n: int, batches: int, pack: str) -> dict[str, Any]:
    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import grain
        import grain.experimental as ge

    import seqstore

    class Docs:
        def __init__(self) -> None:
            self.store = seqstore.open(store_path(n))
            # first-fit refuses documents longer than a sequence: truncated (their rest is lost)
            self.limit = SEQ if pack == "first_fit" else None

        def __len__(self) -> int:
            return len(self.store)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"tokens": np.asarray(self.store[int(i)]["tokens"][: self.limit], dtype=np.int32)}

    with section("first"):
        src = grain.MapDataset.source(Docs()).shuffle(seed=1).to_iter_dataset()
        if pack == "first_fit":
            packed = ge.FirstFitPackIterDataset(src, length_struct={"tokens": SEQ}, num_packing_bins=128,
                                                shuffle_bins=False)
        else:
            packed = ge.ConcatThenSplitIterDataset(src, length_struct={"tokens": SEQ})
        it = iter(packed.batch(BATCH))
        b = next(it)
    pad = 0
    with section("stream"):
        for _ in range(batches):
            b = next(it)
            seg = b["tokens_segment_ids"] if "tokens_segment_ids" in b else None
            if seg is not None:
                pad += int((np.asarray(seg) == 0).sum())
    return {"tokens_per_s": batches * BATCH * SEQ / _stream_time(), "padding": pad / (batches * BATCH * SEQ)}


# ------------------------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sizes", default="1e5,1e6")
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--virtual", default="1e9", help="sizes of the plan-only virtual case ('' to skip)")
    p.add_argument("--index", default="", help="sizes of Megatron's index build on lengths only ('1e7,1e8')")
    p.add_argument("--real", default="", help="sizes of the real short-document store case ('1e9')")
    p.add_argument("--skip", default="", help="comma-separated case names to leave out")
    args = p.parse_args()
    sizes = [10**4] if args.quick else [int(float(s)) for s in args.sizes.split(",") if s]
    skip = set(args.skip.split(","))
    nb = 20 if args.quick else args.batches
    cases = []
    for n in sizes:
        ensure_data(n)
        g = f"N={n:.0e}"
        kw = {"n": n, "batches": nb}
        for name, target, extra in [
            ("get_batch", "case_get_batch", {}),
            ("seqstore concat", "case_seqstore", {"mode": "concat"}),
            ("seqstore best_fit", "case_seqstore", {"mode": "best_fit"}),
            ("megatron GPTDataset", "case_megatron", {}),
            ("megatron BlendedDataset x3", "case_megatron", {"blended": True}),
            ("grain concat_then_split", "case_grain", {"pack": "concat"}),
            ("grain first_fit 128", "case_grain", {"pack": "first_fit"}),
        ]:
            if name not in skip:
                cases.append(Case(name, f"bench.packing:{target}", {**kw, **extra}, group=g, timeout=1800))
    for v in [int(float(s)) for s in args.index.split(",") if s]:
        ensure_index(v)
        cases.append(Case("megatron GPTDataset index build", "bench.packing:case_megatron_index", {"n": v},
                          group=f"index N={v:.0e}", timeout=1800))
        for mode in ("concat", "best_fit"):
            cases.append(Case(f"seqstore {mode} plan only", "bench.packing:case_plan_virtual",
                              {"n": v, "mode": mode}, group=f"index N={v:.0e}"))
    for v in [int(float(s)) for s in args.real.split(",") if s]:
        ensure_short_store(v)
        for mode in ("concat", "best_fit"):
            cases.append(Case(f"seqstore {mode}, real store", "bench.packing:case_seqstore",
                              {"n": v, "mode": mode, "batches": 20, "short": True}, group=f"real short N={v:.0e}",
                              timeout=1800))
    for v in [int(float(s)) for s in args.virtual.split(",") if s]:
        for mode in ("concat", "best_fit"):
            cases.append(Case(f"seqstore {mode} plan only", "bench.packing:case_plan_virtual",
                              {"n": v, "mode": mode}, group=f"virtual N={v:.0e}"))
    results = run_cases("packing_quick" if args.quick else "packing", cases, baseline="get_batch",
                        repeats=args.repeats)
    print_table(results, sections=["first", "stream"], extras=["tokens_per_s", "padding", "index_bytes", "documents"])


if __name__ == "__main__":
    main()
