"""A Redis store's URL as ``serve`` and ``shards`` open it: a password wherever tenants
could reach Redis, a password kept off the command line, and a form safe to print.

Redis holds every tenant's state, and whoever reaches its port with its password (or with
none, when it asks for none) reads and rewrites all of it. `resolve` therefore refuses,
in one line saying what to set, a ``redis://`` or ``rediss://`` URL with no password
whose host is not loopback, or is loopback while workspace commands share the host's
network (`workspace.sandbox.network`: they could connect to it), unless the operator
accepts it (`RedisSettings.allow_no_auth`, for a network they trust). A ``unix://``
socket is guarded by its file's mode; with the sandbox off, commands run as the server
itself and read whatever it can, a password included, so loopback is then taken as is. The password comes from the URL
(``redis://:PASSWORD@host`` for ``requirepass``, ``redis://USER:PASSWORD@host`` for an
ACL user, as redis-py reads it) or, for a URL without one, from the first line of
`RedisSettings.password_file`, so it need not be on the command line, where every local
user reads it (``ps``).

`redact` hides passwords (``redis://USER:***@host``) in a URL or in any message quoting
one; every message here that shows a URL shows it so. `check_credentials` asks Redis once
at startup, so that a missing or wrong password is one line then rather than a failure of
every call.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import parse_qs, quote, urlsplit

from ctxactors.settings import Settings

# A password in a URL's user part (up to the URL's last "@"; a user part with no colon is
# hidden whole: redis://PASSWORD@host is a common slip), or in a (ssl_)password= parameter.
_USERINFO = re.compile(
    r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/\s'\"]*)(?P<colon>:)?"
    r"(?(colon)[^\s'\"]*)@"
)
_PARAMETER = re.compile(r"(?P<head>[?&](?:ssl_)?password=)[^&#\s'\"]*", re.IGNORECASE)
_SCHEMES = ("redis://", "rediss://", "unix://")


def redact(text: str) -> str:
    """`text` (a URL, or a message that quotes URLs) with every password replaced by
    ``***``."""
    return _PARAMETER.sub(r"\g<head>***", _USERINFO.sub(_hidden, text))


def _hidden(match: re.Match[str]) -> str:
    user = f"{match['user']}:" if match["colon"] else ""
    return f"{match['head']}{user}***@"


def has_credentials(url: str) -> bool:
    """Whether redis-py would authenticate for `url`: a password in its user part or its
    parameters, or a TLS client certificate (``rediss://...?ssl_certfile=``)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    certificate = parts.scheme == "rediss" and bool(query.get("ssl_certfile"))
    return bool(parts.password) or bool(query.get("password")) or certificate


def with_password(url: str, password: str) -> str:
    """`url` with `password` in its user part (its user name, if any, kept)."""
    parts = urlsplit(url)
    user, _, _ = parts.netloc.rpartition("@")[0].partition(":")
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{user}:{quote(password, safe='')}@{host}"
    return parts._replace(netloc=netloc).geturl()


def is_loopback(host: str | None) -> bool:
    """Whether `host` names this machine's loopback interface (nothing else reaches it)."""
    if not host or host == "localhost":  # no host: redis-py connects to localhost
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def resolve(url: str, settings: Settings) -> str:
    """The URL to open for `url`: with the password file's password when it carries none;
    `ValueError` (one line, the URL redacted) for a Redis that would take no password where
    tenants could reach it (see the module doc)."""
    if not url.startswith(_SCHEMES):
        return url  # not Redis: the caller's own error names it (redacted)
    redis = settings.redis
    if redis.password_file is not None and not has_credentials(url):
        url = with_password(url, _read_password(redis.password_file))
    if has_credentials(url) or redis.allow_no_auth or url.startswith("unix://"):
        return url
    host = urlsplit(url).hostname
    sandbox = settings.workspace.sandbox
    shared = sandbox.mode == "bwrap" and sandbox.network
    if is_loopback(host) and not shared:
        return url
    where = (
        "on loopback, which workspace commands reach (workspace.sandbox.network is on)"
        if is_loopback(host)
        else f"on {host}, not this machine's loopback"
    )
    raise ValueError(
        f"{redact(url)} is a Redis without a password {where}: whoever connects reads and "
        "rewrites every tenant's state. Give Redis a password (requirepass, or an ACL user) "
        "and put it in the URL (redis://:PASSWORD@host, redis://USER:PASSWORD@host) or in "
        "CTXACTORS_REDIS_PASSWORD_FILE, or accept that on a network you trust with "
        "CTXACTORS_REDIS_ALLOW_NO_AUTH=1"
    )


def check_credentials(url: str, timeout: float = 5.0) -> None:
    """Ask Redis once (PING): `ValueError` (one line, redacted) when it wants a password
    that `url` lacks, or refuses the one it has. A Redis that can't be reached passes: the
    store's own errors say so, call by call, until it is back."""
    if not url.startswith(_SCHEMES):
        return
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        # (Without credentials Redis's own words are about HELLO or AUTH: noise here.)
        what = f"refused the credentials ({exc})" if has_credentials(url) else "asks for a password"
        raise ValueError(
            f"Redis at {redact(url)} {what}: give the password of requirepass or of an ACL "
            "user in the URL or in CTXACTORS_REDIS_PASSWORD_FILE"
        ) from None
    except redis.ResponseError as exc:  # NOPERM, or a password given to a Redis with none
        raise ValueError(f"Redis at {redact(url)} refused the connection: {exc}") from None
    except redis.RedisError:
        pass
    finally:
        client.close()


def _read_password(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            password = file.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ValueError(
            f"CTXACTORS_REDIS_PASSWORD_FILE: cannot read the Redis password file {path}: {reason}"
        ) from None
    if not password:
        raise ValueError(f"CTXACTORS_REDIS_PASSWORD_FILE: the Redis password file {path} is empty")
    return password
