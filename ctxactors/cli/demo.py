"""``ctxactors demo``: a scripted scenario on the embedded runtime, told as it happens.

Several conversations (sessions) with two assistants each call the planning and playbook
tools at the same time, from their own threads. Afterwards every one of them reads its state
back: each sees exactly its own goals, and an assistant that tries to select the other
assistant's playbook (even by smuggling ``__assistantId`` into its arguments) is refused.
"""

from __future__ import annotations

import argparse
import os
import threading
from typing import Any

from ctxactors._runtime import Runtime
from ctxactors.cli import add_settings_argument, settings_from_args
from ctxactors.context import ToolContext, inject_context
from ctxactors.logs import configure_logging
from ctxactors.servers.planning import Planning
from ctxactors.servers.playbooks import Playbooks
from ctxactors.settings import Settings

SESSIONS = ("alice", "bob", "carol", "dave")
ASSISTANTS = ("planner", "coder")
GOALS_EACH = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sessions", type=int, default=len(SESSIONS), help="number of conversations"
    )
    parser.add_argument("--goals", type=int, default=GOALS_EACH, help="goals per assistant")
    add_settings_argument(parser)


def run(args: argparse.Namespace) -> int:
    if not os.environ.get("CTXACTORS_LOG_LEVEL"):
        configure_logging(level="warning")  # keep per-call lines out of the story
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"ctxactors demo: {exc}") from None
    sessions = [SESSIONS[i] if i < len(SESSIONS) else f"user{i}" for i in range(args.sessions)]
    return 0 if demo(sessions, args.goals, settings=settings) else 1


def demo(
    sessions: list[str], goals_each: int, out: Any = print, settings: Settings | None = None
) -> bool:
    ok = True
    # Only the servers the story uses: the workspace needs bubblewrap, the demo does not.
    with Runtime(servers=[Planning, Playbooks], settings=settings) as rt:
        out(f"{len(sessions)} conversations x {len(ASSISTANTS)} assistants, all at once:\n")
        barrier = threading.Barrier(len(sessions) * len(ASSISTANTS))
        playbook_ids: dict[tuple[str, str], str] = {}

        def conversation(session: str, assistant: str) -> None:
            ctx = ToolContext(session, assistant)
            barrier.wait()  # start together, so the calls really interleave
            for i in range(goals_each):
                rt.call(
                    "create_goal",
                    inject_context({"goal": f"{assistant} goal {i + 1} for {session}"}, ctx),
                )
            pb = rt.call(
                "create_playbook",
                inject_context({"name": f"{assistant}'s playbook", "steps": ["plan", "do"]}, ctx),
            )
            playbook_ids[(session, assistant)] = pb.structured["id"]  # type: ignore[index]

        threads = [
            threading.Thread(target=conversation, args=(s, a)) for s in sessions for a in ASSISTANTS
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        for session in sessions:
            for assistant in ASSISTANTS:
                ctx = ToolContext(session, assistant)
                goals = rt.call("get_planning_state", inject_context({}, ctx)).structured["goals"]  # type: ignore[index]
                foreign = [
                    g["goal"]
                    for g in goals
                    if not g["goal"].startswith(f"{assistant} ")
                    or not g["goal"].endswith(f" {session}")
                ]
                mark = "ok " if len(goals) == goals_each and not foreign else "BAD"
                ok &= mark == "ok "
                out(
                    f"  [{mark}] {session:>6} / {assistant:<7} sees {len(goals)} goals, {len(foreign)} of anyone else's"
                )

        out("\nCross-assistant playbook selection (the LLM even adds __assistantId itself):\n")
        for session in sessions[:2]:
            theirs = playbook_ids[(session, "planner")]
            llm_args = {"id": theirs, "__assistantId": "planner"}  # spoofing attempt
            result = rt.call(
                "select_playbook", inject_context(llm_args, ToolContext(session, "coder"))
            )
            own = rt.call(
                "select_playbook",
                inject_context(
                    {"id": playbook_ids[(session, "coder")]}, ToolContext(session, "coder")
                ),
            )
            refused = result.is_error and "does not belong to assistant" in result.text
            ok &= refused and not own.is_error
            out(
                f"  [{'ok ' if refused else 'BAD'}] {session}: coder selecting planner's {theirs}: {result.text}"
            )
            out(
                f"  [{'ok ' if not own.is_error else 'BAD'}] {session}: coder selecting its own playbook: accepted"
            )

        stats = rt.stats()
        out(
            f"\n{stats['calls']} calls, {stats['spawned']} actors spawned (one per key), 0 shared state."
        )
        out(
            "Every conversation saw only its own state."
            if ok
            else "SOMETHING LEAKED: see BAD lines above."
        )
    return ok
