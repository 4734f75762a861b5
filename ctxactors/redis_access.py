"""Who may reach the Redis that ``serve`` and ``shards`` keep every tenant's state in.

Whoever reaches Redis and is let in reads and rewrites all of it, so `prepare` opens a Redis
store only when Redis turns strangers away, and refuses to start otherwise, in one line
saying what to set:

- A ``redis://`` or ``rediss://`` URL needs credentials (a password, or a TLS client
  certificate), loopback included: every local user can connect to loopback.
- A ``unix://`` socket is guarded by its file instead: without credentials it is taken when
  others can't open it (no write permission for others on the socket, or a directory above
  it that others can't search). Its group may open it: keep that group to Redis's clients.
- With credentials, Redis is asked twice at startup: once with them (a missing, wrong or
  needless password is one line then, not a failure of every call), and once on a fresh
  connection without them, which must be refused (``NOAUTH``): a Redis whose default user
  is still on without a password lets anyone in, whatever password ctxactors uses. (Not
  asked for a socket others can't open: its file is the guard.) A Redis that can't be
  reached is not refused: the store's errors say so, call by call, until it is back.

`RedisSettings.allow_no_auth` accepts a Redis that lets strangers in, for a network the
operator trusts, with a warning at every start. The password comes from the URL or from the
first line of `RedisSettings.password_file`; a password on the command line is visible to
every local user (``ps``), and a password file others may read is too, so the first gets a
warning and the second is refused (its group may read it, with a warning: a service's
group is the usual way to share it). Every message shows URLs redacted
(`ctxactors.redis_url`).
"""

from __future__ import annotations

import grp
import ipaddress
import os
import stat
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ctxactors.logs import get_logger
from ctxactors.redis_url import (
    SCHEMES,
    has_credentials,
    has_password,
    redact,
    remember,
    remember_secret,
    shape_error,
    with_password,
)
from ctxactors.settings import Settings

_ADVICE = (
    "give Redis a password (requirepass, or an ACL user) and put it in "
    "CTXACTORS_REDIS_PASSWORD_FILE or the URL (USER:PASSWORD@ before the host), or use a "
    "unix:// socket others can't open; or accept this on a network you trust with "
    "CTXACTORS_REDIS_ALLOW_NO_AUTH=1"
)
_GIVE_IT = (
    "give the password of requirepass or of an ACL user in the URL or in "
    "CTXACTORS_REDIS_PASSWORD_FILE"
)


def prepare(url: str, settings: Settings, *, timeout: float = 5.0) -> str:
    """The URL to open for `url` (``--store``): with the password file's password when it
    carries none, once Redis is shown to turn strangers away (see the module doc);
    `ValueError` (one line, URLs redacted) otherwise. Any other store passes unchanged.
    Warnings (a password on the command line, a password file its group may read, a Redis
    accepted by `allow_no_auth`) are logged once the checks pass."""
    remember(url)  # whatever the scheme: an error about a mistyped one shows no password
    if not url.startswith(SCHEMES):
        return url  # not Redis: the caller's own error names it (redacted)
    wrong = shape_error(url)
    if wrong is not None:
        raise ValueError(wrong)
    warnings: list[tuple[str, dict[str, Any]]] = []
    if has_password(url):
        warnings.append(("redis_password_on_command_line", {"advice": _COMMAND_LINE}))
    redis = settings.redis
    if redis.password_file is not None and not has_credentials(url):
        url = with_password(url, _read_password(redis.password_file, warnings))
    problem = _unguarded(url)
    if problem is not None and not redis.allow_no_auth:
        raise ValueError(
            f"{problem}: whoever connects reads and rewrites every tenant's state. To fix, "
            f"{_ADVICE}"
        )
    if _ping(url, timeout, warnings):
        if problem is None and not _private_socket(url):
            problem = _stranger_let_in(url, timeout, redis.allow_no_auth)
    if problem is not None:  # accepted: `allow_no_auth`
        warnings.append(("redis_no_auth_allowed", {"why": problem}))
    log = get_logger("ctxactors.redis")
    for event, fields in warnings:
        log.warning(event, store=redact(url), **fields)
    return url


_COMMAND_LINE = (
    "the --store URL holds the Redis password, which every local user can read on the "
    "command line (ps): give the URL without it and the password in redis.password_file "
    "(CTXACTORS_REDIS_PASSWORD_FILE)"
)


def _unguarded(url: str) -> str | None:
    """Why nothing guards the Redis at `url` (after the password file), or None: a TCP URL
    without credentials, or a unix socket without them that others may open. (With
    credentials, `_stranger_let_in` asks Redis whether they are needed.)"""
    if has_credentials(url):
        return None
    if url.startswith("unix://"):
        exposure = _socket_exposure(urlsplit(url).path)
        return None if exposure is None else f"{exposure}, and the URL gives no password"
    host = urlsplit(url).hostname
    where = (
        "on loopback, which every user and process of this machine can connect to"
        if _is_loopback(host)
        else f"on {host}, which whoever reaches that address can connect to"
    )
    return f"{redact(url)} is a Redis without a password {where}"


def _private_socket(url: str) -> bool:
    return url.startswith("unix://") and _socket_exposure(urlsplit(url).path) is None


