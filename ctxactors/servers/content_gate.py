"""How many full-text index builds one principal runs at once: `IndexGate`.

Indexing a megabyte document costs the server about a second of CPU (FTS5's trigram
tokenizer, in SQLite, outside the GIL), and forgetting it again as much; no budget of the
tenant's is spent, since it is the server's own work. ``add_content`` and its kin are
blocking tools, so that work holds no worker of the key pool; but four sessions of one
principal indexing at once still took both CPUs of a two-CPU server, and another tenant's
p99 went to 3-7x. With this gate one principal indexes in at most
``content.max_principal_indexing`` sessions at once (default 1: a CPU); its other adds wait
their turn on their blocking threads (at most an eighth of that pool is one principal's).
Callers with no principal are one tenant and are not gated.

The gate is held only while SQLite indexes, never while waiting for anything else, so a
principal's calls can't wait on each other in a circle.

And a large build (from `BACKGROUND_BYTES`) runs on a thread of the gate's own, `NICE`
lower, while its caller's thread waits: the one build a principal may run still took one
CPU of two from the server's other threads, and a victim's call needs several of those in
turn (the event loop, a worker, the loop again). Not ``SCHED_IDLE``, though it was for a
while (``--attacks work`` alone: a victim's p99 1.62x and 1.66x, 2.36x and 2.45x at nice
+10): the build holds the GIL, and an idle thread is descheduled for as long as anything
else wants its CPU, a tenant's sandboxes included (they are idle too: they share it half
and half), so every server thread waited on the GIL it held. With the sandboxes idle
beside the server, ``scripts/bench_tenants.py`` beside every attack at once gave 1.08x,
2.93x, 0.90x and 3.11x (the misses: the server got 5.1 CPU-seconds of the phase, 7.6 in the
others); at nice +10 1.64x, 1.79x, 1.94x and 1.61x, the server 7.3-7.6, and the server-work
phase 1.65-1.98x. A nice value is a thread's own on Linux, and an unprivileged server can't
raise it back, so those threads never run anything else.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

BACKGROUND_BYTES = 64 << 10  # a build of this much text or more runs at a lower priority
NICE = 10  # how much lower (the weight of a nice 10 thread is about a tenth of nice 0's)
_BUILDERS = 64  # low-priority threads at most, for all principals together


class IndexGate:
    """Principal -> index builds running now, at most `per_principal`; thread-safe."""

    def __init__(self, per_principal: int) -> None:
        if per_principal < 1:
            raise ValueError(f"per_principal must be at least 1, got {per_principal}")
        self.per_principal = per_principal
        self._changed = threading.Condition()
        self._running: dict[str, int] = {}
        self._waiting: dict[str, int] = {}
        self._builders: ThreadPoolExecutor | None = None  # made with the first large build

    @contextmanager
    def held(self, principal: str | None) -> Iterator[None]:
        """Wait for one of `principal`'s places, hold it for the block."""
        if principal is None:
            yield
            return
        with self._changed:
            if self._running.get(principal, 0) >= self.per_principal:
                self._waiting[principal] = self._waiting.get(principal, 0) + 1
                while self._running.get(principal, 0) >= self.per_principal:
                    self._changed.wait()
                _less(self._waiting, principal)
            self._running[principal] = self._running.get(principal, 0) + 1
        try:
            yield
        finally:
            with self._changed:
                _less(self._running, principal)
                self._changed.notify_all()

    def build(self, principal: str | None, size: int, work: Callable[[], T]) -> T:
        """Run `work` (an index build over `size` bytes of text) in one of `principal`'s
        places; from `BACKGROUND_BYTES` on a low-priority thread, waiting for it."""
        with self.held(principal):
            if size < BACKGROUND_BYTES:
                return work()
            return self._low_priority().submit(work).result()

    def _low_priority(self) -> ThreadPoolExecutor:
        with self._changed:
            if self._builders is None:
                self._builders = ThreadPoolExecutor(
                    _BUILDERS, thread_name_prefix="ctxactors-index", initializer=_lower_priority
                )
            return self._builders

    def running(self, principal: str) -> int:
        """Index builds of `principal`'s running now."""
        with self._changed:
            return self._running.get(principal, 0)

    def waiting(self, principal: str) -> int:
        """Index builds of `principal`'s waiting for a place now."""
        with self._changed:
            return self._waiting.get(principal, 0)


def _lower_priority() -> None:
    """This thread `NICE` lower (where the OS lets a thread have its own)."""
    with contextlib.suppress(OSError, AttributeError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + NICE, 19))


def _less(counts: dict[str, int], principal: str) -> None:
    left = counts[principal] - 1
    if left:
        counts[principal] = left
    else:
        del counts[principal]
