"""Which shard owns a session: rendezvous (highest random weight) hashing.

Every front end computes the same owner from the session and the shard count alone, so
two front ends agree with no coordination. Going from N to N+1 shards moves only the
sessions whose highest score is now the new shard's (about 1/(N+1) of them); a plain
``hash % N`` would move most of them. Placement is per session, not per key: a session's
keys share its operation history, batch and workspace, which must live in one process.
"""

from __future__ import annotations

import hashlib

import msgspec

from ctxactors.context import SessionKey

_encode = msgspec.msgpack.Encoder().encode


def score(session: SessionKey, shard: int) -> int:
    """The session's weight on `shard`; the principal is part of it (A's "s1" is not B's)."""
    digest = hashlib.blake2b(_encode([session[0], session[1], shard]), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(session: SessionKey, shards: int) -> int:
    """The index (0..shards-1) of the shard that owns `session`."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    return max(range(shards), key=lambda shard: score(session, shard))
