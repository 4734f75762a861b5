"""One settings object per runtime: two runtimes in one process keep their own limits."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import anyio
import msgspec
import pytest
from mcp import Client
from mcp_support import serve_env, stdio_params

from ctxactors import Runtime
from ctxactors.cli.loadtest import command as loadtest
from ctxactors.servers.content import Content
from ctxactors.servers.history import History
from ctxactors.settings import (
    ContentSettings,
    HistorySettings,
    Settings,
    assign,
    fields,
    validate,
)
from ctxactors.testing import context_args as ctx_args


def add(rt: Runtime, size: int) -> str:
    result = rt.call("add_content", ctx_args("s1", filename="f", content="x" * size))
    return result.text if result.is_error else "stored"


def test_two_runtimes_in_one_process_each_enforce_their_own_item_cap() -> None:
    small = Settings(content=ContentSettings(max_item_bytes=10))
    large = Settings(content=ContentSettings(max_item_bytes=20))
    with (
        Runtime(servers=[Content], settings=small) as one,
        Runtime(servers=[Content], settings=large) as two,
    ):
        assert add(one, 10) == add(two, 20) == "stored"
        assert add(one, 11) == "content of 'f' is 11 bytes; one item may hold at most 10 bytes"
        assert add(two, 21) == "content of 'f' is 21 bytes; one item may hold at most 20 bytes"
        assert add(two, 11) == "stored"  # the first runtime's cap is not the second's
        assert (one.settings.content.max_item_bytes, two.settings.content.max_item_bytes) == (
            10,
            20,
        )


def test_the_environment_is_read_when_a_runtime_is_made_not_at_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CTXACTORS_CONTENT_MAX_ITEM_BYTES", "5")
    with Runtime(servers=[Content]) as rt:
        assert add(rt, 6) == "content of 'f' is 6 bytes; one item may hold at most 5 bytes"
    monkeypatch.setenv("CTXACTORS_CONTENT_MAX_ITEM_BYTES", "6")
    with Runtime(servers=[Content]) as rt:
        assert add(rt, 6) == "stored"


def test_the_runtime_keywords_are_shortcuts_that_override_the_settings() -> None:
    given = Settings(ttl=100.0, max_actors=7, call_timeout=9.0)
    with Runtime(servers=[Content], settings=given, ttl=5.0) as rt:
        assert (rt.settings.ttl, rt.settings.max_actors, rt.settings.call_timeout) == (5.0, 7, 9.0)
        assert (rt._registry.ttl, rt._registry.max_actors, rt.call_timeout) == (5.0, 7, 9.0)


def test_a_bad_setting_is_refused_at_construction_naming_field_and_variable() -> None:
    bad = Settings(content=ContentSettings(max_items=0))
    with pytest.raises(ValueError) as refused:
        Runtime(servers=[Content], settings=bad)
    assert str(refused.value) == (
        "content.max_items (CTXACTORS_CONTENT_MAX_ITEMS) must be at least 1"
    )
    with pytest.raises(ValueError) as refused:
        Runtime(servers=[Content], settings=Settings(history=HistorySettings(ttl=-1.0)))
    assert str(refused.value) == "history.ttl (CTXACTORS_HISTORY_TTL) must be positive"


def test_a_bad_variable_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, message in (
        ("ten", "CTXACTORS_HISTORY_TTL must be a number, got 'ten'"),
        ("0", "CTXACTORS_HISTORY_TTL must be positive, got '0'"),
    ):
        monkeypatch.setenv("CTXACTORS_HISTORY_TTL", value)
        with pytest.raises(ValueError) as refused:
            Runtime(servers=[History])
        assert str(refused.value) == message


def test_settings_are_frozen_and_round_trip_through_json() -> None:
    settings = Settings(content=ContentSettings(max_items=3))
    with pytest.raises(AttributeError):
        settings.ttl = 1.0  # type: ignore[misc]
    again = msgspec.json.decode(msgspec.json.encode(settings), type=Settings)
    assert again == settings


def test_settings_types_are_described_once_per_process_not_on_every_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Describing a group's type evaluates its annotations (about 1 ms a group): done on each
    # validation, it was a third of ``ctxactors serve``'s startup and 20 ms of every Runtime().
    Settings.from_env()
    described: list[object] = []
    real = msgspec.inspect.type_info
    monkeypatch.setattr(
        msgspec.inspect, "type_info", lambda kind: described.append(kind) or real(kind)
    )
    settings = assign(Settings.from_env(), ["content.max_items=3"]).replace(ttl=5.0)
    assert validate(settings) is settings
    assert (settings.ttl, settings.content.max_items) == (5.0, 3)
    assert described == []


def test_the_docs_limits_table_lists_every_setting_with_its_variable() -> None:
    limits = (Path(__file__).resolve().parents[2] / "docs" / "limits.md").read_text(
        encoding="utf-8"
    )
    rows = {
        row.split("|")[1].strip(" `"): row.split("|")[2].split()[0].strip("`")
        for row in limits.splitlines()
        if re.match(r"^\| `[a-z_.]+` \|", row)
    }
    for name, variable, _ in fields(Settings):
        assert name in rows, f"docs/limits.md's table has no row for {name}"
        assert rows[name] == (variable or "—"), name


def test_serve_fills_the_settings_from_its_flags_and_the_environment() -> None:
    params = stdio_params("--set", "content.max_item_bytes=10")
    assert params.env is not None
    params.env["CTXACTORS_CONTENT_MAX_ITEMS"] = "1"

    async def main() -> list[str]:
        texts = []
        async with Client(params) as client:
            for content in ("x" * 11, "x" * 10, "y"):
                args = {"filename": "f", "content": content, "__sessionId": "s1"}
                result = await client.call_tool("add_content", args)
                texts.append(result.content[0].text if result.is_error else "stored")
        return texts

    assert anyio.run(main) == [
        "content of 'f' is 11 bytes; one item may hold at most 10 bytes",  # the flag
        "stored",
        "content store full: it holds the maximum of 1 items; delete something first",  # env
    ]


@pytest.mark.parametrize(
    ("command", "env", "message"),
    [
        (
            ["serve"],
            {"CTXACTORS_CONTENT_MAX_ITEMS": "lots"},
            "ctxactors serve: CTXACTORS_CONTENT_MAX_ITEMS must be an integer, got 'lots'",
        ),
        (
            ["serve", "--set", "content.max_items=0"],
            {},
            "ctxactors serve: --set content.max_items must be at least 1, got 0",
        ),
        (
            ["demo", "--set", "content.nope=1"],
            {},
            "ctxactors demo: --set content.nope: no such setting (see the limits table, docs/limits.md)",
        ),
    ],
)
def test_a_bad_setting_stops_a_command_with_one_line_naming_it(
    command: list[str], env: dict[str, str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ctxactors", *command],
        env=serve_env() | env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (1, "", message + "\n")


def test_loadtest_refuses_a_bad_setting_before_it_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser()
    loadtest.add_arguments(parser)
    args = parser.parse_args(["--set", "history.ttl=soon", "--no-progress"])
    assert loadtest.run(args) == 2
    err = capsys.readouterr().err
    assert err == "ctxactors loadtest: --set history.ttl must be a number, got 'soon'\n"
