"""`RayBackend`: a `Runtime`'s calls run in Ray shard actors instead of this process.

The front end (the `Runtime` this backend is given to) stays stateless: it parses,
reads the context and validates as always, then sends the call as plain data (tool name,
context, clean arguments) to the shard that owns the session (`owner`: rendezvous hashing
over the shard count) and resolves the caller's reply slot when the answer comes back. The
Ray calls are awaited on one event loop thread of the backend's own, so neither a blocking
`call` nor an `acall` on the caller's event loop ever waits on Ray itself.

Shards are named detached actors (``ctxactors-shard-<i>`` in the namespace), restarted by
Ray when they die (``max_restarts=-1``) and spread over the nodes; a front end finds them
by name (``get_if_exists``), so any number of front ends share them. The first front end
to name a shard creates it with its own configuration; later ones get the existing actor.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time
from collections.abc import Iterable
from typing import Any, cast

from ctxactors.context import ToolContext
from ctxactors.errors import (
    CallTimeoutError,
    CtxActorsError,
    RuntimeClosedError,
    ShardUnavailableError,
)
from ctxactors.logs import lazy_logger
from ctxactors.ray._auth import check_connected, prepare, start_options
from ctxactors.ray._directory import Directory, Layout
from ctxactors.ray._hashing import owner
from ctxactors.ray._observed import ObservedReply
from ctxactors.ray._shard import Duplicate, Moved, Shard, ShardConfig
from ctxactors.redis_url import redact
from ctxactors.results import ToolResult
from ctxactors.settings import RaySettings, Settings
from ctxactors.tools import Server, ToolSpec

_log = lazy_logger("ctxactors.ray")
_START_TIMEOUT = 180.0  # seconds for the shard processes to start
# Waits between retries of a read-only call while its shard restarts.
_RETRY_DELAYS = (0.05, 0.1, 0.2, 0.5, 1.0)


def _name(index: int) -> str:
    return f"ctxactors-shard-{index}"


def server_path(server: type[Server]) -> str:
    """A server class as the ``module:Class`` path a shard imports it by."""
    return f"{server.__module__}:{server.__qualname__}"


class RayBackend:
    """Runs a `Runtime`'s key actors in `shards` Ray shard actors (see the module doc).

    `address` is a Ray cluster's address (None: start or join a local Ray); `store` the
    ``redis://`` URL every shard keeps key state in (required: a moved or restarted shard
    loads from it). `ttl`, `retention`, `max_actors` and `max_actors_per_principal` are
    each shard's limits, and `settings` every other one (`ctxactors.settings.Settings`;
    default: the shard's environment). `shard_options` are extra Ray actor options for the
    shards (say ``{"resources": {"ctxactors": 1}}`` to keep them on labelled nodes).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        shards: int = 2,
        store: str,
        namespace: str = "ctxactors",
        ttl: float = 3600.0,
        retention: float = 3600.0,
        max_actors: int = 10_000,
        max_actors_per_principal: int | None = None,
        call_timeout: float = 30.0,
        shard_options: dict[str, Any] | None = None,
        settings: Settings | None = None,
    ) -> None:
        if shards < 1:
            raise ValueError(f"shards must be at least 1, got {shards}")
        if not store.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                "the Ray backend keeps state in Redis: store must be a redis:// URL, "
                f"got {redact(store)!r}"
            )
        self.address = address
        self.namespace = namespace
        self._store = store
        self._limits: dict[str, Any] = {
            "ttl": ttl,
            "retention": retention,
            "max_actors": max_actors,
            "max_actors_per_principal": max_actors_per_principal,
            "call_timeout": call_timeout,
            # The shards log as this process was told to (CTXACTORS_LOG_LEVEL/_FORMAT).
            "log_level": os.environ.get("CTXACTORS_LOG_LEVEL") or "info",
            "log_format": os.environ.get("CTXACTORS_LOG_FORMAT") or "json",
            "settings": settings,
        }
        self._options = dict(shard_options or {})
        self._directory = Directory(store, namespace)
        # The stored layout wins: `shards` only sizes a namespace that has none yet.
        self.layout = self._directory.layout(shards)
        self._config: ShardConfig | None = None
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self.retries = 0  # read-only calls sent again after their shard failed
        self._suspect: set[int] = set()  # shards that failed a call (loop thread only)

    # -- the seam the runtime calls ------------------------------------------------------

    def start(self, servers: Iterable[type[Server]]) -> None:
        """Connect to Ray and create or find the shards (the runtime calls this once)."""
        self._config = ShardConfig(
            namespace=self.namespace,
            store=self._store,
            servers=[server_path(s) for s in servers],
            shards=self.layout.count,
            **self._limits,
        )
        import ray
        import ray.exceptions as rex

        self.connect()
        # Wait for the shard processes here, so that a call's timeout never has to cover a
        # process start (seconds; more on a busy machine).
        waiting = [self._shard(index).ping.remote() for index in range(self.layout.count)]
        try:
            ray.get(waiting, timeout=_START_TIMEOUT)
        except rex.GetTimeoutError:
            raise RuntimeError(
                f"the {self.layout.count} shards did not start within {_START_TIMEOUT:g} s"
            ) from None

    @property
    def count(self) -> int:
        """The shard count this front end routes by (its layout's)."""
        return self.layout.count

    def connect(self) -> None:
        """Join the Ray cluster (once per process) and start this backend's loop thread."""
        import ray

        if self._thread is not None:
            return
        if ray.is_initialized():
            check_connected()
        else:
            self._init_ray(ray)
        self._actor_class = ray.remote(Shard)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="ctxactors-ray", daemon=True
        )
        self._thread.start()

    def _init_ray(self, ray: Any) -> None:
        """``ray.init`` with Ray's token authentication on (`ctxactors.ray._auth`)."""
        settings = self._ray_settings()
        auth = prepare(self.address, settings)
        options = {} if auth.joining else start_options(settings)
        try:
            ray.init(address=auth.address, namespace=self.namespace, log_to_driver=False, **options)
        except ConnectionError as exc:
            raise ConnectionError(
                f"{exc} (a token the cluster does not accept fails so too, after Ray's "
                "'Unauthenticated' warnings)"
            ) from None
        _log.info(
            "ray_joined" if auth.joining else "ray_started",
            address=ray.get_runtime_context().gcs_address,
            auth="token",
            token=auth.source,  # where it came from, never the token
            dashboard=None if auth.joining or not settings.dashboard else settings.dashboard_host,
            temp_dir=options.get("_temp_dir"),  # sockets, logs, spilled objects
        )

    def _ray_settings(self) -> RaySettings:
        given: Settings | None = self._limits["settings"]
        return given.ray if given is not None else RaySettings.from_env()

    def submit(
        self,
        spec: ToolSpec,
        ctx: ToolContext,
        args: dict[str, Any],
        reply: Any,
        wrappers: tuple[Any, ...] = (),
    ) -> None:
        """Send a validated call to its shard; `reply.set` gets the result or the error.

        Called in the caller's thread: the runtime's call `wrappers` (metrics, tracing) wrap
        the call here and see its answer (`ObservedReply`), as they would embedded.
        """
        if self._thread is None:
            raise RuntimeClosedError("the runtime is closed")
        if wrappers:
            reply = ObservedReply(reply, spec, ctx, wrappers)
        deadline = (
            getattr(reply, "deadline", None) or time.monotonic() + self._limits["call_timeout"]
        )
        asyncio.run_coroutine_threadsafe(
            self._deliver(spec, ctx, args, deadline, reply), self._loop
        )

    async def _deliver(
        self, spec: ToolSpec, ctx: ToolContext, args: dict[str, Any], deadline: float, reply: Any
    ) -> None:
        context = (ctx.principal, ctx.session_id, ctx.assistant_id, ctx.thread_id)
        # Runs at most once however often Ray delivers it (`ctxactors.ray._claims`).
        call_id = None if spec.read_only else secrets.token_hex(12)
        try:
            result: Any = await self._send(
                ctx.session_key,
                "call",
                spec.read_only,
                deadline,
                lambda layout, left: (layout, spec.name, context, args, left, call_id),
            )
        except CtxActorsError as exc:
            result = exc
        except Exception as exc:  # noqa: BLE001 - the caller gets an answer, whatever failed
            result = ToolResult.from_exception(exc)
        reply.set(result)

    async def _send(
        self,
        session: tuple[str | None, str],
        method: str,
        read_only: bool,
        deadline: float,
        make: Any,
    ) -> Any:
        """Call `method` on the session's shard with ``make(layout, seconds_left)``'s
        arguments; follow `Moved` answers; send again a read-only call whose shard failed,
        and any call whose shard was removed (a removed shard ran none: see `_removed`)."""
        import ray.exceptions as rex

        delays = iter(_RETRY_DELAYS)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CallTimeoutError(f"{method}: no answer from the shard in time")
            layout = self.layout
            index = owner(session, layout.count)
            shard = self._shard(index)
            try:
                if index in self._suspect and not read_only:
                    await self._until_alive(index, shard, deadline)
                answer = await getattr(shard, method).remote(*make(layout, left))
            except (rex.RayActorError, rex.ActorUnavailableError) as exc:
                if await self._removed(index):
                    continue
                if not read_only:
                    # Ray's advice: quarantine an unavailable actor until it answers again.
                    # A call that reached a shard process whose node is going down may still
                    # run there for a moment: the error waits until the shard answers
                    # (restarted, or reachable again), so a read-back after it most likely
                    # sees the call's final outcome.
                    self._suspect.add(index)
                    await self._until_alive(index, shard, deadline)
                    raise ShardUnavailableError(
                        f"shard {index} became unavailable during the call (Ray: "
                        f"{type(exc).__name__}); the call may or may not have been applied: "
                        "retry it when it is safe to"
                    ) from None
                self.retries += 1
                await asyncio.sleep(min(next(delays, _RETRY_DELAYS[-1]), max(left, 0)))
                continue
            if isinstance(answer, Moved):
                self._adopt(answer.layout)
                continue
            if isinstance(answer, Duplicate):
                raise ShardUnavailableError(
                    f"Ray delivered this call to shard {index} a second time after a failure "
                    "(nothing ran now); the first delivery may or may not have been applied: "
                    "retry it when it is safe to"
                )
            return answer

    async def _removed(self, index: int) -> bool:
        """Whether shard `index` is gone because it was removed (`remove_shards`): then the
        call that failed on it did not run, since a shard is stopped only after it adopted
        a layout in which it owns nothing (refusing every call) and its last calls ended."""
        latest = await asyncio.to_thread(self._directory.layout, self.layout.count)
        self._adopt(latest)
        return index >= latest.count

    async def _until_alive(self, index: int, shard: Any, deadline: float) -> None:
        """Wait until a shard that failed a call answers again, before sending it a call that
        changes state: Ray fails calls to a restarting actor at once, and each such call
        would be one more in doubt."""
        import ray.exceptions as rex

        delays = iter(_RETRY_DELAYS)
        while True:
            try:
                await shard.ping.remote()
                self._suspect.discard(index)
                return
            except (rex.RayActorError, rex.ActorUnavailableError):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CallTimeoutError(f"shard {index} did not come back in time") from None
                await asyncio.sleep(min(next(delays, _RETRY_DELAYS[-1]), left))

    # -- shards ----------------------------------------------------------------------------

    def _shard(self, index: int) -> Any:
        if self._thread is None:
            raise RuntimeClosedError("the Ray backend is not connected (or closed)")
        with self._lock:
            handle = self._handles.get(index)
            if handle is None:
                options = {
                    "name": _name(index),
                    "namespace": self.namespace,
                    "lifetime": "detached",
                    "get_if_exists": True,
                    "max_restarts": -1,
                    "max_task_retries": 0,  # a call's outcome is in doubt: the caller decides
                    "max_concurrency": 10_000,
                    "num_cpus": 0,
                    "scheduling_strategy": "SPREAD",
                    **self._options,
                }
                handle = self._handles[index] = self._actor_class.options(**options).remote(
                    index, self._config
                )
            return handle

    def _adopt(self, layout: Layout) -> None:
        """Route by `layout` if it is newer; forget the handles of shards it removed."""
        with self._lock:
            if layout.epoch > self.layout.epoch:
                self.layout = layout
                for index in [i for i in self._handles if i >= layout.count]:
                    del self._handles[index]

    def add_shards(self, count: int = 1) -> int:
        """Grow by `count` shards while serving; the new shard count (see `_change`)."""
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        return self._change(lambda current: current + count)

    def remove_shards(self, count: int = 1) -> int:
        """Shrink by `count` shards (the last ones) while serving; the new shard count.

        Only the sessions of the removed shards move (rendezvous hashing: every other
        session's highest-scoring shard is still there), each loading its state from the
        store on its next call. See `_change`.
        """
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")

        def smaller(current: int) -> int:
            if count >= current:
                raise ValueError(
                    f"cannot remove {count} of {current} shards: at least one must stay"
                )
            return current - count

        return self._change(smaller)

    def _change(self, size: Any) -> int:
        """Change the shard count to ``size(current)`` while serving; the new count.

        Order matters. The shards that lose sessions adopt the new layout first (refusing
        the sessions that moved, and waiting for their last calls), then those that gain
        sessions; only then does the stored layout change, and this front end with it.
        Other front ends learn it from their next `Moved` answer (or, for a removed shard,
        from the store). Every shard is told twice, before and after the stored layout
        changes, so one that Ray restarted in between (reading the old layout) learns it
        too. Removed shards are stopped last. One change at a time (a lock in Redis).
        """
        import ray

        self.connect()
        self._load_config()
        with self._directory.changing(self._limits["call_timeout"]):
            old = self._directory.layout(self.layout.count)
            new = old.next(size(old.count))
            if new.count > old.count:  # the old shards lose sessions, the new ones gain
                order = [*range(old.count), *range(old.count, new.count)]
            else:  # the removed shards lose every session, the others gain
                order = [*range(new.count, old.count), *range(new.count)]
            shards = {i: self._shard(i) for i in order}  # creates the new ones
            for index in order:
                self._until(lambda i=index: shards[i].resize.remote(new))
            self._directory.replace(old, new.count)
            for index in order:
                self._until(lambda i=index: shards[i].resize.remote(new))
            self._adopt(new)
            for index in range(new.count, old.count):
                ray.kill(shards[index], no_restart=True)
        return new.count

    def _load_config(self) -> None:
        """Not a front end (the CLI): create shards that serve what shard 0 serves."""
        import ray

        if self._config is not None:
            return
        try:
            first = ray.get_actor(_name(0), namespace=self.namespace)
        except ValueError:
            raise ValueError(
                f"no shards in Ray namespace {self.namespace!r}: start a front end first"
            ) from None
        self._config = cast(ShardConfig, ray.get(first.config.remote()))

    def _until(self, send: Any) -> Any:
        """``ray.get(send())``, sent again while the shard is restarting (within the call
        timeout): what it sends is safe to repeat."""
        import ray
        import ray.exceptions as rex

        deadline = time.monotonic() + self._limits["call_timeout"]
        delays = iter(_RETRY_DELAYS)
        while True:
            try:
                return ray.get(send())
            except (rex.RayActorError, rex.ActorUnavailableError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(next(delays, _RETRY_DELAYS[-1]))

    # -- session and runtime operations ------------------------------------------------------

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        wait = self._limits["call_timeout"] if timeout is None else timeout
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(wait + 1)

    def end_session(self, session_id: str, principal: str | None) -> int:
        deadline = time.monotonic() + self._limits["call_timeout"]
        stopped: int = self._run(
            self._send(
                (principal, session_id),
                "end_session",
                False,
                deadline,
                lambda layout, left: (layout, principal, session_id),
            )
        )
        return stopped

    def has_session(self, session_id: str, principal: str | None) -> bool:
        deadline = time.monotonic() + self._limits["call_timeout"]
        live: bool = self._run(
            self._send(
                (principal, session_id),
                "has_session",
                True,
                deadline,
                lambda layout, left: (layout, principal, session_id),
            )
        )
        return live

    def shard_stats(self) -> list[dict[str, Any]]:
        """Each shard's runtime stats, with its index, node and shard count. A shard Ray is
        restarting (its node died, say) is asked again until it answers (`_until`)."""
        return [self._until(lambda i=i: self._shard(i).stats.remote()) for i in range(self.count)]

    def stats(self) -> dict[str, int]:
        """The shards' runtime stats summed, plus ``shards`` and this front end's retries."""
        total: dict[str, int] = {}
        for shard in self.shard_stats():
            for name, value in shard.items():
                if name not in ("shard", "count", "epoch", "node_id", "pid", "peak_actors"):
                    total[name] = total.get(name, 0) + int(value)
        return {**total, "shards": self.count, "retries": self.retries}

    def reap(self) -> int:
        import ray

        return sum(ray.get([self._shard(i).reap.remote() for i in range(self.count)]))

    def kill_shards(self) -> None:
        """Stop every shard of the namespace (their state stays in the store)."""
        import ray

        self.connect()  # else Ray's calls would join whatever Ray they find, token or not
        for index in range(max(self.count, self._directory.layout(self.count).count)):
            try:
                ray.kill(ray.get_actor(_name(index), namespace=self.namespace), no_restart=True)
            except ValueError:  # never created
                pass
        with self._lock:
            self._handles.clear()

    def close(self) -> None:
        """Stop this front end's loop; the shards (detached) keep serving other front ends."""
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._thread = None
        self._directory.close()
