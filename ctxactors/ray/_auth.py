"""Ray's own token authentication, required of every Ray a `RayBackend` starts or joins.

Anyone who can connect to a Ray cluster can run code on it (Ray runs the functions it is
sent), so a secret inside our own calls would protect nothing: a plain ``ray.init`` client
could call a shard, or run a task beside it, and read any tenant's state. Ray (2.52 and
later) has token authentication: with ``RAY_AUTH_MODE=token`` every gRPC request between
its processes, and every request to its dashboard, carries the cluster's token, and one
without it is refused (``Unauthenticated: InvalidAuthToken``). `prepare` turns it on for
this process, with a token, before ``ray.init``:

- Ray reads the token from ``RAY_AUTH_TOKEN``, else from the file ``RAY_AUTH_TOKEN_PATH``,
  else (with ``RAY_ENABLE_K8S_TOKEN_AUTH``) the pod's Kubernetes service account token,
  else ``~/.ray/auth_token`` (``AuthenticationTokenLoader::TryLoadTokenFromSources``).
  `RaySettings.token_file` (``CTXACTORS_RAY_TOKEN_FILE``) becomes ``RAY_AUTH_TOKEN_PATH``.
- Joining a cluster (an address, ``RAY_ADDRESS``, or one that ``ray start`` left on this
  machine) with no token from any of them is a `RayAuthError` saying what to set, before
  anything is sent to Ray.
- Starting one (``local``, or no address and none found): the operator's token if there
  is one, else a new one of 256 bits kept only in this process's environment, which the Ray
  processes it starts inherit. Nothing else can join it, and nothing is written to disk (Ray itself
  would write it to ``~/.ray/auth_token`` with the umask's mode).
- ``RAY_AUTH_MODE`` set to anything but ``token`` is refused, and so is a process that is
  already connected to a Ray without token authentication.
- A token shorter than 32 characters is refused (Ray's own are 64 hex digits), and so is a
  token file that is missing or empty: Ray would abort the whole process on it.

Ray reads all of this from the environment, so `prepare` sets it in this process's
(one Ray, one token a process, as with ``ray.init`` itself). A token is never logged nor
put in an error: they name where it came from.
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxactors.errors import CtxActorsError
from ctxactors.logs import lazy_logger
from ctxactors.settings import RaySettings

MIN_TOKEN_CHARS = 32
_WHITESPACE = " \t\n\r\f\v"  # what Ray trims from a token (TrimWhitespace)
_K8S_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
_TO_SET = (
    "set CTXACTORS_RAY_TOKEN_FILE (or --set ray.token_file=PATH) to a file holding the "
    "cluster's token, or give it as RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"
)

_log = lazy_logger("ctxactors.ray")


class RayAuthError(CtxActorsError, RuntimeError):
    """Ray can't be used with token authentication as configured; the message says what to
    set. Raised before anything is sent to Ray."""


@dataclass(frozen=True)
class Auth:
    """How this process is about to use Ray: `joining` a cluster or starting one, and where
    its token comes from (`source`: a variable or file name, or ``generated``)."""

    joining: bool
    source: str
    address: str | None  # what to give ray.init: see `trusted_address`


def prepare(address: str | None, settings: RaySettings) -> Auth:
    """Make ``ray.init(address=address)`` in this process use token authentication, with
    a token (see the module doc); `RayAuthError` when it can't."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.strip().lower() != "token":
        raise RayAuthError(
            f"RAY_AUTH_MODE is {mode!r}: ctxactors uses Ray only with token authentication "
            "(unset it, or set it to token)"
        )
    address = trusted_address(address)
    target = _bootstrap_address(address)
    source = _token_source(settings.token_file)
    if source is None:
        if target is not None:
            raise RayAuthError(f"joining the Ray cluster at {target} needs its token: {_TO_SET}")
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        source = "generated"
    os.environ["RAY_AUTH_MODE"] = "token"
    _reload_ray_config()
    return Auth(joining=target is not None, source=source, address=address)


def trusted_address(address: str | None) -> str | None:
    """`address`, or ``"local"`` (start a Ray of our own) where Ray would otherwise join the
    cluster named in its discovery file and that file is not this user's alone.

    With no address (or ``auto``) and no ``RAY_ADDRESS``, Ray joins the cluster a ``ray
    start`` wrote into ``<temp dir>/ray/ray_current_cluster``, under a world-writable
    ``/tmp`` by default: any local user could point it at a listener of theirs, which would
    then receive our token (and the shards' store URL). Trusted only when the file and its
    directory are ours and writable by no one else (nobody can swap it after the check)."""
    if os.environ.get("RAY_ADDRESS") or address not in (None, "auto"):
        return address
    from ray._common.utils import get_ray_address_file

    path = Path(get_ray_address_file(None))
    if not path.exists():
        # None starts a Ray; "auto" would join any cluster found among the processes.
        if address == "auto":
            raise RayAuthError(
                f"--ray-address auto: there is no {path} from a `ray start` of this user's; "
                "give the cluster's address"
            )
        return None
    if _only_ours(path) and _only_ours(path.parent):
        return address
    if address == "auto":
        raise RayAuthError(
            f"--ray-address auto: {path} (or its directory) belongs to another user or is "
            "writable by others, so it can't say which cluster to join; give the address"
        )
    _log.warning("ray_discovery_file_ignored", path=str(path))
    return "local"


