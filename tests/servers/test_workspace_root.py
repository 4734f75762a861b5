"""The workspace root: made private, or refused when someone else could reach into it.

The default root sits in the shared ``/tmp``, where another local user can make it first
(a directory of theirs, or a link to one); an operator's own root may be group or world
readable. Real directories, real `Runtime`s and a real ``ctxactors serve``.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator

import pytest
from workspace_support import serve_refusal

from ctxactors import Runtime, SandboxUnavailableError
from ctxactors.sandbox import make_root
from ctxactors.servers.workspace import Workspace
from ctxactors.settings import FIRST_UID, SandboxSettings

OWN_USER = SandboxSettings(uid_first=None)  # bwrap runs as the server: the root is 700
# A root server runs bwrap as each principal's own uid: 711.
PER_PRINCIPAL = SandboxSettings(uid_first=FIRST_UID)
FIX = "(CTXACTORS_WORKSPACE_ROOT) must be a directory of this user that no one else may write in"


@pytest.fixture
def parent() -> Iterator[str]:
    where = tempfile.mkdtemp(prefix="ctxactors-test-roots-")
    os.chmod(where, 0o755)  # the sandbox users (under root) must reach the root
    yield where
    shutil.rmtree(where)


def mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize(
    ("settings", "before", "after"),
    [
        (OWN_USER, 0o755, 0o700),
        (OWN_USER, 0o750, 0o700),
        (OWN_USER, 0o701, 0o700),
        (OWN_USER, 0o711, 0o711),  # another runtime on this root runs bwrap as others
        (OWN_USER, 0o700, 0o700),
        (PER_PRINCIPAL, 0o755, 0o711),
        (PER_PRINCIPAL, 0o700, 0o711),
    ],
    ids=lambda v: f"{v:o}" if isinstance(v, int) else ("per principal" if v.uid_first else "own"),
)
def test_an_existing_root_others_could_list_is_tightened(
    parent: str, settings: SandboxSettings, before: int, after: int
) -> None:
    if settings.uid_first is not None and not settings.switch_user:
        pytest.skip("switching to another user needs root")
    root = os.path.join(parent, "root")
    os.mkdir(root)
    os.chmod(root, before)
    make_root(settings, root)
    assert mode(root) == after


def test_a_new_root_is_private(parent: str) -> None:
    root = os.path.join(parent, "a", "root")
    make_root(OWN_USER, root + "/")
    assert mode(root) == 0o700


def _symlink(parent: str, root: str) -> None:
    target = os.path.join(parent, "elsewhere")
    os.mkdir(target, 0o700)
    os.symlink(target, root)


def _dangling(parent: str, root: str) -> None:
    os.symlink(os.path.join(parent, "nothing"), root)


def _file(parent: str, root: str) -> None:
    with open(root, "w") as f:
        f.write("x")


def _mode(bits: int) -> Callable[[str, str], None]:
    def make(parent: str, root: str) -> None:
        os.mkdir(root)
        os.chmod(root, bits)

    return make


def _theirs(parent: str, root: str) -> None:
    os.mkdir(root, 0o700)
    os.chown(root, 65534, 65534)


UNSAFE = {
    "symlink": (_symlink, "it is a symlink"),
    "dangling symlink": (_dangling, "it is a symlink"),
    "file": (_file, "it is not a directory"),
    "world writable": (
        _mode(0o777),
        "its mode is 777, writable by its group or others; remove it, or chmod go-w once you "
        "know nothing in it was put there by another user",
    ),
    "group writable": (
        _mode(0o770),
        "its mode is 770, writable by its group or others; remove it, or chmod go-w once you "
        "know nothing in it was put there by another user",
    ),
    "sticky, world writable": (
        _mode(0o1777),
        "its mode is 1777, writable by its group or others; remove it, or chmod go-w once you "
        "know nothing in it was put there by another user",
    ),
    "another user's": (_theirs, "it belongs to uid 65534"),
}


@pytest.mark.parametrize("case", list(UNSAFE))
@pytest.mark.parametrize("settings", [OWN_USER, PER_PRINCIPAL], ids=["own user", "per principal"])
def test_an_unsafe_root_is_refused_saying_what_is_wrong(
    parent: str, case: str, settings: SandboxSettings
) -> None:
    make, problem = UNSAFE[case]
    if make is _theirs and os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    root = os.path.join(parent, "root")
    make(parent, root)
    before = os.lstat(root)
    with pytest.raises(SandboxUnavailableError) as refused:
        make_root(settings, root)
    assert str(refused.value) == f"the workspace root {root} {FIX}: {problem}"
    after = os.lstat(root)
    assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid)  # left as it was


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_a_runtime_with_an_unsafe_root_refuses_to_start(
    parent: str, sandbox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = os.path.join(parent, "root")
    _symlink(parent, root)
    monkeypatch.setenv("CTXACTORS_WORKSPACE_ROOT", root)
    monkeypatch.setenv("CTXACTORS_WORKSPACE_SANDBOX", sandbox)
    with pytest.raises(SandboxUnavailableError) as refused:
        Runtime(servers=[Workspace])
    assert str(refused.value) == f"the workspace root {root} {FIX}: it is a symlink"
    assert os.listdir(os.path.join(parent, "elsewhere")) == []


def test_serve_refuses_an_unsafe_root_in_one_line(parent: str) -> None:
    root = os.path.join(parent, "root")
    _mode(0o777)(parent, root)
    env = {**os.environ, "CTXACTORS_WORKSPACE_ROOT": root}
    assert serve_refusal(env, "--store", "memory") == (
        f"ctxactors serve: the workspace root {root} {FIX}: its mode is 777, writable by its "
        "group or others; remove it, or chmod go-w once you know nothing in it was put there "
        "by another user"
    )
    assert os.listdir(root) == []
