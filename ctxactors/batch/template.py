"""Placeholders inside argument values: `${id.path}` references and preset `{{param}}`s.

A `Template` finds one syntax of placeholder in nested argument values, says how large the
values would become once filled (before building them: a 1 MiB value referenced 200 times
must be refused, not built), and fills them.

Scanning is linear in the input. Both patterns are one run of a character class between
fixed delimiters, and that class excludes the opening character (``$`` or ``{``), so a
match attempt reads at most up to the next opening character: attempts from different
openings read disjoint spans. (The old ``\\$\\{([^}.\\s]+)((?:\\.[^}.\\s]+)*)\\}`` let a
run include ``$`` and ``{``, so every ``${`` read to the end of the text: ``"${a" * n``
took 3 s at n = 8000 and would take about a day at 4 MiB.)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import msgspec

K = TypeVar("K")


class Template(Generic[K]):
    """One placeholder syntax: `pattern` captures the body, `parse` turns it into a key
    (or None: not a placeholder after all, the text stays as it is)."""

    def __init__(self, pattern: str, parse: Callable[[str], K | None]) -> None:
        self._pattern = re.compile(pattern)
        self._parse = parse

    def _found(self, text: str) -> Iterator[tuple[re.Match[str], K]]:
        for match in self._pattern.finditer(text):
            key = self._parse(match.group(1))
            if key is not None:
                yield match, key

    def whole(self, text: str) -> K | None:
        """The key when `text` is exactly one placeholder (it then keeps the value's type)."""
        match = self._pattern.fullmatch(text)
        return None if match is None else self._parse(match.group(1))

    def keys(self, value: Any) -> list[K]:
        """Every placeholder in a nested value, in order, repeats included."""
        if isinstance(value, str):
            return [key for _, key in self._found(value)]
        if isinstance(value, dict):
            return [key for item in value.values() for key in self.keys(item)]
        if isinstance(value, list):
            return [key for item in value for key in self.keys(item)]
        return []

    def filled_size(self, value: Any, size: Callable[[K], int]) -> int:
        """How many bytes of text the placeholders' strings will hold once filled.

        `size(key)` is the filled value's size; strings without placeholders count 0,
        since they exist already. Nothing is built.
        """
        if isinstance(value, str):
            total, found = len(value), 0
            for match, key in self._found(value):
                found += 1
                total += size(key) - len(match.group(0))
            return total if found else 0
        if isinstance(value, dict):
            return sum(self.filled_size(item, size) for item in value.values())
        if isinstance(value, list):
            return sum(self.filled_size(item, size) for item in value)
        return 0

    def fill(self, value: Any, lookup: Callable[[K], Any]) -> Any:
        """The value with every placeholder filled: a string that is exactly one
        placeholder becomes the value itself (any type), others get the value's text."""
        if isinstance(value, str):
            whole = self.whole(value)
            if whole is not None:
                return lookup(whole)

            def replace(match: re.Match[str]) -> str:
                key = self._parse(match.group(1))
                return match.group(0) if key is None else text_of(lookup(key))

            return self._pattern.sub(replace, value)
        if isinstance(value, dict):
            return {k: self.fill(v, lookup) for k, v in value.items()}
        if isinstance(value, list):
            return [self.fill(v, lookup) for v in value]
        return value


def text_of(value: Any) -> str:
    """A value as it appears inside a longer string: strings as they are, others as JSON."""
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def size_of(value: Any) -> int:
    """The UTF-8 size of `text_of(value)` (a str is only encoded when it is not ASCII)."""
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    return len(msgspec.json.encode(value))


Path = tuple[str, tuple[str, ...]]


def _reference(body: str) -> Path | None:
    parts = body.split(".")
    if "" in parts:
        return None
    return parts[0], tuple(parts[1:])


def _param(body: str) -> str | None:
    return body


# ${opId} or ${opId.path.to.value}; a path element of digits indexes a list.
REFERENCES: Template[Path] = Template(r"\$\{([^}\s${]*)\}", _reference)
# {{name}}, spaces allowed inside the braces.
PLACEHOLDERS: Template[str] = Template(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", _param)
