#!/usr/bin/env python3
"""A noisy neighbour: one principal spends its budgets while another runs the load tester.

One real ``ctxactors serve --transport http`` with bearer-token authentication, the built-in
servers (the workspace sandbox included) and its default SQLite store. Two principals:

- the *victim* runs the load tester's fixed workload (``ctxactors loadtest``'s Python API,
  in a process of its own: `--sessions` sessions of `--calls` planning and playbook calls
  from `--workers` threads, every answer and final state checked exactly), run after run
  (fresh sessions each time) for `--seconds`; and, every two seconds, a sandboxed
  ``echo`` of its own, polled until it exits;
- the *attacker*, in the second phase, first spends every budget a tenant has, then keeps
  pushing past each while the victim runs: CPU (32 busy loops in a sandbox), memory
  (sandboxes filling their tmpfs ``/tmp`` and ``/dev/shm`` to 512 MiB under its memory
  budget, then 512 MiB more), disk (a file 256 MiB past its workspace disk budget, then a
  write from another session, and 1 MB documents in the content store from four sessions until the per-principal cap refuses them), and
  processes (sandboxes forking sleepers, holding what they got, until a fork fails); then a
  new attempt at processes, content and a 5 MiB request body every half second, memory
  every five. In the third phase, with its budgets given back, it makes the server itself
  work: `--streams` sessions adding and deleting a 1 MB document of random words (its
  full-text index), which spends no budget at all.

The victim's workload runs three times in the same run: alone (the baseline), beside the
attacker at its budgets, and beside its server work. The table puts the victim's p50/p99,
errors and sandboxes of the three side by side with their ratios to the baseline; then
what the attacker got (each refusal by the budget that refused it: the variable its error
names, or what the kernel did to its command), what the kernel counted in its cgroups, and
how its sessions ended (DELETE, which must answer 200 with every budget spent). The
enforcement in force is the server's startup log line ``workspace_budgets``. Target: the
victim's p99 within 2x of its baseline, and no victim error.

Run as root, so that the server may make cgroups (CI is root; elsewhere the fallback is in
force and the line says so). The machine is shared: say what else ran beside the figures.
The clients (the victim's load tester, and this process, which sends the attacker's
requests once the server has started) stand for tenants' machines, not more processes of
the server's host: as root they run in a cpu cgroup of their own weighing ten processes, so
the host's scheduler does not make them wait for the server's group, sandboxes included
(with the sandboxes idle beside the server, a load tester sharing the CPU with them measured
itself: `--attacks cpu`, victim p99 2.7x and 4.0x; in its own group 1.16x and 1.31x).
`--client-on-host` leaves them beside the server.
`--server-cpus` pins the server (and so every sandbox it starts) with ``taskset``;
`--attacks` runs some of the attacks only, to find which one costs the victim.

    python scripts/bench_tenants.py [--seconds 12] [--server-cpus 1] [--set NAME=VALUE]
                                    [--streams 4] [--attacks cpu,memory,...] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shutil
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from ctxactors import cgroups
from ctxactors.cli.loadtest.hostile import HOLDING_BOMB, call, printed, run_command
from ctxactors.cli.loadtest.refusals import command_refusal, refusal
from ctxactors.cli.loadtest.targets import RestTarget
from ctxactors.cli.loadtest.workload import Outcome
from ctxactors.cli.token import Bearer
from ctxactors.context import ToolContext

ROOT = Path(__file__).resolve().parent.parent

VICTIM, ATTACKER = "victim", "attacker"
MIB = 1 << 20
ITEM = 1_000_000  # one document: under the default 1 MiB item cap
LOOPS = 32  # the figure: 32 busy loops raised another tenant's p50 tenfold
WAIT = 60.0  # seconds a command of the attacker's ramp may take to get where it is going
PROBE_EVERY = 2.0
# What the attacker goes for: its budgets (the second phase), then the server's own work.
ATTACKS = ("cpu", "memory", "processes", "disk", "pressure", "work")


# -- the server ----------------------------------------------------------------------------


@dataclass
class Served:
    base: str
    proc: psutil.Process
    log: Path
    budgets: dict[str, Any]  # the startup line workspace_budgets

    @property
    def enforcement(self) -> str:
        return str(self.budgets.get("enforcement", "unknown (no workspace_budgets line)"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def serving(tokens: Path, data: Path, cpus: str | None, assignments: list[str]) -> Iterator[Served]:
    port = free_port()
    log = data / "serve.log"
    root = tempfile.mkdtemp(prefix="ctxactors-bench-ws-")  # the uids must enter its parent
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CTXACTORS_LOG_LEVEL": "info",  # the startup lines; a line per call, in both phases
        "CTXACTORS_WORKSPACE_ROOT": root,
    }
    argv = [sys.executable, "-m", "ctxactors.cli", "serve", "--transport", "http"]
    argv += ["--port", str(port), "--auth-tokens", str(tokens), "--operator", VICTIM]
    argv += ["--data-dir", str(data / "state")]
    argv += [arg for item in assignments for arg in ("--set", item)]
    pin = ["taskset", "-c", cpus] if cpus else []
    with log.open("wb") as err:
        proc = subprocess.Popen(pin + argv, env=env, stdin=subprocess.DEVNULL, stderr=err)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not healthy(base):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"ctxactors serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        # taskset execs the server in place: the pid is the server's own.
        yield Served(base, psutil.Process(proc.pid), log, startup_line(log, "workspace_budgets"))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/healthz", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def startup_line(log: Path, event: str) -> dict[str, Any]:
    for line in log.read_text(errors="replace").splitlines():
        if f'"event":"{event}"' in line or f'"event": "{event}"' in line:
            found: dict[str, Any] = json.loads(line)
            return found
    return {}


# -- the victim: the load tester, in a process of its own -------------------------------------

CLIENT_GROUP_ENV = "CTXACTORS_BENCH_CLIENT_GROUP"  # the cgroup the victim's process joins
CLIENT_WEIGHT = {"v1": ("cpu.shares", "10240"), "v2": ("cpu.weight", "1000")}  # 10 processes


@contextlib.contextmanager
def client_group(on_host: bool) -> Iterator[tuple[str | None, str]]:
    """A cpu cgroup for the victim's load tester and what it is, or None where it stays on
    the host (asked to, not root, or no cpu controller at the root)."""
    root = _cpu_root()
    if on_host or os.geteuid() != 0 or root is None:
        yield None, "on the server's host, sharing its CPU" + ("" if on_host else " (no cgroup)")
        return
    version, top = root
    path = os.path.join(top, f"ctxactors-bench-clients-{os.getpid()}")
    os.makedirs(path, exist_ok=True)
    name, value = CLIENT_WEIGHT[version]
    with open(os.path.join(path, name), "w") as f:
        f.write(value)
    try:
        yield (
            path,
            f"in a cpu cgroup with the attacker's client, weighing 10 processes ({name} {value}): "
            "clients on machines of their own",
        )
    finally:
        with contextlib.suppress(OSError):  # back to the root: a group with us in stays
            join(top)
            os.rmdir(path)


def join(group: str) -> None:
    with open(os.path.join(group, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def _cpu_root() -> tuple[str, str] | None:
    """(hierarchy version, root directory) where the cpu controller can be had."""
    if os.path.exists("/sys/fs/cgroup/cpu/cpu.shares"):
        return "v1", "/sys/fs/cgroup/cpu"
    if "cpu" in _read("/sys/fs/cgroup/cgroup.subtree_control").split():
        return "v2", "/sys/fs/cgroup"
    return None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def victim_main(args: argparse.Namespace) -> int:
    """The victim's process: the load tester's workload, run after run for `seconds`, from
    a "go" line on stdin; its latencies, errors and violations as JSON on stdout."""
    from ctxactors.cli.loadtest import command
    from ctxactors.cli.loadtest.options import LoadOptions
    from ctxactors.cli.loadtest.targets import make_target
    from ctxactors.logs import configure_logging

    configure_logging(level="warning")
    if os.environ.get(CLIENT_GROUP_ENV):
        join(os.environ[CLIENT_GROUP_ENV])
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    shape = ["--sessions", str(args.sessions), "--calls", str(args.calls)]
    shape += ["--workers", str(args.workers), "--seed", "7", "--no-progress"]
    options = LoadOptions.from_args(
        parser.parse_args(["--url", args.victim, "--token-file", args.token_file, *shape])
    )
    target = make_target(options)
    print("ready", flush=True)
    sys.stdin.readline()
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    violations: list[str] = []
    runs = 0
    started = time.monotonic()
    while runs == 0 or time.monotonic() - started < args.seconds:
        units, books = command.build_workload(options)  # fresh sessions, the same shape
        metrics = command.Metrics()
        began = time.perf_counter()
        command.run_threads(target, units, books, options.workers, metrics)
        report = command.build_report(
            options, target, units, books, metrics, time.perf_counter() - began, None
        )
        latencies += metrics.latencies
        errors.update(metrics.errors)
        violations += report["violations"]
        runs += 1
    target.close()
    out = {
        "runs": runs,
        "elapsed_s": time.monotonic() - started,
        "latencies": latencies,
        "errors": dict(errors),
        "violations": violations,
    }
    print(json.dumps(out), flush=True)
    return 0


class Victim:
    """The victim's load-tester process, started and made ready before its phase."""

    def __init__(self, base: str, token_file: Path, args: argparse.Namespace) -> None:
        argv = [sys.executable, str(Path(__file__).resolve()), "--victim", base]
        argv += ["--token-file", str(token_file), "--seconds", str(args.seconds)]
        argv += ["--sessions", str(args.sessions), "--calls", str(args.calls)]
        argv += ["--workers", str(args.workers)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if args.client_group:
            env[CLIENT_GROUP_ENV] = args.client_group
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit("the victim's load tester did not start")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, served: Served) -> dict[str, Any]:
        """Its figures, once it is done. If the server dies meanwhile, the load tester
        would send its calls again forever (a call refused before it was sent did not
        run): stop it and say so instead."""
        while True:
            try:
                out, _ = self.proc.communicate(timeout=0.5)  # reading all the while
                break
            except subprocess.TimeoutExpired:
                if alive(served.proc):
                    continue
            self.proc.kill()
            self.proc.wait()
            tail = served.log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"bench_tenants: the server died during a phase:\n{tail}")
        found: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return found


