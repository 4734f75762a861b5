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
]
