"""GroupCoordinator: every group request for the offsets partitions this broker leads, sans-IO.

Routing: a group lives on `__consumer_offsets` partition partition_for_group(group_id); the
broker that leads that partition is its coordinator. Becoming leader = begin_load() then
complete_load() with the partition's records (replayed: last value wins, tombstones delete);
losing it = resign(), which answers every parked reply with NOT_COORDINATOR.

Persist before you promise: an offset commit, a leader's assignment and a group deletion are
answered only after their records are appended (acks=all) — the coordinator emits an Append
and finishes the work in on_append_done(). Offsets enter the cache only then, so a fetch
never returns an offset a failed-over coordinator would not also return.

Transactional offset commits (TxnOffsetCommit, KIP-98/KIP-447) are appended in a
transactional batch of the committing producer and kept pending per producer id: they become
committed offsets when the transaction driver reports the COMMIT marker on the partition
(complete_transaction) and are dropped on ABORT. Replay on load does the same with the markers
it meets in the log; offsets whose marker is not in the log yet stay pending. Every committed
offset remembers its position in the partition's append order, so a transaction's offsets never
replace a plain commit written after them (the order of the log, not of the markers).

KIP-848 (consumer protocol) groups are served by the ConsumerProtocol mixin
(consumer_coordinator.py) with the same routing, appends and committed offsets; OffsetDelete
by the OffsetDeletion mixin (offset_delete.py).

Every method takes `now_ms` and returns Effects (replies to deliver by token, appends to
perform); the trio shell (coordinator_shell.py) performs them.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from raftlog.errors import ErrorCode
from raftlog.groups import offsets_format as fmt
from raftlog.groups.consumer_coordinator import ConsumerProtocol, _PendingConsumerStore
from raftlog.groups.consumer_groups import ConsumerGroups
from raftlog.groups.effects import Append, Effects, TxnProducer, map_append_error
from raftlog.groups.group import Group, GroupEffects, GroupState, StoreGroup, Token
from raftlog.groups.group_codec import group_from_value, group_to_value
from raftlog.groups.hashing import partition_for_group
from raftlog.groups.messages import (
    UNKNOWN_MEMBER_ID,
    DeleteGroupResult,
    DescribedGroup,
    FetchedOffset,
    FetchedTopic,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    LeaveMemberResult,
    ListedGroup,
    ListGroupsResponse,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionError,
    SyncGroupRequest,
    SyncGroupResponse,
    TopicErrors,
    TxnOffsetCommitRequest,
)
from raftlog.groups.offset_delete import OffsetDeletion, _PendingOffsetDelete
from raftlog.groups.offsets_format import CommittedOffset, LogEntry, OffsetKey, Record
from raftlog.groups.settings import GroupConfig
from raftlog.groups.txn_offsets import PendingTxnOffsets, validate_txn_commit

log = logging.getLogger(__name__)


@dataclass
class _PendingStore:
    group_id: str
    store: StoreGroup
    epoch: int


@dataclass
class _PendingCommit:
    token: Token
    group_id: str
    offsets: dict[OffsetKey, CommittedOffset]
    errors: dict[tuple[str, int], ErrorCode]  # every requested partition, in request order
    epoch: int


@dataclass
class _PendingTxnCommit:
    token: Token
    group_id: str
    producer_id: int
    offsets: dict[OffsetKey, CommittedOffset]
    errors: dict[tuple[str, int], ErrorCode]  # every requested partition, in request order
    epoch: int


@dataclass
class _DeleteRequest:
    token: Token
    results: dict[str, ErrorCode]  # request order
    remaining_appends: int


@dataclass
class _PendingDelete:
    request: _DeleteRequest
    group_ids: list[str]
    epoch: int


class GroupCoordinator(ConsumerProtocol, OffsetDeletion):
    def __init__(
        self,
        config: GroupConfig,
        *,
        new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.config = config
        self._new_uuid = new_uuid
        self._groups: dict[str, Group] = {}
        self._offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        # Offset keys with an append in flight, so a deletion tombstones them too.
        self._inflight_keys: dict[str, Counter[OffsetKey]] = {}
        self._owned: set[int] = set()
        self._loading: set[int] = set()
        # Bumped on every load and resign: a completion from an older ownership is stale.
        self._epochs: dict[int, int] = {}
        self._pending: dict[
            int,
            _PendingStore
            | _PendingCommit
            | _PendingTxnCommit
            | _PendingDelete
            | _PendingOffsetDelete
            | _PendingConsumerStore,
        ] = {}
        self._next_append_id = 0
        # Append order of committed offsets (see the module docstring); only compared
        # between offsets of one partition, so one counter serves them all.
        self._positions: dict[OffsetKey, int] = {}
        self._next_position = 0
        self._txn = PendingTxnOffsets()
        # KIP-848 groups (consumer_coordinator.py serves them).
        self.consumer = ConsumerGroups(config, new_uuid)

    # ------------------------------------------------------------------ ownership
    def partition_for(self, group_id: str) -> int:
        return partition_for_group(group_id, self.config.offsets_topic_num_partitions)

    def epoch_of(self, partition: int) -> int:
        """Changes on every begin_load and resign of `partition`."""
        return self._epochs.get(partition, 0)

    def is_loading(self, partition: int) -> bool:
        return partition in self._loading

    def begin_load(self, partition: int, now_ms: int) -> Effects:
        """This broker now leads `partition`; answer COORDINATOR_LOAD_IN_PROGRESS until
        complete_load()."""
        fx = self.resign(partition, now_ms) if partition in self._owned else Effects()
        self._epochs[partition] = self._epochs.get(partition, 0) + 1
        self._loading.add(partition)
        return fx

    def complete_load(self, partition: int, records: Iterable[LogEntry], now_ms: int) -> None:
        """Replay the partition's entries (its committed log, in order) and start serving it.

        Raises CorruptRecordError on a record it cannot decode; the partition stays loading.
        """
        if partition not in self._loading:
            raise AssertionError(f"complete_load({partition}) without begin_load")
        self.install_load(partition, fmt.replay(records), now_ms)

    def install_load(self, partition: int, replayed: fmt.ReplayedPartition, now_ms: int) -> None:
        """Serve `partition` from its replayed entries (offsets_format.replay, a pure
        function a driver may run off the event loop: decoding a large partition takes
        seconds)."""
        if partition not in self._loading:
            raise AssertionError(f"install_load({partition}) without begin_load")
        base = self._next_position
        self._next_position += replayed.entries
        for group_id, value in replayed.groups.items():
            self._groups[group_id] = group_from_value(group_id, value, self.config, now_ms)
        self._load_consumer_groups(partition, replayed, now_ms)
        for key, committed in replayed.offsets.items():
            self._set_committed(key, committed, base + replayed.positions[key], now_ms)
        deferred = self._txn.load(
            partition,
            {
                producer_id: {k: (v, base + pos) for k, (v, pos) in offsets.items()}
                for producer_id, offsets in replayed.pending.items()
            },
        )
        self._loading.discard(partition)
        self._owned.add(partition)
        log.info(
            "offsets partition %d loaded: %d groups, %d offsets, %d open transactions",
            partition,
            len(replayed.groups),
            len(replayed.offsets),
            len(replayed.pending),
        )
        # Markers the transaction driver reported during the load: a marker the replay
        # already saw left nothing pending for its producer, so applying it again is a no-op.
        for producer_id, commit in deferred:
            self.complete_transaction(partition, producer_id, commit, now_ms)

    def _set_committed(
        self, key: OffsetKey, committed: CommittedOffset, position: int, now_ms: int
    ) -> None:
        self._offsets.setdefault(key.group_id, {})[(key.topic, key.partition)] = committed
        self._positions[key] = position
        if key.group_id not in self._groups and self.consumer.get(key.group_id) is None:
            # Offsets without group metadata: a standalone (assign()) consumer's group.
            self._groups[key.group_id] = Group(key.group_id, self.config, now_ms)

    def resign(self, partition: int, now_ms: int) -> Effects:
        """Leadership of `partition` is gone: drop its groups, answer NOT_COORDINATOR."""
        fx = Effects()
        self._epochs[partition] = self._epochs.get(partition, 0) + 1
        self._owned.discard(partition)
        self._loading.discard(partition)
        self._txn.drop_partition(partition)
        self.consumer.drop(lambda group_id: self.partition_for(group_id) == partition)
        for group_id in [g for g in self._groups if self.partition_for(g) == partition]:
            group = self._groups.pop(group_id)
            if group.state is not GroupState.DEAD:
                fx.replies.extend(group.shutdown(ErrorCode.not_coordinator, now_ms).replies)
            self._drop_offsets(group_id)
        return fx

    def _drop_offsets(self, group_id: str) -> None:
        for topic, partition in self._offsets.pop(group_id, {}):
            self._positions.pop(OffsetKey(group_id, topic, partition), None)

    def _route(self, group_id: str) -> ErrorCode:
        partition = self.partition_for(group_id)
        if partition in self._loading:
            return ErrorCode.coordinator_load_in_progress
        if partition not in self._owned:
            return ErrorCode.not_coordinator
        return ErrorCode.none

    def _route_member_api(self, group_id: str) -> ErrorCode:
        if not group_id:
            return ErrorCode.invalid_group_id
        return self._route(group_id)

    # ------------------------------------------------------------------ effects plumbing
    def _append(
        self,
        fx: Effects,
        partition: int,
        records: list[Record],
        pending: object,
        txn: TxnProducer | None = None,
    ) -> None:
        self._next_append_id += 1
        self._pending[self._next_append_id] = pending  # type: ignore[assignment]
        fx.appends.append(Append(self._next_append_id, partition, records, txn))

    def _absorb(self, fx: Effects, group: Group, gfx: GroupEffects, now_ms: int) -> None:
        fx.replies.extend(gfx.replies)
        partition = self.partition_for(group.group_id)
        for store in gfx.stores:
            value = group_to_value(group, now_ms, store.assignments)
            record = fmt.group_metadata_record(group.group_id, value)
            pending = _PendingStore(group.group_id, store, self._epochs.get(partition, 0))
            self._append(fx, partition, [record], pending)

    # ------------------------------------------------------------------ membership APIs
    def join_group(self, token: Token, req: JoinGroupRequest, now_ms: int) -> Effects:
        fx = Effects()
        code = self._route_member_api(req.group_id)
        if code is ErrorCode.none and not (
            self.config.group_min_session_timeout_ms
            <= req.session_timeout_ms
            <= self.config.group_max_session_timeout_ms
        ):
            code = ErrorCode.invalid_session_timeout
        if code is ErrorCode.none and self.consumer.get(req.group_id) is not None:
            if self.consumer.has_members(req.group_id):
                code = ErrorCode.inconsistent_group_protocol
            else:
                self.consumer.remove(req.group_id)  # empty: becomes a classic group
                self._store_consumer(fx, req.group_id, None)
        group = self._groups.get(req.group_id)
        if code is ErrorCode.none and group is None:
            if req.member_id != UNKNOWN_MEMBER_ID:
                code = ErrorCode.unknown_member_id
            elif len(self._groups) >= self.config.max_groups:
                log.warning("refusing new group %r: max_groups reached", req.group_id)
                code = ErrorCode.coordinator_not_available
            else:
                group = self._groups[req.group_id] = Group(req.group_id, self.config, now_ms)
        if code is not ErrorCode.none or group is None:
            fx.replies.append((token, JoinGroupResponse(code, req.member_id)))
            return fx
        prefix = req.group_instance_id or req.client_id
        new_member_id = f"{prefix}-{self._new_uuid()}"
        self._absorb(fx, group, group.join(token, req, now_ms, new_member_id), now_ms)
        return fx

    def sync_group(self, token: Token, req: SyncGroupRequest, now_ms: int) -> Effects:
        fx = Effects()
        code = self._route_member_api(req.group_id)
        group = self._groups.get(req.group_id)
        if code is ErrorCode.none and group is None:
            code = ErrorCode.unknown_member_id
        if code is not ErrorCode.none or group is None:
            fx.replies.append((token, SyncGroupResponse(code)))
            return fx
        self._absorb(fx, group, group.sync(token, req, now_ms), now_ms)
        return fx

    def heartbeat(self, req: HeartbeatRequest, now_ms: int) -> HeartbeatResponse:
        code = self._route_member_api(req.group_id)
        group = self._groups.get(req.group_id)
        if code is not ErrorCode.none:
            return HeartbeatResponse(code)
        if group is None:
            return HeartbeatResponse(ErrorCode.unknown_member_id)
        return HeartbeatResponse(group.heartbeat(req, now_ms))

    def leave_group(
        self, req: LeaveGroupRequest, now_ms: int
    ) -> tuple[LeaveGroupResponse, Effects]:
        fx = Effects()
        code = self._route_member_api(req.group_id)
        if code is not ErrorCode.none:
            return LeaveGroupResponse(code), fx
        group = self._groups.get(req.group_id)
        if group is not None and group.state is GroupState.DEAD:
            return LeaveGroupResponse(ErrorCode.coordinator_not_available), fx
        results = []
        for member in req.members:
            if group is None:
                member_code = ErrorCode.unknown_member_id
            else:
                member_code, gfx = group.leave(member.member_id, member.group_instance_id, now_ms)
                self._absorb(fx, group, gfx, now_ms)
            results.append(
                LeaveMemberResult(member.member_id, member.group_instance_id, member_code)
            )
        return LeaveGroupResponse(ErrorCode.none, tuple(results)), fx

    # ------------------------------------------------------------------ offsets
    def _offsets_to_commit(
        self, group_id: str, requested: list[tuple[str, OffsetCommitPartition]], now_ms: int
    ) -> tuple[dict[tuple[str, int], ErrorCode], dict[OffsetKey, CommittedOffset]]:
        """Each requested partition's answer, and the offsets to write: all but those whose
        metadata is over offset_metadata_max_bytes (OFFSET_METADATA_TOO_LARGE)."""
        errors: dict[tuple[str, int], ErrorCode] = {}
        offsets: dict[OffsetKey, CommittedOffset] = {}
        for topic, p in requested:
            metadata = p.metadata or ""
            if len(metadata.encode()) > self.config.offset_metadata_max_bytes:
                errors[(topic, p.partition)] = ErrorCode.offset_metadata_too_large
                continue
            errors[(topic, p.partition)] = ErrorCode.none
            key = OffsetKey(group_id, topic, p.partition)
            offsets[key] = CommittedOffset(p.offset, p.leader_epoch, metadata, now_ms)
        return errors, offsets

    def offset_commit(self, token: Token, req: OffsetCommitRequest, now_ms: int) -> Effects:
        fx = Effects()
        requested = [(t.name, p) for t in req.topics for p in t.partitions]
        code = self._route(req.group_id)
        group = self._groups.get(req.group_id)
        consumer = self.consumer.get(req.group_id)
        if consumer is not None:
            # OffsetCommit v9: generation_id carries the member epoch (KIP-848).
            if code is ErrorCode.none:
                code = consumer.validate_commit(
                    req.member_id, req.generation_id, transactional=False
                )
        elif code is ErrorCode.none:
            code, group = self._validate_commit(req, group, now_ms)
        if code is not ErrorCode.none or (group is None and consumer is None):
            fx.replies.append(
                (token, _commit_response({(t, p.partition): code for t, p in requested}))
            )
            return fx
        if group is not None:
            group.touch(req.member_id, now_ms)
        errors, offsets = self._offsets_to_commit(req.group_id, requested, now_ms)
        if not offsets:
            fx.replies.append((token, _commit_response(errors)))
            return fx
        partition = self.partition_for(req.group_id)
        records = [fmt.offset_commit_record(k, v) for k, v in offsets.items()]
        inflight = self._inflight_keys.setdefault(req.group_id, Counter())
        inflight.update(offsets.keys())
        pending = _PendingCommit(token, req.group_id, offsets, errors, self._epochs[partition])
        self._append(fx, partition, records, pending)
        return fx

    def _validate_commit(
        self, req: OffsetCommitRequest, group: Group | None, now_ms: int
    ) -> tuple[ErrorCode, Group | None]:
        is_member_commit = (
            req.generation_id >= 0
            or req.member_id != UNKNOWN_MEMBER_ID
            or req.group_instance_id is not None
        )
        if group is None:
            if req.generation_id >= 0:
                # A member of a group this coordinator does not know: an older generation.
                return ErrorCode.illegal_generation, None
            if len(self._groups) >= self.config.max_groups:
                return ErrorCode.coordinator_not_available, None
            # Kafka: a standalone consumer (assign(), no group management) gets an Empty group.
            group = self._groups[req.group_id] = Group(req.group_id, self.config, now_ms)
            return ErrorCode.none, group
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available, group
        if req.generation_id < 0 and group.state is GroupState.EMPTY:
            # As Kafka's KIP-848 coordinator (ClassicGroup.validateOffsetCommit): no generation
            # and an Empty group is a commit from outside group management (the admin client,
            # an assign() consumer), accepted whatever member id it names. librdkafka with
            # group.protocol=consumer names the member id it made for itself, never joined.
            return ErrorCode.none, group
        if is_member_commit:
            code = group.validate_member(req.member_id, req.group_instance_id, req.generation_id)
            if code is ErrorCode.none and group.state is GroupState.COMPLETING_REBALANCE:
                # The member has this generation's join reply but not its assignment yet.
                code = ErrorCode.rebalance_in_progress
            return code, group
        if group.state is not GroupState.EMPTY:
            return ErrorCode.unknown_member_id, group  # only members commit to a live group
        return ErrorCode.none, group

    # ------------------------------------------------------------------ transactional offsets
    def txn_offset_commit(self, token: Token, req: TxnOffsetCommitRequest, now_ms: int) -> Effects:
        """Append the offsets in a transactional batch of req.producer_id; replies an
        OffsetCommitResponse once replicated. They stay pending until complete_transaction."""
        fx = Effects()
        requested = [(t.name, p) for t in req.topics for p in t.partitions]
        code = self._route_member_api(req.group_id)
        group = self._groups.get(req.group_id)
        consumer = self.consumer.get(req.group_id)
        if consumer is not None:
            if code is ErrorCode.none:
                code = consumer.validate_commit(
                    req.member_id, req.generation_id, transactional=True
                )
        elif code is ErrorCode.none:
            code = validate_txn_commit(req, group)
        if code is ErrorCode.none and group is None and consumer is None:
            if len(self._groups) >= self.config.max_groups:
                code = ErrorCode.coordinator_not_available
            else:
                # As Kafka: offsets of a group nobody joined yet (an Empty group).
                group = self._groups[req.group_id] = Group(req.group_id, self.config, now_ms)
        if code is not ErrorCode.none or (group is None and consumer is None):
            fx.replies.append(
                (token, _commit_response({(t, p.partition): code for t, p in requested}))
            )
            return fx
        if group is not None:
            group.touch(req.member_id, now_ms)
        errors, offsets = self._offsets_to_commit(req.group_id, requested, now_ms)
        if not offsets:
            fx.replies.append((token, _commit_response(errors)))
            return fx
        partition = self.partition_for(req.group_id)
        records = [fmt.offset_commit_record(k, v) for k, v in offsets.items()]
        self._txn.begin_append(offsets.keys())
        pending = _PendingTxnCommit(
            token, req.group_id, req.producer_id, offsets, errors, self._epochs[partition]
        )
        txn = TxnProducer(req.transactional_id, req.producer_id, req.producer_epoch)
        self._append(fx, partition, records, pending, txn)
        return fx

    def _finish_txn_commit(self, fx: Effects, pending: _PendingTxnCommit, code: ErrorCode) -> None:
        self._txn.end_append(pending.offsets.keys())
        partition = self.partition_for(pending.group_id)
        if pending.epoch != self._epochs.get(partition):
            code = ErrorCode.not_coordinator  # durable, but the new coordinator replays it
        if code is ErrorCode.none:
            position = self._next_position
            self._next_position += 1
            self._txn.appended(partition, pending.producer_id, pending.offsets, position)
        errors = {k: (code if v is ErrorCode.none else v) for k, v in pending.errors.items()}
        fx.replies.append((pending.token, _commit_response(errors)))

    def complete_transaction(
        self, partition: int, producer_id: int, committed: bool, now_ms: int
    ) -> None:
        """`producer_id`'s COMMIT (committed) or ABORT marker is replicated on offsets
        partition `partition`: its pending offsets there become the groups' committed offsets,
        or are dropped. A partition this coordinator does not serve is ignored (its next
        coordinator replays the marker); one still loading applies it after the replay."""
        if partition in self._loading:
            self._txn.defer(partition, producer_id, committed)
            return
        if partition not in self._owned:
            return
        offsets = self._txn.take(partition, producer_id)
        if not offsets:
            return
        if not committed:
            log.debug("aborted %d offsets of producer %d", len(offsets), producer_id)
            return
        for key, (value, position) in offsets.items():
            if self._positions.get(key, -1) < position:
                self._set_committed(key, value, position, now_ms)

    def has_pending_txn_offsets(self, partition: int, producer_id: int) -> bool:
        return self._txn.has_pending(partition, producer_id)

    def offset_fetch(self, req: OffsetFetchRequest) -> OffsetFetchResponse:
        code = self._route(req.group_id)
        if code is not ErrorCode.none:
            return OffsetFetchResponse(code)
        committed = self._offsets.get(req.group_id, {})
        # KIP-447: a consumer asking for stable offsets waits out open transactions.
        unstable: set[tuple[str, int]] = set()
        if req.require_stable:
            unstable = self._txn.unstable(self.partition_for(req.group_id), req.group_id)
        if req.topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partitions) for t in req.topics}
        topics = []
        for topic, partitions in wanted.items():
            fetched = []
            for partition in partitions:
                c = committed.get((topic, partition))
                if (topic, partition) in unstable:
                    fetched.append(
                        FetchedOffset(partition, -1, error_code=ErrorCode.unstable_offset_commit)
                    )
                elif c is None:
                    fetched.append(FetchedOffset(partition, -1))
                else:
                    fetched.append(FetchedOffset(partition, c.offset, c.leader_epoch, c.metadata))
            topics.append(FetchedTopic(topic, tuple(fetched)))
        return OffsetFetchResponse(ErrorCode.none, tuple(topics))

    def committed_offsets(self) -> dict[tuple[str, str, int], CommittedOffset]:
        """{(group, topic, partition): committed offset} for every group served here."""
        return {
            (group_id, topic, partition): c
            for group_id, offsets in self._offsets.items()
            for (topic, partition), c in offsets.items()
        }

    # ------------------------------------------------------------------ admin APIs
    def describe_groups(self, group_ids: Iterable[str]) -> list[DescribedGroup]:
        described = []
        for group_id in group_ids:
            code = self._route(group_id)
            group = self._groups.get(group_id)
            consumer = self.consumer.describe_classic(group_id)
            if code is not ErrorCode.none:
                described.append(DescribedGroup(group_id, code, state=""))
            elif consumer is not None:
                described.append(consumer)
            elif group is None:
                described.append(DescribedGroup(group_id, ErrorCode.none, GroupState.DEAD.value))
            else:
                described.append(group.describe())
        return described

    def list_groups(self, states_filter: Iterable[str] = ()) -> ListGroupsResponse:
        wanted = {s.lower() for s in states_filter}
        groups = tuple(
            ListedGroup(g.group_id, g.protocol_type or "", g.state.value)
            for g in self._groups.values()
            if g.state is not GroupState.DEAD and (not wanted or g.state.value.lower() in wanted)
        ) + tuple(self.consumer.listed(wanted))
        code = ErrorCode.coordinator_load_in_progress if self._loading else ErrorCode.none
        return ListGroupsResponse(code, groups)

    def delete_groups(self, token: Token, group_ids: Iterable[str], now_ms: int) -> Effects:
        """Delete empty groups and their offsets; replies list[DeleteGroupResult] once the
        tombstones are replicated."""
        fx = Effects()
        results: dict[str, ErrorCode] = {}
        by_partition: dict[int, list[str]] = {}
        was_consumer: set[str] = set()
        for group_id in group_ids:
            if group_id in results:
                continue
            code = self._route(group_id)
            if code is ErrorCode.none and self.consumer.get(group_id) is not None:
                if self.consumer.has_members(group_id):
                    results[group_id] = ErrorCode.non_empty_group
                    continue
                # An empty consumer group is deleted as an empty classic one (its offsets).
                self.consumer.remove(group_id)
                self._groups[group_id] = Group(group_id, self.config, now_ms)
                was_consumer.add(group_id)
            group = self._groups.get(group_id)
            if code is ErrorCode.none:
                if group is None or group.state is GroupState.DEAD:
                    code = ErrorCode.group_id_not_found
                elif group.state is not GroupState.EMPTY:
                    code = ErrorCode.non_empty_group
            results[group_id] = code
            if code is ErrorCode.none and group is not None:
                # Dead while the tombstones replicate: joins and commits get a retriable
                # error instead of racing the deletion.
                fx.replies.extend(
                    group.shutdown(ErrorCode.coordinator_not_available, now_ms).replies
                )
                by_partition.setdefault(self.partition_for(group_id), []).append(group_id)
        request = _DeleteRequest(token, results, len(by_partition))
        if not by_partition:
            fx.replies.append((token, _delete_response(results)))
        for partition, ids in by_partition.items():
            records: list[Record] = []
            for group_id in ids:
                keys = {OffsetKey(group_id, t, p) for t, p in self._offsets.get(group_id, {})}
                keys.update(self._inflight_keys.get(group_id, ()))
                records.extend(fmt.offset_tombstone(k) for k in sorted(keys, key=_key_order))
                records.append(fmt.group_tombstone(group_id))
                if group_id in was_consumer:
                    records.append(fmt.consumer_group_tombstone(group_id))
            pending = _PendingDelete(request, ids, self._epochs[partition])
            self._append(fx, partition, records, pending)
        return fx

    # ------------------------------------------------------------------ completions, timers
    def on_append_done(self, append_id: int, error_code: ErrorCode, now_ms: int) -> Effects:
        """The Append `append_id` finished: none = replicated to every ISR member."""
        fx = Effects()
        pending = self._pending.pop(append_id)
        code = map_append_error(error_code)
        if isinstance(pending, _PendingCommit):
            self._finish_commit(fx, pending, code, now_ms)
            return fx
        if isinstance(pending, _PendingTxnCommit):
            self._finish_txn_commit(fx, pending, code)
            return fx
        if isinstance(pending, _PendingDelete):
            self._finish_delete(fx, pending, code, now_ms)
            return fx
        if isinstance(pending, _PendingConsumerStore):
            self._finish_consumer_store(fx, pending, code)
            return fx
        if isinstance(pending, _PendingOffsetDelete):
            self._finish_offset_delete(fx, pending, code)
            return fx
        group = self._groups.get(pending.group_id)
        partition = self.partition_for(pending.group_id)
        if group is not None and pending.epoch == self._epochs.get(partition):
            if code is not ErrorCode.none:
                log.warning("storing group %r failed: %s", pending.group_id, code.name)
            self._absorb(fx, group, group.on_stored(pending.store, code, now_ms), now_ms)
        return fx

    def _finish_commit(
        self, fx: Effects, pending: _PendingCommit, code: ErrorCode, now_ms: int
    ) -> None:
        inflight = self._inflight_keys.get(pending.group_id)
        if inflight is not None:
            inflight.subtract(pending.offsets.keys())
            if not +inflight:
                del self._inflight_keys[pending.group_id]
        partition = self.partition_for(pending.group_id)
        if pending.epoch != self._epochs.get(partition):
            code = ErrorCode.not_coordinator  # durable, but the new coordinator serves it
        if code is ErrorCode.none:
            position = self._next_position
            self._next_position += 1
            for key, committed in pending.offsets.items():
                self._set_committed(key, committed, position, now_ms)
        errors = {k: (code if v is ErrorCode.none else v) for k, v in pending.errors.items()}
        fx.replies.append((pending.token, _commit_response(errors)))

    def _finish_delete(
        self, fx: Effects, pending: _PendingDelete, code: ErrorCode, now_ms: int
    ) -> None:
        partition = self.partition_for(pending.group_ids[0])
        if pending.epoch != self._epochs.get(partition):
            code = ErrorCode.not_coordinator
        for group_id in pending.group_ids:
            group = self._groups.get(group_id)
            if code is ErrorCode.none:
                if group is not None and group.state is GroupState.DEAD:
                    del self._groups[group_id]
                self._drop_offsets(group_id)
            elif group is not None and group.state is GroupState.DEAD:
                # Nothing was deleted: the group is as it was before, Empty (a direct
                # reset, since Dead is otherwise final).
                group.state = GroupState.EMPTY
                group.state_time_ms = now_ms
            pending.request.results[group_id] = code
        pending.request.remaining_appends -= 1
        if pending.request.remaining_appends == 0:
            fx.replies.append((pending.request.token, _delete_response(pending.request.results)))

    def next_deadline_ms(self) -> int | None:
        deadlines = [d for g in self._groups.values() if (d := g.next_deadline_ms()) is not None]
        consumer_deadline_ms = self.consumer.next_deadline_ms()
        if consumer_deadline_ms is not None:
            deadlines.append(consumer_deadline_ms)
        return min(deadlines, default=None)

    def tick(self, now_ms: int) -> Effects:
        fx = Effects()
        for group_id in self.consumer.tick(now_ms):
            self._store_consumer(fx, group_id, None)
        for group in list(self._groups.values()):
            deadline_ms = group.next_deadline_ms()
            if deadline_ms is not None and deadline_ms <= now_ms:
                self._absorb(fx, group, group.tick(now_ms), now_ms)
        return fx


def _key_order(key: OffsetKey) -> tuple[str, int]:
    return key.topic, key.partition


def _commit_response(errors: dict[tuple[str, int], ErrorCode]) -> OffsetCommitResponse:
    topics: dict[str, list[PartitionError]] = {}
    for (topic, partition), code in errors.items():
        topics.setdefault(topic, []).append(PartitionError(partition, code))
    return OffsetCommitResponse(tuple(TopicErrors(t, tuple(ps)) for t, ps in topics.items()))


def _delete_response(results: dict[str, ErrorCode]) -> list[DeleteGroupResult]:
    return [DeleteGroupResult(group_id, code) for group_id, code in results.items()]
