"""Property tests: random conversations, random budgets, the same invariants every time."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_conversation_invariants import prompt_violations

from ctxactors.conversation import (
    BPETokenCounter,
    HeuristicTokenCounter,
    Message,
    TokenCounter,
    ToolCall,
    build_prompt,
    is_shortened,
    shorten_text,
)
from ctxactors.conversation.samples import CORPORA
from ctxactors.conversation.shorten import SHORTENED_MARK

pytestmark = pytest.mark.timeout(60)

SYSTEM_PROMPT = "You are an assistant with tools. Answer the user's latest request."
TEXTS = {name: text * 30 for name, text in CORPORA.items()}


@st.composite
def texts(draw: st.DrawFn, max_size: int = 6000) -> str:
    corpus = TEXTS[draw(st.sampled_from(sorted(TEXTS)))]
    size = draw(st.integers(1, max_size))
    start = draw(st.integers(0, len(corpus) - size - 1))
    return corpus[start : start + size]


@dataclass
class Conversation:
    history: list[Message]
    request: str  # the latest user message
    newest: Message  # the newest valid message (for a step, its call)


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    """A user request first, then random turns: user and assistant messages, steps with 1-3
    calls (results in any order), and noise: orphan results and calls never answered."""
    request = draw(texts(max_size=3000))
    history = [Message.user(request)]
    newest = history[0]
    n = 0
    for kind in draw(st.lists(st.sampled_from("uastTxo"), max_size=30)):
        n += 1
        if kind == "u":
            request = draw(texts(max_size=3000))
            newest = Message.user(request)
            history.append(newest)
        elif kind == "a":
            newest = Message.assistant(draw(texts(max_size=1500)))
            history.append(newest)
        elif kind in "stT":
            k = draw(st.integers(1, 3))
            calls = [ToolCall.new("tool", {"n": n, "i": i}, id=f"c{n}_{i}") for i in range(k)]
            text = draw(st.one_of(st.none(), texts(max_size=200)))
            newest = Message.assistant(text, calls)
            results = [Message.tool(c.id, draw(texts(max_size=12_000))) for c in calls]
            history += [newest, *draw(st.permutations(results))]
        elif kind == "x":  # a call whose results never came (a crash)
            history.append(Message.assistant(None, [ToolCall.new("tool", id=f"lost{n}")]))
        else:  # a result without its call
            history.append(Message.tool(f"orphan{n}", draw(texts(max_size=500))))
    return Conversation(history, request, newest)


def check(convo: Conversation, budget: int, counter: TokenCounter) -> None:
    prompt = build_prompt(
        convo.history, system_prompt=SYSTEM_PROMPT, max_tokens=budget, counter=counter
    )
    assert (
        prompt_violations(
            prompt,
            budget=budget,
            counter=counter,
            system_prompt=SYSTEM_PROMPT,
            request=convo.request,
        )
        == []
    )
    event("request restated" if all(m.role != "user" for m in prompt) else "request in window")
    event("shortened" if any(is_shortened(m.content) for m in prompt[1:]) else "nothing shortened")
    event("gap" if len(prompt) - 1 < len(convo.history) else "whole history")
    # The window is the history's own messages, in order; only the newest may be shortened.
    body = prompt[1:]
    positions = []
    for message in body:
        if is_shortened(message.content) and message not in convo.history:
            originals = [
                i
                for i, m in enumerate(convo.history)
                if m.role == message.role
                and m.tool_call_id == message.tool_call_id
                and m.tool_calls == message.tool_calls
            ]
            assert originals, message
            positions.append(originals[-1])
        else:
            positions.append(max(i for i, m in enumerate(convo.history) if m is message))
    assert positions == sorted(positions)
    # The newest step is always there (a newest user message may be restated instead).
    if convo.newest.role != "user":
        assert any(
            m.role == convo.newest.role and m.tool_calls == convo.newest.tool_calls
            for m in body[-4:]
        )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(convo=conversations(), budget=st.integers(400, 8000))
def test_random_conversations_heuristic_counter(convo: Conversation, budget: int) -> None:
    check(convo, budget, HeuristicTokenCounter())


BPE = BPETokenCounter()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(convo=conversations(), budget=st.integers(400, 8000))
def test_random_conversations_bpe_counter(convo: Conversation, budget: int) -> None:
    check(convo, budget, BPE)


@settings(max_examples=100, deadline=None)
@given(text=texts(max_size=20_000), budget=st.integers(0, 3000))
def test_shortened_text_never_exceeds_its_budget(text: str, budget: int) -> None:
    counter = HeuristicTokenCounter()
    short = shorten_text(text, budget, counter)
    assert counter.count_text(short) <= budget
    if short in ("", text):
        return
    assert is_shortened(short)
    # What is kept is the text's own beginning (nothing when only the marker fits).
    head, cut, _ = short.rpartition("\n" + SHORTENED_MARK)
    assert text.startswith(head) if cut else short.startswith(SHORTENED_MARK)
