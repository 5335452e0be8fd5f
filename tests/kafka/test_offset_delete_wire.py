"""OffsetDelete (API 47) on the wire: DELETE on the group, READ on each topic (a refused
topic is not told whether it exists), unknown topics and partitions, and the bound on a
request. The coordinator is scripted (tests/groups/test_offset_delete.py covers its rules)."""

from __future__ import annotations

from raftlog.errors import ErrorCode
from raftlog.groups import messages as m
from raftlog.net.kafka.apis import ApiKey
from raftlog.net.kafka.handlers_offset_delete import MAX_PARTITIONS_PER_REQUEST
from raftlog.security.acl import AclOperation, ResourceType
from tests.kafka.test_authz import AuthzBroker, acl, broker, request

__all__ = ["broker"]  # the fixture

E = ErrorCode


def script(b: AuthzBroker) -> list[m.OffsetDeleteRequest]:
    asked: list[m.OffsetDeleteRequest] = []

    async def offset_delete(req: m.OffsetDeleteRequest) -> m.OffsetDeleteResponse:
        asked.append(req)
        return m.OffsetDeleteResponse(
            E.none,
            tuple(
                m.TopicErrors(t.name, tuple(m.PartitionError(p, E.none) for p in t.partitions))
                for t in req.topics
            ),
        )

    b.groups.shell.offset_delete = offset_delete  # type: ignore[attr-defined]
    return asked


def offset_delete(group: str, topics: dict[str, list[int]]):
    return request(
        ApiKey.OFFSET_DELETE,
        0,
        group_id=group,
        topics=[
            {"name": t, "partitions": [{"partition_index": p} for p in ps]}
            for t, ps in topics.items()
        ],
    )


def codes(response) -> dict[tuple[str, int], ErrorCode]:
    return {
        (t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions
    }


async def test_needs_delete_on_group_then_read_on_each_topic(broker: AuthzBroker) -> None:
    asked = script(broker)
    alice = await broker.client("alice")
    call = offset_delete("g1", {"orders": [0], "secret": [0], "ghost": [0]})
    refused = await alice.request(call)
    assert (refused.error_code, refused.topics) == (E.group_authorization_failed, ())
    broker.backend.set_acls(acl(ResourceType.GROUP, "g1", AclOperation.READ))
    assert (await alice.request(call)).error_code == E.group_authorization_failed
    assert asked == []
    broker.backend.set_acls(
        acl(ResourceType.GROUP, "g1", AclOperation.DELETE),
        acl(ResourceType.TOPIC, "orders", AclOperation.READ),
    )
    answer = await alice.request(call)
    assert answer.error_code == E.none
    assert codes(answer) == {
        ("orders", 0): E.none,
        ("secret", 0): E.topic_authorization_failed,
        ("ghost", 0): E.topic_authorization_failed,  # its absence stays hidden
    }
    assert [(t.name, t.partitions) for t in asked[-1].topics] == [("orders", (0,))]


async def test_unknown_topics_partitions_and_bounds(broker: AuthzBroker) -> None:
    asked = script(broker)
    broker.backend.set_acls(allow_everyone=True)
    alice = await broker.client("alice")
    answer = await alice.request(offset_delete("g1", {"orders": [0, 0, 1, -1], "ghost": [0]}))
    assert answer.error_code == E.none
    assert codes(answer) == {
        ("orders", 0): E.none,
        ("orders", 1): E.unknown_topic_or_partition,
        ("orders", -1): E.unknown_topic_or_partition,
        ("ghost", 0): E.unknown_topic_or_partition,
    }
    assert [(t.name, t.partitions) for t in asked[-1].topics] == [("orders", (0,))]
    assert (await alice.request(offset_delete("", {"orders": [0]}))).error_code == (
        E.invalid_group_id
    )
    flood = offset_delete("g1", {"orders": list(range(MAX_PARTITIONS_PER_REQUEST + 1))})
    assert (await alice.request(flood)).error_code == E.invalid_request
    assert len(asked) == 1


async def test_the_group_error_keeps_the_refused_partitions(broker: AuthzBroker) -> None:
    async def unknown_group(req: m.OffsetDeleteRequest) -> m.OffsetDeleteResponse:
        return m.OffsetDeleteResponse(E.group_id_not_found)

    broker.groups.shell.offset_delete = unknown_group  # type: ignore[attr-defined]
    broker.backend.set_acls(allow_everyone=True)
    alice = await broker.client("alice")
    answer = await alice.request(offset_delete("g9", {"orders": [0], "ghost": [3]}))
    assert answer.error_code == E.group_id_not_found
    assert codes(answer) == {("ghost", 3): E.unknown_topic_or_partition}
