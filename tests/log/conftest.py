"""Fixtures of the logging tests."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh directory (on tmpfs when available: commits fsync often)."""
    parent = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="seqstore-log-test-", dir=parent) as d:
        yield Path(d)
