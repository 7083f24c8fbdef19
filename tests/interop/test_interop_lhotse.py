"""Lhotse cut manifests: import_lhotse and ``seqstore convert --from lhotse`` against lhotse's own
manifests, feature storage (Fbank through NumpyFilesWriter) and audio loading, on a tiny local corpus."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import seqstore
from seqstore.cli import main as cli_main
from seqstore.interop import SourceFormatError
from seqstore.interop.lhotse import (
    LhotseCutError,
    MissingFeaturesError,
    MissingRecordingError,
    import_lhotse,
)

lhotse: Any = pytest.importorskip("lhotse")
sf: Any = pytest.importorskip("soundfile")
# lhotse's Fbank (kaldi/layers.py) calls numpy functions in a way NumPy 2 deprecates
pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__ must accept context:DeprecationWarning")

SR = 16000
TEXTS = {"rec0": ["hello there", "wörld ünïcode"], "rec1": [None], "rec2": [], "rec3": ["stereo talk"]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Four recordings (three mono 16-bit WAVs, one stereo) as cuts with supervisions, Fbank features
    stored by NumpyFilesWriter; manifests with and without features."""
    from lhotse import CutSet, Fbank, NumpyFilesWriter, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    root = tmp_path_factory.mktemp("lhotse")
    rng = np.random.default_rng(0)
    recs, sups = [], []
    for k, (name, texts) in enumerate(TEXTS.items()):
        n = SR // 4 + 1000 * k
        shape = (n, 2) if name == "rec3" else (n,)
        sf.write(root / f"{name}.wav", (rng.standard_normal(shape) * 4000).astype(np.int16), SR, subtype="PCM_16")
        rec = Recording.from_file(root / f"{name}.wav", recording_id=name)
        recs.append(rec)
        for j, text in enumerate(texts):
            dur = rec.duration / max(len(texts), 1)
            sups.append(SupervisionSegment(f"{name}-s{j}", name, j * dur, dur, channel=rec.channel_ids, text=text))
    cuts = CutSet.from_manifests(recordings=RecordingSet.from_recordings(recs),
                                 supervisions=SupervisionSet.from_segments(sups))
    cuts.to_file(root / "plain.jsonl.gz")
    with_feats = cuts.compute_and_store_features(Fbank(), storage_path=root / "feats", storage_type=NumpyFilesWriter,
                                                 num_jobs=1)
    with_feats.to_file(root / "cuts.jsonl.gz")
    RecordingSet.from_recordings(recs).to_file(root / "recordings.jsonl.gz")
    return {"root": root, "plain": root / "plain.jsonl.gz", "cuts": root / "cuts.jsonl.gz",
            "recordings": root / "recordings.jsonl.gz"}


def expected_audio(cut: Any, dtype: str, channels: str) -> np.ndarray:
    x = cut.load_audio()
    mono = x[0] if x.shape[0] == 1 or channels == "first" else x.mean(axis=0, dtype=np.float64).astype(np.float32)
    if dtype == "int16":
        return np.clip(np.rint(mono.astype(np.float64) * 32768), -32768, 32767).astype(np.int16)
    return mono


def assert_same(store: seqstore.Store, cuts: Any, *, features: str | None = "float32", audio: str | None = "float32",
                channels: str = "first", sep: str = " ") -> None:
    """Every cut as Lhotse reads it equals the store's record of the same number."""
    n = 0
    for i, cut in enumerate(cuts):
        rec = store[i]
        assert store.id(i) == cut.id
        assert float(rec["duration"]) == cut.duration
        texts = [s.text for s in cut.supervisions if s.text is not None]
        assert bytes(rec["text"]).decode("utf-8") == sep.join(texts)
        if "num_frames" in store.schema:
            assert int(rec["num_frames"]) == (cut.num_frames if cut.has_features else -1)
        if features is not None:
            want = cut.load_features().astype(features)
            assert rec["features"].dtype == want.dtype and np.array_equal(rec["features"], want)
        else:
            assert "features" not in store.schema
        if audio is not None:
            want = expected_audio(cut, audio, channels)
            assert rec["audio"].dtype == want.dtype and np.array_equal(rec["audio"], want)
            assert int(rec["sampling_rate"]) == cut.sampling_rate
        else:
            assert "audio" not in store.schema
        n += 1
    assert n == len(store) > 0



