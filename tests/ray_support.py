"""A multi-node Ray cluster on this machine (a head and two workers) and a real Redis.

Shards are kept off the head node (they need the ``ctxactors_shard`` resource that only
worker nodes have), so removing a worker node really kills shards while the test process,
connected through the head, keeps running. Health checks are fast so that a removed node
is declared dead, and its shards restarted elsewhere, within a couple of seconds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from state_support import RedisServer

from ctxactors import Scope, Server, ToolContext, tool

SHARD_RESOURCE = "ctxactors_shard"
SHARD_OPTIONS = {"resources": {SHARD_RESOURCE: 1}}


@dataclass
class RayCluster:
    cluster: Any
    redis: RedisServer
    started_s: float
    namespaces: list[str] = field(default_factory=list)

    def add_worker(self) -> Any:
        node = self.cluster.add_node(num_cpus=1, resources={SHARD_RESOURCE: 100})
        self.cluster.wait_for_nodes()
        return node

    def worker(self, node_id: str) -> Any:
        """The worker node of a Ray node id."""
        for node in self.cluster.worker_nodes:
            if node.node_id == node_id:
                return node
        raise LookupError(f"no worker node {node_id}")

    def namespace(self) -> str:
        name = f"t{uuid.uuid4().hex[:10]}"
        self.namespaces.append(name)
        return name


@contextmanager
def ray_cluster(directory: Path, workers: int = 2) -> Iterator[RayCluster]:
    """Start Redis (data in `directory`) and the cluster (a head and `workers` worker
    nodes); shut both down however it ends."""
    import ray
    from ray.cluster_utils import Cluster

    redis = RedisServer(directory)
    redis.start()
    started = time.monotonic()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "_system_config": {
                "health_check_initial_delay_ms": 0,
                "health_check_period_ms": 300,
                "health_check_failure_threshold": 3,
            },
        },
    )
    try:
        state = RayCluster(cluster, redis, 0.0)
        for _ in range(workers):
            state.add_worker()
        state.started_s = time.monotonic() - started
        yield state
    finally:
        try:
            ray.shutdown()
        finally:
            cluster.shutdown()
            redis.stop(kill=True)


class CrashOnce(Server):
    """A host server loaded by import path on the shards: its tools kill the shard's process
    the first time they see a marker file's path (and create the file), so a call is in
    flight when its shard dies, at a known moment."""

    name = "crash_once"
    scope = Scope.SESSION

    @tool(read_only=True)
    def crash_reading(self, ctx: ToolContext, marker: str) -> dict[str, Any]:
        """Die once, then answer."""
        return _crash_once(marker)

    @tool
    def crash_writing(self, ctx: ToolContext, marker: str) -> dict[str, Any]:
        """Die once, then answer (a call that changes state)."""
        return _crash_once(marker)


def _crash_once(marker: str) -> dict[str, Any]:
    import os

    try:
        with open(marker, "x"):
            pass
    except FileExistsError:
        return {"pid": os.getpid()}
    os._exit(1)


# The shards import CrashOnce from this directory (a host adds its own modules the same way).
TESTS_ENV = {"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parent)}}
