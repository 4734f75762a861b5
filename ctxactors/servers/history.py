"""Operation history: what this session's tools just did, for follow-up questions.

"Which answers were deselected?" can only be answered if the call that deselected them is
remembered. Every call that reaches a server is recorded in its session's history, which
the model reads with ``get_recent_context{limit?, tool_filter?}``. Each record keeps the
assistant, the thread and the tool's scope of its call, and a reader sees only what it
could have seen itself (`visible`): the session is shared, its records are not.

A session's history is a `SessionHistory` kept by the registry as session state
(`Registry.session_state`, keyed by principal and session id): it lives exactly as long as
the session has a live actor, so it goes when the session's actors are reaped, evicted or
ended, and one session (of one principal) can never reach another's. An observer adds each call to it in the calling key's actor, just before
the reply: a common call is appended as one tuple of references (its own clean arguments,
its result's text) and made into its record (compacted arguments, metadata, the tool's own
extractor too) when the history is read, since most records never are; a call with large
arguments or result is made into its record at once, so a 4 MiB upload does not stay in
memory 50 times, and so is a handler's own result whose text is not its structured part.
With a state store the same holds, and each record is also encoded once, by the first
write of the history that carries it (the common call as the call, `StoredCall`), for
the store (`ctxactors.history_store`).
That costs the call about a microsecond and no message, no thread and no actor: a message per call to a
history actor cost a cheap call 1.6x on a busy CPU and an extra actor per session (see
``scripts/bench_history.py``). Because the record is added before the reply, a caller that
got its result and then asks for the history always finds that call in it. The `History`
server is the session-scoped actor that answers ``get_recent_context``; it holds nothing.

Metadata: a tool may declare ``@tool(extract=fn)`` with ``fn(args: dict, result:
ToolResult) -> dict | None`` (`pick` builds the common one); it replaces the generic
extractor for that tool's successful calls. The generic one keeps ids (``id``, ``*_id``,
``*Id``), counts, and anything under a ``selected*``/``deselected*``/``created*``/
``affected*`` key. An error result's metadata is its message. An extractor runs when the
history is read (in the history's actor, once per record), on the result as the call
returned it (decoded from the JSON text `ToolResult.ok` made then, `JSONText`): let it only
read its arguments.

Bounds: the newest ``CTXACTORS_HISTORY_MAX_OPERATIONS`` (50) operations per session, each
kept for ``CTXACTORS_HISTORY_TTL`` seconds (3600): the runtime's ``settings.history``, aged
by the runtime's clock.
``get_recent_context`` itself is never recorded: asking must not push real operations out.
"""

from __future__ import annotations

import datetime
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Annotated, Any, cast

import msgspec

from ctxactors._decoding import build_now
from ctxactors.bounds import AnswerBudget
from ctxactors.context import SessionKey, ToolContext
from ctxactors.history_store import HistorySaver, Stored, StoredCall, wall_to_clock
from ctxactors.logs import get_logger
from ctxactors.results import JSONText, ToolResult
from ctxactors.tools import Extractor, Scope, Server, ToolSpec, pick, tool

__all__ = [
    "History",
    "OperationRecord",
    "RecentContext",
    "compact",
    "extract_metadata",
    "generic_metadata",
    "pick",
]


class OperationRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """One recorded call, as `get_recent_context` returns it (not the batch tool's input
    operation, `ctxactors.batch.plan.Operation`)."""

    timestamp: str  # ISO 8601, UTC, milliseconds
    tool: str
    arguments: dict[str, Any]
    is_error: bool
    metadata: dict[str, Any]
    assistant_id: str | None = None
    thread_id: str | None = None


build_now(OperationRecord)  # workers convert stored operations to it


class RecentContext(msgspec.Struct, frozen=True, omit_defaults=True):
    """The result of ``get_recent_context``: newest first.

    When the operations asked for don't fit in one answer (``CTXACTORS_MAX_ANSWER_BYTES``),
    it holds the newest that do, ``truncated`` is true and ``total`` says how many there were.
    """

    operations: list[OperationRecord]
    count: int
    truncated: bool = False
    total: int | None = None


