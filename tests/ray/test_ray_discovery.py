"""Which cluster a front end given no address joins: the one Ray's discovery file names only
when no other local user could have written that file (else it could be pointed at a
listener of theirs, which would receive the Ray token)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import structlog

from ctxactors.ray._auth import RayAuthError, trusted_address


@pytest.fixture
def discovery(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Ray's discovery file under a temp dir of this test's (RAY_TMPDIR), not yet written."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "ray").mkdir(mode=0o755)
    os.chmod(tmp_path / "ray", 0o755)
    return tmp_path / "ray" / "ray_current_cluster"


def write(path: Path, mode: int = 0o644) -> None:
    path.write_text("192.0.2.7:6379")
    os.chmod(path, mode)


def test_an_explicit_address_or_ray_address_is_used_as_given(
    discovery: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(discovery, 0o666)
    assert trusted_address("10.0.0.1:6379") == "10.0.0.1:6379"
    assert trusted_address("local") == "local"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    assert trusted_address(None) is None  # Ray reads RAY_ADDRESS itself
    assert trusted_address("auto") == "auto"


def test_no_discovery_file_starts_a_ray_and_auto_is_refused(discovery: Path) -> None:
    assert trusted_address(None) is None
    with pytest.raises(RayAuthError) as refused:
        trusted_address("auto")
    assert str(refused.value) == (
        f"--ray-address auto: there is no {discovery} from a `ray start` of this user's; "
        "give the cluster's address"
    )


def test_a_discovery_file_only_this_user_can_write_is_followed(discovery: Path) -> None:
    write(discovery)
    assert trusted_address(None) is None
    assert trusted_address("auto") == "auto"


@pytest.mark.parametrize("where", ["file", "directory", "owner", "directory owner"])
def test_a_discovery_file_another_user_could_write_is_ignored(discovery: Path, where: str) -> None:
    write(discovery, 0o664 if where == "file" else 0o644)
    if where == "directory":
        os.chmod(discovery.parent, 0o777)  # as Ray leaves /tmp/ray
    if where.endswith("owner"):
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        os.chown(discovery.parent if where == "directory owner" else discovery, 4242, 4242)
    with structlog.testing.capture_logs() as logs:
        assert trusted_address(None) == "local"
    assert logs == [
        {
            "logger": "ctxactors.ray",
            "event": "ray_discovery_file_ignored",
            "path": str(discovery),
            "log_level": "warning",
        }
    ]
    with pytest.raises(RayAuthError) as refused:
        trusted_address("auto")
    assert str(refused.value) == (
        f"--ray-address auto: {discovery} (or its directory) belongs to another user or is "
        "writable by others, so it can't say which cluster to join; give the address"
    )
