"""``ctxactors top`` in a real terminal (tmux) against a served process under load."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mcp_support import http_server, serve_env, wait_until
from rich.console import Console

from ctxactors.cli.top import View, quantile
from ctxactors.transports.observe import ErrorLine, SessionCalls, TopStats

pytestmark = pytest.mark.timeout(90)

TOP = [sys.executable, "-m", "ctxactors.cli", "top"]


def test_quantiles_interpolate_inside_their_bucket_as_prometheus_does() -> None:
    bounds = [0.001, 0.01, 0.1]
    # 10 calls under 1 ms, 10 between 1 and 10 ms, nothing slower.
    counts = [10, 10, 0, 0]
    assert quantile(0.5, bounds, counts) == 0.001
    assert quantile(0.25, bounds, counts) == 0.0005
    assert quantile(0.75, bounds, counts) == pytest.approx(0.0055)
    assert quantile(0.99, bounds, [0, 0, 0, 5]) == 0.1  # in +Inf: the highest finite bound
    assert quantile(0.5, bounds, [0, 0, 0, 0]) is None


@contextlib.contextmanager
def load(base: str, headers: dict[str, str] | None = None) -> Iterator[None]:
    """Calls until the block ends: a busy session, a quiet one, and failing reads."""
    stop = threading.Event()

    def run() -> None:
        with httpx.Client(base_url=base, headers=headers or {}) as client:
            client.post(
                "/api/v1/tools/create_goal",
                json={"goal": "q"},
                headers={"X-Session-Id": "quiet-one"},
            )
            i = 0
            while not stop.is_set():
                client.post(  # read-only: the session's state doesn't grow to its cap
                    "/api/v1/tools/get_planning_state",
                    json={},
                    headers={"X-Session-Id": "busy-one"},
                )
                if i % 10 == 0:
                    client.post(
                        "/api/v1/tools/read_content",
                        json={"id": f"missing-{i}"},
                        headers={"X-Session-Id": "failing-one"},
                    )
                i += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


@contextlib.contextmanager
def terminal(command: list[str], env: dict[str, str] | None = None) -> Iterator[str]:
    """`command` in a detached 120x40 tmux window of a private tmux server; yields the
    socket name for `screen`."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed (python3 scripts/dev.py test installs it)")
    socket = f"ctxactors-top-{id(command)}"
    options = [f"-e{k}={v}" for k, v in (env or {}).items()]
    subprocess.run(
        ["tmux", "-L", socket, "new-session", "-d", "-x", "120", "-y", "40", *options, "--"]
        + command,
        check=True,
        env=serve_env(),
    )
    try:
        yield socket
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], check=False)


def screen(socket: str) -> str:
    return subprocess.run(
        ["tmux", "-L", socket, "capture-pane", "-p"], capture_output=True, text=True, check=True
    ).stdout


def rate(text: str) -> float:
    found = re.search(r"calls/s ([0-9.]+)", text)
    return float(found.group(1)) if found else 0.0


def sessions(text: str) -> list[str]:
    """The session column of the "top sessions" table, in its order."""
    table = text.split("top sessions by calls", 1)[-1].split("recent errors", 1)[0]
    return [row.split("│")[2].strip() for row in table.splitlines() if row.startswith("│")]


def test_top_shows_a_loaded_server_live() -> None:
    with http_server() as (url, _proc):
        base = url.removesuffix("/mcp")
        with load(base), terminal([*TOP, "--url", base]) as socket:
            frames: list[str] = []

            def complete() -> bool:
                # Live: the rate is over the last second, so it is only nonzero under load;
                # the failing session overtakes the quiet one after its second call. One
                # frame is checked whole: a screen read mid-redraw can lack a table.
                frames.append(shown := screen(socket))
                return (
                    rate(shown) > 0
                    and sessions(shown) == ["busy-one", "failing-one", "quiet-one"]
                    and ERROR_ROW.search(shown) is not None
                )

            assert wait_until(complete, 40), frames[-1]
            shown = frames[-1]
    assert re.search(r"p50 [0-9.]+ ms +p90 [0-9.]+ ms +p99 [0-9.]+ m?s", shown), shown
    assert re.search(r"actors 3 \(peak 3\) +sessions 3 ", shown), shown


ERROR_ROW = re.compile(r"read_content +│ failing-one +│ content 'missing-\d+' not found")


ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdefghi"


def test_top_shows_a_non_operator_only_their_own_sessions(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ALICE} alice\n{BOB} bob\n")
    with http_server("--auth-tokens", str(tokens), "--operator", "alice") as (url, _proc):
        base = url.removesuffix("/mcp")
        for token in (ALICE, BOB):
            response = httpx.post(
                base + "/api/v1/tools/create_goal",
                json={"goal": "g"},
                headers={"Authorization": f"Bearer {token}", "X-Session-Id": f"own-{token[:3]}"},
            )
            assert response.status_code == 200

        def top(token: str | None) -> str:
            env = {**serve_env(), "COLUMNS": "120"}
            env.pop("CTXACTORS_TOKEN", None)
            if token:
                env["CTXACTORS_TOKEN"] = token
            done = subprocess.run(
                [*TOP, "--url", base, "--once", "--interval", "0.1"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        bobs = top(BOB)
        assert "own-bob" in bobs and "own-ali" not in bobs and "scope principal" in bobs
        alices = top(ALICE)
        assert "own-bob" in alices and "own-ali" in alices and "scope all" in alices
        assert "refused (401): set CTXACTORS_TOKEN to a bearer token" in top(None)


def test_what_tenants_chose_is_drawn_as_text_never_as_markup_or_escapes() -> None:
    """A session id or an error message is any tenant's text: as rich markup a bad tag ended
    the operator's view and a link tag drew a link; an escape sequence reached the terminal."""
    hostile = [
        "[/x]",
        "[link=http://evil.example]x[/link]",
        "\x1b]8;;http://evil.example\x1b\\x",
    ]
    sample = TopStats(
        time=1000.0,
        scope="all",
        runtime={},
        calls=3,
        errors=3,
        latency_bounds=[0.1],
        latency_counts=[3, 0],
        top_sessions=[SessionCalls(None, text, 1) for text in hostile],
        recent_errors=[ErrorLine(1000.0, "read_content", None, "s", t) for t in hostile],
    )
    console = Console(record=True, width=200, color_system=None, force_terminal=False)
    console.print(View("http://127.0.0.1:1/mcp").render(sample))
    screen = console.export_text()
    assert "\x1b" not in screen and "evil.example]x[/link]" in screen
    assert screen.count("[/x]") == 2
    assert screen.count("\\x1b]8;;http://evil.example\\x1b\\x") == 2
