"""The command line's formats as one table: help generated from it, close matches suggested for misspelled
options, a Hugging Face directory given as Parquet, and the Lhotse import's audio default and progress total.
Each of these failed on cba793a."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tqdm import tqdm

import seqstore
import seqstore.interop.commands
from seqstore.cli import build_parser, main
from seqstore.interop.commands import SOURCES, TARGETS


def _help(command: str) -> str:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return " ".join(sub.choices[command].format_help().split())  # type: ignore[attr-defined]


def test_convert_help_is_generated_from_the_table() -> None:
    text = _help("convert")
    storage = text[text.index("-o KEY=VALUE, --storage-option KEY=VALUE"):]
    storage = storage[: storage.index("--workers")].replace("- ", "-")  # help lines wrap after a hyphen
    for name, conv in SOURCES.items():  # every format that writes into a URL is named for -o
        assert (name in storage) == conv.url, (name, storage)
    assert "hf" in storage and "lhotse" in storage and "logix" not in storage
    assert "a string or integer column whose values become the record ids" in text
    assert "--from hf, --from parquet, --from arrow: --map COLUMN=FIELD" in text  # one group for the three
    assert "hf/parquet/arrow: import COLUMN as field FIELD" in text


def test_export_out_says_what_each_target_writes() -> None:
    text = _help("export")
    out = text[text.index("out the output:"):]
    assert "a file for --to returnn-hdf" in out and "a directory for --to webdataset/hf" in out
    assert "a prefix (PREFIX.bin + PREFIX.idx) for --to megatron" in out
    assert {c.out for c in TARGETS.values()} == {"a file", "a directory", "a prefix (PREFIX.bin + PREFIX.idx)"}


@pytest.mark.parametrize(("argv", "hint"), [
    (["convert", "--from", "parquet", "--id-colunm", "key", "a", "b"], "--id-colunm: did you mean --id-column?"),
    (["convert", "--from", "lhotse", "--featurse", "a", "b"], "--featurse: did you mean --features?"),
    (["info", "x", "--no-lenghts"], "--no-lenghts: did you mean --no-lengths?"),
    (["convert", "--from", "parqet", "a", "b"], "did you mean 'parquet'?"),
])
def test_a_misspelled_option_gets_the_close_match(argv: list[str], hint: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert hint in capsys.readouterr().err


def test_parquet_given_a_datasets_directory_suggests_hf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"x": [[1, 2], [3]], "id": ["a", "b"]}).save_to_disk(str(tmp_path / "hfdir"))
    assert main(["convert", "--from", "parquet", "-q", str(tmp_path / "hfdir"), str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--from hf" in err and "magic bytes" not in err and not (tmp_path / "o").exists()
    arrow_file = next((tmp_path / "hfdir").glob("*.arrow"))  # one Arrow file given as Parquet
    assert main(["convert", "--from", "parquet", "-q", str(arrow_file), str(tmp_path / "o")]) == 2
    assert "--from arrow" in capsys.readouterr().err
    assert main(["convert", "--from", "hf", "-q", str(tmp_path / "hfdir"), str(tmp_path / "o")]) == 0


# ------------------------------------------------------------------------------------------ lhotse


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Cut manifests of recordings without features: three mono WAVs, and the same plus a stereo one."""
    lhotse = pytest.importorskip("lhotse")
    sf = pytest.importorskip("soundfile")
    root = tmp_path_factory.mktemp("recs")
    rng = np.random.default_rng(1)
    recs = []
    for k, channels in enumerate((1, 1, 1, 2)):
        shape = (4000 + 500 * k, channels) if channels > 1 else (4000 + 500 * k,)
        sf.write(root / f"r{k}.wav", (rng.standard_normal(shape) * 3000).astype(np.int16), 16000, subtype="PCM_16")
        recs.append(lhotse.Recording.from_file(root / f"r{k}.wav", recording_id=f"r{k}"))
    sups = [lhotse.SupervisionSegment(f"r{k}-s", f"r{k}", 0, r.duration, text=f"text {k}") for k, r in enumerate(recs)]
    mono = lhotse.CutSet.from_manifests(recordings=lhotse.RecordingSet.from_recordings(recs[:3]),
                                        supervisions=lhotse.SupervisionSet.from_segments(sups[:3]))
    both = lhotse.CutSet.from_manifests(recordings=lhotse.RecordingSet.from_recordings(recs),
                                        supervisions=lhotse.SupervisionSet.from_segments(sups))
    mono.to_file(root / "mono.jsonl.gz")
    both.to_file(root / "stereo.jsonl.gz")
    return {"mono": root / "mono.jsonl.gz", "stereo": root / "stereo.jsonl.gz"}


def test_lhotse_recordings_without_features_keep_their_audio(recordings: dict[str, Path], tmp_path: Path) -> None:
    from lhotse import CutSet

    from seqstore.interop.lhotse import LhotseCutError, import_lhotse

    store = import_lhotse(recordings["mono"], tmp_path / "s")
    assert {"audio", "sampling_rate", "text", "duration"} <= set(store.schema)
    for i, cut in enumerate(CutSet.from_file(recordings["mono"])):
        assert store.id(i) == cut.id and int(store[i]["sampling_rate"]) == 16000
        np.testing.assert_array_equal(store[i]["audio"], cut.load_audio()[0])
    assert store.metadata["lhotse"]["audio"]["dtype"] == "float32"
    assert "audio" not in import_lhotse(recordings["mono"], tmp_path / "t", audio=False).schema
    with pytest.raises(LhotseCutError, match=r"cut 'r3-\d+': audio has 2 channels.*audio=False"):
        import_lhotse(recordings["stereo"], tmp_path / "u")
    assert not (tmp_path / "u").exists()


def test_lhotse_cli_audio_default_and_no_audio(recordings: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "--from", "lhotse", "-q", str(recordings["mono"]), str(tmp_path / "a")]) == 0
    assert "audio" in seqstore.open(tmp_path / "a").schema
    assert main(["convert", "--from", "lhotse", "-q", str(recordings["stereo"]), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "--no-audio" in err and "--channels first" in err and "audio=False" not in err
    assert main(["convert", "--from", "lhotse", "-q", "--no-audio", str(recordings["stereo"]),
                 str(tmp_path / "b")]) == 0
    assert "audio" not in seqstore.open(tmp_path / "b").schema


def test_lhotse_progress_has_a_total_for_a_small_manifest(recordings: dict[str, Path], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []

    class Recording(tqdm):  # type: ignore[misc]
        def close(self) -> None:
            seen.append({"desc": self.desc, "total": self.total, "n": self.n})
            super().close()

    monkeypatch.setattr(seqstore.interop.commands, "tqdm", Recording)
    assert main(["convert", "--from", "lhotse", "--no-audio", str(recordings["stereo"]), str(tmp_path / "c")]) == 0
    assert seen and all(bar == {"desc": "convert lhotse", "total": 4, "n": 4} for bar in seen)
