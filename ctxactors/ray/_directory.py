"""The shard count, kept in the same Redis as the key state.

A shard restarted by Ray gets its original constructor arguments back, so it can't learn
the current count from them; it reads it here. The count only grows: `raise_count` never
lowers it, so a front end or shard with an old view can only be behind, never ahead.
"""

from __future__ import annotations

from typing import Any

from ctxactors.errors import StoreUnavailableError

_RAISE = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local new = tonumber(ARGV[1])
if new > cur then redis.call('SET', KEYS[1], new) return new end
return cur
"""


class Directory:
    """The shard count of one namespace (a Redis key with no expiry)."""

    def __init__(self, url: str, namespace: str) -> None:
        import redis

        self._redis: Any = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._key = f"ctxactors:ray:{namespace}:shards"
        self._raise = self._redis.register_script(_RAISE)

    def count(self, default: int) -> int:
        """The stored count, or `default` when none is stored yet (which is then stored)."""
        return self.raise_to(default)

    def raise_to(self, count: int) -> int:
        """Store `count` if it is larger; the count now stored.

        Raises `StoreUnavailableError` when Redis can't be reached.
        """
        import redis

        try:
            return int(self._raise(keys=[self._key], args=[count]))
        except redis.RedisError as exc:
            raise StoreUnavailableError(f"the shard count's Redis: {exc}") from exc

    def close(self) -> None:
        self._redis.close()
