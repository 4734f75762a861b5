"""pytest plugin for mutation runs: a test past its time limit ends the run with exit status
36, which mutmut counts as a timeout, not a kill.

pytest-timeout's own way fails the test, and mutmut counts any failure as a kill: on a loaded
machine a test that was only slow then "killed" a mutant it never caught, and nothing in the
results told those apart. A timeout is re-run alone with a longer limit
(``scripts/mutation.py --recheck-timeouts``), which the environment sets (changing pytest's
arguments would make mutmut discard every result of the group).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from mutmut.mutation import trampoline

TIMEOUT_EXIT = 36  # mutmut.stats.status_by_exit_code: "timeout"
ENV = "CTXACTORS_MUTATION_TEST_TIMEOUT"
# mutmut's runs of the unmutated code (the clean run, the stats run...): one test past its
# limit there aborts the whole group, and a loaded machine is no reason for that.
UNMUTATED = {"", "stats", "fail", "list_all_tests"}
UNMUTATED_TIMEOUT = 600.0


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool:
    seconds = float(os.environ.get(ENV) or settings.timeout or 0)
    if seconds > 0 and trampoline.get_mutant_under_test() in UNMUTATED:
        seconds = max(seconds, UNMUTATED_TIMEOUT)
    if seconds > 0:
        timer = threading.Timer(seconds, os._exit, args=(TIMEOUT_EXIT,))
        timer.daemon = True
        timer.start()
        item.stash[_TIMER] = timer
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool:
    timer = item.stash.get(_TIMER, None)
    if timer is not None:
        timer.cancel()
    return True


_TIMER = pytest.StashKey[threading.Timer]()
