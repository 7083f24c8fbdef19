"""What runs on a node of the test cluster (tests/support/cluster.py); one JSON config as the argument.

Roles (``config["role"]``):

- ``train``: one rank of a torch.distributed (gloo) job over the hosts' addresses. An epoch of a
  :class:`~seqstore.data.CombinedDataset` of two ``s3://`` stores (``random_block`` and ``laplace``
  child orders) through :class:`~seqstore.torch.IterableSeqDataset` and :class:`~seqstore.torch.SeqDataLoader`
  with ``workers`` DataLoader workers, read through the node's cache. Every ``ckpt_every`` steps each rank
  saves the record ids it consumed so far (``rank<r>-ep<e>-step<s>.npz``), then rank 0 saves the loader
  state (``ckpt``, with the step); at the end ``rank<r>-ep<e>-final.npz``. ``resume``: start from ``ckpt``.
  Epochs ``epoch`` to ``last_epoch``; after each, the bytes the node's cache holds on disk go to
  ``cache-<cache dir name>-ep<e>.txt``.
- ``read``: one process reading its share (``node`` of ``nodes``) of a ``random_block`` epoch of one store
  in batches with ``get_batch``; after each batch the ids read so far go to ``out/ids.npz`` (so a test sees
  progress and what was consumed). It writes ``opened`` once the store is open, and sleeps
  ``after_open`` s before the first read. An exception ends it with status 3 and ``error.txt``.
- ``write``: a writer appending batches of records to an existing ``s3://`` store, committing after each;
  each committed batch's number is appended to ``committed.txt`` (after the commit returned). It stops
  after ``batches`` batches, or before the next one once ``stop_file`` exists.
  ``pause_at``: the commit of that batch stops for a minute just before (``pause_where="before"``) or
  after (``"after"``) its write of ``manifest.json``, with a file ``paused`` written, for a test to kill
  the node mid-commit.

Every record carries its identity in the data: ``rid`` (int64) and ``x`` (float32 rows whose column 0
is ``rid``), checked here for every record consumed, so a test counts records from the records.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np


def _check(batch: dict[str, Any]) -> np.ndarray:
    """The ids of a batch, after checking each record's rows carry its id (a torn or wrong read fails)."""
    rid = np.asarray(batch["rid"]).astype(np.int64)
    if isinstance(batch["x"], tuple):  # get_batch(pad=True): (padded values, lengths)
        x, lens = (np.asarray(v) for v in batch["x"])
    else:  # a torch batch: padded values and "x_lengths"
        x, lens = np.asarray(batch["x"]), np.asarray(batch["x_lengths"])
    for k in range(len(rid)):
        rows = x[k][: int(lens[k])]
        if len(rows) == 0 or not (rows[:, 0] == rid[k]).all():
            raise AssertionError(f"record {rid[k]}: rows {rows[:, 0][:5]} do not carry its id")
    return rid


def _save(path: Path, batches: list[np.ndarray]) -> None:
    """The ids of ``batches`` (``ids``, concatenated) and their sizes (``sizes``) as ``path`` (.npz),
    written whole or not at all."""
    tmp = path.with_name(path.name + ".tmp.npz")
    ids = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    np.savez(tmp, ids=ids, sizes=np.array([len(b) for b in batches], np.int64))
    os.replace(tmp, path)


