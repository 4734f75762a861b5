"""The content store: FTS5 search over a session's documents, isolation, limits."""

from __future__ import annotations

import string
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxactors import InvalidArgumentsError, Runtime, ToolContext
from ctxactors.servers.content import MAX_RESULTS, Content, fts_phrases
from ctxactors.settings import ContentSettings, Settings
from ctxactors.testing import context_args as ctx_args

KOREAN = "여러 파일을 분석해서 리포트 작성"


@pytest.fixture
def rt(rt_settings: Settings) -> Iterator[Runtime]:
    runtime = Runtime(servers=[Content], settings=rt_settings)
    try:
        yield runtime
    finally:
        runtime.close()


def call(rt: Runtime, session: str, tool: str, **args: Any) -> Any:
    result = rt.call(tool, ctx_args(session, **args))
    assert not result.is_error, result.text
    return result.structured


def ids(found: dict[str, Any]) -> list[str]:
    return [r["id"] for r in found["results"]]


def test_add_read_list_delete_round_trip(rt: Runtime) -> None:
    a = call(rt, "s1", "add_content", filename="notes.md", content="héllo wörld")
    b = call(rt, "s1", "add_content", filename="b.txt", content="second")
    assert a == {"id": a["id"], "filename": "notes.md"} and a["id"] != b["id"]
    assert call(rt, "s1", "read_content", id=a["id"]) == {
        "id": a["id"],
        "filename": "notes.md",
        "content": "héllo wörld",
    }
    listed = call(rt, "s1", "list_content")
    assert listed == {
        "items": [
            {"id": a["id"], "filename": "notes.md", "size": len("héllo wörld".encode())},
            {"id": b["id"], "filename": "b.txt", "size": 6},
        ],
        "count": 2,
    }
    call(rt, "s1", "delete_content", id=a["id"])
    assert call(rt, "s1", "list_content")["count"] == 1
    gone = rt.call("read_content", ctx_args("s1", id=a["id"]))
    assert gone.is_error and a["id"] in gone.text and "not found" in gone.text
    assert ids(call(rt, "s1", "search_content", query="wörld")) == []


@pytest.mark.parametrize(
    "query",
    [
        "리포트",  # Korean inside a sentence
        "파일",  # two characters: shorter than a trigram
        "분석해서 리포트",  # two words, both must occur
        "parse_config",  # a code identifier
        "PARSE_CONFIG",  # case-insensitive
        "Config",  # part of an identifier
        "x",  # a single character
        "report.py",  # the filename
    ],
)
def test_search_finds_words_identifiers_korean_and_short_substrings(
    rt: Runtime, query: str
) -> None:
    hit = call(
        rt, "s1", "add_content", filename="report.py", content=f"{KOREAN}\ndef parse_config(x): ..."
    )
    call(rt, "s1", "add_content", filename="other.md", content="nothing relevant in here at all")
    found = call(rt, "s1", "search_content", query=query)
    assert ids(found) == [hit["id"]] and found["count"] == 1
    result = found["results"][0]
    assert result["filename"] == "report.py" and isinstance(result["score"], float)


def test_snippet_marks_the_hit_with_context(rt: Runtime) -> None:
    filler = "lorem ipsum " * 40
    call(rt, "s1", "add_content", filename="r.md", content=f"{filler}{KOREAN}{filler}")
    snippet = call(rt, "s1", "search_content", query="리포트")["results"][0]["snippet"]
    assert "[리포트]" in snippet and "분석해서" in snippet
    assert snippet.startswith("…") and snippet.endswith("…") and len(snippet) < 200


@pytest.mark.parametrize(
    "query",
    [
        '"',
        '"quoted"',
        "a*",
        "*",
        "NEAR(alpha beta)",
        "(",
        ")",
        "-",
        "a - b",
        "x OR y",
        "AND",
        "NOT",
        "^start",
        "col:val",
        "{a b}:c",
        "'; DROP TABLE docs; --",
        "\\",
        "%",
        "_",
    ],
)
def test_query_syntax_characters_search_for_themselves(rt: Runtime, query: str) -> None:
    hit = call(rt, "s1", "add_content", filename="h.txt", content=f"before {query} after")
    miss = call(rt, "s1", "add_content", filename="miss", content="plain words only here")
    found = call(rt, "s1", "search_content", query=query)
    assert hit["id"] in ids(found) and miss["id"] not in ids(found)
    # The store still works afterwards (no table was dropped, nothing raised).
    assert call(rt, "s1", "list_content")["count"] == 2


