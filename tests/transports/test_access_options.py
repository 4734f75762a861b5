"""``ctxactors serve``'s access options, read in this process into `access.HttpSecurity`: the
Host names a bind accepts, the origins it allows, the refusals with their exact messages, and
the options' help; the same checks on a served app.

`test_http_auth` starts ``serve`` with these options as a subprocess and checks what a client
sees; mutation testing sees only code run in the test process, so here the options go
through `access.security_from_args` directly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx
import pytest
from in_process_support import WAIT, parse_serve_args, serve_in_process
from starlette.datastructures import Headers

from ctxactors import Runtime
from ctxactors.transports import access
from ctxactors.transports.auth import AuthConfigError, JwtVerifier, StaticTokens
from ctxactors.transports.guard import (
    LOOPBACK_HOSTS,
    RequestGuard,
    host_name,
    is_loopback,
    normalise_origin,
)

TOKEN = "t" * 32
ISSUER = "https://issuer.example"


@pytest.fixture
def tokens(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN} alice\n")
    return str(path)


def security(*argv: str) -> access.HttpSecurity:
    return access.security_from_args(parse_serve_args(*argv))


def refusal(*argv: str) -> str:
    with pytest.raises(AuthConfigError) as refused:
        security(*argv)
    return str(refused.value)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("tools.example", False),
        ("LOCALHOST", False),  # a name the resolver may map anywhere: only "localhost" is
        ("X127.0.0.1", False),
        ("", False),
    ],
)
def test_which_binds_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_an_origin_is_kept_as_a_browser_sends_it() -> None:
    assert normalise_origin(" HTTPS://App.Example:8443/ ") == "https://app.example:8443"
    assert normalise_origin("http://localhost:3000") == "http://localhost:3000"
    assert normalise_origin("https://[::1]:8443") == "https://[::1]:8443"


@pytest.mark.parametrize(
    "origin",
    [
        "ftp://app.example",
        "app.example",
        "https://",
        "https:///path",
        "https://app.example/path",
        "https://app.example?x=1",
        "https://app.example/#top",
        "https://user@app.example",
        "null",
    ],
)
def test_an_origin_that_is_not_scheme_host_port_is_refused(origin: str) -> None:
    with pytest.raises(AuthConfigError) as refused:
        normalise_origin(origin)
    assert str(refused.value) == f"--allow-origin {origin!r}: expected scheme://host[:port]"


@pytest.mark.parametrize(
    ("argv", "hosts"),
    [
        ((), LOOPBACK_HOSTS),  # 127.0.0.1 is among them already
        (("--host", "127.0.0.2"), (*LOOPBACK_HOSTS, "127.0.0.2")),
        (("--host", "::1"), LOOPBACK_HOSTS),
        (
            ("--host", "127.0.0.2", "--allow-host", "Tools.Example", "--allow-host", "localhost"),
            (*LOOPBACK_HOSTS, "127.0.0.2", "tools.example"),
        ),
        # Not loopback: Host is checked only when the operator names the hosts.
        (("--host", "0.0.0.0", "--insecure-no-auth"), None),
        (("--host", "0.0.0.0", "--insecure-no-auth", "--allow-host", "A.example"), ("a.example",)),
        (("--host", "::", "--insecure-no-auth", "--allow-host", "a.example"), ("a.example",)),
        (("--host", "", "--insecure-no-auth", "--allow-host", "a.example"), ("a.example",)),
        (
            ("--host", "10.1.2.3", "--insecure-no-auth", "--allow-host", "a.example"),
            ("a.example", "10.1.2.3"),
        ),
        (
            ("--host", "fd00::5", "--insecure-no-auth", "--allow-host", "a.example"),
            ("a.example", "[fd00::5]"),
        ),
    ],
)
def test_the_host_names_a_bind_accepts(argv: tuple[str, ...], hosts: tuple[str, ...]) -> None:
    assert security(*argv).allowed_hosts == hosts


def test_what_the_options_build(tokens: str) -> None:
    built = security(
        "--host",
        "0.0.0.0",
        "--auth-tokens",
        tokens,
        "--allow-origin",
        "https://App.example",
        "--max-sessions-per-principal",
        "3",
        "--max-actors-per-principal",
        "1",
    )
    assert isinstance(built.verifier, StaticTokens)
    assert (built.allowed_hosts, built.allowed_origins) == (None, ("https://app.example",))
    assert (built.auth, built.max_sessions_per_principal, built.operators) == (None, 3, frozenset())
    assert security("--host", "0.0.0.0", "--insecure-no-auth").verifier is None


def test_jwt_options_publish_metadata_at_the_servers_url(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = tmp_path / "public.pem"
    pem.write_bytes(
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    jwt = ("--jwt-public-key", str(pem), "--jwt-issuer", ISSUER, "--jwt-audience", "tools")
    for argv, resource in (
        (("--port", "8080"), "http://127.0.0.1:8080"),
        (("--host", "::1", "--port", "8080"), "http://[::1]:8080"),
        (("--public-url", "https://tools.example/api"), "https://tools.example/api"),
    ):
        built = security(*jwt, *argv)
        assert built.auth is not None
        assert (str(built.auth.issuer_url), str(built.auth.resource_server_url)) == (
            ISSUER,
            resource,
        )
        assert str(built.resource_metadata_url) == (
            "https://tools.example/.well-known/oauth-protected-resource/api"
            if resource.endswith("/api")
            else f"{resource}/.well-known/oauth-protected-resource"
        )
    # An issuer that is no URL has no metadata to publish.
    plain = ("--jwt-public-key", str(pem), "--jwt-issuer", "idp", "--jwt-audience", "tools")
    assert security(*plain).auth is None
    assert security(*plain).resource_metadata_url is None


def test_options_that_cant_be_used_together_say_why(tokens: str) -> None:
    jwt = ("--jwt-issuer", ISSUER, "--jwt-audience", "tools", "--jwt-jwks-url", "https://i/j")
    assert refusal("--transport", "stdio", "--auth-tokens", tokens) == (
        "authentication options are for --transport http"
    )
    assert (
        refusal("--transport", "stdio", *jwt) == "authentication options are for --transport http"
    )
    assert refusal("--auth-tokens", tokens, "--max-sessions-per-principal", "0") == (
        "--max-sessions-per-principal must be at least 1"
    )
    assert refusal("--auth-tokens", tokens, "--max-actors-per-principal", "-1") == (
        "--max-actors-per-principal must be at least 1"
    )
    assert refusal("--max-actors-per-principal", "2") == (
        "--max-actors-per-principal needs authentication (principals come from tokens): give "
        "--auth-tokens or the --jwt-* options"
    )
    assert refusal("--max-sessions-per-principal", "2") == (
        "--max-sessions-per-principal needs authentication (principals come from tokens): give "
        "--auth-tokens or the --jwt-* options"
    )
    assert refusal("--host", "10.1.2.3") == (
        "--host 10.1.2.3 is not a loopback address and no authentication is configured: anyone "
        "who can connect would run every tool, shell commands included. Give --auth-tokens FILE "
        "or the --jwt-* options (or, on a network you trust completely, --insecure-no-auth)"
    )
    assert refusal("--auth-tokens", tokens, "--insecure-no-auth") == (
        "--insecure-no-auth contradicts the authentication options"
    )
    assert refusal("--auth-tokens", tokens, *jwt) == (
        "give either --auth-tokens or the --jwt-* options, not both"
    )
    for option, value in (("--jwt-public-key", "k.pem"), ("--jwt-audience", "tools")):
        assert refusal("--auth-tokens", tokens, option, value) == (
            "give either --auth-tokens or the --jwt-* options, not both"
        )


def test_a_jwks_url_and_a_principal_claim_reach_the_verifier() -> None:
    built = security(
        "--jwt-jwks-url",
        "https://idp.example/jwks.json",
        "--jwt-issuer",
        ISSUER,
        "--jwt-audience",
        "tools",
        "--jwt-principal-claim",
        "email",
    )
    verifier = built.verifier
    assert isinstance(verifier, JwtVerifier) and verifier.jwks is not None
    assert (verifier.jwks.uri, verifier.issuer, verifier.audience, verifier.principal_claim) == (
        "https://idp.example/jwks.json",
        ISSUER,
        "tools",
        "email",
    )


# -- what a web page could send -------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "name"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("LocalHost:8765", "localhost"),
        ("[::1]", "[::1]"),
        ("[::1]:80", "[::1]"),
        ("[::1", None),
        ("[::1]80", None),
        ("[::1]:", None),
        ("[::1]x]", None),
        ("tools.example:x", None),
        ("tools.example:x1", None),
        ("tools.example:", None),
        ("a:1:2", None),
        (":80", None),
        ("", None),
    ],
)
def test_the_name_part_of_a_host_header(host: str, name: str | None) -> None:
    assert host_name(host) == name


def guard_refusal(
    method: str, hosts: tuple[str, ...] | None = LOOPBACK_HOSTS, **headers: str
) -> tuple[int, str, str] | None:
    guard = RequestGuard(lambda *_: None, hosts, ("https://app.example",))  # type: ignore[arg-type]
    return guard.refusal(method, Headers({k.replace("_", "-"): v for k, v in headers.items()}))


def test_a_foreign_host_is_refused_naming_it() -> None:
    def refused(shown: str) -> tuple[int, str, str]:
        return (
            421,
            "host_not_allowed",
            f"Host {shown!r} is not a name of this server (DNS-rebinding protection); an "
            "operator behind a proxy adds it with --allow-host",
        )

    assert guard_refusal("GET", host="evil.example") == refused("evil.example")
    assert guard_refusal("GET") == refused("")  # no Host at all
    long = "e" * 300
    assert guard_refusal("GET", host=long) == refused("e" * 200)  # the name is cut for the log
    assert guard_refusal("GET", host="LOCALHOST:1") is None
    assert guard_refusal("GET", hosts=None, host="evil.example") is None  # no Host check


def test_a_foreign_origin_is_refused_naming_it() -> None:
    assert guard_refusal("GET", host="localhost", origin="https://evil.example") == (
        403,
        "origin_not_allowed",
        "cross-origin requests from 'https://evil.example' are refused; the operator allows "
        "an origin with --allow-origin",
    )
    evil = "https://" + "e" * 300
    refused = guard_refusal("GET", host="localhost", origin=evil)
    assert refused is not None and repr(evil[:200]) in refused[2] and evil[:201] not in refused[2]
    assert guard_refusal("GET", host="localhost", origin="HTTPS://APP.example") is None
    assert guard_refusal("GET", host="localhost") is None  # not from a page


def test_a_post_that_is_not_json_is_refused() -> None:
    refused = (415, "unsupported_media_type", "a POST needs Content-Type: application/json")
    assert guard_refusal("POST", host="localhost") == refused
    assert guard_refusal("POST", host="localhost", content_type="text/plain") == refused
    for media_type in ("application/json", "Application/JSON; charset=utf-8; x=y"):
        assert guard_refusal("POST", host="localhost", content_type=media_type) is None
    assert guard_refusal("DELETE", host="localhost") is None


HELP = """\
HTTP access:
  who may reach --transport http (docs/serving.md: Deploying on a network)

  --auth-tokens FILE    bearer tokens, one 'token principal' a line
  --jwt-public-key FILE
                        accept JWTs signed by this PEM public key
  --jwt-jwks-url URL    accept JWTs signed by a key this JWKS serves
  --jwt-issuer ISS      the JWTs' required iss
  --jwt-audience AUD    the JWTs' required aud
  --jwt-principal-claim CLAIM
                        default: sub
  --public-url URL      this server's URL as clients reach it, for the protected-resource metadata
                        (default http://HOST:PORT)
  --allow-origin ORIGIN
                        repeatable
  --allow-host NAME     a Host name clients use besides the bind address (a proxy's); repeatable
  --max-actors-per-principal N
                        live actors of one principal
  --max-sessions-per-principal N
                        open MCP sessions of one (default: http.max_sessions_per_principal, 100)
  --insecure-no-auth    serve a non-loopback address without authentication (anyone who can
                        connect runs every tool)
"""


def test_the_options_help_says_what_each_one_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps to the terminal's width
    parser = argparse.ArgumentParser(prog="serve")
    access.add_arguments(parser)
    assert parser.format_help().split("\n\n", 2)[2] == HELP
    defaults = parser.parse_args([])
    assert (defaults.jwt_principal_claim, defaults.allow_origin, defaults.allow_host) == (
        "sub",
        [],
        [],
    )
    assert defaults.insecure_no_auth is False
    assert parser.parse_args(["--max-actors-per-principal", "7"]).max_actors_per_principal == 7


# -- the same checks on a served app ---------------------------------------------------------


def test_a_served_app_refuses_what_a_page_could_send_and_lets_an_allowed_origin_in() -> None:
    flags = ("--allow-origin", "https://app.example", "--allow-host", "tools.example")
    with (
        serve_in_process(*flags) as served,
        httpx.Client(base_url=served.url, timeout=WAIT) as http,
    ):

        def create(goal: str, **headers: str) -> httpx.Response:
            return http.post(
                "/api/v1/tools/create_goal",
                json={"goal": goal},
                headers={"X-Session-Id": "web", **headers},
            )

        def error(response: httpx.Response) -> tuple[int, str]:
            return response.status_code, response.json()["error"]["code"]

        assert error(create("a", Host="evil.example")) == (421, "host_not_allowed")
        assert error(create("b", Origin="https://evil.example")) == (403, "origin_not_allowed")
        simple = http.post(
            "/api/v1/tools/create_goal",
            content=b'{"goal": "c"}',
            headers={"Content-Type": "text/plain", "X-Session-Id": "web"},
        )
        assert simple.json() == {
            "error": {
                "code": "unsupported_media_type",
                "message": "a POST needs Content-Type: application/json",
            }
        }
        assert simple.status_code == 415
        # /mcp too, before the SDK sees anything.
        mcp = http.post("/mcp", json={}, headers={"Host": "evil.example:80"})
        assert error(mcp) == (421, "host_not_allowed")
        assert create("by a proxy", Host="Tools.Example:443").status_code == 200
        allowed = create("from the app", Origin="https://app.example")
        assert allowed.status_code == 200, allowed.text
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        assert allowed.headers["access-control-expose-headers"] == (
            "Mcp-Session-Id, X-Session-Id, WWW-Authenticate"
        )
        preflight = http.options(
            "/api/v1/tools/create_goal",
            headers={
                "Origin": "https://app.example",
                "Access-Control-Request-Method": "DELETE",
                "Access-Control-Request-Headers": "authorization, mcp-session-id, x-thread-id",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-methods"] == "GET, POST, DELETE"
        assert preflight.headers["access-control-allow-headers"] == (
            "Accept, Accept-Language, Authorization, Content-Language, Content-Type, "
            "Last-Event-ID, Mcp-Protocol-Version, Mcp-Session-Id, X-Assistant-Id, "
            "X-Session-Id, X-Thread-Id"
        )
        put = http.options(
            "/api/v1/tools/create_goal",
            headers={"Origin": "https://app.example", "Access-Control-Request-Method": "PUT"},
        )
        assert (put.status_code, put.text) == (400, "Disallowed CORS method")
        assert goals(served.runtime, "web") == ["by a proxy", "from the app"]


def goals(runtime: Runtime, session: str) -> list[str]:
    state = runtime.call("get_planning_state", {"__sessionId": session})
    assert state.structured is not None
    return [g["goal"] for g in state.structured["goals"]]


def test_the_guard_compares_host_names_in_lower_case() -> None:
    guard = RequestGuard(lambda *_: None, ("Tools.Example",), ())  # type: ignore[arg-type]
    assert guard.refusal("GET", Headers({"host": "TOOLS.example:8443"})) is None
    assert guard.refusal("GET", Headers({"host": "other.example"})) is not None
    # Without a Host check, any Host passes, and origins are still checked.
    open_guard = RequestGuard(lambda *_: None, None, ())  # type: ignore[arg-type]
    assert open_guard.refusal("GET", Headers({"host": "any.example"})) is None
    refused = open_guard.refusal("GET", Headers({"host": "a", "origin": "https://b"}))
    assert refused is not None and refused[0] == 403
