"""Choosing which messages of a history fit in the model's context window.

Keeping "the newest messages that fit" breaks in two ways in a long tool chain: the cut
lands inside a chain (a tool result without its call, or a call without its results: an
HTTP 400 from OpenAI and Anthropic), or the chain's results push the user's request out
and the model forgets what it was asked. Here a chain step (an assistant message with
``tool_calls`` plus all its results) is one unit that is kept or dropped whole; the latest
user message is kept whenever it fits beside the system message and the newest step; and
the newest step is always kept, its tool results shortened (visibly) if it is too large.
What the window cannot hold of the user's request, the system prompt restates
(`ctxactors.conversation.prompt`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import NamedTuple

import msgspec

from ctxactors.conversation.messages import Message
from ctxactors.conversation.shorten import marker_cost, shorten_text
from ctxactors.conversation.tokens import REPLY_PRIMING, TokenCounter
from ctxactors.errors import ContextBudgetError

# A unit of the window: one message, or an assistant message with all its tool results.
Unit = tuple[Message, ...]


class PlacedUnit(NamedTuple):
    """A unit and the position of its first message in the history."""

    position: int
    messages: Unit

    @property
    def is_user(self) -> bool:
        return self.messages[0].role == "user"


_placed = tuple.__new__


class _Newest(NamedTuple):
    """The newest unit as it will be sent, and what is left once it is paid for."""

    messages: Unit  # shortened if it had to be
    pinned: PlacedUnit | None  # the latest user message, kept behind a gap (paid for)
    remaining: int


def select_messages_within_context(
    messages: Sequence[Message],
    max_tokens: int,
    *,
    counter: TokenCounter,
) -> list[Message]:
    """The system message (the first message, if its role is ``system``) and the newest
    messages that fit in `max_tokens`, counted as a whole prompt (`tokens.count_prompt`).

    - A step with tool calls is atomic: kept with all its results or not at all. Tool
      results without their call and calls without all their results (a history cut short
      by a crash, say) are never sent.
    - The latest user message is kept, even behind a gap, whenever it fits beside the
      system message and the newest step; it is never shortened. When it is the newest
      message and does not fit, the window is the system message alone.
    - The newest step is always kept; if it is too large, its longest texts are shortened
      and marked so, sharing what is left of the budget.

    The budget is a hard limit: raises `ContextBudgetError` when the system message and the
    newest step, shortened to their markers, still do not fit. Only the units inside the
    window (and back to the latest user message) are looked at, so a selection over a long
    history costs about as much as the window it returns.
    """
    system = messages[0] if messages and messages[0].role == "system" else None
    head = [system] if system is not None else []
    remaining = _left_beside_system(system, max_tokens, counter)
    units = _units_newest_first(messages, len(head))
    recent = _back_to_latest_user(units)
    if not recent:
        return head
    newest = _place_newest(recent, remaining, counter)
    if newest is None:
        return head  # the system prompt restates the user's message
    kept = _add_older(newest, chain(recent[1:], units), counter)
    return head + [message for unit in reversed(kept) for message in unit]


def _left_beside_system(system: Message | None, max_tokens: int, counter: TokenCounter) -> int:
    """The budget left once the reply priming and the system message are paid for."""
    remaining = (
        max_tokens - REPLY_PRIMING - (counter.count_message(system) if system is not None else 0)
    )
    if remaining < 0:
        raise ContextBudgetError(
            f"the system message alone needs {max_tokens - remaining} tokens; "
            f"the budget is {max_tokens}"
        )
    return remaining


def _back_to_latest_user(units: Iterator[PlacedUnit]) -> list[PlacedUnit]:
    """The units newer than the latest user message, then that message; newest first.

    Consumes `units` only that far, so the caller goes on with the older ones.
    """
    recent: list[PlacedUnit] = []
    for unit in units:
        recent.append(unit)
        if unit.is_user:
            break
    return recent


def _place_newest(
    recent: list[PlacedUnit], remaining: int, counter: TokenCounter
) -> _Newest | None:
    """The newest unit within `remaining`, and the latest user message pinned beside it
    when both fit (the newest shortened, if need be); None when the newest unit is the
    user's own message and does not fit."""
    newest, latest = recent[0], recent[-1]
    newest_cost = _cost(newest.messages, counter)
    if latest.is_user and latest.position == newest.position:
        if newest_cost > remaining:
            return None
        return _Newest(newest.messages, None, remaining - newest_cost)
    pinned = None
    if latest.is_user:
        user_cost = _cost(latest.messages, counter)
        if user_cost + newest_cost <= remaining or (
            user_cost + _minimal_cost(newest.messages, counter) <= remaining
        ):
            pinned = latest
            remaining -= user_cost
    sent = newest.messages
    if newest_cost > remaining:
        sent = _shorten_unit(sent, remaining, counter)
        newest_cost = remaining
    return _Newest(sent, pinned, remaining - newest_cost)


