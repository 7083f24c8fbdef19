"""Every progress bar of the command line ends at exactly its total, counts one unit, and is drawn only
once the inputs are validated; CLI errors spell options as the CLI does.

tqdm is replaced (in each module that draws bars) by a subclass that records desc, unit, total and
final count when a bar closes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tqdm import tqdm

import seqstore as ss
import seqstore.cli
import seqstore.demo
import seqstore.interop.commands
from seqstore.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent / "interop"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "log"))


class Bars(list[dict[str, Any]]):
    def named(self, prefix: str) -> list[dict[str, Any]]:
        return [b for b in self if str(b["desc"]).startswith(prefix)]


@pytest.fixture
def bars(monkeypatch: pytest.MonkeyPatch) -> Bars:
    seen = Bars()

    class Recording(tqdm):  # type: ignore[misc]
        def close(self) -> None:
            if not self.disable and not getattr(self, "_recorded", False):
                self._recorded = True
                seen.append({"desc": self.desc, "unit": self.unit, "total": self.total, "n": self.n})
            super().close()

    for module in (seqstore.cli, seqstore.interop.commands, seqstore.demo):
        monkeypatch.setattr(module, "tqdm", Recording)
    return seen


def _complete(bar: dict[str, Any]) -> None:
    assert bar["total"] is not None and bar["total"] > 0, bar
    assert bar["n"] == bar["total"], bar


def _store(path: Path, **kw: Any) -> Path:
    schema = {"x": ss.Field("float32", (None, 3)), "y": ss.Field("int16"), "z": ss.Field("int16", (2,))}
    with ss.create(path, schema, max_shard_records=40, **kw) as w:
        for i in range(100):
            w.append({"x": np.full((i % 9, 3), i), "y": i, "z": np.arange(2) + i}, id=f"r{i}")
    return path


@pytest.mark.parametrize("packed", [False, True])
def test_verify_bar_ends_at_total(tmp_path: Path, bars: Bars, packed: bool) -> None:
    kw: dict[str, Any] = {"packed": {"g": ["y", "z"]}, "direct_io": True} if packed else {}
    store = _store(tmp_path / "s.seqstore", **kw)
    assert main(["verify", str(store)]) == 0
    [bar] = bars.named("verify")
    _complete(bar)
    assert bar["unit"] == "B" and bar["total"] == ss.store.verify.total_bytes(ss.open(store).manifest)


def test_info_bars_count_records_and_info_shows_open_cost(
    tmp_path: Path, bars: Bars, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _store(tmp_path / "s.seqstore")
    assert main(["info", str(store)]) == 0
    got = bars.named("lengths of x")
    assert [b["desc"] for b in got] == ["lengths of x"]  # one pass over the lengths (issue 25)
    for b in got:
        _complete(b)
        assert b["total"] == 100 and b["unit"] == "rec"
    out = capsys.readouterr().out
    manifest = (store / "manifest.json").stat().st_size
    assert "shards    3" in out and "format    version" in out
    assert f"({manifest}) manifest.json" in out
    assert "open      " in out and " ms, private memory " in out


@pytest.fixture
def hdf_files(tmp_path: Path) -> list[Path]:
    pytest.importorskip("returnn")
    from interop_testlib import write_returnn_hdf

    write_returnn_hdf(tmp_path / "a.hdf", n=30, seed=1)
    write_returnn_hdf(tmp_path / "b.hdf", n=20, seed=2)
    return [tmp_path / "a.hdf", tmp_path / "b.hdf"]


def test_convert_returnn_hdf_and_export_bars(tmp_path: Path, bars: Bars, hdf_files: list[Path]) -> None:
    out = tmp_path / "ab.seqstore"
    assert main(["convert", "--from", "returnn-hdf", *map(str, hdf_files), str(out), "--chunk-mb", "1"]) == 0
    [bar] = bars.named("convert returnn-hdf")
    _complete(bar)
    assert bar["unit"] == "B"
    # export: the bar counts the bytes of the exported streams only
    for extra in ([], ["--inputs", "none", "--field", "classes=cls"]):
        bars.clear()
        assert main(["export", "--to", "returnn-hdf", str(out), str(tmp_path / f"e{len(extra)}.hdf"), *extra]) == 0
        [bar] = bars.named("export returnn-hdf")
        _complete(bar)
    store = ss.open(out)
    assert bar["total"] == sum(4 * len(store[i]["classes"]) for i in range(len(store)))  # int32 rows


def _parquet(tmp_path: Path, n: int) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    # compressible (repeated) values: Parquet's file size is far below the decompressed size
    toks = [np.full(int(rng.integers(0, 50)), k % 3).tolist() for k in range(n)]
    t = pa.table({"key": [f"k{k}" for k in range(n)], "toks": pa.array(toks, pa.list_(pa.int64()))})
    path = tmp_path / "t.parquet"
    pq.write_table(t, path, row_group_size=64)
    return path


def test_convert_parquet_and_arrow_bars_count_records(tmp_path: Path, bars: Bars) -> None:
    pa = pytest.importorskip("pyarrow")
    src = _parquet(tmp_path, 500)
    assert main(["convert", "--from", "parquet", str(src), str(tmp_path / "p.seqstore"), "--id-column", "key"]) == 0
    [bar] = bars.named("convert parquet")
    _complete(bar)
    assert bar["total"] == 500 and bar["unit"] == "rec"
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    for kind in ("file", "stream"):
        path = tmp_path / f"t-{kind}.arrow"
        with pa.OSFile(str(path), "wb") as sink:
            w = pa.ipc.new_file(sink, table.schema) if kind == "file" else pa.ipc.new_stream(sink, table.schema)
            with w:
                for b in table.to_batches(max_chunksize=70):
                    w.write_batch(b)
        bars.clear()
        assert main(["convert", "--from", "arrow", str(path), str(tmp_path / f"{kind}.seqstore"),
                     "--id-column", "key", "--chunk-mb", "1"]) == 0
        [bar] = bars.named("convert arrow")
        _complete(bar)
        assert bar["total"] == 500


def test_convert_logix_bar_counts_imported_records(tmp_path: Path, bars: Bars) -> None:
    from logix_gen import EXPECTED_IDS, write_analog

    write_analog(tmp_path / "logs")  # holds 3 later duplicates, which are not imported
    assert main(["convert", "--from", "logix", str(tmp_path / "logs"), str(tmp_path / "l.seqstore")]) == 0
    [bar] = bars.named("convert logix")
    _complete(bar)
    assert bar["total"] == len(EXPECTED_IDS) == len(ss.open(tmp_path / "l.seqstore"))


def test_demo_bars_end_at_total(tmp_path: Path, bars: Bars) -> None:
    assert main(["demo", "--records", "3000", "--out", str(tmp_path)]) == 0
    assert {b["desc"] for b in bars} >= {"write", "epoch"}
    for b in bars:
        _complete(b)


def test_failed_convert_draws_no_bar_and_speaks_cli(
    tmp_path: Path, bars: Bars, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _parquet(tmp_path, 20)
    out = tmp_path / "p.seqstore"
    assert main(["convert", "--from", "parquet", str(src), str(out), "--id-column", "key", "-q"]) == 0
    capsys.readouterr()
    cases = {
        "exists": (["convert", "--from", "parquet", str(src), str(out), "--id-column", "key"],
                   "pass --overwrite to replace it"),
        "missing": (["convert", "--from", "parquet", str(tmp_path / "nope.parquet"), str(tmp_path / "o1")],
                    "nope.parquet: no such file"),
        "junk": (["convert", "--from", "parquet", str(tmp_path / "junk.parquet"), str(tmp_path / "o2")],
                 "junk.parquet"),
        "bad map": (["convert", "--from", "parquet", str(src), str(tmp_path / "o3"), "--map", "key=k"],
                    "--map COLUMN=FIELD"),
        "export exists": (["export", "--to", "returnn-hdf", str(out), str(src)], "pass --overwrite"),
    }
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all" * 10)
    for name, (argv, needle) in cases.items():
        bars.clear()
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        assert needle in err, (name, err)
        assert "overwrite=True" not in err and "columns={" not in err, (name, err)
        assert bars == [] and "%|" not in err, (name, err)  # no bar was drawn


def test_library_errors_speak_python(tmp_path: Path) -> None:
    from seqstore.interop.arrow import import_parquet

    src = _parquet(tmp_path, 5)
    import_parquet(src, tmp_path / "p.seqstore", id_column="key")
    with pytest.raises(FileExistsError, match=r"pass overwrite=True to replace it"):
        import_parquet(src, tmp_path / "p.seqstore", id_column="key")
    with pytest.raises(ss.SchemaError, match=r"columns=\{column: field\}"):
        import_parquet(src, tmp_path / "q.seqstore", columns={"key": "k"})
