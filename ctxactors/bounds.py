"""Bounded state and bounded answers, so no key or answer grows with what a caller sends.

`text_size` and `check_text` measure a text the way the caps are set (UTF-8 bytes);
`AnswerBudget` cuts a list answer once its JSON would pass the runtime's
``max_answer_bytes`` (``CTXACTORS_MAX_ANSWER_BYTES``).
A cut answer keeps its leading items and says so (``truncated``, and the totals), never
failing the call: the caller still gets what fits and learns that there is more.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec

from ctxactors.errors import ToolError
from ctxactors.settings import Cap

T = TypeVar("T")

_encode = msgspec.json.Encoder().encode
_ENVELOPE = 256  # bytes kept for the answer's own keys around its lists


def text_size(text: str) -> int:
    """UTF-8 bytes of `text` (no copy for ASCII, the common case)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def check_text(cap: Cap, what: str, text: str) -> int:
    """The UTF-8 size of `text`, or `ToolError` naming the cap when it is over it."""
    size = text_size(text)
    if size > cap.value:
        raise ToolError(cap.exceeded(f"{what} is {size:,} bytes of UTF-8"))
    return size


def check_texts(cap: Cap, what: str, texts: Iterable[str]) -> int:
    """The UTF-8 size of all `texts` together; each must be within `cap`."""
    return sum(check_text(cap, f"{what} {i}", text) for i, text in enumerate(texts, 1))


class AnswerBudget:
    """How many more bytes of JSON a list answer may hold; `cut` once an item did not fit."""

    __slots__ = ("left", "cut")

    def __init__(self, max_bytes: int) -> None:
        self.left = max_bytes - _ENVELOPE
        self.cut = False

    def take(self, items: Iterable[T]) -> list[T]:
        """The leading items that fit; stops at the first that doesn't (order is kept)."""
        kept: list[T] = []
        if self.cut:
            return kept
        for item in items:
            size = len(_encode(item)) + 1  # and its comma
            if size > self.left:
                self.cut = True
                break
            self.left -= size
            kept.append(item)
        return kept

    def mark(self, answer: dict[str, Any], **totals: int) -> dict[str, Any]:
        """`answer`, plus ``truncated`` and the totals when something was left out."""
        if self.cut:
            answer["truncated"] = True
            answer.update(totals)
        return answer
