"""The ``ctxactors`` command. Each subcommand lives in its own module.

A subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``; the table
below maps names to modules so that ``ctxactors --help`` stays cheap (modules load lazily).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from ctxactors.logs import configure_logging
from ctxactors.settings import Settings, assign
from ctxactors.tools import Server

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("ctxactors.cli.demo", "run a scripted multi-session scenario on the embedded runtime"),
    "serve": ("ctxactors.cli.serve", "serve the tools over MCP (stdio or HTTP) and REST"),
    "loadtest": (
        "ctxactors.cli.loadtest.command",
        "fire many concurrent sessions and check for cross-talk",
    ),
    "logs": ("ctxactors.cli.logs", "filter and summarise ctxactors JSON log lines"),
    "shards": ("ctxactors.ray._command", "show or add the shards of a Ray deployment"),
    "top": ("ctxactors.cli.top", "a live view of a running server (calls/s, latency, sessions)"),
}
# The extra (pyproject.toml) a command's imports come from; the core install has the demo.
# `top` reads the server's own /top shapes (ctxactors.transports.observe), so it needs both.
EXTRAS = {"serve": "serve", "loadtest": "cli", "logs": "cli", "top": "all"}


def add_settings_argument(parser: argparse.ArgumentParser) -> None:
    """``--set NAME=VALUE``: any setting of the limits table (docs/limits.md), for the runtime a
    command makes; the others come from the ``CTXACTORS_*`` variables."""
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a runtime setting, e.g. content.max_item_bytes=65536 (repeatable; the rest come "
        "from the CTXACTORS_* variables)",
    )


def settings_from_args(args: argparse.Namespace, **shortcuts: Any) -> Settings:
    """The environment's settings, then ``--set``, then the command's own flags (`shortcuts`,
    None for a flag not given); `ValueError` names the variable or flag that is wrong."""
    return assign(Settings.from_env(), getattr(args, "settings", None) or ()).replace(**shortcuts)


def import_server(spec: str) -> type[Server]:
    """The `Server` subclass ``MODULE:CLASS`` names (``--server``); `ValueError` says why not."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--server {spec!r}: expected MODULE:CLASS")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--server {spec!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Server)):
        raise ValueError(f"--server {spec!r}: not a ctxactors.Server subclass")
    return cls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ctxactors", description="Run LLM tool calls with one actor per conversation."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    args_list = sys.argv[1:] if argv is None else argv
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only import the chosen command's module (imports of others may be heavy).
        if args_list[:1] == [name]:
            _load(name).add_arguments(p)
    args = parser.parse_args(args_list)
    # The application configures logging (from CTXACTORS_LOG_*), never the library.
    configure_logging()
    return int(_load(args.command).run(args) or 0)


def _load(command: str) -> Any:
    try:
        return importlib.import_module(COMMANDS[command][0])
    except ModuleNotFoundError as exc:
        if command not in EXTRAS or exc.name is None or exc.name.startswith("ctxactors"):
            raise
        extra = EXTRAS[command]
        sys.exit(
            f"ctxactors {command} needs {exc.name!r}, from the [{extra}] extra: "
            f"pip install 'ctxactors[{extra}]'"
        )
