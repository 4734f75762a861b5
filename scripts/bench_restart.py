#!/usr/bin/env python3
"""A restart from the SQLite store: ready time, first calls and memory by stored sessions.

A store file in the format ``ctxactors serve --store sqlite`` keeps holds N stored sessions
(10,000, the baseline, and 1,000,000 in the same run: ``--sizes``). Each is a copy of one of
64 template sessions that the runtime itself made through its tools (one or two goals, 2 to
8 todos of which some done, 1 to 3 documents, and the history of those calls), written row
by row through the store's own API (`SQLiteStore.write`, the compare-and-set insert of each
key with its parts, which also records the session for retention) under a random session id.

Each run is a fresh interpreter, pinned to one CPU (``--no-pin`` not to), that does what
``ctxactors serve`` does before it listens (`ctxactors.cli.serve.build_runtime`: open the
store, construct the runtime with every built-in server), then:

- answers a first call to a random stored session (a lazy load: its keys are read on first
  use) and a call to a fresh session (a save);
- answers the first call of 200 more random stored sessions (their lazy loads, p50/p99).

Measured: wall and CPU time from the process's start until ready and until both first calls
are answered; the store open and runtime construction alone; the bytes the process read by
then (``read_chars``: a startup that scanned the sessions would read the file); RSS when
ready. Each size is run warm (the file in the page cache, as after a quick restart) and cold
(its pages dropped from the cache first with ``posix_fadvise(DONTNEED)``), ``--rounds``
times in turn; the medians are printed, with the ratio of 1,000,000 to 10,000 (the target:
as fast). ``--profile PREFIX`` writes a cProfile of each size's startup (its first round).

``--purge`` also times, on a copy of each file, the first retention purge after a downtime
longer than the retention (every session expired: `SQLiteStore.purge`, which the reaper
runs once a minute), the largest the WAL grew meanwhile, and what a concurrent caller (a
load then a save of a live session, in a loop) waited for it; ``--purge-only`` runs only
that (no restarts).

Filling 1,000,000 sessions takes minutes and about 1.5 GB: the filled files are cached under
``build/bench_restart/``, keyed by this script's fill version, the store's schema and the
templates' bytes (a change to any of them fills again and removes the stale files). The
runs touch the sessions they call and add one fresh session each; the retention is set far
out (``--retention``) so that a file filled days ago still holds every session.

    python scripts/bench_restart.py [--sizes 10000,1000000] [--rounds 3] [--samples 200]
        [--json PATH] [--no-pin] [--profile PREFIX] [--purge | --purge-only]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# Only the standard library and psutil at the top: a run's import time is ctxactors' own.
import psutil

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "bench_restart"
FILL_VERSION = 1  # bump when the way sessions are filled changes
TEMPLATES = 64
ASSISTANT = "a1"
RETENTION = 1e9  # about 30 years: a cached file's sessions never expire under the bench
BATCH = 500  # sessions per store transaction while filling
WORDS = "release notes plan draft review merge deploy rollback metric latency budget".split()


def ctx(session: str) -> dict[str, Any]:
    return {"__sessionId": session, "__assistantId": ASSISTANT}


def session_id(i: int) -> str:
    """A UUID-like id, stable per index, in no order (as hosts' ids arrive)."""
    return str(uuid.UUID(bytes=hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest()))


# -- the template sessions, made by the runtime -----------------------------------------------


def make_templates(directory: Path) -> tuple[list[dict[Any, Any]], list[dict[str, Any]]]:
    """`TEMPLATES` sessions made through the tools: each one's stored records by key, and what
    a first call must then answer (its planning state, its number of documents)."""
    from ctxactors import Runtime
    from ctxactors.servers import BUILTIN
    from ctxactors.state import SQLiteStore

    store = SQLiteStore(directory / "templates.db", retention=RETENTION)
    expected: list[dict[str, Any]] = []
    with Runtime(BUILTIN, store=store) as rt:
        for t in range(TEMPLATES):
            rng = random.Random(t)
            c = ctx(f"template-{t}")

            def text(words: int, rng: random.Random = rng) -> str:
                return " ".join(rng.choice(WORDS) for _ in range(words))

            for _ in range(rng.randint(1, 2)):
                rt.call("create_goal", {"goal": text(6), **c})
            todos = [
                rt.call("add_todo", {"name": text(5), "goal_id": "g1", **c}).structured
                for _ in range(rng.randint(2, 8))
            ]
            for todo in rng.sample(todos, rng.randint(0, len(todos))):
                rt.call("mark_todo", {"todo_id": (todo or {})["id"], **c})
            documents = rng.randint(1, 3)
            for d in range(documents):
                body = text(rng.randint(20, 150))
                rt.call("add_content", {"filename": f"notes-{d}.md", "content": body, **c})
            state = rt.call("get_planning_state", c).structured
            expected.append({"planning": state, "documents": documents})
    # Closed: every history written behind the calls is in the store now.
    keys = _stored_keys(store)
    records = [
        {k: r for k in keys if (r := store.load((None, f"template-{t}"), k)) is not None}
        for t in range(TEMPLATES)
    ]
    store.close()
    return records, expected


def _stored_keys(store: Any) -> list[tuple[Any, ...]]:
    """The keys the template sessions stored (read from the file: which servers saved)."""
    db = sqlite3.connect(f"file:{store.path}?mode=ro", uri=True)
    try:
        return [tuple(json.loads(k)) for (k,) in db.execute("SELECT DISTINCT key FROM state")]
    finally:
        db.close()


def fill_key(records: list[dict[Any, Any]]) -> str:
    """What a cached file depends on: the fill version, the store's schema, and the
    templates' bytes (a history's record times zeroed: they differ on every run)."""
    import msgspec

    from ctxactors.history_store import KEY as HISTORY
    from ctxactors.history_store import pack, unpack
    from ctxactors.state import SQLiteStore

    digest = hashlib.sha256(f"fill {FILL_VERSION}".encode())
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "schema.db")
        store.close()
        db = sqlite3.connect(Path(tmp) / "schema.db")
        for (sql,) in db.execute("SELECT sql FROM sqlite_master ORDER BY name"):
            digest.update(str(sql).encode())
        db.close()
    encode = msgspec.msgpack.Encoder().encode
    for template in records:
        for key in sorted(template, key=repr):
            record = template[key]
            data = record.data
            if key == HISTORY:
                entries = unpack(data)
                data = pack([encode(msgspec.structs.replace(r, wall=0.0)) for r, _ in entries])
            digest.update(repr(key).encode() + data)
            for name in sorted(record.parts):
                digest.update(name.encode() + record.parts[name])
    return f"v{FILL_VERSION}-{digest.hexdigest()[:12]}"


