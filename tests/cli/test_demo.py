"""The demo the README's first command runs tells a true story."""

from __future__ import annotations

import subprocess
import sys

from ctxactors.cli.demo import StoryLog, demo
from ctxactors.logs import configure_logging

SPOOFING = (
    "the model also wrote __assistantId='planner': dropped (the call ran as 'coder'), "
    "logged as spoofing (spoofed_context_dropped)"
)


def test_demo_reports_isolation_and_refused_cross_assistant_selection() -> None:
    lines: list[str] = []
    log = StoryLog()
    configure_logging(level="warning", file=log.stream, force=True)
    assert demo(["s1", "s2", "s3"], 4, out=lines.append, log=log) is True
    text = "\n".join(lines)
    assert "BAD" not in text
    assert text.count("sees 4 goals, 0 of anyone else's") == 6
    assert text.count("does not belong to assistant 'coder'") == 2
    # The spoofing warning is read back from the log and told where it happened.
    told = [line for line in lines if "__assistantId='planner'" in line]
    assert told == [f"  [ok ] s1: {SPOOFING}", f"  [ok ] s2: {SPOOFING}"]
    assert log.untold() == []


def test_demo_command_exits_zero_and_prints_no_raw_log_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ctxactors.cli", "demo", "--sessions", "2", "--goals", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Every conversation saw only its own state." in proc.stdout
    assert proc.stdout.count("[ok ]") == 10
    assert proc.stdout.count(SPOOFING) == 2
    assert "{" not in proc.stdout and proc.stderr == ""  # no JSON line in the story, or after
