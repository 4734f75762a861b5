"""Content: a session's documents, full-text searchable through SQLite FTS5.

Each session's actor owns one in-memory SQLite database (connections are bound to the thread
that made them, and `Server.create` runs in the actor thread). With a state store, each
document is saved as its own part of the key (`ctxactors.durable.Parted`), so an add or a
delete writes one document, not the session's whole database (which cost 266 ms an add at
1,000 documents). A load puts the documents back but not the index, which the first search
builds (`_index`): a session's first call after a restart then costs what reading its
documents costs (about 20 ms at 1,000 documents of 4 KiB, was 430 ms with the index), and
a session that is never searched again never pays for it.

The index uses FTS5's ``trigram`` tokenizer, which indexes every three-character run. That
finds English words, code identifiers (``parse_config``) and Korean text (``리포트`` inside
``리포트 작성``) alike, with no word segmentation. Terms shorter than three characters can't
use the index; they are matched with ``LIKE`` over the session's documents instead, so short
substring queries still work (slower, but a session's store is capped).

A user query is never spliced into SQL or taken as FTS5 syntax: it is split on whitespace and
each term becomes a quoted FTS5 phrase (quotes doubled), bound as a parameter. So ``*``,
``NEAR``, parentheses, quotes or a lone ``-`` search for themselves.

Limits (`ctxactors.settings.ContentSettings`, from the runtime's settings):

- ``CTXACTORS_CONTENT_MAX_ITEM_BYTES``: one item's content, UTF-8 bytes (default 1 MiB);
- ``CTXACTORS_CONTENT_MAX_SESSION_BYTES``: a session's whole store (default 64 MiB);
- ``CTXACTORS_CONTENT_MAX_ITEMS``: items per session (default 100,000).

Over a limit the call is refused with a message saying which limit, and nothing already
stored changes.
"""

from __future__ import annotations

import sqlite3
import weakref
from collections.abc import Callable, Iterable
from typing import Annotated, Any, ClassVar

import msgspec

from ctxactors.batch.compensation import Compensation
from ctxactors.bounds import AnswerBudget
from ctxactors.context import ToolContext
from ctxactors.errors import ToolError
from ctxactors.servers.content_gate import IndexGate
from ctxactors.servers.content_ledger import ContentLedger
from ctxactors.settings import DEFAULTS, Settings
from ctxactors.state import SessionRef
from ctxactors.tools import Scope, Server, pick, tool

MAX_RESULTS = 50  # search_content's `limit` is clamped to this
MAX_TERMS = 16  # query terms beyond this are refused (each one is a clause)
_TRIGRAM = 3  # the shortest term the trigram index can look up
_SNIPPET_CHARS = 60  # characters of context either side of the first hit


Filename = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
ContentId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Query = Annotated[str, msgspec.Meta(min_length=1, max_length=1000)]
Limit = Annotated[int, msgspec.Meta(ge=1)]


class _Item(msgspec.Struct):
    """What the server keeps in Python about one item (the text lives in SQLite)."""

    rowid: int
    filename: str
    size: int  # UTF-8 bytes of the content


class ContentState(msgspec.Struct):
    """What a session's content key saves besides its documents: the id counter."""

    next: int


class _Doc(msgspec.Struct, array_like=True):
    """One saved document, a part of the key named by its id."""

    rowid: int
    filename: str
    content: str


_encode_doc = msgspec.msgpack.Encoder().encode
_decode_doc = msgspec.msgpack.Decoder(_Doc).decode


