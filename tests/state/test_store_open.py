"""Choosing the store from `serve`'s ``--store`` and ``--data-dir``, and what an operator
reads when the SQLite file can't be used."""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from state_support import RedisServer, redis_server

from ctxactors.state import Record, RedisStore, SQLiteStore, StoreUnavailableError, Write
from ctxactors.state._open import default_data_dir, open_store


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


def test_the_default_data_dir_follows_xdg_state_home_when_it_is_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_data_dir() == tmp_path / "state" / "ctxactors"
    # The XDG spec: a relative path is invalid and ignored, as is an empty one.
    for ignored in ("relative/state", ""):
        monkeypatch.setenv("XDG_STATE_HOME", ignored)
        assert default_data_dir() == home / ".local" / "state" / "ctxactors"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_data_dir() == home / ".local" / "state" / "ctxactors"


def test_sqlite_is_a_private_file_in_the_data_dir(tmp_path: Path) -> None:
    store = open_store("sqlite", data_dir=tmp_path / "data" / "dir", retention=60.0)
    try:
        assert isinstance(store, SQLiteStore)
        assert store.path == tmp_path / "data" / "dir" / "state.db"
        assert store.retention == 60.0
        assert stat.S_IMODE((tmp_path / "data" / "dir").stat().st_mode) == 0o700
    finally:
        assert store is not None
        store.close()


def test_sqlite_without_a_data_dir_goes_to_the_default_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    store = open_store("sqlite", data_dir=None, retention=3600.0)
    try:
        assert isinstance(store, SQLiteStore)
        assert store.path == tmp_path / "ctxactors" / "state.db"
    finally:
        assert store is not None
        store.close()


def test_memory_means_no_store_and_redis_urls_a_redis_store(redis: RedisServer) -> None:
    assert open_store("memory", data_dir=None, retention=1.0) is None
    store = open_store(redis.url, data_dir=None, retention=120.0)
    try:
        assert type(store).__name__ == "RedisStore"
        assert store is not None and store.retention == 120.0
    finally:
        assert store is not None
        store.close()


@pytest.mark.parametrize("retention", [0.0, -1.0, math.nan])
def test_a_retention_that_is_not_positive_is_refused(retention: float, tmp_path: Path) -> None:
    with pytest.raises(ValueError) as refused:
        open_store("sqlite", data_dir=tmp_path, retention=retention)
    assert str(refused.value) == f"retention must be positive, got {retention}"
    assert not (tmp_path / "state.db").exists()


@pytest.mark.parametrize("spec", ["postgres://db", "SQLITE", "redis:/x", ""])
def test_an_unknown_store_is_refused_saying_what_is_known(spec: str) -> None:
    with pytest.raises(ValueError) as refused:
        open_store(spec, data_dir=None, retention=1.0)
    assert str(refused.value) == (f"unknown store {spec!r}: use sqlite, memory or a redis:// URL")


def test_a_damaged_file_says_which_file_and_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not a database, " * 200)
    with pytest.raises(StoreUnavailableError) as refused:
        SQLiteStore(path)
    assert str(refused.value) == (
        f"the state store {path} is damaged (file is not a database): move it aside to "
        "start with an empty store, or restore it from a backup"
    )


def test_a_file_sqlite_cannot_open_says_what_to_check(tmp_path: Path) -> None:
    # A directory where the file should be: SQLite can't open it, and it is not damage.
    path = tmp_path / "state.db"
    path.mkdir()
    with pytest.raises(StoreUnavailableError) as refused:
        SQLiteStore(path)
    assert str(refused.value) == (
        f"the state store {path} can't be opened (unable to open database file): check "
        "that this user may read and write it and its directory, and that the disk has room"
    )
    assert os.listdir(path) == []


def test_sqlite_opened_again_in_its_data_dir_has_what_was_saved(tmp_path: Path) -> None:
    for expected, data in ((0, b"first"), (1, b"second")):
        store = open_store("sqlite", data_dir=tmp_path / "data", retention=60.0)
        assert store is not None
        try:
            assert store.write([Write((None, "s1"), ("k",), data, expected)]) == [expected + 1]
        finally:
            store.close()


def test_a_unix_socket_or_tls_url_is_a_redis_store(redis: RedisServer) -> None:
    store = open_store(f"unix://{redis.socket}", data_dir=None, retention=120.0)
    assert isinstance(store, RedisStore)
    try:
        assert store.write([Write((None, "s1"), ("k",), b"over the socket", 0)]) == [1]
        assert store.load((None, "s1"), ("k",)) == Record(1, b"over the socket", {})
    finally:
        store.close()
    # TLS: nothing is connected before the first use.
    tls = open_store("rediss://127.0.0.1:1/0", data_dir=None, retention=30.0)
    assert isinstance(tls, RedisStore) and tls.retention == 30.0
    tls.close()
