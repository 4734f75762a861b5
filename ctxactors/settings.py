"""Every limit of a runtime in one typed, frozen object: `Settings`.

A runtime takes its settings at construction (``Runtime(settings=...)``; by default
`Settings.from_env()`, read then, not at import) and each server reads its limits from the
runtime it serves, so two runtimes in one process can hold different limits.

The type is the single source of truth: each field's constraint (``msgspec.Meta``) is
checked by `validate` and by `from_env`, and a field that an environment variable sets names
it in its metadata (`var`), so a refusal and a bad value can name the variable. A bad value
fails loudly, naming the variable: a limit that silently fell back to its default on a typo
would look configured and not be.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal, NamedTuple, TypeVar

import msgspec
import msgspec.inspect as mi

G = TypeVar("G", bound="Group")

# Parses a variable's raw text (None when unset or blank) to a field value, or _UNSET.
Parser = Callable[[str, "str | None"], Any]
_UNSET: Any = object()


def var(name: str, parse: Parser | None = None) -> msgspec.Meta:
    """Field metadata: the variable that sets the field (and how its text is read)."""
    return msgspec.Meta(extra={"env": name, "parse": parse})


Count = Annotated[int, msgspec.Meta(ge=1)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]


class Cap(NamedTuple):
    """A configured limit with the variable that sets it, so a refusal can name both."""

    setting: str
    value: int

    def exceeded(self, what: str) -> str:
        """A refusal: ``"<what>: the limit is 100 (CTXACTORS_...)"``."""
        return f"{what}: the limit is {self.value:,} ({self.setting})"


class Group(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A set of settings; `from_env` reads the variables its fields name."""

    @classmethod
    def from_env(cls: type[G], environ: Mapping[str, str] | None = None) -> G:
        """The defaults, with every variable that is set (and not blank) read; a bad value
        raises `ValueError` naming the variable."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in _fields(cls):
            kind = field.type
            if isinstance(kind, mi.StructType) and issubclass(kind.cls, Group):
                values[field.name] = kind.cls.from_env(environ)
            elif (found := _variable(kind)) is not None:
                value = _read(_value_type(kind), *found, environ.get(found[0]))
                if value is not _UNSET:
                    values[field.name] = value
        return validate(cls(**values))

    def cap(self, field: str) -> Cap:
        """The limit `field` as a `Cap` that names its variable."""
        return Cap(variables(type(self))[field], getattr(self, field))


def _variable(kind: Any) -> tuple[str, Parser | None] | None:
    """The variable a field's type names in its metadata (and its parser), if any."""
    extra = kind.extra if isinstance(kind, mi.Metadata) else None
    return (extra["env"], extra.get("parse")) if extra and "env" in extra else None


def _read(kind: Any, name: str, parse: Parser | None, raw: str | None) -> Any:
    text = raw.strip() if raw is not None and raw.strip() else None
    if parse is not None:
        return parse(name, text)
    if text is None:
        return _UNSET
    number = int if isinstance(kind, mi.IntType) else float
    try:
        value = number(text)
    except ValueError:
        what = "an integer" if number is int else "a number"
        raise ValueError(f"{name} must be {what}, got {raw!r}") from None
    problem = _bound_problem(kind, value)
    if problem is not None:
        shown = str(value) if number is int else repr(raw)
        raise ValueError(f"{name} must be {problem}, got {shown}")
    return value


def _bound_problem(kind: Any, value: Any) -> str | None:
    """What `value` must be to meet the bounds of a numeric type, or None if it does."""
    ge, gt, le = getattr(kind, "ge", None), getattr(kind, "gt", None), getattr(kind, "le", None)
    if ge is not None and not value >= ge:
        return f"at least {ge}"
    if le is not None and not value <= le:
        return f"at most {le}"
    if gt is not None and not value > gt:
        return "positive" if gt == 0 else f"above {gt}"
    return None


@functools.cache
def _fields(cls: type[Group]) -> tuple[mi.Field, ...]:
    """The fields of `cls` as msgspec describes them. Cached: the description evaluates every
    annotation each time (about 1 ms a group), and every runtime validates its settings, so
    ``ctxactors serve`` spent about 70 ms of its startup (a third of it) here."""
    return tuple(mi.type_info(cls).fields)  # type: ignore[attr-defined]


