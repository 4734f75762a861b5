"""Many threads, many keys: every key ends with exactly the operations sent to it."""

from __future__ import annotations

import random
import threading
from collections import defaultdict

from ctxactors import Runtime
from ctxactors.testing import context_args as ctx_args

THREADS = 32
SESSIONS = 12
ASSISTANTS = ("a1", "a2", "a3")  # 36 planning keys, 12 playbook keys
CALLS_PER_THREAD = 120


def test_interleaved_calls_over_many_keys_give_exact_final_states() -> None:
    keys = [(f"s{i}", a) for i in range(SESSIONS) for a in ASSISTANTS]
    sent: dict[tuple[str, str], list[str]] = defaultdict(list)
    playbooks_sent: dict[str, list[tuple[str, str]]] = defaultdict(list)
    lock = threading.Lock()
    barrier = threading.Barrier(THREADS)
    errors: list[str] = []

    with Runtime(max_actors=1000) as rt:

        def worker(n: int) -> None:
            rng = random.Random(n)
            barrier.wait()
            for i in range(CALLS_PER_THREAD):
                s, a = rng.choice(keys)
                if rng.random() < 0.8:
                    goal = f"{s}|{a}|w{n}|{i}"
                    result = rt.call("create_goal", ctx_args(s, a, goal=goal))
                    if result.is_error or result.structured["goal"] != goal:
                        errors.append(f"create_goal {goal}: {result.text}")
                    with lock:
                        sent[(s, a)].append(goal)
                else:
                    name = f"pb-w{n}-{i}"
                    result = rt.call("create_playbook", ctx_args(s, a, name=name))
                    if result.is_error or result.structured["agent_id"] != a:
                        errors.append(f"create_playbook {name}: {result.text}")
                    with lock:
                        playbooks_sent[s].append((a, name))

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:5]
        assert (
            sum(map(len, sent.values())) + sum(map(len, playbooks_sent.values()))
            == THREADS * CALLS_PER_THREAD
        )

        for s, a in keys:
            goals = rt.call("get_planning_state", ctx_args(s, a)).structured["goals"]
            # Exactly the set sent to this key, and each thread's goals in its own order.
            assert sorted(g["goal"] for g in goals) == sorted(sent[(s, a)]), (s, a)
            assert len({g["id"] for g in goals}) == len(goals)
            for g in goals:
                assert g["goal"].startswith(f"{s}|{a}|")
            for a2 in ASSISTANTS:
                listed = rt.call("list_playbooks", ctx_args(s, a2)).structured["playbooks"]
                assert sorted(p["name"] for p in listed) == sorted(
                    n for owner, n in playbooks_sent[s] if owner == a2
                )
        stats = rt.stats()
        assert stats["spawned"] == len(keys) + SESSIONS  # planning per (s, a) + playbooks per s
        assert stats["reaped"] == stats["evicted"] == 0
