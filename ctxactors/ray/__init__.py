"""The Ray backend: key actors sharded over a Ray cluster, stateless front ends.

``Runtime(backend=RayBackend(address=..., shards=N, store="redis://..."))`` validates in the
caller as the embedded runtime does, then runs each call in the Ray shard actor that owns
its session (rendezvous hashing); state lives in Redis, so a restarted or moved shard
loads it on the session's next call. Ray is only ever started or joined with its own token
authentication (`RayAuthError` when that can't be: see ``ctxactors.ray._auth``). Needs the
``ray`` extra (``pip install ctxactors[ray]``).
"""

from ctxactors.ray._auth import RayAuthError
from ctxactors.ray._backend import RayBackend, ShardUnavailableError
from ctxactors.ray._hashing import owner

__all__ = ["RayAuthError", "RayBackend", "ShardUnavailableError", "owner"]
