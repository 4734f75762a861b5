"""The two placeholder syntaxes of batches, exactly: what they find, how large the filled
values would be, and what filling gives (no runtime: `batch_template` is plain functions)."""

from __future__ import annotations

from typing import Any

import pytest

from ctxactors.batch.template import PLACEHOLDERS, REFERENCES, size_of, text_of

VALUES: dict[tuple[str, tuple[str, ...]], Any] = {
    ("a", ()): {"n": 1},
    ("a", ("n",)): 1,
    ("b", ("x", "0")): "é",
    ("c", ()): "text",
}


def test_reference_keys_in_order_with_repeats_and_paths() -> None:
    value = {
        "s": "${a} and ${b.x.0}${a}",
        "l": [1, None, "${c}", {"deep": ["${a.n}"]}],
        "n": 3,
    }
    assert REFERENCES.keys(value) == [
        ("a", ()),
        ("b", ("x", "0")),
        ("a", ()),
        ("c", ()),
        ("a", ("n",)),
    ]
    assert REFERENCES.keys(7) == []
    assert REFERENCES.keys(None) == []


@pytest.mark.parametrize(
    "text", ["${}", "${a.}", "${.a}", "${a..b}", "${a b}", "${a", "$a", "{a}", "${a{b}", "${$a}"]
)
def test_not_references(text: str) -> None:
    assert REFERENCES.keys(text) == []
    assert REFERENCES.fill(text, VALUES.__getitem__) == text
    assert REFERENCES.filled_size(text, lambda key: 1000) == 0


def test_a_whole_reference_keeps_the_values_type() -> None:
    assert REFERENCES.fill("${a}", VALUES.__getitem__) == {"n": 1}
    assert REFERENCES.fill("${a.n}", VALUES.__getitem__) == 1
    assert REFERENCES.fill(["${a.n}", {"k": "${c}"}, 5], VALUES.__getitem__) == [
        1,
        {"k": "text"},
        5,
    ]


def test_references_inside_text_are_filled_with_text_or_json() -> None:
    filled = REFERENCES.fill("<${a}|${a.n}|${b.x.0}|${c}|${a.} ${}>", VALUES.__getitem__)
    assert filled == '<{"n":1}|1|é|text|${a.} ${}>'


def test_filled_size_counts_only_strings_with_references() -> None:
    sizes = {key: size_of(value) for key, value in VALUES.items()}
    value = {"x": "ab${a}cd", "y": ["plain", "${b.x.0}${b.x.0}"], "z": 12, "w": "${a.}"}
    # "ab" + 7 + "cd" = 11; "é" is 2 bytes, twice = 4; the rest exist already.
    assert REFERENCES.filled_size(value, sizes.__getitem__) == 11 + 4
    filled = REFERENCES.fill(value, VALUES.__getitem__)
    assert len(filled["x"].encode()) + len(filled["y"][1].encode()) == 15
    assert REFERENCES.filled_size(["${c}"], sizes.__getitem__) == 4
    assert REFERENCES.filled_size(None, sizes.__getitem__) == 0


def test_placeholders() -> None:
    params = {"name": "x", "n": 2, "_u9": [1]}
    value = {"a": "{{name}}", "b": "{{ n }}-{{_u9}}", "c": ["{{9bad}}", "{{ }}", "{name}"]}
    assert PLACEHOLDERS.keys(value) == ["name", "n", "_u9"]
    assert PLACEHOLDERS.fill(value, params.__getitem__) == {
        "a": "x",
        "b": "2-[1]",
        "c": ["{{9bad}}", "{{ }}", "{name}"],
    }
    assert PLACEHOLDERS.fill("{{  n  }}", params.__getitem__) == 2
    sizes = {k: size_of(v) for k, v in params.items()}
    assert PLACEHOLDERS.filled_size(value, sizes.__getitem__) == 1 + 5


def test_text_and_size_of() -> None:
    assert text_of("a\u00e9") == "a\u00e9"
    assert text_of({"k": [1, "é"]}) == '{"k":[1,"é"]}'
    assert text_of(None) == "null"
    assert size_of("abc") == 3
    assert size_of("é€😀") == 2 + 3 + 4
    assert size_of("\ud800") == 3  # a lone surrogate still has a size
    assert size_of({"k": "é"}) == len('{"k":"é"}'.encode())
    assert size_of(12345) == 5
