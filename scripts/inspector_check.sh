#!/usr/bin/env bash
# The MCP Inspector's CLI (from npm) against `ctxactors serve` over stdio: it must list the
# tools with clean schemas, call one with the context in _meta, and get isError for a bad
# argument. Exits non-zero on any failure. Needs node/npx; PYTHON and INSPECTOR override
# the interpreter and the pinned Inspector version. `--fetch` only downloads the Inspector
# into npx's cache (CI does it while the suite runs) and checks nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
INSPECTOR=${INSPECTOR:-@modelcontextprotocol/inspector@2.12.0}
if [ "${1:-}" = "--fetch" ]; then
    exec npm exec --yes --package="$INSPECTOR" -- true
fi
export CTXACTORS_LOG_LEVEL=${CTXACTORS_LOG_LEVEL:-warning}
# serve keeps state on disk by default: a fresh data directory, so the ids checked below
# don't depend on what an earlier run stored.
DATA=$(mktemp -d)

inspect() {
    npx -y "$INSPECTOR" --cli -e "CTXACTORS_LOG_LEVEL=$CTXACTORS_LOG_LEVEL" "$PY" -m ctxactors.cli serve --data-dir "$DATA" "$@" 2>/tmp/inspector_check.$$.err || {
        local rc=$?
        grep -v 'EBADENGINE\|npm warn' /tmp/inspector_check.$$.err >&2 || true
        return $rc
    }
}
trap 'rm -f /tmp/inspector_check.$$.err; rm -rf "$DATA"' EXIT

# check NAME PYTHON-EXPRESSION: evaluate against the JSON on stdin (as `r`).
check() {
    "$PY" -c '
import json, sys
name, expr = sys.argv[1], sys.argv[2]
r = json.load(sys.stdin)
if not eval("(" + expr + ")"):
    sys.exit(f"inspector_check: FAILED {name}: {json.dumps(r)[:2000]}")
print(f"inspector_check: ok {name}")
' "$1" "$2"
}

inspect --method tools/list | check "tools/list has the built-in tools and no reserved field" '
{"create_goal", "get_planning_state", "batch"} <= {t["name"] for t in r["tools"]}
and not any(k.startswith("__") for t in r["tools"] for k in t["inputSchema"].get("properties", {}))'

inspect --method tools/call --tool-name create_goal --tool-arg "goal=Learn Rust" \
    --tool-metadata ctxactors/sessionId=inspector |
    check "tools/call create_goal" \
        'r.get("isError") is not True and r["structuredContent"] == {"id": "g1", "goal": "Learn Rust"}'

# A tool error result may make the CLI exit non-zero; the JSON it printed is what counts.
bad=$(inspect --method tools/call --tool-name mark_todo --tool-arg todo_id=t404 || true)
printf '%s' "$bad" | check "tools/call error result" \
    'r["isError"] is True and "t404" in r["content"][0]["text"]'
echo "inspector_check: all passed"
