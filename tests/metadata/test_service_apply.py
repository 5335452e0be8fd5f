"""Committed entries delivered together are applied as one change (one notification), split
only at epoch-start entries; a node replaying its log never acts on intermediate history."""

from __future__ import annotations

import uuid

from raftlog.config import NodeConfig
from raftlog.metadata import records as r
from raftlog.metadata.raft.messages import Entry
from raftlog.metadata.raft.types import RaftConfig
from raftlog.metadata.records import encode_entry
from raftlog.metadata.service import MetadataService

NO_OP = RaftConfig().leader_change_payload


class _Core:
    config = RaftConfig()
    role = type("Role", (), {"name": "follower"})()
    epoch = 3
    leader_id = 2
    snapshot = None


class _Quorum:
    core = _Core()

    @staticmethod
    def now_ms() -> int:
        return 0


def test_a_commit_batch_is_one_change_with_the_final_state() -> None:
    svc = MetadataService(NodeConfig(), "cluster")
    svc.attach(_Quorum())  # type: ignore[arg-type]
    seen = []
    svc.add_listener(lambda image, delta: seen.append(image))
    seen.clear()
    topic_id = uuid.uuid4()
    leader_moves = [
        r.PartitionChange(topic_id, 0, leader=leader, isr=(1, 2, 3)) for leader in (2, 3, 1)
    ]
    entries = [
        Entry(0, 1, NO_OP),
        Entry(1, 1, encode_entry([r.Topic("t", topic_id)])),
        Entry(2, 1, encode_entry([r.Partition(topic_id, 0, (1, 2, 3), (1, 2, 3), 1, 0, 0)])),
        *[Entry(3 + i, 1, encode_entry([change])) for i, change in enumerate(leader_moves)],
        Entry(6, 2, NO_OP),
        Entry(7, 2, encode_entry([r.Config("topic", "t", "retention.ms", "5")])),
    ]
    svc.on_commit(entries, high_watermark=8)
    # Two runs (split by the epoch-2 no-op), so two notifications, not six.
    assert len(seen) == 2
    first = seen[0].partition(topic_id, 0)
    assert first is not None
    assert first.leader == 1 and first.leader_epoch == 3  # the end state, not leader 2 or 3
    assert seen[1].topic_config("t", "retention.ms") == 5
    assert svc.applied_offset == 7


def test_a_committed_record_this_version_cannot_read_stops_applying_and_names_it() -> None:
    # Kafka's choice too: skipping a committed record would leave this node's image silently
    # different from every other node's, so applying stops with the offset and the record.
    import msgpack
    import pytest

    from raftlog.metadata.service import CommittedMetadataError

    svc = MetadataService(NodeConfig(node_id=4), "cluster")
    svc.attach(_Quorum())  # type: ignore[arg-type]
    topic_id = uuid.uuid4()
    newer = msgpack.packb(
        [r.encode_record(r.Topic("t", topic_id)), msgpack.packb([99, 0, "from the future"])],
        use_bin_type=True,
    )
    entries = [Entry(0, 1, NO_OP), Entry(1, 1, newer)]
    with pytest.raises(CommittedMetadataError) as info:
        svc.on_commit(entries, high_watermark=2)
    assert str(info.value) == (
        "node 4: cannot decode committed metadata entry at offset 1 (epoch 1): record 1 of 2: "
        "unknown metadata record type 99 version 0; known types "
        f"{sorted({type_id for type_id, _ in r.RECORD_TYPES})}"
    )
    assert svc.image.topic("t") is None  # nothing of that entry was applied
