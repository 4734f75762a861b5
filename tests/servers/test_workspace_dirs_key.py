"""The secret that names kept workspace directories is only read from a file that is ours,
private and whole: a planted or empty key would make every directory name guessable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ctxactors.servers.workspace_dirs import SessionDirs
from ctxactors.settings import SandboxSettings

NONE = SandboxSettings(mode="none")


def test_the_key_is_made_private_and_whole_and_names_are_stable(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    first = SessionDirs(root, NONE).path(("p", "s1"))
    key = Path(root, ".ctxactors-session-key")
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    assert SessionDirs(root, NONE).path(("p", "s1")) == first  # read back, same name
    assert SessionDirs(root, NONE).path(("q", "s1")) != first  # the principal counts


@pytest.mark.parametrize(
    ("content", "mode"),
    [(b"", 0o600), (b"x" * 31, 0o600), (b"x" * 33, 0o600), (b"x" * 32, 0o644)],
)
def test_a_key_that_is_short_long_or_readable_by_others_is_refused(
    tmp_path: Path, content: bytes, mode: int
) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    key = root / ".ctxactors-session-key"
    key.write_bytes(content)
    os.chmod(key, mode)
    with pytest.raises(RuntimeError, match="mode 0600 and 32 bytes"):
        SessionDirs(str(root), NONE).path(("p", "s1"))


def test_a_key_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    elsewhere = tmp_path / "planted"
    elsewhere.write_bytes(b"x" * 32)
    os.chmod(elsewhere, 0o600)
    (root / ".ctxactors-session-key").symlink_to(elsewhere)
    with pytest.raises(OSError):
        SessionDirs(str(root), NONE).path(("p", "s1"))