class Content(Server):
    """A session's documents: add, read, list, delete, and ranked full-text search."""

    name = "content"
    scope = Scope.SESSION
    State = ContentState

    # Per runtime: each principal's content bytes, across its sessions.
    _ledgers: ClassVar[weakref.WeakKeyDictionary[Any, ContentLedger]] = weakref.WeakKeyDictionary()
    # Per runtime: each principal's index builds running now (`content_gate`).
    _gates: ClassVar[weakref.WeakKeyDictionary[Any, IndexGate]] = weakref.WeakKeyDictionary()

    @classmethod
    def attach(cls, runtime: Any) -> None:
        cls._gates[runtime] = IndexGate(runtime.settings.content.max_principal_indexing)
        durability = getattr(runtime, "durability", None)
        ledger = cls._ledgers[runtime] = ContentLedger(
            getattr(durability, "store", None), clock=runtime.clock
        )
        if durability is not None:  # stored content counts until its session goes
            durability.listen(ledger)

    @classmethod
    def create(cls, runtime: Any) -> Content:
        content = cls(runtime.settings)
        content._ledger = cls._ledgers.get(runtime)
        content._gate = cls._gates.get(runtime)
        content._stored = getattr(runtime, "durability", None) is not None
        return content

    def __init__(self, settings: Settings = DEFAULTS) -> None:
        self.settings = settings
        self.max_item_bytes = settings.content.max_item_bytes
        self.max_session_bytes = settings.content.max_session_bytes
        self.max_principal_bytes = settings.content.max_principal_bytes
        self.max_items = settings.content.max_items
        # Autocommit: each statement is its own transaction, so a refused call leaves
        # nothing half-written.
        # Any thread: a key's calls run one at a time, but not always on the same thread
        # (`ctxactors._scheduler`).
        self._db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        # `texts` holds the searchable text, with NUL characters replaced (FTS5 and LIKE
        # stop reading a value at a NUL), and `raw` the original only when it differs;
        # `docs` is a contentless index over `texts`, so the text is stored once.
        self._db.execute("CREATE TABLE texts(rowid INTEGER PRIMARY KEY, filename, content, raw)")
        self._db.execute(
            "CREATE VIRTUAL TABLE docs USING fts5(filename, content, content='', "
            "tokenize='trigram')"
        )
        self._items: dict[str, _Item] = {}
        self._by_rowid: dict[int, str] = {}
        self._indexed = True  # False after a load, until the first search builds `docs`
        self._bytes = 0
        self._next = 0
        # With a store: each document changed since the last save, and its saved bytes
        # before the change (None: it was not saved). None without a store: nothing loads.
        self._journal: dict[str, bytes | None] | None = None
        self._ledger: ContentLedger | None = None  # the runtime's
        self._gate: IndexGate | None = None  # the runtime's
        self._stored = False  # whether the content outlives the actor (a store)
        self._session: SessionRef | None = None

    def close(self) -> None:
        self._db.close()
        if self._ledger is not None and self._session is not None and not self._stored:
            self._ledger.drop(self._session)  # the content is gone with the actor

    def _build(self, ctx: ToolContext, size: int, work: Callable[[], None]) -> None:
        """Run `work`, which indexes `size` bytes of text, in one of the caller's
        principal's index builds (`content_gate`); not after a load, when the index is
        left to the first search."""
        if self._gate is None or not self._indexed:
            work()
        else:
            self._gate.build(ctx.principal, size, work)

    def _account(self, ctx: ToolContext) -> None:
        """Tell the ledger this session's bytes now."""
        if self._ledger is not None:
            self._session = ctx.session_key
            self._ledger.set(ctx.session_key, self._bytes)

    def snapshot(self) -> ContentState:
        return ContentState(self._next)

    def restore(self, state: ContentState) -> None:
        self._next = state.next

    def restore_parts(self, parts: dict[str, bytes]) -> None:
        self._journal = None  # loading is not a change
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM texts")
            self._db.execute("INSERT INTO docs(docs) VALUES ('delete-all')")
        self._items, self._by_rowid, self._bytes = {}, {}, 0
        docs = sorted(((cid, _decode_doc(data)) for cid, data in parts.items()), key=_rowid)
        self._indexed = not docs
        self._insert_docs(docs)
        self._journal = {}

    def _index(self) -> None:
        """Build the search index over every document, if a load left it unbuilt."""
        if not self._indexed:
            with self._db:
                self._db.execute("BEGIN")
                self._db.execute(
                    "INSERT INTO docs(rowid, filename, content) "
                    "SELECT rowid, filename, content FROM texts"
                )
            self._indexed = True

    def changed_parts(self) -> dict[str, bytes | None]:
        if not self._journal:
            return {}
        return {
            cid: self._part(cid)
            for cid, before in self._journal.items()
            if before is not None or cid in self._items  # not added and deleted since
        }

    def settle_parts(self, saved: bool) -> None:
        journal, self._journal = self._journal or {}, None  # undoing is not a change
        if not saved:
            for cid, before in journal.items():
                if cid in self._items:
                    self._remove(cid, self._items[cid])
                if before is not None:
                    self._insert_docs([(cid, _decode_doc(before))])
            self._items = dict(sorted(self._items.items(), key=lambda kv: kv[1].rowid))
        self._journal = {}

    def _part(self, cid: str) -> bytes | None:
        item = self._items.get(cid)
        if item is None:
            return None
        return _encode_doc(_Doc(item.rowid, item.filename, self._text(item)))

    def _changing(self, cid: str) -> None:
        if self._journal is not None and cid not in self._journal:
            self._journal[cid] = self._part(cid)

    def _get(self, content_id: str) -> _Item:
        item = self._items.get(content_id)
        if item is None:
            raise ToolError(f"content {content_id!r} not found")
        return item

    # Undos for transactional batches: ids are never handed out again, and a restored
    # item comes back with its id, its row and its place in the listing.
    def _undo_add(self, ctx: ToolContext, args: Any, result: dict[str, Any]) -> None:
        if result["id"] in self._items:
            self.delete_content(ctx, result["id"])

    def _before_delete(self, ctx: ToolContext, args: Any) -> tuple[str, _Item, str] | None:
        if args.id not in self._items:
            return None
        return args.id, self._items[args.id], self.read_content(ctx, args.id)["content"]

    def _undo_delete(
        self, ctx: ToolContext, args: Any, result: Any, before: tuple[str, _Item, str] | None
    ) -> None:
        if before is None or before[0] in self._items:
            return
        self._build(ctx, before[1].size, lambda: self._insert(*before))
        self._items = dict(sorted(self._items.items(), key=lambda kv: kv[1].rowid))
        self._account(ctx)

    # Blocking (`ctxactors._scheduler`): indexing a megabyte document costs about a second
    # of CPU, which on the key pool held one of its few workers from every other key.
    @tool(
        blocking=True,
        compensate=_undo_add,
        extract=pick(created_content="id", filename="filename"),
    )
    def add_content(self, ctx: ToolContext, filename: Filename, content: str) -> dict[str, Any]:
        """Store a document (a file's text, notes, a tool's output) so it can be searched
        and read back later in this session. Returns its id."""
        size = len(content.encode("utf-8"))
        if size > self.max_item_bytes:
            raise ToolError(
                f"content of {filename!r} is {size} bytes; one item may hold at most "
                f"{self.max_item_bytes} bytes"
            )
        if self._bytes + size > self.max_session_bytes:
            raise ToolError(
                f"content store full: {self._bytes} of {self.max_session_bytes} bytes used, "
                f"{filename!r} needs {size} more; delete something first"
            )
        if len(self._items) >= self.max_items:
            raise ToolError(
                f"content store full: it holds the maximum of {self.max_items} items; "
                "delete something first"
            )
        if self._ledger is not None and ctx.principal is not None:
            held = self._ledger.others(ctx.session_key) + self._bytes
            if held + size > self.max_principal_bytes:
                raise ToolError(
                    self.settings.content.cap("max_principal_bytes").exceeded(
                        f"this principal's content is {held:,} bytes across its sessions, "
                        f"{filename!r} needs {size:,} more"
                    )
                    + "; delete something or end a session first"
                )
        self._next += 1
        content_id = f"c{self._next}"
        item = _Item(self._next, filename, size)
        self._build(ctx, size, lambda: self._insert(content_id, item, content))
        self._account(ctx)
        return {"id": content_id, "filename": filename}

    def _insert(self, content_id: str, item: _Item, content: str) -> None:
        self._insert_docs([(content_id, _Doc(item.rowid, item.filename, content))])

    def _insert_docs(self, docs: list[tuple[str, _Doc]]) -> None:
        """Index documents, all or none (in one transaction)."""
        texts, index = [], []
        for cid, doc in docs:
            self._changing(cid)
            indexed = _indexable(doc.content)
            raw = None if indexed == doc.content else doc.content
            texts.append((doc.rowid, _indexable(doc.filename), indexed, raw))
            index.append((doc.rowid, _indexable(doc.filename), indexed))
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO texts(rowid, filename, content, raw) VALUES (?, ?, ?, ?)", texts
            )
            if self._indexed:
                self._db.executemany(
                    "INSERT INTO docs(rowid, filename, content) VALUES (?, ?, ?)", index
                )
        for cid, doc in docs:
            item = _Item(doc.rowid, doc.filename, _utf8_size(doc.content))
            self._items[cid] = item
            self._by_rowid[item.rowid] = cid
            self._bytes += item.size

    def _text(self, item: _Item) -> str:
        row = self._db.execute(
            "SELECT coalesce(raw, content) FROM texts WHERE rowid = ?", (item.rowid,)
        )
        text: str = row.fetchone()[0]
        return text

    def _remove(self, content_id: str, item: _Item) -> None:
        self._changing(content_id)
        with self._db:
            self._db.execute("BEGIN")
            if self._indexed:
                # A contentless index forgets a row when given the values it indexed.
                self._db.execute(
                    "INSERT INTO docs(docs, rowid, filename, content) "
                    "SELECT 'delete', rowid, filename, content FROM texts WHERE rowid = ?",
                    (item.rowid,),
                )
            self._db.execute("DELETE FROM texts WHERE rowid = ?", (item.rowid,))
        del self._items[content_id]
        del self._by_rowid[item.rowid]
        self._bytes -= item.size

    @tool(read_only=True)
    def read_content(self, ctx: ToolContext, id: ContentId) -> dict[str, Any]:
        """Read a stored document back in full, by its id."""
        item = self._get(id)
        return {"id": id, "filename": item.filename, "content": self._text(item)}

    @tool(read_only=True)
    def list_content(self, ctx: ToolContext) -> dict[str, Any]:
        """List this session's stored documents (id, filename, size in bytes), oldest first
        (the first ones, with `truncated` and the total, if they don't all fit)."""
        budget = AnswerBudget(self.settings.max_answer_bytes)
        items = budget.take(
            {"id": cid, "filename": item.filename, "size": item.size}
            for cid, item in self._items.items()
        )
        return budget.mark({"items": items, "count": len(items)}, total=len(self._items))

    @tool(
        blocking=True,  # a contentless index forgets a row by tokenizing it again
        destructive=True,
        idempotent=True,
        compensate=Compensation(_undo_delete, before=_before_delete),
        extract=pick(deleted_content="id", filename="filename"),
    )
    def delete_content(self, ctx: ToolContext, id: ContentId) -> dict[str, Any]:
        """Delete a stored document by its id."""
        item = self._get(id)
        self._build(ctx, item.size, lambda: self._remove(id, item))
        self._account(ctx)
        return {"id": id, "filename": item.filename, "deleted": True}

    @tool(read_only=True, blocking=True)  # may build the index of a loaded session (`_index`)
    def search_content(self, ctx: ToolContext, query: Query, limit: Limit = 10) -> dict[str, Any]:
        """Search this session's documents (filenames and text) for every word of the query,
        best matches first. Any text works, including code identifiers and Korean; query
        operators are not interpreted. `limit` above 50 is treated as 50."""
        terms = _indexable(query).split()
        if not terms:
            raise ToolError("query is blank: give at least one word to search for")
        if len(terms) > MAX_TERMS:
            raise ToolError(f"query has {len(terms)} words; at most {MAX_TERMS} are allowed")
        limit = min(limit, MAX_RESULTS)
        long_terms = [t for t in terms if len(t) >= _TRIGRAM]
        short_terms = [t for t in terms if len(t) < _TRIGRAM]
        if long_terms and not self._indexed and self._gate is not None:
            self._gate.build(ctx.principal, self._bytes, self._index)
        rows = self._search(long_terms, short_terms, limit)
        scored = [
            (rowid, -rank if rank is not None else float(_occurrences(content, terms)), content)
            for rowid, rank, content in rows
        ]
        if not long_terms:  # an unranked LIKE scan: rank by occurrences found
            scored.sort(key=lambda row: -row[1])
            del scored[limit:]
        results = []
        for rowid, score, content in scored:
            content_id = self._by_rowid[rowid]
            results.append(
                {
                    "id": content_id,
                    "filename": self._items[content_id].filename,
                    "snippet": _snippet(content, terms),
                    "score": score,
                }
            )
        return {"results": results, "count": len(results)}

    def _search(
        self, long_terms: list[str], short_terms: list[str], limit: int
    ) -> list[tuple[int, float | None, str]]:
        """Rows (rowid, bm25 rank or None, content). Only fixed SQL; terms are parameters."""
        like = " AND ".join(
            "(texts.filename LIKE ? ESCAPE '\\' OR texts.content LIKE ? ESCAPE '\\')"
            for _ in short_terms
        )
        like_params: list[str] = []
        for term in short_terms:
            pattern = "%" + _escape_like(term) + "%"
            like_params += [pattern, pattern]
        if long_terms:
            self._index()
            sql = (
                "SELECT texts.rowid, bm25(docs), texts.content FROM docs "
                "JOIN texts ON texts.rowid = docs.rowid WHERE docs MATCH ?"
            )
            if like:
                sql += " AND " + like
            sql += " ORDER BY bm25(docs) LIMIT ?"
            params: list[Any] = [fts_phrases(long_terms), *like_params, limit]
            return self._db.execute(sql, params).fetchall()
        # Only short terms: the index can't help; scan (newest first) and rank in Python.
        sql = f"SELECT rowid, NULL, content FROM texts WHERE {like} ORDER BY rowid DESC LIMIT ?"
        return self._db.execute(sql, [*like_params, limit * 20]).fetchall()


