"""TxnService on a real node: the transaction coordinator lives where `__transaction_state`
leads.

The coordinator of a transactional id is the leader of its `__transaction_state` partition.
Transitions are appended to that partition with acks=all through the ReplicaManager, so they
survive a failover: the next leader replays the partition before serving, with its own leader
epoch as the coordinator epoch. Leadership comes from the metadata image, as for groups
(groups/node_service.py); the topic is created on the first FindCoordinator for a
transactional id.

Markers go to each partition's leader: this node's own partitions through
ReplicaManager.write_txn_markers, others through the internal RPC "txn.markers", whose
handler on the leader does the same. After a marker lands on a `__consumer_offsets`
partition, the leader tells its group coordinator (`complete_transaction`), which makes the
transaction's offset commits visible or drops them.

KIP-890 part 1: the produce path asks `verify` before a transactional batch opens a
transaction on a partition; this node's coordinator answers directly, another node's through
the internal RPC "txn.verify".

This module is node glue (the import graph's layer 5, like groups/node_service.py): it
drives the replication and controller layers; the rest of raftlog.txn stays below them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import trio

from raftlog.clock import wall_clock_ms
from raftlog.codec import DecodeError
from raftlog.concurrency import run_all
from raftlog.config import NodeConfig
from raftlog.constants import NO_LEADER
from raftlog.errors import ErrorCode, KafkaError
from raftlog.groups.hashing import partition_for_group
from raftlog.groups.service import CoordinatorLocation
from raftlog.groups.settings import OFFSETS_TOPIC
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.controller.broker_lifecycle import BrokerLifecycle, ControllerClient
from raftlog.metadata.image import MetadataDelta, MetadataImage
from raftlog.metadata.service import MetadataService
from raftlog.net.limits import RateLimitedLog
from raftlog.net.rpc import PeerSet, RpcError
from raftlog.records import BatchHeader, build_batch, iter_records
from raftlog.records import Record as KafkaRecord
from raftlog.replication.internal_topics import (
    coordinator_location,
    create_internal_topic,
    read_partition,
    wait_committed,
)
from raftlog.replication.manager import ReplicaManager
from raftlog.replication.txn_markers import TxnMarkerRequest
from raftlog.txn import rpc_bodies as wire
from raftlog.txn.effects import WriteMarkers
from raftlog.txn.log_format import (
    NO_MARKER_TOPICS,
    TRANSACTION_STATE_TOPIC,
    Record,
    TopicPartition,
)
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
from raftlog.txn.settings import TxnConfig, partition_for_transactional_id
from raftlog.txn.shell import TxnCoordinatorShell

log = logging.getLogger("raftlog.txn")
# A peer that sends bad bodies in a loop gets one line per interval.
_bad_requests = RateLimitedLog(log)

# How long a transition may wait for acks=all before its caller is told to retry.
TXN_STATE_APPEND_TIMEOUT_MS = 10_000
# A remote verification waits at most this long (the produce then fails retriably).
VERIFY_RPC_TIMEOUT_S = 10.0
# A KIP-890 part 2 add: a record append (acks=all) plus up to the shell's wait for the
# producer's previous transaction to complete.
ADD_RPC_TIMEOUT_S = 30.0
# On top of the leader's own wait for acks=all (request_timeout_ms) before a marker call to
# another broker is given up and retried.
MARKER_RPC_SLACK_S = 5.0

# complete_transaction(offsets partition, producer id, committed): the group coordinator's
# hook once a marker is on that `__consumer_offsets` partition.
CompleteTransaction = Callable[[int, int, bool], Awaitable[Any]]

# Verification answers a Produce response may not carry, mapped as Kafka 3.6+ does
# (ReplicaManager's verification callback and AddPartitionsToTxnManager): a producer treats
# NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE / COORDINATOR_LOAD_IN_PROGRESS /
# CONCURRENT_TRANSACTIONS on a Produce as fatal or unknown, so the broker answers
# NOT_ENOUGH_REPLICAS, which every producer retries (the batch is unchanged, the coordinator
# is looked up or loaded meanwhile). PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH, the
# fencing error Produce has always had. INVALID_TXN_STATE (the partition is not in the
# transaction) and the rest pass through.
_VERIFY_ERRORS_FOR_PRODUCE = {
    ErrorCode.not_coordinator: ErrorCode.not_enough_replicas,
    ErrorCode.coordinator_not_available: ErrorCode.not_enough_replicas,
    ErrorCode.coordinator_load_in_progress: ErrorCode.not_enough_replicas,
    ErrorCode.concurrent_transactions: ErrorCode.not_enough_replicas,
    ErrorCode.producer_fenced: ErrorCode.invalid_producer_epoch,
}


class NotABrokerError(KafkaError):
    """An internal transaction call from a node the metadata does not know as a broker."""


class NotACoordinatorError(KafkaError):
    """Markers from a broker that is not, in this node's metadata image, the transaction
    coordinator at the markers' coordinator epoch."""


