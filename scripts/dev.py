#!/usr/bin/env python3
"""Bootstrap and run: the README's quick start on a machine with only python3.

    python3 scripts/dev.py demo      # the scripted multi-session demo
    python3 scripts/dev.py test      # the test suite
    python3 scripts/dev.py <cmd...>  # any `ctxactors` subcommand

Creates `.venv` beside the project on first use and installs the project into it
(editable, with every extra and the test tools), then re-runs inside it. Uses only the
standard library so it works before anything is installed. The installs go through uv
(from PyPI, into `.venv`: it downloads and unpacks in parallel), or pip where uv can't be
had. Before the tests it installs, from Debian, the programs and libraries they run for real when they are missing (bubblewrap
and libseccomp2 for the workspace sandbox, redis-server for the Redis store, tmux for
`ctxactors top`), as root or through sudo, and builds `.venv-mcp1`: langchain-mcp-adapters
needs ``mcp<2`` while `ctxactors serve` needs ``mcp>=2.3``, so the adapter's client runs from
that second environment (the project's core and the adapter, no `[serve]`) against `serve`
from `.venv`. `.venv-mcp1` and the Debian programs are made while `.venv` installs.

`test` runs the suite on pytest-xdist's workers (`tests/parallel.py` says how it is split):
most tests wait on subprocesses, servers and sandboxes, so more workers than cores pay.
Options after `test` go to pytest; `-n` among them replaces the default worker count.
"""

from __future__ import annotations

import concurrent.futures
import ctypes.util
import os
import shutil
import subprocess
import sys
import threading
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".ctxactors-installed"
UV = VENV / "bin" / "uv"


def make_venv() -> None:
    """`.venv`, with pip: it installs uv, and the CI builds the wheel with it."""
    if not PY.exists():
        print(f"creating {VENV} ...", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(VENV)


def ensure_venv() -> None:
    pyproject = ROOT / "pyproject.toml"
    if STAMP.exists() and STAMP.stat().st_mtime >= pyproject.stat().st_mtime:
        return
    print("installing ctxactors and its dependencies ...", file=sys.stderr)
    install(PY, ["-e", f"{ROOT}[all,test]"])
    STAMP.touch()


_UV_LOCK = threading.Lock()  # the installs run at once (main): uv is installed once
_NO_UV: list[bool] = []


def uv() -> Path | None:
    """uv in `.venv` (installed there by pip on first use), or None where it can't be had."""
    with _UV_LOCK:
        if not UV.exists() and not _NO_UV:
            pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
            if subprocess.run([*pip, "uv"]).returncode != 0:
                print("uv could not be installed: installing with pip", file=sys.stderr)
                _NO_UV.append(True)
        return UV if UV.exists() else None


def install(python: Path, args: list[str]) -> None:
    """Install `args` (pip's syntax) into the environment of `python`: with uv, or pip."""
    fast = uv()
    if fast is not None:
        # Bytecode now, as pip does: the suite starts hundreds of Python processes, and
        # with PYTHONDONTWRITEBYTECODE set each would compile every module it imports.
        command = [str(fast), "pip", "install", "-q", "--compile-bytecode"]
        if subprocess.run([*command, "--python", str(python), *args]).returncode == 0:
            return
        print("uv failed: trying pip", file=sys.stderr)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    if not (python.parent / "pip").exists():
        subprocess.run([str(python), "-m", "ensurepip", "-q"], check=True)
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, *args], check=True)


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
        # No pip of its own: uv installs from outside (`install` adds pip if it must).
        venv.EnvBuilder().create(VENV_MCP1)
    newest = max(p.stat().st_mtime for p in (ROOT / "pyproject.toml", Path(__file__)))
    if STAMP_MCP1.exists() and STAMP_MCP1.stat().st_mtime >= newest:
        return
    print("installing langchain-mcp-adapters into .venv-mcp1 ...", file=sys.stderr)
    install(py, ["-e", str(ROOT), *MCP1_PACKAGES])
    STAMP_MCP1.touch()


# program the tests run -> the Debian package that has it
TEST_PROGRAMS = {"bwrap": "bubblewrap", "redis-server": "redis-server", "tmux": "tmux"}
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


# Four workers on two cores: the suite waits on subprocesses, servers, sandboxes and Ray
# more than it computes.
WORKERS = 4
PARALLEL = ["--dist", "loadfile", "--no-loadscope-reorder"]


def pytest_args(args: list[str]) -> list[str]:
    """What `test` passes to pytest: `args`, on WORKERS workers unless they name a count,
    whole modules each unless they name a --dist (docs pages must stay whole)."""
    if "no:xdist" in args:
        return args
    counted = any(
        a == "-n" or a.startswith("--numprocesses") or a.startswith("-n") and a[1:2] != "-"
        for a in args
    )
    dist = any(a.startswith("--dist") for a in args)
    return [*([] if counted else ["-n", str(WORKERS)]), *([] if dist else PARALLEL), *args]


def main(argv: list[str]) -> int:
    cmd = argv or ["demo"]
    make_venv()
    steps = [ensure_venv]
    if cmd[0] == "test":
        steps += [ensure_mcp1_venv, ensure_test_programs]
    # At once: each mostly waits on downloads and unpacking.
    with concurrent.futures.ThreadPoolExecutor(len(steps)) as pool:
        for done in [pool.submit(step) for step in steps]:
            done.result()
    if cmd[0] == "test":
        run = [str(PY), "-m", "pytest", *pytest_args(cmd[1:])]
    else:
        run = [str(VENV / "bin" / "ctxactors"), *cmd]
    return subprocess.call(run, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
