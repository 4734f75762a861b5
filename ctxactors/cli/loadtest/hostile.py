"""``ctxactors loadtest --hostile``: a tenant that attacks the checked ones' server meanwhile.

Beside the checked tenants (whose every answer and final state the load test checks
exactly), one hostile tenant goes round a cycle of attacks until the checked workload and
its verification are done (one whole cycle at least):

- reaching the checked tenants' state: a checked session, assistant and thread named in
  ``__*`` fields of its arguments (REST drops them; MCP drops them when ``_meta`` names
  the context) and in a batch's operations; the checked tenants' ids (``t1``, their
  playbooks' ids) in its own sessions; and, when it is a principal of its own, the checked
  sessions named outright (headers, ``DELETE``, their history), which must reach only its
  own sessions of those names;
- spending budgets: request bodies over the server's cap, items over the content caps,
  content until its session's and principal's caps refuse it, a new session every call,
  MCP sessions until the per-principal cap refuses one, and, when the workspace is served,
  a fork bomb and sandboxes that hold what they forked until the process budget refuses.

It never names a checked session when it shares their principal (no authentication): the
session id is then the only key, and using it is not an attack but access. A violation is
any answer that shows a checked tenant's item (their labels, ``lt…-s00001/a0/-#3``), a
write of its own that landed outside its own session, or a session of its own that could
not be ended; the checked tenants' own checks catch the rest (a foreign item, a lost
write). Its refusals are counted by kind (`refusals.refusal`), as are its accepted calls by
action, and calls cut off in transit (a server being restarted) apart from both.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx

from ctxactors.cli.loadtest.refusals import command_refusal, refusal
from ctxactors.cli.loadtest.targets import RestTarget, TransportError, refused_by
from ctxactors.cli.loadtest.workload import Outcome, PlaybookBook, Unit
from ctxactors.cli.token import Bearer
from ctxactors.context import ToolContext

# A fork bomb that keeps what it got: dash gives up at its first failed fork (its sandbox,
# with every sleeper, ends with it); perl counts the failures and holds the rest. 240 a
# sandbox: under the sandbox's own RLIMIT_NPROC (256), so only the principal's budget (or
# the server's) can refuse a fork.
HOLDING_BOMB = (
    "perl -e '$| = 1; $f = 0; for (1..240) { $p = fork; if (!defined $p) { $f++; next } "
    "if (!$p) { sleep 100000; exit } } "
    'print $f ? "Cannot fork: $f of 240\\n" : "forked\\n"; sleep 100000\''
)
# The classic: forks until the kernel refuses, then its shell (and sandbox) ends.
FORK_BOMB = "while :; do sleep 100000 & done"
_HOLDS = 4  # holding bombs alive at once at most (each ends with its timeout)
_COMMAND_TIMEOUT = 30.0
_POLL_FOR = 10.0  # seconds a started command is polled for what it printed
_CONTENT_ITEM = 256 << 10
_MCP_SESSIONS = 128  # opened in one burst at most (the default per-principal cap is 100)
_MCP_HEADERS = {"Accept": "application/json, text/event-stream"}
_MCP_INIT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "ctxactors-loadtest-hostile", "version": "0"},
}


def call(target: RestTarget, ctx: ToolContext, tool: str, args: dict[str, Any]) -> Any:
    """An answer (`Outcome`) or what the call raised."""
    try:
        return target.call(tool, args, ctx)
    except Exception as exc:  # noqa: BLE001 - every failure is an outcome to count
        return exc


def run_command(
    target: RestTarget,
    ctx: ToolContext,
    command: str,
    *,
    timeout: float,
    until: Callable[[dict[str, Any]], bool],
    poll_for: float = _POLL_FOR,
) -> Outcome | BaseException:
    """Start a workspace command and poll it until `until` holds (or `poll_for` seconds):
    the refused start, or the last poll."""
    started = call(target, ctx, "execute_command", {"command": command, "timeout": timeout})
    if not isinstance(started, Outcome) or started.is_error or started.structured is None:
        return started
    process = {"processId": started.structured["processId"]}
    deadline = time.monotonic() + poll_for
    while True:
        polled = call(target, ctx, "poll_process", process)
        if not isinstance(polled, Outcome) or polled.is_error:
            return polled
        if until(polled.structured or {}) or time.monotonic() > deadline:
            return polled
        time.sleep(0.1)


def printed(marker: str) -> Callable[[dict[str, Any]], bool]:
    """A command has printed `marker`, or ended."""
    return lambda got: marker in (got.get("output") or "") or got.get("status") != "running"


class HostileTenant:
    """One hostile tenant of a served runtime (REST and ``/mcp`` at `base`). `token`: its
    own principal's, when the server authenticates (None: a session family of its own)."""

    def __init__(
        self,
        base: str,
        token: Bearer | None,
        units: list[Unit],
        books: list[PlaybookBook],
        *,
        timeout: float = 30.0,
    ) -> None:
        self.base = base.rstrip("/").removesuffix("/mcp")
        self.own_principal = token is not None
        self.target = RestTarget(self.base, timeout=timeout, connections=4, token=token)
        self._http = httpx.Client(
            base_url=self.base, timeout=timeout, headers=token.headers() if token else {}
        )
        self._units = units
        self._books = books
        first = units[0].ctx.session_id if units else "lt-s0"
        run = first[: first.rindex("-s") + 2]  # "lt<run id>-s"
        self._leak = re.compile(re.escape(run) + r"\d+/")  # a checked item's label
        self.prefix = "hx" + run.removeprefix("lt").removesuffix("-s") + "-"
        self.accepted: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.cut_off: Counter[str] = Counter()
        self.violations: list[str] = []
        self.cycles = 0
        self.sessions: set[str] = set()
        self._mcp: list[str] = []  # open MCP session ids
        self._holds: list[float] = []  # when each holding bomb started
        self._content: ToolContext | None = None
        self._n = 0
        self._workspace: bool | None = None  # known once the tool list was read

    # -- bookkeeping -------------------------------------------------------------------------

    def _ctx(self, assistant: str | None = None) -> ToolContext:
        self._n += 1
        session = f"{self.prefix}{self._n}"
        self.sessions.add(session)
        return ToolContext(session, assistant)

    def _victim(self) -> ToolContext:
        """A checked tenant's context, in turn."""
        return self._units[self._n % len(self._units)].ctx

    def _count(self, action: str, result: Outcome | BaseException) -> str | None:
        """Count an answer: accepted under `action`, refused by its kind, or cut off;
        returns the refusal's kind (None if accepted). Any answer that shows a checked
        tenant's item is a violation."""
        if isinstance(result, httpx.HTTPError):
            self.cut_off[type(result).__name__] += 1
            return type(result).__name__
        if isinstance(result, Outcome):
            self._scan(action, f"{result.structured} {result.text}")
        kind = refusal(result)
        if kind is None:
            self.accepted[action] += 1
        else:
            self.refused[kind] += 1
        return kind

    def _scan(self, action: str, text: str) -> None:
        found = self._leak.search(text)
        if found is not None:
            at = found.start()
            self.violations.append(
                f"hostile tenant ({action}) saw a checked tenant's item: {text[at : at + 80]!r}"
            )

    # -- the cycle -----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Cycles of attacks until `stop` is set (the current cycle, and a first whole one,
        are always finished)."""
        while not (stop.is_set() and self.cycles):
            cut = sum(self.cut_off.values())
            for attack in self._attacks():
                attack()
            self.cycles += 1
            if sum(self.cut_off.values()) > cut:
                self._wait_for_server(stop)

    def _wait_for_server(self, stop: threading.Event) -> None:
        """After calls were cut off (a server being restarted): wait until it answers."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if self._http.get("/healthz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if stop.wait(0.1) and self.cycles:
                return

    def _attacks(self) -> list[Callable[[], None]]:
        attacks = [self._forged_context, self._forged_ids, self._oversized, self._content_fill]
        attacks += [self._many_sessions, self._mcp_sessions]
        if self.own_principal:
            attacks.append(self._checked_sessions)
        if self._served_workspace():
            attacks.append(self._sandboxes)
        return attacks

    def _served_workspace(self) -> bool:
        if self._workspace is None:
            try:
                tools = self._http.get("/api/v1/tools").json()["tools"]
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                return False  # asked again next cycle (a server being restarted)
            self._workspace = any(t.get("name") == "execute_command" for t in tools)
        return self._workspace

    def _forged_context(self) -> None:
        """A checked tenant's context in ``__*`` fields (REST drops them), in an MCP call
        whose ``_meta`` names its own (dropped too), and in a batch's operations: every
        write must land in its own session."""
        victim, own = self._victim(), self._ctx("a0")
        forged = {
            "__sessionId": victim.session_id,
            "__assistantId": victim.assistant_id,
            "__threadId": victim.thread_id,
            "__session_id": victim.session_id,
        }
        sent = [f"{own.session_id}/forged#{i}" for i in range(2)]
        acknowledged = []
        for text in sent:
            result = call(self.target, own, "create_goal", {"goal": text, **forged})
            if self._count("__sessionId forged in a body", result) is None:
                acknowledged.append(text)
        self._check_own(own, sent, acknowledged)
        self._mcp_spoof(own, victim)
        batch = {
            "operations": [
                {"tool": "get_planning_state", "arguments": dict(forged)},
                {"tool": "create_goal", "arguments": {"goal": "batch", **forged}},
            ]
        }
        self._count(
            "a batch's operations naming a checked context", call(self.target, own, "batch", batch)
        )
        rogue = {"operations": [{"tool": "get_planning_state", "sessionId": victim.session_id}]}
        self._count(
            "a batch's operation with a context field", call(self.target, own, "batch", rogue)
        )

    def _check_own(self, own: ToolContext, sent: list[str], acknowledged: list[str]) -> None:
        """Its own session holds every acknowledged goal and nothing it did not send there."""
        state = call(self.target, own, "get_planning_state", {})
        if self._count("reading its own session back", state) is not None:
            return
        assert isinstance(state, Outcome)
        goals = [g.get("goal") for g in (state.structured or {}).get("goals", [])]
        foreign = [g for g in goals if g not in sent and g != "batch"]
        lost = [g for g in acknowledged if g not in goals]
        if foreign or lost:
            self.violations.append(
                f"hostile tenant's session {own.session_id!r}: goals {goals}, sent {sent}, "
                f"acknowledged {acknowledged}"
            )

    def _mcp_spoof(self, own: ToolContext, victim: ToolContext) -> None:
        session = self._mcp_open()
        if not isinstance(session, str):
            self._count("an MCP session", session)
            return
        params = {
            "name": "get_planning_state",
            "arguments": {"__sessionId": victim.session_id, "__assistantId": victim.assistant_id},
            "_meta": {"ctxactors/sessionId": own.session_id, "ctxactors/assistantId": "a0"},
        }
        self._count("__sessionId forged beside _meta over MCP", self._mcp_call(session, params))
        self._mcp_close(session)

    def _forged_ids(self) -> None:
        """The checked tenants' ids (their first todo, goal, document, a playbook of theirs)
        sent from sessions of its own: "not found", or another assistant's."""
        own = self._ctx("a0")
        playbook = self._checked_playbook() or "pb1"
        for tool, args in (
            ("mark_todo", {"todo_id": "t1"}),
            ("add_todo", {"name": "x", "goal_id": "g1"}),
            ("select_playbook", {"id": playbook}),
            ("read_content", {"id": "c1"}),
            ("delete_content", {"id": "c1"}),
        ):
            self._count(f"a checked tenant's id in {tool}", call(self.target, own, tool, args))

    def _checked_playbook(self) -> str | None:
        for book in self._books:
            try:
                for owned in list(book.owned.values()):
                    for playbook in list(owned):
                        return playbook
            except RuntimeError:  # changed by its tenant meanwhile: try another book
                continue
        return None

    def _oversized(self) -> None:
        """A body over the server's cap, and items over the content and text caps."""
        own = self._ctx()
        huge = {"filename": "h", "content": "x" * (5 << 20)}  # the default body cap: 4 MiB
        self._count("a 5 MiB request body", call(self.target, own, "add_content", huge))
        big = {"filename": "b", "content": "x" * ((1 << 20) + 1)}
        self._count("a document over 1 MiB", call(self.target, own, "add_content", big))
        long = {"goal": "x" * ((64 << 10) + 1)}
        self._count("a goal over 64 KiB", call(self.target, own, "create_goal", long))

    def _content_fill(self) -> None:
        """Documents until its session's cap refuses one (then on to a new session) or its
        principal's; eight a cycle at most."""
        document = {"filename": "fill", "content": "x" * _CONTENT_ITEM}
        for _ in range(8):
            if self._content is None:
                self._content = self._ctx()
            kind = self._count("content", call(self.target, self._content, "add_content", document))
            if kind == "CTXACTORS_CONTENT_MAX_PRINCIPAL_BYTES":
                return
            if kind is not None:
                self._content = None

    def _many_sessions(self) -> None:
        for _ in range(4):
            result = call(self.target, self._ctx(), "create_goal", {"goal": "one more session"})
            self._count("a new session", result)

    def _mcp_sessions(self) -> None:
        """MCP sessions until one is refused (the per-principal cap), closed again. With no
        principal of its own there is no cap of its own to find: a few."""
        for _ in range(_MCP_SESSIONS if self.own_principal else 8):
            opened = self._mcp_open()
            if not isinstance(opened, str):
                self._count("an MCP session", opened)
                break
            self._mcp.append(opened)
            self.accepted["an MCP session"] += 1
        self._mcp_close_all()

    def _checked_sessions(self) -> None:
        """With a principal of its own: the checked sessions named outright, which must be
        its own sessions of those names."""
        victim = self._victim()
        self.sessions.add(victim.session_id)  # ended at the end: its own, of that name
        for tool, args in (
            ("get_planning_state", {}),
            ("create_goal", {"goal": f"{self.prefix}in-a-checked-name"}),
            ("list_playbooks", {}),
            ("get_recent_context", {}),
        ):
            self._count(f"a checked session named ({tool})", call(self.target, victim, tool, args))
        path = f"/api/v1/sessions/{victim.session_id}"
        for method in ("GET", "DELETE"):
            url = path + "/context" if method == "GET" else path
            try:
                response = self._http.request(method, url)
            except httpx.HTTPError as exc:
                self._count(f"{method} a checked session", exc)
                continue
            self._scan(f"{method} a checked session", response.text)
            if response.status_code == 200:
                self.accepted[f"{method} a checked session's name (its own)"] += 1
            else:
                self.refused[f"HTTP {response.status_code}"] += 1

    def _sandboxes(self) -> None:
        """A fork bomb, then sandboxes that hold what they forked (a few at once)."""
        self._command("a fork bomb", FORK_BOMB, "Cannot fork")
        now = time.monotonic()
        self._holds = [t for t in self._holds if now - t < _COMMAND_TIMEOUT]
        if len(self._holds) < _HOLDS:
            if self._command("a sandbox holding 240 processes", HOLDING_BOMB, "fork"):
                self._holds.append(now)
        else:  # the budget's refusal, or one more that starts
            self._command("a sandbox of one sleep", "sleep 100000 & echo up; wait", "up")

    def _command(self, action: str, command: str, marker: str) -> bool:
        """Run a command of its own, counted as accepted, refused at its start (a budget),
        or refused by the kernel on the way (counted by what it did); True if it started."""
        done = run_command(
            self.target, self._ctx(), command, timeout=_COMMAND_TIMEOUT, until=printed(marker)
        )
        if isinstance(done, Outcome) and not done.is_error:
            got = done.structured or {}
            kernel = command_refusal(
                got.get("output") or "", got.get("exitCode"), got.get("status", "")
            )
            if kernel is not None:
                self.refused[kernel] += 1
                return True
        return self._count(action, done) is None

    # -- MCP, spoken raw (its own small client: sessions are what it spends) -------------------

    def _mcp_post(self, message: dict[str, Any], session: str | None) -> httpx.Response:
        headers = dict(_MCP_HEADERS)
        if session is not None:
            headers["Mcp-Session-Id"] = session
        return self._http.post("/mcp", json=message, headers=headers)

    def _mcp_open(self) -> str | Outcome | BaseException:
        """A new MCP session's id, or why none was made."""
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": _MCP_INIT}
        try:
            response = self._mcp_post(init, None)
            if response.status_code != 200 or "mcp-session-id" not in response.headers:
                return _http_refusal(response)
            session = response.headers["mcp-session-id"]
            self._mcp_post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
        except httpx.HTTPError as exc:
            return exc
        return session

    def _mcp_call(self, session: str, params: dict[str, Any]) -> Outcome | BaseException:
        message = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
        try:
            response = self._mcp_post(message, session)
        except httpx.HTTPError as exc:
            return exc
        self._scan("an MCP call", response.text)
        if response.status_code != 200:
            return _http_refusal(response)
        result = _rpc_result(response.text)
        text = "\n".join(b.get("text", "") for b in result.get("content") or [])
        return Outcome(result.get("structuredContent"), bool(result.get("isError")), text)

    def _mcp_close(self, session: str) -> None:
        try:
            self._http.delete("/mcp", headers={**_MCP_HEADERS, "Mcp-Session-Id": session})
        except httpx.HTTPError:
            pass  # gone with a restarted server

    def _mcp_close_all(self) -> None:
        while self._mcp:
            self._mcp_close(self._mcp.pop())

    # -- the end ----------------------------------------------------------------------------

    def finish(self) -> None:
        """End its sessions: with its budgets spent, every DELETE must still answer 200."""
        self._mcp_close_all()
        for session in sorted(self.sessions):
            status = self._end(session)
            if status != 200:
                self.violations.append(
                    f"hostile tenant: ending its session {session!r} answered {status}"
                )
        self.target.close()
        self._http.close()

    def _end(self, session: str) -> int | str:
        last: int | str = "no answer"
        for _ in range(5):  # a call cut off by a restart is sent again
            try:
                return self._http.delete(f"/api/v1/sessions/{session}").status_code
            except httpx.HTTPError as exc:
                last = type(exc).__name__
                time.sleep(0.2)
        return last

    def report(self) -> dict[str, Any]:
        return {
            "principal": (
                "its own (a bearer token of its own)"
                if self.own_principal
                else "the checked tenants' (no authentication): a session family of its own"
            ),
            "cycles": self.cycles,
            "sessions": len(self.sessions),
            "accepted": dict(self.accepted),
            "refused": dict(self.refused),
            "cut_off": dict(self.cut_off),
            "violations": list(self.violations),
        }