def _utf8_size(text: str) -> int:
    # An ASCII string knows it is one (a flag): no encoding of every document on a load.
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _rowid(entry: tuple[str, _Doc]) -> int:
    return entry[1].rowid


def fts_phrases(terms: Iterable[str]) -> str:
    """An FTS5 query that matches documents containing every term as literal text.

    Each term becomes a string (``"..."`` with inner quotes doubled), which FTS5 reads as a
    phrase with no operators; phrases side by side mean AND.
    """
    return " ".join('"' + term.replace('"', '""') + '"' for term in terms)


def _indexable(text: str) -> str:
    return text.replace("\x00", "\ufffd")


def _escape_like(term: str) -> str:
    return term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _folded(content: str, terms: list[str]) -> tuple[str, list[str]]:
    """Content and terms lower-cased, unless that changes lengths (then both as given)."""
    folded = content.lower()
    if len(folded) != len(content):
        return content, sorted(set(terms), key=len)
    return folded, sorted({t.lower() for t in terms}, key=len)


def _occurrences(content: str, terms: list[str]) -> int:
    folded, needles = _folded(content, terms)
    return sum(folded.count(n) for n in needles)


def _snippet(content: str, terms: list[str]) -> str:
    """Text around the first hit of any term, with the hits marked ``[...]``.

    Built in Python rather than with FTS5's ``snippet()``, whose fragments are counted in
    trigram tokens and come out clipped for this tokenizer.
    """
    folded, needles = _folded(content, terms)
    first = min((i for n in needles if (i := folded.find(n)) >= 0), default=-1)
    if first < 0:  # matched on the filename only
        text = content[: 2 * _SNIPPET_CHARS]
        return text + ("…" if len(content) > len(text) else "")
    start = max(first - _SNIPPET_CHARS, 0)
    end = min(first + _SNIPPET_CHARS, len(content))
    marks: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        # Only hits starting before `end`, but whole however long (a term may be 1,000 chars).
        found = [(i, len(n)) for n in needles if (i := folded.find(n, pos, end - 1 + len(n))) >= 0]
        if not found:
            break
        i, n = min(found, key=lambda f: (f[0], -f[1]))
        if i >= end:
            break
        marks.append((i, i + n))
        pos = i + n
    end = max([end, *(e for _, e in marks)])
    parts, cursor = [], start
    for s, e in marks:
        parts += [content[cursor:s], "[", content[s:e], "]"]
        cursor = e
    parts.append(content[cursor:end])
    text = "".join(parts).replace("\n", " ")
    return ("…" if start > 0 else "") + text + ("…" if end < len(content) else "")
