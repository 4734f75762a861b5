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

import grp
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_support import SERVE, free_port, http_server, serve_env
from state_support import STORE_ACL, RedisServer

from ctxactors.redis_url import has_credentials, redact, with_password

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
    secret.chmod(0o600)
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
    socket = f"unix://{guarded.socket}"  # its owner's only: taken without a password
    done = serve("--store", socket)
    assert (done.returncode, done.stderr) == (
        1,
        f"ctxactors serve: --store: Redis at {socket} asks for a password: {GIVE_IT}\n",
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


ADVICE = (
    ": whoever connects reads and rewrites every tenant's state. To fix, give Redis a password "
    "(requirepass, or an ACL user) and put it in CTXACTORS_REDIS_PASSWORD_FILE or the URL "
    "(USER:PASSWORD@ before the host), or use a unix:// socket others can't open; or accept "
    "this on a network you trust with CTXACTORS_REDIS_ALLOW_NO_AUTH=1\n"
)


def test_serve_refuses_a_redis_without_a_password_loopback_included(tmp_path: Path) -> None:
    # Another host: refused before anything connects to it.
    done = serve("--store", "redis://redis.example:6379/0")
    assert (done.returncode, done.stderr) == (
        1,
        "ctxactors serve: --store: redis://redis.example:6379/0 is a Redis without a "
        "password on redis.example, which whoever reaches that address can connect to" + ADVICE,
    )
    open_redis = RedisServer(tmp_path)
    open_redis.start()
    try:
        # Loopback is no shelter: every local user can connect to it.
        done = serve("--store", open_redis.url)
        assert (done.returncode, done.stderr) == (
            1,
            f"ctxactors serve: --store: {open_redis.url} is a Redis without a password on "
            "loopback, which every user and process of this machine can connect to" + ADVICE,
        )
        # The operator may accept it, and is told so at every start.
        accepted = serve("--store", open_redis.url, CTXACTORS_REDIS_ALLOW_NO_AUTH="1")
        assert accepted.returncode == 0, accepted.stderr
        warnings = events(accepted.stderr, "redis_no_auth_allowed")
        assert [w["store"] for w in warnings] == [open_redis.url]
    finally:
        open_redis.stop(kill=True)


def test_shards_takes_the_settings_as_serve_does(tmp_path: Path) -> None:
    """``ctxactors shards --set``: the same Redis checks and settings as ``serve``."""
    shards = [*SERVE[:3], "shards", "--ray-address", "127.0.0.1:1"]
    open_redis = RedisServer(tmp_path)
    open_redis.start()
    try:

        def run(*flags: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*shards, "--store", open_redis.url, *flags],
                capture_output=True,
                text=True,
                env=serve_env(),
                timeout=60,
            )

        done = run()
        assert (done.returncode, done.stderr) == (
            2,
            f"ctxactors shards: {open_redis.url} is a Redis without a password on loopback, "
            "which every user and process of this machine can connect to" + ADVICE,
        )
        # Accepted by --set (with its warning), it goes on to Ray, with --set's token file.
        done = run("--set", "redis.allow_no_auth=true", "--set", "ray.token_file=/nowhere/t")
        assert done.returncode == 2
        assert done.stderr.splitlines()[-1] == (
            "ctxactors shards: ray.token_file (CTXACTORS_RAY_TOKEN_FILE): cannot read the Ray "
            "token file /nowhere/t: No such file or directory"
        )
        assert len(events(done.stderr, "redis_no_auth_allowed")) == 1
        done = run("--set", "redis.nope=1")
        assert (done.returncode, done.stderr.splitlines()[-1]) == (
            2,
            "ctxactors shards: --set redis.nope: no such setting (see the limits table, "
            "docs/limits.md)",
        )
    finally:
        open_redis.stop(kill=True)


def events(stderr: str, name: str) -> list[dict[str, Any]]:
    """The JSON log lines of event `name` in `stderr`."""
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == name]


def test_serve_refuses_a_redis_that_lets_in_a_client_without_the_password(
    tmp_path: Path,
) -> None:
    # The ACL user has a password, but the default user is still on without one.
    server = RedisServer(tmp_path, user="ctxactors", password=PASSWORD, strangers=True)
    server.start()
    try:
        done = serve("--store", server.url)
        shown = server.url.replace(PASSWORD, "***")
        assert (done.returncode, done.stderr) == (
            1,
            f"ctxactors serve: --store: Redis at {shown} lets in a client that gives no "
            "password (PONG): its default user is on without a password, so whoever reaches "
            "it reads and rewrites every tenant's state. To fix, turn the default user off "
            "(ACL SETUSER default off, or 'user default off' in redis.conf) or give it a "
            "password (requirepass); or accept this on a network you trust with "
            "CTXACTORS_REDIS_ALLOW_NO_AUTH=1\n",
        )
        accepted = serve("--store", server.url, CTXACTORS_REDIS_ALLOW_NO_AUTH="1")
        assert accepted.returncode == 0, accepted.stderr
        [warning] = events(accepted.stderr, "redis_no_auth_allowed")
        assert warning["why"] == f"Redis at {shown} lets in a client that gives no password (PONG)"
        assert PASSWORD not in accepted.stderr
    finally:
        server.stop(kill=True)


