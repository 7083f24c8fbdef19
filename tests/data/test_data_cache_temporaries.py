"""The temporaries a process killed while writing a dataset cache file leaves (``.<name>.tmp-*``, as large as
the file): removed by the next process to write or find that file; a live writer's are left alone."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.data import MetaDataset, StoreDataset
from seqstore.io.nodecache import temporary


def _store(path: Path, n: int, field: str) -> StoreDataset:
    with seqstore.create(path, {field: Field("int64", (None,))}) as w:
        w.append_batch({field: (np.arange(2 * n, dtype=np.int64), np.full(n, 2))}, ids=[f"u-{i}" for i in range(n)])
    return StoreDataset(path)


def _killed_writers_left(cache: Path) -> list[str]:
    """A dead writer's temporary beside each cache file (a file nobody holds locked, as a process killed by
    SIGKILL leaves it): their names."""
    dead = []
    for f in list(cache.iterdir()):
        dead.append(f".{f.name}.tmp-dead")
        (cache / dead[-1]).write_bytes(b"\0" * 4096)
    return dead


@pytest.mark.parametrize("found", [True, False], ids=["found-whole", "written-again"])
def test_a_join_removes_the_temporaries_of_joins_killed_part_way(tmp_path: Path, found: bool) -> None:
    """MetaDataset's row maps and sidecar: a join killed part way left its temporaries for ever, whether
    the next join wrote the files again or found them written by another process."""
    a, b = _store(tmp_path / "a.seqstore", 30, "x"), _store(tmp_path / "b.seqstore", 20, "y")
    cache = tmp_path / "cache"
    MetaDataset({"a": a, "b": b}, missing="drop", cache_dir=cache)
    made = sorted(p.name for p in cache.iterdir())
    assert len(made) == 3  # the row map, the kept rows, the sidecar
    _killed_writers_left(cache)
    if not found:
        for name in made:
            (cache / name).unlink()
    fd, live = temporary(cache / made[0])  # a live join's, under way
    try:
        again = MetaDataset({"a": a, "b": b}, missing="drop", cache_dir=cache)
        assert again.num_seqs == 20
        assert sorted(p.name for p in cache.iterdir()) == sorted([*made, Path(live).name])
    finally:
        os.close(fd)
        os.unlink(live)


@pytest.mark.parametrize("found", [True, False], ids=["found-whole", "written-again"])
def test_a_lengths_cache_removes_the_temporaries_of_writers_killed_part_way(tmp_path: Path, found: bool) -> None:
    """A dataset's cached lengths (and any ``write_npy`` file): the same."""
    cache = tmp_path / "cache"
    ds = StoreDataset(_store(tmp_path / "a.seqstore", 30, "x").store, cache_dir=cache)
    want = np.asarray(ds.lengths_array())
    made = sorted(p.name for p in cache.iterdir())
    _killed_writers_left(cache)
    if not found:
        for name in made:
            (cache / name).unlink()
    again = StoreDataset(ds.store, cache_dir=cache)
    np.testing.assert_array_equal(again.lengths_array(), want)
    assert sorted(p.name for p in cache.iterdir()) == made
