"""Content store benchmark: add throughput and search latency at 10,000 documents.

Stores N documents of real text (chunks of the standard library's sources, some with Korean
phrases) in one session through the real runtime, then runs the same queries two ways and prints p50/p99:

- ``search_content`` through `Runtime.call` (FTS5 trigram index, bm25 ranking, snippets);
- a naive baseline over the same documents in this process: a lower-cased substring scan
  of every document, ranked by occurrence count (no routing, no snippets: a lower bound for
  any index-free approach).

Target: search p50 under 5 ms at 10,000 documents. The process is pinned to one CPU (if
allowed) so cross-CPU wake-ups don't dominate the round trips; see DESIGN.md.

    .venv/bin/python scripts/bench_content.py [--docs 10000] [--queries 300]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import re
import statistics
import sysconfig
import time

from ctxactors import Runtime
from ctxactors.logs import configure_logging
from ctxactors.servers.content import Content
from ctxactors.settings import ContentSettings, Settings

KOREAN = ["리포트", "분석", "파일", "작성", "데이터", "회의록", "요약", "일정", "검토", "배포"]
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")


def corpus(n: int, seed: int = 7) -> list[str]:
    """N documents of real text: 40-line chunks of the standard library's sources (English
    comments and docstrings, code identifiers), with a Korean sentence in every tenth."""
    rng = random.Random(seed)
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    for path in sorted(root.rglob("*.py")):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for i in range(0, len(lines), 40):
            chunk = "\n".join(lines[i : i + 40])
            if len(docs) % 10 == 0:
                chunk += "\n# " + " ".join(rng.sample(KOREAN, 4))
            docs.append(chunk)
            if len(docs) == n:
                return docs
    return docs


def queries(docs: list[str], n: int, seed: int = 11) -> list[str]:
    """A mix like a model's searches: rare and common identifiers, word pairs, Korean."""
    rng = random.Random(seed)
    occurrences = [w for d in rng.sample(docs, min(len(docs), 2000)) for w in WORD.findall(d)]
    distinct = sorted(set(occurrences))
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(rng.choice(distinct))  # any identifier or word: mostly rare ones
        elif kind == 1:
            out.append(rng.choice(occurrences))  # weighted by frequency: common ones
        elif kind == 2:
            out.append(f"{rng.choice(KOREAN)} {rng.choice(KOREAN)}")
        else:
            doc = WORD.findall(rng.choice(docs)) or ["return"]
            j = rng.randrange(len(doc))
            out.append(" ".join(doc[j : j + 2]))  # two words seen together
    return out


def naive_search(lowered: list[str], query: str, limit: int = 10) -> list[int]:
    terms = query.lower().split()
    hits = []
    for i, doc in enumerate(lowered):
        if all(t in doc for t in terms):
            hits.append((sum(doc.count(t) for t in terms), i))
    hits.sort(reverse=True)
    return [i for _, i in hits[:limit]]


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(int(len(ordered) * p), len(ordered) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        pinned = "pinned to one CPU"
    except (AttributeError, OSError):
        pinned = "not pinned"
    configure_logging(level="warning")
    defaults = Settings.from_env().content
    limits = ContentSettings(
        max_item_bytes=defaults.max_item_bytes,
        max_session_bytes=1 << 30,
        max_items=max(defaults.max_items, args.docs),
    )

    docs = corpus(args.docs)
    qs = queries(docs, args.queries)
    size_mb = sum(len(d.encode()) for d in docs) / 1e6
    print(f"{args.docs} documents, {size_mb:.1f} MB, {len(qs)} queries; {pinned}")

    with Runtime(servers=[Content], settings=Settings(content=limits)) as rt:
        session = {"__sessionId": "bench"}
        t0 = time.perf_counter()
        for i, doc in enumerate(docs):
            rt.call("add_content", {"filename": f"doc{i}.txt", "content": doc, **session})
        add_s = time.perf_counter() - t0
        print(
            f"add_content: {args.docs / add_s:,.0f} docs/s ({add_s * 1e6 / args.docs:.0f} µs each)"
        )

        fts: list[float] = []
        empty = 0
        for q in qs:
            t0 = time.perf_counter()
            result = rt.call("search_content", {"query": q, "limit": 10, **session})
            fts.append((time.perf_counter() - t0) * 1000)
            assert not result.is_error, result.text
            empty += (result.structured or {}).get("count", 0) == 0
        short: list[float] = []
        for term in ["분석", "파일", "요약", "일정", "검토", "os", "id", "fd"]:  # LIKE path
            t0 = time.perf_counter()
            rt.call("search_content", {"query": term, **session})
            short.append((time.perf_counter() - t0) * 1000)

    lowered = [d.lower() for d in docs]
    naive: list[float] = []
    for q in qs:
        t0 = time.perf_counter()
        naive_search(lowered, q)
        naive.append((time.perf_counter() - t0) * 1000)

    fp50, fp99 = pct(fts, 0.5), pct(fts, 0.99)
    np50, np99 = pct(naive, 0.5), pct(naive, 0.99)
    print(
        f"search_content (FTS5 trigram, via Runtime.call): p50 {fp50:.2f} ms  p99 {fp99:.2f} ms  "
        f"mean {statistics.fmean(fts):.2f} ms; {empty} of {len(qs)} queries found nothing"
    )
    print(f"naive substring scan (in process):              p50 {np50:.2f} ms  p99 {np99:.2f} ms")
    print(f"ratio naive/FTS5: p50 {np50 / fp50:.1f}x  p99 {np99 / fp99:.1f}x")
    print(
        f"short (<3 chars) queries, LIKE scan path: p50 {pct(short, 0.5):.2f} ms  "
        f"max {max(short):.2f} ms"
    )
    print(f"target p50 < 5 ms: {'met' if fp50 < 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
