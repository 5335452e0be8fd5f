"""What the transaction coordinator takes and answers: the fields of Kafka's transaction
requests and responses that the coordinator decides, free of wire versions' layout.

The Kafka handlers translate kio's requests into these and back. Topic and partition checks
that need the cluster's metadata (unknown topics, authorization) are the handler's: the
coordinator is asked only about partitions that passed them.

PRODUCER_FENCED (KIP-588, error 90) is what the coordinator answers a fenced producer; older
request versions do not know it, and `for_version` gives them INVALID_PRODUCER_EPOCH as Kafka
does (InitProducerId < v4, AddPartitionsToTxn / AddOffsetsToTxn / EndTxn < v2).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from raftlog.errors import ErrorCode
from raftlog.txn.log_format import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TV_0, TV_2, TopicPartition


class TxnApi(enum.Enum):
    INIT_PRODUCER_ID = "InitProducerId"
    ADD_PARTITIONS_TO_TXN = "AddPartitionsToTxn"
    ADD_OFFSETS_TO_TXN = "AddOffsetsToTxn"
    END_TXN = "EndTxn"


# The first version of each API whose clients understand PRODUCER_FENCED.
_PRODUCER_FENCED_SINCE = {
    TxnApi.INIT_PRODUCER_ID: 4,
    TxnApi.ADD_PARTITIONS_TO_TXN: 2,
    TxnApi.ADD_OFFSETS_TO_TXN: 2,
    TxnApi.END_TXN: 2,
}


def for_version(code: ErrorCode, api: TxnApi, api_version: int) -> ErrorCode:
    """`code` as a client speaking `api_version` of `api` understands it."""
    if code == ErrorCode.producer_fenced and api_version < _PRODUCER_FENCED_SINCE[api]:
        return ErrorCode.invalid_producer_epoch
    return code


# A request without a version is from the newest client.
LATEST = 2**15 - 1
# The first EndTxn version of KIP-890 part 2 (an epoch bump per end, answered with the new
# producer id and epoch) and the first Produce version whose transactional batches add their
# partition to the transaction (a TV2 client sends no AddPartitionsToTxn for them).
END_TXN_TV2_SINCE = 5
PRODUCE_TV2_SINCE = 12


def end_txn_transaction_version(api_version: int) -> int:
    """The transaction version an EndTxn of `api_version` speaks (Kafka's
    TransactionVersion.transactionVersionForEndTxn)."""
    return TV_2 if api_version >= END_TXN_TV2_SINCE else TV_0


@dataclass(frozen=True)
class InitProducerIdRequest:
    transactional_id: str
    transaction_timeout_ms: int
    # KIP-360 (v3+): the id and epoch the producer holds, -1/-1 for a new producer.
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    api_version: int = LATEST


@dataclass(frozen=True)
class InitProducerIdResult:
    error_code: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True)
class AddPartitionsTxn:
    """One transaction of AddPartitionsToTxn (v3 and older carry exactly one).

    verify_only (v4+, sent broker to broker by KIP-890 verification): answer whether the
    partitions are already in the ongoing transaction, change nothing.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]
    verify_only: bool = False
    api_version: int = LATEST
    # TV2 when a partition leader adds a partition for a Produce v12+ batch (KIP-890 part 2).
    client_transaction_version: int = TV_0


@dataclass(frozen=True)
class AddPartitionsTxnResult:
    transactional_id: str
    errors: dict[TopicPartition, ErrorCode]  # every requested partition, in request order


@dataclass(frozen=True)
class AddOffsetsToTxnRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    api_version: int = LATEST


@dataclass(frozen=True)
class EndTxnRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    # Unlike the other requests, no version means the newest before KIP-890 part 2: the
    # epoch bump of TV2 is only for a client that negotiated it.
    api_version: int = END_TXN_TV2_SINCE - 1


@dataclass(frozen=True)
class EndTxnResult:
    error_code: ErrorCode
    # EndTxn v5+ (TV2): the producer id and epoch for the client's next transaction; only
    # ever set with NONE (an error never tells a caller which epoch is current).
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True)
class DescribedTransaction:
    """One entry of DescribeTransactions."""

    transactional_id: str
    error_code: ErrorCode
    state: str = ""  # Kafka's name: "Ongoing", "PrepareCommit", ...
    transaction_timeout_ms: int = 0
    transaction_start_time_ms: int = -1
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    # Partitions of the transaction; in a Prepare state only those still owed a marker.
    topics: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class ListedTransaction:
    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True)
class ListTransactionsResult:
    error_code: ErrorCode
    transactions: tuple[ListedTransaction, ...] = ()
    unknown_state_filters: tuple[str, ...] = ()
