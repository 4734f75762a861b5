"""What one principal may do to, and see of, the others over REST, with a state store:
``DELETE /api/v1/sessions/{id}`` (idempotent, the stored state gone whether or not the
session's actors were still live, only the caller's own session), ``GET
/api/v1/sessions/{id}/context`` (a reaped session's stored history) and ``GET
/api/v1/stats`` (every tenant's figures: operators only).

A real uvicorn, a real SQLite (or Redis) store, bearer tokens checked by the app.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from state_support import redis_server

from ctxactors import Runtime
from ctxactors.state import RedisStore, SQLiteStore, StateStore
from ctxactors.testing import ManualClock, serve_app
from ctxactors.transports.access import HttpSecurity
from ctxactors.transports.auth import StaticTokens
from ctxactors.transports.http import create_app

pytestmark = pytest.mark.timeout(60)

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789"
TTL = 60.0


class Api:
    """One principal's view of the served app."""

    def __init__(self, http: httpx.Client, token: str) -> None:
        self.http = http
        self.auth = {"Authorization": f"Bearer {token}"}

    def call(self, tool: str, body: Any = None, session: str = "s1") -> dict[str, Any]:
        headers = {**self.auth, "X-Session-Id": session}
        response = self.http.post(f"/api/v1/tools/{tool}", json=body or {}, headers=headers)
        assert response.status_code == 200, response.text
        structured: dict[str, Any] = response.json()["structuredContent"]
        return structured

    def goals(self, session: str = "s1") -> list[str]:
        return [g["goal"] for g in self.call("get_planning_state", session=session)["goals"]]

    def delete(self, session: str = "s1") -> httpx.Response:
        return self.http.delete(f"/api/v1/sessions/{session}", headers=self.auth)


def served(rt: Runtime, operators: frozenset[str] = frozenset()) -> Any:
    verifier = StaticTokens([(ALICE, "alice"), (BOB, "bob")])
    return serve_app(create_app(rt, security=HttpSecurity(verifier=verifier, operators=operators)))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    made = SQLiteStore(tmp_path / "state.db")
    yield made
    made.close()


def test_delete_after_a_reap_drops_the_stored_state_and_answers_200(store: StateStore) -> None:
    clock = ManualClock()
    with Runtime(store=store, ttl=TTL, clock=clock) as rt, served(rt) as url:
        with httpx.Client(base_url=url, timeout=30) as http:
            alice, bob = Api(http, ALICE), Api(http, BOB)
            alice.call("create_goal", {"goal": "alice's"})
            alice.call("add_content", {"filename": "notes", "content": "kept"})
            bob.call("create_goal", {"goal": "bob's"})
            clock.advance(TTL + 1)
            assert rt.reap() == 3 and rt.stats()["actors"] == 0  # only the store holds them

            # Bob's DELETE of s1 ends his own s1, never alice's.
            ended = bob.delete()
            assert (ended.status_code, ended.json()) == (
                200,
                {"session_id": "s1", "actors_stopped": 0},
            )
            assert bob.goals() == []
            assert alice.goals() == ["alice's"]  # reloaded from the store
            clock.advance(TTL + 1)
            assert rt.reap() == 2  # alice's planning key, bob's new one

            ended = alice.delete()
            assert (ended.status_code, ended.json()) == (
                200,
                {"session_id": "s1", "actors_stopped": 0},
            )
            assert rt.stats()["actors"] == 0
            assert alice.goals() == []  # read from the store: nothing left
            assert alice.call("list_content") == {"items": [], "count": 0}

            # Live actors are counted; a second DELETE (a retry) is the same success.
            assert alice.delete().json() == {"session_id": "s1", "actors_stopped": 2}
            again = alice.delete()
            assert (again.status_code, again.json()) == (
                200,
                {"session_id": "s1", "actors_stopped": 0},
            )


def test_a_reaped_sessions_history_is_read_from_the_store(store: StateStore) -> None:
    clock = ManualClock()
    with Runtime(store=store, ttl=TTL, clock=clock) as rt, served(rt) as url:
        assert rt.durability is not None
        rt.durability.flush_delay = 30.0  # the history behind the call is unwritten when asked
        with httpx.Client(base_url=url, timeout=30) as http:
            alice, bob = Api(http, ALICE), Api(http, BOB)
            alice.call("create_goal", {"goal": "kept"})

            def context(api: Api, session: str = "s1") -> httpx.Response:
                return http.get(f"/api/v1/sessions/{session}/context", headers=api.auth)

            live = context(alice).json()
            assert rt.durability is not None
            rt.durability.flush()  # the history is written behind the calls (within 50 ms)
            clock.advance(TTL + 1)
            assert rt.reap() == 2 and rt.stats()["actors"] == 0
            reaped = context(alice)
            assert reaped.status_code == 200, reaped.text
            assert reaped.json() == live
            assert [op["tool"] for op in live["operations"]] == ["create_goal"]
            spawned = rt.stats()["spawned"]
            for unknown in (context(bob), context(alice, "nobody")):  # bob's s1 has nothing
                assert unknown.status_code == 404
                assert unknown.json()["error"]["code"] == "unknown_session"
            assert rt.stats()["spawned"] == spawned  # asking spawned no actor
            alice.delete()
            assert context(alice).status_code == 404


def test_a_store_that_is_down_makes_delete_503_and_a_retry_deletes(tmp_path: Path) -> None:
    with redis_server(tmp_path) as server:
        store = RedisStore(server.url, timeout=2)
        clock = ManualClock()
        with Runtime(store=store, ttl=TTL, clock=clock) as rt, served(rt) as url:
            with httpx.Client(base_url=url, timeout=30) as http:
                alice = Api(http, ALICE)
                alice.call("create_goal", {"goal": "kept"})
                clock.advance(TTL + 1)
                assert rt.reap() == 1
                server.stop()
                down = alice.delete()
                assert down.status_code == 503, down.text
                error = down.json()["error"]
                assert error["code"] == "store_unavailable"
                # Where Redis is stays in the server's log (test_redis_auth): not the tenant's.
                assert error["message"] == "the state store is unavailable; retry later"
                assert str(server.port) not in down.text
                server.start()
                assert alice.goals() == ["kept"]  # nothing was deleted
                clock.advance(TTL + 1)
                assert rt.reap() == 1
                assert alice.delete().status_code == 200
                assert alice.goals() == []
        store.close()


@pytest.mark.parametrize("operators", [frozenset(), frozenset({"alice"})], ids=["none", "alice"])
def test_the_server_wide_stats_are_for_operators_only(operators: frozenset[str]) -> None:
    with Runtime() as rt, served(rt, operators) as url, httpx.Client(base_url=url) as http:
        alice, bob = Api(http, ALICE), Api(http, BOB)
        bob.call("create_goal", {"goal": "bob's"}, session="bobs-secret-session")
        refused = http.get("/api/v1/stats", headers=bob.auth)
        assert (refused.status_code, refused.json()) == (
            403,
            {"error": {"code": "forbidden", "message": "'bob' is no operator"}},
        )
        answered = http.get("/api/v1/stats", headers=alice.auth)
        if operators:
            assert answered.status_code == 200
            assert (answered.json()["calls"], answered.json()["sessions"]) == (1, 1)
        else:  # an app made without operators shows them to no one
            assert answered.status_code == 403
