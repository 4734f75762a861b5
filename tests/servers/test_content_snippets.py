"""Search snippets and occurrence counts, exactly: the text around the first hit, hits marked."""

from __future__ import annotations

import pytest

from ctxactors.servers.content import _folded, _occurrences, _snippet


@pytest.mark.parametrize(
    ("content", "terms", "snippet"),
    [
        # 60 characters either side of the first hit, cut marks where text was left out
        (
            "a" * 100 + "needle" + "b" * 100,
            ["needle"],
            "…" + "a" * 60 + "[needle]" + "b" * 54 + "…",
        ),
        # case-insensitive, every hit in the window marked, in the content's own case
        (
            "x" * 10 + "Rust and rust" + "y" * 10,
            ["rust"],
            "x" * 10 + "[Rust] and [rust]" + "y" * 10,
        ),
        # at one position the longer term wins; a shorter one is found where it alone fits
        ("abc abcd abcde", ["abcd", "abc"], "[abc] [abcd] [abcd]e"),
        # a match on the filename only: the head of the content
        ("short text", ["zzz"], "short text"),
        # a hit at the very start; a window starting at 1 still shows its cut mark
        ("needle and more", ["needle"], "[needle] and more"),
        ("x" + "a" * 60 + "needle", ["needle"], "…" + "a" * 60 + "[needle]"),
        # a hit starting exactly where the window ends is left out
        ("ab" + "x" * 58 + "ab" + "y" * 10, ["ab"], "[ab]" + "x" * 58 + "…"),
        ("q" * 130, ["zzz"], "q" * 120 + "…"),
        ("line one\nline two\nhit here", ["hit"], "line one line two [hit] here"),
        # lower-casing would change lengths: match as given
        ("İstanbul İzmir", ["İzmir"], "İstanbul [İzmir]"),
        (
            "k" * 55 + "AB" + "cc" + "AB" + "z" * 70,
            ["ab"],
            "k" * 55 + "[AB]cc[AB]" + "z" * 54 + "…",
        ),
        # a hit that starts inside the window is marked whole, and the window grows to it
        (
            "w" * 10 + "x" + "w" * 58 + "xyzxyz",
            ["x", "xyzxyz"],
            "w" * 10 + "[x]" + "w" * 58 + "[xyzxyz]",
        ),
        # however long: a 150-character term, first or later in the window
        ("start " + "x" * 150 + " end", ["x" * 150], "start [" + "x" * 150 + "]…"),
        (
            "w" * 10 + "x" + "w" * 58 + "y" * 100,
            ["x", "y" * 100],
            "w" * 10 + "[x]" + "w" * 58 + "[" + "y" * 100 + "]",
        ),
    ],
)
def test_snippet(content: str, terms: list[str], snippet: str) -> None:
    assert _snippet(content, terms) == snippet


def test_occurrences_fold_case_unless_lengths_change() -> None:
    assert _occurrences("Rust rust RUST", ["rust"]) == 3
    assert _occurrences("Rust rust RUST", ["RUST", "rust"]) == 3  # one needle after folding
    assert _occurrences("İx İx", ["İx", "ix"]) == 2  # not folded: only the exact "İx"
    assert _folded("AbC", ["aB", "ab", "C"]) == ("abc", ["c", "ab"])
    assert _folded("İx", ["İX", "b"]) == ("İx", ["b", "İX"])