class Probe:
    """The victim's own sandboxed command every two seconds: started, polled until done."""

    def __init__(self, target: RestTarget) -> None:
        self.target = target
        self.seconds: list[float] = []
        self.failures: Counter[str] = Counter()

    def run(self, stop: threading.Event) -> None:
        n = 0
        while not stop.wait(PROBE_EVERY):
            n += 1
            ctx = ToolContext(f"probe-{n}")
            began = time.perf_counter()
            done = run_command(self.target, ctx, "echo ok", timeout=30, until=ended, poll_for=WAIT)
            if isinstance(done, Outcome) and not done.is_error:
                got = done.structured or {}
                if (got.get("status"), got.get("exitCode"), got.get("output")) == (
                    "exited",
                    0,
                    "ok\n",
                ):
                    self.seconds.append(time.perf_counter() - began)
                    continue
            self.failures[refusal(done) or f"answer {short(done)}"] += 1


def ended(got: dict[str, Any]) -> bool:
    return got.get("status") != "running"


def short(result: Outcome | BaseException) -> str:
    if isinstance(result, Outcome):
        return str(result.structured or result.text)[:120]
    return repr(result)[:120]


# -- the attacker -------------------------------------------------------------------------


LOOPS_COMMAND = f"for i in $(seq {LOOPS}); do (while :; do :; done) & done; echo spinning; wait"
TMPFS = "head -c 256M /dev/zero > /tmp/f; head -c 256M /dev/zero > /dev/shm/f"


