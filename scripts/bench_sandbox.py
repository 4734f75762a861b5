"""Start-up cost of a sandboxed workspace command beside an unsandboxed one, same run.

Times ``true`` from the spawn to the reaped exit, N times each way, through the code path
`execute_command` uses (`ctxactors.sandbox.start`): the sandbox (bubblewrap with its
namespaces, mounts, passwd pipes and prlimit) against ``CTXACTORS_WORKSPACE_SANDBOX=none``
(a plain ``/bin/sh -c``). The two alternate run by run so load on a shared machine hits both
alike. The process is pinned to one CPU (if allowed), as the other benchmarks are.

    .venv/bin/python scripts/bench_sandbox.py [--runs 200] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import msgspec

from ctxactors import sandbox


def one(settings: sandbox.SandboxSettings, workdir: str) -> float:
    began = time.perf_counter()
    # As a principal's uid would run it on a root server (the range's first).
    proc = sandbox.start(settings, workdir, "true", sandbox.Tenant(sandbox.probe_ids(settings)))
    proc.communicate()
    elapsed = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"`true` failed (exit {proc.returncode}) with {settings}")
    return elapsed


def summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs each way (default 200)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures here as JSON")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    sandboxed = msgspec.structs.replace(sandbox.SandboxSettings.from_env(), mode="bwrap")
    plain = msgspec.structs.replace(sandboxed, mode="none")
    root = tempfile.mkdtemp(prefix="ctxactors-bench-sandbox-")
    try:
        sandbox.check(sandboxed, root)
        workdir = tempfile.mkdtemp(dir=root)
        sandbox.prepare_directory(sandboxed, workdir, sandbox.probe_ids(sandboxed))
        times: dict[str, list[float]] = {"bwrap": [], "none": []}
        for _ in range(args.runs):
            times["bwrap"].append(one(sandboxed, workdir))
            times["none"].append(one(plain, workdir))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures = {
        "benchmark": "sandbox_startup",
        "runs": args.runs,
        "sandboxed": summary(times["bwrap"]),
        "unsandboxed": summary(times["none"]),
    }
    figures["extra_median_ms"] = round(
        figures["sandboxed"]["median_ms"] - figures["unsandboxed"]["median_ms"], 2
    )
    print(f"start-up to exit of `true`, {args.runs} runs each, alternating, one CPU")
    print(f"{'':14}{'median':>10}{'p90':>10}")
    for label, key in (("sandboxed", "sandboxed"), ("unsandboxed", "unsandboxed")):
        row = figures[key]
        print(f"{label:14}{row['median_ms']:>8.2f}ms{row['p90_ms']:>8.2f}ms")
    print(f"the sandbox adds {figures['extra_median_ms']:.2f} ms (median) to each command")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
