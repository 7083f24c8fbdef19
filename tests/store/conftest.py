"""Fixtures of the store tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from store_testlib import new_scratch


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh directory for stores (on tmpfs when available: commits fsync often)."""
    with new_scratch() as d:
        yield Path(d)
