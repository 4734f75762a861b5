#!/usr/bin/env python3
"""Benchmark the conversation context: window selection and token counting.

    .venv/bin/python scripts/bench_conversation.py [--messages 10000] [--repeat 50]

1. Selection time over a long history (default 10,000 messages: user turns, tool steps
   with results from a few words to ~10k tokens, assistant answers), for several budgets:
   with the per-message counts cached (the steady state of a session: every step selects
   again over the same messages) against an uncached baseline (a fresh counter, every
   message of the window tokenized) in the same run. Also: appending one tool step and
   selecting again, which is what each step of a chain costs.
2. The heuristic counter's error against the exact BPE count per corpus (English prose,
   code, Korean; the calibration samples and held-out text found on this machine), beside
   characters/4, and both counters' speed on fresh text.

The process is pinned to one CPU (when the OS allows) so figures hold from run to run.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ctxactors.conversation import (  # noqa: E402
    BPETokenCounter,
    HeuristicTokenCounter,
    Message,
    ToolCall,
    build_prompt,
    select_messages_within_context,
)
from ctxactors.conversation.samples import CORPORA  # noqa: E402

SYSTEM = Message.system("You are a research assistant with tools. Answer the latest request.")


# Tool result sizes in characters: mostly small, now and then a page of ~10k tokens.
SIZES = [40, 200, 800, 2_000, 6_000, 40_000]
SIZE_WEIGHTS = [30, 30, 20, 12, 6, 2]


def make_history(n: int, seed: int = 7) -> list[Message]:
    """About `n` messages: a user request, a tool chain of 5-40 steps, an answer, repeat."""
    rng = random.Random(seed)
    pools = [CORPORA["english"] * 80, CORPORA["code"] * 80, CORPORA["korean"] * 80]
    history: list[Message] = []
    step = 0
    while len(history) < n:
        history.append(Message.user(f"Request {step}: " + rng.choice(pools)[:400]))
        for _ in range(rng.randint(5, 40)):
            step += 1
            width = 3 if step % 9 == 0 else 1
            calls = [ToolCall.new("read_page", {"page": step, "i": i}) for i in range(width)]
            history.append(Message.assistant(None, calls))
            for call in calls:
                pool = rng.choice(pools)
                size = rng.choices(SIZES, weights=SIZE_WEIGHTS)[0]
                start = rng.randrange(0, len(pool) - size)
                history.append(Message.tool(call.id, pool[start : start + size]))
        history.append(Message.assistant("Here is what I found. " * rng.randint(1, 20)))
    return history[:n]


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of `repeat` runs."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


NEXT_STEP = [
    Message.assistant(None, [ToolCall.new("read_page", {"page": -1}, id="next")]),
    Message.tool("next", CORPORA["english"][:1500]),
]


def select_after_one_more_step(
    messages: list[Message], budget: int, counter: BPETokenCounter
) -> None:
    """One step of a chain: two new messages (counted afresh), then select again."""
    for message in NEXT_STEP:
        counter._cache.pop(message, None)
    select_messages_within_context([*messages, *NEXT_STEP], budget, counter=counter)


def bench_selection(n: int, repeat: int) -> None:
    history = make_history(n)
    messages = [SYSTEM, *history]
    chars = sum(len(m.text) for m in history)
    print(f"Selection over {len(history):,} messages ({chars / 1e6:.1f} M characters)\n")
    print(
        f"{'budget':>12} {'kept':>6} {'cached':>10} {'uncached BPE':>13} "
        f"{'uncached heur.':>15} {'+1 step, cached':>16}"
    )
    warm = BPETokenCounter()
    for budget in (8_000, 32_000, 128_000, 100_000_000):
        window = select_messages_within_context(messages, budget, counter=warm)
        cached = timed(
            functools.partial(select_messages_within_context, messages, budget, counter=warm),
            repeat,
        )

        def cold(b: int = budget, make: Callable[[], object] = BPETokenCounter) -> None:
            select_messages_within_context(messages, b, counter=make())  # type: ignore[arg-type]

        uncached = timed(cold, 3)
        uncached_heuristic = timed(functools.partial(cold, budget, HeuristicTokenCounter), 3)
        one_more = timed(
            functools.partial(select_after_one_more_step, messages, budget, warm), repeat
        )
        label = "everything" if budget >= 100_000_000 else f"{budget:,}"
        print(
            f"{label:>12} {len(window) - 1:>6} {cached * 1e3:>7.2f} ms {uncached * 1e3:>10.1f} ms "
            f"{uncached_heuristic * 1e3:>12.1f} ms {one_more * 1e3:>13.2f} ms"
        )
    prompt_time = timed(
        lambda: build_prompt(history, system_prompt=SYSTEM.text, max_tokens=32_000, counter=warm),
        repeat,
    )
    print(
        f"\nbuild_prompt (selection + system prompt), 32,000 tokens, cached: "
        f"{prompt_time * 1e3:.2f} ms"
    )


def corpora() -> dict[str, tuple[str, str]]:
    """name -> (kind, text): the calibration samples, then held-out text when present."""
    import asyncio.tasks
    import json.decoder

    found = {f"{k} (calibration sample)": (k, v) for k, v in CORPORA.items()}
    for name, kind, path in [
        ("GPL-3 licence", "english", "/usr/share/common-licenses/GPL-3"),
        ("Python licence", "english", f"{sys.base_prefix}/lib/python3.11/LICENSE.txt"),
        ("Python licence", "english", "/usr/lib/python3.11/LICENSE.txt"),
        ("Vim tutor", "korean", "/usr/share/vim/vim90/tutor/tutor.ko.utf-8"),
    ]:
        if name not in found and Path(path).exists():
            found[f"{name} (held out)"] = (kind, Path(path).read_text(encoding="utf-8"))
    found["stdlib json+asyncio (held out)"] = (
        "code",
        inspect.getsource(json.decoder) + inspect.getsource(asyncio.tasks),
    )
    rows = [{"id": f"g{i}", "goal": f"goal {i}", "done": i % 3 == 0} for i in range(300)]
    found["JSON tool result (held out)"] = ("code", json.dumps(rows))
    return found


def bench_counters() -> None:
    print("\nHeuristic counter vs BPE (error = heuristic / BPE - 1)\n")
    print(
        f"{'corpus':<36} {'kind':<8} {'chars':>7} {'o200k':>7} {'heur.':>7} "
        f"{'error':>7} {'chars/4':>8} {'cl100k err.':>11}"
    )
    exact = {enc: BPETokenCounter(enc) for enc in ("o200k_base", "cl100k_base")}
    heuristic = {enc: HeuristicTokenCounter(enc) for enc in exact}
    worst: dict[str, float] = {}
    for name, (kind, text) in corpora().items():
        bpe = exact["o200k_base"].count_text(text)
        est = heuristic["o200k_base"].count_text(text)
        err = est / bpe - 1
        quarter = len(text) / 4 / bpe - 1
        cl = heuristic["cl100k_base"].count_text(text) / exact["cl100k_base"].count_text(text) - 1
        worst[kind] = max(worst.get(kind, 0.0), abs(err))
        print(
            f"{name:<36} {kind:<8} {len(text):>7} {bpe:>7} {est:>7} {err:>+7.1%} "
            f"{quarter:>+8.1%} {cl:>+11.1%}"
        )
    print(
        "\nworst |error| per kind (o200k): " + ", ".join(f"{k} {v:.1%}" for k, v in worst.items())
    )

    text = "".join(t for _, t in corpora().values())
    fresh = BPETokenCounter()
    fresh._encode.__self__._cache.clear()  # type: ignore[attr-defined]  # a cold piece cache
    t0 = time.perf_counter()
    fresh.count_text(text)
    bpe_time = time.perf_counter() - t0
    heur_time = timed(lambda: HeuristicTokenCounter().count_text(text), 5)
    print(
        f"speed on {len(text) / 1e6:.2f} M fresh characters: BPE {len(text) / bpe_time / 1e6:.1f} "
        f"M chars/s, heuristic {len(text) / heur_time / 1e6:.1f} M chars/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    except (AttributeError, OSError):
        pass
    bench_counters()
    print()
    bench_selection(args.messages, args.repeat)


if __name__ == "__main__":
    main()
