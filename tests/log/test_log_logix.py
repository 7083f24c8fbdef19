"""Import of LogIX logs: the vendored log written by LogIX 0.1.1's own LogSaver, the older AnaLog
layout, and (when LogIX's source is importable) a fresh log compared with LogIX's own LogDataset."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from logix_gen import DATA, EXPECTED_IDS, MODULES, have_logix, values_for, write_analog, write_with_logix

import seqstore as ss
from seqstore.log import import_logix
from seqstore.store.verify import verify


def _check(store_path: Path) -> None:
    st = ss.open(store_path)
    assert len(st) == len(EXPECTED_IDS) and verify(store_path) == []
    assert [st.id(i) for i in range(len(st))] == EXPECTED_IDS  # LogIX order, first occurrence wins
    for i, data_id in enumerate(EXPECTED_IDS):
        rec = st.nested(i)
        want = values_for(data_id, 0)
        for name, _ in MODULES:
            np.testing.assert_array_equal(rec[name]["grad"], want[name])
    assert st.manifest.stats["duplicates_skipped"] == 3
    assert st.metadata["fields"]["block.0.attn/grad"] == "block.0.attn/grad"
    assert list(st.groups) == ["packed"]


@pytest.mark.parametrize("sub", ["logix_0.1.1", "analog"])
def test_import_vendored(scratch: Path, sub: str) -> None:
    report = import_logix(DATA / sub, scratch / "out", batch_records=7)
    assert report.records == 50 and report.duplicates_skipped == 3 and report.chunks == 3
    _check(scratch / "out")


def test_import_generated_analog_and_errors(scratch: Path) -> None:
    write_analog(scratch / "logs")
    import_logix(scratch / "logs", scratch / "out")
    _check(scratch / "out")
    with pytest.raises(FileExistsError):
        import_logix(scratch / "logs", scratch / "out")
    (scratch / "logs" / "log_rank_1_chunk_0_metadata.json").unlink()
    with pytest.raises(ss.FormatError, match="metadata"):
        import_logix(scratch / "logs", scratch / "out2")
    with pytest.raises(ss.FormatError, match="no LogIX chunks"):
        import_logix(scratch / "out", scratch / "out3")


def test_import_fails_in_a_later_chunk_all_or_nothing(scratch: Path) -> None:
    """A log whose last chunk is malformed fails after two chunks were written: like the other
    importers, nothing is left at ``out`` (no readable prefix), an existing store replaced with
    ``overwrite`` is kept as it was, no hidden temporary is left, and a re-run once the log is
    fixed works without ``overwrite``."""
    write_analog(scratch / "logs")
    meta = scratch / "logs" / "log_rank_1_chunk_0_metadata.json"
    good = meta.read_text()
    meta.write_text(good[: len(good) // 2])  # truncated JSON: the third chunk of three
    with pytest.raises(ss.FormatError, match="log_rank_1_chunk_0_metadata.json"):
        import_logix(scratch / "logs", scratch / "new")
    assert not (scratch / "new").exists()
    with ss.create(scratch / "old", {"x": ss.Field("int32")}) as w:
        w.append({"x": 5}, id="kept")
    with pytest.raises(ss.FormatError, match="log_rank_1_chunk_0_metadata.json"):
        import_logix(scratch / "logs", scratch / "old", overwrite=True)
    st = ss.open(scratch / "old")
    assert len(st) == 1 and st.id(0) == "kept" and list(st.schema) == ["x"]
    assert sorted(p.name for p in scratch.iterdir()) == ["logs", "old"]
    meta.write_text(good)
    import_logix(scratch / "logs", scratch / "new")
    _check(scratch / "new")
    import_logix(scratch / "logs", scratch / "old", overwrite=True)
    _check(scratch / "old")


@pytest.mark.skipif(not have_logix(), reason="LogIX source not importable (put logix-ai 0.1.1 on PYTHONPATH)")
def test_import_matches_logix_loader_record_by_record(scratch: Path) -> None:
    from logix.logging.log_loader import LogDataset

    write_with_logix(scratch / "logs")
    import_logix(scratch / "logs", scratch / "out")
    _check(scratch / "out")
    ds = LogDataset(str(scratch / "logs"), flatten=False)
    st = ss.open(scratch / "out")
    assert len(ds) == len(st)
    for i in range(len(ds)):
        data_id, nested = ds[i]
        j = st.index(data_id)
        for name, _ in MODULES:
            np.testing.assert_array_equal(st[j][f"{name}/grad"], nested[name]["grad"].numpy())


def test_vendored_data_is_what_the_generator_writes(scratch: Path) -> None:
    write_analog(scratch / "a")
    for p in (DATA / "analog").iterdir():
        assert (scratch / "a" / p.name).read_bytes() == p.read_bytes()
    if have_logix():
        write_with_logix(scratch / "l")
        for p in (DATA / "logix_0.1.1").iterdir():
            assert (scratch / "l" / p.name).read_bytes() == p.read_bytes()
    shutil.rmtree(scratch / "a")


def test_convert_logix_shard_mb_sizes_the_shards(scratch: Path) -> None:
    """``seqstore convert --from logix --shard-mb`` cuts the store into shards of that size (the option
    was accepted and unused: one shard whatever it said); the records are the same."""
    from seqstore.cli import main

    plan = {(0, 0): [(f"ex{i}", 0) for i in range(20_000)]}  # 164 bytes a record: 3.3 MB
    write_analog(scratch / "logs", plan)
    assert main(["convert", "--from", "logix", str(scratch / "logs"), str(scratch / "out"), "--shard-mb", "1",
                 "-q"]) == 0
    st = ss.open(scratch / "out")
    assert len(st) == 20_000 and st.num_shards >= 3 and verify(scratch / "out") == []
    for i in (0, 9_999, 19_999):
        assert st.id(i) == f"ex{i}"
        np.testing.assert_array_equal(st.nested(i)["head"]["grad"], values_for(f"ex{i}")["head"])


def test_import_to_a_url_is_all_or_nothing(scratch: Path, moto_s3: Any, s3_bucket: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A log that fails in its last chunk leaves nothing at a URL of object storage, and an existing
    store there (``overwrite=True``) as it was (the URL was written in place, chunk by chunk: the chunks
    before the failure became a readable store, replacing the old one); a good log then imports."""
    for k, v in moto_s3.env().items():
        monkeypatch.setenv(k, v)
    write_analog(scratch / "logs")
    meta = scratch / "logs" / "log_rank_1_chunk_0_metadata.json"
    good = meta.read_text()
    meta.write_text(good[: len(good) // 2])
    new, old = f"s3://{s3_bucket}/new.seqstore", f"s3://{s3_bucket}/old.seqstore"
    with pytest.raises(ss.FormatError, match="log_rank_1_chunk_0_metadata.json"):
        import_logix(scratch / "logs", new)
    with pytest.raises(ss.FormatError, match="no such store|does not exist"):
        ss.open(new)
    with ss.create(old, {"x": ss.Field("int32")}) as w:
        w.append({"x": 5}, id="kept")
    with pytest.raises(FileExistsError):
        import_logix(scratch / "logs", old)
    with pytest.raises(ss.FormatError, match="log_rank_1_chunk_0_metadata.json"):
        import_logix(scratch / "logs", old, overwrite=True)
    st = ss.open(old)
    assert len(st) == 1 and st.id(0) == "kept" and list(st.schema) == ["x"]
    meta.write_text(good)
    report = import_logix(scratch / "logs", old, overwrite=True)
    assert report.records == len(EXPECTED_IDS)
    st = ss.open(old)
    assert [st.id(i) for i in range(len(st))] == EXPECTED_IDS and st.manifest.stats["duplicates_skipped"] == 3
    np.testing.assert_array_equal(st.nested(7)["fc1"]["grad"], values_for("ex7", 0)["fc1"])


def test_a_truncated_chunk_file_is_named_with_its_record(scratch: Path) -> None:
    """A chunk file shorter than its metadata says: a FormatError naming the file and the first record
    whose values lie outside it (it named neither), and nothing is left at ``out``."""
    import os

    write_analog(scratch / "logs")
    data = scratch / "logs" / "log_rank_0_chunk_1.mmap"
    os.truncate(data, data.stat().st_size - 1000)
    with pytest.raises(ss.FormatError, match=r"log_rank_0_chunk_1\.mmap: data_id 'ex29': its values lie outside"):
        import_logix(scratch / "logs", scratch / "out")
    assert not (scratch / "out").exists()


@pytest.mark.parametrize(("key", "value", "why"), [("shape", None, "KeyError: 'shape'"),
                                                   ("dtype", "float99", "TypeError"), ("offset", "x", "ValueError")])
def test_a_malformed_metadata_entry_is_named(scratch: Path, key: str, value: Any, why: str) -> None:
    """A metadata entry without a key or with a value of the wrong kind: a FormatError naming the file and
    the entry (it was a bare KeyError, TypeError or ValueError naming neither)."""
    import json

    write_analog(scratch / "logs")
    meta = scratch / "logs" / "log_rank_0_chunk_1_metadata.json"
    entries = json.loads(meta.read_text())
    if value is None:
        del entries[4][key]
    else:
        entries[4][key] = value
    meta.write_text(json.dumps(entries))
    with pytest.raises(ss.FormatError, match=rf"log_rank_0_chunk_1_metadata\.json: metadata entry 4 is malformed "
                       rf"\({why}"):
        import_logix(scratch / "logs", scratch / "out")


@pytest.mark.parametrize("dtype", ["<U4", "datetime64[s]"])
def test_a_first_record_of_an_unsupported_dtype_is_named(scratch: Path, dtype: str) -> None:
    """The first record decides the schema: a dtype seqstore cannot store (its size matching its shape) was
    a SchemaError naming neither the file nor the record."""
    import json

    shutil.copytree(DATA / "logix_0.1.1", scratch / "logs")
    meta = scratch / "logs" / "log_rank_0_chunk_0_metadata.json"
    entries = json.loads(meta.read_text())
    entries[0]["dtype"] = dtype
    meta.write_text(json.dumps(entries))
    with pytest.raises(ss.SchemaError, match=rf"log_rank_0_chunk_0_metadata\.json: data_id '{entries[0]['data_id']}'"
                       r", fc1/grad: unsupported dtype"):
        import_logix(scratch / "logs", scratch / "out")
    assert not (scratch / "out").exists()


def test_the_importers_keywords_are_checked_before_the_log_is_read(scratch: Path) -> None:
    """``import_logix`` goes through the importers' driver: its keywords are checked as every importer's
    are, before the log directory is looked at (here it does not exist)."""
    missing = scratch / "no-log"
    with pytest.raises(ValueError, match="storage_options are for URLs"):
        import_logix(missing, scratch / "o", storage_options={"region": "x"})
    with pytest.raises(ValueError, match="shard_bytes must be positive"):
        import_logix(missing, scratch / "o", shard_bytes=0)
    with pytest.raises(ValueError, match="import_logix: batch_records must be an integer >= 1, got 0"):
        import_logix(missing, scratch / "o", batch_records=0)
    assert not (scratch / "o").exists()


def test_batch_records_is_checked_as_every_importers_sizes(scratch: Path) -> None:
    """``batch_records`` had a check of its own (other words than the importers' sizes, and a NumPy integer,
    e.g. one read from a config array, refused as 'not a positive integer'): it is checked as they are."""
    report = import_logix(DATA / "logix_0.1.1", scratch / "out", batch_records=np.int64(7))
    assert report.records == 50
    for bad in (2.0, True):
        with pytest.raises(ValueError, match=f"import_logix: batch_records must be an integer >= 1, got {bad!r}"):
            import_logix(DATA / "logix_0.1.1", scratch / "o", batch_records=bad)  # type: ignore[arg-type]


def test_import_to_a_url_with_storage_options(scratch: Path, moto_s3: Any, s3_bucket: str) -> None:
    """The URL's client options are given as for every importer (no credentials in the environment)."""
    url, opts = f"s3://{s3_bucket}/opts.seqstore", moto_s3.storage_options()
    report = import_logix(DATA / "analog", url, storage_options=opts)
    st = ss.open(url, storage_options=opts)
    assert report.records == len(st) == len(EXPECTED_IDS) and st.id(0) == EXPECTED_IDS[0]
    assert list(st.groups) == ["packed"] and st.manifest.stats["duplicates_skipped"] == 3


def test_a_log_inside_the_output_is_refused(scratch: Path) -> None:
    """import_logix called directly did not check what the CLI and the other importers check: a log directory
    inside ``out`` is deleted when ``overwrite`` replaces the store there. It is refused, naming both."""
    with ss.create(scratch / "s", {"x": ss.Field("int32")}) as w:
        w.append({"x": 5})
    write_analog(scratch / "s" / "logs")
    before = sorted(p.name for p in (scratch / "s" / "logs").iterdir())
    with pytest.raises(ss.SeqstoreError, match="import_logix: the source .*logs is inside the output"):
        import_logix(scratch / "s" / "logs", scratch / "s", overwrite=True)
    assert sorted(p.name for p in (scratch / "s" / "logs").iterdir()) == before
    assert len(ss.open(scratch / "s")) == 1


def test_a_failed_import_removes_the_directories_it_made_for_the_output(scratch: Path) -> None:
    """An import to ``a/b/out`` whose log failed part way left the empty directories ``a/b`` it had made to
    hold the output (the exporters remove theirs): a failed import leaves nothing behind, not even them."""
    write_analog(scratch / "logs")
    meta = scratch / "logs" / "log_rank_1_chunk_0_metadata.json"
    meta.write_text(meta.read_text()[:100])
    with pytest.raises(ss.FormatError, match="log_rank_1_chunk_0_metadata.json"):
        import_logix(scratch / "logs", scratch / "a" / "b" / "out")
    assert sorted(p.name for p in scratch.iterdir()) == ["logs"]


def test_a_log_given_as_a_file_url_is_its_directory(scratch: Path) -> None:
    """import_logix("file:///x/logs", ...) said "file:/x/logs: not a directory" (and ``convert --from logix``
    "no such file"), where every other importer takes a file:// source as its path."""
    report = import_logix(f"file://{DATA / 'analog'}", scratch / "out")
    assert report.records == 50
    _check(scratch / "out")
    assert ss.open(scratch / "out").metadata["source"] == str((DATA / "analog").resolve())
    from seqstore.cli import main

    assert main(["convert", "--from", "logix", f"file://{DATA / 'analog'}", str(scratch / "cli"), "-q"]) == 0
    assert len(ss.open(scratch / "cli")) == 50