def train(cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    import seqstore
    from seqstore.data import CombinedDataset, StoreDataset
    from seqstore.torch import IterableSeqDataset, LengthBatching, SeqDataLoader

    rank, world = cfg["rank"], cfg["world"]
    from datetime import timedelta

    dist.init_process_group("gloo", init_method=f"tcp://{cfg['master']}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg.get("gloo_timeout", 60)))
    out = Path(cfg["out"])
    opts, cache = cfg["storage_options"], cfg["cache"]
    children = {}
    for name, ordering in (("a", "random_block:16:4"), ("b", "laplace:.64")):
        store = seqstore.open(cfg["urls"][name], storage_options=opts, cache_dir=cache)
        children[name] = StoreDataset(store, ordering=ordering, seed=11, length_field="x",
                                      cache_dir=Path(cache) / "derived" / name)
    ds = CombinedDataset(children, ordering="random", seed=5)
    it = IterableSeqDataset(ds, batch=LengthBatching(max_frames=cfg.get("max_frames", 400)))
    loader = SeqDataLoader(it, batch_size=None, num_workers=cfg["workers"])
    step = 0
    epoch = cfg.get("epoch", 1)
    if cfg.get("resume"):
        ck = torch.load(Path(cfg["ckpt"]), weights_only=False)
        loader.load_state_dict(ck["data"])
        epoch = ck["data"]["epoch"]
    for e in range(epoch, cfg.get("last_epoch", epoch) + 1):
        step = _epoch(cfg, loader, e, step, dist, torch)
        dist.barrier()
        if rank % 2 == 0:  # one process per node: what the node's cache holds after this epoch
            (out / f"cache-{Path(cache).name}-ep{e}.txt").write_text(str(_disk_bytes(Path(cache))))
        dist.barrier()
    dist.destroy_process_group()


def _disk_bytes(path: Path) -> int:
    """Bytes a cache holds on disk: its entries are sparse files of the pages fetched so far."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


def _epoch(cfg: dict[str, Any], loader: Any, epoch: int, step: int, dist: Any, torch: Any) -> int:
    """One epoch (or the rest of one, after a resume) of ``loader``; returns the step count."""
    rank, out, ckpt = cfg["rank"], Path(cfg["out"]), Path(cfg["ckpt"])
    loader.set_epoch(epoch)
    seen: list[np.ndarray] = []
    tag = f"rank{rank}-ep{epoch}" + ("-resumed" if cfg.get("resume") else "")
    for batch in loader:
        seen.append(_check(batch))
        step += 1
        time.sleep(cfg.get("step_sleep", 0.0))
        if cfg.get("ckpt_every") and step % cfg["ckpt_every"] == 0:
            state = loader.state_dict()
            _save(out / f"{tag}-step{step}.npz", seen)
            dist.barrier()
            if rank == 0:
                tmp = ckpt.with_name(ckpt.name + ".tmp")
                torch.save({"data": state, "step": step}, tmp)
                os.replace(tmp, ckpt)
            dist.barrier()
    _save(out / f"{tag}-final.npz", seen)
    return step


def read(cfg: dict[str, Any]) -> None:
    import seqstore
    from seqstore.order import seq_order

    out = Path(cfg["out"])
    store = seqstore.open(cfg["url"], storage_options=cfg["storage_options"], cache_dir=cfg["cache"])
    (out / "opened").write_text(str(time.time()))
    time.sleep(cfg.get("after_open", 0.0))
    order = np.asarray(seq_order(len(store), "random_block:16:4", epoch=1, seed=3))
    mine = order[cfg["node"]:: cfg["nodes"]]
    seen: list[np.ndarray] = []
    size = cfg.get("batch", 32)
    for a in range(0, len(mine), size):
        batch = store.get_batch(mine[a: a + size], pad=True)
        seen.append(_check(batch))
        _save(out / "ids.npz", seen)
        time.sleep(cfg.get("step_sleep", 0.0))
    (out / "done").write_text(str(time.time()))


def write(cfg: dict[str, Any]) -> None:
    import seqstore

    node, per = cfg["node"], cfg.get("per_batch", 20)
    log = Path(cfg["out"]) / "committed.txt"
    if cfg.get("pause_at") is not None:
        _pause_in_commit(cfg["pause_at"], cfg.get("pause_where", "before"), Path(cfg["out"]) / "paused")
    w = seqstore.append_to(cfg["url"], storage_options=cfg["storage_options"])
    stop = Path(cfg["stop_file"]) if cfg.get("stop_file") else None
    for k in range(cfg["batches"]):
        if stop is not None and stop.exists():
            break
        rid = (node * 1_000_000 + k * 1000 + np.arange(per)).astype(np.int64)
        lens = np.full(per, 2)
        x = np.repeat(rid, lens).astype(np.float32)[:, None].repeat(2, 1)
        w.append_batch({"rid": rid, "x": (x, lens)}, ids=[str(r) for r in rid])
        _BATCH[0] = k
        w.commit()
        with open(log, "a") as f:
            f.write(f"{k}\n")
            f.flush()
            os.fsync(f.fileno())
    w.close()


_BATCH = [-1]  # the batch the writer is committing


def _pause_in_commit(batch: int, where: str, marker: Path) -> None:
    """Make the commit of batch ``batch`` (0-based) stop for a minute just ``before`` or ``after`` its
    conditional write of ``manifest.json`` (the commit point), with ``marker`` written: the test kills
    the node there, mid-commit."""
    from seqstore.io.objects import ObjectClient

    real = ObjectClient.put

    def put(self: ObjectClient, key: str, data: Any, *, mode: Any = "overwrite") -> str:
        if key != "manifest.json" or not isinstance(mode, dict):
            return real(self, key, data, mode=mode)
        if _BATCH[0] == batch and where == "before":
            marker.write_text("before")
            time.sleep(60)
        tag = real(self, key, data, mode=mode)  # a refused write (another writer was first) raises here
        if _BATCH[0] == batch and where == "after":
            marker.write_text("after")
            time.sleep(60)
        return tag

    ObjectClient.put = put  # type: ignore[method-assign]


def main() -> int:
    cfg = json.loads(sys.argv[1])
    out = Path(cfg["out"])
    out.mkdir(parents=True, exist_ok=True)
    try:
        {"train": train, "read": read, "write": write}[cfg["role"]](cfg)
    except BaseException as exc:
        (out / "error.txt").write_text(f"{time.time()}\n{type(exc).__name__}\n{exc}\n{traceback.format_exc()}")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
