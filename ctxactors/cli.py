"""The ``ctxactors`` command. Each subcommand lives in its own module.

A subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``; the table
below maps names to modules so that ``ctxactors --help`` stays cheap (modules load lazily).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("ctxactors.demo", "run a scripted multi-session scenario on the embedded runtime"),
    "serve": ("ctxactors.transports.serve", "serve the tools over MCP (stdio or HTTP) and REST"),
    "loadtest": ("ctxactors.loadtest", "fire many concurrent sessions and check for cross-talk"),
    "logs": ("ctxactors.logtool", "filter and summarise ctxactors JSON log lines"),
}
# The extra (pyproject.toml) a command's imports come from; the core install has the demo.
EXTRAS = {"serve": "serve", "loadtest": "cli", "logs": "cli"}


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


if __name__ == "__main__":
    sys.exit(main())