@functools.cache
def variables(cls: type[Group]) -> dict[str, str]:
    """Field name -> the variable that sets it, for the fields of `cls` that have one."""
    out: dict[str, str] = {}
    for field in _fields(cls):
        found = _variable(field.type)
        if found is not None:
            out[field.name] = found[0]
    return out


def fields(cls: type[Group], prefix: str = "") -> list[tuple[str, str | None, Any]]:
    """Every setting of `cls`, nested ones included: ``(dotted name, variable, default)``."""
    out: list[tuple[str, str | None, Any]] = []
    names = variables(cls)
    for field in _fields(cls):
        if isinstance(field.type, mi.StructType) and issubclass(field.type.cls, Group):
            out += fields(field.type.cls, f"{prefix}{field.name}.")
        else:
            out.append((prefix + field.name, names.get(field.name), field.default))
    return out


def assign(settings: G, assignments: Iterable[str], *, source: str = "--set") -> G:
    """`settings` with ``NAME=VALUE`` assignments applied (dotted names, as in the docs' limits
    table: ``content.max_items=10``); each value is read as its variable's would be, and a
    bad one raises `ValueError` naming it (``--set content.max_items must be ...``)."""
    for item in assignments:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{source} {item!r}: expected NAME=VALUE")
        label = f"{source} {name.strip()}"
        settings = _assign(settings, name.strip().split("."), text, label)
    return validate(settings)


def _assign(group: G, path: list[str], text: str, label: str) -> G:
    known = {f.name: f for f in _fields(type(group))}
    field = known.get(path[0])
    inner = getattr(group, path[0], None)
    if field is None or isinstance(inner, Group) != (len(path) > 1):
        raise ValueError(f"{label}: no such setting (see the limits table, docs/limits.md)")
    if isinstance(inner, Group):
        return msgspec.structs.replace(group, **{path[0]: _assign(inner, path[1:], text, label)})
    found = _variable(field.type)
    value = _read(_value_type(field.type), label, found[1] if found else None, text)
    if value is _UNSET:
        raise ValueError(f"{label}: needs a value")
    return msgspec.structs.replace(group, **{path[0]: value})


def _value_type(kind: Any) -> Any:
    """The type a field's value has: its metadata's, and of `int | None` the int."""
    kind = kind.type if isinstance(kind, mi.Metadata) else kind
    if isinstance(kind, mi.UnionType):
        kind = next((t for t in kind.types if not isinstance(t, mi.NoneType)), kind)
    return kind


def validate(settings: G) -> G:
    """`settings` if every field meets its type's constraints, else `ValueError` naming the
    field (and its variable). Constructing a Struct does not check ``Meta`` constraints;
    a runtime calls this once on the settings it is given."""
    _check_bounds(settings, "")
    try:
        msgspec.convert(msgspec.to_builtins(settings), type(settings))
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid settings: {exc}") from None
    return settings


def _check_bounds(group: Group, prefix: str) -> None:
    names = variables(type(group))
    for field in _fields(type(group)):
        value = getattr(group, field.name)
        if isinstance(value, Group):
            _check_bounds(value, f"{prefix}{field.name}.")
            continue
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        problem = _bound_problem(_value_type(field.type), value)
        if problem is not None:
            where = f"{prefix}{field.name}" + (
                f" ({names[field.name]})" if field.name in names else ""
            )
            raise ValueError(f"{where} must be {problem}")


# -- the sandbox's variables, which are not plain numbers ----------------------------------

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _mode(name: str, raw: str | None) -> str:
    mode = (raw or "bwrap").lower()
    if mode not in ("bwrap", "none"):
        raise ValueError(f"{name} must be bwrap or none, got {mode!r}")
    return mode


def _seccomp(name: str, raw: str | None) -> str:
    mode = (raw or "require").strip().lower()
    if mode not in ("require", "auto"):
        raise ValueError(f"{name} must be require or auto, got {mode!r}")
    return mode


def _scheduler(name: str, raw: str | None) -> str:
    scheduler = (raw or "pool").lower()
    if scheduler not in ("pool", "thread"):
        raise ValueError(f"{name} must be pool or thread, got {scheduler!r}")
    return scheduler


