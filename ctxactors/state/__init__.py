"""Where key state lives beyond its actor: the store contract and its three stores.

`MemoryStore` (tests, ephemeral), `SQLiteStore` (one file, the default of ``ctxactors
serve``), `RedisStore` (many processes on one Redis). Every save is a compare-and-set on a
revision, so only one writer per key ever wins; `GroupCommit` writes many saves together.
"""

from ctxactors.state._base import (
    Outcome,
    Part,
    Record,
    SessionRef,
    StaleStateError,
    StateKey,
    StateStore,
    StoreError,
    StoreUnavailableError,
    Write,
    encode_ref,
)
from ctxactors.state._commit import Done, GroupCommit, Pending, answering
from ctxactors.state._memory import MemoryStore
from ctxactors.state._open import default_data_dir, open_store
from ctxactors.state._redis import RedisStore
from ctxactors.state._sqlite import SQLiteStore

__all__ = [
    "Done",
    "GroupCommit",
    "MemoryStore",
    "Outcome",
    "Part",
    "Pending",
    "Record",
    "RedisStore",
    "SQLiteStore",
    "SessionRef",
    "StaleStateError",
    "StateKey",
    "StateStore",
    "StoreError",
    "StoreUnavailableError",
    "Write",
    "answering",
    "default_data_dir",
    "encode_ref",
    "open_store",
]
