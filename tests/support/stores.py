"""Small local stores for the remote-store tests, and a digest of everything a store returns.

The stores are written with seqstore's local writer (not the code under test of the remote tests:
those read the store back from object storage and compare with the local one, value for value).
Objects stay small (moto copies the whole object for every range request).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

N = 400
SHARD_RECORDS = 128  # 4 shards: 128, 128, 128, 16 records


def schema() -> dict[str, Any]:
    import seqstore as ss

    return {
        "x": ss.Field("float32", (None, 3)),  # ragged 2-D
        "tok": ss.Field("int32", (None,)),  # ragged 1-D
        "spk": ss.Field("int64"),  # fixed scalar
        "emb": ss.Field("bfloat16", (4,)),  # fixed bfloat16
        "g": {"a": ss.Field("float16", (2,)), "b": ss.Field("float16", (3,))},  # packed as "pk"
    }


PACKED = {"pk": ["g/a", "g/b"]}


def ids_of(n: int) -> list[str]:
    return [f"utt-{i:05d}" for i in range(n)]


def build_store(path: str | os.PathLike[str], *, n: int = N, seed: int = 0, values_seed: int | None = None,
                max_rows: int = 6, shard_records: int = SHARD_RECORDS) -> Path:
    """Write a store of ``n`` records with every kind of field and ids. The lengths (so every file's
    size) depend on ``seed`` only; the values on ``values_seed`` (default ``seed``): two stores with one
    ``seed`` and different ``values_seed`` have the same files, byte sizes and ids, and other bytes."""
    import seqstore as ss

    lens_rng = np.random.default_rng(seed)
    rng = np.random.default_rng(seed if values_seed is None else 1000 + values_seed)
    x_len = lens_rng.integers(0, max_rows + 1, size=n)
    tok_len = lens_rng.integers(0, max_rows + 1, size=n)
    ids = ids_of(n)
    with ss.create(path, schema(), packed=PACKED, max_shard_records=shard_records,
                   metadata={"name": "remote-test", "seed": seed}) as w:
        for a in range(0, n, 50):
            b = min(n, a + 50)
            w.append_batch(
                {
                    "x": [(rng.standard_normal((int(k), 3)) * 100).astype(np.float32) for k in x_len[a:b]],
                    "tok": [rng.integers(-(2**31), 2**31 - 1, size=int(k), dtype=np.int32) for k in tok_len[a:b]],
                    "spk": rng.integers(-(2**62), 2**62, size=b - a, dtype=np.int64),
                    "emb": (rng.standard_normal((b - a, 4)) * 10).astype(np.float32),
                    "g/a": rng.standard_normal((b - a, 2)).astype(np.float16),
                    "g/b": rng.standard_normal((b - a, 3)).astype(np.float16),
                },
                ids=ids[a:b],
            )
    return Path(path)


def digest(store: Any, batch: int = 97) -> str:
    """sha256 of every value, length and id of ``store`` (read with ``get_batch`` in batches)."""
    h = hashlib.sha256()
    n = len(store)
    h.update(str((n, list(store.schema))).encode())
    for a in range(0, n, batch):
        idx = np.arange(a, min(n, a + batch))
        out = store.get_batch(idx)
        for name in store.schema:
            v = out[name]
            for arr in (v if isinstance(v, tuple) else (v,)):
                arr = np.ascontiguousarray(arr)
                h.update(str((name, arr.dtype.str, arr.shape)).encode())
                h.update(arr.tobytes())
        if store.has_ids:
            h.update("\0".join(store.id(int(i)) for i in idx).encode())
    return h.hexdigest()


# ----------------------------------------------------------------------------------- comparisons


def same(got: Any, want: Any, what: str) -> None:
    """Same dtype, shape and bytes (NaN payloads and -0.0 included)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.tobytes() == want.tobytes(), f"{what}: values differ"


