"""Reading a node's /metrics from Python: what status views use, so they show the very figures
a dashboard does (one computation, on the node) instead of computing their own.

`scrape()` fetches and parses one node's exposition (bounded in bytes and time);
`status_figures()` picks the figures `raftlog cluster status` shows per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio
from prometheus_client.parser import text_string_to_metric_families

from raftlog.errors import RemoteError

# The exposition of a node with a few thousand partitions is well under this.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
DEFAULT_TIMEOUT_S = 5.0
_READ_CHUNK_BYTES = 65536

# status field -> metric (gauges and counters a status line shows per node).
STATUS_METRICS: dict[str, str] = {
    "active_controller": "raftlog_controller_kafka_controller_active_controller_count",
    "offline_partitions": "raftlog_controller_kafka_controller_offline_partitions_count",
    "under_replicated_partitions": "raftlog_server_replica_manager_under_replicated_partitions",
    "under_min_isr_partitions": "raftlog_server_replica_manager_under_min_isr_partition_count",
    "leader_count": "raftlog_server_replica_manager_leader_count",
    "partition_count": "raftlog_server_replica_manager_partition_count",
    "metadata_epoch": "raftlog_server_raft_metrics_current_epoch",
    "metadata_leader": "raftlog_server_raft_metrics_current_leader",
    "metadata_high_watermark": "raftlog_server_raft_metrics_high_watermark",
    "isr_shrinks": "raftlog_server_replica_manager_isr_shrinks_total",
    "isr_expands": "raftlog_server_replica_manager_isr_expands_total",
}


class ScrapeError(RemoteError):
    """The node's metrics endpoint did not answer with an exposition."""


@dataclass
class Samples:
    """Every sample of one scrape: name -> [(labels, value)]."""

    by_name: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float | None:
        """The sample with exactly these labels, None when absent."""
        for sample_labels, sample_value in self.by_name.get(name, ()):
            if sample_labels == labels:
                return sample_value
        return None

    def total(self, name: str, **labels: str) -> float:
        """The sum over samples whose labels include these (0 when none)."""
        return sum(
            sample_value
            for sample_labels, sample_value in self.by_name.get(name, ())
            if labels.items() <= sample_labels.items()
        )


def parse_exposition(text: str) -> Samples:
    """Raises ScrapeError for text that is not the Prometheus text format."""
    samples = Samples()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.by_name.setdefault(sample.name, []).append(
                    (dict(sample.labels), float(sample.value))
                )
    except ValueError as exc:
        raise ScrapeError(f"not a metrics exposition: {exc}") from None
    return samples


async def scrape(
    host: str,
    port: int,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_bytes: int = MAX_RESPONSE_BYTES,
) -> Samples:
    """GET /metrics from host:port; raises ScrapeError (unreachable, slow, not 200, too big)."""
    response = bytearray()
    with trio.move_on_after(timeout_s) as deadline:
        try:
            stream = await trio.open_tcp_stream(host, port)
            async with stream:
                request = f"GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                await stream.send_all(request.encode("ascii"))
                while chunk := await stream.receive_some(_READ_CHUNK_BYTES):
                    response += chunk
                    if len(response) > max_bytes:
                        raise ScrapeError(f"{host}:{port}: metrics over {max_bytes} bytes")
        except (OSError, trio.BrokenResourceError) as exc:
            raise ScrapeError(f"{host}:{port}: {exc}") from None
    if deadline.cancelled_caught:
        raise ScrapeError(f"{host}:{port}: no metrics within {timeout_s} s")
    head, separator, body = bytes(response).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0]
    if not separator or status_line.split(b" ")[1:2] != [b"200"]:
        raise ScrapeError(f"{host}:{port}: {status_line.decode('ascii', 'replace')!r}")
    return parse_exposition(body.decode("utf-8", "replace"))


def status_figures(samples: Samples) -> dict[str, float]:
    """The per-node figures of `raftlog cluster status` (STATUS_METRICS), 0 when absent."""
    return {key: samples.total(name) for key, name in STATUS_METRICS.items()}
