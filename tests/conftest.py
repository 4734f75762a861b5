"""Shared fixtures: a runtime that is always closed, and a manual clock for reaping tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from ctxactors import Runtime
from ctxactors.logs import configure_logging
from ctxactors.settings import Settings


class ManualClock:
    """A monotonic clock that only moves when a test says so."""

    def __init__(self) -> None:
        self._now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


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


def ctx_args(
    session: str, assistant: str | None = None, thread: str | None = None, **args: object
) -> dict[str, object]:
    """Arguments as the host middleware would send them."""
    out: dict[str, object] = dict(args)
    out["__sessionId"] = session
    if assistant is not None:
        out["__assistantId"] = assistant
    if thread is not None:
        out["__threadId"] = thread
    return out
