"""The sandbox's settings and command lines, exactly: what each variable parses to, the
environment a command gets, and the bwrap and prlimit arguments (no process is started).

The sandbox's behaviour is attacked with real bubblewrap in test_sandbox.py; these pin the
values it is built from, which a wrong default or a dropped flag would change silently.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ctxactors import sandbox
from ctxactors.sandbox import bwrap_args, clean_env, limit_args
from ctxactors.settings import NOBODY, SandboxSettings

VARIABLES = [
    "CTXACTORS_WORKSPACE_SANDBOX",
    "CTXACTORS_WORKSPACE_BWRAP",
    "CTXACTORS_WORKSPACE_NETWORK",
    "CTXACTORS_WORKSPACE_ENV",
    "CTXACTORS_WORKSPACE_CPU_SECONDS",
    "CTXACTORS_WORKSPACE_MAX_MEMORY_BYTES",
    "CTXACTORS_WORKSPACE_MAX_FILE_BYTES",
    "CTXACTORS_WORKSPACE_MAX_PROCESSES",
    "CTXACTORS_WORKSPACE_TMP_BYTES",
    "CTXACTORS_WORKSPACE_SANDBOX_USER",
]


@pytest.fixture(autouse=True)
def unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_defaults_when_nothing_is_set() -> None:
    settings = SandboxSettings.from_env()
    assert settings == SandboxSettings(
        mode="bwrap",
        bwrap=shutil.which("bwrap") or "/usr/bin/bwrap",
        network=False,
        env=(),
        cpu_seconds=600,
        memory_bytes=4 << 30,
        file_bytes=1 << 30,
        processes=256,
        tmp_bytes=256 << 20,
        user=NOBODY if os.getuid() == 0 else None,
    )
    assert settings.enabled is True


def test_every_variable_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "CTXACTORS_WORKSPACE_SANDBOX": "  NONE ",
        "CTXACTORS_WORKSPACE_BWRAP": "/opt/bwrap",
        "CTXACTORS_WORKSPACE_NETWORK": " On ",
        "CTXACTORS_WORKSPACE_ENV": " A_1 , ,_b,",
        "CTXACTORS_WORKSPACE_CPU_SECONDS": "7",
        "CTXACTORS_WORKSPACE_MAX_MEMORY_BYTES": "8",
        "CTXACTORS_WORKSPACE_MAX_FILE_BYTES": "9",
        "CTXACTORS_WORKSPACE_MAX_PROCESSES": "10",
        "CTXACTORS_WORKSPACE_TMP_BYTES": "11",
        "CTXACTORS_WORKSPACE_SANDBOX_USER": " 1234:5678 ",
    }.items():
        monkeypatch.setenv(name, value)
    settings = SandboxSettings.from_env()
    assert settings == SandboxSettings(
        mode="none",
        bwrap="/opt/bwrap",
        network=True,
        env=("A_1", "_b"),
        cpu_seconds=7,
        memory_bytes=8,
        file_bytes=9,
        processes=10,
        tmp_bytes=11,
        user=(1234, 5678),
    )
    assert settings.enabled is False


def test_a_blank_mode_is_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXACTORS_WORKSPACE_SANDBOX", "  ")
    assert SandboxSettings.from_env().mode == "bwrap"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("", False),
        ("0", False),
        ("False", False),
        ("no", False),
        (" off ", False),
    ],
)
def test_network_words(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    monkeypatch.setenv("CTXACTORS_WORKSPACE_NETWORK", raw)
    assert SandboxSettings.from_env().network is expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            "docker",
            "CTXACTORS_WORKSPACE_SANDBOX must be bwrap or none, got 'docker'",
        ),
    ],
)
def test_a_bad_mode_is_named_exactly(
    monkeypatch: pytest.MonkeyPatch, raw: str, message: str
) -> None:
    monkeypatch.setenv("CTXACTORS_WORKSPACE_SANDBOX", raw)
    with pytest.raises(ValueError) as bad:
        SandboxSettings.from_env()
    assert str(bad.value) == message


def test_bad_values_are_reported_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, raw, message in [
        (
            "CTXACTORS_WORKSPACE_NETWORK",
            "Maybe",
            "CTXACTORS_WORKSPACE_NETWORK must be 1/0, true/false, yes/no or on/off, got 'maybe'",
        ),
        (
            "CTXACTORS_WORKSPACE_ENV",
            "OK,1BAD,also-bad,FINE",
            "CTXACTORS_WORKSPACE_ENV: not environment variable names: 1BAD, also-bad",
        ),
        (
            "CTXACTORS_WORKSPACE_SANDBOX_USER",
            "nobody",
            "CTXACTORS_WORKSPACE_SANDBOX_USER must be UID or UID:GID (numbers), got 'nobody'",
        ),
        (
            "CTXACTORS_WORKSPACE_SANDBOX_USER",
            "10:x",
            "CTXACTORS_WORKSPACE_SANDBOX_USER must be UID or UID:GID (numbers), got '10:x'",
        ),
        (
            "CTXACTORS_WORKSPACE_SANDBOX_USER",
            "10:-1",
            "CTXACTORS_WORKSPACE_SANDBOX_USER must not be negative, got '10:-1'",
        ),
        (
            "CTXACTORS_WORKSPACE_SANDBOX_USER",
            "-1",
            "CTXACTORS_WORKSPACE_SANDBOX_USER must not be negative, got '-1'",
        ),
    ]:
        with monkeypatch.context() as env:
            env.setenv(name, raw)
            with pytest.raises(ValueError) as bad:
                SandboxSettings.from_env()
            assert str(bad.value) == message


@pytest.mark.parametrize(
    ("raw", "user"), [("0", (0, 0)), ("1000", (1000, 1000)), ("5:0", (5, 0)), ("7:", (7, 7))]
)
def test_sandbox_user(monkeypatch: pytest.MonkeyPatch, raw: str, user: tuple[int, int]) -> None:
    monkeypatch.setenv("CTXACTORS_WORKSPACE_SANDBOX_USER", raw)
    assert SandboxSettings.from_env().user == user


def test_switch_user_only_for_another_uid() -> None:
    me = os.getuid()
    assert SandboxSettings(user=None).switch_user is False
    assert SandboxSettings(user=(me, me + 1)).switch_user is False
    assert SandboxSettings(user=(me + 1, me)).switch_user is True


def test_clean_env_copies_only_listed_names_and_pins_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    monkeypatch.setenv("LISTED", "yes")
    monkeypatch.setenv("HOME", "/root")
    monkeypatch.setenv("SECRET", "no")
    monkeypatch.delenv("ABSENT", raising=False)
    settings = SandboxSettings(env=("LISTED", "ABSENT", "HOME"))
    assert clean_env(settings, "/workspace") == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/workspace",
        "LANG": "de_DE.UTF-8",
        "LISTED": "yes",
    }
    monkeypatch.setenv("LANG", "")
    assert clean_env(SandboxSettings(), "/w") == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/w",
        "LANG": "C.UTF-8",
    }


def test_limit_args_exactly() -> None:
    settings = SandboxSettings(cpu_seconds=3, memory_bytes=4, file_bytes=5, processes=6)
    assert limit_args(settings) == [
        "/usr/bin/prlimit",
        "--cpu=3",
        "--as=4",
        "--fsize=5",
        "--nproc=6",
        "--",
        "/usr/bin/choom",
        "-n",
        "1000",
        "--",
    ]


def fake_root(root: Path, merged: bool) -> str:
    """A host's system directories: Debian 12's merged /usr (/bin a symlink to usr/bin...),
    or real /bin, /sbin, /lib, /lib32 and /lib64 beside /usr (and a file named libx32)."""
    for name in ("bin", "sbin", "lib", "lib64"):
        (root / "usr" / name).mkdir(parents=True)
        if merged:
            (root / name).symlink_to(f"usr/{name}")
        else:
            (root / name).mkdir()
    if not merged:
        (root / "lib32").mkdir()
        (root / "libx32").write_text("not a directory")
    return str(root)


def test_bwrap_args_exactly_on_a_merged_usr_host(tmp_path: Path) -> None:
    root = fake_root(tmp_path, merged=True)
    settings = SandboxSettings(bwrap="/x/bwrap", network=False, tmp_bytes=77)
    assert bwrap_args(settings, 7, 8, 9, root=root) == [
        "/x/bwrap",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "workspace",
        "--ro-bind",
        f"{root}/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/sbin",
        "/sbin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--ro-bind-try",
        "/etc/ld.so.cache",
        "/etc/ld.so.cache",
        "--ro-bind-try",
        "/etc/alternatives",
        "/etc/alternatives",
        "--ro-bind-try",
        "/etc/localtime",
        "/etc/localtime",
        "--ro-bind-data",
        "8",
        "/etc/passwd",
        "--ro-bind-data",
        "9",
        "/etc/group",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        "77",
        "--tmpfs",
        "/tmp",
        "--size",
        "77",
        "--tmpfs",
        "/dev/shm",
        "--bind-fd",
        "7",
        "/workspace",
        "--chdir",
        "/workspace",
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--",
    ]


def test_bwrap_args_exactly_on_a_host_whose_bin_and_lib_are_directories(tmp_path: Path) -> None:
    root = fake_root(tmp_path, merged=False)
    settings = SandboxSettings(bwrap="/x/bwrap", network=True, tmp_bytes=77)
    args = bwrap_args(settings, 7, 8, 9, root=root)
    assert args == [
        "/x/bwrap",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--share-net",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "workspace",
        "--ro-bind",
        f"{root}/usr",
        "/usr",
        "--ro-bind",
        f"{root}/bin",
        "/bin",
        "--ro-bind",
        f"{root}/sbin",
        "/sbin",
        "--ro-bind",
        f"{root}/lib",
        "/lib",
        "--ro-bind",
        f"{root}/lib32",
        "/lib32",
        "--ro-bind",
        f"{root}/lib64",
        "/lib64",
        "--ro-bind-try",
        "/etc/ld.so.cache",
        "/etc/ld.so.cache",
        "--ro-bind-try",
        "/etc/alternatives",
        "/etc/alternatives",
        "--ro-bind-try",
        "/etc/localtime",
        "/etc/localtime",
        "--ro-bind-try",
        "/etc/resolv.conf",
        "/etc/resolv.conf",
        "--ro-bind-try",
        "/etc/hosts",
        "/etc/hosts",
        "--ro-bind-try",
        "/etc/nsswitch.conf",
        "/etc/nsswitch.conf",
        "--ro-bind-try",
        "/etc/gai.conf",
        "/etc/gai.conf",
        "--ro-bind-try",
        "/etc/ssl",
        "/etc/ssl",
        "--ro-bind-try",
        "/etc/ca-certificates",
        "/etc/ca-certificates",
        "--ro-bind-data",
        "8",
        "/etc/passwd",
        "--ro-bind-data",
        "9",
        "/etc/group",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        "77",
        "--tmpfs",
        "/tmp",
        "--size",
        "77",
        "--tmpfs",
        "/dev/shm",
        "--bind-fd",
        "7",
        "/workspace",
        "--chdir",
        "/workspace",
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--",
    ]
    # Said once more as the rule: every system directory read-only, nothing but the
    # session's own directory (by descriptor) writable.
    for name in ("usr", "bin", "sbin", "lib", "lib32", "lib64"):
        at = args.index(f"{root}/{name}")
        assert args[at - 1 : at + 2] == ["--ro-bind", f"{root}/{name}", f"/{name}"]
    assert [a for a in args if a.startswith("--bind")] == ["--bind-fd"]


def test_this_hosts_system_directories_are_read_only_too() -> None:
    args = bwrap_args(SandboxSettings(bwrap="/x/bwrap"), 7, 8, 9)
    system = args[10 : args.index("--ro-bind-try")]  # /usr, then /bin, /lib... as found
    assert system[:3] == ["--ro-bind", "/usr", "/usr"]
    assert {system[i] for i in range(0, len(system), 3)} <= {"--ro-bind", "--symlink"}
    assert [a for a in args if a.startswith("--bind")] == ["--bind-fd"]


def test_the_generated_passwd_and_group(tmp_path: os.PathLike[str]) -> None:
    with sandbox._sandbox_fds(str(tmp_path), 1234, 5678) as (workdir, passwd, group):
        assert os.path.samefile(f"/proc/self/fd/{workdir}", str(tmp_path))
        assert os.read(passwd, 4096) == b"sandbox:x:1234:5678:sandbox:/workspace:/bin/sh\n"
        assert os.read(group, 4096) == b"sandbox:x:5678:\n"
        fds = (workdir, passwd, group)
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_bwrap_is_found_on_path_else_at_its_debian_place(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    elsewhere = os.path.join(tmp_path, "bin")
    os.mkdir(elsewhere)
    os.symlink("/usr/bin/bwrap", os.path.join(elsewhere, "bwrap"))
    monkeypatch.setenv("PATH", elsewhere)
    assert SandboxSettings.from_env().bwrap == os.path.join(elsewhere, "bwrap")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap there
    assert SandboxSettings.from_env().bwrap == "/usr/bin/bwrap"
    monkeypatch.setenv("CTXACTORS_WORKSPACE_BWRAP", "/opt/b")
    assert SandboxSettings.from_env().bwrap == "/opt/b"
