#!/usr/bin/env python3
"""Bootstrap and run: the README's quick start on a machine with only python3.

    python3 scripts/dev.py demo      # the scripted multi-session demo
    python3 scripts/dev.py test      # the test suite
    python3 scripts/dev.py <cmd...>  # any `ctxactors` subcommand

Creates `.venv` beside the project on first use and installs the project into it
(editable, with every extra and the test tools), then re-runs inside it. Uses only the
standard library so it works before anything is installed. Before the tests it installs,
from Debian, the programs and libraries they run for real when they are missing (bubblewrap
and libseccomp2 for the workspace sandbox, redis-server for the Redis store, tmux for
`ctxactors top`), as root or through sudo.
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


def main(argv: list[str]) -> int:
    ensure_venv()
    cmd = argv or ["demo"]
    if cmd[0] == "test":
        ensure_test_programs()
        run = [str(PY), "-m", "pytest", *cmd[1:]]
    else:
        run = [str(VENV / "bin" / "ctxactors"), *cmd]
    return subprocess.call(run, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
