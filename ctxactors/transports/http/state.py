"""What the endpoints share, kept on the app (``app.state.api``) rather than in closures,
so each endpoint is a plain module function that can be mounted and tested on its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request


@dataclass(frozen=True)
class ApiState:
    runtime: Any
    model: Any  # a `ctxactors.conversation.ChatModel`, or None: /api/v1/query answers 503
    openapi: bytes  # the encoded /openapi.json, built once per app
    log: Any
    operators: frozenset[str] = frozenset()  # who may read /api/v1/stats, with auth on


def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state