class HistoryConfig(msgspec.Struct, frozen=True):
    """Bounds of one runtime's histories; `clock` is monotonic seconds (injectable for tests)."""

    max_operations: int = 50
    ttl: float = 3600.0
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if self.max_operations < 1:
            raise ValueError(f"max_operations must be at least 1, got {self.max_operations}")
        if not self.ttl > 0:
            raise ValueError(f"ttl must be positive, got {self.ttl}")


def runtime_config(runtime: Any) -> HistoryConfig:
    """The history bounds of `runtime`: its settings, aged by its clock."""
    limits = runtime.settings.history
    return HistoryConfig(limits.max_operations, limits.ttl, runtime.clock)


# (config clock for the TTL, wall clock, the tool's scope, the operation without its
# timestamp, and with a store its encoding): the timestamp is formatted when read, as most
# records never are; the scope decides who may read it; the encoding is made once, when the
# call is recorded, and written as is by every write of the history that holds it.
_Record = tuple[float, float, Scope, OperationRecord, bytes | None]


def _session_histories(runtime: Any) -> Callable[[SessionKey], SessionHistory | None]:
    """``(principal, session_id) -> its SessionHistory`` (None once the session is gone)."""
    registry = runtime._registry
    durable = getattr(runtime, "durability", None)
    config = runtime_config(runtime)
    if durable is None:

        def new() -> SessionHistory:
            return SessionHistory(config)

        return lambda session: registry.session_state(session, "history", new)

    tools: Mapping[str, ToolSpec] = runtime.tools  # a stored call's extractor, when read

    def stored(session: SessionKey) -> SessionHistory:
        return SessionHistory(config, HistorySaver(durable, session), tools)

    return lambda session: registry.session_state(session, "history", lambda: stored(session))


Limit = Annotated[int, msgspec.Meta(ge=1)]
ToolName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
ToolFilter = ToolName | Annotated[list[ToolName], msgspec.Meta(max_length=100)] | None


