"""Shortening a text to a token budget, visibly.

A tool result too large for the window, or a user request restated in the system prompt,
keeps its beginning and says that it was cut and by how much, so the model knows it is
reading part of something rather than all of it.
"""

from __future__ import annotations

from ctxactors.conversation.tokens import TokenCounter

SHORTENED_MARK = "[shortened:"


def shortened_marker(kept: int, total: int) -> str:
    """The note appended to a shortened text (``kept`` of ``total`` characters)."""
    return f"{SHORTENED_MARK} kept the first {kept:,} of {total:,} characters]"


def is_shortened(text: str | None) -> bool:
    return bool(text) and SHORTENED_MARK in text  # type: ignore[operator]


def marker_cost(text: str, counter: TokenCounter) -> int:
    """Tokens of the shortest form of `text`: the marker alone."""
    return counter.count_text(shortened_marker(0, len(text)))


def shorten_text(text: str, max_tokens: int, counter: TokenCounter) -> str:
    """`text` if it fits in `max_tokens`, else its longest head that fits with the marker.

    The result is guaranteed to count at most `max_tokens` with `counter`: it is measured,
    not estimated. When not even the marker fits, the result is ``""``. Only a prefix a few
    times longer than the budget is ever tokenized, so shortening a megabyte costs little.
    """
    if max_tokens <= 0:
        return ""
    total = len(text)
    # A token rarely covers more than 8 characters; look no further than that.
    probe = min(total, 8 * max_tokens + 64)
    if probe == total and counter.count_text(text) <= max_tokens:
        return text

    def candidate(cut: int) -> str:
        marker = shortened_marker(cut, total)
        return f"{text[:cut]}\n{marker}" if cut else marker

    fits, fails = 0, probe + 1  # invariant: candidate(fits) fits; cut >= fails doesn't
    cut = probe
    for _ in range(24):
        used = counter.count_text(candidate(cut))
        if used <= max_tokens:
            fits = cut
            if used >= max_tokens - 1 or fails - fits <= 1:
                break
            guess = int(cut * max_tokens / max(used, 1))
        else:
            fails = cut
            guess = int(cut * max_tokens / used * 0.97)
        # Proportional guesses converge fast; bisect when they leave the open bracket.
        cut = guess if fits < guess < fails else (fits + fails) // 2
        if cut <= fits:
            break
    result = candidate(fits)
    return result if counter.count_text(result) <= max_tokens else ""
