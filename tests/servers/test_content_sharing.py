"""The content store is the session's: every assistant and thread of it shares documents."""

from __future__ import annotations

from ctxactors import Runtime
from ctxactors.testing import context_args as ctx_args


def test_assistants_and_threads_of_one_session_share_documents(runtime: Runtime) -> None:
    added = runtime.call(
        "add_content", ctx_args("s1", "writer", "t1", filename="notes.md", content="alpha beta")
    )
    assert added.structured == {"id": "c1", "filename": "notes.md"}

    for who in (("reader", "t2"), ("writer", "t9"), (None, None)):
        args = ctx_args("s1", *who)
        listed = runtime.call("list_content", args).structured
        assert listed == {"items": [{"id": "c1", "filename": "notes.md", "size": 10}], "count": 1}
        read = runtime.call("read_content", {**args, "id": "c1"}).structured
        assert read == {"id": "c1", "filename": "notes.md", "content": "alpha beta"}
        found = runtime.call("search_content", {**args, "query": "beta"}).structured
        assert found is not None and [r["id"] for r in found["results"]] == ["c1"]

    # One store, one actor: another assistant's delete is seen by the writer.
    assert not runtime.call("delete_content", ctx_args("s1", "reader", "t2", id="c1")).is_error
    assert runtime.call("list_content", ctx_args("s1", "writer", "t1")).structured == {
        "items": [],
        "count": 0,
    }
    assert [k for k in runtime._registry.keys() if k[0] == "content"] == [("content", (None, "s1"))]
