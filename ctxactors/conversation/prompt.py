"""The system prompt, and the whole prompt of one model call.

When a long tool chain leaves no room for the user's message in the window, the system
prompt restates it (``Last user query: ...``), shortened to a small share of the budget, so
every model call still carries what the user asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxactors.conversation.messages import Message
from ctxactors.conversation.selection import select_messages_within_context
from ctxactors.conversation.shorten import shorten_text
from ctxactors.conversation.tokens import TokenCounter
from ctxactors.logs import get_logger

LAST_USER_QUERY = "Last user query: "
DEFAULT_RESTATE_SHARE = 0.10


def latest_user_message(history: Sequence[Message]) -> Message | None:
    for message in reversed(history):
        if message.role == "user":
            return message
    return None


def build_system_prompt(
    base: str,
    extension: str = "",
    *,
    window: Sequence[Message],
    history: Sequence[Message],
    counter: TokenCounter,
    max_tokens: int,
    restate_share: float = DEFAULT_RESTATE_SHARE,
) -> str:
    """The assistant's prompt and its extension, plus the restated user request when the
    window holds no user message.

    The restatement is the latest user message of the full `history`, shortened (and marked
    so) until it adds at most ``restate_share * max_tokens`` tokens to the prompt.
    """
    prompt = "\n\n".join(part for part in (base, extension) if part)
    if any(m.role == "user" for m in window):
        return prompt
    user = latest_user_message(history)
    if user is None:
        return prompt
    allowed = int(restate_share * max_tokens)
    separator = "\n\n" if prompt else ""
    base_cost = counter.count_text(prompt)
    query_budget = allowed - counter.count_text(f"{separator}{LAST_USER_QUERY}")
    # Joining two texts can cost a token more than the sum: measure and tighten.
    while query_budget > 0:
        query = shorten_text(user.text, query_budget, counter)
        restated = f"{prompt}{separator}{LAST_USER_QUERY}{query}"
        over = counter.count_text(restated) - base_cost - allowed
        if over <= 0:
            return restated
        query_budget -= over
    # The model will answer without what the user asked: say so where an operator looks.
    get_logger("ctxactors.conversation").warning(
        "user_request_not_restated",
        reason="the restatement does not fit its share of the budget",
        allowed_tokens=allowed,
        request_tokens=counter.count_text(user.text),
        restate_share=restate_share,
        max_tokens=max_tokens,
    )
    return prompt


def build_prompt(
    history: Sequence[Message],
    *,
    system_prompt: str,
    extension: str = "",
    max_tokens: int,
    counter: TokenCounter,
    restate_share: float = DEFAULT_RESTATE_SHARE,
) -> list[Message]:
    """Everything a model call is sent (system prompt first), within `max_tokens`.

    `history` is the conversation without the system prompt. The window is selected beside
    the plain system prompt; if it holds no user message, the prompt gains the restatement
    and the window is selected again beside it (a smaller budget never brings a user
    message back, so the restatement is still needed).
    """
    system = Message.system("\n\n".join(part for part in (system_prompt, extension) if part))
    window = select_messages_within_context([system, *history], max_tokens, counter=counter)
    if any(m.role == "user" for m in window):
        return window
    text = build_system_prompt(
        system_prompt,
        extension,
        window=window,
        history=history,
        counter=counter,
        max_tokens=max_tokens,
        restate_share=restate_share,
    )
    if text == system.content:
        return window
    return select_messages_within_context(
        [Message.system(text), *history], max_tokens, counter=counter
    )