class Attacker:
    """One principal spending every budget it has, then pushing past each until stopped;
    or making the server itself work hard (`churn`)."""

    def __init__(
        self,
        target: RestTarget,
        token: Bearer,
        budgets: dict[str, Any],
        hold: float,
        oom_kills: Callable[[], int] = lambda: 0,
        attacks: frozenset[str] = frozenset(ATTACKS),
    ):
        self.target = target
        self.attacks = attacks
        self.oom_kills = oom_kills  # the kernel's count of OOM kills in its memory group
        self.token = token
        self.budgets = budgets
        self.hold = hold  # its commands' timeout: they outlive the phase (ended by DELETE)
        self.outcomes: dict[str, Counter[str]] = {}
        self.notes: dict[str, str] = {}
        self.sessions: set[str] = set()
        self._n = 0
        self._lock = threading.Lock()

    def _ctx(self, kind: str) -> ToolContext:
        with self._lock:
            self._n += 1
            session = f"atk-{kind.split(':')[0]}-{self._n}"
            self.sessions.add(session)
        return ToolContext(session)

    def _count(self, resource: str, outcome: str) -> None:
        with self._lock:
            self.outcomes.setdefault(resource, Counter())[outcome] += 1

    def _timed(self, resource: str, began: float) -> None:
        self.notes[resource] = (
            f"{self.notes.get(resource, '')}; ramp {time.monotonic() - began:.1f} s".lstrip("; ")
        )

    def _command(self, resource: str, command: str, marker: str) -> bool:
        """A command of the attacker's, counted as accepted (it printed `marker`), refused
        at its start (the budget's error), or refused by the kernel on the way; True when
        it was accepted."""
        done = run_command(
            self.target,
            self._ctx(resource),
            command,
            timeout=self.hold,
            until=printed(marker),
            poll_for=WAIT,
        )
        outcome = refusal(done)
        if isinstance(done, Outcome) and outcome is None:
            got = done.structured or {}
            output = got.get("output") or ""
            outcome = command_refusal(output, got.get("exitCode"), got.get("status", ""))
            if outcome is None and marker not in output:
                outcome = f"ended: {got.get('status')} {got.get('exitCode')}"
        self._count(resource, outcome or "accepted")
        return outcome is None

    # -- budgets ----------------------------------------------------------------------------

    def ramp(self) -> None:
        """Up to every budget of `attacks`: the content store from four sessions meanwhile;
        memory, processes, CPU, then a workspace file (its full disk refuses the principal
        any new session directory, so it comes last; beside the process bombs its commands
        meet the process budget first: `--attacks disk` shows the disk budget's refusal).
        The busy loops come late because
        they take the principal's own CPU share from its later commands, and every sandbox
        needs a few processes, so room is left for them before a last bomb forks into the
        limit."""
        began = time.monotonic()
        content = threading.Thread(target=self._fill_content, args=(began,))
        if "disk" in self.attacks:
            content.start()
        if "memory" in self.attacks:
            budget = int(self.budgets.get("principal_memory_bytes") or 2 << 30)
            held = 0
            while held + 1024 * MIB <= budget:  # all but 512 MiB, in 512 MiB sandboxes
                if not self._command("memory", TMPFS + "; echo held; sleep 100000", "held"):
                    break
                held += 512 * MIB
            self.notes["memory"] = f"{held // MIB} MiB of tmpfs held, then 512 MiB more"
            self._past_memory()
            self._timed("memory", began)
        bombs = "processes" in self.attacks
        processes = int(self.budgets.get("principal_processes") or 1024)
        for _ in range(max(processes // 244 - 1, 0) if bombs else 0):  # room for the loops
            if not self._command("processes", HOLDING_BOMB, "fork"):
                break
        if "cpu" in self.attacks:
            self._command("cpu", LOOPS_COMMAND, "spinning")
            self._timed("cpu", began)
        for _ in range(4 if bombs else 0):  # into the limit: a fork fails, or a refusal
            if not self._command("processes", HOLDING_BOMB, "fork"):
                break
        if bombs:
            self._timed("processes", began)
        if "disk" in self.attacks:  # last: a full disk leaves no room for a new session
            budget = int(self.budgets.get("principal_disk_bytes") or 1 << 30)
            size = budget // MIB + 256  # past its disk budget, in one session
            write = f"head -c {size}M /dev/zero > f && sync && echo ok"
            self._command("disk: workspace file", write, "ok")
            # Then from another session, which must be told that the budget is spent.
            self._command("disk: workspace file", "echo x > g && echo ok", "ok")
            self.notes["disk: workspace file"] = (
                f"{size} MiB against a {budget // MIB} MiB budget "
                f"({self.budgets.get('disk_enforcement', 'unknown')})"
            )
        if content.ident is not None:
            content.join()

    def _past_memory(self) -> None:
        """512 MiB more of tmpfs: past the budget, the kernel's OOM killer ends one of the
        attacker's processes (any of them: its tmpfs pages belong to no process)."""
        before = self.oom_kills()
        command = TMPFS + "; echo rc=$?"
        done = run_command(
            self.target,
            self._ctx("memory"),
            command,
            timeout=60,
            until=printed("rc="),
            poll_for=WAIT,
        )
        killed = self.oom_kills() - before
        if killed > 0:
            self._count("memory", f"kernel: the OOM killer ended {killed} of its processes")
        else:
            self._count("memory", refusal(done) or "accepted (not past the budget)")

    def _fill_content(self, began: float) -> None:
        """Documents in four sessions at once until the principal's content cap refuses one
        (a session's own cap moves its stream to a new session)."""
        stored = [0]

        def stream(n: int) -> None:
            ctx = self._ctx("content")
            for i in range(10_000):
                args = {"filename": f"d{n}-{i}", "content": FILLER}
                why = refusal(call(self.target, ctx, "add_content", args))
                self._count("disk: content", why or "accepted")
                if why is None:
                    with self._lock:
                        stored[0] += 1
                elif why == "CTXACTORS_CONTENT_MAX_PRINCIPAL_BYTES":
                    return
                else:
                    ctx = self._ctx("content")

        threads = [threading.Thread(target=stream, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.notes["disk: content"] = f"{stored[0] * ITEM / MIB:,.0f} MiB of documents stored"
        self._timed("disk: content", began)

    def pressure(self, stop: threading.Event) -> None:
        """Until `stop` (with "pressure" in `attacks`): a new attempt past each budget every
        half second (memory: every five seconds)."""
        if "pressure" not in self.attacks:
            return
        tick = 0
        while not stop.wait(0.5):
            tick += 1
            self._command("processes", HOLDING_BOMB, "fork")
            args = {"filename": "d", "content": FILLER}
            got = call(self.target, self._ctx("content"), "add_content", args)
            self._count("disk: content", refusal(got) or "accepted")
            args = {"filename": "h", "content": HUGE}
            self._count(
                "request body",
                refusal(call(self.target, self._ctx("body"), "add_content", args)) or "accepted",
            )
            if tick % 10 == 0:
                self._past_memory()

    # -- the server's own work ---------------------------------------------------------------

    def churn(self, stop: threading.Event) -> None:
        """Until `stop`: add a document of random words (a full-text index of a megabyte)
        and delete it again, so no budget is ever spent."""
        ctx = self._ctx("work")
        while not stop.is_set():
            added = call(self.target, ctx, "add_content", {"filename": "w", "content": WORDS})
            self._count("server work: add+delete 1 MB", refusal(added) or "accepted")
            if isinstance(added, Outcome) and added.structured:
                call(self.target, ctx, "delete_content", {"id": added.structured["id"]})

    def end(self) -> dict[str, Any]:
        """End every session of the attacker's (DELETE): with every budget spent, still 200."""
        statuses: Counter[int] = Counter()
        slowest = 0.0
        auth = self.token.headers()
        with httpx.Client(base_url=self.target.base, headers=auth, timeout=60) as http:
            for session in sorted(self.sessions):
                began = time.perf_counter()
                response = http.delete(f"/api/v1/sessions/{session}")
                slowest = max(slowest, time.perf_counter() - began)
                statuses[response.status_code] += 1
        self.sessions.clear()
        return {
            "sessions": sum(statuses.values()),
            "statuses": dict(statuses),
            "slowest_s": slowest,
        }


FILLER = "x" * ITEM  # cheap to index: one trigram
HUGE = "x" * (5 * MIB)  # over the 4 MiB request body cap
# Random words: a trigram index of a megabyte of them costs the server seconds of CPU.
WORDS = " ".join(
    "".join(random.Random(n).choices(string.ascii_lowercase, k=7)) for n in range(ITEM // 8)
)


# -- what the kernel counted ----------------------------------------------------------------


def group_dirs(budgets: dict[str, Any], principal: str) -> dict[str, str]:
    """Controller -> the principal's cgroup directory, from the startup line's paths
    (``kernel: cgroup v1 (pids, memory, cpu) at DIR, DIR, DIR``); {} in the fallback."""
    enforcement = str(budgets.get("enforcement", ""))
    if not enforcement.startswith("kernel: cgroup"):
        return {}
    paths = enforcement.split(" at ", 1)[1].split("; ", 1)[0].split(", ")  # then notes
    group = cgroups.group_name(principal)
    if "cgroup v2" in enforcement:
        return dict.fromkeys(cgroups.CONTROLLERS, os.path.join(paths[0], group))
    out: dict[str, str] = {}
    for path in paths:  # each under its hierarchy's mount, named by its controllers
        for part in path.split("/"):
            for controller in set(part.split(",")) & set(cgroups.CONTROLLERS):
                out.setdefault(controller, os.path.join(path, group))
    return out


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def keyed(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[name] = int(value)
    return out


class KernelWatch:
    """Samples the attacker's cgroups each quarter second: peaks and the kernel's counts."""

    def __init__(self, dirs: dict[str, str]) -> None:
        self.dirs = dirs
        self.peak_processes = 0
        self.peak_memory = 0
        self.last: dict[str, Any] = {}
        self.cpu_seconds = 0.0
        self._cpu: dict[int, float] = {}

    def sample(self, cpu_too: bool = True) -> None:
        pids, memory = self.dirs.get("pids"), self.dirs.get("memory")
        if pids:
            now = read(os.path.join(pids, "pids.current"))
            if now.isdigit():
                self.peak_processes = max(self.peak_processes, int(now))
                self.last["pids.max"] = read(os.path.join(pids, "pids.max"))
                self.last["pids.events"] = keyed(read(os.path.join(pids, "pids.events")))
        if memory:
            for name in ("memory.max_usage_in_bytes", "memory.peak", "memory.usage_in_bytes"):
                value = read(os.path.join(memory, name))
                if value.isdigit():
                    self.peak_memory = max(self.peak_memory, int(value))
            limit = read(os.path.join(memory, "memory.limit_in_bytes")) or read(
                os.path.join(memory, "memory.max")
            )
            self.last["memory limit"] = limit
            self.last["memory.failcnt"] = read(os.path.join(memory, "memory.failcnt"))
            oom = keyed(read(os.path.join(memory, "memory.oom_control")))
            oom.update(keyed(read(os.path.join(memory, "memory.events"))))
            if "oom_kill" in oom:
                self.last["oom_kill"] = oom["oom_kill"]
        cpu = self.dirs.get("cpu")
        if cpu and cpu_too:  # a thousand processes to read: every other second
            for pid_text in read(os.path.join(cpu, "cgroup.procs")).split():
                with contextlib.suppress(psutil.Error):
                    times = psutil.Process(int(pid_text)).cpu_times()
                    self._cpu[int(pid_text)] = times.user + times.system
            self.cpu_seconds = sum(self._cpu.values())

    def oom_kills(self) -> int:
        memory = self.dirs.get("memory")
        if not memory:
            return 0
        counts = keyed(read(os.path.join(memory, "memory.oom_control")))
        counts.update(keyed(read(os.path.join(memory, "memory.events"))))
        return counts.get("oom_kill", 0)

    def run(self, stop: threading.Event) -> None:
        tick = 0
        while not stop.wait(0.25):
            tick += 1
            self.sample(cpu_too=tick % 8 == 0)


# -- the run --------------------------------------------------------------------------------

PHASES = ("alone", "budgets", "server work")


def phases(attacks: frozenset[str]) -> list[str]:
    """The attacked phases `attacks` asks for (the baseline runs before and after them)."""
    out = []
    if attacks - {"work"}:
        out.append("budgets")
    if "work" in attacks:
        out.append("server work")
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(int(q * (len(ordered) - 1) + 0.5), len(ordered) - 1)]


def bearer(tokens: dict[str, Path], who: str) -> Bearer:
    return Bearer(tokens[who].read_text().strip(), who)


def phase(
    served: Served, tokens: dict[str, Path], args: argparse.Namespace, name: str
) -> dict[str, Any]:
    """The victim's workload for `args.seconds`: alone, beside an attacker that spent every
    budget and keeps pushing past them, or beside one that makes the server work hard."""
    victim_target = RestTarget(served.base, timeout=60, connections=4, token=bearer(tokens, VICTIM))
    attack_target = RestTarget(
        served.base, timeout=300, connections=16, token=bearer(tokens, ATTACKER)
    )
    watch = KernelWatch(group_dirs(served.budgets, ATTACKER) if name == "budgets" else {})
    attacker = Attacker(
        attack_target,
        bearer(tokens, ATTACKER),
        served.budgets,
        args.seconds + 300,
        watch.oom_kills,
        args.attacks,
    )
    victim = Victim(served.base, tokens[VICTIM], args)
    probe = Probe(victim_target)
    out: dict[str, Any] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch.run, args=(stop,))
    watcher.start()
    threads = [threading.Thread(target=probe.run, args=(stop,))]
    if name == "budgets":
        began = time.monotonic()
        attacker.ramp()  # every budget spent before the victim starts
        out["ramp_s"] = time.monotonic() - began
        threads.append(threading.Thread(target=attacker.pressure, args=(stop,)))
    elif name == "server work":
        threads += [
            threading.Thread(target=attacker.churn, args=(stop,)) for _ in range(args.streams)
        ]
    cpu_before = served.proc.cpu_times()
    began = time.monotonic()
    victim.go()
    for t in threads:
        t.start()
    result = victim.result(served)
    stop.set()
    for t in [*threads, watcher]:
        t.join()
    elapsed = time.monotonic() - began
    cpu_after = served.proc.cpu_times()
    watch.sample()
    out.update(
        figures(result["latencies"], probe.seconds),
        runs=result["runs"],
        errors=result["errors"],
        violations=len(result["violations"]),
        violation_samples=result["violations"][:5],
        probe_failures=dict(probe.failures),
        server_cpu_s=(cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system),
        elapsed_s=elapsed,
    )
    if name != "alone":
        out["attacker"] = {
            "outcomes": {k: dict(v) for k, v in attacker.outcomes.items()},
            "notes": attacker.notes,
            "ended": attacker.end(),
        }
        if watch.dirs:
            out["attacker"]["kernel"] = {
                "peak_processes": watch.peak_processes,
                "peak_memory_mib": round(watch.peak_memory / MIB, 1),
                "sandbox_cpu_s": round(watch.cpu_seconds, 1),
                **watch.last,
            }
    victim_target.close()
    attack_target.close()
    return out


def figures(latencies: list[float], probes: list[float]) -> dict[str, Any]:
    """The victim's latency figures (and the raw latencies, which the JSON leaves out)."""
    return {
        "calls": len(latencies),
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "max_ms": max(latencies, default=0.0) * 1000,
        "probe_ok": len(probes),
        "probe_p50_ms": percentile(probes, 0.5) * 1000,
        "latencies": latencies,
        "probe_seconds": probes,
    }


def merged(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """The baseline: the victim alone before the attacks and after them, as one."""
    out = figures(
        first["latencies"] + last["latencies"], first["probe_seconds"] + last["probe_seconds"]
    )
    for key in ("errors", "probe_failures"):
        out[key] = dict(Counter(first[key]) + Counter(last[key]))
    for key in ("runs", "violations", "server_cpu_s", "elapsed_s"):
        out[key] = first[key] + last[key]
    out["violation_samples"] = first["violation_samples"] + last["violation_samples"]
    out["p99_first_last_ms"] = [first["p99_ms"], last["p99_ms"]]
    return out


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def report(result: dict[str, Any]) -> str:
    alone = result["alone"]
    ran = [p for p in PHASES if p in result]
    lines = [
        f"bench_tenants: {result['machine']}",
        f"  enforcement  {result['enforcement']}",
        f"  uids         {result['uids']}; seccomp: {result['seccomp']}",
        f"  budgets      {result['budget_line']}",
        f"  victim       loadtest --sessions {result['shape']['sessions']} --calls "
        f"{result['shape']['calls']} --workers {result['shape']['workers']} over REST with its "
        f"token, run after run for {result['shape']['seconds']:g} s a phase; a sandboxed echo "
        f"every {PROBE_EVERY:g} s; its load tester {result['client']}",
        f"  attacks      {', '.join(result['attacks'])}",
        "",
        f"  {'':22}" + "".join(f"{p:>20}" for p in ran),
    ]

    def row(label: str, get: Callable[[dict[str, Any]], str]) -> None:
        lines.append(f"  {label:22}" + "".join(f"{get(result[p]):>20}" for p in ran))

    row("victim calls", lambda f: f"{f['calls']:,}")
    for q in ("p50_ms", "p99_ms", "max_ms"):

        def latency(f: dict[str, Any], q: str = q) -> str:
            return f"{f[q]:.1f}" + ("" if f is alone else f" ({ratio(f[q], alone[q])})")

        row(f"victim {q.replace('_', ' ')}", latency)
    row("victim errors", lambda f: str(sum(f["errors"].values())))
    row("victim violations", lambda f: str(f["violations"]))
    row("victim sandboxes ok", lambda f: f"{f['probe_ok']} (p50 {f['probe_p50_ms']:.0f} ms)")
    row("  refused or failed", lambda f: str(sum(f["probe_failures"].values())))
    row("server CPU s", lambda f: f"{f['server_cpu_s']:.1f} of {f['elapsed_s']:.0f}")
    before, after = alone["p99_first_last_ms"]
    lines.append(f"  (alone: before and after the attacks; p99 {before:.1f} and {after:.1f} ms)")
    for p in ran:
        for sample in result[p]["violation_samples"]:
            lines.append(f"  VIOLATION ({p}) {sample}")
        for kind, n in {**result[p]["errors"], **result[p]["probe_failures"]}.items():
            lines.append(f"  victim error ({p}) {kind}: {n}")
    for p in ran[1:]:
        attacker = result[p]["attacker"]
        ramp = result[p].get("ramp_s")
        lines += [
            "",
            f"  attacker, {p}"
            + (f" (ramp to its budgets before the victim: {ramp:.1f} s)" if ramp else ""),
        ]
        for resource, outcomes in attacker["outcomes"].items():
            note = attacker["notes"].get(resource)
            lines.append(f"    {resource}" + (f" ({note})" if note else ""))
            for outcome, n in sorted(outcomes.items(), key=lambda kv: -kv[1]):
                lines.append(f"      {n:>6}  {outcome}")
        kernel = attacker.get("kernel")
        if kernel:
            lines.append("    its cgroups: " + ", ".join(f"{k} {v}" for k, v in kernel.items()))
        ended = attacker["ended"]
        lines.append(
            f"    ending its {ended['sessions']} sessions: HTTP {ended['statuses']}, "
            f"slowest {ended['slowest_s'] * 1000:.0f} ms"
        )
    lines.append("")
    for p in ran[1:]:
        f = result[p]
        errors = sum(f["errors"].values()) + sum(f["probe_failures"].values()) + f["violations"]
        met = f["p99_ms"] <= 2 * alone["p99_ms"] and errors == 0
        lines.append(
            f"  target ({p}): victim p99 within 2x of alone, no victim error: "
            f"{'MET' if met else 'MISSED'} ({ratio(f['p99_ms'], alone['p99_ms'])}, {errors} errors)"
        )
    return "\n".join(lines)


DEFAULT_SETTINGS = [
    # The content cap per principal, down from 512 MiB so that the ramp reaches it in
    # seconds (a megabyte document costs the server about 0.2 s to index even as one trigram).
    "content.max_principal_bytes=33554432",
    # The workspace disk per principal, down from 1 GiB: the ramp writes 512 MiB, not 1.25 GiB.
    "workspace.budget.principal_disk_bytes=268435456",
]


def attacks_of(text: str) -> frozenset[str]:
    chosen = frozenset(a.strip() for a in text.split(",") if a.strip())
    unknown = chosen - set(ATTACKS)
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose from {','.join(ATTACKS)}, got {text!r}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="each phase (default 12)")
    parser.add_argument("--sessions", type=int, default=4, help="victim sessions per run")
    parser.add_argument("--calls", type=int, default=30, help="victim calls per session")
    parser.add_argument("--workers", type=int, default=2, help="victim sender threads")
    parser.add_argument("--streams", type=int, default=4, help="the attacker's server work at once")
    parser.add_argument("--server-cpus", metavar="LIST", help="taskset CPU list for the server")
    parser.add_argument(
        "--attacks",
        type=attacks_of,
        default=frozenset(ATTACKS),
        metavar="LIST",
        help=f"what the attacker goes for, of {','.join(ATTACKS)} (default: all; to find "
        "which one costs the victim)",
    )
    parser.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a server setting (repeatable), after the bench's own: " + ", ".join(DEFAULT_SETTINGS),
    )
    parser.add_argument(
        "--client-on-host",
        action="store_true",
        help="leave the victim's load tester beside the server (default, as root: a cpu "
        "cgroup of its own, standing for a machine of its own)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--victim", help=argparse.SUPPRESS)  # the victim's own process
    parser.add_argument("--token-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.victim:
        return victim_main(args)
    if os.geteuid() != 0:
        print("bench_tenants: not root: the server can't make cgroups (the fallback is measured)")
    with (
        client_group(args.client_on_host) as (args.client_group, client),
        tempfile.TemporaryDirectory(prefix="ctxactors-bench-tenants-") as tmp,
    ):
        data = Path(tmp)
        tokens = {who: data / f"{who}.token" for who in (VICTIM, ATTACKER)}
        for path in tokens.values():
            path.write_text(secrets.token_urlsafe(32))
        lines = "".join(f"{path.read_text()} {who}\n" for who, path in tokens.items())
        (data / "tokens").write_text(lines)
        assignments = [*DEFAULT_SETTINGS, *args.assignments]
        with serving(data / "tokens", data, args.server_cpus, assignments) as served:
            if args.client_group:  # only now: the server must start where a server would
                join(args.client_group)
            load = os.getloadavg()
            budgets = {
                k: v for k, v in served.budgets.items() if k.startswith(("principal_", "server_"))
            }
            result: dict[str, Any] = {
                "machine": f"{os.cpu_count()} CPUs, load average {load[0]:.1f} at the start"
                + (f", server pinned to CPUs {args.server_cpus}" if args.server_cpus else ""),
                "enforcement": served.enforcement,
                "uids": served.budgets.get("uids"),
                "seccomp": served.budgets.get("seccomp"),
                "server_budgets": budgets,
                "budget_line": ", ".join(f"{k} {v}" for k, v in budgets.items())
                + "; "
                + ", ".join(assignments),
                "shape": {k: getattr(args, k) for k in ("sessions", "calls", "workers", "seconds")},
                "client": client,
            }
            result["attacks"] = sorted(args.attacks)
            first = phase(served, tokens, args, "alone")
            for name in phases(args.attacks):
                result[name] = phase(served, tokens, args, name)
            result["alone"] = merged(first, phase(served, tokens, args, "alone"))
            result["load_average_end"] = os.getloadavg()[0]
    print(report(result))
    if args.json:
        for name in PHASES:  # the raw latencies stay out
            for key in ("latencies", "probe_seconds"):
                result.get(name, {}).pop(key, None)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
