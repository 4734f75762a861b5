"""Mutation testing of the core, the servers and the batch engine with mutmut (not run in CI).

    python scripts/mutation.py                 # run (resumes: finished mutants are kept)
    python scripts/mutation.py --jobs 2        # more workers (the machine has 2 cores)
    python scripts/mutation.py --report-only   # rewrite mutation/report.md from the results
    python scripts/mutation.py --retry-survivors   # re-run survivors (after new tests)
    python scripts/mutation.py 'ctxactors.registry.*'   # (re)run only matching mutants

The modules and the test files come from ``[tool.mutmut]`` in pyproject.toml. mutmut runs
the selected tests once to learn which tests reach which function, then runs each mutant
against only those tests (``-x``, fastest first), so a module is tested by the tests that
exercise it and the whole run fits in well under an hour here.

The run happens in a staged copy (``build/mutation/``), for two reasons:

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
from collections import Counter
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "build" / "mutation"
REPORT = ROOT / "mutation" / "report.md"
EQUIVALENT = ROOT / "mutation" / "equivalent.txt"
COPIED = ["ctxactors", "tests", "pyproject.toml"]

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


def stage() -> None:
    """Copy the tree into STAGE (keeping its mutants/ cache), unwrapping @tool in servers."""
    STAGE.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = ROOT / name
        if src.is_file():
            _write_if_changed(STAGE / name, src.read_text())
            continue
        dst = STAGE / name
        wanted = set()
        for path in src.rglob("*"):
            if "__pycache__" in path.parts or path.is_dir():
                continue
            rel = path.relative_to(ROOT)
            wanted.add(rel)
            text = path.read_text()
            if rel.parts[:2] == ("ctxactors", "servers") and path.suffix == ".py":
                text = cst.parse_module(text).visit(_UnwrapTool()).code
            _write_if_changed(STAGE / rel, text)
        for path in list(dst.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                if path.relative_to(STAGE) not in wanted:
                    path.unlink()


def run(jobs: int, names: list[str]) -> int:
    mutmut = Path(sys.executable).with_name("mutmut")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cmd = [str(mutmut), "run", "--max-children", str(jobs), *names]
    return subprocess.call(cmd, cwd=STAGE, env=env)


def _equivalent() -> dict[str, str]:
    out: dict[str, str] = {}
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, _, reason = line.strip().partition(" ")
                out[name] = reason.strip()
    return out


def _results() -> dict[str, dict[str, str]]:
    """module path -> mutant name -> status, from mutmut's meta files."""
    out: dict[str, dict[str, str]] = {}
    for meta in sorted((STAGE / "mutants").rglob("*.py.meta")):
        module = str(meta.relative_to(STAGE / "mutants"))[: -len(".meta")]
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if codes:
            out[module] = {
                k: STATUS.get(v, "suspicious" if v is not None else "not run")
                for k, v in codes.items()
            }
    return out


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def report() -> str:
    results = _results()
    equivalent = _equivalent()
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = (
        " (with uncommitted changes)" if _git("status", "--porcelain", "ctxactors", "tests") else ""
    )
    lines = [
        "# Mutation testing report",
        "",
        f"Generated by `python scripts/mutation.py` on "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC at commit `{commit}`{dirty}, "
        "with mutmut "
        f"{_mutmut_version()}. Score = (killed + timeout) / (mutants - equivalent - skipped).",
        "",
        "| module | mutants | killed | timeout | survived | no tests | equivalent | score |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    survivors: list[str] = []
    totals: Counter[str] = Counter()
    for module, statuses in results.items():
        counts: Counter[str] = Counter()
        for name, status in statuses.items():
            if status in NOT_KILLED and name in equivalent:
                status = "equivalent"
            counts[status] += 1
            if status in NOT_KILLED:
                survivors.append(f"- `{name}`: {status}")
        counts["mutants"] = len(statuses)
        totals.update(counts)
        lines.append(_row(module, counts))
    lines.append(_row("**all**", totals))
    lines += ["", "## Equivalent mutants (listed by hand in `mutation/equivalent.txt`)", ""]
    listed = {n for s in results.values() for n in s}
    lines += [f"- `{n}`: {r}" for n, r in sorted(equivalent.items()) if n in listed] or ["none"]
    lines += ["", "## Surviving mutants not known to be equivalent", ""]
    lines += survivors or ["none"]
    return "\n".join(lines) + "\n"


def _row(module: str, c: Counter[str]) -> str:
    judged = c["mutants"] - c["equivalent"] - c["skipped"]
    score = f"{100 * (c['killed'] + c['timeout']) / judged:.1f}%" if judged else "-"
    not_killed = c["survived"] + c["suspicious"] + c["not run"]
    return (
        f"| {module} | {c['mutants']} | {c['killed']} | {c['timeout']} | {not_killed} "
        f"| {c['no tests']} | {c['equivalent']} | {score} |"
    )


def _mutmut_version() -> str:
    from importlib.metadata import version

    return version("mutmut")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutant name globs to (re)run")
    parser.add_argument("--jobs", type=int, default=1, help="mutmut workers (default 1)")
    parser.add_argument("--report-only", action="store_true", help="only write the report")
    parser.add_argument(
        "--retry-survivors", action="store_true", help="re-run the mutants not killed yet"
    )
    opts = parser.parse_args()
    names = list(opts.names)
    if opts.retry_survivors:
        equivalent = _equivalent()
        # mutmut looks up the tests of an exact name and fails on a function that had none
        # (a glob is looked up leniently): glob those.
        names += [
            name if status == "survived" else f"{name}*"
            for statuses in _results().values()
            for name, status in statuses.items()
            if status in NOT_KILLED and name not in equivalent
        ]
        if not names:
            print("no survivors to re-run")
    if not opts.report_only and (names or not opts.retry_survivors):
        stage()
        code = run(opts.jobs, names)
        if code != 0:
            print(f"mutmut exited with {code}", file=sys.stderr)
    if not (STAGE / "mutants").exists():
        print("no results yet: run without --report-only first", file=sys.stderr)
        return 1
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(report())
    print(f"wrote {REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
