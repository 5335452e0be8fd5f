"""raftlog's own async (trio) Kafka client: connection, cluster metadata, admin, produce, fetch.

async with open_cluster("127.0.0.1:9092") as cluster:
    admin = Admin(cluster)
    await admin.create_topics([NewTopic("events", num_partitions=3)])
    await Producer(cluster).produce("events", [Record(value=b"hi")], partition=0)
    records = await Consumer(cluster).fetch_range("events", 0, 0)

A consumer-group member: `async with open_group_consumer(cluster, "group", ["events"])`
(raftlog.client.group_consumer; the protocol itself is raftlog.client.group_member).

Rules of this package: the client speaks only the Kafka protocol (through kio) to any
Kafka-compatible broker; it imports no server-side module beyond shared vocabulary.
"""

from raftlog.client.admin import (
    Admin,
    ClusterDescription,
    ConfigOp,
    ListedOffset,
    QuotaMatch,
    ResourceType,
    TopicResult,
)
from raftlog.client.admin_security import (
    AclDeletion,
    AclResult,
    DeletedAcl,
    ScramDeletion,
    ScramUpsertion,
    UserResult,
    UserScramCredentials,
)
from raftlog.client.admin_txn import (
    AbortTransactionSpec,
    PartitionProducers,
    ProducerState,
    TransactionAdmin,
    TransactionDescription,
    TransactionListing,
)
from raftlog.client.auth import AuthenticationFailed, TlsHandshakeFailed
from raftlog.client.cluster import (
    Cluster,
    ClusterLimits,
    PartitionInfo,
    TopicInfo,
    open_cluster,
)
from raftlog.client.connection import (
    BrokerConnection,
    ConnectionClosed,
    ConnectionLimits,
    RequestTimeout,
    UnsupportedVersion,
    open_connection,
)
from raftlog.client.consumer import AbortedTxn, Consumer, FetchResult
from raftlog.client.group_consumer import (
    ConsumedRecord,
    GroupConsumer,
    GroupConsumerConfig,
    open_group_consumer,
)
from raftlog.client.group_member import GroupMember
from raftlog.client.member_state import GroupMemberError, MemberConfig
from raftlog.client.producer import Producer, ProduceResult, murmur2, partition_for_key
from raftlog.client.properties import (
    ClientProperties,
    ClientPropertiesError,
    ClientSecurity,
    SecurityProtocol,
    load_client_properties,
    parse_client_properties,
)
from raftlog.client.protocol import IsolationLevel
from raftlog.client.quorum import QuorumAdmin, QuorumDescription
from raftlog.client.transactional import (
    ProducerFenced,
    TransactionalProducer,
    TransactionHandle,
    committed_offset,
    end_transaction,
)
from raftlog.constants import ACKS_ALL, ACKS_LEADER, ACKS_NONE
from raftlog.metadata.controller.messages import NewTopic

__all__ = [
    "ACKS_ALL",
    "ACKS_LEADER",
    "ACKS_NONE",
    "AbortTransactionSpec",
    "AbortedTxn",
    "AclDeletion",
    "AclResult",
    "Admin",
    "AuthenticationFailed",
    "BrokerConnection",
    "ClientProperties",
    "ClientPropertiesError",
    "ClientSecurity",
    "Cluster",
    "ClusterDescription",
    "ClusterLimits",
    "ConfigOp",
    "ConnectionClosed",
    "ConnectionLimits",
    "ConsumedRecord",
    "Consumer",
    "DeletedAcl",
    "FetchResult",
    "GroupConsumer",
    "GroupConsumerConfig",
    "GroupMember",
    "GroupMemberError",
    "IsolationLevel",
    "ListedOffset",
    "MemberConfig",
    "NewTopic",
    "PartitionInfo",
    "PartitionProducers",
    "ProduceResult",
    "Producer",
    "ProducerFenced",
    "ProducerState",
    "QuorumAdmin",
    "QuorumDescription",
    "QuotaMatch",
    "RequestTimeout",
    "ResourceType",
    "ScramDeletion",
    "ScramUpsertion",
    "SecurityProtocol",
    "TlsHandshakeFailed",
    "TopicInfo",
    "TopicResult",
    "TransactionAdmin",
    "TransactionDescription",
    "TransactionHandle",
    "TransactionListing",
    "TransactionalProducer",
    "UnsupportedVersion",
    "UserResult",
    "UserScramCredentials",
    "committed_offset",
    "end_transaction",
    "load_client_properties",
    "murmur2",
    "open_cluster",
    "open_connection",
    "open_group_consumer",
    "parse_client_properties",
    "partition_for_key",
]
