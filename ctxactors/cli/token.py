"""The bearer token a command sends to a server with authentication (``serve --auth-tokens``
or JWT options).

Read from ``CTXACTORS_TOKEN`` or a file (``--token-file``), never from a command-line
argument, which other users of the machine can read in ``ps``. The token never shows
itself: `Bearer`'s ``repr`` and ``str`` are ``***``, and a token that could not go into an
HTTP header is refused without quoting it (httpx's own error would).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

TOKEN_ENV = "CTXACTORS_TOKEN"
# RFC 6750's b64token: what a bearer token may hold (JWTs and opaque tokens alike).
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_MAX_FILE_BYTES = 64 << 10


class Bearer:
    """A bearer token; it prints as ``***`` wherever it ends up (a report, a traceback)."""

    __slots__ = ("_token",)

    def __init__(self, token: str, source: str) -> None:
        if not _B64TOKEN.fullmatch(token):
            raise ValueError(
                f"the token in {source} is not a bearer token (RFC 6750: letters, digits, "
                "-._~+/ and trailing =, on one line)"
            )
        self._token = token

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"}

    def __repr__(self) -> str:
        return "Bearer('***')"

    __str__ = __repr__


def read_bearer(path: str | None, environ: Mapping[str, str] | None = None) -> Bearer | None:
    """The token of `path` (its content, surrounding whitespace dropped) when given, else of
    ``CTXACTORS_TOKEN`` when set, else None; ValueError says what is wrong, never the token."""
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = f.read(_MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"--token-file {path}: {exc.strerror or exc}") from None
        if len(raw) > _MAX_FILE_BYTES:
            raise ValueError(f"--token-file {path}: over {_MAX_FILE_BYTES:,} bytes")
        return Bearer(raw.decode("utf-8", "replace").strip(), f"--token-file {path}")
    token = (os.environ if environ is None else environ).get(TOKEN_ENV, "").strip()
    return Bearer(token, TOKEN_ENV) if token else None
