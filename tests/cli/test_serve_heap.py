"""`ctxactors serve` keeps its start-up heap out of the cyclic collector's passes."""

from __future__ import annotations

import gc
import weakref

from ctxactors.cli.serve import settle_heap


class _Node:
    def __init__(self) -> None:
        self.me = self


def test_settling_freezes_what_start_up_made_and_collects_its_garbage_first() -> None:
    garbage = _Node()  # a cycle nothing refers to: frozen, it would never be collected
    gone = weakref.ref(garbage)
    del garbage
    kept = _Node()
    gc.unfreeze()
    assert any(o is kept for o in gc.get_objects())
    try:
        settle_heap()
        assert gone() is None
        assert gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())  # no pass will walk it
    finally:
        gc.unfreeze()
