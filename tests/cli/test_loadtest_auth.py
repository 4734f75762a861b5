"""``ctxactors loadtest --url`` against a server with authentication: a real ``ctxactors
serve --auth-tokens``, over REST and MCP, the token from ``CTXACTORS_TOKEN`` or a file, and
never shown in what the load test prints or writes."""

from __future__ import annotations

import argparse
import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mcp_support import http_server

from ctxactors.cli.loadtest import command as loadtest
from ctxactors.cli.loadtest.options import LoadOptions

pytestmark = pytest.mark.timeout(120)

TOKEN = "loader-" + secrets.token_urlsafe(24)
TENANT = "tenant-" + secrets.token_urlsafe(24)  # no operator: /api/v1/stats is not theirs


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tokens = tmp_path_factory.mktemp("auth") / "tokens"
    tokens.write_text(f"{TOKEN} loader\n{TENANT} tenant\n")
    flags = ("--auth-tokens", str(tokens), "--operator", "loader", "--store", "memory")
    with http_server(*flags) as (url, _proc):
        yield url.removesuffix("/mcp")


@pytest.fixture(autouse=True)
def no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CTXACTORS_TOKEN", raising=False)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    loadtest.add_arguments(parser)
    return parser.parse_args([*argv, "--no-progress"])


def server_calls(base: str) -> int:
    stats = httpx.get(f"{base}/api/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"})
    assert stats.status_code == 200, stats.text
    calls: int = stats.json()["calls"]
    return calls


@pytest.mark.parametrize("path", ["", "/mcp"])
def test_a_run_with_the_token_from_the_environment_passes(
    base: str,
    path: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CTXACTORS_TOKEN", TOKEN)
    before = server_calls(base)
    out = tmp_path / "report.json"
    argv = ("--url", base + path, "--sessions", "6", "--calls", "8", "--json", str(out))
    assert loadtest.run(parse(*argv)) == 0, capsys.readouterr()
    report = json.loads(out.read_text())
    assert report["passed"] and report["errors"] == {}
    assert report["actors"]["spawned"] is not None  # /api/v1/stats was read with the token
    done = report["workload_calls"] + report["verification_calls"]
    assert server_calls(base) == before + done
    printed = capsys.readouterr()
    assert TOKEN not in printed.out + printed.err + out.read_text()


def test_a_tenant_that_is_no_operator_runs_without_the_servers_counters(
    base: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTXACTORS_TOKEN", TENANT)
    assert loadtest.run(parse("--url", base, "--sessions", "3", "--calls", "4")) == 0
    out = capsys.readouterr().out
    assert "actors       n/a (no /api/v1/stats for this caller: none served, or not an " in out
    assert "verdict      PASS: 0 violations" in out


def test_the_token_may_come_from_a_file(base: str, tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n")
    options = LoadOptions.from_args(parse("--url", base, "--token-file", str(path)))
    assert TOKEN not in repr(options) and "Bearer('***')" in repr(options)
    argv = ("--url", base, "--token-file", str(path), "--sessions", "3", "--calls", "4")
    assert loadtest.run(parse(*argv)) == 0


@pytest.mark.parametrize(
    ("token", "said"),
    [
        (None, "asks for a bearer token"),
        ("wrong-" + secrets.token_urlsafe(16), "refused the bearer token"),
    ],
    ids=["none", "wrong"],
)
def test_a_missing_or_wrong_token_is_one_clear_line(
    base: str,
    token: str | None,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if token is not None:
        monkeypatch.setenv("CTXACTORS_TOKEN", token)
    before = server_calls(base)
    assert loadtest.run(parse("--url", base + "/mcp", "--sessions", "2", "--calls", "2")) == 2
    printed = capsys.readouterr()
    assert printed.err == (
        f"ctxactors loadtest: {base} {said} (HTTP 401): put a valid one in CTXACTORS_TOKEN or "
        "--token-file\n"
    )
    assert token is None or token not in printed.out + printed.err
    assert server_calls(base) == before  # nothing was sent


@pytest.mark.parametrize("content", ["qzx1 qzx2\n", "qzx1\nqzx2\n", "qzx1\tqzx2", ""])
def test_a_token_that_cannot_be_a_header_is_refused_without_quoting_it(
    tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "token"
    path.write_text(content)
    assert loadtest.run(parse("--url", "http://127.0.0.1:1", "--token-file", str(path))) == 2
    assert capsys.readouterr().err == (
        f"ctxactors loadtest: the token in --token-file {path} is not a bearer token "
        "(RFC 6750: letters, digits, -._~+/ and trailing =, on one line)\n"
    )


def test_token_options_are_refused_where_they_mean_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    assert loadtest.run(parse("--token-file", str(missing))) == 2
    assert capsys.readouterr().err == "ctxactors loadtest: --token-file is for a server of --url\n"
    assert loadtest.run(parse("--url", "http://127.0.0.1:1", "--token-file", str(missing))) == 2
    err = capsys.readouterr().err
    assert err == f"ctxactors loadtest: --token-file {missing}: No such file or directory\n"
