"""Every Python example in the documentation (``docs/*.md``, ``README.md``) runs as a test.

Sybil collects each fenced ``python`` block of those pages as a test item; a page's blocks
run in order in one namespace, as a reader would type them. What an example needs beyond
the page (a framework's fake model) comes from a hidden block on the page itself
(``<!-- invisible-code-block: python -->``, using ``tests/docs_support.py``); an example
that can't run here says why in a ``<!-- skip: next "why" -->`` line above it, which pytest
reports as a skip with that reason.

Each page runs in a fresh working directory, with ``ctxactors`` (this environment's) first
on ``PATH`` and the workspace root and the state directory under it, so an
example that writes ``state.db`` or starts ``ctxactors serve`` leaves nothing behind.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests"))  # docs_support, for the pages' hidden blocks

_SAVED = "__docs_saved__"


def _setup(namespace: dict[str, Any]) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="ctxactors-docs-"))
    scratch.chmod(0o711)  # the workspace's sandbox user (nobody, under root) must enter it
    bin_dir = str(Path(sys.executable).parent)
    env = {
        "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "CTXACTORS_WORKSPACE_ROOT": str(scratch / "workspaces"),
        "XDG_STATE_HOME": str(scratch / "state"),
        "CTXACTORS_LOG_LEVEL": "warning",
    }
    namespace[_SAVED] = (os.getcwd(), {k: os.environ.get(k) for k in env})
    os.environ.update(env)
    os.chdir(scratch)


def _teardown(namespace: dict[str, Any]) -> None:
    cwd, env = namespace.pop(_SAVED)
    os.chdir(cwd)
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    patterns=["docs/*.md", "README.md"],
    setup=_setup,
    teardown=_teardown,
).pytest()
