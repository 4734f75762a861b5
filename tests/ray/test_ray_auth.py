"""Ray is trusted infrastructure: every Ray a front end joins or starts has Ray's own token
authentication, and a client without the token can't reach a tenant's state through it.

On the session's multi-node cluster (started with a token, `ray_support`): a served front
end given only the token file serves its own state; a plain ``ray.init`` client that reads
a tenant's document through a shard succeeds with the token (so the attempt is a real one)
and fails at the connection without it, or with a wrong one. A front end with no token
configured, or with Ray's authentication turned off, refuses to start in one line before it
contacts Ray. A front end that starts its own Ray generates a token that is never logged
nor written to disk, and a client without it can't connect there either.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_support import serve_env
from ray_support import SHARD_RESOURCE, RayCluster
from served_support import SERVE, no_traceback, serving_http

from ctxactors.ray import RayBackend

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

# Every variable a token could come from, in this process's environment while the cluster
# runs (ray_support); a test that means a source gives it back explicitly.
TOKEN_VARS = ("CTXACTORS_RAY_TOKEN_FILE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")

# A tenant's document, read the way any Ray client could: ask the session's shard for it.
READER = """
import sys
import ray
from ctxactors.ray._directory import Layout
from ctxactors.ray._hashing import owner
from ctxactors.ray._shard import Moved

address, namespace, principal, session = sys.argv[1:5]
principal = principal or None  # the served front end has no authentication: no principal
ray.init(address=address, namespace=namespace, log_to_driver=False)
print("CONNECTED", flush=True)
layout = Layout(0, 1)  # any: the shard answers Moved with the real one
for _ in range(3):
    name = f"ctxactors-shard-{owner((principal, session), layout.count)}"
    shard = ray.get_actor(name, namespace=namespace)
    context = (principal, session, None, None)
    answer = ray.get(shard.call.remote(layout, "read_content", context, {"id": "c1"}, 10.0))
    if not isinstance(answer, Moved):
        break
    layout = answer.layout
print("READ", answer.structured["content"], flush=True)
"""


def clean_env(home: Path, **given: str) -> dict[str, str]:
    """`serve_env` with no token source but `given`, and a fresh HOME (no
    ``~/.ray/auth_token``)."""
    env = {k: v for k, v in serve_env().items() if k not in TOKEN_VARS}
    home.mkdir(exist_ok=True)
    return {**env, "HOME": str(home), "CTXACTORS_LOG_LEVEL": "info", **given}


@contextmanager
def front_end(
    env: dict[str, str], *flags: str, log: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``ctxactors serve --transport http --backend ray FLAGS``: its base URL and process,
    once healthy; stopped after, with no traceback in its log."""
    with serving_http(env, log, "--backend", "ray", *flags, start_timeout=120) as served:
        yield served
    no_traceback(log.read_text())


