"""The demo the README's first command runs tells a true story."""

from __future__ import annotations

import subprocess
import sys

from ctxactors.cli.demo import demo


def test_demo_reports_isolation_and_refused_cross_assistant_selection() -> None:
    lines: list[str] = []
    assert demo(["s1", "s2", "s3"], 4, out=lines.append) is True
    text = "\n".join(lines)
    assert "BAD" not in text
    assert text.count("sees 4 goals, 0 of anyone else's") == 6
    assert text.count("does not belong to assistant 'coder'") == 2


def test_demo_command_exits_zero() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ctxactors.cli", "demo", "--sessions", "2", "--goals", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Every conversation saw only its own state." in proc.stdout
    assert proc.stdout.count("[ok ]") == 8
