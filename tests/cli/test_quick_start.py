"""The quick start (the README's, and Getting started's in the docs) says what
`scripts/dev.py test` does to the machine and how long the suite takes, and names the same
Debian packages the script installs."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each page that has a quick start, and the heading of that section.
PAGES = {"README.md": "## Quick start", "docs/getting-started.md": "## The quick start"}


def quick_start(page: str) -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    return text.split(PAGES[page], 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_quick_start_names_every_package_dev_py_installs_and_how(page: str) -> None:
    spec = importlib.util.spec_from_file_location("dev", ROOT / "scripts" / "dev.py")
    assert spec is not None and spec.loader is not None
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    text = " ".join(quick_start(page).split())  # one line: the wrapping doesn't matter
    packages = sorted([*dev.TEST_PROGRAMS.values(), *dev.TEST_LIBRARIES.values()])
    assert packages == ["bubblewrap", "e2fsprogs", "libseccomp2", "redis-server", "tmux"]
    named = re.search(r"installs the Debian packages (.+?) when they are missing", text)
    assert named is not None
    assert sorted(re.findall(r"`([a-z0-9-]+)`", named[1])) == packages
    assert "with `apt-get`, as root or through `sudo`" in text
    assert "The test suite takes 8-12 minutes on 2 cores" in text
