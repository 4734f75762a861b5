#!/usr/bin/env python3
"""Bootstrap and run: the README's quick start on a machine with only python3.

    python3 scripts/dev.py demo      # the scripted multi-session demo
    python3 scripts/dev.py test      # the test suite
    python3 scripts/dev.py <cmd...>  # any `ctxactors` subcommand

Creates `.venv` beside the project on first use and installs the project into it
(editable, with every extra and the test tools), then re-runs inside it. Uses only the
standard library so it works before anything is installed. Before the tests it installs,
from Debian, the programs and libraries they run for real when they are missing (bubblewrap
and libseccomp2 for the workspace sandbox, e2fsprogs for its disk images, redis-server for the Redis store, tmux for
`ctxactors top`), as root or through sudo, and builds `.venv-mcp1`: langchain-mcp-adapters
needs ``mcp<2`` while `ctxactors serve` needs ``mcp>=2.3``, so the adapter's client runs from
that second environment (the project's core and the adapter, no `[serve]`) against `serve`
from `.venv`.
"""

from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".ctxactors-installed"


def ensure_venv() -> None:
    if not PY.exists():
        print(f"creating {VENV} ...", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(VENV)
    pyproject = ROOT / "pyproject.toml"
    if STAMP.exists() and STAMP.stat().st_mtime >= pyproject.stat().st_mtime:
        return
    print("installing ctxactors and its dependencies ...", file=sys.stderr)
    pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[all,test]"], check=True)
    STAMP.touch()


VENV_MCP1 = ROOT / ".venv-mcp1"
STAMP_MCP1 = VENV_MCP1 / ".ctxactors-installed"
# What the LangChain MCP test's client (tests/langchain_mcp_client.py) imports there.
MCP1_PACKAGES = ["langchain-mcp-adapters>=0.3,<0.4", "langgraph>=1"]


def ensure_mcp1_venv() -> None:
    """`.venv-mcp1`, the project's core (no extras: `[serve]` would pull in mcp 2) beside
    langchain-mcp-adapters and its mcp 1.x, reinstalled when pyproject.toml or this script
    changes."""
    py = VENV_MCP1 / "bin" / "python"
    if not py.exists():
        print(f"creating {VENV_MCP1} ...", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(VENV_MCP1)
    newest = max(p.stat().st_mtime for p in (ROOT / "pyproject.toml", Path(__file__)))
    if STAMP_MCP1.exists() and STAMP_MCP1.stat().st_mtime >= newest:
        return
    print("installing langchain-mcp-adapters into .venv-mcp1 ...", file=sys.stderr)
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-e", str(ROOT), *MCP1_PACKAGES], check=True)
    STAMP_MCP1.touch()


# program the tests run -> the Debian package that has it
TEST_PROGRAMS = {
    "bwrap": "bubblewrap",
    "redis-server": "redis-server",
    "tmux": "tmux",
    "mkfs.ext4": "e2fsprogs",  # the workspace's disk images (ctxactors.loop_images)
}
# library loaded at run time -> its Debian package (libseccomp: the sandbox's seccomp filter)
TEST_LIBRARIES = {"seccomp": "libseccomp2"}


def ensure_test_programs() -> None:
    missing = [pkg for exe, pkg in TEST_PROGRAMS.items() if shutil.which(exe) is None]
    missing += [pkg for lib, pkg in TEST_LIBRARIES.items() if ctypes.util.find_library(lib) is None]
    if not missing or shutil.which("apt-get") is None:
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    if sudo and shutil.which("sudo") is None:
        print(f"tests need {' '.join(missing)}: install them (Debian packages)", file=sys.stderr)
        return
    print(f"installing {' '.join(missing)} (apt-get) ...", file=sys.stderr)
    for step in (["update", "-qq"], ["install", "-y", "-qq", *missing]):
        subprocess.run([*sudo, "apt-get", *step], check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str]) -> int:
    ensure_venv()
    cmd = argv or ["demo"]
    if cmd[0] == "test":
        ensure_test_programs()
        ensure_mcp1_venv()
        run = [str(PY), "-m", "pytest", *cmd[1:]]
    else:
        run = [str(VENV / "bin" / "ctxactors"), *cmd]
    return subprocess.call(run, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
