"""``ctxactors demo``: a scripted scenario on the embedded runtime, told as it happens.

Several conversations (sessions) with two assistants each call the planning and playbook
tools at the same time, from their own threads. Afterwards every one of them reads its state
back: each sees exactly its own goals, and an assistant that tries to select the other
assistant's playbook (even by smuggling ``__assistantId`` into its arguments) is refused;
the smuggled field's ``spoofed_context_dropped`` warning is read back from the log and told
as part of the story (any other warning is shown as it was logged, after it).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import threading
from typing import Any

from ctxactors._runtime import Runtime
from ctxactors.cli import add_settings_argument, settings_from_args
from ctxactors.context import ToolContext, inject_context
from ctxactors.logs import configure_logging, flush_logs
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
    log: StoryLog | None = None
    if not os.environ.get("CTXACTORS_LOG_LEVEL"):
        # Warnings only (no per-call lines), into the story rather than between its lines.
        log = StoryLog()
        configure_logging(level="warning", file=log.stream)
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"ctxactors demo: {exc}") from None
    sessions = [SESSIONS[i] if i < len(SESSIONS) else f"user{i}" for i in range(args.sessions)]
    try:
        return 0 if demo(sessions, args.goals, settings=settings, log=log) else 1
    finally:
        if log is not None:
            sys.stderr.write("".join(json.dumps(line) + "\n" for line in log.untold()))


class StoryLog:
    """The log lines written while the demo runs, for it to tell (`read`) the ones that are
    part of its story; the others are `untold`."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self._read = 0
        self._untold: list[dict[str, Any]] = []

    def read(self, event: str) -> list[dict[str, Any]]:
        """The `event` lines logged since the last read (the others are kept as untold)."""
        flush_logs()
        text = self.stream.getvalue()
        new, self._read = text[self._read :], len(text)
        lines = [json.loads(line) for line in new.splitlines() if line.strip()]
        self._untold += [line for line in lines if line.get("event") != event]
        return [line for line in lines if line.get("event") == event]

    def untold(self) -> list[dict[str, Any]]:
        self.read("")
        return self._untold


def demo(
    sessions: list[str],
    goals_each: int,
    out: Any = print,
    settings: Settings | None = None,
    log: StoryLog | None = None,
) -> bool:
    """Run the story, telling it through `out`; True when no conversation saw another's
    state. With `log` (the `StoryLog` logging was configured to write to), the spoofing
    warnings are read back and told too."""
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
            if log is not None:
                ok &= _tell_spoofing(log, session, out)
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


def _tell_spoofing(log: StoryLog, session: str, out: Any) -> bool:
    """Tell the ``spoofed_context_dropped`` warning the model's ``__assistantId`` caused."""
    dropped = log.read("spoofed_context_dropped")
    seen = [
        line
        for line in dropped
        if line.get("session_id") == session and line.get("fields") == ["__assistantId"]
    ]
    mark = "ok " if len(seen) == 1 and len(dropped) == 1 else "BAD"
    ran_as = seen[0].get("assistant_id") if seen else None
    out(
        f"  [{mark}] {session}: the model also wrote __assistantId='planner': dropped (the "
        f"call ran as {ran_as!r}), logged as spoofing (spoofed_context_dropped)"
    )
    return mark == "ok "
