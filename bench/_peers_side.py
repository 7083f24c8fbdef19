"""MosaicML Streaming and LitData cases of ``bench/peers.py``, run by the interpreter of ``bench/.venv-peers``.

Both peers pull a CUDA torch and Streaming pins ``numpy<2.2``, so they live in a venv of their own
(:func:`install`): the CPU wheel ``torch==2.13.0`` and ``numpy<2.2`` first, then the few packages
their readers import, then ``mosaicml-streaming`` and ``litdata`` with ``--no-deps`` (so neither
replaces that torch). Streaming's ``streaming/__init__.py`` imports torchvision, whose PyPI wheels are
CUDA builds that fail next to the CPU torch; ``streaming.base`` (the real reader and writer) is
imported under an empty parent package (as ``bench/_remote_streaming.py`` does). LitData imports
torchvision only for its image types, which these cases do not use.

Nothing here imports seqstore. The documents come from the flat files ``bench/peers.py`` writes
(``tokens.npy`` int32, ``offsets.npy`` int64), so every library stores the same tokens. Each case
function is called by ``bench.harness`` in a fresh process of that venv and wraps what it measures in
``section``; the peers' defaults are used (Streaming: ``py1e`` shuffle, LitData: its chunk shuffle),
as a user gets them.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / "bench" / ".venv-peers"
FIRST = ["numpy<2.2", "torch==2.13.0"]
PACKAGES = [
    "boto3", "xxhash<4", "zstd<2", "brotli", "python-snappy<1", "tqdm", "catalogue<3", "transformers<5",
    "pillow", "lightning-utilities", "filelock", "requests", "urllib3>=1.26", "tifffile", "obstore", "psutil",
]
PEERS = ["mosaicml-streaming==0.13.0", "litdata==0.2.76"]
BATCH = 64


def install(log: Any = sys.stderr) -> Path | None:
    """Create ``bench/.venv-peers`` if missing; its Python, or None (with the reason printed)."""
    from bench._remote_streaming import install_venv

    return install_venv(VENV, [FIRST, [*PACKAGES, *FIRST], ["--no-deps", *PEERS]],
                        "from bench._peers_side import _streaming; _streaming(); import litdata", ", ".join(PEERS), log)


def _streaming() -> Any:
    """``streaming.base`` under an empty parent package (``bench/_remote_streaming.py`` says why)."""
    from bench._remote_streaming import _import_streaming

    return _import_streaming()


def _docs(flat: str) -> tuple[Any, Any]:
    import numpy as np

    return np.load(Path(flat) / "tokens.npy", mmap_mode="r"), np.load(Path(flat) / "offsets.npy")


def _pad(samples: list[Any]) -> Any:
    """The pad collate a user writes: the token tensors right-padded with 0, and their lengths."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    seqs = [torch.as_tensor(s["tokens"]) for s in samples]
    return {"tokens": pad_sequence(seqs, batch_first=True), "lengths": torch.tensor([len(s) for s in seqs])}


def _digest(batch: Any) -> int:
    """Order-sensitive digest of a padded batch (for the resume check)."""
    import numpy as np

    t = np.asarray(batch["tokens"], dtype=np.int64)
    return int((t * (np.arange(t.size, dtype=np.int64).reshape(t.shape) % 7919 + 1)).sum() % (1 << 61))


def _import(lib: str) -> Any:
    """The peer's package and torch, imported before a case's sections."""
    import torch  # noqa: F401

    if lib == "streaming":
        return _streaming()
    import litdata

    return litdata


def _dataset(lib: str, out: str, shuffle: bool) -> Any:
    # Streaming keeps a shared-memory registry per local directory; a fresh process may find a stale one
    if lib == "streaming":
        base = _streaming()
        base.util.clean_stale_shared_memory()
        return base.StreamingDataset(local=out, shuffle=shuffle, shuffle_seed=1, batch_size=BATCH)
    import litdata

    return litdata.StreamingDataset(out, shuffle=shuffle, seed=1)


def _loader(lib: str, out: str, workers: int) -> Any:
    ds = _dataset(lib, out, True)
    if lib == "streaming":
        base = _streaming()
        return base.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=_pad)
    import litdata

    return litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=_pad)


# ------------------------------------------------------------------------------------------ cases


def case_write(lib: str, flat: str, out: str) -> dict[str, Any]:
    import shutil

    from bench.harness import section

    tokens, offsets = _docs(flat)
    n = len(offsets) - 1
    shutil.rmtree(out, ignore_errors=True)
    if lib == "streaming":
        base = _streaming()
        with section():
            with base.MDSWriter(out=out, columns={"tokens": "ndarray:int32"}) as w:
                for i in range(n):
                    w.write({"tokens": tokens[offsets[i] : offsets[i + 1]]})
    else:
        import functools

        import litdata

        with section():
            litdata.optimize(fn=functools.partial(_lit_docs, flat=flat), inputs=list(range(0, n, _LIT_CHUNK)),
                             output_dir=out, chunk_bytes="64MB", num_workers=1, verbose=False)
    return {"records": n}


