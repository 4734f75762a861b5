"""``ctxactors logs``: filters, inputs (files, gzip, stdin), summary figures, follow, bad lines."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ctxactors.cli import logs as logtool
from ctxactors.testing import wait_until


def call_line(
    session: str,
    tool: str,
    duration: float,
    *,
    assistant: str | None = "a1",
    thread: str | None = None,
    outcome: str = "ok",
    ts: str = "2026-01-01T10:00:00.000000Z",
    level: str = "info",
) -> str:
    return json.dumps(
        {
            "logger": "ctxactors",
            "session_id": session,
            "assistant_id": assistant,
            "thread_id": thread,
            "tool": tool,
            "duration_ms": duration,
            "outcome": outcome,
            "event": "tool_call",
            "level": level,
            "timestamp": ts,
        }
    )


LINES = [
    call_line("s1", "create_goal", 1.0, ts="2026-01-01T10:00:00Z"),
    call_line("s1", "add_todo", 3.0, thread="t1", ts="2026-01-01T10:05:00Z"),
    call_line("s2", "create_goal", 2.0, assistant="a2", ts="2026-01-01T10:10:00Z"),
    call_line("s2", "select_playbook", 4.0, outcome="error", ts="2026-01-01T10:15:00Z"),
    json.dumps({"event": "actor_spawned", "session_id": "s1", "level": "info", "server": "x"}),
    "Traceback (most recent call last):",
    "[1, 2]",
    "",
]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    logtool.add_arguments(parser)
    return parser.parse_args(list(argv))


def run(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = logtool.run(parse(*argv), stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    path = tmp_path / "calls.log"
    path.write_text("\n".join(LINES) + "\n")
    return path


def records(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ((), [1.0, 3.0, 2.0, 4.0, None]),
        (("--session", "s1"), [1.0, 3.0, None]),
        (("--session", "s1", "--session", "s2", "--event", "tool_call"), [1.0, 3.0, 2.0, 4.0]),
        (("--assistant", "a2"), [2.0]),
        (("--thread", "t1"), [3.0]),
        (("--tool", "create_goal"), [1.0, 2.0]),
        (("--errors",), [4.0]),
        (("--since", "2026-01-01T10:05:00Z", "--until", "2026-01-01T10:10:00"), [3.0, 2.0]),
        (("--session", "s2", "--tool", "add_todo"), []),
    ],
)
def test_filters_keep_exactly_the_matching_lines(
    log_file: Path, argv: tuple[str, ...], expected: list[float | None]
) -> None:
    code, out, err = run(str(log_file), "--json", *argv)
    assert code == 0
    assert [r.get("duration_ms") for r in records(out)] == expected
    assert "2 of 7 lines were not JSON objects" in err  # counted, never a crash
    assert f"first at {log_file}:6" in err


def test_relative_since_uses_now_and_bad_times_are_refused(log_file: Path) -> None:
    code, out, _ = run(str(log_file), "--since", "15m")  # these lines are from January
    assert (code, out) == (0, "")
    code, out, err = run(str(log_file), "--since", "yesterday")
    assert code == 2 and "not an ISO time or a duration like 15m: 'yesterday'" in err


def test_gzip_and_stdin_read_like_plain_files(log_file: Path, tmp_path: Path) -> None:
    packed = tmp_path / "calls.log.1"  # rotated name without .gz: detected by magic bytes
    packed.write_bytes(gzip.compress(log_file.read_bytes()))
    plain = run(str(log_file), "--json")[1]
    assert run(str(packed), "--json")[1] == plain
    assert run("-", "--json", stdin=log_file.read_text())[1] == plain
    assert run("--json", stdin=log_file.read_text())[1] == plain  # '-' is the default


def test_unreadable_file_is_reported_and_the_others_still_read(log_file: Path) -> None:
    code, out, err = run("/nonexistent/x.log", str(log_file), "--tool", "add_todo", "--json")
    assert code == 2
    assert "cannot read /nonexistent/x.log" in err
    assert [r["tool"] for r in records(out)] == ["add_todo"]


def test_readable_lines_show_who_what_and_how_long(log_file: Path) -> None:
    _, out, _ = run(str(log_file))
    lines = out.splitlines()
    assert "s1/a1/t1" in lines[1] and "add_todo" in lines[1] and "3.00 ms" in lines[1]
    assert lines[3].rstrip().endswith("error")
    assert "actor_spawned" in lines[4] and "server=x" in lines[4]


def test_summary_per_session_and_tool(tmp_path: Path) -> None:
    path = tmp_path / "many.log"
    lines = [call_line("s1", "create_goal", float(d)) for d in range(1, 101)]  # 1..100 ms
    lines += [call_line("s2", "add_todo", 7.0, outcome="error") for _ in range(3)]
    lines.append("{not json")
    path.write_text("\n".join(lines))
    code, out, _ = run(str(path), "--summary", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["by_session"]["s1"] == {"calls": 100, "errors": 0, "p50_ms": 50.0, "p99_ms": 99.0}
    assert data["by_session"]["s2"] == {"calls": 3, "errors": 3, "p50_ms": 7.0, "p99_ms": 7.0}
    assert data["by_tool"]["add_todo"]["errors"] == 3
    assert (data["lines"], data["invalid_lines"]) == (104, 1)
    code, table, _ = run(str(path), "--summary", "--session", "s2")
    assert "tool calls by session" in table and "s2" in table and "s1 " not in table


def test_summary_keeps_the_sessions_with_the_most_calls_and_says_how_many_it_left_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "busy.log"
    # Session sNN makes NN calls: the busiest are s25, s24, ...
    lines = [call_line(f"s{n:02d}", "add_todo", 1.0) for n in range(1, 26) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")
    code, out, _ = run(str(path), "--summary", "--json")
    assert code == 0
    data = json.loads(out)
    assert list(data["by_session"]) == [f"s{n:02d}" for n in range(25, 5, -1)]  # the top 20
    assert data["left_out"] == {"session": 5, "tool": 0}
    data = json.loads(run(str(path), "--summary", "--json", "--top", "3")[1])
    assert list(data["by_session"]) == ["s25", "s24", "s23"]
    assert data["by_session"]["s23"]["calls"] == 23
    assert data["left_out"] == {"session": 22, "tool": 0}
    data = json.loads(run(str(path), "--summary", "--json", "--top", "0")[1])
    assert len(data["by_session"]) == 25 and data["left_out"] == {"session": 0, "tool": 0}
    _, table, _ = run(str(path), "--summary", "--top", "2")
    assert "\n23 more sessions with fewer calls (--top 0 shows all)\n" in table
    assert "more tools" not in table
    assert " s25 " in table and " s24 " in table and " s23 " not in table
    with pytest.raises(SystemExit):
        parse(str(path), "--summary", "--top", "-1")


def test_follow_prints_appended_lines_and_survives_truncation_and_rotation(tmp_path: Path) -> None:
    path = tmp_path / "live.log"
    path.write_text(call_line("s1", "create_goal", 1.0) + "\n")
    stop = threading.Event()
    out = io.StringIO()
    args = parse(str(path), "--follow", "--json", "--session", "s1")
    worker = threading.Thread(
        target=logtool.run, args=(args,), kwargs={"stdout": out, "stop": stop}
    )
    worker.start()

    def wait_for(count: int) -> list[float]:
        def printed() -> list[float] | None:
            got = [r["duration_ms"] for r in records(out.getvalue())]
            return got if len(got) >= count else None

        return wait_until(printed, 20, describe=out.getvalue)

    try:
        assert wait_for(1) == [1.0]
        with open(path, "a") as f:
            f.write(call_line("s2", "create_goal", 9.0) + "\n")  # filtered out
            f.write(call_line("s1", "add_todo", 2.0)[:20])  # half a line: not yet
            f.flush()
            time.sleep(0.5)
            assert wait_for(1) == [1.0]
            f.write(call_line("s1", "add_todo", 2.0)[20:] + "\n")
        assert wait_for(2) == [1.0, 2.0]
        path.write_text(call_line("s1", "mark_todo", 3.0) + "\n")  # truncated and rewritten
        assert wait_for(3) == [1.0, 2.0, 3.0]
        path.rename(tmp_path / "live.log.1")  # rotated: a new file takes the name
        lines = [call_line("s1", "get_planning_state", float(d)) for d in (4, 5, 6)]
        (tmp_path / "live.log").write_text("\n".join(lines) + "\n")
        assert wait_for(6) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    finally:
        stop.set()
        worker.join(timeout=20)
    assert not worker.is_alive()


def test_follow_needs_one_file(log_file: Path) -> None:
    code, _, err = run(str(log_file), "--follow", "--summary")
    assert code == 2 and "--follow takes exactly one file" in err


def test_summary_of_real_runtime_lines_counts_every_call(tmp_path: Path) -> None:
    """The lines the runtime really writes (via a load test run) parse and add up."""
    log, report = tmp_path / "rt.log", tmp_path / "report.json"
    env = {**os.environ, "CTXACTORS_LOG_LEVEL": "info", "CTXACTORS_LOG_FILE": str(log)}
    subprocess.run(
        [sys.executable, "-m", "ctxactors.cli", "loadtest", "--sessions", "6", "--calls", "10"]
        + ["--no-progress", "--json", str(report)],
        env=env,
        check=True,
        capture_output=True,
        timeout=50,
    )
    figures = json.loads(report.read_text())
    code, out, err = run(str(log), "--summary", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    calls = sum(row["calls"] for row in data["by_session"].values())
    assert calls == figures["workload_calls"] + figures["verification_calls"]
    assert len(data["by_session"]) == 6
