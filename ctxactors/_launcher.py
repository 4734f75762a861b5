"""One long-lived thread that starts every sandbox.

bubblewrap's ``--die-with-parent`` is the kernel's parent-death signal, which fires when the
*thread* that forked the process exits, not the process. Tool calls run on pool threads
that come and go (`ctxactors._scheduler`'s elastic pool retires idle threads; a call may
even run on its caller's thread), so a command started there would be killed when that
thread ends. Started from this thread instead, which lives as long as the process, a
command lives until it ends, is killed, or the server itself dies (which is what the
signal is for).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
_started = threading.Lock()
_thread: threading.Thread | None = None


def launch(start: Callable[[], T]) -> T:
    """Run `start` (a `subprocess.Popen`, say) on the launcher thread; its result or error."""
    global _thread
    if _thread is None:
        with _started:
            if _thread is None:
                _thread = threading.Thread(target=_serve, name="ctxactors-launcher", daemon=True)
                _thread.start()
    done: Future[T] = Future()
    _jobs.put((start, done))
    return done.result()


def _serve() -> None:
    while True:
        start, done = _jobs.get()
        try:
            done.set_result(start())
        except BaseException as exc:  # noqa: BLE001 - the asker gets it; this thread goes on
            done.set_exception(exc)