class SessionHistory:
    """The recent operations of one session, oldest first, bounded by count and age.

    Shared by the session's actors (each adds its calls from its own thread), hence the
    lock; held by the registry as session state, so it goes with the session.
    """

    def __init__(
        self,
        config: HistoryConfig,
        saver: HistorySaver | None = None,
        tools: Mapping[str, ToolSpec] | None = None,
    ) -> None:
        self.config = config
        self._lock = threading.Lock()
        # Records, or calls still to be made into their records (`record`).
        self._ops: deque[_Record | _Pending] = deque(maxlen=config.max_operations)
        self._saver = saver  # with a state store: the history is kept there too
        self._tools = tools or {}  # by name: the specs of calls read back from the store
        if saver is not None:
            saver.bind(self._lock, self._encodings, lambda: self._merge_stored(saver))

    def add(self, record: _Record | _Pending) -> None:
        saver = self._saver
        lock = self._lock
        lock.acquire()  # not `with`: on every stored call's path
        try:
            if saver is not None and not saver.loaded:
                self._merge_stored(saver)  # first use, or after a failed write
            self._ops.append(record)
            tell = saver is not None and saver.changed()
        finally:
            lock.release()
        if tell:
            assert saver is not None
            saver.defer()  # the flusher writes it (and what comes meanwhile) later

    def record(self, ctx: ToolContext, spec: ToolSpec, args: dict[str, Any], result: Any) -> None:
        """Add one call. The common call (flat and small arguments, a short result) is
        kept as references (`_Pending`) and made into its record, metadata and
        all, when the history is read: most records are never read. The references are
        safe to keep: the arguments are the call's own dict of immutable values and the
        result's text is the snapshot of what it returned; their size is bounded here."""
        content = result.content
        if len(content) == 1:
            block = content[0]
            text = block.get("text")
            if (
                type(text) is str
                and len(text) <= _LAZY_TEXT
                # A structured result only when its text is its JSON (`ToolResult.ok`):
                # then the text is the snapshot. A handler's own ToolResult pairs other
                # text with a dict it may change later, so it is recorded now; and so is a
                # text result that a tool's own extractor would read.
                and (
                    type(block) is JSONText
                    if result.structured is not None
                    else spec.extract is None or result.is_error
                )
                and _flat_and_small(args)
            ):
                record = _Pending(  # what it holds stays alive for 50 calls
                    self.config.clock(),
                    time.time(),
                    spec.server.scope,
                    spec,
                    args,
                    text,
                    result.is_error,
                    result.structured is not None,
                    ctx.assistant_id,
                    ctx.thread_id,
                )
                if self._saver is not None:
                    self.add(record)
                    return
                lock = self._lock
                lock.acquire()  # not `with`: on every call's path, and twice as costly
                try:
                    self._ops.append(record)
                finally:
                    lock.release()
                return
        now, wall = self.config.clock(), time.time()
        arguments = compact(args)
        op = OperationRecord(
            timestamp="",
            tool=spec.name,
            arguments=arguments,
            is_error=result.is_error,
            metadata=extract_metadata(spec, arguments, result),
            assistant_id=ctx.assistant_id,
            thread_id=ctx.thread_id,
        )
        self.add((now, wall, spec.server.scope, op, None))

    def _finished(self) -> list[_Record]:
        """The records, each pending one made into its record once (lock held)."""
        ops, stored = self._ops, self._saver is not None
        for i, record in enumerate(ops):
            if isinstance(record, _Pending):
                done = _finish(record)
                # Still stored as the call: its encoding is made now, if not yet.
                raw = record.raw if record.raw is not None or not stored else _stored(record)
                ops[i] = (record.clock, record.wall, record.scope, done, raw)
        return cast(list[_Record], list(ops))

    def _expire(self) -> None:
        """Drop the records past the TTL (lock held)."""
        cutoff = self.config.clock() - self.config.ttl
        while self._ops and _clock(self._ops[0]) <= cutoff:
            self._ops.popleft()

    def _encodings(self) -> list[bytes]:
        """The records as the store keeps them (lock held): each encoded once, by the
        first write that carries it, and kept with the record for the next writes. A
        record the bound pushed out before a write is never encoded at all (a busy
        session adds far more records per write than it keeps)."""
        self._expire()
        ops = self._ops
        for i, record in enumerate(ops):
            if isinstance(record, _Pending):
                if record.raw is None:
                    record.raw = _stored(record)
            elif record[-1] is None:
                ops[i] = (*record[:-1], _stored(record))
        # Every record has its encoding now (a `cast` per record costs 0.2 µs)
        return [_raw(record) for record in ops]  # type: ignore[misc]

    def _merge_stored(self, saver: HistorySaver) -> bool:
        """Take in what the store holds (once, or again after a failed write); records
        kept here that are newer than the stored ones stay after them (lock held). True
        when some of those stayed: the store lacks them."""
        stored = saver.load()
        if stored is None:
            return False
        now = self.config.clock()
        loaded: list[_Record | _Pending] = []
        for item, raw in stored:
            try:
                loaded.append(self._from_store(item, raw, now))
            except (ValueError, TypeError) as exc:  # msgspec's errors are ValueErrors
                # Not a record this history wrote: skipped (the next write drops it).
                get_logger("ctxactors.history").warning("history_record_unreadable", error=str(exc))
        newest = _wall(loaded[-1]) if loaded else float("-inf")
        ours = [r for r in self._ops if _wall(r) > newest]
        self._ops.clear()
        self._ops.extend(loaded)
        self._ops.extend(ours)
        return bool(ours)

    def _from_store(self, item: Stored | StoredCall, raw: bytes, now: float) -> _Record | _Pending:
        """One stored record as this history keeps it (ValueError if it can't be one)."""
        wall = item.wall
        if not 0 <= wall <= _LAST_WALL:  # NaN fails this too
            raise ValueError(f"a record's time is out of range: {wall!r}")
        clock = wall_to_clock(wall, now)
        if type(item) is Stored:
            scope, op = item.op
            return (clock, wall, Scope(scope), msgspec.convert(op, OperationRecord), raw)
        call = cast(StoredCall, item)
        spec = self._tools.get(call.tool, call.tool)
        return _Pending(
            clock,
            wall,
            call.scope,
            spec,
            call.arguments,
            call.text,
            call.is_error,
            call.structured,
            call.assistant_id,
            call.thread_id,
            raw,
        )

    def current(self) -> list[_Record]:
        """The records within the TTL, oldest first (expired ones are dropped)."""
        saver = self._saver
        with self._lock:
            tell = (
                saver is not None
                and not saver.loaded
                and self._merge_stored(saver)
                and saver.changed()
            )
            self._expire()
            records = self._finished()
        if tell:
            assert saver is not None
            saver.defer()
        return records


