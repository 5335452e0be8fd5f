"""DescribeConfigs of a BROKER resource lists broker.rack as Kafka does: read-only, the rack
the named broker registered (whichever node answers), null when it has none; the cluster-wide
default resource ("") has no rack."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import trio

from raftlog.broker import BrokerBackend
from raftlog.config import NodeConfig
from raftlog.net.kafka.backend import ConfigResourceType, ConfigSource
from tests.metadata.test_controller import cluster

BROKER = ConfigResourceType.BROKER


def backend_with_racks(racks: dict[int, str | None]) -> BrokerBackend:
    image = cluster(3).image
    brokers = {b: dataclasses.replace(reg, rack=racks[b]) for b, reg in image.brokers.items()}
    metadata = SimpleNamespace(
        image=dataclasses.replace(image, brokers=brokers), add_listener=lambda listener: None
    )
    # This node (1) is configured with a rack of its own: the answer must not use it.
    config = NodeConfig(node_id=1, broker_rack="not-this")
    replicas = SimpleNamespace(
        writes=SimpleNamespace(produce=None),
        reads=SimpleNamespace(fetch=None, list_offset=None, offset_for_leader_epoch=None),
        replicas=SimpleNamespace(data_event=None),
        unsafe_partitions=tuple,
    )
    return BrokerBackend(config, metadata, None, None, replicas)  # type: ignore[arg-type]


def rack_entries(backend: BrokerBackend, name: str, keys: list[str] | None) -> list:
    result = trio.run(backend.describe_configs, BROKER, name, keys)
    assert result.error == 0, result
    return [e for e in result.configs if e.name == "broker.rack"]


def test_broker_rack_is_the_registered_rack_read_only() -> None:
    backend = backend_with_racks({1: "RACK1", 2: "RACK2", 3: None})
    (entry,) = rack_entries(backend, "2", None)
    assert (entry.value, entry.read_only, entry.source) == (
        "RACK2",
        True,
        ConfigSource.STATIC_BROKER_CONFIG,
    )
    assert not entry.is_default
    (entry,) = rack_entries(backend, "3", ["broker.rack"])
    assert (entry.value, entry.read_only, entry.source) == (None, True, ConfigSource.DEFAULT_CONFIG)
    assert entry.is_default
    assert rack_entries(backend, "1", ["log.retention.ms"]) == []
    assert rack_entries(backend, "", None) == []


def test_entries_stay_sorted_by_name() -> None:
    backend = backend_with_racks({1: "r", 2: "r", 3: "r"})
    names = [e.name for e in trio.run(backend.describe_configs, BROKER, "1", None).configs]
    assert "broker.rack" in names
    assert names == sorted(names)