class NodeTxnService:
    """Implements raftlog.txn.service.TxnService for one broker, plus KIP-890's `verify`."""

    def __init__(
        self,
        config: NodeConfig,
        metadata: MetadataService,
        controller: ControllerClient,
        lifecycle: BrokerLifecycle,
        replicas: ReplicaManager,
        peers: PeerSet,
        *,
        txn_config: TxnConfig | None = None,
        complete_transaction: CompleteTransaction | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.metadata = metadata
        self.controller = controller
        self.lifecycle = lifecycle
        self.replicas = replicas
        self.peers = peers
        self.complete_transaction = complete_transaction
        txn_config = txn_config or TxnConfig(
            transaction_state_log_num_partitions=config.transaction_state_log_num_partitions,
            offsets_topic_num_partitions=config.offsets_topic_num_partitions,
            transaction_max_timeout_ms=config.transaction_max_timeout_ms,
        )
        self.shell = TxnCoordinatorShell(
            txn_config,
            self._append,
            self._read_all,
            self.write_markers,
            self._allocate_producer_ids,
            clock_ms=clock_ms,
        )
        self._creating = False
        self._nursery: trio.Nursery | None = None

    @property
    def txn_config(self) -> TxnConfig:
        return self.shell.config

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.shell.run)
            task_status.started()

    def register_rpc(self, node_methods: dict[str, Any]) -> None:
        """The two internal methods, as handler(sender node id, body)."""
        node_methods[wire.TXN_MARKERS_METHOD] = self.handle_markers
        node_methods[wire.TXN_VERIFY_METHOD] = self.handle_verify

    # ---------------------------------------------------------------- FindCoordinator
    async def coordinator_for(self, transactional_id: str) -> CoordinatorLocation:
        location = coordinator_location(
            self.metadata.image,
            TRANSACTION_STATE_TOPIC,
            lambda count: partition_for_transactional_id(transactional_id, count),
        )
        if location is None:
            self._create_topic()
            return CoordinatorLocation(ErrorCode.coordinator_not_available)
        return location

    def _create_topic(self) -> None:
        if self._creating or self._nursery is None:
            return
        self._creating = True
        self._nursery.start_soon(self._create_topic_task)

    async def _create_topic_task(self) -> None:
        try:
            await create_internal_topic(
                self.controller.call,
                self.metadata.image,
                TRANSACTION_STATE_TOPIC,
                self.txn_config.transaction_state_log_num_partitions,
                self.config.transaction_state_log_replication_factor,
                self.config.transaction_state_log_min_isr,
            )
        finally:
            self._creating = False

    # ---------------------------------------------------------------- leadership
    def on_metadata(self, image: MetadataImage, delta: MetadataDelta) -> None:
        """Follow leadership of the `__transaction_state` partitions (called after the
        ReplicaManager's listener, so a partition led here is already hosted as leader)."""
        topic = image.topic(TRANSACTION_STATE_TOPIC)
        led: dict[int, int] = {}
        if topic is not None:
            count = len(topic.partitions)
            if count != self.txn_config.transaction_state_log_num_partitions:
                if self.shell.partitions:
                    log.error("%s changed to %d partitions", TRANSACTION_STATE_TOPIC, count)
                    return
                # As Kafka: the topic's partition count routes transactional ids, whatever
                # this node's configuration says.
                self.shell.config = replace(
                    self.txn_config, transaction_state_log_num_partitions=count
                )
            led = {
                partition: state.leader_epoch
                for partition, state in topic.partitions.items()
                if state.leader == self.node_id
            }
        for partition, epoch in sorted(self.shell.partitions.items()):
            if led.get(partition) != epoch:
                self.shell.resign(partition)
        for partition, epoch in sorted(led.items()):
            self.shell.become_coordinator(partition, epoch)

    # ---------------------------------------------------------------- TxnService
    async def init_producer_id(self, request: InitProducerIdRequest) -> InitProducerIdResult:
        return await self.shell.init_producer_id(request)

    async def add_partitions_to_txn(
        self, transactions: Sequence[AddPartitionsTxn]
    ) -> list[AddPartitionsTxnResult]:
        return await self.shell.add_partitions_to_txn(transactions)

    async def add_offsets_to_txn(self, request: AddOffsetsToTxnRequest) -> ErrorCode:
        return await self.shell.add_offsets_to_txn(request)

    async def end_txn(self, request: EndTxnRequest) -> EndTxnResult:
        return await self.shell.end_txn(request)

    async def describe_transactions(
        self, transactional_ids: Sequence[str]
    ) -> list[DescribedTransaction]:
        return await self.shell.describe_transactions(transactional_ids)

    async def list_transactions(
        self,
        state_filters: Iterable[str],
        producer_id_filters: Iterable[int],
        duration_filter_ms: int,
    ) -> ListTransactionsResult:
        return await self.shell.list_transactions(
            state_filters, producer_id_filters, duration_filter_ms
        )

    # ---------------------------------------------------------------- KIP-890 part 1
    async def verify(self, request: Any) -> ErrorCode:
        """ProducePath.verify_transaction: `request` is a replication.produce.TxnProduce.
        Its `add_partition` (a Produce v12+ batch, KIP-890 part 2) asks the coordinator to
        add the partition to the transaction rather than only check it is there; the answer
        then comes once the coordinator's Ongoing record is replicated."""
        transactional_id: str | None = request.transactional_id
        if not transactional_id:
            # A transactional batch whose request names no transactional id cannot be
            # checked against any coordinator: it cannot open a transaction.
            return ErrorCode.invalid_txn_state
        mode = wire.ADD_PARTITION if getattr(request, "add_partition", False) else wire.VERIFY_ONLY
        args = (
            transactional_id,
            request.producer_id,
            request.producer_epoch,
            request.topic,
            request.partition,
        )
        leader = self._txn_state_leader(transactional_id)
        if leader is None:
            code = ErrorCode.coordinator_not_available
        elif leader == self.node_id:
            code = await self._ask_local(mode, *args)
        else:
            code = await self._verify_remotely(leader, args, mode)
        return _VERIFY_ERRORS_FOR_PRODUCE.get(code, code)

    async def add_offsets_for_commit(self, request: AddOffsetsToTxnRequest) -> ErrorCode:
        """TxnService.add_offsets_for_commit: the coordinator's own code (the caller maps it
        for its client)."""
        partitions = self.txn_config.offsets_topic_num_partitions
        partition = partition_for_group(request.group_id, partitions)
        args = (
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            OFFSETS_TOPIC,
            partition,
        )
        leader = self._txn_state_leader(request.transactional_id)
        if leader is None:
            return ErrorCode.coordinator_not_available
        if leader == self.node_id:
            return await self._ask_local(wire.ADD_PARTITION, *args)
        return await self._verify_remotely(leader, args, wire.ADD_PARTITION)

    async def _ask_local(
        self,
        mode: int,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> ErrorCode:
        if mode == wire.ADD_PARTITION:
            return await self.shell.add_partition_for_produce(
                transactional_id, producer_id, producer_epoch, topic, partition
            )
        return self.shell.verify(transactional_id, producer_id, producer_epoch, topic, partition)

    def _txn_state_leader(self, transactional_id: str) -> int | None:
        image: MetadataImage = self.metadata.image
        topic = image.topic(TRANSACTION_STATE_TOPIC)
        if topic is None:
            return None
        partition = partition_for_transactional_id(transactional_id, len(topic.partitions))
        state = topic.partitions.get(partition)
        if state is None or state.leader == NO_LEADER:
            return None
        return state.leader

    async def _verify_remotely(
        self, leader: int, args: tuple[str, int, int, str, int], mode: int = wire.VERIFY_ONLY
    ) -> ErrorCode:
        try:
            body = wire.verify_request(*args, mode=mode)
        except DecodeError:
            return ErrorCode.invalid_request  # a value no peer would accept
        # An add waits for an acks=all append, and for the end of the producer's previous
        # transaction (CONCURRENT_TRANSACTIONS, retried by the coordinator's shell).
        timeout_s = VERIFY_RPC_TIMEOUT_S if mode == wire.VERIFY_ONLY else ADD_RPC_TIMEOUT_S
        try:
            answer = await self._peer(leader).call(
                wire.TXN_VERIFY_METHOD, body, timeout_s=timeout_s
            )
            return wire.decode_verify_response(answer)
        except (RpcError, KafkaError, DecodeError) as exc:
            log.info("verifying with the coordinator on node %d failed: %s", leader, exc)
            return ErrorCode.coordinator_not_available

    async def handle_verify(self, sender_id: int, body: Any) -> Any:
        """The coordinator's side of "txn.verify"; answers the coordinator's own code (the
        asking leader maps it for its producer). A body out of range is answered
        INVALID_REQUEST, with one rate-limited line that names the sender, not the values."""
        self._check_broker(sender_id)
        try:
            request = wire.decode_verify_request(body)
        except DecodeError as exc:
            _bad_requests.warning("txn.verify from node %d refused: %s", sender_id, exc)
            return wire.verify_response(ErrorCode.invalid_request)
        code = await self._ask_local(
            request.mode,
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            request.topic,
            request.partition,
        )
        return wire.verify_response(code)

    # ---------------------------------------------------------------- markers
    async def write_markers(self, send: WriteMarkers) -> dict[TopicPartition, ErrorCode]:
        """One transaction's markers, each partition through its leader; one code each."""
        image: MetadataImage = self.metadata.image
        results: dict[TopicPartition, ErrorCode] = {}
        by_leader: dict[int, list[TopicPartition]] = {}
        for key in send.partitions:
            topic = image.topic(key[0])
            state = None if topic is None else topic.partitions.get(key[1])
            if state is None:
                # As Kafka: the partition was deleted, nothing on it waits for a marker.
                log.info("no marker for deleted %s-%d", *key)
                results[key] = ErrorCode.none
            elif state.leader == NO_LEADER:
                results[key] = ErrorCode.not_leader_or_follower  # retried after the backoff
            else:
                by_leader.setdefault(state.leader, []).append(key)

        async def deliver(leader: int, partitions: tuple[TopicPartition, ...]) -> None:
            marker = (
                send.producer_id,
                send.producer_epoch,
                send.coordinator_epoch,
                send.commit,
                partitions,
            )
            if leader == self.node_id:
                results.update(await self.write_local_markers(*marker))
            else:
                results.update(await self._write_remote_markers(leader, marker))

        await run_all(deliver, [(leader, tuple(ps)) for leader, ps in by_leader.items()])
        return results

    async def write_local_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        partitions: tuple[TopicPartition, ...],
    ) -> dict[TopicPartition, ErrorCode]:
        """Write one marker on partitions this node leads, then tell the group coordinator
        about the `__consumer_offsets` partitions among them. Partitions of NO_MARKER_TOPICS
        get INVALID_TOPIC_EXCEPTION and nothing is written on them (their loaders read no
        control batch; a coordinator never adds them to a transaction)."""
        refused = {
            key: ErrorCode.invalid_topic_exception
            for key in partitions
            if key[0] in NO_MARKER_TOPICS
        }
        if refused:
            log.warning(
                "no marker of producer %d on %s: not a data partition",
                producer_id,
                ", ".join(f"{topic}-{partition}" for topic, partition in refused),
            )
            partitions = tuple(key for key in partitions if key not in refused)
            if not partitions:
                return refused
        request = TxnMarkerRequest(
            producer_id, producer_epoch, coordinator_epoch, commit, partitions
        )
        [results] = await self.replicas.write_txn_markers([request])
        results = {**dict(results), **refused}
        if self.complete_transaction is not None:
            for (topic, partition), code in list(results.items()):
                if topic != OFFSETS_TOPIC or code != ErrorCode.none:
                    continue
                try:
                    await self.complete_transaction(partition, producer_id, commit)
                except Exception as exc:
                    # The marker is written; the coordinator sends it again (a duplicate is
                    # answered without a second append) and the group coordinator is asked
                    # again, so it must treat a second call as done.
                    log.warning(
                        "completing the transaction of producer %d on %s-%d failed: %s",
                        producer_id,
                        topic,
                        partition,
                        exc,
                    )
                    results[(topic, partition)] = (
                        exc.code if isinstance(exc, KafkaError) else ErrorCode.request_timed_out
                    )
        return results

    async def _write_remote_markers(
        self, leader: int, marker: tuple[int, int, int, bool, tuple[TopicPartition, ...]]
    ) -> dict[TopicPartition, ErrorCode]:
        partitions = marker[4]
        timeout_s = self.config.request_timeout_ms / 1000 + MARKER_RPC_SLACK_S
        try:
            answer = await self._peer(leader).call(
                wire.TXN_MARKERS_METHOD, wire.markers_request(*marker), timeout_s=timeout_s
            )
            answered = wire.decode_markers_response(answer)
        except (RpcError, KafkaError, DecodeError) as exc:
            log.info("markers to node %d failed, to be retried: %s", leader, exc)
            return {key: ErrorCode.request_timed_out for key in partitions}
        # Only what was asked: a partition left out counts as failed (the core retries it).
        return {key: answered[key] for key in partitions if key in answered}

    async def handle_markers(self, sender_id: int, body: Any) -> Any:
        """The partition leader's side of "txn.markers": only from the coordinator whose
        marker it is (see _check_coordinator)."""
        self._check_broker(sender_id)
        request = wire.decode_markers_request(body)
        self._check_coordinator(sender_id, request.coordinator_epoch)
        results = await self.write_local_markers(
            request.producer_id,
            request.producer_epoch,
            request.coordinator_epoch,
            request.commit,
            request.topic_partitions,
        )
        return wire.markers_response(results)

    # ---------------------------------------------------------------- plumbing
    def _check_broker(self, sender_id: int) -> None:
        # Only a broker coordinates transactions; a controller-only node or an unknown
        # peer has no business writing markers or asking about producers.
        image: MetadataImage = self.metadata.image
        if sender_id not in image.brokers:
            raise NotABrokerError(ErrorCode.cluster_authorization_failed, f"node {sender_id}")

    def _check_coordinator(self, sender_id: int, coordinator_epoch: int) -> None:
        """A marker's coordinator epoch is the leader epoch of its coordinator's
        `__transaction_state` partition: the sender must lead one at that epoch in this
        node's image. Else any broker could end any producer's transaction, and with a high
        epoch fence the real coordinator's markers for good. A coordinator that this image
        does not know yet (or no longer) is refused too; it retries after its backoff."""
        image: MetadataImage = self.metadata.image
        topic = image.topic(TRANSACTION_STATE_TOPIC)
        if topic is not None and any(
            state.leader == sender_id and state.leader_epoch == coordinator_epoch
            for state in topic.partitions.values()
        ):
            return
        raise NotACoordinatorError(
            ErrorCode.cluster_authorization_failed,
            f"node {sender_id} leads no {TRANSACTION_STATE_TOPIC} partition at epoch "
            f"{coordinator_epoch}",
        )

    def _peer(self, node_id: int) -> Any:
        image: MetadataImage = self.metadata.image
        registration = image.brokers.get(node_id)
        if registration is None:
            raise KafkaError(ErrorCode.broker_not_available, f"unknown broker {node_id}")
        # A voter is reached at its controller_quorum_voters address, as every other
        # internal caller reaches it (one PeerClient per node, re-created when the address
        # a caller names differs).
        address = self.config.voters.get(node_id) or registration.internal_endpoint
        return self.peers.peer(node_id, *address)

    async def _allocate_producer_ids(self) -> range:
        reply = await self.controller.call(
            cm.AllocateProducerIds(self.node_id, self.lifecycle.broker_epoch)
        )
        if reply.error_code != ErrorCode.none:
            raise KafkaError(reply.error_code, reply.error_message or "AllocateProducerIds")
        start = reply.producer_id_start
        return range(start, start + reply.producer_id_len)

    async def _append(self, partition: int, records: list[Record]) -> None:
        batch = build_batch([KafkaRecord(key=key, value=value) for key, value in records])
        result = await self.replicas.writes.produce(
            TRANSACTION_STATE_TOPIC, partition, batch, -1, TXN_STATE_APPEND_TIMEOUT_MS
        )
        if result.error != ErrorCode.none:
            raise KafkaError(result.error, result.error_message or "transaction state append")

    async def _read_all(self, partition: int) -> list[Record]:
        """Every (key, value) of the partition, in log order (markers carry none), once the
        HW covers all of it (wait_committed: the coordinator acts on what it loads)."""
        hosted = self.replicas.replicas.partitions.get((TRANSACTION_STATE_TOPIC, partition))
        await wait_committed(hosted)
        return await read_partition(hosted, _state_records)


