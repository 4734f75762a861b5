"""Who may reach the HTTP server, as one object: `HttpSecurity`, and the ``serve`` options
that build it.

The defaults protect a server on loopback from the pages its operator visits (`guard`);
authentication (`auth`) is what makes any other address safe, so without it ``serve``
binds loopback only unless told ``--insecure-no-auth``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
from mcp.server.auth.settings import AuthSettings
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import AnyHttpUrl, ValidationError
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route

from ctxactors.transports.auth import AuthConfigError, JwtVerifier, RequireAuth, StaticTokens
from ctxactors.transports.guard import LOOPBACK_HOSTS, RequestGuard, is_loopback, normalise_origin

# What a page on an allowed origin may send (the MCP and REST headers a client uses).
_CORS_REQUEST_HEADERS = [
    "Authorization",
    "Content-Type",
    "Mcp-Session-Id",
    "Mcp-Protocol-Version",
    "Last-Event-ID",
    "X-Session-Id",
    "X-Assistant-Id",
    "X-Thread-Id",
]


@dataclass(frozen=True)
class HttpSecurity:
    """Everything that decides who reaches the HTTP server, built once by ``serve``.

    `verifier` None means no authentication (allowed on loopback binds only, unless the
    operator insists). `auth` (JWT with an issuer URL) publishes RFC 9728 metadata naming
    the identity provider; static tokens have no provider to name, so they publish none.
    """

    allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS
    allowed_origins: tuple[str, ...] = ()
    verifier: TokenVerifier | None = None
    auth: AuthSettings | None = None
    # None: the runtime's ``http.max_sessions_per_principal`` (`mcp.session_cap`).
    max_sessions_per_principal: int | None = None
    # Principals that may read the server-wide figures (``serve --operator``).
    operators: frozenset[str] = frozenset()

    @property
    def resource_metadata_url(self) -> AnyHttpUrl | None:
        if self.auth is None or self.auth.resource_server_url is None:
            return None
        return build_resource_metadata_url(self.auth.resource_server_url)

    def middleware(self) -> list[Middleware]:
        """Outermost first: browser checks, CORS for allowed origins, then authentication."""
        stack = [Middleware(RequestGuard, self.allowed_hosts, self.allowed_origins)]
        if self.allowed_origins:
            stack.append(
                Middleware(
                    CORSMiddleware,
                    allow_origins=list(self.allowed_origins),
                    allow_methods=["GET", "POST", "DELETE"],
                    allow_headers=_CORS_REQUEST_HEADERS,
                    expose_headers=["Mcp-Session-Id", "X-Session-Id", "WWW-Authenticate"],
                )
            )
        if self.verifier is not None:
            stack.append(
                Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(self.verifier))
            )
            stack.append(Middleware(RequireAuth, self.resource_metadata_url))
        return stack

    def routes(self) -> list[Route]:
        """The protected-resource metadata document, when there is one to publish."""
        if self.auth is None or self.auth.resource_server_url is None:
            return []
        return create_protected_resource_routes(
            resource_url=self.auth.resource_server_url,
            authorization_servers=[self.auth.issuer_url],
            resource_name="ctxactors",
        )

    def transport_security(self) -> TransportSecuritySettings:
        """The same Host/Origin rules in the SDK's terms, for its own check at ``/mcp``."""
        hosts = self.allowed_hosts or ()
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=self.allowed_hosts is not None,
            allowed_hosts=[*hosts, *(f"{h}:*" for h in hosts)],
            allowed_origins=list(self.allowed_origins),
        )


def jwt_auth_settings(issuer: str, resource_url: str) -> AuthSettings | None:
    """`AuthSettings` for the metadata document, or None when the issuer is not a URL."""
    if urlsplit(issuer).scheme not in ("http", "https"):
        return None
    # Strings, so the model keeps a path-less URL as given (RFC 8414 compares issuers
    # exactly; a bare AnyHttpUrl would add a slash).
    try:
        return AuthSettings.model_validate(
            {
                "issuer_url": issuer,
                "resource_server_url": resource_url,
                "validate_token_resource": False,  # the verifier checks the audience itself
            }
        )
    except ValidationError as exc:
        raise AuthConfigError(
            f"--public-url {resource_url!r}: not an http(s) URL ({exc})"
        ) from None


# What an app gets unless told otherwise: loopback Host names, no cross-origin request, JSON
# POSTs only, no authentication.
LOOPBACK_ONLY = HttpSecurity()


