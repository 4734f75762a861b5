"""The built-in tool servers, one module each."""

from __future__ import annotations

import typing

from ctxactors.servers.batch import Batch, Presets
from ctxactors.servers.content import Content
from ctxactors.servers.history import History
from ctxactors.servers.planning import Planning
from ctxactors.servers.playbooks import Playbooks
from ctxactors.servers.workspace import Workspace

if typing.TYPE_CHECKING:
    from ctxactors.tools import Server

# Registered by Runtime(servers=None).
BUILTIN: list[type[Server]] = [Planning, Playbooks, Content, Workspace]

# Part of every runtime, whatever servers it was given (history, batch).
ALWAYS: list[type[Server]] = [History, Batch, Presets]


def builtins_named(spec: str) -> list[type[Server]]:
    """The built-in servers a comma list names (``"planning,content"``), in `BUILTIN`'s
    order; ``"none"`` is none of them. The history, batch and presets servers are part of
    every runtime: naming them changes nothing. An unknown name raises ValueError listing
    the valid ones."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if names == ["none"]:
        return []
    known = {server.name for server in [*BUILTIN, *ALWAYS]}
    for name in names:
        if name not in known:
            raise ValueError(
                f"unknown built-in server {name!r}: choose from "
                f"{', '.join(s.name for s in BUILTIN)} (comma-separated), or none "
                f"({', '.join(s.name for s in ALWAYS)} are always served)"
            )
    if not names:
        raise ValueError("name at least one built-in server, or none")
    return [server for server in BUILTIN if server.name in names]


__all__ = [
    "ALWAYS",
    "BUILTIN",
    "Batch",
    "Content",
    "History",
    "Planning",
    "Playbooks",
    "Presets",
    "Workspace",
    "builtins_named",
]
