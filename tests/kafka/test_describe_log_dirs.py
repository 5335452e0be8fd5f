"""DescribeLogDirs (handlers_log_dirs.py): every version kio models that raftlog serves (v1-4),
the topic filter, authorization (DESCRIBE on the cluster), the sizes and lags it reports from
real partition logs, and a stock client (kafka-python's KafkaAdminClient.describe_log_dirs)
over the wire. The handler is registered here on the test's own server; the node's registry
gets it from apis.py."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from raftlog.errors import ErrorCode
from raftlog.net.kafka import codec, handlers_log_dirs
from raftlog.net.kafka.apis import default_registry
from raftlog.net.kafka.handlers_log_dirs import (
    DESCRIBE_LOG_DIRS_KEY,
    LOG_DIR_APIS,
    PartitionLogInfo,
    describe_partition_logs,
    handle_describe_log_dirs,
)
from raftlog.security.acl import AclBinding, AclOperation, AclPermissionType, PatternType
from raftlog.security.acl import ResourceType as RT
from raftlog.security.authorizer import Authorizer
from tests.kafka.conftest import start_broker
from tests.kafka.memory_backend import MemoryBackend
from tests.kafka.test_reassign_handlers import context
from tests.replication.test_manager import TOPIC, followers, produce, start_cluster
from tests.waiting import wait_until

VERSIONS = range(1, 5)
KIB = 1024


def schema(version: int, kind: str) -> Any:
    module = importlib.import_module(f"kio.schema.describe_log_dirs.v{version}.{kind}")
    return getattr(module, f"DescribeLogDirs{kind.capitalize()}")


def request(version: int, topics: dict[str, list[int]] | None) -> Any:
    named = None if topics is None else [{"topic": t, "partitions": ps} for t, ps in topics.items()]
    return codec.build(schema(version, "request"), {"topics": named})


class LogDirs:
    """A LogDirsBackend holding fixed partition logs."""

    def __init__(self, path: Path, logs: Sequence[PartitionLogInfo]) -> None:
        self.path = path
        self.logs = logs

    def log_dir(self) -> str:
        return str(self.path)

    def partition_logs(self) -> Sequence[PartitionLogInfo]:
        return self.logs


LOGS = (
    PartitionLogInfo("a", 0, 1000, 0),
    PartitionLogInfo("a", 1, 0, 0),
    PartitionLogInfo("b", 0, 70, 12),
)


def listed(response: dict[str, Any]) -> dict[tuple[str, int], tuple[int, int]]:
    (result,) = response["results"]
    return {
        (t["name"], p["partition_index"]): (p["partition_size"], p["offset_lag"])
        for t in result["topics"]
        for p in t["partitions"]
    }


@pytest.mark.parametrize("version", VERSIONS)
async def test_every_version_lists_the_directory_and_filters_topics(
    tmp_path: Path, version: int
) -> None:
    backend = LogDirs(tmp_path, LOGS)
    ctx = context(backend, DESCRIBE_LOG_DIRS_KEY, version)
    response = await handle_describe_log_dirs(ctx, request(version, None))
    built = codec.build(schema(version, "response"), response)  # a valid response of it
    (result,) = built.results
    assert result.error_code == ErrorCode.none and result.log_dir == str(tmp_path)
    assert all(not p.is_future_key for t in result.topics for p in t.partitions)
    assert listed(response) == {("a", 0): (1000, 0), ("a", 1): (0, 0), ("b", 0): (70, 12)}
    if version >= 4:
        stats = os.statvfs(tmp_path)
        assert result.total_bytes == stats.f_blocks * stats.f_frsize
        assert 0 <= result.usable_bytes <= result.total_bytes
    # Named partitions only; a topic named with no partitions and unhosted ones list nothing.
    named = {"a": [1, 7, -1], "b": [], "ghost": [0]}
    response = await handle_describe_log_dirs(ctx, request(version, named))
    codec.build(schema(version, "response"), response)
    assert listed(response) == {("a", 1): (0, 0)}


async def test_refused_without_describe_on_the_cluster(tmp_path: Path) -> None:
    backend = LogDirs(tmp_path, LOGS)
    nobody = Authorizer([])
    for version in VERSIONS:
        ctx = context(backend, DESCRIBE_LOG_DIRS_KEY, version, nobody)
        response = await handle_describe_log_dirs(ctx, request(version, None))
        codec.build(schema(version, "response"), response)
        # v3+ say why; v1-2 have no error field and list no directory, as Kafka answers.
        assert response["error_code"] == ErrorCode.cluster_authorization_failed
        assert response["results"] == []
    describe = AclBinding(
        RT.CLUSTER,
        "kafka-cluster",
        PatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.DESCRIBE,
        AclPermissionType.ALLOW,
    )
    allowed = context(backend, DESCRIBE_LOG_DIRS_KEY, 4, Authorizer([describe]))
    response = await handle_describe_log_dirs(allowed, request(4, None))
    assert response["error_code"] == ErrorCode.none and len(listed(response)) == 3


async def test_a_node_without_partition_logs_lists_no_directory(tmp_path: Path) -> None:
    ctx = context(SimpleNamespace(), DESCRIBE_LOG_DIRS_KEY, 4)
    response = await handle_describe_log_dirs(ctx, request(4, None))
    assert response == {"throttle_time": 0, "error_code": ErrorCode.none, "results": []}


async def test_an_unreadable_directory_is_a_storage_error(tmp_path: Path) -> None:
    ctx = context(LogDirs(tmp_path / "gone", LOGS), DESCRIBE_LOG_DIRS_KEY, 4)
    response = await handle_describe_log_dirs(ctx, request(4, None))
    (result,) = codec.build(schema(4, "response"), response).results
    assert result.error_code == ErrorCode.kafka_storage_error and result.topics == ()


def test_a_followers_lag_is_the_leaders_high_watermark_minus_its_log_end() -> None:
    def plog(end: int, size: int) -> Any:
        return SimpleNamespace(log_end_offset=end, size_bytes=size)

    def hosted(follower: Any) -> Any:
        return SimpleNamespace(replica=SimpleNamespace(follower=follower))

    logs = {
        ("t", 0): plog(20, 5),
        ("t", 1): plog(20, 6),
        ("t", 2): plog(20, 7),
        ("u", 0): plog(3, 1),
    }
    partitions = {
        ("t", 0): hosted(SimpleNamespace(leader_high_watermark=50)),  # behind by 30
        ("t", 1): hosted(SimpleNamespace(leader_high_watermark=-1)),  # no answer yet
        ("t", 2): hosted(None),  # leads (or no role): no lag
    }
    assert describe_partition_logs(logs, partitions) == [
        PartitionLogInfo("t", 0, 5, 30),
        PartitionLogInfo("t", 1, 6, 0),
        PartitionLogInfo("t", 2, 7, 0),
        PartitionLogInfo("u", 0, 1, 0),  # a log no replica holds (yet): no lag known
    ]


async def test_sizes_are_the_segment_files_of_real_replicas(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)
        for _ in range(5):
            assert (await produce(cluster, count=50)).error == ErrorCode.none
        await wait_until("in sync", cluster.in_sync)
        for broker_id in (cluster.leader_id, *followers(cluster)):
            manager = cluster.managers[broker_id]
            adapter = handlers_log_dirs._ReplicaManagerAdapter(manager)
            (info,) = [i for i in adapter.partition_logs() if i.topic == TOPIC]
            directory = Path(adapter.log_dir()) / f"{TOPIC}-0"
            on_disk = sum(f.stat().st_size for f in directory.glob("*.log"))
            assert info.size_bytes == on_disk > 0
            assert info.offset_lag == 0  # leader, and followers in sync
            assert os.path.isabs(adapter.log_dir())
        await cluster.stop_all()


async def test_kafka_python_describes_the_log_dirs(nursery: trio.Nursery, tmp_path: Path) -> None:
    registry = default_registry()
    for api_key, (lo, hi, handler) in LOG_DIR_APIS.items():
        registry.register(api_key, lo, hi, handler)

    class Backend(MemoryBackend):
        def log_dir(self) -> str:
            return str(tmp_path)

        def partition_logs(self) -> Sequence[PartitionLogInfo]:
            return LOGS

    broker = await start_broker(nursery, tmp_path, registry)
    broker.backend.__class__ = Backend

    def run() -> Any:
        from kafka.admin import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="kp-admin")
        try:
            return admin.describe_log_dirs({"a": [0, 1], "b": [0]})
        finally:
            admin.close()

    with trio.fail_after(60):
        (answer,) = await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    (log_dir,) = answer["log_dirs"]
    assert log_dir["log_dir"] == str(tmp_path) and log_dir["error_code"] == 0
    sizes = {
        (t["name"], p["partition_index"]): p["partition_size"]
        for t in log_dir["topics"]
        for p in t["partitions"]
    }
    assert sizes == {("a", 0): 1000, ("a", 1): 0, ("b", 0): 70}
