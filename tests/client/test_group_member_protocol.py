"""The group member's protocol steps against a scripted coordinator (tests/client/fake_broker):
KIP-394's member-id round trip, the leader's range assignment in SyncGroup, what each
heartbeat error makes it do (commit first only where the generation still allows it, then
rejoin with or without its member id), bounded join retries, and LeaveGroup on close.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from raftlog.client import Cluster, open_cluster
from raftlog.client.consumer_protocol import decode_subscription, encode_assignment
from raftlog.client.group_member import (
    CommitFailed,
    GroupMember,
    GroupMemberError,
    MemberConfig,
)
from raftlog.errors import ErrorCode
from tests.client.fake_broker import FakeBroker, Request

GROUP = "g"
TOPIC = "t"
FAST = MemberConfig(
    session_timeout_ms=6_000, heartbeat_interval_ms=20, retry_backoff_ms=5, max_join_attempts=3
)
STEP_DEADLINE_S = 10
GROUP_APIS = {
    "api_versions": (0, 3),
    "metadata": (0, 12),
    "find_coordinator": (0, 4),
    "join_group": (0, 9),
    "sync_group": (0, 5),
    "heartbeat": (0, 4),
    "leave_group": (0, 5),
    "offset_commit": (2, 8),
}


@dataclass
class Coordinator:
    """One member's worth of classic-group coordinator, driven by the test's script."""

    broker: FakeBroker
    # Heartbeat answers, in order; NONE once they run out.
    heartbeats: list[ErrorCode] = field(default_factory=list)
    join_error: ErrorCode = ErrorCode.none
    generation: int = 0
    next_member: int = 0
    joins: list[str] = field(default_factory=list)  # member ids JoinGroup carried
    finds: int = 0
    commits: list[tuple[int, str, dict[tuple[str, int], int]]] = field(default_factory=list)
    leaves: list[str] = field(default_factory=list)
    synced: trio.Event = field(default_factory=trio.Event)

    def install(self) -> None:
        self.broker.api_versions = dict(GROUP_APIS)
        self.broker.topics = {TOPIC: [(0, 1, 0), (1, 1, 0), (2, 1, 0)]}
        for api in ("find_coordinator", "join_group", "sync_group", "heartbeat"):
            self.broker.handlers[api] = getattr(self, api)
        self.broker.handlers["offset_commit"] = self.offset_commit
        self.broker.handlers["leave_group"] = self.leave_group

    async def find_coordinator(self, request: Request) -> dict[str, Any]:
        self.finds += 1
        entry = {
            "key": GROUP,
            "node_id": self.broker.node_id,
            "host": self.broker.host,
            "port": self.broker.port,
            "error_code": ErrorCode.none,
            "error_message": None,
        }
        return {"throttle_time": 0, **entry, "coordinators": [entry]}

    async def join_group(self, request: Request) -> dict[str, Any]:
        body = request.body
        self.joins.append(body.member_id)
        base = {"throttle_time": 0, "protocol_type": "consumer", "protocol_name": "range"}
        if self.join_error != ErrorCode.none:
            return {**base, "error_code": self.join_error, "leader": "", "member_id": ""}
        if not body.member_id:
            self.next_member += 1
            return {
                **base,
                "error_code": ErrorCode.member_id_required,
                "leader": "",
                "member_id": f"m-{self.next_member}",
            }
        self.generation += 1
        subscription = decode_subscription(body.protocols[0].metadata)
        assert subscription.topics == (TOPIC,)
        return {
            **base,
            "error_code": ErrorCode.none,
            "generation_id": self.generation,
            "leader": body.member_id,
            "member_id": body.member_id,
            "members": [
                {
                    "member_id": body.member_id,
                    "group_instance_id": None,
                    "metadata": body.protocols[0].metadata,
                }
            ],
        }

    async def sync_group(self, request: Request) -> dict[str, Any]:
        body = request.body
        assert body.generation_id == self.generation
        mine = [a.assignment for a in body.assignments if a.member_id == body.member_id]
        self.synced.set()
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "protocol_type": "consumer",
            "protocol_name": "range",
            "assignment": mine[0] if mine else b"",
        }

    async def heartbeat(self, request: Request) -> dict[str, Any]:
        code = self.heartbeats.pop(0) if self.heartbeats else ErrorCode.none
        return {"throttle_time": 0, "error_code": code}

    async def offset_commit(self, request: Request) -> dict[str, Any]:
        body = request.body
        offsets = {
            (t.name, int(p.partition_index)): int(p.committed_offset)
            for t in body.topics
            for p in t.partitions
        }
        self.commits.append((int(body.generation_id_or_member_epoch), body.member_id, offsets))
        return {
            "throttle_time": 0,
            "topics": [
                {
                    "name": t.name,
                    "partitions": [
                        {"partition_index": p.partition_index, "error_code": ErrorCode.none}
                        for p in t.partitions
                    ],
                }
                for t in body.topics
            ],
        }

    async def leave_group(self, request: Request) -> dict[str, Any]:
        members = [m.member_id for m in request.body.members]
        self.leaves.extend(members)
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "members": [
                {"member_id": m, "group_instance_id": None, "error_code": ErrorCode.none}
                for m in members
            ],
        }


@dataclass
class Recorder:
    """A listener that commits offset 5 of everything it gives up, and records what it sees."""

    events: list[tuple[str, frozenset[tuple[str, int]]]] = field(default_factory=list)
    commit_errors: list[ErrorCode] = field(default_factory=list)
    member: GroupMember | None = None

    async def on_partitions_assigned(self, partitions: frozenset[tuple[str, int]]) -> None:
        self.events.append(("assigned", partitions))

    async def on_partitions_revoked(self, partitions: frozenset[tuple[str, int]]) -> None:
        self.events.append(("revoked", partitions))
        assert self.member is not None
        try:
            await self.member.commit(dict.fromkeys(partitions, 5))
        except CommitFailed as exc:
            self.commit_errors.append(exc.code)


@pytest.fixture
async def coordinator(nursery: trio.Nursery) -> Coordinator:
    broker = await nursery.start(FakeBroker().serve)
    script = Coordinator(broker)
    script.install()
    return script


@pytest.fixture
async def cluster(coordinator: Coordinator) -> AsyncIterator[Cluster]:
    async with open_cluster(f"127.0.0.1:{coordinator.broker.port}") as opened:
        yield opened


def new_member(cluster: Cluster, config: MemberConfig = FAST) -> tuple[GroupMember, Recorder]:
    recorder = Recorder()
    member = GroupMember(cluster, GROUP, [TOPIC], recorder, config)
    recorder.member = member
    return member, recorder


ALL = frozenset((TOPIC, p) for p in range(3))


def member_error(exc: BaseException) -> GroupMemberError:
    """The GroupMemberError inside the nurseries' exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, GroupMemberError), repr(exc)
    return exc