def _bwrap(name: str, raw: str | None) -> str:
    return raw or shutil.which("bwrap") or "/usr/bin/bwrap"


def _flag(name: str, raw: str | None) -> bool:
    text = (raw or "").lower()
    if text in _TRUE:
        return True
    if text in _FALSE or not text:
        return False
    raise ValueError(f"{name} must be 1/0, true/false, yes/no or on/off, got {text!r}")


def _auto_flag(name: str, raw: str | None) -> str:
    """auto (unset), on or off (any word `_flag` knows)."""
    if raw is None or raw.lower() == "auto":
        return "auto"
    try:
        return "on" if _flag(name, raw) else "off"
    except ValueError:
        raise ValueError(f"{name} must be auto, on or off, got {raw.lower()!r}") from None


def _names(name: str, raw: str | None) -> tuple[str, ...]:
    names = tuple(n.strip() for n in (raw or "").split(",") if n.strip())
    bad = [n for n in names if not re.match(_ENV_NAME, n)]
    if bad:
        raise ValueError(f"{name}: not environment variable names: {', '.join(bad)}")
    return names


FIRST_UID = 2_000_000_000  # the sandbox uids of a root server: far above any login's


def _first_uid(name: str, raw: str | None) -> int | None:
    if raw is None:
        return FIRST_UID if os.getuid() == 0 else None
    if raw.lower() == "none":
        return None
    try:
        uid = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a uid (a number) or none, got {raw!r}") from None
    if uid < 1:
        raise ValueError(f"{name} must be at least 1 (never root), got {raw!r}")
    return uid


def _root(name: str, raw: str | None) -> str:
    return raw or os.path.join(tempfile.gettempdir(), "ctxactors-workspaces")


class SandboxSettings(Group, frozen=True):
    """How workspace commands are confined (see `ctxactors.sandbox`)."""

    mode: Annotated[Literal["bwrap", "none"], var("CTXACTORS_WORKSPACE_SANDBOX", _mode)] = "bwrap"
    bwrap: Annotated[str, var("CTXACTORS_WORKSPACE_BWRAP", _bwrap)] = "/usr/bin/bwrap"
    network: Annotated[bool, var("CTXACTORS_WORKSPACE_NETWORK", _flag)] = False
    # require: refuse to sandbox when the seccomp filter can't be built here (no pyseccomp
    # or libseccomp); auto: run such sandboxes unfiltered (the startup log says so).
    seccomp: Annotated[Literal["require", "auto"], var("CTXACTORS_WORKSPACE_SECCOMP", _seccomp)] = (
        "require"
    )
    # Names copied from the server's environment into every command's.
    env: Annotated[
        tuple[Annotated[str, msgspec.Meta(pattern=_ENV_NAME)], ...],
        var("CTXACTORS_WORKSPACE_ENV", _names),
    ] = ()
    cpu_seconds: Annotated[Count, var("CTXACTORS_WORKSPACE_CPU_SECONDS")] = 600
    # RLIMIT_AS, per process
    memory_bytes: Annotated[Count, var("CTXACTORS_WORKSPACE_MAX_MEMORY_BYTES")] = 4 << 30
    file_bytes: Annotated[Count, var("CTXACTORS_WORKSPACE_MAX_FILE_BYTES")] = 1 << 30
    # RLIMIT_NPROC, per sandbox (processes and threads)
    processes: Annotated[Count, var("CTXACTORS_WORKSPACE_MAX_PROCESSES")] = 256
    tmp_bytes: Annotated[Count, var("CTXACTORS_WORKSPACE_TMP_BYTES")] = 256 << 20
    # A root server runs each principal's sandboxes as a uid (and gid) of its own, the
    # next free one from uid_first (of uid_count); None: every sandbox as the server's user.
    uid_first: Annotated[
        Annotated[int, msgspec.Meta(ge=1)] | None,
        var("CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST", _first_uid),
    ] = None
    uid_count: Annotated[Count, var("CTXACTORS_WORKSPACE_SANDBOX_UID_COUNT")] = 1_000_000

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SandboxSettings:
        environ = os.environ if environ is None else environ
        if (environ.get(_REPLACED) or "").strip():
            raise ValueError(
                f"{_REPLACED} is replaced by CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST and "
                "CTXACTORS_WORKSPACE_SANDBOX_UID_COUNT: each principal's sandboxes run as a "
                "uid of their own from that range; unset it"
            )
        return super().from_env(environ)

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    @property
    def switch_user(self) -> bool:
        """True when bwrap runs as the principal's own uid (a root server with a range)."""
        return self.enabled and self.uid_first is not None and os.geteuid() == 0


