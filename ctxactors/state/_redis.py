"""The Redis store: a hash per session, a compare-and-set script per save, MULTI per batch.

A session is one hash (``<prefix>:<session as JSON>``), with two fields per key: ``r<key>``
the revision and ``d<key>`` the state, and for a key with parts one field per part
(``p<key>\\0<name>``: a key is JSON, which never holds a raw NUL) and their count
``n<key>``. Keeping a session in one hash lets Redis do the retention itself (one PEXPIRE
per save or load refreshes the whole session) and makes `delete_session` one DEL. Each
save runs `_CAS` (atomic in Redis, parts included), and a batch of saves goes in one
MULTI/EXEC round trip: that is group commit for Redis. For durability run the
server with ``--appendonly yes --appendfsync always``.

An outage's `StoreUnavailableError` says what kind it is (no connection, a timeout, Redis's
error code) but not where Redis is: its message reaches tenants, in a tool's error result.
The detail (redis-py's own words, with the address; passwords hidden) goes to the log
instead, once a second at most.

Uses the official ``redis`` package (the ``ctxactors[redis]`` extra).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ctxactors.logs import get_logger
from ctxactors.redis_url import redact
from ctxactors.state._base import (
    Outcome,
    Record,
    SessionRef,
    StaleStateError,
    StateKey,
    StoreUnavailableError,
    Write,
    encode_ref,
    principal_prefix,
)

# KEYS[1]: the session hash. ARGV: key, expected revision, "s"ave or "d"elete, data, TTL ms,
# then a name, "s"/"d" and data for each part. Returns {1, new revision} on success, {0,
# current revision} when `expected` is stale. Field ``n<key>`` counts the key's parts, so a
# load reads the hash's other fields only for a key that has some.
_CAS = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'r' .. ARGV[1]) or '0')
if cur ~= tonumber(ARGV[2]) then return {0, cur} end
local prefix = 'p' .. ARGV[1] .. '\\0'
if ARGV[3] == 'd' then
  if redis.call('HEXISTS', KEYS[1], 'n' .. ARGV[1]) == 1 then
    for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
      if string.sub(field, 1, #prefix) == prefix then redis.call('HDEL', KEYS[1], field) end
    end
  end
  redis.call('HDEL', KEYS[1], 'r' .. ARGV[1], 'd' .. ARGV[1], 'n' .. ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {1, 0}
end
redis.call('HSET', KEYS[1], 'r' .. ARGV[1], cur + 1, 'd' .. ARGV[1], ARGV[4])
local count = 0
for i = 6, #ARGV, 3 do
  if ARGV[i + 1] == 'd' then
    count = count - redis.call('HDEL', KEYS[1], prefix .. ARGV[i])
  else
    count = count + redis.call('HSET', KEYS[1], prefix .. ARGV[i], ARGV[i + 2])
  end
end
if count ~= 0 then redis.call('HINCRBY', KEYS[1], 'n' .. ARGV[1], count) end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1, cur + 1}
"""

# KEYS[1]: the session hash. ARGV: key, TTL ms. Returns {} or {revision, data, part names
# and data alternating...}, and refreshes the session's retention.
_LOAD = """
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local got = redis.call('HMGET', KEYS[1], 'r' .. ARGV[1], 'd' .. ARGV[1], 'n' .. ARGV[1])
if not got[1] then return {} end
local out = {got[1], got[2]}
if got[3] and tonumber(got[3]) > 0 then
  local prefix = 'p' .. ARGV[1] .. '\\0'
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, #prefix) == prefix then
      out[#out + 1] = string.sub(all[i], #prefix + 1)
      out[#out + 1] = all[i + 1]
    end
  end
end
return out
"""

