"""Token counting: exact BPE counts, the heuristic's calibration, message accounting, cache."""

from __future__ import annotations

import inspect
import json
import sys
import threading
from pathlib import Path

import pytest

from ctxactors.conversation import (
    BPETokenCounter,
    HeuristicTokenCounter,
    Message,
    TokenCounter,
    ToolCall,
    count_prompt,
)
from ctxactors.conversation.samples import CORPORA
from ctxactors.conversation.tokens import (
    MESSAGE_OVERHEAD,
    REPLY_PRIMING,
    TOOL_CALL_OVERHEAD,
)

pytestmark = pytest.mark.timeout(30)

# Held out: not used to fit the heuristic.
ENGLISH_HELD_OUT = """\
On Tuesday the committee finally agreed on a budget for the new library wing. The debate had
run for three months, mostly about whether the reading room should face the river or the
market square. In the end the architects proposed a compromise: tall windows on both sides,
and a narrow balcony where readers can step out for air without leaving the building. Several
members admitted they had changed their minds after visiting a similar library in the next
town, where the light in the afternoon was, as one of them put it, almost unfairly pleasant.
"""

KOREAN_HELD_OUT = """\
화요일에 위원회는 마침내 새 도서관 별관의 예산에 합의했다. 논쟁은 석 달 동안 이어졌는데,
대부분은 열람실이 강 쪽을 향해야 하는지 시장 광장 쪽을 향해야 하는지에 관한 것이었다.
결국 건축가들은 양쪽에 높은 창을 내고, 독자들이 건물을 떠나지 않고도 바람을 쐴 수 있는
좁은 발코니를 만드는 절충안을 내놓았다. 몇몇 위원은 이웃 마을의 비슷한 도서관을 다녀온
뒤 생각이 바뀌었다고 털어놓았다. 그곳의 오후 햇살은 한 위원의 말처럼 거의 불공평할 만큼
좋았다고 한다. 다음 주에는 시공 업체를 선정하고 세부 일정을 확정할 예정이다.
"""


def stdlib_code() -> str:
    import asyncio.tasks
    import json.decoder

    return inspect.getsource(json.decoder) + inspect.getsource(asyncio.tasks)


def held_out() -> dict[str, str]:
    texts = {
        "english (held out)": ENGLISH_HELD_OUT,
        "korean (held out)": KOREAN_HELD_OUT,
        "code (stdlib)": stdlib_code(),
        "json (tool result)": json.dumps(
            [{"id": f"g{i}", "goal": f"goal number {i}", "done": i % 3 == 0} for i in range(200)]
        ),
    }
    for name, path in {
        "english (GPL-3)": "/usr/share/common-licenses/GPL-3",
        "korean (vim tutor)": "/usr/share/vim/vim90/tutor/tutor.ko.utf-8",
    }.items():
        if Path(path).exists():
            texts[name] = Path(path).read_text(encoding="utf-8")
    return texts


@pytest.fixture(scope="module")
def bpe() -> BPETokenCounter:
    return BPETokenCounter()


def test_bpe_counts_match_the_real_tables() -> None:
    # Known token ids of tiktoken's tables: "hello world" is [15339, 1917] in cl100k_base.
    assert BPETokenCounter("cl100k_base").count_text("hello world") == 2
    assert BPETokenCounter("o200k_base").count_text("hello world") == 2
    assert BPETokenCounter().count_text("") == 0
    # Special-token text in a message is plain text, not a control token (and no error).
    assert BPETokenCounter().count_text("<|endoftext|>") > 1


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("corpus", sorted(CORPORA))
def test_heuristic_within_15_percent_on_calibration_corpora(encoding: str, corpus: str) -> None:
    exact = BPETokenCounter(encoding).count_text(CORPORA[corpus])
    estimate = HeuristicTokenCounter(encoding).count_text(CORPORA[corpus])
    assert abs(estimate - exact) / exact <= 0.15, (corpus, estimate, exact)


@pytest.mark.parametrize("name", sorted(held_out()))
def test_heuristic_within_15_percent_on_held_out_text(bpe: BPETokenCounter, name: str) -> None:
    text = held_out()[name]
    exact = bpe.count_text(text)
    estimate = HeuristicTokenCounter().count_text(text)
    assert abs(estimate - exact) / exact <= 0.15, (name, estimate, exact)


