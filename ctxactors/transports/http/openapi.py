"""``/openapi.json``: the OpenAPI 3.1 document of the REST API.

Response shapes come from the msgspec types in `shapes`; each tool's request body is that
tool's own ``inputSchema``, so the document never disagrees with what the runtime checks.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ctxactors.context import MAX_ID
from ctxactors.transports.http.shapes import (
    ErrorBody,
    Health,
    QueryRequest,
    QueryResponse,
    SessionContext,
    SessionEnded,
    ToolCallResponse,
    ToolList,
)

_REF = "#/components/schemas/{name}"
_ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_ID}
_CONTEXT_HEADERS = [
    {"name": header, "in": "header", "required": False, "schema": _ID_SCHEMA, "description": what}
    for header, what in (
        ("X-Session-Id", "the conversation; a new one is made when absent"),
        ("X-Assistant-Id", "the assistant calling"),
        ("X-Thread-Id", "the thread within the conversation"),
    )
]
_SESSION_PATH = {"name": "session_id", "in": "path", "required": True, "schema": _ID_SCHEMA}


def build_openapi(runtime: Any) -> dict[str, Any]:
    """The OpenAPI 3.1 document: response shapes from the msgspec types in `shapes`, and one path
    per tool whose request body is that tool's own ``inputSchema``."""
    types: tuple[type[msgspec.Struct], ...] = (ErrorBody, ToolList, ToolCallResponse, Health)
    types += (SessionContext, SessionEnded, QueryRequest, QueryResponse)
    refs, components = msgspec.json.schema_components((*types, dict[str, int]), ref_template=_REF)
    ref = dict(zip((t.__name__ for t in types), refs, strict=False))
    stats_schema = refs[-1]

    def body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
        return {"required": required, "content": {"application/json": {"schema": schema}}}

    def answers(ok: dict[str, Any], *errors: int, headers: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"200": {"description": "OK", **body(ok)}}
        out["200"].pop("required")
        if headers:
            out["200"]["headers"] = {"X-Session-Id": {"schema": {"type": "string"}}}
        for status in errors:
            out[str(status)] = {"description": _STATUS_TEXT[status], **body(ref["ErrorBody"])}
            out[str(status)].pop("required")
        return out

    paths: dict[str, Any] = {
        "/healthz": {"get": {"operationId": "healthz", "responses": answers(ref["Health"], 503)}},
        "/api/v1/tools": {
            "get": {"operationId": "list_tools", "responses": answers(ref["ToolList"])}
        },
        "/api/v1/sessions/{session_id}/context": {
            "get": {
                "operationId": "session_context",
                "summary": "A session's recent operations, newest first",
                "parameters": [
                    _SESSION_PATH,
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1},
                    },
                    {
                        "name": "tool_filter",
                        "in": "query",
                        "required": False,
                        "explode": True,
                        "schema": {
                            "type": "array",
                            "items": {"type": "string", "minLength": 1, "maxLength": 200},
                        },
                    },
                ],
                "responses": answers(ref["SessionContext"], 400, 404),
            }
        },
        "/api/v1/sessions/{session_id}": {
            "delete": {
                "operationId": "end_session",
                "summary": "End a session: stop its actors and drop its state",
                "description": "Idempotent: 200 whether the session had live actors, only "
                "stored state, or nothing (again); `actors_stopped` counts the live ones. "
                "With authentication, only the caller's own session of that id is ended.",
                "parameters": [_SESSION_PATH],
                "responses": answers(ref["SessionEnded"], 400, 503),
            }
        },
        "/api/v1/query": {
            "post": {
                "operationId": "query",
                "summary": "Run the agent loop once (needs a configured model)",
                "parameters": _CONTEXT_HEADERS,
                "requestBody": body(ref["QueryRequest"]),
                "responses": answers(ref["QueryResponse"], 400, 413, 415, 502, 503, headers=True),
            }
        },
        "/api/v1/stats": {
            "get": {
                "operationId": "stats",
                "summary": "Server-wide counters; with authentication, for operators only",
                "responses": answers(stats_schema, 403),
            }
        },
    }
    for spec in runtime.tools.values():
        schema = _hoist_defs(spec.input_schema, spec.name, components)
        paths[f"/api/v1/tools/{spec.name}"] = {
            "post": {
                "operationId": f"call_{spec.name}",
                "summary": spec.description.split("\n", 1)[0],
                "description": spec.description,
                "parameters": _CONTEXT_HEADERS,
                "requestBody": body(schema, required=False),
                "responses": answers(
                    ref["ToolCallResponse"], 400, 413, 415, 503, 504, headers=True
                ),
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "ctxactors REST API", "version": "1"},
        "paths": paths,
        "components": {"schemas": components},
    }


_STATUS_TEXT = {
    400: "Malformed JSON or invalid arguments (the message names the field)",
    403: "With authentication: the caller is no operator (serve --operator)",
    404: "Unknown tool or session",
    413: "Request body over the size limit",
    415: "A POST without Content-Type: application/json",
    502: "The chat model failed",
    503: "The runtime is closed, the server is shutting down, no model is configured, "
    "the state store is unavailable, or a Ray shard died during the call (code "
    "shard_unavailable: retryable, the call is in doubt)",
    504: "The tool did not answer in time",
}


def _hoist_defs(schema: dict[str, Any], prefix: str, components: dict[str, Any]) -> Any:
    """A tool schema with its ``$defs`` moved into the components (``#/$defs/X`` only
    resolves against the document root in OpenAPI), names prefixed by the tool's."""
    local = schema.get("$defs", {})

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: rewrite(v) for k, v in node.items() if k != "$defs"}
            target = out.get("$ref")
            if isinstance(target, str) and target.startswith("#/$defs/"):
                out["$ref"] = _REF.format(name=f"{prefix}.{target[len('#/$defs/') :]}")
            return out
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    for name, definition in local.items():
        components[f"{prefix}.{name}"] = rewrite(definition)
    return rewrite(schema)
