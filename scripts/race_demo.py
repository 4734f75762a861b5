#!/usr/bin/env python3
"""The bug ctxactors exists to remove, reproduced: a global ``switch_context`` under load.

The old design kept one "current session" (and assistant) in the tool server. A host called
``switch_context(session, assistant)`` and then the tool, as two requests. With several
conversations in flight, another conversation's switch lands between the two, and the tool
runs against the wrong session's state or checks the wrong assistant's permission. The model
below is faithful to that and nothing worse: every request is atomic (one lock around each),
and each request crosses a simulated network hop (a short sleep), as the real ones did.

Both designs then run the same workload from the same threads: each (session, assistant)
client creates goals and selects its own playbook and another assistant's playbook (which
must be refused). The demo counts, per design, the calls that ran against the wrong session
and the permission checks decided for the wrong assistant, and checks every final state.

    python scripts/race_demo.py [--sessions 8] [--rounds 20] [--hop-ms 0.3]

Exit status 0 when ctxactors had no wrong call at all, 1 otherwise.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ctxactors import Runtime, ToolContext, inject_context
from ctxactors.logs import configure_logging

ASSISTANTS = ("planner", "coder")
NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")


class Counts(msgspec.Struct):
    """What one design did with the workload."""

    design: str
    requests: int = 0
    goals: int = 0
    wrong_session: int = 0  # create_goal stored in another session's state
    foreign_allowed: int = 0  # another assistant's playbook passed the check
    own_refused: int = 0  # the caller's own playbook failed the check
    checks: int = 0
    sessions_with_foreign_goals: int = 0
    states: int = 0
    seconds: float = 0.0

    @property
    def wrong(self) -> int:
        return (
            self.wrong_session
            + self.foreign_allowed
            + self.own_refused
            + self.sessions_with_foreign_goals
        )


class Workload(msgspec.Struct, frozen=True):
    sessions: list[str]
    rounds: int
    hop: float  # seconds of simulated network per request
    concurrent: bool = True  # False: one client after another (the old design is then right)

    def clients(self) -> list[tuple[str, str]]:
        return [(s, a) for s in self.sessions for a in ASSISTANTS]


def playbook_of(session: str, assistant: str) -> str:
    return f"pb-{session}-{assistant}"


def other(assistant: str) -> str:
    return ASSISTANTS[1] if assistant == ASSISTANTS[0] else ASSISTANTS[0]


# -- the old design ------------------------------------------------------------------------


class OldServer:
    """One process-wide tool server with a *global* current session and assistant."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # every request is atomic: the bug is not a data race
        self.current: tuple[str, str] | None = None
        self.goals: dict[str, list[str]] = {}
        self.owners: dict[str, str] = {}  # playbook id -> owning assistant

    def switch_context(self, session: str, assistant: str) -> None:
        with self._lock:
            self.current = (session, assistant)

    def create_goal(self, goal: str) -> str:
        """Stores the goal in the current session; returns which session that was."""
        with self._lock:
            assert self.current is not None
            session = self.current[0]
            self.goals.setdefault(session, []).append(goal)
            return session

    def create_playbook(self, playbook_id: str) -> None:
        with self._lock:
            assert self.current is not None
            self.owners[playbook_id] = self.current[1]

    def select_playbook(self, playbook_id: str) -> bool:
        with self._lock:
            assert self.current is not None
            return self.owners.get(playbook_id) == self.current[1]


def hop(seconds: float, rng: random.Random) -> None:
    """The network between host and server: a jittered sleep before each request lands."""
    time.sleep(seconds * (0.5 + rng.random()))


def run_old(work: Workload) -> Counts:
    server = OldServer()
    counts = Counts("old: global switch_context")
    for session, assistant in work.clients():  # setup, one at a time (no race here)
        server.switch_context(session, assistant)
        server.create_playbook(playbook_of(session, assistant))
    lock = threading.Lock()

    def client(session: str, assistant: str, rng: random.Random) -> None:
        local = Counts(counts.design)
        for i in range(work.rounds):
            goal = f"{session}: goal {i} of {assistant}"
            hop(work.hop, rng)
            server.switch_context(session, assistant)
            hop(work.hop, rng)
            stored_in = server.create_goal(goal)
            local.goals += 1
            local.wrong_session += stored_in != session
            for playbook, mine in (
                (playbook_of(session, assistant), True),
                (playbook_of(session, other(assistant)), False),
            ):
                hop(work.hop, rng)
                server.switch_context(session, assistant)
                hop(work.hop, rng)
                allowed = server.select_playbook(playbook)
                local.checks += 1
                local.own_refused += mine and not allowed
                local.foreign_allowed += (not mine) and allowed
            local.requests += 6
        with lock:
            _add(counts, local)

    counts.seconds = _run_clients(work, client)
    counts.requests += 2 * len(work.clients())
    for session in work.sessions:
        counts.states += 1
        goals = server.goals.get(session, [])
        counts.sessions_with_foreign_goals += any(not g.startswith(f"{session}:") for g in goals)
    return counts


# -- ctxactors -----------------------------------------------------------------------------


