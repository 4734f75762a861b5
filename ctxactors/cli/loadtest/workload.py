"""The load test's workload and its checker: what each session sends and what it must see.

A *unit* is one planning key (session, assistant, thread). It sends its calls one after
another and keeps a model of the state those calls built, so every reply can be checked
the moment it arrives and the final `get_planning_state` must equal the model exactly. Every
goal, todo and playbook name carries its unit's label, so an item that turns up in the wrong
place names where it came from.

Ephemeral state (reaping under load). A reaped or evicted key starts again from an empty
server whose id counter restarts at 1. With `allow_resets` the checker accepts a reply that
is exactly what a *fresh* incarnation would answer (the first id again, "not found" for an
item of the old one, an empty state) as a reset, clears its model and counts it; anything
else is still a violation. The driver then checks that the resets it saw are no more than
the actors the runtime says it retired, so a silent state loss can't hide behind this rule.

Calls in doubt (`tolerate_doubt`, for a server restarted under load). A call that failed in
transit may or may not have run. The unit then reads its key back before anything else
(`get_planning_state`, repeated until it answers) and accepts exactly two states: the model
without the call, or with its whole effect; either becomes the model. A call refused before
it was sent (nothing listening) did not run: it is sent again. A playbook in doubt
may be present or absent in the final listing. Acknowledged calls stay exact.

Host tools (of ``--server`` classes) can be in the mix too: their state is the host's, which
the checker has no model of, so their answers are only checked for errors
(`ctxactors.cli.loadtest.host_tools`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import msgspec

from ctxactors.context import ToolContext

DEFAULT_MIX = {
    "create_goal": 3,
    "add_todo": 3,
    "mark_todo": 2,
    "get_planning_state": 1,
    "create_playbook": 1,
}


class Outcome(msgspec.Struct, frozen=True):
    """A reply, whatever transport it came over: MCP's structured content and error flag."""

    structured: dict[str, Any] | None
    is_error: bool
    text: str = ""


class PlannedCall(msgspec.Struct, frozen=True):
    """One call a unit is about to send (arguments without context)."""

    tool: str
    args: dict[str, Any]
    ctx: ToolContext
    verify: bool = False
    resync: bool = False  # reads the key back after a call in doubt


def parse_mix(spec: str | None, hosts: Iterable[str] = ()) -> dict[str, int]:
    """``"create_goal=3,add_todo=1"`` -> weights; unknown tools or bad weights raise ValueError.

    `hosts` are the tools of the ``--server`` classes, which the mix may name as well.
    """
    if not spec:
        return dict(DEFAULT_MIX)
    known = [*DEFAULT_MIX, *(name for name in hosts if name not in DEFAULT_MIX)]
    mix: dict[str, int] = {}
    for part in spec.split(","):
        name, sep, weight = part.strip().partition("=")
        if name not in known:
            raise ValueError(
                f"--mix: unknown tool {name!r} (choose from {', '.join(known)}, "
                "or a tool of a --server class)"
            )
        try:
            mix[name] = int(weight) if sep else 1
        except ValueError:
            raise ValueError(f"--mix: weight of {name!r} is not an integer: {weight!r}") from None
        if mix[name] < 0:
            raise ValueError(f"--mix: weight of {name!r} is negative")
    if not any(mix.values()):
        raise ValueError("--mix: every weight is zero")
    return mix


def label(ctx: ToolContext) -> str:
    return f"{ctx.session_id}/{ctx.assistant_id}/{ctx.thread_id or '-'}"


