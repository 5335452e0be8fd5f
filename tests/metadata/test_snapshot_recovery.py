"""Start-up with a metadata snapshot on disk that does not decode (real files, real driver).

A snapshot whose checksum is fine but whose records this version cannot read (written by a
newer version, or a writer bug) is passed over like a damaged one: the node starts from the
snapshot before it plus the log, or from the log at offset 0, and says so. Only when its own
disk cannot rebuild the metadata does a voter refuse to start (an observer starts empty).
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from raftlog.config import NodeConfig
from raftlog.metadata import records as r
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.raft.driver import QuorumDriver
from raftlog.metadata.raft.log_store import (
    UNUSABLE_SNAPSHOT_SUFFIX,
    MetadataLogStore,
    MetadataRecoveryError,
)
from raftlog.metadata.raft.messages import Entry
from raftlog.metadata.raft.types import Snapshot
from raftlog.metadata.service import MetadataService
from raftlog.metadata.snapshot import decode_snapshot, encode_snapshot
from raftlog.net.rpc import PeerSet
from raftlog.storage.flusher import Flusher
from tests.metadata.test_node_quorum import make_configs
from tests.metadata.test_snapshot import snapshot_from_a_newer_version

NOW_MS = 1_700_000_000_000


def _image(offset: int) -> MetadataImage:
    image, _ = MetadataImage.empty("cluster").apply(
        [
            r.RegisterBroker(1, uuid.UUID(int=1), 1, "h", 9092, "h", 9093),
            r.Topic(f"at-{offset}", uuid.UUID(int=offset + 1)),
        ],
        offset,
        1,
    )
    return image


def _good(end_offset: int) -> Snapshot:
    return Snapshot(end_offset, 1, encode_snapshot(_image(end_offset - 1)))


def _newer_version(end_offset: int) -> Snapshot:
    return Snapshot(end_offset, 1, snapshot_from_a_newer_version(_image(end_offset - 1)))


def _entries(start: int, end: int) -> list[Entry]:
    return [Entry(offset, 1, b"e%d" % offset) for offset in range(start, end)]


def _store(config: NodeConfig) -> MetadataLogStore:
    return MetadataLogStore(config.data_path, now_ms=NOW_MS)


def _driver(config: NodeConfig, decoded: list[bytes] | None = None) -> QuorumDriver:
    def decoder(data: bytes) -> MetadataImage:
        if decoded is not None:
            decoded.append(data)
        return decode_snapshot(data)

    noop = lambda *_: None  # noqa: E731
    return QuorumDriver(
        config,
        _store(config),
        Flusher(),
        PeerSet(config.node_id),
        on_commit=noop,
        on_snapshot=noop,
        on_role_change=noop,
        snapshot_decoder=decoder,
    )


def _snapshot_files(config: NodeConfig, suffix: str = ".snapshot") -> list[str]:
    directory = _store_dir(config)
    return sorted(p.name.split("-")[0].lstrip("0") for p in directory.glob(f"*{suffix}"))


def _store_dir(config: NodeConfig) -> Path:
    return config.data_path / "__cluster_metadata-0"


async def test_undecodable_newest_snapshot_falls_back_to_the_one_before_it(tmp_path, caplog):
    config = make_configs(tmp_path, n=1)[0]
    store = _store(config)
    store.append(_entries(0, 30), NOW_MS)
    store.save_snapshot(_good(10))
    store.compact_to(10)
    assert store.log.log_start_offset == 0  # no older snapshot yet: the whole log stays
    store.save_snapshot(_newer_version(20))
    store.compact_to(20)
    # The log is kept from the snapshot before the newest: that one is the fallback.
    assert store.log.log_start_offset == 10
    store.close()

    decoded: list[bytes] = []
    with caplog.at_level(logging.WARNING, "raftlog.quorum"):
        driver = _driver(config, decoded)
    assert driver.core.snapshot == _good(10)
    assert (driver.core.log_start, driver.core.log_end) == (10, 30)
    assert driver.core.entries() == _entries(10, 30)
    assert "passing over metadata snapshot 00000000000000000020-0000000001.snapshot" in caplog.text
    assert "unknown metadata record type 99" in caplog.text
    assert "metadata starts from the older snapshot at offset 10" in caplog.text
    # Set aside, so no later start or retention counts on it; kept for the operator.
    assert _snapshot_files(config) == ["10"]
    assert _snapshot_files(config, UNUSABLE_SNAPSHOT_SUFFIX) == ["20"]

    # The service builds its image from the vetted snapshot without decoding it again.
    service = MetadataService(config, "cluster")
    service.attach(driver)
    assert service.image == _image(9)
    assert len(decoded) == 2  # the newest (refused) and the fallback, each once
    driver.close()


async def test_undecodable_only_snapshot_falls_back_to_the_log_from_zero(tmp_path, caplog):
    config = make_configs(tmp_path, n=1)[0]
    store = _store(config)
    store.append(_entries(0, 30), NOW_MS)
    store.save_snapshot(_newer_version(20))
    store.compact_to(20)
    store.close()

    with caplog.at_level(logging.WARNING, "raftlog.quorum"):
        driver = _driver(config)
    assert driver.core.snapshot is None
    assert driver.core.entries() == _entries(0, 30)
    assert "metadata starts from the log at offset 0" in caplog.text
    assert _snapshot_files(config) == []
    driver.close()


def _after_an_installed_snapshot(config: NodeConfig, snapshot: Snapshot) -> None:
    """The disk of a follower that installed the leader's snapshot, then replicated on."""
    store = _store(config)
    store.append(_entries(0, 8), NOW_MS)
    store.install_snapshot(snapshot)
    store.append(_entries(20, 25), NOW_MS)
    store.close()