def test_a_redis_not_reached_at_startup_is_not_refused_but_said_unchecked() -> None:
    # Redis may come up after the server: its calls fail until then, as the store says.
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    done = serve("--store", url)
    assert done.returncode == 0, done.stderr
    [unchecked] = events(done.stderr, "redis_unchecked")
    assert unchecked["store"] == url.replace(PASSWORD, "***")
    assert unchecked["why"].startswith("not reached at startup: Error 111 connecting to")
    assert PASSWORD not in done.stderr


def test_a_password_given_to_a_redis_without_one_is_named_so(tmp_path: Path) -> None:
    open_redis = RedisServer(tmp_path)
    open_redis.start()
    try:
        given = with_password(open_redis.url, PASSWORD)
        done = serve("--store", given)
    finally:
        open_redis.stop(kill=True)
    shown = given.replace(PASSWORD, "***")
    assert (done.returncode, done.stderr) == (
        1,
        f"ctxactors serve: --store: Redis at {shown} has no password set, but one was given: "
        "set it in Redis (requirepass PASSWORD, or an ACL user with it: docs/durable-state.md)\n",
    )


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory every user may search (pytest's own are its owner's only)."""
    directory = Path(tempfile.mkdtemp(prefix="ctxactors-redis-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_unix_socket_without_a_password_is_taken_only_when_others_cant_open_it(
    public_dir: Path,
) -> None:
    server = RedisServer(public_dir)  # no password; its socket's mode 0700
    server.start()
    try:
        url = f"unix://{server.socket}"
        assert serve("--store", url).returncode == 0  # only its owner may open it
        server.socket.chmod(0o777)
        done = serve("--store", url)
        assert (done.returncode, done.stderr) == (
            1,
            f"ctxactors serve: --store: every user of this machine may open the Redis socket "
            f"{server.socket} (mode 0777), and the URL gives no password" + ADVICE,
        )
        public_dir.chmod(0o700)  # others can't reach the socket any more
        assert serve("--store", url).returncode == 0
        public_dir.chmod(0o755)
        accepted = serve("--store", url, CTXACTORS_REDIS_ALLOW_NO_AUTH="1")
        assert accepted.returncode == 0, accepted.stderr
        assert len(events(accepted.stderr, "redis_no_auth_allowed")) == 1
    finally:
        server.stop(kill=True)
    server.socket.unlink()  # (a killed Redis leaves it)
    done = serve("--store", url)  # gone: who may open it can't be told
    assert (done.returncode, done.stderr) == (
        1,
        f"ctxactors serve: --store: cannot tell who may open the Redis socket {server.socket}: "
        "No such file or directory, and the URL gives no password" + ADVICE,
    )


def test_a_password_file_others_may_read_is_refused_and_one_its_group_may_read_warned(
    guarded: RedisServer, tmp_path: Path
) -> None:
    secret = tmp_path / "redis-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o644)
    done = serve("--store", guarded.bare_url, CTXACTORS_REDIS_PASSWORD_FILE=str(secret))
    assert (done.returncode, done.stderr) == (
        1,
        "ctxactors serve: --store: CTXACTORS_REDIS_PASSWORD_FILE: every user of this machine "
        f"may read the Redis password file {secret} (mode 0644): chmod o-r {secret} (0600, or "
        "0640 for a group of the server's own)\n",
    )
    secret.chmod(0o640)
    done = serve("--store", guarded.bare_url, CTXACTORS_REDIS_PASSWORD_FILE=str(secret))
    assert done.returncode == 0, done.stderr
    [warning] = events(done.stderr, "redis_password_file_group_readable")
    group = grp.getgrgid(secret.stat().st_gid).gr_name
    assert (warning["path"], warning["mode"], warning["group"]) == (str(secret), "0640", group)
    secret.chmod(0o600)
    done = serve("--store", guarded.bare_url, CTXACTORS_REDIS_PASSWORD_FILE=str(secret))
    assert (done.returncode, done.stderr) == (0, "")
    # The password on the command line works, with a warning to use the file instead.
    done = serve("--store", guarded.url)
    assert done.returncode == 0, done.stderr
    [warning] = events(done.stderr, "redis_password_on_command_line")
    assert warning["store"] == guarded.url.replace(PASSWORD, "***")
    assert "redis.password_file" in warning["advice"] and PASSWORD not in done.stderr


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
        # The tenant is told what failed, not where Redis is; the log keeps that.
        failed = rest(base, "create_goal", "s1", goal="h")
        assert failed["isError"] and failed["content"][0]["text"] == (
            "the state store is unavailable (Redis store unavailable: no connection to Redis); "
            "nothing was changed, retry the call later"
        )
        down = httpx.delete(f"{base}/api/v1/sessions/s1", headers={"X-Session-Id": "s1"})
        assert (down.status_code, down.json()["error"]) == (
            503,
            {"code": "store_unavailable", "message": "the state store is unavailable; retry later"},
        )
    logged = log.read_text()
    assert '"event":"serving"' in logged.replace(" ", "")
    [detail, *_] = events(logged, "redis_unavailable")
    assert f"127.0.0.1:{guarded.port}" in detail["error"]
    assert [line["error"] for line in events(logged, "store_unavailable")] == [
        "Redis store unavailable: no connection to Redis"
    ]
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


def test_a_password_file_s_password_goes_into_the_url_quoted() -> None:
    assert with_password("redis://alice@10.0.0.5:6379/0", "p@ss/w:rd") == (
        "redis://alice:p%40ss%2Fw%3Ard@10.0.0.5:6379/0"
    )
    assert with_password("unix:///run/redis.sock", "p@ss/w:rd") == (
        "unix://:p%40ss%2Fw%3Ard@/run/redis.sock"
    )
