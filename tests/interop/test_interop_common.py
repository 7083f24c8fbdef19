"""new_store: the all-or-nothing write shared by the importers (temporary sibling, rename into place)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore
from seqstore import Field
from seqstore.interop import _common

SCHEMA = {"x": Field("int32", (None,))}


def _fill(n: int, fail_after: int | None = None) -> Any:
    def fill(w: seqstore.Writer) -> None:
        for i in range(n):
            w.append({"x": np.full(3, i, np.int32)}, id=f"new-{i}")
            w.commit()  # committed shards: aborting alone would leave them
            if fail_after is not None and i + 1 == fail_after:
                raise RuntimeError("simulated failure while filling")

    return fill


def _old(path: Path) -> None:
    with seqstore.create(path, SCHEMA) as w:
        w.append({"x": np.zeros(2, np.int32)}, id="old-0")


def test_failure_keeps_the_old_store_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "s.seqstore"
    _old(out)
    with pytest.raises(RuntimeError, match="simulated"):
        _common.new_store(out, SCHEMA, _fill(5, fail_after=3), overwrite=True, shard_bytes=8)
    store = seqstore.open(out)
    assert len(store) == 1 and store.id(0) == "old-0"
    assert os.listdir(tmp_path) == ["s.seqstore"]
    with pytest.raises(RuntimeError, match="simulated"):  # no existing store: nothing appears
        _common.new_store(tmp_path / "t.seqstore", SCHEMA, _fill(5, fail_after=1))
    assert os.listdir(tmp_path) == ["s.seqstore"]


def test_success_replaces_and_builds_in_a_temporary_sibling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "s.seqstore"
    _old(out)
    seen: list[tuple[Path, dict[str, Any]]] = []
    real = _common.create

    def spy(path: Any, schema: Any, **kw: Any) -> seqstore.Writer:
        seen.append((Path(path), kw))
        return real(path, schema, **kw)

    monkeypatch.setattr(_common, "create", spy)
    _common.new_store(out, SCHEMA, _fill(4), overwrite=True, metadata={"k": 1})
    (path, kw), = seen
    assert path.parent == tmp_path and path.name.startswith(".s.seqstore.tmp-") and not kw.get("overwrite")
    store = seqstore.open(out)
    assert [store.id(i) for i in range(len(store))] == [f"new-{i}" for i in range(4)]
    assert store.metadata["k"] == 1
    assert os.listdir(tmp_path) == ["s.seqstore"]
    _common.new_store(tmp_path / "sub" / "fresh.seqstore", SCHEMA, _fill(1))  # parents are created
    assert len(seqstore.open(tmp_path / "sub" / "fresh.seqstore")) == 1


def test_a_store_made_at_the_path_while_building_is_never_replaced(tmp_path: Path) -> None:
    """Without overwrite, out was checked only before the (possibly hours long) build: a store another
    process created at out meanwhile was renamed aside and deleted when the new one was installed. It is
    kept, the build is refused with OutputExistsError, and nothing of the build remains."""
    import subprocess
    import sys

    out = tmp_path / "s.seqstore"
    src = Path(seqstore.__file__).resolve().parents[1]
    other = (f"import seqstore as ss, numpy as np\nwith ss.create({str(out)!r}, {{'x': ss.Field('int32', (None,))}})"
             " as w:\n    w.append({'x': np.zeros(2, np.int32)}, id='theirs')")

    def fill(w: seqstore.Writer) -> None:
        _fill(2)(w)
        subprocess.run([sys.executable, "-c", other], check=True, env={**os.environ, "PYTHONPATH": str(src)})

    with pytest.raises(_common.OutputExistsError, match=str(out)):
        _common.new_store(out, SCHEMA, fill)
    store = seqstore.open(out)
    assert len(store) == 1 and store.id(0) == "theirs"
    assert os.listdir(tmp_path) == ["s.seqstore"]


def test_refusals_happen_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "s.seqstore"
    _old(out)
    called: list[int] = []

    def fill(w: seqstore.Writer) -> None:
        called.append(1)

    with pytest.raises(FileExistsError, match="overwrite=True"):
        _common.new_store(out, SCHEMA, fill)
    other = tmp_path / "data"
    other.mkdir()
    (other / "precious.txt").write_text("x")
    with pytest.raises(seqstore.SeqstoreError, match="not a store"):
        _common.new_store(other, SCHEMA, fill, overwrite=True)
    assert not called and (other / "precious.txt").exists()
    assert sorted(os.listdir(tmp_path)) == ["data", "s.seqstore"]


def test_overwrite_never_replaces_a_file(tmp_path: Path) -> None:
    """``overwrite=True`` replaces a store, never a file: a source file named as the output by mistake
    (``convert --from parquet a.parquet b.parquet --overwrite``, OUT forgotten) is refused and kept."""
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    from seqstore.interop.arrow import import_parquet

    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": [4, 5]}), tmp_path / "b.parquet")
    kept = (tmp_path / "b.parquet").read_bytes()
    for workers in (1, 2):
        with pytest.raises(seqstore.SeqstoreError, match="refusing to overwrite.*not a store"):
            import_parquet(tmp_path / "a.parquet", tmp_path / "b.parquet", overwrite=True, workers=workers)
        assert (tmp_path / "b.parquet").read_bytes() == kept
    with pytest.raises(seqstore.SeqstoreError, match="not a store"):
        _common.new_store(tmp_path / "b.parquet", SCHEMA, _fill(1), overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet"]


def test_failed_rename_into_place_restores_the_old_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "s.seqstore"
    _old(out)
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(src).name.startswith(".s.seqstore.tmp-"):
            raise OSError("simulated rename failure")
        real(src, dst)

    monkeypatch.setattr(_common.os, "replace", replace)
    with pytest.raises(OSError, match="simulated rename"):
        _common.new_store(out, SCHEMA, _fill(2), overwrite=True)
    monkeypatch.setattr(_common.os, "replace", real)
    store = seqstore.open(out)
    assert len(store) == 1 and store.id(0) == "old-0"
    assert os.listdir(tmp_path) == ["s.seqstore"]


def test_exporters_take_one_field_as_a_string(tmp_path: Path) -> None:
    """``fields="data"`` is the field ``data`` in every exporter and engine schema, not the fields d, a, t, a."""
    from interop_testlib import make_store

    from seqstore.engines.spark_types import spark_schema
    from seqstore.interop.hf_export import export_hf
    from seqstore.interop.webdataset import export_webdataset

    make_store(tmp_path / "s.seqstore", n=5)
    store = seqstore.open(tmp_path / "s.seqstore")
    assert [f.name for f in spark_schema(store, fields="speaker").fields] == ["speaker"]
    export_hf(store, tmp_path / "hf", fields="speaker")
    import datasets

    assert datasets.load_from_disk(str(tmp_path / "hf")).column_names == ["id", "speaker"]  # (the ids too)
    export_webdataset(store, tmp_path / "wds", fields="speaker")
    import tarfile

    names = [m.name for t in sorted((tmp_path / "wds").glob("*.tar")) for m in tarfile.open(t).getmembers()]
    assert names and all(n.endswith(".speaker.npy") or ".speaker." in n for n in names), names[:4]


@pytest.mark.parametrize("name", ["export_hdf", "export_megatron", "export_hf", "export_webdataset"])
def test_an_exporter_given_a_url_refuses_it(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exporter called with an object-store URL as its output wrote a local directory named 's3:' (only
    the command line refused it); every exporter now refuses it, naming the URL, before writing."""
    import importlib

    module = {"export_hdf": "returnn", "export_megatron": "megatron", "export_hf": "hf_export",
              "export_webdataset": "webdataset"}[name]
    export = getattr(importlib.import_module(f"seqstore.interop.{module}"), name)
    with seqstore.create(tmp_path / "s", SCHEMA) as w:
        w.append({"x": np.arange(3, dtype=np.int32)}, id="a")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(seqstore.errors.SeqstoreError, match=f"{name}: s3://b/out is a URL; .* local files only"):
        export(tmp_path / "s", "s3://b/out")
    assert sorted(os.listdir(tmp_path)) == ["s"]