class History(Server):
    """Answers ``get_recent_context`` from the caller's session history."""

    name = "history"
    scope = Scope.SESSION

    def __init__(
        self, histories: Callable[[SessionKey], SessionHistory | None], max_answer_bytes: int
    ) -> None:
        self._histories = histories
        self._max_answer_bytes = max_answer_bytes

    @classmethod
    def create(cls, runtime: Any) -> History:
        return cls(_session_histories(runtime), runtime.settings.max_answer_bytes)

    @classmethod
    def attach(cls, runtime: Any) -> None:
        """Record every call of this runtime in the caller's session history."""
        runtime.add_observer(_Recorder(_session_histories(runtime)), before_reply=True)

    @tool(read_only=True)
    def get_recent_context(
        self, ctx: ToolContext, limit: Limit = 5, tool_filter: ToolFilter = None
    ) -> RecentContext:
        """Recent operations of this conversation, newest first: tool, arguments, whether
        it failed, and what it did (ids created, items selected or deselected, errors).
        Use it to answer follow-up questions about earlier tool calls. `tool_filter` keeps
        only the named tool(s); `limit` (default 5) is capped at the number kept."""
        wanted = {tool_filter} if isinstance(tool_filter, str) else tool_filter
        found: list[OperationRecord] = []
        history = self._histories(ctx.session_key)
        records = history.current() if history is not None else []
        for _, wall, scope, op, _ in reversed(records):
            if len(found) >= limit:
                break
            if (wanted is None or op.tool in wanted) and visible(scope, op, ctx):
                found.append(msgspec.structs.replace(op, timestamp=_iso(wall)))
        budget = AnswerBudget(self._max_answer_bytes)
        kept = budget.take(found)
        if budget.cut:
            return RecentContext(kept, len(kept), truncated=True, total=len(found))
        return RecentContext(kept, len(kept))


class _Recorder:
    """The observer that adds each call to its session's history, in the calling actor's
    thread just before the reply (the session's own actor reaches the history unlocked)."""

    __slots__ = ("_histories",)

    def __init__(self, histories: Callable[[SessionKey], SessionHistory | None]) -> None:
        self._histories = histories

    def __call__(
        self, ctx: ToolContext, spec: ToolSpec, args: dict[str, Any], result: ToolResult
    ) -> None:
        if issubclass(spec.server, History):
            return  # asking about the history is not an operation
        history = self._histories(ctx.session_key)
        if history is None:
            return  # the session was ended meanwhile: nothing to add to
        history.record(ctx, spec, args, result)


# The latest wall-clock time a stored record may carry (year 5138): a time a history never
# wrote would break reading it (`_iso`) and never expire.
_LAST_WALL = 1e11

# A result text longer than this is made into its record at once (metadata, clipping), so a
# session's pending records stay small.
_LAZY_TEXT = 4096


