"""The shard layout in Redis: created once, changed only by compare-and-set of its epoch, one
admin at a time, each namespace apart; a Redis that can't be reached is said plainly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from state_support import RedisServer, redis_server

from ctxactors.errors import StoreUnavailableError
from ctxactors.ray._directory import Directory, Layout, LayoutChangedError


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


def test_the_next_layout_takes_the_next_epoch() -> None:
    assert Layout(4, 2).next(3) == Layout(5, 3)
    assert Layout(4, 2).next(1) == Layout(5, 1)


def test_the_first_layout_is_stored_and_later_defaults_change_nothing(server: RedisServer) -> None:
    directory = Directory(server.url, "first")
    try:
        assert directory.layout(3) == Layout(1, 3)
        assert directory.layout(7) == Layout(1, 3)
        stored = redis.Redis.from_url(server.url).hgetall("ctxactors:ray:first:layout")
        assert stored == {b"epoch": b"1", b"count": b"3"}
    finally:
        directory.close()


def test_a_change_is_stored_as_the_next_epoch_only_if_planned_from_the_stored_one(
    server: RedisServer,
) -> None:
    directory = Directory(server.url, "cas")
    other = Directory(server.url, "cas")  # another admin
    try:
        planned = directory.layout(2)
        assert other.replace(planned, 3) == Layout(2, 3)
        assert directory.layout(2) == Layout(2, 3)
        # Planned from epoch 1, which is gone: refused, and the stored layout is kept.
        with pytest.raises(LayoutChangedError) as refused:
            directory.replace(planned, 5)
        assert str(refused.value) == (
            "the shard layout changed meanwhile (epoch 2, 3 shards): look again and retry"
        )
        assert directory.layout(2) == Layout(2, 3)
        assert directory.replace(Layout(2, 3), 1) == Layout(3, 1)
        assert other.layout(9) == Layout(3, 1)
    finally:
        directory.close()
        other.close()


def test_each_namespace_has_its_own_layout_and_its_own_admin_lock(server: RedisServer) -> None:
    a, b, a_again = (Directory(server.url, ns) for ns in ("ns-a", "ns-b", "ns-a"))
    try:
        assert a.layout(2) == Layout(1, 2)
        assert b.layout(4) == Layout(1, 4)
        assert a.replace(Layout(1, 2), 3) == Layout(2, 3)
        assert b.layout(4) == Layout(1, 4)
        with a.changing(timeout=5.0):
            with b.changing(timeout=5.0):  # another namespace: not held up
                pass
            # The same namespace waits up to its timeout (a short one: it is bound to fail).
            with pytest.raises(LayoutChangedError) as refused, a_again.changing(timeout=0.1):
                pass
            assert str(refused.value) == (
                "another change of the shard layout is still running after 0.1 s: "
                "retry when it is done"
            )
        with a_again.changing(timeout=5.0):  # released
            pass
    finally:
        for d in (a, b, a_again):
            d.close()


def test_the_layout_s_redis_gives_up_after_five_seconds_rather_than_hang() -> None:
    # A stalled Redis must fail a shard's start or an admin's change in bounded time; the
    # client's own timeouts are what bound it (waiting them out here would take 10 s).
    directory = Directory("redis://127.0.0.1:1/0", "timeouts")
    try:
        kwargs = directory._redis.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (5, 5)
    finally:
        directory.close()


def test_a_layout_s_redis_that_cannot_be_reached_is_said_plainly(tmp_path: Path) -> None:
    with redis_server(tmp_path) as down:
        url = down.url
    directory = Directory(url, "down")
    try:
        with pytest.raises(StoreUnavailableError, match="^the shard layout's Redis: .*refused"):
            directory.layout(2)
        with pytest.raises(StoreUnavailableError, match="^the shard layout's Redis: "):
            directory.replace(Layout(1, 2), 3)
    finally:
        directory.close()
