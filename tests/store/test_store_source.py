"""A third kind of byte source plugs into the Store: one ByteSource subclass, nothing else.

:class:`MemorySource` serves a store whose data files live in memory (bytes read once from a local
store); only the metadata (manifest, shard table, descriptors) is in a local directory, so a read
that went to the files instead of the source would fail. Records, batches, ids and matrices read
through it equal those of the local store.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore as ss
from seqstore.errors import CorruptionError
from seqstore.format.manifest import FileInfo, Manifest
from seqstore.format.npy import parse_header
from seqstore.io.source import ByteSource, ReadPolicy
from seqstore.store.reader import Store

SCHEMA = {
    "x": ss.Field("float32", (8,)),
    "tok": ss.Field("int32", (None,)),
    "label": ss.Field("int64"),
}


class MemorySource(ByteSource):
    """The store at ``path`` with every ``.npy`` file held in memory; ``meta`` gets the rest (the files a
    manifest load reads). Counts what the store asks of it."""

    def __init__(self, path: Path, meta: Path) -> None:
        self.files = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*.npy")}
        shutil.copytree(path, meta, ignore=shutil.ignore_patterns("*.npy"))
        self.root = meta
        self.mapped: list[str] = []
        self.requested = 0

    @property
    def url(self) -> str:
        return f"memory:{self.root.name}"

    def load(self) -> Manifest:
        return Manifest.load(self.root)

    def map_npy(
        self, path: Path, info: FileInfo | None, dtype: np.dtype[Any], shape: tuple[int, ...], *,
        sequential: bool = False,
    ) -> np.ndarray[Any, Any]:
        rel = path.relative_to(self.root).as_posix()
        data = self.files.get(rel)
        if data is None:
            raise CorruptionError(f"{self.url}/{rel}: not in memory")
        header = parse_header(data[:4096], f"{self.url}/{rel}")
        assert header.dtype == dtype and header.shape == shape, (rel, header)
        assert info is None or info.bytes == len(data)
        self.mapped.append(rel)
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(data, dtype=dtype, count=count, offset=header.data_offset).reshape(shape)

    def policy(self, readahead: str) -> ReadPolicy:
        return ReadPolicy(ahead=readahead != "never", probe=False)

    def reopen(self) -> tuple[Any, dict[str, Any]]:
        return self, {}  # the source pickles itself, bytes and all

    def request(self, starts: Any, ends: Any, *, most: int) -> None:
        self.requested += len(starts)

    def request_span(self, start: int, stop: int, *, most: int) -> None:
        self.requested += 1


@pytest.fixture
def stores(tmp_path: Path) -> tuple[Store, Store, MemorySource]:
    rng = np.random.default_rng(3)
    n = 250
    lengths = rng.integers(0, 9, n)
    tok = rng.integers(-1000, 1000, int(lengths.sum())).astype(np.int32)
    with ss.create(tmp_path / "s", SCHEMA, max_shard_records=60) as w:
        w.append_batch(
            {"x": rng.standard_normal((n, 8), dtype=np.float32), "tok": (tok, lengths), "label": np.arange(n) * 3},
            ids=[f"r{i:04d}" for i in range(n)],
        )
    source = MemorySource(tmp_path / "s", tmp_path / "meta")
    return ss.open(tmp_path / "s"), Store(source), source


def test_a_store_reads_through_an_in_memory_source(stores: tuple[Store, Store, MemorySource]) -> None:
    local, mem, source = stores
    assert not list(mem.root.rglob("*.npy"))  # the data is only in memory
    assert len(mem) == len(local) == 250 and mem.num_shards == local.num_shards == 5
    assert mem.url == source.url and not mem.is_remote and mem.source is source
    for i in (0, 59, 60, 249, -1):
        got, want = mem[i], local[i]
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    idx = np.random.default_rng(0).permutation(250)[:90]
    for pad in (False, True):
        got_b, want_b = mem.get_batch(idx, pad=pad), local.get_batch(idx, pad=pad)
        np.testing.assert_array_equal(got_b["x"], want_b["x"])
        np.testing.assert_array_equal(got_b["label"], want_b["label"])
        np.testing.assert_array_equal(got_b["tok"][0], want_b["tok"][0])
        np.testing.assert_array_equal(got_b["tok"][1], want_b["tok"][1])
    assert source.requested > 0  # read-ahead went to the source
    np.testing.assert_array_equal(mem.matrix("x"), local.matrix("x"))
    np.testing.assert_array_equal(np.asarray(mem.lengths()), np.asarray(local.lengths()))
    assert mem.id(137) == "r0137" and mem.index("r0201") == 201
    np.testing.assert_array_equal(mem.index_many(["r0003", "r0190"]), [3, 190])
    assert any(rel.endswith("x.npy") for rel in source.mapped)


def test_a_store_on_a_source_pickles_through_it(stores: tuple[Store, Store, MemorySource]) -> None:
    local, mem, source = stores
    back = pickle.loads(pickle.dumps(mem))
    assert isinstance(back.source, MemorySource) and back.source is not source
    np.testing.assert_array_equal(back.get_batch([5, 200])["label"], local.get_batch([5, 200])["label"])


def test_the_source_names_what_is_missing(stores: tuple[Store, Store, MemorySource]) -> None:
    _, mem, source = stores
    del source.files[next(rel for rel in source.files if rel.endswith("label.npy") and "000004" in rel)]
    with pytest.raises(CorruptionError, match="memory:meta/.*label.npy: not in memory"):
        mem[249]
    with pytest.raises(ValueError, match="takes no storage_options"):
        Store(source, storage_options={"region": "x"})


def test_the_library_refuses_a_chained_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``seqstore.create("simplecache::s3://b/x", ...)`` wrote a local directory ``simplecache::s3:/b/x`` (only
    the CLI, importers and engines refused chained URLs); ``open`` and ``copy`` said 'no such store' for a
    local path the user never gave. Each is a ConfigError naming the URL; nothing is written."""
    from seqstore.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    ss.create("s", {"x": ss.Field("int32", shape=())}).close()
    with pytest.raises(ConfigError, match=r"^simplecache::s3://b/x: a chained URL"):
        ss.create("simplecache::s3://b/x", {"x": ss.Field("int32", shape=())})
    with pytest.raises(ConfigError, match=r"^blockcache::file:///w: a chained URL"):
        ss.open("blockcache::file:///w")
    with pytest.raises(ConfigError, match=r"^filecache::s3://b/c: a chained URL"):
        ss.copy("s", "filecache::s3://b/c")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
    ss.create("run::1", {"x": ss.Field("int32", shape=())}).close()
    assert len(ss.open("run::1")) == 0
