"""Bearer authentication for the HTTP transport, and the principal it yields.

Tokens are checked by an MCP SDK `TokenVerifier`: `StaticTokens` (a file of ``token
principal`` lines) or `JwtVerifier` (PyJWT: a public key or a JWKS URL, with issuer and
audience checks). The SDK's `BearerAuthBackend` turns a valid token into an
`AuthenticatedUser`, and its `RequireAuthMiddleware` (behind `RequireAuth`) answers 401
with ``WWW-Authenticate``, so ``/mcp`` and REST refuse the same way. `principal_of` reads
the principal back; the transports pass it to the runtime, where it namespaces every key.
`PrincipalSessionManager` caps one principal's open MCP sessions.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from mcp.server.auth.middleware.bearer_auth import (
    AuthenticatedUser,
    AuthorizationContext,
    RequireAuthMiddleware,
)
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from pydantic import AnyHttpUrl
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ctxactors.context import MAX_ID, check_id
from ctxactors.errors import InvalidArgumentsError
from ctxactors.logs import lazy_logger

MAX_PRINCIPAL = MAX_ID  # a principal is checked as an id is
MIN_TOKEN = 16  # a shorter static token is guessable; refused when the file is read
JWT_LEEWAY_S = 30  # clock skew allowed between the token issuer and this server
# Paths anyone may read: a health probe, and the metadata that tells a client how to get a
# token (RFC 9728 §3.1: this path, or it followed by the resource's own path).
_HEALTH = "/healthz"
_METADATA = "/.well-known/oauth-protected-resource"
_log = lazy_logger("ctxactors.auth")


class AuthConfigError(ValueError):
    """An access option or file that can't be used; the message says why."""


# -- principals ------------------------------------------------------------------------------


def principal_of(scope: Scope | None) -> str | None:
    """The authenticated principal of an HTTP request's ASGI scope, or None without auth."""
    user = scope.get("user") if scope is not None else None
    if not isinstance(user, AuthenticatedUser):
        return None
    return user.access_token.subject


def is_operator(scope: Scope | None, operators: Collection[str]) -> bool:
    """Whether the caller may read server-wide figures (``/metrics``, ``/api/v1/stats``):
    anyone without authentication (a loopback server), else a principal of ``--operator``.
    Another tenant's call volume, live sessions and errors are not a tenant's to see."""
    principal = principal_of(scope)
    return principal is None or principal in operators


def _access_token(token: str, principal: str, scopes: Any = None, **extra: Any) -> AccessToken:
    """What the SDK keeps of a valid token. The principal is both client and subject, so
    the SDK's session-ownership check (client, issuer, subject) compares principals."""
    scopes = scopes.split() if isinstance(scopes, str) else []
    return AccessToken(token=token, client_id=principal, subject=principal, scopes=scopes, **extra)


def _check_principal(value: Any, where: str) -> str:
    """`value` if it can be a principal: a string that could be a session id (`check_id`),
    since it is stored, logged and sent back beside one; else `AuthConfigError`."""
    if not isinstance(value, str):
        raise AuthConfigError(f"{where}: a principal must be a string, not {type(value).__name__}")
    try:
        return check_id(value, "the principal")
    except InvalidArgumentsError as exc:
        raise AuthConfigError(f"{where}: {exc}") from None


# -- static tokens ---------------------------------------------------------------------------


class StaticTokens:
    """Bearer tokens from a file of ``token principal`` lines (``#`` starts a comment).

    Only SHA-256 digests are kept, and a presented token's digest is compared with
    `hmac.compare_digest` against every entry, match or not: neither the time taken nor
    the token's length tells a caller which entry came close.
    """

    def __init__(self, entries: Iterable[tuple[str, str]]) -> None:
        self._entries: list[tuple[bytes, str]] = []
        for token, principal in entries:
            _check_principal(principal, "auth tokens")
            self._entries.append((_digest(token), principal))
        if not self._entries:
            raise AuthConfigError("auth tokens: no token given")
        if len({d for d, _ in self._entries}) != len(self._entries):
            raise AuthConfigError("auth tokens: a token is listed twice")

    @classmethod
    def from_file(cls, path: str | Path) -> StaticTokens:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise AuthConfigError(f"--auth-tokens {path}: {exc}") from None
        entries = []
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            where = f"--auth-tokens {path} line {number}"  # never the token itself
            if len(fields) != 2:
                raise AuthConfigError(f"{where}: expected 'token principal'")
            if len(fields[0]) < MIN_TOKEN:
                raise AuthConfigError(f"{where}: a token needs at least {MIN_TOKEN} characters")
            entries.append((fields[0], _check_principal(fields[1], where)))
        if not entries:
            raise AuthConfigError(f"--auth-tokens {path}: no 'token principal' line")
        return cls(entries)

    async def verify_token(self, token: str) -> AccessToken | None:
        presented = _digest(token)
        found: str | None = None
        for digest, principal in self._entries:
            if hmac.compare_digest(digest, presented):
                found = principal
        return None if found is None else _access_token(token, found)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


# -- JWT -------------------------------------------------------------------------------------

