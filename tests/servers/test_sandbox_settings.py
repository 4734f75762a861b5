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

from ctxactors import sandbox, sandbox_seccomp
from ctxactors.sandbox import bwrap_args, clean_env, limit_args
from ctxactors.settings import FIRST_UID, BudgetSettings, SandboxSettings

VARIABLES = [
    "CTXACTORS_WORKSPACE_SANDBOX",
    "CTXACTORS_WORKSPACE_BWRAP",
    "CTXACTORS_WORKSPACE_NETWORK",
    "CTXACTORS_WORKSPACE_SECCOMP",
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
        seccomp="require",
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
        "CTXACTORS_WORKSPACE_SECCOMP": " Auto ",
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
        seccomp="auto",
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
    ("raw", "expected"),
    [(None, "auto"), ("", "auto"), ("AUTO", "auto"), ("on", "on"), ("1", "on"), (" Off ", "off")],
)
def test_the_sandboxes_cpu_idle_words(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: str
) -> None:
    if raw is not None:
        monkeypatch.setenv("CTXACTORS_WORKSPACE_SERVER_CPU_IDLE", raw)
    else:
        monkeypatch.delenv("CTXACTORS_WORKSPACE_SERVER_CPU_IDLE", raising=False)
    assert BudgetSettings.from_env().server_cpu_idle == expected


def test_a_bad_cpu_idle_word_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXACTORS_WORKSPACE_SERVER_CPU_IDLE", "Maybe")
    with pytest.raises(
        ValueError, match="CTXACTORS_WORKSPACE_SERVER_CPU_IDLE must be auto, on or off, got 'maybe'"
    ):
        BudgetSettings.from_env()


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
            "CTXACTORS_WORKSPACE_SECCOMP",
            "off",
            "CTXACTORS_WORKSPACE_SECCOMP must be require or auto, got 'off'",
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
    ]
    assert sandbox.CHOOM == ("/usr/bin/choom", "-n", "1000", "--")  # run on bwrap, outside


def fake_root(root: Path, merged: bool) -> str:
    """A host's system directories: Debian 12's merged /usr (/bin a symlink to usr/bin...),
    or real /bin, /sbin, /lib, /lib32 and /lib64 beside /usr (and a file named libx32). Its
    /proc: a 6.x kernel's (sched_debug moved to debugfs in 5.13) on the merged host, an
    older kernel's on the other."""
    for name in ("bin", "sbin", "lib", "lib64"):
        (root / "usr" / name).mkdir(parents=True)
        if merged:
            (root / name).symlink_to(f"usr/{name}")
        else:
            (root / name).mkdir()
    if not merged:
        (root / "lib32").mkdir()
        (root / "libx32").write_text("not a directory")
    (root / "proc").mkdir()
    for name in ("keys", "key-users", "timer_list") + (() if merged else ("sched_debug",)):
        (root / "proc" / name).write_text("")
    return str(root)


def test_bwrap_args_exactly_on_a_merged_usr_host(tmp_path: Path) -> None:
    root = fake_root(tmp_path, merged=True)
    settings = SandboxSettings(bwrap="/x/bwrap", network=False, tmp_bytes=77)
    assert bwrap_args(settings, 7, 8, 9, 10, root=root) == [
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
        "--ro-bind",
        "/dev/null",
        "/proc/keys",
        "--ro-bind",
        "/dev/null",
        "/proc/key-users",
        "--ro-bind",
        "/dev/null",
        "/proc/timer_list",
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
        "--seccomp",
        "10",
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
        "--ro-bind",
        "/dev/null",
        "/proc/keys",
        "--ro-bind",
        "/dev/null",
        "/proc/key-users",
        "--ro-bind",
        "/dev/null",
        "/proc/timer_list",
        "--ro-bind",
        "/dev/null",
        "/proc/sched_debug",
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
    with sandbox._sandbox_fds(SandboxSettings(), str(tmp_path), 1234, 5678) as fds:
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
