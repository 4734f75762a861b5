"""Each REST endpoint is a module function: mounted alone on a bare Starlette app that holds
an `ApiState`, it answers as it does inside `create_app`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import structlog
from starlette.applications import Starlette
from starlette.routing import Route

from ctxactors import Runtime
from ctxactors.servers import BUILTIN
from ctxactors.testing import context_args, serve_app
from ctxactors.transports.http import app, endpoints
from ctxactors.transports.http.failures import HANDLERS
from ctxactors.transports.http.state import ApiState


@pytest.fixture
def rt() -> Iterator[Runtime]:
    with Runtime(BUILTIN) as runtime:
        yield runtime


def alone(rt: Runtime, path: str, endpoint: object, method: str) -> Starlette:
    one = Starlette(routes=[Route(path, endpoint, methods=[method])], exception_handlers=HANDLERS)
    one.state.api = ApiState(rt, None, b"{}", structlog.get_logger("test"))
    return one


def test_the_session_context_endpoint_answers_alone(rt: Runtime) -> None:
    rt.call("create_goal", context_args("s1", goal="alone"))
    bare = alone(rt, "/ctx/{session_id}", endpoints.session_context, "GET")
    with serve_app(bare) as url, httpx.Client(base_url=url) as http:
        found = http.get("/ctx/s1", params={"limit": "1"})
        unknown = http.get("/ctx/nobody")
    assert found.status_code == 200
    ops = found.json()["operations"]
    assert [(op["tool"], op["arguments"], op["is_error"]) for op in ops] == [
        ("create_goal", {"goal": "alone"}, False)
    ]
    assert found.json()["count"] == 1
    assert unknown.status_code == 404
    assert unknown.json() == {
        "error": {"code": "unknown_session", "message": "session 'nobody' has no state"}
    }


def test_the_query_endpoint_alone_says_no_model_is_configured(rt: Runtime) -> None:
    bare = alone(rt, "/q", endpoints.query, "POST")
    with serve_app(bare) as url:
        refused = httpx.post(f"{url}/q", json={"query": "hi"})
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "no_model"


def test_every_route_of_the_table_is_served_by_create_app(rt: Runtime) -> None:
    served = {
        (route.path, method)
        for route in app.create_app(rt).routes
        if isinstance(route, Route)
        for method in route.methods or ()
    }
    for path, _, methods in app.API_ROUTES:
        assert {(path, m) for m in methods} <= served