_SIZES = [("export_hdf", "returnn", "chunk_bytes"), ("export_megatron", "megatron", "chunk_bytes"),
          ("export_hf", "hf_export", "chunk_records"), ("export_webdataset", "webdataset", "chunk_records"),
          ("export_webdataset", "webdataset", "shard_records"), ("export_webdataset", "webdataset", "shard_bytes")]


@pytest.mark.parametrize("value", [0, -4, 1.5, "8", True, None])
@pytest.mark.parametrize(("name", "module", "keyword"), _SIZES)
def test_an_exporters_size_that_is_not_an_integer_ge_1_is_a_value_error_naming_it(
        name: str, module: str, keyword: str, value: Any, tmp_path: Path) -> None:
    """A size keyword of an exporter (chunk_bytes=1.5, chunk_records="8", 0, True, ...) was used as it
    came: a bare TypeError from deep inside, or silently a size of 1; it is now refused, by name, before
    anything is written."""
    import importlib

    export = getattr(importlib.import_module(f"seqstore.interop.{module}"), name)
    with seqstore.create(tmp_path / "s", SCHEMA) as w:
        w.append({"x": np.arange(3, dtype=np.int32)}, id="a")
    with pytest.raises(ValueError, match=f"{name}: {keyword} must be an integer >= 1, got {value!r}"):
        export(tmp_path / "s", tmp_path / "out", **{keyword: value})
    assert sorted(os.listdir(tmp_path)) == ["s"]



