"""Choosing a store from the command line: ``sqlite`` (the default, a file under the data
directory), ``memory``, or a ``redis://`` / ``rediss://`` / ``unix://`` URL."""

from __future__ import annotations

import os
from pathlib import Path

from ctxactors.state._base import StateStore
from ctxactors.state._sqlite import SQLiteStore

DB_NAME = "state.db"


def default_data_dir() -> Path:
    """``$XDG_STATE_HOME/ctxactors``, or ``~/.local/state/ctxactors`` (the XDG default)."""
    base = os.environ.get("XDG_STATE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "ctxactors"


def open_store(spec: str, *, data_dir: Path | None, retention: float) -> StateStore | None:
    """The store `spec` names; None for ``memory``: state lives only in the actors, as
    with no store (a `MemoryStore` would only add copies in the same process).

    Raises `ValueError` for a spec it does not know.
    """
    if not retention > 0:
        raise ValueError(f"retention must be positive, got {retention}")
    if spec == "memory":
        return None
    if spec == "sqlite":
        directory = data_dir or default_data_dir()
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        return SQLiteStore(directory / DB_NAME, retention=retention)
    if spec.startswith(("redis://", "rediss://", "unix://")):
        from ctxactors.state._redis import RedisStore

        return RedisStore(spec, retention=retention)
    raise ValueError(f"unknown store {spec!r}: use sqlite, memory or a redis:// URL")
