"""The ``seqstore`` command says what it does (issue 25, items 5 and 6): help texts, dtype names, one pass
over the lengths, and the same words and exit status for a missing store from every command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
from seqstore import cli
from seqstore.cli import build_parser, main


def _help(*argv: str) -> str:
    parser = build_parser()
    if not argv:
        return parser.format_help()
    sub = next(a for a in parser._actions if a.dest == "command")
    return str(sub.choices[argv[0]].format_help())  # type: ignore[attr-defined]


def test_top_level_description_names_every_command() -> None:
    text = " ".join(_help().split("positional arguments")[0].split())
    for command in ("info", "verify", "copy", "convert", "export", "demo"):
        assert command in text


def test_convert_usage_has_sources_then_one_out() -> None:
    usage = " ".join(_help("convert").split("\n\n")[0].split())
    assert "SOURCE [SOURCE ...] OUT" in usage and "OUT ...]" not in usage


def test_convert_groups_map_and_id_column_under_parquet_and_arrow() -> None:
    text = _help("convert")
    block = text[text.index("--from parquet, --from arrow:"):]
    block = block[: block.index("\n\n")]
    assert "--map COLUMN=FIELD" in block and "--id-column COLUMN" in block


def test_demo_seed_has_help() -> None:
    text = " ".join(_help("demo").split())
    assert "--seed SEED random seed" in text


@pytest.fixture()
def typed_store(tmp_path: Path) -> Path:
    path = tmp_path / "t.seqstore"
    schema = {"feat": ss.Field("float16", (None, 2)), "label": ss.Field("int32"), "flag": ss.Field("bool")}
    with ss.create(path, schema, max_shard_records=30) as w:
        for i in range(70):
            w.append({"feat": np.ones((i % 7 + 3 * (i % 2), 2)), "label": i, "flag": i % 2 == 0})
    return path


def test_info_prints_dtype_names(typed_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(typed_store), "-q"]) == 0
    out = capsys.readouterr().out
    fields = {line.split()[0]: line.split()[1] for line in out.split("fields\n")[1].splitlines()[:3]}
    assert fields == {"feat": "float16", "label": "int32", "flag": "bool"}
    assert "<f2" not in out and "<i4" not in out


@pytest.mark.parametrize("tally", [1 << 22, 4])  # one pass; a record longer than the tally: two passes
def test_length_histogram_matches_numpy(typed_store: Path, tally: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_MAX_TALLY", tally)
    store = ss.open(typed_store)
    lengths = np.asarray(store.lengths("feat")[:])
    lines = cli._length_stats(store, "feat", progress=False)
    lo, hi = int(lengths.min()), int(lengths.max())
    assert lines[0] == (f"    rows per record: min {lo}, mean {lengths.mean():.1f}, max {hi}; "
                        f"total {int(lengths.sum())}")
    width = -(-(hi + 1 - lo) // 10)
    edges = np.arange(lo, hi + 1 + width, width)[: -(-(hi + 1 - lo) // width) + 1]
    expected = np.histogram(lengths, bins=edges)[0]
    assert [int(line.split()[-1]) for line in lines[1:]] == expected.tolist()


@pytest.mark.parametrize("kind", ["missing", "not a store"])
def test_info_and_verify_agree_on_a_missing_store(tmp_path: Path, kind: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nothing.seqstore"
    if kind == "not a store":
        path.mkdir()
    assert main(["info", str(path), "-q"]) == 2
    info_err = capsys.readouterr().err
    assert main(["verify", str(path), "-q"]) == 2
    verify_err = capsys.readouterr().err
    assert info_err == verify_err and info_err.startswith("seqstore: error: ") and str(path) in info_err


def test_verify_still_reports_a_damaged_manifest_as_a_problem(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.seqstore"
    with ss.create(path, {"y": ss.Field("int16")}) as w:
        w.append({"y": 1})
    (path / "manifest.json").write_text("{not json")
    assert main(["verify", str(path), "-q"]) == 1
    assert "not valid JSON" in capsys.readouterr().err


def test_convert_logix_missing_path_says_it_does_not_exist(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nolog"
    assert main(["convert", "--from", "logix", str(missing), str(tmp_path / "out.seqstore"), "-q"]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "no such file or directory" in err and "not a directory" not in err


@pytest.mark.parametrize("target, metadata, option", [
    ("megatron", {"megatron": {"document_field": 5}}, "--documents"),
    ("returnn-hdf", {"returnn": {"inputs": 5}}, "--inputs"),
])
def test_export_errors_name_the_options_of_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            target: str, metadata: dict[str, object],
                                                            option: str) -> None:
    """A store whose recorded metadata names no field: ``export`` ended its one line with the library's
    keyword ('pass documents=', 'pass inputs='), which the command line has no spelling for."""
    path = tmp_path / "m.seqstore"
    with ss.create(path, {"tokens": ss.Field("int32", (None,))}, metadata=metadata) as w:
        w.append({"tokens": np.arange(3, dtype=np.int32)})
    assert main(["export", "--to", target, str(path), str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"pass {option} FIELD (or {option} none)" in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.seqstore"]


def test_export_hf_of_a_complex_field_names_the_fields_option(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """'leave it out with fields=' spoke Python to a user of ``export --to hf``: it names ``--fields``."""
    pytest.importorskip("datasets")
    path = tmp_path / "c.seqstore"
    with ss.create(path, {"z": ss.Field("complex64", (None,)), "y": ss.Field("int32")}) as w:
        w.append_batch({"z": (np.arange(4).astype(np.complex64), np.array([1, 3])), "y": np.array([5, 6])})
    assert main(["export", "--to", "hf", str(path), str(tmp_path / "hf"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "leave it out with --fields A,B" in err and len(err.splitlines()) == 1, err