@pytest.mark.parametrize("suffix", [".bin", ".idx"])
def test_export_megatron_with_overwrite_never_replaces_a_directory(tmp_path: Path, suffix: str) -> None:
    """export_megatron(..., overwrite=True) replaced a directory at PREFIX.bin or PREFIX.idx (and all in it)
    by its file; like the other exporters it now refuses to overwrite what it does not write, before writing."""
    from seqstore.interop.megatron import export_megatron

    with seqstore.create(tmp_path / "s", SCHEMA) as w:
        w.append({"x": np.arange(3, dtype=np.int32)})
    (tmp_path / f"out{suffix}").mkdir()
    (tmp_path / f"out{suffix}" / "keep.txt").write_text("mine")
    with pytest.raises(seqstore.errors.SeqstoreError, match=rf"out\{suffix}: refusing to overwrite a directory"):
        export_megatron(tmp_path / "s", tmp_path / "out", overwrite=True)
    assert (tmp_path / f"out{suffix}" / "keep.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == sorted(["s", f"out{suffix}"])



_INTO_STORE = [("export_hdf", "returnn", "manifest.json"), ("export_hdf", "returnn", "new.hdf"),
               ("export_megatron", "megatron", "shard-000000/x"), ("export_webdataset", "webdataset", "w"),
               ("export_hf", "hf_export", "h"), ("export_hf", "hf_export", "..")]


@pytest.mark.parametrize("as_store", [False, True])
@pytest.mark.parametrize(("name", "module", "out"), _INTO_STORE)
def test_an_export_into_the_store_it_reads_or_over_it_is_refused(tmp_path: Path, name: str, module: str, out: str,
                                                                  as_store: bool) -> None:
    """Only the command line refused an output inside the store it exports: export_hdf(store,
    store/manifest.json, overwrite=True) replaced the manifest and lost the store, others wrote their files
    among the store's, and export_hf(store, DIR, overwrite=True) with the store inside a DIR holding a
    state.json deleted the store with DIR. Every exporter now refuses, naming both, before writing."""
    import importlib

    export = getattr(importlib.import_module(f"seqstore.interop.{module}"), name)
    (tmp_path / "state.json").write_text("{}")
    with seqstore.create(tmp_path / "s", SCHEMA) as w:
        w.append({"x": np.arange(3, dtype=np.int32)}, id="a")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    src = seqstore.open(tmp_path / "s") if as_store else tmp_path / "s"
    words = "holds the store" if out == ".." else "is inside the store"
    with pytest.raises(seqstore.errors.SeqstoreError, match=f"{name}: the output .* {words} .*s that it exports"):
        export(src, tmp_path / "s" / out, overwrite=True)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert len(seqstore.open(tmp_path / "s")) == 1


@pytest.mark.parametrize(("name", "module"), [("export_hdf", "returnn"), ("export_megatron", "megatron"),
                                             ("export_webdataset", "webdataset"), ("export_hf", "hf_export")])
def test_a_failed_export_removes_the_directories_it_made_for_its_output(tmp_path: Path, name: str,
                                                                        module: str) -> None:
    """An export to a path under directories that did not exist made them, and a failure (here: its
    progress callback raising) left them behind, empty; they are removed again (those that existed stay)."""
    import importlib

    export = getattr(importlib.import_module(f"seqstore.interop.{module}"), name)
    with seqstore.create(tmp_path / "s", SCHEMA) as w:
        w.append({"x": np.arange(3, dtype=np.int32)}, id="a")
    (tmp_path / "kept").mkdir()

    def progress(n: int) -> None:
        raise RuntimeError("stopped by the progress callback")

    with pytest.raises(RuntimeError, match="stopped by the progress callback"):
        export(tmp_path / "s", tmp_path / "kept" / "a" / "b" / "out", progress=progress)
    assert sorted(os.listdir(tmp_path)) == ["kept", "s"] and not os.listdir(tmp_path / "kept")


@pytest.mark.parametrize(("name", "module", "kwargs", "words"), [
    ("export_hdf", "returnn", {"fields": {"x": 5}}, "field 'x': 5 cannot be an HDF target key"),
    ("export_webdataset", "webdataset", {"fields": {"x": 5}}, "field 'x': 5 cannot be a tar member extension"),
    ("export_hf", "hf_export", {"id_column": 5}, "id_column must be a str or None, got 5"),
])
def test_an_exporters_name_that_is_not_a_string_is_a_named_error(tmp_path: Path, name: str, module: str,
                                                                   kwargs: dict[str, Any], words: str) -> None:
    """A target key, extension or id column given as a number was a bare TypeError from deep inside."""
    import importlib

    export = getattr(importlib.import_module(f"seqstore.interop.{module}"), name)
    with seqstore.create(tmp_path / "s", SCHEMA) as w:
        w.append({"x": np.arange(3, dtype=np.int32)}, id="a")
    with pytest.raises((seqstore.errors.SchemaError, ValueError), match=words):
        export(tmp_path / "s", tmp_path / "out", **kwargs)
    assert sorted(os.listdir(tmp_path)) == ["s"]


_KILLED_CONVERSION = """
import os, signal, sys
import numpy as np
from seqstore import Field
from seqstore.interop import _common
out, at = sys.argv[1], sys.argv[2]

def hook(event, args):  # SIGKILL the conversion as it renames its new store onto out (the old one aside)
    if at == "rename" and event == "os.rename" and str(args[1]) == out:
        os.kill(os.getpid(), signal.SIGKILL)

def fill(w):
    w.append({"x": np.full(3, 7, np.int32)}, id="new-0")
    w.commit()
    if at == "fill":  # or while it writes the new store
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(hook)
_common.new_store(out, {"x": Field("int32", (None,))}, fill, overwrite=True)
"""


@pytest.mark.parametrize("at", ["fill", "rename"])
def test_a_conversion_killed_leaves_nothing_after_the_next_one(tmp_path: Path, at: str) -> None:
    """A conversion killed (SIGKILL) while building left its hidden sibling for ever, and killed between
    its two renames no store at all at the path (the old one hidden aside): the next conversion of the path
    puts the old store back and deletes what the dead one left; one being built is kept."""
    out = tmp_path / "s.seqstore"
    _old(out)
    env = {**os.environ, "PYTHONPATH": str(Path(seqstore.__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", _KILLED_CONVERSION, str(out), at], timeout=120, env=env)
    assert proc.returncode == -signal.SIGKILL
    left = os.listdir(tmp_path)
    assert len(left) > 1 and ("s.seqstore" in left) == (at == "fill"), left
    with _common.replaced(tmp_path / "t.seqstore") as live:  # another conversion, alive meanwhile
        live.mkdir()
        with pytest.raises(_common.OutputExistsError):  # the old store is back at the path
            _common.new_store(out, SCHEMA, _fill(1))
        assert live.is_dir()
    store = seqstore.open(out)
    assert len(store) == 1 and store.id(0) == "old-0"
    assert sorted(os.listdir(tmp_path)) == ["s.seqstore", "t.seqstore"]


def test_read_as_float32_keeps_the_view_and_options_of_a_store_given(tmp_path: Path) -> None:
    """An export given an open Store with bfloat16 fields reopened it at its path with only its client's
    options: records committed since it was opened were exported too, and ``verify_reads`` (like
    ``readahead``, ``max_mapped_shards``) was dropped. The Store's view and options are kept."""
    path = tmp_path / "b.seqstore"
    with seqstore.create(path, {"x": Field("bfloat16", (None,))}) as w:
        w.append({"x": np.ones(2, np.float32)})
    st = seqstore.open(path, verify_reads=True, readahead="never")
    with seqstore.append_to(path) as w:  # committed after ``st`` was opened: not part of it
        w.append({"x": np.ones(3, np.float32)})
    got = _common.read_as_float32(st)
    assert len(got) == len(st) == 1 and got.bfloat16 == "float32"
    assert got.__reduce__()[1][4]["verify_reads"] and got.__reduce__()[1][4]["readahead"] == "never"
    assert _common.read_as_float32(got) is got  # (already float32: not reopened)


def test_importers_and_exporters_refuse_a_chained_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``import_*(..., "simplecache::s3://b/x")`` and ``export_*`` wrote a local directory named
    ``simplecache::s3:``; a chained fsspec URL is a ConfigError naming it, before anything is written.
    A local name with ``::`` in it that is no chained URL stays a local path."""
    from seqstore.errors import ConfigError
    from seqstore.interop.webdataset import export_webdataset

    monkeypatch.chdir(tmp_path)
    _old(tmp_path / "s.seqstore")
    with pytest.raises(ConfigError, match="simplecache::s3://b/x: .*chained"):
        _common.new_store("simplecache::s3://b/x", SCHEMA, _fill(1))
    with pytest.raises(ConfigError, match="blockcache::file:///w: .*chained"):
        export_webdataset(tmp_path / "s.seqstore", "blockcache::file:///w")
    assert sorted(os.listdir(tmp_path)) == ["s.seqstore"]
    export_webdataset(tmp_path / "s.seqstore", "run::1")
    assert (tmp_path / "run::1").is_dir()


@pytest.mark.parametrize("inside", ["t.parquet", "sub/t.parquet", ""])
def test_an_import_refuses_a_source_inside_its_output(tmp_path: Path, inside: str) -> None:
    """``import_parquet("s.seqstore/t.parquet", "s.seqstore", overwrite=True)`` imported the file, then
    replaced the store directory holding it: the source was deleted. A source that is the output or lies
    inside it is refused (SeqstoreError naming both) before anything is read or written."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from seqstore.interop.arrow import import_parquet

    out = tmp_path / "s.seqstore"
    _old(out)
    src = out / inside if inside else out
    if inside:
        src.parent.mkdir(exist_ok=True)
        pq.write_table(pa.table({"x": pa.array([[1, 2]], pa.list_(pa.int32()))}), src)
    with pytest.raises(seqstore.SeqstoreError, match=f"the source {src} is inside the output {out}"):
        import_parquet(str(src), out, overwrite=True)
    assert src.exists() and len(seqstore.open(out)) == 1


@pytest.mark.parametrize("target", ["webdataset", "hf", "megatron", "returnn-hdf"])
def test_exporters_refuse_a_chained_store_url(tmp_path: Path, target: str) -> None:
    """``export_webdataset("simplecache::s3://b/x", out)`` said '<cwd>/simplecache::s3:/b/x: no such store'
    (the URL taken as a local path); every exporter refuses it as a chained URL, naming it."""
    import importlib

    from seqstore.errors import ConfigError

    module, name = {"webdataset": ("webdataset", "export_webdataset"), "hf": ("hf_export", "export_hf"),
                    "megatron": ("megatron", "export_megatron"), "returnn-hdf": ("returnn", "export_hdf")}[target]
    export = getattr(importlib.import_module(f"seqstore.interop.{module}"), name)
    with pytest.raises(ConfigError, match=r"^simplecache::s3://b/x: a chained URL"):
        export("simplecache::s3://b/x", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
