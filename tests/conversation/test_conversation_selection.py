"""Window selection, shortening and the system prompt, case by case."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs
from test_conversation_invariants import prompt_violations

from ctxactors.conversation import (
    LAST_USER_QUERY,
    SHORTENED_MARK,
    BPETokenCounter,
    ContextBudgetError,
    Message,
    ToolCall,
    build_prompt,
    build_system_prompt,
    count_prompt,
    is_shortened,
    select_messages_within_context,
    shorten_text,
)
from ctxactors.conversation.samples import CORPORA

pytestmark = pytest.mark.timeout(20)

COUNTER = BPETokenCounter()
SYSTEM = Message.system("You are a careful research assistant.")
REQUEST = "Summarize chapters 1 to 30 of the report and list every open question."


def step(i: int, result: str) -> list[Message]:
    call = ToolCall.new("read_page", {"page": i}, id=f"call_{i}")
    return [Message.assistant(None, [call]), Message.tool(call.id, result)]


def chain(n: int, size: int = 400) -> list[Message]:
    text = CORPORA["english"]
    return [m for i in range(n) for m in step(i, (text * 20)[i : i + size])]


def select(messages: list[Message], budget: int) -> list[Message]:
    window = select_messages_within_context(messages, budget, counter=COUNTER)
    assert count_prompt(window, COUNTER) <= budget
    return window


def violations(prompt: list[Message], budget: int, request: str = REQUEST) -> list[str]:
    return prompt_violations(
        prompt, budget=budget, counter=COUNTER, system_prompt=SYSTEM.text, request=request
    )


def test_everything_fits_everything_is_kept_in_order() -> None:
    history = [SYSTEM, Message.user(REQUEST), *chain(5), Message.assistant("Done.")]
    assert select(history, 100_000) == history


def test_cut_never_lands_inside_a_step() -> None:
    # Budgets at every size: a newest-first trimmer would leave an orphan result at the head.
    history = [SYSTEM, Message.user(REQUEST), *chain(12, size=300)]
    for budget in range(300, 2500, 37):
        window = select(history, budget)
        assert violations(window, budget) == [], budget


def test_request_is_kept_behind_a_gap_when_the_chain_is_long() -> None:
    history = [SYSTEM, Message.user("an older question"), Message.assistant("an answer")]
    history += [Message.user(REQUEST), *chain(40)]
    window = select(history, 1200)
    assert window[0] == SYSTEM and window[1] == Message.user(REQUEST)
    assert window[-2:] == history[-2:]  # the newest step, whole
    assert Message.user("an older question") not in window  # older turns wait for room
    assert len(window) < len(history) - 10


def test_newest_step_too_large_is_shortened_and_marked() -> None:
    small = ToolCall.new("get_planning_state", {}, id="small")
    big = ToolCall.new("read_page", {"page": 9}, id="big")
    huge = CORPORA["english"] * 40
    history = [
        SYSTEM,
        Message.user(REQUEST),
        Message.assistant("Reading.", [small, big]),
        Message.tool("small", '{"goals": []}'),
        Message.tool("big", huge),
    ]
    window = select(history, 900)
    assert window[:2] == history[:2]
    assert window[3] == history[3]  # the small result of the same step is whole
    assert is_shortened(window[4].content) and window[4].tool_call_id == "big"
    assert huge.startswith(window[4].text.split(f"\n{SHORTENED_MARK}")[0])
    assert count_prompt(window, COUNTER) > 800  # the room left was used, not wasted
    assert violations(window, 900) == []


def test_incomplete_steps_and_orphans_are_never_sent() -> None:
    a, b = ToolCall.new("x", id="a"), ToolCall.new("y", id="b")
    history = [
        SYSTEM,
        Message.tool("ghost", "a result whose call was trimmed away"),
        Message.user(REQUEST),
        Message.assistant(None, [a, b]),
        Message.tool("a", "only one of two results: the run crashed"),
        Message.assistant(None, [a]),
        Message.tool("a", "first"),
        Message.tool("a", "duplicate"),
        Message.tool("zzz", "unknown id"),
        Message.assistant("Here is the summary."),
    ]
    window = select(history, 10_000)
    assert window == [
        SYSTEM,
        Message.user(REQUEST),
        Message.assistant(None, [a]),
        Message.tool("a", "first"),
        Message.assistant("Here is the summary."),
    ]


def test_newest_call_without_results_is_not_sent() -> None:
    history = [SYSTEM, Message.user(REQUEST), Message.assistant(None, [ToolCall.new("x")])]
    assert select(history, 1000) == history[:2]


def test_request_too_large_for_the_window_is_restated_shortened() -> None:
    request = CORPORA["korean"] * 6  # about 3,300 tokens
    history = [Message.user(request), *chain(3)]
    budget = 2000
    prompt = build_prompt(history, system_prompt=SYSTEM.text, max_tokens=budget, counter=COUNTER)
    assert all(m.role != "user" for m in prompt)
    assert LAST_USER_QUERY in prompt[0].text and is_shortened(prompt[0].text)
    assert prompt[-2:] == history[-2:]
    assert violations(prompt, budget, request) == []


def test_request_pushed_out_by_the_newest_step_is_restated() -> None:
    request = CORPORA["english"][:1500]  # about 300 tokens: fits beside the system message
    calls = [ToolCall.new("read_page", {"page": i}, id=f"p{i}") for i in range(12)]
    history = [
        Message.user(request),
        Message.assistant(None, calls),
        *(Message.tool(c.id, "x" * 400) for c in calls),
    ]
    budget = 600  # the step's twelve calls and markers need most of it
    prompt = build_prompt(history, system_prompt=SYSTEM.text, max_tokens=budget, counter=COUNTER)
    assert all(m.role != "user" for m in prompt)
    assert prompt[1] == history[1]
    assert violations(prompt, budget, request) == []


def test_restatement_only_when_the_window_has_no_user_message() -> None:
    history = [Message.user(REQUEST)]
    kwargs = dict(history=history, counter=COUNTER, max_tokens=1000)
    assert build_system_prompt("base", "ext", window=history, **kwargs) == "base\n\next"
    restated = build_system_prompt("base", "ext", window=[], **kwargs)
    assert restated == f"base\n\next\n\n{LAST_USER_QUERY}{REQUEST}"
    assert build_system_prompt("", window=[], **kwargs) == f"{LAST_USER_QUERY}{REQUEST}"
    no_user = dict(kwargs, history=[Message.assistant("hi")])
    assert build_system_prompt("base", window=[], **no_user) == "base"


@pytest.mark.parametrize("share", [0.02, 0.05, 0.10, 0.25])
def test_restatement_respects_its_share(share: float) -> None:
    request = CORPORA["korean"]
    base = "You help."
    text = build_system_prompt(
        base,
        window=[],
        history=[Message.user(request)],
        counter=COUNTER,
        max_tokens=2000,
        restate_share=share,
    )
    cost = COUNTER.count_text(text) - COUNTER.count_text(base)
    assert 0 < cost <= share * 2000
    assert is_shortened(text)


def test_a_restatement_that_cannot_fit_its_share_is_logged_not_dropped_silently() -> None:
    request = CORPORA["english"][:1500]
    with capture_logs() as logs:
        text = build_system_prompt(
            "base",
            window=[],
            history=[Message.user(request)],
            counter=COUNTER,
            max_tokens=40,  # a 10% share is 4 tokens: not even the "Last user query" label
        )
    assert text == "base"
    assert logs == [
        {
            "event": "user_request_not_restated",
            "log_level": "warning",
            "logger": "ctxactors.conversation",
            "reason": "the restatement does not fit its share of the budget",
            "allowed_tokens": 4,
            "request_tokens": COUNTER.count_text(request),
            "restate_share": 0.10,
            "max_tokens": 40,
        }
    ]


def test_system_message_alone_over_budget_raises() -> None:
    with pytest.raises(ContextBudgetError, match="system message alone"):
        select([Message.system("word " * 500), Message.user("hi")], 100)


def test_newest_step_that_cannot_fit_even_shortened_raises() -> None:
    call = ToolCall.new("add_content", {"content": "x " * 2000}, id="c")
    history = [SYSTEM, Message.user("hi"), Message.assistant(None, [call]), Message.tool("c", "ok")]
    with pytest.raises(ContextBudgetError, match="newest step needs at least"):
        select(history, 500)


def test_history_without_system_message() -> None:
    history = [Message.user(REQUEST), *chain(2)]
    assert select(history, 10_000) == history


def test_newest_plain_message_too_large_is_shortened() -> None:
    history = [SYSTEM, Message.user(REQUEST), Message.assistant(CORPORA["code"] * 10)]
    window = select(history, 700)
    assert window[1] == history[1] and is_shortened(window[2].content)


def test_shorten_text_is_exact_and_cheap_on_huge_text() -> None:
    text = CORPORA["english"] * 400  # a megabyte
    for budget in (20, 100, 1000):
        short = shorten_text(text, budget, COUNTER)
        assert COUNTER.count_text(short) <= budget
        assert COUNTER.count_text(short) >= budget - 15  # and near the budget
        assert is_shortened(short)
    assert shorten_text("short", 10, COUNTER) == "short"
    assert shorten_text(text, 3, COUNTER) == ""  # not even the marker fits
    assert shorten_text(text, 0, COUNTER) == ""