_LIT_CHUNK = 10_000


def _lit_docs(a: int, flat: str) -> Any:
    """The documents ``[a, a + _LIT_CHUNK)``, one dict each (LitData's ``optimize`` pickles this function
    into its worker process)."""
    tokens, offsets = _docs(flat)
    for i in range(a, min(a + _LIT_CHUNK, len(offsets) - 1)):
        yield {"tokens": tokens[offsets[i] : offsets[i + 1]]}


# ------------------------------------------------------------------------------------------ timed loops
# shared by both sides: bench/peers.py calls them with seqstore's datasets and loaders. Rates are taken from
# the timed block itself (``section_time``): the harness's measurement around a block (peak RSS reset and
# read) costs time that grows with the pages a process has mapped, which is not the reader's time


def timed_epoch(make: Callable[[], Any], records: int) -> dict[str, Any]:
    """Construction (``make()``: an iterable of samples) to the first sample, then ``records`` samples."""
    from bench.harness import section, section_time

    with section("first_sample"):
        it = iter(make())
        next(it)
    with section("epoch"):
        k = 1
        for _ in it:
            k += 1
            if k >= records:
                break
    return {"records_per_s": (k - 1) / section_time("epoch")}


def settle() -> None:
    """Wait for what a library still starts in the background after its first batch, so that a walk
    measures the steady state: seqstore's numba warm-up thread, whose end a first batch taken at once
    after the import no longer waits for (the batches in the meantime share the GIL with it)."""
    warm = sys.modules.get("seqstore.torch._warm")
    if warm is not None:
        warm.wait_warmup()


def timed_loader(make: Callable[[], Any], batches: int) -> dict[str, Any]:
    """Construction (``make()``: a loader) to the first batch, then ``batches`` batches."""
    from bench.harness import section, section_time

    with section("first_batch"):
        it = iter(make())
        next(it)
    settle()
    with section("walk"):
        for k, _ in enumerate(it, 1):
            if k >= batches:
                break
    return {"batches_per_s": batches / section_time("walk")}


def timed_random(ds: Any, indices: str, count: int) -> dict[str, Any]:
    """``ds[i]`` for the first ``count`` positions of ``indices`` (one untimed first)."""
    import numpy as np

    from bench.harness import section, section_time

    idx = np.load(indices)[:count].tolist()
    ds[idx[0]]
    with section():
        for i in idx:
            ds[i]
    return {"records_per_s": len(idx) / section_time()}


def prepare_resume(make: Callable[[], Any], state: str, after: int) -> dict[str, Any]:
    """Take ``after`` batches of ``make()``, save its state, and record the digest of the next batch."""
    from bench.harness import section

    with section():
        loader = make()
        it = iter(loader)
        for _ in range(after):
            next(it)
        st = loader.state_dict()
        ref = _digest(next(it))
    Path(state).write_bytes(pickle.dumps({"state": st, "ref": ref}))
    return {}


def timed_resume(make: Callable[[], Any], state: str) -> dict[str, Any]:
    """Construct, load the saved state, first batch; ``exact`` if it is the recorded next batch."""
    from bench.harness import section

    saved = pickle.loads(Path(state).read_bytes())
    with section("first_batch"):
        loader = make()
        loader.load_state_dict(saved["state"])
        batch = next(iter(loader))
    return {"exact": float(_digest(batch) == saved["ref"])}


def case_open(lib: str, out: str) -> dict[str, Any]:
    from bench.harness import section

    _import(lib)
    with section():
        ds = _dataset(lib, out, True)
    return {"records": len(ds)}


def case_epoch(lib: str, out: str, records: int) -> dict[str, Any]:
    """A shuffled epoch, sample by sample."""
    _import(lib)
    return timed_epoch(lambda: _dataset(lib, out, True), records)


def case_loader(lib: str, out: str, workers: int, batches: int) -> dict[str, Any]:
    _import(lib)
    return timed_loader(lambda: _loader(lib, out, workers), batches)


def case_random(lib: str, out: str, indices: str, count: int) -> dict[str, Any]:
    return timed_random(_dataset(lib, out, False), indices, count)


def case_resume_prepare(lib: str, out: str, state: str, after: int) -> dict[str, Any]:
    return prepare_resume(lambda: _loader(lib, out, 0), state, after)


def case_resume(lib: str, out: str, state: str) -> dict[str, Any]:
    """A fresh process: the first batch after loading the saved state."""
    _import(lib)
    return timed_resume(lambda: _loader(lib, out, 0), state)


if __name__ == "__main__":  # python bench/_peers_side.py install
    if sys.argv[1:] == ["install"]:
        print(json.dumps({"python": str(install() or "")}))
    os._exit(0)
