"""The Redis store: a hash per session, a compare-and-set script per save, MULTI per batch.

A session is one hash (``<prefix>:<session as JSON>``), with two fields per key: ``r<key>``
the revision and ``d<key>`` the state. Keeping a session in one hash lets Redis do the
retention itself (one PEXPIRE per save or load refreshes the whole session) and makes
`delete_session` a single DEL. Each save runs `_CAS` (atomic in Redis), and a batch of saves
goes in one MULTI/EXEC round trip: that is group commit for Redis. For durability run the
server with ``--appendonly yes --appendfsync always``.

Uses the official ``redis`` package (the ``ctxactors[redis]`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxactors.state._base import (
    Outcome,
    Record,
    SessionRef,
    StaleStateError,
    StateKey,
    StoreUnavailableError,
    Write,
    encode_ref,
)

# KEYS[1]: the session hash. ARGV: key, expected revision, "s"ave or "d"elete, data, TTL ms.
# Returns {1, new revision} on success, {0, current revision} when `expected` is stale.
_CAS = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'r' .. ARGV[1]) or '0')
if cur ~= tonumber(ARGV[2]) then return {0, cur} end
if ARGV[3] == 'd' then
  redis.call('HDEL', KEYS[1], 'r' .. ARGV[1], 'd' .. ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {1, 0}
end
redis.call('HSET', KEYS[1], 'r' .. ARGV[1], cur + 1, 'd' .. ARGV[1], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1, cur + 1}
"""


class RedisStore:
    """Key state in Redis; safe for many processes on one server (revisions guard saves)."""

    def __init__(
        self,
        url: str,
        *,
        retention: float = 3600.0,
        prefix: str = "ctxactors",
        timeout: float = 5.0,
    ) -> None:
        import redis

        self.retention = retention
        self._prefix = prefix
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError,)
        self._redis = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self._cas = self._redis.register_script(_CAS)

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.retention * 1000))

    def _hash(self, session: SessionRef) -> str:
        return f"{self._prefix}:{encode_ref(session)}"

    def load(self, session: SessionRef, key: StateKey) -> Record | None:
        name, field = self._hash(session), encode_ref(key)
        try:
            pipe = self._redis.pipeline(transaction=True)
            pipe.hmget(name, "r" + field, "d" + field)
            pipe.pexpire(name, self._ttl_ms)
            (revision, data), _ = pipe.execute()
        except self._errors as exc:
            raise StoreUnavailableError(f"Redis store unavailable: {exc}") from exc
        return None if revision is None else Record(int(revision), bytes(data))

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        try:
            pipe = self._redis.pipeline(transaction=True)
            for w in writes:
                action = "d" if w.data is None else "s"
                args: list[Any] = [encode_ref(w.key), w.expected, action, w.data or b""]
                self._cas(keys=[self._hash(w.session)], args=[*args, self._ttl_ms], client=pipe)
            replies = pipe.execute()
        except self._errors as exc:
            raise StoreUnavailableError(f"Redis store unavailable: {exc}") from exc
        outcomes: list[Outcome] = []
        for w, (ok, revision) in zip(writes, replies, strict=True):
            if ok:
                outcomes.append(int(revision))
            elif w.data is None and w.expected == 0:
                outcomes.append(0)
            else:
                outcomes.append(StaleStateError(w.key, w.expected, int(revision)))
        return outcomes

    def delete_session(self, session: SessionRef) -> int:
        name = self._hash(session)
        try:
            pipe = self._redis.pipeline(transaction=True)
            pipe.hlen(name)
            pipe.delete(name)
            fields, _ = pipe.execute()
        except self._errors as exc:
            raise StoreUnavailableError(f"Redis store unavailable: {exc}") from exc
        return int(fields) // 2

    def purge(self) -> int:
        return 0  # Redis expires whole sessions itself (PEXPIRE on every save and load)

    def close(self) -> None:
        self._redis.close()
