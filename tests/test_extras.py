"""The ecosystem extras: ``seqstore[lhotse]``, ``[webdataset]`` and ``[megatron]`` exist, with the pins of
the dev extra, and the docs name them (not the dev extra, which pulls Ray, Spark and more)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = Path(__file__).resolve().parents[1]


def test_ecosystem_extras_match_dev_pins() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    dev = set(extras["dev"])
    for name, package in (("lhotse", "lhotse"), ("webdataset", "webdataset"), ("megatron", "megatron-core")):
        assert name in extras, name
        assert all(req in dev for req in extras[name]), (name, extras[name])
        assert any(req.startswith(package + "==") for req in extras[name]), extras[name]


def test_docs_name_the_extras() -> None:
    text = "\n".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))
    for name in ("lhotse", "webdataset", "megatron"):
        assert f"seqstore[{name}]" in text, name
    assert not re.search(r"extra `dev`", text)