def same_batch(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    assert list(got) == list(want), f"{what}: fields {list(got)} != {list(want)}"
    for name in want:
        g, w = got[name], want[name]
        if isinstance(w, tuple):
            assert isinstance(g, tuple) and len(g) == len(w), f"{what} {name}: {type(g)}"
            for k, (a, b) in enumerate(zip(g, w)):
                same(a, b, f"{what} {name}[{k}]")
        else:
            same(g, w, f"{what} {name}")


def assert_same_reads(remote: Any, local: Any, seed: int = 0) -> None:
    """Every read API of ``remote`` returns what ``local`` returns, value for value."""
    rng = np.random.default_rng(seed)
    n = len(local)
    assert len(remote) == n and remote.num_shards == local.num_shards
    assert list(remote.schema) == list(local.schema)
    assert remote.has_ids == local.has_ids and remote.metadata == local.metadata
    assert list(remote.groups) == list(local.groups)
    assert remote.matrix_columns("pk") == local.matrix_columns("pk")
    # store[i], negative indices, nested, out of range
    for i in list(range(n)) + [-1, -n]:
        same_batch(remote[i], local[i], f"store[{i}]")
    nested_r, nested_l = remote.nested(n // 2), local.nested(n // 2)
    assert nested_r.keys() == nested_l.keys()
    same(nested_r["g"]["b"], nested_l["g"]["b"], "nested g/b")
    for bad in (n, -n - 1):
        try:
            remote[bad]
        except IndexError:
            pass
        else:
            raise AssertionError(f"store[{bad}] of {n} records did not raise IndexError")
    # iteration
    count = 0
    for i, rec in enumerate(remote):
        same_batch(rec, local[i], f"iter(store) record {i}")
        count += 1
    assert count == n
    # get_batch: random with repeats and negatives, everything, nothing, one shard's tail, subsets
    batches = [rng.integers(-n, n, size=77), np.arange(n), np.array([], dtype=np.int64),
               np.arange(n - 5, n), np.array([3, 3, 3])]
    for idx in batches:
        for pad in (False, True):
            same_batch(remote.get_batch(idx, pad=pad), local.get_batch(idx, pad=pad), f"get_batch pad={pad}")
    for fields in (["x"], ["tok", "spk"], ["g/b", "emb"]):
        idx = rng.integers(0, n, size=20)
        same_batch(remote.get_batch(idx, fields=fields, pad=True), local.get_batch(idx, fields=fields, pad=True),
                   f"get_batch fields={fields}")
    # iter_batches over an epoch order, with read-ahead
    import seqstore as ss

    order = ss.seq_order(n, "random", epoch=2, seed=3)
    chunks = list(order.iter_chunks(33))
    got = list(remote.iter_batches(iter(chunks), pad=True, prefetch=2))
    assert len(got) == len(chunks)
    for k, (g, c) in enumerate(zip(got, chunks)):
        same_batch(g, local.get_batch(c, pad=True), f"iter_batches batch {k}")
    # lengths
    for field in ("x", "tok"):
        lr, ll = remote.lengths(field), local.lengths(field)
        assert len(lr) == len(ll) == n
        same(np.asarray(lr), np.asarray(ll), f"lengths({field})")
        same(lr[5:300:7], ll[5:300:7], f"lengths({field})[5:300:7]")
        pick = rng.integers(-n, n, size=30)
        same(lr[pick], ll[pick], f"lengths({field})[array]")
        same(lr.take(pick), ll.take(pick), f"lengths({field}).take")
        assert lr[-1] == ll[-1] and lr[0] == ll[0]
        same(np.concatenate(list(lr.iter_chunks(size=50))), np.asarray(ll), f"lengths({field}).iter_chunks")
    # ids
    ids = [local.id(i) for i in range(n)]
    assert [remote.id(i) for i in range(n)] == ids
    assert remote.id(-1) == ids[-1]
    for i in rng.integers(0, n, size=25).tolist():
        assert remote.index(ids[i]) == i
    same(remote.index_many(ids), local.index_many(ids), "index_many")
    try:
        remote.index("no-such-id")
    except KeyError as exc:
        assert "no-such-id" in str(exc)
    else:
        raise AssertionError("index of a missing id did not raise KeyError")
    same(remote.index_many(["no-such-id", ids[7]], missing=-1), np.array([-1, 7], dtype=np.int64), "index_many missing")
    # matrix / iter_matrix / iter_ragged
    for fields in ("pk", ["g/a", "g/b"], ["g/b"], ["spk"], "emb"):
        same(remote.matrix(fields), local.matrix(fields), f"matrix({fields})")
    same(remote.matrix("emb", dtype="float32"), local.matrix("emb", dtype="float32"), "matrix(emb, float32)")
    rows = rng.integers(0, n, size=40)
    same(remote.matrix("pk", rows=rows), local.matrix("pk", rows=rows), "matrix(pk, rows=array)")
    same(remote.matrix("pk", rows=slice(100, 140)), local.matrix("pk", rows=slice(100, 140)), "matrix(pk, rows=slice)")
    got_m = list(remote.iter_matrix("pk", chunk_rows=50, start=10, stop=n - 3))
    want_m = list(local.iter_matrix("pk", chunk_rows=50, start=10, stop=n - 3))
    assert [a for a, _ in got_m] == [a for a, _ in want_m]
    for (a, g), (_, w) in zip(got_m, want_m):
        same(g, w, f"iter_matrix block at {a}")
    for field in ("x", "tok"):
        got_r = list(remote.iter_ragged(field, chunk_records=37))
        want_r = list(local.iter_ragged(field, chunk_records=37))
        assert [a for a, _, _ in got_r] == [a for a, _, _ in want_r]
        for (a, gv, gl), (_, wv, wl) in zip(got_r, want_r):
            same(gv, wv, f"iter_ragged({field}) values at {a}")
            same(gl, wl, f"iter_ragged({field}) lengths at {a}")


def same_stores(a: Any, b: Any) -> None:
    """Two stores hold the same records, values (dtype, shape and bytes) and ids, in the same order."""
    assert len(a) == len(b) and list(a.schema) == list(b.schema)
    ga, gb = a.get_batch(np.arange(len(a))), b.get_batch(np.arange(len(b)))
    for name in gb:
        for x, y in zip(ga[name] if isinstance(ga[name], tuple) else (ga[name],),
                        gb[name] if isinstance(gb[name], tuple) else (gb[name],)):
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
    assert [a.id(i) for i in range(len(a))] == [b.id(i) for i in range(len(b))]


def store_files(root: Path) -> dict[str, bytes]:
    """Every file of a local store by relative path (its commit lock and writers' scratch directory aside)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock" and not p.relative_to(root).as_posix().startswith("_tmp/")}


def tensors_equal(a: Any, b: Any, what: str) -> None:
    """Two batches of torch tensors (dicts) have the same keys, dtypes, shapes and bytes."""
    import torch

    assert set(a) == set(b), what
    for k in a:
        x, y = a[k], b[k]
        assert x.dtype == y.dtype and x.shape == y.shape, f"{what} {k}: {x.dtype} {x.shape} vs {y.dtype} {y.shape}"
        if x.dtype == torch.bfloat16:
            x, y = x.view(torch.int16), y.view(torch.int16)
        assert x.numpy().tobytes() == y.numpy().tobytes(), f"{what} {k} differs"
