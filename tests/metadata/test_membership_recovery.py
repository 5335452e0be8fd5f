"""Start-up recovery with dynamic membership (KIP-853): a node that is not in the static
controller_quorum_voters but that a voter set on its own disk names is a voter, so it refuses
to empty a log it cannot rebuild (it may have acknowledged committed entries)."""

from __future__ import annotations

import pytest

from raftlog.config import NodeConfig
from raftlog.metadata.raft.log_store import MetadataRecoveryError
from raftlog.metadata.raft.messages import Entry
from raftlog.metadata.raft.voters import VoterSet, encode_voters_record
from tests.metadata.test_node_quorum import make_configs
from tests.metadata.test_snapshot_recovery import (
    NOW_MS,
    _driver,
    _newer_version,
    _store,
)


def _observer_config(tmp_path) -> NodeConfig:  # type: ignore[no-untyped-def]
    voter, broker = make_configs(tmp_path, n=2)
    return NodeConfig.from_dict(
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


def test_a_node_its_log_names_a_voter_refuses_to_start_over(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = _observer_config(tmp_path)
    store = _store(config)
    store.append([Entry(o, 1, b"e%d" % o) for o in range(8)], NOW_MS)
    store.install_snapshot(_newer_version(20))  # an image this version cannot read
    added = encode_voters_record(VoterSet.of_ids({1, config.node_id}))
    store.append([Entry(20, 1, b"x"), Entry(21, 1, added), Entry(22, 1, b"y")], NOW_MS)
    store.close()
    with pytest.raises(MetadataRecoveryError, match="cannot rebuild"):
        _driver(config)
