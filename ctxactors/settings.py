"""Settings from the environment: a bad value fails loudly at import, naming the variable.

A limit that silently fell back to its default on a typo would look configured and not be.
"""

from __future__ import annotations

import os
from typing import NamedTuple


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


class Cap(NamedTuple):
    """A configured limit with the variable that sets it, so a refusal can name both."""

    setting: str
    value: int

    @classmethod
    def from_env(cls, setting: str, default: int) -> Cap:
        return cls(setting, env_int(setting, default))

    def exceeded(self, what: str) -> str:
        """A refusal: ``"<what>: the limit is 100 (CTXACTORS_...)"``."""
        return f"{what}: the limit is {self.value:,} ({self.setting})"


# Shared by the servers that keep text (goals, todos, playbook steps): one text's size in
# UTF-8 bytes; and the JSON size of one list answer (above what a full key holds, so only
# content listings, histories and escape-heavy text are ever cut).
MAX_TEXT_BYTES = Cap.from_env("CTXACTORS_MAX_TEXT_BYTES", 64 << 10)
MAX_ANSWER_BYTES = Cap.from_env("CTXACTORS_MAX_ANSWER_BYTES", 16 << 20)
