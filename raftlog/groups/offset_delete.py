"""OffsetDelete (KIP-496) in the GroupCoordinator, sans-IO.

A mixin of GroupCoordinator (as consumer_coordinator.py is). Kafka's rules:
- a group this coordinator does not know (nor any offsets of it) is GROUP_ID_NOT_FOUND;
- an Empty group, or a KIP-848 consumer group, may lose the offsets of any partition;
- a classic group with members that speaks the "consumer" protocol may lose only the
  offsets of topics none of its members subscribes to: the others answer
  GROUP_SUBSCRIBED_TO_TOPIC; a classic group of another protocol type (Connect, ...) with
  members is NON_EMPTY_GROUP;
- partitions without a committed offset answer NONE (there is nothing to delete).

Persist before you promise: the deletion is one append of offset tombstones to the group's
`__consumer_offsets` partition (what a replay and every other coordinator read); the cache
forgets the offsets and the client is answered only once it is replicated.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from raftlog.client.consumer_protocol import (
    CONSUMER_PROTOCOL_TYPE,
    ConsumerProtocolError,
    decode_subscription,
)
from raftlog.errors import ErrorCode
from raftlog.groups import offsets_format as fmt
from raftlog.groups.consumer_groups import ConsumerGroups
from raftlog.groups.effects import Effects
from raftlog.groups.group import Group, GroupState, Token
from raftlog.groups.messages import (
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    PartitionError,
    TopicErrors,
)
from raftlog.groups.offsets_format import CommittedOffset, OffsetKey, Record


@dataclass
class _PendingOffsetDelete:
    token: Token
    group_id: str
    keys: list[OffsetKey]
    errors: dict[tuple[str, int], ErrorCode]  # every requested partition, in request order
    epoch: int


def classic_subscriptions(group: Group) -> set[str] | None:
    """The topics a classic consumer group's members subscribe to, None when that cannot be
    told (a member's metadata does not decode): then, as Kafka, every topic counts as
    subscribed, so no offset the group may be using is deleted."""
    topics: set[str] = set()
    for member in group.members.values():
        if group.protocol_name is not None:
            blobs = [member.metadata_for(group.protocol_name)]
        else:  # before the first protocol is chosen: whatever the member offered
            blobs = [metadata for _name, metadata in member.protocols]
        for blob in blobs:
            try:
                topics.update(decode_subscription(blob).topics)
            except ConsumerProtocolError:
                return None
    return topics


class OffsetDeletion:
    # Provided by GroupCoordinator.
    consumer: ConsumerGroups
    _groups: dict[str, Group]
    _offsets: dict[str, dict[tuple[str, int], CommittedOffset]]
    _positions: dict[OffsetKey, int]
    _inflight_keys: dict[str, Counter[OffsetKey]]
    _epochs: dict[int, int]

    def partition_for(self, group_id: str) -> int:
        raise NotImplementedError

    def _route(self, group_id: str) -> ErrorCode:
        raise NotImplementedError

    def _append(self, fx: Effects, partition: int, records: list[Record], pending: object) -> None:
        raise NotImplementedError

    def _subscribed(self, group_id: str) -> tuple[ErrorCode, set[str] | None]:
        """The group's error, and the topics whose offsets must stay (None: all of them)."""
        consumer = self.consumer.get(group_id)
        if consumer is not None:
            return ErrorCode.none, self.consumer.subscribed_topics(group_id)
        group = self._groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return ErrorCode.group_id_not_found, set()
        if group.state is GroupState.EMPTY:
            return ErrorCode.none, set()
        if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return ErrorCode.non_empty_group, set()
        return ErrorCode.none, classic_subscriptions(group)

    def offset_delete(self, token: Token, req: OffsetDeleteRequest, now_ms: int) -> Effects:
        """Tombstone the group's offsets of the requested partitions; replies an
        OffsetDeleteResponse once the tombstones are replicated. (`now_ms`: the signature
        every coordinator request has; nothing here depends on the time.)"""
        fx = Effects()
        code = self._route(req.group_id)
        subscribed: set[str] | None = set()
        if code is ErrorCode.none:
            code, subscribed = self._subscribed(req.group_id)
        if code is not ErrorCode.none:
            fx.replies.append((token, OffsetDeleteResponse(code)))
            return fx
        committed = self._offsets.get(req.group_id, {})
        inflight = self._inflight_keys.get(req.group_id, Counter())
        errors: dict[tuple[str, int], ErrorCode] = {}
        keys: list[OffsetKey] = []
        for topic in req.topics:
            in_use = subscribed is None or topic.name in subscribed
            for partition in topic.partitions:
                if (topic.name, partition) in errors:
                    continue
                if in_use:
                    errors[(topic.name, partition)] = ErrorCode.group_subscribed_to_topic
                    continue
                errors[(topic.name, partition)] = ErrorCode.none
                key = OffsetKey(req.group_id, topic.name, partition)
                # An in-flight commit is tombstoned too: it lands before this append.
                if (topic.name, partition) in committed or inflight[key] > 0:
                    keys.append(key)
        if not keys:
            fx.replies.append((token, _response(errors)))
            return fx
        partition_index = self.partition_for(req.group_id)
        pending = _PendingOffsetDelete(
            token, req.group_id, keys, errors, self._epochs[partition_index]
        )
        self._append(fx, partition_index, [fmt.offset_tombstone(k) for k in keys], pending)
        return fx

    def _finish_offset_delete(
        self, fx: Effects, pending: _PendingOffsetDelete, code: ErrorCode
    ) -> None:
        if pending.epoch != self._epochs.get(self.partition_for(pending.group_id)):
            code = ErrorCode.not_coordinator  # durable, but the new coordinator replays it
        if code is not ErrorCode.none:
            # Nothing is known deleted: the group's answer is the append's error.
            fx.replies.append((pending.token, OffsetDeleteResponse(code)))
            return
        committed = self._offsets.get(pending.group_id, {})
        for key in pending.keys:
            committed.pop((key.topic, key.partition), None)
            self._positions.pop(key, None)
        if not committed:
            self._offsets.pop(pending.group_id, None)
        fx.replies.append((pending.token, _response(pending.errors)))


def _response(errors: dict[tuple[str, int], ErrorCode]) -> OffsetDeleteResponse:
    topics: dict[str, list[PartitionError]] = {}
    for (topic, partition), code in errors.items():
        topics.setdefault(topic, []).append(PartitionError(partition, code))
    return OffsetDeleteResponse(
        ErrorCode.none, tuple(TopicErrors(t, tuple(ps)) for t, ps in topics.items())
    )
