"""The shard layout (an epoch and a shard count), kept in the same Redis as the key state.

A shard restarted by Ray gets its original constructor arguments back, so it can't learn
the current layout from them; it reads it here. Every change of the count (growing or
shrinking) takes the next epoch, so "newer" is always "larger epoch": a front end or shard
with an old view is behind, never ahead, whichever way the count went. Changes are made by
one admin at a time (`changing`, a Redis lock), and the stored layout is set with a
compare-and-set of its epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from ctxactors.errors import StoreUnavailableError

# KEYS[1]: the layout hash. ARGV: the default count. The stored layout, created if missing.
_GET = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then
  redis.call('HSET', KEYS[1], 'epoch', 1, 'count', ARGV[1])
  return {1, tonumber(ARGV[1])}
end
return {tonumber(epoch), tonumber(redis.call('HGET', KEYS[1], 'count'))}
"""
# ARGV: the epoch the change was planned from, the new count. The layout now stored.
_SET = """
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if epoch == tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'epoch', epoch + 1, 'count', ARGV[2])
  return {epoch + 1, tonumber(ARGV[2])}
end
return {epoch, tonumber(redis.call('HGET', KEYS[1], 'count'))}
"""


class Layout(msgspec.Struct, frozen=True, array_like=True):
    """How many shards own sessions (indexes ``0..count-1``), as of `epoch`."""

    epoch: int
    count: int

    def next(self, count: int) -> Layout:
        return Layout(self.epoch + 1, count)


class LayoutChangedError(RuntimeError):
    """Another admin changed the layout first; nothing of this change was stored."""


class Directory:
    """The shard layout of one namespace (a Redis hash with no expiry)."""

    def __init__(self, url: str, namespace: str) -> None:
        import redis

        self._redis: Any = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._key = f"ctxactors:ray:{namespace}:layout"
        self._lock_key = f"ctxactors:ray:{namespace}:changing"
        self._get = self._redis.register_script(_GET)
        self._set = self._redis.register_script(_SET)

    def layout(self, default: int) -> Layout:
        """The stored layout, or ``(1, default)`` when none is stored yet (then stored).

        Raises `StoreUnavailableError` when Redis can't be reached.
        """
        return self._run(self._get, [default])

    def replace(self, planned: Layout, count: int) -> Layout:
        """Store `count` as the next epoch if the stored one is still `planned`'s."""
        stored = self._run(self._set, [planned.epoch, count])
        if stored != planned.next(count):
            raise LayoutChangedError(
                f"the shard layout changed meanwhile (epoch {stored.epoch}, {stored.count} "
                "shards): look again and retry"
            )
        return stored

    @contextmanager
    def changing(self, timeout: float) -> Iterator[None]:
        """Hold the lock of one admin changing the layout (others wait up to `timeout`)."""
        import redis

        lock = self._redis.lock(self._lock_key, timeout=timeout * 4, blocking_timeout=timeout)
        if not lock.acquire():
            raise LayoutChangedError(
                f"another change of the shard layout is still running after {timeout:g} s: "
                "retry when it is done"
            )
        try:
            yield
        finally:
            try:
                lock.release()
            except redis.exceptions.LockError:  # held past its expiry: the CAS still guards
                pass

    def _run(self, script: Any, args: list[int]) -> Layout:
        import redis

        try:
            epoch, count = script(keys=[self._key], args=args)
        except redis.RedisError as exc:
            raise StoreUnavailableError(f"the shard layout's Redis: {exc}") from exc
        return Layout(int(epoch), int(count))

    def close(self) -> None:
        self._redis.close()
