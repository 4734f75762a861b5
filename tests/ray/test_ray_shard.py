"""A shard's ownership check against a layout that changes while a call waits on Redis.

The shard body runs here as a plain object on a real Redis (no Ray cluster needed): its
methods are coroutines on one event loop, which is how a Ray async actor runs them too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from state_support import redis_server

from ctxactors.ray._directory import Layout
from ctxactors.ray._hashing import owner
from ctxactors.ray._shard import Moved, Shard, ShardConfig

pytest.importorskip("ray")


def _moving_session() -> str:
    """A session shard 0 owns of 2 shards, and shard 2 owns of 3."""
    i = 0
    while not (owner((None, f"m{i}"), 2) == 0 and owner((None, f"m{i}"), 3) == 2):
        i += 1
    return f"m{i}"


def test_a_call_whose_session_moves_while_its_claim_is_made_does_not_run_here(
    tmp_path: Path,
) -> None:
    session = _moving_session()
    with redis_server(tmp_path) as redis:
        config = ShardConfig(
            namespace="race",
            store=redis.url,
            servers=["ctxactors.servers.planning:Planning"],
            shards=2,
        )
        shard = Shard(0, config)
        try:

            async def race() -> object:
                old = shard.layout
                context = (None, session, None, None)
                call = shard.call(old, "create_goal", context, {"goal": "x"}, 30.0, "id-1")
                task = asyncio.ensure_future(call)
                await asyncio.sleep(0)  # the call is now waiting for Redis to claim its id
                assert await shard.resize(Layout(old.epoch + 1, 3)) == 0
                answer = await task
                # The new owner may run it: the claim was given back.
                assert await shard._claims.first("id-1")
                return answer

            answer = asyncio.run(race())
            assert answer == Moved(Layout(shard.layout.epoch, 3))
            # Nothing ran here: no actor was spawned for the session that moved away.
            assert shard.runtime.stats()["spawned"] == 0
        finally:
            shard.runtime.close()