def test_like_wildcards_in_short_terms_are_literal(rt: Runtime) -> None:
    call(rt, "s1", "add_content", filename="a", content="abc")
    for query in ("%", "_", "a%", "_b"):
        assert call(rt, "s1", "search_content", query=query)["count"] == 0


TEXT = st.text(
    alphabet=st.sampled_from(
        string.ascii_letters + string.digits + string.punctuation + " \x00리포트분석가"
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(needle=TEXT, noise=TEXT)
def test_any_text_query_finds_the_document_that_contains_it(needle: str, noise: str) -> None:
    store = Content()
    ctx = ToolContext("s1")
    try:
        doc = store.add_content(ctx, filename="f", content=f"<{needle}>")
        store.add_content(ctx, filename="g", content=noise)
        if not needle.split():
            return
        found = store.search_content(ctx, query=needle)
        assert doc["id"] in ids(found)
        for result in found["results"]:  # every result really contains every term
            stored = store.read_content(ctx, id=result["id"])
            where = (stored["filename"].lower(), stored["content"].lower())
            assert all(any(t.lower() in w for w in where) for t in needle.split())
    finally:
        store.close()


def test_text_after_a_nul_character_is_still_found(rt: Runtime) -> None:
    doc = call(rt, "s1", "add_content", filename="bin", content="head\x00tail words")
    assert ids(call(rt, "s1", "search_content", query="tail")) == [doc["id"]]
    assert call(rt, "s1", "read_content", id=doc["id"])["content"] == "head\x00tail words"
    call(rt, "s1", "delete_content", id=doc["id"])
    assert call(rt, "s1", "search_content", query="tail")["count"] == 0


def test_fts_phrases_quotes_every_term() -> None:
    assert fts_phrases(['say "hi"', "NEAR(a"]) == '"say ""hi""" "NEAR(a"'


def test_ranking_prefers_more_occurrences_and_limit_is_clamped(rt: Runtime) -> None:
    once = call(rt, "s1", "add_content", filename="once", content="tokio " + "x " * 50)
    many = call(rt, "s1", "add_content", filename="many", content="tokio " * 20)
    found = call(rt, "s1", "search_content", query="tokio")
    assert ids(found) == [many["id"], once["id"]]
    assert found["results"][0]["score"] > found["results"][1]["score"]
    for i in range(MAX_RESULTS + 10):
        call(rt, "s1", "add_content", filename=f"f{i}", content=f"tokio {i}")
    assert call(rt, "s1", "search_content", query="tokio", limit=1000)["count"] == MAX_RESULTS
    assert call(rt, "s1", "search_content", query="tokio", limit=3)["count"] == 3
    assert call(rt, "s1", "search_content", query="to", limit=1000)["count"] == MAX_RESULTS


def test_bad_input_is_refused_clearly_and_the_store_keeps_serving(rt: Runtime) -> None:
    call(rt, "s1", "add_content", filename="a", content="keep me")
    with pytest.raises(InvalidArgumentsError, match="limit"):
        rt.call("search_content", ctx_args("s1", query="keep", limit=0))
    with pytest.raises(InvalidArgumentsError, match="filename"):
        rt.call("add_content", ctx_args("s1", content="no name"))
    blank = rt.call("search_content", ctx_args("s1", query="   "))
    assert blank.is_error and "blank" in blank.text
    many = rt.call("search_content", ctx_args("s1", query=" ".join(["w"] * 40)))
    assert many.is_error and "40 words" in many.text
    assert call(rt, "s1", "search_content", query="keep")["count"] == 1


def test_sessions_never_see_each_others_content(rt: Runtime) -> None:
    secret = call(rt, "alice", "add_content", filename="secret.txt", content="alice password")
    call(rt, "bob", "add_content", filename="bob.txt", content="bob stuff")
    assert [i["filename"] for i in call(rt, "bob", "list_content")["items"]] == ["bob.txt"]
    for query in ("alice", "password", "secret", "pa", "a"):
        assert all(
            r["filename"] == "bob.txt"
            for r in call(rt, "bob", "search_content", query=query)["results"]
        )
    for guess in (secret["id"], "c1", "c2", "1", "c0", "../c1"):
        for tool in ("read_content", "delete_content"):
            res = rt.call(tool, ctx_args("bob", id=guess))
            assert "alice" not in res.text and "secret" not in res.text
    # Bob's calls deleted at most his own item; Alice's is untouched.
    assert call(rt, "alice", "read_content", id=secret["id"])["content"] == "alice password"
    assert call(rt, "alice", "list_content")["count"] == 1


@pytest.mark.parametrize(
    "rt_settings",
    [Settings(content=ContentSettings(max_item_bytes=100, max_session_bytes=250, max_items=4))],
)
def test_size_limits_refuse_without_losing_anything(rt: Runtime) -> None:
    first = call(rt, "s1", "add_content", filename="a", content="a" * 100)
    big = rt.call("add_content", ctx_args("s1", filename="big", content="리" * 34))  # 102 B
    assert big.is_error
    assert big.text == "content of 'big' is 102 bytes; one item may hold at most 100 bytes"
    call(rt, "s1", "add_content", filename="b", content="b" * 100)
    full = rt.call("add_content", ctx_args("s1", filename="c", content="c" * 60))
    assert full.is_error and full.text == (
        "content store full: 200 of 250 bytes used, 'c' needs 60 more; delete something first"
    )
    listed = call(rt, "s1", "list_content")
    assert [i["filename"] for i in listed["items"]] == ["a", "b"]
    assert call(rt, "s1", "read_content", id=first["id"])["content"] == "a" * 100
    call(rt, "s1", "delete_content", id=first["id"])  # frees its bytes
    call(rt, "s1", "add_content", filename="c", content="c" * 60)
    call(rt, "s1", "add_content", filename="d", content="d")
    call(rt, "s1", "add_content", filename="e", content="e")
    too_many = rt.call("add_content", ctx_args("s1", filename="f", content="f"))
    assert too_many.is_error and too_many.text == (
        "content store full: it holds the maximum of 4 items; delete something first"
    )
    # The limits are per session: another session starts empty.
    call(rt, "s2", "add_content", filename="a", content="a" * 100)


def test_ending_a_session_drops_its_store_and_its_thread() -> None:
    before = set(threading.enumerate())  # threads of earlier tests may still be ending
    with Runtime(servers=[Content]) as rt:
        call(rt, "s1", "add_content", filename="a", content="gone soon")
        assert rt.end_session("s1") == 1
        assert call(rt, "s1", "list_content")["count"] == 0  # a fresh incarnation
        assert call(rt, "s1", "search_content", query="gone")["count"] == 0
    # The log writer is the process's, started by the first line logged and ended when idle.
    left = {t for t in set(threading.enumerate()) - before if t.name != "ctxactors-log-writer"}
    assert left == set()


def test_delete_removes_the_index_entry_not_just_the_text() -> None:
    store = Content()
    ctx = ToolContext("s1")
    try:
        doc = store.add_content(ctx, filename="a\x00b", content="x\x00 needle")
        index = "SELECT count(*) FROM docs WHERE docs MATCH ?"
        assert store._db.execute(index, ('"needle"',)).fetchone() == (1,)
        store.delete_content(ctx, id=doc["id"])
        assert store._db.execute(index, ('"needle"',)).fetchone() == (0,)
        assert store._db.execute("SELECT count(*) FROM texts").fetchone() == (0,)
    finally:
        store.close()


def test_a_three_letter_term_matches_whatever_its_case_beyond_ascii(rt: Runtime) -> None:
    """Three letters go to the trigram index, which folds case for any letter; SQL LIKE
    (for shorter terms) folds only ASCII, so it must not filter these too."""
    made = call(rt, "s1", "add_content", filename="f.txt", content="un été chaud")
    for query in ("ÉTÉ", "Été chaud"):
        assert ids(call(rt, "s1", "search_content", query=query)) == [made["id"]], query
