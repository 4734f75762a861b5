"""The ``ctxactors`` command. Each subcommand lives in its own module.

A subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``; the table
below maps names to modules so that ``ctxactors --help`` stays cheap (modules load lazily).
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("ctxactors.demo", "run a scripted multi-session scenario on the embedded runtime"),
    "serve": ("ctxactors.transports.serve", "serve the tools over MCP (stdio or HTTP) and REST"),
    "loadtest": ("ctxactors.loadtest", "fire many concurrent sessions and check for cross-talk"),
    "logs": ("ctxactors.logtool", "filter and summarise ctxactors JSON log lines"),
    "top": ("ctxactors.top", "a live view of a running server (calls/s, latency, sessions)"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ctxactors", description="Run LLM tool calls with one actor per conversation."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    args_list = sys.argv[1:] if argv is None else argv
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only import the chosen command's module (imports of others may be heavy).
        if args_list[:1] == [name]:
            importlib.import_module(module_name).add_arguments(p)
    args = parser.parse_args(args_list)
    module = importlib.import_module(COMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
