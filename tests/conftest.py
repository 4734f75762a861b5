"""Shared fixtures: a runtime that is always closed, and a manual clock for reaping tests.

Helpers a test imports live in `ctxactors.testing` (host apps use them too).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from mcp_support import TEST_DIRS

from ctxactors import Runtime
from ctxactors.logs import configure_logging
from ctxactors.settings import Settings
from ctxactors.testing import ManualClock

# A test module may import another folder's by its basename (all unique), as when they
# were one flat directory: every test folder is on sys.path before any is collected.
sys.path[:0] = [str(d) for d in TEST_DIRS if str(d) not in sys.path]

# The workspace fixtures (workspace_root, leaks, rt): see workspace_support; the Ray
# cluster every Ray test shares (cluster): see ray_support; how the suite spreads over
# pytest-xdist's workers: see parallel.
pytest_plugins = ("workspace_support", "ray_support", "parallel")


@pytest.fixture(autouse=True)
def default_logging() -> None:
    """Every test starts from the default log configuration (some commands change it)."""
    configure_logging(format="json", level="info", force=True)


@pytest.fixture
def rt_settings() -> Settings:
    """The settings a module's runtime fixture is made with; a test that needs other limits
    parametrizes it: ``@pytest.mark.parametrize("rt_settings", [Settings(...)])``."""
    return Settings.from_env()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    rt = Runtime()
    try:
        yield rt
    finally:
        rt.close()