async def test_join_assign_and_leave(coordinator: Coordinator, cluster: Cluster) -> None:
    member, recorder = new_member(cluster)
    with trio.fail_after(STEP_DEADLINE_S):
        async with member.joined():
            # KIP-394: the first JoinGroup had no id, the second the one the coordinator gave.
            assert coordinator.joins == ["", "m-1"]
            assert member.member_id == "m-1" and member.assignment == ALL
            assert member.generation is not None and member.generation.is_leader
            await member.commit({(TOPIC, 1): 7})
    assert recorder.events == [("assigned", ALL), ("revoked", ALL)]
    # The explicit commit, then the revoke's commit on close; both as generation 1's m-1.
    assert coordinator.commits == [
        (1, "m-1", {(TOPIC, 1): 7}),
        (1, "m-1", dict.fromkeys(ALL, 5)),
    ]
    assert coordinator.leaves == ["m-1"]


@pytest.mark.parametrize(
    ("code", "commits_first", "rejoins_as"),
    [
        (ErrorCode.rebalance_in_progress, True, "m-1"),
        (ErrorCode.not_coordinator, True, "m-1"),
        (ErrorCode.illegal_generation, False, "m-1"),
        (ErrorCode.unknown_member_id, False, ""),
    ],
)
async def test_heartbeat_errors_rejoin(
    coordinator: Coordinator,
    cluster: Cluster,
    code: ErrorCode,
    commits_first: bool,
    rejoins_as: str,
) -> None:
    coordinator.heartbeats = [ErrorCode.none, code]
    member, recorder = new_member(cluster)
    with trio.fail_after(STEP_DEADLINE_S):
        async with member.joined():
            while coordinator.generation < 2:  # noqa: ASYNC110 - bounded by fail_after
                await trio.sleep(0.01)
            while member.generation is None or member.generation.generation_id < 2:  # noqa: ASYNC110
                await trio.sleep(0.01)
    assert recorder.events == [
        ("assigned", ALL),
        ("revoked", ALL),
        ("assigned", ALL),
        ("revoked", ALL),
    ]
    first_revoke = [c for c in coordinator.commits if c[0] == 1]
    if commits_first:
        assert first_revoke == [(1, "m-1", dict.fromkeys(ALL, 5))]
        assert recorder.commit_errors == []
    else:
        assert first_revoke == [], "a stale generation's commit would be refused"
        assert recorder.commit_errors == [ErrorCode.rebalance_in_progress]
    # After the first join (ids "", "m-1"): rejoined with the same id, or as a new member.
    expected_rejoin = ["m-1"] if rejoins_as else ["", "m-2"]
    assert coordinator.joins == ["", "m-1", *expected_rejoin]
    final = "m-1" if rejoins_as else "m-2"
    assert coordinator.commits[-1] == (2, final, dict.fromkeys(ALL, 5))
    assert coordinator.leaves == [final]
    if code == ErrorCode.not_coordinator:
        assert coordinator.finds >= 2


