"""Fixtures shared by the servers' tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ctxactors.state import SQLiteStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    """A real SQLite file, sessions kept an hour (a test file may define its own)."""
    opened = SQLiteStore(tmp_path / "state.db", retention=3600)
    yield opened
    opened.close()
