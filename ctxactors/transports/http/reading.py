"""What a request carries: context ids from headers and paths, and the JSON body.

Ids travel as UTF-8 in headers; one that no header could carry (a control character, a
blank at either end, over `MAX_ID` characters) is refused with 400 by the same rule every
surface uses (`check_id`).
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request

from ctxactors.context import MAX_ID, check_id
from ctxactors.errors import InvalidArgumentsError
from ctxactors.transports.http.shapes import ApiError

_decode = msgspec.json.Decoder().decode


def header_id(request: Request, header: str) -> str | None:
    raw = request.headers.get(header)
    if raw is None:
        return None
    try:  # Starlette decodes header bytes as latin-1; clients send UTF-8
        value = raw.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_header", f"{header} is not valid UTF-8") from None
    return header_safe(value, header, "invalid_header")  # length too: one id rule


def header_safe(value: str, what: str, code: str) -> str:
    """`value` if it is an id every surface (and a response header) can carry."""
    try:
        return check_id(value, what)
    except InvalidArgumentsError as exc:
        raise ApiError(400, code, str(exc)) from None


def as_header(value: str) -> str:
    """A header value sent as UTF-8 (Starlette encodes header strings as latin-1)."""
    return value.encode("utf-8").decode("latin-1")


def path_id(request: Request, name: str) -> str:
    value: str = request.path_params[name]
    if len(value) > MAX_ID:
        raise ApiError(400, "invalid_path", f"{name} must be at most {MAX_ID} characters")
    return value


async def json_body(request: Request) -> Any:
    """The body as a JSON object (an empty body is ``None``); `BodyLimit` enforces the cap."""
    raw = await request.body()
    if not raw.strip():
        return None
    try:
        body = _decode(raw)
    except msgspec.DecodeError as exc:
        raise ApiError(
            400, "malformed_json", f"the request body is not valid JSON: {exc}"
        ) from None
    except UnicodeDecodeError:  # msgspec's offset is within the string: find the body's
        raise ApiError(
            400, "malformed_json", f"the request body is not valid UTF-8 ({_utf8_error(raw)})"
        ) from None
    except RecursionError:
        raise ApiError(400, "malformed_json", "the request body is nested too deeply") from None
    if not isinstance(body, dict):
        kind = "null" if body is None else type(body).__name__
        raise ApiError(400, "invalid_body", f"the request body must be a JSON object, got {kind}")
    return body


def _utf8_error(raw: bytes) -> str:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"{exc.reason} at byte {exc.start}"
    return "a string is not UTF-8"
