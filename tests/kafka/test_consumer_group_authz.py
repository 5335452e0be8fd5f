"""KIP-848's APIs with the ACL authorizer on (KAFKA-18813): a member learns of no topic it may
not DESCRIBE, neither by naming it, nor through its own regex subscription, nor by describing
a group (ConsumerGroupDescribe or the classic DescribeGroups). A real in-process group
coordinator behind a SASL_PLAINTEXT listener. Kafka's own gap stays: members of one regex
with different ACLs share its resolution."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.client.consumer_protocol import decode_subscription
from raftlog.errors import ErrorCode
from raftlog.groups.service import InProcessGroupService
from raftlog.groups.settings import GroupConfig
from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka.apis import ApiKey
from raftlog.net.kafka.handlers_consumer_group import CONSUMER_GROUP_DESCRIBE
from raftlog.security.acl import AclOperation, ResourceType
from tests.kafka.test_authz import AuthzBroker, acl, start_authz_broker
from tests.kafka.test_consumer_group_wire import send_heartbeat
from tests.kafka.test_groups_wire import call
from tests.kafka.wire import WireClient

TAF = ErrorCode.topic_authorization_failed
PARTITIONS = {"orders": 4, "orders-eu": 2, "secret": 3}


@dataclass
class Cluster:
    broker: AuthzBroker
    service: InProcessGroupService

    def topic_id(self, name: str) -> uuid.UUID:
        (info,) = self.broker.backend.topics([name])
        return info.topic_id


@pytest.fixture
async def cluster(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Cluster]:
    service = InProcessGroupService(GroupConfig(offsets_topic_num_partitions=1))
    await nursery.start(service.run)
    broker = await start_authz_broker(nursery, tmp_path, service)
    backend = broker.backend
    await backend.create_topics([NewTopic(n, p, 1) for n, p in PARTITIONS.items()], 5000, False)
    # alice may use groups cg and cg2 and see the orders topics; bob sees every topic.
    backend.set_acls(
        acl(ResourceType.GROUP, "cg", AclOperation.READ),
        acl(ResourceType.GROUP, "cg2", AclOperation.READ),
        acl(ResourceType.GROUP, "cg2", AclOperation.DESCRIBE),
        acl(ResourceType.TOPIC, "orders", AclOperation.DESCRIBE),
        acl(ResourceType.TOPIC, "orders-eu", AclOperation.DESCRIBE),
        acl(ResourceType.GROUP, "cg", AclOperation.READ, principal="User:bob"),
        acl(ResourceType.TOPIC, "*", AclOperation.DESCRIBE, principal="User:bob"),
    )
    yield Cluster(broker, service)
    backend.close()


async def heartbeat(
    client: WireClient, group: str, member_id: str, epoch: int, **values: Any
) -> Any:
    """A ConsumerGroupHeartbeat to `group`; a join names its subscription in `values`."""
    return await send_heartbeat(client, member_id, epoch, group=group, **values)


def assigned_ids(response: Any) -> set[uuid.UUID]:
    assert response.error_code == ErrorCode.none, response
    assert response.assignment is not None
    return {t.topic_id for t in response.assignment.topic_partitions}


async def test_naming_a_topic_it_may_not_describe_refuses_the_heartbeat(cluster: Cluster) -> None:
    alice = await cluster.broker.client("alice")
    refused = await heartbeat(alice, "cg", "m-a", 0, subscribed_topic_names=("orders", "secret"))
    assert refused.error_code == TAF
    assert "secret" not in (refused.error_message or "")
    assert refused.member_epoch == -1 and refused.assignment is None
    joined = await heartbeat(alice, "cg", "m-a", 0, subscribed_topic_names=("orders",))
    assert assigned_ids(joined) == {cluster.topic_id("orders")}


async def test_a_regex_matches_only_what_the_member_may_describe(cluster: Cluster) -> None:
    """alice subscribes to every topic by regex: she is assigned the two she may see, never
    the other one, and no response carries its id."""
    alice = await cluster.broker.client("alice")
    joined = await heartbeat(alice, "cg", "m-a", 0, subscribed_topic_regex=".*")
    visible = {cluster.topic_id("orders"), cluster.topic_id("orders-eu")}
    assert assigned_ids(joined) == visible
    again = await heartbeat(alice, "cg", "m-a", joined.member_epoch, topic_partitions=())
    assert again.error_code == ErrorCode.none
    assert again.assignment is None or assigned_ids(again) <= visible


async def test_members_with_other_acls_do_not_resolve_the_regex_back_and_forth(
    cluster: Cluster,
) -> None:
    """As Kafka: the regex is resolved with the ACLs of the member whose heartbeat made a
    resolution due (a new regex, topics created or deleted); members with wider ACLs
    heartbeating in between do not move the group epoch."""
    alice = await cluster.broker.client("alice")
    bob = await cluster.broker.client("bob")
    a = await heartbeat(alice, "cg", "m-a", 0, subscribed_topic_regex=".*")
    b = await heartbeat(bob, "cg", "m-b", 0, subscribed_topic_regex=".*")
    assert b.error_code == ErrorCode.none
    epoch = b.member_epoch
    for _ in range(3):
        a = await heartbeat(alice, "cg", "m-a", a.member_epoch)
        b = await heartbeat(bob, "cg", "m-b", b.member_epoch)
        assert a.error_code == b.error_code == ErrorCode.none
    assert b.member_epoch == epoch
    (group,) = await cluster.service.shell.consumer_group_describe(["cg"])
    assert group.group_epoch == epoch
    assert {t for m in group.members for t, _ in m.target_assignment} <= {"orders", "orders-eu"}


async def test_a_group_holding_a_topic_the_caller_may_not_describe_is_not_described(
    cluster: Cluster,
) -> None:
    admin = await cluster.broker.client("admin")  # a super user
    alice = await cluster.broker.client("alice")
    joined = await heartbeat(admin, "cg2", "m-x", 0, subscribed_topic_names=("secret",))
    assert assigned_ids(joined) == {cluster.topic_id("secret")}
    for client, code in ((alice, TAF), (admin, ErrorCode.none)):
        response = await call(
            client,
            CONSUMER_GROUP_DESCRIBE,
            1,
            group_ids=("cg2",),
            include_authorized_operations=False,
        )
        (described,) = response.groups
        assert described.error_code == code
        if code is TAF:
            assert described.members == () and described.group_epoch == -1
        else:
            assert described.members[0].subscribed_topic_names == ("secret",)
        # The classic DescribeGroups view of the same group encodes the member's topics.
        classic = await call(
            client, ApiKey.DESCRIBE_GROUPS, 5, groups=("cg2",), include_authorized_operations=False
        )
        (group,) = classic.groups
        assert group.error_code == code
        if code is TAF:
            assert group.members == ()
        else:
            (member,) = group.members
            assert decode_subscription(member.member_metadata).topics == ("secret",)