class Unit:
    """One planning key's script and model. Used by one caller at a time (not thread-safe)."""

    def __init__(
        self,
        ctx: ToolContext,
        calls: int,
        mix: dict[str, int],
        seed: int,
        book: PlaybookBook,
        allow_resets: bool = False,
        tolerate_doubt: bool = False,
        hosts: Mapping[str, Callable[[str, int], dict[str, Any]]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.hosts = hosts or {}  # host tool -> its arguments (label, sequence number)
        self.tolerate_doubt = tolerate_doubt
        self.doubt: PlannedCall | None = None  # the call in doubt, until the key is read back
        self.in_doubt = 0  # calls cut off in transit: they may have run
        self.refused = 0  # calls refused before they were sent: they did not run
        self.again: PlannedCall | None = None  # a refused call, to send again
        self.name = label(ctx)
        self.remaining = calls
        self.book = book
        self.allow_resets = allow_resets
        self._rng = random.Random(seed)
        self._tools = list(mix)
        self._weights = [mix[t] for t in self._tools]
        self.goals: dict[str, dict[str, Any]] = {}
        self.todos: dict[str, dict[str, Any]] = {}
        self.next_id = 0
        self.seq = 0
        self.resets = 0
        self.violations: list[str] = []
        self.uncertain = False  # a transport error: we can't know whether the call ran
        self.verified = False

    # -- the script ----------------------------------------------------------------------

    def next_call(self) -> PlannedCall | None:
        """The next workload call, or None when the unit has sent all of them."""
        if self.doubt is not None:
            return PlannedCall("get_planning_state", {}, self.ctx, resync=True)
        if self.again is not None:
            call, self.again = self.again, None
            return call
        if self.remaining <= 0:
            return None
        self.remaining -= 1
        self.seq += 1
        tool = self._rng.choices(self._tools, self._weights)[0]
        if tool == "mark_todo" and not self.todos:
            tool = "add_todo"
        text = f"{self.name}#{self.seq}"
        args: dict[str, Any]
        if tool == "create_goal":
            args = {"goal": text}
        elif tool == "add_todo":
            args = {"name": text}
            if self.goals and self._rng.random() < 0.7:
                args["goal_id"] = self._rng.choice(list(self.goals))
        elif tool == "mark_todo":
            args = {"todo_id": self._rng.choice(list(self.todos)), "done": self._rng.random() < 0.8}
        elif tool == "create_playbook":
            args = {"name": text, "steps": [f"{text} step {i}" for i in range(2)]}
        elif tool in self.hosts:
            args = self.hosts[tool](text, self.seq)
        else:
            args = {}
        return PlannedCall(tool, args, self.ctx)

    def final_call(self) -> PlannedCall:
        return PlannedCall("get_planning_state", {}, self.ctx, verify=True)

    # -- the checker ---------------------------------------------------------------------

    def record(self, call: PlannedCall, outcome: Outcome | None, refused: bool = False) -> None:
        """Check a reply against the model and advance it. None: the call failed in transit
        (`refused`: before it was sent, so it certainly did not run)."""
        if outcome is None and self.tolerate_doubt and refused:
            self.refused += 1
            if not call.resync:
                self.again = call  # it did not run: send it again
            return
        if outcome is None and self.tolerate_doubt:
            self.in_doubt += 0 if call.resync else 1
            if self.doubt is None and not call.resync:
                self.doubt = call
            if call.tool == "create_playbook":
                self.book.doubtful(call.args["name"])
            return
        if outcome is None:
            self.uncertain = True
            return
        if self.doubt is not None and call.tool == "get_planning_state":
            self._settle_doubt(call, outcome)
            self.verified = self.verified or call.verify
            return
        if self.uncertain and call.tool != "create_playbook":
            return  # the model is unknown from here; the failure is already counted
        if call.tool in self.hosts:
            check = self._check_host
        else:
            check = getattr(self, f"_check_{call.tool}")
        check(call, outcome)
        if call.verify:
            self.verified = True

    def _settle_doubt(self, call: PlannedCall, out: Outcome) -> None:
        """The key read back after a call in doubt: without its effect, or with all of it."""
        doubt, self.doubt = self.doubt, None
        assert doubt is not None
        if out.is_error or out.structured is None:
            self._violation(call, f"unexpected error {out.text!r}")
            return
        without = {"goals": list(self.goals.values()), "todos": list(self.todos.values())}
        if out.structured == without:
            return
        goals, todos, next_id = dict(self.goals), dict(self.todos), self.next_id
        if doubt.tool in ("create_goal", "add_todo"):
            next_id += 1
            if doubt.tool == "create_goal":
                goals[f"g{next_id}"] = {"id": f"g{next_id}", "goal": doubt.args["goal"]}
            else:
                todo_id = f"t{next_id}"
                todos[todo_id] = {
                    "id": todo_id,
                    "name": doubt.args["name"],
                    "goal_id": doubt.args.get("goal_id"),
                    "done": False,
                }
        elif doubt.tool == "mark_todo":
            todo_id = doubt.args["todo_id"]
            todos[todo_id] = {**todos[todo_id], "done": doubt.args["done"]}
        with_it = {"goals": list(goals.values()), "todos": list(todos.values())}
        if out.structured != with_it:
            self._violation(
                call, f"after {doubt.tool} in doubt: {diff_state(with_it, out.structured)}"
            )
            return
        self.goals, self.todos, self.next_id = goals, todos, next_id

    def _violation(self, call: PlannedCall, what: str) -> None:
        self.violations.append(f"session {self.ctx.session_id!r} ({self.name}) {call.tool}: {what}")

    def _reset(self) -> None:
        self.goals.clear()
        self.todos.clear()
        self.next_id = 0
        self.resets += 1

    def _check_created(self, call: PlannedCall, out: Outcome, prefix: str) -> dict[str, Any] | None:
        if out.is_error or out.structured is None:
            if self.allow_resets and "not found" in out.text and "goal_id" in call.args:
                self._reset()  # the goal belonged to a retired incarnation; nothing ran
                return None
            self._violation(call, f"unexpected error {out.text!r}")
            return None
        got = out.structured.get("id")
        expected = f"{prefix}{self.next_id + 1}"
        if got != expected and self.allow_resets and got == f"{prefix}1":
            self._reset()
            expected = got
        if got != expected:
            self._violation(call, f"returned id {got!r}, expected {expected!r}{_owner(out)}")
            return None
        self.next_id += 1
        return out.structured

    def _check_host(self, call: PlannedCall, out: Outcome) -> None:
        """A host tool's answer: not an error (its state is the host's, not modelled)."""
        if out.is_error:
            self._violation(call, f"unexpected error {out.text!r}")

    def _check_create_goal(self, call: PlannedCall, out: Outcome) -> None:
        record = self._check_created(call, out, "g")
        if record is None:
            return
        want = {"id": record["id"], "goal": call.args["goal"]}
        if record != want:
            self._violation(call, f"returned {record!r}, expected {want!r}")
        self.goals[want["id"]] = want

    def _check_add_todo(self, call: PlannedCall, out: Outcome) -> None:
        record = self._check_created(call, out, "t")
        if record is None:
            return
        want = {
            "id": record["id"],
            "name": call.args["name"],
            "goal_id": call.args.get("goal_id"),
            "done": False,
        }
        if record != want:
            self._violation(call, f"returned {record!r}, expected {want!r}")
        self.todos[want["id"]] = want

    def _check_mark_todo(self, call: PlannedCall, out: Outcome) -> None:
        todo_id = call.args["todo_id"]
        if out.is_error:
            if self.allow_resets and "not found" in out.text:
                self._reset()
                return
            self._violation(call, f"unexpected error {out.text!r}")
            return
        want = {**self.todos[todo_id], "done": call.args["done"]}
        if out.structured != want:
            self._violation(call, f"returned {out.structured!r}, expected {want!r}")
        self.todos[todo_id] = want

    def _check_get_planning_state(self, call: PlannedCall, out: Outcome) -> None:
        if out.is_error or out.structured is None:
            self._violation(call, f"unexpected error {out.text!r}")
            return
        want = {"goals": list(self.goals.values()), "todos": list(self.todos.values())}
        got = out.structured
        if got == want:
            return
        if self.allow_resets and got == {"goals": [], "todos": []}:
            self._reset()
            return
        self._violation(call, diff_state(want, got))

    def _check_create_playbook(self, call: PlannedCall, out: Outcome) -> None:
        if out.is_error or out.structured is None:
            self._violation(call, f"unexpected error {out.text!r}")
            return
        want = {
            "name": call.args["name"],
            "agent_id": self.ctx.assistant_id,
            "steps": call.args["steps"],
        }
        got = {k: out.structured.get(k) for k in want}
        if got != want:
            self._violation(call, f"returned {out.structured!r}, expected {want!r}")
            return
        self.book.created(self.ctx, out.structured["id"], call.args["name"])


def _owner(out: Outcome) -> str:
    text = (out.structured or {}).get("goal") or (out.structured or {}).get("name")
    return f" (its item {text!r} belongs to {str(text).split('#')[0]})" if text else ""


def diff_state(want: dict[str, Any], got: dict[str, Any]) -> str:
    """A short, readable difference between two planning states."""
    parts = []
    for kind in ("goals", "todos"):
        w = {item.get("id"): item for item in want.get(kind, [])}
        g = {item.get("id"): item for item in got.get(kind, []) if isinstance(item, dict)}
        missing = [i for i in w if i not in g]
        extra = [g[i] for i in g if i not in w]
        changed = [f"{i}: {g[i]!r} != {w[i]!r}" for i in w if i in g and g[i] != w[i]]
        if missing:
            parts.append(f"missing {kind} {missing}")
        for item in extra:
            text = item.get("goal") or item.get("name") or ""
            parts.append(f"foreign {kind[:-1]} {item.get('id')!r} from {text.split('#')[0]}")
        parts.extend(changed)
        if not (missing or extra or changed) and list(w) != list(g):
            parts.append(f"{kind} out of order: {list(g)} != {list(w)}")
    return "; ".join(parts) or f"state {got!r} != {want!r}"


class PlaybookBook:
    """Which playbooks each assistant of one session created (the session-wide store)."""

    def __init__(self, session_id: str, assistants: list[str], allow_resets: bool) -> None:
        self.session_id = session_id
        self.assistants = assistants
        self.allow_resets = allow_resets
        self.owned: dict[str, dict[str, str]] = {a: {} for a in assistants}  # id -> name
        self.violations: list[str] = []
        self.uncertain = False
        self.in_doubt: set[str] = set()  # names of playbooks created in doubt
        self.verified = 0  # assistants' final listings that matched exactly

    def doubtful(self, name: str) -> None:
        self.in_doubt.add(name)

    def created(self, ctx: ToolContext, playbook_id: str, name: str) -> None:
        assert ctx.assistant_id is not None
        self.owned[ctx.assistant_id][playbook_id] = name

    def final_calls(self) -> Iterator[PlannedCall]:
        """One `list_playbooks` per assistant, and (exact mode) a cross-assistant probe."""
        for assistant in self.assistants:
            yield PlannedCall(
                "list_playbooks", {}, ToolContext(self.session_id, assistant), verify=True
            )
        victim, thief = self.assistants[0], self.assistants[-1]
        if victim != thief and self.owned[victim] and not self.allow_resets:
            target = next(iter(self.owned[victim]))
            args = {"id": target}
            yield PlannedCall("select_playbook", args, ToolContext(self.session_id, thief), True)

    def record(self, call: PlannedCall, outcome: Outcome | None, refused: bool = False) -> None:
        where = f"session {self.session_id!r} ({self.session_id}/{call.ctx.assistant_id})"
        if outcome is None:
            self.uncertain = True
            return
        if call.tool == "select_playbook":
            if not outcome.is_error or "does not belong to assistant" not in outcome.text:
                self.violations.append(
                    f"{where} select_playbook of another assistant's playbook was not refused: "
                    f"{outcome.text!r}"
                )
            return
        if outcome.is_error or outcome.structured is None:
            self.violations.append(f"{where} list_playbooks: unexpected error {outcome.text!r}")
            return
        assert call.ctx.assistant_id is not None
        want = self.owned[call.ctx.assistant_id]
        got: dict[str, Any] = {}
        for p in outcome.structured.get("playbooks", []):
            got[p.get("id")] = p.get("name")
            if p.get("agent_id") != call.ctx.assistant_id:
                self.violations.append(
                    f"{where} list_playbooks shows {p.get('id')!r} of assistant {p.get('agent_id')!r}"
                )
        if self.uncertain:
            return
        got = {i: n for i, n in got.items() if n not in self.in_doubt or i in want}
        if self.allow_resets:
            names = set(want.values())
            foreign = {i: n for i, n in got.items() if n not in names}
            if foreign:
                self.violations.append(f"{where} list_playbooks: foreign playbooks {foreign}")
        elif got != want:
            missing = sorted(set(want) - set(got))
            extra = {i: n for i, n in got.items() if want.get(i) != n}
            self.violations.append(f"{where} list_playbooks: missing {missing}, unexpected {extra}")
        elif call.verify:
            self.verified += 1
