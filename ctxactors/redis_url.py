"""A Redis URL's credentials: where redis-py finds them, and a form of any message that
shows none of them.

redis-py reads a password from a URL's user part (``redis://:PASSWORD@host`` for
``requirepass``, ``redis://USER:PASSWORD@host`` for an ACL user; percent-encoded, as
`urllib.parse` splits it) or from a ``password=`` parameter. `redact` hides them in a URL
or in any message that quotes one, however odd the password: a parser can't be trusted
with that (``urlsplit`` ends the address at a raw ``/``, ``?`` or ``#`` inside a
password, then finds no password at all), so a user part is taken to run from ``://`` to
the last ``@`` before the next URL that a host follows, and is hidden whole unless it is plainly ``USER:``
and a password. Hiding too much there costs a less useful message; hiding too little
would leak the password. The passwords `remember` was given (those of the store this
process opens) are hidden wherever they appear as well, in every form redis-py or a
message may show them. Checking who Redis lets in is `ctxactors.redis_access`.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, quote, unquote, urlsplit

SCHEMES = ("redis://", "rediss://", "unix://")

# Where a URL begins in a message: a scheme at the start or after a space, quote, bracket,
# comma or "=" (not after ":" or "/", as inside a password such as "a://b").
_URL_START = re.compile(r"(?:^|(?<=[\s'\"(\[<{,=]))[A-Za-z][A-Za-z0-9+.-]*://")
# The "@" that ends a user part is followed by a host (or, in unix://:PW@/path, a path).
_HOST_AFTER_AT = re.compile(r"@(?=[A-Za-z0-9\[/%_.-])")
_PLAIN_USER = re.compile(r"[A-Za-z0-9._~-]*")
_PARAMETER = re.compile(r"(?P<head>[?&](?:ssl_)?password=)[^&\s'\"]*", re.IGNORECASE)
_SECRETS: set[str] = set()
# Shorter remembered passwords are not searched for in messages (they would match ordinary
# words); the user part and parameter rules above still hide them inside a URL.
_MIN_SECRET = 4


def redact(text: str) -> str:
    """`text` (a URL, or a message that quotes URLs) with every password replaced by
    ``***``."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, "***")
    starts = [m.end() for m in _URL_START.finditer(text)]
    if starts:
        pieces = [text[: starts[0]]]
        for start, end in zip(starts, [*starts[1:], len(text)], strict=True):
            pieces.append(_hide_user_part(text[start:end]))
        text = "".join(pieces)
    return _PARAMETER.sub(r"\g<head>***", text)


def _hide_user_part(rest: str) -> str:
    """`rest` (what follows a URL's ``://``, to the next URL) with its user part hidden."""
    ats = [m.start() for m in _HOST_AFTER_AT.finditer(rest)]
    if not ats:
        return rest
    at = ats[-1]
    user, colon, _ = rest[:at].partition(":")
    shown = f"{user}:***" if colon and _PLAIN_USER.fullmatch(user) else "***"
    return shown + rest[at:]


def remember(url: str) -> None:
    """Hide the passwords of `url` (user part and parameters) in every later `redact`."""
    rest = url.partition("://")[2]
    user_part = rest[: rest.rfind("@")] if "@" in rest else ""
    # A user part with no colon is a user name to redis-py: not searched for (a name such as
    # "ctxactors" is in many messages); as a password slipped there, the rules hide it.
    _, colon, password = user_part.partition(":")
    found = [password] if colon else []
    found += re.findall(r"[?&](?:ssl_)?password=([^&]*)", rest, re.IGNORECASE)
    for secret in found:
        remember_secret(secret)
        remember_secret(unquote(secret))


def remember_secret(secret: str) -> None:
    """Hide `secret` (raw and percent-encoded) in every later `redact`."""
    for form in (secret, quote(secret, safe=""), quote(secret)):
        if len(form) >= _MIN_SECRET:
            _SECRETS.add(form)


def shape_error(url: str) -> str | None:
    """Why redis-py would read `url`'s address and password wrongly (a raw ``/``, ``?`` or
    ``#`` in the password ends the address there), or None."""
    scheme, _, rest = url.partition("://")
    netloc = urlsplit(url).netloc
    if scheme == "unix" and netloc and not netloc.endswith("@"):
        return (
            f"{redact(url)}: a socket's URL is unix:///ABSOLUTE/PATH (unix://:PASSWORD@/PATH "
            "with a password, percent-encoded)"
        )
    if not ("@" in rest and rest.rfind("@") >= len(netloc)):
        return None
    return (
        f"{redact(url)}: the password holds a raw '/', '?' or '#', which end a URL's "
        "address: percent-encode it (%2F, %3F, %23) or put it in CTXACTORS_REDIS_PASSWORD_FILE"
    )


def has_password(url: str) -> bool:
    """Whether `url` carries a password (user part or parameter), as redis-py reads it."""
    parts = urlsplit(url)
    return bool(parts.password) or bool(parse_qs(parts.query).get("password"))


def has_credentials(url: str) -> bool:
    """Whether redis-py would authenticate for `url`: a password in its user part or its
    parameters, or a TLS client certificate (``rediss://...?ssl_certfile=``)."""
    parts = urlsplit(url)
    certificate = parts.scheme == "rediss" and bool(parse_qs(parts.query).get("ssl_certfile"))
    return has_password(url) or certificate


def with_password(url: str, password: str) -> str:
    """`url` with `password` in its user part (its user name, if any, kept)."""
    parts = urlsplit(url)
    user, _, _ = parts.netloc.rpartition("@")[0].partition(":")
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{user}:{quote(password, safe='')}@{host}"
    return parts._replace(netloc=netloc).geturl()
