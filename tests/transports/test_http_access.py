"""Who may call, checked in this process: JWT verification (a PEM key of each kind, a JWKS
URL), the per-principal cap of MCP sessions and its 429, the access settings handed to the
MCP SDK.

`test_http_auth` checks the same promises against a real ``ctxactors serve`` subprocess;
mutation testing sees only code run in the test process, so here the verifier is called
directly and the server runs as `serve` wires it in a thread (`in_process_support`).
"""

from __future__ import annotations

import json
import locale
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from in_process_support import WAIT, serve_in_process
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel import Server as SdkServer
from mcp.server.transport_security import TransportSecuritySettings
from served_support import INITIALIZE_PARAMS, MCP_HEADERS
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send
from structlog.testing import capture_logs
from test_http_auth import AUDIENCE, ISSUER, _hs256_with, assert_401, make_jwt

from ctxactors.logs import configure_logging
from ctxactors.transports.access import HttpSecurity, jwt_auth_settings
from ctxactors.transports.auth import (
    AuthConfigError,
    JwtVerifier,
    PrincipalSessionManager,
    SessionLimit,
    SessionLimitExceeded,
    StaticTokens,
    is_operator,
    principal_of,
)

pytestmark = pytest.mark.timeout(90)

ALICE = "alice-" + secrets.token_urlsafe(24)
BOB = "bob-" + secrets.token_urlsafe(24)
MCP_ACCEPT = {"Accept": MCP_HEADERS["Accept"]}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE_PARAMS}


def pem_file(path: Path, key: Any) -> str:
    path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return str(path)


def verifier_for(tmp_path: Path, key: Any, principal_claim: str = "sub") -> JwtVerifier:
    return JwtVerifier.from_options(
        issuer=ISSUER,
        audience=AUDIENCE,
        public_key_file=pem_file(tmp_path / f"{type(key).__name__}.pem", key),
        principal_claim=principal_claim,
    )


def verify(verifier: JwtVerifier, token: str) -> AccessToken | None:
    return anyio.run(verifier.verify_token, token)


def principal(verifier: JwtVerifier, token: str) -> str | None:
    access = verify(verifier, token)
    return None if access is None else access.subject


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def debug_logs() -> Iterator[list[dict[str, Any]]]:
    configure_logging(format="json", level="debug", force=True)
    with capture_logs() as logs:
        yield logs


# -- JWTs checked against a PEM public key ---------------------------------------------------


def test_a_valid_jwt_yields_its_principal_scopes_expiry_and_issuer(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey
) -> None:
    verifier = verifier_for(tmp_path, rsa_key)
    exp = int(time.time()) + 300
    token = make_jwt(rsa_key, "RS256", exp=exp, scope="read write")
    assert verify(verifier, token) == AccessToken(
        token=token,
        client_id="alice",
        subject="alice",
        scopes=["read", "write"],
        expires_at=exp,
        claims={"iss": ISSUER},
    )
    # No scope, or one that is not the space-separated string of RFC 8693: no scopes.
    for scope in (None, ["read"]):
        access = verify(verifier, make_jwt(rsa_key, "RS256", scope=scope))
        assert access is not None and access.scopes == []


def test_the_principal_comes_from_the_configured_claim(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey
) -> None:
    verifier = verifier_for(tmp_path, rsa_key, principal_claim="email")
    token = make_jwt(rsa_key, "RS256", email="alice@example.org", sub="ignored")
    access = verify(verifier, token)
    assert access is not None
    assert (access.client_id, access.subject) == ("alice@example.org", "alice@example.org")
    assert verify(verifier, make_jwt(rsa_key, "RS256")) is None  # no email claim
    assert verify(verifier, make_jwt(rsa_key, "RS256", email=42)) is None  # no string


