"""The sandbox's settings and command lines, exactly: what each variable parses to, the
environment a command gets, and the bwrap and prlimit arguments (no process is started).

The sandbox's behaviour is attacked with real bubblewrap in test_sandbox.py; these pin the
values it is built from, which a wrong default or a dropped flag would change silently.
"""

from __future__ import annotations

import os
import shutil

import pytest

from ctxactors import sandbox, sandbox_seccomp
from ctxactors.sandbox import bwrap_args, clean_env, limit_args
from ctxactors.settings import FIRST_UID, SandboxSettings

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
    "CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST",
    "CTXACTORS_WORKSPACE_SANDBOX_UID_COUNT",
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
        uid_first=FIRST_UID if os.getuid() == 0 else None,
        uid_count=1_000_000,
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
        "CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST": " 1234 ",
        "CTXACTORS_WORKSPACE_SANDBOX_UID_COUNT": "12",
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
        uid_first=1234,
        uid_count=12,
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
            "CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST",
            "nobody",
            "CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST must be a uid (a number) or none, got 'nobody'",
        ),
        (
            "CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST",
            "0",
            "CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST must be at least 1 (never root), got '0'",
        ),
        (
            "CTXACTORS_WORKSPACE_SANDBOX_UID_COUNT",
            "0",
            "CTXACTORS_WORKSPACE_SANDBOX_UID_COUNT must be at least 1, got 0",
        ),
        (
            "CTXACTORS_WORKSPACE_SANDBOX_USER",
            "65534:65534",
            "CTXACTORS_WORKSPACE_SANDBOX_USER is replaced by CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST "
            "and CTXACTORS_WORKSPACE_SANDBOX_UID_COUNT: each principal's sandboxes run as a uid "
            "of their own from that range; unset it",
        ),
    ]:
        with monkeypatch.context() as env:
            env.setenv(name, raw)
            with pytest.raises(ValueError) as bad:
                SandboxSettings.from_env()
            assert str(bad.value) == message


@pytest.mark.parametrize(("raw", "first"), [("1", 1), ("100000", 100000), ("None", None)])
def test_sandbox_uid_first(monkeypatch: pytest.MonkeyPatch, raw: str, first: int | None) -> None:
    monkeypatch.setenv("CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST", raw)
    assert SandboxSettings.from_env().uid_first == first


def test_users_are_switched_only_by_a_root_server_with_a_range() -> None:
    root = os.geteuid() == 0
    assert SandboxSettings(uid_first=None).switch_user is False
    assert SandboxSettings(uid_first=FIRST_UID).switch_user is root
    assert SandboxSettings(uid_first=FIRST_UID, mode="none").switch_user is False


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


def _root_dirs() -> list[str]:
    out: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            out += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            out += ["--ro-bind", path, path]
    return out


@pytest.mark.parametrize(("network", "seccomp"), [(False, True), (True, False)])
def test_bwrap_args_exactly(network: bool, seccomp: bool) -> None:
    settings = SandboxSettings(bwrap="/x/bwrap", network=network, tmp_bytes=77)
    masks = []  # the host-wide /proc files this kernel has, hidden
    for name in ("keys", "key-users", "timer_list", "sched_debug"):
        if os.path.exists(f"/proc/{name}"):
            masks += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    etc = ["/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"]
    if network:
        etc += [
            "/etc/resolv.conf",
            "/etc/hosts",
            "/etc/nsswitch.conf",
            "/etc/gai.conf",
            "/etc/ssl",
            "/etc/ca-certificates",
        ]
    expected = ["/x/bwrap", "--unshare-all", "--unshare-user", "--disable-userns"]
    expected += ["--share-net"] if network else []
    expected += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    expected += ["--hostname", "workspace", "--ro-bind", "/usr", "/usr", *_root_dirs()]
    for path in etc:
        expected += ["--ro-bind-try", path, path]
    expected += ["--ro-bind-data", "8", "/etc/passwd", "--ro-bind-data", "9", "/etc/group"]
    expected += ["--proc", "/proc", *masks, "--dev", "/dev"]
    expected += ["--size", "77", "--tmpfs", "/tmp", "--size", "77", "--tmpfs", "/dev/shm"]
    expected += ["--bind-fd", "7", "/workspace", "--chdir", "/workspace"]
    expected += ["--seccomp", "10"] if seccomp else []
    expected += ["--remount-ro", "/dev", "--remount-ro", "/", "--"]
    assert bwrap_args(settings, 7, 8, 9, 10 if seccomp else None) == expected


def test_the_generated_passwd_and_group(tmp_path: os.PathLike[str]) -> None:
    with sandbox._sandbox_fds(str(tmp_path), 1234, 5678) as fds:
        workdir, passwd, group, seccomp = fds
        assert os.path.samefile(f"/proc/self/fd/{workdir}", str(tmp_path))
        assert os.read(passwd, 4096) == b"sandbox:x:1234:5678:sandbox:/workspace:/bin/sh\n"
        assert os.read(group, 4096) == b"sandbox:x:5678:\n"
        assert os.read(seccomp, 65536) == sandbox_seccomp.program()
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
