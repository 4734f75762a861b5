"""Mutation testing of every module that keeps a promise, with mutmut (not run in CI).

    python scripts/mutation.py                 # every group (resumes: results are kept)
    python scripts/mutation.py --group core    # one group (see GROUPS)
    python scripts/mutation.py --jobs 3        # workers (a hung mutant waits, using no CPU)
    python scripts/mutation.py --report-only   # rewrite mutation/report.md from the results
    python scripts/mutation.py --retry-survivors   # re-run survivors (after new tests)
    python scripts/mutation.py --recheck-timeouts  # re-run timeouts alone, longer limit
    python scripts/mutation.py --group core 'ctxactors._registry.*'  # matching mutants only

Each group (`GROUPS`) is a set of modules and the test files relevant to them; mutmut's
shared settings are ``[tool.mutmut]`` in pyproject.toml. Within a group mutmut runs the
tests once to learn which of them reach which function, then runs each mutant against only
those (``-x``), so the core is never run against the slow batch and workspace tests.

Each group runs in its own staged copy (``build/mutation/<group>/``), for two reasons:

- mutmut skips decorated functions, which would leave every ``@tool`` handler of the
  servers unmutated. The staged copy moves ``@tool(...)`` below the method as
  ``name = tool(...)(name)``, which builds the same tool, so the handlers are mutated too;
- editing the tree while a run is going changes nothing in the run.

`mutation/report.md` is generated: date, commit, per-module counts and score, the
equivalent mutants listed by hand in `mutation/equivalent.txt` (``name  reason`` per line),
and every mutant that survived and is not listed there.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent
STAGES = ROOT / "build" / "mutation"
REPORT = ROOT / "mutation" / "report.md"
EQUIVALENT = ROOT / "mutation" / "equivalent.txt"
NOTES = ROOT / "mutation" / "notes.md"  # hand-written, included as it is
COPIED = ["ctxactors", "tests"]
TIMEOUT_PLUGIN = ROOT / "scripts" / "_mutation_timeout.py"  # copied into each stage
RECHECK_TIMEOUT = 120  # seconds a test may run when a timeout is re-checked
RUN = "last-run.json"  # in a group's stage: the commit and date of its last mutmut run


def _tests(*names: str) -> list[str]:
    """``tests/<area>/test_<name>.py`` for each name: the tests sit in folders by area."""
    paths = [sorted((ROOT / "tests").glob(f"*/test_{name}.py")) for name in names]
    assert all(len(p) == 1 for p in paths), dict(zip(names, paths, strict=True))
    return [p[0].relative_to(ROOT).as_posix() for p in paths]


# group -> (modules mutated, test files run); the core first: it matters most.
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "core": (
        [
            f"ctxactors/{m}.py"
            for m in (
                "context",
                "tools",
                "_registry",
                "_actors",
                "_call",
                "_runtime",
                "encodable",
                "_attribute_state",
            )
        ],
        _tests(
            "context",
            "context_precedence",
            "runtime",
            "reaping",
            "acall",
            "inflight_accounting",
            "tool_declaration",
            "lifecycle_logs",
            "history",
            "hostile_input",
            "call_message",
            "attribute_state",
        )
        # It starts an MCP stdio server whose stderr is ours, which mutmut has closed.
        + [
            "--deselect",
            "tests/core/test_context_precedence.py::"
            "test_mcp_stdio_every_combination_falls_back_to_default",
            # A `serve` subprocess (mutmut can't see into it) that spends longer importing
            # than the group's 12 s limit on a loaded machine.
            "--deselect",
            "tests/servers/test_attribute_state.py::test_serve_refuses_such_a_server_in_one_line",
        ],
    ),
    "servers": (
        [
            f"ctxactors/servers/{m}.py"
            for m in (
                "planning",
                "playbooks",
                "content",
                "content_ledger",
                "content_gate",
                "history",
            )
        ],
        _tests(
            "runtime",
            "playbook_ownership",
            "content",
            "content_principal_cap",
            "content_sharing",
            "content_snippets",
            "content_principal_recount",
            "content_indexing_gate",
            "history",
            "server_details",
            "durable",  # snapshot/restore and the stored history's merge
            # The history read back from a store (merged, each record as stored, another
            # assistant's and thread's after a reload): `SessionHistory`'s store half.
            "history_store",
        ),
    ),
    # Apart: its tests run real bubblewrap sandboxes and are the slowest by far.
    "workspace": (
        [
            *(f"ctxactors/servers/{m}.py" for m in ("workspace", "workspace_dirs")),
            "ctxactors/servers/workspace_tenants.py",
            "ctxactors/sandbox.py",
            "ctxactors/sandbox_disk.py",
            "ctxactors/loop_images.py",
            "ctxactors/sandbox_diskwatch.py",
            "ctxactors/sandbox_held.py",
            "ctxactors/servers/workspace_legacy.py",
        ],
        _tests(
            "workspace",
            "workspace_ids",
            "workspace_details",
            "workspace_dirs_key",
            "workspace_durable",
            "sandbox",
            "sandbox_settings",
            "sandbox_tenants",
            "workspace_root",
            "workspace_disk_budget",
            "workspace_disk_watch",
            "workspace_loop_images",
            "workspace_legacy_dirs",
            "workspace_deep_trees",
            "workspace_disk_watch_holes",
            "workspace_delete_only",
            "workspace_legacy_attack27",
            "workspace_inode_floor",
            "workspace_legacy_retry",
            "workspace_seccomp_holes",
        ),
    ),
    # The key actors on the worker pool, async tools and the sandbox launcher.
    "scheduler": (
        [
            *(f"ctxactors/{m}.py" for m in ("_scheduler", "_fair", "_tool_loop", "_launcher")),
        ],
        _tests(
            "scheduler",
            "scheduler_fairness",
            "async_tools",
            "launcher",
            "runtime",
            "reaping",
            "acall",
        ),
    ),
    # What keeps a promise of durability: the save path, the stored history, the stores.
    "store": (
        [
            "ctxactors/durable.py",
            "ctxactors/history_store.py",
            *(f"ctxactors/state/{m}.py" for m in ("_base", "_commit", "_memory", "_sqlite")),
            *(f"ctxactors/state/{m}.py" for m in ("_redis", "_checkpoint", "_open", "_reserve")),
            "ctxactors/state/_turns.py",
            "ctxactors/state_budget.py",
            "ctxactors/_decoding.py",
        ],
        _tests(
            "durable",
            "durable_pipelined",
            "state_store",
            "history_store",
            "store_full_disk",
            "store_open",
            "durable_direct",
            "sqlite_purge",
            "principal_store_budget",
            "state_budget_history",
            "state_budget_recount",
            "history_recount_elsewhere",
            "wal_checkpoints",
            "delete_reserve",
            "group_commit",
            "memory_store",
            "state_budget_ledger",
            "turn_lock",
            "state_decoder_threads",  # decoders built once, before threads race for them
        ),
    ),
    # Who may call, and what an operator sees: authentication, access, the HTTP guard.
    "http": (
        [
            *(f"ctxactors/transports/{m}.py" for m in ("auth", "access", "guard", "connections")),
            "ctxactors/metrics.py",
        ],
        _tests(
            "http_auth",
            "http_tenancy",
            "principal",
            "metrics",
            "http_endpoints",
            "http_admission",
            "http_slow_clients",
            # The same promises in this process, where mutmut sees them (the ones above
            # drive a `ctxactors serve` subprocess, which its coverage can't see).
            "connection_guard",
            "http_access",
            "access_options",
            "metrics_served",
        ),
    ),
    # The shard's logic is plain Python: tested in-process (test_ray_shard and the tests of
    # its parts), where mutmut's coverage sees it, unlike code run inside Ray workers.
    "ray": (
        [f"ctxactors/ray/{m}.py" for m in ("_shard", "_hashing", "_claims", "_directory")],
        _tests("ray_shard", "ray_placement", "ray_claims", "ray_directory"),
    ),
    # tests/batch_support.py is staged with the tests; it is a helper, not a test file.
    "batch": (
        [
            *(f"ctxactors/batch/{m}.py" for m in ("engine", "plan", "template")),
            "ctxactors/servers/batch.py",
        ],
        _tests(
            "batch",
            "batch_rollback",
            "batch_safety",
            "batch_template",
            "batch_exact",
            "batch_presets",
            "batch_slow_undo",
            "presets",  # tests/servers: the presets' refusals and options
        ),
    ),
}

# Seconds a test may run (changing a group's pytest arguments discards its results: mutmut
# starts it over). The core had 12 (many of its mutants make a call hang, and its tests are
# quick), but three clean runs in a row failed on it at load 15: a quick test took longer.
TEST_TIMEOUT: dict[str, int] = {}

# Environment of a group's run. mutmut runs each mutant's tests under a hard RLIMIT_CPU of
# at least 31 s (it is how it times them out); every process inherits it, so the sandbox's
# `prlimit --cpu=600` (the default) fails with EPERM and every sandboxed command fails:
# each workspace mutant would count as killed whatever it changed. 30 s fits under it.
# Every group: a runtime with the built-in servers probes the sandbox when it starts, so
# any test of any group that starts one fails too (and kills every mutant it reaches).
GROUP_ENV = {group: {"CTXACTORS_WORKSPACE_CPU_SECONDS": "30"} for group in GROUPS}

# mutmut's exit codes (mutmut.stats.status_by_exit_code) folded into what the report shows.
STATUS = {1: "killed", 3: "killed", 36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout"}
STATUS |= {255: "timeout", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped"}
NOT_KILLED = ("survived", "no tests", "suspicious", "not run")


class _UnwrapTool(cst.CSTTransformer):
    """``@tool(...) def f`` -> ``def f`` followed by ``f = tool(...)(f)`` (same tool)."""

    def leave_IndentedBlock(
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body: list[cst.BaseStatement] = []
        for stmt in updated.body:
            if isinstance(stmt, cst.FunctionDef) and _only_tool(stmt):
                deco = stmt.decorators[0].decorator
                name = stmt.name
                wrapped = cst.Call(deco, [cst.Arg(name)])
                body.append(stmt.with_changes(decorators=[]))
                body.append(
                    cst.SimpleStatementLine(
                        [cst.Assign([cst.AssignTarget(name)], wrapped)],
                        leading_lines=[],
                    )
                )
            else:
                body.append(stmt)
        return updated.with_changes(body=body)


def _only_tool(fn: cst.FunctionDef) -> bool:
    if len(fn.decorators) != 1:
        return False
    deco = fn.decorators[0].decorator
    target = deco.func if isinstance(deco, cst.Call) else deco
    return isinstance(target, cst.Name) and target.value == "tool"


def _write_if_changed(path: Path, text: str) -> None:
    # mutmut regenerates a module's mutants when its source is newer: keep mtimes stable.
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def stage(group: str) -> Path:
    """Copy the tree into the group's stage (keeping its mutants/ cache); @tool unwrapped."""
    where = STAGES / group
    where.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src, dst = ROOT / name, where / name
        wanted = set()
        for path in src.rglob("*"):
            if "__pycache__" in path.parts or path.is_dir():
                continue
            rel = path.relative_to(ROOT)
            wanted.add(rel)
            text = path.read_text()
            if rel.parts[:2] == ("ctxactors", "servers") and path.suffix == ".py":
                text = cst.parse_module(text).visit(_UnwrapTool()).code
            _write_if_changed(where / rel, text)
        for path in list(dst.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                if path.relative_to(where) not in wanted:
                    path.unlink()
    # Its own directory on PYTHONPATH: `-p` imports it before pytest's ini `pythonpath`
    # applies, and the stage itself there would shadow the mutated package.
    (where / "plugins").mkdir(exist_ok=True)
    _write_if_changed(where / "plugins" / TIMEOUT_PLUGIN.name, TIMEOUT_PLUGIN.read_text())
    _write_if_changed(where / "pyproject.toml", _group_config(group))
    return where


def _group_config(group: str) -> str:
    """pyproject.toml's [tool.mutmut] plus the group's modules, tests and test time limit."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    modules, tests = GROUPS[group]
    pytest_args = [
        *config.get("pytest_add_cli_args", []),
        f"--timeout={TEST_TIMEOUT.get(group, 30)}",
        *("-p", TIMEOUT_PLUGIN.stem),
    ]
    config = {
        **config,
        "only_mutate": modules,
        "pytest_add_cli_args": pytest_args,
        "pytest_add_cli_args_test_selection": tests,
    }
    # pytest's own section stops it from reading the checkout's pyproject.toml and conftest.py
    # above the stage, which put the checkout first on sys.path: the tests then imported the
    # unmutated package and mutmut found no test reaching any mutant.
    pytest_ini = {
        **tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"],
        "testpaths": ["tests"],
        "pythonpath": ["."],
    }
    lines = ["[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in config.items()]
    lines += ["", "[tool.pytest.ini_options]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in pytest_ini.items()]
    return "\n".join(lines) + "\n"


def run(group: str, jobs: int, names: list[str], env: dict[str, str] | None = None) -> int:
    where = stage(group)
    mutmut = Path(sys.executable).with_name("mutmut")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **GROUP_ENV.get(group, {}), **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(where / "plugins"), env.get("PYTHONPATH")])
    )
    cmd = [str(mutmut), "run", "--max-children", str(jobs), *names]
    code = subprocess.call(cmd, cwd=where, env=env)
    # The report says which commit each group's results are from (groups run at different times).
    run = {"commit": _commit(), "date": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}"}
    (where / RUN).write_text(json.dumps(run) + "\n")
    return code


def _commit() -> str:
    """HEAD, marked when ctxactors/ or tests/ have changes not committed."""
    dirty = _git("status", "--porcelain", "ctxactors", "tests")
    return _git("rev-parse", "--short", "HEAD") + (" (with uncommitted changes)" if dirty else "")


def _equivalent() -> dict[str, str]:
    out: dict[str, str] = {}
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, _, reason = line.strip().partition(" ")
                out[name] = reason.strip()
    return out


def _results(groups: list[str]) -> dict[str, dict[str, str]]:
    """module path -> mutant name -> status, from mutmut's meta files."""
    out: dict[str, dict[str, str]] = {}
    for group in groups:
        mutants = STAGES / group / "mutants"
        for module in GROUPS[group][0]:
            meta = mutants / f"{module}.meta"
            if not meta.exists():
                continue
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            out[module] = {
                k: STATUS.get(v, "suspicious" if v is not None else "not run")
                for k, v in codes.items()
            }
    return out


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def report() -> str:
    results = _results(list(GROUPS))
    equivalent = _equivalent()
    lines = [
        "# Mutation testing report",
        "",
        f"Generated by `python scripts/mutation.py` on "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC at commit `{_commit()}`, "
        "with mutmut "
        f"{_mutmut_version()}, then `--retry-survivors` after new tests. "
        "Score = (killed + timeout) / (mutants - equivalent - skipped - not run yet); "
        "'timeout' is a mutant that made a test run past its limit (30 s; each one "
        "re-checked alone at 120 s with `--recheck-timeouts`, so a loaded machine's slow "
        "test is not counted), so a test failed on it; a score "
        "marked 'partial' covers only the mutants run so far (mutmut runs the quickest "
        "first).",
        "",
        "Each group's rows are from its last run (`--retry-survivors` included): "
        + "; ".join(run for group in GROUPS if (run := _last_run(group))),
        "",
        "| module | mutants | killed | timeout | survived | no tests | not run yet | equivalent "
        "| score |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    survivors: list[str] = []
    totals: Counter[str] = Counter()
    for module, statuses in results.items():
        counts: Counter[str] = Counter()
        for name, status in statuses.items():
            if status in NOT_KILLED and name in equivalent:
                status = "equivalent"
            counts[status] += 1
            if status in NOT_KILLED and status != "not run":
                survivors.append(f"- `{name}`: {status}")
        counts["mutants"] = len(statuses)
        totals.update(counts)
        lines.append(_row(module, counts))
    lines.append(_row("**all**", totals))
    if NOTES.exists():
        lines += ["", NOTES.read_text().strip()]
    lines += ["", "## Groups (each mutant runs only the tests of its group that reach it)", ""]
    for group, (modules, tests) in GROUPS.items():
        lines.append(f"- {group}: {', '.join(modules)}; tests: {', '.join(tests)}")
    lines += ["", "## Equivalent mutants (listed by hand in `mutation/equivalent.txt`)", ""]
    listed = {n for s in results.values() for n in s}
    lines += [f"- `{n}`: {r}" for n, r in sorted(equivalent.items()) if n in listed] or ["none"]
    lines += ["", "## Surviving mutants not known to be equivalent", ""]
    lines += survivors or ["none"]
    return "\n".join(lines) + "\n"


def _last_run(group: str) -> str:
    path = STAGES / group / RUN
    if not path.exists():
        return ""
    run = json.loads(path.read_text())
    return f"{group} at `{run['commit']}` ({run['date']} UTC{_since(group, run['commit'])})"


def _since(group: str, commit: str) -> str:
    """Whether the group's modules, tests and test helpers are the same at HEAD as at the
    commit it ran at: groups run at different commits, and a row holds for HEAD if so."""
    modules, tests = GROUPS[group]
    files = [*modules, *(t for t in tests if t.startswith("tests/")), ":(glob)tests/*.py"]
    if commit.split()[0] == _git("rev-parse", "--short", "HEAD"):
        return ""
    changed = _git("diff", "--name-only", commit.split()[0], "HEAD", "--", *files)
    if not changed:
        return "; its modules and tests unchanged at HEAD"
    return "; changed since: " + ", ".join(f"`{f}`" for f in changed.split())


def _row(module: str, c: Counter[str]) -> str:
    judged = c["mutants"] - c["equivalent"] - c["skipped"] - c["not run"]
    score = f"{100 * (c['killed'] + c['timeout']) / judged:.1f}%" if judged else "-"
    if judged and c["not run"]:
        score += " (partial)"
    return (
        f"| {module} | {c['mutants']} | {c['killed']} | {c['timeout']} "
        f"| {c['survived'] + c['suspicious']} | {c['no tests']} | {c['not run']} "
        f"| {c['equivalent']} | {score} |"
    )


def _mutmut_version() -> str:
    from importlib.metadata import version

    return version("mutmut")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutant name globs to (re)run")
    parser.add_argument("--group", action="append", choices=list(GROUPS), help="default: all")
    parser.add_argument("--jobs", type=int, default=1, help="mutmut workers (default 1)")
    parser.add_argument("--report-only", action="store_true", help="only write the report")
    parser.add_argument(
        "--retry-survivors", action="store_true", help="re-run the mutants not killed yet"
    )
    parser.add_argument(
        "--recheck-timeouts",
        action="store_true",
        help=f"re-run the timeouts one at a time, {RECHECK_TIMEOUT} s a test (a loaded "
        "machine makes false ones)",
    )
    opts = parser.parse_args()
    for group in [] if opts.report_only else opts.group or list(GROUPS):
        names, jobs, env = list(opts.names), opts.jobs, {}
        if opts.retry_survivors:
            names += _survivors(group)
        if opts.recheck_timeouts:
            names += _timeouts(group)
            jobs, env = 1, {"CTXACTORS_MUTATION_TEST_TIMEOUT": str(RECHECK_TIMEOUT)}
        if (opts.retry_survivors or opts.recheck_timeouts) and not names:
            continue
        code = run(group, jobs, names, env)
        if code != 0:
            print(f"mutmut exited with {code} for {group}", file=sys.stderr)
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(report())
    print(f"wrote {REPORT.relative_to(ROOT)}")
    return 0


def _timeouts(group: str) -> list[str]:
    return [
        name
        for statuses in _results([group]).values()
        for name, status in statuses.items()
        if status == "timeout"
    ]


def _survivors(group: str) -> list[str]:
    # mutmut looks up the tests of an exact name and fails on a function that had none
    # (a glob is looked up leniently): glob those.
    equivalent = _equivalent()
    return [
        name if status == "survived" else f"{name}*"
        for statuses in _results([group]).values()
        for name, status in statuses.items()
        if status in NOT_KILLED and name not in equivalent
    ]


if __name__ == "__main__":
    sys.exit(main())
