"""The router: context in, validated call out to the right key's actor, result back.

Every call goes the same way, whichever transport it came from:

1. parse the arguments (dict or JSON string) and read the context (`read_context`: the
   transport's principal, then ``_meta`` or else the ``__*`` fields, then the session
   fallback), strip the ``__*`` fields, validate the rest against the tool's args type;
   all of this in the caller, so bad input fails before anything is sent;
2. build the call as data (`ctxactors._call.ToolCall`), pick the key with the server's
   scope and hand the call to that key's actor: the only time a call takes the registry's
   lock;
3. wait for the reply (a lock handoff for `call`, an asyncio future for `acall`).

In the actor, `ctxactors._call.execute` runs it: the handler (between the load and the save
of a durable key's state), the observers, the reply, and then the call's log line.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

import msgspec

from ctxactors._actors import (
    AsyncReply,
    KeyActor,
    Lifecycle,
    ReplyExpired,
    SyncReply,
    take_sync_reply,
)
from ctxactors._attribute_state import declare
from ctxactors._call import CallHost, CallWrapper, Envelope, Observer, Reply, ToolCall, Undo
from ctxactors._registry import Registry
from ctxactors._scheduler import BlockingPool, Dispatcher, PoolActor
from ctxactors._tool_loop import CancelledResult
from ctxactors.context import (
    DEFAULT_SESSION,
    NO_SESSION_MESSAGE,
    SHARED_SESSION_FIX,
    Carriers,
    ToolContext,
    logged_fields,
    parse_arguments,
    split_context,
)
from ctxactors.durable import Durability, is_durable
from ctxactors.errors import (
    CallTimeoutError,
    CtxActorsError,
    InvalidArgumentsError,
    UnknownToolError,
)
from ctxactors.logs import get_logger
from ctxactors.results import ToolResult
from ctxactors.settings import Settings, validate
from ctxactors.state import StateStore
from ctxactors.tools import Server, ToolSpec, collect_tools

__all__ = ["CallWrapper", "Observer", "Runtime"]


class Runtime:
    """Routes tool calls to one pykka actor per key. Use as a context manager, or `close()`.

    `servers=None` registers the built-in servers. `ttl` is the idle time after which a
    key's actor is reaped (its state goes with it unless a `store` keeps it: see
    `ctxactors.durable`); `max_actors` caps the live actors (the
    least recently used idle one is passivated to make room), `max_actors_per_principal`
    caps each principal's (passivating that principal's own least recently used idle key,
    never another's); `clock` is an injectable monotonic clock for tests (the reaper's and
    the operation history's). `settings` holds every limit (`ctxactors.settings.Settings`;
    default: read from the environment now). With an injected clock and no `scan_interval`
    there is no
    background reaper: the test calls `reap()` itself. ``tools="unified"`` makes
    `list_tools()` publish only the batch and preset tools, whose description lists every
    other tool; every tool can still be called either way. `backend` runs the key actors
    elsewhere: a `ctxactors.ray.RayBackend` sends each validated call to the Ray shard that
    owns its session (this runtime then keeps no key state; the backend's limits apply).
    """

    def __init__(
        self,
        servers: Iterable[type[Server]] | None = None,
        *,
        ttl: float | None = None,
        scan_interval: float | None = None,
        max_actors: int | None = None,
        max_actors_per_principal: int | None = None,
        call_timeout: float | None = None,
        clock: Callable[[], float] | None = None,
        tools: str = "all",
        store: StateStore | None = None,
        settings: Settings | None = None,
        backend: Any = None,
    ) -> None:
        # Every limit, read from the environment now (not at import) unless given; the
        # keywords are shortcuts that override their settings.
        given = validate(settings) if settings is not None else Settings.from_env()
        self.settings = given.replace(
            ttl=ttl,
            max_actors=max_actors,
            max_actors_per_principal=max_actors_per_principal,
            call_timeout=call_timeout,
        )
        ttl, max_actors = self.settings.ttl, self.settings.max_actors
        max_actors_per_principal = self.settings.max_actors_per_principal
        call_timeout = self.settings.call_timeout
        self.clock = clock or time.monotonic
        if tools not in ("all", "unified"):
            raise ValueError(f"tools must be 'all' or 'unified', got {tools!r}")
        if backend is not None and store is not None:
            raise ValueError("a backend keeps key state in its own store: give the store to it")
        if servers is None:
            from ctxactors.servers import BUILTIN

            servers = BUILTIN
        from ctxactors.servers import ALWAYS

        self._servers = [*servers, *(s for s in ALWAYS if s not in servers)]
        self._tools: dict[str, ToolSpec] = collect_tools(self._servers)
        self._factories = {s: functools.partial(s.create, self) for s in self._servers}
        # Kept encoded: every list_tools() decodes a fresh copy the caller may change.
        # tools="unified" lists only the batch and preset tools (same calls, shorter list).
        if tools == "unified":
            from ctxactors.servers.batch import unified_definitions

            definitions = unified_definitions(self._tools)
        else:
            definitions = [s.definition() for s in self._tools.values()]
        self._definitions = msgspec.json.encode(definitions)
        self.call_timeout = call_timeout
        self._log = get_logger("ctxactors")
        # The _meta keys that name a call's context: ctxactors/* first, then the hosts'.
        self._carriers = Carriers.of(self.settings.context_meta)
        # Taken by the first call that falls back to the session `default`, never released:
        # that call warns, once per runtime (every later one would repeat the same line).
        self._default_warned = threading.Lock()
        if backend is not None:
            scan_interval = None  # the shards reap their keys; a front end hosts none
        elif scan_interval is None and clock is None:
            scan_interval = min(max(ttl / 4, 0.05), 60.0)
        actors = self.settings.actors
        self._dispatcher: Dispatcher | None = None
        launch: Callable[..., Any] = KeyActor.launch
        if actors.scheduler == "pool":
            self._dispatcher = Dispatcher(
                actors.workers, blocking=BlockingPool(actors.blocking_threads)
            )
            launch = functools.partial(_launch_pooled, dispatcher=self._dispatcher)
        self._registry = Registry(
            ttl=ttl,
            max_actors=max_actors,
            max_actors_per_principal=max_actors_per_principal,
            clock=self.clock,
            scan_interval=scan_interval,
            log=self._log,
            launch=launch,
        )
        # Key state beyond its actor (see ctxactors.durable); None: ephemeral, as before.
        self._durable = (
            Durability(
                store,
                save_timeout=call_timeout,
                flush_delay=self.settings.history.write_delay,
                clock=self.clock,
                live=lambda: {key.session for key in self._registry.keys()},
                max_principal_bytes=self.settings.state.cap("max_principal_bytes"),
            )
            if store is not None
            else None
        )
        if self._durable is not None:
            self._registry.on_pass = self._purge
        self._observers: list[Observer] = []
        self._early_observers: list[Observer] = []
        # Where key actors run: None is here; a `ctxactors.ray.RayBackend` runs them in Ray
        # shards, which attach the servers themselves (this runtime only validates and routes).
        self._backend = backend
        self._host = CallHost(self._log, self._durable, self._observers, self._early_observers)
        _trace_if_enabled(self)  # only with a tracer provider installed: no cost
        try:
            for server in self._servers if backend is None else ():
                server.attach(self)
            if backend is not None:
                backend.start(self._servers)
            elif self._durable is not None:
                for server in self._servers:  # after `attach`: `create` may need what it set
                    declare(server, self)  # durable by its attributes, or refused
        except BaseException:
            # A server that refuses to start (no sandbox, say) must not leave the reaper
            # thread and the store's writer running behind a runtime nobody can close.
            self.close()
            raise
        # What `_submit` needs of each tool, looked up once: (read_only, durable, scope,
        # the factory of its server's instances).
        self._routes = {
            spec: (
                spec.read_only,
                self._durable is not None and is_durable(spec.server),
                spec.server.scope,
                self._factories[spec.server],
            )
            for spec in self._tools.values()
        }
        if self._durable is not None:  # retention counts from a session's last use
            durable = self._durable
            # A save restarts its session's retention in the store (and `Durability.save`
            # tells a save that wrote nothing): only the other calls are told here.
            saves = {spec for spec, route in self._routes.items() if route[1] and not route[0]}

            def used(ctx: ToolContext, spec: ToolSpec, args: Any, result: Any) -> None:
                if spec not in saves:
                    durable.used(ctx.session_key)

            # Before the reply (a dict lookup), so a flush after a call sees its use.
            self.add_observer(used, before_reply=True)

    # -- calls ---------------------------------------------------------------------------

    def call(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        meta: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        principal: str | None = None,
        session_fallback: str | None = DEFAULT_SESSION,
    ) -> ToolResult:
        """Call a tool and wait for its result.

        The context comes from `meta` (MCP ``_meta``) when it carries any context key
        (``ctxactors/*``, or a key of `Settings.context_meta`: the conversation ids hosts
        send), and then every ``__*`` argument is dropped as spoofing; otherwise from the
        ``__*`` arguments. `principal` is for an authenticated transport only: it namespaces
        every key and nothing in `arguments` or `meta` can change it. `session_fallback` is
        the session when neither names one (the first call of a runtime that falls back to
        ``default`` logs a warning); ``None`` refuses such a call.

        Raises `UnknownToolError`, `InvalidArgumentsError` (nothing ran),
        `CallTimeoutError` or `RuntimeClosedError`; a tool's own failure is a result with
        ``is_error=True``.
        """
        wait = self.call_timeout if timeout is None else timeout
        deadline = _monotonic() + wait
        reply = take_sync_reply(deadline)
        self._dispatch(tool, arguments, meta, principal, session_fallback, reply)
        # A call run here, on this thread (`ctxactors._scheduler`), answers even when late:
        # past its deadline it is a timeout all the same, as it would have been elsewhere.
        if not reply.wait(wait) or _monotonic() > deadline:
            raise CallTimeoutError(f"tool {tool!r} did not answer within {wait:g} s")
        result: ToolResult = reply.recycle()
        if type(result) is not ToolResult:
            _raise_odd_reply(result, tool, wait)
        return result

    async def acall(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        meta: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        principal: str | None = None,
        session_fallback: str | None = DEFAULT_SESSION,
    ) -> ToolResult:
        """`call`, awaitable. Never blocks the event loop: the reply resolves a future."""
        wait = self.call_timeout if timeout is None else timeout
        reply = AsyncReply(asyncio.get_running_loop(), time.monotonic() + wait)
        self._dispatch(tool, arguments, meta, principal, session_fallback, reply)
        reply.expire()
        try:
            result: ToolResult = await reply.future
        except ReplyExpired:
            raise CallTimeoutError(f"tool {tool!r} did not answer within {wait:g} s") from None
        finally:
            reply.settle()
        if type(result) is not ToolResult:
            _raise_odd_reply(result, tool, wait)
        return result

    def _dispatch(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str | None,
        meta: Mapping[str, Any] | None,
        principal: str | None,
        session_fallback: str | None,
        reply: SyncReply | AsyncReply,
    ) -> None:
        spec = self._tools.get(tool)
        if spec is None:
            raise UnknownToolError(f"unknown tool {tool!r}")
        raw = arguments if type(arguments) is dict else parse_arguments(arguments)
        try:
            ctx, args, spoofed, defaulted = split_context(
                raw, meta, principal=principal, fallback=session_fallback, carriers=self._carriers
            )
        except InvalidArgumentsError as exc:
            if exc.args[0] is NO_SESSION_MESSAGE:  # a client that names no session at all
                self._log.warning("no_session_refused", tool=tool, principal=principal)
            raise
        validated = spec.validate(args)
        if spoofed:
            self._log.warning(
                "spoofed_context_dropped",
                tool=tool,
                fields=logged_fields(spoofed),
                principal=ctx.principal,
                session_id=ctx.session_id,
                assistant_id=ctx.assistant_id,
                thread_id=ctx.thread_id,
            )
        if (
            defaulted
            and session_fallback == DEFAULT_SESSION
            and self._default_warned.acquire(blocking=False)
        ):
            self._log.warning(
                "no_session_id", tool=tool, fallback=ctx.session_id, fix=SHARED_SESSION_FIX
            )
        if self._backend is not None:
            # The call wrappers (metrics, tracing) only when there are some: a backend
            # without them keeps the four-argument seam.
            wrappers = (self._host.wrappers,) if self._host.wrappers else ()
            self._backend.submit(spec, ctx, args, reply, *wrappers)
            return
        self._submit(spec, ctx, validated, args, reply, reply.deadline)

    def _submit(
        self,
        spec: ToolSpec,
        ctx: ToolContext,
        validated: Any,
        args: dict[str, Any],
        reply: Reply | None,
        deadline: float | None,
        *,
        prepare: bool = False,
        undo: Undo | None = None,
    ) -> None:
        """Hand an already validated call to its key's actor (`call`, and the batch tool's
        operations and undos).

        `prepare` records the compensation's ``before`` into ``reply.prior``; `undo` runs the
        compensation instead of the tool, and stays out of the observers (an undo is not a
        call of the tool it undoes, so the operation history must not record it).
        """
        read_only, durable, scope, factory = self._routes[spec]
        call = ToolCall(
            spec.name, ctx, args, deadline, read_only, durable, undo is None, prepare, undo
        )
        key = scope.key(spec.server.name, ctx)
        envelope = Envelope(call, spec, validated, key, reply, self._host)
        if self._host.wrappers and call.observe:
            envelope.wrap(self._host.wrappers)
        self._registry.submit(key, factory, envelope)

    def add_observer(self, observer: Observer, *, before_reply: bool = False) -> None:
        """Run `observer` in the actor thread after every call that reached a server.

        By default it runs once the caller has its reply. ``before_reply=True`` runs it
        just before, for a cheap hand-off whose effect the caller's next call must see
        (the operation history: "what did I just do?" must include the call that returned).
        """
        (self._early_observers if before_reply else self._observers).append(observer)

    def add_call_wrapper(self, wrapper: CallWrapper) -> None:
        """Wrap the body of every later call that reached a server (not the undo of a batch).

        `wrapper` runs in the caller's thread (where a trace context or a start time is
        read) and the body it returns runs in the key's actor. No wrapper, no cost: this is
        how `ctxactors.metrics` and `ctxactors.tracing` hook in.
        """
        self._host.wrappers = (*self._host.wrappers, wrapper)

    # -- introspection and lifecycle -----------------------------------------------------

    def list_tools(self) -> list[dict[str, Any]]:
        """MCP tool definitions; no schema contains a reserved field."""
        tools: list[dict[str, Any]] = msgspec.json.decode(self._definitions)
        return tools

    def tool_spec(self, name: str) -> ToolSpec:
        spec = self._tools.get(name)
        if spec is None:
            raise UnknownToolError(f"unknown tool {name!r}")
        return spec

    @property
    def tools(self) -> Mapping[str, ToolSpec]:
        return self._tools

    def end_session(self, session_id: str, *, principal: str | None = None) -> int:
        """Stop every actor of `principal`'s session now (after calls already sent to them
        finish); another principal's session of the same id is untouched.

        Waits for their cleanup (processes killed, directories removed); returns how many
        actors were stopped. With a store, the session's stored state is deleted too (raises
        `StoreUnavailableError` if the store can't be reached: the actors are stopped, the
        stored state stays until its retention ends or a retry succeeds).
        """
        if self._backend is not None:
            return int(self._backend.end_session(session_id, principal))
        session = (principal, session_id)
        stopped = self._registry.end_session(session, wait=self.call_timeout)
        if self._durable is not None:
            self._durable.delete_session(session)
        return stopped

    def has_session(self, session_id: str, *, principal: str | None = None) -> bool:
        """Whether `principal`'s session has a live actor (so live state) now."""
        if self._backend is not None:
            return bool(self._backend.has_session(session_id, principal))
        return self._registry.has_session((principal, session_id))

    def reap(self) -> int:
        """One reaper pass now; returns how many idle actors it stopped. With a store, it
        also forgets the sessions past their retention."""
        if self._backend is not None:
            return int(self._backend.reap())
        reaped = self._registry.reap()
        if self._durable is not None:
            self._durable.purge(every=0.0)
        return reaped

    def _purge(self) -> None:
        """The background reaper's store pass: retention is coarse, a few scans a period."""
        assert self._durable is not None
        self._durable.purge(every=min(self._durable.store.retention / 10, 60.0))

    @property
    def store(self) -> StateStore | None:
        return None if self._durable is None else self._durable.store

    @property
    def durability(self) -> Durability | None:
        """The store side of this runtime (None without a store)."""
        return self._durable

    def stats(self) -> dict[str, int]:
        if self._backend is not None:
            return dict(self._backend.stats())
        return self._registry.stats()

    @property
    def closed(self) -> bool:
        """Whether `close` has begun: the runtime takes no more calls."""
        return self._registry.closed

    def close(self) -> None:
        """Refuse new calls, stop every actor and wait for their cleanup. Idempotent."""
        self._registry.close(timeout=self.call_timeout)
        if self._backend is not None:
            self._backend.close()
        for server in self._servers if self._backend is None else ():
            server.detach(self)  # after the actors: nothing of theirs runs now
        self._host.tool_loop.close()  # after the actors: none waits on a coroutine now
        if self._dispatcher is not None:
            self._dispatcher.close()  # after the loop: a cancelled coroutine's actor resumes
        if self._durable is not None:
            self._durable.close()  # after the actors: their last saves are written

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _launch_pooled(
    factory: Callable[[], Any], lifecycle: Lifecycle, *, dispatcher: Dispatcher
) -> PoolActor:
    return PoolActor.launch(factory, lifecycle, dispatcher)


def _raise_odd_reply(result: Any, tool: str, wait: float) -> None:
    """Raise what a reply other than a plain `ToolResult` stands for, if anything."""
    if isinstance(result, CtxActorsError):  # the backend's (a shard that went away)
        raise result
    if isinstance(result, CancelledResult):  # an async tool cancelled at the deadline
        raise CallTimeoutError(f"tool {tool!r} did not answer within {wait:g} s")


def _trace_if_enabled(runtime: Runtime) -> None:
    """`tracing.instrument_if_enabled`, without importing OpenTelemetry (the optional
    ``[otel]``/``[serve]`` extras) into a core install: a global tracer provider can only
    have been installed by a host that imported ``opentelemetry.trace`` already, or named
    one in ``OTEL_PYTHON_TRACER_PROVIDER``."""
    if "opentelemetry.trace" not in sys.modules and not os.environ.get(
        "OTEL_PYTHON_TRACER_PROVIDER"
    ):
        return
    try:
        from ctxactors import tracing
    except ImportError:  # opentelemetry-api is not installed: nothing can be traced
        return
    tracing.instrument_if_enabled(runtime)


_monotonic = time.monotonic
