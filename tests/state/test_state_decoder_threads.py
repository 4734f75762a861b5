"""Two workers loading a server's state for the first time at once: neither may crash.

msgspec caches a struct type's decoding info on the class before it has filled in its
fields' types; filling them in evaluates annotations (Python code, where the GIL can pass
to another thread). A thread that built a decoder for the same type meanwhile got the
half-built info, and its first decode crashed the process with SIGSEGV: a Ray shard died
so (the calls in flight on it came back in doubt) when several moved sessions loaded their
state at once. `decode_state` builds its decoders one at a time.

The test runs in a child process, since without the fix it dies. The window is held open
with a gate: the nested struct's annotation calls it while the first thread builds the
decoder, and it waits until the second thread has decoded (the crash) or waits for the
decoders' lock.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ctxactors

CHILD = r"""
import threading

import msgspec

from ctxactors import durable
from ctxactors.tools import Server

in_gate = threading.Event()
second_here = threading.Event()  # the second thread has decoded, or waits for the lock


def gate() -> type:
    # Called while the first thread builds the decoder, after msgspec cached the outer
    # struct's info and before it filled in its field types.
    in_gate.set()
    if not second_here.wait(60):
        raise SystemExit("the second thread never came")
    return int


class Inner(msgspec.Struct):
    value: "gate()"


class Outer(msgspec.Struct):
    items: list[Inner]


class Gated(Server):
    name = "gated"
    State = Outer


class Watched:
    # The decoders' lock, telling when the second thread waits for it.
    def __init__(self, lock):
        self.lock = lock

    def __enter__(self):
        if threading.current_thread() is second:
            second_here.set()
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


durable._decoders_lock = Watched(getattr(durable, "_decoders_lock", threading.Lock()))
# Encoding reads no decoding info: the gate is not called here.
data = msgspec.msgpack.encode(Outer([Inner(7)]))
results = {}


def load(name):
    results[name] = durable.decode_state(Gated, data)
    if name == "second":
        second_here.set()


first = threading.Thread(target=load, args=("first",))
second = threading.Thread(target=load, args=("second",))
first.start()
if not in_gate.wait(60):
    raise SystemExit("the first thread never built the decoder")
second.start()
first.join()
second.join()
print(results["first"], results["second"])
"""


def test_two_threads_building_a_state_decoder_at_once_both_decode() -> None:
    root = str(Path(ctxactors.__file__).parents[1])  # the code this test imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "Outer(items=[Inner(value=7)]) Outer(items=[Inner(value=7)])\n",
        "",
    )


SPY = r"""
import sys

import msgspec

from ctxactors import history_store
from ctxactors.servers import history
from ctxactors.transports.http import shapes

built = []


def spy(frame, event, arg):
    # msgspec reads a struct's annotations (a Python function) only while it builds the
    # struct's decoding info.
    if event == "call" and frame.f_code.co_name == "get_class_annotations":
        built.append(frame.f_locals["obj"].__name__)


sys.setprofile(spy)
kinds = [history_store.Stored, history_store.StoredCall, history.OperationRecord]
for kind in [*kinds, shapes.QueryRequest]:
    try:
        msgspec.convert({}, kind)
    except msgspec.ValidationError:
        pass
sys.setprofile(None)
print(built)
"""


def test_the_types_worker_threads_decode_are_built_when_their_module_is_imported() -> None:
    # Each worker loading a session's history converts its records: were the first of them
    # to build a type's info while another decodes it, the process could die as above.
    root = str(Path(ctxactors.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", SPY], capture_output=True, text=True, env=env, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")
