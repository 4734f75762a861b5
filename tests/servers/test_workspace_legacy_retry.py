"""A legacy move refused after a passing lack of room is tried again; the purge's sweep
leaves no lock file of a name it finished (issue 27, an attacker's third pass).

Before: a copy that hit ``ENOSPC`` was refused until the principal's disk had more free
than at the refusal, and the free of a disk whose other files went back to what they were
is the same again: an unused legacy directory's refusal never ended. Real ``cp``, real
files, a real small filesystem (a tmpfs) as the principal's area.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctxactors.servers import workspace_legacy
from ctxactors.servers.workspace_legacy import COPY, TRASH, Refusals, TooBig, move, prepare, sweep

MIB = 1 << 20
NAME = "ws-" + "ab" * 24


@pytest.fixture
def small_area(tmp_path: Path) -> Iterator[Path]:
    """A principal's area on a 4 MiB filesystem of its own (a tmpfs)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: to mount a small filesystem")
    area = tmp_path / "area"
    area.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(area)], check=True)
    try:
        yield area
    finally:
        subprocess.run(["umount", "-l", str(area)], check=True)


def test_a_refusal_after_enospc_is_remembered_then_tried_again(
    tmp_path: Path, small_area: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    legacy = tmp_path / "root" / NAME
    legacy.mkdir(parents=True)
    data = os.urandom(2 * MIB)  # not zeros: cp --sparse=always would make a hole of them
    (legacy / "data").write_bytes(data)
    filler = small_area / "filler"  # another command's file, deleted later
    filler.write_bytes(os.urandom(3 * MIB))
    refusals = Refusals()
    # The budget says 16 MiB are free (the image's count); the copy finds otherwise.
    with pytest.raises(TooBig) as first:
        move(str(legacy), str(small_area), 16 * MIB, refusals)
    assert (first.value.free, first.value.past_bound) == (16 * MIB, False)
    assert os.listdir(small_area) == ["filler"]  # the partial copy removed
    filler.unlink()  # the lack of room passed; the budget's count is as it was
    # Remembered for a while: no copy tried at each call.
    with pytest.raises(TooBig) as again:
        move(str(legacy), str(small_area), 16 * MIB, refusals)
    assert again.value is first.value
    # Later, tried again: it fits now.
    later = time.monotonic() + 3600
    monkeypatch.setattr(workspace_legacy, "_clock", lambda: later, raising=False)
    assert move(str(legacy), str(small_area), 16 * MIB, refusals) is True
    assert (small_area / NAME / "data").read_bytes() == data
    assert not legacy.exists()


def test_the_sweep_leaves_no_lock_file_of_a_name_it_finished(tmp_path: Path) -> None:
    root, area = tmp_path / "root", tmp_path / "area"
    area.mkdir()
    prepare(str(root))
    trashed, copied, pending = NAME, "ws-" + "cd" * 24, "ws-" + "ef" * 24
    (root / (TRASH + trashed) / "sub").mkdir(parents=True)  # removal cut short
    (area / (COPY + copied)).mkdir()  # copy cut short, its root directory gone since
    (area / (COPY + pending)).mkdir()  # copy cut short, its root directory still there
    (root / pending).mkdir()
    sweep(str(root), [str(area)])
    assert sorted(os.listdir(root)) == [".ctxactors-move-locks", pending]
    assert os.listdir(area) == []
    assert os.listdir(root / ".ctxactors-move-locks") == [pending]