def _socket_exposure(path: str) -> str | None:
    """Why users other than the socket's owner and group may open the Redis socket at
    `path` (None: they may not). Connecting needs write permission on the socket and search
    permission on every directory above it."""
    try:
        real = Path(os.path.realpath(path))
        mode = real.stat().st_mode
    except OSError as exc:
        return f"cannot tell who may open the Redis socket {path}: {exc.strerror}"
    if not stat.S_ISSOCK(mode):
        return f"{path} is not a socket"
    if not mode & stat.S_IWOTH:
        return None
    for directory in real.parents:
        if not directory.stat().st_mode & stat.S_IXOTH:
            return None  # others can't get to it
    return f"every user of this machine may open the Redis socket {path} (mode {stat.S_IMODE(mode):04o})"


def _is_loopback(host: str | None) -> bool:
    """Whether `host` names this machine's loopback interface."""
    if not host or host == "localhost":  # no host: redis-py connects to localhost
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _ping(url: str, timeout: float, warnings: list[tuple[str, dict[str, Any]]]) -> bool:
    """Ask Redis once (PING) with `url`'s credentials, if any: whether it answered;
    `ValueError` when it wants a password `url` lacks, refuses the one it has, or has
    none to check it against."""
    import redis

    shown = redact(url)
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        client.ping()
        return True
    except redis.AuthenticationError as exc:
        words = str(exc)
        if not has_credentials(url):  # (Redis's own words are about HELLO or AUTH: noise)
            raise ValueError(f"Redis at {shown} asks for a password: {_GIVE_IT}") from None
        if "without any password configured" in words or "no password is set" in words:
            raise ValueError(_NO_PASSWORD_SET.format(shown=shown)) from None
        raise ValueError(
            f"Redis at {shown} refused the credentials ({words}): {_GIVE_IT}"
        ) from None
    except redis.ResponseError as exc:  # NOPERM
        raise ValueError(f"Redis at {shown} refused the connection: {exc}") from None
    except redis.RedisError as exc:
        warnings.append(("redis_unchecked", {"why": f"not reached at startup: {redact(str(exc))}"}))
        return False
    finally:
        client.close()


def _stranger_let_in(url: str, timeout: float, allow_no_auth: bool) -> str | None:
    """Why Redis lets in a client without `url`'s credentials, or None when it refuses it;
    `ValueError` for the first unless `allow_no_auth`."""
    import redis

    pool = redis.ConnectionPool.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    answer = _stranger_answer(pool)
    if answer is None:
        return None
    if answer == "PONG" and not pool.connection_kwargs.get("username") and has_password(url):
        # The password was the default user's, which takes any password or none.
        raise ValueError(_NO_PASSWORD_SET.format(shown=redact(url)))
    problem = f"Redis at {redact(url)} lets in a client that gives no password ({answer})"
    if allow_no_auth:
        return problem
    raise ValueError(
        f"{problem}: its default user is on without a password, so whoever reaches it "
        "reads and rewrites every tenant's state. To fix, turn the default user off "
        "(ACL SETUSER default off, or 'user default off' in redis.conf) or give it a "
        "password (requirepass); or accept this on a network you trust with "
        "CTXACTORS_REDIS_ALLOW_NO_AUTH=1"
    )


_NO_PASSWORD_SET = (
    "Redis at {shown} has no password set, but one was given: set it in Redis "
    "(requirepass PASSWORD, or an ACL user with it: docs/durable-state.md)"
)


_CREDENTIALS = ("username", "password", "credential_provider", "ssl_certfile", "ssl_keyfile")


def _stranger_answer(pool: Any) -> str | None:
    """What Redis answers a PING on a fresh connection to `pool`'s server without its
    credentials (no AUTH, no client certificate): None when it refuses it (NOAUTH, or a TLS
    handshake without a certificate), else its answer."""
    import redis

    options = {k: v for k, v in pool.connection_kwargs.items() if k not in _CREDENTIALS}
    stranger = redis.ConnectionPool(connection_class=pool.connection_class, **options)
    try:
        redis.Redis(connection_pool=stranger).ping()
        return "PONG"
    except redis.AuthenticationError:
        return None  # NOAUTH
    except redis.ResponseError as exc:  # NOPERM: let in, with fewer rights
        return str(exc)
    except redis.RedisError:
        return None  # refused before any command (a client certificate is required)
    finally:
        stranger.disconnect()


def _read_password(path: str, warnings: list[tuple[str, dict[str, Any]]]) -> str:
    """The first line of the password file at `path`; `ValueError` when it can't be read, is
    empty, or others may read it."""
    try:
        with open(path, encoding="utf-8") as file:
            mode = os.fstat(file.fileno())
            password = file.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ValueError(
            f"CTXACTORS_REDIS_PASSWORD_FILE: cannot read the Redis password file {path}: {reason}"
        ) from None
    if not password:
        raise ValueError(f"CTXACTORS_REDIS_PASSWORD_FILE: the Redis password file {path} is empty")
    remember_secret(password)
    bits = stat.S_IMODE(mode.st_mode)
    if bits & stat.S_IROTH:
        raise ValueError(
            f"CTXACTORS_REDIS_PASSWORD_FILE: every user of this machine may read the Redis "
            f"password file {path} (mode {bits:04o}): chmod o-r {path} (0600, or 0640 for a "
            "group of the server's own)"
        )
    if bits & stat.S_IRGRP:
        group = _group_name(mode.st_gid)
        warnings.append(
            (
                "redis_password_file_group_readable",
                {
                    "path": path,
                    "mode": f"{bits:04o}",
                    "group": group,
                    "advice": f"every member of group {group} may read the Redis password: "
                    "keep that group to the server's own users, or chmod g-r",
                },
            )
        )
    return password


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
