"""How the suite spreads over pytest-xdist's workers (``scripts/dev.py test`` runs it so).

``--dist loadfile``: a test module (or documentation page) runs whole on one worker, in its
written order, so what its tests share stays shared: a served process or a Ray cluster
started once per module or session, a page's examples in one namespace. Everything a test
uses beyond that is its own (`tmp_path`, free ports, a workspace root, sandbox uids of its
own where it fills a per-uid kernel limit), so modules run beside each other freely.
(``--dist loadgroup`` with marks would split more finely, but pytest 9.2's structured node
ids drop its groups silently: pytest-xdist issue 1386.)

A worker takes the next module when it is nearly done with its last, so a long module
started last would leave the others idle: this plugin (``tests/conftest.py`` loads it)
puts the modules in order of their longest declared timeout (pytest-timeout's mark, the
ini's default otherwise), then of their size; ``--no-loadscope-reorder`` keeps that order.

Those timeouts only stop a test that hangs, and were set for a test running alone: beside
N-1 others (N workers on the same cores) a test may take N times as long, so on a worker
each is N times the declared one. What a test asserts, and the deadlines of the conditions
it waits for, stay as written.
"""

from __future__ import annotations

import os

import pytest


def declared_timeout(item: pytest.Item) -> float:
    mark = item.get_closest_marker("timeout")
    if mark is not None and mark.args:
        return float(mark.args[0])
    return float(item.config.getini("timeout") or 0)


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker: as written
        return
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    for item in items:
        declared = declared_timeout(item)
        if declared > 0 and workers > 1:
            mark = item.get_closest_marker("timeout")
            kwargs = mark.kwargs if mark is not None else {}
            # First among the item's own marks: the one pytest-timeout reads.
            item.add_marker(pytest.mark.timeout(declared * workers, **kwargs), append=False)
    longest: dict[str, float] = {}
    size: dict[str, int] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        module = module_of(item)
        longest[module] = max(longest.get(module, 0.0), declared_timeout(item))
        size[module] = size.get(module, 0) + 1
        first.setdefault(module, index)

    def order(item: pytest.Item) -> tuple[float, int, int]:
        module = module_of(item)
        return (-longest[module], -size[module], first[module])

    items.sort(key=order)  # stable: a module's tests keep their order