_REPLACED = "CTXACTORS_WORKSPACE_SANDBOX_USER"


def _cgroups(name: str, raw: str | None) -> str:
    mode = (raw or "auto").lower()
    if mode not in ("auto", "require", "off"):
        raise ValueError(f"{name} must be auto, require or off, got {mode!r}")
    return mode


def _path(name: str, raw: str | None) -> str | None:
    if raw is not None and not raw.startswith("/"):
        raise ValueError(f"{name} must be an absolute path, got {raw!r}")
    return raw


Weight = Annotated[int, msgspec.Meta(ge=1, le=10_000)]


class BudgetSettings(Group, frozen=True):
    """What the sandboxes of one principal (across all its sessions), and of the whole
    server, may use (see `ctxactors.sandbox_limits`). Callers with no principal are one
    tenant under the server's budget only."""

    # auto: cgroups when the kernel lets the server make them, else the fallback;
    # require: refuse to start without them; off: the fallback.
    cgroups: Annotated[
        Literal["auto", "require", "off"], var("CTXACTORS_WORKSPACE_CGROUPS", _cgroups)
    ] = "auto"
    # Where the server's group goes (a path in the hierarchy); None: the server's own group.
    cgroup_parent: Annotated[str | None, var("CTXACTORS_WORKSPACE_CGROUP_PARENT", _path)] = None
    principal_processes: Annotated[Count, var("CTXACTORS_WORKSPACE_PRINCIPAL_PROCESSES")] = 1024
    principal_memory_bytes: Annotated[Count, var("CTXACTORS_WORKSPACE_PRINCIPAL_MEMORY_BYTES")] = (
        2 << 30
    )
    principal_cpu_weight: Annotated[Weight, var("CTXACTORS_WORKSPACE_PRINCIPAL_CPU_WEIGHT")] = 100
    # Sandboxes running at once, all of a principal's sessions (counted by the server).
    principal_running: Annotated[Count, var("CTXACTORS_WORKSPACE_PRINCIPAL_RUNNING")] = 32
    server_processes: Annotated[Count, var("CTXACTORS_WORKSPACE_SERVER_PROCESSES")] = 8192
    # None: three quarters of the memory the server may use (the host's, or its cgroup's).
    server_memory_bytes: Annotated[Count | None, var("CTXACTORS_WORKSPACE_SERVER_MEMORY_BYTES")] = (
        None
    )
    # Every sandbox together, against the server's own threads (when not idle, below).
    server_cpu_weight: Annotated[Weight, var("CTXACTORS_WORKSPACE_SERVER_CPU_WEIGHT")] = 100
    # Sandboxes run on the CPU time the server's own threads leave (cgroup ``cpu.idle``):
    # the server's threads serve every tenant, so one tenant's loops never delay them.
    # auto and on alike: a server in a hierarchy's root group first moves into a group of
    # its own, else the sandboxes' siblings would be every process of the host; where that
    # move fails, auto goes by weight and on stays idle (yielding to the whole host).
    server_cpu_idle: Annotated[
        Literal["auto", "on", "off"], var("CTXACTORS_WORKSPACE_SERVER_CPU_IDLE", _auto_flag)
    ] = "auto"
    server_running: Annotated[Count, var("CTXACTORS_WORKSPACE_SERVER_RUNNING")] = 512
    # Workspace files on disk (`ctxactors.sandbox_disk`). auto: an ext4 image per principal
    # when the server may loop-mount one, else measured; require: refuse to start without
    # images; off: measured.
    disk: Annotated[
        Literal["auto", "require", "off"], var("CTXACTORS_WORKSPACE_DISK", _cgroups)
    ] = "auto"
    principal_disk_bytes: Annotated[Count, var("CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES")] = (
        1 << 30
    )
    # None: 3/4 of what the root's filesystem had free at start plus what workspaces held.
    server_disk_bytes: Annotated[Count | None, var("CTXACTORS_WORKSPACE_SERVER_DISK_BYTES")] = None
    # Kernel mode: take each principal's image's blocks on the host when it is made or grown
    # (a hard guarantee against other writers on the root's filesystem); off: sparse images,
    # made only while the host has room for every image's budget (`ctxactors.loop_images`).
    disk_preallocate: Annotated[bool, var("CTXACTORS_WORKSPACE_DISK_PREALLOCATE", _flag)] = False


