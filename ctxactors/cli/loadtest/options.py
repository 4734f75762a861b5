"""The load test's options: read from the command line once, checked, defaults resolved.

The rest of the load test reads this frozen object, never the argparse namespace, so what
a run did is what its options say (the namespace is not changed behind the caller's back).
"""

from __future__ import annotations

import argparse
from typing import Literal
from urllib.parse import urlsplit

import msgspec

from ctxactors.cli import settings_from_args
from ctxactors.cli.loadtest.host_tools import arguments_for, host_tools
from ctxactors.cli.loadtest.workload import DEFAULT_MIX, parse_mix
from ctxactors.cli.token import Bearer, read_bearer
from ctxactors.settings import Settings

DEFAULT_TTL = 3600.0
DEFAULT_MAX_ACTORS = 10_000
_AT_LEAST_ONE = ("sessions", "assistants", "calls", "workers", "concurrency")


class LoadOptions(msgspec.Struct, frozen=True, kw_only=True):
    """One load test run, as `ctxactors loadtest`'s flags describe it (see their help)."""

    sessions: int
    assistants: int
    threads: int  # per assistant; 0: calls carry no thread
    calls: int  # workload calls per session
    mix: dict[str, int]  # tool -> weight
    servers: tuple[str, ...]  # host servers (MODULE:CLASS): served, and their tools in the mix
    workers: int
    use_async: bool  # asyncio tasks (always for an MCP target) instead of sender threads
    concurrency: int
    url: str | None  # None: the embedded runtime (or, with `restart_every`, until it starts)
    transport: Literal["rest", "mcp"]  # with `url`
    token: Bearer | None  # with `url`: sent to a server with authentication
    ttl: float  # embedded runtime only
    max_actors: int  # embedded runtime only
    allow_resets: bool  # state reset by reaping is accepted, not a violation
    # Start a served runtime and SIGKILL/restart it every so many seconds (url: its own).
    restart_every: float | None
    serve_store: str  # with `restart_every`: the served store
    # A hostile tenant beside the checked ones (`ctxactors.cli.loadtest.hostile`), with its
    # own principal's token (with `url`; `restart_every` makes both tokens itself).
    hostile: bool
    hostile_token: Bearer | None
    assignments: tuple[str, ...]  # --set, as given: for the restarted server too
    call_timeout: float
    settings: Settings  # the embedded runtime's (environment, then --set)
    seed: int
    json: str | None  # where to write the report too
    progress: bool

    @property
    def keys(self) -> int:
        """Actor keys the workload touches: a planning key per assistant and thread, and
        a playbook key per session."""
        return self.sessions * self.assistants * max(self.threads, 1) + self.sessions

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoadOptions:
        """The options of `args` (from `loadtest.add_arguments`); ValueError says which
        flag is wrong and why."""
        for name in _AT_LEAST_ONE:
            if getattr(args, name) < 1:
                raise ValueError(f"--{name} must be at least 1")
        if args.threads < 0:
            raise ValueError("--threads must not be negative")
        restarted = args.restart_every is not None
        if restarted and (not args.restart_every > 0 or args.url or args.use_async):
            raise ValueError(
                "--restart-every takes a positive number of seconds and starts its own "
                "server: not with --url or --async"
            )
        if args.token_file is not None and not args.url:
            raise ValueError("--token-file is for a server of --url")
        if args.hostile and not (args.url or restarted):
            raise ValueError(
                "--hostile attacks a server: give --url, or --restart-every to start one"
            )
        if args.hostile_token_file is not None and not (args.hostile and args.url):
            raise ValueError("--hostile-token-file is for --hostile against a server of --url")
        # The restarted server is served over REST.
        transport = "rest" if restarted else _transport(args.url, args.transport)
        # Reaping resets state: expected when asked for, or when the embedded runtime is
        # given its own TTL or cap.
        embedded_limits = args.ttl is not None or args.max_actors is not None
        embedded = not args.url and not restarted
        allow_resets = args.expect_reaping or (embedded and embedded_limits)
        keys = args.sessions * args.assistants * max(args.threads, 1) + args.sessions
        hosts = host_tools(args.server)
        mix = parse_mix(args.mix, hosts)
        for name in mix.keys() - DEFAULT_MIX.keys():
            arguments_for(hosts[name])  # a host tool whose arguments can't be made up: say so
        return cls(
            sessions=args.sessions,
            assistants=args.assistants,
            threads=args.threads,
            calls=args.calls,
            mix=mix,
            servers=tuple(args.server),
            workers=args.workers,
            use_async=args.use_async or transport == "mcp",
            concurrency=args.concurrency,
            url=args.url or None,
            transport=transport,
            token=read_bearer(args.token_file) if args.url else None,
            ttl=DEFAULT_TTL if args.ttl is None else args.ttl,
            max_actors=(
                max(DEFAULT_MAX_ACTORS, keys + 16) if args.max_actors is None else args.max_actors
            ),
            allow_resets=allow_resets,
            restart_every=args.restart_every,
            serve_store=args.serve_store,
            hostile=args.hostile,
            hostile_token=_hostile_token(args),
            assignments=tuple(getattr(args, "settings", None) or ()),
            call_timeout=args.call_timeout,
            settings=settings_from_args(args),  # a bad one: ValueError naming it
            seed=args.seed,
            json=args.json,
            progress=not args.no_progress,
        )


def _hostile_token(args: argparse.Namespace) -> Bearer | None:
    """The hostile tenant's token, which must not be the checked tenants' own."""
    if args.hostile_token_file is None:
        return None
    token = read_bearer(args.hostile_token_file)
    checked = read_bearer(args.token_file)
    if token is not None and checked is not None and token.headers() == checked.headers():
        raise ValueError(
            "--hostile-token-file holds the checked tenants' own token: the hostile tenant "
            "needs a principal of its own"
        )
    return token


def _transport(url: str | None, asked: str) -> Literal["rest", "mcp"]:
    """MCP for ``--transport mcp``, or for ``auto`` and a URL whose path ends in ``/mcp``."""
    if asked == "mcp" or (
        asked == "auto" and url and urlsplit(url).path.rstrip("/").endswith("/mcp")
    ):
        return "mcp"
    return "rest"