def run_ctxactors(work: Workload) -> Counts:
    counts = Counts("ctxactors")
    lock = threading.Lock()
    with Runtime() as rt:
        ids: dict[tuple[str, str], str] = {}
        for session, assistant in work.clients():
            ctx = ToolContext(session, assistant)
            made = rt.call("create_playbook", inject_context({"name": "steps"}, ctx))
            assert made.structured is not None
            ids[(session, assistant)] = made.structured["id"]

        def client(session: str, assistant: str, rng: random.Random) -> None:
            local = Counts(counts.design)
            ctx = ToolContext(session, assistant)
            for i in range(work.rounds):
                goal = f"{session}: goal {i} of {assistant}"
                hop(work.hop, rng)
                result = rt.call("create_goal", inject_context({"goal": goal}, ctx))
                local.goals += 1
                local.wrong_session += result.is_error
                for key, mine in (
                    ((session, assistant), True),
                    ((session, other(assistant)), False),
                ):
                    hop(work.hop, rng)
                    result = rt.call("select_playbook", inject_context({"id": ids[key]}, ctx))
                    local.checks += 1
                    local.own_refused += mine and result.is_error
                    local.foreign_allowed += (not mine) and not result.is_error
                local.requests += 3
            with lock:
                _add(counts, local)

        counts.seconds = _run_clients(work, client)
        counts.requests += len(work.clients())
        for session, assistant in work.clients():
            state = rt.call(
                "get_planning_state", inject_context({}, ToolContext(session, assistant))
            )
            assert state.structured is not None
            goals = [g["goal"] for g in state.structured["goals"]]
            expected = [f"{session}: goal {i} of {assistant}" for i in range(work.rounds)]
            counts.states += 1
            counts.sessions_with_foreign_goals += goals != expected
    return counts


# -- running and telling -------------------------------------------------------------------


def _add(total: Counts, part: Counts) -> None:
    for field in ("requests", "goals", "wrong_session", "foreign_allowed", "own_refused", "checks"):
        setattr(total, field, getattr(total, field) + getattr(part, field))


def _run_clients(work: Workload, client: Callable[[str, str, random.Random], None]) -> float:
    """One thread per (session, assistant), all released at once; returns the wall time."""
    clients = work.clients()
    start = threading.Barrier(len(clients) if work.concurrent else 1)
    turn = threading.Lock() if not work.concurrent else None

    def body(i: int, session: str, assistant: str) -> None:
        start.wait()
        if turn is None:
            client(session, assistant, random.Random(i))
            return
        with turn:
            client(session, assistant, random.Random(i))

    threads = [threading.Thread(target=body, args=(i, *c)) for i, c in enumerate(clients)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - began


def four_steps() -> list[str]:
    """The race in four requests, played in the unlucky order, on the old design."""
    server = OldServer()
    server.switch_context("alice", "planner")
    lines = ["  1. alice's host:  switch_context(alice, planner)"]
    server.switch_context("bob", "coder")
    lines.append("  2. bob's host:    switch_context(bob, coder)")
    stored = server.create_goal("alice: learn Rust")
    lines.append(
        f"  3. alice's host:  create_goal('alice: learn Rust')  -> stored in {stored}'s plan"
    )
    stored = server.create_goal("bob: ship v2")
    lines.append(
        f"  4. bob's host:    create_goal('bob: ship v2')       -> stored in {stored}'s plan"
    )
    return lines


def report(old: Counts, new: Counts, work: Workload) -> list[str]:
    rows: list[tuple[str, Any, Any]] = [
        ("requests sent", old.requests, new.requests),
        (
            "create_goal ran against the wrong session",
            f"{old.wrong_session} of {old.goals}",
            f"{new.wrong_session} of {new.goals}",
        ),
        (
            "another assistant's playbook allowed",
            f"{old.foreign_allowed} of {old.checks // 2}",
            f"{new.foreign_allowed} of {new.checks // 2}",
        ),
        (
            "own playbook refused",
            f"{old.own_refused} of {old.checks // 2}",
            f"{new.own_refused} of {new.checks // 2}",
        ),
        (
            "final states holding another session's goals",
            f"{old.sessions_with_foreign_goals} of {old.states} sessions",
            f"{new.sessions_with_foreign_goals} of {new.states} plans",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [
        f"Workload: {len(work.sessions)} sessions x {len(ASSISTANTS)} assistants, "
        f"{work.rounds} rounds each (create_goal, select own playbook, select the other "
        f"assistant's), {len(work.clients())} concurrent clients, "
        f"~{work.hop * 1000:g} ms network hop per request.",
        "",
        f"{'':{width}}  {'old design':>24}  {'ctxactors':>20}",
    ]
    lines += [f"{name:{width}}  {str(a):>24}  {str(b):>20}" for name, a, b in rows]
    lines.append("")
    lines.append(
        f"old design: {old.wrong} wrong outcomes; ctxactors: {new.wrong}"
        + (" - none, by construction." if new.wrong == 0 else " - THIS IS A BUG.")
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--hop-ms", type=float, default=0.3, help="simulated network per request")
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.rounds < 1 or args.hop_ms < 0:
        parser.error("--sessions and --rounds must be at least 1, --hop-ms not negative")
    configure_logging(level="warning")
    sessions = [NAMES[i] if i < len(NAMES) else f"user{i}" for i in range(args.sessions)]
    work = Workload(sessions, args.rounds, args.hop_ms / 1000)
    print("The race in four requests (old design, unlucky order):")
    print("\n".join(four_steps()))
    print()
    old = run_old(work)
    new = run_ctxactors(work)
    print("\n".join(report(old, new, work)))
    return 0 if new.wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