# -- one group per server -------------------------------------------------------------------


class StateSettings(Group, frozen=True):
    """The state store's budget per principal (`ctxactors.state_budget`)."""

    # The bytes of every state one principal has stored (planning, playbooks, history, any
    # server's; content's documents have their own budget). No principal: not capped.
    max_principal_bytes: Annotated[Count, var("CTXACTORS_STATE_MAX_PRINCIPAL_BYTES")] = 1 << 30


class ContentSettings(Group, frozen=True):
    """The content server's limits, per session and per principal."""

    max_item_bytes: Annotated[Count, var("CTXACTORS_CONTENT_MAX_ITEM_BYTES")] = 1 << 20
    max_session_bytes: Annotated[Count, var("CTXACTORS_CONTENT_MAX_SESSION_BYTES")] = 64 << 20
    # All of one principal's sessions together (callers with no principal: not capped).
    max_principal_bytes: Annotated[Count, var("CTXACTORS_CONTENT_MAX_PRINCIPAL_BYTES")] = 512 << 20
    # Full-text index builds of one principal's at once (a megabyte document costs about a
    # second of CPU; see `ctxactors.servers.content_gate`). No principal: not gated.
    max_principal_indexing: Annotated[Count, var("CTXACTORS_CONTENT_MAX_PRINCIPAL_INDEXING")] = 1
    max_items: Annotated[Count, var("CTXACTORS_CONTENT_MAX_ITEMS")] = 100_000


class PlanningSettings(Group, frozen=True):
    """The planning server's limits, per thread."""

    max_goals: Annotated[Count, var("CTXACTORS_PLANNING_MAX_GOALS")] = 1000
    max_todos: Annotated[Count, var("CTXACTORS_PLANNING_MAX_TODOS")] = 1000
    max_bytes: Annotated[Count, var("CTXACTORS_PLANNING_MAX_BYTES")] = 8 << 20


class PlaybooksSettings(Group, frozen=True):
    """The playbooks server's limits, per session."""

    max_playbooks: Annotated[Count, var("CTXACTORS_PLAYBOOKS_MAX_PLAYBOOKS")] = 1000
    max_steps: Annotated[Count, var("CTXACTORS_PLAYBOOKS_MAX_STEPS")] = 200
    max_bytes: Annotated[Count, var("CTXACTORS_PLAYBOOKS_MAX_BYTES")] = 8 << 20


class BatchSettings(Group, frozen=True):
    """The batch tool's limits (per batch) and the presets' (per assistant)."""

    max_operations: Annotated[Count, var("CTXACTORS_BATCH_MAX_OPERATIONS")] = 100
    max_expanded_bytes: Annotated[Count, var("CTXACTORS_BATCH_MAX_EXPANDED_BYTES")] = 8 << 20
    max_result_bytes: Annotated[Count, var("CTXACTORS_BATCH_MAX_RESULT_BYTES")] = 16 << 20
    max_presets: Annotated[Count, var("CTXACTORS_BATCH_MAX_PRESETS")] = 100
    max_preset_bytes: Annotated[Count, var("CTXACTORS_BATCH_MAX_PRESET_BYTES")] = 64 << 10
    max_presets_bytes: Annotated[Count, var("CTXACTORS_BATCH_MAX_PRESETS_BYTES")] = 1 << 20


class HistorySettings(Group, frozen=True):
    """The operation history's bounds, per session."""

    max_operations: Annotated[Count, var("CTXACTORS_HISTORY_MAX_OPERATIONS")] = 50
    ttl: Annotated[Seconds, var("CTXACTORS_HISTORY_TTL")] = 3600.0
    # With a store: how long a new record waits before the session's history is written
    # (with every record added meanwhile). A crash loses at most this much history, never a
    # key's state; a busy session writes once per delay, and records that the bound pushes
    # out meanwhile are never written at all.
    write_delay: Annotated[Seconds, var("CTXACTORS_HISTORY_WRITE_DELAY")] = 1.0