def test_characters_over_four_is_what_fails_on_korean(bpe: BPETokenCounter) -> None:
    text = CORPORA["korean"] + KOREAN_HELD_OUT
    exact = bpe.count_text(text)
    assert (len(text) / 4 - exact) / exact < -0.4  # the failure the heuristic fixes
    assert abs(HeuristicTokenCounter().count_text(text) - exact) / exact <= 0.15


def test_heuristic_splits_camel_case_and_counts_other_scripts(bpe: BPETokenCounter) -> None:
    heuristic = HeuristicTokenCounter()
    camel = "getUserById parseHttpResponse onClickHandler " * 20
    assert abs(heuristic.count_text(camel) - bpe.count_text(camel)) / bpe.count_text(camel) < 0.2
    chinese = "北京是中华人民共和国的首都，也是全国的政治和文化中心。" * 10
    assert heuristic.count_text(chinese) >= 0.85 * bpe.count_text(chinese)
    assert heuristic.count_text("x") == 1 and heuristic.count_text("") == 0
    with pytest.raises(ValueError, match="no heuristic profile"):
        HeuristicTokenCounter("r50k_base")


@pytest.mark.parametrize("counter", [BPETokenCounter(), HeuristicTokenCounter()], ids=repr)
def test_message_count_includes_calls_ids_names_and_overhead(counter: TokenCounter) -> None:
    text = counter.count_text
    call = ToolCall.new("create_goal", {"goal": "Learn Rust"}, id="call_abc")
    assistant = Message.assistant("On it.", [call])
    assert counter.count_message(assistant) == (
        MESSAGE_OVERHEAD
        + text("On it.")
        + TOOL_CALL_OVERHEAD
        + text("call_abc")
        + text("create_goal")
        + text('{"goal":"Learn Rust"}')
    )
    result = Message.tool("call_abc", "ok")
    assert counter.count_message(result) == MESSAGE_OVERHEAD + text("ok") + text("call_abc")
    named = Message("user", "hi", name="dana")
    assert counter.count_message(named) == MESSAGE_OVERHEAD + text("hi") + 1 + text("dana")
    assert count_prompt([named, result], counter) == (
        REPLY_PRIMING + counter.count_message(named) + counter.count_message(result)
    )
    assert isinstance(counter, TokenCounter)


def test_counts_are_cached_per_message() -> None:
    counter = BPETokenCounter()
    history = [Message.user(f"message number {i} " * 20) for i in range(200)]
    first = [counter.count_message(m) for m in history]
    assert counter.misses == 200
    again = [counter.count_message(m) for m in history]
    assert again == first and counter.misses == 200
    # An equal message (a history decoded again) is the same cache entry.
    counter.count_message(Message.from_json(history[0].to_json()))
    assert counter.misses == 200
    counter.clear_cache()
    counter.count_message(history[0])
    assert counter.misses == 1


def test_cache_is_bounded() -> None:
    counter = HeuristicTokenCounter(cache_size=10)
    for i in range(50):
        counter.count_message(Message.user(f"m{i}"))
    assert len(counter._cache) == 10
    assert counter.count_message(Message.user("m49")) == counter.count_message(Message.user("m49"))


def test_one_counter_shared_by_threads_keeps_its_cache_bounded_and_its_counts_exact() -> None:
    """Chat sessions on one server share a counter: evictions from several threads at once
    must neither fail (two threads deleting the same oldest key) nor overfill the cache,
    and every count must be the message's own."""
    messages = [Message.user("word " * (i % 40 + 1)) for i in range(400)]
    expected = [HeuristicTokenCounter().count_message(m) for m in messages]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show up
    try:
        for _ in range(5):  # a race is a race: several rounds make a miss unlikely
            counter = HeuristicTokenCounter(cache_size=8)
            failures, wrong = _count_from_threads(counter, messages, expected, threads=8)
            assert failures == [] and wrong == []
            assert len(counter._cache) == 8
    finally:
        sys.setswitchinterval(interval)


def _count_from_threads(
    counter: TokenCounter, messages: list[Message], expected: list[int], threads: int
) -> tuple[list[BaseException], list[int]]:
    start = threading.Barrier(threads)
    failures: list[BaseException] = []
    wrong: list[int] = []

    def count_all(offset: int) -> None:
        start.wait()
        try:
            for n in range(3 * len(messages)):
                i = (n * 7 + offset) % len(messages)
                if counter.count_message(messages[i]) != expected[i]:
                    wrong.append(i)
        except BaseException as exc:  # reported by the caller's assertion
            failures.append(exc)

    workers = [threading.Thread(target=count_all, args=(k * 50,)) for k in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return failures, wrong
