"""With a state store, a session's workspace directory outlives its actor (reap, restart)
within the retention, and goes with end_session and after the retention; processes don't
survive, and polling one lost to a restart says so. Real bubblewrap, real SQLite."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from workspace_support import WAIT, call, session_dirs, start, wait_done

from ctxactors import Runtime
from ctxactors.servers.workspace import Workspace
from ctxactors.state import SQLiteStore
from ctxactors.testing import ManualClock, wait_until
from ctxactors.testing import context_args as ctx_args

S = "s1"


pytestmark = pytest.mark.usefixtures("workspace_root")  # each test on a root of its own


def run(rt: Runtime, command: str, session: str = S) -> dict[str, object]:
    done = wait_done(rt, session, start(rt, session, command))
    assert done["status"] == "exited", done
    return done


def test_a_file_survives_a_reap_and_a_restart_in_the_same_session(
    store: SQLiteStore, clock: ManualClock
) -> None:
    with Runtime(servers=[Workspace], store=store, ttl=60, clock=clock) as rt:
        run(rt, "echo kept > note.txt")
        run(rt, "echo other > note.txt", session="s2")
        clock.advance(61)
        assert rt.reap() == 2
        assert run(rt, "cat note.txt")["output"] == "kept\n"
    with Runtime(servers=[Workspace], store=store) as rt:  # a restart
        assert run(rt, "cat note.txt")["output"] == "kept\n"
        assert run(rt, "cat note.txt", session="s2")["output"] == "other\n"


def test_polling_a_process_lost_to_a_restart_says_so(store: SQLiteStore) -> None:
    with Runtime(servers=[Workspace], store=store) as rt:
        lost = start(rt, S, "sleep 600")
    with Runtime(servers=[Workspace], store=store) as rt:
        polled = rt.call("poll_process", ctx_args(S, processId=lost))
        assert polled.is_error
        assert polled.text == (
            f"process {lost!r} was stopped when this session's workspace was restarted (a "
            "server restart, or its end); its output is gone, the files it wrote in "
            "/workspace are kept"
        )
        other = rt.call("poll_process", ctx_args("s2", processId=lost))
        assert other.is_error and other.text == f"process {lost!r} not found in this session"
        assert call(rt, S, "list_processes") == {"processes": [], "count": 0}


def test_end_session_deletes_the_directory(store: SQLiteStore, workspace_root: str) -> None:
    with Runtime(servers=[Workspace], store=store) as rt:
        run(rt, "echo gone > note.txt")
        run(rt, "echo kept > note.txt", session="s2")
        assert len(session_dirs(workspace_root)) == 2
        rt.end_session(S)
        assert len(session_dirs(workspace_root)) == 1
        assert run(rt, "cat note.txt 2>&1; true")["output"] == (
            "cat: note.txt: No such file or directory\n"
        )
        assert run(rt, "cat note.txt", session="s2")["output"] == "kept\n"


def test_a_directory_unused_for_the_retention_is_deleted(
    store: SQLiteStore, clock: ManualClock, workspace_root: str
) -> None:
    with Runtime(servers=[Workspace], store=store, ttl=60, clock=clock) as rt:
        run(rt, "echo old > note.txt")
        run(rt, "echo recent > note.txt", session="s2")
        assert rt.durability is not None
        rt.durability.flush()  # the calls' touches are written behind them
        clock.advance(61)
        assert rt.reap() == 2
        # s1 was last used past the retention ago; s2 just now.
        # The server's record of s1's last use (the directory's own times are the sandbox's).
        record = os.path.join(workspace_root, ".ctxactors-last-use", _name(rt, S))
        past = time.time() - 3601
        os.utime(record, (past, past))
        rt.reap()
        assert [os.path.basename(d) for d in session_dirs(workspace_root)] == [_name(rt, "s2")]
        assert run(rt, "cat note.txt", session="s2")["output"] == "recent\n"


def test_retention_goes_by_the_servers_record_of_use_not_a_time_the_sandbox_sets(
    tmp_path: Path, clock: ManualClock, workspace_root: str
) -> None:
    """The session's directory is the sandbox's to change, its times included: a command
    that dates it in 2100 does not keep it past the retention."""
    store = SQLiteStore(tmp_path / "short.db", retention=1.0)
    try:
        with Runtime(servers=[Workspace], store=store, ttl=60, clock=clock) as rt:
            assert rt.durability is not None
            run(rt, "echo kept > note.txt")
            rt.durability.flush()  # the server's record of this use is written
            run(rt, "touch -d 2100-01-01 /workspace /workspace/note.txt")
            [directory] = session_dirs(workspace_root)
            assert os.stat(directory).st_mtime > time.time() + 50 * 365 * 86400
            clock.advance(61)
            assert rt.reap() == 1  # the actor is gone; the directory is kept for now

            def purged() -> bool:
                rt.reap()  # a purge pass now (the session's last use was >= 1 s ago)
                return session_dirs(workspace_root) == []

            wait_until(purged, WAIT, describe=lambda: session_dirs(workspace_root))
            assert run(rt, "cat note.txt 2>&1; true")["output"] == (
                "cat: note.txt: No such file or directory\n"
            )
    finally:
        store.close()


def _name(rt: Runtime, session: str) -> str:
    return os.path.basename(Workspace._kept[rt].path((None, session)))  # noqa: SLF001


def test_without_a_store_the_directory_goes_with_the_actor(
    clock: ManualClock, workspace_root: str
) -> None:
    with Runtime(servers=[Workspace], ttl=60, clock=clock) as rt:
        run(rt, "echo x > note.txt")
        clock.advance(61)
        assert rt.reap() == 1
        # reap() stops the actor; its server's close (which removes the directory) runs in
        # the actor's thread after that, so wait for it rather than race it.
        wait_until(
            lambda: session_dirs(workspace_root) == [],
            WAIT,
            describe=lambda: session_dirs(workspace_root),
        )
