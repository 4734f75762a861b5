"""The built-in tool servers, one module each."""

from __future__ import annotations

from ctxactors.servers.content import Content
from ctxactors.servers.planning import Planning
from ctxactors.servers.playbooks import Playbooks
from ctxactors.servers.workspace import Workspace
from ctxactors.tools import Server

# Registered by Runtime(servers=None).
BUILTIN: list[type[Server]] = [Planning, Playbooks, Content, Workspace]

# Part of every runtime, whatever servers it was given (history, batch).
ALWAYS: list[type[Server]] = []

__all__ = ["ALWAYS", "BUILTIN", "Content", "Planning", "Playbooks", "Workspace"]