class WorkspaceSettings(Group, frozen=True):
    """The workspace server's limits and where its directories go."""

    root: Annotated[str, var("CTXACTORS_WORKSPACE_ROOT", _root)] = os.path.join(
        tempfile.gettempdir(), "ctxactors-workspaces"
    )
    max_output_bytes: Annotated[Count, var("CTXACTORS_WORKSPACE_MAX_OUTPUT_BYTES")] = 256 << 10
    default_timeout: Annotated[Seconds, var("CTXACTORS_WORKSPACE_DEFAULT_TIMEOUT")] = 600.0
    max_timeout: Annotated[Seconds, var("CTXACTORS_WORKSPACE_MAX_TIMEOUT")] = 3600.0
    max_running: Annotated[Count, var("CTXACTORS_WORKSPACE_MAX_RUNNING")] = 16
    sandbox: SandboxSettings = SandboxSettings()
    budget: BudgetSettings = BudgetSettings()


class ActorSettings(Group, frozen=True):
    """How key actors are run (see `ctxactors._scheduler`)."""

    # "pool": on `workers` threads, however many keys (the default); "thread": an OS
    # thread per live key, as before (bounded by the kernel's pid_max, ~30,000 keys).
    scheduler: Annotated[Literal["pool", "thread"], var("CTXACTORS_SCHEDULER", _scheduler)] = "pool"
    workers: Annotated[Count, var("CTXACTORS_WORKERS")] = 8
    # The elastic pool of `@tool(blocking=True)` calls (subprocesses, batches) at most.
    blocking_threads: Annotated[Count, var("CTXACTORS_BLOCKING_THREADS")] = 512


class MetricsSettings(Group, frozen=True):
    """Bounds of the Prometheus metrics (`ctxactors.metrics`)."""

    # Distinct principal label values (``--metrics-principal-label``); the rest are counted
    # under ``other``, so a tenant minting tokens can't grow the series without bound.
    max_principals: Annotated[Count, var("CTXACTORS_METRICS_MAX_PRINCIPALS")] = 100


class HttpSettings(Group, frozen=True):
    """What one client or principal may hold of the HTTP server (``serve --transport http``;
    see `ctxactors.transports.connections`)."""

    # A request's headers must arrive within this of its first byte, its body within
    # `body_timeout` of its headers, or the connection is closed (a half-sent request
    # otherwise holds a connection forever).
    header_timeout: Annotated[Seconds, var("CTXACTORS_HTTP_HEADER_TIMEOUT")] = 10.0
    body_timeout: Annotated[Seconds, var("CTXACTORS_HTTP_BODY_TIMEOUT")] = 60.0
    # Connections open at once: the server's (lowered to fit the open-file limit), and one
    # client address's (behind a proxy, every client has the proxy's: raise it there).
    max_connections: Annotated[Count, var("CTXACTORS_HTTP_MAX_CONNECTIONS")] = 4096
    max_connections_per_client: Annotated[
        Count, var("CTXACTORS_HTTP_MAX_CONNECTIONS_PER_CLIENT")
    ] = 256

    # Open stateful MCP sessions of one authenticated principal (the SDK's own cap, 10,000,
    # is for the whole server: without this one a single principal could take them all).
    max_sessions_per_principal: Annotated[
        Count, var("CTXACTORS_HTTP_MAX_SESSIONS_PER_PRINCIPAL")
    ] = 100

    # An MCP call over HTTP answers as one JSON body; one not answered within this becomes
    # an SSE stream with a ping this often, so a proxy's idle-read timeout can't cut it.
    ping_interval: Annotated[Seconds, var("CTXACTORS_HTTP_PING_INTERVAL")] = 15.0


def _host(name: str, raw: str | None) -> Any:
    if raw is None:
        return _UNSET
    if not re.fullmatch(r"[A-Za-z0-9.:\-]+", raw):
        raise ValueError(f"{name} must be a host name or IP address, got {raw!r}")
    return raw