def _only_ours(path: Path) -> bool:
    info = path.stat()
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def check_connected() -> None:
    """`RayAuthError` unless the Ray this process is already connected to uses tokens."""
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    if not is_token_auth_enabled():
        raise RayAuthError(
            "this process is already connected to a Ray without token authentication: "
            "ctxactors uses Ray only with RAY_AUTH_MODE=token"
        )


def start_options(settings: RaySettings) -> dict[str, Any]:
    """``ray.init``'s options for a Ray this process starts: the dashboard off unless asked
    for, and then on `settings.dashboard_host` (loopback by default); the node's address;
    a temp dir of its own inside one only this user can enter (Ray's default, ``/tmp/ray``,
    is writable by every local user, and holds the session's sockets, logs and spilled
    objects; Ray makes whatever temp dir it is given writable by all, hence the parent)."""
    options: dict[str, Any] = {
        "include_dashboard": settings.dashboard,
        "dashboard_host": settings.dashboard_host,
        "_temp_dir": str(Path(tempfile.mkdtemp(prefix="ctxactors-ray-")) / "ray"),
    }
    if settings.node_ip is not None:
        options["_node_ip_address"] = settings.node_ip
    return options


def _bootstrap_address(address: str | None) -> str | None:
    """The cluster ``ray.init(address=address)`` would join, or None when it would start one:
    Ray's own answer (``ray.init`` asks the same function), so the two never disagree."""
    from ray._private.services import canonicalize_bootstrap_address

    found: str | None = canonicalize_bootstrap_address(address)  # type: ignore[arg-type]
    return found  # (Ray's annotation says str; its body reads None as "find or start")


def _token_source(token_file: str | None) -> str | None:
    """Where Ray will read the token from (its order), checked; None when nowhere."""
    if token_file is not None:
        if os.environ.get("RAY_AUTH_TOKEN"):
            raise RayAuthError(
                "both CTXACTORS_RAY_TOKEN_FILE (ray.token_file) and RAY_AUTH_TOKEN give a Ray "
                "token, and Ray would use RAY_AUTH_TOKEN: give only one"
            )
        _check_file(token_file, "ray.token_file (CTXACTORS_RAY_TOKEN_FILE)")
        os.environ["RAY_AUTH_TOKEN_PATH"] = token_file
        return f"ray.token_file ({token_file})"
    if os.environ.get("RAY_AUTH_TOKEN"):
        _check_token(os.environ["RAY_AUTH_TOKEN"].strip(_WHITESPACE), "RAY_AUTH_TOKEN")
        return "RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        path = os.environ["RAY_AUTH_TOKEN_PATH"]
        _check_file(path, "RAY_AUTH_TOKEN_PATH")
        return f"RAY_AUTH_TOKEN_PATH ({path})"
    if os.environ.get("RAY_ENABLE_K8S_TOKEN_AUTH", "").strip().lower() in ("1", "true"):
        # Kubernetes RBAC mode: Ray sends the pod's service account token, which the
        # cluster checks with the Kubernetes API (Ray's k8s_constants.h names the file).
        if Path(_K8S_TOKEN).is_file() and _check_file(_K8S_TOKEN, "RAY_ENABLE_K8S_TOKEN_AUTH"):
            return f"RAY_ENABLE_K8S_TOKEN_AUTH ({_K8S_TOKEN})"
    default = Path(os.environ.get("HOME") or ".") / ".ray" / "auth_token"
    if default.exists() and _check_file(str(default), "~/.ray/auth_token", empty_ok=True):
        return str(default)
    return None  # (Ray's default file, absent or empty, holds no token)


def _check_file(path: str, label: str, empty_ok: bool = False) -> bool:
    """Whether the token file `path` holds a token (Ray reads its first line, trimmed);
    `RayAuthError` when it can't be read, or holds a token too short, or none (unless
    `empty_ok`): Ray would abort the process on a ``RAY_AUTH_TOKEN_PATH`` it can't read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            token = file.readline().strip(_WHITESPACE)
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise RayAuthError(
            f"{label}: cannot read the Ray token file {path}: {exc.strerror}"
        ) from None
    if not token:
        if empty_ok:
            return False
        raise RayAuthError(f"{label}: the Ray token file {path} is empty")
    _check_token(token, f"{label} ({path})")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        # Whoever reads it can run code on the cluster. Not refused: Kubernetes mounts
        # secrets 0644 by default, in a container of one user.
        _log.warning("ray_token_file_readable_by_others", path=path, mode=oct(mode & 0o777))
    return True


def _check_token(token: str, label: str) -> None:
    if len(token) < MIN_TOKEN_CHARS:
        raise RayAuthError(
            f"the Ray token in {label} is {len(token)} characters: use at least "
            f"{MIN_TOKEN_CHARS} (say, python3 -c 'import secrets; print(secrets.token_hex(32))')"
        )


def _reload_ray_config() -> None:
    """Make Ray's C++ side of this process see the mode and token just set: its config and
    token are read once and cached (Ray's own ``_enable_token_auth`` and test helpers
    refresh them the same way)."""
    # Both are compiled (Cython) classes the package's type stubs leave out.
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
