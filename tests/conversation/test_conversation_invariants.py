"""The invariants every prompt must keep, checked independently of the selection code.

`prompt_violations` is used by the tool-chain harness and the property tests; the tests
here show that it catches the failures it exists for (the shapes LangChain's
`trim_messages` produces among them).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from ctxactors.conversation import (
    LAST_USER_QUERY,
    SHORTENED_MARK,
    HeuristicTokenCounter,
    Message,
    TokenCounter,
    ToolCall,
    count_prompt,
)

pytestmark = pytest.mark.timeout(10)


def prompt_violations(
    prompt: Sequence[Message],
    *,
    budget: int,
    counter: TokenCounter,
    system_prompt: str,
    request: str,
    restate_share: float = 0.10,
) -> list[str]:
    """Everything wrong with one prompt; empty when it keeps every invariant.

    - within the budget, system prompt included;
    - no tool result without its call just before it, no call without all its results;
    - the latest user request is carried: as the last user message of the window, or
      restated in the system prompt (whole, or a marked head of it);
    - a restatement costs at most `restate_share` of the budget.
    """
    problems: list[str] = []
    total = count_prompt(prompt, counter)
    if total > budget:
        problems.append(f"{total} tokens over a budget of {budget}")
    if not prompt or prompt[0].role != "system":
        return [*problems, "the prompt does not start with the system message"]
    pending: set[str] = set()
    for i, message in enumerate(prompt):
        if message.role == "tool":
            if message.tool_call_id not in pending:
                problems.append(f"orphan tool result at {i} ({message.tool_call_id})")
            pending.discard(message.tool_call_id or "")
            continue
        if pending:
            problems.append(f"calls {sorted(pending)} without results before message {i}")
        pending = {c.id for c in message.tool_calls or ()}
    if pending:
        problems.append(f"calls {sorted(pending)} without results at the end")
    users = [m for m in prompt if m.role == "user"]
    system = prompt[0].text
    if users:
        if users[-1].content != request:
            problems.append("the window's last user message is not the latest request")
    elif LAST_USER_QUERY not in system:
        problems.append("the request is neither in the window nor restated")
    else:
        restated = system.split(LAST_USER_QUERY, 1)[1]
        shown = restated.split(f"\n{SHORTENED_MARK}", 1)[0]
        if restated != request and not (
            SHORTENED_MARK in restated and shown and request.startswith(shown)
        ):
            problems.append(f"the restatement is not the request: {restated[:80]!r}")
        cost = counter.count_text(system) - counter.count_text(system_prompt)
        if cost > restate_share * budget:
            problems.append(f"the restatement costs {cost} tokens, over {restate_share:.0%}")
    return problems


COUNTER = HeuristicTokenCounter()
CALL = ToolCall.new("read_page", {"page": 1}, id="c1")


def check(prompt: list[Message], budget: int = 1000, request: str = "do it") -> list[str]:
    return prompt_violations(
        prompt, budget=budget, counter=COUNTER, system_prompt="sys", request=request
    )


def test_a_good_prompt_passes() -> None:
    prompt = [
        Message.system("sys"),
        Message.user("do it"),
        Message.assistant(None, [CALL]),
        Message.tool("c1", "page one"),
    ]
    assert check(prompt) == []


def test_orphan_result_at_the_head_is_caught() -> None:
    # What a newest-first trimmer leaves when the cut falls inside a step: an API 400.
    prompt = [Message.system("sys"), Message.tool("c1", "page one"), Message.user("do it")]
    assert any("orphan" in p for p in check(prompt))


def test_call_without_results_is_caught() -> None:
    prompt = [Message.system("sys"), Message.user("do it"), Message.assistant(None, [CALL])]
    assert any("without results" in p for p in check(prompt))
    interleaved = [*prompt, Message.user("x"), Message.tool("c1", "late")]
    assert len(check(interleaved, request="x")) == 2


def test_lost_request_is_caught() -> None:
    prompt = [Message.system("sys"), Message.assistant(None, [CALL]), Message.tool("c1", "p")]
    assert check(prompt) == ["the request is neither in the window nor restated"]
    old = [Message.system("sys"), Message.user("older request")]
    assert check(old) == ["the window's last user message is not the latest request"]


def test_restatement_checks() -> None:
    restated = [Message.system(f"sys\n\n{LAST_USER_QUERY}do it")]
    assert check(restated) == []
    wrong = [Message.system(f"sys\n\n{LAST_USER_QUERY}something else")]
    assert "not the request" in check(wrong)[0]
    long_request = "please " * 300
    too_big = [Message.system(f"sys\n\n{LAST_USER_QUERY}{long_request}")]
    assert "over 10%" in check(too_big, budget=3000, request=long_request)[0]


def test_over_budget_is_caught() -> None:
    prompt = [Message.system("sys"), Message.user("do it")]
    assert "over a budget" in check(prompt, budget=5)[0]