@pytest.mark.parametrize(
    ("key", "algorithms"),
    [
        (ec.generate_private_key(ec.SECP256R1()), ["ES256"]),
        (ec.generate_private_key(ec.SECP384R1()), ["ES384"]),
        (ed25519.Ed25519PrivateKey.generate(), ["EdDSA"]),
        (ed448.Ed448PrivateKey.generate(), ["EdDSA"]),
    ],
    ids=["P-256", "P-384", "Ed25519", "Ed448"],
)
def test_each_kind_of_public_key_accepts_its_own_algorithms(
    tmp_path: Path, key: Any, algorithms: list[str]
) -> None:
    verifier = verifier_for(tmp_path, key)
    for algorithm in algorithms:
        assert principal(verifier, make_jwt(key, algorithm, sub=f"by-{algorithm}")) == (
            f"by-{algorithm}"
        )


def test_an_rsa_key_accepts_the_rsa_algorithms_and_no_other(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey
) -> None:
    verifier = verifier_for(tmp_path, rsa_key)
    for algorithm in ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"):
        assert principal(verifier, make_jwt(rsa_key, algorithm)) == "alice", algorithm
    # The public key used as an HMAC secret (the "alg" confusion), an EC key's token, none.
    public_pem = Path(tmp_path / "RSAPrivateKey.pem").read_bytes()
    assert principal(verifier, _hs256_with(public_pem)) is None
    assert principal(verifier, make_jwt(ec.generate_private_key(ec.SECP256R1()), "ES256")) is None
    assert principal(verifier, make_jwt(None, "none")) is None


def test_a_key_of_no_supported_kind_is_refused_when_read(tmp_path: Path) -> None:
    key = dsa.generate_private_key(key_size=2048)
    with pytest.raises(AuthConfigError) as refused:
        verifier_for(tmp_path, key)
    assert str(refused.value) == f"unsupported public key type {type(key.public_key()).__name__}"


def test_every_failed_check_is_a_refusal_logged_at_debug(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, debug_logs: list[dict[str, Any]]
) -> None:
    verifier = verifier_for(tmp_path, rsa_key)
    now = int(time.time())
    refused = {
        "ExpiredSignatureError: Signature has expired": make_jwt(
            rsa_key, "RS256", exp=now - 120, iat=now - 600
        ),
        "InvalidAudienceError: Audience doesn't match": make_jwt(rsa_key, "RS256", aud="other"),
        "InvalidIssuerError: Invalid issuer": make_jwt(
            rsa_key, "RS256", iss="https://evil.example"
        ),
        'MissingRequiredClaimError: Token is missing the "exp" claim': make_jwt(
            rsa_key, "RS256", exp=None
        ),
        'MissingRequiredClaimError: Token is missing the "iss" claim': make_jwt(
            rsa_key, "RS256", iss=None
        ),
        'MissingRequiredClaimError: Token is missing the "aud" claim': make_jwt(
            rsa_key, "RS256", aud=None
        ),
        'MissingRequiredClaimError: Token is missing the "sub" claim': make_jwt(
            rsa_key, "RS256", sub=None
        ),
        "AuthConfigError: token: the principal contains the character '\\x07', which no "
        "header carries": make_jwt(rsa_key, "RS256", sub="bob\x07"),
        "InvalidSubjectError: Subject must be a string": make_jwt(rsa_key, "RS256", sub=42),
        "DecodeError: Not enough segments": "not-a-jwt",
    }
    for token in refused.values():
        assert verify(verifier, token) is None
    assert [e for e in debug_logs if e["event"] == "token_refused"] == [
        {
            "event": "token_refused",
            "reason": reason,
            "logger": "ctxactors.auth",
            "log_level": "debug",
        }
        for reason in refused
    ]


def test_the_expiry_allows_30_seconds_of_clock_skew(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey
) -> None:
    """An issuer's clock a little ahead of ours: a token that expired 15 s ago by our clock
    still passes, one that expired 45 s ago does not (each 15 s from the 30 s leeway, room
    for a slow machine)."""
    verifier = verifier_for(tmp_path, rsa_key)
    now = int(time.time())
    assert principal(verifier, make_jwt(rsa_key, "RS256", exp=now - 15, iat=now - 60)) == "alice"
    assert principal(verifier, make_jwt(rsa_key, "RS256", exp=now - 45, iat=now - 90)) is None


# -- JWTs checked against a JWKS URL ---------------------------------------------------------