def _state_records(data: bytes, pos: int, header: BatchHeader) -> list[Record]:
    if header.is_control:
        return []
    return [(r.key, r.value) for r in iter_records(data, pos) if r.key is not None]


async def start_node_txn_service(
    nursery: trio.Nursery,
    config: NodeConfig,
    metadata: MetadataService,
    controller: ControllerClient,
    lifecycle: BrokerLifecycle,
    replicas: ReplicaManager,
    peers: PeerSet,
    rpc_node_methods: dict[str, Any],
    complete_transaction: CompleteTransaction | None = None,
    *,
    txn_config: TxnConfig | None = None,
    clock_ms: Callable[[], int] = wall_clock_ms,
) -> NodeTxnService:
    """The node's wiring in one call: start the service, follow leadership (after the
    replica manager's listener), serve the two internal methods, and verify transactional
    produces (KIP-890) with it."""
    service = NodeTxnService(
        config,
        metadata,
        controller,
        lifecycle,
        replicas,
        peers,
        txn_config=txn_config,
        complete_transaction=complete_transaction,
        clock_ms=clock_ms,
    )
    await nursery.start(service.run)
    metadata.add_listener(service.on_metadata)
    service.register_rpc(rpc_node_methods)
    replicas.writes.verify_transaction = service.verify
    return service
