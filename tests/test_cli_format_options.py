"""``seqstore convert`` / ``export``: an option of another format is refused (exit 2, naming the formats
it is for), as docs/interop.md promises, instead of being accepted and ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqstore.cli import main


@pytest.mark.parametrize(("argv", "words"), [
    (["convert", "--from", "parquet", "{tmp}/t.parquet", "{tmp}/o", "--rename", "spk=speaker"],
     "convert --from parquet: --rename does not apply (it is for --from returnn-hdf)"),
    (["convert", "--from", "returnn-hdf", "{tmp}/a.hdf", "{tmp}/o", "--map", "x=y"],
     "convert --from returnn-hdf: --map does not apply (it is for --from hf, parquet, arrow)"),
    (["convert", "--from", "megatron", "{tmp}/m", "{tmp}/o", "--features"],
     "convert --from megatron: --features does not apply (it is for --from lhotse)"),
    (["convert", "--from", "arrow", "{tmp}/a", "{tmp}/o", "--no-audio"],
     "convert --from arrow: --audio does not apply (it is for --from lhotse)"),
    (["export", "--to", "hf", "{tmp}/s", "{tmp}/h", "--keys", "ids"],
     "export --to hf: --keys does not apply (it is for --to webdataset)"),
    (["export", "--to", "megatron", "{tmp}/s", "{tmp}/m", "--inputs", "none"],
     "export --to megatron: --inputs does not apply (it is for --to returnn-hdf)"),
    (["export", "--to", "returnn-hdf", "{tmp}/s", "{tmp}/r.hdf", "--shard-mb", "8"],
     "export --to returnn-hdf: --shard-mb does not apply (it is for --to webdataset)"),
])
def test_an_option_of_another_format_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                argv: list[str], words: str) -> None:
    assert main([a.format(tmp=tmp_path) for a in argv] + ["-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error:") and words in err, err
    assert list(tmp_path.iterdir()) == []


def test_an_option_of_the_chosen_format_or_at_its_default_is_taken(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Only what the format would ignore is refused: its own options, and another format's option given
    its default value, reach the importer (which then reports the missing source)."""
    for extra in (["--map", "x=y"], ["--tokens-field", "tokens"]):
        code = main(["convert", "--from", "parquet", str(tmp_path / "missing.parquet"), str(tmp_path / "o"), "-q",
                     *extra])
        err = capsys.readouterr().err
        assert code == 2 and "does not apply" not in err and "missing.parquet" in err, err