class Jwks:
    """An identity provider's JWKS endpoint, in this process, counting its fetches."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.fetches = 0
        self.lock = threading.Lock()
        jwks = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                with jwks.lock:
                    jwks.fetches += 1
                body = json.dumps(document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
def jwks(ec_key: ec.EllipticCurvePrivateKey) -> Iterator[Jwks]:
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key()))
    served = Jwks({"keys": [{**jwk, "kid": "k1", "use": "sig"}]})
    yield served
    served.close()


def jwks_verifier(url: str, principal_claim: str = "sub") -> JwtVerifier:
    return JwtVerifier.from_options(
        issuer=ISSUER, audience=AUDIENCE, jwks_url=url, principal_claim=principal_claim
    )


def test_jwts_are_checked_against_the_key_their_kid_names_at_a_jwks_url(
    jwks: Jwks, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    verifier = jwks_verifier(jwks.url)
    assert verifier.jwks is not None and verifier.public_key is None
    exp = int(time.time()) + 300
    token = make_jwt(ec_key, "ES256", headers={"kid": "k1"}, exp=exp, scope="tools")
    assert verify(verifier, token) == AccessToken(
        token=token,
        client_id="alice",
        subject="alice",
        scopes=["tools"],
        expires_at=exp,
        claims={"iss": ISSUER},
    )
    impostor = ec.generate_private_key(ec.SECP256R1())
    for refused in (
        make_jwt(impostor, "ES256", headers={"kid": "k1"}),  # not the published key
        make_jwt(ec_key, "ES256", headers={"kid": "unknown"}),
        make_jwt(ec_key, "ES256", headers={"kid": "k1"}, aud="another-service"),
        make_jwt(ec_key, "ES256", headers={"kid": "k1"}, iss="https://evil.example"),
        # The key's own algorithm only: ES384 is not what the JWKS key (P-256) signs.
        make_jwt(ec.generate_private_key(ec.SECP384R1()), "ES384", headers={"kid": "k1"}),
    ):
        assert verify(verifier, refused) is None
    # One fetch: the key set is cached, and an unknown kid refetches it at most once per
    # 30 s (PyJWT's cooldown, from the first fetch, a few milliseconds ago).
    assert jwks.fetches == 1
    assert (verifier.jwks.timeout, verifier.jwks.jwk_set_cache.lifespan) == (10, 300)  # type: ignore[union-attr]
    # The principal claim the operator names, here too.
    by_email = jwks_verifier(jwks.url, principal_claim="email")
    token = make_jwt(ec_key, "ES256", headers={"kid": "k1"}, email="alice@example.org")
    assert principal(by_email, token) == "alice@example.org"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "give exactly one of --jwt-public-key and --jwt-jwks-url"),
        (
            {"public_key_file": "k.pem", "jwks_url": "https://idp.example/jwks"},
            "give exactly one of --jwt-public-key and --jwt-jwks-url",
        ),
        (
            {"jwks_url": "https://idp.example/jwks", "issuer": None},
            "JWT authentication needs --jwt-issuer and --jwt-audience",
        ),
        (
            {"jwks_url": "https://idp.example/jwks", "audience": ""},
            "JWT authentication needs --jwt-issuer and --jwt-audience",
        ),
        (
            {"jwks_url": "file:///etc/jwks.json"},
            "--jwt-jwks-url 'file:///etc/jwks.json': expected an http(s) URL",
        ),
    ],
)
def test_jwt_options_that_cant_be_used_say_why(options: dict[str, Any], message: str) -> None:
    with pytest.raises(AuthConfigError) as refused:
        JwtVerifier.from_options(**{"issuer": ISSUER, "audience": AUDIENCE, **options})
    assert str(refused.value) == message


def test_a_jwks_url_may_be_https_or_http() -> None:
    """Neither is fetched before a token needs it."""
    for url in ("https://idp.example/jwks.json", "http://127.0.0.1:1/jwks.json"):
        verifier = jwks_verifier(url)
        assert verifier.jwks is not None and verifier.jwks.uri == url
        assert (verifier.issuer, verifier.audience) == (ISSUER, AUDIENCE)


def test_concurrent_first_verifications_fetch_the_key_set_once(
    jwks: Jwks, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    """The fetch runs off the event loop, in threads: PyJWT's client lock makes the first
    verifications that arrive together wait for one fetch, not make one each."""
    verifier = jwks_verifier(jwks.url)
    tokens = [make_jwt(ec_key, "ES256", headers={"kid": "k1"}, sub=f"p{n}") for n in range(8)]
    found: list[str | None] = [None] * len(tokens)

    async def main() -> None:
        async def one(n: int) -> None:
            access = await verifier.verify_token(tokens[n])
            found[n] = None if access is None else access.subject

        async with anyio.create_task_group() as tg:
            for n in range(len(tokens)):
                tg.start_soon(one, n)

    anyio.run(main)
    assert found == [f"p{n}" for n in range(8)]
    assert jwks.fetches == 1


def test_a_jwks_url_that_does_not_answer_refuses_tokens(
    ec_key: ec.EllipticCurvePrivateKey, debug_logs: list[dict[str, Any]]
) -> None:
    gone = Jwks({})
    gone.close()  # nothing listens at its address any more
    verifier = jwks_verifier(gone.url)
    assert verify(verifier, make_jwt(ec_key, "ES256", headers={"kid": "k1"})) is None
    [refusal] = [e for e in debug_logs if e["event"] == "token_refused"]
    assert refusal["reason"].startswith("PyJWKClientConnectionError: Fail to fetch data")


def test_by_default_the_principal_is_the_sub_claim(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey
) -> None:
    """`JwtVerifier.from_options` without a `principal_claim`, as a host may call it."""
    verifier = JwtVerifier.from_options(
        issuer=ISSUER, audience=AUDIENCE, public_key_file=pem_file(tmp_path / "rsa.pem", rsa_key)
    )
    assert verifier.principal_claim == "sub"
    assert principal(verifier, make_jwt(rsa_key, "RS256", sub="carol")) == "carol"
    assert principal(verifier, make_jwt(rsa_key, "RS256", sub=None, email="carol@x")) is None


# -- static tokens --------------------------------------------------------------------------


def test_a_token_file_takes_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    shortest = "t" * 16  # MIN_TOKEN characters: enough
    path.write_text(f"# token principal\n\n{ALICE} alice # one # two\n  {shortest}\tbob\n")
    tokens = StaticTokens.from_file(path)
    assert [principal_of_token(tokens, t) for t in (ALICE, shortest, "t" * 17)] == [
        "alice",
        "bob",
        None,
    ]


def test_a_token_file_is_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """A server started in the C locale (ASCII) still reads a token with accents."""
    token = "clé-" + secrets.token_urlsafe(24)
    path = tmp_path / "tokens"
    path.write_bytes(f"{token} alice\n".encode())
    saved = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        assert "utf" not in locale.getpreferredencoding(False).lower()  # the point
        tokens = StaticTokens.from_file(path)
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)
    assert principal_of_token(tokens, token) == "alice"


def principal_of_token(tokens: StaticTokens, token: str) -> str | None:
    access = anyio.run(tokens.verify_token, token)
    return None if access is None else access.subject


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", ": no 'token principal' line"),
        ("# only a comment\n\n", ": no 'token principal' line"),
        (f"{ALICE} alice extra\n", " line 1: expected 'token principal'"),
        (f"# who\n{ALICE}\n", " line 2: expected 'token principal'"),
        ("t" * 15 + " alice\n", " line 1: a token needs at least 16 characters"),
    ],
    # Ids without the random token: pytest-xdist's workers must collect the same names.
    ids=["empty", "comments only", "three words", "token alone", "short token"],
)
def test_a_token_file_that_cant_be_used_says_why(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(AuthConfigError) as refused:
        StaticTokens.from_file(path)
    assert str(refused.value) == f"--auth-tokens {path}{message}"  # never the token itself


def test_static_tokens_that_cant_be_used_say_why() -> None:
    refusals = {
        "auth tokens: no token given": [],
        "auth tokens: a token is listed twice": [(ALICE, "alice"), (ALICE, "bob")],
        "auth tokens: a principal must be a string, not int": [(ALICE, 42)],
        "auth tokens: the principal contains the character '\\x07', which no header carries": [
            (ALICE, "bob\x07")
        ],
    }
    for message, entries in refusals.items():
        with pytest.raises(AuthConfigError) as refused:
            StaticTokens(entries)  # type: ignore[arg-type]
        assert str(refused.value) == message


def test_a_presented_token_of_any_text_is_checked_without_error() -> None:
    """A token is hashed whatever it holds (a lone surrogate, say): a refusal, not a 500."""
    tokens = StaticTokens([(ALICE, "alice")])
    for token in ("\ud800" * 20, "", ALICE + "\udfff", "é" * 16):
        assert principal_of_token(tokens, token) is None
    assert principal_of_token(tokens, ALICE) == "alice"


def test_without_authentication_there_is_no_principal_and_everyone_is_operator() -> None:
    assert principal_of(None) is None
    assert principal_of({"type": "http"}) is None
    assert is_operator(None, frozenset({"alice"})) is True


# -- requiring a token -----------------------------------------------------------------------


def test_a_request_without_a_valid_token_gets_a_401_that_closes_its_connection(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey
) -> None:
    pem = pem_file(tmp_path / "public.pem", rsa_key)
    flags = ("--jwt-public-key", pem, "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE)
    flags += ("--public-url", "https://tools.example")
    metadata = "https://tools.example/.well-known/oauth-protected-resource"
    with (
        serve_in_process(*flags) as served,
        httpx.Client(base_url=served.url, timeout=WAIT) as http,
    ):

        def call(
            token: str | None, path: str = "/api/v1/tools/get_planning_state"
        ) -> httpx.Response:
            headers = {
                "X-Session-Id": "s",
                **({"Authorization": f"Bearer {token}"} if token else {}),
            }
            return http.post(path, json={}, headers=headers)

        for token in (None, "not-a-jwt", make_jwt(rsa_key, "RS256", aud="other")):
            for path in ("/api/v1/tools/get_planning_state", "/mcp"):
                refused = call(token, path)
                assert_401(refused, metadata)
                assert refused.headers["connection"] == "close"
        answered = call(make_jwt(rsa_key, "RS256"))
        assert answered.status_code == 200, answered.text
        assert answered.headers.get("connection") != "close"  # kept alive
        # The public paths: the health probe and the metadata that says where to get a token.
        assert http.get("/healthz").status_code == 200
        assert http.get("/.well-known/oauth-protected-resource").json() == {
            "resource": "https://tools.example",
            "authorization_servers": [ISSUER],
            "bearer_methods_supported": ["header"],
            "resource_name": "ctxactors",
        }
        # Below the metadata path (RFC 9728 allows the resource's path there): public, so
        # not found rather than refused; a path that merely begins the same way is not.
        assert http.get("/.well-known/oauth-protected-resource/mcp").status_code == 404
        for path in ("/.well-known/oauth-protected-resource-x", "/healthz/x", "/healthzx"):
            assert_401(http.get(path), metadata)


# -- what the MCP SDK is told ----------------------------------------------------------------


def test_the_metadata_settings_keep_the_issuer_as_given() -> None:
    settings = jwt_auth_settings("https://issuer.example", "http://127.0.0.1:8765")
    assert settings is not None
    assert str(settings.issuer_url) == "https://issuer.example"  # no slash added
    assert str(settings.resource_server_url) == "http://127.0.0.1:8765"
    assert settings.validate_token_resource is False
    assert settings.required_scopes is None
    plain = jwt_auth_settings("http://idp.internal:8080", "http://127.0.0.1:8765")
    assert plain is not None and str(plain.issuer_url) == "http://idp.internal:8080"
    # An issuer that is not an http(s) URL names no metadata to publish.
    assert jwt_auth_settings("issuer-name", "http://127.0.0.1:8765") is None
    assert jwt_auth_settings("urn:example:issuer", "http://127.0.0.1:8765") is None


def test_a_public_url_that_is_no_http_url_is_refused() -> None:
    with pytest.raises(AuthConfigError) as refused:
        jwt_auth_settings("https://issuer.example", "ftp://tools.example")
    assert str(refused.value).startswith("--public-url 'ftp://tools.example': not an http(s) URL (")


def test_the_sdks_host_and_origin_checks_are_the_apps() -> None:
    security = HttpSecurity(
        allowed_hosts=("127.0.0.1", "tools.example"), allowed_origins=("https://app.example",)
    )
    assert security.transport_security() == TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1", "tools.example", "127.0.0.1:*", "tools.example:*"],
        allowed_origins=["https://app.example"],
    )
    # No Host check (a non-loopback bind, no --allow-host): the SDK's is off too.
    assert HttpSecurity(allowed_hosts=None).transport_security() == TransportSecuritySettings(
        enable_dns_rebinding_protection=False, allowed_hosts=[], allowed_origins=[]
    )


# -- MCP sessions per principal --------------------------------------------------------------


@pytest.fixture
def tokens(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    path.write_text(f"{ALICE} alice\n{BOB} bob\n")
    return str(path)


def cap_message(cap: int, idle: str = "; an idle one ends by itself after 1800 s") -> str:
    return (
        f"principal 'alice' already has {cap} open MCP sessions, the most allowed; end one "
        f"(DELETE /mcp with its Mcp-Session-Id) or reuse it{idle}"
    )


def test_one_principal_holds_at_most_its_cap_of_mcp_sessions(tokens: str) -> None:
    flags = ("--auth-tokens", tokens, "--max-sessions-per-principal", "2")
    with serve_in_process(*flags) as served, httpx.Client(timeout=WAIT) as http:

        def initialize(token: str) -> httpx.Response:
            headers = {"Authorization": f"Bearer {token}", **MCP_ACCEPT}
            return http.post(f"{served.url}/mcp", json=INITIALIZE, headers=headers)

        def delete(token: str, opened: httpx.Response) -> int:
            session = opened.headers["Mcp-Session-Id"]
            headers = {"Authorization": f"Bearer {token}", "Mcp-Session-Id": session}
            return http.delete(f"{served.url}/mcp", headers=headers).status_code

        opened = [initialize(ALICE) for _ in range(2)]
        assert [r.status_code for r in opened] == [200, 200]
        refused = initialize(ALICE)
        assert refused.status_code == 429
        assert refused.json() == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32000, "message": cap_message(2)},
        }
        assert "Mcp-Session-Id" not in refused.headers
        # Another principal's sessions don't count against alice's, nor hers against his.
        bobs = [initialize(BOB) for _ in range(2)]
        assert [r.status_code for r in bobs] == [200, 200]
        assert initialize(BOB).status_code == 429
        assert delete(ALICE, opened[0]) == 200  # its place is free at once
        again = initialize(ALICE)
        assert again.status_code == 200, again.text
        assert initialize(ALICE).status_code == 429
        assert [delete(BOB, r) for r in bobs] == [200, 200]
        assert initialize(ALICE).status_code == 429  # bob's ended sessions were his


def post_through_limit(inner: Any, idle: float | None) -> httpx.Response:
    """An initialize POSTed to `inner` behind a `SessionLimit` of 3 sessions, whose
    manager ends idle sessions after `idle` seconds."""
    manager = PrincipalSessionManager(
        SdkServer("t"), max_sessions_per_principal=3, session_idle_timeout=idle
    )
    transport = httpx.ASGITransport(app=SessionLimit(inner, manager))

    async def main() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/mcp", json=INITIALIZE)

    return anyio.run(main)


@pytest.mark.parametrize(
    ("idle", "said"),
    [(None, ""), (90.5, "; an idle one ends by itself after 90.5 s")],
)
def test_the_429_says_the_cap_and_when_an_idle_session_ends(idle: float | None, said: str) -> None:
    async def over_cap(scope: Scope, receive: Receive, send: Send) -> None:
        raise SessionLimitExceeded("alice")

    refused = post_through_limit(over_cap, idle)
    assert refused.status_code == 429
    assert refused.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32000, "message": cap_message(3, said)},
    }


def test_what_is_not_over_the_cap_passes_the_limit_unchanged() -> None:
    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        await PlainTextResponse("answered", 201)(scope, receive, send)

    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("not ours")

    answered = post_through_limit(answer, None)
    assert (answered.status_code, answered.text) == (201, "answered")
    with pytest.raises(RuntimeError, match="not ours"):
        post_through_limit(failing, None)