def fill(path: Path, n: int, records: list[dict[Any, Any]]) -> None:
    """N sessions, session i a copy of template i % 64, through `SQLiteStore.write`."""
    from ctxactors.state import SQLiteStore, Write

    store = SQLiteStore(path, retention=RETENTION)
    started = time.perf_counter()
    try:
        for start in range(0, n, BATCH):
            writes = [
                Write(session, key, record.data, 0, tuple(record.parts.items()))
                for i in range(start, min(start + BATCH, n))
                for session in [(None, session_id(i))]
                for key, record in records[i % TEMPLATES].items()
            ]
            outcomes = store.write(writes)
            if any(o != 1 for o in outcomes):
                raise RuntimeError(f"filling {path}: a write was refused: {outcomes[:3]}")
            if start and start % 100_000 == 0:
                rate = start / (time.perf_counter() - started)
                print(f"  filled {start:,} of {n:,} ({rate:,.0f}/s)", file=sys.stderr)
    finally:
        store.close()


def filled(n: int, key: str, records: list[dict[Any, Any]]) -> Path:
    """The data directory of a store of `n` sessions (filled now unless cached)."""
    home = CACHE / key
    directory = home / f"n{n}"
    if (directory / "filled").exists():
        return directory
    for stale in CACHE.glob("v*") if CACHE.exists() else ():
        if stale != home:  # another fill version or schema: never read again
            shutil.rmtree(stale, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    print(f"filling {n:,} sessions into {directory} (cached for later runs) ...", file=sys.stderr)
    started = time.perf_counter()
    fill(directory / "state.db", n, records)
    (directory / "filled").write_text(f"{n} sessions in {time.perf_counter() - started:.0f} s\n")
    return directory


def drop_from_page_cache(directory: Path) -> None:
    """Evict the store's pages from the page cache (written back first: dirty pages stay)."""
    for path in directory.glob("state.db*"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- one run, in its own interpreter ---------------------------------------------------------


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Start as ``ctxactors serve`` does, answer the first calls; every figure measured."""
    me = psutil.Process()
    imported_at = time.perf_counter()
    from ctxactors.cli import serve
    from ctxactors.logs import configure_logging

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args(
        ["--data-dir", spec["data_dir"], "--retention", str(spec["retention"])]
    )
    configure_logging(level="warning", file=open(os.devnull, "w"), force=True)  # noqa: SIM115
    opening_at = time.perf_counter()
    profile = None
    if spec["profile"]:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    rt = serve.build_runtime(args)
    if profile is not None:
        profile.disable()
        profile.dump_stats(spec["profile"])
    ready_at, ready_wall = time.perf_counter(), time.time()
    ready_cpu = time.process_time()
    ready_rss = me.memory_info().rss
    ready_read = me.io_counters().read_chars  # type: ignore[attr-defined]
    samples = spec["samples"]
    expected = spec["expected"]

    def first_call(session: str, template: int) -> float:
        t0 = time.perf_counter()
        got = rt.call("get_planning_state", ctx(session)).structured
        elapsed = time.perf_counter() - t0
        if got != expected[template]["planning"]:
            raise AssertionError(f"stored session {session}: {got} != template {template}")
        return elapsed

    first_stored = first_call(*samples[0])
    t0 = time.perf_counter()
    made = rt.call("create_goal", {"goal": "a fresh one", **ctx(str(uuid.uuid4()))}).structured
    fresh = time.perf_counter() - t0
    assert made == {"id": "g1", "goal": "a fresh one"}, made
    served_wall, served_cpu = time.time(), time.process_time()
    lazy = [first_call(*sample) for sample in samples[1:]]
    content = []
    for session, template in samples[1:]:
        t0 = time.perf_counter()
        listed = rt.call("list_content", ctx(session)).structured or {}
        content.append(time.perf_counter() - t0)
        assert listed["count"] == expected[template]["documents"], listed
    after_rss = me.memory_info().rss
    rt.close()
    if rt.store is not None:
        rt.store.close()
    return {
        "import_ms": (opening_at - imported_at) * 1000,
        "open_ms": (ready_at - opening_at) * 1000,
        "ready_ms": (ready_wall - spec["spawned"]) * 1000,
        "ready_cpu_ms": ready_cpu * 1000,
        "read_by_ready_mb": ready_read / 1e6,
        "first_stored_ms": first_stored * 1000,
        "fresh_ms": fresh * 1000,
        "served_ms": (served_wall - spec["spawned"]) * 1000,
        "served_cpu_ms": served_cpu * 1000,
        "lazy_p50_ms": _pct(lazy, 50),
        "lazy_p99_ms": _pct(lazy, 99),
        "content_p50_ms": _pct(content, 50),
        "content_p99_ms": _pct(content, 99),
        "rss_ready_mb": ready_rss / 1e6,
        "rss_after_mb": after_rss / 1e6,
    }


def _pct(values: list[float], p: int) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, len(ordered) * p // 100)]


def run(
    directory: Path,
    n: int,
    expected: list[dict[str, Any]],
    samples: int,
    seed: int,
    profile: str | None,
) -> dict[str, Any]:
    rng = random.Random(seed)
    picked = [(session_id(i), i % TEMPLATES) for i in rng.sample(range(n), samples + 1)]
    spec = {
        "data_dir": str(directory),
        "retention": RETENTION,
        "samples": picked,
        "expected": expected,
        "profile": profile,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        spec_path = f.name
        started = time.time()
        done = subprocess.run(
            [sys.executable, __file__, "--child", spec_path, "--spawned", repr(started)],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.unlink(spec_path)
    if done.returncode != 0:
        raise SystemExit(f"a run on {n:,} sessions failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def purge_after_downtime(directory: Path) -> dict[str, float]:
    """On a copy of the store: one retention purge with every session past its retention
    (the first reaper pass after a downtime longer than the retention), while another
    thread loads then saves a live key in a loop: the pass's time, how long those loads and
    saves waited (longest, p99), and the largest the WAL file grew."""
    import threading

    from ctxactors.state import SQLiteStore, Write

    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        copy = Path(tmp) / "state.db"
        shutil.copyfile(directory / "state.db", copy)
        # The retention past for every session: the store's clock twice the retention ahead.
        store = SQLiteStore(copy, retention=RETENTION, clock=lambda: time.time() + 2 * RETENTION)
        loads: list[float] = []
        saves: list[float] = []
        wal = [0]
        stop = threading.Event()

        def call() -> None:
            session, key, revision = (None, "a caller"), ("planning", ASSISTANT, None), 0
            while not stop.is_set():
                t0 = time.perf_counter()
                store.load(session, key)
                t1 = time.perf_counter()
                (outcome,) = store.write([Write(session, key, b"{}", revision)])
                saves.append(time.perf_counter() - t1)
                loads.append(t1 - t0)
                assert isinstance(outcome, int), outcome  # the only writer of its key
                revision = outcome
                time.sleep(0.001)

        def watch_wal() -> None:
            while not stop.wait(0.05):
                try:
                    wal[0] = max(wal[0], os.path.getsize(f"{copy}-wal"))
                except FileNotFoundError:
                    pass

        threads = [threading.Thread(target=call), threading.Thread(target=watch_wal)]
        for thread in threads:
            thread.start()
        started, cpu = time.perf_counter(), time.process_time()
        purged = store.purge()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        stop.set()
        for thread in threads:
            thread.join()
        store.close()
    return {
        "purged": purged,
        "purge_s": elapsed,
        "purge_cpu_s": cpu,
        "longest_load_wait_ms": max(loads) * 1000,
        "load_p99_ms": percentile(loads, 0.99) * 1000,
        "longest_save_wait_ms": max(saves) * 1000,
        "save_p99_ms": percentile(saves, 0.99) * 1000,
        "saves_during": len(saves),
        "largest_wal_mb": wal[0] / 1e6,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the report --------------------------------------------------------------------------------

ROWS = [
    ("ready_ms", "process start to ready, ms"),
    ("ready_cpu_ms", "  its CPU, ms"),
    ("import_ms", "  imports, ms"),
    ("open_ms", "  store open + runtime, ms"),
    ("read_by_ready_mb", "  bytes read by then, MB"),
    ("served_ms", "start to both first calls answered, ms"),
    ("served_cpu_ms", "  its CPU, ms"),
    ("first_stored_ms", "first call, a stored session, ms"),
    ("fresh_ms", "first call, a fresh session, ms"),
    ("lazy_p50_ms", "a stored session's first call p50, ms"),
    ("lazy_p99_ms", "  p99, ms"),
    ("content_p50_ms", "  then its content's first call p50, ms"),
    ("rss_ready_mb", "RSS when ready, MB"),
    ("rss_after_mb", "RSS after the samples' loads, MB"),
]


def median(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def print_report(sizes: list[int], medians: dict[str, dict[int, dict[str, float]]]) -> None:
    base, top = sizes[0], sizes[-1]
    for mode, by_size in medians.items():
        print(f"\n{mode} page cache, medians; ratio: {top:,} sessions to {base:,}")
        head = "".join(f"{n:>12,}" for n in sizes)
        print(f"{'stored sessions':42}{head}{'ratio':>8}")
        for key, label in ROWS:
            cells = "".join(f"{by_size[n][key]:>12.2f}" for n in sizes)
            ratio = by_size[top][key] / by_size[base][key] if by_size[base][key] else float("nan")
            print(f"{label:42}{cells}{ratio:>8.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--sizes",
        default="10000,1000000",
        help="stored sessions, comma-separated; the first is the baseline",
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each size and cache")
    parser.add_argument("--samples", type=int, default=200, help="stored sessions called a run")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--no-pin", action="store_true", help="don't pin to one CPU")
    parser.add_argument(
        "--purge",
        action="store_true",
        help="also time one retention purge of every session (on a copy of each size)",
    )
    parser.add_argument("--purge-only", action="store_true", help="only time the purge")
    parser.add_argument(
        "--profile", metavar="PREFIX", help="write a cProfile of startup to PREFIX-N.pstats"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(Path(args.child).read_text())
        print(json.dumps(child({**spec, "spawned": args.spawned})))
        return 0
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes: expected numbers separated by commas, got {args.sizes!r}")
    if not sizes or min(sizes) <= args.samples:
        parser.error(f"--sizes: every size must exceed --samples ({args.samples})")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        records, expected = make_templates(Path(tmp))
    key = fill_key(records)
    directories = {n: filled(n, key, records) for n in sizes}
    pinned = None
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        pinned = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {pinned})  # the runs inherit it
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {"cold": {}, "warm": {}}
    report: dict[str, Any] = {"benchmark": "restart", "sizes": sizes}
    if not args.purge_only:
        report["medians"] = restarts(args, sizes, directories, expected, runs, pinned)
    if args.purge or args.purge_only:
        report["purge"] = purges = {n: purge_after_downtime(directories[n]) for n in sizes}
        print(
            "\nthe first retention purge after a downtime past the retention (every session), "
            f"pinned to CPU {pinned}"
        )
        for n, p in purges.items():
            print(
                f"  {n:>12,} sessions: {p['purge_s']:.2f} s ({p['purge_cpu_s']:.2f} s CPU); the "
                f"WAL grew to {p['largest_wal_mb']:,.0f} MB; a concurrent caller's load waited "
                f"up to {p['longest_load_wait_ms']:,.0f} ms (p99 {p['load_p99_ms']:,.1f}), its "
                f"save up to {p['longest_save_wait_ms']:,.0f} ms (p99 {p['save_p99_ms']:,.1f}; "
                f"{p['saves_during']:,} saves)"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**report, "runs": runs}, f)
    return 0


def restarts(
    args: argparse.Namespace,
    sizes: list[int],
    directories: dict[int, Path],
    expected: list[dict[str, Any]],
    runs: dict[str, dict[int, list[dict[str, Any]]]],
    pinned: int | None,
) -> dict[str, dict[int, dict[str, float]]]:
    """The restart runs (`runs` filled in), printed; their medians."""
    for round_ in range(args.rounds):
        for n in sizes:
            for mode in ("cold", "warm"):
                if mode == "cold":
                    drop_from_page_cache(directories[n])
                profile = f"{args.profile}-{n}.pstats" if args.profile and round_ == 0 else None
                seed = round_ * 1_000_003 + n + (mode == "cold")
                result = run(directories[n], n, expected, args.samples, seed, profile)
                runs[mode].setdefault(n, []).append(result)
    medians = {mode: {n: median(r) for n, r in by.items()} for mode, by in runs.items()}
    print(
        f"restart from a SQLite store (the serve path: open_store + Runtime with the built-in "
        f"servers), {args.rounds} rounds, pinned to CPU {pinned}; file sizes: "
        + ", ".join(
            f"{n:,}: {(directories[n] / 'state.db').stat().st_size / 1e6:,.0f} MB" for n in sizes
        )
    )
    print_report(sizes, medians)
    return medians


if __name__ == "__main__":
    sys.exit(main())
