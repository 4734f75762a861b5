"""``ctxactors shards``: grow a running Ray deployment (``--add N``) or show its shards.

Growing takes effect at once for every front end: the old shards refuse the sessions that
moved (their front ends then learn the new count), and each moved session loads its state
from Redis on its new shard at its next call.
"""

from __future__ import annotations

import argparse
import json
import sys

from ctxactors.ray._backend import RayBackend
from ctxactors.ray._directory import LayoutChangedError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray-address", required=True, metavar="ADDR", help="the Ray cluster")
    parser.add_argument("--store", required=True, metavar="redis://...", help="the shards' Redis")
    parser.add_argument("--ray-namespace", default="ctxactors", metavar="NAME")
    change = parser.add_mutually_exclusive_group()
    change.add_argument("--add", type=int, default=0, metavar="N", help="add N shards")
    change.add_argument(
        "--remove", type=int, default=0, metavar="N", help="remove the last N shards"
    )


def run(args: argparse.Namespace) -> int:
    backend = RayBackend(args.ray_address, shards=1, store=args.store, namespace=args.ray_namespace)
    try:
        if args.add:
            print(f"shards: {backend.add_shards(args.add)}")
        elif args.remove:
            print(f"shards: {backend.remove_shards(args.remove)}")
        backend.connect()
        for shard in backend.shard_stats():
            print(json.dumps(shard, sort_keys=True))
    except (ValueError, LayoutChangedError) as exc:
        print(f"ctxactors shards: {exc}", file=sys.stderr)
        return 2
    finally:
        backend.close()
    return 0