class _Pending(msgspec.Struct, gc=False):
    """A call recorded as references (`SessionHistory.record`), made into its
    `OperationRecord` when first read: a `_Record`'s clocks and scope, then the spec (its
    name only for a call read back from the store whose tool this runtime lacks), the clean
    arguments, the result's text, is_error, whether it was structured, the assistant, the
    thread, and with a store its encoding (`StoredCall`). For a structured result the text
    is the JSON the call returned then, so the metadata reads that snapshot, not a dict the
    server may have changed since.

    Not tracked by CPython's cyclic garbage collector (``gc=False``: it can't be part of a
    cycle, as nothing it holds refers back to it). Kept for 50 calls, a tuple here was the
    one object per call that outlived the young collections, and every full pass (a pause
    of every thread) walked each session's 50: at 4,000 sessions a pass took 82 ms over
    295,000 objects, 42 ms over 95,000 without them (docs/benchmarks.md).
    """

    clock: float
    wall: float
    scope: Scope
    spec: ToolSpec | str
    args: dict[str, Any]
    text: str
    is_error: bool
    structured: bool
    assistant_id: str | None
    thread_id: str | None
    raw: bytes | None = None


_encode = msgspec.msgpack.Encoder().encode


def _stored(record: _Record | _Pending) -> bytes:
    """A record as the store keeps it: a finished one with its scope (msgspec writes a
    Scope as its value), a common call as the call (`StoredCall`), whose record is made
    only if it is read; its text only when the metadata can need it."""
    if not isinstance(record, _Pending):
        _, wall, scope, op, _ = record
        return _encode(Stored(wall, (scope, op)))
    spec, is_error, structured = record.spec, record.is_error, record.structured
    name = spec if isinstance(spec, str) else spec.name
    kept = record.text if is_error or structured else ""
    call = StoredCall(
        record.wall,
        record.scope,
        name,
        record.args,
        kept,
        is_error,
        structured,
        record.assistant_id,
        record.thread_id,
    )
    return _encode(call)


def _clock(record: _Record | _Pending) -> float:
    return record.clock if isinstance(record, _Pending) else record[0]


def _wall(record: _Record | _Pending) -> float:
    return record.wall if isinstance(record, _Pending) else record[1]


def _raw(record: _Record | _Pending) -> bytes | None:
    return record.raw if isinstance(record, _Pending) else record[-1]


def _finish(pending: _Pending) -> OperationRecord:
    spec, args, text = pending.spec, pending.args, pending.text
    is_error, structured = pending.is_error, pending.structured
    assistant_id, thread_id = pending.assistant_id, pending.thread_id
    name, extract = (spec, None) if isinstance(spec, str) else (spec.name, spec.extract)
    arguments = dict(args)  # what `compact` makes of flat and small arguments
    if is_error:
        metadata = {"error": _clip(text, MAX_ERROR)}
    elif not structured:
        metadata = {}  # no extractor of its own (`record` made that one at once)
    elif extract is None:
        metadata = generic_metadata(_snapshot(text))
    else:  # the tool's extractor, on the result as it was returned
        assert not isinstance(spec, str)
        block = JSONText(type="text", text=text)
        metadata = extract_metadata(spec, arguments, ToolResult([block], _snapshot(text)))
    return OperationRecord("", name, arguments, is_error, metadata, assistant_id, thread_id)


def _snapshot(text: str) -> dict[str, Any]:
    """The structured result as it was returned: its JSON text (nothing if it is not)."""
    try:
        decoded = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return {}
    return decoded if isinstance(decoded, dict) else {}


def visible(scope: Scope, op: OperationRecord, ctx: ToolContext) -> bool:
    """Whether `ctx` could have seen what `op` did by calling the tool itself.

    The history is the session's, but its records are not: another assistant's calls
    (its playbook steps, say) stay its own, and so do another thread's calls of a tool
    whose state is per thread. Calls made without an assistant are the session's and
    shown to all, except where the tool's state is keyed by assistant.
    """
    if scope is Scope.SESSION:
        return op.assistant_id is None or op.assistant_id == ctx.assistant_id
    if op.assistant_id != ctx.assistant_id:
        return False
    return scope is Scope.ASSISTANT or op.thread_id == ctx.thread_id


