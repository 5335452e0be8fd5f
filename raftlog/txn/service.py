"""TxnService: the seam between the Kafka protocol handlers and the node's transaction
coordinators.

The handlers (raftlog/net/kafka/handlers_txn.py) translate kio's requests into
raftlog.txn.messages and ask a TxnService; the node's implementation routes each
transactional id to the coordinator of its `__transaction_state` partition (this node's, when
it leads that partition, else NOT_COORDINATOR so the client looks the coordinator up again).

Topic checks that need the cluster's metadata (unknown topics, authorization) are the
handler's: the service is asked only about partitions that passed them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from raftlog.errors import ErrorCode
from raftlog.groups.service import CoordinatorLocation
from raftlog.txn.messages import (
    AddOffsetsToTxnRequest,
    AddPartitionsTxn,
    AddPartitionsTxnResult,
    DescribedTransaction,
    EndTxnRequest,
    EndTxnResult,
    InitProducerIdRequest,
    InitProducerIdResult,
    ListTransactionsResult,
)


class TxnService(Protocol):
    """What the node provides to the transaction protocol handlers."""

    async def coordinator_for(self, transactional_id: str) -> CoordinatorLocation:
        """The broker coordinating `transactional_id` (its advertised client endpoint): the
        leader of `__transaction_state` partition partition_for_transactional_id(...), or
        COORDINATOR_NOT_AVAILABLE while that partition has no leader or the topic does not
        exist yet (created on first use: start it, answer, the client retries)."""
        ...

    async def init_producer_id(self, request: InitProducerIdRequest) -> InitProducerIdResult:
        """InitProducerId with a transactional id (KIP-98 fencing, KIP-360 recovery)."""
        ...

    async def add_partitions_to_txn(
        self, transactions: Sequence[AddPartitionsTxn]
    ) -> list[AddPartitionsTxnResult]:
        """AddPartitionsToTxn: one transaction (v3 and older) or a batch (v4+), results in
        request order."""
        ...

    async def add_offsets_to_txn(self, request: AddOffsetsToTxnRequest) -> ErrorCode:
        """AddOffsetsToTxn: the group's `__consumer_offsets` partition joins the transaction."""
        ...

    async def add_offsets_for_commit(self, request: AddOffsetsToTxnRequest) -> ErrorCode:
        """KIP-890 part 2: a TxnOffsetCommit v5 (no AddOffsetsToTxn before it) adds the
        group's `__consumer_offsets` partition to the transaction, asked of the id's
        coordinator wherever it runs (the group's coordinator need not be on its node)."""
        ...

    async def end_txn(self, request: EndTxnRequest) -> EndTxnResult:
        """EndTxn: answered once PrepareCommit/PrepareAbort is replicated; the markers
        follow."""
        ...

    async def describe_transactions(
        self, transactional_ids: Sequence[str]
    ) -> list[DescribedTransaction]:
        """DescribeTransactions for ids this node coordinates (NOT_COORDINATOR for others)."""
        ...

    async def list_transactions(
        self,
        state_filters: Iterable[str],
        producer_id_filters: Iterable[int],
        duration_filter_ms: int,
    ) -> ListTransactionsResult:
        """ListTransactions over the `__transaction_state` partitions this node leads."""
        ...
