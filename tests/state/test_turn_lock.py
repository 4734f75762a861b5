"""`TurnLock`, the lock a long purge gives up between its batches: the threads waiting
for it when its holder yields get it first, each once; with none waiting, the holder goes
on at once."""

from __future__ import annotations

import threading

from ctxactors.state._turns import TurnLock
from ctxactors.testing import wait_until


def test_with_none_waiting_a_yield_returns_at_once() -> None:
    lock = TurnLock()
    with lock:
        assert lock.waiting == 0
    lock.yield_turn()
    with lock:  # taken again, uncontended
        pass
    assert lock.waiting == 0


def test_the_threads_waiting_at_a_yield_each_have_the_lock_before_its_holder_again() -> None:
    lock = TurnLock()
    order: list[str] = []

    def waiter(name: str) -> None:
        with lock:
            order.append(name)

    threads = [threading.Thread(target=waiter, args=(f"w{i}",)) for i in range(3)]
    with lock:
        for t in threads:
            t.start()
        wait_until(lambda: lock.waiting == 3)
    lock.yield_turn()
    with lock:
        order.append("holder")
    for t in threads:
        t.join(30)
    assert sorted(order[:3]) == ["w0", "w1", "w2"] and order[3] == "holder"
    assert lock.waiting == 0
    assert lock._served == 3  # noqa: SLF001 - one each: what a yield counts on
    lock.yield_turn()  # all served already: returns at once
