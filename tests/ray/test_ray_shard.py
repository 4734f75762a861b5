"""A shard: its calls run with the caller's context, sessions kept apart; it refuses what it
does not own under the current layout; a newer layout passivates exactly the sessions that
moved away, after their calls in flight finish and their saves are in the store.

The shard body runs here as a plain object on a real Redis (no Ray cluster needed): its
methods are coroutines on one event loop, which is how a Ray async actor runs them too.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import redis
from shard_support import LEDGER, running_shard, session_owned
from state_support import RedisServer, redis_server

from ctxactors.errors import CallTimeoutError, UnknownToolError
from ctxactors.logs import flush_logs, get_logger
from ctxactors.ray._directory import Directory, Layout
from ctxactors.ray._shard import Duplicate, Moved, ShardConfig, import_server
from ctxactors.results import ToolResult
from ctxactors.servers.planning import Planning
from ctxactors.settings import PlanningSettings, Settings
from ctxactors.testing import await_until

ray = pytest.importorskip("ray")

PLANNING = "ctxactors.servers.planning:Planning"
EMPTY_PLAN = {"goals": [], "todos": []}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as server:
        yield server


def _config(server: RedisServer, shards: int, *servers: str, **more: Any) -> ShardConfig:
    return ShardConfig(
        namespace="t", store=server.url, servers=list(servers), shards=shards, **more
    )


def _structured(result: ToolResult | Moved | Duplicate) -> Any:
    assert isinstance(result, ToolResult), result
    assert not result.is_error, result.text
    return result.structured


def _stored_sessions(server: RedisServer) -> list[str]:
    """The sessions with state in the store (one Redis hash each), as their JSON key."""
    keys = redis.Redis.from_url(server.url).keys("ctxactors:[[]*")
    return sorted(k.decode().removeprefix("ctxactors:") for k in keys)


def test_calls_run_with_the_caller_s_context_and_each_context_sees_only_its_own(
    server: RedisServer,
) -> None:
    with running_shard(0, _config(server, 1, PLANNING)) as shard:

        async def run() -> None:
            layout = shard.layout
            mine = ("alice", "s1", "a1", "t1")
            created = await shard.call(layout, "create_goal", mine, {"goal": "alpha"}, 10.0, "c1")
            assert _structured(created) == {"id": "g1", "goal": "alpha"}
            assert await shard.has_session(layout, "alice", "s1") is True
            assert await shard.has_session(layout, "bob", "s1") is False
            assert await shard.has_session(layout, "alice", "s2") is False
            state = await shard.call(layout, "get_planning_state", mine, {}, 10.0)
            assert _structured(state) == {"goals": [{"id": "g1", "goal": "alpha"}], "todos": []}
            # Another principal, session, assistant or thread, or none: another key.
            for other in [
                ("bob", "s1", "a1", "t1"),
                (None, "s1", "a1", "t1"),
                ("alice", "s2", "a1", "t1"),
                ("alice", "s1", "a2", "t1"),
                ("alice", "s1", None, "t1"),
                ("alice", "s1", "a1", "t2"),
                ("alice", "s1", "a1", None),
                ("alice", "default", None, None),
            ]:
                state = await shard.call(layout, "get_planning_state", other, {}, 10.0)
                assert _structured(state) == EMPTY_PLAN, other
            # A tool of a server this shard does not serve (content is built in, not listed).
            with pytest.raises(UnknownToolError, match="'save_content'"):
                await shard.call(layout, "save_content", mine, {"content": "x"}, 10.0)

        asyncio.run(run())
        assert _stored_sessions(server) == ['["alice","s1"]']


def test_a_call_past_its_timeout_is_answered_by_the_timeout_the_front_end_gave(
    server: RedisServer,
) -> None:
    with running_shard(0, _config(server, 1, LEDGER)) as shard:

        async def run() -> None:
            context = (None, "s1", None, None)
            with pytest.raises(CallTimeoutError, match="did not answer within 0.2 s"):
                await shard.call(shard.layout, "append", context, {"entry": "e", "seconds": 1}, 0.2)

        asyncio.run(run())


def test_a_shard_answers_moved_for_what_it_does_not_own_or_an_older_layout_and_runs_nothing(
    server: RedisServer,
) -> None:
    elsewhere = session_owned({2: 1})
    here = session_owned({2: 0})
    with running_shard(0, _config(server, 2, PLANNING)) as shard:

        async def run() -> None:
            current = shard.layout
            assert current == Layout(1, 2)
            moved = Moved(current)
            context = (None, elsewhere, None, None)
            assert await shard.call(current, "create_goal", context, {"goal": "x"}, 10.0) == moved
            assert await shard.call(current, "create_goal", context, {"goal": "x"}, 10.0, "c1") == (
                moved
            )
            assert await shard.end_session(current, None, elsewhere) == moved
            assert await shard.has_session(current, None, elsewhere) == moved
            # A session it owns, sent with an older layout: the sender is behind.
            older = Layout(0, 2)
            context = (None, here, None, None)
            assert await shard.call(older, "create_goal", context, {"goal": "x"}, 10.0) == moved
            assert await shard.end_session(older, None, here) == moved
            assert await shard.has_session(older, None, here) == moved
            # The refused claim was given back (or never made): the owner may run it.
            assert await shard._claims.first("c1")

        asyncio.run(run())
        assert shard.runtime.stats()["spawned"] == 0
        assert _stored_sessions(server) == []


def test_a_layout_no_newer_than_the_shard_s_is_never_adopted(server: RedisServer) -> None:
    # Only a larger epoch is newer; a sender claiming the same epoch with another count (no
    # admin makes one) changes nothing here: the shard judges by its own layout.
    here = session_owned({2: 0, 5: 3})
    with running_shard(0, _config(server, 2, PLANNING)) as shard:

        async def run() -> None:
            same_epoch = Layout(1, 5)
            context = (None, here, None, None)
            created = await shard.call(same_epoch, "create_goal", context, {"goal": "x"}, 10.0)
            assert _structured(created) == {"id": "g1", "goal": "x"}
            assert shard.layout == Layout(1, 2)
            assert await shard.resize(same_epoch) == 0
            assert await shard.resize(Layout(0, 7)) == 0
            assert shard.layout == Layout(1, 2)
            assert await shard.has_session(shard.layout, None, here) is True

        asyncio.run(run())


def test_a_newer_layout_passivates_exactly_the_sessions_that_moved_away(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray's node id is the one thing a shard asks Ray (no cluster here).
    monkeypatch.setattr(
        ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: "n1")
    )
    # Owned by shard 0 of 2; then of 3 shards, `stays` is still 0's, the others are not;
    # then of 4 shards `stays` moves too. One of them is a principal's.
    stays = session_owned({2: 0, 3: 0, 4: 3})
    to_two = session_owned({2: 0, 3: 2})
    alices = session_owned({2: 0, 3: 2}, principal="alice")
    sessions = [(None, stays), (None, to_two), ("alice", alices)]
    with running_shard(0, _config(server, 2, LEDGER)) as shard:

        async def run() -> dict[str, Any]:
            for principal, session in sessions:
                context = (principal, session, None, None)
                answer = await shard.call(shard.layout, "append", context, {"entry": "e"}, 10.0)
                assert _structured(answer) == {"entries": ["e"]}
            assert await shard.stats() == {
                **shard.runtime.stats(),
                "shard": 0,
                "count": 2,
                "epoch": 1,
                "moved_away": 0,
                "node_id": "n1",
                "pid": os.getpid(),
            }
            assert await shard.resize(Layout(2, 3)) == 2
            live = [shard.runtime.has_session(s, principal=p) for p, s in sessions]
            assert live == [True, False, False]
            assert await shard.has_session(Layout(2, 3), None, stays) is True
            first = await shard.stats()
            assert await shard.resize(Layout(3, 4)) == 3
            assert not shard.runtime.has_session(stays)
            return first

        first = asyncio.run(run())
        assert {k: first[k] for k in ("count", "epoch", "moved_away", "actors")} == {
            "count": 3,
            "epoch": 2,
            "moved_away": 2,
            "actors": 1,
        }
        stats = shard.runtime.stats()
        assert (stats["actors"], stats["sessions"], stats["ended"]) == (0, 0, 3)
        # Passivated, not ended: every session's state stays in the store for its new shard.
        assert _stored_sessions(server) == sorted(msgspec.json.encode(s).decode() for s in sessions)


def test_a_shard_removed_by_a_smaller_layout_passivates_all_and_refuses_everything(
    server: RedisServer,
) -> None:
    sessions = [session_owned({3: 2}, prefix=p) for p in ("a", "b")]
    with running_shard(2, _config(server, 3, LEDGER)) as shard:

        async def run() -> None:
            for session in sessions:
                await shard.call(
                    shard.layout, "append", (None, session, None, None), {"entry": "e"}, 10.0
                )
            assert await shard.resize(Layout(2, 2)) == 2
            for session in sessions:
                context = (None, session, None, None)
                answer = await shard.call(Layout(2, 2), "entries_of", context, {}, 10.0)
                assert answer == Moved(Layout(2, 2))

        asyncio.run(run())
        assert shard.runtime.stats()["actors"] == 0


def test_a_call_bringing_a_newer_layout_adopts_it_and_passivates_what_moved(
    server: RedisServer,
) -> None:
    stays = session_owned({2: 0, 3: 0})
    moves = session_owned({2: 0, 3: 2})
    with running_shard(0, _config(server, 2, LEDGER)) as shard:

        async def run() -> None:
            old, new = shard.layout, Layout(2, 3)
            await shard.call(old, "append", (None, moves, None, None), {"entry": "m"}, 10.0)
            answer = await shard.call(
                new, "append", (None, stays, None, None), {"entry": "s"}, 10.0
            )
            assert _structured(answer) == {"entries": ["s"]}
            assert shard.layout == new
            assert await shard.resize(new) == 1  # waits for the passivation begun by the call
            assert not shard.runtime.has_session(moves)
            assert shard.runtime.has_session(stays)

        asyncio.run(run())


def test_a_call_in_flight_when_its_session_moves_finishes_and_its_save_is_in_the_store(
    server: RedisServer,
) -> None:
    moves = session_owned({2: 0, 3: 2})
    context = (None, moves, None, None)
    config = _config(server, 2, LEDGER)
    with running_shard(0, config) as shard, running_shard(2, config) as new_owner:

        async def run() -> None:
            call = shard.call(
                shard.layout, "append", context, {"entry": "late", "seconds": 1}, 30.0
            )
            in_flight = asyncio.ensure_future(call)
            await await_until(lambda: shard.runtime.stats()["inflight"] == 1)
            assert await shard.resize(Layout(2, 3)) == 1
            # resize answered after the call finished and its actor stopped (save included).
            assert shard.runtime.stats()["inflight"] == 0
            assert _structured(await in_flight) == {"entries": ["late"]}
            moved = await shard.call(Layout(2, 3), "entries_of", context, {}, 10.0)
            assert moved == Moved(Layout(2, 3))
            loaded = await new_owner.call(Layout(2, 3), "entries_of", context, {}, 10.0)
            assert _structured(loaded) == {"entries": ["late"]}

        asyncio.run(run())


def test_end_session_stops_one_principal_s_session_and_deletes_only_its_state(
    server: RedisServer,
) -> None:
    with running_shard(0, _config(server, 1, LEDGER)) as shard:

        async def run() -> None:
            layout = shard.layout
            for principal in ("alice", "bob"):
                context = (principal, "s1", None, None)
                await shard.call(layout, "append", context, {"entry": principal}, 10.0)
            assert await shard.end_session(layout, "alice", "s1") == 1
            assert await shard.has_session(layout, "alice", "s1") is False
            assert await shard.has_session(layout, "bob", "s1") is True
            assert _stored_sessions(server) == ['["bob","s1"]']
            for principal, entries in (("alice", []), ("bob", ["bob"])):
                context = (principal, "s1", None, None)
                answer = await shard.call(layout, "entries_of", context, {}, 10.0)
                assert _structured(answer) == {"entries": entries}
            assert await shard.end_session(layout, "carol", "s1") == 0

        asyncio.run(run())


def test_reap_stops_no_key_used_within_its_ttl(server: RedisServer) -> None:
    with running_shard(0, _config(server, 1, LEDGER)) as shard:

        async def run() -> None:
            await shard.call(shard.layout, "append", (None, "s1", None, None), {"entry": "e"}, 10.0)
            assert await shard.reap() == 0
            assert await shard.has_session(shard.layout, None, "s1") is True

        asyncio.run(run())


def test_a_changing_call_is_not_run_when_its_claim_cannot_be_made(server: RedisServer) -> None:
    with running_shard(0, _config(server, 1, LEDGER)) as shard:
        server.stop(kill=True)

        async def run() -> ToolResult | Moved | Duplicate:
            context = (None, "s1", None, None)
            return await shard.call(shard.layout, "append", context, {"entry": "e"}, 10.0, "c1")

        answer = asyncio.run(run())
        assert isinstance(answer, ToolResult) and answer.is_error
        assert answer.text == "not run: the state store did not answer: no connection to Redis"
        assert shard.runtime.stats()["spawned"] == 0


def test_a_second_delivery_of_a_changing_call_runs_nothing(server: RedisServer) -> None:
    with running_shard(0, _config(server, 1, LEDGER)) as shard:

        async def run() -> list[Any]:
            context = (None, "s1", None, None)
            args = {"entry": "once"}
            first = await shard.call(shard.layout, "append", context, args, 10.0, "c1")
            again = await shard.call(shard.layout, "append", context, args, 10.0, "c1")
            seen = await shard.call(shard.layout, "entries_of", context, {}, 10.0)
            return [_structured(first), again, _structured(seen)]

        assert asyncio.run(run()) == [{"entries": ["once"]}, Duplicate(), {"entries": ["once"]}]


def test_a_shard_takes_its_servers_limits_store_and_claims_from_its_config(
    server: RedisServer,
) -> None:
    config = _config(
        server,
        1,
        PLANNING,
        ttl=120.0,
        retention=1000.0,
        max_actors=77,
        max_actors_per_principal=3,
        call_timeout=9.0,
        settings=Settings(planning=PlanningSettings(max_goals=1)),
    )
    with running_shard(0, config) as shard:
        assert shard.runtime.settings == Settings(
            ttl=120.0,
            max_actors=77,
            max_actors_per_principal=3,
            call_timeout=9.0,
            planning=PlanningSettings(max_goals=1),
        )
        assert sorted({spec.server.name for spec in shard.runtime.tools.values()}) == [
            "batch",
            "history",
            "planning",
            "presets",
        ]

        async def run() -> list[ToolResult | Moved | Duplicate]:
            context = (None, "s1", None, None)
            calls = [({"goal": "one"}, "c1"), ({"goal": "two"}, "c2")]
            answers = [
                await shard.call(shard.layout, "create_goal", context, args, 10.0, call_id)
                for args, call_id in calls
            ]
            assert await shard.config() == config
            assert await shard.ping() == 0
            return answers

        first, second = asyncio.run(run())
        assert _structured(first) == {"id": "g1", "goal": "one"}
        assert isinstance(second, ToolResult) and second.is_error  # the settings' cap of 1
        assert "goal" in second.text
        r = redis.Redis.from_url(server.url)
        # The state's retention and the claims' (four call timeouts), as Redis expiries.
        assert 900_000 <= r.pttl('ctxactors:[null,"s1"]') <= 1_000_000
        assert 30_000 <= r.pttl("ctxactors:ray:t:call:c1") <= 36_000


def test_a_restarted_shard_reads_the_stored_layout_not_its_constructor_s_count(
    server: RedisServer,
) -> None:
    directory = Directory(server.url, "t")
    try:
        directory.replace(directory.layout(2), 3)
    finally:
        directory.close()
    with running_shard(1, _config(server, 2, PLANNING)) as shard:
        assert shard.layout == Layout(2, 3)


def test_a_shard_logs_at_its_configured_level_and_format(
    server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(server, 1, PLANNING, log_level="warning", log_format="console")
    with running_shard(0, config):
        log = get_logger("ctxactors.test")
        log.info("hidden line")
        log.warning("shown line", n=1)
        flush_logs()
    err = capsys.readouterr().err
    assert "hidden line" not in err
    [line] = [line for line in err.splitlines() if "shown line" in line]
    assert "[warning  ] shown line" in line and "n=1" in line  # console, not JSON


def test_servers_are_imported_by_module_and_attribute_path() -> None:
    assert import_server(PLANNING) is Planning
    assert import_server("os:path.join") is os.path.join
    with pytest.raises(AttributeError, match="'Planning:x'"):
        import_server(f"{PLANNING}:x")


def test_a_call_whose_session_moves_while_its_claim_is_made_does_not_run_here(
    server: RedisServer,
) -> None:
    session = session_owned({2: 0, 3: 2}, prefix="m")
    with running_shard(0, _config(server, 2, PLANNING)) as shard:

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
