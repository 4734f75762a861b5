"""The README's quick start says what `scripts/dev.py test` does to the machine and how long
the suite takes, and names the same Debian packages the script installs."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_start() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def test_the_quick_start_names_every_package_dev_py_installs_and_how() -> None:
    spec = importlib.util.spec_from_file_location("dev", ROOT / "scripts" / "dev.py")
    assert spec is not None and spec.loader is not None
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    text = " ".join(quick_start().split())  # one line: the wrapping doesn't matter
    packages = sorted([*dev.TEST_PROGRAMS.values(), *dev.TEST_LIBRARIES.values()])
    assert packages == ["bubblewrap", "libseccomp2", "redis-server", "tmux"]
    named = re.search(r"installs the Debian packages (.+?) when they are missing", text)
    assert named is not None
    assert sorted(re.findall(r"`([a-z0-9-]+)`", named[1])) == packages
    assert "with `apt-get`, as root or through `sudo`" in text
    assert "The test suite takes 11-15 minutes on 2 cores" in text