def rest(base: str, tool: str, session: str, **args: Any) -> Any:
    answer = httpx.post(
        f"{base}/api/v1/tools/{tool}", json=args, headers={"X-Session-Id": session}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert not body["isError"], body
    return body["structuredContent"]


def log_events(log: Path) -> list[dict[str, Any]]:
    lines = [line for line in log.read_text().splitlines() if line.startswith("{")]
    return [json.loads(line) for line in lines]


def start_reader(
    env: dict[str, str], address: str, namespace: str, session: str = "s1"
) -> subprocess.Popen[str]:
    """`READER` for `session` (no principal) of `namespace`, in its own process."""
    return subprocess.Popen(
        [sys.executable, "-c", READER, address, namespace, "", session],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def refused(reader: subprocess.Popen[str]) -> tuple[str, str]:
    """A reader's (stdout, stderr), once it failed."""
    out, err = reader.communicate(timeout=120)
    assert reader.returncode != 0, out
    return out, err


@pytest.fixture(scope="module")
def tenant(
    cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, str]]:
    """A served front end on a fresh namespace, joined with nothing but the token file
    (``CTXACTORS_RAY_TOKEN_FILE``), after it stored a tenant's document in a fresh session
    (the store outlives namespaces): (its base URL, the namespace, the session). One for
    the module: it takes most of a minute to start on a busy machine."""
    tmp_path = tmp_path_factory.mktemp("tenant")
    namespace = cluster.namespace()
    session = f"s-{namespace}"
    env = clean_env(tmp_path / "home", CTXACTORS_RAY_TOKEN_FILE=str(cluster.token_file))
    flags = ["--ray-address", cluster.cluster.address, "--ray-namespace", namespace]
    flags += ["--shard-resource", SHARD_RESOURCE, "--shards", "2", "--store", cluster.redis.url]
    log = tmp_path / "serve.err"
    try:
        with front_end(env, *flags, log=log) as (base, _):
            added = rest(base, "add_content", session, filename="plan.txt", content="the plan")
            assert added == {"id": "c1", "filename": "plan.txt"}
            yield base, namespace, session
    finally:
        RayBackend(
            cluster.cluster.address, store=cluster.redis.url, namespace=namespace
        ).kill_shards()
    (joined,) = [e for e in log_events(log) if e["event"] == "ray_joined"]
    assert {k: joined[k] for k in ("auth", "token")} == {
        "auth": "token",
        "token": f"ray.token_file ({cluster.token_file})",
    }
    assert cluster.token_file.read_text().strip() not in log.read_text()


def test_a_front_end_joined_with_the_token_file_reads_its_own_state(
    tenant: tuple[str, str, str],
) -> None:
    base, _, session = tenant
    assert rest(base, "read_content", session, id="c1") == {
        "id": "c1",
        "filename": "plan.txt",
        "content": "the plan",
    }


def test_a_ray_client_without_the_cluster_s_token_cannot_connect_nor_read_a_tenant_s_document(
    cluster: RayCluster, tenant: tuple[str, str, str], tmp_path: Path
) -> None:
    _, namespace, session = tenant
    address = cluster.cluster.address
    token = cluster.token_file.read_text().strip()
    # Three readers at once (two of them wait for Ray's connection retries to give up).
    right = clean_env(tmp_path / "h1", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    with_token = start_reader(right, address, namespace, session)
    no_token = start_reader(clean_env(tmp_path / "h2"), address, namespace, session)
    wrong = clean_env(tmp_path / "h3", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64)
    wrong_token = start_reader(wrong, address, namespace, session)

    # The attempt is real: with the token, the same client reads the tenant's document.
    out, err = with_token.communicate(timeout=120)
    assert (with_token.returncode, out) == (0, "CONNECTED\nREAD the plan\n"), err
    for reader in (no_token, wrong_token):
        out, err = refused(reader)
        assert out == ""  # not even connected: no task, no actor call ran
        assert "Unauthenticated: RPC error: InvalidAuthToken" in err
        assert f"ConnectionError: Failed to connect to Ray cluster at {address}" in err


def test_joining_with_no_token_or_with_ray_s_authentication_off_is_refused_in_one_line(
    cluster: RayCluster, tmp_path: Path
) -> None:
    address = cluster.cluster.address
    short = tmp_path / "short-token"
    short.write_text("0123456789\n")
    short.chmod(0o600)
    given = str(cluster.token_file)
    to_set = (
        "set CTXACTORS_RAY_TOKEN_FILE (or --set ray.token_file=PATH) to a file holding the "
        "cluster's token, or give it as RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"
    )
    cases: list[tuple[dict[str, str], str]] = [
        ({}, f"joining the Ray cluster at {address} needs its token: {to_set}"),
        (
            {"CTXACTORS_RAY_TOKEN_FILE": given, "RAY_AUTH_MODE": "disabled"},
            "RAY_AUTH_MODE is 'disabled': ctxactors uses Ray only with token authentication "
            "(unset it, or set it to token)",
        ),
        (
            {"CTXACTORS_RAY_TOKEN_FILE": str(short)},
            f"the Ray token in ray.token_file (CTXACTORS_RAY_TOKEN_FILE) ({short}) is 10 "
            "characters: use at least 32 (say, python3 -c 'import secrets; "
            "print(secrets.token_hex(32))')",
        ),
        (
            {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")},
            f"RAY_AUTH_TOKEN_PATH: cannot read the Ray token file {tmp_path / 'missing'}: "
            "No such file or directory",
        ),
        (
            {"CTXACTORS_RAY_TOKEN_FILE": given, "RAY_AUTH_TOKEN": "x" * 64},
            "both CTXACTORS_RAY_TOKEN_FILE (ray.token_file) and RAY_AUTH_TOKEN give a Ray "
            "token, and Ray would use RAY_AUTH_TOKEN: give only one",
        ),
    ]
    # The Redis password in a file: on the command line it would add a warning to stderr.
    secret = {"CTXACTORS_REDIS_PASSWORD_FILE": str(cluster.redis.password_file(tmp_path / "pw"))}
    store = cluster.redis.user_url
    for given_env, message in cases:
        env = clean_env(tmp_path / "home", **secret, **given_env)
        done = subprocess.run(
            [*SERVE, "--backend", "ray", "--ray-address", address, "--store", store],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert (done.returncode, done.stderr) == (1, f"--backend ray: {message}\n"), given_env
    # `ctxactors shards` joins the same way.
    shards = [sys.executable, "-m", "ctxactors.cli", "shards", "--ray-address", address]
    done = subprocess.run(
        [*shards, "--store", store],
        capture_output=True,
        text=True,
        env=clean_env(tmp_path / "home", **secret),
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (
        2,
        f"ctxactors shards: joining the Ray cluster at {address} needs its token: {to_set}\n",
    )


@pytest.mark.timeout(300)
def test_a_ray_the_front_end_starts_has_a_generated_token_no_one_else_has(
    cluster: RayCluster, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    env = clean_env(home)
    log = tmp_path / "serve.err"
    flags = ["--ray-address", "local", "--shards", "1", "--store", cluster.redis.url]
    namespace = cluster.namespace()
    flags += ["--ray-namespace", namespace]
    session = f"s-{namespace}"
    with front_end(env, *flags, log=log) as (base, server):
        rest(base, "create_goal", session, goal="mine")
        assert rest(base, "get_planning_state", session) == {
            "goals": [{"id": "g1", "goal": "mine"}],
            "todos": [],
        }
        (started,) = [e for e in log_events(log) if e["event"] == "ray_started"]
        assert {k: started[k] for k in ("auth", "token", "dashboard")} == {
            "auth": "token",
            "token": "generated",
            "dashboard": None,
        }
        token = _token_of_children(server.pid)
        assert len(token) == 64
        # Its sockets, logs and spilled objects are in a directory no other user can enter
        # (Ray's own default, /tmp/ray, is writable by everyone).
        temp_dir = Path(started["temp_dir"])
        info = temp_dir.parent.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), 0o700)
        (session,) = temp_dir.glob("session_2*")
        assert (session / "sockets").is_dir()
        reader = start_reader(clean_env(tmp_path / "h2"), started["address"], "any")
        out, err = refused(reader)
        assert out == ""
        assert "Unauthenticated: RPC error: InvalidAuthToken" in err
    assert token not in log.read_text()
    assert not (home / ".ray").exists()  # the token was never written (Ray's default would)


def _token_of_children(pid: int) -> str:
    """The token the Ray processes `pid` started were given (their environment at exec:
    the server's own /proc environ shows its environment before it made the token)."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    tokens = set()
    for child in children.stdout.split():
        raw = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        tokens |= {
            item[len(b"RAY_AUTH_TOKEN=") :].decode()
            for item in raw
            if item.startswith(b"RAY_AUTH_TOKEN=")
        }
    (token,) = tokens
    return token
