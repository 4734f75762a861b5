"""At most once: a call id is claimed once per namespace, for a few call timeouts, and a claim
that can't be made (Redis down) is an error, never a silent second run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from state_support import RedisServer, redis_server

from ctxactors.errors import StoreUnavailableError
from ctxactors.ray._claims import Claims


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


def test_an_id_is_claimed_once_until_it_is_given_back(server: RedisServer) -> None:
    async def run() -> list[bool]:
        claims = Claims(server.url, "once", keep=60)
        seen = [await claims.first("c1"), await claims.first("c1"), await claims.first("c2")]
        await claims.release("c1")
        seen += [await claims.first("c1"), await claims.first("c1")]
        await claims._redis.aclose()
        return seen

    assert asyncio.run(run()) == [True, False, True, True, False]


def test_each_namespace_claims_its_own_ids(server: RedisServer) -> None:
    async def run() -> list[bool]:
        a, b = Claims(server.url, "ns-a", keep=60), Claims(server.url, "ns-b", keep=60)
        seen = [await a.first("c1"), await b.first("c1"), await b.first("c1")]
        await a._redis.aclose()
        await b._redis.aclose()
        return seen

    assert asyncio.run(run()) == [True, True, False]
    keys = redis.Redis.from_url(server.url).keys("ctxactors:ray:ns-*")
    assert sorted(keys) == [b"ctxactors:ray:ns-a:call:c1", b"ctxactors:ray:ns-b:call:c1"]


def test_a_claim_is_kept_for_its_seconds(server: RedisServer) -> None:
    claims_kept(server, "keep-120", 120.0)
    left = redis.Redis.from_url(server.url).pttl("ctxactors:ray:keep-120:call:c1")
    assert 110_000 <= left <= 120_000  # Redis expires it by itself (SET EX)


def test_a_claim_kept_for_a_fraction_of_a_second_is_kept_for_one(server: RedisServer) -> None:
    claims_kept(server, "keep-0.3", 0.3)
    # Whole seconds: one, so at most 1000 ms are left (or none: -2, it is gone already on
    # a slow machine), and never no expiry (-1).
    left = redis.Redis.from_url(server.url).pttl("ctxactors:ray:keep-0.3:call:c1")
    assert left <= 1000 and left != -1


def claims_kept(server: RedisServer, namespace: str, keep: float) -> None:
    """Claim ``c1`` in `namespace` with claims kept `keep` seconds."""

    async def run() -> None:
        claims = Claims(server.url, namespace, keep=keep)
        assert await claims.first("c1")
        await claims._redis.aclose()

    asyncio.run(run())


def test_a_claim_that_cannot_be_made_is_an_error_and_a_release_never_fails(
    tmp_path: Path,
) -> None:
    with redis_server(tmp_path) as down:
        url = down.url

    async def run() -> None:
        claims = Claims(url, "down", keep=60)
        with pytest.raises(StoreUnavailableError) as refused:
            await claims.first("c1")
        # What reaches the tenant names no address (redis-py's text does).
        assert str(refused.value) == "the state store did not answer: no connection to Redis"
        await claims.release("c1")  # best effort: no error
        await claims._redis.aclose()

    asyncio.run(run())


def test_a_stalled_redis_fails_a_claim_after_five_seconds_rather_than_hang() -> None:
    # The client's own timeouts bound it (waiting them out here would take 10 s).
    claims = Claims("redis://127.0.0.1:1/0", "timeouts", keep=60)
    kwargs = claims._redis.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (5, 5)
