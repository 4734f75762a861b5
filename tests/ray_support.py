"""A multi-node Ray cluster on this machine (a head and two workers) and a real Redis, both
as a deployment should run them: Ray with its token authentication, Redis asking an ACL
user's password.

Shards are kept off the head node (they need the ``ctxactors_shard`` resource that only
worker nodes have), so removing a worker node really kills shards while the test process,
connected through the head, keeps running. Health checks are fast so that a removed node
is declared dead, and its shards restarted elsewhere, within a couple of seconds.

The cluster's token is in a file (mode 0600) named by ``CTXACTORS_RAY_TOKEN_FILE`` in this
process's environment while the cluster runs: this process's front ends, and the ``serve``
and ``shards`` commands the tests start (their environment is a copy), join with it. The
`cluster` fixture (session-wide, a plugin of ``tests/conftest.py``) starts it once.
"""

from __future__ import annotations

import os
import secrets
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from state_support import RedisServer

from ctxactors import Scope, Server, ToolContext, tool

SHARD_RESOURCE = "ctxactors_shard"
SHARD_OPTIONS = {"resources": {SHARD_RESOURCE: 1}}


@dataclass
class RayCluster:
    cluster: Any
    redis: RedisServer
    started_s: float
    token_file: Path
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


# What the cluster's processes and this one read the token and its mode from while it runs.
_TOKEN_VARS = ("CTXACTORS_RAY_TOKEN_FILE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """One cluster for the whole test session (it takes seconds to start)."""
    with ray_cluster(tmp_path_factory.mktemp("ray-redis")) as started:
        yield started


@contextmanager
def ray_cluster(directory: Path, workers: int = 2) -> Iterator[RayCluster]:
    """Start Redis (data in `directory`; an ACL user with a password, the default user off)
    and the cluster (a head and `workers` worker nodes) with token authentication; shut
    both down however it ends."""
    import ray
    from ray.cluster_utils import Cluster

    from ctxactors.ray._auth import _reload_ray_config

    redis = RedisServer(directory, user="ctxactors", password=secrets.token_hex(16))
    redis.start()
    token_file = directory / "ray-token"
    token_file.touch(mode=0o600)
    token_file.write_text(secrets.token_hex(32) + "\n")
    saved = {name: os.environ.get(name) for name in _TOKEN_VARS}
    os.environ.update(
        CTXACTORS_RAY_TOKEN_FILE=str(token_file),  # the front ends, here and in commands
        RAY_AUTH_TOKEN_PATH=str(token_file),  # the nodes (this process's children)
        RAY_AUTH_MODE="token",
    )
    _reload_ray_config()  # this process's own GCS client waits for the nodes
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
        state = RayCluster(cluster, redis, 0.0, token_file)
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
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            _reload_ray_config()


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
