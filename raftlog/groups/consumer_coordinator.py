"""The consumer group protocol's requests (KIP-848) in the GroupCoordinator, sans-IO.

A mixin of GroupCoordinator, kept apart so the classic and the consumer protocol read
separately: it uses the coordinator's routing (which offsets partitions are served), its
appends and its classic groups (one protocol per group id), and keeps the KIP-848 groups in
`self.consumer` (consumer_groups.py). A heartbeat that changed its group is answered only once
the group's record (consumer_format.py) is replicated; a new coordinator replays it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from raftlog.errors import ErrorCode
from raftlog.groups import offsets_format as fmt
from raftlog.groups.consumer_format import group_from_value as consumer_from_value
from raftlog.groups.consumer_format import group_to_value as consumer_to_value
from raftlog.groups.consumer_groups import ConsumerGroups
from raftlog.groups.effects import Effects
from raftlog.groups.group import Group, GroupState, Token
from raftlog.groups.messages import (
    ConsumerHeartbeatRequest,
    ConsumerHeartbeatResponse,
    DescribedConsumerGroup,
)
from raftlog.groups.offsets_format import Record
from raftlog.groups.settings import GroupConfig

log = logging.getLogger("raftlog.groups.coordinator")


@dataclass
class _PendingConsumerStore:
    group_id: str
    reply: tuple[Token, ConsumerHeartbeatResponse] | None
    epoch: int


class ConsumerProtocol:
    # Provided by GroupCoordinator.
    config: GroupConfig
    consumer: ConsumerGroups
    _groups: dict[str, Group]
    _epochs: dict[int, int]

    def partition_for(self, group_id: str) -> int:
        raise NotImplementedError

    def _route(self, group_id: str) -> ErrorCode:
        raise NotImplementedError

    def _route_member_api(self, group_id: str) -> ErrorCode:
        raise NotImplementedError

    def _append(self, fx: Effects, partition: int, records: list[Record], pending: object) -> None:
        raise NotImplementedError

    def consumer_group_heartbeat(
        self,
        token: Token,
        req: ConsumerHeartbeatRequest,
        partition_counts: dict[str, int],
        now_ms: int,
        topic_names: Collection[str] | None = None,
        may_describe: Callable[[str], bool] | None = None,
    ) -> Effects:
        """ConsumerGroupHeartbeat; `partition_counts` covers the topics the group and the
        request subscribe to (consumer_subscriptions tells the caller which), and every
        topic of `topic_names` (the cluster's non-internal topics, given when the group or
        the request subscribes by regex: consumer_uses_regex; a regex matches only the
        ones `may_describe` allows, ConsumerGroup.resolve_regexes). Replies a
        ConsumerHeartbeatResponse, once the group's record is replicated if it changed."""
        fx = Effects()
        code = self._route_member_api(req.group_id)
        classic = self._groups.get(req.group_id)
        if code is ErrorCode.none and classic is not None:
            if classic.state not in (GroupState.EMPTY, GroupState.DEAD) or classic.members:
                code = ErrorCode.inconsistent_group_protocol
            elif classic.state is GroupState.DEAD:
                code = ErrorCode.coordinator_not_available
        if code is not ErrorCode.none:
            fx.replies.append((token, ConsumerHeartbeatResponse(code, req.member_id or None)))
            return fx
        total = len(self._groups) + len(self.consumer.groups)
        may_create = classic is not None or total < self.config.max_groups
        resp = self.consumer.heartbeat(
            req, partition_counts, now_ms, may_create, topic_names, may_describe
        )
        group = self.consumer.get(req.group_id)
        converted: list[Record] = []
        if classic is not None and group is not None:
            # An empty classic group, now a consumer group (its offsets stay).
            del self._groups[req.group_id]
            converted.append(fmt.group_tombstone(req.group_id))
        if group is None or not group.dirty:
            fx.replies.append((token, resp))
            return fx
        self._store_consumer(fx, req.group_id, (token, resp), converted)
        return fx

    def _store_consumer(
        self,
        fx: Effects,
        group_id: str,
        reply: tuple[Token, ConsumerHeartbeatResponse] | None,
        before: list[Record] | None = None,
    ) -> None:
        """Append consumer group `group_id`'s record (a tombstone if it is gone), then
        deliver `reply` (consumer_format.py)."""
        partition = self.partition_for(group_id)
        group = self.consumer.get(group_id)
        records = list(before or ())
        if group is None:
            records.append(fmt.consumer_group_tombstone(group_id))
        else:
            group.dirty = False
            records.append(fmt.consumer_group_record(group_id, consumer_to_value(group)))
        pending = _PendingConsumerStore(group_id, reply, self._epochs.get(partition, 0))
        self._append(fx, partition, records, pending)

    def consumer_subscriptions(self, group_id: str) -> set[str]:
        return self.consumer.subscribed_topics(group_id)

    def consumer_uses_regex(self, group_id: str) -> bool:
        return self.consumer.uses_regex(group_id)

    def consumer_group_describe(self, group_ids: Iterable[str]) -> list[DescribedConsumerGroup]:
        out = []
        for group_id in group_ids:
            code = self._route(group_id)
            if code is not ErrorCode.none:
                out.append(DescribedConsumerGroup(group_id, code))
            else:
                out.extend(self.consumer.describe([group_id]))
        return out

    def _finish_consumer_store(
        self, fx: Effects, pending: _PendingConsumerStore, code: ErrorCode
    ) -> None:
        if pending.epoch != self._epochs.get(self.partition_for(pending.group_id)):
            code = ErrorCode.not_coordinator
        if code is not ErrorCode.none:
            # The group in memory stays ahead of the log: the member retries (its previous
            # epoch is accepted), a failover replays only what was written.
            log.warning("storing consumer group %r failed: %s", pending.group_id, code.name)
        if pending.reply is not None:
            token, resp = pending.reply
            if code is not ErrorCode.none:
                resp = ConsumerHeartbeatResponse(code, resp.member_id)
            fx.replies.append((token, resp))

    def _load_consumer_groups(
        self, partition: int, replayed: fmt.ReplayedPartition, now_ms: int
    ) -> None:
        for group_id, value in replayed.consumer_groups.items():
            try:
                group = consumer_from_value(group_id, value, self.config, now_ms)
            except ValueError as exc:
                # Its members get UNKNOWN_MEMBER_ID and rejoin; the offsets are kept.
                log.error("offsets partition %d: not loading %s", partition, exc)
                continue
            self._groups.pop(group_id, None)
            self.consumer.groups[group_id] = group
