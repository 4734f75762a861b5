"""What the store tests share: a redis-server for the module, and a store that can be
opened again (a restart) on SQLite or Redis."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from state_support import RedisServer, redis_server

from ctxactors.state import RedisStore, SQLiteStore, StateStore


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(params=["sqlite", "redis"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Opens the same store again each time it is called (a restart reopens it)."""
    opened: list[StateStore] = []
    prefix = f"t{os.urandom(4).hex()}"

    def make() -> StateStore:
        store: StateStore
        if request.param == "sqlite":
            store = SQLiteStore(tmp_path / "state.db")
        else:
            server: RedisServer = request.getfixturevalue("redis")
            store = RedisStore(server.url, prefix=prefix)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()