class RaySettings(Group, frozen=True):
    """How a Ray backend (``serve --backend ray``) starts or joins Ray: always with Ray's own
    token authentication (see `ctxactors.ray._auth`)."""

    # A file holding the cluster's token (it becomes Ray's RAY_AUTH_TOKEN_PATH). Without it,
    # Ray's own sources: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token. Joining a
    # cluster needs one of them; starting one with none generates a token.
    token_file: Annotated[str | None, var("CTXACTORS_RAY_TOKEN_FILE", _path)] = None
    # Only when this process starts Ray: the address its node gives the others (None: Ray's
    # choice), and Ray's dashboard (off; on, it listens on `dashboard_host`).
    node_ip: Annotated[str | None, var("CTXACTORS_RAY_NODE_IP", _host)] = None
    dashboard: Annotated[bool, var("CTXACTORS_RAY_DASHBOARD", _flag)] = False
    dashboard_host: Annotated[str, var("CTXACTORS_RAY_DASHBOARD_HOST", _host)] = "127.0.0.1"


class RedisSettings(Group, frozen=True):
    """The credentials of a Redis store (``serve --store redis://...``, ``shards``; see
    `ctxactors.redis_access`)."""

    # A file whose first line is the password, for a URL that carries none: the password
    # stays off the command line, where every local user can read it (ps). Refused when
    # others may read the file.
    password_file: Annotated[str | None, var("CTXACTORS_REDIS_PASSWORD_FILE", _path)] = None
    # Accept a Redis that lets in a client without a password (a URL with none, loopback
    # included; a socket others may open; a default user left on without one), with a
    # warning at every start: for a network you trust.
    allow_no_auth: Annotated[bool, var("CTXACTORS_REDIS_ALLOW_NO_AUTH", _flag)] = False


# -- where a call's conversation comes from ------------------------------------------------

ContextRole = Literal["session", "assistant", "thread"]
ROLES: tuple[ContextRole, ...] = ("session", "assistant", "thread")
# An MCP ``_meta`` key name (the specification's grammar): an optional prefix of dotted
# labels and a slash, then a name that begins and ends with a letter or digit.
_LABEL = r"[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
META_KEY = rf"^(?:{_LABEL}(?:\.{_LABEL})*/)?[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$"
MetaKey = Annotated[str, msgspec.Meta(pattern=META_KEY)]
ContextMeta = tuple[tuple[MetaKey, ContextRole], ...]

# The ``_meta`` keys with which real MCP hosts name their conversation on ``tools/call``, each
# seen in the host's own source (none guessed; docs/serving.md's table says where). A host that
# sends one of them keeps its conversations apart with no ctxactors-specific setup.
HOST_CONTEXT_META: ContextMeta = (
    # VS Code's chat: McpTool._callWithProgress sets it to the chat session's id
    # (microsoft/vscode, src/vs/workbench/contrib/mcp/common/mcpServer.ts, at 0052d689).
    # Its neighbour "vscode.requestId" names one request, not the conversation: not read.
    ("vscode.conversationId", "session"),
    # OpenCode 2: the invoking Session.ID (anomalyco/opencode#46008, merged into v2;
    # packages/core/src/mcp/client.ts, callTool).
    ("sessionID", "session"),
    # Codex: its thread id, which is its conversation's id, on every MCP tool call
    # (openai/codex#18093; codex-rs/app-server/src/request_processors/mcp_processor.rs,
    # at 5886055b). Codex's thread is a whole conversation, so it is the session here.
    ("threadId", "session"),
)


def context_meta_pair(text: str, source: str = "--context-meta") -> tuple[str, ContextRole]:
    """``KEY=ROLE`` as a carrier; `ValueError` says what is wrong, naming `source`."""
    key, sep, role = (part.strip() for part in text.rpartition("="))
    if not sep or not key:
        raise ValueError(f"{source}: {text!r}: expected KEY=ROLE (ROLE: {'|'.join(ROLES)})")
    if role not in ROLES:
        raise ValueError(f"{source}: {text!r}: ROLE must be session, assistant or thread")
    check_context_meta(((key, role),), source)
    return key, role  # type: ignore[return-value]


