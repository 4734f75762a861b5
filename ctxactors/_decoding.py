"""Struct types' decoding info, built at import instead of by threads racing at first use.

msgspec (0.22, with the GIL) builds a struct type's decoding info the first time the type
is decoded or converted, and caches it on the class *before* it has filled in the fields'
types; filling them in runs Python code (annotations are evaluated), where the GIL may pass
to another thread. A thread that decodes the same type meanwhile gets the half-built info,
and the process dies (SIGSEGV in msgspec's ``mpack_decode``): a Ray shard did, when several
moved sessions loaded their state at once (``ctxactors.durable`` builds its decoders under
a lock). Types that worker threads decode are built here, once, while their module is
imported: no other thread can reach a class before its module's import has ended.
"""

from __future__ import annotations

from typing import Any

import msgspec


def build_now(*types: Any) -> None:
    """Build (and cache on each struct class involved) the decoding info of `types`."""
    for kind in types:
        msgspec.msgpack.Decoder(kind)