async def test_voter_that_cannot_rebuild_from_its_disk_refuses_to_start_and_says_why(
    tmp_path, caplog
):
    config = make_configs(tmp_path, n=1)[0]
    _after_an_installed_snapshot(config, _newer_version(20))
    with pytest.raises(MetadataRecoveryError) as info:
        _driver(config)
    message = str(info.value)
    assert "node 1: no usable metadata snapshot" in message
    assert "00000000000000000020-0000000001.snapshot" in message
    assert "metadata log starts at 20" in message and "remove that directory" in message
    assert "refusing to start this voter" in caplog.text
    # Nothing was changed: the same version as the one that wrote the snapshot could start.
    assert _snapshot_files(config) == ["20"]
    store = _store(config)
    assert (store.log.log_start_offset, store.log.log_end_offset) == (20, 25)
    store.close()


async def test_observer_that_cannot_rebuild_from_its_disk_starts_empty(tmp_path, caplog):
    voter, broker = make_configs(tmp_path, n=2)
    observer = NodeConfig.from_dict(
        {
            "node_id": broker.node_id,
            "data_dir": str(broker.data_path),
            "cluster_id": broker.cluster_id,
            "roles": ["broker"],
            "client_listener": f"127.0.0.1:{broker.client_address[1]}",
            "internal_listener": f"127.0.0.1:{broker.internal_address[1]}",
            "controller_quorum_voters": f"1@127.0.0.1:{voter.internal_address[1]}",
        }
    )
    _after_an_installed_snapshot(observer, _newer_version(20))
    with caplog.at_level(logging.WARNING, "raftlog.quorum"):
        driver = _driver(observer)
    # Its acknowledgements never counted toward a commit: it fetches everything again.
    assert driver.core.snapshot is None and (driver.core.log_start, driver.core.log_end) == (0, 0)
    assert "this observer starts over from an empty log" in caplog.text
    assert _snapshot_files(observer, UNUSABLE_SNAPSHOT_SUFFIX) == ["20"]
    driver.close()