class _Bar:
    """A progress callback that records the counts it is told and the totals announced."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.total = 0

    def __call__(self, n: int) -> None:
        self.seen.append(n)

    def add_total(self, n: int) -> None:
        self.total += n

def test_manifest_features_audio_round_trip(corpus: dict[str, Path], tmp_path: Path) -> None:
    store = import_lhotse(corpus["cuts"], tmp_path / "s", features=True, audio=True, channels="first")
    assert_same(store, lhotse.CutSet.from_jsonl_lazy(corpus["cuts"]))
    assert store.schema["features"].inner_shape == (80,)
    meta = store.metadata["lhotse"]
    assert meta["manifests"] == ["cuts.jsonl.gz"] and meta["features"]["dims"] == 80
    assert bytes(store[0]["text"]).decode() == "hello there wörld ünïcode"


def test_cutset_object_float16_int16_mix_and_small_blocks(corpus: dict[str, Path], tmp_path: Path) -> None:
    cuts = lhotse.CutSet.from_file(corpus["cuts"]).to_eager()
    bar = _Bar()

    store = import_lhotse(cuts, tmp_path / "s", features=True, features_dtype="float16", audio=True,
                          audio_dtype="int16", channels="mix", text_separator="|", chunk_bytes=1, progress=bar)
    assert_same(store, cuts, features="float16", audio="int16", channels="mix", sep="|")
    assert bar.seen == [1, 1, 1, 1] and bar.total == 4  # one cut per block; an eager CutSet announces its size
    assert store.metadata["lhotse"]["manifests"] is None


def test_without_features_and_several_manifests(corpus: dict[str, Path], tmp_path: Path) -> None:
    store = import_lhotse(corpus["plain"], tmp_path / "plain", audio=False)
    assert "num_frames" not in store.schema
    assert_same(store, lhotse.CutSet.from_jsonl_lazy(corpus["plain"]), features=None, audio=None)
    both = import_lhotse([corpus["cuts"], corpus["plain"]], tmp_path / "both", overwrite=True)
    cuts = list(lhotse.CutSet.from_jsonl_lazy(corpus["cuts"])) + list(lhotse.CutSet.from_jsonl_lazy(corpus["plain"]))
    assert_same(both, cuts, features=None, audio=None)  # num_frames: -1 for the cuts of the plain manifest
    assert [int(both[i]["num_frames"]) for i in range(4, 8)] == [-1] * 4


def test_missing_features_names_cut_and_leaves_nothing(corpus: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(MissingFeaturesError, match=r"plain\.jsonl\.gz, cut 'rec0-0'.*no features") as info:
        import_lhotse(corpus["plain"], tmp_path / "s", features=True)
    assert info.value.cut_id == "rec0-0"
    # a later cut without features: found while writing; an existing store stays as it was
    old = import_lhotse(corpus["plain"], tmp_path / "old", audio=False)
    cuts = lhotse.CutSet.from_jsonl_lazy(corpus["cuts"]).subset(first=2) + lhotse.CutSet.from_jsonl_lazy(
        corpus["plain"]).subset(last=1)
    with pytest.raises(MissingFeaturesError, match="rec3-3"):
        import_lhotse(cuts, old.root, features=True, overwrite=True)
    assert len(seqstore.open(old.root)) == 4 and "features" not in seqstore.open(old.root).schema
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]


def test_missing_recording_and_channels(corpus: dict[str, Path], tmp_path: Path) -> None:
    cuts = lhotse.CutSet.from_file(corpus["cuts"]).to_eager()
    no_rec = lhotse.CutSet.from_cuts([cuts[0].drop_recording()])
    with pytest.raises(MissingRecordingError, match=r"<CutSet>, cut 'rec0-0'.*no recording"):
        import_lhotse(no_rec, tmp_path / "s", audio=True)
    assert_same(import_lhotse(no_rec, tmp_path / "s", features=True), no_rec, audio=None)  # without audio: fine
    with pytest.raises(LhotseCutError, match=r"cut 'rec3-3': audio has 2 channels.*channels='first'"):
        import_lhotse(cuts, tmp_path / "t", audio=True)
    assert not (tmp_path / "t").exists()


def test_a_missing_audio_or_feature_file_names_the_manifest_and_cut(corpus: dict[str, Path], tmp_path: Path) -> None:
    """Lhotse's own error for a recording or feature file that is gone named that file only, not the
    manifest or the cut that refers to it."""
    cuts = lhotse.CutSet.from_file(corpus["cuts"]).to_eager()
    gone = tmp_path / "gone.wav"
    gone.write_bytes((corpus["root"] / "rec1.wav").read_bytes())
    rec = lhotse.Recording.from_file(gone, recording_id="rec1")
    gone.unlink()
    cut = cuts[1]
    lhotse.CutSet.from_cuts([cuts[0], lhotse.utils.fastcopy(cut, recording=rec)]).to_file(tmp_path / "m.jsonl")
    with pytest.raises(LhotseCutError, match=rf"m\.jsonl, cut '{cut.id}': cannot load its audio: .*gone\.wav"):
        import_lhotse(tmp_path / "m.jsonl", tmp_path / "s", audio=True)
    assert not (tmp_path / "s").exists()
    moved = lhotse.utils.fastcopy(cut.features, storage_path=str(tmp_path / "nowhere"))
    feats = lhotse.utils.fastcopy(cut, features=moved)
    lhotse.CutSet.from_cuts([cuts[0], feats]).to_file(tmp_path / "f.jsonl")
    with pytest.raises(LhotseCutError, match=rf"f\.jsonl, cut '{cut.id}': cannot load its features"):
        import_lhotse(tmp_path / "f.jsonl", tmp_path / "s", features=True)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(("change", "words"), [({"duration": "abc"}, "could not convert string to float: 'abc'"),
                                              ({"duration": None}, "float"),
                                              ({"supervisions": [{"id": "s", "recording_id": "r", "start": 0.0,
                                                                 "duration": 1.0, "channel": 0, "text": 5}]},
                                               "expected str instance, int found")])
def test_a_cut_of_unreadable_duration_or_text_names_the_manifest_and_cut(tmp_path: Path, change: dict[str, Any],
                                                                         words: str) -> None:
    """A duration that is not a number or a supervision text that is not a string failed in float() or
    str.join, a bare ValueError/TypeError naming neither the manifest nor the cut."""
    def line(i: int, **kw: Any) -> str:
        return json.dumps({"id": f"c{i}", "start": 0.0, "duration": 1.0, "channel": 0, "supervisions": [],
                           "type": "MonoCut", **kw})

    (tmp_path / "m.jsonl").write_text(f"{line(0)}\n{line(1, **change)}\n{line(2)}\n")
    with pytest.raises(LhotseCutError, match=rf"m\.jsonl, cut 'c1': cannot read its duration and texts: .*{words}"):
        import_lhotse(tmp_path / "m.jsonl", tmp_path / "s")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("num_features", ["abc", None, 4.5, True, float("nan")])
def test_a_first_cut_of_unreadable_num_features_names_the_manifest_and_cut(tmp_path: Path, num_features: Any) -> None:
    """With features=True, a first cut whose features' num_features is not a whole number was a bare
    ValueError/TypeError from int() (4.5 was taken as 4)."""
    np.save(tmp_path / "f0.npy", np.ones((100, 4), np.float32))

    def line(i: int, dims: Any) -> str:
        feats = {"type": "fbank", "num_frames": 100, "num_features": dims, "frame_shift": 0.01, "sampling_rate": SR,
                 "start": 0.0, "duration": 1.0, "storage_type": "numpy_files", "storage_path": str(tmp_path),
                 "storage_key": "f0.npy"}
        return json.dumps({"id": f"c{i}", "start": 0.0, "duration": 1.0, "channel": 0, "supervisions": [],
                           "features": feats, "type": "MonoCut"})

    (tmp_path / "m.jsonl").write_text(f"{line(0, num_features)}\n{line(1, 4)}\n")
    with pytest.raises(LhotseCutError, match=rf"m\.jsonl, cut 'c0': its features' num_features .*{num_features!r}"):
        import_lhotse(tmp_path / "m.jsonl", tmp_path / "s", features=True)
    assert not (tmp_path / "s").exists()
    assert list(import_lhotse(tmp_path / "m.jsonl", tmp_path / "s2", features=False).schema) == [
        "duration", "num_frames", "text"]


def test_bad_inputs(corpus: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.jsonl.gz: no such Lhotse manifest"):
        import_lhotse(tmp_path / "nope.jsonl.gz", tmp_path / "s")
    with pytest.raises(SourceFormatError, match="holds a RecordingSet, not cuts"):
        import_lhotse(corpus["recordings"], tmp_path / "s")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(SourceFormatError, match="holds no cuts"):
        import_lhotse(tmp_path / "empty.jsonl", tmp_path / "s")
    with pytest.raises(SourceFormatError, match="expected a JSONL manifest"):
        import_lhotse(corpus["root"] / "rec0.wav", tmp_path / "s")
    with pytest.raises(ValueError, match="features_dtype"):
        import_lhotse(corpus["cuts"], tmp_path / "s", features=True, features_dtype="int8")
    import_lhotse(corpus["plain"], tmp_path / "s", audio=False)
    with pytest.raises(FileExistsError):
        import_lhotse(corpus["plain"], tmp_path / "s", audio=False)


def test_empty_manifests_among_others_are_skipped(corpus: dict[str, Path], tmp_path: Path) -> None:
    """An empty manifest in a list of manifests was an error ("holds no cuts") though the others hold
    cuts; it is skipped, and only a list of empty manifests is an error naming them all."""
    (tmp_path / "empty.jsonl").write_text("")
    with gzip.open(tmp_path / "empty.jsonl.gz", "wt") as f:
        f.write("")
    store = import_lhotse([tmp_path / "empty.jsonl", corpus["plain"], tmp_path / "empty.jsonl.gz"], tmp_path / "s",
                          audio=False)
    assert_same(store, lhotse.CutSet.from_jsonl_lazy(corpus["plain"]), features=None, audio=None)
    with pytest.raises(SourceFormatError, match=r"empty\.jsonl, .*empty\.jsonl\.gz: holds no cuts"):
        import_lhotse([tmp_path / "empty.jsonl", tmp_path / "empty.jsonl.gz"], tmp_path / "s2")
    assert not (tmp_path / "s2").exists()


class _Counting:
    """A progress callback with ``add_total``: the import then counts the manifest's lines first."""

    def __init__(self) -> None:
        self.total = self.done = 0

    def __call__(self, n: int) -> None:
        self.done += n

    def add_total(self, n: int) -> None:
        self.total += n


