"""scripts/bench_all.py: every bench script runs; JSON figures or text; failures recorded."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_all.py"

WITH_JSON = """
import argparse, json
p = argparse.ArgumentParser()
p.add_argument("--json")
a = p.parse_args()
print("fast thing   120 calls/s   baseline 100 calls/s")
if a.json:
    json.dump({"benchmark": "fast", "ratio": 1.2}, open(a.json, "w"))
"""
TEXT_ONLY = 'import sys\nprint("ratio 0.9 against", sys.argv[1:] or "no args")\n'
BROKEN = 'import sys\nprint("half a table")\nsys.exit("boom")\n'


@pytest.fixture
def bench_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_all", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "bench_fast.py").write_text(WITH_JSON)
    (scripts / "bench_text.py").write_text(TEXT_ONLY)
    (scripts / "bench_broken.py").write_text(BROKEN)
    (scripts / "helper.py").write_text("raise SystemExit('not a bench')\n")
    (scripts / "bench_all.py").write_text("raise SystemExit('must not run itself')\n")
    monkeypatch.setattr(module, "SCRIPTS", scripts)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    return module


def test_report_has_machine_date_figures_and_text(bench_all: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    assert bench_all.main(["--out", str(out)]) == 1  # one script failed
    report = json.loads((out / "report.json").read_text())
    assert {"platform", "python", "cpus", "cpu_model", "memory_gb"} <= set(report["machine"])
    assert report["date"].startswith("20")
    entries = {e["script"]: e for e in report["benchmarks"]}
    assert list(entries) == [
        "scripts/bench_broken.py",
        "scripts/bench_fast.py",
        "scripts/bench_text.py",
    ]
    fast, text, broken = (entries[f"scripts/bench_{n}.py"] for n in ("fast", "text", "broken"))
    assert fast["figures"] == {"benchmark": "fast", "ratio": 1.2}
    assert fast["command"] == "python scripts/bench_fast.py --json PATH"
    assert text["figures"] is None and "ratio 0.9 against no args" in text["stdout"]
    assert broken["returncode"] == 1 and "boom" in broken["stderr"]
    md = (out / "report.md").read_text()
    assert "do not edit by hand" in md and report["machine"]["cpu_model"] in md
    assert "## scripts/bench_fast.py" in md and "baseline 100 calls/s" in md
    assert "(prints text only, no --json)" in md and "FAILED (exit 1)" in md


def test_only_selects_by_short_name(bench_all: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "only"
    assert bench_all.main(["--only", "fast", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [e["script"] for e in report["benchmarks"]] == ["scripts/bench_fast.py"]
    assert bench_all.main(["--only", "nothing", "--out", str(out)]) == 2


def test_a_hanging_script_is_cut_off(bench_all: ModuleType, tmp_path: Path) -> None:
    (bench_all.SCRIPTS / "bench_slow.py").write_text("import time\ntime.sleep(30)\n")
    out = tmp_path / "slow"
    assert bench_all.main(["--only", "slow", "--timeout", "1", "--out", str(out)]) == 1
    entry = json.loads((out / "report.json").read_text())["benchmarks"][0]
    assert entry["returncode"] is None and "timed out after 1 s" in entry["stderr"]


def test_python_is_the_running_interpreter(bench_all: ModuleType) -> None:
    assert bench_all.machine()["python"] == ".".join(map(str, sys.version_info[:3]))
