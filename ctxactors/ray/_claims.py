"""At most once: a call that changes state runs at most once, however often Ray delivers it.

Ray promises that an actor task with ``max_task_retries=0`` is never run twice; this makes
it hold whatever the path of a second delivery: each such call carries an id chosen by its
front end, and a shard claims the id in Redis (``SET NX``, kept for a few call timeouts)
just before running it; a second delivery finds the claim and runs nothing, and its caller
learns the call is in doubt. (The calls once seen applied twice under a node kill were
not Ray's doing: the MCP client re-sent them, with a new id, on the error code -32020,
which `ShardUnavailableError` no longer uses.)
"""

from __future__ import annotations

from typing import Any

from ctxactors.errors import StoreUnavailableError
from ctxactors.state._redis import error_kind


class Claims:
    """The call ids claimed in one namespace (Redis keys that expire)."""

    def __init__(self, url: str, namespace: str, keep: float) -> None:
        import redis.asyncio

        self._redis: Any = redis.asyncio.Redis.from_url(
            url, socket_timeout=5, socket_connect_timeout=5
        )
        self._prefix = f"ctxactors:ray:{namespace}:call:"
        self._keep = max(int(keep), 1)

    async def first(self, call_id: str) -> bool:
        """Claim `call_id`; False when it was claimed before (a second delivery)."""
        import redis

        try:
            return bool(await self._redis.set(self._prefix + call_id, 1, nx=True, ex=self._keep))
        except redis.RedisError as exc:
            # Its kind only: the text names Redis's address, and this reaches the tenant as
            # the call's result. (The store's own errors, on the same Redis, log the detail.)
            raise StoreUnavailableError(
                f"the state store did not answer: {error_kind(exc)}"
            ) from exc

    async def release(self, call_id: str) -> None:
        """Give back a claim whose call did not run (best effort: a claim left behind makes
        the call's next delivery in doubt, never run twice)."""
        import redis

        try:
            await self._redis.delete(self._prefix + call_id)
        except redis.RedisError:
            pass