def _add_older(newest: _Newest, older: Iterable[PlacedUnit], counter: TokenCounter) -> list[Unit]:
    """The units kept, newest first: older units are added while they fit, and the pinned
    user message wherever it falls (at the end if the window stops before it)."""
    count = counter.count_message
    kept = [newest.messages]
    pinned, remaining = newest.pinned, newest.remaining
    for position, unit in older:
        if pinned is not None and position == pinned.position:
            kept.append(pinned.messages)  # already paid for
            pinned = None
            continue
        unit_cost = 0
        for message in unit:  # inlined: this loop runs once per message of the window
            unit_cost += count(message)
        if unit_cost > remaining:
            break
        kept.append(unit)
        remaining -= unit_cost
    if pinned is not None:
        kept.append(pinned.messages)  # older than everything else kept
    return kept


def _cost(unit: Unit, counter: TokenCounter) -> int:
    return sum(counter.count_message(message) for message in unit)


def _units_newest_first(messages: Sequence[Message], start: int) -> Iterator[PlacedUnit]:
    """The valid units of ``messages[start:]`` with their positions, newest first.

    Walking backwards lets the selection stop as soon as the window is full. (`_placed`
    builds each `PlacedUnit` without the named tuple's Python-level ``__new__``: this runs
    once per unit of the window.)
    """
    i = len(messages) - 1
    while i >= start:
        message = messages[i]
        if message.role != "tool":
            if not message.tool_calls:  # a call not followed by its results is dropped
                yield _placed(PlacedUnit, (i, (message,)))
            i -= 1
            continue
        first = i
        while first > start and messages[first - 1].role == "tool":
            first -= 1
        caller = first - 1
        if caller >= start and messages[caller].tool_calls:
            unit = _complete_step(messages[caller], messages[first : i + 1])
            if unit is not None:
                yield _placed(PlacedUnit, (caller, unit))
            i = caller - 1
        else:
            i = first - 1  # tool results without their call


def _complete_step(call: Message, results: Sequence[Message]) -> Unit | None:
    """The call with the first result for each of its ids, or None if any is missing."""
    calls = call.tool_calls or ()
    if len(calls) == 1 and len(results) == 1:  # the common case, without the sets
        return (call, results[0]) if results[0].tool_call_id == calls[0].id else None
    wanted = {c.id for c in calls}
    kept: dict[str, Message] = {}
    for result in results:
        if result.tool_call_id in wanted and result.tool_call_id not in kept:
            kept[result.tool_call_id] = result
    if len(kept) != len(wanted):
        return None
    return (call, *kept.values())


def _sizes(unit: Unit, counter: TokenCounter) -> tuple[int, list[int], list[int]]:
    """The unit's cost without its texts, each text's cost, and the least each can cost:
    its marker when shortened, or all of it when that is less."""
    fixed = sum(counter.count_message(msgspec.structs.replace(m, content=None)) for m in unit)
    sizes = [counter.count_text(m.content) if m.content else 0 for m in unit]
    floors = [
        min(size, marker_cost(m.content, counter)) if m.content else 0
        for m, size in zip(unit, sizes, strict=True)
    ]
    return fixed, sizes, floors


def _minimal_cost(unit: Unit, counter: TokenCounter) -> int:
    """Tokens of the unit with every text cut down to its marker (or kept, if shorter)."""
    fixed, _, floors = _sizes(unit, counter)
    return fixed + sum(floors)


def _shorten_unit(unit: Unit, budget: int, counter: TokenCounter) -> Unit:
    """The unit within `budget`: short texts kept whole, the long ones sharing the rest.

    Every text first gets its floor (`_sizes`); what is left is shared smallest-first,
    each taking what it still needs or an equal share.
    """
    fixed, sizes, base = _sizes(unit, counter)
    available = budget - fixed - sum(base)
    order = sorted(range(len(unit)), key=lambda i: sizes[i] - base[i])
    for _ in range(4):
        if available < 0:
            break
        allowance = list(base)
        left = available
        for rank, i in enumerate(order):
            extra = min(sizes[i] - base[i], left // (len(order) - rank))
            allowance[i] += extra
            left -= extra
        shortened = tuple(
            m
            if allowance[i] >= sizes[i]
            else msgspec.structs.replace(
                m, content=shorten_text(m.content or "", allowance[i], counter)
            )
            for i, m in enumerate(unit)
        )
        used = sum(counter.count_message(m) for m in shortened)
        if used <= budget:
            return shortened
        available -= used - budget  # a counter that is not additive: try a little smaller
    raise ContextBudgetError(
        f"the newest step needs at least {_minimal_cost(unit, counter)} tokens beside the "
        f"system message; {budget} are left of the budget"
    )
