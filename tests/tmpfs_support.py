"""A small file system of a test's own, to fill up without touching the host's."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def own_tmpfs(size: str, prefix: str) -> Iterator[Path]:
    """A tmpfs of `size` (``mount``'s words: ``1m``) at a new directory; skips the test where
    it can't be mounted (not root, no tmpfs)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix=prefix))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"no tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)
        where.rmdir()
