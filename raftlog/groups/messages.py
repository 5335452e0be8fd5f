"""Version-neutral requests and responses of the group coordinator.

The Kafka server decodes each API version with kio and maps it onto these; the coordinator
never sees wire versions. Fields that older versions lack have Kafka's defaults here (e.g. a
v0 LeaveGroup becomes one member, a v0 JoinGroup has rebalance_timeout_ms = session timeout).
Error codes are raftlog.errors.ErrorCode values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raftlog.errors import ErrorCode

UNKNOWN_MEMBER_ID = ""  # what a client sends before the coordinator gave it an id
NO_GENERATION = -1


@dataclass(frozen=True)
class JoinGroupRequest:
    group_id: str
    member_id: str
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata) in the member's preference order
    session_timeout_ms: int
    rebalance_timeout_ms: int
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    # KIP-394: JoinGroup v4+ must first get a member id (MEMBER_ID_REQUIRED), then rejoin.
    require_known_member_id: bool = True
    # JoinGroup v9+ (KIP-814): a restarted static leader may be told to skip the assignor.
    supports_skip_assignment: bool = False


@dataclass(frozen=True)
class JoinGroupMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True)
class JoinGroupResponse:
    error_code: ErrorCode
    member_id: str
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[JoinGroupMember, ...] = ()  # only the leader gets the member list
    # v9+: the leader of a Stable group, rejoined as a restarted static member, must not
    # run its assignor (the group keeps its assignment).
    skip_assignment: bool = False


@dataclass(frozen=True)
class SyncGroupRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    protocol_type: str | None = None  # v5+; None means "not sent"
    protocol_name: str | None = None
    assignments: tuple[tuple[str, bytes], ...] = ()  # (member_id, assignment), leader only


@dataclass(frozen=True)
class SyncGroupResponse:
    error_code: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True)
class HeartbeatRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True)
class HeartbeatResponse:
    error_code: ErrorCode


@dataclass(frozen=True)
class LeaveMember:
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True)
class LeaveGroupRequest:
    group_id: str
    members: tuple[LeaveMember, ...]


@dataclass(frozen=True)
class LeaveMemberResult:
    member_id: str
    group_instance_id: str | None
    error_code: ErrorCode


@dataclass(frozen=True)
class LeaveGroupResponse:
    # v0-2 carry only the top-level code: the server should send the first member's error
    # there when the top level is NONE.
    error_code: ErrorCode
    members: tuple[LeaveMemberResult, ...] = ()


@dataclass(frozen=True)
class OffsetCommitPartition:
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None


@dataclass(frozen=True)
class OffsetCommitTopic:
    name: str
    partitions: tuple[OffsetCommitPartition, ...]


@dataclass(frozen=True)
class OffsetCommitRequest:
    group_id: str
    topics: tuple[OffsetCommitTopic, ...]
    generation_id: int = NO_GENERATION  # -1 with member "" = a standalone (non-group) commit
    member_id: str = UNKNOWN_MEMBER_ID
    group_instance_id: str | None = None


@dataclass(frozen=True)
class TxnOffsetCommitRequest:
    """Offsets committed inside `producer_id`'s transaction (KIP-98); v3+ (KIP-447) carry the
    consumer's generation, member id and instance id so a zombie member is fenced."""

    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int
    topics: tuple[OffsetCommitTopic, ...]
    generation_id: int = NO_GENERATION
    member_id: str = UNKNOWN_MEMBER_ID
    group_instance_id: str | None = None


@dataclass(frozen=True)
class PartitionError:
    partition: int
    error_code: ErrorCode


@dataclass(frozen=True)
class TopicErrors:
    name: str
    partitions: tuple[PartitionError, ...]


@dataclass(frozen=True)
class OffsetCommitResponse:
    topics: tuple[TopicErrors, ...]


@dataclass(frozen=True)
class OffsetDeleteRequest:
    """OffsetDelete (KIP-496): forget the group's committed offsets of these partitions."""

    group_id: str
    topics: tuple[OffsetFetchTopic, ...]


@dataclass(frozen=True)
class OffsetDeleteResponse:
    error_code: ErrorCode  # the group's; partitions are answered only when it is none
    topics: tuple[TopicErrors, ...] = ()


@dataclass(frozen=True)
class OffsetFetchTopic:
    name: str
    partitions: tuple[int, ...]


@dataclass(frozen=True)
class OffsetFetchRequest:
    group_id: str
    topics: tuple[OffsetFetchTopic, ...] | None = None  # None = every committed partition
    require_stable: bool = False


@dataclass(frozen=True)
class FetchedOffset:
    partition: int
    offset: int  # -1 when nothing is committed
    leader_epoch: int = -1
    metadata: str = ""
    error_code: ErrorCode = ErrorCode.none


@dataclass(frozen=True)
class FetchedTopic:
    name: str
    partitions: tuple[FetchedOffset, ...]


@dataclass(frozen=True)
class OffsetFetchResponse:
    error_code: ErrorCode
    topics: tuple[FetchedTopic, ...] = ()


@dataclass(frozen=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class DescribedGroup:
    group_id: str
    error_code: ErrorCode
    state: str  # Kafka's state names: "Empty", "Stable", ..., "Dead" for an unknown group
    protocol_type: str = ""
    protocol_data: str = ""  # the selected protocol, only while Stable (as Kafka)
    members: tuple[DescribedMember, ...] = ()
    # A KIP-848 group's topics its members' metadata and assignments name (the server
    # resolved them, so the handler checks DESCRIBE on each); empty for a classic group.
    topics: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"  # "consumer" for a KIP-848 group


@dataclass(frozen=True)
class ListGroupsResponse:
    error_code: ErrorCode
    groups: tuple[ListedGroup, ...] = field(default=())


@dataclass(frozen=True)
class DeleteGroupResult:
    group_id: str
    error_code: ErrorCode


# ---------------------------------------------------------------- KIP-848 consumer protocol
TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class ConsumerHeartbeatRequest:
    """ConsumerGroupHeartbeat with topics by name (the handler maps topic ids). None in a
    field means "unchanged since the last heartbeat", as on the wire."""

    group_id: str
    member_id: str
    member_epoch: int  # 0 join, -1 leave, -2 static member leaving for a while
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    server_assignor: str | None = None
    owned: frozenset[TopicPartition] | None = None
    client_id: str = ""
    client_host: str = ""
    # KIP-848's regex subscription (RE2 syntax, checked at decode); "" drops the member's.
    subscribed_topic_regex: str | None = None


@dataclass(frozen=True)
class ConsumerHeartbeatResponse:
    error_code: ErrorCode
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: frozenset[TopicPartition] | None = None  # None: unchanged
    error_message: str | None = None


@dataclass(frozen=True)
class DescribedConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    assignment: frozenset[TopicPartition]
    target_assignment: frozenset[TopicPartition]
    subscribed_topic_regex: str | None = None


@dataclass(frozen=True)
class DescribedConsumerGroup:
    group_id: str
    error_code: ErrorCode
    state: str = ""  # Kafka's names: Empty, Assigning, Reconciling, Stable, Dead
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: tuple[DescribedConsumerMember, ...] = ()