def check_context_meta(pairs: Iterable[tuple[str, str]], source: str = "context_meta") -> None:
    """`ValueError` unless every key is an MCP ``_meta`` key name outside ``ctxactors/``
    (those are always read) and no key is given two roles."""
    roles: dict[str, str] = {}
    for key, role in pairs:
        if not re.match(META_KEY, key):
            raise ValueError(f"{source}: {key!r} is not an MCP _meta key name")
        if key.startswith("ctxactors/"):
            raise ValueError(f"{source}: {key!r}: the ctxactors/ keys are always read")
        if roles.setdefault(key, role) != role:
            raise ValueError(f"{source}: {key!r} is given two roles, {roles[key]} and {role}")


def _context_meta(name: str, raw: str | None) -> Any:
    """``KEY=ROLE,KEY=ROLE``: the whole list (it replaces the hosts' keys); ``none``: no
    carrier but ``ctxactors/*``."""
    if raw is None:
        return _UNSET
    if raw.lower() == "none":
        return ()
    pairs = tuple(context_meta_pair(item, name) for item in raw.split(",") if item.strip())
    check_context_meta(pairs, name)
    return tuple(dict.fromkeys(pairs))


def _fallback(name: str, raw: str | None) -> str:
    value = (raw or "default").lower()
    if value not in ("default", "refuse"):
        raise ValueError(f"{name} must be default or refuse, got {value!r}")
    return value


class Settings(Group, frozen=True):
    """Every limit of one runtime. Give it to ``Runtime(settings=...)``.

    The runtime's own (`ttl`, `max_actors`, `max_actors_per_principal`, `call_timeout`) are
    also its keywords, which override these. `max_text_bytes` bounds one text kept by a
    server (a goal, a todo, a playbook step), `max_answer_bytes` the JSON of one list answer
    (above what a full key holds, so only content listings, histories and escape-heavy text
    are ever cut).
    """

    ttl: Seconds = 3600.0
    max_actors: Count = 10_000
    max_actors_per_principal: Count | None = None
    call_timeout: Seconds = 30.0
    max_text_bytes: Annotated[Count, var("CTXACTORS_MAX_TEXT_BYTES")] = 64 << 10
    max_answer_bytes: Annotated[Count, var("CTXACTORS_MAX_ANSWER_BYTES")] = 16 << 20
    state: StateSettings = StateSettings()
    content: ContentSettings = ContentSettings()
    planning: PlanningSettings = PlanningSettings()
    playbooks: PlaybooksSettings = PlaybooksSettings()
    batch: BatchSettings = BatchSettings()
    history: HistorySettings = HistorySettings()
    workspace: WorkspaceSettings = WorkspaceSettings()
    metrics: MetricsSettings = MetricsSettings()
    actors: ActorSettings = ActorSettings()
    http: HttpSettings = HttpSettings()
    ray: RaySettings = RaySettings()
    redis: RedisSettings = RedisSettings()
    # The MCP _meta keys read as the context beside ctxactors/* (which come first), in order:
    # the first one present for a role gives it (`ctxactors.context.Carriers`).
    context_meta: Annotated[ContextMeta, var("CTXACTORS_CONTEXT_META", _context_meta)] = (
        HOST_CONTEXT_META
    )
    # A stdio MCP call that names no session: "default" shares the session `default` (one
    # warning, on the first); "refuse" refuses it, as a stateless HTTP server does.
    session_fallback: Annotated[
        Literal["default", "refuse"], var("CTXACTORS_SESSION_FALLBACK", _fallback)
    ] = "default"

    def __post_init__(self) -> None:
        check_context_meta(self.context_meta)

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` (the runtime's keywords: None leaves a field as it is)."""
        kept = {k: v for k, v in changes.items() if v is not None}
        return validate(msgspec.structs.replace(self, **kept)) if kept else self


DEFAULTS = Settings()
"""The documented defaults (no environment read): what a server made alone uses."""

__all__ = [
    "DEFAULTS",
    "HOST_CONTEXT_META",
    "ActorSettings",
    "BatchSettings",
    "BudgetSettings",
    "Cap",
    "ContentSettings",
    "ContextRole",
    "HistorySettings",
    "HttpSettings",
    "MetricsSettings",
    "PlanningSettings",
    "PlaybooksSettings",
    "RaySettings",
    "RedisSettings",
    "SandboxSettings",
    "Settings",
    "StateSettings",
    "WorkspaceSettings",
    "assign",
    "check_context_meta",
    "context_meta_pair",
    "fields",
    "validate",
    "variables",
]
