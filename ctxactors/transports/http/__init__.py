"""The REST API (Starlette): `create_app` builds it; see `app` for routes and errors.

- `app`: the route table and `create_app`.
- `endpoints`: one module function per route, reading the runtime from ``app.state.api``.
- `shapes`: the msgspec types on the wire; `reading`: ids and body from a request.
- `failures`: every error as the API's JSON body; `middleware`: body cap, drain count.
- `openapi`: ``/openapi.json`` from the same types.
"""

from ctxactors.transports.http.app import create_app
from ctxactors.transports.http.openapi import build_openapi

__all__ = ["build_openapi", "create_app"]