def _iso(wall: float) -> str:
    moment = datetime.datetime.fromtimestamp(wall, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- metadata ------------------------------------------------------------------------------

_ID_KEY = re.compile(r"^(id|.+_id|.+Id|.+_ids|.+Ids)$")
_COUNT_KEY = re.compile(r"^(count|total|.+_count|.+Count)$")
_LIST_KEY = re.compile(r"^(selected|deselected|created|affected|removed|deleted)", re.IGNORECASE)
MAX_ERROR = 500


def extract_metadata(spec: ToolSpec, args: dict[str, Any], result: ToolResult) -> dict[str, Any]:
    """The metadata of one call: the error, the tool's own extractor, or the generic one."""
    if result.is_error:
        return {"error": _clip(result.text, MAX_ERROR)}
    extractor: Extractor | None = spec.extract
    if extractor is None:
        return generic_metadata(result.structured)
    try:
        found = extractor(args, result)
    except Exception as exc:  # noqa: BLE001 - a bad extractor costs metadata, not the record
        get_logger("ctxactors.history").warning("extract_failed", tool=spec.name, exc_info=exc)
        return generic_metadata(result.structured)
    return compact(dict(found or {}))


def generic_metadata(structured: dict[str, Any] | None) -> dict[str, Any]:
    """Ids, counts and selected/deselected/created/affected items of a structured result."""
    if not structured:
        return {}
    found: dict[str, Any] = {}
    for key, value in structured.items():
        if _LIST_KEY.match(key) and isinstance(value, list | dict):
            found[key] = _ids_or_items(value)
        elif _ID_KEY.match(key) and _scalar(value, allow_list=True):
            found[key] = value
        elif _COUNT_KEY.match(key) and isinstance(value, int) and not isinstance(value, bool):
            found[key] = value
    return compact(found)


def _scalar(value: Any, allow_list: bool = False) -> bool:
    if isinstance(value, str | int) and not isinstance(value, bool):
        return True
    return allow_list and isinstance(value, list) and all(_scalar(v) for v in value)


def _ids_or_items(value: list[Any] | dict[str, Any]) -> Any:
    """A record's id when it has one (``{"selected": {playbook}}`` -> its id), else itself."""
    if isinstance(value, dict):
        return value["id"] if "id" in value and _scalar(value["id"]) else value
    return [_ids_or_items(v) if isinstance(v, dict) else v for v in value]


# -- compaction ----------------------------------------------------------------------------

MAX_STRING = 500
MAX_ITEMS = 50
MAX_DEPTH = 6


def compact(value: Any, depth: int = 0) -> Any:
    """A bounded copy: long strings, lists and dicts are cut with a note of what was cut.

    A record's size must not follow its call's (an ``add_content`` of 4 MiB would otherwise
    be kept 50 times per session).
    """
    if isinstance(value, str):
        return _clip(value, MAX_STRING)
    if isinstance(value, dict):
        if _flat_and_small(value):
            return dict(value)  # the common case, on every call's path: a plain copy
        if depth >= MAX_DEPTH:
            return f"<object of {len(value)} keys>"
        items = list(value.items())
        out = {_clip(str(k), MAX_STRING): compact(v, depth + 1) for k, v in items[:MAX_ITEMS]}
        if len(items) > MAX_ITEMS:
            out["…"] = f"{len(items) - MAX_ITEMS} more keys"
        return out
    if isinstance(value, list | tuple):
        if depth >= MAX_DEPTH:
            return f"<list of {len(value)} items>"
        out_list = [compact(v, depth + 1) for v in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            out_list.append(f"… {len(value) - MAX_ITEMS} more items")
        return out_list
    if value is None or isinstance(value, bool | int | float):
        return value
    return _clip(repr(value), MAX_STRING)


_SCALARS = frozenset({bool, int, float, type(None)})


def _flat_and_small(value: dict[Any, Any]) -> bool:
    """True if `compact` would keep this dict as it is: few keys, short scalar values."""
    if len(value) > MAX_ITEMS:
        return False
    for key, item in value.items():
        kind = type(item)
        if (
            type(key) is not str
            or len(key) > MAX_STRING
            or (len(item) > MAX_STRING if kind is str else kind not in _SCALARS)
        ):
            return False
    return True


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"