# -- ``ctxactors serve`` options ---------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "HTTP access", "who may reach --transport http (README: Deploying on a network)"
    )
    add = group.add_argument
    add("--auth-tokens", metavar="FILE", help="bearer tokens, one 'token principal' a line")
    add("--jwt-public-key", metavar="FILE", help="accept JWTs signed by this PEM public key")
    add("--jwt-jwks-url", metavar="URL", help="accept JWTs signed by a key this JWKS serves")
    add("--jwt-issuer", metavar="ISS", help="the JWTs' required iss")
    add("--jwt-audience", metavar="AUD", help="the JWTs' required aud")
    add("--jwt-principal-claim", metavar="CLAIM", default="sub", help="default: sub")
    add(
        "--public-url",
        metavar="URL",
        help="this server's URL as clients reach it, for the protected-resource metadata "
        "(default http://HOST:PORT)",
    )
    add("--allow-origin", metavar="ORIGIN", action="append", default=[], help="repeatable")
    add(
        "--allow-host",
        metavar="NAME",
        action="append",
        default=[],
        help="a Host name clients use besides the bind address (a proxy's); repeatable",
    )
    add("--max-actors-per-principal", type=int, metavar="N", help="live actors of one principal")
    add(
        "--max-sessions-per-principal",
        type=int,
        metavar="N",
        help="open MCP sessions of one (default: http.max_sessions_per_principal, 100)",
    )
    add(
        "--insecure-no-auth",
        action="store_true",
        help="serve a non-loopback address without authentication (anyone who can connect "
        "runs every tool)",
    )


_AUTH_OPTIONS = ("auth_tokens", "jwt_public_key", "jwt_jwks_url", "jwt_issuer", "jwt_audience")
_PRINCIPAL_LIMITS = ("max_actors_per_principal", "max_sessions_per_principal")


def security_from_args(args: argparse.Namespace) -> HttpSecurity:
    """The `HttpSecurity` the options ask for; `AuthConfigError` says what is wrong."""
    given = [name for name in _AUTH_OPTIONS if getattr(args, name)]
    if given and args.transport != "http":
        raise AuthConfigError("authentication options are for --transport http")
    for name in _PRINCIPAL_LIMITS:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise AuthConfigError(f"--{name.replace('_', '-')} must be at least 1")
    verifier, auth = _verifier_from_args(args)
    if verifier is None:
        limits = [n for n in _PRINCIPAL_LIMITS if getattr(args, n) is not None]
        if limits:
            raise AuthConfigError(
                f"--{limits[0].replace('_', '-')} needs authentication (principals come "
                "from tokens): give --auth-tokens or the --jwt-* options"
            )
        if not is_loopback(args.host) and not args.insecure_no_auth:
            raise AuthConfigError(
                f"--host {args.host} is not a loopback address and no authentication is "
                "configured: anyone who can connect would run every tool, shell commands "
                "included. Give --auth-tokens FILE or the --jwt-* options (or, on a network "
                "you trust completely, --insecure-no-auth)"
            )
    elif args.insecure_no_auth:
        raise AuthConfigError("--insecure-no-auth contradicts the authentication options")
    return HttpSecurity(
        allowed_hosts=_allowed_hosts(args.host, args.allow_host),
        allowed_origins=tuple(normalise_origin(o) for o in args.allow_origin),
        verifier=verifier,
        auth=auth,
        max_sessions_per_principal=args.max_sessions_per_principal,
    )


def _verifier_from_args(
    args: argparse.Namespace,
) -> tuple[TokenVerifier | None, AuthSettings | None]:
    jwt_given = any(getattr(args, n) for n in _AUTH_OPTIONS[1:])
    if args.auth_tokens and jwt_given:
        raise AuthConfigError("give either --auth-tokens or the --jwt-* options, not both")
    if args.auth_tokens:
        return StaticTokens.from_file(args.auth_tokens), None
    if not jwt_given:
        return None, None
    verifier = JwtVerifier.from_options(
        issuer=args.jwt_issuer,
        audience=args.jwt_audience,
        public_key_file=args.jwt_public_key,
        jwks_url=args.jwt_jwks_url,
        principal_claim=args.jwt_principal_claim,
    )
    host = f"[{args.host}]" if ":" in args.host else args.host
    public_url = args.public_url or f"http://{host}:{args.port}"
    return verifier, jwt_auth_settings(verifier.issuer, public_url)


def _allowed_hosts(bind: str, extra: Sequence[str]) -> tuple[str, ...] | None:
    """Loopback binds accept loopback names and their own address (``127.0.0.2`` too);
    other binds check Host only when the operator names the hosts."""
    names = [h.lower() for h in extra]
    own = [] if bind in ("0.0.0.0", "::", "") else [f"[{bind}]" if ":" in bind else bind]
    if is_loopback(bind):
        return tuple(dict.fromkeys([*LOOPBACK_HOSTS, *own, *names]))
    if not names:
        return None
    return tuple(dict.fromkeys([*names, *own]))