def test_a_cut_short_gzip_manifest_is_a_named_error(corpus: dict[str, Path], tmp_path: Path) -> None:
    """A ``.jsonl.gz`` manifest cut short (a partial copy) names the manifest, whether its lines are
    counted first (a progress bar) or only read, instead of a bare EOFError from gzip."""
    lines = gzip.decompress(corpus["plain"].read_bytes())
    packed = gzip.compress(lines * 500)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    for progress in (None, _Counting()):
        with pytest.raises(SourceFormatError, match=r"cut\.jsonl\.gz.*ended before the end-of-stream marker"):
            import_lhotse(cut, tmp_path / "s", audio=False, progress=progress)
        assert not (tmp_path / "s").exists()


def test_cli(corpus: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.seqstore"
    assert cli_main(["convert", "--from", "lhotse", "-q", "--features", "--audio", "--audio-dtype", "int16",
                     "--channels", "first", "--text-separator", " / ", str(corpus["cuts"]), str(out)]) == 0
    assert_same(seqstore.open(out), lhotse.CutSet.from_jsonl_lazy(corpus["cuts"]), audio="int16", sep=" / ")
    assert cli_main(["convert", "--from", "lhotse", "--no-audio", str(corpus["plain"]), str(tmp_path / "bar")]) == 0
    assert "4 records" in capsys.readouterr().out
    assert cli_main(["convert", "--from", "lhotse", "-q", "--features", str(corpus["plain"]),
                     str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "cut 'rec0-0'" in err and "--features" in err and "features=True" not in err
    assert cli_main(["convert", "--from", "lhotse", "-q", str(tmp_path / "missing.jsonl.gz"), str(tmp_path / "y")]) == 2
    assert "missing.jsonl.gz: no such Lhotse manifest" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_into_an_s3_store(corpus: dict[str, Path], moto_s3: Any, s3_bucket: str) -> None:
    """A URL as output: built locally, copied up with the manifest last; an existing store is refused."""
    opts = moto_s3.storage_options()
    url = f"s3://{s3_bucket}/cuts.seqstore"
    store = import_lhotse(corpus["cuts"], url, features=True, storage_options=opts)
    assert store.is_remote
    assert_same(store, lhotse.CutSet.from_jsonl_lazy(corpus["cuts"]), audio=None)
    with pytest.raises(FileExistsError, match="cuts.seqstore"):
        import_lhotse(corpus["cuts"], url, storage_options=opts)
    again = import_lhotse(corpus["cuts"], url, storage_options=opts, overwrite=True)
    assert "features" not in again.schema and len(again) == len(store)


# ------------------------------------------------------------------------------------------ workers


def same_store(a: seqstore.Store, b: seqstore.Store) -> None:
    """Same schema, ids, order and values, field by field."""
    assert a.schema == b.schema and len(a) == len(b) > 0
    for i in range(len(a)):
        assert a.id(i) == b.id(i)
        ra, rb = a[i], b[i]
        for name in a.schema:
            assert np.asarray(ra[name]).dtype == np.asarray(rb[name]).dtype
            assert np.array_equal(ra[name], rb[name]), (i, name)


@pytest.fixture
def tiny_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Units of one cut: the tiny corpus is split as a large manifest would be."""
    import seqstore.interop.lhotse as mod

    monkeypatch.setattr(mod, "MIN_UNIT_CUTS", 1)
    monkeypatch.setattr(mod, "PARALLEL_MIN_CUTS", 1)


def test_workers_single_manifest_same_store(corpus: dict[str, Path], tmp_path: Path, tiny_units: None) -> None:
    from lhotse import CutSet

    plain_jsonl = tmp_path / "cuts.jsonl"  # not compressed: read the same way
    CutSet.from_file(corpus["cuts"]).to_file(plain_jsonl)
    one = import_lhotse(corpus["cuts"], tmp_path / "one", features=True, audio=True, channels="first")
    bar = _Bar()

    for src in (corpus["cuts"], plain_jsonl):
        two = import_lhotse(src, tmp_path / "two", features=True, audio=True, channels="first", workers=2,
                            overwrite=True, progress=bar)
        same_store(one, two)
        assert two.metadata["lhotse"] == one.metadata["lhotse"] | {"manifests": [src.name]}
        assert two.num_shards > one.num_shards  # really written as several parts (one per cut here)
    assert sum(bar.seen) == 8 and bar.total == 8  # the counted lines are announced up front


def test_workers_several_manifests_same_store(corpus: dict[str, Path], tmp_path: Path, tiny_units: None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import seqstore.interop.lhotse as mod

    srcs = [corpus["cuts"], corpus["plain"], corpus["cuts"]]
    one = import_lhotse(srcs, tmp_path / "one")
    two = import_lhotse(srcs, tmp_path / "two", workers=2)
    same_store(one, two)
    frames = [int(c.num_frames) for c in lhotse.CutSet.from_file(corpus["cuts"])]
    assert [int(two[i]["num_frames"]) for i in range(12)] == frames + [-1] * 4 + frames
    assert two.num_shards > one.num_shards
    # runs of about total / (8 x workers) cuts, MIN_UNIT_CUTS at least, small manifests sharing one
    assert mod._units([4, 0, 4], 2) == [[(k, a, a + 1)] for k in (0, 2) for a in range(4)]
    monkeypatch.setattr(mod, "MIN_UNIT_CUTS", 3)
    assert mod._units([4, 0, 4], 2) == [[(0, 0, 3)], [(0, 3, 4), (2, 0, 2)], [(2, 2, 4)]]
    assert mod._units([40, 0, 4], 2) == [[(0, a, a + 3)] for a in range(0, 39, 3)] + [[(0, 39, 40), (2, 0, 2)],
                                                                                    [(2, 2, 4)]]
    monkeypatch.setattr(mod, "PARALLEL_MIN_CUTS", 9)  # too few cuts in all: one run
    assert mod._units([4, 0, 4], 2) == [[(0, 0, 4), (2, 0, 4)]]


def test_worker_error_is_named_and_leaves_nothing(corpus: dict[str, Path], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import seqstore.interop.lhotse as mod

    monkeypatch.setattr(mod, "MIN_UNIT_CUTS", 2)
    monkeypatch.setattr(mod, "PARALLEL_MIN_CUTS", 1)
    with gzip.open(corpus["cuts"], "rt") as f:
        good = f.read().splitlines()
    with gzip.open(corpus["plain"], "rt") as f:
        plain = f.read().splitlines()
    # the first cut has features, the second none: both in the first unit, which a worker process writes
    # (this process takes units from the last one backwards)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join([good[0], plain[1]] + good[1:] * 2) + "\n")
    with pytest.raises(MissingFeaturesError, match=r"mixed\.jsonl, cut 'rec1-1'.*no features") as info:
        import_lhotse(mixed, tmp_path / "s", features=True, workers=2)
    assert info.value.cut_id == "rec1-1" and info.value.path == str(mixed)
    assert info.value.__cause__ is not None and "Traceback" in str(info.value.__cause__)  # from the worker
    # the same found by this process (the last manifest's cuts); an existing store stays as it was
    old = import_lhotse(corpus["plain"], tmp_path / "old", audio=False)
    with pytest.raises(MissingFeaturesError, match=r"plain\.jsonl\.gz, cut 'rec\d-\d'.*no features"):
        import_lhotse([corpus["cuts"], corpus["plain"]], old.root, features=True, workers=2, overwrite=True)
    bad = tmp_path / "bad.jsonl"  # a line that is not JSON
    bad.write_text("\n".join(good[:3] + ["{not json"] + good) + "\n")
    with pytest.raises(SourceFormatError, match=r"bad\.jsonl.*line 4: not a Lhotse cut"):
        import_lhotse(bad, old.root, features=True, workers=2, overwrite=True)
    # in one process the same line is named the same way (and a blank line, which Lhotse cannot parse either)
    with pytest.raises(SourceFormatError, match=r"bad\.jsonl.*line 4: not a Lhotse cut"):
        import_lhotse(bad, old.root, features=True, overwrite=True)
    bad.write_text("\n".join(good[:2] + [""] + good) + "\n")
    with pytest.raises(SourceFormatError, match=r"bad\.jsonl.*line 3: not a Lhotse cut"):
        import_lhotse([corpus["cuts"], bad], old.root, features=True, overwrite=True)
    assert len(seqstore.open(old.root)) == 4 and "features" not in seqstore.open(old.root).schema
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "mixed.jsonl", "old"]


def test_workers_into_an_s3_store(corpus: dict[str, Path], moto_s3: Any, s3_bucket: str, tmp_path: Path,
                                  tiny_units: None) -> None:
    opts = moto_s3.storage_options()
    url = f"s3://{s3_bucket}/cuts.seqstore"
    one = import_lhotse(corpus["cuts"], tmp_path / "one", features=True)
    two = import_lhotse(corpus["cuts"], url, features=True, workers=2, storage_options=opts)
    assert two.is_remote
    same_store(one, two)
    with pytest.raises(MissingFeaturesError, match="plain.jsonl.gz"):
        import_lhotse([corpus["cuts"], corpus["plain"]], url, features=True, workers=2, storage_options=opts,
                      overwrite=True)
    same_store(one, seqstore.open(url, storage_options=opts))  # the old store stays as it was


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_plain_manifest_runs_start_at_noted_offsets(corpus: dict[str, Path], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, trailing_newline: bool) -> None:
    """A worker enters a plain manifest at the offset noted for the nearest line before its run: the same
    cuts as reading past every line (gzip: no offsets, read from the start)."""
    from seqstore.interop import _lhotse_manifest as mod

    monkeypatch.setattr(mod, "MARK_LINES", 3)
    with gzip.open(corpus["cuts"], "rt") as f:
        lines = f.read().splitlines() * 3  # 12 lines
    plain = tmp_path / "cuts.jsonl"
    plain.write_text("\n".join(lines) + ("\n" if trailing_newline else ""))
    n, marks = mod.scan_manifest(str(plain))
    assert n == len(lines) == mod.count_cuts(plain)
    offsets = [len("\n".join(lines[:k]).encode()) + 1 for k in (3, 6, 9)]  # bytes (the texts are not ASCII)
    assert marks is not None and marks.tolist()[:4] == [0, *offsets]
    everything = [c.id for c in mod.manifest_cuts(str(plain), 0, None)]
    for start, stop in [(0, 12), (2, 5), (3, 4), (5, 12), (9, None), (11, 12), (12, None)]:
        got = [c.id for c in mod.manifest_cuts(str(plain), start, stop, marks)]
        assert got == everything[start:stop], (start, stop)
    assert mod.scan_manifest(str(corpus["cuts"]))[1] is None


def test_cut_spans_and_other_cut_types_read_as_lhotse_reads_them(corpus: dict[str, Path], tmp_path: Path) -> None:
    """MonoCut lines are read without Lhotse's cut objects (``LeanCut``), other lines by Lhotse: cuts that
    start inside their features, of many lengths, one a frame longer than its features (Lhotse repeats the
    last frame), and a MixedCut give what ``cut.load_features()`` gives, with Lhotse's ``num_frames``."""
    from lhotse import CutSet, MonoCut

    from seqstore.interop import _lhotse_manifest as mod

    base = [c for c in CutSet.from_file(corpus["cuts"]) if c.id.startswith(("rec0", "rec1", "rec2"))]
    rng = np.random.default_rng(3)
    spans = []
    for k in range(40):
        cut = base[k % len(base)]
        offset = float(rng.uniform(0, cut.duration / 2))
        spans.append(cut.truncate(offset=offset, duration=float(rng.uniform(0.011, cut.duration - offset)),
                                  preserve_id=False))
    longer = base[1].to_dict()
    longer["id"], longer["duration"] = "longer", base[1].duration + base[1].frame_shift
    manifest = tmp_path / "spans.jsonl"
    CutSet.from_cuts([*spans, MonoCut.from_dict(longer), base[0].append(base[1])]).to_file(manifest)

    parsed = list(mod.manifest_cuts(str(manifest), 0, None, lean=True))
    assert [type(c).__name__ for c in parsed] == ["LeanCut"] * 41 + ["MixedCut"]
    assert all(c.start > 0 for c in parsed[:40])
    store = import_lhotse(manifest, tmp_path / "s", features=True)
    assert_same(store, CutSet.from_file(manifest), audio=None)
    feats = store[40]["features"]
    assert len(feats) == base[1].num_frames + 1 and np.array_equal(feats[-1], feats[-2])
    assert [type(c).__name__ for c in mod.manifest_cuts(str(manifest), 0, 3)] == ["MonoCut"] * 3


def test_gzip_runs_in_order_go_on_from_the_kept_stream(corpus: dict[str, Path], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of a gzip manifest read to its end leaves its stream for a next run at or after it (a worker
    takes runs in order): the same cuts, one decompression from the start instead of one per run; a run
    before it, another manifest or a rewritten file opens the file again; forget_streams closes it."""
    from seqstore.interop import _lhotse_manifest as mod

    with gzip.open(corpus["cuts"], "rt") as f:
        lines = f.read().splitlines() * 3  # 12 lines
    path = tmp_path / "cuts.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    opened: list[str] = []
    real_open = mod.open_manifest
    monkeypatch.setattr(mod, "open_manifest", lambda p: (opened.append(p), real_open(p))[1])
    everything = [c.id for c in mod.manifest_cuts(str(path), 0, None)]
    assert len(opened) == 1 and not mod._LEFT  # to the end (stop None): nothing kept
    runs = [(0, 3), (3, 5), (7, 10), (10, 12)]
    got = [[c.id for c in mod.manifest_cuts(str(path), a, b)] for a, b in runs]
    assert got == [everything[a:b] for a, b in runs] and len(opened) == 2  # one new stream for the four
    kept = mod._LEFT[0][3]
    assert [c.id for c in mod.manifest_cuts(str(path), 4, 6)] == everything[4:6]  # backwards: opened again
    assert len(opened) == 3 and kept.closed
    with gzip.open(path, "wt") as f:  # the file changed under the kept stream: not reused
        f.write("\n".join(lines[:8]) + "\n")
    assert [c.id for c in mod.manifest_cuts(str(path), 6, 8)] == everything[6:8] and len(opened) == 4
    half = mod.manifest_cuts(str(path), 0, 4)
    next(half)
    half.close()  # a run not read to its end keeps nothing
    assert not mod._LEFT
    list(mod.manifest_cuts(str(path), 0, 2))
    left = mod._LEFT[0][3]
    mod.forget_streams()
    assert left.closed and not mod._LEFT