# KEYS[1]: the session hash. Deletes it; returns how many keys it held.
_DELETE = """
local n = 0
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, 1) == 'r' then n = n + 1 end
end
redis.call('DEL', KEYS[1])
return n
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
        self._load = self._redis.register_script(_LOAD)
        self._delete = self._redis.register_script(_DELETE)
        self._log = get_logger("ctxactors.store", store="redis")
        self._logged = threading.Lock()
        self._logged_at = -1.0e9
        self._unlogged = 0

    def _unavailable(self, exc: BaseException) -> StoreUnavailableError:
        """The tenant-facing error for redis-py's `exc`; its detail goes to the log."""
        with self._logged:
            now = time.monotonic()
            if now - self._logged_at < 1.0:
                self._unlogged += 1
            else:
                self._log.warning(
                    "redis_unavailable", error=redact(str(exc)), not_logged=self._unlogged
                )
                self._logged_at, self._unlogged = now, 0
        return StoreUnavailableError(f"Redis store unavailable: {error_kind(exc)}")

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.retention * 1000))

    def _hash(self, session: SessionRef) -> str:
        return f"{self._prefix}:{encode_ref(session)}"

    def load(self, session: SessionRef, key: StateKey) -> Record | None:
        try:
            got = self._load(keys=[self._hash(session)], args=[encode_ref(key), self._ttl_ms])
        except self._errors as exc:
            raise self._unavailable(exc) from exc
        if not got:
            return None
        parts = {bytes(got[i]).decode(): bytes(got[i + 1]) for i in range(2, len(got), 2)}
        return Record(int(got[0]), bytes(got[1]), parts)

    def touch(self, sessions: Iterable[SessionRef]) -> None:
        try:
            pipe = self._redis.pipeline(transaction=False)
            for session in sessions:
                pipe.pexpire(self._hash(session), self._ttl_ms)
            pipe.execute()
        except self._errors as exc:
            raise self._unavailable(exc) from exc

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        try:
            pipe = self._redis.pipeline(transaction=True)
            for w in writes:
                action = "d" if w.data is None else "s"
                args: list[Any] = [encode_ref(w.key), w.expected, action, w.data or b""]
                args.append(self._ttl_ms)
                for name, data in w.parts:
                    args += [name, "d", b""] if data is None else [name, "s", data]
                self._cas(keys=[self._hash(w.session)], args=args, client=pipe)
            replies = pipe.execute()
        except self._errors as exc:
            raise self._unavailable(exc) from exc
        outcomes: list[Outcome] = []
        for w, (ok, revision) in zip(writes, replies, strict=True):
            if ok:
                outcomes.append(int(revision))
            else:  # a delete expecting no key that finds one is stale too, as in every store
                outcomes.append(StaleStateError(w.key, w.expected, int(revision)))
        return outcomes

    def delete_session(self, session: SessionRef) -> int:
        try:
            return int(self._delete(keys=[self._hash(session)]))
        except self._errors as exc:
            raise self._unavailable(exc) from exc

    def part_bytes(self, principal: str, key: StateKey) -> dict[str, int]:
        return self._field_bytes(principal, b"p" + encode_ref(key).encode() + b"\0")

    def principal_bytes(self, principal: str) -> dict[str, int]:
        return self._field_bytes(principal, b"d")  # every key's state, no part

    def _field_bytes(self, principal: str, start: bytes) -> dict[str, int]:
        """Session id -> bytes of the fields named `start`... in each of `principal`'s
        session hashes that has some."""
        hashes = f"{self._prefix}:{principal_prefix(principal)}"
        out: dict[str, int] = {}
        try:
            for name in self._redis.scan_iter(match=_glob_escape(hashes) + "*", count=1000):
                fields = [f for f in self._redis.hkeys(name) if _raw(f).startswith(start)]
                if not fields:
                    continue
                pipe = self._redis.pipeline(transaction=False)
                for f in fields:
                    pipe.hstrlen(name, f)
                session = json.loads(_raw(name)[len(self._prefix.encode()) + 1 :])
                out[str(session[1])] = sum(int(n) for n in pipe.execute())
        except self._errors as exc:
            raise self._unavailable(exc) from exc
        return out

    def purge(self) -> int:
        return 0  # Redis expires whole sessions itself (PEXPIRE on every save and load)

    def close(self) -> None:
        self._redis.close()


def _glob_escape(text: str) -> str:
    """`text` matched literally by a Redis glob pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _raw(value: bytes | str) -> bytes:
    """A reply as bytes (the client answers bytes unless told to decode)."""
    return value if isinstance(value, bytes) else value.encode()


def error_kind(exc: BaseException) -> str:
    """What a tenant may be told of redis-py's `exc`: its kind, never its text (which names
    the server's address)."""
    import redis

    if isinstance(exc, redis.TimeoutError):
        return "Redis did not answer in time"
    if isinstance(exc, redis.AuthenticationError):
        return "Redis refused the credentials"
    if isinstance(exc, redis.ConnectionError):
        return "no connection to Redis"
    if isinstance(exc, redis.ResponseError):
        code = str(exc).split(" ", 1)[0]
        return f"Redis answered {code if code.isupper() else 'an error'}"
    return type(exc).__name__
