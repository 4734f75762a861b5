"""``ctxactors shards``: grow (``--add N``) or shrink (``--remove N``) a running Ray
deployment, or show its shards.

Growing takes effect at once for every front end: the old shards refuse the sessions that
moved (their front ends then learn the new count), and each moved session loads its state
from Redis on its new shard at its next call.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ctxactors import redis_access, redis_url
from ctxactors.cli.main import add_settings_argument, settings_from_args
from ctxactors.errors import StoreUnavailableError
from ctxactors.ray._auth import RayAuthError
from ctxactors.ray._backend import RayBackend
from ctxactors.ray._directory import LayoutChangedError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray-address", required=True, metavar="ADDR", help="the Ray cluster")
    parser.add_argument("--store", required=True, metavar="redis://...", help="the shards' Redis")
    parser.add_argument("--ray-namespace", default="ctxactors", metavar="NAME")
    parser.add_argument(
        "--shard-resource",
        metavar="NAME",
        help="the custom Ray resource new shards need (as given to serve)",
    )
    add_settings_argument(parser)  # redis.*, ray.* as serve takes them
    change = parser.add_mutually_exclusive_group()
    change.add_argument("--add", type=int, default=0, metavar="N", help="add N shards")
    change.add_argument(
        "--remove", type=int, default=0, metavar="N", help="remove the last N shards"
    )


def shard_options(resource: str | None) -> dict[str, Any] | None:
    """Ray actor options that keep shards on the nodes that offer `resource`."""
    return None if not resource else {"resources": {resource: 1}}


def run(args: argparse.Namespace) -> int:
    try:  # the Redis and Ray checks of `serve` (`ctxactors.redis_access`, `ctxactors.ray._auth`)
        settings = settings_from_args(args)
        store = redis_access.prepare(args.store, settings)
        backend = RayBackend(
            args.ray_address,
            shards=1,
            store=store,
            namespace=args.ray_namespace,
            shard_options=shard_options(args.shard_resource),
            settings=settings,
        )
    except (ValueError, StoreUnavailableError) as exc:
        print(f"ctxactors shards: {redis_url.redact(str(exc))}", file=sys.stderr)
        return 2
    try:
        if args.add:
            print(f"shards: {backend.add_shards(args.add)}")
        elif args.remove:
            print(f"shards: {backend.remove_shards(args.remove)}")
        backend.connect()
        for shard in backend.shard_stats():
            print(json.dumps(shard, sort_keys=True))
    except (ValueError, LayoutChangedError, RayAuthError, ConnectionError) as exc:
        print(f"ctxactors shards: {redis_url.redact(str(exc))}", file=sys.stderr)
        return 2
    finally:
        backend.close()
    return 0
