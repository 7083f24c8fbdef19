"""``seqstore copy --workers``: 0, a negative or a non-number is a usage error naming the option (exit 2),
as for ``convert --workers``, before anything is opened."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqstore.cli import main


@pytest.mark.parametrize("workers", ["0", "-3", "x"])
def test_copy_workers_below_one_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 workers: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["copy", str(tmp_path / "src"), str(tmp_path / "dst"), "--workers", workers, "-q"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--workers" in err and f"expected a positive integer, got '{workers}'" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["info", "verify"])
def test_storage_options_for_a_local_store_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       command: str) -> None:
    """``seqstore info ./store -o endpoint=...`` ignored the option (``copy`` and ``convert`` refuse it)."""
    import numpy as np

    import seqstore as ss

    path = tmp_path / "s.seqstore"
    with ss.create(path, {"x": ss.Field("float32", (None, 2))}) as w:
        w.append({"x": np.ones((2, 2))})
    assert main([command, str(path), "-q", "-o", "endpoint=http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error:") and "-o options are for URLs of object storage" in err, err
    assert main([command, str(path), "-q"]) == 0


def test_every_exit_status_is_in_the_help_and_the_docs(capsys: pytest.CaptureFixture[str]) -> None:
    """The command exits 2 when a conversion worker process is killed and 1 when ``verify`` finds problems
    (or 141 for a closed pipe), but docs/interop.md listed neither; every status ``main`` and the
    commands return is in one table, shown by ``seqstore --help`` and listed in the docs."""
    import re

    from seqstore.cli import EXIT_STATUSES

    root = Path(__file__).resolve().parents[1]
    used = {int(n) for name in ("src/seqstore/cli.py", "src/seqstore/interop/commands.py")
            for n in re.findall(r"^\s+return (\d+)$", (root / name).read_text(), flags=re.M)}
    assert used | {2} == set(EXIT_STATUSES)  # (2 also for argparse's usage errors)
    assert "worker" in EXIT_STATUSES[2] and "verify" in EXIT_STATUSES[1]
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    docs = (root / "docs" / "interop.md").read_text()
    for status, meaning in EXIT_STATUSES.items():
        assert f"{status}: {meaning}" in shown
        assert f"| {status} | {meaning} |" in docs


@pytest.mark.parametrize("argv", [["info", "s3://b/x.seqstore", "-o", "region=a", "-o", "region=b"],
                                  ["verify", "s3://b/x.seqstore", "-o", "region=a", "-o", "region=b"],
                                  ["copy", "s3://b/x.seqstore", "y", "--src-option", "region=a", "--src-option",
                                   "region=b"]])
def test_a_storage_option_given_twice_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """``seqstore info URL -o region=a -o region=b`` used the last value silently (``convert`` and ``export``
    refuse a name given twice): one line naming the option, exit 2, before anything is opened."""
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqstore: error:") and "'region=b': expected each name once" in err, err
    assert list(tmp_path.iterdir()) == []
