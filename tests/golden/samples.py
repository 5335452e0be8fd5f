"""Sample values of every internal message and metadata record, with their wire encoding.

`tests/testdata/golden/*.hex` hold the bytes these samples encoded to when the formats were
pinned; tests/golden/test_golden_formats.py checks that the code of today still writes those
bytes and still reads them back. `python -m tests.golden.samples` rewrites the files (only for
a deliberate format change: old nodes and old data must still read what they pin).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from raftlog.errors import ErrorCode
from raftlog.groups import offsets_format
from raftlog.groups.offsets_format import (
    CommittedOffset,
    GroupKey,
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetKey,
)
from raftlog.metadata import records as r
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.raft import messages as rm
from raftlog.metadata.raft.describe import QuorumDescription, ReplicaProgress
from raftlog.quotas.broker_hook import usage_to_wire
from raftlog.quotas.entity import QuotaEntity
from raftlog.quotas.manager import QuotaUsage
from raftlog.quotas.usage_rpc import rows_from_wire
from raftlog.replication import fetch_wire as fw
from raftlog.replication.core.types import DivergingEpoch as PartitionDivergingEpoch
from raftlog.security import acl

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "testdata" / "golden"

T1 = uuid.UUID("8f1c2b4e-6a3d-4e5f-9a0b-1c2d3e4f5a6b")
T2 = uuid.UUID("00000000-0000-4000-8000-000000000002")
INCARNATION = uuid.UUID("5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9")
BIG = 2**63 - 1


@dataclass(frozen=True)
class Family:
    """One message family: its samples, and how one is written and read back."""

    name: str
    samples: dict[str, Any]
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]


def _pack(value: Any) -> bytes:
    # The RPC frame's own packing (raftlog.net.rpc): a body is a value inside the envelope.
    return msgpack.packb(value, use_bin_type=True)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


RAFT_MESSAGES: dict[str, rm.Message] = {
    "vote": rm.Vote(False, 1, 7, 120, 6),
    "pre_vote": rm.Vote(True, 3, 8, 0, 0),
    "vote_response": rm.VoteResponse(False, 7, None, True),
    "vote_response_error": rm.VoteResponse(True, 9, 2, False, rm.ERROR_FENCED_EPOCH),
    "begin_quorum_epoch": rm.BeginQuorumEpoch(7, 1),
    "begin_quorum_epoch_response": rm.BeginQuorumEpochResponse(7, 1),
    "begin_quorum_epoch_response_error": rm.BeginQuorumEpochResponse(8, None, rm.ERROR_NOT_LEADER),
    "end_quorum_epoch": rm.EndQuorumEpoch(7, 1, (3, 2)),
    "end_quorum_epoch_empty": rm.EndQuorumEpoch(7, 1, ()),
    "end_quorum_epoch_response": rm.EndQuorumEpochResponse(7, 1),
    "fetch": rm.Fetch(2, 7, 120, 6, 500),
    "fetch_read_sequence": rm.Fetch(3, 2**31 - 1, BIG, 2**31 - 1, 0, 17),
    "fetch_response_entries": rm.FetchResponse(
        7,
        1,
        118,
        6,
        120,
        (rm.Entry(118, 6, b"\x91\x93\x0c\x00\x07"), rm.Entry(119, 7, b"")),
        read_sequence=4,
    ),
    "fetch_response_diverging": rm.FetchResponse(
        7, 1, 130, 6, 120, diverging_epoch=rm.DivergingEpoch(6, 125)
    ),
    "fetch_response_snapshot": rm.FetchResponse(
        7, 1, 10, 2, 120, snapshot_id=rm.SnapshotId(100, 5)
    ),
    "fetch_response_error": rm.FetchResponse(8, None, 0, -1, 0, error=rm.ERROR_FENCED_EPOCH),
    "fetch_snapshot": rm.FetchSnapshot(2, 7, rm.SnapshotId(100, 5), 65536, 1 << 20),
    "fetch_snapshot_response": rm.FetchSnapshotResponse(
        7, 1, rm.SnapshotId(100, 5), 0, bytes(range(256)) * 3, 70000
    ),
    "fetch_snapshot_response_error": rm.FetchSnapshotResponse(
        7, 1, None, 0, b"", 0, rm.ERROR_SNAPSHOT_NOT_FOUND
    ),
}

METADATA_RECORDS: dict[str, r.Record] = {
    "register_broker": r.RegisterBroker(1, INCARNATION, 17, "localhost", 9092, "127.0.0.1", 19092),
    "register_broker_rack": r.RegisterBroker(
        2, INCARNATION, 2**40, "broker-2.example", 65535, "10.0.0.2", 1, "rack-é"
    ),
    "fence_broker": r.FenceBroker(1, 17),
    "unfence_broker": r.UnfenceBroker(1, 17),
    "broker_shutdown_begin": r.BrokerShutdownBegin(3, 4),
    "topic": r.Topic("orders", T1),
    "topic_long_name": r.Topic("t" * 249, T2),
    "partition": r.Partition(T1, 0, (1, 2, 3), (1, 2), 1, 4, 9),
    "partition_defaults": r.Partition(T2, 7, (3,), (), -1),
    "partition_change_leader": r.PartitionChange(T1, 0, leader=2),
    "partition_change_isr": r.PartitionChange(T1, 0, isr=(1, 3), replicas=(1, 3, 4)),
    "partition_change_no_leader": r.PartitionChange(T1, 1, leader=-1, isr=()),
    "remove_topic": r.RemoveTopic(T2),
    "config_set": r.Config("topic", "orders", "retention.ms", "604800000"),
    "config_delete": r.Config("cluster", "", "unclean.leader.election.enable", None),
    "client_quota": r.ClientQuota(
        (("client-id", None), ("user", "bob")), "consumer_byte_rate", 2048.0
    ),
    "client_quota_fraction": r.ClientQuota((("user", None),), "request_percentage", 25.5),
    "client_quota_remove": r.ClientQuota((("ip", "10.1.2.3"),), "connection_creation_rate", None),
    "producer_ids": r.ProducerIds(1, 17, 5000),
    "producer_ids_snapshot": r.ProducerIds(-1, -1, 2**62),
    "leader_change": r.LeaderChange(7, 2),
    "feature_level": r.FeatureLevel("metadata.version", 1),
    "access_control_entry": r.AccessControlEntry(T1, 2, "orders", 3, "User:alice", "*", 3, 3),
    "access_control_entry_prefixed_deny": r.AccessControlEntry(
        T2, 3, "app-", 4, "User:bob", "10.0.0.1", 2, 2
    ),
    "remove_access_control_entry": r.RemoveAccessControlEntry(T1),
    "user_scram_credential_sha256": r.UserScramCredential(
        "alice", 1, bytes(range(16)), bytes(range(32)), bytes(range(32, 64)), 4096
    ),
    "user_scram_credential_sha512": r.UserScramCredential(
        "bob-é", 2, bytes(range(64)), bytes(range(64)), bytes(range(64, 128)), 16384
    ),
    "remove_user_scram_credential": r.RemoveUserScramCredential("alice", 2),
    "unregister_broker": r.UnregisterBroker(4, 3),
}

READ_ORDERS = acl.AclBinding(
    acl.ResourceType.TOPIC,
    "orders",
    acl.PatternType.LITERAL,
    "User:alice",
    "*",
    acl.AclOperation.READ,
    acl.AclPermissionType.ALLOW,
)

CONTROLLER_MESSAGES: dict[str, Any] = {
    "register_broker": cm.RegisterBroker(
        1, INCARNATION, "localhost", 9092, "127.0.0.1", 19092, None, "cluster-a"
    ),
    "register_broker_reply": cm.RegisterBrokerReply(broker_epoch=17),
    "register_broker_reply_error": cm.RegisterBrokerReply(
        ErrorCode.inconsistent_cluster_id, "cluster id mismatch"
    ),
    "broker_heartbeat": cm.BrokerHeartbeat(1, 17, 120, want_shutdown=True),
    "broker_heartbeat_reply": cm.BrokerHeartbeatReply(is_caught_up=True, is_fenced=False),
    "allocate_producer_ids": cm.AllocateProducerIds(1, 17),
    "allocate_producer_ids_reply": cm.AllocateProducerIdsReply(
        producer_id_start=5000, producer_id_len=1000
    ),
    "create_topics": cm.CreateTopics(
        (
            cm.NewTopic(
                "orders", 3, 2, configs={"retention.ms": "1000", "cleanup.policy": "delete"}
            ),
            cm.NewTopic("pinned", assignments={0: (1, 2), 1: (2, 3)}),
        ),
        validate_only=True,
    ),
    "create_topics_reply": cm.CreateTopicsReply(
        (
            cm.CreateTopicResult("orders", topic_id=T1, num_partitions=3, replication_factor=2),
            cm.CreateTopicResult("bad", ErrorCode.invalid_partitions, "need at least 1"),
        )
    ),
    "delete_topics": cm.DeleteTopics(("orders",), (T2,)),
    "delete_topics_reply": cm.DeleteTopicsReply(
        (
            cm.DeleteTopicResult("orders", T1),
            cm.DeleteTopicResult(None, T2, ErrorCode.unknown_topic_id),
        )
    ),
    "create_partitions": cm.CreatePartitions(
        (cm.NewPartitions("orders", 5, ((1, 2), (2, 3))), cm.NewPartitions("t", 2))
    ),
    "create_partitions_reply": cm.CreatePartitionsReply((cm.CreatePartitionsResult("orders"),)),
    "alter_partition": cm.AlterPartition(1, 17, T1, 0, 4, 9, (1, 2)),
    "alter_partition_reply": cm.AlterPartitionReply(
        leader=1, leader_epoch=4, isr=(1, 2), partition_epoch=10
    ),
    "alter_configs": cm.AlterConfigs(
        (cm.AlterConfigsResource("topic", "orders", {"retention.ms": "5000"}),)
    ),
    "incremental_alter_configs": cm.IncrementalAlterConfigs(
        (
            cm.IncrementalAlterConfigsResource(
                "broker",
                "1",
                (cm.ConfigOp("log.retention.ms", "set", "7"), cm.ConfigOp("x", "delete")),
            ),
        ),
        validate_only=True,
    ),
    "alter_configs_reply": cm.AlterConfigsReply(
        (cm.ConfigResourceResult("topic", "orders", ErrorCode.invalid_config, "bad value"),)
    ),
    "alter_client_quotas": cm.AlterClientQuotas(
        (
            cm.QuotaEntry(
                (("client-id", None), ("user", "bob")),
                (("consumer_byte_rate", 2048.0), ("producer_byte_rate", None)),
            ),
        )
    ),
    "alter_client_quotas_reply": cm.AlterClientQuotasReply(
        (cm.QuotaEntryResult((("user", "bob"),)),)
    ),
    "create_acls": cm.CreateAcls((READ_ORDERS,)),
    "create_acls_reply": cm.CreateAclsReply(
        (cm.AclCreationResult(), cm.AclCreationResult(ErrorCode.invalid_request, "no"))
    ),
    "delete_acls": cm.DeleteAcls(
        (acl.AclBindingFilter(), acl.AclBindingFilter(acl.ResourceType.TOPIC, "orders"))
    ),
    "delete_acls_reply": cm.DeleteAclsReply((cm.DeleteAclsFilterResult(matching=(READ_ORDERS,)),)),
    "alter_user_scram_credentials": cm.AlterUserScramCredentials(
        (cm.ScramCredentialDeletion("bob", 2),),
        (cm.ScramCredentialUpsertion("alice", 1, 8192, bytes(range(16)), bytes(range(32))),),
    ),
    "alter_user_scram_credentials_reply": cm.AlterUserScramCredentialsReply(
        (cm.ScramUserResult("bob", ErrorCode.resource_not_found, "none"), cm.ScramUserResult("a"))
    ),
    "unregister_broker": cm.UnregisterBroker(4),
    "unregister_broker_reply": cm.UnregisterBrokerReply(),
    "unregister_broker_reply_error": cm.UnregisterBrokerReply(
        ErrorCode.broker_id_not_registered, "broker 4 is not registered"
    ),
}

REPLICA_FETCH_REQUESTS: dict[str, fw.ReplicaFetchRequest] = {
    "request": fw.ReplicaFetchRequest(
        2,
        500,
        1,
        (
            fw.ReplicaFetchPartition("orders", 0, 120, 6, 7),
            fw.ReplicaFetchPartition("__consumer_offsets", 49, 0, -1, 0, 100),
        ),
    ),
    "request_empty": fw.ReplicaFetchRequest(3, 0, 0, ()),
}

REPLICA_FETCH_RESPONSES: dict[str, list[fw.ReplicaFetchAnswer]] = {
    "response": [
        fw.ReplicaFetchAnswer("orders", 0, ErrorCode.none, 130, 0, None, b"\x00" * 70),
        fw.ReplicaFetchAnswer("orders", 1, ErrorCode.none, 50, 10, PartitionDivergingEpoch(5, 48)),
        fw.ReplicaFetchAnswer("gone", 0, ErrorCode.unknown_topic_or_partition, -1, -1),
    ],
    "response_empty": [],
}

# The "quorum.describe" answer a non-leader forwards to (node.describe_quorum_description).
DESCRIBE_QUORUM: dict[str, QuorumDescription | None] = {
    "quorum": QuorumDescription(
        1,
        7,
        120,
        (
            ReplicaProgress(1, 120, 1_700_000_000_000, 1_700_000_000_000),
            ReplicaProgress(2, 118, -1, -1),
        ),
    ),
    "no_leader": None,
}


QUOTA_USAGE: dict[str, list[QuotaUsage]] = {
    "usage": [
        QuotaUsage(
            "producer_byte_rate",
            "alice",
            "",
            QuotaEntity.of([("user", "alice")]),
            1024.0,
            1536.25,
            1200,
        ),
        QuotaUsage(
            "request_percentage",
            "",
            "app-1",
            QuotaEntity.of([("client-id", None)]),
            25.5,
            0.0,
            0,
        ),
    ],
    "no_usage": [],
}


def _quota_usage_read(data: bytes) -> list[QuotaUsage]:
    return [
        QuotaUsage(
            row.quota_key,
            row.user,
            row.client_id,
            row.entity,
            row.quota,
            row.rate,
            row.throttle_time_total_ms,
        )
        for row in rows_from_wire(1, _unpack(data))
    ]


# __consumer_offsets records on disk: (key, value or None for a tombstone).
CONSUMER_OFFSETS: dict[str, tuple[Any, Any]] = {
    "offset_commit": (
        OffsetKey("app", "orders", 3),
        CommittedOffset(120, 7, "checkpoint", 1_700_000_000_000),
    ),
    "offset_commit_no_epoch": (
        OffsetKey("g-é", "t", 0),
        CommittedOffset(2**40, -1, "", 0),
    ),
    "offset_tombstone": (OffsetKey("app", "orders", 3), None),
    "group_metadata": (
        GroupKey("app"),
        GroupMetadataValue(
            "consumer",
            4,
            "range",
            "m-1",
            1_700_000_000_000,
            (
                MemberMetadataValue(
                    "m-1", None, "c-1", "/127.0.0.1", 10000, 30000, b"\x00\x00sub", b"\x00\x00as"
                ),
                MemberMetadataValue("m-2", "static-2", "c-2", "/10.0.0.2", 45000, 60000, b"", b""),
            ),
        ),
    ),
    "group_metadata_empty": (GroupKey("empty"), GroupMetadataValue(None, 0, None, None, 5, ())),
    "group_tombstone": (GroupKey("app"), None),
}


def _offsets_record_write(item: tuple[Any, Any]) -> bytes:
    key, value = item
    if isinstance(key, OffsetKey):
        record = (
            offsets_format.offset_tombstone(key)
            if value is None
            else offsets_format.offset_commit_record(key, value)
        )
    else:
        record = (
            offsets_format.group_tombstone(key.group_id)
            if value is None
            else offsets_format.group_metadata_record(key.group_id, value)
        )
    return _pack(list(record))


def _offsets_record_read(data: bytes) -> tuple[Any, Any]:
    key_bytes, value_bytes = _unpack(data)
    key = offsets_format.decode_key(key_bytes)
    if value_bytes is None:
        return key, None
    if isinstance(key, OffsetKey):
        return key, offsets_format.decode_offset_value(value_bytes)
    return key, offsets_format.decode_group_value(value_bytes)


# The RPC envelope around every body: (kind, correlation id, sender id, method, body).
RPC_FRAMES: dict[str, tuple[int, int, int, str, Any]] = {
    "raft_cast": (0, 0, 1, "raft", [[7, 2, 7, 120, 6, 500, 0], "localhost", 19093]),
    "request": (1, 42, 2, "replica.fetch", {"replica_id": 2, "partitions": []}),
    "response": (2, 42, 0, "controller", ["ok", b"\xc7\x01\x03\x00"]),
    "error": (3, 2**40, 0, "quorum.describe", "ValueError: bad thing"),
    "external_sender": (1, 1, -1, "quotas.usage", None),
}


def _rpc_frame_write(frame: tuple[int, int, int, str, Any]) -> bytes:
    from raftlog.net.rpc import _encode

    return _encode(*frame)


def _rpc_frame_read(data: bytes) -> tuple[int, int, int, str, Any]:
    from raftlog.net.rpc import _decode

    assert int.from_bytes(data[:4], "big") == len(data) - 4
    return _decode(data[4:])


def _describe_quorum_wire(described: QuorumDescription | None) -> bytes:
    return _pack(None if described is None else rm.CODEC.to_wire(described))


def _describe_quorum_read(data: bytes) -> QuorumDescription | None:
    wire = _unpack(data)
    return None if wire is None else rm.CODEC.from_wire(QuorumDescription, wire)


def families() -> list[Family]:
    return [
        Family(
            "raft_messages",
            RAFT_MESSAGES,
            lambda m: _pack(m.to_wire()),
            lambda b: rm.message_from_wire(_unpack(b)),
        ),
        Family("metadata_records", METADATA_RECORDS, r.encode_record, r.decode_record),
        Family(
            "controller_messages",
            CONTROLLER_MESSAGES,
            lambda m: cm.CODEC.encode(m, cm.ControllerRequest | cm.ControllerReply),
            lambda b: cm.CODEC.decode(cm.ControllerRequest | cm.ControllerReply, b),
        ),
        Family(
            "replica_fetch_requests",
            REPLICA_FETCH_REQUESTS,
            lambda q: _pack(fw.encode_request(q)),
            lambda b: fw.decode_request(_unpack(b)),
        ),
        Family(
            "replica_fetch_responses",
            REPLICA_FETCH_RESPONSES,
            lambda a: _pack(fw.encode_response(a)),
            lambda b: fw.decode_response(_unpack(b)),
        ),
        Family("describe_quorum", DESCRIBE_QUORUM, _describe_quorum_wire, _describe_quorum_read),
        Family(
            "rpc_frames",
            RPC_FRAMES,
            _rpc_frame_write,
            _rpc_frame_read,
        ),
        Family(
            "consumer_offsets",
            CONSUMER_OFFSETS,
            _offsets_record_write,
            _offsets_record_read,
        ),
        Family(
            "quota_usage",
            QUOTA_USAGE,
            lambda rows: _pack(usage_to_wire(rows)),
            _quota_usage_read,
        ),
    ]


def hex_path(family: Family) -> Path:
    return GOLDEN_DIR / f"{family.name}.hex"


def render(family: Family) -> str:
    lines = [f"# {family.name}: sample name, then its encoding in hex (tests/golden/samples.py)"]
    for name, value in family.samples.items():
        lines.append(f"{name} {family.encode(value).hex()}")
    return "\n".join(lines) + "\n"


def read_hex(path: Path) -> dict[str, bytes]:
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, data = line.split(" ", 1)
            out[name] = bytes.fromhex(data)
    return out


if __name__ == "__main__":
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    for fam in families():
        hex_path(fam).write_text(render(fam))


# ---------------------------------------------------------------- a metadata log on disk
METADATA_CLUSTER_ID = "golden-cluster"
METADATA_NOW_MS = 1_700_000_000_000
# (epoch, records) of each Raft entry, in log order: a bootstrap, a topic, a broker's life.
METADATA_ENTRIES: list[tuple[int, list[r.Record]]] = [
    (1, [r.LeaderChange(1, 1)]),
    (1, [r.FeatureLevel("metadata.version", 1)]),
    (
        1,
        [
            r.RegisterBroker(1, INCARNATION, 2, "localhost", 9092, "127.0.0.1", 19092),
            r.UnfenceBroker(1, 2),
        ],
    ),
    (
        1,
        [
            r.Topic("orders", T1),
            r.Partition(T1, 0, (1,), (1,), 1),
            r.Partition(T1, 1, (1,), (1,), 1),
        ],
    ),
    (2, [r.LeaderChange(2, 1)]),
    (2, [r.Config("topic", "orders", "retention.ms", "5000")]),
    (2, [r.ClientQuota((("user", "bob"),), "producer_byte_rate", 1024.0)]),
    (2, [r.PartitionChange(T1, 1, leader=-1, isr=())]),
    (2, [r.ProducerIds(1, 2, 1000)]),
    (2, [r.BrokerShutdownBegin(1, 2), r.FenceBroker(1, 2)]),
]
# The snapshot covers the entries below this offset.
METADATA_SNAPSHOT_END_OFFSET = 6
METADATA_DIR = GOLDEN_DIR / "metadata"


def metadata_image_at(end_offset: int) -> Any:
    """The image after applying the entries below end_offset."""
    from raftlog.metadata.image import MetadataImage

    image = MetadataImage.empty(METADATA_CLUSTER_ID)
    for offset, (epoch, records) in enumerate(METADATA_ENTRIES[:end_offset]):
        image, _ = image.apply(records, offset, epoch)
    return image


def write_metadata_dir(data_dir: Path) -> None:
    """A node's metadata directory as the code of today writes it: log, then a snapshot."""
    from raftlog.metadata.raft.log_store import MetadataLogStore
    from raftlog.metadata.raft.types import Snapshot
    from raftlog.metadata.records import encode_entry
    from raftlog.metadata.snapshot import encode_snapshot

    store = MetadataLogStore(data_dir, now_ms=METADATA_NOW_MS)
    try:
        store.append(
            [
                rm.Entry(offset, epoch, encode_entry(records))
                for offset, (epoch, records) in enumerate(METADATA_ENTRIES)
            ],
            METADATA_NOW_MS,
        )
        end = METADATA_SNAPSHOT_END_OFFSET
        image = metadata_image_at(end)
        store.save_snapshot(Snapshot(end, METADATA_ENTRIES[end - 1][0], encode_snapshot(image)))
    finally:
        store.close()


if __name__ == "__main__":
    import shutil

    shutil.rmtree(METADATA_DIR, ignore_errors=True)
    write_metadata_dir(METADATA_DIR)
