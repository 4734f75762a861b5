"""``ctxactors serve`` keeps state by default: across a clean restart, and across a SIGKILL
under concurrent load, where every acknowledged call's effect is present afterwards and the
call in flight in each session is either wholly present or absent."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_support import SERVE, http_server, serve_env
from state_support import RedisServer, redis_server

from ctxactors.state import SQLiteStore, default_data_dir, open_store


def rest(base: str, tool: str, session: str, client: httpx.Client, **args: Any) -> Any:
    response = client.post(
        f"{base}/api/v1/tools/{tool}", json=args, headers={"X-Session-Id": session}
    )
    response.raise_for_status()
    body = response.json()
    assert not body["isError"], body
    return body["structuredContent"]


def base_of(url: str) -> str:
    return url.removesuffix("/mcp")


def test_the_default_store_is_sqlite_under_the_users_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "ctxactors"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")  # the XDG spec: absolute only
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_dir() == tmp_path / "home" / ".local" / "state" / "ctxactors"
    store = open_store("sqlite", data_dir=None, retention=60)
    assert isinstance(store, SQLiteStore)
    assert store.path == tmp_path / "home" / ".local" / "state" / "ctxactors" / "state.db"
    assert store.retention == 60
    store.close()
    assert open_store("memory", data_dir=None, retention=60) is None
    with pytest.raises(ValueError, match="unknown store 'mysql://x'"):
        open_store("mysql://x", data_dir=None, retention=60)


def test_serve_keeps_state_across_a_restart(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "data")]
    with httpx.Client(timeout=30) as client:
        with http_server(*data) as (url, _):
            assert rest(base_of(url), "create_goal", "s1", client, goal="Learn Rust")["id"] == "g1"
        assert (tmp_path / "data" / "state.db").exists()
        with http_server(*data) as (url, _):
            state = rest(base_of(url), "get_planning_state", "s1", client)
            assert state == {"goals": [{"id": "g1", "goal": "Learn Rust"}], "todos": []}
        with http_server("--store", "memory") as (url, _):  # ephemeral: a fresh start
            state = rest(base_of(url), "get_planning_state", "s1", client)
            assert state == {"goals": [], "todos": []}


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    # With a password: `serve` refuses a Redis that lets anyone in (ctxactors.redis_access).
    with redis_server(tmp_path / "redis", password="durable-serve-7c1d") as server:
        yield server


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_sigkill_under_load_loses_no_acknowledged_call(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if store == "sqlite":
        flags = ["--data-dir", str(tmp_path / "data")]
    else:
        (tmp_path / "redis").mkdir()
        server: RedisServer = request.getfixturevalue("redis")
        flags = ["--store", server.url]
    sessions = 16
    acked: dict[str, list[str]] = {f"crash-{i}": [] for i in range(sessions)}
    in_flight: dict[str, str | None] = dict.fromkeys(acked)
    kill_after = random.Random(os.getpid()).randint(60, 240)  # a random moment
    enough = threading.Event()
    total = [0]
    lock = threading.Lock()

    def load(base: str, session: str) -> None:
        with httpx.Client(timeout=30) as client:
            n = 0
            while True:
                n += 1
                goal = f"{session}-goal-{n}"
                in_flight[session] = goal
                try:
                    rest(base, "create_goal", session, client, goal=goal)
                except (httpx.HTTPError, OSError):
                    return  # the server died under this call: it is in doubt
                acked[session].append(goal)
                in_flight[session] = None
                with lock:
                    total[0] += 1
                    if total[0] >= kill_after:
                        enough.set()

    with http_server(*flags) as (url, proc):
        workers = [
            threading.Thread(target=load, args=(base_of(url), s), daemon=True) for s in acked
        ]
        for worker in workers:
            worker.start()
        assert enough.wait(120), "the load never got going"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        for worker in workers:
            worker.join(60)
    assert sum(len(a) for a in acked.values()) >= kill_after

    in_doubt_present = 0
    with http_server(*flags) as (url, _), httpx.Client(timeout=30) as client:
        for session, goals in acked.items():
            state = rest(base_of(url), "get_planning_state", session, client)
            found = [g["goal"] for g in state["goals"]]
            doubt = in_flight[session]
            if doubt is not None and found == [*goals, doubt]:
                in_doubt_present += 1  # applied and saved, but the reply never came
            else:
                assert found == goals, session
            assert [g["id"] for g in state["goals"]] == [f"g{i + 1}" for i in range(len(found))]
    assert 0 <= in_doubt_present <= sessions


@pytest.mark.parametrize(
    "garbage", [os.urandom(8192), b"SQLite format 3\0" + b"\xff" * 4080], ids=["noise", "header"]
)
def test_a_damaged_store_file_is_one_line_naming_the_file_and_the_fix(
    tmp_path: Path, garbage: bytes
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "state.db").write_bytes(garbage)
    done = subprocess.run(
        [*SERVE, "--data-dir", str(data)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=serve_env(),
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stdout == b""  # the stdio protocol channel stays clean
    assert done.stderr.decode() == (
        f"ctxactors serve: the state store {data / 'state.db'} is damaged (file is not a "
        "database): move it aside to start with an empty store, or restore it from a "
        "backup\n"
    )
    assert (data / "state.db").read_bytes() == garbage  # nothing was written to it