async def test_a_fatal_heartbeat_error_ends_the_member(
    coordinator: Coordinator, cluster: Cluster
) -> None:
    coordinator.heartbeats = [ErrorCode.group_authorization_failed]
    member, _ = new_member(cluster)
    with pytest.raises(BaseExceptionGroup) as raised, trio.fail_after(STEP_DEADLINE_S):
        async with member.joined():
            await trio.sleep_forever()
    assert "heartbeat refused: GROUP_AUTHORIZATION_FAILED" in str(member_error(raised.value))
    assert coordinator.leaves == ["m-1"]


async def test_joining_is_bounded(coordinator: Coordinator, cluster: Cluster) -> None:
    coordinator.join_error = ErrorCode.coordinator_not_available
    member, recorder = new_member(cluster)
    with pytest.raises(BaseExceptionGroup) as raised, trio.fail_after(STEP_DEADLINE_S):
        async with member.joined():
            pytest.fail("joined a group whose coordinator never answered")
    assert "could not join group 'g' in 3 attempts" in str(member_error(raised.value))
    assert len(coordinator.joins) == 3
    assert coordinator.finds == 3, "each attempt looks the coordinator up again"
    assert recorder.events == []


async def test_a_follower_takes_the_assignment_it_is_given(
    coordinator: Coordinator, cluster: Cluster
) -> None:
    """A member that is not the leader sends no assignments and keeps what SyncGroup says."""
    original = coordinator.join_group

    async def join_as_follower(request: Request) -> dict[str, Any]:
        answer = await original(request)
        if answer["error_code"] == ErrorCode.none:
            answer["leader"] = "someone-else"
        return answer

    async def sync_from_leader(request: Request) -> dict[str, Any]:
        assert list(request.body.assignments) == []
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "protocol_type": "consumer",
            "protocol_name": "range",
            "assignment": encode_assignment([(TOPIC, 2)]),
        }

    coordinator.broker.handlers["join_group"] = join_as_follower
    coordinator.broker.handlers["sync_group"] = sync_from_leader
    member, _ = new_member(cluster)
    with trio.fail_after(STEP_DEADLINE_S):
        async with member.joined():
            assert member.assignment == frozenset({(TOPIC, 2)})
            assert member.generation is not None and not member.generation.is_leader