# Asymmetric algorithms only, chosen by the key's type: a public key is never an HMAC secret
# (the classic "alg" confusion), and "none" is never accepted.
_ALGORITHMS: tuple[tuple[type, tuple[str, ...]], ...] = (
    (rsa.RSAPublicKey, ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")),
    (ec.EllipticCurvePublicKey, ("ES256", "ES384", "ES512")),
    (ed25519.Ed25519PublicKey, ("EdDSA",)),
    (ed448.Ed448PublicKey, ("EdDSA",)),
)


@dataclass(frozen=True)
class JwtVerifier:
    """JWTs signed by the operator's identity provider, checked with PyJWT.

    The signature (a PEM public key, or the key a JWKS URL publishes under the token's
    ``kid``), ``exp`` (required), ``iss`` and ``aud`` are all checked; the principal is
    the `principal_claim` (default ``sub``). Any failure is a refusal, logged at debug
    (an attacker could otherwise fill the log).
    """

    issuer: str
    audience: str
    public_key: Any = None
    jwks: jwt.PyJWKClient | None = None
    principal_claim: str = "sub"

    @classmethod
    def from_options(
        cls,
        *,
        issuer: str | None,
        audience: str | None,
        public_key_file: str | None = None,
        jwks_url: str | None = None,
        principal_claim: str = "sub",
    ) -> JwtVerifier:
        if bool(public_key_file) == bool(jwks_url):
            raise AuthConfigError("give exactly one of --jwt-public-key and --jwt-jwks-url")
        if not issuer or not audience:
            raise AuthConfigError("JWT authentication needs --jwt-issuer and --jwt-audience")
        if public_key_file:
            return cls(issuer, audience, _load_public_key(public_key_file), None, principal_claim)
        assert jwks_url is not None
        if urlsplit(jwks_url).scheme not in ("https", "http"):
            raise AuthConfigError(f"--jwt-jwks-url {jwks_url!r}: expected an http(s) URL")
        # PyJWT caches the key set and refetches an unknown kid at most every 30 s.
        jwks = jwt.PyJWKClient(jwks_url, lifespan=300, timeout=10)
        return cls(issuer, audience, None, jwks, principal_claim)

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            if self.jwks is not None:  # may fetch the key set: off the event loop
                jwk = await anyio.to_thread.run_sync(self.jwks.get_signing_key_from_jwt, token)
                key, algorithms = jwk.key, [jwk.algorithm_name]
            else:
                key, algorithms = self.public_key, _algorithms_for(self.public_key)
            claims = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                issuer=self.issuer,
                audience=self.audience,
                leeway=JWT_LEEWAY_S,
                options={"require": ["exp", "iss", "aud", self.principal_claim]},
            )
            principal = _check_principal(claims[self.principal_claim], "token")
        except (jwt.PyJWTError, AuthConfigError) as exc:
            _log.debug("token_refused", reason=f"{type(exc).__name__}: {exc}")
            return None
        return _access_token(
            token,
            principal,
            claims.get("scope"),
            expires_at=int(claims["exp"]),
            claims={"iss": claims["iss"]},
        )


def _load_public_key(path: str) -> Any:
    try:
        key = load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise AuthConfigError(f"--jwt-public-key {path}: not a PEM public key ({exc})") from None
    _algorithms_for(key)
    return key


def _algorithms_for(key: Any) -> list[str]:
    for kind, names in _ALGORITHMS:
        if isinstance(key, kind):
            return list(names)
    raise AuthConfigError(f"unsupported public key type {type(key).__name__}")


# -- requiring a token ---------------------------------------------------------------------


class RequireAuth:
    """The SDK's `RequireAuthMiddleware` on every HTTP path but the public ones. Its 401
    closes the connection: a client without a valid token keeps no connection open (the
    request's body, unread, goes with it)."""

    def __init__(self, app: ASGIApp, resource_metadata_url: AnyHttpUrl | None) -> None:
        self.app = app
        self.required = RequireAuthMiddleware(app, [], resource_metadata_url)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or _is_public(scope["path"]):
            await self.app(scope, receive, send)
            return

        async def close_after_401(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                message = {**message, "headers": [*message.get("headers", []), _CLOSE]}
            await send(message)

        await self.required(scope, receive, close_after_401)


_CLOSE = (b"connection", b"close")


def _is_public(path: str) -> bool:
    return path in (_HEALTH, _METADATA) or path.startswith(_METADATA + "/")


# -- MCP sessions per principal --------------------------------------------------------------


class SessionLimitExceeded(Exception):
    """One principal already holds its cap of open MCP sessions."""


class PrincipalSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, with a cap on each principal's open sessions.

    The count is taken where the SDK admits a session, under its creation lock, from the
    owners it records for every session, so concurrent initializes can't overshoot and a
    session that ends (DELETE, idle timeout, crash) frees its place at once.
    """

    def __init__(self, *args: Any, max_sessions_per_principal: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_sessions_per_principal = max_sessions_per_principal

    def _admit_session(
        self, requestor: AuthorizationContext | None
    ) -> StreamableHTTPServerTransport | None:
        if requestor is not None:
            held = sum(owner == requestor for owner in self._session_owners.values())
            if held >= self.max_sessions_per_principal:
                raise SessionLimitExceeded(requestor["subject"])
        return super()._admit_session(requestor)


class SessionLimit:
    """Turns `SessionLimitExceeded` into a 429 that says what to do (no session was made)."""

    def __init__(self, app: ASGIApp, manager: PrincipalSessionManager) -> None:
        self.app = app
        self.cap = manager.max_sessions_per_principal
        idle = manager.session_idle_timeout
        self.idle = "" if idle is None else f"; an idle one ends by itself after {idle:g} s"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except SessionLimitExceeded as exc:
            message = (
                f"principal {exc.args[0]!r} already has {self.cap} open MCP sessions, the "
                "most allowed; end one (DELETE /mcp with its Mcp-Session-Id) or reuse it"
                f"{self.idle}"
            )
            body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}
            await JSONResponse(body, 429)(scope, receive, send)