def _http_refusal(response: httpx.Response) -> Outcome | BaseException:
    return TransportError(f"HTTP {response.status_code}", response.text[:200])


def _rpc_result(text: str) -> dict[str, Any]:
    """The result of a JSON-RPC answer, plain JSON or the last event of an SSE stream."""
    lines = [line[5:] for line in re.split(r"\r\n|\r|\n", text) if line.startswith("data:")]
    try:
        message = json.loads(lines[-1] if lines else text)
    except ValueError:
        return {"isError": True, "content": [{"text": f"not JSON-RPC: {text[:100]!r}"}]}
    if "error" in message:
        return {"isError": True, "content": [{"text": str(message["error"].get("message"))}]}
    result: dict[str, Any] = message.get("result") or {}
    return result


def hostile_admitted(url: str, token: Bearer | None, timeout: float = 5.0) -> None:
    """ValueError, in one line, when the server at `url` won't let the hostile tenant in:
    it authenticates and the tenant has no token (it needs a principal of its own, not the
    checked tenants'), or it refuses the token."""
    fix = "give the hostile tenant a valid token of a principal of its own in --hostile-token-file"
    refused_by(url, token, timeout, "the hostile tenant's token", fix)


@contextlib.contextmanager
def alongside(hostile: HostileTenant) -> Iterator[HostileTenant]:
    """Run `hostile` in a thread of its own for the block; then let it end its cycle and
    its sessions."""
    stop = threading.Event()
    thread = threading.Thread(
        target=hostile.run, args=(stop,), name="loadtest-hostile", daemon=True
    )
    thread.start()
    try:
        yield hostile
    finally:
        stop.set()
        thread.join()
        hostile.finish()


def print_hostile(report: dict[str, Any], out: Callable[[str], None] = print) -> None:
    """The hostile tenant's lines of the load test's report."""
    accepted, refused, cut = (report[k] for k in ("accepted", "refused", "cut_off"))
    out(
        f"  hostile      principal: {report['principal']}; {report['cycles']} cycles, "
        f"{report['sessions']} sessions; {sum(accepted.values()):,} accepted, "
        f"{sum(refused.values()):,} refused, {sum(cut.values()):,} cut off in transit"
    )
    for title, counts in (("refused", refused), ("accepted", accepted), ("cut off", cut)):
        for n, (kind, count) in enumerate(_largest(counts.items())):
            out(f"    {title if n == 0 else '':9}{count:>7,}  {kind}")


def _largest(items: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    return sorted(items, key=lambda kv: (-kv[1], kv[0]))
