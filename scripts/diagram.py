#!/usr/bin/env python3
"""Regenerate the README's picture of a call's way through ctxactors.

    python3 scripts/diagram.py          # docs/call-flow.dot -> docs/call-flow.svg and .png

Needs Graphviz's ``dot`` (Debian: ``apt-get install graphviz``). The ``.dot`` source is the
one to edit; the generated images are committed so the README and the docs show them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
SOURCE = DOCS / "call-flow.dot"


def main() -> int:
    dot = shutil.which("dot")
    if dot is None:
        print(
            "scripts/diagram.py: needs Graphviz's dot (apt-get install graphviz)", file=sys.stderr
        )
        return 1
    for fmt, extra in (("svg", []), ("png", ["-Gdpi=110"])):
        out = SOURCE.with_suffix(f".{fmt}")
        subprocess.run([dot, f"-T{fmt}", *extra, str(SOURCE), "-o", str(out)], check=True)
        print(f"wrote {out.relative_to(DOCS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
