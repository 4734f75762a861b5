"""Why a server refused a tenant's call, in a word a report can count.

A budget's refusal names the variable that sets it (``... the limit is 64
(CTXACTORS_WORKSPACE_PRINCIPAL_PROCESSES)``, `ctxactors.settings.Cap`), so that variable is
the refusal's kind; an HTTP error is its status; any other tool error is its message with
the parts that differ from call to call (numbers, quoted names) blanked, so that a thousand
"content store full" refusals are one row, not a thousand. The load tester's hostile tenant
and ``scripts/bench_tenants.py`` count what they were refused with these.
"""

from __future__ import annotations

import re

from ctxactors.cli.loadtest.targets import TransportError
from ctxactors.cli.loadtest.workload import Outcome

_SETTING = re.compile(r"\((CTXACTORS_[A-Z0-9_]+)\)")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"\d[\d,.]*")
_CODE = re.compile(r'"code"\s*:\s*"([A-Za-z_]+)"')
_WIDTH = 72  # a kind is one short line of a report


def refusal(result: Outcome | BaseException) -> str | None:
    """The kind of refusal a call's answer (or what it raised) is; None when it was
    accepted (an answer with no error)."""
    if isinstance(result, Outcome):
        if not result.is_error:
            return None
        named = _SETTING.search(result.text)
        return named.group(1) if named else "tool error: " + _blank(result.text)
    if isinstance(result, TransportError):
        code = _CODE.search(str(result))  # the REST API's error code, when it gave one
        return f"{result.kind} {code.group(1)}" if code else result.kind
    return type(result).__name__


def _blank(text: str) -> str:
    line = _NUMBER.sub("N", _QUOTED.sub("'…'", text.strip().splitlines()[0] if text else ""))
    return line if len(line) <= _WIDTH else line[: _WIDTH - 1] + "…"


def command_refusal(output: str, exit_code: int | None, status: str) -> str | None:
    """What the kernel or the sandbox refused a finished workspace command, from its output
    and exit status (None: nothing was refused)."""
    if output.startswith("[ctxactors: ") and (named := _SETTING.search(output.split("]\n")[0])):
        return named.group(1)  # started at a disk budget: no file may grow
    last = output.rstrip("\n").rpartition("\n")[2]
    if status == "killed" and last.startswith("[ctxactors: killed: "):
        named = _SETTING.search(last)  # stopped for writing past a disk budget
        return named.group(1) if named else None
    if "Cannot fork" in output or "Resource temporarily unavailable" in output:
        return "kernel: fork failed (pids.max or RLIMIT_NPROC)"
    if "No space left on device" in output:
        return (
            "kernel: no space (a tmpfs: CTXACTORS_WORKSPACE_TMP_BYTES, or the principal's "
            "disk: CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES)"
        )
    if "File size limit exceeded" in output or exit_code == 153:
        return "kernel: file too large (CTXACTORS_WORKSPACE_MAX_FILE_BYTES)"
    if status == "exited" and (exit_code == 137 or "=137" in output):
        return "kernel: SIGKILL (the OOM killer in its memory group)"
    if status == "timeout":
        return "sandbox: timeout"
    return None
