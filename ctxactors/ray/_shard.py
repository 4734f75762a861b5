"""A shard: one Ray actor process hosting many keys, as an embedded `Runtime` over Redis.

The embedded runtime already does everything a key needs (one pykka actor per key, TTL
reaping, caps, durable state with revision compare-and-set), so a shard only adds two
things: it takes calls as plain data from front ends, and it refuses sessions it does not
own under the current layout (`Moved`), which is what makes growing and shrinking safe:

- every call carries the sender's layout (epoch, shard count); a newer one than the
  shard's own is adopted at once (and the sessions that moved away are passivated: their
  state is in the store);
- a call for a session this shard does not own, or sent with an older layout, is answered
  `Moved(layout)` without running, so the front end re-routes with the newer layout and no
  stale live actor ever serves a session that another shard now owns. A shard being
  removed owns no session under the new layout: it refuses everything.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from typing import Any

import msgspec

from ctxactors.context import META_KEYS, SessionKey
from ctxactors.errors import StoreUnavailableError
from ctxactors.ray._claims import Claims
from ctxactors.ray._directory import Directory, Layout
from ctxactors.ray._hashing import owner
from ctxactors.results import ToolResult
from ctxactors.settings import Settings


class ShardConfig(msgspec.Struct, frozen=True):
    """What every shard is started with (plain data: it crosses to other nodes)."""

    namespace: str
    store: str  # a redis:// URL: the state shared by every shard and front end
    servers: list[str]  # MODULE:CLASS import paths, loaded on the shard's node
    shards: int
    ttl: float = 3600.0
    retention: float = 3600.0
    max_actors: int = 10_000
    max_actors_per_principal: int | None = None
    call_timeout: float = 30.0
    # The shard process is an entry point of its own: it configures logging (to its stderr,
    # which Ray keeps in the node's log directory) as the front end's command line did.
    log_level: str = "info"
    log_format: str = "json"
    # Every other limit (content, workspace, history...), as the front end's runtime has them.
    settings: Settings | None = None


class Moved(msgspec.Struct, frozen=True):
    """The answer to a call for a session this shard does not own: nothing ran."""

    layout: Layout


class Duplicate(msgspec.Struct, frozen=True):
    """The answer to a second delivery of a call that changes state: nothing ran now, and
    the first delivery may have run (see `ctxactors.ray._claims`)."""


def import_server(path: str) -> type[Any]:
    """``module:Class`` (or ``module:Outer.Inner``) to the class."""
    module_name, _, attr = path.partition(":")
    value: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        value = getattr(value, part)
    return value  # type: ignore[no-any-return]


class Shard:
    """The body of the shard actor (`RayBackend` wraps it with ``ray.remote``).

    Its methods are coroutines: a Ray async actor runs them all on one event loop, and the
    runtime's `acall` waits for a key's reply without blocking it.
    """

    def __init__(self, index: int, config: ShardConfig) -> None:
        from ctxactors import Runtime
        from ctxactors.logs import configure_logging
        from ctxactors.state import RedisStore

        configure_logging(level=config.log_level, format=config.log_format)

        self.index = index
        self.shard_config = config
        self._directory = Directory(config.store, config.namespace)
        self.layout = self._directory.layout(config.shards)
        self._claims = Claims(config.store, config.namespace, keep=4 * config.call_timeout)
        self.runtime = Runtime(
            [import_server(path) for path in config.servers],
            ttl=config.ttl,
            max_actors=config.max_actors,
            max_actors_per_principal=config.max_actors_per_principal,
            call_timeout=config.call_timeout,
            store=RedisStore(config.store, retention=config.retention),
            settings=config.settings,
        )
        # Passivating moved sessions is the registry's end_session: it keeps stored state.
        self._registry = self.runtime._registry  # noqa: SLF001 - same package family
        self.moved_away = 0  # sessions passivated because another shard owns them now
        self._draining: list[asyncio.Future[None]] = []

    def _owns(self, session: SessionKey, layout: Layout) -> Moved | None:
        if layout.epoch > self.layout.epoch:
            self._adopt(layout)
        if layout.epoch < self.layout.epoch or not self._owner_of(session):
            return Moved(self.layout)
        return None

    def _owner_of(self, session: SessionKey) -> bool:
        return owner(session, self.layout.count) == self.index

    def _adopt(self, layout: Layout) -> None:
        """Take a newer layout and passivate the sessions that moved away (their state is in
        the store: their next call loads it on their new shard).

        The layout changes at once, so from now on no call for a moved session runs here;
        the calls already queued to their actors finish, in a thread, before `resize`
        answers.
        """
        self.layout = layout
        gone = {key[1] for key in self._registry.keys()}
        gone = {s for s in gone if not self._owner_of(s)}
        self.moved_away += len(gone)
        if gone:
            self._draining.append(asyncio.ensure_future(asyncio.to_thread(self._passivate, gone)))

    def _passivate(self, sessions: set[SessionKey]) -> None:
        for session in sessions:
            # The registry's end_session retires the actors without deleting stored state.
            self._registry.end_session(session, wait=self.shard_config.call_timeout)

    async def call(
        self,
        layout: Layout,
        tool: str,
        context: tuple[str | None, str, str | None, str | None],
        arguments: dict[str, Any],
        timeout: float,
        call_id: str | None = None,
    ) -> ToolResult | Moved | Duplicate:
        """Run one call; `context` is ``(principal, session, assistant, thread)``.

        The context goes in as ``_meta`` and the principal as the transport's principal, so
        the shard's runtime reads exactly the context the front end read, and validates the
        arguments again (a shard trusts no sender with its keys' state). A call that
        changes state comes with a `call_id` and runs only on its first delivery.
        """
        principal, session, assistant, thread = context
        moved = self._owns((principal, session), layout)
        if moved is not None:
            return moved
        if call_id is not None:
            try:
                if not await self._claims.first(call_id):
                    return Duplicate()
            except StoreUnavailableError as exc:
                return ToolResult.error(f"not run: {exc}")
            # A newer layout may have come in while the claim was made (and its sessions
            # been passivated): check again, with nothing awaited from here to the submit,
            # and give the claim back when the call goes elsewhere.
            moved = self._owns((principal, session), layout)
            if moved is not None:
                await self._claims.release(call_id)
                return moved
        meta = {META_KEYS["session_id"]: session}
        if assistant is not None:
            meta[META_KEYS["assistant_id"]] = assistant
        if thread is not None:
            meta[META_KEYS["thread_id"]] = thread
        return await self.runtime.acall(
            tool, arguments, meta=meta, principal=principal, timeout=timeout
        )

    async def end_session(self, layout: Layout, principal: str | None, session: str) -> int | Moved:
        moved = self._owns((principal, session), layout)
        if moved is not None:
            return moved
        return await asyncio.to_thread(self.runtime.end_session, session, principal=principal)

    async def has_session(
        self, layout: Layout, principal: str | None, session: str
    ) -> bool | Moved:
        moved = self._owns((principal, session), layout)
        if moved is not None:
            return moved
        return self.runtime.has_session(session, principal=principal)

    async def resize(self, layout: Layout) -> int:
        """Adopt `layout` (if newer) and wait until the sessions that moved away have
        stopped, so their last saves are in the store; the sessions passivated so far."""
        if layout.epoch > self.layout.epoch:
            self._adopt(layout)
        while self._draining:
            await self._draining.pop()
        return self.moved_away

    async def reap(self) -> int:
        return await asyncio.to_thread(self.runtime.reap)

    async def stats(self) -> dict[str, Any]:
        import ray

        return {
            **self.runtime.stats(),
            "shard": self.index,
            "count": self.layout.count,
            "epoch": self.layout.epoch,
            "moved_away": self.moved_away,
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
        }

    async def ping(self) -> int:
        return self.index

    async def config(self) -> ShardConfig:
        """What this shard serves: a shard added from outside a front end copies it."""
        return self.shard_config
