"""Who reaches the tools over HTTP: ``ctxactors serve --transport http`` with its access checks.

Real processes and real clients only: httpx for REST and raw HTTP, the official MCP SDK
client (its bearer header passed through its own httpx client) for ``/mcp``, tokens from a
file, JWTs signed by keys made here (RSA from a PEM file, EC through a JWKS URL).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_support import SERVE, free_port, host_meta, http_server, serve_env

from ctxactors import Runtime
from ctxactors.cli import main as cli_main
from ctxactors.conversation import Message, ScriptedModel, ToolCall
from ctxactors.testing import serve_app, wait_until
from ctxactors.transports.access import HttpSecurity
from ctxactors.transports.auth import StaticTokens
from ctxactors.transports.http import create_app

pytestmark = pytest.mark.timeout(60)

ALICE = "alice-" + secrets.token_urlsafe(24)
BOB = "bob-" + secrets.token_urlsafe(24)
ISSUER = "https://issuer.example"
AUDIENCE = "ctxactors-test"
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}


# -- servers and clients ---------------------------------------------------------------------


def base(url: str) -> str:
    return url.removesuffix("/mcp")


@pytest.fixture(scope="module")
def open_url() -> Iterator[str]:
    """No authentication (loopback), one allowed origin, one more Host name (a proxy's)."""
    extra = ("--allow-origin", "https://app.example", "--allow-host", "tools.example")
    with http_server(*extra) as (url, _proc):
        yield base(url)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("auth") / "tokens"
    path.write_text(f"# token principal\n{ALICE} alice\n\n{BOB} bob  # the second\n")
    return str(path)


@pytest.fixture(scope="module")
def static_url(tokens: str) -> Iterator[str]:
    with http_server("--auth-tokens", tokens, "--max-sessions-per-principal", "2") as (url, _p):
        yield base(url)


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def jwt_url(tmp_path_factory: pytest.TempPathFactory, rsa_key: rsa.RSAPrivateKey) -> Iterator[str]:
    pem = tmp_path_factory.mktemp("jwt") / "public.pem"
    pem.write_bytes(
        rsa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    options = ("--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE)
    with http_server("--jwt-public-key", str(pem), *options) as (url, _proc):
        yield base(url)


def make_jwt(key: Any, algorithm: str = "RS256", headers: Any = None, **overrides: Any) -> str:
    """A token for `sub` alice valid for 5 minutes, with `overrides` (None drops a claim)."""
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 300}
    claims.update(overrides)
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode(claims, key, algorithm=algorithm, headers=headers)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def call(
    url: str, tool: str, body: Any, *, token: str | None, session: str, **headers: str
) -> httpx.Response:
    h = {"X-Session-Id": session, **headers, **(bearer(token) if token else {})}
    return httpx.post(f"{url}/api/v1/tools/{tool}", json=body, headers=h)


def rest_goals(url: str, token: str, session: str) -> list[str]:
    response = call(url, "get_planning_state", {}, token=token, session=session)
    assert response.status_code == 200, response.text
    return [g["goal"] for g in response.json()["structuredContent"]["goals"]]


def mcp_client(url: str, http: httpx2.AsyncClient) -> Client:
    """The SDK client over streamable HTTP, with its requests sent by `http` (bearer header)."""
    return Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy")


def mcp_goals(result: Any) -> list[str]:
    assert not result.is_error, result.content
    return [g["goal"] for g in result.structured_content["goals"]]


def calls(url: str, token: str | None = None) -> int:
    stats = httpx.get(f"{url}/api/v1/stats", headers=bearer(token) if token else {})
    assert stats.status_code == 200, stats.text
    count: int = stats.json()["calls"]
    return count


def assert_401(response: httpx.Response, metadata_url: str | None = None) -> None:
    assert response.status_code == 401, (response.status_code, response.text)
    challenge = 'Bearer error="invalid_token", error_description="Authentication required"'
    if metadata_url is not None:
        challenge += f', resource_metadata="{metadata_url}"'
    assert response.headers["WWW-Authenticate"] == challenge
    assert response.json() == {
        "error": "invalid_token",
        "error_description": "Authentication required",
    }


# -- cross-site requests ---------------------------------------------------------------------


def test_text_plain_post_with_foreign_host_is_refused_and_runs_nothing(open_url: str) -> None:
    """The attack of issue 14: a page's "simple request" to a loopback server's shell."""
    before = calls(open_url)
    url = f"{open_url}/api/v1/tools/execute_command"
    body = json.dumps({"command": "id"})
    rebound = httpx.post(
        url,
        content=body,
        headers={"Host": "evil.example", "Content-Type": "text/plain", "X-Session-Id": "web"},
    )
    assert rebound.status_code == 421
    assert rebound.json()["error"]["code"] == "host_not_allowed"
    simple = httpx.post(
        url, content=body, headers={"Content-Type": "text/plain", "X-Session-Id": "web"}
    )
    assert simple.status_code == 415
    assert simple.json() == {
        "error": {
            "code": "unsupported_media_type",
            "message": "a POST needs Content-Type: application/json",
        }
    }
    assert calls(open_url) == before
    assert httpx.get(f"{open_url}/api/v1/sessions/web/context").status_code == 404


def test_foreign_host_is_refused_on_every_path(open_url: str) -> None:
    evil = {"Host": "evil.example:80"}
    assert httpx.get(f"{open_url}/api/v1/sessions/s/context", headers=evil).status_code == 421
    assert httpx.get(f"{open_url}/api/v1/stats", headers=evil).status_code == 421
    mcp = httpx.post(f"{open_url}/mcp", json=INITIALIZE, headers={**evil, **MCP_ACCEPT})
    assert mcp.status_code == 421


def test_a_host_name_the_operator_allows_passes(open_url: str) -> None:
    for host in ("tools.example", "TOOLS.example:8443", "localhost:1", "[::1]:2"):
        response = httpx.get(f"{open_url}/api/v1/tools", headers={"Host": host})
        assert response.status_code == 200, host
    for host in ("tools.example.evil.example", "tools.example:x", "[::1", "", "evil.example"):
        response = httpx.get(f"{open_url}/api/v1/tools", headers={"Host": host})
        assert response.status_code == 421, host


def test_post_from_a_foreign_origin_is_refused(open_url: str) -> None:
    before = calls(open_url)
    evil = {"Origin": "https://evil.example"}
    response = call(open_url, "create_goal", {"goal": "x"}, token=None, session="o", **evil)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "origin_not_allowed"
    for origin in ("null", "http://127.0.0.1:1", "https://app.example.evil.example"):
        again = call(open_url, "create_goal", {"goal": "x"}, token=None, session="o", Origin=origin)
        assert again.status_code == 403, origin
    preflight = httpx.options(
        f"{open_url}/api/v1/tools/create_goal",
        headers={**evil, "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 403
    mcp = httpx.post(f"{open_url}/mcp", json=INITIALIZE, headers={**evil, **MCP_ACCEPT})
    assert mcp.status_code == 403
    assert calls(open_url) == before


def test_an_allowed_origin_passes_with_cors_headers(open_url: str) -> None:
    app = {"Origin": "https://app.example"}
    response = call(open_url, "create_goal", {"goal": "from app"}, token=None, session="o2", **app)
    assert response.status_code == 200, response.text
    assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"
    preflight = httpx.options(
        f"{open_url}/api/v1/tools/create_goal",
        headers={
            **app,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-session-id",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://app.example"
    allowed = {
        h.strip().lower() for h in preflight.headers["Access-Control-Allow-Headers"].split(",")
    }
    assert {"authorization", "content-type", "x-session-id", "mcp-session-id"} <= allowed


# -- static tokens ---------------------------------------------------------------------------


def test_requests_without_a_valid_token_get_401(static_url: str) -> None:
    requests = [
        ("POST", "/api/v1/tools/get_planning_state", {}),
        ("GET", "/api/v1/tools", None),
        ("GET", "/api/v1/stats", None),
        ("GET", "/api/v1/sessions/s1/context", None),
        ("DELETE", "/api/v1/sessions/s1", None),
        ("GET", "/openapi.json", None),
        ("POST", "/mcp", INITIALIZE),
    ]
    wrong = [{}, bearer(ALICE + "x"), bearer(ALICE[:-1]), {"Authorization": f"Basic {ALICE}"}]
    for method, path, body in requests:
        for headers in wrong:
            response = httpx.request(
                method, f"{static_url}{path}", json=body, headers={**headers, **MCP_ACCEPT}
            )
            assert_401(response)
    assert httpx.get(f"{static_url}/healthz").status_code == 200
    # Static tokens name no authorization server, so there is no metadata to publish.
    assert httpx.get(f"{static_url}/.well-known/oauth-protected-resource").status_code == 404


def test_two_principals_with_the_same_session_id_are_isolated_over_rest(static_url: str) -> None:
    for token, goal in ((ALICE, "alice's"), (BOB, "bob's")):
        created = call(static_url, "create_goal", {"goal": goal}, token=token, session="s1")
        assert created.status_code == 200, created.text
    assert rest_goals(static_url, ALICE, "s1") == ["alice's"]
    assert rest_goals(static_url, BOB, "s1") == ["bob's"]

    def context(token: str, session: str) -> httpx.Response:
        return httpx.get(f"{static_url}/api/v1/sessions/{session}/context", headers=bearer(token))

    alice_ops = context(ALICE, "s1").json()["operations"]
    assert [(op["tool"], op["arguments"]) for op in alice_ops] == [
        ("get_planning_state", {}),
        ("create_goal", {"goal": "alice's"}),
    ]
    # A session only alice has is unknown to bob, for reading and for ending.
    assert call(static_url, "add_content", {"filename": "a", "content": "x"}, token=ALICE,
                session="alice-only").status_code == 200  # fmt: skip
    assert context(BOB, "alice-only").status_code == 404
    ended = httpx.delete(f"{static_url}/api/v1/sessions/alice-only", headers=bearer(BOB))
    assert ended.json() == {"session_id": "alice-only", "actors_stopped": 0}  # bob's: none
    assert context(ALICE, "alice-only").status_code == 200
    # Bob ending his s1 leaves alice's s1 whole.
    ended = httpx.delete(f"{static_url}/api/v1/sessions/s1", headers=bearer(BOB))
    assert ended.status_code == 200, ended.text
    assert rest_goals(static_url, ALICE, "s1") == ["alice's"]
    assert rest_goals(static_url, BOB, "s1") == []


def test_two_principals_with_the_same_session_id_are_isolated_over_mcp(static_url: str) -> None:
    meta = host_meta(session="m1")

    async def main() -> tuple[list[str], list[str]]:
        async with (
            httpx2.AsyncClient(headers=bearer(ALICE)) as alice_http,
            httpx2.AsyncClient(headers=bearer(BOB)) as bob_http,
            mcp_client(static_url, alice_http) as alice,
            mcp_client(static_url, bob_http) as bob,
        ):
            await alice.call_tool("create_goal", {"goal": "alice's"}, meta=meta)
            await bob.call_tool("create_goal", {"goal": "bob's"}, meta=meta)
            await bob.call_tool("create_goal", {"goal": "bob's 2"}, meta=meta)
            return (
                mcp_goals(await alice.call_tool("get_planning_state", {}, meta=meta)),
                mcp_goals(await bob.call_tool("get_planning_state", {}, meta=meta)),
            )

    alice_goals, bob_goals = anyio.run(main)
    assert alice_goals == ["alice's"]
    assert bob_goals == ["bob's", "bob's 2"]


def test_rest_and_mcp_with_the_same_token_reach_the_same_session(static_url: str) -> None:
    meta = host_meta(session="both")

    async def over_mcp(goal: str | None) -> list[str]:
        async with (
            httpx2.AsyncClient(headers=bearer(ALICE)) as http,
            mcp_client(static_url, http) as client,
        ):
            if goal is not None:
                await client.call_tool("create_goal", {"goal": goal}, meta=meta)
            return mcp_goals(await client.call_tool("get_planning_state", {}, meta=meta))

    assert anyio.run(over_mcp, "via mcp") == ["via mcp"]
    created = call(static_url, "create_goal", {"goal": "via rest"}, token=ALICE, session="both")
    assert created.status_code == 200
    assert rest_goals(static_url, ALICE, "both") == ["via mcp", "via rest"]
    assert anyio.run(over_mcp, None) == ["via mcp", "via rest"]
    assert rest_goals(static_url, BOB, "both") == []


def test_one_principal_holds_at_most_its_cap_of_mcp_sessions(static_url: str) -> None:
    def initialize(token: str) -> httpx.Response:
        return httpx.post(
            f"{static_url}/mcp", json=INITIALIZE, headers={**bearer(token), **MCP_ACCEPT}
        )

    async def main() -> None:
        async with httpx2.AsyncClient(headers=bearer(ALICE)) as http:
            async with mcp_client(static_url, http) as first, mcp_client(static_url, http):
                refused = await anyio.to_thread.run_sync(initialize, ALICE)
                assert refused.status_code == 429
                assert refused.json()["error"]["message"] == (
                    "principal 'alice' already has 2 open MCP sessions, the most allowed; "
                    "end one (DELETE /mcp with its Mcp-Session-Id) or reuse it; an idle one "
                    "ends by itself after 1800 s"
                )
                assert "Mcp-Session-Id" not in refused.headers
                # Another principal is not affected, and alice's sessions keep working.
                bob = await anyio.to_thread.run_sync(initialize, BOB)
                assert bob.status_code == 200, bob.text
                await _delete_session(bob)
                await first.call_tool("list_content", {}, meta=host_meta(session="cap"))
            # Both closed (DELETE): alice may open sessions again.
            reopened = await anyio.to_thread.run_sync(initialize, ALICE)
            assert reopened.status_code == 200, reopened.text
            await _delete_session(reopened)

    anyio.run(main)


def test_by_default_one_principal_holds_at_most_100_mcp_sessions(tokens: str) -> None:
    """No flag: the default cap holds one principal to 100 sessions, others still open
    theirs, and a session that ends gives its place back."""
    cap = 100  # the documented default (docs/limits.md: http.max_sessions_per_principal)
    with http_server("--auth-tokens", tokens) as (url, _proc), httpx.Client() as http:

        def initialize(token: str) -> httpx.Response:
            return http.post(url, json=INITIALIZE, headers={**bearer(token), **MCP_ACCEPT})

        opened = [initialize(ALICE) for _ in range(cap)]
        assert [r.status_code for r in opened] == [200] * cap
        refused = initialize(ALICE)
        assert refused.status_code == 429
        assert refused.json() == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {
                "code": -32000,
                "message": f"principal 'alice' already has {cap} open MCP sessions, the most "
                "allowed; end one (DELETE /mcp with its Mcp-Session-Id) or reuse it; an idle "
                "one ends by itself after 1800 s",
            },
        }
        assert "Mcp-Session-Id" not in refused.headers
        bob = initialize(BOB)
        assert bob.status_code == 200, bob.text
        ended = http.delete(
            url, headers={**bearer(ALICE), "Mcp-Session-Id": opened[0].headers["Mcp-Session-Id"]}
        )
        assert ended.status_code == 200
        assert initialize(ALICE).status_code == 200  # the ended session's place
        assert initialize(ALICE).status_code == 429


async def _delete_session(opened: httpx.Response) -> None:
    request = opened.request
    headers = {
        "Authorization": request.headers["Authorization"],
        "Mcp-Session-Id": opened.headers["Mcp-Session-Id"],
    }
    async with httpx.AsyncClient() as http:
        deleted = await http.delete(str(request.url), headers=headers)
    assert deleted.status_code == 200, deleted.text


def test_max_actors_per_principal_passivates_that_principals_own_keys(tokens: str) -> None:
    """With a cap of 2, alice's third session passivates alice's oldest, never bob's.

    Passivation only frees memory (the store keeps the state), so it shows in the counts:
    a live key answers without a spawn, a passivated one is spawned again.
    """
    flags = ("--auth-tokens", tokens, "--operator", "alice", "--max-actors-per-principal", "2")
    with http_server(*flags) as (url, _p):
        rest = base(url)

        def counts() -> tuple[int, int, int]:
            stats = httpx.get(f"{rest}/api/v1/stats", headers=bearer(ALICE)).json()
            return stats["actors"], stats["spawned"], stats["evicted"]

        created = call(rest, "create_goal", {"goal": "bob's"}, token=BOB, session="b")
        assert created.status_code == 200
        for n in range(3):
            response = call(rest, "create_goal", {"goal": f"a{n}"}, token=ALICE, session=f"a{n}")
            assert response.status_code == 200
        assert counts() == (3, 4, 1)
        assert rest_goals(rest, BOB, "b") == ["bob's"]
        assert rest_goals(rest, ALICE, "a2") == ["a2"]
        assert counts() == (3, 4, 1)  # bob's key and alice's newest were still live
        assert rest_goals(rest, ALICE, "a0") == ["a0"]  # reloaded: nothing was lost
        assert counts() == (3, 5, 2)  # a0 was spawned again (and a1 passivated for it)


def test_an_mcp_session_answers_only_the_token_that_opened_it(static_url: str) -> None:
    opened = httpx.post(
        f"{static_url}/mcp", json=INITIALIZE, headers={**bearer(ALICE), **MCP_ACCEPT}
    )
    assert opened.status_code == 200, opened.text
    session = {"Mcp-Session-Id": opened.headers["Mcp-Session-Id"]}
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    hijack = httpx.post(
        f"{static_url}/mcp", json=ping, headers={**bearer(BOB), **session, **MCP_ACCEPT}
    )
    assert hijack.status_code == 404
    assert httpx.delete(f"{static_url}/mcp", headers={**bearer(BOB), **session}).status_code == 404
    anyio.run(_delete_session, opened)


def test_deleting_an_mcp_session_ends_only_its_principals_state(static_url: str) -> None:
    opened = httpx.post(
        f"{static_url}/mcp", json=INITIALIZE, headers={**bearer(ALICE), **MCP_ACCEPT}
    )
    mcp_id = opened.headers["Mcp-Session-Id"]
    alice = {**bearer(ALICE), **MCP_ACCEPT, "Mcp-Session-Id": mcp_id}
    alice["Mcp-Protocol-Version"] = "2025-06-18"
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert httpx.post(f"{static_url}/mcp", json=initialized, headers=alice).status_code == 202
    create = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "create_goal", "arguments": {"goal": "in the MCP session"}},
    }
    assert httpx.post(f"{static_url}/mcp", json=create, headers=alice).status_code == 200
    # Bob has a session of the same id; it is his own and outlives alice's DELETE.
    assert call(static_url, "list_content", {}, token=BOB, session=mcp_id).status_code == 200

    def context(token: str) -> int:
        url = f"{static_url}/api/v1/sessions/{mcp_id}/context"
        return httpx.get(url, headers=bearer(token)).status_code

    assert (context(ALICE), context(BOB)) == (200, 200)
    bob_delete = httpx.delete(
        f"{static_url}/mcp", headers={**bearer(BOB), "Mcp-Session-Id": mcp_id}
    )
    assert bob_delete.status_code == 404
    assert (context(ALICE), context(BOB)) == (200, 200)
    assert httpx.delete(f"{static_url}/mcp", headers=alice).status_code == 200
    assert (context(ALICE), context(BOB)) == (404, 200)


def test_query_runs_its_tools_as_the_callers_principal() -> None:
    model = ScriptedModel(
        [
            Message.assistant(None, [ToolCall.new("create_goal", {"goal": "Ship it"})]),
            Message.assistant("Created it."),
        ]
    )
    security = HttpSecurity(verifier=StaticTokens([(ALICE, "alice"), (BOB, "bob")]))
    with Runtime() as rt:
        with serve_app(create_app(rt, model=model, security=security)) as url:
            query = {"query": "make a goal", "session_id": "q"}
            assert_401(httpx.post(f"{url}/api/v1/query", json=query))
            answered = httpx.post(f"{url}/api/v1/query", json=query, headers=bearer(ALICE))
            assert answered.json() == {"session_id": "q", "answer": "Created it."}

        def goals(principal: str | None) -> list[str]:
            state = rt.call("get_planning_state", {"__sessionId": "q"}, principal=principal)
            assert state.structured is not None
            return [g["goal"] for g in state.structured["goals"]]

        assert (goals("alice"), goals("bob"), goals(None)) == (["Ship it"], [], [])


# -- JWT -------------------------------------------------------------------------------------


def test_a_valid_jwt_reaches_the_tools_over_rest_and_mcp(
    jwt_url: str, rsa_key: rsa.RSAPrivateKey
) -> None:
    alice, bob = make_jwt(rsa_key), make_jwt(rsa_key, sub="bob")
    assert call(jwt_url, "create_goal", {"goal": "a"}, token=alice, session="j").status_code == 200
    assert call(jwt_url, "create_goal", {"goal": "b"}, token=bob, session="j").status_code == 200

    async def over_mcp() -> list[str]:
        async with (
            httpx2.AsyncClient(headers=bearer(alice)) as http,
            mcp_client(jwt_url, http) as client,
        ):
            return mcp_goals(
                await client.call_tool("get_planning_state", {}, meta=host_meta(session="j"))
            )

    assert anyio.run(over_mcp) == ["a"]
    assert rest_goals(jwt_url, bob, "j") == ["b"]


def test_bad_jwts_get_401_pointing_at_the_metadata(
    jwt_url: str, rsa_key: rsa.RSAPrivateKey
) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    now = int(time.time())
    bad = {
        "expired": make_jwt(rsa_key, exp=now - 120, iat=now - 600),
        "wrong audience": make_jwt(rsa_key, aud="another-service"),
        "wrong issuer": make_jwt(rsa_key, iss="https://evil.example"),
        "wrong signature": make_jwt(other),
        "no expiry": make_jwt(rsa_key, exp=None),
        "no subject": make_jwt(rsa_key, sub=None),
        "alg none": make_jwt(None, algorithm="none"),
        "HMAC with the public key": _hs256_with(public_pem),
        "not a JWT": "not-a-jwt",
    }
    metadata = f"{jwt_url}/.well-known/oauth-protected-resource"
    for what, token in bad.items():
        for method, path in (("POST", "/api/v1/tools/list_content"), ("POST", "/mcp")):
            response = httpx.request(
                method, f"{jwt_url}{path}", json={}, headers={**bearer(token), **MCP_ACCEPT}
            )
            assert response.status_code == 401, what
            assert_401(response, metadata)
    assert_401(httpx.post(f"{jwt_url}/api/v1/tools/list_content", json={}), metadata)


def test_a_jwt_whose_principal_is_no_id_gets_401_and_harms_no_one(
    jwt_url: str, rsa_key: rsa.RSAPrivateKey
) -> None:
    """A principal is checked as a session id is: a validly signed token whose principal
    could not be stored or sent back (a lone surrogate, a control character, 257
    characters, a number) authenticates no one."""
    metadata = f"{jwt_url}/.well-known/oauth-protected-resource"
    for sub in ("\ud800", "alice\x00", "bob\x1b[31m", "a" * 257, " alice", 42, ""):
        token = make_jwt(rsa_key, sub=sub)
        for method, path in (
            ("POST", "/api/v1/tools/create_goal"),
            ("DELETE", "/api/v1/sessions/s"),
            ("POST", "/mcp"),
        ):
            response = httpx.request(
                method,
                f"{jwt_url}{path}",
                json={"goal": "x"} if method == "POST" else None,
                headers={**bearer(token), **MCP_ACCEPT, "X-Session-Id": "s"},
            )
            assert response.status_code == 401, (sub, path, response.text)
            assert_401(response, metadata)
    alice = make_jwt(rsa_key, sub="alice")
    assert call(jwt_url, "create_goal", {"goal": "ok"}, token=alice, session="s").status_code == 200
    assert rest_goals(jwt_url, alice, "s") == ["ok"]


def _hs256_with(secret: bytes) -> str:
    """A token "signed" with the server's public key as an HMAC secret (alg confusion)."""
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    now = int(time.time())
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": now + 300}
    payload = b64(json.dumps(claims).encode())
    signature = b64(hmac.new(secret, header + b"." + payload, hashlib.sha256).digest())
    return (header + b"." + payload + b"." + signature).decode()


def test_protected_resource_metadata_is_served(jwt_url: str) -> None:
    response = httpx.get(f"{jwt_url}/.well-known/oauth-protected-resource")
    assert response.status_code == 200
    assert response.json() == {
        "resource": jwt_url,
        "authorization_servers": [ISSUER],
        "bearer_methods_supported": ["header"],
        "resource_name": "ctxactors",
    }


class _Jwks(BaseHTTPRequestHandler):
    """A JWKS endpoint; each test makes its own subclass (`_jwks_handler`), whose count
    starts at zero: a count kept on this class would carry over from an earlier run of the
    test in the same process (mutmut runs the tests twice in one process)."""

    document = b"{}"
    fetches = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).fetches += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.document)

    def log_message(self, *args: Any) -> None:
        pass


def _jwks_handler(document: bytes) -> type[_Jwks]:
    return type("Jwks", (_Jwks,), {"document": document, "fetches": 0})


def test_jwts_checked_against_a_jwks_url() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    handler = _jwks_handler(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig"}]}).encode())
    jwks = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=jwks.serve_forever, daemon=True).start()
    options = ("--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE)
    jwks_url = f"http://127.0.0.1:{jwks.server_address[1]}/jwks.json"
    try:
        with http_server("--jwt-jwks-url", jwks_url, *options) as (url, _proc):
            rest = base(url)
            good = make_jwt(key, "ES256", headers={"kid": "k1"})
            assert call(rest, "list_content", {}, token=good, session="k").status_code == 200
            impostor = ec.generate_private_key(ec.SECP256R1())
            for token in (
                make_jwt(impostor, "ES256", headers={"kid": "k1"}),
                make_jwt(key, "ES256", headers={"kid": "unknown"}),
                make_jwt(key, "ES256", headers={"kid": "k1"}, aud="another-service"),
            ):
                assert_401(
                    call(rest, "list_content", {}, token=token, session="k"),
                    f"{rest}/.well-known/oauth-protected-resource",
                )
            # Unknown kids refresh the key set at most once per cooldown (PyJWT's 30 s from
            # the first fetch), not once a token. These few requests take well under 30 s,
            # even on a loaded machine; a run that took longer would see one refetch more.
            for n in range(5):
                forged = make_jwt(key, "ES256", headers={"kid": f"forged-{n}"})
                assert call(rest, "list_content", {}, token=forged, session="k").status_code == 401
            assert handler.fetches == 1
    finally:
        jwks.shutdown()


# -- what serve refuses to start -------------------------------------------------------------


def test_a_loopback_bind_accepts_its_own_address_as_host() -> None:
    """127.0.0.2 is loopback too: clients that connect to it send it as their Host."""
    port = free_port()
    command = [*SERVE, "--transport", "http", "--host", "127.0.0.2", "--port", str(port)]
    proc = subprocess.Popen(command, env=serve_env(), stdin=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.2:{port}/api/v1/tools"

        def answer() -> httpx.Response | None:
            assert proc.poll() is None, "serve exited"
            try:
                return httpx.get(url)
            except httpx.TransportError:
                return None

        assert wait_until(answer, 30, 0.05).status_code == 200
        assert httpx.get(url, headers={"Host": "evil.example"}).status_code == 421
    finally:
        proc.terminate()
        proc.wait(15)


def test_a_non_loopback_bind_without_auth_exits_2() -> None:
    done = subprocess.run(
        [*SERVE, "--transport", "http", "--host", "0.0.0.0", "--port", str(free_port())],
        env=serve_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(
        "ctxactors serve: --host 0.0.0.0 is not a loopback address and no authentication "
        "is configured"
    )
    assert "--insecure-no-auth" in done.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--host", "10.1.2.3"], "--host 10.1.2.3 is not a loopback address"),
        (
            ["--max-sessions-per-principal", "2"],
            "--max-sessions-per-principal needs authentication",
        ),
        (["--max-actors-per-principal", "2"], "--max-actors-per-principal needs authentication"),
        (["--jwt-public-key", "k.pem", "--jwt-issuer", ISSUER], "JWT authentication needs"),
        (["--jwt-issuer", ISSUER, "--jwt-audience", "a"], "give exactly one of --jwt-public-key"),
        (
            ["--allow-origin", "https://app.example/path"],
            "--allow-origin 'https://app.example/path'",
        ),
        (
            ["--jwt-public-key", __file__, "--jwt-issuer", ISSUER, "--jwt-audience", "a"],
            "not a PEM public key",
        ),
        (
            ["--auth-tokens", __file__, "--jwt-issuer", ISSUER],
            "either --auth-tokens or the --jwt-* options",
        ),
        (["--auth-tokens", "/nonexistent/tokens"], "--auth-tokens /nonexistent/tokens: "),
    ],
)
def test_bad_access_options_exit_2_with_a_message(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["serve", "--transport", "http", *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_bad_token_file_exits_2_without_echoing_a_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ALICE} alice\nshort-secret bob\n")
    assert cli_main(["serve", "--transport", "http", "--auth-tokens", str(tokens)]) == 2
    err = capsys.readouterr().err
    assert f"--auth-tokens {tokens} line 2: a token needs at least 16 characters" in err
    assert "short-secret" not in err
    tokens.write_text(f"{ALICE} alice\n{ALICE} bob\n")
    assert cli_main(["serve", "--transport", "http", "--auth-tokens", str(tokens)]) == 2
    assert "a token is listed twice" in capsys.readouterr().err


def test_a_token_file_principal_that_is_no_id_exits_2_naming_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# who\n{ALICE} alice\n{BOB} bob\x07\n", encoding="utf-8")
    assert cli_main(["serve", "--transport", "http", "--auth-tokens", str(tokens)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"ctxactors serve: --auth-tokens {tokens} line 3: the principal contains the "
        "character '\\x07', which no header carries\n"
    )
    assert BOB not in err
