"""Settings from the environment: a bad value fails loudly at import, naming the variable.

A limit that silently fell back to its default on a typo would look configured and not be.
"""

from __future__ import annotations

import os


def env_int(name: str, default: int) -> int:
    """An integer of at least 1 from the environment, or `default` when unset or blank."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def env_float(name: str, default: float) -> float:
    """A positive number from the environment, or `default` when unset or blank."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {raw!r}")
    return value
