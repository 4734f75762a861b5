"""Redis is trusted infrastructure: ``serve`` uses a Redis store only with a password where
tenants could reach it, takes the password from the URL or a file, and never shows it.

Against a real ``redis-server`` asking for a password (``requirepass``, or an ACL user with
the rules docs/durable-state.md gives): the store works with the password, from the URL or
from ``CTXACTORS_REDIS_PASSWORD_FILE``; without it, or with a wrong one, ``serve`` refuses
to start in one line. A Redis with no password is refused off loopback, and on loopback
while the sandbox shares the host's network, unless the operator accepts it. No error or
log line ever holds the password.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_support import SERVE, http_server, serve_env
from state_support import STORE_ACL, RedisServer

from ctxactors.redis_url import has_credentials, redact, resolve
from ctxactors.settings import RedisSettings, SandboxSettings, Settings, WorkspaceSettings

PASSWORD = "hunter2-7f3c9a1e5b"
GIVE_IT = (
    "give the password of requirepass or of an ACL user in the URL or in "
    "CTXACTORS_REDIS_PASSWORD_FILE"
)


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis that asks for `PASSWORD` (requirepass)."""
    server = RedisServer(tmp_path, password=PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.stop(kill=True)


def serve(*flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``ctxactors serve`` on stdio with no input: it starts, or refuses to, and ends."""
    return subprocess.run(
        [*SERVE, *flags],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={**serve_env(), **env},
        timeout=60,
    )


def rest(base: str, tool: str, session: str, **args: Any) -> dict[str, Any]:
    answer = httpx.post(
        f"{base}/api/v1/tools/{tool}", json=args, headers={"X-Session-Id": session}, timeout=30
    )
    body: dict[str, Any] = answer.json()
    return body


def test_the_store_works_with_the_password_from_the_url_or_a_file(
    guarded: RedisServer, tmp_path: Path
) -> None:
    secret = tmp_path / "redis-password"
    secret.write_text(PASSWORD + "\n")
    log = tmp_path / "serve.err"
    with http_server("--store", guarded.url, stderr=log.open("wb")) as (url, _):
        base = url.removesuffix("/mcp")
        assert rest(base, "create_goal", "s1", goal="kept")["structuredContent"]["id"] == "g1"
    # The URL without the password, the password in a file: the same store, the same state.
    with http_server(
        "--store", guarded.bare_url, env={"CTXACTORS_REDIS_PASSWORD_FILE": str(secret)}
    ) as (url, _):
        state = rest(url.removesuffix("/mcp"), "get_planning_state", "s1")["structuredContent"]
        assert state == {"goals": [{"id": "g1", "goal": "kept"}], "todos": []}
    assert PASSWORD not in log.read_text()


def test_an_acl_user_with_the_documented_rules_runs_the_store(tmp_path: Path) -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "durable-state.md"
    assert STORE_ACL in docs.read_text(encoding="utf-8")  # the rules the docs give
    server = RedisServer(tmp_path, user="ctxactors", password=PASSWORD)
    server.start()
    try:
        with http_server("--store", server.url) as (url, _):
            base = url.removesuffix("/mcp")
            for tool, args in [
                ("create_goal", {"goal": "g"}),
                ("add_content", {"filename": "f", "content": "text"}),
            ]:
                assert not rest(base, tool, "s1", **args)["isError"], tool
        # A new server reads it all back from Redis: state, content, history.
        with http_server("--store", server.url) as (url, _):
            base = url.removesuffix("/mcp")
            answers = [
                rest(base, tool, "s1", **args)["structuredContent"]
                for tool, args in [
                    ("get_planning_state", {}),
                    ("read_content", {"id": "c1"}),
                    ("get_recent_context", {}),
                ]
            ]
    finally:
        server.stop(kill=True)
    state, content, history = answers
    assert state == {"goals": [{"id": "g1", "goal": "g"}], "todos": []}
    assert content == {"id": "c1", "filename": "f", "content": "text"}
    assert [op["tool"] for op in history["operations"]] == [
        "read_content",
        "get_planning_state",
        "add_content",
        "create_goal",
    ]


def test_serve_refuses_in_one_line_a_missing_or_wrong_password(
    guarded: RedisServer, tmp_path: Path
) -> None:
    done = serve("--store", guarded.bare_url)
    assert (done.returncode, done.stderr) == (
        1,
        f"ctxactors serve: --store: Redis at {guarded.bare_url} asks for a password: {GIVE_IT}\n",
    )
    wrong = guarded.bare_url.replace("redis://", "redis://:wrong-password-0123@")
    done = serve("--store", wrong)
    shown = guarded.bare_url.replace("redis://", "redis://:***@")
    assert (done.returncode, done.stderr) == (
        1,
        f"ctxactors serve: --store: Redis at {shown} refused the credentials (invalid "
        f"username-password pair or user is disabled.): {GIVE_IT}\n",
    )
    empty = tmp_path / "empty"
    empty.write_text("")
    done = serve("--store", guarded.bare_url, CTXACTORS_REDIS_PASSWORD_FILE=str(empty))
    assert (done.returncode, done.stderr) == (
        1,
        f"ctxactors serve: --store: CTXACTORS_REDIS_PASSWORD_FILE: the Redis password file "
        f"{empty} is empty\n",
    )


def test_serve_refuses_a_redis_without_a_password_that_tenants_could_reach(
    tmp_path: Path,
) -> None:
    advice = (
        ": whoever connects reads and rewrites every tenant's state. Give Redis a password "
        "(requirepass, or an ACL user) and put it in the URL (redis://:PASSWORD@host, "
        "redis://USER:PASSWORD@host) or in CTXACTORS_REDIS_PASSWORD_FILE, or accept that on "
        "a network you trust with CTXACTORS_REDIS_ALLOW_NO_AUTH=1\n"
    )
    # Another host: refused before anything connects to it.
    done = serve("--store", "redis://redis.example:6379/0")
    assert (done.returncode, done.stderr) == (
        1,
        "ctxactors serve: --store: redis://redis.example:6379/0 is a Redis without a "
        "password on redis.example, not this machine's loopback" + advice,
    )
    open_redis = RedisServer(tmp_path)
    open_redis.start()
    try:
        # Loopback is no shelter once workspace commands share the host's network.
        done = serve("--store", open_redis.url, CTXACTORS_WORKSPACE_NETWORK="1")
        assert (done.returncode, done.stderr) == (
            1,
            f"ctxactors serve: --store: {open_redis.url} is a Redis without a password on "
            "loopback, which workspace commands reach (workspace.sandbox.network is on)" + advice,
        )
        # The operator may accept it; and loopback with the sandbox's own network is fine.
        accepted = serve(
            "--store",
            open_redis.url,
            CTXACTORS_WORKSPACE_NETWORK="1",
            CTXACTORS_REDIS_ALLOW_NO_AUTH="1",
        )
        assert accepted.returncode == 0, accepted.stderr
        assert serve("--store", open_redis.url).returncode == 0
    finally:
        open_redis.stop(kill=True)


def test_no_error_or_log_line_shows_the_password(guarded: RedisServer, tmp_path: Path) -> None:
    done = serve("--store", f"redsi://:{PASSWORD}@127.0.0.1/0")  # a typo in the scheme
    assert (done.returncode, done.stderr) == (
        1,
        "--store: unknown store 'redsi://:***@127.0.0.1/0': use sqlite, memory or a redis:// URL\n",
    )
    done = serve("--backend", "ray", "--store", f"http://ctxactors:{PASSWORD}@127.0.0.1/0")
    assert (done.returncode, done.stderr) == (
        1,
        "--backend ray: the Ray backend keeps state in Redis: store must be a redis:// URL, "
        "got 'http://ctxactors:***@127.0.0.1/0'\n",
    )
    # Serving, and then failing every call once Redis is gone: the password in none of it.
    log = tmp_path / "serve.err"
    with http_server(
        "--store", guarded.url, env={"CTXACTORS_LOG_LEVEL": "debug"}, stderr=log.open("wb")
    ) as (url, _):
        base = url.removesuffix("/mcp")
        assert not rest(base, "create_goal", "s1", goal="g")["isError"]
        guarded.stop(kill=True)
        failed = rest(base, "create_goal", "s1", goal="h")
        assert failed["isError"] and "Redis store unavailable" in str(failed), failed
        assert PASSWORD not in str(failed)
    logged = log.read_text()
    assert '"event":"serving"' in logged.replace(" ", "")
    assert PASSWORD not in logged


def test_passwords_are_found_and_hidden_wherever_redis_py_reads_them() -> None:
    assert redact(f"redis://:{PASSWORD}@h:1/0") == "redis://:***@h:1/0"
    assert (
        redact(f"got 'rediss://alice:{PASSWORD}@h/0' there") == "got 'rediss://alice:***@h/0' there"
    )
    assert redact(f"unix:///run/redis.sock?db=0&password={PASSWORD}") == (
        "unix:///run/redis.sock?db=0&password=***"
    )
    assert redact("redis://h:6379/0") == "redis://h:6379/0"
    # A user part with no colon is hidden whole: redis://PASSWORD@host is a common slip.
    assert redact("redis://p@ss@h/0") == "redis://***@h/0"
    assert redact(f"at redis://{PASSWORD}@10.0.0.5/0 x") == "at redis://***@10.0.0.5/0 x"
    assert redact(f"rediss://h/0?ssl_password={PASSWORD}&db=0") == (
        "rediss://h/0?ssl_password=***&db=0"
    )
    for url, expected in [
        ("redis://:pw@h/0", True),
        ("redis://alice:pw@h/0", True),
        ("redis://h/0?password=pw", True),
        ("rediss://h/0?ssl_certfile=/etc/c.pem&ssl_keyfile=/etc/k.pem", True),  # TLS client cert
        ("redis://alice@h/0", False),
        ("redis://:@h/0", False),
        ("redis://h/0?ssl_certfile=/etc/c.pem", False),  # no TLS, no certificate sent
    ]:
        assert has_credentials(url) is expected, url


def test_a_password_file_s_password_goes_into_the_url_quoted(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("p@ss/w:rd\n")
    settings = Settings(redis=RedisSettings(password_file=str(secret)))
    assert resolve("redis://alice@10.0.0.5:6379/0", settings) == (
        "redis://alice:p%40ss%2Fw%3Ard@10.0.0.5:6379/0"
    )
    assert resolve("unix:///run/redis.sock", settings) == "unix://:p%40ss%2Fw%3Ard@/run/redis.sock"
    open_sandbox = Settings(
        workspace=WorkspaceSettings(sandbox=SandboxSettings(mode="none", network=True))
    )
    # With the sandbox off nothing guards loopback anyway (commands run as the server).
    assert resolve("redis://127.0.0.1:6379/0", open_sandbox) == "redis://127.0.0.1:6379/0"
