"""One consumer group's membership state machine (Kafka's classic group protocol), sans-IO.

Inputs are requests plus `now_ms`; outputs are GroupEffects: replies to deliver (join and
sync replies are parked under the caller's token until the rebalance completes) and requests
to persist the group's metadata. Deadlines are not timers here: `next_deadline_ms()` says when
the driver must call `tick(now_ms)` next. No clock, no I/O, no randomness (new member ids are
passed in), so a test can drive it step by step. What a member is, and the queries over the
member table (protocol vote, static instance owner, member lists), are in group_members.py.

States and their legal predecessors follow Kafka's GroupMetadata (see docs/groups.md):
  Empty ──join──▶ PreparingRebalance ──all joined / timeout──▶ CompletingRebalance
  CompletingRebalance ──leader's assignment stored──▶ Stable
  Stable / CompletingRebalance ──join, leave, expiry──▶ PreparingRebalance
  PreparingRebalance ──nobody rejoined──▶ Empty;  any ──deleted / unloaded──▶ Dead
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from raftlog.errors import ErrorCode
from raftlog.groups.group_members import (
    Member,
    Token,
    all_support_one_of,
    described_members,
    instance_owner,
    join_group_members,
    max_rebalance_timeout_ms,
    next_leader,
    replace_member_id,
    select_protocol,
)
from raftlog.groups.messages import (
    UNKNOWN_MEMBER_ID,
    DescribedGroup,
    HeartbeatRequest,
    JoinGroupMember,
    JoinGroupRequest,
    JoinGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from raftlog.groups.settings import GroupConfig


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


S = GroupState
# Kafka's table of valid previous states; anything else is a bug and raises.
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    S.EMPTY: frozenset({S.PREPARING_REBALANCE}),
    S.PREPARING_REBALANCE: frozenset({S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY}),
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE}),
    S.STABLE: frozenset({S.COMPLETING_REBALANCE}),
    S.DEAD: frozenset(GroupState),
}


@dataclass(frozen=True)
class StaticJoin:
    """A restarted static member that took its old incarnation's place in a Stable group
    (KIP-345): its JoinGroup is answered once the new member id is stored."""

    token: Token
    old_member_id: str
    new_member_id: str
    old_protocols: tuple[tuple[str, bytes], ...]  # restored if the store fails
    leader_before: str | None  # the leader id a client older than JoinGroup v9 is told
    supports_skip_assignment: bool


@dataclass(frozen=True)
class StoreGroup:
    """Persist this group's metadata; the coordinator answers with Group.on_stored().

    `assignments` is the leader's SyncGroup: it is handed out only once stored, so a member
    never acts on an assignment a new coordinator would not know after a failover.
    `static_join` is a static member's replacement, answered once stored.
    """

    generation_id: int
    assignments: dict[str, bytes] | None = None
    static_join: StaticJoin | None = None


@dataclass
class GroupEffects:
    replies: list[tuple[Token, object]] = field(default_factory=list)
    stores: list[StoreGroup] = field(default_factory=list)

    def reply(self, token: Token | None, response: object) -> None:
        if token is not None:
            self.replies.append((token, response))


class Group:
    def __init__(self, group_id: str, config: GroupConfig, now_ms: int) -> None:
        self.group_id = group_id
        self.config = config
        self.state = GroupState.EMPTY
        self.state_time_ms = now_ms
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}  # insertion order = join order
        # KIP-394 members that got MEMBER_ID_REQUIRED and must rejoin by this deadline.
        self.pending_members: dict[str, int] = {}
        # Members of this generation that have not sent SyncGroup yet (Kafka 3.x
        # pendingSyncMembers): removed if they stay silent past sync_deadline_ms.
        self.pending_sync: set[str] = set()
        self.join_deadline_ms: int | None = None
        self.sync_deadline_ms: int | None = None
        # Initial rebalance delay (Kafka's InitialDelayedJoin): extended while members arrive.
        self.initial_delay_remaining_ms: int | None = None
        self.new_member_added = False
        self.storing_generation: int | None = None  # leader's assignment being persisted

    # ------------------------------------------------------------------ state helpers
    def transition(self, target: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise AssertionError(
                f"group {self.group_id!r}: illegal transition {self.state.value} -> "
                f"{target.value} (generation {self.generation_id}, members {list(self.members)})"
            )
        self.state = target
        self.state_time_ms = now_ms

    def is_empty(self) -> bool:
        return not self.members and not self.pending_members

    def rebalance_timeout_ms(self) -> int:
        return max_rebalance_timeout_ms(self.members)

    def _supports_protocols(self, protocol_type: str, names: list[str]) -> bool:
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        if protocol_type != self.protocol_type:
            return False
        return all_support_one_of(self.members, names)

    def select_protocol(self) -> str:
        """The protocol this generation uses (Kafka's vote, group_members.select_protocol)."""
        return select_protocol(self.group_id, self.members, self.leader_id)

    def _all_joined(self) -> bool:
        return not self.pending_members and all(
            m.join_token is not None for m in self.members.values()
        )

    def _error_join(self, member_id: str, code: ErrorCode) -> JoinGroupResponse:
        return JoinGroupResponse(error_code=code, member_id=member_id)

    def _join_result(self, member: Member) -> JoinGroupResponse:
        members: tuple[JoinGroupMember, ...] = ()
        if member.member_id == self.leader_id:
            members = join_group_members(self.members, self.protocol_name)
        return JoinGroupResponse(
            error_code=ErrorCode.none,
            member_id=member.member_id,
            generation_id=self.generation_id,
            protocol_type=self.protocol_type,
            protocol_name=self.protocol_name,
            leader=self.leader_id or "",
            members=members,
        )

    def _sync_reply(self, code: ErrorCode, assignment: bytes = b"") -> SyncGroupResponse:
        return SyncGroupResponse(code, assignment, self.protocol_type, self.protocol_name)

    def validate_member(
        self, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        """Kafka's validateCurrentMember: known member, not fenced, current generation."""
        owner = instance_owner(self.members, group_instance_id)
        if owner is not None and owner.member_id != member_id:
            return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        if generation_id != self.generation_id:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    def touch(self, member_id: str, now_ms: int) -> None:
        member = self.members.get(member_id)
        if member is not None:
            member.last_heartbeat_ms = now_ms

    # ------------------------------------------------------------------ JoinGroup
    def join(
        self, token: Token, req: JoinGroupRequest, now_ms: int, new_member_id: str
    ) -> GroupEffects:
        fx = GroupEffects()
        if self.state is GroupState.DEAD:
            # The group was deleted or unloaded under us; the client looks the coordinator up
            # again and retries.
            fx.reply(token, self._error_join(req.member_id, ErrorCode.coordinator_not_available))
            return fx
        names = [name for name, _ in req.protocols]
        if not self._supports_protocols(req.protocol_type, names):
            fx.reply(token, self._error_join(req.member_id, ErrorCode.inconsistent_group_protocol))
            return fx
        if req.member_id == UNKNOWN_MEMBER_ID:
            self._join_new_member(fx, token, req, now_ms, new_member_id)
        else:
            self._join_known_member(fx, token, req, now_ms)
        return fx

    def _is_full(self) -> bool:
        return len(self.members) + len(self.pending_members) >= self.config.group_max_size

    def _join_new_member(
        self, fx: GroupEffects, token: Token, req: JoinGroupRequest, now_ms: int, member_id: str
    ) -> None:
        previous = instance_owner(self.members, req.group_instance_id)
        if previous is not None:
            self._replace_static_member(fx, token, req, previous, member_id, now_ms)
            return
        if self._is_full():
            fx.reply(token, self._error_join(UNKNOWN_MEMBER_ID, ErrorCode.group_max_size_reached))
            return
        if req.require_known_member_id and req.group_instance_id is None:
            self.pending_members[member_id] = now_ms + req.session_timeout_ms
            fx.reply(token, self._error_join(member_id, ErrorCode.member_id_required))
            return
        self._add_member_and_rebalance(fx, token, req, member_id, now_ms)

    def _replace_static_member(
        self,
        fx: GroupEffects,
        token: Token,
        req: JoinGroupRequest,
        previous: Member,
        new_id: str,
        now_ms: int,
    ) -> None:
        """A static member restarted (unknown member id, known instance id): it takes its old
        incarnation's place under a new member id (Kafka's updateStaticMemberAndRebalance,
        KIP-345). In a Stable group whose protocol it leaves unchanged nobody else notices:
        the new id is stored, the member gets the current generation back and, at SyncGroup,
        its old assignment. In CompletingRebalance the leader may be assigning to the old
        id, so the group rebalances; in PreparingRebalance it joins like any member."""
        old_id = previous.member_id
        leader_before = self.leader_id
        # The old incarnation, if still waiting on a reply, is a zombie from now on.
        fx.reply(previous.join_token, self._error_join(old_id, ErrorCode.fenced_instance_id))
        fx.reply(previous.sync_token, self._sync_reply(ErrorCode.fenced_instance_id))
        previous.join_token = previous.sync_token = None
        old_protocols = tuple(previous.protocols)
        member = self._rekey(old_id, new_id)
        member.protocols = list(req.protocols)
        member.last_heartbeat_ms = now_ms
        member.join_token = token
        if self.state is GroupState.STABLE and self.select_protocol() == self.protocol_name:
            join = StaticJoin(
                token, old_id, new_id, old_protocols, leader_before, req.supports_skip_assignment
            )
            fx.stores.append(StoreGroup(self.generation_id, static_join=join))
        elif self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(fx, now_ms)
        else:  # PreparingRebalance: this may have been the last member awaited
            self._maybe_complete_join(fx, now_ms)

    def _rekey(self, old_id: str, new_id: str) -> Member:
        member = replace_member_id(self.members, old_id, new_id)
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        return member

    def _on_static_join_stored(self, store: StoreGroup, code: ErrorCode) -> GroupEffects:
        fx = GroupEffects()
        join = store.static_join
        assert join is not None
        member = self.members.get(join.new_member_id)
        if (
            member is None
            or member.join_token != join.token
            or self.state is not GroupState.STABLE
            or self.generation_id != store.generation_id
        ):
            return fx  # a rebalance or a leave answered the join meanwhile
        member.join_token = None
        if code is not ErrorCode.none:
            # Not stored: the old incarnation's record is what a new coordinator would load.
            self._rekey(join.new_member_id, join.old_member_id).protocols = list(join.old_protocols)
            fx.reply(
                join.token,
                JoinGroupResponse(
                    error_code=code,
                    member_id=UNKNOWN_MEMBER_ID,
                    generation_id=self.generation_id,
                    protocol_type=self.protocol_type,
                    protocol_name=self.protocol_name,
                    leader=join.leader_before or "",
                ),
            )
            return fx
        # A v9+ leader is told it leads but must not assign (the group keeps its assignment);
        # an older client is given the previous leader id, so a restarted leader does not
        # compute an assignment a Stable group would ignore.
        skip = join.supports_skip_assignment and member.member_id == self.leader_id
        fx.reply(
            join.token,
            JoinGroupResponse(
                error_code=ErrorCode.none,
                member_id=member.member_id,
                generation_id=self.generation_id,
                protocol_type=self.protocol_type,
                protocol_name=self.protocol_name,
                leader=(self.leader_id if join.supports_skip_assignment else join.leader_before)
                or "",
                members=join_group_members(self.members, self.protocol_name) if skip else (),
                skip_assignment=skip,
            ),
        )
        return fx

    def _join_known_member(
        self, fx: GroupEffects, token: Token, req: JoinGroupRequest, now_ms: int
    ) -> None:
        member_id = req.member_id
        if member_id in self.pending_members:
            del self.pending_members[member_id]
            self._add_member_and_rebalance(fx, token, req, member_id, now_ms)
            return
        owner = instance_owner(self.members, req.group_instance_id)
        if owner is not None and owner.member_id != member_id:
            fx.reply(token, self._error_join(member_id, ErrorCode.fenced_instance_id))
            return
        member = self.members.get(member_id)
        if member is None or self.state in (GroupState.EMPTY, GroupState.DEAD):
            fx.reply(token, self._error_join(member_id, ErrorCode.unknown_member_id))
            return
        same = req.protocols == tuple(member.protocols)
        if self.state is GroupState.COMPLETING_REBALANCE and same:
            # A retried join of this generation: answer it again, nothing changed.
            member.last_heartbeat_ms = now_ms
            fx.reply(token, self._join_result(member))
            return
        if self.state is GroupState.STABLE and same and member_id != self.leader_id:
            # A follower rejoining with unchanged metadata gets the current generation; the
            # leader rejoining means it wants a new assignment, so it rebalances.
            member.last_heartbeat_ms = now_ms
            fx.reply(token, self._join_result(member))
            return
        self._update_member_and_rebalance(fx, token, req, member, now_ms)

    def _add_member_and_rebalance(
        self, fx: GroupEffects, token: Token, req: JoinGroupRequest, member_id: str, now_ms: int
    ) -> None:
        member = Member(
            member_id=member_id,
            group_instance_id=req.group_instance_id,
            client_id=req.client_id,
            client_host=req.client_host,
            session_timeout_ms=req.session_timeout_ms,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=list(req.protocols),
            last_heartbeat_ms=now_ms,
            join_token=token,
        )
        if not self.members:
            self.protocol_type = req.protocol_type
        self.members[member_id] = member
        if self.leader_id is None:
            self.leader_id = member_id
        if self.state is GroupState.PREPARING_REBALANCE and self.generation_id == 0:
            self.new_member_added = True
        self._maybe_prepare_rebalance(fx, now_ms)

    def _update_member_and_rebalance(
        self, fx: GroupEffects, token: Token, req: JoinGroupRequest, member: Member, now_ms: int
    ) -> None:
        member.protocols = list(req.protocols)
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        member.last_heartbeat_ms = now_ms
        # A second join while one is parked: the client gave up on the first; answer it so
        # no parked reply is ever leaked.
        fx.reply(
            member.join_token, self._error_join(member.member_id, ErrorCode.rebalance_in_progress)
        )
        member.join_token = token
        self._maybe_prepare_rebalance(fx, now_ms)

    # ------------------------------------------------------------------ rebalance phases
    def _maybe_prepare_rebalance(self, fx: GroupEffects, now_ms: int) -> None:
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance(fx, now_ms)
        elif self.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(fx, now_ms)

    def _prepare_rebalance(self, fx: GroupEffects, now_ms: int) -> None:
        if self.state is GroupState.COMPLETING_REBALANCE:
            for member in self.members.values():
                if member.sync_token is not None:
                    # Released from parking: its session restarts now.
                    member.last_heartbeat_ms = now_ms
                fx.reply(member.sync_token, self._sync_reply(ErrorCode.rebalance_in_progress))
                member.sync_token = None
        self.pending_sync.clear()
        self.sync_deadline_ms = None
        self.storing_generation = None
        rebalance_timeout_ms = self.rebalance_timeout_ms()
        delay_ms = self.config.group_initial_rebalance_delay_ms
        if self.state is GroupState.EMPTY and delay_ms > 0:
            first_ms = min(delay_ms, rebalance_timeout_ms)
            self.join_deadline_ms = now_ms + first_ms
            self.initial_delay_remaining_ms = max(rebalance_timeout_ms - delay_ms, 0)
            self.new_member_added = False
        else:
            self.join_deadline_ms = now_ms + rebalance_timeout_ms
            self.initial_delay_remaining_ms = None
        self.transition(GroupState.PREPARING_REBALANCE, now_ms)
        self._maybe_complete_join(fx, now_ms)

    def _maybe_complete_join(self, fx: GroupEffects, now_ms: int) -> None:
        # During the initial delay Kafka waits out the delay even if everyone is in.
        if self.initial_delay_remaining_ms is None and self._all_joined():
            self._complete_join(fx, now_ms)

    def _complete_join(self, fx: GroupEffects, now_ms: int) -> None:
        assert self.state is GroupState.PREPARING_REBALANCE, self.state
        # Members that did not rejoin in time are out of the new generation.
        for member_id in [m.member_id for m in self.members.values() if m.join_token is None]:
            self._drop(member_id)
        self.pending_members.clear()
        self.join_deadline_ms = None
        self.initial_delay_remaining_ms = None
        self.generation_id += 1
        if not self.members:
            self.protocol_name = None
            self.leader_id = None
            self.transition(GroupState.EMPTY, now_ms)
            fx.stores.append(StoreGroup(self.generation_id))
            return
        self.protocol_name = self.select_protocol()
        self.transition(GroupState.COMPLETING_REBALANCE, now_ms)
        self.pending_sync = set(self.members)
        self.sync_deadline_ms = now_ms + self.rebalance_timeout_ms()
        for member in self.members.values():
            fx.reply(member.join_token, self._join_result(member))
            member.join_token = None
            member.last_heartbeat_ms = now_ms

    def _drop(self, member_id: str) -> None:
        """Forget a member (its parked replies must already be answered)."""
        del self.members[member_id]
        self.pending_sync.discard(member_id)
        if member_id == self.leader_id:
            self.leader_id = next_leader(self.members)

    def _remove_member(
        self, fx: GroupEffects, member_id: str, code: ErrorCode, now_ms: int
    ) -> None:
        member = self.members[member_id]
        fx.reply(member.join_token, self._error_join(member_id, code))
        fx.reply(member.sync_token, self._sync_reply(code))
        member.join_token = member.sync_token = None
        self._drop(member_id)
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(fx, now_ms)
        elif self.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(fx, now_ms)

    # ------------------------------------------------------------------ SyncGroup
    def sync(self, token: Token, req: SyncGroupRequest, now_ms: int) -> GroupEffects:
        fx = GroupEffects()
        if self.state is GroupState.DEAD:
            fx.reply(token, self._sync_reply(ErrorCode.coordinator_not_available))
            return fx
        code = self.validate_member(req.member_id, req.group_instance_id, req.generation_id)
        if code is ErrorCode.none and (
            (req.protocol_type is not None and req.protocol_type != self.protocol_type)
            or (req.protocol_name is not None and req.protocol_name != self.protocol_name)
        ):
            code = ErrorCode.inconsistent_group_protocol
        if code is not ErrorCode.none:
            fx.reply(token, self._sync_reply(code))
            return fx
        member = self.members[req.member_id]
        if self.state is GroupState.EMPTY:
            fx.reply(token, self._sync_reply(ErrorCode.unknown_member_id))
        elif self.state is GroupState.PREPARING_REBALANCE:
            fx.reply(token, self._sync_reply(ErrorCode.rebalance_in_progress))
        elif self.state is GroupState.STABLE:
            self.pending_sync.discard(member.member_id)
            member.last_heartbeat_ms = now_ms
            fx.reply(token, self._sync_reply(ErrorCode.none, member.assignment))
        else:  # CompletingRebalance: park until the leader's assignment is stored
            self.pending_sync.discard(member.member_id)
            member.last_heartbeat_ms = now_ms
            fx.reply(member.sync_token, self._sync_reply(ErrorCode.rebalance_in_progress))
            member.sync_token = token
            if member.member_id == self.leader_id and self.storing_generation is None:
                given = dict(req.assignments)
                assignments = {m: given.get(m, b"") for m in self.members}
                self.storing_generation = self.generation_id
                fx.stores.append(StoreGroup(self.generation_id, assignments))
        return fx

    def on_stored(self, store: StoreGroup, code: ErrorCode, now_ms: int) -> GroupEffects:
        """The persist requested by `store` finished with `code` (none = replicated)."""
        if store.static_join is not None:
            return self._on_static_join_stored(store, code)
        fx = GroupEffects()
        if (
            store.assignments is None
            or self.state is not GroupState.COMPLETING_REBALANCE
            or self.storing_generation != store.generation_id
            or self.generation_id != store.generation_id
        ):
            return fx  # the group moved on; this store is history
        self.storing_generation = None
        if code is not ErrorCode.none:
            for member in self.members.values():
                fx.reply(member.sync_token, self._sync_reply(code))
                member.sync_token = None
                member.last_heartbeat_ms = now_ms
            self._prepare_rebalance(fx, now_ms)
            return fx
        for member in self.members.values():
            member.assignment = store.assignments.get(member.member_id, b"")
            fx.reply(member.sync_token, self._sync_reply(ErrorCode.none, member.assignment))
            member.sync_token = None
            member.last_heartbeat_ms = now_ms
        self.transition(GroupState.STABLE, now_ms)
        return fx

    # ------------------------------------------------------------------ Heartbeat / Leave
    def heartbeat(self, req: HeartbeatRequest, now_ms: int) -> ErrorCode:
        if self.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if self.state is GroupState.EMPTY:
            return ErrorCode.unknown_member_id
        code = self.validate_member(req.member_id, req.group_instance_id, req.generation_id)
        if code is not ErrorCode.none:
            return code
        self.members[req.member_id].last_heartbeat_ms = now_ms
        if self.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(
        self, member_id: str, group_instance_id: str | None, now_ms: int
    ) -> tuple[ErrorCode, GroupEffects]:
        fx = GroupEffects()
        if self.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available, fx
        if member_id in self.pending_members:
            del self.pending_members[member_id]
            if self.state is GroupState.PREPARING_REBALANCE:
                self._maybe_complete_join(fx, now_ms)
            return ErrorCode.none, fx
        if group_instance_id is not None:
            # KIP-345: a static member leaves by instance id; a member id that disagrees
            # with the instance's current owner is a fenced zombie.
            owner = instance_owner(self.members, group_instance_id)
            if owner is None:
                return ErrorCode.unknown_member_id, fx
            if member_id not in (UNKNOWN_MEMBER_ID, owner.member_id):
                return ErrorCode.fenced_instance_id, fx
            member_id = owner.member_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id, fx
        self._remove_member(fx, member_id, ErrorCode.unknown_member_id, now_ms)
        return ErrorCode.none, fx

    # ------------------------------------------------------------------ timers
    def _session_expired(self, member: Member, now_ms: int) -> bool:
        # Kafka's shouldKeepAlive: a member parked in join or sync is covered by the
        # rebalance timeout, not its session.
        if member.join_token is not None or member.sync_token is not None:
            return False
        return member.last_heartbeat_ms + member.session_timeout_ms <= now_ms

    def next_deadline_ms(self) -> int | None:
        if self.state is GroupState.DEAD:
            return None
        deadlines = [d for d in (self.join_deadline_ms, self.sync_deadline_ms) if d is not None]
        deadlines.extend(self.pending_members.values())
        for member in self.members.values():
            if member.join_token is None and member.sync_token is None:
                deadlines.append(member.last_heartbeat_ms + member.session_timeout_ms)
        return min(deadlines, default=None)

    def tick(self, now_ms: int) -> GroupEffects:
        fx = GroupEffects()
        # One expiry can arm a deadline that is already due (the last member expires, the
        # join phase of an empty group ends at once), so repeat; each round strictly
        # advances the state, and a few rounds always suffice.
        for _ in range(4):
            deadline_ms = self.next_deadline_ms()
            if deadline_ms is None or deadline_ms > now_ms:
                break
            self._tick_once(fx, now_ms)
        return fx

    def _tick_once(self, fx: GroupEffects, now_ms: int) -> None:
        for member_id, deadline_ms in list(self.pending_members.items()):
            if deadline_ms <= now_ms:
                del self.pending_members[member_id]
        if self.state is GroupState.PREPARING_REBALANCE:
            if self.join_deadline_ms is not None and self.join_deadline_ms <= now_ms:
                self._on_join_deadline(fx, now_ms)
            else:
                self._maybe_complete_join(fx, now_ms)  # a pending member may have expired
        if (
            self.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
            and self.sync_deadline_ms is not None
            and self.sync_deadline_ms <= now_ms
        ):
            self.sync_deadline_ms = None
            silent = [m for m in self.members if m in self.pending_sync]
            if silent:
                for member_id in silent:
                    self._answer_and_drop(fx, member_id)
                self._prepare_rebalance(fx, now_ms)
        for member in list(self.members.values()):
            if member.member_id in self.members and self._session_expired(member, now_ms):
                self._remove_member(fx, member.member_id, ErrorCode.unknown_member_id, now_ms)

    def _answer_and_drop(self, fx: GroupEffects, member_id: str) -> None:
        member = self.members[member_id]
        fx.reply(member.join_token, self._error_join(member_id, ErrorCode.unknown_member_id))
        fx.reply(member.sync_token, self._sync_reply(ErrorCode.unknown_member_id))
        self._drop(member_id)

    def _on_join_deadline(self, fx: GroupEffects, now_ms: int) -> None:
        remaining_ms = self.initial_delay_remaining_ms
        if remaining_ms is not None and self.new_member_added and remaining_ms > 0:
            delay_ms = min(self.config.group_initial_rebalance_delay_ms, remaining_ms)
            self.initial_delay_remaining_ms = max(remaining_ms - delay_ms, 0)
            self.new_member_added = False
            self.join_deadline_ms = now_ms + delay_ms
            return
        self._complete_join(fx, now_ms)

    # ------------------------------------------------------------------ shutdown / describe
    def shutdown(self, code: ErrorCode, now_ms: int) -> GroupEffects:
        """Unloaded or deleted: answer every parked reply with `code`, become Dead."""
        fx = GroupEffects()
        for member in self.members.values():
            fx.reply(member.join_token, self._error_join(member.member_id, code))
            fx.reply(member.sync_token, self._sync_reply(code))
            member.join_token = member.sync_token = None
        self.pending_members.clear()
        self.join_deadline_ms = self.sync_deadline_ms = None
        self.transition(GroupState.DEAD, now_ms)
        return fx

    def describe(self) -> DescribedGroup:
        stable = self.state is GroupState.STABLE
        members = described_members(self.members, self.protocol_name, stable=stable)
        return DescribedGroup(
            group_id=self.group_id,
            error_code=ErrorCode.none,
            state=self.state.value,
            protocol_type=self.protocol_type or "",
            protocol_data=(self.protocol_name or "") if stable else "",
            members=members,
        )
