"""Produce record batches (built with raftlog.records) to partition leaders.

A produce goes to the partition's leader; leadership errors refresh metadata and retry
(bounded). Without idempotence a retried produce whose first attempt did land is written
twice: that is Kafka's at-least-once contract for a non-idempotent producer, and tests that
count records must use acks and retries accordingly.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from raftlog.client.cluster import Cluster, raise_for
from raftlog.client.protocol import build_request, throttle_time_ms
from raftlog.constants import ACKS_ALL, ACKS_LEADER, ACKS_NONE
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import Compression, Record, build_batch

_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class ProduceResult:
    partition: int
    base_offset: int  # -1 with acks=0: the broker does not answer
    throttle_time_ms: int


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the default partitioner's hash), as a signed 32-bit int."""
    m = 0x5BD1E995
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & _MASK32
        k ^= k >> 24
        k = (k * m) & _MASK32
        h = (h * m) & _MASK32
        h ^= k
    tail = length % 4
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * m) & _MASK32
    h ^= h >> 13
    h = (h * m) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Kafka's default partitioner for keyed records: positive murmur2 modulo partitions."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class Producer:
    """Sends one batch per produce() call; see the module docstring for retry semantics."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        acks: int = ACKS_ALL,
        compression: Compression = Compression.NONE,
        timeout_ms: int = 30_000,
    ) -> None:
        if acks not in (ACKS_NONE, ACKS_LEADER, ACKS_ALL):
            raise ValueError(f"acks must be 0, 1 or -1 (all), got {acks}")
        self.cluster = cluster
        self.acks = acks
        self.compression = compression
        self.timeout_ms = timeout_ms
        self._round_robin = itertools.count()

    async def _choose_partition(self, topic: str, key: bytes | None) -> int:
        if topic not in self.cluster.topics:
            await self.cluster.refresh_metadata([topic])
        info = self.cluster.topics.get(topic)
        if info is None or not info.partitions:
            code = info.error if info else ErrorCode.unknown_topic_or_partition
            raise KafkaError(code, f"topic {topic!r} has no partitions")
        count = len(info.partitions)
        if key is not None:
            return partition_for_key(key, count)
        return next(self._round_robin) % count

    async def produce(
        self,
        topic: str,
        records: Sequence[Record],
        *,
        partition: int | None = None,
        key: bytes | None = None,
    ) -> ProduceResult:
        """Send records as one batch to partition (or the partition of key, or round-robin)."""
        if not records:
            raise ValueError("produce needs at least one record")
        if partition is None:
            partition = await self._choose_partition(topic, key)
        batch = build_batch(records, compression=self.compression)
        chosen = partition

        async def attempt() -> ProduceResult:
            connection, _ = await self.cluster.leader(topic, chosen)
            payload = build_request(
                "produce",
                connection.version("produce"),
                {
                    "transactional_id": None,
                    "acks": self.acks,
                    "timeout": self.timeout_ms,
                    "topic_data": [
                        {"name": topic, "partition_data": [{"index": chosen, "records": batch}]}
                    ],
                },
            )
            if self.acks == ACKS_NONE:
                await connection.request(payload, expect_response=False)
                return ProduceResult(chosen, -1, 0)
            response = await connection.request(payload)
            result = response.responses[0].partition_responses[0]
            raise_for(
                result.error_code,
                f"produce {topic}-{chosen}",
                getattr(result, "error_message", None),
            )
            return ProduceResult(chosen, int(result.base_offset), throttle_time_ms(response))

        return await self.cluster.retrying(attempt, refresh_topics=[topic])
