"""Reading a node's /metrics for status views: the figures, and every way a scrape fails."""

from __future__ import annotations

import pytest
import trio
from prometheus_client import CollectorRegistry

from raftlog.metrics.collectors import HealthCollector
from raftlog.metrics.endpoint import serve_metrics
from raftlog.metrics.health import ControllerHealth, NodeHealth, QuorumHealth, ReplicaHealth
from raftlog.metrics.scrape import (
    STATUS_METRICS,
    ScrapeError,
    parse_exposition,
    scrape,
    status_figures,
)

HEALTH = NodeHealth(
    node_id=2,
    replicas=ReplicaHealth(5, 3, 2, 1, 0),
    controller=ControllerHealth(1, 4, 1, 5, 0, 3),
    quorum=QuorumHealth(9, 2, 77, 78, "leader"),
    produce_purgatory_size=0,
)


async def serve(nursery: trio.Nursery, registry: CollectorRegistry) -> int:
    listeners = await nursery.start(serve_metrics, registry, "127.0.0.1", 0)
    return int(listeners[0].socket.getsockname()[1])


async def test_status_figures_are_the_nodes_own_numbers() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HealthCollector(lambda: HEALTH))
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, registry)
        figures = status_figures(await scrape("127.0.0.1", port))
        nursery.cancel_scope.cancel()
    assert set(figures) == set(STATUS_METRICS)
    assert figures["under_replicated_partitions"] == 2
    assert figures["under_min_isr_partitions"] == 1
    assert figures["offline_partitions"] == 4
    assert figures["active_controller"] == 1
    assert figures["metadata_epoch"] == 9
    assert figures["isr_shrinks"] == 0  # not exported by this registry: 0


def test_samples_sum_over_matching_labels() -> None:
    samples = parse_exposition(
        'x_total{topic="a",p="0"} 2\nx_total{topic="a",p="1"} 3\nx_total{topic="b",p="0"} 4\n'
    )
    assert samples.total("x_total") == 9
    assert samples.total("x_total", topic="a") == 5
    assert samples.value("x_total", topic="b", p="0") == 4
    assert samples.value("x_total", topic="b") is None
    with pytest.raises(ScrapeError):
        parse_exposition("this is { not metrics\n")


async def test_scrape_failures_are_scrape_errors() -> None:
    async def answer(payload: bytes, stream: trio.SocketStream) -> None:
        async with stream:
            await stream.receive_some(1024)
            if payload:
                await stream.send_all(payload)
            else:
                await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        for payload, why in (
            (b"HTTP/1.1 404 Not Found\r\n\r\nno", "404"),
            (b"garbage without a head", "garbage"),
            (b"", "no metrics within"),
        ):
            listeners = await nursery.start(trio.serve_tcp, lambda s, p=payload: answer(p, s), 0)
            port = listeners[0].socket.getsockname()[1]
            with pytest.raises(ScrapeError, match=why):
                await scrape("127.0.0.1", port, timeout_s=0.5)
        big = b"HTTP/1.1 200 OK\r\n\r\n" + b"x 1\n" * 1000
        listeners = await nursery.start(trio.serve_tcp, lambda s: answer(big, s), 0)
        with pytest.raises(ScrapeError, match="over 100 bytes"):
            await scrape("127.0.0.1", listeners[0].socket.getsockname()[1], max_bytes=100)
        nursery.cancel_scope.cancel()
    with pytest.raises(ScrapeError):
        await scrape("127.0.0.1", 1, timeout_s=1.0)  # nothing listens there
