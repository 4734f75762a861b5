"""Batch planning and engine details pinned to exact values (mutation testing found them
unasserted): reference lookup, its error text, and what plans and results carry."""

from __future__ import annotations

import pytest

from ctxactors.batch_engine import _margin
from ctxactors.batch_plan import BadReference, lookup, references, resolve

RESULTS = {"a": {"items": [{"id": "x"}, {"id": "y"}], "n": 0}, "b": None}


def test_lookup_walks_dicts_and_list_indexes() -> None:
    assert lookup(("a", ()), RESULTS) == RESULTS["a"]
    assert lookup(("a", ("items", "1", "id")), RESULTS) == "y"
    assert lookup(("a", ("n",)), RESULTS) == 0
    assert lookup(("b", ()), RESULTS) is None


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (("items", "2", "id"), "reference ${a.items.2.id}: no value at a.items.2"),
        (("items", "-1"), "reference ${a.items.-1}: no value at a.items.-1"),
        (("items", "x"), "reference ${a.items.x}: no value at a.items.x"),
        (("n", "0"), "reference ${a.n.0}: no value at a.n.0"),
        (("missing",), "reference ${a.missing}: no value at a.missing"),
    ],
)
def test_lookup_says_where_the_path_ends(path: tuple[str, ...], message: str) -> None:
    with pytest.raises(BadReference) as bad:
        lookup(("a", path), RESULTS)
    assert str(bad.value) == message


def test_resolve_and_references() -> None:
    value = {"whole": "${a.items.0}", "text": "id=${a.items.0.id};n=${a.n}", "k": [1]}
    assert resolve(value, RESULTS) == {"whole": {"id": "x"}, "text": "id=x;n=0", "k": [1]}
    assert references(value) == {"a"}
    assert references(["${b}", "${c.d}", "${}", 3]) == {"b", "c"}


@pytest.mark.parametrize(
    ("remaining", "margin"), [(100.0, 1.0), (10.0, 1.0), (5.0, 0.5), (0.05, 0.01), (-1.0, 0.01)]
)
def test_the_margin_kept_to_hand_the_result_back(remaining: float, margin: float) -> None:
    assert _margin(remaining) == pytest.approx(margin)
