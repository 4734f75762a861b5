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
import threading
from pathlib import Path

import msgspec

import ctxactors
from ctxactors._decoding import build_now
from ctxactors.durable import decode_state
from ctxactors.testing import wait_until
from ctxactors.tools import Server

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


# The in-process tests below: a struct's field annotation calls one of these when msgspec
# builds the struct's decoding info (and only then), so a test sees when that happens.
evaluated: list[str] = []
building = threading.Event()  # a decoder is being built, held at `built`
built = threading.Event()


def counted() -> type:
    evaluated.append("counted")
    return int


def held() -> type:
    building.set()
    if not built.wait(60):
        raise TimeoutError("the test never let the build finish")
    return int


def test_build_now_builds_a_types_decoding_info_then_and_only_then() -> None:
    evaluated.clear()

    class Fresh(msgspec.Struct):
        value: counted()  # type: ignore[valid-type]

    build_now(Fresh)
    assert evaluated == ["counted"]
    data = msgspec.msgpack.encode(Fresh(7))
    assert msgspec.msgpack.Decoder(Fresh).decode(data) == Fresh(7)
    assert evaluated == ["counted"]  # a decode later reads what was built, builds nothing


def test_a_load_whose_decoder_is_built_never_waits_for_another_servers_first_build() -> None:
    class Slow(msgspec.Struct):
        value: held()  # type: ignore[valid-type]

    class Quick(msgspec.Struct):
        value: int

    class SlowServer(Server):
        name = "slow"
        State = Slow

    class QuickServer(Server):
        name = "quick"
        State = Quick

    quick = msgspec.msgpack.encode(Quick(1))
    assert decode_state(QuickServer, quick) == Quick(1)  # its decoder is built now
    building.clear()
    built.clear()
    loaded: list[object] = []
    first = threading.Thread(
        target=lambda: loaded.append(decode_state(SlowServer, msgspec.msgpack.encode(Slow(2))))
    )
    first.start()
    second = None
    try:
        assert building.wait(60)  # the slow server's first load is building its decoder
        second = threading.Thread(target=lambda: loaded.append(decode_state(QuickServer, quick)))
        second.start()
        wait_until(lambda: loaded == [Quick(1)])
    finally:
        built.set()
        first.join(60)
        if second is not None:
            second.join(60)
    assert loaded == [Quick(1), Slow(2)]
